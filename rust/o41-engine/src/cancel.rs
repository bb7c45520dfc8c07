//! Cooperative cancellation. Every wait that can last (a remote request and its retries, a
//! pipeline thread, a long inspection) looks at a [`Cancel`] flag, so `close()` and Ctrl-C stop
//! work in flight instead of waiting for it to finish or for its retry budget to run out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A shared flag: set once, seen by every clone.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag; every clone sees it.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// True once [`Cancel::cancel`] ran on any clone.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Fails with [`Error::Cancelled`] naming `what` once the flag is set.
    pub fn check(&self, what: &str) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Cancelled {
                what: what.to_owned(),
            })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag() {
        let a = Cancel::new();
        let b = a.clone();
        assert!(b.check("x").is_ok());
        a.cancel();
        assert!(b.is_cancelled());
        assert!(matches!(b.check("x"), Err(Error::Cancelled { .. })));
    }
}
