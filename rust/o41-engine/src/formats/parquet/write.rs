//! Writing: the saver's Parquet shards, with a page index and list lengths in the footer.

use std::io::Write;

use arrow_array::cast::AsArray;
use arrow_array::{Array, OffsetSizeTrait, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use super::footer::MAX_SCHEMA_DEPTH;
use crate::error::{Error, Result};

/// Levels of `data_type` (1 for a leaf), counted no further than `limit + 1`: the walk itself
/// must not recurse without bound either.
fn nesting(data_type: &DataType, limit: usize) -> usize {
    if limit == 0 {
        return 1;
    }
    let children: Vec<&DataType> = match data_type {
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => vec![f.data_type()],
        DataType::Struct(fields) => fields.iter().map(|f| f.data_type()).collect(),
        DataType::Union(fields, _) => fields.iter().map(|(_, f)| f.data_type()).collect(),
        DataType::Dictionary(_, value) => vec![value.as_ref()],
        DataType::RunEndEncoded(_, values) => vec![values.data_type()],
        _ => return 1,
    };
    1 + children
        .into_iter()
        .map(|child| nesting(child, limit - 1))
        .max()
        .unwrap_or(0)
}

/// Writes `batches` (all of `schema`) as one Parquet file: zstd-compressed pages with a page
/// index, so that streams select just the pages holding the rows a rank reads, and for each
/// list column of integers without nulls its record lengths in the footer
/// ([`crate::formats::parquet::list_lengths::footer_value`]), so that a packing stage plans from the footer.
pub fn write(
    out: impl Write + Send,
    schema: SchemaRef,
    batches: &[RecordBatch],
    path: &str,
) -> Result<()> {
    let refused = |e: ParquetError| Error::Data {
        path: path.to_owned(),
        row: None,
        field: None,
        message: format!("cannot be written as Parquet: {e}"),
    };
    // arrow-rs builds a writer per level by recursion: a deep schema would overflow the stack.
    if let Some(field) = schema
        .fields()
        .iter()
        .find(|f| nesting(f.data_type(), MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH)
    {
        return Err(Error::Data {
            path: path.to_owned(),
            row: None,
            field: Some(field.name().clone()),
            message: format!(
                "nests more than {MAX_SCHEMA_DEPTH} levels deep, more than a Parquet shard \
                 written here may"
            ),
        });
    }
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let footer: Vec<KeyValue> = schema
        .fields()
        .iter()
        .enumerate()
        .filter_map(|(k, field)| {
            let value = crate::formats::parquet::list_lengths::footer_value(
                &integer_list_lengths(batches, k)?,
            )?;
            let key = format!(
                "{}{}",
                crate::formats::parquet::list_lengths::FOOTER_KEY_PREFIX,
                field.name()
            );
            Some(KeyValue::new(key, value))
        })
        .collect();
    let mut writer = ArrowWriter::try_new(out, schema, Some(properties)).map_err(refused)?;
    for batch in batches {
        writer.write(batch).map_err(refused)?;
    }
    for entry in footer {
        writer.append_key_value_metadata(entry);
    }
    writer.close().map_err(refused)?;
    Ok(())
}

/// The record lengths of column `k` of `batches` where it is a list of integers holding no
/// null, list or element; `None` otherwise.
pub(super) fn integer_list_lengths(batches: &[RecordBatch], k: usize) -> Option<Vec<u64>> {
    fn append<O: OffsetSizeTrait>(column: &dyn Array, lengths: &mut Vec<u64>) -> Option<()> {
        let list = column.as_list::<O>();
        let values = list.values();
        if column.null_count() > 0 || values.null_count() > 0 || !values.data_type().is_integer() {
            return None;
        }
        lengths.extend(
            list.offsets()
                .windows(2)
                .map(|w| (w[1] - w[0]).as_usize() as u64),
        );
        Some(())
    }
    let mut lengths = Vec::new();
    for batch in batches {
        let column = batch.column(k).as_ref();
        match column.data_type() {
            DataType::List(_) => append::<i32>(column, &mut lengths)?,
            DataType::LargeList(_) => append::<i64>(column, &mut lengths)?,
            _ => return None,
        }
    }
    Some(lengths)
}
