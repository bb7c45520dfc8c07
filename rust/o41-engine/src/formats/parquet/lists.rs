//! Token lists: a Parquet token column's list lengths and ids, from the footer, the levels or the
//! decoded arrays, for the stages that pack or window tokens.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::Array;
use arrow_schema::DataType;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::ChunkReader;

use super::fetch::{ArcReader, Fetched};
use super::footer::{guarded, ParquetIndex};
use super::metered::metered;
use super::read::selected_rows;
use super::{decode_error, format_error};
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::ShardMeta;
use crate::storage::Object;

/// The Arrow type of the first column `index` projects; `None` for an empty shard's index.
pub(in crate::formats) fn projected_type(index: &ParquetIndex) -> Option<&DataType> {
    let &root = index.roots.first()?;
    Some(index.metadata.schema().field(root).data_type())
}

/// The index of a shard inspected with `projection`, for readers of whole lists (token shards).
pub(in crate::formats) fn index_of(meta: &ShardMeta) -> Option<Arc<ParquetIndex>> {
    meta.index.clone().into_any().downcast().ok()
}

/// Whether record `lengths` agree with the footer's record and level counts of the one list
/// column `index` projects.
pub(in crate::formats) fn lengths_agree(index: &ParquetIndex, lengths: &[u64]) -> bool {
    let metadata = index.metadata.metadata();
    let rows: u64 = index.group_starts.last().copied().unwrap_or(0);
    match index.roots[..] {
        [root] => {
            lengths.len() as u64 == rows
                && crate::formats::parquet::list_lengths::agree_with_levels(metadata, root, lengths)
        }
        _ => false,
    }
}

/// A record's token ids as the file stores them: `i32` and `i64` lists are lent as they were
/// decoded, other integer types widened to `i64`.
#[derive(Clone, Copy)]
pub(in crate::formats) enum Ids<'a> {
    /// 32-bit ids.
    I32(&'a [i32]),
    /// 64-bit ids, stored so or widened.
    I64(&'a [i64]),
}

impl Ids<'_> {
    /// Number of ids.
    pub(in crate::formats) fn len(&self) -> usize {
        match self {
            Ids::I32(v) => v.len(),
            Ids::I64(v) => v.len(),
        }
    }

    /// Ids `range`.
    pub(in crate::formats) fn slice(&self, range: Range<usize>) -> Self {
        match self {
            Ids::I32(v) => Ids::I32(&v[range]),
            Ids::I64(v) => Ids::I64(&v[range]),
        }
    }

    /// Every id, as `i64`.
    pub(in crate::formats) fn iter(&self) -> Box<dyn Iterator<Item = i64> + '_> {
        match self {
            Ids::I32(v) => Box::new(v.iter().map(|&x| i64::from(x))),
            Ids::I64(v) => Box::new(v.iter().copied()),
        }
    }
}

/// What [`for_each_list`] calls with each record: its number, its list's length, and its ids
/// (empty unless they were asked for).
pub(in crate::formats) type EachList<'a> = dyn FnMut(u64, u64, Ids<'_>) -> Result<()> + 'a;

/// Reads records `ranges` (sorted, disjoint) of the one list column `index` projects, handing
/// `each(record, length, values)` every record's list length and, when `values` is set, its
/// whole list as `i64`s (else nothing), in record order. Token shards read their streams
/// through this; `projection` is the one the index was inspected with.
pub(in crate::formats) fn for_each_list(
    object: &Arc<Object>,
    index: &ParquetIndex,
    (ranges, values): (&[Range<u64>], bool),
    projection: &Projection,
    each: &mut EachList<'_>,
) -> Result<()> {
    let path = object.uri().to_owned();
    let first = ranges.first().map(|r| r.start);
    let read = guarded(&path, first, || {
        if ranges.iter().all(Range::is_empty) {
            return Ok(());
        }
        if let Some(file) = object.local_file() {
            // Counted like every other read of the shard (`bytes_read`).
            let reads = (index, (ranges, values), path.as_str());
            return match object.meter() {
                Some(meter) => local_lists(|| metered(file, meter), reads, each),
                None => local_lists(
                    || file.try_clone().map_err(|e| Error::io(&path, e)),
                    reads,
                    each,
                ),
            };
        }
        let pieces = object.read_pieces(&index.fetch_ranges(ranges, projection))?;
        let fetched = Arc::new(Fetched::from_pieces(object.clone(), pieces));
        let rest = match lists_direct(&fetched, index, (ranges, values), &path, each) {
            Ok(Some(rest)) => rest,
            Ok(None) => return Ok(()),
            Err(e) => return Err(fetched.take_failure().unwrap_or(e)),
        };
        lists(
            ArcReader(fetched.clone()),
            index,
            (&rest, values),
            &path,
            each,
        )
        .map_err(|e| fetched.take_failure().unwrap_or(e))
    })?;
    read.map_err(|e| naming_field(e, projection))
}

