//! CouchDB's HTTP API over reqwest: requests, status → error mapping, retries.
//!
//! This layer knows the wire protocol and nothing about money. Every request sends
//! `Content-Type` and `Accept: application/json` (pouchdb-server stores an empty document for a
//! PUT without `Content-Type`), document ids are percent-encoded, and only requests that are safe
//! to repeat are retried.
//!
//! Long, and one file on purpose: it is the whole wire floor, the client and every CouchDB
//! endpoint the ledger calls (server and database, documents, views, `_changes`), all going
//! through the one request path at the top (`send`: retries, deadlines, status → error);
//! split, each endpoint would sit apart from the path that gives it its errors.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{
    HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, COOKIE, RETRY_AFTER, SET_COOKIE,
};
use reqwest::{Method, StatusCode};
use secrecy::ExposeSecret as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::{Auth, ClientBuilder, RetryPolicy};
use crate::error::{is_transient_status, scrub, Error, Result};
use crate::iam::{Bearer, TokenSource};
use crate::observe::{Observer, RequestEvent, RetryEvent};
#[cfg(feature = "testing")]
use crate::wire::Transport;
#[cfg(feature = "testing")]
use crate::wire::WireRequest;
use crate::wire::{WireFailure, WireReply};

/// Everything but RFC 3986's unreserved characters is encoded in a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A CouchDB client bound to one database. Cheap to clone (an `Arc`): create one and reuse it.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// Server URL with a trailing slash and no credentials.
    base: url::Url,
    database: String,
    auth: Option<Auth>,
    /// IAM bearer tokens, shared by clients made with [`Client::with_database`].
    iam: Option<Arc<TokenSource>>,
    /// `AuthSession=…` once logged in with cookie auth.
    session: Mutex<Option<String>>,
    retry: RetryPolicy,
    request_timeout: Duration,
    /// Time allowed for one call, retries included ([`ClientBuilder::call_timeout`]).
    call_timeout: Option<Duration>,
    /// HTTP requests sent (attempts, retries included).
    requests: AtomicU64,
    /// Told about every attempt and every `_bulk_docs` conflict (metrics).
    observer: Option<Arc<dyn Observer>>,
    /// Where requests go instead of HTTP (a simulated server).
    #[cfg(feature = "testing")]
    transport: Option<Arc<dyn Transport>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.inner.base.as_str())
            .field("database", &self.inner.database)
            .field("user", &self.inner.auth.as_ref().map(|a| a.user.as_str()))
            .field("password", &self.inner.auth.as_ref().map(|_| "_"))
            .field("iam", &self.inner.iam.is_some())
            .finish()
    }
}

/// Whether a request may be sent again when its outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Repeating it cannot cause a second effect (a read, a PUT of a fixed id, a CAS write).
    Safe,
    /// Sent at most once.
    Never,
}

/// The server's acknowledgement of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Document id.
    pub id: String,
    /// The new revision.
    pub rev: String,
    /// `true` on `202 Accepted`: the write was stored but a cluster did not reach its write
    /// quorum yet. The write is durable on at least one node; callers decide what that means.
    pub accepted: bool,
}

/// One document's outcome in a `_bulk_docs` reply.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BulkResult {
    /// Document id.
    pub id: Option<String>,
    /// New revision, when the document was written.
    pub rev: Option<String>,
    /// CouchDB's error for this document (`conflict`, `forbidden`…).
    pub error: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// Written, but a cluster did not reach its write quorum (`202 Accepted`, or `"accepted":
    /// true` on this document): it may have landed on one copy only, and may be in conflict
    /// with a rival write. Never take it as a plain success (docs/CLUSTER.md).
    #[serde(default)]
    pub accepted: bool,
}

impl BulkResult {
    /// The document was written.
    pub fn is_ok(&self) -> bool {
        self.error.is_none() && self.rev.is_some()
    }
    /// Its `_rev` was stale, or it exists already.
    pub fn is_conflict(&self) -> bool {
        self.error.as_deref() == Some("conflict")
    }
    /// Refused by `validate_doc_update`.
    pub fn is_forbidden(&self) -> bool {
        self.error.as_deref() == Some("forbidden")
    }
}

/// One row of `_all_docs`.
#[derive(Debug, Clone, Deserialize)]
pub struct AllDocsRow {
    /// The key asked for.
    pub key: Value,
    /// Document id, absent when it does not exist.
    pub id: Option<String>,
    /// `{rev, deleted?}`.
    pub value: Option<Value>,
    /// The document, with `include_docs`; `null` for a deleted one.
    pub doc: Option<Value>,
    /// `not_found` for a missing key.
    pub error: Option<String>,
}

/// Parameters of a view query. Unset fields are not sent.
#[derive(Debug, Clone, Default)]
pub struct ViewQuery {
    /// Only rows with this key.
    pub key: Option<Value>,
    /// Only rows with these keys (sent as a POST body).
    pub keys: Option<Vec<Value>>,
    /// First key.
    pub start_key: Option<Value>,
    /// Last key (inclusive unless `inclusive_end` is false).
    pub end_key: Option<Value>,
    /// Include `end_key`.
    pub inclusive_end: Option<bool>,
    /// Start at this document id among rows of `start_key`.
    pub start_key_doc_id: Option<String>,
    /// Group by key.
    pub group: Option<bool>,
    /// Group by the first N elements of an array key.
    pub group_level: Option<u32>,
    /// `false` to get map rows of a view with a reduce.
    pub reduce: Option<bool>,
    /// Include each row's document.
    pub include_docs: Option<bool>,
    /// With `include_docs`: each document carries `_conflicts`, its losing leaves' revisions.
    pub conflicts: Option<bool>,
    /// At most this many rows.
    pub limit: Option<u64>,
    /// Skip this many rows.
    pub skip: Option<u64>,
    /// Reverse order.
    pub descending: Option<bool>,
    /// `true`, `false` or `lazy` (CouchDB; pouchdb-server ignores `false`).
    pub update: Option<&'static str>,
}

/// One view row.
#[derive(Debug, Clone, Deserialize)]
pub struct ViewRow {
    /// Source document id (absent in reduced rows).
    pub id: Option<String>,
    /// Emitted key.
    #[serde(default)]
    pub key: Value,
    /// Emitted or reduced value.
    #[serde(default)]
    pub value: Value,
    /// With `include_docs`.
    pub doc: Option<Value>,
}

/// A view's reply.
#[derive(Debug, Clone, Deserialize)]
pub struct ViewResponse {
    /// Rows of the view (map rows) — absent for reduced results.
    pub total_rows: Option<u64>,
    /// Offset of the first row.
    pub offset: Option<u64>,
    /// The rows.
    pub rows: Vec<ViewRow>,
}

/// Parameters of a `_changes` request.
#[derive(Debug, Clone, Default)]
pub struct ChangesQuery {
    /// Sequence to start after (`now` for only new changes); `None` = from the beginning.
    pub since: Option<Value>,
    /// Wait for a change (longpoll) up to `timeout`.
    pub longpoll: bool,
    /// Longpoll / continuous wait. The client also puts its own deadline on the request, since
    /// pouchdb-server does not honour `timeout`.
    pub timeout: Option<Duration>,
    /// At most this many rows.
    pub limit: Option<u64>,
    /// Include the documents.
    pub include_docs: bool,
    /// Only documents that the view `(ddoc, view)` maps (`filter=_view`).
    pub view: Option<(String, String)>,
    /// Only these documents (`filter=_doc_ids`).
    pub doc_ids: Option<Vec<String>>,
    /// With `include_docs`: each document carries `_conflicts`, the revisions that lost to
    /// it (a cluster's concurrent writes, or replication).
    pub conflicts: bool,
}

/// One change.
#[derive(Debug, Clone, Deserialize)]
pub struct ChangeRow {
    /// Its sequence (opaque: a number or a string).
    pub seq: Value,
    /// Document id.
    pub id: String,
    /// `[{rev}]`.
    #[serde(default)]
    pub changes: Vec<Value>,
    /// The document was deleted.
    #[serde(default)]
    pub deleted: bool,
    /// With `include_docs`.
    pub doc: Option<Value>,
}

/// A `_changes` reply.
#[derive(Debug, Clone, Deserialize)]
pub struct ChangesResponse {
    /// The changes.
    pub results: Vec<ChangeRow>,
    /// Where to continue from.
    pub last_seq: Value,
}

