//! One HTTP exchange with the server, below the client's retries: a request goes out, a status
//! and a whole body come back, or the exchange fails on the way (a transport failure).
//!
//! A program always sends through reqwest. With the `testing` feature a client can be given a
//! [`Transport`] of its own instead (`ClientBuilder::transport`): the simulated CouchDB cluster
//! of the test suite answers there. Everything above this layer — retries, status mapping, the
//! ledger — is the same code either way.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A request as the client sends it.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireRequest {
    /// `GET`, `PUT`, `POST`, `DELETE`, `HEAD`.
    pub method: String,
    /// The path under the server's URL, each segment percent-encoded: `""` (the server),
    /// `"ledger"`, `"ledger/_bulk_docs"`, `"ledger/account%3Aalice"`.
    pub path: String,
    /// Query parameters, not encoded.
    pub query: Vec<(String, String)>,
    /// A JSON body.
    pub body: Option<Vec<u8>>,
    /// How long the client waits for this exchange, when not its default.
    pub timeout: Option<Duration>,
}

#[cfg_attr(not(feature = "testing"), allow(dead_code))]
impl WireRequest {
    /// The value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The server's answer, body read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireReply {
    /// HTTP status.
    pub status: u16,
    /// `Retry-After`, when the answer carried one.
    pub retry_after: Option<Duration>,
    /// The body.
    pub body: Vec<u8>,
}

/// An exchange that got no whole answer: refused, reset, or out of time. Whether the server
/// acted on the request is unknown.
#[derive(Debug)]
pub struct WireFailure {
    /// It ran out of time (rather than being refused or reset).
    pub timeout: bool,
    /// What happened.
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// What a `Transport` answers.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub type Exchange = Pin<Box<dyn Future<Output = Result<WireReply, WireFailure>> + Send>>;

/// Carries requests to a server other than over HTTP (feature `testing`): a simulated one.
#[cfg(feature = "testing")]
pub trait Transport: Send + Sync {
    /// Sends one request and waits for its answer.
    fn exchange(&self, request: WireRequest) -> Exchange;
}
