//! Resolution: from the user's config to the pinned document a stream opens, with every shard's
//! encoding and row count, after checking one shard of every source against the projection.
//!
//! Open costs the sources, not the bytes: a manifest's shards take their row counts and sizes
//! from the manifest and are read for the first time by the stream itself, which holds each to
//! that promise ([`crate::formats::Promise`]); a plain file list's shards are counted once per
//! host and remembered in the [`InspectCache`]. A resumed stream re-checks its pinned shards the
//! same way.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::checkpoint::Checkpoint;
use crate::config::{
    renamed_fields, renamed_layout, FieldSpec, NamedFile, ResolvedConfig, ResolvedShard,
    ResolvedSource, SourceSpec, StreamConfig, TokenLayout, RESOLVED_CONFIG_VERSION,
};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::identity;
use crate::formats::{self, format_of, Promise, PromiseOrigin, ShardMeta};
use crate::inspect_cache::{Cached, InspectCache};
use crate::manifest::{Manifest, ShardLocations};
use crate::memory::{MemoryBound, PipelineShape, ShardScratch};
use crate::parallel::parallel;
use crate::storage::{self, Pin, Storage};

/// A resolved config with what open learnt about its shards.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The pinned document (shared with the checkpoints a stream takes).
    pub config: Arc<ResolvedConfig>,
    /// Validated projection (all columns, synthetic ones included).
    pub projection: Projection,
    /// The inspections open made, by flat shard id (stage, then source, then shard order),
    /// ascending: one shard per source at least, and a plain file list's shards the cache did
    /// not know.
    pub inspected: Vec<(usize, Box<ShardMeta>)>,
    /// The decode scratch open knows of: the largest, and whether every shard's is known.
    pub scratch: KnownScratch,
    /// The fingerprint of the checkpoint the document comes from, if it does. Broken promises
    /// are then reported as a resume that cannot be exact, and the stream takes the fingerprint
    /// as known: hashing a million-shard document again would delay its first batch.
    pub resumed_from: Option<String>,
    /// Where the shards are read from.
    pub storage: Storage,
}

/// The decode scratch (working memory of one read job) known at open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KnownScratch {
    /// The most any known shard needs.
    pub largest: u64,
    /// Whether it is known for every shard; otherwise shards read later may need more, and the
    /// stream reserves room for them.
    pub complete: bool,
}

/// Re-opens the shards a checkpoint's resolved config pinned, refusing any whose size, version or
/// row count changed since: a resumed stream must read exactly what the original read. Costs what
/// open costs: a file list's shards are looked at (size and version) and counted only where the
/// cache does not know them; a manifest's are held to their pins when first read.
pub fn reopen(checkpoint: &Checkpoint, storage: &Storage) -> Result<Resolved> {
    let config = checkpoint.resolved.clone();
    config.validate()?;
    let setup = Setup::new(&config.fields, config.pipeline_shape())?;
    let mut jobs = Vec::new();
    for (s, stage) in config.stages.iter().enumerate() {
        let layout = stage.token_layout().map(Arc::new);
        for (j, source) in stage.sources.iter().enumerate() {
            jobs.reserve(source.shards.len());
            let (reading, layout) = Reading::of(&config.fields, &source.columns, layout.as_ref())?;
            for shard in &source.shards {
                storage.check(&shard.path)?;
                jobs.push(Job {
                    layout: layout.clone(),
                    reading: reading.clone(),
                    stage: s,
                    source: j,
                    path: Cow::Borrowed(&shard.path),
                    encoding: shard.encoding,
                    promise: Some(shard.promise(PromiseOrigin::Checkpoint)),
                    listed: source.manifest.is_none() || layout.is_some(),
                });
            }
        }
    }
    let mut settled = settle(storage, &jobs, &setup)?;
    drop(jobs);
    let projection = setup.projection;
    Ok(Resolved {
        config,
        projection,
        inspected: inspections(&mut settled),
        scratch: settled.scratch,
        resumed_from: Some(checkpoint.position.fingerprint.clone()),
        storage: storage.clone(),
    })
}

