//! `ClientBuilder`: the one way to configure a [`Client`](crate::Client).
//!
//! The bottom floor with `error` and `observe`: it imports nothing of the HTTP layer.
//! [`ClientBuilder::build`] is defined in `couch.rs`, which turns the validated [`Settings`]
//! into a client, so the dependency runs one way (couch → config).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;

use crate::error::{Error, Result};
use crate::observe::Observer;

/// The server URL used when none is given (CouchDB's default port on loopback).
pub const DEFAULT_URL: &str = "http://127.0.0.1:5984";
/// The database used when none is given.
pub const DEFAULT_DATABASE: &str = "ledger";
/// IBM Cloud's IAM token endpoint, where an API key is exchanged for a bearer token.
pub const DEFAULT_IAM_TOKEN_URL: &str = "https://iam.cloud.ibm.com/identity/token";

/// User and password for basic or cookie authentication.
#[derive(Clone)]
pub(crate) struct Auth {
    pub(crate) user: String,
    pub(crate) password: SecretString,
    pub(crate) cookie: bool,
}

/// An IBM Cloud IAM API key and where to exchange it for bearer tokens.
pub(crate) struct Iam {
    pub(crate) api_key: SecretString,
    pub(crate) token_url: url::Url,
}

/// What [`ClientBuilder`] validated, for `couch.rs` to build a client from.
pub(crate) struct Settings {
    pub(crate) http: reqwest::Client,
    /// Server URL with a trailing slash and no credentials.
    pub(crate) base: url::Url,
    pub(crate) database: String,
    pub(crate) auth: Option<Auth>,
    pub(crate) iam: Option<Iam>,
    pub(crate) retry: RetryPolicy,
    pub(crate) request_timeout: Duration,
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    #[cfg(feature = "testing")]
    pub(crate) transport: Option<Arc<dyn crate::wire::Transport>>,
}

/// How transient failures are retried: capped exponential backoff with full jitter, honouring a
/// server's `Retry-After` up to `retry_after_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 = never retry).
    pub retries_max: u32,
    /// Backoff before the first retry; doubles each time, before jitter.
    pub delay_base: Duration,
    /// Upper bound of one backoff.
    pub delay_max: Duration,
    /// Upper bound of a wait asked for by `Retry-After`.
    pub retry_after_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries_max: 6,
            delay_base: Duration::from_millis(50),
            delay_max: Duration::from_secs(2),
            retry_after_max: Duration::from_secs(30),
        }
    }
}

/// Builds a [`Client`](crate::Client). Consuming and `#[must_use]`; the first configuration
/// error is kept and reported by [`ClientBuilder::build`].
///
/// ```no_run
/// # async fn f() -> couch_ledger::Result<()> {
/// use std::time::Duration;
/// let client = couch_ledger::Client::builder()
///     .url("http://127.0.0.1:5984")
///     .database("ledger")
///     .basic_auth("admin", "secret")
///     .request_timeout(Duration::from_secs(30))
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use]
pub struct ClientBuilder {
    url: String,
    database: String,
    user: Option<String>,
    password: Option<SecretString>,
    cookie: bool,
    iam_api_key: Option<SecretString>,
    iam_token_url: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    call_timeout: Option<Duration>,
    retry: RetryPolicy,
    observer: Option<Arc<dyn Observer>>,
    #[cfg(feature = "testing")]
    transport: Option<Arc<dyn crate::wire::Transport>>,
    error: Option<Error>,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &redact_url(&self.url))
            .field("database", &self.database)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "_"))
            .field("cookie", &self.cookie)
            .field("iam_api_key", &self.iam_api_key.as_ref().map(|_| "_"))
            .field("iam_token_url", &self.iam_token_url)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("retry", &self.retry)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            url: DEFAULT_URL.to_owned(),
            database: DEFAULT_DATABASE.to_owned(),
            user: None,
            password: None,
            cookie: false,
            iam_api_key: None,
            iam_token_url: DEFAULT_IAM_TOKEN_URL.to_owned(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            call_timeout: None,
            retry: RetryPolicy::default(),
            observer: None,
            #[cfg(feature = "testing")]
            transport: None,
            error: None,
        }
    }
}