/// [`for_each_list`] over a local shard, each reader on its own handle from `open`.
pub(super) fn local_lists<R: ChunkReader + 'static>(
    open: impl Fn() -> Result<R>,
    (index, (ranges, values), path): (&ParquetIndex, (&[Range<u64>], bool), &str),
    each: &mut EachList<'_>,
) -> Result<()> {
    let direct = Arc::new(open()?);
    let Some(rest) = lists_direct(&direct, index, (ranges, values), path, each)? else {
        return Ok(());
    };
    lists(open()?, index, (&rest, values), path, each)
}

/// Hands `each` the records of `ranges` read page by page (`direct`), as far as the
/// column reads so; returns the ranges left for arrow-rs to read (`None` when none are).
pub(super) fn lists_direct<R: ChunkReader + 'static>(
    reader: &Arc<R>,
    index: &ParquetIndex,
    (ranges, values): (&[Range<u64>], bool),
    path: &str,
    each: &mut EachList<'_>,
) -> Result<Option<Vec<Range<u64>>>> {
    let [root] = index.roots[..] else {
        return Ok(Some(ranges.to_vec()));
    };
    // The first record not yet handed over.
    let mut next = ranges.first().map_or(0, |r| r.start);
    let mut scratch: Vec<i64> = Vec::new();
    let done = crate::formats::parquet::direct::runs(
        reader,
        index.metadata.metadata(),
        index.metadata.schema().fields(),
        (&index.group_starts, ranges),
        root,
        &mut |array, first| {
            for i in 0..array.len() {
                let record = first + i as u64;
                hand_over(array, (i, record), (values, &mut scratch), path, each)?;
                next = record + 1;
            }
            Ok(())
        },
    );
    if let Ok(Some(result)) = done {
        return result.map(|()| None);
    }
    // The rest through arrow-rs, which reports what stopped this reader, if anything.
    let rest: Vec<Range<u64>> = ranges
        .iter()
        .filter(|r| r.end > next)
        .map(|r| r.start.max(next)..r.end)
        .collect();
    Ok((!rest.is_empty()).then_some(rest))
}

/// Every record's list length of the one list column `index` projects (`rows` records), read
/// from the column's levels without decoding its ids; `None` where the column is not laid out
/// as that reader expects, or its pages do not read so: [`for_each_list`] then decodes the
/// lists, and reports what is wrong with them.
pub(in crate::formats) fn list_lengths(
    object: &Arc<Object>,
    index: &ParquetIndex,
    rows: u64,
    projection: &Projection,
) -> Result<Option<Vec<u64>>> {
    let path = object.uri().to_owned();
    let [root] = index.roots[..] else {
        return Ok(None);
    };
    let metadata = index.metadata.metadata();
    // A shard the saver wrote lists them in its footer, which open has read already.
    if let Some(lengths) =
        crate::formats::parquet::list_lengths::footer_lengths(metadata, root, rows)
    {
        return Ok(Some(lengths));
    }
    guarded(&path, None, || {
        if let Some(file) = object.local_file() {
            // Counted like every other read of the shard (`bytes_read`).
            fn levels<R: ChunkReader + 'static>(
                file: R,
                (metadata, root, rows): (&ParquetMetaData, usize, u64),
            ) -> Option<Vec<u64>> {
                crate::formats::parquet::list_lengths::list_lengths(
                    &Arc::new(file),
                    metadata,
                    root,
                    rows,
                )
                .unwrap_or(None)
            }
            let column = (metadata.as_ref(), root, rows);
            return Ok(match object.meter() {
                Some(meter) => levels(metered(file, meter)?, column),
                None => levels(file.try_clone().map_err(|e| Error::io(&path, e))?, column),
            });
        }
        let all = 0..rows;
        let fetched = Arc::new(Fetched::new(
            object.clone(),
            &index.fetch_ranges(std::slice::from_ref(&all), projection),
        )?);
        match crate::formats::parquet::list_lengths::list_lengths(&fetched, metadata, root, rows) {
            Ok(found) => Ok(found),
            // A failed read is the storage's error; anything else, the decoder's to report.
            Err(_) => fetched.take_failure().map_or(Ok(None), Err),
        }
    })?
}

pub(super) fn lists<R: ChunkReader + 'static>(
    file: R,
    index: &ParquetIndex,
    (ranges, want_values): (&[Range<u64>], bool),
    path: &str,
    each: &mut EachList<'_>,
) -> Result<()> {
    let first_row = ranges[0].start;
    let reader = selected_rows(file, index, ranges, index.batch_rows as usize)
        .map_err(|e| decode_error(path, Some(first_row), &e))?;
    let mut records = ranges.iter().flat_map(Clone::clone);
    let mut values: Vec<i64> = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| decode_error(path, Some(first_row), e))?;
        let column = batch.column(0);
        for i in 0..batch.num_rows() {
            let record = records.next().ok_or_else(|| {
                format_error(path, None, "the decoder returned more rows than selected")
            })?;
            hand_over(
                column.as_ref(),
                (i, record),
                (want_values, &mut values),
                path,
                each,
            )?;
        }
    }
    if let Some(record) = records.next() {
        return Err(format_error(
            path,
            Some(record),
            "the decoder returned fewer rows than selected",
        ));
    }
    Ok(())
}

