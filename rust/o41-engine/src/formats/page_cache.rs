//! Bytes of shards kept for the next read job of the same shard.
//!
//! A Parquet row group is often read by more than one job: a sequential read is cut where a
//! planned group of batches ends, and a shuffled read touches a row group in many jobs. Every
//! such job needs the column chunks' dictionary pages (the whole chunks where the shard has no
//! page index), and one that starts inside a page needs the page its predecessor ended in. A
//! compressed MDS shard is read whole by every job that reads it, and gzip jobs read the
//! compressed bytes from the access point before their rows on. Asking storage again costs a
//! request (about as much as a megabyte of transfer) or, merged into a neighbouring range, the
//! bytes again; the stream keeps these pages (a whole MDS shard is one page, a gzip stream's
//! are blocks of [`BLOCK_BYTES`]) instead, up to a fixed budget counted in its memory bound.
//!
//! Jobs are dispatched a few at a time, so the next job often asks while its predecessor's
//! fetch is still under way: a page being fetched is promised, and the later job waits for it
//! when it decodes. A promise always ends: its fetch keeps the page, or (failed or cancelled)
//! withdraws it, and the later job then reads the page itself.

use std::collections::VecDeque;
use std::io::Read;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::cancel::Cancel;
use crate::storage::{carry, Object};

/// Pages (held and promised) at most, whatever their size: a promise whose fetch failed is
/// never fulfilled, and goes with the oldest.
const MAX_PAGES: usize = 1024;

/// Recently fetched pages of remote shards, oldest evicted first once over budget.
#[derive(Debug)]
pub struct PageCache {
    capacity: u64,
    inner: Mutex<Pages>,
    /// Signalled when a promise ends.
    settled: Condvar,
}

#[derive(Debug, Default)]
struct Pages {
    entries: VecDeque<Page>,
    /// Bytes of the held pages.
    bytes: u64,
}

#[derive(Debug)]
struct Page {
    /// The shard and the version its reads are pinned to ([`PageCache::key`]).
    shard: String,
    range: Range<u64>,
    /// None while the page is being fetched.
    bytes: Option<Bytes>,
}

impl Pages {
    /// What the cache knows of `range`; a held page it serves becomes the newest, so the pages
    /// jobs keep reading (a window's row groups, its inflated shards) outlive those read once.
    fn lookup(&mut self, shard: &str, range: &Range<u64>) -> Lookup {
        let Some(k) = self.entries.iter().position(|p| p.holds(shard, range)) else {
            return Lookup::Missing;
        };
        let Some(bytes) = self.entries[k].bytes.clone() else {
            return Lookup::Coming;
        };
        let page = self.entries.remove(k).expect("found above");
        let from = (range.start - page.range.start) as usize;
        self.entries.push_back(page);
        Lookup::Held(bytes.slice(from..from + (range.end - range.start) as usize))
    }
}

impl Page {
    fn holds(&self, shard: &str, range: &Range<u64>) -> bool {
        self.shard == shard && self.range.start <= range.start && range.end <= self.range.end
    }

    fn held(&self) -> u64 {
        self.bytes.as_ref().map_or(0, |b| b.len() as u64)
    }
}

/// How often a wait for a promised page looks at its cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// Promised pages of one fetch ([`PageCache::promise`]): dropping it withdraws those the fetch
/// did not keep, so a failed or cancelled fetch leaves no promise behind.
pub struct Promised {
    cache: Arc<PageCache>,
    shard: String,
    ranges: Vec<Range<u64>>,
}

impl Promised {
    /// The promised pages.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// Keeps the promised pages that `pieces` (in offset order) hold.
    pub fn keep(&self, pieces: &[(u64, Bytes)]) {
        self.cache.keep(&self.shard, &self.ranges, pieces);
    }
}

impl Drop for Promised {
    fn drop(&mut self) {
        self.cache.withdraw(&self.shard, &self.ranges);
    }
}