impl ClientBuilder {
    /// The server's URL (`http://host:port`, optionally with a path prefix). Credentials in the
    /// URL (`http://user:pass@host`) are taken out of it and used as basic auth.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = url.into();
        self
    }

    /// The database every call of the client works on.
    pub fn database(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        if let Err(e) = validate_database_name(&name) {
            self.error.get_or_insert(e);
        }
        self.database = name;
        self
    }

    /// HTTP basic authentication on every request. The password is kept as a
    /// [`secrecy::SecretString`]: never in `Debug` output, zeroed when dropped.
    pub fn basic_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(SecretString::from(password.into()));
        self.cookie = false;
        self
    }

    /// Cookie authentication: log in once with `POST /_session`, send the `AuthSession` cookie,
    /// log in again when the server answers 401.
    pub fn cookie_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(SecretString::from(password.into()));
        self.cookie = true;
        self
    }

    /// IBM Cloud IAM authentication (Cloudant's recommended kind): `key` is exchanged at the
    /// token endpoint ([`ClientBuilder::iam_token_url`]) for a bearer token, sent as
    /// `Authorization: Bearer …`, refreshed before it expires, and fetched anew once when the
    /// server answers 401. Takes the place of any user and password (also those in the URL).
    pub fn iam_api_key(mut self, key: impl Into<String>) -> Self {
        self.iam_api_key = Some(SecretString::from(key.into()));
        self
    }

    /// The IAM token endpoint [default: [`DEFAULT_IAM_TOKEN_URL`]].
    pub fn iam_token_url(mut self, url: impl Into<String>) -> Self {
        self.iam_token_url = url.into();
        self
    }

    /// Time allowed to open a TCP connection.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Time allowed for one request, from sending to the end of the body.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Time allowed for one call, its retries included [default: none: each try has the
    /// request timeout, and tries follow the retry policy]. With it, no try is waited on past
    /// this much time after the call began, and no retry starts that could not; a call that
    /// waits for a change (a longpoll) gets its own wait on top. A command line sets it so that
    /// a server that accepts connections and never answers fails the command in about this
    /// long, rather than in one request timeout per try.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// How transient failures are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Tells `observer` about every HTTP request the client sends (latency, status, retries)
    /// and every conflict inside a `_bulk_docs` reply: the hook a service's metrics hang on.
    /// Clients made from this one with [`Client::with_database`](crate::Client::with_database)
    /// keep it.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Sends every request through `transport` instead of HTTP (feature `testing`: a simulated
    /// server). Clients made from this one with [`Client::with_database`] keep it.
    #[cfg(feature = "testing")]
    pub fn transport(mut self, transport: Arc<dyn crate::wire::Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Validates the configuration (the work of [`ClientBuilder::build`]).
    pub(crate) fn settings(self) -> Result<Settings> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let (url, in_url) = base_url(&self.url)?;
        let mut user = self.user;
        let mut password = self.password;
        if let Some((url_user, url_password)) = in_url {
            if user.is_none() {
                user = Some(url_user);
                password = Some(url_password);
            }
        }
        if self.connect_timeout.is_zero()
            || self.request_timeout.is_zero()
            || self.call_timeout.is_some_and(|t| t.is_zero())
        {
            return Err(Error::config("timeouts must be longer than zero"));
        }
        let iam = match self.iam_api_key {
            Some(api_key) => Some(Iam {
                api_key,
                token_url: token_url(&self.iam_token_url)?,
            }),
            None => None,
        };
        let auth = match (user, password) {
            // IAM replaces a user and password.
            _ if iam.is_some() => None,
            (Some(user), password) => Some(Auth {
                user,
                password: password.unwrap_or_else(|| SecretString::from("")),
                cookie: self.cookie,
            }),
            (None, _) => None,
        };
        let http = http_client(self.connect_timeout, self.request_timeout)?;
        Ok(Settings {
            http,
            base: url,
            database: self.database,
            auth,
            iam,
            retry: self.retry,
            request_timeout: self.request_timeout,
            call_timeout: self.call_timeout,
            observer: self.observer,
            #[cfg(feature = "testing")]
            transport: self.transport,
        })
    }
}

