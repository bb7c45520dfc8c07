//! The numeric limits every layer shares, at the bottom so that the config that validates against
//! them and the order function that relies on them both depend on this module, not on each other.

/// No position or counter reaches this many rows or batches: no stream delivers 2^62 rows, and
/// staying below keeps every position computation within 64 bits. A checkpoint beyond it is
/// refused rather than wrapped into another part of the sequence.
pub const MAX_POSITION: u64 = 1 << 62;
