//! A hook for metrics: what the client's HTTP exchanges with the server came to, told to an
//! [`Observer`] given to [`ClientBuilder::observer`](crate::ClientBuilder::observer).
//!
//! The client already counts its requests ([`Client::requests_sent`](crate::Client::requests_sent));
//! a service exporting metrics also wants each request's latency, which ones were retries and
//! how many writes met a conflict — including the per-document conflicts inside a `_bulk_docs`
//! reply, which the group-commit engine resolves without an error ever reaching the caller.

use std::time::Duration;

/// One attempt of one HTTP request to the server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RequestEvent<'a> {
    /// `GET`, `PUT`, `POST`…
    pub method: &'a str,
    /// The reply's status; `None` when no reply came (refused, reset, timed out).
    pub status: Option<u16>,
    /// From sending the request to having read the reply's body (or failing).
    pub elapsed: Duration,
    /// 0 for the first attempt, `n` for the `n`-th retry of the same request.
    pub attempt: u32,
}

/// A call about to be tried again after a try that failed in a way that may pass (no answer,
/// or a transient status such as 503).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetryEvent<'a> {
    /// `GET`, `PUT`, `POST`…
    pub method: &'a str,
    /// The request's path below the server's URL (`ledger/_all_docs`), without its query.
    pub path: &'a str,
    /// The server's URL, without credentials.
    pub server: &'a str,
    /// The try about to start: 2 for the first retry.
    pub next_try: u32,
    /// The most tries the retry policy allows.
    pub tries_max: u32,
    /// The failed try's status; `None` when no answer came (refused, reset, timed out).
    pub status: Option<u16>,
    /// The failed try got no answer within its time.
    pub timed_out: bool,
    /// How long the failed try took.
    pub elapsed: Duration,
    /// The wait before the next try (backoff, or what the server asked with `Retry-After`).
    pub delay: Duration,
    /// Time left for the whole call after the wait, when the client has a
    /// [`call_timeout`](crate::ClientBuilder::call_timeout).
    pub left: Option<Duration>,
}

/// Told about the client's requests. Called on the request's task, right after each attempt:
/// keep it cheap (count, observe a histogram) and never block. Every method has a default
/// that does nothing, so an observer implements only what it records.
pub trait Observer: Send + Sync + 'static {
    /// An attempt finished (successfully or not).
    fn request(&self, event: &RequestEvent<'_>) {
        let _ = event;
    }

    /// A call is about to be tried again (after `event.delay`).
    fn retrying(&self, event: &RetryEvent<'_>) {
        let _ = event;
    }

    /// A `_bulk_docs` reply refused `count` (≥ 1) of its documents with `conflict` (a stale
    /// `_rev`, or a create of an id that exists); the request itself succeeded.
    fn bulk_conflicts(&self, count: u64) {
        let _ = count;
    }
}
