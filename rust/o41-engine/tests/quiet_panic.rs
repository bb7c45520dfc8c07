//! `catch_quietly` keeps a decoder's panic off stderr and leaves every other panic to the hook
//! that was installed before it. Its own test binary: the panic hook is process-wide.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use o41_engine::error::catch_quietly;

#[test]
fn a_quiet_panic_reaches_no_hook_and_every_other_panic_does() {
    let reported = Arc::new(AtomicUsize::new(0));
    let count = reported.clone();
    std::panic::set_hook(Box::new(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    }));

    let error = catch_quietly(|| -> u8 { panic!("bad page {}", 3) }).unwrap_err();
    assert!(
        error.starts_with("bad page 3 (at o41-engine/tests/quiet_panic.rs:"),
        "{error}"
    );
    assert_eq!(reported.load(Ordering::SeqCst), 0);
    assert_eq!(catch_quietly(|| 7), Ok(7));

    // Nested: the inner call leaves the outer one quiet.
    let outer = catch_quietly(|| {
        assert!(catch_quietly(|| -> u8 { panic!("inner") }).is_err());
        panic!("outer")
    });
    assert!(outer.unwrap_err().starts_with("outer (at "));
    assert_eq!(reported.load(Ordering::SeqCst), 0);

    // Outside it, on this thread and on another, the earlier hook sees the panic.
    assert!(std::panic::catch_unwind(|| panic!("a bug")).is_err());
    assert!(
        std::thread::spawn(|| catch_quietly(|| 1).map(|_| panic!("a bug elsewhere")))
            .join()
            .is_err()
    );
    assert_eq!(reported.load(Ordering::SeqCst), 2);
}