/// A continuous `_changes` feed, read one row at a time.
pub struct ChangesStream {
    /// The response still being read; `None` once a transport gave the whole body at once.
    response: Option<reqwest::Response>,
    buffer: Vec<u8>,
    done: bool,
}

impl ChangesStream {
    /// The next change; `None` when the server ended the feed (its `last_seq` line, or the
    /// connection closed).
    ///
    /// # Errors
    ///
    /// The connection broke or a line was not a change.
    pub async fn next(&mut self) -> Option<Result<ChangeRow>> {
        loop {
            if let Some(pos) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=pos).collect();
                let line = trim_ascii(&line);
                if line.is_empty() {
                    continue; // heartbeat
                }
                let value: Value = match serde_json::from_slice(line) {
                    Ok(v) => v,
                    Err(e) => return Some(Err(Error::decode(format!("changes line: {e}")))),
                };
                if value.get("last_seq").is_some() && value.get("id").is_none() {
                    self.done = true;
                    return None;
                }
                return Some(
                    serde_json::from_value(value)
                        .map_err(|e| Error::decode(format!("changes row: {e}"))),
                );
            }
            if self.done {
                return None;
            }
            let Some(response) = self.response.as_mut() else {
                self.done = true;
                if trim_ascii(&self.buffer).is_empty() {
                    return None;
                }
                self.buffer.push(b'\n');
                continue;
            };
            match response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => {
                    self.done = true;
                    if trim_ascii(&self.buffer).is_empty() {
                        return None;
                    }
                    self.buffer.push(b'\n');
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(Error::transport(e.is_timeout()).with_source(scrub(e))));
                }
            }
        }
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

/// What sending a request gave: an HTTP response whose body is still to be read, or a
/// transport's whole answer.
enum Sent {
    Http(reqwest::Response),
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Whole(WireReply),
}

fn wire_failure(e: reqwest::Error) -> WireFailure {
    WireFailure {
        timeout: e.is_timeout(),
        source: Box::new(scrub(e)),
    }
}

/// A reply with a success status.
struct Reply {
    status: StatusCode,
    body: Vec<u8>,
}

/// One call's tries: its bounds, and what the tries so far leave for the next.
struct Call<'a> {
    method: &'a Method,
    path: &'a str,
    policy: RetryPolicy,
    /// The call's own time for one try (a longpoll waiting for a change), if any.
    timeout: Option<Duration>,
    started: Instant,
    /// The whole call's bound, retries included.
    deadline: Option<Instant>,
    /// Tries so far that were retried.
    attempt: u32,
    /// Logged in again, or given a new IAM token, after a 401: once a call.
    relogged: bool,
    /// The IAM token a 401 refused, to be replaced before the next attempt.
    refused: Option<u64>,
}

/// What one try leaves its call to do.
enum Tried {
    /// The call's answer: a reply, or the error that stands.
    Done(Result<Reply>),
    /// Try again (any wait a retry calls for already waited).
    Again,
}

impl<'a> Call<'a> {
    fn new(
        method: &'a Method,
        path: &'a str,
        policy: RetryPolicy,
        call_timeout: Option<Duration>,
        timeout: Option<Duration>,
    ) -> Call<'a> {
        let started = Instant::now();
        // The whole call's bound, retries included; a call with a longer time of its own (a
        // longpoll waiting for a change) keeps it.
        let deadline = call_timeout.map(|c| started + c.max(timeout.unwrap_or_default()));
        Call {
            method,
            path,
            policy,
            timeout,
            started,
            deadline,
            attempt: 0,
            relogged: false,
            refused: None,
        }
    }

    /// Whether a retry after `delay` still fits in the call's time.
    fn fits(&self, delay: Duration) -> bool {
        self.deadline.is_none_or(|d| Instant::now() + delay < d)
    }

    /// Each try has the request timeout, and no more than what is left of the call's.
    fn try_timeout(&self, request_timeout: Duration) -> Option<Duration> {
        match self.deadline {
            Some(d) => Some(
                self.timeout
                    .unwrap_or(request_timeout)
                    .min(d.saturating_duration_since(Instant::now())),
            ),
            None => self.timeout,
        }
    }

    /// The IAM token endpoint failed. Nothing was sent to the server: a failing token endpoint
    /// is retried for any request, a refused key (not transient) is final.
    async fn token_failed(&mut self, err: Error) -> Tried {
        if err.is_transient()
            && self.attempt < self.policy.retries_max
            && self.fits(backoff(&self.policy, self.attempt))
        {
            tracing::debug!(
                attempt = self.attempt,
                "IAM token endpoint failed, retrying: {err}"
            );
            self.wait(backoff(&self.policy, self.attempt)).await;
            return Tried::Again;
        }
        Tried::Done(Err(err))
    }

    /// Waits `delay` before the next try, and counts the one retried.
    async fn wait(&mut self, delay: Duration) {
        tokio::time::sleep(delay).await;
        self.attempt += 1;
    }
}

impl ClientBuilder {
    /// Builds the client. No request is sent (an IAM key is exchanged on the first request).
    ///
    /// # Errors
    ///
    /// An invalid URL, token URL or database name, a zero timeout, or a TLS backend that
    /// fails to start.
    pub fn build(self) -> Result<Client> {
        let s = self.settings()?;
        let iam = s.iam.map(|iam| Arc::new(TokenSource::new(iam)));
        let client = Client::from_parts(
            s.http,
            s.base,
            s.database,
            s.auth,
            iam,
            s.retry,
            s.request_timeout,
            s.call_timeout,
            s.observer,
        );
        #[cfg(feature = "testing")]
        let client = client.with_transport(s.transport);
        Ok(client)
    }
}

impl Client {
    /// Starts configuring a client.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        http: reqwest::Client,
        base: url::Url,
        database: String,
        auth: Option<Auth>,
        iam: Option<Arc<TokenSource>>,
        retry: RetryPolicy,
        request_timeout: Duration,
        call_timeout: Option<Duration>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Client {
        Client {
            inner: Arc::new(Inner {
                http,
                base,
                database,
                auth,
                iam,
                session: Mutex::new(None),
                retry,
                request_timeout,
                call_timeout,
                requests: AtomicU64::new(0),
                observer,
                #[cfg(feature = "testing")]
                transport: None,
            }),
        }
    }

