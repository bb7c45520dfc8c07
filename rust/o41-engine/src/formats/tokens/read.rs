//! Reading windows: a window's tokens gathered from its pieces and written into the batch's
//! columns, with the columns a token stage derives from the pieces (`fill_window`).

use std::ops::Range;
use std::sync::Arc;

use super::{malformed, Aligned, TokenFile, TokenIndex};
use crate::columns::{Chunk, ColumnBuf};
use crate::config::WindowColumn;
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::token_ids::IdType;
use crate::formats::{parquet, ReadFailure, ShardReader};
use crate::order::pack::Piece;
use crate::storage::Object;

/// Writes window `w`'s `kind` column into elements `row` of `out` (one window): the pieces'
/// values (per token, or one length per piece), then `pad` to the row's end, so every element
/// of the row is written. The value that does not fit the column's dtype, or the number of
/// pieces that does not fit the row, is the error (checked for every shard at open, see
/// [`TokenIndex::largest_position`] and [`TokenIndex::most_pieces`]).
pub fn fill_window(
    index: &TokenIndex,
    w: u64,
    kind: WindowColumn,
    (out, row): (&mut ColumnBuf, Range<usize>),
    pad: i64,
    pieces: &mut Vec<Piece>,
) -> std::result::Result<(), u64> {
    pieces.clear();
    index.pieces(w, pieces);
    if kind == WindowColumn::Lengths && pieces.len() > row.len() {
        return Err(pieces.len() as u64);
    }
    let mut first = row.start;
    for (i, piece) in pieces.iter().enumerate() {
        if kind == WindowColumn::Labels {
            // Every token but the piece's last has its successor beside it: marked 0, to be
            // filled with it; the last has none in the window.
            let len = (piece.len as usize).min(row.end - first);
            let inner = len.saturating_sub(1);
            fill(out, first..first + inner, 0, 0)?;
            out.fill_int(first + inner..first + len, pad);
            first += len;
            continue;
        }
        let (len, value, step) = match kind {
            WindowColumn::Segments => (piece.len as usize, i as u64 + 1, 0),
            WindowColumn::Positions => (piece.len as usize, piece.position, 1),
            WindowColumn::Lengths => (1, piece.len.into(), 0),
            WindowColumn::Labels => unreachable!("filled above"),
        };
        let len = len.min(row.end - first);
        fill(out, first..first + len, value, step)?;
        first += len;
    }
    out.fill_int(first..row.end, pad);
    Ok(())
}

/// Where a piece of a window goes: tokens `start..start + len` of the stream into element
/// `out` of the token column, for row `row` (the shard's window, for errors).
pub(super) struct Need {
    pub(super) start: u64,
    pub(super) len: u64,
    pub(super) out: usize,
    pub(super) row: u64,
}

/// Reads windows of a token shard.
pub struct Reader {
    pub(super) object: Arc<Object>,
    pub(super) index: Arc<TokenIndex>,
    pub(super) encoding: Encoding,
}

impl Reader {
    /// A reader of the shard `object` that `index` describes.
    pub fn open(object: Arc<Object>, index: Arc<TokenIndex>, encoding: Encoding) -> Self {
        Reader {
            object,
            index,
            encoding,
        }
    }

