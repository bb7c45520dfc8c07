//! Byte-mutation fuzzing of everything the engine reads from a file: shards of every encoding,
//! checkpoint documents and data manifests. Valid seeds are mutated (bytes overwritten, inserted,
//! deleted, the tail cut) and read through inspection, the stream readers and whole-record
//! reads. An input may be refused, with an error; it may not panic, abort, or make the engine
//! ask for a large allocation: no single allocation may exceed `ALLOCATION_BOUND`, whatever the
//! (small) input claims its sizes are.
//!
//! Runs `PROPTEST_CASES` cases per target (300 by default, a few seconds); set it higher for a
//! longer search. This binary counts its allocations, so it holds these tests only.

// Counting allocations needs a global allocator, which is an unsafe trait; it only forwards to
// the system allocator.
#![allow(unsafe_code)]

mod counting;
mod forge;

use counting::{Counting, ALLOCATION_BOUND, LARGEST};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, Int64Array, ListArray, RecordBatch};
use o41_engine::checkpoint::Checkpoint;
use o41_engine::columns::Chunk;
use o41_engine::config::{FieldSpec, ResolvedConfig};
use o41_engine::dtype::DType;
use o41_engine::encoding::{Encoding, RecordPayload};
use o41_engine::fields::Projection;
use o41_engine::formats::{self, ShardRecords};
use o41_engine::manifest::Manifest;
use o41_engine::order::Order;
use o41_engine::storage::Storage;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use proptest::prelude::*;
use proptest::sample::Index;

/// Inspections that decode the first record too, as open's do: more of a mutated shard is read.
const FIRST: formats::Checks<'static> = formats::Checks {
    promise: None,
    first_record: true,
    seen: None,
    cache: None,
};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Edits applied to a seed: overwrite, insert or delete a byte, or cut the tail.
fn mutations(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((any::<Index>(), any::<u8>(), 0..4u8), 1..6).prop_map(move |edits| {
        let mut bytes = seed.clone();
        for (at, byte, kind) in edits {
            if bytes.is_empty() {
                bytes.push(byte);
                continue;
            }
            let i = at.index(bytes.len());
            match kind {
                0 => bytes[i] = byte,
                1 => bytes.insert(i, byte),
                2 => {
                    bytes.remove(i);
                }
                _ => bytes.truncate(i),
            }
        }
        bytes
    })
}

fn projection() -> Projection {
    Projection::new(&[
        FieldSpec {
            overflow: o41_engine::config::Overflow::Truncate,
            pad_side: o41_engine::config::PadSide::Right,
            name: "v".into(),
            source: "v".into(),
            dtype: DType::I64,
            shape: vec![],
            pad: serde_json::Value::from(0),
        },
        FieldSpec {
            overflow: o41_engine::config::Overflow::Truncate,
            pad_side: o41_engine::config::PadSide::Right,
            name: "t".into(),
            source: "t".into(),
            dtype: DType::I32,
            shape: vec![4],
            pad: serde_json::Value::from(0),
        },
    ])
    .unwrap()
}

fn records() -> Vec<(i64, Vec<i32>)> {
    (0..40)
        .map(|i| (i * 7, (0..i % 5).map(|k| k as i32).collect()))
        .collect()
}

fn parquet_seed() -> Vec<u8> {
    parquet_seed_with(
        WriterProperties::builder()
            .set_max_row_group_row_count(Some(16))
            .build(),
    )
}

/// The other common layout: version 2 pages, uncompressed and without dictionaries, a few rows
/// a page, so mutations land in levels and values the engine's own page reader decodes.
fn parquet_v2_seed() -> Vec<u8> {
    parquet_seed_with(
        WriterProperties::builder()
            .set_writer_version(parquet::file::properties::WriterVersion::PARQUET_2_0)
            .set_compression(parquet::basic::Compression::UNCOMPRESSED)
            .set_dictionary_enabled(false)
            .set_data_page_row_count_limit(4)
            .set_write_batch_size(4)
            .set_max_row_group_row_count(Some(16))
            .build(),
    )
}

/// `records()` as one Arrow batch: `v` an int64 column, `t` a list of int32.
fn seed_batch() -> RecordBatch {
    let (v, t): (Vec<i64>, Vec<Vec<i32>>) = records().into_iter().unzip();
    let v: ArrayRef = Arc::new(Int64Array::from(v));
    let t: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
        t.into_iter().map(|l| Some(l.into_iter().map(Some))),
    ));
    RecordBatch::try_from_iter([("v", v), ("t", t)]).unwrap()
}

fn parquet_seed_with(properties: WriterProperties) -> Vec<u8> {
    let batch = seed_batch();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

fn jsonl_seed() -> Vec<u8> {
    let mut out = Vec::new();
    for (v, t) in records() {
        writeln!(out, "{{\"v\": {v}, \"t\": {t:?}, \"x\": \"skip\"}}").unwrap();
    }
    out
}

fn gzip_seed() -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&jsonl_seed()).unwrap();
    gz.finish().unwrap()
}

/// What the engine's writer (the dataset saver's) makes of small records: the seekable layout,
/// with enough records (2,100) for three members (at most 1,024 lines each).
fn seekable_gz_seed() -> Vec<u8> {
    // Tests run in parallel threads: each seed gets a file of its own.
    static SEEDS: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "o41-fuzz-seed-{}-{}.jsonl.gz",
        std::process::id(),
        SEEDS.fetch_add(1, Ordering::Relaxed)
    ));
    let records: Vec<formats::Record> = (0..2100i64)
        .map(|i| (i * 7, (0..i % 5).map(|k| k as i32).collect::<Vec<_>>()))
        .map(|(v, t)| {
            vec![
                ("v".to_owned(), formats::Value::Int(v)),
                (
                    "t".to_owned(),
                    formats::Value::List(
                        t.into_iter()
                            .map(|k| formats::Value::Int(k.into()))
                            .collect(),
                    ),
                ),
            ]
        })
        .collect();
    let uri = path.to_string_lossy().into_owned();
    formats::write_shard(
        &uri,
        &uri,
        Encoding::JsonlGz,
        formats::ShardData::Records(&records),
    )
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

fn msgpack_seed() -> Vec<u8> {
    let mut out = Vec::new();
    for (v, t) in records() {
        let frame = rmp_serde::to_vec_named(&serde_json::json!({"v": v, "t": t})).unwrap();
        out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        out.extend_from_slice(&frame);
    }
    out
}

