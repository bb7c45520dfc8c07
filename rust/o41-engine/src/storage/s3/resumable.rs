//! Resumable reads of one object version: ranged gets that continue a broken body from its last
//! received byte with `If-Match`, fetched ahead or in the background.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore};
use tokio::sync::mpsc;

use super::errors::{Context, Failure};
use super::runtime::{block_on, runtime};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::metrics::{Meter, RetryCause};
use crate::storage::carry;
use crate::storage::retry::Attempts;

/// Byte pieces of an object with the offset of each, in order.
pub type Pieces = Vec<(u64, Bytes)>;

/// What a background fetch calls with its pieces once they are all in.
pub type Arrived = Option<Box<dyn FnOnce(&Pieces) + Send>>;

/// Chunks a remote reader may fetch ahead of its consumer.
pub(super) const READ_AHEAD_CHUNKS: usize = 64;

pub(super) struct RemoteObject {
    pub(super) uri: String,
    pub(super) store: Arc<AmazonS3>,
    pub(super) path: Path,
    /// The version every read of this object is pinned to.
    pub(super) etag: Option<String>,
    /// The hex SHA-256 its writer stored in its metadata, as the HEAD that opened it reported.
    pub(super) sha256: Option<String>,
    pub(super) context: Context,
    /// Where retries of its reads are counted (its bytes are counted by the `Object`).
    pub(super) meter: Option<Arc<Meter>>,
}

impl RemoteObject {
    /// Sends the bytes of `range` to `tx`, resuming from the last received byte after transient
    /// failures. Stops early, without error, when the receiver is gone.
    pub(super) async fn stream_range(
        &self,
        range: Range<u64>,
        tx: mpsc::Sender<Bytes>,
    ) -> Result<()> {
        let mut pos = range.start;
        let mut attempts = Attempts::new(self.context.policy);
        let mut retried = false;
        while pos < range.end {
            let options = GetOptions {
                if_match: self.etag.clone(),
                range: Some(GetRange::Bounded(pos..range.end)),
                ..GetOptions::default()
            };
            let sent = Instant::now();
            let (kind, cause) = match self.store.get_opts(&self.path, options).await {
                Err(e) if self.context.refreshed(&e, sent, &mut retried).await => continue,
                Err(e) => match self.context.classify(&self.uri, e) {
                    Failure::Fatal(e) => return Err(e),
                    Failure::Exists => unreachable!("reads do not create"),
                    Failure::Transient(kind, cause) => (kind, cause),
                },
                Ok(result) => {
                    let mut body = result.into_stream();
                    loop {
                        match body.next().await {
                            Some(Ok(chunk)) => {
                                let take = (chunk.len() as u64).min(range.end - pos);
                                if take == 0 {
                                    continue;
                                }
                                pos += take;
                                attempts.progress();
                                // Credentials worked: a later refusal gets its own retry.
                                retried = false;
                                if tx.send(chunk.slice(..take as usize)).await.is_err() {
                                    return Ok(());
                                }
                            }
                            Some(Err(e)) => match self.context.classify(&self.uri, e) {
                                Failure::Fatal(e) => return Err(e),
                                Failure::Exists => unreachable!("reads do not create"),
                                // A body that went silent timed out; any other break in it
                                // is an interrupted response, resumed from its last byte.
                                Failure::Transient(RetryCause::Timeout, cause) => {
                                    break (RetryCause::Timeout, cause)
                                }
                                Failure::Transient(_, cause) => {
                                    break (RetryCause::Interrupted, cause)
                                }
                            },
                            None if pos < range.end => {
                                break (
                                    RetryCause::Interrupted,
                                    format!(
                                        "the response ended at byte {pos}, before byte {}",
                                        range.end
                                    ),
                                )
                            }
                            None => return Ok(()),
                        }
                    }
                }
            };
            if let Some(meter) = &self.meter {
                meter.retry(kind);
            }
            match attempts.failed() {
                Ok(wait) => tokio::time::sleep(wait).await,
                Err(reason) => {
                    return Err(Error::Storage {
                        path: self.uri.clone(),
                        message: format!(
                            "{reason} while reading bytes {pos}..{}; last error: {cause}",
                            range.end
                        ),
                    })
                }
            }
        }
        Ok(())
    }

    /// The bytes of `range` as the pieces they arrived in, each with its offset.
    pub(super) async fn pieces(&self, range: Range<u64>) -> Result<Pieces> {
        let (tx, mut rx) = mpsc::channel::<Bytes>(READ_AHEAD_CHUNKS);
        let gather = async {
            let mut pieces = Vec::new();
            let mut at = range.start;
            while let Some(chunk) = rx.recv().await {
                let len = chunk.len() as u64;
                pieces.push((at, chunk));
                at += len;
            }
            pieces
        };
        let (done, pieces) = tokio::join!(self.stream_range(range.clone(), tx), gather);
        done?;
        Ok(pieces)
    }