    pub(super) fn read(
        &self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
    ) -> Result<()> {
        let path = self.object.uri();
        let field = self.index.layout.field();
        // `@segment_ids` and `@positions` are not record columns: the planner writes them.
        let tokens_column = projection.columns.iter().position(|c| c.source == field);
        // Columns read beside the tokens, element for element: (column, its Parquet column).
        let aligned: Vec<(usize, &Aligned)> = match &self.index.file {
            TokenFile::Parquet { aligned, .. } => projection
                .columns
                .iter()
                .enumerate()
                .filter_map(|(k, c)| aligned.iter().find(|a| a.field == c.source).map(|a| (k, a)))
                .collect(),
            _ => Vec::new(),
        };
        let mut needs: Vec<Need> = Vec::new();
        let mut pieces: Vec<Piece> = Vec::new();
        let mut out_row = 0usize;
        for range in ranges {
            for w in range.clone() {
                if w >= self.index.windows() {
                    return Err(malformed(
                        path,
                        self.encoding,
                        Some(w),
                        format!("the shard has {} windows", self.index.windows()),
                    ));
                }
                if let Some(k) = tokens_column {
                    pieces.clear();
                    self.index.pieces(w, &mut pieces);
                    let column = &projection.columns[k];
                    let mut at = 0usize;
                    for piece in &pieces {
                        needs.push(Need {
                            start: piece.start,
                            len: piece.len.into(),
                            out: out_row * column.width + at,
                            row: w,
                        });
                        at += piece.len as usize;
                    }
                    // The pieces fill the window from its start; the rest is padding, written
                    // here so the chunk need not be filled with pads first.
                    let row = out_row * column.width;
                    chunk.columns[k]
                        .fill_pad(row + at.min(column.width)..row + column.width, column.pad);
                    for &(a, _) in &aligned {
                        let other = &projection.columns[a];
                        chunk.columns[a]
                            .fill_pad(row + at.min(other.width)..row + other.width, other.pad);
                    }
                }
                out_row += 1;
            }
        }
        let Some(k) = tokens_column else {
            return Ok(());
        };
        needs.sort_by_key(|n| n.start);
        let column = &projection.columns[k];
        let fits = |row: u64, v: i128| Error::Projection {
            path: path.to_owned(),
            row,
            field: column.name.clone(),
            source_field: column.source.clone(),
            message: format!("token id {v} does not fit dtype {}", column.dtype.name()),
        };
        if let TokenFile::Parquet { record_starts, .. } = &self.index.file {
            for &(a, parquet_column) in &aligned {
                let other = &projection.columns[a];
                let fits = |row: u64, v: i128| Error::Projection {
                    path: path.to_owned(),
                    row,
                    field: other.name.clone(),
                    source_field: other.source.clone(),
                    message: format!("value {v} does not fit dtype {}", other.dtype.name()),
                };
                self.read_parquet(
                    &parquet_column.index,
                    &parquet_column.projection,
                    (record_starts, Some(&other.source)),
                    &needs,
                    &mut chunk.columns[a],
                    &fits,
                )?;
            }
        }
        let out = &mut chunk.columns[k];
        match &self.index.file {
            TokenFile::Flat { ids, offset, .. } => {
                self.read_flat((*ids, *offset), &needs, out, &fits)
            }
            TokenFile::Parquet {
                index,
                projection,
                record_starts,
                ..
            } => self.read_parquet(index, projection, (record_starts, None), &needs, out, &fits),
            TokenFile::Records {
                source,
                record_starts,
            } => self.read_records(&**source, record_starts, &needs, out, &fits),
        }
    }

    pub(super) fn read_flat(
        &self,
        (ids, offset): (IdType, u64),
        needs: &[Need],
        out: &mut ColumnBuf,
        fits: &dyn Fn(u64, i128) -> Error,
    ) -> Result<()> {
        let width = ids.width;
        // Byte ranges, merged through a gap no longer than the piece after it: fewer requests,
        // and never more than twice the bytes the windows need.
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for need in needs {
            let r = offset + need.start * width..offset + (need.start + need.len) * width;
            match ranges.last_mut() {
                Some(last) if r.start <= last.end + (r.end - r.start) => {
                    last.end = last.end.max(r.end);
                }
                _ => ranges.push(r),
            }
        }
        let pieces = self.object.read_pieces(&ranges)?;
        let mut bytes: Vec<u8> = Vec::new();
        let mut wide: Vec<i64> = Vec::new();
        for need in needs {
            let (from, to) = (
                offset + need.start * width,
                offset + (need.start + need.len) * width,
            );
            bytes.clear();
            gather(&pieces, from..to, &mut bytes);
            if bytes.len() as u64 != to - from {
                return Err(malformed(
                    self.object.uri(),
                    self.encoding,
                    Some(need.row),
                    format!("bytes {from}..{to} were not read"),
                ));
            }
            if let (IdType::U16, ColumnBuf::I32(buf)) = (ids, &mut *out) {
                // Every 16-bit id fits: straight into the column.
                let span = &mut buf[need.out..need.out + bytes.len() / 2];
                for (o, b) in span.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = i32::from(u16::from_le_bytes([b[0], b[1]]));
                }
                continue;
            }
            wide.clear();
            ids.decode(&bytes, &mut wide)
                .map_err(|v| fits(need.row, v))?;
            put_wide(out, need.out, &wide).map_err(|v| fits(need.row, i128::from(v)))?;
        }
        Ok(())
    }

    /// Fills `needs` from a list column: the token column, or (`aligned` naming it) a column
    /// read beside it, whose lists must be as long as the token lists.
    pub(super) fn read_parquet(
        &self,
        index: &parquet::ParquetIndex,
        projection: &Projection,
        (record_starts, aligned): (&[u64], Option<&str>),
        needs: &[Need],
        out: &mut ColumnBuf,
        fits: &dyn Fn(u64, i128) -> Error,
    ) -> Result<()> {
        let records = records_of(needs, record_starts);
        let path = self.object.uri();
        let mut lo = 0usize;
        parquet::for_each_list(
            &self.object,
            index,
            (&records, true),
            projection,
            &mut |record, _, values| {
                let len = values.len();
                let parts = record_parts(needs, &mut lo, record_starts, record, len).map_err(
                    |message| match aligned {
                        None => malformed(path, Encoding::Parquet, Some(record), message),
                        Some(field) => {
                            let r = record as usize;
                            let tokens = record_starts[r + 1] - record_starts[r];
                            Error::Projection {
                                path: path.to_owned(),
                                row: record,
                                field: field.to_owned(),
                                source_field: field.to_owned(),
                                message: format!(
                                    "it is read beside the tokens, element for element, and its \
                                     list holds {len} values where the record's token list holds \
                                     {tokens}"
                                ),
                            }
                        }
                    },
                )?;
                for (need, within, at) in parts {
                    put(out, at, values.slice(within))
                        .map_err(|v| fits(need.row, i128::from(v)))?;
                }
                Ok(())
            },
        )
    }
}

