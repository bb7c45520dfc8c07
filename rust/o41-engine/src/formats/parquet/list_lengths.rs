//! Record lengths of a Parquet list column from its repetition and definition levels alone.
//!
//! Packing a Parquet token shard plans from every document's length. Decoding the column for
//! that decodes every id too, and ids are almost all of a token column's bytes: the levels are
//! a few bytes a page (a run of `1`s per record). This reads them page by page, straight from
//! the Parquet encoding (the RLE / bit-packed hybrid, `parquet-format`'s `Encodings.md`), and
//! never decodes a value. It reads the layouts a plain list of ids has, and answers `None` for
//! anything else (a null list, the deprecated `BIT_PACKED` level encoding, levels that do not
//! add up): the caller then decodes the lists, whose errors name what is wrong.
//!
//! Shards the dataset saver writes carry their list columns' lengths in the footer as well
//! ([`footer_value`], `docs/formats.md`), so a shard of theirs is planned from its footer, which
//! open reads anyway, and not a byte of its pages. That index is trusted only as far as the
//! footer's own counts confirm it: each row group's records and level count must come out of
//! the lengths exactly, and the reader still holds every record to its planned length.

use std::io::{Read, Write};
use std::sync::Arc;

use base64::Engine;

use parquet::basic::{Encoding, Repetition};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::{ColumnDescriptor, SchemaDescriptor};

use super::rle::{bit_width, lockstep, Hybrid};

/// The list lengths of every record of root column `root`, in record order, or `None` where the
/// column is not a list of one level that this reads (see the module's notes). At most
/// `max_records` lengths are kept: a file whose levels start more records than its footer
/// counts is not read this way.
pub(super) fn list_lengths<R: ChunkReader + 'static>(
    reader: &Arc<R>,
    metadata: &ParquetMetaData,
    root: usize,
    max_records: u64,
) -> parquet::errors::Result<Option<Vec<u64>>> {
    let schema = metadata.file_metadata().schema_descr();
    let Some(leaf) = single_leaf(schema, root) else {
        return Ok(None);
    };
    let column = schema.column(leaf);
    if column.max_rep_level() != 1 {
        return Ok(None);
    }
    let shape = Shape {
        max_def: column.max_def_level(),
        element: element_level(&column),
    };
    let mut walk = Walk {
        lengths: Vec::new(),
        open: None,
        max_records,
    };
    for g in 0..metadata.num_row_groups() {
        let group = metadata.row_group(g);
        let before = walk.lengths.len();
        let mut pages = SerializedPageReader::new(
            reader.clone(),
            group.column(leaf),
            group.num_rows() as usize,
            None,
        )?;
        while let Some(page) = pages.get_next_page()? {
            if walk.page(&page, &shape).is_none() {
                return Ok(None);
            }
        }
        // Records never span row groups.
        if walk.close().is_none() || (walk.lengths.len() - before) as i64 != group.num_rows() {
            return Ok(None);
        }
    }
    Ok(Some(walk.lengths))
}

/// The footer key under which the saver stores a list column's record lengths: this prefix and
/// the column's name.
pub const FOOTER_KEY_PREFIX: &str = "o41.list_lengths.";

/// The value's format tag: version 1 is the lengths as little-endian `u32`s, deflated, then
/// base64 (standard alphabet, padded).
const FOOTER_VERSION: &str = "1:";

/// The footer value for a column whose records hold `lengths` values; `None` where one does not
/// fit a `u32` (no index is written then).
pub fn footer_value(lengths: &[u64]) -> Option<String> {
    let mut raw = Vec::with_capacity(lengths.len() * 4);
    for &len in lengths {
        raw.extend_from_slice(&u32::try_from(len).ok()?.to_le_bytes());
    }
    let mut deflate =
        flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    deflate.write_all(&raw).ok()?;
    let packed = deflate.finish().ok()?;
    Some(format!(
        "{FOOTER_VERSION}{}",
        base64::engine::general_purpose::STANDARD.encode(packed)
    ))
}