/// Writes `bytes` as a shard and reads it every way the engine does; errors are fine.
fn read_every_way(bytes: &[u8], encoding: Encoding, case: u64) {
    // Targets of one encoding run in parallel threads, each counting its cases from 0.
    static FILES: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "o41-fuzz-{}-{case}-{}.{}",
        std::process::id(),
        FILES.fetch_add(1, Ordering::Relaxed),
        encoding.name()
    ));
    std::fs::write(&path, bytes).unwrap();
    let uri = path.to_string_lossy().into_owned();
    let storage = Storage::local();
    let projection = projection();
    if let Ok(meta) = formats::inspect(&storage, &uri, encoding, &projection, 1 << 20, FIRST) {
        if let Ok(mut reader) = formats::open(&storage, &uri, &meta, None) {
            let rows = meta.rows.min(1 << 16);
            let mut chunk = Chunk::padded(&projection, rows as usize);
            let _ = reader.read_ranges(
                std::slice::from_ref(&(0..rows)),
                &projection,
                &mut chunk,
                None,
            );
        }
    }
    if let Ok(mut records) = ShardRecords::open(&storage, &uri, encoding, 64) {
        for _ in 0..10_000 {
            match records.next_chunk(64) {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }
    std::fs::remove_file(&path).unwrap();
}

fn check_allocations() {
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= ALLOCATION_BOUND,
        "an input of a few KiB made the engine allocate {largest} bytes at once"
    );
}

fn fuzz_shards(encoding: Encoding, seed: Vec<u8>) {
    fuzz_mutations(encoding, seed, <[u8]>::to_vec);
}

/// Reads every mutation of `seed`, made into a shard by `shard`, every way there is.
fn fuzz_mutations(encoding: Encoding, seed: Vec<u8>, shard: impl Fn(&[u8]) -> Vec<u8>) {
    each_mutation(seed, |mutated, n| {
        read_every_way(&shard(mutated), encoding, n);
    });
}

/// Hands `read(mutation, case number)` every mutation of `seed`, checking allocations after each.
fn each_mutation(seed: Vec<u8>, read: impl Fn(&[u8], u64)) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let case = AtomicUsize::new(0);
    runner
        .run(&mutations(seed), |mutated| {
            read(&mutated, case.fetch_add(1, Ordering::Relaxed) as u64);
            check_allocations();
            Ok(())
        })
        .unwrap();
}

#[test]
fn parquet_shards() {
    fuzz_shards(Encoding::Parquet, parquet_seed());
}

