//! The one I/O runtime every S3 request runs on, and blocking on it while obeying a [`Cancel`].

use std::future::Future;
use std::sync::Mutex;

use tokio::runtime::Runtime;

use crate::cancel::Cancel;
use crate::error::{Error, Result};

/// The tokio runtime that drives requests, one per process: after a fork the child cannot use
/// the parent's runtime threads or pooled connections, so it builds its own.
pub(super) fn runtime() -> &'static Runtime {
    static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = RUNTIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match *slot {
        Some((owner, runtime)) if owner == pid => runtime,
        _ => {
            let runtime: &'static Runtime = Box::leak(Box::new(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("o41-io")
                    .enable_all()
                    .build()
                    .expect("the I/O runtime starts"),
            ));
            *slot = Some((pid, runtime));
            runtime
        }
    }
}

/// How often a wait on the network looks at its cancellation flag.
pub(super) const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Runs `work` to completion on the I/O runtime, or stops it (dropping the request and any
/// retry it is sleeping before) once `cancel` is set.
pub(super) fn block_on<T>(
    cancel: &Cancel,
    what: &str,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    runtime().block_on(async {
        tokio::select! {
            out = work => out,
            () = cancelled(cancel) => Err(Error::Cancelled { what: what.to_owned() }),
        }
    })
}

async fn cancelled(cancel: &Cancel) {
    while !cancel.is_cancelled() {
        tokio::time::sleep(CANCEL_POLL).await;
    }
}
