use super::fetch::{load_metadata, MERGE_GAP};
use super::footer::decode_batch_rows;
use super::read::read_ranges;
use super::*;
use crate::formats::PageCache;
use std::ops::Range;
use std::sync::Mutex;

use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::file::reader::{ChunkReader, Length};

use crate::columns::Chunk;
use crate::fields::Projection;
use crate::formats::ShardReader;
use crate::storage::Object;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};

use crate::columns::ColumnBuf;
use crate::config::FieldSpec;
use crate::dtype::DType;
use crate::storage::Storage;

fn projection() -> Projection {
    Projection::new(&[FieldSpec {
        overflow: crate::config::Overflow::Truncate,
        pad_side: crate::config::PadSide::Right,
        name: "v".into(),
        source: "v".into(),
        dtype: DType::I64,
        shape: vec![],
        pad: serde_json::Value::from(0),
    }])
    .unwrap()
}

/// Writes 1,000 rows with `codec`, page format `version` and dictionaries on or off, then reads
/// two ranges back through inspection and a reader.
fn round_trip(codec: Compression, version: WriterVersion, dictionary: bool) {
    let path = std::env::temp_dir().join(format!(
        "o41-codec-{}-{codec:?}-{version:?}-{dictionary}.parquet",
        std::process::id()
    ));
    let values: ArrayRef = Arc::new(Int64Array::from_iter_values((0..1000).map(|i| i * 3)));
    let batch = RecordBatch::try_from_iter([("v", values)]).unwrap();
    let properties = WriterProperties::builder()
        .set_compression(codec)
        .set_writer_version(version)
        .set_dictionary_enabled(dictionary)
        .set_data_page_row_count_limit(100)
        .set_max_row_group_row_count(Some(400))
        .build();
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();

    let uri = path.to_string_lossy().into_owned();
    let object = Arc::new(Storage::local().open(&uri).unwrap());
    let projection = projection();
    let meta = inspect(object.clone(), &projection, true).unwrap();
    assert_eq!(meta.rows, 1000);
    let index = crate::formats::parquet::index_of(&meta).expect("a Parquet index");
    let mut reader = Reader::open(object, index);
    let mut chunk = Chunk::padded(&projection, 30);
    reader
        .read_ranges(&[5..15, 390..410], &projection, &mut chunk, None)
        .map_err(|failure| failure.error)
        .unwrap();
    let expected: Vec<i64> = (5..15).chain(390..410).map(|i| i * 3).collect();
    assert!(
        matches!(&chunk.columns[0], ColumnBuf::I64(v) if v[..] == expected[..]),
        "{codec:?}"
    );
    std::fs::remove_file(path).unwrap();
}

/// Elements of row `i`'s list: its length varies so record boundaries fall mid-page.
fn list_row(i: u64) -> Vec<i64> {
    (0..20 + i % 7).map(|k| (i * 1000 + k) as i64).collect()
}

const LIST_WIDTH: usize = 32;

fn list_projection() -> Projection {
    Projection::new(&[FieldSpec {
        overflow: crate::config::Overflow::Truncate,
        pad_side: crate::config::PadSide::Right,
        name: "tokens".into(),
        source: "tokens".into(),
        dtype: DType::I64,
        shape: vec![LIST_WIDTH],
        pad: serde_json::Value::from(-1),
    }])
    .unwrap()
}

/// Writes `rows` list rows in row groups of 200 and pages of 10 rows, with a page index, as
/// the benchmark corpus is laid out (many pages per row group); returns the open object.
fn write_lists(name: &str, rows: u64) -> (std::path::PathBuf, Arc<Object>) {
    use arrow_array::builder::{Int64Builder, ListBuilder};
    let path = std::env::temp_dir().join(format!("o41-{name}-{}.parquet", std::process::id()));
    let mut lists = ListBuilder::new(Int64Builder::new());
    for i in 0..rows {
        lists.values().append_slice(&list_row(i));
        lists.append(true);
    }
    let column: ArrayRef = Arc::new(lists.finish());
    let batch = RecordBatch::try_from_iter([("tokens", column)]).unwrap();
    let properties = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_write_batch_size(10)
        .set_data_page_row_count_limit(10)
        .set_max_row_group_row_count(Some(200))
        .build();
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let uri = path.to_string_lossy().into_owned();
    (path, Arc::new(Storage::local().open(&uri).unwrap()))
}

/// The index inspection builds for the Parquet shard `object`.
fn parquet_index(object: &Arc<Object>, projection: &Projection) -> Arc<ParquetIndex> {
    let meta = inspect(object.clone(), projection, true).unwrap();
    crate::formats::parquet::index_of(&meta).expect("a Parquet index")
}

