//! Resolution: from the user's config to the pinned document a stream opens, with every shard's
//! encoding and row count, after checking each shard's first record against the projection.

use std::collections::HashMap;
use std::path::Path;

use crate::config::{
    ManifestSelection, ResolvedConfig, ResolvedShard, ResolvedSource, ResolvedStage, ShuffleSpec,
    SourceSpec, StreamConfig, RESOLVED_CONFIG_VERSION,
};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::{self, ShardMeta};
use crate::manifest::{shard_path, Manifest};
use crate::memory::{MemoryBound, PipelineShape, ShardScratch};
use crate::storage::{self, Storage};

/// A resolved config with what inspection learnt about each shard.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The pinned document.
    pub config: ResolvedConfig,
    /// Validated projection (all columns, synthetic ones included).
    pub projection: Projection,
    /// Per stage, per source, per shard: row count and read index.
    pub metas: Vec<Vec<Vec<ShardMeta>>>,
    /// Where the shards are read from.
    pub storage: Storage,
}

/// Re-inspects the shards a checkpoint's resolved config pinned, refusing any whose row count
/// or encoding changed since: a resumed stream must read exactly what the original read.
pub fn reopen(config: ResolvedConfig, storage: &Storage) -> Result<Resolved> {
    config.validate()?;
    let projection = Projection::new(&config.fields)?;
    let bound = preflight(
        config.stages.iter().map(|s| (s.batch_size, s.shuffle)),
        (
            config.threads,
            config.prefetch_batches,
            config.memory_limit_bytes,
        ),
        &projection,
    )?;
    let (records, _) = projection.record_columns();
    let mut jobs = Vec::new();
    for (s, stage) in config.stages.iter().enumerate() {
        for (j, source) in stage.sources.iter().enumerate() {
            for shard in &source.shards {
                jobs.push(Job {
                    stage: s,
                    source: j,
                    path: shard.path.clone(),
                    encoding: shard.encoding,
                    rows: None,
                });
            }
        }
    }
    for job in &jobs {
        storage.check(&job.path)?;
    }
    let max_record = max_record(&bound, config.threads, jobs.len());
    let metas = inspect_all(storage, &jobs, &records, config.threads, max_record)?;
    let mut next = metas.into_iter();
    let mut all = Vec::with_capacity(config.stages.len());
    for stage in &config.stages {
        let mut stage_metas = Vec::with_capacity(stage.sources.len());
        for source in &stage.sources {
            let mut source_metas = Vec::with_capacity(source.shards.len());
            for shard in &source.shards {
                let meta = next.next().expect("one inspection per shard");
                if meta.rows != shard.rows {
                    return Err(Error::Checkpoint {
                        message: format!(
                            "{} now holds {} rows, but the checkpoint's stream read it with {}; the file list changed",
                            shard.path, meta.rows, shard.rows
                        ),
                    });
                }
                if let (Some(then), Some(now)) = (&shard.version, &meta.pin.version) {
                    if then != now {
                        return Err(Error::Checkpoint {
                            message: format!(
                                "{} changed since the checkpoint was taken (version {then}, now \
                                 {now}); a resumed stream must read the bytes the original read. \
                                 Copies of local shards must keep their modification times \
                                 (cp -p, rsync -t)",
                                shard.path
                            ),
                        });
                    }
                }
                source_metas.push(meta);
            }
            stage_metas.push(source_metas);
        }
        all.push(stage_metas);
    }
    Ok(Resolved {
        config,
        projection,
        metas: all,
        storage: storage.clone(),
    })
}

struct Job {
    stage: usize,
    source: usize,
    path: String,
    encoding: Encoding,
    /// Row count a manifest promises for the shard.
    rows: Option<u64>,
}

