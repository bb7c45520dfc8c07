//! The stream's working-set bound, computed from the declared shapes and the pipeline's sizes,
//! and checked against `memory_limit_bytes` (default: half the host's physical memory).
//!
//! It is checked twice: before any shard is touched, from the config alone (so a config whose
//! buffers could not be allocated is refused before inspection allocates its first row), and
//! at open with what inspection learnt about the shards (decoders' scratch). All arithmetic is
//! checked: a size that does not fit 64 bits is refused, never wrapped.

use std::fmt;

use crate::config::ShuffleSpec;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::order::partition_window_rows;

/// Buffered bytes an open shard reader may hold (read buffers, decompressor state).
const READER_BYTES: u64 = 3 << 20;
/// Open readers per decode worker.
pub const READERS_PER_WORKER: u64 = 4;
/// Remote pages kept for later jobs ([`crate::formats::PageCache`]), per read job in flight:
/// room for a dictionary page and the page a job ended in, of a few columns.
const PAGE_CACHE_BYTES_PER_JOB: u64 = 2 << 20;
/// Most unique rows one read job decodes.
pub const MAX_JOB_ROWS: u64 = 1024;
/// Rows planned together at least (a group reads each shard range once), for narrow rows.
const MIN_GROUP_ROWS: u64 = 4096;
/// Bytes of rows planned together at least, for rows too wide for `MIN_GROUP_ROWS` of them to
/// stay small: two groups' batches are held at once, so 4,096 wide rows hold hundreds of MiB
/// (token windows of 24 KiB a row: 200 MiB) for no more speed. Much smaller groups cost
/// Parquet reads, whose jobs shrink with them; 16 MiB kept the order benchmark's rows/s
/// (`benchmarks/RESULTS.md`, order) while its peak RSS fell under the bound.
const MIN_GROUP_BYTES: u64 = 16 << 20;

/// What a stream's pipeline looks like, from the config alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineShape {
    /// Rows planned together: at least one shuffle window (with partitions, the windows a
    /// rank reads of one round of them), and 4,096 rows or 16 MiB of rows (whichever is fewer
    /// rows), in whole batches.
    pub group_rows: u64,
    /// Rows of the largest batch.
    pub largest_batch: u64,
    /// Read jobs in flight at most.
    pub max_jobs: u64,
    /// Decode threads.
    pub threads: u64,
    /// Batches queued for the consumer.
    pub prefetch_batches: u64,
    /// The limit the bound is checked against.
    pub limit: u64,
}

fn too_large() -> Error {
    Error::config(
        "memory_limit_bytes",
        "the stream's working set does not fit in 64 bits; lower batch_size, prefetch_batches, \
         threads, the shuffle window or the field shapes",
    )
}

impl PipelineShape {
    /// The shape for stages of `(batch_size, shuffle)` dealt to `partitions` by `layout`, read by
    /// `world_size` ranks, rows of `row_bytes`, `threads` decode threads, `prefetch_batches`
    /// and `memory_limit_bytes`.
    pub fn new(
        stages: impl IntoIterator<Item = (usize, Option<ShuffleSpec>)>,
        (partitions, layout, world_size): (u64, u32, u64),
        row_bytes: u64,
        threads: usize,
        prefetch_batches: usize,
        memory_limit_bytes: Option<u64>,
    ) -> Result<Self> {
        let mut largest_window = 0u64;
        let mut largest_batch = 1u64;
        // A rank reads its share of a round of windows at once: each of its partitions' windows
        // whole, so that no window is read twice.
        let windows_read = partitions.div_ceil(world_size.max(1)).max(1);
        for (s, (batch_size, shuffle)) in stages.into_iter().enumerate() {
            let (window, _) =
                partition_window_rows(shuffle, s, batch_size as u64, (partitions, layout))?;
            let read = window.checked_mul(windows_read).ok_or_else(too_large)?;
            largest_window = largest_window.max(read);
            largest_batch = largest_batch.max(batch_size as u64);
        }
        let group_rows = largest_window
            .max(group_floor(row_bytes))
            .div_ceil(largest_batch)
            .checked_mul(largest_batch)
            .ok_or_else(too_large)?;
        Ok(PipelineShape {
            group_rows,
            largest_batch,
            max_jobs: (threads as u64).checked_mul(2).ok_or_else(too_large)?,
            threads: threads as u64,
            prefetch_batches: prefetch_batches as u64,
            limit: memory_limit_bytes.unwrap_or_else(default_limit),
        })
    }

