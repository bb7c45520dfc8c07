//! Forged inputs of issue 32 ("fail closed, round 3"), each refused with an error that names the
//! file, instead of crashing, hanging or allocating what the input claims.
//!
//! This binary counts its allocations: no single one may exceed `ALLOCATION_BOUND`, so a forged
//! size that reaches an allocator fails here on any machine (instead of succeeding where memory
//! overcommits).

// Counting allocations needs a global allocator, which is an unsafe trait; it only forwards to
// the system allocator.
#![allow(unsafe_code)]

mod counting;
mod forge;

use counting::{Counting, ALLOCATION_BOUND, LARGEST};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use forge::{forge, Forge};
use o41_engine::columns::Chunk;
use o41_engine::config::FieldSpec;
use o41_engine::dtype::DType;
use o41_engine::encoding::Encoding;
use o41_engine::fields::Projection;
use o41_engine::formats::{self, RecordChunk, ShardRecords};
use o41_engine::storage::Storage;
use o41_engine::Error;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const FIRST: formats::Checks<'static> = formats::Checks {
    promise: None,
    first_record: true,
    seen: None,
    cache: None,
};

fn projection() -> Projection {
    Projection::new(&[FieldSpec {
        overflow: o41_engine::config::Overflow::Truncate,
        pad_side: o41_engine::config::PadSide::Right,
        name: "v".into(),
        source: "v".into(),
        dtype: DType::I64,
        shape: vec![],
        pad: serde_json::Value::from(0),
    }])
    .unwrap()
}

/// A file of its own for `bytes`, removed on drop.
struct Shard(std::path::PathBuf);