fn expected_rows(ranges: &[Range<u64>]) -> Vec<i64> {
    let mut out = Vec::new();
    for row in ranges.iter().flat_map(Clone::clone) {
        let mut values = list_row(row);
        values.resize(LIST_WIDTH, -1);
        out.extend(values);
    }
    out
}

fn read_i64(reader: &mut Reader, ranges: &[Range<u64>], projection: &Projection) -> Vec<i64> {
    let rows: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let mut chunk = Chunk::padded(projection, rows as usize);
    reader
        .read_ranges(ranges, projection, &mut chunk, None)
        .map_err(|failure| failure.error)
        .unwrap();
    let ColumnBuf::I64(values) = &chunk.columns[0] else {
        panic!("an i64 column")
    };
    values.to_vec()
}

/// A file reader that records the byte ranges the decoder asks for.
struct Recording {
    file: std::fs::File,
    asked: Arc<Mutex<Vec<Range<u64>>>>,
}

impl Length for Recording {
    fn len(&self) -> u64 {
        self.file.len()
    }
}

impl ChunkReader for Recording {
    type T = <std::fs::File as ChunkReader>::T;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        self.asked.lock().unwrap().push(start..self.file.len());
        self.file.get_read(start)
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.asked
            .lock()
            .unwrap()
            .push(start..start + length as u64);
        self.file.get_bytes(start, length)
    }
}