    /// This client with requests going to `transport` instead of HTTP.
    #[cfg(feature = "testing")]
    fn with_transport(self, transport: Option<Arc<dyn Transport>>) -> Client {
        let Some(transport) = transport else {
            return self;
        };
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|_| unreachable!("new client"));
        inner.transport = Some(transport);
        Client {
            inner: Arc::new(inner),
        }
    }

    /// The same server and credentials, another database. Shares the connection pool; has its
    /// own request counter.
    ///
    /// # Errors
    ///
    /// An invalid database name.
    pub fn with_database(&self, name: &str) -> Result<Client> {
        crate::config::validate_database_name(name)?;
        let client = Client::from_parts(
            self.inner.http.clone(),
            self.inner.base.clone(),
            name.to_owned(),
            self.inner.auth.clone(),
            self.inner.iam.clone(),
            self.inner.retry,
            self.inner.request_timeout,
            self.inner.call_timeout,
            self.inner.observer.clone(),
        );
        #[cfg(feature = "testing")]
        let client = client.with_transport(self.inner.transport.clone());
        Ok(client)
    }

    /// The database this client works on.
    pub fn database(&self) -> &str {
        &self.inner.database
    }

    /// The server URL, without credentials.
    pub fn url(&self) -> &str {
        self.inner.base.as_str()
    }

    /// HTTP requests this client has sent so far, every retry counted.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    fn db_path(&self) -> String {
        utf8_percent_encode(&self.inner.database, SEGMENT).to_string()
    }

    /// `db/<encoded id>`, refusing ids CouchDB reserves.
    fn doc_path(&self, id: &str) -> Result<String> {
        Ok(format!("{}/{}", self.db_path(), encode_doc_id(id)?))
    }

    // ---- requests -------------------------------------------------------------------------

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
        retry: Retry,
    ) -> Result<Reply> {
        self.send_with_timeout(method, path, query, body, retry, None)
            .await
    }

    /// One call: tries until an answer stands, the retry policy gives up or the call's time is
    /// up. `timeout` is the call's own time for one try (a longpoll waiting for a change).
    async fn send_with_timeout(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
        retry: Retry,
        timeout: Option<Duration>,
    ) -> Result<Reply> {
        let mut call = Call::new(
            &method,
            path,
            self.inner.retry,
            self.inner.call_timeout,
            timeout,
        );
        loop {
            let bearer = match self.bearer(call.refused.take()).await {
                Ok(bearer) => bearer,
                Err(err) => match call.token_failed(err).await {
                    Tried::Done(result) => return result,
                    Tried::Again => continue,
                },
            };
            let try_timeout = call.try_timeout(self.inner.request_timeout);
            let started = Instant::now();
            let response = self
                .attempt(
                    &method,
                    path,
                    query,
                    body.as_deref(),
                    try_timeout,
                    bearer.as_ref(),
                )
                .await;
            let retries_left = retry == Retry::Safe && call.attempt < call.policy.retries_max;
            let tried = match response {
                Err(failure) => self.failed(&mut call, started, failure, retries_left).await,
                Ok(reply) => {
                    self.answered(&mut call, started, reply, bearer.as_ref(), retries_left)
                        .await
                }
            };
            match tried {
                Tried::Done(result) => return result,
                Tried::Again => {}
            }
        }
    }

    /// A try (begun at `started`) that got no answer, a transport error or its timeout:
    /// retried when the request is safe to repeat, tries are left and the wait fits in the
    /// call's time.
    async fn failed(
        &self,
        call: &mut Call<'_>,
        started: Instant,
        failure: WireFailure,
        retries_left: bool,
    ) -> Tried {
        self.observed(call, started, None);
        let mut err = Error::transport(failure.timeout)
            .with_source(failure.source)
            .with_server(self.inner.base.as_str())
            .with_request(call.method.as_str(), call.path);
        if failure.timeout {
            err = err.with_waited(call.started.elapsed());
        }
        let delay = backoff(&call.policy, call.attempt);
        if !(retries_left && call.fits(delay)) {
            return Tried::Done(Err(err));
        }
        tracing::debug!(
            method = %call.method,
            path = call.path,
            attempt = call.attempt,
            "transport error, retrying: {err}"
        );
        self.retrying(call, started, None, failure.timeout, delay);
        call.wait(delay).await;
        Tried::Again
    }

    /// A try (begun at `started`) that got an answer: a success is the call's reply; a 401
    /// logs in again, or takes a new IAM token, once a call; a transient status is retried
    /// like a failed try, after at least the wait the server asked for (`Retry-After`,
    /// capped); any other status is the call's error.
    async fn answered(
        &self,
        call: &mut Call<'_>,
        started: Instant,
        reply: WireReply,
        bearer: Option<&Bearer>,
        retries_left: bool,
    ) -> Tried {
        self.observed(call, started, Some(reply.status));
        let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
        if status.is_success() {
            return Tried::Done(Ok(Reply {
                status,
                body: reply.body,
            }));
        }
        if status == StatusCode::UNAUTHORIZED && !call.relogged && self.uses_cookie() {
            // The session expired: log in again once, then repeat the request.
            call.relogged = true;
            self.clear_session();
            return Tried::Again;
        }
        if status == StatusCode::UNAUTHORIZED && !call.relogged {
            if let Some(b) = bearer {
                // The token expired or was revoked early: a new one, once.
                call.relogged = true;
                call.refused = Some(b.generation);
                return Tried::Again;
            }
        }
        let err = self
            .lockout(status_error(status, &reply.body))
            .with_request(call.method.as_str(), call.path);
        let mut delay = backoff(&call.policy, call.attempt);
        if let Some(wait) = reply.retry_after {
            delay = delay.max(wait.min(call.policy.retry_after_max));
        }
        if !(retries_left && is_transient_status(status.as_u16()) && call.fits(delay)) {
            return Tried::Done(Err(err));
        }
        tracing::debug!(
            method = %call.method,
            path = call.path,
            attempt = call.attempt,
            ?delay,
            "transient status, retrying: {err}"
        );
        self.retrying(call, started, Some(status.as_u16()), false, delay);
        call.wait(delay).await;
        Tried::Again
    }

    /// Tells the observer, if any, how the try begun at `started` ended: its status, or none
    /// without an answer.
    fn observed(&self, call: &Call<'_>, started: Instant, status: Option<u16>) {
        if let Some(observer) = &self.inner.observer {
            observer.request(&RequestEvent {
                method: call.method.as_str(),
                status,
                elapsed: started.elapsed(),
                attempt: call.attempt,
            });
        }
    }

    /// Tells the observer, if any, that the try begun at `started` is retried after `delay`.
    /// Told before the wait, so a person can be told why nothing happens.
    fn retrying(
        &self,
        call: &Call<'_>,
        started: Instant,
        status: Option<u16>,
        timed_out: bool,
        delay: Duration,
    ) {
        if let Some(observer) = &self.inner.observer {
            observer.retrying(&RetryEvent {
                method: call.method.as_str(),
                path: call.path,
                server: self.inner.base.as_str(),
                next_try: call.attempt + 2,
                tries_max: call.policy.retries_max + 1,
                status,
                timed_out,
                elapsed: started.elapsed(),
                delay,
                left: call
                    .deadline
                    .map(|d| d.saturating_duration_since(Instant::now() + delay)),
            });
        }
    }

    /// One exchange: the request, then the whole answer (or why none came).
    async fn attempt(
        &self,
        method: &Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&[u8]>,
        timeout: Option<Duration>,
        bearer: Option<&Bearer>,
    ) -> std::result::Result<WireReply, WireFailure> {
        let response = self
            .request(method, path, query, body, timeout, bearer)
            .await?;
        let response = match response {
            Sent::Http(response) => response,
            Sent::Whole(reply) => return Ok(reply),
        };
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        let body = response.bytes().await.map_err(wire_failure)?;
        Ok(WireReply {
            status,
            retry_after,
            body: body.to_vec(),
        })
    }

    /// Sends a request: the HTTP response still to be read, or a transport's whole answer.
    async fn request(
        &self,
        method: &Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&[u8]>,
        timeout: Option<Duration>,
        bearer: Option<&Bearer>,
    ) -> std::result::Result<Sent, WireFailure> {
        #[cfg(feature = "testing")]
        if let Some(transport) = &self.inner.transport {
            self.inner.requests.fetch_add(1, Ordering::Relaxed);
            let request = WireRequest {
                method: method.as_str().to_owned(),
                path: path.to_owned(),
                query: query
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone()))
                    .collect(),
                body: body.map(<[u8]>::to_vec),
                timeout,
            };
            return transport.exchange(request).await.map(Sent::Whole);
        }
        let mut url = self.inner.base.clone();
        // The path is already encoded segment by segment; set it verbatim.
        url.set_path(&format!("{}{}", self.inner.base.path(), path));
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let mut request = self
            .inner
            .http
            .request(method.clone(), url)
            .header(ACCEPT, "application/json")
            .header(CONTENT_TYPE, "application/json");
        if let Some(t) = timeout {
            request = request.timeout(t);
        }
        if let Some(auth) = &self.inner.auth {
            if auth.cookie {
                match self.session_cookie().await.map_err(wire_failure)? {
                    Some(cookie) => request = request.header(COOKIE, cookie),
                    // The login was refused: let the server judge the same credentials, so a
                    // wrong password is its 401 — never an anonymous request, which a server
                    // that lets anonymous users in would answer as if all were well.
                    None => {
                        request =
                            request.basic_auth(&auth.user, Some(auth.password.expose_secret()))
                    }
                }
            } else {
                request = request.basic_auth(&auth.user, Some(auth.password.expose_secret()));
            }
        }
        if let Some(bearer) = bearer {
            if let Ok(mut value) =
                HeaderValue::from_str(&format!("Bearer {}", bearer.token.expose_secret()))
            {
                value.set_sensitive(true);
                request = request.header(AUTHORIZATION, value);
            }
        }
        if let Some(body) = body {
            request = request.body(body.to_vec());
        }
        // Counted once it goes out: a cookie login that failed stopped it before.
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        request.send().await.map(Sent::Http).map_err(wire_failure)
    }

    /// CouchDB's login lockout answers 403 `forbidden` with this reason (3.4, SERVERS.md):
    /// said plainly as a locked user, not as a wrong password or a validation refusal.
    fn lockout(&self, err: Error) -> Error {
        let locked = err.status_code() == Some(403)
            && err
                .reason()
                .is_some_and(|r| r.contains("temporarily locked"));
        if !locked {
            return err;
        }
        Error::locked(self.inner.auth.as_ref().map(|a| a.user.clone()))
    }

    /// The IAM token for the next attempt (`None` without IAM); with `stale`, that token was
    /// refused and is replaced.
    async fn bearer(&self, stale: Option<u64>) -> Result<Option<Bearer>> {
        match &self.inner.iam {
            Some(source) => source.token(&self.inner.http, stale).await.map(Some),
            None => Ok(None),
        }
    }

    fn uses_cookie(&self) -> bool {
        self.inner.auth.as_ref().is_some_and(|a| a.cookie)
    }

    fn clear_session(&self) {
        *self.inner.session.lock().expect("session lock") = None;
    }

    /// The `AuthSession` cookie, logging in first when there is none. After a refused login the
    /// request carries the credentials as basic auth, so the caller sees the server's own 401;
    /// a login that fails on the network is that request's network failure (transient, retried
    /// like it).
    async fn session_cookie(&self) -> std::result::Result<Option<HeaderValue>, reqwest::Error> {
        if let Some(c) = self.inner.session.lock().expect("session lock").clone() {
            return Ok(HeaderValue::from_str(&c).ok());
        }
        let Some(auth) = self.inner.auth.as_ref() else {
            return Ok(None);
        };
        let mut url = self.inner.base.clone();
        url.set_path(&format!("{}_session", self.inner.base.path()));
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let response = self
            .inner
            .http
            .post(url)
            .header(ACCEPT, "application/json")
            .header(CONTENT_TYPE, "application/json")
            .body(json!({"name": auth.user, "password": auth.password.expose_secret()}).to_string())
            .send()
            .await?;
        if !response.status().is_success() {
            tracing::warn!(status = %response.status(), "cookie login refused");
            return Ok(None);
        }
        let Some(cookie) = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("AuthSession="))
            .and_then(|v| v.split(';').next())
            .map(str::to_owned)
        else {
            tracing::warn!("cookie login answered without an AuthSession cookie");
            return Ok(None);
        };
        *self.inner.session.lock().expect("session lock") = Some(cookie.clone());
        Ok(HeaderValue::from_str(&cookie).ok())
    }

    async fn send_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
        retry: Retry,
    ) -> Result<T> {
        let reply = self.send(method.clone(), path, query, body, retry).await?;
        decode(&reply.body).map_err(|e| e.with_request(method.as_str(), path))
    }

    // ---- server and database --------------------------------------------------------------

    /// `GET /`: the server's welcome document (version, vendor…).
    ///
    /// # Errors
    ///
    /// The server could not be reached or refused the credentials.
    pub async fn server_info(&self) -> Result<Value> {
        self.send_json(Method::GET, "", &[], None, Retry::Safe)
            .await
    }

    /// Creates the database unless it exists; `true` when this call created it.
    ///
    /// # Errors
    ///
    /// The server refused (e.g. 401/403 without admin rights).
    pub async fn ensure_database(&self) -> Result<bool> {
        self.ensure_database_with(None).await
    }

    /// [`Client::ensure_database`], creating it with `shards` shards (CouchDB's `q`) when
    /// given. A server that refuses the parameter (400) gets the plain creation instead: the
    /// shard count is a matter of speed, never of correctness.
    ///
    /// # Errors
    ///
    /// The server refused (e.g. 401/403 without admin rights).
    pub async fn ensure_database_with(&self, shards: Option<u32>) -> Result<bool> {
        let path = self.db_path();
        match self.send(Method::GET, &path, &[], None, Retry::Safe).await {
            Ok(_) => return Ok(false),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        let query: Vec<(&str, String)> = shards.iter().map(|q| ("q", q.to_string())).collect();
        let created = match self
            .send(Method::PUT, &path, &query, None, Retry::Safe)
            .await
        {
            Err(e) if e.status_code() == Some(400) && !query.is_empty() => {
                tracing::info!(
                    ?shards,
                    "the server refused q for a new database; creating it with its default"
                );
                self.send(Method::PUT, &path, &[], None, Retry::Safe).await
            }
            other => other,
        };
        match created {
            Ok(_) => Ok(true),
            // Someone else (or our own retried request) created it first.
            Err(e) if e.status_code() == Some(412) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes the database with everything in it.
    ///
    /// # Errors
    ///
    /// The server refused, or the database does not exist (404).
    pub async fn delete_database(&self) -> Result<()> {
        let path = self.db_path();
        self.send(Method::DELETE, &path, &[], None, Retry::Safe)
            .await
            .map(drop)
    }

    /// `GET /db`: document count, update sequence…
    ///
    /// # Errors
    ///
    /// The database does not exist (404), or the server failed.
    pub async fn database_info(&self) -> Result<Value> {
        let path = self.db_path();
        self.send_json(Method::GET, &path, &[], None, Retry::Safe)
            .await
    }

    // ---- documents ------------------------------------------------------------------------

    /// Reads a document.
    ///
    /// # Errors
    ///
    /// 404 when it does not exist (see [`Client::get_opt`]); a body that is not a `T`.
    pub async fn get<T: DeserializeOwned>(&self, id: &str) -> Result<T> {
        let path = self.doc_path(id)?;
        self.send_json(Method::GET, &path, &[], None, Retry::Safe)
            .await
    }

    /// Reads a document; `None` when it does not exist or was deleted.
    ///
    /// # Errors
    ///
    /// The database is missing, the server failed, or the body is not a `T`.
    pub async fn get_opt<T: DeserializeOwned>(&self, id: &str) -> Result<Option<T>> {
        match self.get(id).await {
            Ok(doc) => Ok(Some(doc)),
            Err(e) if e.is_not_found() && !e.is_missing_database() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes a document: a create when `doc` has no `_rev`, a compare-and-swap update when it
    /// has one. Retried on transient failures; a retried create or update that had landed
    /// comes back as a 409, which the caller resolves by reading the document.
    ///
    /// # Errors
    ///
    /// 409 on a stale `_rev` or an existing document; 403 from `validate_doc_update`.
    pub async fn put<T: Serialize + ?Sized>(&self, id: &str, doc: &T) -> Result<Written> {
        let path = self.doc_path(id)?;
        let body = serde_json::to_vec(doc).map_err(|e| Error::invalid_input(e.to_string()))?;
        let reply = self
            .send(Method::PUT, &path, &[], Some(body), Retry::Safe)
            .await?;
        written(&reply).map_err(|e| e.with_request("PUT", &path))
    }

    /// [`Client::put`] with CouchDB's write parameters (`w`: how many copies must take it before
    /// the server answers 201 rather than 202).
    ///
    /// # Errors
    ///
    /// As [`Client::put`].
    pub async fn put_with<T: Serialize + ?Sized>(
        &self,
        id: &str,
        doc: &T,
        options: &WriteOptions,
    ) -> Result<Written> {
        let path = self.doc_path(id)?;
        let body = serde_json::to_vec(doc).map_err(|e| Error::invalid_input(e.to_string()))?;
        let query: Vec<(&str, String)> = options.w.iter().map(|w| ("w", w.to_string())).collect();
        let reply = self
            .send(Method::PUT, &path, &query, Some(body), Retry::Safe)
            .await?;
        written(&reply).map_err(|e| e.with_request("PUT", &path))
    }

    /// Deletes revision `rev` of a document.
    ///
    /// # Errors
    ///
    /// 409 when `rev` is not the current revision; 403 from `validate_doc_update`.
    pub async fn delete(&self, id: &str, rev: &str) -> Result<Written> {
        let path = self.doc_path(id)?;
        let reply = self
            .send(
                Method::DELETE,
                &path,
                &[("rev", rev.to_owned())],
                None,
                Retry::Safe,
            )
            .await?;
        written(&reply).map_err(|e| e.with_request("DELETE", &path))
    }

    /// Writes several documents in one request. The reply has one result per document, in
    /// request order (restored by id when a server reorders them); a conflict or a refusal of
    /// one document does not fail the others.
    ///
    /// Retried on transient failures only when every document names its `_id` (a repeat then
    /// finds its own writes as conflicts instead of making copies).
    ///
    /// # Errors
    ///
    /// The whole request failed, or the reply does not have one entry per document.
    pub async fn bulk_docs<T: Serialize>(&self, docs: &[T]) -> Result<Vec<BulkResult>> {
        self.bulk_docs_with(docs, &WriteOptions::default()).await
    }

    /// [`Client::bulk_docs`] with CouchDB's write parameters (`w`: how many copies must take
    /// each document before the server answers 201 rather than 202).
    ///
    /// # Errors
    ///
    /// As [`Client::bulk_docs`].
    pub async fn bulk_docs_with<T: Serialize>(
        &self,
        docs: &[T],
        options: &WriteOptions,
    ) -> Result<Vec<BulkResult>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        let docs: Vec<Value> = docs
            .iter()
            .map(serde_json::to_value)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::invalid_input(e.to_string()))?;
        let docs: Vec<&Value> = docs.iter().collect();
        self.bulk_docs_values(&docs, options).await
    }

    /// [`Client::bulk_docs_with`] for documents already in JSON: serialized once, straight into
    /// the request body.
    pub(crate) async fn bulk_docs_values(
        &self,
        docs: &[&Value],
        options: &WriteOptions,
    ) -> Result<Vec<BulkResult>> {
        #[derive(Serialize)]
        struct Body<'a> {
            docs: &'a [&'a Value],
        }
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Option<&str>> = docs
            .iter()
            .map(|d| d.get("_id").and_then(Value::as_str))
            .collect();
        let body = serde_json::to_vec(&Body { docs }).expect("serializable");
        self.bulk_docs_body(body, &ids, options).await
    }

    /// [`Client::bulk_docs_with`] for documents serialized already (the engine's writes, each
    /// serialized once: an account is rewritten whole by every write of it).
    pub(crate) async fn bulk_docs_raw(
        &self,
        docs: &[&RawDoc],
        options: &WriteOptions,
    ) -> Result<Vec<BulkResult>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        let size: usize = docs.iter().map(|d| d.json.get().len() + 1).sum();
        let mut body = Vec::with_capacity(size + 12);
        body.extend_from_slice(b"{\"docs\":[");
        for (i, doc) in docs.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(doc.json.get().as_bytes());
        }
        body.extend_from_slice(b"]}");
        let ids: Vec<Option<&str>> = docs.iter().map(|d| Some(d.id.as_str())).collect();
        self.bulk_docs_body(body, &ids, options).await
    }

    /// Sends a `_bulk_docs` body of documents with these ids (`None`: no `_id`, a create the
    /// server names, never retried blindly).
    async fn bulk_docs_body(
        &self,
        body: Vec<u8>,
        ids: &[Option<&str>],
        options: &WriteOptions,
    ) -> Result<Vec<BulkResult>> {
        let mut retry = Retry::Safe;
        for id in ids {
            match id {
                Some(id) => {
                    encode_doc_id(id)?;
                }
                None => retry = Retry::Never,
            }
        }
        let path = format!("{}/_bulk_docs", self.db_path());
        let mut query = Vec::new();
        if let Some(w) = options.w {
            query.push(("w", w.to_string()));
        }
        let reply = self
            .send(Method::POST, &path, &query, Some(body), retry)
            .await?;
        let mut results: Vec<BulkResult> =
            decode(&reply.body).map_err(|e| e.with_request("POST", &path))?;
        if results.len() != ids.len() {
            return Err(Error::decode(format!(
                "_bulk_docs answered {} results for {} documents",
                results.len(),
                ids.len()
            ))
            .with_request("POST", &path));
        }
        mark_accepted(reply.status == StatusCode::ACCEPTED, &mut results);
        if let Some(observer) = &self.inner.observer {
            let conflicts = results.iter().filter(|r| r.is_conflict()).count() as u64;
            if conflicts > 0 {
                observer.bulk_conflicts(conflicts);
            }
        }
        Ok(in_request_order(ids, results))
    }

    /// `_all_docs` for these keys, in order, one row per key.
    ///
    /// # Errors
    ///
    /// The server failed, or the reply does not have one row per key.
    pub async fn all_docs(&self, keys: &[String], include_docs: bool) -> Result<Vec<AllDocsRow>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        for key in keys {
            encode_doc_id(key)?;
        }
        let mut query = Vec::new();
        if include_docs {
            query.push(("include_docs", "true".to_owned()));
        }
        self.all_docs_keys(keys, &query).await
    }

    /// `POST _all_docs` with `keys` (checked by the caller) and `query`: one row per key.
    async fn all_docs_keys(
        &self,
        keys: &[String],
        query: &[(&str, String)],
    ) -> Result<Vec<AllDocsRow>> {
        let path = format!("{}/_all_docs", self.db_path());
        let body = serde_json::to_vec(&json!({ "keys": keys })).expect("serializable");
        #[derive(Deserialize)]
        struct Reply {
            rows: Vec<AllDocsRow>,
        }
        let reply: Reply = self
            .send_json(Method::POST, &path, query, Some(body), Retry::Safe)
            .await?;
        if reply.rows.len() != keys.len() {
            return Err(Error::decode(format!(
                "_all_docs answered {} rows for {} keys",
                reply.rows.len(),
                keys.len()
            ))
            .with_request("POST", &path));
        }
        Ok(reply.rows)
    }

    /// Queries a view of `_design/{ddoc}`.
    ///
    /// # Errors
    ///
    /// 404 when the design document or view is missing; the server failed.
    pub async fn view(&self, ddoc: &str, view: &str, q: &ViewQuery) -> Result<ViewResponse> {
        let path = format!(
            "{}/_design/{}/_view/{}",
            self.db_path(),
            utf8_percent_encode(ddoc, SEGMENT),
            utf8_percent_encode(view, SEGMENT)
        );
        let mut query: Vec<(&str, String)> = Vec::new();
        let js = |v: &Value| v.to_string();
        if let Some(v) = &q.key {
            query.push(("key", js(v)));
        }
        if let Some(v) = &q.start_key {
            query.push(("startkey", js(v)));
        }
        if let Some(v) = &q.end_key {
            query.push(("endkey", js(v)));
        }
        if let Some(v) = q.inclusive_end {
            query.push(("inclusive_end", v.to_string()));
        }
        if let Some(v) = &q.start_key_doc_id {
            query.push(("startkey_docid", v.clone()));
        }
        if let Some(v) = q.group {
            query.push(("group", v.to_string()));
        }
        if let Some(v) = q.group_level {
            query.push(("group_level", v.to_string()));
        }
        if let Some(v) = q.reduce {
            query.push(("reduce", v.to_string()));
        }
        if let Some(v) = q.include_docs {
            query.push(("include_docs", v.to_string()));
        }
        if let Some(v) = q.conflicts {
            query.push(("conflicts", v.to_string()));
        }
        if let Some(v) = q.limit {
            query.push(("limit", v.to_string()));
        }
        if let Some(v) = q.skip {
            query.push(("skip", v.to_string()));
        }
        if let Some(v) = q.descending {
            query.push(("descending", v.to_string()));
        }
        if let Some(v) = q.update {
            query.push(("update", v.to_owned()));
        }
        match &q.keys {
            // A read: POST only because the keys may not fit in a URL. Safe to repeat.
            Some(keys) => {
                let body = serde_json::to_vec(&json!({ "keys": keys })).expect("serializable");
                self.send_json(Method::POST, &path, &query, Some(body), Retry::Safe)
                    .await
            }
            None => {
                self.send_json(Method::GET, &path, &query, None, Retry::Safe)
                    .await
            }
        }
    }

    /// One `_changes` request (normal or longpoll). A longpoll that times out on our side comes
    /// back as no changes since `since`, so a missing server-side timeout cannot hang a caller.
    ///
    /// # Errors
    ///
    /// The server failed or could not be reached.
    pub async fn changes(&self, q: &ChangesQuery) -> Result<ChangesResponse> {
        let path = format!("{}/_changes", self.db_path());
        let (query, body) = changes_params(q, if q.longpoll { "longpoll" } else { "normal" });
        let method = if body.is_some() {
            Method::POST
        } else {
            Method::GET
        };
        let wait = q.timeout.unwrap_or(Duration::from_secs(60));
        let deadline = self
            .inner
            .request_timeout
            .max(wait + Duration::from_secs(5));
        let result = self
            .send_with_timeout(
                method.clone(),
                &path,
                &query,
                body,
                Retry::Safe,
                Some(deadline),
            )
            .await;
        match result {
            Ok(reply) => decode(&reply.body).map_err(|e| e.with_request(method.as_str(), &path)),
            Err(e) if q.longpoll && e.is_timeout() => Ok(ChangesResponse {
                results: Vec::new(),
                last_seq: q.since.clone().unwrap_or(Value::from(0)),
            }),
            Err(e) => Err(e),
        }
    }

    /// Opens a continuous `_changes` feed that lasts at most `max_duration`.
    ///
    /// # Errors
    ///
    /// The feed could not be opened.
    pub async fn changes_stream(
        &self,
        q: &ChangesQuery,
        max_duration: Duration,
    ) -> Result<ChangesStream> {
        let path = format!("{}/_changes", self.db_path());
        let (mut query, body) = changes_params(q, "continuous");
        query.push(("heartbeat", "10000".to_owned()));
        let method = if body.is_some() {
            Method::POST
        } else {
            Method::GET
        };
        let bearer = self.bearer(None).await?;
        let sent = self
            .request(
                &method,
                &path,
                &query,
                body.as_deref(),
                Some(max_duration),
                bearer.as_ref(),
            )
            .await
            .map_err(|f| {
                Error::transport(f.timeout)
                    .with_source(f.source)
                    .with_server(self.inner.base.as_str())
                    .with_request(method.as_str(), &path)
            })?;
        let (response, buffer) = match sent {
            Sent::Http(response) if !response.status().is_success() => {
                let status = response.status();
                let bytes = response.bytes().await.unwrap_or_default();
                return Err(status_error(status, &bytes).with_request(method.as_str(), &path));
            }
            Sent::Http(response) => (Some(response), Vec::new()),
            Sent::Whole(reply) if !(200..300).contains(&reply.status) => {
                let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
                return Err(status_error(status, &reply.body).with_request(method.as_str(), &path));
            }
            Sent::Whole(reply) => (None, reply.body),
        };
        Ok(ChangesStream {
            response,
            buffer,
            done: false,
        })
    }

    /// `count` fresh ids from the server's `_uuids`.
    ///
    /// # Errors
    ///
    /// The server failed.
    pub async fn uuids(&self, count: u32) -> Result<Vec<String>> {
        #[derive(Deserialize)]
        struct Reply {
            uuids: Vec<String>,
        }
        let reply: Reply = self
            .send_json(
                Method::GET,
                "_uuids",
                &[("count", count.to_string())],
                None,
                Retry::Safe,
            )
            .await?;
        if reply.uuids.len() != count as usize {
            return Err(Error::decode("_uuids answered the wrong number of ids"));
        }
        Ok(reply.uuids)
    }

    /// Reads `_local/{name}` (not replicated, not in views or `_changes`).
    ///
    /// # Errors
    ///
    /// The server failed or the body is not a `T`.
    pub async fn get_local<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        self.get_opt(&format!("_local/{name}")).await
    }

    /// Writes `_local/{name}`; include `_rev` to update.
    ///
    /// # Errors
    ///
    /// 409 on a stale `_rev`.
    pub async fn put_local<T: Serialize + ?Sized>(&self, name: &str, doc: &T) -> Result<Written> {
        self.put(&format!("_local/{name}"), doc).await
    }

    /// Reads the database's `_security` object.
    ///
    /// # Errors
    ///
    /// The server refused or failed.
    pub async fn security(&self) -> Result<Value> {
        let path = format!("{}/_security", self.db_path());
        self.send_json(Method::GET, &path, &[], None, Retry::Safe)
            .await
    }

    /// Replaces the database's `_security` object (admins only).
    ///
    /// # Errors
    ///
    /// The server refused or failed.
    pub async fn set_security(&self, security: &Value) -> Result<()> {
        let path = format!("{}/_security", self.db_path());
        let body = serde_json::to_vec(security).expect("serializable");
        self.send(Method::PUT, &path, &[], Some(body), Retry::Safe)
            .await
            .map(drop)
    }

    /// The database's `_revs_limit`: how many revisions of a document's history the server
    /// keeps. `None` when the server has no such setting (pouchdb-server answers the path as
    /// a document id: 400, or 404).
    ///
    /// # Errors
    ///
    /// The server refused or failed.
    pub async fn revs_limit(&self) -> Result<Option<u32>> {
        let path = format!("{}/_revs_limit", self.db_path());
        match self
            .send_json::<Value>(Method::GET, &path, &[], None, Retry::Safe)
            .await
        {
            Ok(value) => value
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| Error::decode(format!("_revs_limit answered {value}"))),
            Err(e) if e.is_not_found() || e.status_code() == Some(400) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets the database's `_revs_limit` (admins only).
    ///
    /// # Errors
    ///
    /// The server refused or failed.
    pub async fn set_revs_limit(&self, limit: u32) -> Result<()> {
        let path = format!("{}/_revs_limit", self.db_path());
        let body = limit.to_string().into_bytes();
        self.send(Method::PUT, &path, &[], Some(body), Retry::Safe)
            .await
            .map(drop)
    }
}