/// One shard open must account for; on resume, it borrows from the checkpoint's document.
struct Job<'a> {
    stage: usize,
    source: usize,
    path: Cow<'a, str>,
    encoding: Encoding,
    /// What a manifest or checkpoint says of the shard.
    promise: Option<Promise<'a>>,
    /// A plain file list's shard: counted through the inspection cache. Token shards are
    /// listed too, and inspected (their windows are not in any manifest or cache).
    listed: bool,
    /// How the shard's stage reads tokens, if it does (its token field as the source names it).
    layout: Option<Arc<TokenLayout>>,
    /// How a source with a column mapping reads its records; `None`: as the fields say.
    reading: Option<Arc<Reading>>,
}

impl Job<'_> {
    /// The record columns the shard is read with: its source's, where it maps them.
    fn records<'j>(&'j self, fields: &'j Projection) -> &'j Projection {
        self.reading.as_ref().map_or(fields, |r| &r.records)
    }

    /// The inspection cache's key for the shard's projection.
    fn key<'j>(&'j self, fields: &'j str) -> &'j str {
        self.reading.as_ref().map_or(fields, |r| &r.key)
    }
}

/// How the shards of a source with a column mapping are read: the record columns with their
/// fields renamed, and the inspection cache's key for them.
struct Reading {
    records: Projection,
    key: String,
}

impl Reading {
    /// How a source with `columns` reads `fields` in a stage of `layout`: `None` without a
    /// mapping; otherwise its records and the stage's layout, renamed.
    #[allow(clippy::type_complexity)]
    fn of(
        fields: &[FieldSpec],
        columns: &BTreeMap<String, String>,
        layout: Option<&Arc<TokenLayout>>,
    ) -> Result<(Option<Arc<Reading>>, Option<Arc<TokenLayout>>)> {
        if columns.is_empty() {
            return Ok((None, layout.cloned()));
        }
        let fields = renamed_fields(fields, columns);
        let reading = Reading {
            records: Projection::new(&fields)?.record_columns().0,
            key: projection_key(&fields),
        };
        let layout = layout.map(|l| Arc::new(renamed_layout(l, columns)));
        Ok((Some(Arc::new(reading)), layout))
    }
}

/// What open learnt about the shards it looked at. Every other shard is pinned as promised
/// (its job's promise), so a million-shard manifest costs no entry here per shard.
struct Settled {
    /// The shards looked at (listed or inspected), by job index, ascending.
    shards: Vec<(usize, SettledShard)>,
    /// The decode scratch known.
    scratch: KnownScratch,
}

/// What open saw of a listed shard: its pin, its cached inspection, and a local file's
/// content identity.
type Probe = (Pin, Option<Cached>, Option<String>);

/// What open learnt about one shard it looked at.
struct SettledShard {
    rows: u64,
    /// A listed shard's version and size as open saw them.
    seen: Option<(Option<String>, u64)>,
    /// Its inspection, if open made one.
    meta: Option<Box<ShardMeta>>,
}

/// Refuses a source's shards (`jobs`, just appended) that its stage cannot read: a `.bin` token
/// stream outside a token stage, or a token stage's shard that is neither `.bin` nor Parquet.
/// A token stage's shards are all inspected at open (their windows are in no manifest).
fn check_token_sources(
    source: &SourceSpec,
    (s, j): (usize, usize),
    tokens: bool,
    jobs: &mut [Job],
) -> Result<()> {
    let option = format!("stages[{s}].sources[{j}]");
    if !tokens {
        if let Some((k, job)) = jobs
            .iter()
            .enumerate()
            .find(|(_, job)| !format_of(job.encoding).reads_records())
        {
            let at = match source {
                SourceSpec::Files { .. } => format!("{option}.files[{k}]"),
                SourceSpec::Manifest { .. } => option,
            };
            return Err(Error::config(
                at,
                format!(
                    "{} is a {} token stream, which only a stage with packing or windows reads",
                    job.path,
                    job.encoding.name()
                ),
            ));
        }
        return Ok(());
    }
    for (k, job) in jobs.iter_mut().enumerate() {
        if !format_of(job.encoding).reads_tokens() {
            return Err(Error::config(
                format!("{option}.encoding"),
                format!(
                    "stages[{s}] packs or windows tokens, which come from {} shards; shard {k} \
                     ({}) is {}",
                    crate::formats::token_encodings(),
                    job.path,
                    job.encoding.name()
                ),
            ));
        }
        job.listed = true;
    }
    Ok(())
}

