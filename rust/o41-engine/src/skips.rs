//! Skipped global batches (`docs/order.md`, "Skipping batches"): ranges of the global batch
//! sequence no rank receives, for recovering from a loss spike. The order function does not
//! know them: every other batch keeps its rows and its place, only delivery passes these by.
//!
//! A range is `[start, end)` in global batches. The ranges of a stream are sorted and disjoint,
//! recorded in its resolved document (and so in its fingerprint and every checkpoint), and a
//! resumed stream may add ranges that start at or after its position, never change one.

use crate::error::{Error, Result};
use crate::limits::MAX_POSITION;

/// One skipped range of global batches, `[start, end)`.
pub type SkipRange = [u64; 2];

/// Most ranges one stream may skip.
pub const MAX_SKIP_RANGES: usize = 4096;

/// Refuses ranges that are empty, unsorted, overlapping, too many or beyond any position.
pub fn validate(skips: &[SkipRange]) -> Result<()> {
    if skips.len() > MAX_SKIP_RANGES {
        return Err(Error::config(
            "skip_batches",
            format!(
                "{} ranges, more than the {MAX_SKIP_RANGES} a stream may skip",
                skips.len()
            ),
        ));
    }
    let mut after = 0;
    for (i, &[start, end]) in skips.iter().enumerate() {
        let problem = if start >= end {
            Some("is empty: a range is [start, end) with start < end".to_owned())
        } else if end > MAX_POSITION {
            Some(format!("ends beyond any position ({MAX_POSITION})"))
        } else if i > 0 && start < after {
            Some(format!(
                "starts before the previous range ends ({after}); ranges are sorted and disjoint"
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::config(
                format!("skip_batches[{i}]"),
                format!("[{start}, {end}) {problem}"),
            ));
        }
        after = end;
    }
    Ok(())
}

/// The skipped range holding global batch `g`, if any.
pub fn holding(skips: &[SkipRange], g: u64) -> Option<SkipRange> {
    let i = skips.partition_point(|&[_, end]| end <= g);
    skips.get(i).copied().filter(|&[start, _]| start <= g)
}

/// How many of the `count` global batches `first, first + step, ...` fall in skipped ranges,
/// and where each skipped run starts: `(index of its first batch, batches in it)`.
pub fn runs_in(skips: &[SkipRange], first: u64, step: u64, count: u64) -> Vec<(u64, u64)> {
    let last = first.saturating_add(step.saturating_mul(count));
    let index_at = |g: u64| g.saturating_sub(first).div_ceil(step).min(count);
    skips
        .iter()
        .filter(|&&[start, end]| end > first && start < last)
        .filter_map(|&[start, end]| {
            let (from, to) = (index_at(start), index_at(end));
            (to > from).then_some((from, to - from))
        })
        .collect()
}

/// Refuses a range the stream's ranks would not all skip the same number of batches of: in a
/// stage whose ranks take whole batches in turn, a range must hold whole rounds of
/// `world_size` batches counted from `origin` (a range already past is not checked).
pub fn check_rounds(skips: &[SkipRange], origin: u64, world_size: u64, shared: bool) -> Result<()> {
    if shared || world_size == 1 {
        return Ok(());
    }
    for (i, &[start, end]) in skips.iter().enumerate() {
        if end <= origin {
            continue;
        }
        let from = start.max(origin);
        if !(from - origin).is_multiple_of(world_size) || !(end - origin).is_multiple_of(world_size)
        {
            let round = |g: u64| origin + (g - origin) / world_size * world_size;
            return Err(Error::config(
                format!("skip_batches[{i}]"),
                format!(
                    "[{start}, {end}) does not cover whole rounds of {world_size} global \
                     batches (rounds start at {origin} + k * {world_size}), so the ranks would \
                     skip different numbers of batches; skip [{}, {}) instead",
                    round(from),
                    round(end + world_size - 1)
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses `now` as the skips of a stream resumed at global batch `next_batch` from one that
/// skipped `then`: every range of `then` is kept as it was, and a new one starts at or after
/// `next_batch` (batches before it were delivered already).
pub fn check_extends(then: &[SkipRange], now: &[SkipRange], next_batch: u64) -> Result<()> {
    validate(now)?;
    if let Some(&[start, end]) = then.iter().find(|range| !now.contains(range)) {
        return Err(Error::Checkpoint {
            message: format!(
                "it skips global batches [{start}, {end}), which the new skip_batches does not \
                 keep; a resumed stream keeps every range it skipped and may only add ranges"
            ),
        });
    }
    if let Some(&[start, end]) = now
        .iter()
        .find(|range| !then.contains(range) && range[0] < next_batch)
    {
        return Err(Error::Checkpoint {
            message: format!(
                "skip_batches adds [{start}, {end}), which starts before the checkpoint's next \
                 global batch {next_batch}: those batches were delivered already"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_found_and_counted_along_a_rank_s_batches() {
        let skips = [[10, 20], [30, 31]];
        validate(&skips).unwrap();
        assert_eq!(holding(&skips, 9), None);
        assert_eq!(holding(&skips, 10), Some([10, 20]));
        assert_eq!(holding(&skips, 19), Some([10, 20]));
        assert_eq!(holding(&skips, 20), None);
        assert_eq!(holding(&skips, 30), Some([30, 31]));
        // Rank 1 of 4 takes 1, 5, 9, 13, 17, 21, ...: 13 and 17 are skipped.
        assert_eq!(runs_in(&skips, 1, 4, 8), vec![(3, 2)]);
        // Every batch from 8 on, 25 of them: 10..20 and 30.
        assert_eq!(runs_in(&skips, 8, 1, 25), vec![(2, 10), (22, 1)]);
        assert!(runs_in(&skips, 40, 1, 5).is_empty());
    }

    #[test]
    fn bad_ranges_are_named() {
        let message = |skips: &[SkipRange]| validate(skips).unwrap_err().to_string();
        assert!(message(&[[5, 5]]).contains("skip_batches[0]"));
        assert!(message(&[[1, 9], [8, 12]]).contains("skip_batches[1]"));
        assert!(message(&[[1, MAX_POSITION + 1]]).contains("beyond any position"));
        let rounds = check_rounds(&[[10, 20]], 0, 4, false)
            .unwrap_err()
            .to_string();
        assert!(rounds.contains("skip [8, 20) instead"), "{rounds}");
        assert!(check_rounds(&[[8, 20]], 0, 4, false).is_ok());
        assert!(check_rounds(&[[10, 21]], 0, 4, true).is_ok());
        assert!(
            check_rounds(&[[1, 3]], 12, 4, false).is_ok(),
            "a past range"
        );
    }

    #[test]
    fn a_resume_keeps_every_range_and_adds_only_ahead() {
        assert!(check_extends(&[[4, 8]], &[[4, 8], [20, 24]], 12).is_ok());
        assert!(check_extends(&[[4, 8]], &[[20, 24]], 12).is_err());
        assert!(check_extends(&[], &[[8, 12]], 12).is_err());
        assert!(check_extends(&[], &[[12, 16]], 12).is_ok());
    }
}