/// Appends the shards `source` (stage `s`, index `j`) reads to `jobs`.
fn source_jobs(
    source: &SourceSpec,
    s: usize,
    j: usize,
    manifests: &mut HashMap<String, Manifest>,
    jobs: &mut Vec<Job>,
    storage: &Storage,
) -> Result<()> {
    let option = format!("stages[{s}].sources[{j}]");
    match source {
        SourceSpec::Files {
            files, encoding, ..
        } => {
            for (f, file) in files.iter().enumerate() {
                let encoding = match encoding {
                    Some(name) => Encoding::parse(name, &format!("{option}.encoding"))?,
                    None => Encoding::from_path(file, &format!("{option}.files[{f}]"))?,
                };
                storage
                    .check(file)
                    .map_err(|e| renamed(e, &format!("{option}.files[{f}]")))?;
                jobs.push(Job {
                    stage: s,
                    source: j,
                    path: absolute(file),
                    encoding,
                    rows: None,
                });
            }
        }
        SourceSpec::Manifest {
            manifest_uri,
            split,
            curriculum_stages,
            ..
        } => {
            let uri = absolute(manifest_uri);
            if !manifests.contains_key(&uri) {
                storage
                    .check(&uri)
                    .map_err(|e| renamed(e, &format!("{option}.manifest_uri")))?;
                manifests.insert(uri.clone(), Manifest::load(&uri, storage)?);
            }
            let manifest = &manifests[&uri];
            for shard in manifest.select(split, curriculum_stages.as_deref(), &option)? {
                jobs.push(Job {
                    stage: s,
                    source: j,
                    path: shard_path(&uri, &shard.location),
                    encoding: manifest.data_format,
                    rows: Some(shard.rows),
                });
            }
            if jobs
                .last()
                .is_none_or(|job| (job.stage, job.source) != (s, j))
            {
                return Err(Error::config(
                    option,
                    format!("split '{split}' of {uri} lists no shards"),
                ));
            }
        }
    }
    Ok(())
}

/// The manifest selection `source` reads, as the resolved document records it.
fn selection(source: &SourceSpec) -> Option<ManifestSelection> {
    match source {
        SourceSpec::Files { .. } => None,
        SourceSpec::Manifest {
            manifest_uri,
            split,
            curriculum_stages,
            ..
        } => Some(ManifestSelection {
            manifest_uri: absolute(manifest_uri),
            split: split.clone(),
            curriculum_stages: curriculum_stages.clone(),
        }),
    }
}

/// Names the config option at fault in a storage settings error.
fn renamed(error: Error, option: &str) -> Error {
    match error {
        Error::Config { message, .. } => Error::config(option, message),
        other => other,
    }
}

/// Local paths are made absolute so a resolved document does not depend on the working directory.
fn absolute(path: &str) -> String {
    if storage::is_remote(path) {
        return path.to_owned();
    }
    std::path::absolute(Path::new(path))
        .map_or_else(|_| path.to_owned(), |p| p.to_string_lossy().into_owned())
}

/// Refuses, before any shard is touched, a config whose buffers alone exceed its memory limit
/// or 64 bits: inspection must not allocate a row that the bound would refuse.
fn preflight(
    stages: impl IntoIterator<Item = (usize, Option<ShuffleSpec>)>,
    resources: (usize, usize, Option<u64>),
    projection: &Projection,
) -> Result<MemoryBound> {
    let (threads, prefetch_batches, memory_limit_bytes) = resources;
    let shape = PipelineShape::new(stages, threads, prefetch_batches, memory_limit_bytes)?;
    MemoryBound::compute(&shape, projection, ShardScratch::default())
}

/// The longest record (JSON line, `MessagePack` frame) each inspection thread may hold, so that
/// inspecting hostile shards stays within the memory limit too: the bound's headroom shared by
/// the threads, and never more than `MAX_RECORD_BYTES`.
fn max_record(bound: &MemoryBound, threads: usize, shards: usize) -> u64 {
    let headroom = bound.limit - bound.total();
    (headroom / inspect_threads(threads, shards) as u64)
        .saturating_sub(formats::READER_BUFFER_BYTES)
        .min(formats::MAX_RECORD_BYTES)
}

/// Threads that inspect `shards` shards: at most `threads`, and never more than this many, which
/// keep a storage service busy already.
fn inspect_threads(threads: usize, shards: usize) -> usize {
    const MAX_INSPECT_THREADS: usize = 64;
    threads.clamp(1, shards.clamp(1, MAX_INSPECT_THREADS))
}

