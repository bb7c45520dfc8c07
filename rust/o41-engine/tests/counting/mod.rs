//! The system allocator, remembering the largest single request: the hostile-input tests assert
//! that no input makes the engine ask for more than their bound. Each test binary installs it
//! with `#[global_allocator] static ALLOCATOR: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The largest single allocation any forged or mutated input (a few KiB) may cause.
pub const ALLOCATION_BOUND: usize = 64 << 20;

/// The largest single request so far.
pub static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// Counts into [`LARGEST`], then asks the system allocator.
pub struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
