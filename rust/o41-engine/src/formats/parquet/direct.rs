//! Rows of a Parquet shard read page by page, for the columns training data is made of: numbers
//! and booleans, alone or in one list level, plain or dictionary encoded.
//!
//! arrow-rs reaches a row inside a page by decoding the repetition levels of every row before
//! it, and leaves the page after a row the same way. A rank of a large world reads a few rows
//! of nearly every page (its share of shuffled units), so that decoding, of rows it never
//! delivers, was most of what it paid over a rank of a small world. Here a page is read only if
//! it holds a wanted row (the offset index says which rows each page holds), its levels are
//! walked a run at a time to find the wanted records, and dictionary indices are skipped a run
//! at a time: only the wanted values are decoded. Each wanted run of rows becomes a small Arrow
//! array projected exactly as the decoder's output is ([`project_arrow_column`]).
//!
//! Anything else (other types or encodings, a shard without an offset index, a null, levels
//! that disagree with the page) makes [`read`] answer `None` before it is done: the caller then
//! reads the rows with arrow-rs, whose errors say what is wrong.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array,
    LargeListArray, ListArray,
};
use arrow_buffer::{BooleanBufferBuilder, OffsetBuffer};
use arrow_schema::{DataType, FieldRef};
use parquet::basic::{Encoding, Type as Physical};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::page_index::PageIndexProvider;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::SchemaDescriptor;

use super::list_lengths::{element_level, levels, prefixed, sections, single_leaf, Sections};
use super::rle::{lockstep, Hybrid};
use crate::columns::Chunk;
use crate::error::Error;
use crate::fields::Projection;
use crate::formats::ReadFailure;
use crate::from_arrow::project_arrow_column;

/// The element types read here.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    I32,
    I64,
    F32,
    F64,
    Bool,
}

impl Kind {
    fn of(arrow: &DataType, physical: Physical) -> Option<Self> {
        match (arrow, physical) {
            // Narrow integers are stored as INT32 holding their value (the format's INT(8|16)
            // annotations): read as it is stored, which every projection converts exactly (a
            // uint8 loss mask costs what an i32 list costs, not arrow-rs' casting reader).
            (
                DataType::Int32
                | DataType::Int16
                | DataType::Int8
                | DataType::UInt16
                | DataType::UInt8,
                Physical::INT32,
            ) => Some(Kind::I32),
            (DataType::Int64, Physical::INT64) => Some(Kind::I64),
            (DataType::Float32, Physical::FLOAT) => Some(Kind::F32),
            (DataType::Float64, Physical::DOUBLE) => Some(Kind::F64),
            (DataType::Boolean, Physical::BOOLEAN) => Some(Kind::Bool),
            _ => None,
        }
    }

    /// The Arrow type of the values decoded.
    fn arrow_type(self) -> DataType {
        match self {
            Kind::I32 => DataType::Int32,
            Kind::I64 => DataType::Int64,
            Kind::F32 => DataType::Float32,
            Kind::F64 => DataType::Float64,
            Kind::Bool => DataType::Boolean,
        }
    }

    /// Bytes of a plain value; booleans are bits.
    fn width(self) -> usize {
        match self {
            Kind::I32 | Kind::F32 => 4,
            Kind::I64 | Kind::F64 => 8,
            Kind::Bool => 0,
        }
    }
}

/// How one projected column is laid out, when it is a layout read here.
struct Layout {
    leaf: usize,
    kind: Kind,
    /// The list's item field and whether its offsets are 64-bit; `None` for a column of values.
    list: Option<(FieldRef, bool)>,
    max_def: i16,
    /// Definition level of a present value (for a list: of an element slot).
    element: i16,
}

