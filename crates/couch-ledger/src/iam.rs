//! IBM Cloud IAM: an API key exchanged for bearer tokens (Cloudant's recommended
//! authentication), on the wire floor beside `couch.rs`.
//!
//! `POST {token_url}` with the form `grant_type=urn:ibm:params:oauth:grant-type:apikey&apikey=…`
//! answers `{access_token, expires_in, expiration, …}`. A token is reused until little of its
//! life is left ([`refresh_margin`]), then fetched again; the client asks for a new one when the
//! server answers 401 with the one it sent ([`TokenSource::token`] with `stale`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;

use crate::config::Iam;
use crate::error::{is_transient_status, scrub, Error, Result};

/// A token is replaced when less than a tenth of its lifetime or a minute, whichever is more,
/// is left ([`refresh_margin`]); never before half-way, so a short-lived token is still reused.
const REFRESH_MARGIN_MIN: Duration = Duration::from_secs(60);
const REFRESH_LIFETIME_DIVISOR: u32 = 10;

/// A bearer token and which one it is (a counter), so a 401 can ask to replace exactly the
/// token it was refused with, and not one another request has fetched meanwhile.
#[derive(Clone)]
pub(crate) struct Bearer {
    pub(crate) generation: u64,
    pub(crate) token: SecretString,
}

struct Current {
    bearer: Bearer,
    obtained: Instant,
    lifetime: Duration,
}

/// Hands out bearer tokens for one API key, one exchange at a time.
pub(crate) struct TokenSource {
    api_key: SecretString,
    token_url: url::Url,
    current: tokio::sync::Mutex<Option<Current>>,
}

impl TokenSource {
    pub(crate) fn new(iam: Iam) -> TokenSource {
        TokenSource {
            api_key: iam.api_key,
            token_url: iam.token_url,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The token to send: the current one while fresh, else a new one from the endpoint.
    /// With `stale`, the token of that generation was refused: a new one is fetched unless
    /// another request already replaced it.
    ///
    /// # Errors
    ///
    /// The endpoint refused the key (a 4xx: not transient), failed (5xx, 429, the network:
    /// transient), or answered something that is not a token.
    pub(crate) async fn token(&self, http: &reqwest::Client, stale: Option<u64>) -> Result<Bearer> {
        let mut current = self.current.lock().await;
        let generation = match current.as_ref() {
            Some(c) if stale == Some(c.bearer.generation) => c.bearer.generation + 1,
            Some(c) if c.obtained.elapsed() + refresh_margin(c.lifetime) < c.lifetime => {
                return Ok(c.bearer.clone());
            }
            Some(c) => c.bearer.generation + 1,
            None => 1,
        };
        let obtained = Instant::now();
        let (token, lifetime) = self.exchange(http).await?;
        tracing::debug!(generation, ?lifetime, "IAM token obtained");
        let bearer = Bearer { generation, token };
        *current = Some(Current {
            bearer: bearer.clone(),
            obtained,
            lifetime,
        });
        Ok(bearer)
    }

    async fn exchange(&self, http: &reqwest::Client) -> Result<(SecretString, Duration)> {
        let path = self.token_url.path().to_owned();
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "urn:ibm:params:oauth:grant-type:apikey")
            .append_pair("apikey", self.api_key.expose_secret())
            .finish();
        let response = http
            .post(self.token_url.clone())
            .header(ACCEPT, "application/json")
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                Error::transport(e.is_timeout())
                    .with_source(scrub(e))
                    .with_request("POST", &path)
            })?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| {
            Error::transport(e.is_timeout())
                .with_source(scrub(e))
                .with_request("POST", &path)
        })?;
        if !status.is_success() {
            let said = error_message(&bytes, self.api_key.expose_secret());
            let (error, reason) = if is_transient_status(status.as_u16()) {
                (
                    "iam_unavailable",
                    format!("the IAM token endpoint failed{said}"),
                )
            } else {
                (
                    "iam_key_refused",
                    format!("the IAM token endpoint refused the API key{said}"),
                )
            };
            return Err(
                Error::status(status.as_u16(), Some(error.to_owned()), Some(reason))
                    .with_request("POST", &path),
            );
        }
        #[derive(Deserialize)]
        struct Reply {
            access_token: String,
            expires_in: Option<u64>,
            expiration: Option<u64>,
        }
        let reply: Reply = serde_json::from_slice(&bytes).map_err(|e| {
            Error::decode(format!("IAM token reply: {e}")).with_request("POST", &path)
        })?;
        let lifetime = match (reply.expires_in, reply.expiration) {
            (Some(secs), _) => Duration::from_secs(secs),
            (None, Some(at)) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                Duration::from_secs(at.saturating_sub(now))
            }
            (None, None) => {
                return Err(
                    Error::decode("IAM token reply without expires_in or expiration")
                        .with_request("POST", &path),
                )
            }
        };
        if reply.access_token.is_empty() {
            return Err(Error::decode("IAM token reply with an empty access_token")
                .with_request("POST", &path));
        }
        Ok((SecretString::from(reply.access_token), lifetime))
    }
}

/// How long before its end a token of `lifetime` is replaced: a tenth of it or a minute,
/// whichever is more, but at most half of it.
pub(crate) fn refresh_margin(lifetime: Duration) -> Duration {
    (lifetime / REFRESH_LIFETIME_DIVISOR)
        .max(REFRESH_MARGIN_MIN)
        .min(lifetime / 2)
}

/// `: <the endpoint's errorMessage>` (IAM's error shape), without the key should an endpoint
/// echo it; empty when there is none.
fn error_message(body: &[u8], key: &str) -> String {
    #[derive(Deserialize)]
    struct Body {
        #[serde(rename = "errorMessage")]
        error_message: Option<String>,
    }
    let message = serde_json::from_slice::<Body>(body)
        .ok()
        .and_then(|b| b.error_message)
        .map(|m| m.chars().take(200).collect::<String>());
    match message {
        Some(m) if !key.is_empty() => format!(": {}", m.replace(key, "_")),
        Some(m) => format!(": {m}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margins() {
        let h = Duration::from_secs(3600);
        assert_eq!(refresh_margin(h), Duration::from_secs(360));
        assert_eq!(
            refresh_margin(Duration::from_secs(300)),
            Duration::from_secs(60)
        );
        assert_eq!(
            refresh_margin(Duration::from_secs(4)),
            Duration::from_secs(2)
        );
        assert_eq!(refresh_margin(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn an_echoed_key_is_blanked() {
        let body = br#"{"errorCode":"BXNIM0415E","errorMessage":"Provided API key k3y-XYZ could not be found"}"#;
        let m = error_message(body, "k3y-XYZ");
        assert_eq!(m, ": Provided API key _ could not be found");
        assert_eq!(error_message(b"<html>", "k"), "");
    }
}