/// Parameters of a write. Unset fields are not sent (the server's defaults apply).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// `w`: copies that must take the write before the server answers 201 (not 202).
    pub w: Option<u32>,
}

/// A document read with its conflicts: the winning revision and the other leaves.
#[derive(Debug, Clone)]
pub struct Leaves {
    /// The winning revision's body (with `_id` and `_rev`), `None` when there is no live one.
    pub winner: Option<Value>,
    /// The losing live leaves' bodies (each with its `_rev`), in no particular order.
    pub losers: Vec<Value>,
}

impl Client {
    /// Every row of `ddoc/view` under `base`, in key order, passed to `visit`: pages of
    /// `PAGE_ROWS_MAX` rows, each starting after the last key of the page before (so the keys
    /// must be unique: grouped rows, or map rows with one row per document), at most
    /// `PAGES_MAX` pages (src/limits.rs). `base`'s `start_key`, `skip` and `limit` are set here.
    pub(crate) async fn view_in_pages(
        &self,
        ddoc: &str,
        view: &str,
        base: ViewQuery,
        mut visit: impl FnMut(ViewRow) -> Result<()>,
    ) -> Result<()> {
        let mut after: Option<Value> = None;
        for _ in 0..crate::limits::PAGES_MAX {
            let q = ViewQuery {
                start_key: after.clone(),
                skip: after.as_ref().map(|_| 1),
                limit: Some(crate::limits::PAGE_ROWS_MAX),
                ..base.clone()
            };
            let rows = self.view(ddoc, view, &q).await?.rows;
            let n = rows.len() as u64;
            for row in rows {
                after = Some(row.key.clone());
                visit(row)?;
            }
            if n < crate::limits::PAGE_ROWS_MAX {
                return Ok(());
            }
        }
        Err(Error::invariant(format!(
            "{ddoc}/{view}: more than {} rows, not read to the end",
            crate::limits::PAGES_MAX * crate::limits::PAGE_ROWS_MAX
        )))
    }