#[test]
fn an_inspection_that_skips_the_first_record_reads_only_the_metadata() {
    let (path, _) = write_lists("metadata-only", 1000);
    let uri = path.to_string_lossy().into_owned();
    let projection = list_projection();
    let bytes_read = |look: &dyn Fn(Arc<Object>)| {
        let meter = Arc::new(crate::metrics::Meter::default());
        let storage = crate::storage::Storage::local().with_meter(meter.clone());
        look(Arc::new(storage.open(&uri).unwrap()));
        meter.reading().bytes_read
    };
    let metadata = bytes_read(&|object| {
        load_metadata(&object).unwrap();
    });
    let skipped = bytes_read(&|object| {
        inspect(object, &projection, false).unwrap();
    });
    let checked = bytes_read(&|object| {
        inspect(object, &projection, true).unwrap();
    });
    assert!(metadata > 0);
    assert_eq!(skipped, metadata, "the footer and page index alone");
    assert!(checked > metadata, "the first record's pages as well");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_job_takes_the_pages_its_predecessor_kept_and_fetches_only_the_rest() {
    let (path, object) = write_lists("page-cache", 400);
    let projection = list_projection();
    let index = parquet_index(&object, &projection);
    let locations = index
        .metadata
        .metadata()
        .page_index()
        .and_then(|p| p.offset_index(0, 0))
        .expect("the writer wrote a page index")
        .page_locations()
        .clone();
    let page = |k: usize| {
        let at = locations[k].offset as u64;
        at..at + locations[k].compressed_page_size as u64
    };
    let cache = (Arc::new(PageCache::new(1 << 20)), PageCache::key("s", None));
    // Pages hold 10 rows: a job of rows 0..15 ends inside page 1, which the next job of
    // the row group starts in, so it is kept (no dictionary: the writer wrote none).
    let first = index.fetch_plan(
        std::slice::from_ref(&(0..15)),
        &projection,
        Some(&cache),
        MERGE_GAP,
    );
    assert_eq!(first.fetch, vec![page(0).start..page(1).end]);
    assert_eq!(first.keep, vec![page(1)]);
    assert!(first.cached.is_empty() && first.expected.is_empty());

    // While that fetch is under way the page is promised; then kept.
    let promised = cache.0.promise(&cache.1, first.keep.clone());
    let next = index.fetch_plan(
        std::slice::from_ref(&(15..30)),
        &projection,
        Some(&cache),
        MERGE_GAP,
    );
    assert_eq!((next.expected, next.fetch), (vec![page(1)], vec![page(2)]));
    let bytes = object.read_range(page(0).start..page(1).end).unwrap();
    promised.keep(&[(page(0).start, bytes)]);
    let next = index.fetch_plan(
        std::slice::from_ref(&(15..30)),
        &projection,
        Some(&cache),
        MERGE_GAP,
    );
    assert_eq!(next.fetch, vec![page(2)]);
    assert_eq!(next.cached.len(), 1);
    assert_eq!(next.cached[0].0, page(1).start);
    assert_eq!(
        next.cached[0].1,
        object.read_range(page(1)).unwrap(),
        "the kept page's bytes"
    );

    // A kept page inside a gap that merging closes comes with the request, not the cache.
    let around = index.fetch_plan(
        &[5..6, 15..16, 25..26],
        &projection,
        Some(&cache),
        MERGE_GAP,
    );
    assert_eq!(around.fetch, vec![page(0).start..page(2).end]);
    assert!(around.cached.is_empty() && around.expected.is_empty());
    std::fs::remove_file(path).unwrap();
}

#[test]
fn short_runs_spread_over_row_groups_read_only_their_own_pages() {
    let (path, object) = write_lists("short-runs", 1000);
    let projection = list_projection();
    let index = parquet_index(&object, &projection);
    // A rank's share at a large world size: runs of 2 to 6 rows, one every 32 rows, in
    // every row group (short enough for the default policy to choose a mask).
    let ranges: Vec<Range<u64>> = (0..31u64)
        .map(|k| k * 32 + k % 9..k * 32 + k % 9 + 2 + k % 5)
        .collect();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let file = std::fs::File::open(&path).unwrap();
    let rows: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let mut chunk = Chunk::padded(&projection, rows as usize);
    let recording = Recording {
        file,
        asked: asked.clone(),
    };
    read_ranges(recording, &index, &ranges, &projection, &mut chunk, "t")
        .map_err(|failure| failure.error)
        .unwrap();
    assert!(matches!(&chunk.columns[0], ColumnBuf::I64(v) if v[..] == expected_rows(&ranges)[..]));

    // Every page the decoder fetched holds a selected row: pages between runs are skipped
    // by their offset index, not decoded and filtered.
    let metadata = index.metadata.metadata();
    let offsets = metadata
        .page_index()
        .expect("the writer wrote a page index");
    let mut unwanted = Vec::new();
    for g in 0..metadata.num_row_groups() {
        let (first, end) = (index.group_starts[g], index.group_starts[g + 1]);
        let pages = offsets.offset_index(g, 0).unwrap().page_locations();
        for (k, page) in pages.iter().enumerate() {
            let from = first + page.first_row_index as u64;
            let to = pages
                .get(k + 1)
                .map_or(end, |next| first + next.first_row_index as u64);
            if !ranges.iter().any(|r| r.start < to && r.end > from) {
                let at = page.offset as u64;
                unwanted.push(at..at + page.compressed_page_size as u64);
            }
        }
    }
    let asked = asked.lock().unwrap();
    assert!(!asked.is_empty());
    for range in asked.iter() {
        assert!(
            !unwanted
                .iter()
                .any(|page| range.start < page.end && range.end > page.start),
            "fetched {range:?}, which overlaps a page with no selected row"
        );
    }
    std::fs::remove_file(path).unwrap();
}

#[test]
fn decode_batches_hold_about_a_mebibyte_of_rows() {
    let (path, object) = write_lists("batch-rows", 400);
    let index = parquet_index(&object, &list_projection());
    let metadata = index.metadata.metadata();
    let widest = metadata
        .row_groups()
        .iter()
        .map(|g| (g.column(0).uncompressed_size() as u64).div_ceil(g.num_rows() as u64))
        .max()
        .unwrap();
    assert_eq!(index.batch_rows, (DECODE_BATCH_BYTES / widest).min(8192));
    assert_eq!(decode_batch_rows(metadata, &[]), MAX_DECODE_BATCH_ROWS);
    std::fs::remove_file(path).unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// One pass over many short runs, spanning row groups, pages and decode batches,
    /// yields exactly the rows that reading each run on its own yields.
    #[test]
    fn one_pass_over_short_runs_equals_a_read_per_run(
        picks in proptest::collection::btree_set(0u64..1200, 1..160),
        lens in proptest::collection::vec(1u64..7, 160),
    ) {
        static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (path, object) = write_lists(&format!("one-pass-{case}"), 1200);
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for (start, len) in picks.into_iter().zip(lens) {
            let start = start.max(ranges.last().map_or(0, |r| r.end + 1));
            let end = (start + len).min(1200);
            if start < end {
                ranges.push(start..end);
            }
        }
        proptest::prop_assume!(!ranges.is_empty());
        let projection = list_projection();
        let index = parquet_index(&object, &projection);
        let mut reader = Reader::open(object, index);
        let together = read_i64(&mut reader, &ranges, &projection);
        let mut apart = Vec::new();
        for range in &ranges {
            apart.extend(read_i64(&mut reader, std::slice::from_ref(range), &projection));
        }
        std::fs::remove_file(path).unwrap();
        proptest::prop_assert_eq!(&together, &apart);
        proptest::prop_assert_eq!(together, expected_rows(&ranges));
    }
}

#[test]
fn every_standard_codec_and_page_format_reads() {
    let codecs = [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::GZIP(GzipLevel::default()),
        Compression::BROTLI(BrotliLevel::default()),
        // The legacy LZ4 codec, Hadoop-framed as Parquet's own writers framed it.
        Compression::LZ4,
        Compression::LZ4_RAW,
        Compression::ZSTD(ZstdLevel::default()),
    ];
    for codec in codecs {
        for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            for dictionary in [true, false] {
                round_trip(codec, version, dictionary);
            }
        }
    }
}