/// Resolves `config`: infers encodings, counts rows, indexes and checks every shard.
pub fn resolve(config: &StreamConfig, storage: &Storage) -> Result<Resolved> {
    config.validate()?;
    let projection = Projection::new(&config.fields)?;
    let bound = preflight(
        config.stages.iter().map(|s| (s.batch_size, s.shuffle)),
        (
            config.threads,
            config.prefetch_batches,
            config.memory_limit_bytes,
        ),
        &projection,
    )?;
    let (records, _) = projection.record_columns();
    let mut jobs = Vec::new();
    let mut manifests = HashMap::new();
    let mut counts: Vec<Vec<usize>> = Vec::with_capacity(config.stages.len());
    for (s, stage) in config.stages.iter().enumerate() {
        let mut stage_counts = Vec::with_capacity(stage.sources.len());
        for (j, source) in stage.sources.iter().enumerate() {
            let before = jobs.len();
            source_jobs(source, s, j, &mut manifests, &mut jobs, storage)?;
            stage_counts.push(jobs.len() - before);
        }
        counts.push(stage_counts);
    }
    let max_record = max_record(&bound, config.threads, jobs.len());
    let metas = inspect_all(storage, &jobs, &records, config.threads, max_record)?;
    for (job, meta) in jobs.iter().zip(&metas) {
        if let Some(expected) = job.rows {
            if expected != meta.rows {
                return Err(Error::Format {
                    path: job.path.clone(),
                    encoding: job.encoding.name(),
                    row: None,
                    message: format!(
                        "the manifest lists {expected} rows, the shard holds {}",
                        meta.rows
                    ),
                });
            }
        }
    }

    let mut stages = Vec::with_capacity(config.stages.len());
    let mut all_metas = Vec::with_capacity(config.stages.len());
    let mut next = jobs.iter().zip(metas);
    for (s, stage) in config.stages.iter().enumerate() {
        let mut sources = Vec::new();
        let mut stage_metas = Vec::new();
        for (j, source) in stage.sources.iter().enumerate() {
            let count = counts[s][j];
            let mut shards = Vec::with_capacity(count);
            let mut source_metas = Vec::with_capacity(count);
            for _ in 0..count {
                let (job, meta) = next.next().expect("one inspection per file");
                debug_assert_eq!((job.stage, job.source), (s, j));
                shards.push(ResolvedShard {
                    path: job.path.clone(),
                    encoding: job.encoding,
                    rows: meta.rows,
                    version: meta.pin.version.clone(),
                });
                source_metas.push(meta);
            }
            let resolved = ResolvedSource {
                weight: source.weight(),
                shards,
                manifest: selection(source),
            };
            if resolved.rows() == 0 {
                return Err(Error::config(
                    format!("stages[{s}].sources[{j}]"),
                    "the source's shards hold no records",
                ));
            }
            sources.push(resolved);
            stage_metas.push(source_metas);
        }
        stages.push(ResolvedStage {
            sources,
            batch_size: stage.batch_size,
            shuffle: stage.shuffle,
            infinite: stage.infinite,
        });
        all_metas.push(stage_metas);
    }
    Ok(Resolved {
        config: ResolvedConfig {
            version: RESOLVED_CONFIG_VERSION,
            fields: config.fields.clone(),
            stages,
            seed: config.seed,
            threads: config.threads,
            prefetch_batches: config.prefetch_batches,
            rank: config.rank,
            world_size: config.world_size,
            memory_limit_bytes: config.memory_limit_bytes,
        },
        projection,
        metas: all_metas,
        storage: storage.clone(),
    })
}

/// Inspects shards on up to `threads` threads; results keep the jobs' order, and the first
/// failure in that order is reported so errors do not depend on timing.
fn inspect_all(
    storage: &Storage,
    jobs: &[Job],
    projection: &Projection,
    threads: usize,
    max_record: u64,
) -> Result<Vec<ShardMeta>> {
    let threads = inspect_threads(threads, jobs.len());
    let per = jobs.len().div_ceil(threads).max(1);
    let inspect_part = |part: &[Job]| -> Vec<Result<ShardMeta>> {
        part.iter()
            .map(|job| {
                Error::catch(|| {
                    storage.cancel().check(&job.path)?;
                    formats::inspect(storage, &job.path, job.encoding, projection, max_record)
                })
            })
            .collect()
    };
    let results: Vec<Vec<Result<ShardMeta>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .chunks(per)
            .map(|part| {
                std::thread::Builder::new()
                    .name("o41-inspect".to_owned())
                    .spawn_scoped(scope, move || inspect_part(part))
                    .map_err(|e| Error::io("inspection thread", e))
            })
            .collect();
        handles
            .into_iter()
            .map(|spawned| match spawned {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|panic| vec![Err(Error::from_panic(panic.as_ref()))]),
                Err(e) => vec![Err(e)],
            })
            .collect()
    });
    results.into_iter().flatten().collect()
}

/// Refuses `resolved` (a checkpoint's) when `config` would not resolve to the same stream,
/// naming the first part that differs. Compares what the config says, without reading any
/// shard or manifest: the fields, the seed, each stage's settings and each source's weight,
/// file list and encodings or manifest selection. Row counts are checked when the shards are
/// reopened; rank, world size and resources (threads, prefetch, memory limit) are not compared.
pub fn check_config(resolved: &ResolvedConfig, config: &StreamConfig) -> Result<()> {
    config.validate()?;
    match first_difference(resolved, config)? {
        None => Ok(()),
        Some(difference) => Err(Error::Checkpoint {
            message: format!(
                "it was taken from another stream than this config describes: {difference}"
            ),
        }),
    }
}