/// Every seed reads whole, so the fuzz mutates valid shards, not inputs refused at the first byte.
#[test]
fn seeds_read_whole() {
    let seeds = [
        (Encoding::Parquet, parquet_seed()),
        (Encoding::Parquet, parquet_v2_seed()),
        (Encoding::Jsonl, jsonl_seed()),
        (Encoding::JsonlGz, gzip_seed()),
        (Encoding::JsonlGz, seekable_gz_seed()),
        (Encoding::Msgpack, msgpack_seed()),
    ];
    for (k, (encoding, bytes)) in seeds.into_iter().enumerate() {
        let path = std::env::temp_dir().join(format!(
            "o41-fuzz-seed-{}-{k}.{}",
            std::process::id(),
            encoding.name()
        ));
        std::fs::write(&path, bytes).unwrap();
        let uri = path.to_string_lossy().into_owned();
        let storage = Storage::local();
        let projection = projection();
        let meta = formats::inspect(&storage, &uri, encoding, &projection, 1 << 20, FIRST).unwrap();
        assert!(
            meta.rows >= records().len() as u64,
            "seed {k}: {} rows",
            meta.rows
        );
        let mut reader = formats::open(&storage, &uri, &meta, None).unwrap();
        let mut chunk = Chunk::padded(&projection, meta.rows as usize);
        reader
            .read_ranges(
                std::slice::from_ref(&(0..meta.rows)),
                &projection,
                &mut chunk,
                None,
            )
            .map_err(|f| f.error)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn parquet_v2_shards() {
    fuzz_shards(Encoding::Parquet, parquet_v2_seed());
}

/// The seed's records as the dataset saver writes them: their token lists' lengths in the footer.
fn saved_parquet_seed() -> Vec<u8> {
    let batch = seed_batch();
    let path = std::env::temp_dir().join(format!("o41-fuzz-saved-{}.parquet", std::process::id()));
    let path_str = path.to_string_lossy().into_owned();
    formats::write_shard(
        &path_str,
        "saved",
        Encoding::Parquet,
        formats::ShardData::Arrow {
            schema: batch.schema(),
            batches: std::slice::from_ref(&batch),
        },
    )
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

/// A Parquet shard of token lists, planned for packing as a token stage plans it: list lengths
/// from the pages' levels, or from decoding the lists where those do not read. Only the plan is
/// fuzzed here; reading the lists is `parquet_shards`' `t` column.
#[test]
fn parquet_token_shards() {
    fuzz_token_plans(parquet_seed());
}

/// Mutations of a saver-written shard also reach its footer's index of list lengths.
#[test]
fn saved_parquet_token_shards() {
    let seed = saved_parquet_seed();
    assert!(
        seed.windows(17)
            .any(|w| w == b"o41.list_lengths.".as_slice()),
        "the seed carries a footer index"
    );
    fuzz_token_plans(seed);
}

fn fuzz_token_plans(seed: Vec<u8>) {
    use o41_engine::config::{PackingSpec, TokenLayout};
    let layout = TokenLayout::Packed(PackingSpec {
        field: "t".into(),
        seq_len: 8,
        bins: 2,
        eos_id: None,
        overflow: o41_engine::config::PackOverflow::default(),
    });
    let projection = projection();
    each_mutation(seed, |mutated, n| {
        let path = std::env::temp_dir().join(format!(
            "o41-fuzz-tokens-{}-{n}.parquet",
            std::process::id()
        ));
        std::fs::write(&path, mutated).unwrap();
        let uri = path.to_string_lossy().into_owned();
        let tokens = formats::TokenInspection {
            layout: &layout,
            cache: None,
        };
        let _ = formats::inspect_shard(
            &Storage::local(),
            &uri,
            Encoding::Parquet,
            Some(tokens),
            &projection,
            (1 << 20, 16 << 20),
            formats::Checks::default(),
        );
        std::fs::remove_file(&path).unwrap();
    });
}

#[test]
fn jsonl_shards() {
    fuzz_shards(Encoding::Jsonl, jsonl_seed());
}

#[test]
fn jsonl_gz_shards() {
    fuzz_shards(Encoding::JsonlGz, gzip_seed());
}

#[test]
fn seekable_jsonl_gz_shards() {
    fuzz_shards(Encoding::JsonlGz, seekable_gz_seed());
}

/// Mutations aimed at the member index: only the file's last bytes (the index member) change.
#[test]
fn seekable_jsonl_gz_indexes() {
    let seed = seekable_gz_seed();
    let total = u32::from_le_bytes(seed[seed.len() - 14..seed.len() - 10].try_into().unwrap());
    let (members, index) = seed.split_at(seed.len() - total as usize);
    fuzz_mutations(Encoding::JsonlGz, index.to_vec(), |tail| {
        [members, tail].concat()
    });
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// An index that claims every member inflates to far more than its few compressed bytes can
/// (deflate expands at most 1,032 times), with a longest line the reader accepts: the reader
/// must refuse the claim, not allocate for it.
#[test]
fn seekable_jsonl_gz_sizes_beyond_deflate() {
    let seed = seekable_gz_seed();
    let total = u32::from_le_bytes(seed[seed.len() - 14..seed.len() - 10].try_into().unwrap());
    let members_end = seed.len() - total as usize;
    // Member boundaries: each data member starts with the same fixed header.
    let header = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut starts: Vec<usize> = (0..members_end)
        .filter(|&at| seed[at..].starts_with(&header))
        .collect();
    starts.push(members_end);
    let longest = 1u64 << 20;
    let mut data = vec![1u8];
    put_varint(&mut data, longest);
    put_varint(&mut data, (starts.len() - 1) as u64);
    for pair in starts.windows(2) {
        put_varint(&mut data, (pair[1] - pair[0]) as u64);
        put_varint(&mut data, (65 << 20) - 1);
        put_varint(&mut data, 1000);
    }
    let xlen = 4 + data.len() + 8;
    let member_len = 12 + xlen + 10;
    let mut bytes = seed[..members_end].to_vec();
    bytes.extend_from_slice(&[0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff]);
    bytes.extend_from_slice(&(xlen as u16).to_le_bytes());
    bytes.extend_from_slice(b"oI");
    bytes.extend_from_slice(&(data.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&data);
    bytes.extend_from_slice(b"oL\x04\x00");
    bytes.extend_from_slice(&(member_len as u32).to_le_bytes());
    bytes.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    read_every_way(&bytes, Encoding::JsonlGz, 0);
    check_allocations();
}

#[test]
fn msgpack_shards() {
    fuzz_shards(Encoding::Msgpack, msgpack_seed());
}

fn checkpoint_seed() -> Vec<u8> {
    let resolved: ResolvedConfig = serde_json::from_value(serde_json::json!({
        "version": 1,
        "fields": [{"name": "v", "source": "v", "dtype": "i64", "shape": [], "pad": 0}],
        "stages": [
            {"sources": [{"weight": 1.0, "shards": [{"path": "/a.jsonl", "encoding": "jsonl", "rows": 100}]}],
             "batch_size": 4, "shuffle": {"buffer_rows": 16, "unit_rows": 2}, "infinite": true},
            {"sources": [{"weight": 2.0, "shards": [{"path": "/b.jsonl", "encoding": "jsonl", "rows": 10}]}],
             "batch_size": 2, "shuffle": null, "infinite": false}
        ],
        "seed": 1, "threads": 1, "prefetch_batches": 1, "rank": 0, "world_size": 2,
        "memory_limit_bytes": null
    }))
    .unwrap();
    let fingerprint = resolved.fingerprint();
    serde_json::to_vec(&serde_json::json!({
        "version": 1,
        "fingerprint": fingerprint,
        "cursor": {"segment": {"stage": 1, "start_batch": 8, "drain": {"stage": 0, "from": 30, "to": 32}}, "next_batch": 10},
        "stage": 1,
        "batches_yielded": 5,
        "rows_yielded": 18,
        "epochs": [0],
        "resolved": resolved,
    }))
    .unwrap()
}

#[test]
fn checkpoint_documents() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&mutations(checkpoint_seed()), |bytes| {
            let Ok(text) = std::str::from_utf8(&bytes) else {
                return Ok(());
            };
            if let Ok(checkpoint) = Checkpoint::from_json(text) {
                // What resuming does with the document before opening any shard.
                if let Ok(order) = Order::new(&checkpoint.resolved) {
                    let _ = order.check_cursor(
                        &checkpoint.position.cursor.segment,
                        checkpoint.position.cursor.next_batch,
                        checkpoint.resolved.world_size as u64,
                    );
                }
                let _ = checkpoint.for_world(1, 3);
            }
            check_allocations();
            Ok(())
        })
        .unwrap();
}

/// A split checkpoint (version 2): its rank file and its shared document are mutated in turn,
/// and the other kept whole. Neither may panic or allocate past the bound; a pair that parses
/// goes through what resuming does first.
#[test]
fn split_checkpoint_documents() {
    let whole = Checkpoint::from_json(std::str::from_utf8(&checkpoint_seed()).unwrap()).unwrap();
    let rank = whole.to_split_json();
    let shared = whole.shared_json();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    for (seed, mutate_rank) in [(rank.clone(), true), (shared.clone(), false)] {
        runner
            .run(&mutations(seed.into_bytes()), |bytes| {
                let Ok(text) = std::str::from_utf8(&bytes) else {
                    return Ok(());
                };
                let (rank_text, shared_text) = if mutate_rank {
                    (text, shared.as_str())
                } else {
                    (rank.as_str(), text)
                };
                let _ = o41_engine::checkpoint::shared_reference(rank_text);
                if let Ok(checkpoint) = Checkpoint::from_split(rank_text, shared_text) {
                    assert_eq!(
                        checkpoint.position.fingerprint,
                        checkpoint.resolved.fingerprint()
                    );
                    let _ = checkpoint.for_world(1, 3);
                }
                check_allocations();
                Ok(())
            })
            .unwrap();
    }
}

fn manifest_seed() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "format": "o41-data-manifest",
        "version": 1,
        "data_format": "parquet",
        "splits": {
            "train": {
                "shards": [
                    {"location": "train/easy/shard-0.parquet", "rows": 10, "bytes": 100,
                     "checksum": "sha256:00", "curriculum_stage": "easy", "metadata": {}},
                    {"location": "train/hard/shard-1.parquet", "rows": 20, "bytes": 200,
                     "checksum": "sha256:11", "curriculum_stage": "hard", "metadata": {"k": 1}}
                ],
                "curricula": [{"name": "all", "shards": ["train/easy/shard-0.parquet", "train/hard/shard-1.parquet"], "metadata": {}}]
            }
        }
    }))
    .unwrap()
}

#[test]
fn manifest_documents() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&mutations(manifest_seed()), |bytes| {
            let Ok(text) = std::str::from_utf8(&bytes) else {
                return Ok(());
            };
            if let Ok(manifest) = Manifest::from_json(text, "/m.json") {
                for stages in [
                    None,
                    Some(vec!["easy".to_owned()]),
                    Some(vec!["all".to_owned()]),
                ] {
                    let _ = manifest.select("train", stages.as_deref(), "source");
                }
            }
            check_allocations();
            Ok(())
        })
        .unwrap();
}