/// Bytes of an object a [`CachedReader`] reads at once, kept whole: about what one request
/// costs in transfer, and what a rank reads past its own rows at most at each end.
pub const BLOCK_BYTES: u64 = 1 << 20;

/// An object's bytes from an offset on, read a block of [`BLOCK_BYTES`] at a time through a
/// [`PageCache`]: readers that start at different offsets of one object (jobs inflating a
/// gzip stream from the access points before their rows, on any decode thread) read each block
/// from storage once while the cache holds it.
pub struct CachedReader {
    object: Arc<Object>,
    cache: Arc<PageCache>,
    key: String,
    pos: u64,
    block: Option<(u64, Bytes)>,
}

impl CachedReader {
    /// Reads `object` from `offset` through `cache`, where its blocks fit (None where they do
    /// not: a cache that cannot keep a block only cuts the reads into blocks).
    pub fn new(object: Arc<Object>, cache: &Arc<PageCache>, offset: u64) -> Option<Self> {
        if !cache.fits(&(0..BLOCK_BYTES.min(object.size()))) {
            return None;
        }
        let key = PageCache::key_of(&object);
        Some(CachedReader {
            object,
            cache: cache.clone(),
            key,
            pos: offset,
            block: None,
        })
    }
}

impl Read for CachedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = self.object.size();
        if self.pos >= size || buf.is_empty() {
            return Ok(0);
        }
        let pos = self.pos;
        if !self
            .block
            .as_ref()
            .is_some_and(|(at, b)| *at <= pos && pos < at + b.len() as u64)
        {
            let start = pos / BLOCK_BYTES * BLOCK_BYTES;
            let range = start..(start + BLOCK_BYTES).min(size);
            let bytes = self
                .cache
                .read_through(&self.key, &self.object, range)
                .map_err(carry)?;
            self.block = Some((start, bytes));
        }
        let (at, bytes) = self.block.as_ref().expect("set above");
        let from = (pos - at) as usize;
        let n = buf.len().min(bytes.len() - from);
        buf[..n].copy_from_slice(&bytes[from..from + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

/// What [`PageCache::claim`] finds.
enum Claim {
    /// The bytes.
    Held(Bytes),
    /// Nothing: the caller reads them, and keeps them through the promise.
    Bring(Promised),
}

/// What the cache knows of a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Its bytes.
    Held(Bytes),
    /// A fetch under way will bring it.
    Coming,
    /// Nothing.
    Missing,
}

impl PageCache {
    /// A cache that holds at most `capacity` bytes of pages.
    pub fn new(capacity: u64) -> Self {
        PageCache {
            capacity,
            inner: Mutex::new(Pages::default()),
            settled: Condvar::new(),
        }
    }

    /// The key of a shard's pages: its location and the version its reads are pinned to, so
    /// the pages of an object replaced under the same name are never served for it.
    pub fn key(uri: &str, version: Option<&str>) -> String {
        format!("{uri}\n{}", version.unwrap_or(""))
    }

    /// The key of `object`'s pages ([`PageCache::key`]).
    pub fn key_of(object: &Object) -> String {
        Self::key(object.uri(), object.version())
    }

    fn pages(&self) -> std::sync::MutexGuard<'_, Pages> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What the cache knows of `range` of shard `shard` (a page holding all of it).
    pub fn get(&self, shard: &str, range: &Range<u64>) -> Lookup {
        self.pages().lookup(shard, range)
    }

    /// The bytes of `range` of shard `shard`, waiting while a fetch under way promises them;
    /// None once nothing holds or promises them, or when `cancel` is set.
    pub fn wait(&self, shard: &str, range: &Range<u64>, cancel: &Cancel) -> Option<Bytes> {
        let mut pages = self.pages();
        loop {
            match pages.lookup(shard, range) {
                Lookup::Held(bytes) => return Some(bytes),
                Lookup::Missing => return None,
                Lookup::Coming if cancel.is_cancelled() => return None,
                // A promise ends with its fetch; the timeout only lets `cancel` be seen. The
                // lock is held from the lookup to the wait, so no settling is missed.
                Lookup::Coming => {
                    pages = self
                        .settled
                        .wait_timeout(pages, CANCEL_POLL)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// All of `range` of shard `shard`: held, else (after waiting while another reader brings
    /// it) for the caller to bring, under a promise it keeps or drops. Looked up and promised
    /// under one lock, so that two readers never bring the same page at once.
    fn claim(self: &Arc<Self>, shard: &str, range: &Range<u64>, cancel: &Cancel) -> Claim {
        let mut pages = self.pages();
        loop {
            match pages.lookup(shard, range) {
                Lookup::Held(bytes) => return Claim::Held(bytes),
                Lookup::Coming if !cancel.is_cancelled() => {
                    pages = self
                        .settled
                        .wait_timeout(pages, CANCEL_POLL)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
                Lookup::Coming | Lookup::Missing => {
                    let mut promised = Vec::new();
                    if self.promise_locked(&mut pages, shard, range) {
                        promised.push(range.clone());
                    }
                    return Claim::Bring(Promised {
                        cache: self.clone(),
                        shard: shard.to_owned(),
                        ranges: promised,
                    });
                }
            }
        }
    }

    /// All of `range` of `object`, whose pages are under `key`: from the cache, else read from
    /// storage (by whichever reader asks first, the others waiting for it) and kept.
    pub fn read_through(
        self: &Arc<Self>,
        key: &str,
        object: &Object,
        range: Range<u64>,
    ) -> crate::error::Result<Bytes> {
        match self.claim(key, &range, object.cancel()) {
            Claim::Held(bytes) => Ok(bytes),
            Claim::Bring(promised) => {
                let bytes = object.read_range(range.clone())?;
                promised.keep(&[(range.start, bytes.clone())]);
                Ok(bytes)
            }
        }
    }

    /// Promises `range` of shard `shard` under the lock `pages` holds; false where a page that
    /// large is not kept, or one holding it is held or promised already.
    fn promise_locked(&self, pages: &mut Pages, shard: &str, range: &Range<u64>) -> bool {
        if !self.fits(range) || pages.entries.iter().any(|p| p.holds(shard, range)) {
            return false;
        }
        self.make_room(pages, 0);
        pages.entries.push_back(Page {
            shard: shard.to_owned(),
            range: range.clone(),
            bytes: None,
        });
        true
    }

    /// Promises the pages of `ranges` of shard `shard`, which a fetch under way brings. The
    /// promises last until the guard is dropped: pages the fetch kept by then stay, the others
    /// are withdrawn.
    pub fn promise(self: &Arc<Self>, shard: &str, ranges: Vec<Range<u64>>) -> Promised {
        let mut pages = self.pages();
        for range in &ranges {
            self.promise_locked(&mut pages, shard, range);
        }
        Promised {
            cache: self.clone(),
            shard: shard.to_owned(),
            ranges,
        }
    }

    /// Withdraws the promises of `ranges` of shard `shard` not kept yet.
    fn withdraw(&self, shard: &str, ranges: &[Range<u64>]) {
        let mut pages = self.pages();
        pages
            .entries
            .retain(|p| p.bytes.is_some() || p.shard != shard || !ranges.contains(&p.range));
        drop(pages);
        self.settled.notify_all();
    }

    /// Keeps a copy of `bytes`, which start at offset `at` of shard `shard` (a copy, so the
    /// response buffer they came in is not held), fulfilling its promise if there is one.
    pub fn put(&self, shard: &str, at: u64, bytes: &[u8]) {
        let range = at..at + bytes.len() as u64;
        if !self.fits(&range) {
            return;
        }
        let mut pages = self.pages();
        let promised = pages
            .entries
            .iter()
            .position(|p| p.bytes.is_none() && p.shard == shard && p.range == range);
        if let Some(k) = promised {
            pages.entries.remove(k);
        } else if pages.entries.iter().any(|p| p.holds(shard, &range)) {
            return;
        }
        self.make_room(&mut pages, range.end - range.start);
        pages.bytes += range.end - range.start;
        pages.entries.push_back(Page {
            shard: shard.to_owned(),
            range,
            bytes: Some(Bytes::copy_from_slice(bytes)),
        });
        drop(pages);
        self.settled.notify_all();
    }

    /// Keeps the pages of `ranges` of shard `shard` that `pieces` (in offset order) hold.
    pub fn keep(&self, shard: &str, ranges: &[Range<u64>], pieces: &[(u64, Bytes)]) {
        for range in ranges {
            if let Some(bytes) = held(pieces, range.start, range.end - range.start) {
                self.put(shard, range.start, &bytes);
            }
        }
    }

    /// Whether a page of `range` may be kept: not empty, and at most a quarter of the budget
    /// (a larger one would evict most others).
    fn fits(&self, range: &Range<u64>) -> bool {
        let len = range.end - range.start;
        len > 0 && len <= self.capacity / 4
    }

    /// Evicts the oldest pages until one more of `len` bytes fits.
    fn make_room(&self, pages: &mut Pages, len: u64) {
        while pages.bytes + len > self.capacity || pages.entries.len() >= MAX_PAGES {
            let Some(oldest) = pages.entries.pop_front() else {
                break;
            };
            pages.bytes -= oldest.held();
        }
    }

    /// Bytes of pages held now.
    #[cfg(test)]
    pub fn held(&self) -> u64 {
        self.pages().bytes
    }
}

/// Bytes `start..start + len` of `parts` (pieces in offset order) where they hold them: a view
/// of one piece when it holds them all, else a copy of the consecutive pieces that do.
pub(in crate::formats) fn held(parts: &[(u64, Bytes)], start: u64, len: u64) -> Option<Bytes> {
    let end = start + len;
    let k = parts.partition_point(|(at, _)| *at <= start);
    if k == 0 {
        return None;
    }
    let (at, bytes) = &parts[k - 1];
    if end <= at + bytes.len() as u64 {
        let from = (start - at) as usize;
        return Some(bytes.slice(from..from + len as usize));
    }
    let mut out = Vec::with_capacity(len as usize);
    let mut next = start;
    for (at, bytes) in &parts[k - 1..] {
        let piece_end = at + bytes.len() as u64;
        if *at > next || next >= end {
            break;
        }
        if piece_end <= next {
            continue;
        }
        let take = piece_end.min(end);
        out.extend_from_slice(&bytes[(next - at) as usize..(take - at) as usize]);
        next = take;
    }
    (next == end).then(|| Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(lookup: Lookup) -> Option<Vec<u8>> {
        match lookup {
            Lookup::Held(bytes) => Some(bytes.to_vec()),
            _ => None,
        }
    }

    #[test]
    fn a_kept_page_serves_any_range_inside_it_of_its_own_shard_only() {
        let cache = PageCache::new(1 << 20);
        let a = PageCache::key("s3://b/a.parquet", Some("\"e1\""));
        cache.put(&a, 100, &[1, 2, 3, 4, 5]);
        assert_eq!(bytes(cache.get(&a, &(101..104))), Some(vec![2, 3, 4]));
        assert_eq!(bytes(cache.get(&a, &(100..105))), Some(vec![1, 2, 3, 4, 5]));
        assert_eq!(cache.get(&a, &(99..101)), Lookup::Missing, "not all of it");
        assert_eq!(cache.get(&a, &(104..106)), Lookup::Missing, "not all of it");
        let replaced = PageCache::key("s3://b/a.parquet", Some("\"e2\""));
        assert_eq!(
            cache.get(&replaced, &(101..104)),
            Lookup::Missing,
            "another version's pages are not served"
        );
    }

    #[test]
    fn a_promised_page_is_coming_until_its_fetch_keeps_it_or_ends() {
        let cache = Arc::new(PageCache::new(1 << 20));
        let a = PageCache::key("s3://b/a.parquet", None);
        let promised = cache.promise(&a, vec![10..20, 30..40]);
        assert_eq!(cache.get(&a, &(12..15)), Lookup::Coming);
        assert_eq!(cache.held(), 0, "a promise holds no bytes");
        let waiter = {
            let (cache, a) = (cache.clone(), a.clone());
            std::thread::spawn(move || cache.wait(&a, &(12..15), &Cancel::new()))
        };
        let other = {
            let (cache, a) = (cache.clone(), a.clone());
            std::thread::spawn(move || cache.wait(&a, &(30..40), &Cancel::new()))
        };
        promised.keep(&[(10, Bytes::from(vec![7; 10]))]);
        assert_eq!(waiter.join().unwrap().as_deref(), Some(&[7; 3][..]));
        drop(promised);
        assert_eq!(
            other.join().unwrap(),
            None,
            "a page the fetch did not bring"
        );
        assert_eq!(cache.get(&a, &(30..40)), Lookup::Missing, "is withdrawn");
        assert_eq!(
            bytes(cache.get(&a, &(12..15))),
            Some(vec![7; 3]),
            "a kept one stays"
        );
        assert_eq!(cache.held(), 10);
    }

    #[test]
    fn a_wait_for_a_promise_ends_when_cancelled() {
        let cache = Arc::new(PageCache::new(1 << 20));
        let a = PageCache::key("s3://b/a.parquet", None);
        let _promised = cache.promise(&a, std::iter::once(10..20).collect());
        let cancel = Cancel::new();
        cancel.cancel();
        assert_eq!(cache.wait(&a, &(10..20), &cancel), None);
    }

    #[test]
    fn the_budget_evicts_the_oldest_pages_and_refuses_large_ones() {
        let cache = Arc::new(PageCache::new(400));
        let shard = PageCache::key("s3://b/a.parquet", None);
        cache.put(&shard, 0, &[0; 100]);
        cache.put(&shard, 1000, &[1; 100]);
        cache.put(&shard, 0, &[0; 50]);
        assert_eq!(cache.held(), 200, "a page already held is not kept twice");
        cache.put(&shard, 2000, &[2; 101]);
        let _promised = cache.promise(&shard, std::iter::once(2000..2101).collect());
        assert_eq!(
            cache.held(),
            200,
            "a page over a quarter of the budget is not kept"
        );
        assert_eq!(cache.get(&shard, &(2000..2001)), Lookup::Missing);
        cache.put(&shard, 3000, &[3; 100]);
        cache.put(&shard, 4000, &[4; 100]);
        cache.put(&shard, 5000, &[5; 100]);
        assert_eq!(cache.held(), 400);
        assert_eq!(
            cache.get(&shard, &(0..100)),
            Lookup::Missing,
            "the oldest went"
        );
        assert!(bytes(cache.get(&shard, &(5000..5100))).is_some());
        assert!(bytes(cache.get(&shard, &(1000..1100))).is_some());
    }

    #[test]
    fn unfulfilled_promises_are_evicted_by_count() {
        let cache = Arc::new(PageCache::new(1 << 30));
        let shard = PageCache::key("s3://b/a.parquet", None);
        let ranges = (0..MAX_PAGES as u64 + 10)
            .map(|k| k * 10..k * 10 + 5)
            .collect();
        let _promised = cache.promise(&shard, ranges);
        assert_eq!(cache.pages().entries.len(), MAX_PAGES);
        assert_eq!(
            cache.get(&shard, &(0..5)),
            Lookup::Missing,
            "the oldest went"
        );
    }
}
