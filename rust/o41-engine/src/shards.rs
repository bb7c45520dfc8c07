//! The stream's shards by flat id: where each is, what the stream was promised about it, what
//! its source read, and its inspection once made. The planner asks for a shard's index here;
//! the inspection a first read needs (I/O) happens here, not in the planner.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use crate::config::{renamed_fields, renamed_layout, ResolvedConfig, ResolvedShard, TokenLayout};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::{self, Promise, PromiseOrigin, ShardMeta};
use crate::metrics::Meter;
use crate::storage::{self, Storage};

/// The shards of one source: flat shard ids `first..` up to the next source's `first`. What a
/// shard is (location, encoding, promise) stays in the resolved document alone, so a
/// million-shard stream holds each location once.
struct SourceShards {
    /// Stage and source index in the resolved document.
    stage: usize,
    source: usize,
    /// Flat id of the source's first shard.
    first: usize,
    /// Who promised the shards' row counts (and sizes or versions).
    origin: PromiseOrigin,
    /// How the source's stage reads tokens: its shards' rows are then windows. Its token
    /// field is named as the source's shards name it.
    layout: Option<Arc<TokenLayout>>,
    /// The record columns of a source with a column mapping, renamed; `None`: the stream's.
    records: Option<Arc<Projection>>,
}

/// One shard of the stream, by flat id: where it is, what the stream was promised about it,
/// and, once something read it, its inspection.
#[derive(Clone, Copy)]
pub struct ShardEntry<'a> {
    /// The shard in the resolved document.
    resolved: &'a ResolvedShard,
    /// Its source.
    source: &'a SourceShards,
    /// What its source read.
    meter: &'a Arc<Meter>,
    /// Its inspection, once made.
    meta: &'a OnceLock<Box<ShardMeta>>,
}

impl<'a> ShardEntry<'a> {
    /// Location.
    pub fn path(&self) -> &'a str {
        &self.resolved.path
    }

    /// Encoding.
    pub fn encoding(&self) -> Encoding {
        self.resolved.encoding
    }

    /// The inspection, if the shard has been inspected.
    pub fn inspected(&self) -> Option<&'a ShardMeta> {
        self.meta.get().map(AsRef::as_ref)
    }

    /// What the shard's source read.
    pub fn meter(&self) -> &'a Meter {
        self.meter
    }

    /// Rows (and size or version, where known) the shard is held to when first inspected. A
    /// listed shard open did not look at (no version pinned) was promised by its dataset's
    /// index (an MDS `index.json`), and is held to it as such.
    fn promise(&self) -> Promise<'a> {
        let origin = match self.source.origin {
            PromiseOrigin::Listing if self.resolved.version.is_none() => PromiseOrigin::Index,
            origin => origin,
        };
        self.resolved.promise(origin)
    }
}

/// What a shard inspected at its first read is held to: the columns read from records, the
/// decode scratch the stream reserved per read, and the bytes of plan its memory limit leaves.
#[derive(Debug, Clone, Default)]
pub struct InspectionLimits {
    /// The columns read from records.
    pub records: Projection,
    /// Decode scratch one read job may use: a shard that needs more fails closed.
    pub scratch_reserved: u64,
    /// Bytes a token shard's window plan may hold.
    pub plan_room: u64,
}

/// Every shard of a stream, by flat id in stage, source and shard order.
pub struct Shards {
    resolved: Arc<ResolvedConfig>,
    /// Every source, in stage then source order, with the flat ids of its shards.
    sources: Vec<SourceShards>,
    /// Index into `sources` of each stage's first source.
    stage_sources: Vec<usize>,
    /// Every shard's inspection once made, by flat id (boxed: most of a million-shard corpus
    /// is never inspected by one rank).
    inspections: Vec<OnceLock<Box<ShardMeta>>>,
    /// What each source read, in stage then source order (as `sources`). Kept for the
    /// stream's life, across advances.
    pub meters: Vec<Arc<Meter>>,
    limits: InspectionLimits,
}