impl Layout {
    fn of(schema: &SchemaDescriptor, arrow: &DataType, root: usize) -> Option<Self> {
        let leaf = single_leaf(schema, root)?;
        let column = schema.column(leaf);
        let max_def = column.max_def_level();
        let physical = column.physical_type();
        let (kind, list, element) = match (arrow, column.max_rep_level()) {
            (DataType::List(item) | DataType::LargeList(item), 1) => {
                let large = matches!(arrow, DataType::LargeList(_));
                let kind = Kind::of(item.data_type(), physical)?;
                // The arrays built here hold the values as decoded (a narrow integer as i32).
                let item = Arc::new(item.as_ref().clone().with_data_type(kind.arrow_type()));
                (kind, Some((item, large)), element_level(&column))
            }
            (other, 0) => (Kind::of(other, physical)?, None, max_def),
            _ => return None,
        };
        Some(Layout {
            leaf,
            kind,
            list,
            max_def,
            element,
        })
    }
}

/// Decoded values of one kind.
enum Values {
    I32(Vec<i32>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(BooleanBufferBuilder),
}

impl Values {
    fn new(kind: Kind) -> Self {
        match kind {
            Kind::I32 => Values::I32(Vec::new()),
            Kind::I64 => Values::I64(Vec::new()),
            Kind::F32 => Values::F32(Vec::new()),
            Kind::F64 => Values::F64(Vec::new()),
            Kind::Bool => Values::Bool(BooleanBufferBuilder::new(0)),
        }
    }

    /// Appends plain-encoded values `range` of `bytes`.
    fn plain(&mut self, bytes: &[u8], range: Range<usize>) -> Option<()> {
        macro_rules! fixed {
            ($v:expr, $t:ty, $w:expr) => {{
                let raw = bytes.get(range.start.checked_mul($w)?..range.end.checked_mul($w)?)?;
                $v.extend(
                    raw.chunks_exact($w)
                        .map(|b| <$t>::from_le_bytes(b.try_into().expect("a whole value"))),
                );
            }};
        }
        match self {
            Values::I32(v) => fixed!(v, i32, 4),
            Values::I64(v) => fixed!(v, i64, 8),
            Values::F32(v) => fixed!(v, f32, 4),
            Values::F64(v) => fixed!(v, f64, 8),
            Values::Bool(v) => {
                if range.end.div_ceil(8) > bytes.len() {
                    return None;
                }
                v.append_packed_range(range, bytes);
            }
        }
        Some(())
    }

    /// Appends `dictionary`'s entries at the next `n` of `indices`.
    fn gather(&mut self, dictionary: &Values, indices: &mut Hybrid, n: usize) -> Option<()> {
        if n == 0 {
            return Some(());
        }
        // An index past the dictionary reads its first entry and is caught after the page's
        // run, so the unpacking loop has no early exit.
        let past = std::cell::Cell::new(false);
        macro_rules! gather {
            ($v:expr, $d:expr) => {{
                let first = *$d.first()?;
                indices.read_map(n, $v, |i| match $d.get(i as usize) {
                    Some(&entry) => entry,
                    None => {
                        past.set(true);
                        first
                    }
                })?;
            }};
        }
        match (self, dictionary) {
            (Values::I32(v), Values::I32(d)) => gather!(v, d),
            (Values::I64(v), Values::I64(d)) => gather!(v, d),
            (Values::F32(v), Values::F32(d)) => gather!(v, d),
            (Values::F64(v), Values::F64(d)) => gather!(v, d),
            _ => return None,
        }
        (!past.get()).then_some(())
    }

    fn into_array(self) -> ArrayRef {
        match self {
            Values::I32(v) => Arc::new(Int32Array::from(v)),
            Values::I64(v) => Arc::new(Int64Array::from(v)),
            Values::F32(v) => Arc::new(Float32Array::from(v)),
            Values::F64(v) => Arc::new(Float64Array::from(v)),
            Values::Bool(mut v) => Arc::new(BooleanArray::new(v.finish(), None)),
        }
    }
}

/// A data page's records and values, ready to be taken from in order.
struct DataPage<'a> {
    /// Values in each record of the page.
    counts: Vec<u32>,
    /// Where the values are, and how they are encoded.
    values: PageValues<'a>,
    /// Records passed so far.
    record: usize,
    /// Values passed so far: those of the records passed.
    at: usize,
}

