//! What credentials are and where they come from: plain data, shared by the chain's lookup
//! (`profiles`), the signer that fetches and refreshes them (`credentials`) and the scrubber.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::error::{Error, Result};

/// Credentials and, for temporary ones, when they stop working.
#[derive(Clone)]
pub struct TemporaryCredentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
    /// When they expire; `None` for keys that do not.
    pub expiry: Option<SystemTime>,
}

impl fmt::Debug for TemporaryCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TemporaryCredentials(<redacted>, expiry {:?})",
            self.expiry
        )
    }
}

/// A caller's source of temporary credentials. Called on a blocking thread, never two calls at
/// once for one storage object; an error fails the request that needed the credentials.
pub trait FetchCredentials: Send + Sync {
    /// Fresh credentials.
    fn fetch(&self) -> Result<TemporaryCredentials>;
}

/// Where the credentials come from.
#[derive(Clone)]
pub enum Credentials {
    /// These keys, for the whole run.
    Static(TemporaryCredentials),
    /// The standard AWS chain; `profile` names the shared-file profile and, when given, skips
    /// the environment's keys and web identity (as the AWS SDKs do for an explicit profile).
    Chain {
        /// The profile to use instead of `AWS_PROFILE` or `default`.
        profile: Option<String>,
    },
    /// A caller's function.
    Provider(Arc<dyn FetchCredentials>),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Credentials::Static(_) => "static keys",
            Credentials::Chain { .. } => "the AWS credential chain",
            Credentials::Provider(_) => "a credential provider",
        })
    }
}

/// Checks fetched credentials as the engine checks configured ones: headers carry visible ASCII
/// only, and `object_store` panics on anything else.
pub(super) fn check_keys(c: &TemporaryCredentials) -> Result<()> {
    for (option, value) in [
        ("access_key_id", Some(&c.access_key_id)),
        ("secret_access_key", Some(&c.secret_access_key)),
        ("session_token", c.session_token.as_ref()),
    ] {
        let Some(value) = value else { continue };
        if value.is_empty() && option != "session_token" {
            return Err(Error::config(option, "must not be empty"));
        }
        // Not echoed: most are secrets.
        if let Some(at) = value.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(Error::config(
                option,
                format!(
                    "byte {at} is not visible ASCII (a space, newline or control character, or \
                     non-ASCII text); credentials and regions are printable ASCII only"
                ),
            ));
        }
    }
    Ok(())
}