impl Shards {
    /// The shards of `config`, with the inspections open made. A resumed stream holds its
    /// shards to the checkpoint's promises; an opened one to its manifests' or its listing's.
    pub fn new(
        config: Arc<ResolvedConfig>,
        resumed: bool,
        inspected: Vec<(usize, Box<ShardMeta>)>,
    ) -> Result<Self> {
        let mut sources = Vec::new();
        let mut stage_sources = Vec::with_capacity(config.stages.len());
        let mut count = 0;
        for (s, stage) in config.stages.iter().enumerate() {
            stage_sources.push(sources.len());
            let layout = stage.token_layout().map(Arc::new);
            for (j, source) in stage.sources.iter().enumerate() {
                let origin = match (resumed, &source.manifest) {
                    (true, _) => PromiseOrigin::Checkpoint,
                    // A token shard's rows are the windows open counted, not the manifest's.
                    (false, Some(_)) if layout.is_none() => PromiseOrigin::Manifest,
                    (false, _) => PromiseOrigin::Listing,
                };
                let (records, layout) = if source.columns.is_empty() {
                    (None, layout.clone())
                } else {
                    let fields = renamed_fields(&config.fields, &source.columns);
                    let records = Projection::new(&fields)?.record_columns().0;
                    let layout = layout
                        .as_deref()
                        .map(|l| Arc::new(renamed_layout(l, &source.columns)));
                    (Some(Arc::new(records)), layout)
                };
                sources.push(SourceShards {
                    stage: s,
                    source: j,
                    first: count,
                    origin,
                    layout,
                    records,
                });
                count += source.shards.len();
            }
        }
        let mut inspections: Vec<OnceLock<Box<ShardMeta>>> =
            (0..count).map(|_| OnceLock::new()).collect();
        for (id, meta) in inspected {
            inspections[id] = OnceLock::from(meta);
        }
        Ok(Shards {
            meters: sources.iter().map(|_| Arc::new(Meter::default())).collect(),
            resolved: config,
            sources,
            stage_sources,
            inspections,
            limits: InspectionLimits::default(),
        })
    }

    /// The record columns shard `id` is read with: its source's, where the source maps them,
    /// else `fields` (the stream's).
    pub fn records<'s>(&'s self, id: usize, fields: &'s Projection) -> &'s Projection {
        self.entry(id).source.records.as_deref().unwrap_or(fields)
    }

    /// Sets what shards inspected at their first read are held to (known once the stream's
    /// memory bound is).
    pub fn hold_to(&mut self, limits: InspectionLimits) {
        self.limits = limits;
    }

    /// Every shard's entry in the resolved document, in flat id order.
    fn resolved_shards(&self) -> impl Iterator<Item = &ResolvedShard> {
        self.resolved
            .stages
            .iter()
            .flat_map(|stage| stage.sources.iter().flat_map(|source| &source.shards))
    }

    /// The encodings of the shards, in first-seen order.
    pub fn encodings(&self) -> Vec<Encoding> {
        let mut encodings = Vec::new();
        for shard in self.resolved_shards() {
            if !encodings.contains(&shard.encoding) {
                encodings.push(shard.encoding);
            }
        }
        encodings
    }

    /// Whether any shard is read from object storage.
    pub fn any_remote(&self) -> bool {
        self.resolved_shards()
            .any(|shard| storage::is_remote(&shard.path))
    }

    /// The number of shards.
    pub fn len(&self) -> usize {
        self.inspections.len()
    }

    /// Whether the stream has no shard.
    pub fn is_empty(&self) -> bool {
        self.inspections.is_empty()
    }