    /// `GET /db`'s `cluster.n`: how many copies of each document the server keeps (1 on a
    /// single node and on servers that do not say).
    ///
    /// # Errors
    ///
    /// The database is missing, or the server failed.
    pub async fn copies(&self) -> Result<u32> {
        Ok(self.stated_copies().await?.unwrap_or(1))
    }

    /// `GET /db`'s `cluster.n`, `None` when the server does not say (pouchdb-server).
    ///
    /// # Errors
    ///
    /// The database is missing, or the server failed.
    pub async fn stated_copies(&self) -> Result<Option<u32>> {
        let info = self.database_info().await?;
        Ok(info
            .get("cluster")
            .and_then(|c| c.get("n"))
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0))
    }

    /// `_all_docs` for these keys with the documents, each carrying `_conflicts` (the losing
    /// leaves' revisions) when it has any.
    ///
    /// # Errors
    ///
    /// As [`Client::all_docs`].
    pub async fn all_docs_with_conflicts(&self, keys: &[String]) -> Result<Vec<AllDocsRow>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        for key in keys {
            encode_doc_id(key)?;
        }
        let query = [
            ("include_docs", "true".to_owned()),
            ("conflicts", "true".to_owned()),
        ];
        self.all_docs_keys(keys, &query).await
    }

    /// `_all_docs` from `start` to `end` (inclusive): ids and winning revisions, no documents.
    ///
    /// # Errors
    ///
    /// The server failed.
    pub async fn all_docs_range(&self, start: &str, end: &str) -> Result<Vec<AllDocsRow>> {
        let path = format!("{}/_all_docs", self.db_path());
        let query = vec![
            ("startkey", Value::from(start).to_string()),
            ("endkey", Value::from(end).to_string()),
        ];
        #[derive(Deserialize)]
        struct Reply {
            rows: Vec<AllDocsRow>,
        }
        let reply: Reply = self
            .send_json(Method::GET, &path, &query, None, Retry::Safe)
            .await?;
        Ok(reply.rows)
    }

    /// Reads these revisions of a document (`open_revs`): the live ones found, each with its
    /// `_rev`; revisions missing or deleted are left out.
    ///
    /// # Errors
    ///
    /// The server failed, or the reply is not a list of revisions.
    pub async fn revisions(&self, id: &str, revs: &[String]) -> Result<Vec<Value>> {
        if revs.is_empty() {
            return Ok(Vec::new());
        }
        let path = self.doc_path(id)?;
        let query = vec![(
            "open_revs",
            serde_json::to_string(revs).expect("serializable"),
        )];
        let rows: Vec<Value> = self
            .send_json(Method::GET, &path, &query, None, Retry::Safe)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|row| row.get("ok").cloned())
            .filter(|doc| doc.get("_deleted").and_then(Value::as_bool) != Some(true))
            .collect())
    }

    /// Every live leaf of a document, from every copy that answers (`open_revs=all` with
    /// `r` = `copies`): on a cluster, a read with `conflicts=true` shows one copy's leaves, and
    /// a rival revision that reached only the other copies is not among them. Empty when the
    /// document does not exist.
    ///
    /// # Errors
    ///
    /// The server failed, or the reply is not a list of revisions.
    pub async fn live_leaves(&self, id: &str, copies: Option<u32>) -> Result<Vec<Value>> {
        self.live_leaves_with(id, copies, false).await
    }

    /// Every leaf of many documents in one request (`_bulk_get` with no `rev`, which merges the
    /// revision trees of the copies that answer, `r` = `copies`, as `open_revs=all` does): per
    /// id, in the order given, its leaves, deleted ones too (`_deleted`); empty when it does
    /// not exist.
    ///
    /// # Errors
    ///
    /// The server failed, an id is not valid, or the reply does not answer each id once, in
    /// order.
    pub async fn leaves_of(&self, ids: &[String], copies: Option<u32>) -> Result<Vec<Vec<Value>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        for id in ids {
            encode_doc_id(id)?;
        }
        let path = format!("{}/_bulk_get", self.db_path());
        let query: Vec<(&str, String)> = copies.map(|n| ("r", n.to_string())).into_iter().collect();
        let docs: Vec<Value> = ids.iter().map(|id| json!({ "id": id })).collect();
        let body = serde_json::to_vec(&json!({ "docs": docs })).expect("serializable");
        #[derive(Deserialize)]
        struct Result_ {
            id: String,
            docs: Vec<Value>,
        }
        #[derive(Deserialize)]
        struct Reply {
            results: Vec<Result_>,
        }
        let reply: Reply = self
            .send_json(Method::POST, &path, &query, Some(body), Retry::Safe)
            .await?;
        let answered_each = reply.results.len() == ids.len()
            && reply.results.iter().zip(ids).all(|(r, id)| &r.id == id);
        if !answered_each {
            return Err(Error::decode(format!(
                "_bulk_get answered {} results for {} ids, not one per id in order",
                reply.results.len(),
                ids.len()
            ))
            .with_request("POST", &path));
        }
        let mut out = Vec::with_capacity(ids.len());
        for result in reply.results {
            let mut leaves = Vec::new();
            for row in result.docs {
                if let Some(doc) = row.get("ok") {
                    leaves.push(doc.clone());
                } else if row
                    .get("error")
                    .and_then(|e| e.get("error"))
                    .and_then(Value::as_str)
                    != Some("not_found")
                {
                    return Err(Error::decode(format!(
                        "_bulk_get could not read {}: {row}",
                        result.id
                    ))
                    .with_request("POST", &path));
                }
            }
            out.push(leaves);
        }
        Ok(out)
    }

    /// [`Client::live_leaves`], each leaf with its `_revisions` (its revision's ancestors, as
    /// far as the copies keep them).
    ///
    /// # Errors
    ///
    /// As [`Client::live_leaves`].
    pub async fn live_leaves_with_history(
        &self,
        id: &str,
        copies: Option<u32>,
    ) -> Result<Vec<Value>> {
        self.live_leaves_with(id, copies, true).await
    }

    async fn live_leaves_with(
        &self,
        id: &str,
        copies: Option<u32>,
        history: bool,
    ) -> Result<Vec<Value>> {
        let path = self.doc_path(id)?;
        let mut query = vec![("open_revs", "all".to_owned())];
        if history {
            query.push(("revs", "true".to_owned()));
        }
        if let Some(n) = copies {
            query.push(("r", n.to_string()));
        }
        let rows: Vec<Value> = match self
            .send_json(Method::GET, &path, &query, None, Retry::Safe)
            .await
        {
            Ok(rows) => rows,
            Err(e) if e.is_not_found() && !e.is_missing_database() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(rows
            .into_iter()
            .filter_map(|row| row.get("ok").cloned())
            .filter(|doc| doc.get("_deleted").and_then(Value::as_bool) != Some(true))
            .collect())
    }

    /// A document with every live leaf of its revision tree: the winner and, when it holds a
    /// conflict, the losers (two requests then, one otherwise). `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// The server failed.
    pub async fn leaves(&self, id: &str) -> Result<Option<Leaves>> {
        let path = self.doc_path(id)?;
        let winner: Option<Value> = match self
            .send_json(
                Method::GET,
                &path,
                &[("conflicts", "true".to_owned())],
                None,
                Retry::Safe,
            )
            .await
        {
            Ok(doc) => Some(doc),
            Err(e) if e.is_not_found() && !e.is_missing_database() => None,
            Err(e) => return Err(e),
        };
        let Some(mut winner) = winner else {
            return Ok(None);
        };
        let losers = take_conflicts(&mut winner);
        let losers = self.revisions(id, &losers).await?;
        Ok(Some(Leaves {
            winner: Some(winner),
            losers,
        }))
    }
}

