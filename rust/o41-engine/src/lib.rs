//! The o41-training-data engine: shard formats, projection to fixed-shape columns, the order of
//! rows and batches, and the threaded pipeline that produces them. Pure Rust; the Python binding
//! lives in the `o41-python` crate.

pub mod cancel;
pub mod checkpoint;
pub mod columns;
pub mod config;
pub mod dtype;
pub mod encoding;
pub mod error;
pub mod fields;
pub mod fnv;
pub mod formats;
pub mod from_arrow;
pub mod inspect_cache;
pub mod labels;
pub mod limits;
pub mod manifest;
pub mod memory;
pub mod metrics;
pub mod order;
pub mod parallel;
pub mod pipeline;
pub mod plan;
pub mod pool;
pub mod record;
pub mod resolve;
pub mod shards;
pub mod shared_slots;
pub mod skips;
pub mod storage;
pub mod stream;
pub mod trace;

pub use config::{ResolvedConfig, StreamConfig};
pub use error::{Error, Result};
pub use stream::{Batch, BatchStream, Expect, Next, Share, SourceStats, StreamStats};
