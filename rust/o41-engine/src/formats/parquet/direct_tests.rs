use crate::columns::Chunk;

use std::ops::Range;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Int32Builder, Int64Builder, Int8Builder, LargeListBuilder, ListBuilder,
    UInt16Builder, UInt8Builder,
};
use arrow_array::{ArrayRef, Float32Array, Int16Array, Int64Array, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::{WriterProperties, WriterVersion};
use proptest::prelude::*;

use super::read::{read_direct, read_ranges};
use super::test_layout::{page_layouts, PageLayout as Layout};
use super::ParquetIndex;
use crate::config::FieldSpec;
use crate::dtype::DType;
use crate::fields::Projection;
use crate::storage::Storage;

fn field(name: &str, dtype: DType, shape: Vec<usize>) -> FieldSpec {
    FieldSpec {
        overflow: crate::config::Overflow::Truncate,
        pad_side: crate::config::PadSide::Right,
        name: name.into(),
        source: name.into(),
        dtype,
        shape,
        pad: serde_json::Value::from(0),
    }
}

fn projection() -> Projection {
    Projection::new(&[
        field("i", DType::I64, vec![]),
        field("f", DType::F32, vec![]),
        field("t", DType::I32, vec![6]),
        field("m", DType::Bool, vec![6]),
        field("l", DType::I64, vec![3]),
        // Narrow integers, stored as INT32 (a uint8 loss mask, int8 labels, ...).
        field("u8", DType::I32, vec![6]),
        field("i8", DType::I64, vec![6]),
        field("u16", DType::I32, vec![6]),
        field("i16", DType::I64, vec![]),
    ])
    .unwrap()
}

/// Rows of every column kind read here; list lengths `lengths[row]` (short ones make the
/// levels bit-packed), ids from a small set (so dictionaries are used) or not.
fn write(lengths: &[usize], layout: &Layout, path: &std::path::Path) {
    let rows = lengths.len();
    let mut t = ListBuilder::new(Int32Builder::new());
    let mut m = ListBuilder::new(BooleanBuilder::new());
    let mut l = LargeListBuilder::new(Int64Builder::new());
    let mut u8s = ListBuilder::new(UInt8Builder::new());
    let mut i8s = ListBuilder::new(Int8Builder::new());
    let mut u16s = ListBuilder::new(UInt16Builder::new());
    for (row, &n) in lengths.iter().enumerate() {
        for k in 0..n {
            t.values()
                .append_value(((row * 7 + k * 3) % 50) as i32 - 20);
            m.values().append_value((row + k) % 3 == 0);
            l.values().append_value((row * 1000 + k) as i64);
            u8s.values()
                .append_value(((row / 3 + k / 4) % 2 * 255) as u8);
            i8s.values()
                .append_value(((row * 31 + k) % 256) as u8 as i8);
            u16s.values().append_value((row * 4099 + k) as u16);
        }
        t.append(true);
        m.append(true);
        l.append(true);
        u8s.append(true);
        i8s.append(true);
        u16s.append(true);
    }
    let i16s: ArrayRef = Arc::new(Int16Array::from_iter_values(
        (0..rows).map(|r| (r as i16).wrapping_mul(257)),
    ));
    let i: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..rows as i64).map(|r| r * 11),
    ));
    let f: ArrayRef = Arc::new(Float32Array::from_iter_values(
        (0..rows).map(|r| r as f32 / 4.0),
    ));
    let batch = RecordBatch::try_from_iter([
        ("i", i),
        ("f", f),
        ("t", Arc::new(t.finish()) as ArrayRef),
        ("m", Arc::new(m.finish()) as ArrayRef),
        ("l", Arc::new(l.finish()) as ArrayRef),
        ("u8", Arc::new(u8s.finish()) as ArrayRef),
        ("i8", Arc::new(i8s.finish()) as ArrayRef),
        ("u16", Arc::new(u16s.finish()) as ArrayRef),
        ("i16", i16s),
    ])
    .unwrap();
    layout.write(&batch, path);
}

fn index_of(path: &std::path::Path, projection: &Projection) -> Arc<ParquetIndex> {
    let object = Arc::new(Storage::local().open(&path.to_string_lossy()).unwrap());
    let meta = super::inspect(object, projection, true).unwrap();
    crate::formats::parquet::index_of(&meta).expect("a Parquet index")
}

/// Reads `ranges` both ways: page by page (`None` where that reader declined the shard)
/// and through arrow-rs.
fn both(path: &std::path::Path, ranges: &[Range<u64>]) -> (Option<String>, String) {
    let projection = projection();
    let index = index_of(path, &projection);
    let rows: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let mut direct = Chunk::padded(&projection, rows as usize);
    let file = Arc::new(std::fs::File::open(path).unwrap());
    let read = read_direct(&file, &index, ranges, &projection, (&mut direct, "shard"))
        .map(|done| done.map_err(|f| f.error).unwrap());
    let mut arrow = Chunk::padded(&projection, rows as usize);
    read_ranges(
        std::fs::File::open(path).unwrap(),
        &index,
        ranges,
        &projection,
        &mut arrow,
        "shard",
    )
    .map_err(|f| f.error)
    .unwrap();
    (
        read.map(|()| format!("{:?}", direct.columns)),
        format!("{:?}", arrow.columns),
    )
}

fn layouts() -> impl Strategy<Value = Layout> {
    page_layouts(1..30, 1..120)
}

