//! The one way the binding waits: without the GIL, looking at Python's signal handlers every
//! 100 ms, with engine errors mapped to the Python hierarchy in one place.
//!
//! Python runs signal handlers only on its main thread and only when that thread holds the GIL,
//! so a call that blocks inside Rust would leave Ctrl-C pending until it returns. Work that
//! cannot stop on its own every 100 ms (opening a stream over thousands of remote shards,
//! closing one during a storage outage) runs on a helper thread, while the caller's thread
//! waits in 100 ms steps and runs the handlers in between. A handler that raises (Ctrl-C's
//! `KeyboardInterrupt`) sets the work's [`Cancel`] flag, which every engine wait obeys, and its
//! exception is raised once the work has stopped. No engine lock is held across any of this:
//! the engine's locks are taken and released inside the work, never while the GIL is retaken.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use o41_engine::cancel::Cancel;
use o41_engine::Error;
use pyo3::prelude::*;

use crate::errors::to_py;

/// How long one GIL-free wait lasts before Python gets a chance to run its signal handlers.
pub const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// What one step of a wait found.
pub enum Step<T> {
    /// The wait is over.
    Done(T),
    /// Nothing yet; the step returned after its timeout.
    Pending,
}

/// Calls `step(SIGNAL_POLL)` without the GIL until it is done, running Python's signal handlers
/// between steps. When a handler raises, `on_interrupt` runs (without the GIL) and the handler's
/// exception is returned.
pub fn wait<T: Send>(
    py: Python<'_>,
    mut step: impl FnMut(Duration) -> Result<Step<T>, Error> + Send,
    on_interrupt: impl FnOnce() + Send,
) -> PyResult<T> {
    loop {
        match py.detach(|| Error::catch(|| step(SIGNAL_POLL))) {
            Ok(Step::Done(value)) => return Ok(value),
            Ok(Step::Pending) => {}
            Err(e) => return Err(to_py(py, &e)),
        }
        if let Err(interrupt) = py.check_signals() {
            py.detach(on_interrupt);
            return Err(interrupt);
        }
    }
}

/// Runs `work` on a helper thread and waits for it as [`wait`] does. The work receives the
/// flag that an interrupt sets; pass it on to the engine (`storage.with_cancel(...)`).
pub fn blocking<T: Send>(
    py: Python<'_>,
    work: impl FnOnce(&Cancel) -> Result<T, Error> + Send,
) -> PyResult<T> {
    blocking_with(py, &Cancel::new(), work)
}

/// Like [`blocking`], with the flag of an object that outlives the call (a reader whose storage
/// was opened with it): an interrupt cancels that object's reads, now and later.
pub fn blocking_with<T: Send>(
    py: Python<'_>,
    cancel: &Cancel,
    work: impl FnOnce(&Cancel) -> Result<T, Error> + Send,
) -> PyResult<T> {
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = mpsc::sync_channel::<()>(1);
        let worker = scope.spawn(move || {
            let result = work(cancel);
            let _ = done_tx.send(());
            result
        });
        let finished = wait(
            py,
            move |timeout| match done_rx.recv_timeout(timeout) {
                Ok(()) | Err(RecvTimeoutError::Disconnected) => Ok(Step::Done(())),
                Err(RecvTimeoutError::Timeout) => Ok(Step::Pending),
            },
            || cancel.cancel(),
        );
        // After an interrupt the engine stops promptly (its waits obey the flag); the scope
        // joins the worker either way.
        let joined = py.detach(|| worker.join());
        finished?;
        match joined {
            Ok(result) => result.map_err(|e| to_py(py, &e)),
            Err(panic) => Err(to_py(py, &Error::from_panic(panic.as_ref()))),
        }
    })
}