enum PageValues<'a> {
    Plain(&'a [u8]),
    Dictionary(Hybrid<'a>),
    /// Booleans in the hybrid encoding (version 2 pages).
    Bits(Hybrid<'a>),
}

impl<'a> DataPage<'a> {
    /// Reads `page`'s levels into record counts; `None` where it holds a null, a record that
    /// starts in an earlier page, or another number of records than `rows`.
    fn new(page: &'a Page, layout: &Layout, rows: usize) -> Option<Self> {
        let Sections {
            rep,
            def,
            values,
            count,
            encoding,
        } = sections(page, layout.list.is_some(), layout.max_def > 0)?;
        let counts = record_counts((rep, def), count, layout, rows)?;
        let values = match (encoding, layout.kind, page) {
            (Encoding::PLAIN, _, _) => PageValues::Plain(values),
            (Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY, kind, _)
                if kind != Kind::Bool =>
            {
                let (&width, indices) = values.split_first()?;
                PageValues::Dictionary(Hybrid::new(indices, width)?)
            }
            (Encoding::RLE, Kind::Bool, Page::DataPageV2 { .. }) => {
                PageValues::Bits(Hybrid::new(prefixed(values)?.0, 1)?)
            }
            _ => return None,
        };
        Some(DataPage {
            counts,
            values,
            record: 0,
            at: 0,
        })
    }

    /// Appends the values of records `records` (of this page, in order, past any taken before)
    /// to `out`, and their counts to `lengths`.
    fn take(
        &mut self,
        records: Range<usize>,
        dictionary: Option<&Values>,
        out: &mut Values,
        lengths: &mut Vec<u32>,
        scratch: &mut Vec<u32>,
    ) -> Option<()> {
        let skip: usize = self
            .counts
            .get(self.record..records.start)?
            .iter()
            .map(|&c| c as usize)
            .sum();
        let first = self.at + skip;
        let counts = self.counts.get(records.clone())?;
        self.record = records.end;
        let n: usize = counts.iter().map(|&c| c as usize).sum();
        lengths.extend_from_slice(counts);
        match &mut self.values {
            PageValues::Plain(bytes) => out.plain(bytes, first..first + n)?,
            PageValues::Dictionary(indices) => {
                indices.skip(skip as u64)?;
                out.gather(dictionary?, indices, n)?;
            }
            PageValues::Bits(bits) => {
                bits.skip(skip as u64)?;
                scratch.clear();
                bits.read(n, scratch)?;
                let Values::Bool(v) = out else { return None };
                for &b in scratch.iter() {
                    v.append(b != 0);
                }
            }
        }
        self.at = first + n;
        Some(())
    }
}

/// Records and values a page read here may hold: a few bytes of runs can claim billions of
/// either, and the arrow-rs reader, which decodes in batches, takes pages past these bounds.
const MAX_PAGE_RECORDS: usize = 1 << 20;
const MAX_PAGE_VALUES: u64 = 1 << 22;

/// Values in each record of a page of `count` levels, which must hold `rows` records, none of
/// them null or holding a null.
fn record_counts(
    (rep, def): (&[u8], &[u8]),
    count: u32,
    layout: &Layout,
    rows: usize,
) -> Option<Vec<u32>> {
    if rows > MAX_PAGE_RECORDS || u64::from(count) > MAX_PAGE_VALUES {
        return None;
    }
    let mut counts: Vec<u32> = Vec::with_capacity(rows);
    let list = layout.list.is_some();
    lockstep(
        levels(rep, i16::from(list)),
        levels(def, layout.max_def),
        count,
        |r, d, n| {
            let d = i16::try_from(d).ok()?;
            let present = d >= layout.element;
            if d > layout.max_def || (present && d < layout.max_def) {
                // A null element, or a level past the column's.
                return None;
            }
            match (r, list) {
                // A null value, or a null list (below an empty one's level).
                (0, _) if counts.len() + n as usize > rows => return None,
                (0, false) if !present => return None,
                (0, true) if d < layout.element - 1 => return None,
                (0, _) => counts.extend(std::iter::repeat_n(u32::from(present), n as usize)),
                (1, true) => {
                    let last = counts.last_mut().filter(|_| present)?;
                    *last = last.checked_add(n)?;
                }
                _ => return None,
            }
            Some(())
        },
    )?;
    (counts.len() == rows).then_some(counts)
}

/// Decodes a plain dictionary page.
fn dictionary(page: &Page, kind: Kind) -> Option<Values> {
    let Page::DictionaryPage {
        buf,
        num_values,
        encoding,
        ..
    } = page
    else {
        return None;
    };
    if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) || kind == Kind::Bool {
        return None;
    }
    let n = *num_values as usize;
    if n.checked_mul(kind.width())? > buf.len() {
        return None;
    }
    let mut values = Values::new(kind);
    values.plain(buf, 0..n)?;
    Some(values)
}

/// Builds the array of `lengths` records holding `values`, as the decoder would.
fn array(layout: &Layout, values: Values, lengths: &[u32]) -> Option<ArrayRef> {
    let values = values.into_array();
    let Some((item, large)) = &layout.list else {
        return Some(values);
    };
    let array: ArrayRef = if *large {
        let offsets = OffsetBuffer::<i64>::from_lengths(lengths.iter().map(|&l| l as usize));
        Arc::new(LargeListArray::try_new(item.clone(), offsets, values, None).ok()?)
    } else {
        let total: usize = lengths.iter().map(|&l| l as usize).sum();
        i32::try_from(total).ok()?;
        let offsets = OffsetBuffer::<i32>::from_lengths(lengths.iter().map(|&l| l as usize));
        Arc::new(ListArray::try_new(item.clone(), offsets, values, None).ok()?)
    };
    Some(array)
}

/// The page index and the layout of root column `root`, where it is one read here.
fn column_layout<'m>(
    metadata: &'m ParquetMetaData,
    arrow_fields: &[FieldRef],
    root: usize,
) -> Option<(&'m dyn PageIndexProvider, Layout)> {
    let schema = metadata.file_metadata().schema_descr();
    let name = schema.root_schema().get_fields().get(root)?.name();
    let field = arrow_fields.get(root).filter(|f| f.name() == name)?;
    let layout = Layout::of(schema, field.data_type(), root)?;
    Some((metadata.page_index()?.as_ref(), layout))
}