/// Sorted, disjoint ranges of `0..rows`, from cut points.
fn ranges_of(rows: u64, cuts: &[(u64, bool)]) -> Vec<Range<u64>> {
    let mut points: Vec<u64> = cuts.iter().map(|&(c, _)| c % (rows + 1)).collect();
    points.push(0);
    points.push(rows);
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .zip(
            cuts.iter()
                .map(|&(_, keep)| keep)
                .chain(std::iter::repeat(true)),
        )
        .filter(|(_, keep)| *keep)
        .map(|(w, _)| w[0]..w[1])
        .collect()
}

/// Every record of `ranges` of the list column `t`, as `for_each_list` hands them over.
fn listed(path: &std::path::Path, ranges: &[Range<u64>]) -> Vec<(u64, Vec<i64>)> {
    let projection = Projection::new(&[field("t", DType::I32, vec![4])]).unwrap();
    let object = Arc::new(Storage::local().open(&path.to_string_lossy()).unwrap());
    let index = index_of(path, &projection);
    let mut out = Vec::new();
    super::for_each_list(
        &object,
        &index,
        (ranges, true),
        &projection,
        &mut |record, len, ids| {
            assert_eq!(len as usize, ids.len());
            out.push((record, ids.iter().collect()));
            Ok(())
        },
    )
    .unwrap();
    out
}

/// The ids `write` puts in record `row` of `t`.
fn ids_of(row: usize, len: usize) -> Vec<i64> {
    (0..len)
        .map(|k| ((row * 7 + k * 3) % 50) as i64 - 20)
        .collect()
}

/// A token column whose dictionary fills up after a few pages, so later pages are encoded
/// otherwise (delta, in version 2 pages): the page reader hands over the records it reads
/// and arrow-rs the rest, each once and in order.
#[test]
fn lists_read_past_the_page_reader_once_each() {
    let path =
        std::env::temp_dir().join(format!("o41-direct-lists-{}.parquet", std::process::id()));
    let lengths: Vec<usize> = (0..300).map(|r| 1 + r % 9).collect();
    let mut t = ListBuilder::new(Int32Builder::new());
    for (row, &n) in lengths.iter().enumerate() {
        // Ids past the first pages are new, so the dictionary overflows.
        t.values()
            .append_slice(&(0..n).map(|k| (row * 100 + k) as i32).collect::<Vec<_>>());
        t.append(true);
    }
    let batch = RecordBatch::try_from_iter([("t", Arc::new(t.finish()) as ArrayRef)]).unwrap();
    let properties = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_dictionary_page_size_limit(256)
        .set_write_batch_size(10)
        .set_data_page_row_count_limit(10)
        .build();
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    // The premise: the page reader reads the first pages and stops at a later one.
    let projection = Projection::new(&[field("t", DType::I32, vec![4])]).unwrap();
    let index = index_of(&path, &projection);
    let mut visited = 0;
    let stopped = super::direct::runs(
        &Arc::new(std::fs::File::open(&path).unwrap()),
        index.metadata.metadata(),
        index.metadata.schema().fields(),
        (&index.group_starts, std::slice::from_ref(&(0..300))),
        0,
        &mut |array, _| {
            visited += array.len();
            Ok(())
        },
    )
    .unwrap();
    assert!(
        stopped.is_none() && visited > 0 && visited < 300,
        "{visited}"
    );
    let all = 0..300;
    for ranges in [vec![all], vec![3..5, 17..120, 250..299]] {
        let expected: Vec<(u64, Vec<i64>)> = ranges
            .iter()
            .flat_map(Clone::clone)
            .map(|r| {
                (
                    r,
                    (0..lengths[r as usize])
                        .map(|k| (r * 100 + k as u64) as i64)
                        .collect(),
                )
            })
            .collect();
        assert_eq!(listed(&path, &ranges), expected);
    }
    std::fs::remove_file(&path).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Any selection of rows reads page by page as arrow-rs reads it, and a token column's
    /// records are handed over as written, over page versions, codecs, dictionaries, page and
    /// row-group sizes and lists of any length.
    #[test]
    fn pages_read_as_the_decoder_reads(
        layout in layouts(),
        lengths in prop::collection::vec(prop_oneof![3 => 0usize..4, 1 => 0usize..40], 1..200),
        cuts in prop::collection::vec((any::<u64>(), any::<bool>()), 0..12),
    ) {
        let path = std::env::temp_dir().join(format!(
            "o41-direct-{}-{:?}.parquet",
            std::process::id(),
            std::thread::current().id()
        ));
        write(&lengths, &layout, &path);
        let ranges = ranges_of(lengths.len() as u64, &cuts);
        if !ranges.is_empty() {
            let (direct, arrow) = both(&path, &ranges);
            // Version 2 pages without dictionaries hold delta-encoded numbers, which
            // arrow-rs reads; every other layout written here is read page by page.
            let declined = layout.version == WriterVersion::PARQUET_2_0 && !layout.dictionary;
            prop_assert_eq!(direct.is_none(), declined);
            if let Some(direct) = direct {
                prop_assert_eq!(direct, arrow);
            }
            let expected: Vec<(u64, Vec<i64>)> = ranges
                .iter()
                .flat_map(Clone::clone)
                .map(|r| (r, ids_of(r as usize, lengths[r as usize])))
                .collect();
            prop_assert_eq!(listed(&path, &ranges), expected);
        }
        std::fs::remove_file(&path).unwrap();
    }
}
