//! Keeping credentials out of every message: text from the service or the client library is
//! cleaned of each credential configured or fetched during the run.

use std::sync::{Arc, PoisonError, RwLock};

use object_store::aws::AwsCredential;

/// Replaces credentials in text that came from the service or the client library. It learns
/// each credential fetched during a run before the credential is used.
#[derive(Clone, Default)]
pub(super) struct Scrubber(Arc<RwLock<Vec<String>>>);

impl Scrubber {
    pub(super) fn clean(&self, text: &str) -> String {
        let secrets = self.0.read().unwrap_or_else(PoisonError::into_inner);
        secrets.iter().fold(text.to_owned(), |out, secret| {
            out.replace(secret.as_str(), "<redacted>")
        })
    }

    /// Adds `credential`'s key id, secret and token to what is scrubbed.
    pub(super) fn learn(&self, credential: &AwsCredential) {
        let mut secrets = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let values = [
            Some(credential.key_id.as_str()),
            Some(credential.secret_key.as_str()),
            credential.token.as_deref(),
        ];
        for value in values.into_iter().flatten() {
            if !value.is_empty() && !secrets.iter().any(|s| s == value) {
                secrets.push(value.to_owned());
            }
        }
    }
}
