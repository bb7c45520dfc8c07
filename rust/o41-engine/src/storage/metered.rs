//! Readers that count what they return into a meter, and engine errors carried through
//! `std::io::Read`.

use std::fmt;
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Error;
use crate::metrics::Meter;

/// A reader that counts what it returns, and the time it waited for it, into a [`Meter`].
pub struct Metered<R> {
    inner: R,
    meter: Arc<Meter>,
}

impl<R> Metered<R> {
    /// Counts the reads of `inner` into `meter`.
    pub fn new(inner: R, meter: Arc<Meter>) -> Self {
        Metered { inner, meter }
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let since = Instant::now();
        let n = self.inner.read(buf)?;
        self.meter.read(n as u64, since);
        Ok(n)
    }
}

/// A reader that tallies the bytes it returns and adds them to a [`Meter`] when dropped,
/// without timing: for readers called many times for a few bytes each (a Parquet decoder
/// parsing page headers from a local file), where a clock reading and a shared atomic per call
/// would cost more than the read. Such readers live for one column chunk of one read job.
pub struct Tallied<R> {
    inner: R,
    meter: Arc<Meter>,
    bytes: u64,
}

impl<R> Tallied<R> {
    /// Tallies the reads of `inner` for `meter`.
    pub fn new(inner: R, meter: Arc<Meter>) -> Self {
        Tallied {
            inner,
            meter,
            bytes: 0,
        }
    }
}

impl<R: Read> Read for Tallied<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<R> Drop for Tallied<R> {
    fn drop(&mut self) {
        self.meter.bytes(self.bytes);
    }
}

/// An engine error carried through `std::io::Read`, which only speaks `io::Error`.
#[derive(Debug)]
struct Carried(Error);

impl fmt::Display for Carried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Carried {}

/// Wraps an engine error for a `std::io::Read` implementation; [`from_io`] unwraps it.
pub fn carry(error: Error) -> std::io::Error {
    std::io::Error::other(Carried(error))
}

/// Turns an `io::Error` from an [`Object::reader`] back into the engine error it carries, or
/// into `otherwise(e)` when it is a plain I/O or decoding failure.
pub fn from_io(e: std::io::Error, otherwise: impl FnOnce(std::io::Error) -> Error) -> Error {
    if e.get_ref()
        .is_some_and(<dyn std::error::Error + Send + Sync>::is::<Carried>)
    {
        let inner = e.into_inner().expect("checked above");
        return inner.downcast::<Carried>().expect("checked above").0;
    }
    otherwise(e)
}
