//! Parquet shards, read and written: row counts from the footer, projected columns only,
//! row-group and page level seeking through a row selection. Every standard codec reads; a
//! codec this build lacks (LZO) is an unsupported feature, not a malformed shard.
//!
//! `inspect` reads and checks the footer, `fetch` plans and fetches a job's byte ranges (keeping
//! in `super::page_cache` the pages later jobs read again), `read` decodes row ranges (and whole
//! shards), `metered` counts a local file's reads, `lists` reads token lists, `write` writes.

mod direct;
mod fetch;
mod footer;
mod format;
mod guard;
mod inspect;
mod list_lengths;
mod lists;
mod metered;
mod read;
mod rle;
mod write;

#[cfg(test)]
mod direct_tests;
#[cfg(test)]
mod test_layout;
#[cfg(test)]
mod tests;

use crate::error::Error;

pub use fetch::Prefetched;
pub use footer::ParquetIndex;
pub use format::Parquet;
pub use inspect::inspect;
pub use inspect::inspect_footer;
pub(super) use lists::for_each_list;
pub(super) use lists::index_of;
pub(super) use lists::lengths_agree;
pub(super) use lists::list_lengths;
pub(super) use lists::projected_type;
pub(super) use lists::EachList;
pub(super) use lists::Ids;
pub use read::Batches;
pub use read::Reader;
pub use write::write;

/// Bytes fetched from the end of a remote shard at open: the footer and, for shards written by
/// the saver, the page index before it, in one request.
pub(super) const REMOTE_TAIL_BYTES: u64 = 256 << 10;

pub(super) const ENCODING: &str = "parquet";

/// Encoded bytes of the projected columns one decode batch holds at most. A job is decoded in
/// batches of about this size rather than all at once, so a decode thread's transient Arrow
/// arrays and level buffers stay a few MiB whatever the job's length (rows with a 1,500-token
/// list and its mask: about 300 rows a batch).
pub(super) const DECODE_BATCH_BYTES: u64 = 1 << 20;

/// Rows of one decode batch at most, however narrow the rows.
pub(super) const MAX_DECODE_BATCH_ROWS: u64 = 8192;

pub(super) fn format_error(path: &str, row: Option<u64>, e: impl std::fmt::Display) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: ENCODING,
        row,
        message: e.to_string(),
    }
}

/// A decoder's error (from the Parquet reader, or through Arrow, which keeps only its text): a
/// feature this build lacks is unsupported, anything else is a malformed shard.
pub(super) fn decode_error(path: &str, row: Option<u64>, e: impl std::fmt::Display) -> Error {
    let message = e.to_string();
    if message.contains("NYI") || message.contains("Disabled feature") {
        return Error::Unsupported {
            path: path.to_owned(),
            encoding: ENCODING,
            message,
        };
    }
    format_error(path, row, message)
}
