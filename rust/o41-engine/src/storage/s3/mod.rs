//! S3-compatible object storage over the `object_store` crate.
//!
//! `object_store`'s own retries are turned off and its whole-request timeout disabled: a large
//! GET would otherwise be cut off by a timeout meant for small requests, and its retry budget
//! counts attempts and total time rather than failures in a row. The loops here resume a broken
//! body from the last received byte with `If-Match` on the `ETag` seen at open, so a replaced
//! object fails closed instead of splicing two versions.

//!
//! `runtime` holds the I/O runtime, `errors` the causes of failures, `client` the requests and
//! their retries, `resumable` the reads of one object version, `keys` what credentials are,
//! `profiles` the AWS credential chain, `chain_files` and `process` the chain's files and
//! `credential_process` helpers, bounded, `credentials` the signer that fetches and refreshes
//! them and `scrub` keeping them out of messages.

mod chain_files;
mod client;
mod credentials;
mod errors;
mod keys;
mod process;
mod profiles;
mod resumable;
mod runtime;
mod scrub;

#[cfg(test)]
mod tests;

pub use client::{S3Settings, S3};
pub use keys::{Credentials, FetchCredentials, TemporaryCredentials};
pub use resumable::{Arrived, PendingPieces, Pieces, Remote};