    pub(super) async fn collect(&self, range: Range<u64>) -> Result<Bytes> {
        let mut pieces = self.pieces(range.clone()).await?;
        // One response chunk is the common case for small ranges: hand it over without a copy.
        if pieces.len() == 1 {
            return Ok(pieces.pop().expect("one piece").1);
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        for (_, piece) in pieces {
            out.extend_from_slice(&piece);
        }
        Ok(out.freeze())
    }
}

/// The pieces of every range, fetched concurrently, in range order.
async fn all_pieces(object: Arc<RemoteObject>, ranges: Vec<Range<u64>>) -> Result<Pieces> {
    let all = futures::future::join_all(ranges.iter().map(|r| object.pieces(r.clone()))).await;
    let mut out = Vec::new();
    for pieces in all {
        out.extend(pieces?);
    }
    Ok(out)
}

/// A background fetch; dropping it cancels the fetch.
pub struct PendingPieces(pub(super) Option<tokio::task::JoinHandle<Result<Pieces>>>);

impl PendingPieces {
    /// Waits for the fetch to finish; dropping the wait (cancellation) aborts the fetch.
    pub fn wait(mut self, uri: &str, cancel: &Cancel) -> Result<Pieces> {
        let handle = self.0.take().expect("waited once");
        let abort = handle.abort_handle();
        let result = block_on(cancel, uri, async {
            handle.await.map_err(|e| Error::Storage {
                path: uri.to_owned(),
                message: format!("the background read stopped: {e}"),
            })?
        });
        abort.abort();
        result
    }
}

impl Drop for PendingPieces {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// The remote half of an [`Object`].
pub struct Remote(pub(super) Arc<RemoteObject>);

impl Remote {
    pub fn version(&self) -> Option<&str> {
        self.0.etag.as_deref()
    }

    /// The hex SHA-256 stored in the object's metadata when it was written, if any.
    pub fn stored_sha256(&self) -> Option<&str> {
        self.0.sha256.as_deref()
    }

    pub fn read_range(&self, range: Range<u64>, cancel: &Cancel) -> Result<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        block_on(cancel, &self.0.uri, self.0.collect(range))
    }

    pub fn read_pieces(&self, ranges: &[Range<u64>], cancel: &Cancel) -> Result<Pieces> {
        block_on(
            cancel,
            &self.0.uri,
            all_pieces(self.0.clone(), ranges.to_vec()),
        )
    }

    /// Starts fetching `ranges` in the background; `arrived` sees the pieces as soon as they
    /// are all in, before anyone waits for them.
    pub fn spawn_pieces(&self, ranges: Vec<Range<u64>>, arrived: Arrived) -> PendingPieces {
        let object = self.0.clone();
        PendingPieces(Some(runtime().spawn(async move {
            let pieces = all_pieces(object, ranges).await;
            if let (Ok(pieces), Some(arrived)) = (&pieces, arrived) {
                arrived(pieces);
            }
            pieces
        })))
    }

    /// A blocking reader of `range` whose bytes are fetched ahead by a background task; its
    /// waits stop once `cancel` is set.
    pub fn reader(&self, range: Range<u64>, cancel: Cancel) -> RemoteReader {
        let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
        let (err_tx, err_rx) = std::sync::mpsc::sync_channel(1);
        let object = self.0.clone();
        let task = runtime().spawn(async move {
            if let Err(e) = object.stream_range(range, tx).await {
                let _ = err_tx.send(e);
            }
        });
        RemoteReader {
            uri: self.0.uri.clone(),
            rx,
            errors: err_rx,
            current: Bytes::new(),
            task,
            cancel,
        }
    }
}

/// Blocking `Read` over a background fetch; dropping it stops the fetch.
pub struct RemoteReader {
    pub(super) uri: String,
    pub(super) rx: mpsc::Receiver<Bytes>,
    pub(super) errors: std::sync::mpsc::Receiver<Error>,
    pub(super) current: Bytes,
    pub(super) task: tokio::task::JoinHandle<()>,
    pub(super) cancel: Cancel,
}

impl std::io::Read for RemoteReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            let rx = &mut self.rx;
            let next =
                block_on(&self.cancel, &self.uri, async { Ok(rx.recv().await) }).map_err(carry)?;
            match next {
                Some(chunk) => self.current = chunk,
                // The fetch has ended; its error, if any, is sent before the task finishes.
                None => {
                    return match self.errors.recv() {
                        Ok(e) => Err(carry(e)),
                        Err(_) => Ok(0),
                    }
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

impl Drop for RemoteReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}