/// Live leaves as a read with conflicts shows a document: CouchDB's winner among them (the
/// longer revision path, then the greater revision id), its `_conflicts` the others' revisions.
/// `None` when there is none.
pub fn winner_of(leaves: &[Value]) -> Option<Value> {
    let rev = |leaf: &Value| {
        let r = leaf.get("_rev").and_then(Value::as_str).unwrap_or("");
        let (pos, hash) = r.split_once('-').unwrap_or(("0", r));
        (pos.parse::<u64>().unwrap_or(0), hash.to_owned())
    };
    let mut leaves: Vec<&Value> = leaves.iter().collect();
    leaves.sort_by_key(|leaf| std::cmp::Reverse(rev(leaf)));
    let mut leaves = leaves.into_iter();
    let mut winner = leaves.next()?.clone();
    let conflicts: Vec<Value> = leaves.filter_map(|l| l.get("_rev").cloned()).collect();
    if !conflicts.is_empty() {
        if let Some(w) = winner.as_object_mut() {
            w.insert("_conflicts".to_owned(), Value::Array(conflicts));
        }
    }
    Some(winner)
}

/// Removes `_conflicts` from a document read with `conflicts=true`: the losing revisions.
pub fn take_conflicts(doc: &mut Value) -> Vec<String> {
    doc.as_object_mut()
        .and_then(|m| m.remove("_conflicts"))
        .and_then(|c| serde_json::from_value(c).ok())
        .unwrap_or_default()
}

