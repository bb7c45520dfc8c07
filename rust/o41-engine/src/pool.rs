//! Column buffers handed round instead of allocated anew: every read job's chunk and every
//! batch of a stream have the same few sizes.
//!
//! A fresh allocation of a batch's size comes from the kernel as untouched pages (a fault and a
//! clearing per page, then the fill), and a freed one goes back to it or stays in the
//! allocator's arenas, uncounted; with three columns of 2,048 tokens a row, that churn cost more
//! than decoding the tokens. A buffer taken from a pool is already mapped and is only filled.
//!
//! A pool holds no more than its limit: buffers handed out and kept free together stay within
//! it unless the buffers in use alone exceed it (a consumer holding batches), and then nothing
//! more is kept. The limit is the part of the memory bound that counts these buffers, so the
//! pool never lets the stream hold more than it declares.

use std::sync::{Arc, Mutex, MutexGuard};

use arrow_buffer::MutableBuffer;

/// A buffer is reused for a request of at least `1 / SLACK` of its capacity, so a small batch
/// does not hold a large buffer.
const SLACK: usize = 2;

/// Buffers kept for reuse, within a byte limit.
#[derive(Debug)]
pub struct BufferPool {
    state: Mutex<State>,
    limit: usize,
}

#[derive(Debug, Default)]
struct State {
    free: Vec<MutableBuffer>,
    /// Capacity of the free buffers.
    free_bytes: usize,
    /// Capacity of the buffers handed out and not given back.
    out_bytes: usize,
}

impl BufferPool {
    /// A pool keeping at most `limit` bytes, in use and free together.
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(BufferPool {
            state: Mutex::default(),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while the lock was held leaves counts, never broken buffers.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A zeroed buffer of `len` bytes, to be given back with [`BufferPool::give`].
    pub fn take(&self, len: usize) -> MutableBuffer {
        self.take_with(len, true)
    }

    /// A buffer of `len` bytes that may hold a previous user's bytes, for a caller that writes
    /// every one of them before reading any: it skips clearing a reused buffer.
    pub fn take_dirty(&self, len: usize) -> MutableBuffer {
        self.take_with(len, false)
    }

    fn take_with(&self, len: usize, zeroed: bool) -> MutableBuffer {
        let mut state = self.state();
        let fit = state
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len && b.capacity() <= len.saturating_mul(SLACK))
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        if let Some(i) = fit {
            let mut buffer = state.free.swap_remove(i);
            state.free_bytes -= buffer.capacity();
            state.out_bytes += buffer.capacity();
            drop(state);
            if zeroed || buffer.len() < len {
                buffer.clear();
            }
            buffer.resize(len, 0);
            return buffer;
        }
        // Make room for the new buffer by dropping free ones that did not fit.
        let mut evicted = Vec::new();
        while state.out_bytes + state.free_bytes + len > self.limit {
            let Some(buffer) = state.free.pop() else {
                break;
            };
            state.free_bytes -= buffer.capacity();
            evicted.push(buffer);
        }
        drop(state);
        drop(evicted);
        let buffer = MutableBuffer::from_len_zeroed(len);
        self.state().out_bytes += buffer.capacity();
        buffer
    }

    /// Takes back a buffer that [`BufferPool::take`] handed out.
    pub fn give(&self, buffer: MutableBuffer) {
        let capacity = buffer.capacity();
        let mut state = self.state();
        state.out_bytes = state.out_bytes.saturating_sub(capacity);
        if capacity > 0 && state.out_bytes + state.free_bytes + capacity <= self.limit {
            state.free_bytes += capacity;
            state.free.push(buffer);
        }
    }

    /// Bytes handed out and bytes kept free.
    pub fn held(&self) -> (usize, usize) {
        let state = self.state();
        (state.out_bytes, state.free_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_back_buffer_is_reused_zeroed() {
        let pool = BufferPool::new(1 << 20);
        let mut a = pool.take(4096);
        a.as_slice_mut().fill(7);
        let address = a.as_ptr();
        pool.give(a);
        let b = pool.take(3000);
        assert_eq!(b.as_ptr(), address);
        assert_eq!(b.len(), 3000);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert_eq!(pool.held(), (4096, 0));
    }

    #[test]
    fn a_dirty_buffer_keeps_its_bytes_and_its_length() {
        let pool = BufferPool::new(1 << 20);
        let mut a = pool.take(4096);
        a.as_slice_mut().fill(7);
        pool.give(a);
        let b = pool.take_dirty(3000);
        assert_eq!(b.len(), 3000);
        assert!(b.as_slice().iter().all(|&x| x == 7));
        pool.give(b);
        // Shorter than asked (its last user took less): cleared, never read past its length.
        let c = pool.take_dirty(4000);
        assert!(c.as_slice().iter().all(|&x| x == 0));
    }

    #[test]
    fn a_much_larger_buffer_is_not_lent_to_a_small_request() {
        let pool = BufferPool::new(1 << 20);
        let a = pool.take(64 * 1024);
        let address = a.as_ptr();
        pool.give(a);
        let b = pool.take(1024);
        assert_ne!(b.as_ptr(), address);
        assert_eq!(pool.held(), (1024, 64 * 1024));
    }

    #[test]
    fn in_use_and_free_stay_within_the_limit() {
        let pool = BufferPool::new(10_000);
        let a = pool.take(6_000);
        let b = pool.take(3_000);
        pool.give(a);
        // 6,000 is within slack of a request of 5,000: reused.
        let c = pool.take(5_000);
        assert_eq!(pool.held(), (9_000, 0));
        pool.give(b);
        pool.give(c);
        // Free ones that do not fit are dropped to make room for a new buffer.
        let d = pool.take(9_500);
        let (out, free) = pool.held();
        assert!(out + free <= 10_000, "{out} + {free}");
        assert_eq!(out, 9_500);
        pool.give(d);
        // In use past the limit (a consumer holding batches): nothing is kept.
        let e = pool.take(8_000);
        let f = pool.take(8_000);
        pool.give(e);
        assert_eq!(pool.held(), (8_000, 0));
        pool.give(f);
    }
}