impl Shard {
    fn new(name: &str, bytes: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!(
            "o41-hostile3-{}-{name}.parquet",
            std::process::id()
        ));
        std::fs::write(&path, bytes).unwrap();
        Shard(path)
    }

    fn uri(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }

    /// Every value of `v`, as a stream reads it (inspection, then one read of every row).
    fn read(&self) -> o41_engine::Result<Vec<i64>> {
        let storage = Storage::local();
        let projection = projection();
        let meta = formats::inspect(
            &storage,
            &self.uri(),
            Encoding::Parquet,
            &projection,
            1 << 20,
            FIRST,
        )?;
        let mut reader = formats::open(&storage, &self.uri(), &meta, None)?;
        let mut chunk = Chunk::padded(&projection, meta.rows as usize);
        reader
            .read_ranges(
                std::slice::from_ref(&(0..meta.rows)),
                &projection,
                &mut chunk,
                None,
            )
            .map_err(|f| f.error)?;
        let column = chunk.columns.swap_remove(0);
        let array = column.into_arrow(&projection.columns[0]);
        Ok(array
            .as_primitive::<arrow_array::types::Int64Type>()
            .values()
            .to_vec())
    }

    /// Every record, as `iter_shard` reads them.
    fn records(&self) -> o41_engine::Result<usize> {
        let mut records =
            ShardRecords::open(&Storage::local(), &self.uri(), Encoding::Parquet, 64)?;
        let mut n = 0;
        while let Some(chunk) = records.next_chunk(64)? {
            n += match chunk {
                RecordChunk::Arrow(batch) => batch.num_rows(),
                RecordChunk::Records(records) => records.len(),
            };
        }
        Ok(n)
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `result` is a malformed-shard error naming `shard` and saying `what`.
fn assert_malformed<T: std::fmt::Debug>(result: o41_engine::Result<T>, shard: &Shard, what: &str) {
    let error = result.expect_err("a forged shard is refused");
    assert!(
        matches!(error, Error::Format { .. }),
        "a malformed shard error, not {error:?}"
    );
    let text = error.to_string();
    assert!(text.contains(&shard.uri()), "names the file: {text}");
    assert!(text.contains(what), "says '{what}': {text}");
    assert!(LARGEST.load(Ordering::Relaxed) <= ALLOCATION_BOUND);
}

#[test]
fn forged_files_read_whole_when_not_forged() {
    for (name, f) in [
        ("plain", Forge::default()),
        (
            "dictionary",
            Forge {
                dictionary: true,
                ..Forge::default()
            },
        ),
        (
            "snappy",
            Forge {
                dictionary: true,
                snappy: true,
                ..Forge::default()
            },
        ),
        (
            "nested",
            Forge {
                deep: 8,
                ..Forge::default()
            },
        ),
    ] {
        let shard = Shard::new(&format!("whole-{name}"), &forge(&f));
        assert_eq!(shard.read().unwrap(), f.values, "{name}");
        assert_eq!(shard.records().unwrap(), f.values.len(), "{name}");
    }
}

/// Item 1: a column 1,000 groups deep overflowed arrow-rs's recursion (SIGSEGV), even with only
/// another column projected.
#[test]
fn deep_schemas_are_refused_before_arrow_rs_recurses() {
    let shard = Shard::new(
        "deep",
        &forge(&Forge {
            deep: 1000,
            ..Forge::default()
        }),
    );
    for result in [shard.read().map(|_| ()), shard.records().map(|_| ())] {
        let error = result.expect_err("a deep shard is refused");
        assert!(
            matches!(error, Error::Unsupported { .. }),
            "a valid but unsupported shard, not {error:?}"
        );
        let text = error.to_string();
        assert!(text.contains(&shard.uri()), "names the file: {text}");
        assert!(
            text.contains("levels deep, more than the 64 supported"),
            "{text}"
        );
        assert!(LARGEST.load(Ordering::Relaxed) <= ALLOCATION_BOUND);
    }
}

/// Item 2: the saver's writer recursed once per level of a record's nesting (SIGSEGV at 300).
#[test]
fn the_writer_refuses_deep_records() {
    use arrow_array::{new_null_array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    let mut t = DataType::Int64;
    for _ in 0..300 {
        t = DataType::List(Arc::new(Field::new("item", t, true)));
    }
    let schema = Arc::new(Schema::new(vec![Field::new("deep", t.clone(), true)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![new_null_array(&t, 1)]).unwrap();
    let path = std::env::temp_dir().join(format!("o41-hostile3-{}-w.parquet", std::process::id()));
    let uri = path.to_string_lossy().into_owned();
    let error = formats::write_shard(
        &uri,
        &uri,
        Encoding::Parquet,
        formats::ShardData::Arrow {
            schema,
            batches: std::slice::from_ref(&batch),
        },
    )
    .expect_err("refused");
    let _ = std::fs::remove_file(&path);
    assert!(
        matches!(&error, Error::Data { field: Some(field), .. } if field == "deep")
            && error.to_string().contains("nests more than 64 levels deep"),
        "{error}"
    );
}

/// Item 3: a dictionary page claiming 2^31-1 values made arrow-rs allocate 16 GiB.
#[test]
fn a_dictionary_claiming_more_values_than_its_bytes_is_refused() {
    let shard = Shard::new(
        "dictionary",
        &forge(&Forge {
            dictionary: true,
            dictionary_values: Some(0x7FFF_FFFF),
            ..Forge::default()
        }),
    );
    assert_malformed(shard.read(), &shard, "dictionary page");
    assert_malformed(shard.records(), &shard, "dictionary page");
}

/// Item 4: a Snappy data page claiming 2^31-1 uncompressed bytes was allocated for.
#[test]
fn a_page_larger_than_its_chunk_is_refused() {
    let shard = Shard::new(
        "page",
        &forge(&Forge {
            snappy: true,
            page_uncompressed: Some(0x7FFF_FFFF),
            ..Forge::default()
        }),
    );
    assert_malformed(
        shard.read(),
        &shard,
        "uncompressed bytes, more than its column chunk",
    );
    assert_malformed(
        shard.records(),
        &shard,
        "uncompressed bytes, more than its column chunk",
    );
}

/// Item 4, the footer's side: a chunk declaring more than its codec can expand to is a forged
/// shard (it was reported as a memory limit too small, naming no file).
#[test]
fn a_chunk_larger_than_its_codec_makes_is_refused() {
    let shard = Shard::new(
        "chunk",
        &forge(&Forge {
            snappy: true,
            chunk_uncompressed: Some(1 << 40),
            ..Forge::default()
        }),
    );
    assert_malformed(shard.read(), &shard, "more than SNAPPY can make");
}

/// Item 15: the schema says INT32, the column metadata INT64: arrow-rs read the INT64 values as
/// twice as many INT32s.
#[test]
fn a_column_whose_types_disagree_is_refused() {
    let shard = Shard::new(
        "types",
        &forge(&Forge {
            schema_type: 1,
            chunk_type: 2,
            ..Forge::default()
        }),
    );
    assert_malformed(shard.read(), &shard, "is INT32 in the schema but INT64");
    assert_malformed(shard.records(), &shard, "is INT32 in the schema but INT64");
}

/// A token shard as the saver writes it: records of `lengths` tokens in column `t`, their
/// lengths in the footer.
fn token_shard(name: &str, lengths: &[usize]) -> Shard {
    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, ListArray, RecordBatch};
    let t: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
        lengths
            .iter()
            .map(|&n| Some((0..n as i32).map(|k| Some(k % 50)))),
    ));
    let batch = RecordBatch::try_from_iter([("t", t)]).unwrap();
    let shard = Shard::new(name, b"");
    formats::write_shard(
        &shard.uri(),
        "saved",
        Encoding::Parquet,
        formats::ShardData::Arrow {
            schema: batch.schema(),
            batches: std::slice::from_ref(&batch),
        },
    )
    .unwrap();
    shard
}

fn inspect_tokens(
    shard: &Shard,
    layout: &o41_engine::config::TokenLayout,
    cache: Option<&o41_engine::inspect_cache::InspectCache>,
    max_plan: u64,
) -> o41_engine::Result<formats::ShardMeta> {
    formats::inspect_shard(
        &Storage::local(),
        &shard.uri(),
        Encoding::Parquet,
        Some(formats::TokenInspection { layout, cache }),
        &token_projection(),
        (1 << 20, max_plan),
        formats::Checks::default(),
    )
}

fn token_projection() -> Projection {
    Projection::new(&[FieldSpec {
        overflow: o41_engine::config::Overflow::Truncate,
        pad_side: o41_engine::config::PadSide::Right,
        name: "t".into(),
        source: "t".into(),
        dtype: DType::I32,
        shape: vec![8],
        pad: serde_json::Value::from(0),
    }])
    .unwrap()
}

/// Items 5 and 6: an inspection-cache entry whose lengths claim a record of 2^32-1 tokens made
/// open place hundreds of millions of pieces (a 12 GiB plan for packing, a hang for windows).
/// An entry that disagrees with the footer's level counts is not the shard's: a miss.
#[test]
fn forged_cached_list_lengths_are_a_miss() {
    use o41_engine::config::{PackingSpec, TokenLayout, WindowsSpec};
    let lengths = [3usize, 5, 2, 9];
    let shard = token_shard("tokens-cache", &lengths);
    let dir = std::env::temp_dir().join(format!("o41-hostile3-cache-{}", std::process::id()));
    let cache = o41_engine::inspect_cache::InspectCache::new(&dir);
    let pin = Storage::local().open(&shard.uri()).unwrap().pin();
    let forged = [u64::from(u32::MAX), 5, 2, 9];
    for layout in [
        TokenLayout::Packed(PackingSpec {
            field: "t".into(),
            seq_len: 8,
            bins: 2,
            eos_id: None,
            overflow: o41_engine::config::PackOverflow::default(),
        }),
        TokenLayout::Windows(WindowsSpec {
            field: "t".into(),
            seq_len: 8,
            eos_id: None,
        }),
    ] {
        o41_engine::formats::store_list_lengths(
            &cache,
            (&shard.uri(), Encoding::Parquet, &pin),
            "t",
            &forged,
        );
        let honest = inspect_tokens(&shard, &layout, None, 256 << 20).unwrap();
        let meta = inspect_tokens(&shard, &layout, Some(&cache), 256 << 20).unwrap();
        assert_eq!(meta.rows, honest.rows);
        assert!(LARGEST.load(Ordering::Relaxed) <= ALLOCATION_BOUND);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Item 5, the bound: a document is checked against the plan's bound before it is placed, not
/// after (a long record of 4M tokens in windows of one token was placed as 4M pieces first).
#[test]
fn a_document_past_the_plan_bound_is_refused_before_it_is_placed() {
    use o41_engine::config::{PackingSpec, TokenLayout};
    let shard = token_shard("tokens-long", &[4 << 20]);
    let layout = TokenLayout::Packed(PackingSpec {
        field: "t".into(),
        seq_len: 1,
        bins: 1,
        eos_id: None,
        overflow: o41_engine::config::PackOverflow::default(),
    });
    let error = inspect_tokens(&shard, &layout, None, 1 << 20).expect_err("too large");
    assert!(error.to_string().contains(&shard.uri()), "{error}");
    assert!(LARGEST.load(Ordering::Relaxed) <= ALLOCATION_BOUND);
}