/// Hands `each` list `i` of `array`, which is shard record `record` (its ids too when `want`
/// is set, widened into `scratch` where they are not lent).
pub(super) fn hand_over(
    array: &dyn Array,
    (i, record): (usize, u64),
    (want, scratch): (bool, &mut Vec<i64>),
    path: &str,
    each: &mut EachList<'_>,
) -> Result<()> {
    scratch.clear();
    let (len, ids) = list_ids(array, i, want, scratch).map_err(|e| match e {
        ListError::Malformed(message) => format_error(path, Some(record), message),
        // The field is named by `for_each_list`, which knows the projection.
        ListError::DoesNotFit(message) => Error::Projection {
            path: path.to_owned(),
            row: record,
            field: String::new(),
            source_field: String::new(),
            message,
        },
    })?;
    each(record, len, ids.unwrap_or(Ids::I64(scratch)))
}

/// Why a record's token list cannot be handed over.
pub(in crate::formats) enum ListError {
    /// The list is not one of token ids (null, not a list, not integers).
    Malformed(String),
    /// An id is too large for any token dtype.
    DoesNotFit(String),
}

impl From<String> for ListError {
    fn from(message: String) -> Self {
        ListError::Malformed(message)
    }
}

/// `error` with the token field named where [`hand_over`] could not name it.
fn naming_field(error: Error, projection: &Projection) -> Error {
    match (error, projection.columns.first()) {
        (
            Error::Projection {
                path,
                row,
                field,
                message,
                ..
            },
            Some(column),
        ) if field.is_empty() => Error::Projection {
            path,
            row,
            field: column.name.clone(),
            source_field: column.source.clone(),
            message,
        },
        (error, _) => error,
    }
}

/// The length of list `i` of `array` and, when `want` is set, its ids: lent when the file
/// stores `i32` or `i64` (`Some`), else widened into `out` (`None`).
pub(in crate::formats) fn list_ids<'a>(
    array: &'a dyn Array,
    i: usize,
    want: bool,
    out: &mut Vec<i64>,
) -> std::result::Result<(u64, Option<Ids<'a>>), ListError> {
    if array.is_null(i) {
        return Err("the token list is null".to_owned().into());
    }
    let (child, range): (&dyn Array, Range<usize>) = match array.data_type() {
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            let o = l.value_offsets();
            (l.values().as_ref(), o[i] as usize..o[i + 1] as usize)
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            let o = l.value_offsets();
            (l.values().as_ref(), o[i] as usize..o[i + 1] as usize)
        }
        DataType::FixedSizeList(_, size) => {
            let size = *size as usize;
            (
                array.as_fixed_size_list().values().as_ref(),
                i * size..(i + 1) * size,
            )
        }
        other => return Err(format!("expected a list of token ids, found {other}").into()),
    };
    let len = range.len() as u64;
    if !want || range.is_empty() {
        return Ok((len, None));
    }
    if let Some(nulls) = child.logical_nulls() {
        if nulls.slice(range.start, range.len()).null_count() > 0 {
            return Err("a token id is null".to_owned().into());
        }
    }
    macro_rules! widen {
        ($t:ty) => {
            out.extend(
                child.as_primitive::<$t>().values()[range]
                    .iter()
                    .map(|&v| i64::from(v)),
            )
        };
    }
    match child.data_type() {
        // Stored at a column's own width: lent as decoded.
        DataType::Int32 => {
            let ids = &child.as_primitive::<Int32Type>().values()[range];
            return Ok((len, Some(Ids::I32(ids))));
        }
        DataType::Int64 => {
            let ids = &child.as_primitive::<Int64Type>().values()[range];
            return Ok((len, Some(Ids::I64(ids))));
        }
        DataType::Int8 => widen!(Int8Type),
        DataType::Int16 => widen!(Int16Type),
        DataType::UInt8 => widen!(UInt8Type),
        DataType::UInt16 => widen!(UInt16Type),
        DataType::UInt32 => widen!(UInt32Type),
        DataType::UInt64 => {
            for &v in &child.as_primitive::<UInt64Type>().values()[range] {
                out.push(i64::try_from(v).map_err(|_| {
                    ListError::DoesNotFit(format!(
                        "token id {v} does not fit i64, the widest token dtype"
                    ))
                })?);
            }
        }
        // Writers infer `list<null>` for a column whose lists are all empty.
        DataType::Null => {}
        other => return Err(format!("expected integer token ids, found {other}").into()),
    }
    Ok((len, None))
}
