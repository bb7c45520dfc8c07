//! Running one fallible function over many items on a few scoped threads, results in order:
//! how resolution inspects shards and a stream inspects the shards it reaches first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Threads that inspect `shards` shards: at most `threads`, and never more than this many, which
/// keep a storage service busy already.
pub fn threads_for(threads: usize, shards: usize) -> usize {
    const MAX_INSPECT_THREADS: usize = 64;
    threads.clamp(1, shards.clamp(1, MAX_INSPECT_THREADS))
}

/// Runs `f` on every item on up to `threads` threads (see [`threads_for`]); results keep
/// the items' order, so the first failure reported does not depend on timing.
pub fn parallel<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    if items.is_empty() {
        return Vec::new();
    }
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, Result<R>)>> = Mutex::new(Vec::with_capacity(items.len()));
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(i) else { return };
        let result = Error::catch(|| f(item));
        done.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((i, result));
    };
    let spawn_failed = std::thread::scope(|scope| {
        let mut failed = None;
        let work = &work;
        for _ in 0..threads_for(threads, items.len()) {
            if let Err(e) = std::thread::Builder::new()
                .name("o41-inspect".to_owned())
                .spawn_scoped(scope, work)
            {
                failed = Some(Error::io("inspection thread", e));
                break;
            }
        }
        failed
    });
    let mut done = done
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    done.sort_unstable_by_key(|(i, _)| *i);
    let mut out: Vec<Result<R>> = done.into_iter().map(|(_, r)| r).collect();
    // Items no thread reached (none could be started) fail with the reason.
    while out.len() < items.len() {
        out.push(Err(spawn_failed.as_ref().map_or_else(
            || Error::Internal {
                message: "an inspection was never run".to_owned(),
            },
            |e| Error::Internal {
                message: e.to_string(),
            },
        )));
    }
    out
}