/// The record lengths of root column `root` from the saver's footer index, when the footer has
/// one for it that agrees with the footer's counts (`rows` records; per row group, its records
/// and the leaf column's level count); `None` otherwise, and the levels are read instead.
pub(super) fn footer_lengths(
    metadata: &ParquetMetaData,
    root: usize,
    rows: u64,
) -> Option<Vec<u64>> {
    let file = metadata.file_metadata();
    let name = file
        .schema_descr()
        .root_schema()
        .get_fields()
        .get(root)?
        .name();
    let key = format!("{FOOTER_KEY_PREFIX}{name}");
    let value = file
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_deref()?
        .strip_prefix(FOOTER_VERSION)?;
    let packed = base64::engine::general_purpose::STANDARD
        .decode(value)
        .ok()?;
    // Inflate no further than the lengths `rows` records take, and one byte past to tell a
    // longer index; deflate expands at most 1,032 times, so a claim past that is refused
    // before anything is allocated for it.
    let want = rows.checked_mul(4)?;
    if want > (packed.len() as u64).saturating_mul(1032) {
        return None;
    }
    let mut raw = Vec::with_capacity(usize::try_from(want).ok()?);
    flate2::read::DeflateDecoder::new(packed.as_slice())
        .take(want + 1)
        .read_to_end(&mut raw)
        .ok()?;
    if raw.len() as u64 != want {
        return None;
    }
    let lengths: Vec<u64> = raw
        .chunks_exact(4)
        .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .collect();
    agree_with_levels(metadata, root, &lengths).then_some(lengths)
}

/// Whether `lengths` (one per record) agree with the footer's counts for root column `root`:
/// each row group's records, and its leaf column's level count (each record of a list column
/// adds one level per value, and one for an empty list). Lengths from an index or a cache entry
/// that disagree are not this shard's.
pub(super) fn agree_with_levels(metadata: &ParquetMetaData, root: usize, lengths: &[u64]) -> bool {
    let Some(leaf) = single_leaf(metadata.file_metadata().schema_descr(), root) else {
        return false;
    };
    let mut at = 0usize;
    for g in 0..metadata.num_row_groups() {
        let group = metadata.row_group(g);
        let Some(end) = usize::try_from(group.num_rows())
            .ok()
            .and_then(|records| at.checked_add(records))
        else {
            return false;
        };
        let Some(records) = lengths.get(at..end) else {
            return false;
        };
        let levels = records
            .iter()
            .try_fold(0u64, |sum, &l| sum.checked_add(l.max(1)));
        if levels.and_then(|l| i64::try_from(l).ok()) != Some(group.column(leaf).num_values()) {
            return false;
        }
        at = end;
    }
    at == lengths.len()
}

/// What the levels of one list column mean.
struct Shape {
    max_def: i16,
    /// Definition level of an element slot (one below it: an empty list; further below: null).
    element: i16,
}

/// The one leaf column under root column `root`; `None` for a root of several.
pub(super) fn single_leaf(schema: &SchemaDescriptor, root: usize) -> Option<usize> {
    let mut leaves = (0..schema.num_columns()).filter(|&c| schema.get_column_root_idx(c) == root);
    let leaf = leaves.next()?;
    leaves.next().is_none().then_some(leaf)
}

/// The definition level at which a list column's leaf holds an element slot: an optional
/// element adds one level under the repeated node, a required or repeated leaf none.
pub(super) fn element_level(column: &ColumnDescriptor) -> i16 {
    let max_def = column.max_def_level();
    match column.self_type().get_basic_info().repetition() {
        Repetition::OPTIONAL => max_def - 1,
        Repetition::REQUIRED | Repetition::REPEATED => max_def,
    }
}

/// Levels of a section that holds levels of at most `max` (none when `max` is 0).
pub(super) fn levels(section: &[u8], max: i16) -> Option<Hybrid<'_>> {
    (max > 0).then(|| {
        Hybrid::new(section, bit_width(max as u32)).expect("levels are narrower than 16 bits")
    })
}

/// Lengths found so far, and the record still open.
struct Walk {
    lengths: Vec<u64>,
    open: Option<u64>,
    max_records: u64,
}

impl Walk {
    /// Adds one data page's levels; `None` where the page is not one this reads.
    fn page(&mut self, page: &Page, shape: &Shape) -> Option<()> {
        if matches!(page, Page::DictionaryPage { .. }) {
            return Some(());
        }
        let Sections {
            rep, def, count, ..
        } = sections(page, true, shape.max_def > 0)?;
        lockstep(
            levels(rep, 1),
            levels(def, shape.max_def),
            count,
            |r, d, n| self.levels(r, d, n, shape),
        )
    }

