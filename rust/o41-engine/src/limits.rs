//! The numeric limits every layer shares, at the bottom so that the config that validates against
//! them and the order function that relies on them both depend on this module, not on each other.
//! The Python face reads them from here (`_core.limits()`) rather than keeping copies.

/// No position or counter reaches this many rows or batches: no stream delivers 2^62 rows, and
/// staying below keeps every position computation within 64 bits. A checkpoint beyond it is
/// refused rather than wrapped into another part of the sequence.
pub const MAX_POSITION: u64 = 1 << 62;

/// Most ranks a stream may be split over: positions and rank arithmetic stay within 64 bits, and
/// no tool that writes one file per rank is asked for more than this.
pub const MAX_WORLD_SIZE: u64 = 1 << 32;

/// Most decode threads a stream may start.
pub const MAX_THREADS: u64 = 4096;

/// Most windows a packing keeps open: first-fit looks at each of them for every document.
pub const MAX_BINS: u64 = 4096;

/// Longest window: a piece's length is stored in 32 bits.
pub const MAX_SEQ_LEN: u64 = 1 << 30;

/// Ramp steps a stage may have at most: the order tabulates one entry per step.
pub const MAX_RAMP_STEPS: u64 = 65_536;

/// Deepest nesting of a record's values (lists in lists, objects in objects) the engine writes
/// or reads from a schema: arrow-rs builds readers, writers and types by recursion over it.
pub const MAX_NESTING: u64 = 64;

/// Most failed attempts in a row a retry policy may allow: the engine counts them in 32 bits.
pub const MAX_RETRY_FAILURES: u64 = u32::MAX as u64;

/// Longest duration, in seconds, a retry policy may set (a timeout or a backoff): far below
/// what a `Duration` holds, and past any wait a run would choose.
pub const MAX_RETRY_SECONDS: u64 = 1_000_000_000;

/// Every limit by the name the Python face and the docs use.
pub const ALL: [(&str, u64); 9] = [
    ("max_position", MAX_POSITION),
    ("max_world_size", MAX_WORLD_SIZE),
    ("max_threads", MAX_THREADS),
    ("max_bins", MAX_BINS),
    ("max_seq_len", MAX_SEQ_LEN),
    ("max_ramp_steps", MAX_RAMP_STEPS),
    ("max_nesting", MAX_NESTING),
    ("max_retry_failures", MAX_RETRY_FAILURES),
    ("max_retry_seconds", MAX_RETRY_SECONDS),
];