    /// The budget of the page cache a stream with Parquet shards keeps, for record rows of
    /// `record_row_bytes` decoded: 2 MiB per job in flight, or a planned group's rows if more.
    /// A shuffled group touches every row group of its windows and ends inside them, and where
    /// a shard has no page index the next group's jobs read those row groups' column chunks
    /// whole again: a group's rows decoded hold about as much as their chunks compressed.
    pub fn page_cache_bytes(&self, record_row_bytes: u64) -> Result<u64> {
        Ok(product(&[self.max_jobs, PAGE_CACHE_BYTES_PER_JOB])?
            .max(product(&[self.group_rows, record_row_bytes])?))
    }
}

/// The fewest rows a group plans, for rows of `row_bytes`.
fn group_floor(row_bytes: u64) -> u64 {
    match row_bytes {
        0 => MIN_GROUP_ROWS,
        b => (MIN_GROUP_BYTES / b).clamp(1, MIN_GROUP_ROWS),
    }
}

/// Bytes of one row of `fields` as declared (synthetic columns included; a validation pass's
/// mask is not counted, which only sizes groups).
pub fn declared_row_bytes(fields: &[crate::config::FieldSpec]) -> Result<u64> {
    Ok(Projection::new(fields)?.row_bytes() as u64)
}

/// `pipeline_shape` for a config and for a resolved document, which name these options alike.
macro_rules! pipeline_shape {
    ($($config:ty => $doc:literal),*) => {$(
        impl $config {
            #[doc = $doc]
            pub fn pipeline_shape(&self) -> Result<PipelineShape> {
                let stages = self.stages.iter().map(|s| (s.batch_size, s.shuffle));
                PipelineShape::new(
                    stages,
                    (self.partitions, self.partition_layout(), self.world_size as u64),
                    declared_row_bytes(&self.fields)?,
                    self.threads,
                    self.prefetch_batches,
                    self.memory_limit_bytes,
                )
            }
        }
    )*};
}

pipeline_shape!(
    crate::config::StreamConfig => "The pipeline this config runs.",
    crate::config::ResolvedConfig => "The pipeline this document runs."
);

/// What inspection learnt about the shards that the bound depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardScratch {
    /// The most working memory one job's decoder needs on any of the stream's shards.
    pub largest: u64,
    /// Whether some shard is remote: remote jobs fetch their bytes from dispatch on, so every
    /// job in flight may hold them, not only the ones being decoded.
    pub prefetching: bool,
    /// Whether some shard is Parquet or MDS, whose reads keep pages for later jobs
    /// ([`PipelineShape::page_cache_bytes`]).
    pub pages: bool,
    /// Bytes the token shards' indexes hold (packing plans, record offsets) for the stream's
    /// life.
    pub token_plans: u64,
}

/// The terms of the bound, each in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBound {
    /// Batches queued for the consumer, the one it holds, and two planned groups being filled
    /// (each at least one shuffle window of rows).
    pub batches: u64,
    /// Decoded rows of read jobs in flight: only their record columns, since synthetic and
    /// token-window columns are written straight into batches.
    pub decode_units: u64,
    /// Open shard readers' buffers, and the Parquet pages kept for later jobs when some shard
    /// is Parquet or MDS ([`PipelineShape::page_cache_bytes`]).
    pub readers: u64,
    /// Decoders' working memory: per decode thread, the largest any shard needs for one job.
    pub decode_scratch: u64,
    /// Token shards' packing plans and record offsets, held while the stream runs.
    pub token_plans: u64,
    /// The limit it was checked against.
    pub limit: u64,
}

/// `a * b + ...` in checked arithmetic.
fn product(factors: &[u64]) -> Result<u64> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or_else(too_large)
}

impl MemoryBound {
    /// Sum of the terms (checked to fit when the bound was computed).
    pub fn total(&self) -> u64 {
        self.batches + self.decode_units + self.readers + self.decode_scratch + self.token_plans
    }