impl Reader {
    /// Fills `needs` from the token lists of a shard of records (Arrow, MDS): the records the
    /// pieces lie in are read once each, in order.
    pub(super) fn read_records(
        &self,
        source: &dyn crate::formats::TokenRecords,
        record_starts: &[u64],
        needs: &[Need],
        out: &mut ColumnBuf,
        fits: &dyn Fn(u64, i128) -> Error,
    ) -> Result<()> {
        let records = records_of(needs, record_starts);
        let path = self.object.uri();
        let encoding = self.encoding;
        let mut lo = 0usize;
        source.for_each(&self.object, &records, true, &mut |record, _, ids| {
            let parts = record_parts(needs, &mut lo, record_starts, record, ids.len())
                .map_err(|message| malformed(path, encoding, Some(record), message))?;
            for (need, within, at) in parts {
                put_wide(out, at, &ids[within]).map_err(|v| fits(need.row, i128::from(v)))?;
            }
            Ok(())
        })
    }
}

/// The records (sorted, merged ranges) the pieces `needs` lie in, of a shard whose record `r`
/// holds tokens `record_starts[r]..record_starts[r + 1]`.
fn records_of(needs: &[Need], record_starts: &[u64]) -> Vec<Range<u64>> {
    let record_of = |token: u64| record_starts.partition_point(|&s| s <= token) - 1;
    let mut records: Vec<Range<u64>> = Vec::new();
    for need in needs.iter().filter(|n| n.len > 0) {
        let r = record_of(need.start) as u64..record_of(need.start + need.len - 1) as u64 + 1;
        match records.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => records.push(r),
        }
    }
    records
}

/// A need, the tokens of a record it takes, and the column element they go to.
type Part<'n> = (&'n Need, Range<usize>, usize);

/// The parts of `needs` that record `record` (of `len` tokens, checked against what inspection
/// counted) holds: each need, the record's tokens it takes, and the column element they go to.
/// `lo` is the first need not yet passed, carried from record to record.
fn record_parts<'n>(
    needs: &'n [Need],
    lo: &mut usize,
    record_starts: &[u64],
    record: u64,
    len: usize,
) -> std::result::Result<impl Iterator<Item = Part<'n>> + 'n, String> {
    let (rs, re) = (
        record_starts[record as usize],
        record_starts[record as usize + 1],
    );
    if len as u64 != re - rs {
        return Err(format!(
            "the record holds {len} tokens, {} when the shard was inspected",
            re - rs
        ));
    }
    while *lo < needs.len() && needs[*lo].start + needs[*lo].len <= rs {
        *lo += 1;
    }
    Ok(needs[*lo..]
        .iter()
        .take_while(move |n| n.start < re)
        .filter_map(move |need| {
            let (from, to) = (need.start.max(rs), (need.start + need.len).min(re));
            (from < to).then(|| {
                let within = (from - rs) as usize..(to - rs) as usize;
                (need, within, need.out + (from - need.start) as usize)
            })
        }))
}