    /// `n` levels of repetition `r` and definition `d`.
    fn levels(&mut self, r: u32, d: u32, n: u32, shape: &Shape) -> Option<()> {
        let d = i16::try_from(d).ok()?;
        if d > shape.max_def || d < shape.element - 1 {
            // A null list: the decoder reports it.
            return None;
        }
        let slot = u64::from(d >= shape.element);
        match r {
            0 => {
                for _ in 0..n {
                    self.close()?;
                    self.open = Some(slot);
                }
            }
            1 => {
                // A continued list has an element in every slot after its first.
                let open = self.open.as_mut().filter(|_| slot == 1)?;
                *open += u64::from(n);
            }
            _ => return None,
        }
        Some(())
    }

    /// Ends the open record; `None` past the records the footer counts.
    fn close(&mut self) -> Option<()> {
        if let Some(len) = self.open.take() {
            if self.lengths.len() as u64 >= self.max_records {
                return None;
            }
            self.lengths.push(len);
        }
        Some(())
    }
}

/// A data page's parts: its repetition and definition levels (empty where the column has
/// none), its values, how many levels it holds, and how its values are encoded.
pub(super) struct Sections<'a> {
    pub(super) rep: &'a [u8],
    pub(super) def: &'a [u8],
    pub(super) values: &'a [u8],
    pub(super) count: u32,
    pub(super) encoding: Encoding,
}

/// Splits a data page of a column with repetition levels (`rep`) and definition levels (`def`)
/// or not; `None` for a dictionary page, levels in another encoding than RLE, or sections that
/// overrun the page.
pub(super) fn sections(page: &Page, rep: bool, def: bool) -> Option<Sections<'_>> {
    match page {
        Page::DataPage {
            buf,
            num_values,
            encoding,
            def_level_encoding,
            rep_level_encoding,
            ..
        } => {
            // Version 1 pages prefix each level section with its byte length.
            let mut rest: &[u8] = buf;
            let mut section = |present: bool, encoding: Encoding| -> Option<&[u8]> {
                if !present {
                    return Some(&[]);
                }
                if encoding != Encoding::RLE {
                    return None;
                }
                let (levels, after) = prefixed(rest)?;
                rest = after;
                Some(levels)
            };
            let rep = section(rep, *rep_level_encoding)?;
            let def = section(def, *def_level_encoding)?;
            Some(Sections {
                rep,
                def,
                values: rest,
                count: *num_values,
                encoding: *encoding,
            })
        }
        Page::DataPageV2 {
            buf,
            num_values,
            encoding,
            rep_levels_byte_len,
            def_levels_byte_len,
            ..
        } => {
            let rep_end = *rep_levels_byte_len as usize;
            let def_end = rep_end.checked_add(*def_levels_byte_len as usize)?;
            Some(Sections {
                rep: buf.get(..rep_end)?,
                def: buf.get(rep_end..def_end)?,
                values: buf.get(def_end..)?,
                count: *num_values,
                encoding: *encoding,
            })
        }
        Page::DictionaryPage { .. } => None,
    }
}