/// Byte mutations of shards written byte by byte with a dictionary and Snappy pages, and with a
/// column nested eight groups deep: mutations land in page headers and schema elements.
#[test]
fn forged_parquet_shards() {
    use forge::{forge, Forge};
    fuzz_shards(
        Encoding::Parquet,
        forge(&Forge {
            dictionary: true,
            snappy: true,
            ..Forge::default()
        }),
    );
    fuzz_shards(
        Encoding::Parquet,
        forge(&Forge {
            deep: 8,
            ..Forge::default()
        }),
    );
}

/// Page header and footer fields forged to any value: dictionary sizes, page sizes, chunk sizes,
/// physical types and nesting depths. Each is read, or refused, within the allocation bound.
#[test]
fn forged_parquet_sizes_and_schemas() {
    use forge::{forge, Forge};
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let fields = (
        proptest::option::of(any::<i32>()),
        proptest::option::of(any::<i32>()),
        proptest::option::of(any::<i64>()),
        (1..3i32, 0..8i32),
        (0..200usize, any::<bool>(), any::<bool>()),
    );
    let case = AtomicUsize::new(0);
    runner
        .run(
            &fields,
            |(dictionary_values, page_uncompressed, chunk_uncompressed, types, shape)| {
                let (schema_type, chunk_type) = types;
                let (deep, dictionary, snappy) = shape;
                let bytes = forge(&Forge {
                    dictionary,
                    snappy,
                    schema_type,
                    chunk_type,
                    dictionary_values,
                    page_uncompressed,
                    chunk_uncompressed,
                    deep,
                    ..Forge::default()
                });
                read_every_way(
                    &bytes,
                    Encoding::Parquet,
                    case.fetch_add(1, Ordering::Relaxed) as u64,
                );
                check_allocations();
                Ok(())
            },
        )
        .unwrap();
}

/// Inspection-cache entries of list lengths forged to any lengths: a token plan is built from
/// them only where they agree with the shard, within the allocation bound.
#[test]
fn forged_cached_list_lengths() {
    use o41_engine::config::{PackingSpec, TokenLayout};
    use o41_engine::inspect_cache::InspectCache;
    let seed = saved_parquet_seed();
    let path =
        std::env::temp_dir().join(format!("o41-fuzz-lengths-{}.parquet", std::process::id()));
    std::fs::write(&path, &seed).unwrap();
    let uri = path.to_string_lossy().into_owned();
    let dir = std::env::temp_dir().join(format!("o41-fuzz-lengths-{}", std::process::id()));
    let cache = InspectCache::new(&dir);
    let pin = Storage::local().open(&uri).unwrap().pin();
    let layout = TokenLayout::Packed(PackingSpec {
        field: "t".into(),
        seq_len: 2,
        bins: 2,
        eos_id: None,
        overflow: o41_engine::config::PackOverflow::default(),
    });
    let projection = projection();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let lengths = prop::collection::vec(
        prop_oneof![
            0..8u64,
            Just(u64::from(u32::MAX)),
            any::<u32>().prop_map(u64::from)
        ],
        0..48,
    );
    runner
        .run(&lengths, |lengths| {
            formats::store_list_lengths(&cache, (&uri, Encoding::Parquet, &pin), "t", &lengths);
            let _ = formats::inspect_shard(
                &Storage::local(),
                &uri,
                Encoding::Parquet,
                Some(formats::TokenInspection {
                    layout: &layout,
                    cache: Some(&cache),
                }),
                &projection,
                (1 << 20, 16 << 20),
                formats::Checks::default(),
            );
            check_allocations();
            Ok(())
        })
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::remove_file(&path).unwrap();
}

/// A gzip stream long enough for access points (one every 2 MiB of output): its text's lines.
fn long_gzip_seed() -> (Vec<u8>, u64) {
    let mut text = Vec::new();
    let mut rows = 0u64;
    while text.len() < 5 << 20 {
        // Numbers that do not repeat, so deflate closes blocks often, as on real text.
        let noise: Vec<u64> = (0..(rows % 60))
            .map(|k| (rows * 2_654_435_761 + k * 40_503) % 1_000_003)
            .collect();
        writeln!(text, "{{\"v\": {rows}, \"t\": [1, 2], \"x\": {noise:?}}}").unwrap();
        rows += 1;
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&text).unwrap();
    (gz.finish().unwrap(), rows)
}

/// A gzip access index in the inspection cache damaged any way: it is rebuilt, or its damaged
/// window is found out when read; the rows read are the stream's either way.
#[test]
fn forged_gzip_access_indexes() {
    use o41_engine::inspect_cache::InspectCache;
    let (seed, rows) = long_gzip_seed();
    let name = format!("o41-fuzz-gzindex-{}", std::process::id());
    let path = std::env::temp_dir().join(format!("{name}.jsonl.gz"));
    std::fs::write(&path, &seed).unwrap();
    let uri = path.to_string_lossy().into_owned();
    let dir = std::env::temp_dir().join(name);
    let cache = InspectCache::new(&dir);
    let checks = formats::Checks {
        cache: Some(&cache),
        ..FIRST
    };
    let projection = projection();
    let storage = Storage::local();
    let read = |range: std::ops::Range<u64>| {
        let meta = formats::inspect(
            &storage,
            &uri,
            Encoding::JsonlGz,
            &projection,
            1 << 20,
            checks,
        )
        .expect("the stream is sound");
        assert_eq!(meta.rows, rows);
        let mut reader = formats::open(&storage, &uri, &meta, None).unwrap();
        let mut chunk = Chunk::padded(&projection, (range.end - range.start) as usize);
        reader
            .read_ranges(std::slice::from_ref(&range), &projection, &mut chunk, None)
            .expect("the rows read");
        let o41_engine::columns::ColumnBuf::I64(v) = &chunk.columns[0] else {
            unreachable!("v is i64")
        };
        assert_eq!(
            v[..],
            (range.start as i64..range.end as i64).collect::<Vec<_>>()[..]
        );
    };
    read(0..2);
    // Entries sit one directory down, by their digest's first byte.
    let index = std::fs::read_dir(&dir)
        .unwrap()
        .flat_map(|sub| std::fs::read_dir(sub.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "gzindex"))
        .expect("the first inspection stored an access index");
    let good = std::fs::read(&index).unwrap();
    each_mutation(good, |mutated, case| {
        std::fs::write(&index, mutated).unwrap();
        let deep = rows - 3 - case % (rows / 2);
        read(deep..deep + 3);
    });
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::remove_file(&path).unwrap();
}