/// The server's URL as a client keeps it (its path ending in `/`, no query or fragment), and
/// the user and password it carried, decoded, if any.
fn base_url(text: &str) -> Result<(url::Url, Option<(String, SecretString)>)> {
    let mut url = url::Url::parse(text).map_err(|e| Error::config(format!("URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(Error::config("URL: the scheme must be http or https"));
    }
    if url.cannot_be_a_base() || url.host().is_none() {
        return Err(Error::config("URL: needs a host"));
    }
    let mut credentials = None;
    if !url.username().is_empty() {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        credentials = Some((
            decode(url.username()),
            decode(url.password().unwrap_or("")).into(),
        ));
        // Credentials never stay in a URL: URLs end up in errors and logs.
        let _ = url.set_username("");
        let _ = url.set_password(None);
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    url.set_query(None);
    url.set_fragment(None);
    Ok((url, credentials))
}

/// The IAM token endpoint's URL, checked.
fn token_url(text: &str) -> Result<url::Url> {
    let token_url =
        url::Url::parse(text).map_err(|e| Error::config(format!("IAM token URL: {e}")))?;
    if token_url.scheme() != "http" && token_url.scheme() != "https" {
        return Err(Error::config(
            "IAM token URL: the scheme must be http or https",
        ));
    }
    Ok(token_url)
}

/// The HTTP client every request of a client goes through.
fn http_client(connect_timeout: Duration, request_timeout: Duration) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .timeout(request_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        // The same wire behaviour in every build: a dev-dependency (couch_rs) turns on
        // reqwest's gzip feature in test builds, and a gzipped continuous `_changes` feed is
        // held back by the server's compressor until it fills a block.
        .no_gzip()
        .build()
        .map_err(|e| Error::config("HTTP client").with_source(crate::error::scrub(e)))
}

/// The URL as text with any password replaced by `_` (`<invalid URL>` when it is not one), for
/// logs, `Debug` output and messages.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("_"));
            }
            u.to_string()
        }
        Err(_) => "<invalid URL>".to_owned(),
    }
}

/// CouchDB's rule for database names: a lower-case letter, then lower-case letters, digits and
/// `_ $ ( ) + - /`.
pub(crate) fn validate_database_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok =
        chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_$()+-/".contains(c));
    if !first_ok || !rest_ok || name.len() > 238 {
        return Err(Error::invalid(
            "database",
            format!(
                "{name:?}: use a lower-case letter, then lower-case letters, digits or _$()+-/"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redact_url("http://u:secret@h:1/"), "http://u:_@h:1/");
        assert_eq!(redact_url("http://h:1"), "http://h:1/");
        assert_eq!(redact_url("not a url"), "<invalid URL>");
    }

    use super::*;

    #[test]
    fn credentials_in_the_url_are_moved_out_of_it() {
        let b = ClientBuilder::default().url("http://admin:s3cret@127.0.0.1:5984");
        let debug = format!("{b:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        let client = b.build().unwrap();
        let debug = format!("{client:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("admin"), "{debug}");
    }

    #[test]
    fn bad_configuration_is_kept_until_build() {
        let e = ClientBuilder::default()
            .database("Bad Name")
            .build()
            .unwrap_err();
        assert!(e.is_invalid_input());
        let e = ClientBuilder::default().url("ftp://x").build().unwrap_err();
        assert!(e.to_string().contains("scheme"), "{e}");
        let e = ClientBuilder::default()
            .request_timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("timeouts"), "{e}");
    }
}