    /// Computes the bound and refuses a config that exceeds its limit or 64 bits.
    pub fn compute(
        shape: &PipelineShape,
        projection: &Projection,
        scratch: ShardScratch,
    ) -> Result<Self> {
        let row_bytes = projection.row_bytes() as u64;
        // What a read job's chunk holds (`Plan::records`).
        let decoded_bytes = projection.record_columns().0.row_bytes() as u64;
        let held_batches = shape
            .prefetch_batches
            .checked_add(1)
            .ok_or_else(too_large)?;
        let batch_rows = product(&[held_batches, shape.largest_batch])?
            .checked_add(product(&[2, shape.group_rows])?)
            .ok_or_else(too_large)?;
        let scratch_holders = if scratch.prefetching {
            shape.max_jobs
        } else {
            shape.threads
        };
        let pages = if scratch.pages {
            shape.page_cache_bytes(decoded_bytes)?
        } else {
            0
        };
        let bound = MemoryBound {
            batches: product(&[batch_rows, row_bytes])?,
            decode_units: product(&[shape.max_jobs, MAX_JOB_ROWS, decoded_bytes])?,
            readers: product(&[shape.threads, READERS_PER_WORKER, READER_BYTES])?
                .checked_add(pages)
                .ok_or_else(too_large)?,
            decode_scratch: product(&[scratch_holders, scratch.largest])?,
            token_plans: scratch.token_plans,
            limit: shape.limit,
        };
        let total = [
            bound.decode_units,
            bound.readers,
            bound.decode_scratch,
            bound.token_plans,
        ]
        .iter()
        .try_fold(bound.batches, |acc, &t| acc.checked_add(t))
        .ok_or_else(too_large)?;
        if total > bound.limit {
            return Err(Error::config("memory_limit_bytes", format!("the stream's working set is bounded at {bound}, above the limit of {} bytes; lower batch_size, prefetch_batches, threads or the field shapes, or raise memory_limit_bytes", bound.limit)));
        }
        Ok(bound)
    }
}

impl fmt::Display for MemoryBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes (batches {}, decode units {}, shard readers {}, decode scratch {}",
            self.total(),
            self.batches,
            self.decode_units,
            self.readers,
            self.decode_scratch
        )?;
        if self.token_plans > 0 {
            write!(f, ", token plans {}", self.token_plans)?;
        }
        write!(f, ")")
    }
}

/// Half the host's physical memory; unbounded where it cannot be read.
fn default_limit() -> u64 {
    host_memory_bytes().map_or(u64::MAX, |b| b / 2)
}

/// Physical memory from `/proc/meminfo` (Linux).
pub fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group_rows(batch: usize, row_bytes: u64) -> u64 {
        PipelineShape::new([(batch, None)], (1, 1, 1), row_bytes, 2, 4, Some(u64::MAX))
            .unwrap()
            .group_rows
    }

    #[test]
    fn the_page_cache_holds_a_planned_group_of_record_rows_or_2_mib_per_job() {
        let shape =
            PipelineShape::new([(32, None)], (1, 1, 1), 10_240, 2, 4, Some(u64::MAX)).unwrap();
        // 16 MiB of 10 KiB rows, in whole batches: 1,664 rows.
        assert_eq!(shape.group_rows, 1664);
        assert_eq!(shape.page_cache_bytes(10_240).unwrap(), 1664 * 10_240);
        // Narrow record columns: two jobs per decode thread, 2 MiB each.
        assert_eq!(shape.page_cache_bytes(16).unwrap(), 4 * (2 << 20));
    }

    #[test]
    fn narrow_rows_are_planned_4096_at_a_time() {
        assert_eq!(group_rows(32, 32), 4096);
        assert_eq!(group_rows(1000, 32), 5000);
        assert_eq!(group_rows(32, 0), 4096);
    }

    #[test]
    fn wide_rows_are_planned_16_mib_at_a_time_in_whole_batches() {
        // Three i32 columns of 2,048 tokens: 24 KiB a row, 682 rows in 16 MiB, 22 batches of 32.
        assert_eq!(group_rows(32, 3 * 2048 * 4), 704);
        // A row wider than 16 MiB still plans a whole batch.
        assert_eq!(group_rows(2, 32 << 20), 2);
    }
}