/// Checkpoint fields set to any combination of values: stage, cursor, counters, epochs, rank
/// and world size. A document is refused or resumes consistently; nothing panics.
#[test]
fn checkpoint_field_combinations() {
    let seed: serde_json::Value = serde_json::from_slice(&checkpoint_seed()).unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let small_or_huge = || prop_oneof![0..12u64, Just(u64::MAX), Just(u64::MAX - 1), Just(1 << 32)];
    let fields = (
        (small_or_huge(), small_or_huge(), small_or_huge()),
        (small_or_huge(), small_or_huge()),
        prop::collection::vec(small_or_huge(), 0..3),
        (small_or_huge(), small_or_huge(), 0..3u32),
    );
    runner
        .run(
            &fields,
            |((stage, segment_stage, next), (batches, rows), epochs, world)| {
                let mut doc = seed.clone();
                doc["stage"] = stage.into();
                doc["cursor"]["segment"]["stage"] = segment_stage.into();
                doc["cursor"]["next_batch"] = next.into();
                doc["batches_yielded"] = batches.into();
                doc["rows_yielded"] = rows.into();
                doc["epochs"] = epochs.into();
                doc["resolved"]["rank"] = world.0.into();
                doc["resolved"]["world_size"] = world.1.into();
                doc["resolved"]["version"] = world.2.into();
                if let Ok(checkpoint) = Checkpoint::from_json(&doc.to_string()) {
                    let position = &checkpoint.position;
                    assert_eq!(position.stage, position.cursor.segment.stage);
                    assert!(checkpoint.resolved.world_size <= 1 << 32);
                    assert_eq!(position.world_size, checkpoint.resolved.world_size);
                    if let Ok(order) = Order::new(&checkpoint.resolved) {
                        let _ = order.check_cursor(
                            &position.cursor.segment,
                            position.cursor.next_batch,
                            checkpoint.resolved.world_size as u64,
                        );
                    }
                    let _ = checkpoint.for_world(
                        usize::try_from(world.0).unwrap_or(usize::MAX),
                        usize::try_from(world.1).unwrap_or(usize::MAX),
                    );
                }
                check_allocations();
                Ok(())
            },
        )
        .unwrap();
}