/// Appends the bytes `range` of the object, found in `pieces` (sorted, as read), to `out`.
pub(super) fn gather(pieces: &[(u64, bytes::Bytes)], range: Range<u64>, out: &mut Vec<u8>) {
    let k = pieces.partition_point(|(at, _)| *at <= range.start);
    let mut next = range.start;
    for (at, piece) in &pieces[k.saturating_sub(1)..] {
        let end = at + piece.len() as u64;
        if *at > next || next >= range.end {
            break;
        }
        if end <= next {
            continue;
        }
        let take = end.min(range.end);
        out.extend_from_slice(&piece[(next - at) as usize..(take - at) as usize]);
        next = take;
    }
}

/// Copies `ids` into an integer column from element `at`; the first value that does not fit
/// the column's dtype is the error. Ids of the column's own width are copied as they are.
pub(super) fn put(
    column: &mut ColumnBuf,
    at: usize,
    ids: parquet::Ids<'_>,
) -> std::result::Result<(), i64> {
    match (column, ids) {
        (ColumnBuf::I32(buf), parquet::Ids::I32(ids)) => {
            buf[at..at + ids.len()].copy_from_slice(ids);
        }
        (ColumnBuf::I64(buf), parquet::Ids::I32(ids)) => {
            for (o, &v) in buf[at..at + ids.len()].iter_mut().zip(ids) {
                *o = i64::from(v);
            }
        }
        (ColumnBuf::Bool(buf), parquet::Ids::I32(ids)) => {
            put_flags(
                &mut buf[at..at + ids.len()],
                ids.iter().map(|&v| i64::from(v)),
            )?;
        }
        (column, parquet::Ids::I64(values)) => return put_wide(column, at, values),
        // Token columns are declared i32 or i64, aligned ones may be bool too (checked with the
        // config).
        (ColumnBuf::F32(_) | ColumnBuf::F64(_), parquet::Ids::I32(_)) => {}
    }
    Ok(())
}

/// Copies 0/1 `values` into a bool column (an aligned mask); any other value is the error.
fn put_flags(out: &mut [u8], values: impl Iterator<Item = i64>) -> std::result::Result<(), i64> {
    for (o, v) in out.iter_mut().zip(values) {
        *o = match v {
            0 => 0,
            1 => 1,
            other => return Err(other),
        };
    }
    Ok(())
}

/// Copies `values` into an integer column from element `at`; the first value that does not fit
/// the column's dtype is the error. The range is checked once, so the copy vectorises.
pub(super) fn put_wide(
    column: &mut ColumnBuf,
    at: usize,
    values: &[i64],
) -> std::result::Result<(), i64> {
    match column {
        ColumnBuf::I32(buf) => {
            let (lo, hi) = values
                .iter()
                .fold((0i64, 0i64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            if lo < i64::from(i32::MIN) || hi > i64::from(i32::MAX) {
                let bad = values.iter().find(|&&v| i32::try_from(v).is_err());
                return Err(bad.copied().unwrap_or(hi));
            }
            for (o, &v) in buf[at..at + values.len()].iter_mut().zip(values) {
                *o = v as i32;
            }
        }
        ColumnBuf::I64(buf) => buf[at..at + values.len()].copy_from_slice(values),
        ColumnBuf::Bool(buf) => put_flags(&mut buf[at..at + values.len()], values.iter().copied())?,
        // Token columns are declared i32 or i64, aligned ones may be bool too (checked with the
        // config).
        ColumnBuf::F32(_) | ColumnBuf::F64(_) => {}
    }
    Ok(())
}

/// Writes `first, first + step, ...` into elements `range` of an integer column; the largest
/// value, when it does not fit the dtype, is the error.
pub(super) fn fill(
    column: &mut ColumnBuf,
    range: Range<usize>,
    first: u64,
    step: u64,
) -> std::result::Result<(), u64> {
    let last = first.saturating_add(step.saturating_mul(range.len().saturating_sub(1) as u64));
    match column {
        ColumnBuf::I32(buf) => {
            let start = i32::try_from(last)
                .map(|_| first as i32)
                .map_err(|_| last)?;
            for (j, o) in buf[range].iter_mut().enumerate() {
                *o = start + (step as i32) * j as i32;
            }
        }
        ColumnBuf::I64(buf) => {
            let start = i64::try_from(last)
                .map(|_| first as i64)
                .map_err(|_| last)?;
            for (j, o) in buf[range].iter_mut().enumerate() {
                *o = start + (step as i64) * j as i64;
            }
        }
        ColumnBuf::F32(_) | ColumnBuf::F64(_) | ColumnBuf::Bool(_) => {}
    }
    Ok(())
}

impl ShardReader for Reader {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        _prefetched: Option<crate::formats::Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        Ok(self.read(ranges, projection, chunk)?)
    }
}
