//! Inspection: the footer read and checked against the file, the projected columns' roots and
//! row groups ([`ParquetIndex`]), and each shard's promise.

use std::sync::Arc;

use super::fetch::{load_metadata, MERGE_GAP};
use super::footer::{check_codecs, decode_batch_rows, guarded, ParquetIndex};
use super::read::Reader;
use crate::columns::Chunk;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::{ShardMeta, ShardReader};
use crate::storage::Object;
use crate::storage::Pin;

pub fn inspect(
    object: Arc<Object>,
    projection: &Projection,
    first_record: bool,
) -> Result<ShardMeta> {
    let path = object.uri().to_owned();
    guarded(&path, None, || {
        inspect_unguarded(object, projection, first_record)
    })?
}

/// [`inspect`] from the footer alone: the projection's columns are found but no record is
/// decoded, for a caller that checks their types itself (a token stage, which inspects every
/// shard at open and would otherwise read a page of each).
pub fn inspect_footer(object: Arc<Object>, projection: &Projection) -> Result<ShardMeta> {
    let path = object.uri().to_owned();
    guarded(&path, None, || inspect_unguarded(object, projection, false))?
}

pub(super) fn inspect_unguarded(
    object: Arc<Object>,
    projection: &Projection,
    decode_first: bool,
) -> Result<ShardMeta> {
    let path = &object.uri().to_owned();
    let metadata = load_metadata(&object)?;
    if metadata.metadata().file_metadata().num_rows() == 0 {
        // An empty shard (a writer's output for no records may have no columns at all) holds
        // nothing to project: streams skip it.
        return Ok(ShardMeta {
            dropped: crate::formats::Dropped::default(),
            rows: 0,
            pin: Pin::default(),
            scratch_bytes: 0,
            longest_record: 0,
            index: Arc::new(ParquetIndex {
                metadata,
                roots: Vec::new(),
                group_starts: vec![0],
                batch_rows: 1,
            }),
        });
    }
    let schema = metadata.schema().clone();
    let mut roots = Vec::with_capacity(projection.columns.len());
    for column in &projection.columns {
        let idx = schema.index_of(&column.source).map_err(|_| {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Error::Projection {
                path: path.to_owned(),
                row: 0,
                field: column.name.clone(),
                source_field: column.source.clone(),
                message: format!(
                    "the shard has no such column (its columns: {})",
                    names.join(", ")
                ),
            }
        })?;
        roots.push(idx);
    }
    check_codecs(metadata.metadata(), Some(&roots), path)?;
    let mut group_starts = vec![0u64];
    for group in metadata.metadata().row_groups() {
        let last = *group_starts.last().expect("starts with 0");
        group_starts.push(last + group.num_rows() as u64);
    }
    let rows = *group_starts.last().expect("starts with 0");
    let sources: Vec<&str> = projection
        .columns
        .iter()
        .map(|c| c.source.as_str())
        .collect();
    let largest_group = metadata
        .metadata()
        .row_groups()
        .iter()
        .map(|group| {
            group
                .columns()
                .iter()
                .filter(|c| sources.contains(&c.column_path().parts()[0].as_str()))
                // Compressed pages, decompressed pages, and the Arrow arrays decoded from them.
                .map(|c| (c.compressed_size() + 2 * c.uncompressed_size()).max(0) as u64)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let batch_rows = decode_batch_rows(metadata.metadata(), &sources);
    // Merged remote requests also fetch the gaps between the ranges they join: at most one gap
    // per projected column chunk (and its dictionary) in each of a job's two row groups.
    let gap_bytes = if object.local_file().is_some() {
        0
    } else {
        let leaves = metadata.metadata().row_groups().first().map_or(0, |g| {
            g.columns()
                .iter()
                .filter(|c| sources.contains(&c.column_path().parts()[0].as_str()))
                .count() as u64
        });
        2 * 2 * leaves * MERGE_GAP
    };
    let index = Arc::new(ParquetIndex {
        metadata,
        roots,
        group_starts,
        batch_rows,
    });
    let meta = ShardMeta {
        dropped: crate::formats::Dropped::default(),
        rows,
        pin: Pin::default(),
        // A job spans at most two row groups (it holds at most one group's worth of rows).
        scratch_bytes: 2 * largest_group + gap_bytes,
        longest_record: 0,
        index: index.clone(),
    };
    if rows > 0 && decode_first {
        // Decoding the first record checks every projected column's type now, not mid-run.
        let mut reader = Reader::open(object, index);
        let mut chunk = Chunk::padded(projection, 1);
        reader
            .read_ranges(std::slice::from_ref(&(0..1)), projection, &mut chunk, None)
            .map_err(|failure| failure.error)?;
    }
    Ok(meta)
}