/// A Megatron dataset as megatron-core's builder lays it out: three documents of one, two and
/// zero sequences of `int32` ids, no modes. Returns the `.idx` and the `.bin`.
fn megatron_seed() -> (Vec<u8>, Vec<u8>) {
    let sequences: [&[i32]; 3] = [&[5, 6, 7], &[8, 9], &[10, 11, 12, 13]];
    let documents: [u64; 4] = [0, 1, 3, 3];
    let mut bin = Vec::new();
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(4);
    idx.extend_from_slice(&(sequences.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(documents.len() as u64).to_le_bytes());
    for s in sequences {
        idx.extend_from_slice(&(s.len() as i32).to_le_bytes());
    }
    for s in sequences {
        idx.extend_from_slice(&(bin.len() as u64).to_le_bytes());
        bin.extend(s.iter().flat_map(|v| v.to_le_bytes()));
    }
    for d in documents {
        idx.extend_from_slice(&d.to_le_bytes());
    }
    (idx, bin)
}

/// Writes a Megatron dataset and reads it every way: inspected and read as records, read whole,
/// and planned and read as a packed token stage.
fn read_megatron(idx: &[u8], bin: &[u8], case: u64) {
    static FILES: AtomicUsize = AtomicUsize::new(0);
    let prefix = std::env::temp_dir().join(format!(
        "o41-fuzz-megatron-{}-{case}-{}",
        std::process::id(),
        FILES.fetch_add(1, Ordering::Relaxed)
    ));
    let uri = format!("{}.bin", prefix.to_string_lossy());
    let idx_path = format!("{}.idx", prefix.to_string_lossy());
    std::fs::write(&uri, bin).unwrap();
    std::fs::write(&idx_path, idx).unwrap();
    let storage = Storage::local();
    let projection = Projection::new(&[FieldSpec {
        overflow: o41_engine::config::Overflow::Truncate,
        pad_side: o41_engine::config::PadSide::Right,
        name: "t".into(),
        source: "tokens".into(),
        dtype: DType::I64,
        shape: vec![4],
        pad: serde_json::Value::from(0),
    }])
    .unwrap();
    read_all(&storage, &uri, Encoding::Megatron, &projection, None);
    let (layout, tokens) = token_plan("tokens");
    read_all(&storage, &uri, Encoding::Megatron, &tokens, Some(&layout));
    std::fs::remove_file(&uri).unwrap();
    std::fs::remove_file(&idx_path).unwrap();
}

/// A packing stage's layout over `field` (windows of 4 in 2 bins) and the projection of its
/// tokens.
fn token_plan(field: &str) -> (o41_engine::config::TokenLayout, Projection) {
    use o41_engine::config::{PackingSpec, TokenLayout};
    let layout = TokenLayout::Packed(PackingSpec {
        field: field.into(),
        seq_len: 4,
        bins: 2,
        eos_id: None,
        overflow: o41_engine::config::PackOverflow::default(),
    });
    let tokens = Projection::new(&[FieldSpec {
        overflow: o41_engine::config::Overflow::Truncate,
        pad_side: o41_engine::config::PadSide::Right,
        name: field.into(),
        source: field.into(),
        dtype: DType::I64,
        shape: vec![4],
        pad: serde_json::Value::from(0),
    }])
    .unwrap();
    (layout, tokens)
}

/// Inspects `uri` (as a token stage when `layout` is given) and reads every row of it, then
/// reads its whole records; errors are fine.
fn read_all(
    storage: &Storage,
    uri: &str,
    encoding: Encoding,
    projection: &Projection,
    layout: Option<&o41_engine::config::TokenLayout>,
) {
    let tokens = layout.map(|layout| formats::TokenInspection {
        layout,
        cache: None,
    });
    let inspected = formats::inspect_shard(
        storage,
        uri,
        encoding,
        tokens,
        projection,
        (1 << 20, 16 << 20),
        FIRST,
    );
    if let Ok(meta) = inspected {
        if let Ok(mut reader) = formats::open(storage, uri, &meta, None) {
            let rows = meta.rows.min(1 << 16);
            let mut chunk = Chunk::padded(projection, rows as usize);
            let _ = reader.read_ranges(
                std::slice::from_ref(&(0..rows)),
                projection,
                &mut chunk,
                None,
            );
        }
    }
    if layout.is_none() {
        if let Ok(mut records) = ShardRecords::open(storage, uri, encoding, 64) {
            while let Ok(Some(_)) = records.next_chunk(64) {}
        }
    }
}

/// Megatron indexes with forged counts, lengths, pointers and document indices, and truncated.
#[test]
fn megatron_indexes() {
    let (idx, bin) = megatron_seed();
    each_mutation(idx, |mutated, n| read_megatron(mutated, &bin, n));
}

/// Megatron `.bin` files cut, grown or rewritten under a valid index.
#[test]
fn megatron_bins() {
    let (idx, bin) = megatron_seed();
    each_mutation(bin, |mutated, n| read_megatron(&idx, mutated, n));
}

/// A Megatron index whose header claims counts of any size: refused before anything is sized
/// from them.
#[test]
fn megatron_forged_counts() {
    let (idx, bin) = megatron_seed();
    for (at, value) in [
        (18, u64::MAX),
        (18, 1 << 40),
        (26, u64::MAX),
        (26, 1 << 40),
        (18, 0),
        (26, 0),
    ] {
        let mut forged = idx.clone();
        forged[at..at + 8].copy_from_slice(&value.to_le_bytes());
        read_megatron(&forged, &bin, value);
        check_allocations();
    }
}

/// A `.npy` file of nine `uint16` ids, two of them eos (0), with a header of `version`.
fn npy_seed(version: u8) -> Vec<u8> {
    let header = "{'descr': '<u2', 'fortran_order': False, 'shape': (9,), }";
    let mut seed = b"\x93NUMPY".to_vec();
    seed.extend_from_slice(&[version, 0]);
    let padded = format!("{header:<117}\n");
    if version == 1 {
        seed.extend_from_slice(&(padded.len() as u16).to_le_bytes());
    } else {
        seed.extend_from_slice(&(padded.len() as u32).to_le_bytes());
    }
    seed.extend_from_slice(padded.as_bytes());
    for id in [3u16, 4, 0, 5, 6, 7, 0, 8, 9] {
        seed.extend_from_slice(&id.to_le_bytes());
    }
    seed
}

/// The in-place seeds are valid: the fuzz mutates datasets that read, not refused ones.
#[test]
fn in_place_seeds_read_whole() {
    let (idx, bin) = megatron_seed();
    let dir = std::env::temp_dir().join(format!("o41-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("m.idx"), idx).unwrap();
    std::fs::write(dir.join("m.bin"), bin).unwrap();
    std::fs::write(dir.join("a.npy"), npy_seed(2)).unwrap();
    let storage = Storage::local();
    let uri = dir.join("m.bin").to_string_lossy().into_owned();
    let mut records = ShardRecords::open(&storage, &uri, Encoding::Megatron, 64).unwrap();
    let Some(formats::RecordChunk::Records(docs)) = records.next_chunk(64).unwrap() else {
        panic!("no records");
    };
    let lens: Vec<usize> = docs
        .iter()
        .map(|d| match &d[0].1 {
            formats::Value::List(ids) => ids.len(),
            _ => usize::MAX,
        })
        .collect();
    assert_eq!(lens, [3, 6, 0]);
    let npy = dir.join("a.npy").to_string_lossy().into_owned();
    let (ids, _) = formats::count_ids(&storage, &npy, Encoding::Npy).unwrap();
    assert_eq!(ids, 9);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `.npy` token arrays (versions 1 and 2 headers), mutated, planned for packing at an eos id
/// and read.
#[test]
fn npy_arrays() {
    use o41_engine::config::{PackingSpec, TokenLayout};
    let layout = TokenLayout::Packed(PackingSpec {
        field: "tokens".into(),
        seq_len: 4,
        bins: 2,
        eos_id: Some(0),
        overflow: o41_engine::config::PackOverflow::default(),
    });
    let tokens = Projection::new(&[FieldSpec {
        overflow: o41_engine::config::Overflow::Truncate,
        pad_side: o41_engine::config::PadSide::Right,
        name: "tokens".into(),
        source: "tokens".into(),
        dtype: DType::I32,
        shape: vec![4],
        pad: serde_json::Value::from(0),
    }])
    .unwrap();
    for version in [1u8, 2] {
        let seed = npy_seed(version);
        each_mutation(seed, |mutated, n| {
            let path = std::env::temp_dir().join(format!(
                "o41-fuzz-npy-{}-{version}-{n}.npy",
                std::process::id()
            ));
            std::fs::write(&path, mutated).unwrap();
            let uri = path.to_string_lossy().into_owned();
            read_all(
                &Storage::local(),
                &uri,
                Encoding::Npy,
                &tokens,
                Some(&layout),
            );
            std::fs::remove_file(&path).unwrap();
        });
    }
}

/// The seed batch as an Arrow IPC stream (what `datasets` writes) or file (with its footer).
fn arrow_seed(file: bool) -> Vec<u8> {
    let batch = seed_batch();
    let mut out = Vec::new();
    if file {
        let mut writer = arrow_ipc::writer::FileWriter::try_new(&mut out, &batch.schema()).unwrap();
        writer.write(&batch.slice(0, 2)).unwrap();
        writer.write(&batch.slice(2, batch.num_rows() - 2)).unwrap();
        writer.finish().unwrap();
    } else {
        let mut writer =
            arrow_ipc::writer::StreamWriter::try_new(&mut out, &batch.schema()).unwrap();
        writer.write(&batch.slice(0, 2)).unwrap();
        writer.write(&batch.slice(2, batch.num_rows() - 2)).unwrap();
        writer.finish().unwrap();
    }
    out
}

/// Arrow IPC streams and files, mutated: message lengths, headers, bodies, truncation.
#[test]
fn arrow_ipc_files() {
    fuzz_shards(Encoding::Arrow, arrow_seed(false));
    fuzz_shards(Encoding::Arrow, arrow_seed(true));
}

/// The Arrow seeds read whole, so the fuzz mutates tables that read.
#[test]
fn arrow_seeds_read_whole() {
    for file in [false, true] {
        let path = std::env::temp_dir().join(format!(
            "o41-fuzz-arrow-seed-{}-{file}.arrow",
            std::process::id()
        ));
        std::fs::write(&path, arrow_seed(file)).unwrap();
        let uri = path.to_string_lossy().into_owned();
        let meta = formats::inspect(
            &Storage::local(),
            &uri,
            Encoding::Arrow,
            &projection(),
            1 << 20,
            FIRST,
        )
        .unwrap();
        assert_eq!(meta.rows, seed_batch().num_rows() as u64);
        std::fs::remove_file(&path).unwrap();
    }
}

/// An MDS dataset of three samples as `MDSWriter` lays it out, uncompressed: columns `id`
/// (`int`), `tokens` (`ndarray:int32`) and `text` (`str`). Returns the shard and `index.json`.
fn mds_seed() -> (Vec<u8>, String) {
    let samples: Vec<Vec<u8>> = (0..3i64)
        .map(|i| {
            // A dynamic shape: one dimension of uint8 sizes (1 << 2 | 0), then the ids.
            let mut tokens = vec![4u8, i as u8 + 1];
            tokens.extend((0..=i as i32).flat_map(i32::to_le_bytes));
            let text = format!("sample {i}").into_bytes();
            let mut sample = Vec::new();
            sample.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
            sample.extend_from_slice(&(text.len() as u32).to_le_bytes());
            sample.extend_from_slice(&(i * 7).to_le_bytes());
            sample.extend_from_slice(&tokens);
            sample.extend_from_slice(&text);
            sample
        })
        .collect();
    let config = b"{\"columns\": \"...\"}";
    let n = samples.len();
    // The count, then where each sample starts and the end, then the writer's config.
    let mut shard = (n as u32).to_le_bytes().to_vec();
    let mut at = (4 + 4 * (n + 1) + config.len()) as u32;
    shard.extend_from_slice(&at.to_le_bytes());
    for sample in &samples {
        at += sample.len() as u32;
        shard.extend_from_slice(&at.to_le_bytes());
    }
    shard.extend_from_slice(config);
    for sample in &samples {
        shard.extend_from_slice(sample);
    }
    let index = format!(
        r#"{{"version": 2, "shards": [{{"format": "mds", "version": 2,
        "column_names": ["id", "tokens", "text"],
        "column_encodings": ["int", "ndarray:int32", "str"],
        "column_sizes": [8, null, null], "compression": null, "hashes": [],
        "raw_data": {{"basename": "shard.00000.mds", "bytes": {}, "hashes": {{}}}},
        "samples": 3, "size_limit": 67108864, "zip_data": null}}]}}"#,
        shard.len()
    );
    (shard, index)
}