/// What reading one column came to.
enum Column {
    /// Every wanted row projected.
    Done,
    /// The first row whose projection failed: its place in the chunk, and the error.
    Failed(usize, Error),
}

/// Reads rows `ranges` (sorted, disjoint) of every column of `projection` into `chunk`, as the
/// arrow-rs reader of the same rows would; `Ok(None)` where some column is not one read here
/// (nothing is then promised about what the chunk holds).
pub(super) fn read<R: ChunkReader + 'static>(
    reader: &Arc<R>,
    metadata: &ParquetMetaData,
    arrow_fields: &[FieldRef],
    (group_starts, ranges): (&[u64], &[Range<u64>]),
    projection: &Projection,
    (chunk, path): (&mut Chunk, &str),
) -> parquet::errors::Result<Option<std::result::Result<(), ReadFailure>>> {
    let schema = metadata.file_metadata().schema_descr();
    let mut earliest: Option<(usize, Error)> = None;
    for (k, column) in projection.columns.iter().enumerate() {
        let Some(root) = (0..schema.root_schema().get_fields().len())
            .find(|&r| schema.root_schema().get_fields()[r].name() == column.source)
        else {
            return Ok(None);
        };
        let outcome = read_column(
            reader,
            (metadata, arrow_fields, root),
            (group_starts, ranges),
            |array, out_row, row_base| {
                project_arrow_column(
                    array,
                    column,
                    0..array.len(),
                    &mut chunk.columns[k],
                    out_row,
                    path,
                    row_base,
                )
            },
        )?;
        match outcome {
            None => return Ok(None),
            Some(Column::Done) => {}
            Some(Column::Failed(row, error)) => {
                if earliest.as_ref().is_none_or(|(r, _)| row < *r) {
                    earliest = Some((row, error));
                }
            }
        }
    }
    Ok(Some(match earliest {
        None => Ok(()),
        Some((rows_done, error)) => Err(ReadFailure { rows_done, error }),
    }))
}

