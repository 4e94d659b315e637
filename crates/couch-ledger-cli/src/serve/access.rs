//! One structured log line per request (method, path, status, duration, transfer id) and the
//! service's own HTTP metrics. Never the query string, a header or a body: no key or personal
//! data ends up in the log.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::{AppState, TransferId};

/// The outermost middleware: it sees every answer, 401s and 404s included.
pub(crate) async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let in_flight = state.metrics.http_started();
    let response = next.run(req).await;
    drop(in_flight);
    let took = started.elapsed();
    let status = response.status().as_u16();
    state
        .metrics
        .http_answered(method.as_str(), &route, status, took);
    let transfer_id = response
        .extensions()
        .get::<TransferId>()
        .map(|t| t.0.as_str());
    tracing::info!(
        target: "couch_ledger::access",
        method = %method,
        path = %path,
        status,
        duration_ms = (took.as_secs_f64() * 1e6).round() / 1e3,
        transfer_id,
        "request"
    );
    response
}
