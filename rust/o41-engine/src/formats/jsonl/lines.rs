//! Lines of JSON Lines text: where they end, whether they hold a record, and the error for one
//! longer than a reader may hold. Shared by the plain and gzip readers.

use crate::encoding::Encoding;
use crate::error::Error;

/// Whether `line` holds no record (whitespace only).
pub fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// A line longer than the `max_line` bytes a reader holds, at record `row`.
pub fn too_long(path: &str, encoding: Encoding, row: u64, max_line: u64) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: encoding.name(),
        row: Some(row),
        message: format!(
            "a line is longer than {max_line} bytes, the most this stream holds for one record \
             (the longest line at open, or the memory limit's share); a shard that changed \
             since open, or raise memory_limit_bytes"
        ),
    }
}

/// Bytes per block `first_newline` and `for_each_newline` test at once: lines of a tokenised
/// corpus are kilobytes long, so most blocks hold none and are passed over in a few
/// vectorised instructions.
const NEWLINE_BLOCK: usize = 32;

fn has_newline(block: &[u8]) -> bool {
    // No short-circuit on purpose: the whole block is compared at once.
    block.iter().fold(0u8, |any, &b| any | u8::from(b == b'\n')) != 0
}

/// The offset of the first `\n` in `buf`.
pub fn first_newline(buf: &[u8]) -> Option<usize> {
    let mut blocks = buf.chunks_exact(NEWLINE_BLOCK);
    let mut base = 0;
    for block in &mut blocks {
        if has_newline(block) {
            return block.iter().position(|&b| b == b'\n').map(|i| base + i);
        }
        base += NEWLINE_BLOCK;
    }
    blocks
        .remainder()
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| base + i)
}

/// Calls `f` with the offset of every `\n` in `text`, in order.
pub fn for_each_newline(text: &[u8], mut f: impl FnMut(usize)) {
    let mut blocks = text.chunks_exact(NEWLINE_BLOCK);
    let mut base = 0;
    for block in &mut blocks {
        if has_newline(block) {
            for (i, &b) in block.iter().enumerate() {
                if b == b'\n' {
                    f(base + i);
                }
            }
        }
        base += NEWLINE_BLOCK;
    }
    for (i, &b) in blocks.remainder().iter().enumerate() {
        if b == b'\n' {
            f(base + i);
        }
    }
}