/// A version 1 level section: a little-endian `u32` byte length, then the levels.
pub(super) fn prefixed(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    let end = 4usize.checked_add(len)?;
    Some((buf.get(4..end)?, &buf[end..]))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{Int32Builder, LargeListBuilder, ListBuilder};
    use arrow_array::{ArrayRef, RecordBatch};
    use arrow_schema::{DataType, Field};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::properties::WriterVersion;
    use proptest::prelude::*;

    use super::super::test_layout::{page_layouts, PageLayout};
    use super::list_lengths;

    /// A record: `None` a null list, else its elements (`None` a null id).
    type Record = Option<Vec<Option<i32>>>;

    #[derive(Debug, Clone)]
    struct Layout {
        pages: PageLayout,
        large: bool,
        nullable_ids: bool,
    }

    fn write(records: &[Record], layout: &Layout) -> (tempfile_path::Path, Arc<std::fs::File>) {
        let item = Field::new("item", DataType::Int32, layout.nullable_ids);
        let column: ArrayRef = if layout.large {
            let mut lists = LargeListBuilder::new(Int32Builder::new()).with_field(item);
            for record in records {
                if let Some(ids) = record {
                    lists.values().extend(ids.iter().copied());
                }
                lists.append(record.is_some());
            }
            Arc::new(lists.finish())
        } else {
            let mut lists = ListBuilder::new(Int32Builder::new()).with_field(item);
            for record in records {
                if let Some(ids) = record {
                    lists.values().extend(ids.iter().copied());
                }
                lists.append(record.is_some());
            }
            Arc::new(lists.finish())
        };
        let other: ArrayRef = Arc::new(arrow_array::Int64Array::from_iter_values(
            0..records.len() as i64,
        ));
        let batch = RecordBatch::try_from_iter([("id", other), ("tokens", column)]).unwrap();
        let path = tempfile_path::Path::new("lengths");
        layout.pages.write(&batch, &path.0);
        let file = Arc::new(std::fs::File::open(&path.0).unwrap());
        (path, file)
    }

    /// A temporary file path removed on drop.
    mod tempfile_path {
        use std::sync::atomic::{AtomicUsize, Ordering};
        pub struct Path(pub std::path::PathBuf);
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        impl Path {
            pub fn new(name: &str) -> Self {
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                Path(
                    std::env::temp_dir()
                        .join(format!("o41-{name}-{}-{n}.parquet", std::process::id())),
                )
            }
        }
        impl Drop for Path {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    fn lengths(records: &[Record], layout: &Layout, max_records: u64) -> Option<Vec<u64>> {
        let (_path, file) = write(records, layout);
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&*file)
            .unwrap();
        list_lengths(&file, &metadata, 1, max_records).unwrap()
    }

    fn expected(records: &[Record]) -> Vec<u64> {
        records
            .iter()
            .map(|r| r.as_ref().map_or(0, |ids| ids.len() as u64))
            .collect()
    }

    fn layouts() -> impl Strategy<Value = Layout> {
        (page_layouts(1..40, 1..200), any::<bool>(), any::<bool>()).prop_map(
            |(pages, large, nullable_ids)| Layout {
                pages,
                large,
                nullable_ids,
            },
        )
    }

    fn records(nullable_ids: bool) -> impl Strategy<Value = Vec<Record>> {
        // Short lists make the levels bit-packed; long ones, runs.
        let id = if nullable_ids {
            prop_oneof![9 => any::<i32>().prop_map(Some), 1 => Just(None)].boxed()
        } else {
            any::<i32>().prop_map(Some).boxed()
        };
        let list = prop_oneof![
            3 => prop::collection::vec(id.clone(), 0..4),
            1 => prop::collection::vec(id, 0..300),
        ];
        prop::collection::vec(list.prop_map(Some), 0..300)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The levels give every record's length, null ids counted, as a decode of the lists
        /// does, over page formats, codecs, dictionaries, page and row-group sizes.
        #[test]
        fn lengths_from_levels_are_the_lists_lengths(
            (layout, records) in layouts().prop_flat_map(|layout| {
                let nullable = layout.nullable_ids;
                (Just(layout), records(nullable))
            })
        ) {
            let found = lengths(&records, &layout, records.len() as u64);
            prop_assert_eq!(found, Some(expected(&records)));
        }
    }

    fn plain() -> Layout {
        Layout {
            pages: PageLayout {
                version: WriterVersion::PARQUET_1_0,
                dictionary: true,
                codec: Compression::SNAPPY,
                page_rows: 7,
                group_rows: 50,
            },
            large: false,
            nullable_ids: true,
        }
    }

    #[test]
    fn a_null_list_is_left_to_the_decoder() {
        let mut records: Vec<Record> = (0..20).map(|i| Some(vec![Some(i); 3])).collect();
        records[11] = None;
        assert_eq!(lengths(&records, &plain(), 20), None);
    }

    #[test]
    fn more_records_than_the_footer_counts_are_not_read() {
        let records: Vec<Record> = (0..20).map(|i| Some(vec![Some(i); 3])).collect();
        assert_eq!(lengths(&records, &plain(), 19), None);
        assert_eq!(lengths(&records, &plain(), 20), Some(vec![3; 20]));
    }

    #[test]
    fn a_column_that_is_not_a_list_is_not_read() {
        let records: Vec<Record> = (0..5).map(|i| Some(vec![Some(i)])).collect();
        let (_path, file) = write(&records, &plain());
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&*file)
            .unwrap();
        assert_eq!(list_lengths(&file, &metadata, 0, 5).unwrap(), None);
    }

    /// `lengths` records of a `tokens` list column (ids `0..len`), in two batches; `null_at`
    /// makes that record's first id null.
    fn token_batches(lengths: &[usize], null_at: Option<usize>) -> Vec<RecordBatch> {
        let half = lengths.len() / 2;
        [&lengths[..half], &lengths[half..]]
            .iter()
            .enumerate()
            .map(|(part, lengths)| {
                let mut lists = ListBuilder::new(Int32Builder::new());
                for (r, &len) in lengths.iter().enumerate() {
                    for k in 0..len {
                        let null = null_at == Some(part * half + r) && k == 0;
                        lists.values().append_option((!null).then_some(k as i32));
                    }
                    lists.append(true);
                }
                let column: ArrayRef = Arc::new(lists.finish());
                RecordBatch::try_from_iter([("tokens", column)]).unwrap()
            })
            .collect()
    }

    /// Writes `batches` as the saver does; the file and its footer.
    fn saved(
        batches: &[RecordBatch],
    ) -> (
        tempfile_path::Path,
        Arc<std::fs::File>,
        parquet::file::metadata::ParquetMetaData,
    ) {
        let path = tempfile_path::Path::new("saved");
        let out = std::fs::File::create(&path.0).unwrap();
        crate::formats::parquet::write(out, batches[0].schema(), batches, "saved").unwrap();
        let file = Arc::new(std::fs::File::open(&path.0).unwrap());
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&*file)
            .unwrap();
        (path, file, metadata)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// The saver's writer leaves every record's length in the footer, and they are the
        /// lengths the levels give.
        #[test]
        fn the_saver_footer_lists_the_lengths_the_levels_give(
            lengths in prop::collection::vec(prop_oneof![3 => 0usize..4, 1 => 0usize..300], 0..300),
        ) {
            let (_path, file, metadata) = saved(&token_batches(&lengths, None));
            let expected: Vec<u64> = lengths.iter().map(|&l| l as u64).collect();
            let rows = lengths.len() as u64;
            prop_assert_eq!(super::footer_lengths(&metadata, 0, rows), Some(expected.clone()));
            prop_assert_eq!(list_lengths(&file, &metadata, 0, rows).unwrap(), Some(expected));
        }
    }

    /// A footer index is used only where the footer's own counts confirm it.
    #[test]
    fn a_footer_index_the_footer_does_not_confirm_is_not_used() {
        let lengths = [3usize, 0, 5, 1, 2, 7];
        let batches = token_batches(&lengths, None);
        let write = |value: &str| {
            let path = tempfile_path::Path::new("footer");
            let file = std::fs::File::create(&path.0).unwrap();
            let mut writer = ArrowWriter::try_new(file, batches[0].schema(), None).unwrap();
            for batch in &batches {
                writer.write(batch).unwrap();
            }
            writer.append_key_value_metadata(parquet::file::metadata::KeyValue::new(
                format!("{}tokens", super::FOOTER_KEY_PREFIX),
                value.to_owned(),
            ));
            writer.close().unwrap();
            let file = std::fs::File::open(&path.0).unwrap();
            let metadata = ParquetMetaDataReader::new()
                .parse_and_finish(&file)
                .unwrap();
            super::footer_lengths(&metadata, 0, lengths.len() as u64)
        };
        let value = |lengths: &[u64]| super::footer_value(lengths).unwrap();
        let right: Vec<u64> = lengths.iter().map(|&l| l as u64).collect();
        assert_eq!(write(&value(&right)), Some(right.clone()));
        // One record a value longer: the row group's level count disagrees.
        let mut longer = right.clone();
        longer[2] += 1;
        assert_eq!(write(&value(&longer)), None);
        // One record fewer, or more.
        assert_eq!(write(&value(&right[1..])), None);
        assert_eq!(write(&value(&[right.clone(), vec![1]].concat())), None);
        // Another version, or not base64 or deflate.
        let current = value(&right);
        assert_eq!(write(&current.replacen("1:", "2:", 1)), None);
        assert_eq!(write("1:not base64!"), None);
        assert_eq!(write("1:AAAA"), None);
    }

    /// A column holding a null id is given no footer index (its levels are read, or it is
    /// decoded), and a column of another type neither.
    #[test]
    fn lists_holding_a_null_get_no_footer_index() {
        let (_path, _file, metadata) = saved(&token_batches(&[2, 3, 1], Some(1)));
        let keys: Vec<&str> = metadata
            .file_metadata()
            .key_value_metadata()
            .into_iter()
            .flatten()
            .map(|kv| kv.key.as_str())
            .collect();
        assert!(
            !keys.iter().any(|k| k.starts_with(super::FOOTER_KEY_PREFIX)),
            "{keys:?}"
        );
        assert_eq!(super::footer_lengths(&metadata, 0, 3), None);
    }
}
