//! The stream's working-set bound, computed at open from the declared shapes and the pipeline's
//! sizes, and checked against `memory_limit_bytes` (default: half the host's physical memory).

use std::fmt;

use crate::config::ResolvedConfig;
use crate::error::{Error, Result};
use crate::fields::Projection;

/// Buffered bytes an open shard reader may hold (read buffers, decompressor state).
const READER_BYTES: u64 = 3 << 20;
/// Open readers per decode worker.
const READERS_PER_WORKER: u64 = 4;

/// The pipeline's sizes that the bound depends on, besides the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSizes {
    /// Rows planned together (at least one shuffle window, whole batches).
    pub group_rows: u64,
    /// Read jobs in flight at most.
    pub max_jobs: usize,
    /// Decoded rows that the jobs in flight hold together, at most.
    pub job_rows: usize,
    /// The most working memory one job's decoder needs on any of the stream's shards.
    pub largest_scratch: u64,
    /// Whether some shard is remote: remote jobs fetch their bytes from dispatch on, so every
    /// job in flight may hold them, not only the ones being decoded.
    pub prefetching: bool,
}

/// The terms of the bound, each in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBound {
    /// Batches queued for the consumer, the one it holds, and two planned groups being filled
    /// (each at least one shuffle window of rows).
    pub batches: u64,
    /// Decoded rows of read jobs in flight.
    pub decode_units: u64,
    /// Open shard readers' buffers.
    pub readers: u64,
    /// Decoders' working memory: per decode thread, the largest any shard needs for one job.
    pub decode_scratch: u64,
    /// The limit it was checked against.
    pub limit: u64,
}

impl MemoryBound {
    /// Sum of the terms.
    pub fn total(&self) -> u64 {
        self.batches + self.decode_units + self.readers + self.decode_scratch
    }

    /// Computes the bound and refuses a config that exceeds its limit.
    pub fn compute(
        config: &ResolvedConfig,
        projection: &Projection,
        sizes: PipelineSizes,
    ) -> Result<Self> {
        let PipelineSizes {
            group_rows,
            max_jobs,
            job_rows,
            largest_scratch,
            prefetching,
        } = sizes;
        let scratch_holders = if prefetching {
            max_jobs as u64
        } else {
            config.threads as u64
        };
        let row_bytes = projection.row_bytes() as u64;
        let batch_rows = config
            .stages
            .iter()
            .map(|s| s.batch_size as u64)
            .max()
            .unwrap_or(0);
        let bound = MemoryBound {
            batches: ((config.prefetch_batches as u64 + 1) * batch_rows + 2 * group_rows)
                * row_bytes,
            decode_units: job_rows as u64 * row_bytes,
            readers: config.threads as u64 * READERS_PER_WORKER * READER_BYTES,
            decode_scratch: scratch_holders * largest_scratch,
            limit: config.memory_limit_bytes.unwrap_or_else(default_limit),
        };
        if bound.total() > bound.limit {
            return Err(Error::config("memory_limit_bytes", format!("the stream's working set is bounded at {bound}, above the limit of {} bytes; lower batch_size, prefetch_batches, threads or the field shapes, or raise memory_limit_bytes", bound.limit)));
        }
        Ok(bound)
    }
}

impl fmt::Display for MemoryBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes (batches {}, decode units {}, shard readers {}, decode scratch {})",
            self.total(),
            self.batches,
            self.decode_units,
            self.readers,
            self.decode_scratch
        )
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
    Some(kib * 1024)
}