    /// Shard `id` (a flat id).
    pub fn entry(&self, id: usize) -> ShardEntry<'_> {
        let k = self.sources.partition_point(|s| s.first <= id) - 1;
        let source = &self.sources[k];
        ShardEntry {
            resolved: &self.resolved.stages[source.stage].sources[source.source].shards
                [id - source.first],
            source,
            meter: &self.meters[k],
            meta: &self.inspections[id],
        }
    }

    /// The flat index of source `source` of stage `stage`, over every stage's sources in order
    /// (the index of its [`Meter`] and of its delivery counters).
    pub fn source_index(&self, stage: usize, source: usize) -> usize {
        self.stage_sources[stage] + source
    }

    /// Rows the shards leave out for a field's overflow rule `drop` (streams with such a field
    /// inspect every shard at open): per source, in stage then source order, and, by flat shard
    /// id, those of the same source's earlier shards (empty when no shard leaves a row out).
    pub fn dropped_rows(&self) -> (Vec<u64>, Vec<u64>) {
        let mut counts = vec![0; self.sources.len()];
        let mut before = Vec::new();
        for (j, source) in self.sources.iter().enumerate() {
            let shards = self.resolved.stages[source.stage].sources[source.source]
                .shards
                .len();
            for id in source.first..source.first + shards {
                let dropped = self.inspected(id).map_or(0, |meta| meta.dropped.len());
                if dropped > 0 && before.is_empty() {
                    before = vec![0; self.inspections.len()];
                }
                if let Some(slot) = before.get_mut(id) {
                    *slot = counts[j];
                }
                // Documents packing left out are records left out too, though no row of
                // windows is: they count here and not in `before`.
                let documents = self
                    .inspected(id)
                    .and_then(ShardMeta::tokens)
                    .map_or(0, crate::formats::TokenIndex::dropped_documents);
                counts[j] += dropped + documents;
            }
        }
        (counts, before)
    }

    /// The flat id of shard `shard` of source `source` of stage `stage`.
    pub fn id(&self, stage: usize, source: usize, shard: usize) -> usize {
        self.sources[self.stage_sources[stage] + source].first + shard
    }

    /// The flat ids of stage `stage`'s shards.
    pub fn stage_shards(&self, stage: usize) -> Range<usize> {
        let end = self
            .stage_sources
            .get(stage + 1)
            .map_or(self.inspections.len(), |&next| self.sources[next].first);
        self.id(stage, 0, 0)..end
    }

    /// Shard `id`'s inspection, if it has been inspected.
    pub fn inspected(&self, id: usize) -> Option<&ShardMeta> {
        self.inspections[id].get().map(AsRef::as_ref)
    }

    /// `storage`, counting into the meter of shard `shard`'s source.
    pub fn metered(&self, storage: &Storage, shard: usize) -> Storage {
        storage.with_meter(self.entry(shard).meter.clone())
    }

    /// Shard `shard`'s inspection, made now if no read needed it before. The shard is held to
    /// its promise and to the stream's scratch reservation; a failure is not remembered, so a
    /// later read (after `advance`, say) tries again.
    pub fn meta(&self, storage: &Storage, shard: usize) -> Result<&ShardMeta> {
        let entry = self.entry(shard);
        if let Some(meta) = entry.inspected() {
            return Ok(meta);
        }
        let limits = &self.limits;
        // A shard first read now may find more than its count there (a gzip access index).
        let cache = crate::inspect_cache::InspectCache::from_env();
        let meta = formats::inspect_shard(
            &self.metered(storage, shard),
            entry.path(),
            entry.encoding(),
            entry
                .source
                .layout
                .as_deref()
                .map(|layout| formats::TokenInspection {
                    layout,
                    cache: None,
                }),
            entry.source.records.as_deref().unwrap_or(&limits.records),
            (
                limits.scratch_reserved.min(formats::MAX_RECORD_BYTES),
                limits.plan_room,
            ),
            formats::Checks {
                promise: Some(&entry.promise()),
                first_record: false,
                seen: None,
                cache: cache.as_ref(),
            },
        )?;
        if meta.scratch_bytes > limits.scratch_reserved {
            return Err(Error::config(
                "memory_limit_bytes",
                format!(
                    "{} needs {} bytes of decode scratch per read, more than the {} the stream \
                     reserved at open from the shards it inspected then (its row groups or \
                     records are much larger than theirs); raise memory_limit_bytes, or rewrite \
                     the shard with smaller row groups",
                    entry.path(),
                    meta.scratch_bytes,
                    limits.scratch_reserved
                ),
            ));
        }
        Ok(entry.meta.get_or_init(|| Box::new(meta)).as_ref())
    }

    /// Inspects, in parallel (up to what `threads` allows), those of `shards` not inspected yet,
    /// so a group's first reads find their shards' indexes ready. Failures are left for the
    /// read that needs the shard, which reports them at its batch.
    pub fn inspect_all(&self, storage: &Storage, shards: &[usize], threads: usize) {
        let mut todo: Vec<usize> = shards
            .iter()
            .copied()
            .filter(|&k| self.inspected(k).is_none())
            .collect();
        todo.sort_unstable();
        todo.dedup();
        if todo.len() == 1 {
            let _ = self.meta(storage, todo[0]);
        } else if !todo.is_empty() {
            let remote = todo
                .iter()
                .any(|&k| storage::is_remote(self.entry(k).path()));
            let threads = crate::resolve::inspection_concurrency(threads, remote);
            let _ =
                crate::parallel::parallel(&todo, threads, |&k| self.meta(storage, k).map(|_| ()));
        }
    }
}
