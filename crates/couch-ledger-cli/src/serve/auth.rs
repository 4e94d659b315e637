//! API keys: with any configured, every `/v1` request needs `Authorization: Bearer <key>`.
//!
//! Keys are kept only as SHA-256 digests and a presented key is compared with every one of
//! them in constant time (`subtle`), so neither the time an answer takes nor a memory dump
//! tells a key. Keys never appear in logs or errors.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use super::error::ApiError;
use crate::cli::UsageError;

/// Keys shorter than this are refused at start: a guessable key is no protection.
const KEY_CHARS_MIN: usize = 16;

/// The accepted keys, as digests.
#[derive(Default)]
pub(crate) struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

impl ApiKeys {
    /// The keys of `file` (one a line; blank lines and `#` comments skipped) and of `env`
    /// (comma-separated).
    ///
    /// # Errors
    ///
    /// The file cannot be read or holds no key; a key shorter than [`KEY_CHARS_MIN`].
    pub(crate) fn load(file: Option<&Path>, env: Option<&str>) -> Result<ApiKeys, UsageError> {
        let mut keys: Vec<String> = Vec::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| UsageError::new(format!("--api-keys-file {}: {e}", path.display())))?;
            let before = keys.len();
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
            if keys.len() == before {
                return Err(UsageError::new(format!(
                    "--api-keys-file {} holds no key (one a line)",
                    path.display()
                )));
            }
        }
        if let Some(env) = env {
            keys.extend(
                env.split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned),
            );
        }
        if let Some(i) = keys.iter().position(|k| k.chars().count() < KEY_CHARS_MIN) {
            return Err(UsageError::new(format!(
                "API key number {} is shorter than {KEY_CHARS_MIN} characters",
                i + 1
            )));
        }
        Ok(ApiKeys {
            digests: keys.iter().map(|k| digest(k)).collect(),
        })
    }

    /// Keys are configured: `/v1` needs one.
    pub(crate) fn required(&self) -> bool {
        !self.digests.is_empty()
    }

    /// `presented` is one of the keys. Every key is compared, in constant time.
    pub(crate) fn accepts(&self, presented: &str) -> bool {
        let d = digest(presented);
        let mut found = Choice::from(0);
        for k in &self.digests {
            found |= k.ct_eq(&d);
        }
        found.into()
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The middleware in front of `/v1`: 401 without a configured key.
pub(crate) async fn require_key(
    State(keys): State<Arc<ApiKeys>>,
    req: Request,
    next: Next,
) -> Response {
    if !keys.required() {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match presented {
        Some(key) if keys.accepts(key) => next.run(req).await,
        _ => ApiError::unauthorized().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_from_a_file_and_the_environment() {
        let dir = std::env::temp_dir().join(format!("keys-{}", std::process::id()));
        std::fs::write(
            &dir,
            "# ops\nkey-one-0123456789abcdef\n\n  key-two-0123456789abcdef  \n",
        )
        .unwrap();
        let keys = ApiKeys::load(Some(&dir), Some("key-three-0123456789abc, ,")).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert!(keys.required());
        for k in [
            "key-one-0123456789abcdef",
            "key-two-0123456789abcdef",
            "key-three-0123456789abc",
        ] {
            assert!(keys.accepts(k), "{k}");
        }
        assert!(!keys.accepts("key-one-0123456789abcde"));
        assert!(!keys.accepts(""));
        assert!(!format!("{keys:?}").contains("key-one"));
        assert!(ApiKeys::load(None, Some("short")).is_err());
        assert!(!ApiKeys::load(None, None).unwrap().required());
    }
}