/// Hands `visit(array, first_record)` the rows `ranges` (sorted, disjoint) of root column
/// `root`, a run of them at a time, in order; `Ok(None)` where the column is not read here or
/// its pages stop reading so (some runs may have been handed over by then).
pub(super) fn runs<R: ChunkReader + 'static>(
    reader: &Arc<R>,
    metadata: &ParquetMetaData,
    arrow_fields: &[FieldRef],
    (group_starts, ranges): (&[u64], &[Range<u64>]),
    root: usize,
    visit: &mut dyn FnMut(&dyn Array, u64) -> crate::error::Result<()>,
) -> parquet::errors::Result<Option<crate::error::Result<()>>> {
    let outcome = read_column(
        reader,
        (metadata, arrow_fields, root),
        (group_starts, ranges),
        |array, _, first| visit(array, first),
    )?;
    Ok(outcome.map(|column| match column {
        Column::Done => Ok(()),
        Column::Failed(_, error) => Err(error),
    }))
}

/// Reads root column `root`'s wanted rows, handing `project(array, chunk_row, shard_row)` each
/// run of them that one page holds; `Ok(None)` where the column is not one read here.
fn read_column<R: ChunkReader + 'static>(
    reader: &Arc<R>,
    (metadata, arrow_fields, root): (&ParquetMetaData, &[FieldRef], usize),
    (group_starts, ranges): (&[u64], &[Range<u64>]),
    mut project: impl FnMut(&dyn Array, usize, u64) -> crate::error::Result<()>,
) -> parquet::errors::Result<Option<Column>> {
    let Some((offsets, layout)) = column_layout(metadata, arrow_fields, root) else {
        return Ok(None);
    };
    let layout = &layout;
    let mut out_row = 0usize;
    let mut lengths: Vec<u32> = Vec::new();
    let mut scratch: Vec<u32> = Vec::new();
    let mut next = 0usize; // the first range not yet read past
    for g in 0..metadata.num_row_groups() {
        let (first, end) = (group_starts[g], group_starts[g + 1]);
        let wanted: Vec<Range<u64>> = ranges[next..]
            .iter()
            .take_while(|r| r.start < end)
            .filter(|r| r.end > first)
            .map(|r| r.start.max(first) - first..r.end.min(end) - first)
            .collect();
        if wanted.is_empty() {
            continue;
        }
        while next < ranges.len() && ranges[next].end <= end {
            next += 1;
        }
        let Some(locations) = offsets
            .offset_index(g, layout.leaf)
            .map(|index| index.page_locations().clone())
        else {
            return Ok(None);
        };
        let group_rows = end - first;
        let group = metadata.row_group(g);
        let starts: Vec<u64> = locations.iter().map(|l| l.first_row_index as u64).collect();
        let mut pages = SerializedPageReader::new(
            reader.clone(),
            group.column(layout.leaf),
            group_rows as usize,
            Some(locations),
        )?;
        let mut dictionary_values: Option<Values> = None;
        let mut p = 0usize;
        let mut w = 0usize;
        while w < wanted.len() {
            let Some(meta) = pages.peek_next_page()? else {
                return Ok(None);
            };
            if meta.is_dict {
                let page = pages.get_next_page()?.ok_or_else(|| {
                    parquet::errors::ParquetError::General("a dictionary page vanished".into())
                })?;
                let Some(values) = dictionary(&page, layout.kind) else {
                    return Ok(None);
                };
                dictionary_values = Some(values);
                continue;
            }
            let Some(&from) = starts.get(p) else {
                return Ok(None);
            };
            let to = starts.get(p + 1).copied().unwrap_or(group_rows);
            p += 1;
            if to <= from || wanted[w].start >= to {
                pages.skip_next_page()?;
                continue;
            }
            let Some(page) = pages.get_next_page()? else {
                return Ok(None);
            };
            let Some(mut data) = DataPage::new(&page, layout, (to - from) as usize) else {
                return Ok(None);
            };
            while w < wanted.len() && wanted[w].start < to {
                let (a, b) = (wanted[w].start.max(from), wanted[w].end.min(to));
                let mut values = Values::new(layout.kind);
                lengths.clear();
                let records = (a - from) as usize..(b - from) as usize;
                if data
                    .take(
                        records,
                        dictionary_values.as_ref(),
                        &mut values,
                        &mut lengths,
                        &mut scratch,
                    )
                    .is_none()
                {
                    return Ok(None);
                }
                let Some(array) = array(layout, values, &lengths) else {
                    return Ok(None);
                };
                if let Err(error) = project(array.as_ref(), out_row, first + a) {
                    // A projection error names its shard row; its place in the chunk follows.
                    let at = match &error {
                        Error::Projection { row, .. } => out_row + (row - (first + a)) as usize,
                        _ => out_row,
                    };
                    return Ok(Some(Column::Failed(at, error)));
                }
                out_row += (b - a) as usize;
                if b < wanted[w].end {
                    break; // the range goes on in the next page
                }
                w += 1;
            }
        }
    }
    // Rows past the shard's row groups were never handed over: arrow-rs reads the job
    // instead, and reports the shortfall.
    let wanted: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    if out_row as u64 != wanted {
        return Ok(None);
    }
    Ok(Some(Column::Done))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dictionary indices 0, 1, 2 then `last`, bit-packed at two bits in one group of eight.
    fn indices(last: u8) -> Vec<u8> {
        let group = [0u8, 1, 2, last, 0, 0, 0, 0];
        let mut bits = 0u16;
        for (k, &v) in group.iter().enumerate() {
            bits |= u16::from(v) << (2 * k);
        }
        let mut data = vec![(1 << 1) | 1];
        data.extend_from_slice(&bits.to_le_bytes());
        data
    }

    #[test]
    fn gather_maps_indices_and_refuses_one_past_the_dictionary() {
        let dictionary = Values::I64(vec![10, 20, 30]);
        let data = indices(2);
        let mut out = Values::I64(Vec::new());
        let mut hybrid = Hybrid::new(&data, 2).unwrap();
        out.gather(&dictionary, &mut hybrid, 4).unwrap();
        let Values::I64(v) = &out else { unreachable!() };
        assert_eq!(v, &[10, 20, 30, 30]);

        let data = indices(3);
        let mut hybrid = Hybrid::new(&data, 2).unwrap();
        assert!(out.gather(&dictionary, &mut hybrid, 4).is_none());
        // Nothing to take needs no dictionary entry.
        let mut hybrid = Hybrid::new(&data, 2).unwrap();
        assert!(Values::I64(Vec::new())
            .gather(&Values::I64(Vec::new()), &mut hybrid, 0)
            .is_some());
    }

    /// Level or index bytes: hybrid runs with small counts and values, so pages often hold
    /// the records asked for, then any byte overwritten.
    fn hybrid_bytes() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        (
            proptest::collection::vec((any::<bool>(), 0u8..8, any::<u8>()), 0..6),
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..2),
        )
            .prop_map(|(runs, flips)| {
                let mut out = Vec::new();
                for (packed, count, value) in runs {
                    if packed {
                        // `count` groups of eight one-bit values (widths here are small).
                        out.push((count << 1) | 1);
                        out.extend(std::iter::repeat_n(value, usize::from(count)));
                    } else {
                        out.push(count << 1);
                        out.push(value % 4);
                    }
                }
                for (at, byte) in flips {
                    if !out.is_empty() {
                        let k = at % out.len();
                        out[k] = byte;
                    }
                }
                out
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20000))]

        /// A data page of any levels, indices and values, against any column layout, is read
        /// or declined: never a panic, nor values that disagree with the record counts handed
        /// over with them. (The file-level fuzz in `tests/fuzz.rs` reads through the guard that
        /// turns a decoder's panic into an error, so it would not see one of these.)
        #[test]
        fn any_page_is_read_or_declined(
            (kind, list, nullable) in (0usize..5, proptest::prelude::any::<bool>(), proptest::prelude::any::<bool>()),
            (v2, encoding) in (proptest::prelude::any::<bool>(), 0usize..4),
            (rep, def) in (hybrid_bytes(), hybrid_bytes()),
            // Short value sections often end inside the values the levels claim.
            values in proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12),
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96),
            ],
            count in proptest::prop_oneof![0u32..16, 0u32..80],
            takes in proptest::collection::vec(0usize..6, 0..4),
            entries in 0usize..5,
            present in proptest::prelude::any::<bool>(),
        ) {
            let kind = [Kind::I32, Kind::I64, Kind::F32, Kind::F64, Kind::Bool][kind];
            let item = Arc::new(arrow_schema::Field::new("item", DataType::Int32, false));
            let max_def = i16::from(list) * 2 + i16::from(nullable);
            let layout = Layout {
                leaf: 0,
                kind,
                list: list.then_some((item, false)),
                max_def,
                element: max_def,
            };
            let encoding = [
                Encoding::PLAIN,
                Encoding::RLE_DICTIONARY,
                Encoding::PLAIN_DICTIONARY,
                Encoding::RLE,
            ][encoding];
            // Often every slot present, so lists' repetition levels are what decides.
            let def = if present && max_def > 0 {
                let mut run = Vec::new();
                let mut header = u64::from(count) << 1;
                while header >= 0x80 {
                    run.push((header as u8) | 0x80);
                    header >>= 7;
                }
                run.extend([header as u8, max_def as u8]);
                run
            } else {
                def
            };
            let mut buf = Vec::new();
            let page = if v2 {
                buf.extend_from_slice(&rep);
                buf.extend_from_slice(&def);
                buf.extend_from_slice(&values);
                Page::DataPageV2 {
                    buf: buf.into(),
                    num_values: count,
                    encoding,
                    num_nulls: 0,
                    num_rows: 0,
                    def_levels_byte_len: def.len() as u32,
                    rep_levels_byte_len: rep.len() as u32,
                    is_compressed: false,
                    statistics: None,
                }
            } else {
                for section in [&rep, &def] {
                    buf.extend_from_slice(&(section.len() as u32).to_le_bytes());
                    buf.extend_from_slice(section);
                }
                buf.extend_from_slice(&values);
                Page::DataPage {
                    buf: buf.into(),
                    num_values: count,
                    encoding,
                    def_level_encoding: Encoding::RLE,
                    rep_level_encoding: Encoding::RLE,
                    statistics: None,
                }
            };
            let dictionary = match kind {
                Kind::I32 => Values::I32((0..entries as i32).collect()),
                Kind::I64 => Values::I64((0..entries as i64).collect()),
                Kind::F32 => Values::F32((0..entries).map(|e| e as f32).collect()),
                Kind::F64 => Values::F64((0..entries).map(|e| e as f64).collect()),
                Kind::Bool => Values::Bool(BooleanBufferBuilder::new(0)),
            };
            for rows in 0..=count as usize {
                let Some(mut data) = DataPage::new(&page, &layout, rows) else {
                    continue;
                };
                let mut out = Values::new(kind);
                let (mut lengths, mut scratch) = (Vec::new(), Vec::new());
                let mut next = 0;
                for &take in &takes {
                    let records = next..(next + take).min(rows);
                    next = records.end;
                    if data
                        .take(records, Some(&dictionary), &mut out, &mut lengths, &mut scratch)
                        .is_none()
                    {
                        break;
                    }
                    let total: usize = lengths.iter().map(|&l| l as usize).sum();
                    let held = match &out {
                        Values::I32(v) => v.len(),
                        Values::I64(v) => v.len(),
                        Values::F32(v) => v.len(),
                        Values::F64(v) => v.len(),
                        Values::Bool(v) => v.len(),
                    };
                    proptest::prop_assert_eq!(held, total);
                }
            }
        }
    }
}