/// Appends the shards `source` (stage `s`, index `j`) reads to `jobs`. Returns a file list's
/// entries as named, where one of them names other files than itself.
fn source_jobs(
    source: &SourceSpec,
    (s, j): (usize, usize),
    (layout, reading): (Option<&Arc<TokenLayout>>, Option<&Arc<Reading>>),
    manifests: &HashMap<String, Manifest<'_>>,
    jobs: &mut Vec<Job>,
    storage: &Storage,
) -> Result<Option<Vec<NamedFile>>> {
    let option = format!("stages[{s}].sources[{j}]");
    match source {
        SourceSpec::Files {
            files, encoding, ..
        } => {
            let mut names = Vec::with_capacity(files.len());
            let mut expanded = false;
            let before = jobs.len();
            // The entry each job comes from, to name both spellings of a shard named twice.
            let mut entries = Vec::with_capacity(files.len());
            for (f, file) in files.iter().enumerate() {
                let encoding = match encoding {
                    Some(name) => Encoding::parse(name, &format!("{option}.encoding"))?,
                    None => Encoding::from_path(file, &format!("{option}.files[{f}]"))?,
                };
                storage
                    .check(file)
                    .map_err(|e| renamed(e, &format!("{option}.files[{f}]")))?;
                // The format decides what the name stands for: itself, another file (a
                // Megatron `.idx`'s `.bin`) or the shards a dataset directory lists.
                let named = format!("{option}.files[{f}]");
                let shards = format_of(encoding).expand(storage, &absolute(file), &named)?;
                let file = absolute(file);
                expanded |= shards.len() != 1 || shards[0].0 != file;
                names.push(NamedFile {
                    file,
                    shards: shards.len() as u64,
                });
                for (path, promise) in shards {
                    entries.push(f);
                    jobs.push(Job {
                        layout: layout.cloned(),
                        reading: reading.cloned(),
                        stage: s,
                        source: j,
                        path: Cow::Owned(path),
                        encoding,
                        listed: promise.is_none(),
                        promise,
                    });
                }
            }
            refuse_repeats(&jobs[before..], &entries, files, &option)?;
            Ok(expanded.then_some(names))
        }
        SourceSpec::Manifest {
            manifest_uri,
            split,
            curriculum_stages,
            ..
        } => {
            let uri = absolute(manifest_uri);
            let manifest = &manifests[&uri];
            let locations = ShardLocations::new(&uri);
            let selected = manifest.select(split, curriculum_stages.as_deref(), &option)?;
            jobs.reserve(selected.len());
            for shard in selected {
                jobs.push(Job {
                    layout: layout.cloned(),
                    reading: reading.cloned(),
                    stage: s,
                    source: j,
                    path: Cow::Owned(
                        format_of(manifest.data_format)
                            .shard_location(&locations.path(&shard.location)),
                    ),
                    encoding: manifest.data_format,
                    promise: Some(Promise {
                        origin: PromiseOrigin::Manifest,
                        rows: shard.rows,
                        bytes: Some(shard.bytes),
                        version: None,
                        sha256: shard
                            .checksum
                            .strip_prefix("sha256:")
                            .map(|hex| Cow::Owned(hex.to_ascii_lowercase())),
                    }),
                    listed: false,
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
            Ok(None)
        }
    }
}

/// Refuses a file list that reads one shard twice (two spellings of one file, a Megatron `.idx`
/// and its prefix, a directory listing a file twice): every row would be delivered twice. A
/// source's weight is how it is read more often. `entries[k]` is the entry job `k` comes from.
fn refuse_repeats(jobs: &[Job], entries: &[usize], files: &[String], option: &str) -> Result<()> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(jobs.len());
    for (k, job) in jobs.iter().enumerate() {
        let Some(first) = seen.insert(&job.path, k) else {
            continue;
        };
        let (a, b) = (entries[first], entries[k]);
        let how = if a == b {
            format!("files[{a}] ({}) lists it twice", files[a])
        } else {
            format!(
                "files[{a}] ({}) and files[{b}] ({}) both name it",
                files[a], files[b]
            )
        };
        return Err(Error::config(
            option,
            format!(
                "{how}: the shard {} would be read twice; a source reads each shard once (give \
                 the source a larger weight to read it more often)",
                job.path
            ),
        ));
    }
    Ok(())
}

/// The documents of the manifests `config` reads, each once, by absolute location, in the order
/// of the sources that name them.
fn manifest_texts(config: &StreamConfig, storage: &Storage) -> Result<Vec<(String, String)>> {
    let mut texts: Vec<(String, String)> = Vec::new();
    for (s, stage) in config.stages.iter().enumerate() {
        for (j, source) in stage.sources.iter().enumerate() {
            let SourceSpec::Manifest { manifest_uri, .. } = source else {
                continue;
            };
            let uri = absolute(manifest_uri);
            if texts.iter().any(|(known, _)| *known == uri) {
                continue;
            }
            storage
                .check(&uri)
                .map_err(|e| renamed(e, &format!("stages[{s}].sources[{j}].manifest_uri")))?;
            let text = Manifest::read(&uri, storage)?;
            texts.push((uri, text));
        }
    }
    Ok(texts)
}

/// Names the config option at fault in a storage settings error.
fn renamed(error: Error, option: &str) -> Error {
    match error {
        Error::Config { message, .. } => Error::config(option, message),
        other => other,
    }
}

/// Local paths are made absolute so a resolved document does not depend on the working
/// directory, in the one spelling every layer compares ([`storage::normalize`]).
pub(crate) fn absolute(path: &str) -> String {
    storage::normalize(path)
}

/// What open knows from the config alone, before it touches any object.
struct Setup<'a> {
    /// The fields, as the document stores them (the inspection cache's projection key).
    fields: &'a [FieldSpec],
    /// Validated projection (all columns, synthetic ones included).
    projection: Projection,
    /// The working-set bound without decoders' scratch: a config whose buffers alone exceed
    /// its memory limit or 64 bits is refused here, so inspection never allocates a row that
    /// the bound would refuse.
    bound: MemoryBound,
    /// Decode threads.
    threads: usize,
}

impl<'a> Setup<'a> {
    fn new(fields: &'a [FieldSpec], shape: Result<PipelineShape>) -> Result<Self> {
        let projection = Projection::new(fields)?;
        let shape = shape?;
        let bound = MemoryBound::compute(&shape, &projection, ShardScratch::default())?;
        Ok(Setup {
            fields,
            projection,
            bound,
            threads: shape.threads as usize,
        })
    }
}

/// The longest record (JSON line, `MessagePack` frame) each inspection thread may hold, so that
/// inspecting hostile shards stays within the memory limit too: the bound's headroom shared by
/// the threads, and never more than `MAX_RECORD_BYTES`.
pub(crate) fn max_record(bound: &MemoryBound, threads: usize, shards: usize) -> u64 {
    let headroom = bound.limit - bound.total();
    (headroom / crate::parallel::threads_for(threads, shards) as u64)
        .saturating_sub(formats::READER_BUFFER_BYTES)
        .min(formats::MAX_RECORD_BYTES)
}

/// Threads that inspect a stream's shards: its decode threads, and for remote shards at least
/// 32, since inspecting them waits on round trips, not on the CPU.
pub(crate) fn inspection_concurrency(threads: usize, remote: bool) -> usize {
    const REMOTE_INSPECT_THREADS: usize = 32;
    if remote {
        threads.max(REMOTE_INSPECT_THREADS)
    } else {
        threads
    }
}

/// What the inspection cache keys a projection's scratch by: the fields, as the document
/// stores them.
pub(crate) fn projection_key(fields: &[FieldSpec]) -> String {
    let json = serde_json::to_vec(fields).expect("fields always serialise");
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    storage::hex(&digest.as_ref()[..16])
}

/// Settles every job: looks at a plain file list's shards (size and version) and takes their
/// counts from the cache where it knows them; inspects the rest of them, and one shard of every
/// source that none of these covers, so each source's projection is checked at open. A
/// manifest's or checkpoint's other shards are not touched.
fn settle(storage: &Storage, jobs: &[Job], setup: &Setup<'_>) -> Result<Settled> {
    let cache = InspectCache::from_env();
    let key = projection_key(setup.fields);
    let remote = jobs.iter().any(|j| storage::is_remote(&j.path));
    let threads = inspection_concurrency(setup.threads, remote);
    let (records, _) = setup.projection.record_columns();
    // Rows an overflow rule leaves out are found by reading the shard: every shard is looked
    // at, so that its kept rows are known before the order is planned over them.
    let drops = formats::drops_rows(&records);
    let is_listed = |job: &Job| job.listed || drops;
    let listed: Vec<usize> = (0..jobs.len()).filter(|&i| is_listed(&jobs[i])).collect();
    let probes = parallel(&listed, threads, |&i| {
        let job = &jobs[i];
        storage.cancel().check(&job.path)?;
        let object = storage.open(&job.path)?;
        let pin = object.pin();
        // A local file is pinned by its content, so that a copy of it resumes: its identity is
        // taken where the new document pins it (a shard looked at on open) or where a
        // checkpoint's holds one to compare.
        let compared = match &job.promise {
            Some(p) if p.origin == PromiseOrigin::Checkpoint => p
                .version
                .as_deref()
                .is_some_and(|v| v.starts_with(crate::storage::promise::CONTENT_PREFIX)),
            _ => true,
        };
        let content = if compared {
            let pinned = job.promise.as_ref().and_then(|p| p.version.as_deref());
            identity::of(&object, job.encoding, cache.as_ref(), pinned)?
        } else {
            None
        };
        if let Some(promise) = &job.promise {
            promise.check_pin(&job.path, job.encoding, &pin, || Ok(content.clone()))?;
        }
        // A token shard's rows are its windows, which the cache does not know.
        let cached = cache
            .as_ref()
            .filter(|_| job.layout.is_none() && !drops)
            .and_then(|c| c.lookup(&job.path, job.encoding, &pin, job.key(&key)));
        if let (Some(promise), Some(cached)) = (&job.promise, &cached) {
            promise.check_rows(&job.path, job.encoding, cached.rows)?;
        }
        Ok((pin, cached, content))
    });
    // Keyed by job: a manifest's or checkpoint's shards are not looked at, and a million of
    // them should not cost an entry each.
    let mut seen: HashMap<usize, Probe> = HashMap::with_capacity(listed.len());
    for (&i, probe) in listed.iter().zip(probes) {
        seen.insert(i, probe?);
    }
    let known_rows = |i: usize| match (seen.get(&i).map(|p| (&p.0, &p.1)), &jobs[i].promise) {
        // Every token shard is inspected: its windows and their plan are needed at open.
        _ if jobs[i].layout.is_some() || drops => None,
        (Some((_, Some(cached))), _) => Some(cached.rows),
        (_, Some(promise)) => Some(promise.rows),
        _ => None,
    };
    let mut inspect: Vec<usize> = (0..jobs.len())
        .filter(|&i| is_listed(&jobs[i]) && known_rows(i).is_none())
        .collect();
    let mut covered: std::collections::HashSet<(usize, usize)> = inspect
        .iter()
        .map(|&i| (jobs[i].stage, jobs[i].source))
        .collect();
    // A source's jobs are consecutive: once it is covered, the rest of them are skipped
    // without a lookup each.
    let mut done = None;
    for (i, job) in jobs.iter().enumerate() {
        let key = (job.stage, job.source);
        if done == Some(key) {
            continue;
        }
        if covered.contains(&key) {
            done = Some(key);
        } else if known_rows(i).is_some_and(|r| r > 0) {
            // The first shard with records checks the source's projection.
            covered.insert(key);
            inspect.push(i);
            done = Some(key);
        }
    }
    inspect.sort_unstable();
    // One shard of each source checks the projection against its first record; the others'
    // counts come from their footers or indexes, and their rows are checked as they are
    // decoded. Checking every shard cost each node that opens a cold cache a request or more
    // per shard for data only the rank that reads it needs.
    let mut checked = std::collections::HashSet::new();
    let checkers: std::collections::HashSet<usize> = inspect
        .iter()
        .copied()
        .filter(|&i| checked.insert((jobs[i].stage, jobs[i].source)))
        .collect();
    let max_record = max_record(&setup.bound, threads, inspect.len());
    let max_plan = setup.bound.limit - setup.bound.total();
    let inspected = parallel(&inspect, threads, |&i| {
        let job = &jobs[i];
        storage.cancel().check(&job.path)?;
        let meta = formats::inspect_shard(
            storage,
            &job.path,
            job.encoding,
            job.layout
                .as_deref()
                .map(|layout| formats::TokenInspection {
                    layout,
                    cache: cache.as_ref(),
                }),
            job.records(&records),
            (max_record, max_plan),
            formats::Checks {
                promise: job.promise.as_ref(),
                first_record: checkers.contains(&i),
                seen: seen.get(&i).map(|(pin, _, _)| pin),
                cache: cache.as_ref(),
            },
        )?;
        // Stored by the thread that inspected it: writing thousands of entries one after
        // another was most of a first open's time.
        if let (true, None, Some(cache), false) = (job.listed, &job.layout, &cache, drops) {
            let cached = Cached {
                rows: meta.rows,
                scratch_bytes: Some(meta.scratch_bytes),
            };
            cache.store(&job.path, job.encoding, &meta.pin, job.key(&key), cached);
        }
        Ok(meta)
    });
    let mut metas: HashMap<usize, Box<ShardMeta>> = HashMap::with_capacity(inspect.len());
    for (&i, meta) in inspect.iter().zip(inspected) {
        metas.insert(i, Box::new(meta?));
    }
    let mut looked: Vec<usize> = seen.keys().chain(metas.keys()).copied().collect();
    looked.sort_unstable();
    looked.dedup();
    let mut scratch = KnownScratch {
        largest: 0,
        // Only a shard looked at can have its scratch known.
        complete: looked.len() == jobs.len(),
    };
    let shards = looked
        .into_iter()
        .map(|i| {
            let job = &jobs[i];
            let meta = metas.remove(&i);
            let probe = seen.remove(&i);
            let cached = probe.as_ref().and_then(|(_, cached, _)| *cached);
            match meta
                .as_ref()
                .map(|m| m.scratch_bytes)
                .or(cached.and_then(|c| c.scratch_bytes))
            {
                Some(bytes) => scratch.largest = scratch.largest.max(bytes),
                None => scratch.complete = false,
            }
            let shard = SettledShard {
                rows: meta
                    .as_ref()
                    .map(|m| m.rows)
                    .or(cached.map(|c| c.rows))
                    .or(job.promise.as_ref().map(|p| p.rows))
                    .expect("every shard is inspected, cached or promised"),
                // Every listed shard was probed: pinned as the probe saw it, a local file
                // by its content.
                seen: probe
                    .filter(|_| is_listed(job))
                    .map(|(pin, _, content)| (content.or(pin.version), pin.size)),
                meta,
            };
            (i, shard)
        })
        .collect();
    Ok(Settled { shards, scratch })
}

/// The inspections of `settled`, by flat shard id.
fn inspections(settled: &mut Settled) -> Vec<(usize, Box<ShardMeta>)> {
    settled
        .shards
        .iter_mut()
        .filter_map(|(i, shard)| Some((*i, shard.meta.take()?)))
        .collect()
}

/// Resolves `config`: infers encodings, takes row counts from manifests, the inspection cache or
/// inspection, and checks one shard of every source against the projection.
pub fn resolve(config: &StreamConfig, storage: &Storage) -> Result<Resolved> {
    config.validate()?;
    let setup = Setup::new(&config.fields, config.pipeline_shape())?;
    let texts = manifest_texts(config, storage)?;
    let manifests = texts
        .iter()
        .map(|(uri, text)| Ok((uri.clone(), Manifest::from_json(text, uri)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    let mut jobs = Vec::new();
    let mut counts: Vec<Vec<(usize, Option<Vec<NamedFile>>)>> =
        Vec::with_capacity(config.stages.len());
    for (s, stage) in config.stages.iter().enumerate() {
        let mut stage_counts = Vec::with_capacity(stage.sources.len());
        let layout = stage.token_layout().map(Arc::new);
        for (j, source) in stage.sources.iter().enumerate() {
            let before = jobs.len();
            let (reading, layout) = Reading::of(&config.fields, source.columns(), layout.as_ref())?;
            let named = source_jobs(
                source,
                (s, j),
                (layout.as_ref(), reading.as_ref()),
                &manifests,
                &mut jobs,
                storage,
            )?;
            check_token_sources(source, (s, j), layout.is_some(), &mut jobs[before..])?;
            stage_counts.push((jobs.len() - before, named));
        }
        counts.push(stage_counts);
    }
    // The jobs own what they need: the documents go before the resolved shards are built.
    drop(manifests);
    drop(texts);
    let mut settled = settle(storage, &jobs, &setup)?;
    let inspected = inspections(&mut settled);
    let drops = formats::drops_rows(&setup.projection.record_columns().0);
    let mut learnt = settled.shards.into_iter().peekable();
    let mut stages = Vec::with_capacity(config.stages.len());
    let mut next = jobs.into_iter().enumerate();
    for (s, stage) in config.stages.iter().enumerate() {
        let mut sources = Vec::new();
        for (j, source) in stage.sources.iter().enumerate() {
            let (count, named) = std::mem::take(&mut counts[s][j]);
            let mut shards = Vec::with_capacity(count);
            let mut dropped = 0u64;
            for _ in 0..count {
                let (i, job) = next.next().expect("one job per shard");
                if let Some(Ok(k)) = drops.then(|| inspected.binary_search_by_key(&i, |(k, _)| *k))
                {
                    dropped += inspected[k].1.dropped.len();
                }
                debug_assert_eq!((job.stage, job.source), (s, j));
                let looked = learnt.next_if(|(k, _)| *k == i).map(|(_, shard)| shard);
                let (promised_rows, promised, sha256) =
                    job.promise.map_or((None, (None, None), None), |p| {
                        (Some(p.rows), (p.version, p.bytes), p.sha256)
                    });
                let (rows, seen) = match looked {
                    Some(shard) => (shard.rows, shard.seen),
                    None => (
                        promised_rows.expect("a shard open did not look at is promised"),
                        None,
                    ),
                };
                let (version, bytes) = seen.map_or(promised, |(version, size)| {
                    (version.map(Cow::Owned), Some(size))
                });
                shards.push(ResolvedShard {
                    path: job.path.into_owned(),
                    encoding: job.encoding,
                    rows,
                    version: version.map(Cow::into_owned),
                    bytes,
                    sha256: sha256.map(Cow::into_owned),
                });
            }
            let resolved = ResolvedSource {
                weight: source.weight(),
                shards,
                manifest: source.manifest_selection(),
                named,
                columns: source.columns().clone(),
            };
            if resolved.rows() == 0 {
                let message = if dropped > 0 {
                    format!(
                        "the source's shards hold no records a field's overflow 'drop' keeps: \
                         all {dropped} are longer than it allows"
                    )
                } else {
                    "the source's shards hold no records".to_owned()
                };
                return Err(Error::config(format!("stages[{s}].sources[{j}]"), message));
            }
            sources.push(resolved);
        }
        stages.push(stage.with_sources(sources));
    }
    let config = Arc::new(ResolvedConfig {
        version: RESOLVED_CONFIG_VERSION,
        fields: config.fields.clone(),
        stages,
        seed: config.seed,
        threads: config.threads,
        prefetch_batches: config.prefetch_batches,
        rank: config.rank,
        world_size: config.world_size,
        memory_limit_bytes: config.memory_limit_bytes,
        validation_pass: config.validation_pass,
        partitions: config.partitions,
        partition_layout: config.partition_layout(),
        skip_batches: config.skip_batches.clone(),
    });
    Ok(Resolved {
        config,
        projection: setup.projection,
        inspected,
        scratch: settled.scratch,
        resumed_from: None,
        storage: storage.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_keeps_the_items_order_and_turns_panics_into_errors() {
        let items: Vec<u64> = (0..200).collect();
        let results = parallel(&items, 4, |&i| {
            assert!(i != 77, "item 77");
            if i % 50 == 49 {
                return Err(Error::config("x", format!("item {i}")));
            }
            Ok(i * 2)
        });
        assert_eq!(results.len(), 200);
        for (i, result) in results.iter().enumerate() {
            match (i, result) {
                (77, Err(Error::Internal { message })) => assert!(message.contains("item 77")),
                (i, Err(Error::Config { message, .. })) if i % 50 == 49 => {
                    assert_eq!(message, &format!("item {i}"));
                }
                (i, Ok(v)) => assert_eq!(*v, i as u64 * 2),
                (i, other) => panic!("item {i}: {other:?}"),
            }
        }
        assert!(parallel(&[] as &[u8], 4, |_| Ok(())).is_empty());
    }

    #[test]
    fn remote_shards_are_inspected_with_more_threads_than_local_ones() {
        assert_eq!(inspection_concurrency(2, false), 2);
        assert_eq!(inspection_concurrency(2, true), 32);
        assert_eq!(inspection_concurrency(48, true), 48);
        assert_eq!(crate::parallel::threads_for(48, 3), 3);
        assert_eq!(crate::parallel::threads_for(200, 1000), 64);
    }
}
