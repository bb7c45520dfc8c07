//! Record lengths of a Parquet list column from its repetition and definition levels alone.
//!
//! Packing a Parquet token shard plans from every document's length. Decoding the column for
//! that decodes every id too, and ids are almost all of a token column's bytes: the levels are
//! a few bytes a page (a run of `1`s per record). This reads them page by page, straight from
//! the Parquet encoding (the RLE / bit-packed hybrid, `parquet-format`'s `Encodings.md`), and
//! never decodes a value. It reads the layouts a plain list of ids has, and answers `None` for
//! anything else (a null list, the deprecated `BIT_PACKED` level encoding, levels that do not
//! add up): the caller then decodes the lists, whose errors name what is wrong.

use std::sync::Arc;

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
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use proptest::prelude::*;

    use super::list_lengths;

    /// A record: `None` a null list, else its elements (`None` a null id).
    type Record = Option<Vec<Option<i32>>>;

    #[derive(Debug, Clone)]
    struct Layout {
        version: WriterVersion,
        dictionary: bool,
        codec: Compression,
        /// Rows per data page and per row group.
        page_rows: usize,
        group_rows: usize,
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
        let properties = WriterProperties::builder()
            .set_writer_version(layout.version)
            .set_dictionary_enabled(layout.dictionary)
            .set_compression(layout.codec)
            .set_write_batch_size(layout.page_rows)
            .set_data_page_row_count_limit(layout.page_rows)
            .set_max_row_group_row_count(Some(layout.group_rows))
            .build();
        let path = tempfile_path::Path::new("lengths");
        let file = std::fs::File::create(&path.0).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
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
        (
            prop_oneof![
                Just(WriterVersion::PARQUET_1_0),
                Just(WriterVersion::PARQUET_2_0)
            ],
            any::<bool>(),
            prop_oneof![
                Just(Compression::UNCOMPRESSED),
                Just(Compression::SNAPPY),
                Just(Compression::ZSTD(parquet::basic::ZstdLevel::default())),
            ],
            1usize..40,
            1usize..200,
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(version, dictionary, codec, page_rows, group_rows, large, nullable_ids)| Layout {
                    version,
                    dictionary,
                    codec,
                    page_rows,
                    group_rows,
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
            version: WriterVersion::PARQUET_1_0,
            dictionary: true,
            codec: Compression::SNAPPY,
            page_rows: 7,
            group_rows: 50,
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
}