/// CouchDB answers `_bulk_docs` in request order; pouchdb-server answers validation refusals
/// first. Put results back in request order by id, so callers can match by position on any
/// server. When ids are missing or repeated, the server's order is all there is.
/// Which written documents of a `_bulk_docs` answer are uncertain. A 202 says that some
/// document of the request did not reach the write quorum. CouchDB (3.x's clustered layer)
/// names each one with `"accepted": true`, and the others of the request reached it: a
/// contested write of one document (two writers of one account through two nodes) must not
/// make every other document of its batch uncertain, or each transfer decision batched with it
/// would be reported unconfirmed. A 202 that names none (a server that does not say which)
/// makes every written document uncertain.
fn mark_accepted(status_accepted: bool, results: &mut [BulkResult]) {
    if status_accepted && !results.iter().any(|r| r.accepted) {
        for r in results.iter_mut().filter(|r| r.is_ok()) {
            r.accepted = true;
        }
    }
}

fn in_request_order(ids: &[Option<&str>], results: Vec<BulkResult>) -> Vec<BulkResult> {
    let unique = ids.iter().all(Option::is_some)
        && ids.iter().collect::<std::collections::HashSet<_>>().len() == ids.len();
    let answered = results.iter().all(|r| r.id.is_some());
    if !unique || !answered {
        return results;
    }
    let mut by_id: std::collections::HashMap<String, BulkResult> = results
        .into_iter()
        .map(|r| (r.id.clone().unwrap_or_default(), r))
        .collect();
    let mut ordered = Vec::with_capacity(by_id.len());
    for id in ids.iter().flatten() {
        match by_id.remove(*id) {
            Some(r) => ordered.push(r),
            // An id the server did not answer: keep what there is, in any order.
            None => break,
        }
    }
    ordered.extend(by_id.into_values());
    ordered
}