fn mds_projection() -> Projection {
    Projection::new(&[
        FieldSpec {
            overflow: o41_engine::config::Overflow::Truncate,
            pad_side: o41_engine::config::PadSide::Right,
            name: "id".into(),
            source: "id".into(),
            dtype: DType::I64,
            shape: vec![],
            pad: serde_json::Value::from(0),
        },
        FieldSpec {
            overflow: o41_engine::config::Overflow::Truncate,
            pad_side: o41_engine::config::PadSide::Right,
            name: "tokens".into(),
            source: "tokens".into(),
            dtype: DType::I32,
            shape: vec![4],
            pad: serde_json::Value::from(0),
        },
    ])
    .unwrap()
}

/// Writes an MDS dataset (`shard` listed by `index`) and reads it every way.
fn read_mds(shard: &[u8], index: &[u8], case: u64) {
    static DIRS: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "o41-fuzz-mds-{}-{case}-{}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("shard.00000.mds"), shard).unwrap();
    std::fs::write(dir.join("index.json"), index).unwrap();
    let uri = dir.join("shard.00000.mds").to_string_lossy().into_owned();
    read_all(
        &Storage::local(),
        &uri,
        Encoding::Mds,
        &mds_projection(),
        None,
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// MDS shards mutated under their index: counts, offsets, column sizes, truncation.
#[test]
fn mds_shards() {
    let (shard, index) = mds_seed();
    each_mutation(shard, |mutated, n| {
        // The index lists the shard's size, so a mutation that keeps it reaches the reader.
        let index = index.replace(
            &format!("\"bytes\": {}", mds_seed().0.len()),
            &format!("\"bytes\": {}", mutated.len()),
        );
        read_mds(mutated, index.as_bytes(), n);
    });
}

/// MDS indexes mutated: counts, sizes, encodings, names.
#[test]
fn mds_indexes() {
    let (shard, index) = mds_seed();
    each_mutation(index.into_bytes(), |mutated, n| {
        read_mds(&shard, mutated, n);
    });
}

/// The MDS seed reads whole.
#[test]
fn mds_seed_reads_whole() {
    let (shard, index) = mds_seed();
    let dir = std::env::temp_dir().join(format!("o41-fuzz-mds-seed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("shard.00000.mds"), shard).unwrap();
    std::fs::write(dir.join("index.json"), index).unwrap();
    let uri = dir.join("shard.00000.mds").to_string_lossy().into_owned();
    let mut records = ShardRecords::open(&Storage::local(), &uri, Encoding::Mds, 64).unwrap();
    let Some(formats::RecordChunk::Records(samples)) = records.next_chunk(64).unwrap() else {
        panic!("no samples");
    };
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[2][0].1, formats::Value::Int(14));
    assert_eq!(samples[2][2].1, formats::Value::Str("sample 2".into()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Arrow files and MDS shards read by a token stage: their list columns planned for packing
/// and read as windows.
#[test]
fn arrow_and_mds_token_plans() {
    let layout = |field: &str| token_plan(field).0;
    let tokens = |field: &str| token_plan(field).1;
    for file in [false, true] {
        each_mutation(arrow_seed(file), |mutated, n| {
            let path = std::env::temp_dir().join(format!(
                "o41-fuzz-arrow-tokens-{}-{file}-{n}.arrow",
                std::process::id()
            ));
            std::fs::write(&path, mutated).unwrap();
            let uri = path.to_string_lossy().into_owned();
            read_all(
                &Storage::local(),
                &uri,
                Encoding::Arrow,
                &tokens("t"),
                Some(&layout("t")),
            );
            std::fs::remove_file(&path).unwrap();
        });
    }
    let (shard, index) = mds_seed();
    each_mutation(shard, |mutated, n| {
        let dir =
            std::env::temp_dir().join(format!("o41-fuzz-mds-tokens-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let index = index.replace(
            &format!("\"bytes\": {}", mds_seed().0.len()),
            &format!("\"bytes\": {}", mutated.len()),
        );
        std::fs::write(dir.join("shard.00000.mds"), mutated).unwrap();
        std::fs::write(dir.join("index.json"), index).unwrap();
        let uri = dir.join("shard.00000.mds").to_string_lossy().into_owned();
        read_all(
            &Storage::local(),
            &uri,
            Encoding::Mds,
            &tokens("tokens"),
            Some(&layout("tokens")),
        );
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

/// The fuzz seeds' records as `MessagePack` maps, one `ArrayRecord` record each.
fn array_record_payloads() -> Vec<Vec<u8>> {
    records()
        .into_iter()
        .map(|(v, t)| rmp_serde::to_vec_named(&serde_json::json!({"v": v, "t": t})).unwrap())
        .collect()
}

const AR_MSGPACK: Encoding = Encoding::ArrayRecord(RecordPayload::Msgpack);
const AR_IDS: Encoding = Encoding::ArrayRecord(RecordPayload::Ids {
    width: 2,
    signed: false,
});

/// The `ArrayRecord` seed reads whole, as records and as token documents.
#[test]
fn array_record_seed_reads_whole() {
    use forge::riegeli::array_record;
    let path = std::env::temp_dir().join(format!("o41-fuzz-ar-seed-{}", std::process::id()));
    std::fs::write(&path, array_record(&array_record_payloads(), 6, &[])).unwrap();
    let uri = path.to_string_lossy().into_owned();
    let meta = formats::inspect(
        &Storage::local(),
        &uri,
        AR_MSGPACK,
        &projection(),
        1 << 20,
        FIRST,
    )
    .unwrap();
    assert_eq!(meta.rows, records().len() as u64);
    let mut reader = ShardRecords::open(&Storage::local(), &uri, AR_MSGPACK, 64).unwrap();
    let Some(formats::RecordChunk::Records(got)) = reader.next_chunk(64).unwrap() else {
        panic!("no records");
    };
    assert_eq!(got.len(), records().len());
    let v = got[13]
        .iter()
        .find(|(k, _)| k == "v")
        .map(|(_, v)| v.clone());
    assert_eq!(v, Some(formats::Value::Int(91)));
    let ids: Vec<Vec<u8>> = (0..9u16)
        .map(|i| (0..i).flat_map(u16::to_le_bytes).collect())
        .collect();
    std::fs::write(&path, array_record(&ids, 4, &[])).unwrap();
    let mut reader = ShardRecords::open(&Storage::local(), &uri, AR_IDS, 64).unwrap();
    let Some(formats::RecordChunk::Records(docs)) = reader.next_chunk(64).unwrap() else {
        panic!("no documents");
    };
    assert_eq!(docs.len(), 9);
    assert_eq!(
        docs[3][0].1,
        formats::Value::List((0..3).map(formats::Value::Int).collect())
    );
    std::fs::remove_file(&path).unwrap();
}

/// `ArrayRecord` files with bytes flipped, cut or inserted anywhere: hashes and bounds catch them.
#[test]
fn array_record_files() {
    use forge::riegeli::array_record;
    fuzz_shards(AR_MSGPACK, array_record(&array_record_payloads(), 6, &[]));
}

fn lie() -> impl Strategy<Value = forge::riegeli::Lie> {
    use forge::riegeli::Lie;
    let k = 0usize..8;
    prop_oneof![
        k.clone().prop_map(Lie::EntryOffset),
        k.clone().prop_map(Lie::EntryRecords),
        k.clone().prop_map(Lie::EntryDecoded),
        Just(Lie::Version),
        Just(Lie::Chunks),
        Just(Lie::Records),
        Just(Lie::FooterOffset),
        k.clone().prop_map(Lie::HeaderRecords),
        k.prop_map(Lie::HeaderDecoded),
        (0usize..40).prop_map(Lie::RecordSize),
    ]
}

fn forged_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..300,
        (1u64 << 16)..(1u64 << 18),
        (1u64 << 20)..(1u64 << 40),
        any::<u64>(),
        Just(u64::MAX),
    ]
}

/// `ArrayRecord` footers, postscripts and chunk headers that lie (offsets, counts, decoded sizes,
/// record sizes) with every hash matching: each is read, or refused, within the allocation bound,
/// as records and as token documents.
#[test]
fn forged_array_record_files() {
    use forge::riegeli::array_record;
    let (layout, tokens) = token_plan("tokens");
    let ids: Vec<Vec<u8>> = (0..20u16)
        .map(|i| (0..i % 7).flat_map(u16::to_le_bytes).collect())
        .collect();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let case = AtomicUsize::new(0);
    runner
        .run(
            &proptest::collection::vec((lie(), forged_value()), 1..4),
            |lies| {
                let n = case.fetch_add(1, Ordering::Relaxed);
                read_every_way(
                    &array_record(&array_record_payloads(), 6, &lies),
                    AR_MSGPACK,
                    n as u64,
                );
                check_allocations();
                let path = std::env::temp_dir()
                    .join(format!("o41-fuzz-ar-tokens-{}-{n}", std::process::id()));
                std::fs::write(&path, array_record(&ids, 3, &lies)).unwrap();
                let uri = path.to_string_lossy().into_owned();
                read_all(&Storage::local(), &uri, AR_IDS, &tokens, Some(&layout));
                std::fs::remove_file(&path).unwrap();
                check_allocations();
                Ok(())
            },
        )
        .unwrap();
}

/// Issue 48, case 16: a token shard whose footer claims 20 records of 2^32 - 1 tokens made open
/// visit each of the ~10^10 stream windows they would make to find the most pieces of any (no
/// output in a minute). The count is made from the documents, whatever the tokens claim.
#[test]
fn a_forged_token_count_is_planned_in_time_linear_in_its_documents() {
    use o41_engine::order::pack::{most_stream_pieces, stream_window_pieces};
    let per = u64::from(u32::MAX);
    let starts: Vec<u64> = (0..=20).map(|k| k * per).collect();
    let tokens = 20 * per;
    for seq_len in [1, 8, 4096] {
        let most = most_stream_pieces(tokens, seq_len, &starts);
        // A window across a boundary is two pieces; none holds more.
        let across = (per - 1) / seq_len;
        let mut pieces = Vec::new();
        stream_window_pieces(tokens, seq_len, across, &starts, &mut pieces);
        assert_eq!(most, pieces.len().max(1) as u64, "seq_len {seq_len}");
        assert!(most <= 2);
    }
    check_allocations();
}

/// Issue 48, case 15: a record nested 5,000 deep given to the dataset saver aborted the process
/// under an address-space cap. The Python face refuses it before Arrow sees it; the engine's own
/// writers of records must not recurse past their stack or allocate past the bound either.
#[test]
fn deep_records_are_written_or_refused_within_the_bound() {
    use o41_engine::formats::Value;
    let mut deep = Value::Int(1);
    for _ in 0..5_000 {
        deep = Value::List(vec![deep]);
    }
    let records = vec![vec![("deep".to_owned(), deep)]];
    for encoding in [Encoding::Msgpack, Encoding::JsonlGz] {
        let path = std::env::temp_dir().join(format!(
            "o41-fuzz-deep-{}.{}",
            std::process::id(),
            encoding.name()
        ));
        let uri = path.to_string_lossy().into_owned();
        let written = formats::write_shard(
            &uri,
            "deep",
            encoding,
            formats::ShardData::Records(&records),
        );
        let _ = std::fs::remove_file(&path);
        if let Err(error) = written {
            assert!(error.to_string().contains("deep"), "{error}");
        }
        check_allocations();
    }
}