/// "`option` is X in the checkpoint, Y in the config" when they differ.
fn differs<T: PartialEq + serde::Serialize>(option: &str, theirs: &T, ours: &T) -> Option<String> {
    (theirs != ours).then(|| {
        format!(
            "{option} is {} in the checkpoint, {} in the config",
            show(theirs),
            show(ours)
        )
    })
}

fn first_difference(resolved: &ResolvedConfig, config: &StreamConfig) -> Result<Option<String>> {
    if let Some(d) = differs(
        "the number of fields",
        &resolved.fields.len(),
        &config.fields.len(),
    ) {
        return Ok(Some(d));
    }
    for (i, (theirs, ours)) in resolved.fields.iter().zip(&config.fields).enumerate() {
        if let Some(d) = differs(&format!("fields[{i}]"), theirs, ours) {
            return Ok(Some(d));
        }
    }
    if let Some(d) = differs("seed", &resolved.seed, &config.seed).or_else(|| {
        differs(
            "the number of stages",
            &resolved.stages.len(),
            &config.stages.len(),
        )
    }) {
        return Ok(Some(d));
    }
    for (s, (theirs, ours)) in resolved.stages.iter().zip(&config.stages).enumerate() {
        let option = format!("stages[{s}]");
        let stage = differs(
            &format!("{option}.batch_size"),
            &theirs.batch_size,
            &ours.batch_size,
        )
        .or_else(|| differs(&format!("{option}.shuffle"), &theirs.shuffle, &ours.shuffle))
        .or_else(|| {
            differs(
                &format!("{option}.infinite"),
                &theirs.infinite,
                &ours.infinite,
            )
        })
        .or_else(|| {
            differs(
                &format!("the number of {option}.sources"),
                &theirs.sources.len(),
                &ours.sources.len(),
            )
        });
        if stage.is_some() {
            return Ok(stage);
        }
        for (j, (theirs, ours)) in theirs.sources.iter().zip(&ours.sources).enumerate() {
            let option = format!("{option}.sources[{j}]");
            if let Some(d) = differs(&format!("{option}.weight"), &theirs.weight, &ours.weight()) {
                return Ok(Some(d));
            }
            if let Some(difference) = source_difference(theirs, ours, &option)? {
                return Ok(Some(difference));
            }
        }
    }
    Ok(None)
}

fn source_difference(
    theirs: &ResolvedSource,
    ours: &SourceSpec,
    option: &str,
) -> Result<Option<String>> {
    let selection_in_checkpoint = &theirs.manifest;
    match (ours, selection_in_checkpoint) {
        (SourceSpec::Files { .. }, Some(pinned)) => Ok(Some(format!(
            "{option} read split '{}' of {} in the checkpoint; the config lists files",
            pinned.split, pinned.manifest_uri
        ))),
        (SourceSpec::Manifest { .. }, None) => Ok(Some(format!(
            "{option} read a file list in the checkpoint; the config names a manifest"
        ))),
        (SourceSpec::Manifest { .. }, Some(pinned)) => {
            let wanted = selection(ours);
            Ok((Some(pinned) != wanted.as_ref()).then(|| {
                format!(
                    "{option} selects {} in the config, {} in the checkpoint",
                    show(&wanted),
                    show(pinned)
                )
            }))
        }
        (
            SourceSpec::Files {
                files, encoding, ..
            },
            None,
        ) => {
            if files.len() != theirs.shards.len() {
                return Ok(Some(format!(
                    "{option}: the file list changed: the checkpoint read {} files, the config lists {}",
                    theirs.shards.len(),
                    files.len()
                )));
            }
            for (f, (file, shard)) in files.iter().zip(&theirs.shards).enumerate() {
                let path = absolute(file);
                if path != shard.path {
                    return Ok(Some(format!(
                        "{option}: the file list changed: files[{f}] is {path} in the config, {} in the checkpoint",
                        shard.path
                    )));
                }
                let expected = match encoding {
                    Some(name) => Encoding::parse(name, &format!("{option}.encoding"))?,
                    None => Encoding::from_path(file, &format!("{option}.files[{f}]"))?,
                };
                if expected != shard.encoding {
                    return Ok(Some(format!(
                        "{option}: files[{f}] is read as {} in the config, as {} in the checkpoint",
                        expected.name(),
                        shard.encoding.name()
                    )));
                }
            }
            Ok(None)
        }
    }
}

/// A value as compact JSON, for messages.
fn show<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
