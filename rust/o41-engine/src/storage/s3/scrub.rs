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

/// The shortest run of key-like characters taken for a secret by [`redact_secret_like`]: AWS
/// key ids are 20 characters, secret keys 40, session tokens and JWTs hundreds.
const SECRET_LIKE_LEN: usize = 16;

/// `text` with everything that looks like a key or token replaced by `<redacted>`: a run of at
/// least 16 letters, digits and `+/=_-` that mixes two of upper case, lower case and digits.
/// For text a credential helper wrote, which may hold secrets no scrubber has learnt (its
/// own, or those it failed to hand over). Paths and hex digests are redacted too: better a
/// message that says less than one that leaks.
pub(super) fn redact_secret_like(text: &str) -> String {
    fn key_like(c: char) -> bool {
        c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '_' | '-')
    }
    fn secret_like(run: &str) -> bool {
        let classes = [
            run.bytes().any(|b| b.is_ascii_uppercase()),
            run.bytes().any(|b| b.is_ascii_lowercase()),
            run.bytes().any(|b| b.is_ascii_digit()),
        ];
        run.len() >= SECRET_LIKE_LEN && classes.iter().filter(|&&c| c).count() >= 2
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !key_like(c)).unwrap_or(rest.len());
        let (run, after) = rest.split_at(end);
        out.push_str(if secret_like(run) { "<redacted>" } else { run });
        let mut chars = after.chars();
        if let Some(c) = chars.next() {
            out.push(c);
        }
        rest = chars.as_str();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_looks_like_a_key_is_redacted_and_words_are_kept() {
        assert_eq!(
            redact_secret_like(
                "corp-login failed for AKIAIOSFODNN7EXAMPLE (secret \
                 wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY); run corp-login --renew"
            ),
            "corp-login failed for <redacted> (secret <redacted>); run corp-login --renew"
        );
        // A JWT's parts, a long token, a hex digest; plain words and short ids stay.
        assert_eq!(
            redact_secret_like("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0 ok"),
            "<redacted>.<redacted> ok"
        );
        assert_eq!(
            redact_secret_like("token expired at step 12, credential_process_helper: éèà"),
            "token expired at step 12, credential_process_helper: éèà"
        );
        assert_eq!(
            redact_secret_like("sha 9f86d081884c7d659a2feaa0c55ad015"),
            "sha <redacted>"
        );
    }
}