/// A document serialized once, with its id: what the engine hands the bulk writer.
#[derive(Debug, Clone)]
pub(crate) struct RawDoc {
    pub(crate) id: String,
    pub(crate) json: Box<serde_json::value::RawValue>,
}

impl RawDoc {
    /// Serializes `doc`, whose `_id` is `id`.
    pub(crate) fn new<T: Serialize>(id: &str, doc: &T) -> Result<RawDoc> {
        let text = serde_json::to_string(doc).map_err(|e| Error::invalid_input(e.to_string()))?;
        let json = serde_json::value::RawValue::from_string(text)
            .map_err(|e| Error::invalid_input(e.to_string()))?;
        Ok(RawDoc {
            id: id.to_owned(),
            json,
        })
    }

    /// Bytes the document takes in a request body (with its comma).
    pub(crate) fn bytes(&self) -> usize {
        self.json.get().len() + 1
    }
}

fn changes_params(q: &ChangesQuery, feed: &str) -> (Vec<(&'static str, String)>, Option<Vec<u8>>) {
    let mut query = vec![("feed", feed.to_owned())];
    if let Some(since) = &q.since {
        let since = match since {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        query.push(("since", since));
    }
    if let Some(t) = q.timeout {
        query.push(("timeout", t.as_millis().to_string()));
    }
    if let Some(l) = q.limit {
        query.push(("limit", l.to_string()));
    }
    if q.include_docs {
        query.push(("include_docs", "true".to_owned()));
    }
    if q.conflicts {
        query.push(("conflicts", "true".to_owned()));
    }
    let mut body = None;
    if let Some((ddoc, view)) = &q.view {
        query.push(("filter", "_view".to_owned()));
        query.push(("view", format!("{ddoc}/{view}")));
    } else if let Some(ids) = &q.doc_ids {
        query.push(("filter", "_doc_ids".to_owned()));
        body = Some(serde_json::to_vec(&json!({ "doc_ids": ids })).expect("serializable"));
    }
    (query, body)
}

/// Percent-encodes a document id for a URL path. `_design/` and `_local/` keep their prefix;
/// any other id beginning with `_` is refused (CouchDB reserves them), as are empty ids and ids
/// holding control characters.
pub(crate) fn encode_doc_id(id: &str) -> Result<String> {
    if id.is_empty() {
        return Err(Error::invalid("id", "must not be empty"));
    }
    if id.chars().any(char::is_control) {
        return Err(Error::invalid(
            "id",
            format!("{id:?} holds a control character"),
        ));
    }
    for prefix in ["_design/", "_local/"] {
        if let Some(rest) = id.strip_prefix(prefix) {
            if rest.is_empty() {
                return Err(Error::invalid("id", format!("{id:?} has no name")));
            }
            return Ok(format!("{prefix}{}", utf8_percent_encode(rest, SEGMENT)));
        }
    }
    if id.starts_with('_') {
        return Err(Error::invalid(
            "id",
            format!("{id:?} begins with '_', which CouchDB reserves"),
        ));
    }
    Ok(utf8_percent_encode(id, SEGMENT).to_string())
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| {
        let shown: String = String::from_utf8_lossy(body).chars().take(80).collect();
        Error::decode(format!("{e} in body starting {shown:?}"))
    })
}

fn written(reply: &Reply) -> Result<Written> {
    #[derive(Deserialize)]
    struct Ack {
        id: String,
        rev: String,
    }
    let ack: Ack = decode(&reply.body)?;
    Ok(Written {
        id: ack.id,
        rev: ack.rev,
        accepted: reply.status == StatusCode::ACCEPTED,
    })
}

fn status_error(status: StatusCode, body: &[u8]) -> Error {
    #[derive(Deserialize)]
    struct Body {
        error: Option<String>,
        reason: Option<String>,
    }
    let parsed: Option<Body> = serde_json::from_slice(body).ok();
    let (error, reason) = parsed.map_or((None, None), |b| (b.error, b.reason));
    Error::status(status.as_u16(), error, reason)
}

/// `Retry-After` as a number of seconds or as an HTTP date (RFC 9110 §10.2.3); a date in the
/// past is no wait.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// Full-jitter exponential backoff: a random wait in `[0, min(cap, base·2^attempt)]`, at least
/// 1 ms so a storm of retries still spreads out.
fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let cap = policy.delay_max.as_millis() as u64;
    let exp = (policy.delay_base.as_millis() as u64).saturating_mul(1u64 << attempt.min(20));
    let ceiling = exp.min(cap).max(1);
    Duration::from_millis(fastrand::u64(1..=ceiling))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_encoded_and_reserved_ones_refused() {
        assert_eq!(
            encode_doc_id("payment:o1:r 1").unwrap(),
            "payment%3Ao1%3Ar%201"
        );
        assert_eq!(encode_doc_id("_design/orders").unwrap(), "_design/orders");
        assert_eq!(encode_doc_id("_local/a/b").unwrap(), "_local/a%2Fb");
        assert!(encode_doc_id("_users").unwrap_err().is_invalid_input());
        assert!(encode_doc_id("a\u{7}b").unwrap_err().is_invalid_input());
        assert!(encode_doc_id("").is_err());
        assert!(encode_doc_id("_design/").is_err());
    }

    #[test]
    fn backoff_stays_under_its_cap() {
        let p = RetryPolicy::default();
        for attempt in 0..40 {
            let d = backoff(&p, attempt);
            assert!(d <= p.delay_max, "{d:?}");
            assert!(d >= Duration::from_millis(1));
        }
    }

    #[test]
    fn bulk_results_come_back_in_request_order() {
        let r = |id: &str, error: Option<&str>| BulkResult {
            id: Some(id.into()),
            rev: error.is_none().then(|| "1-x".into()),
            error: error.map(Into::into),
            reason: None,
            accepted: false,
        };
        let shuffled = vec![r("b", Some("forbidden")), r("c", None), r("a", None)];
        let ordered = in_request_order(&[Some("a"), Some("b"), Some("c")], shuffled);
        let ids: Vec<_> = ordered.iter().map(|r| r.id.clone().unwrap()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert!(ordered[1].is_forbidden());
    }

    #[test]
    fn a_202_bulk_answer_is_uncertain_only_where_it_says_so() {
        let r = |id: &str, error: Option<&str>, accepted: bool| BulkResult {
            id: Some(id.into()),
            rev: error.is_none().then(|| "1-x".into()),
            error: error.map(Into::into),
            reason: None,
            accepted,
        };
        let flags = |results: &[BulkResult]| -> Vec<bool> {
            results.iter().map(|r| r.accepted).collect::<Vec<_>>()
        };
        // CouchDB names the document that missed the quorum: only that one is uncertain.
        let mut named = vec![
            r("a", None, false),
            r("b", None, true),
            r("c", Some("conflict"), false),
        ];
        mark_accepted(true, &mut named);
        assert_eq!(flags(&named), [false, true, false]);
        // A 202 naming none: every written document is uncertain, never an error.
        let mut unnamed = vec![
            r("a", None, false),
            r("b", None, false),
            r("c", Some("conflict"), false),
        ];
        mark_accepted(true, &mut unnamed);
        assert_eq!(flags(&unnamed), [true, true, false]);
        // A 201: nothing is.
        let mut plain = vec![r("a", None, false)];
        mark_accepted(false, &mut plain);
        assert_eq!(flags(&plain), [false]);
    }

    #[test]
    fn redacted_url_has_no_password() {
        let r = crate::config::redact_url("http://u:secret@h:1/");
        assert!(!r.contains("secret"), "{r}");
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let headers = |v: &str| {
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_str(v).unwrap());
            h
        };
        assert_eq!(retry_after(&headers("7")), Some(Duration::from_secs(7)));
        let later = std::time::SystemTime::now() + Duration::from_secs(30);
        let wait = retry_after(&headers(&httpdate::fmt_http_date(later))).unwrap();
        // The date has whole seconds: 29 s and a fraction to 30 s.
        assert!(
            wait > Duration::from_secs(28) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        assert_eq!(
            retry_after(&headers("Wed, 21 Oct 2015 07:28:00 GMT")),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers("soon")), None);
        assert_eq!(retry_after(&reqwest::header::HeaderMap::new()), None);
    }
}
