//! For operators: `/healthz`, `/readyz`, `/metrics`, `/openapi.json`, and the ledger's
//! `/v1/status` and `/v1/verify`.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use couch_ledger::VerifyOptions;

use super::api::{ErrorBody, HealthBody, ReadyBody, StatusBody, VerifyBody, VerifyQuery};
use super::error::ApiError;
use super::extract::QueryParams;
use super::AppState;

/// A scrape waits at most this long for the ledger's status (several view requests); past it
/// the per-state figures keep their last values and `status_up` is 0, so a slow CouchDB never
/// makes `/metrics` itself slow.
const STATUS_SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// `/readyz` waits at most this long for CouchDB.
const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// The process is up (no CouchDB request).
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "getHealth",
    tag = "operations",
    responses((status = 200, description = "Up", body = HealthBody))
)]
pub(crate) async fn healthz() -> Json<HealthBody> {
    Json(HealthBody {
        status: "ok".to_owned(),
    })
}

/// CouchDB answers and this version's design documents (views, validation) are installed
/// unchanged (one `_all_docs` request).
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "getReadiness",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = ReadyBody),
        (status = 503, description = "CouchDB unreachable, the database missing, or design documents missing or changed (`not_ready`: run init)", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait before asking again"))),
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    let client = state.ledger.client();
    let not_ready = |message: String| {
        let mut r =
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", message).into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(5u32));
        r
    };
    match tokio::time::timeout(READY_TIMEOUT, state.ledger.design_drift()).await {
        Err(_) => not_ready(format!("CouchDB did not answer within {READY_TIMEOUT:?}")),
        Ok(Err(e)) => ApiError::from_ledger(&e, String::new).into_response(),
        Ok(Ok(problems)) if problems.is_empty() => Json(ReadyBody {
            ready: true,
            database: client.database().to_owned(),
        })
        .into_response(),
        Ok(Ok(problems)) => not_ready(
            problems
                .iter()
                .map(|(_, what)| what.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    }
}

/// Prometheus metrics (OpenMetrics text).
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "getMetrics",
    tag = "operations",
    responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text", body = String))
)]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    match tokio::time::timeout(STATUS_SCRAPE_TIMEOUT, state.ledger.status()).await {
        Ok(Ok(s)) => state.metrics.set_status(Some(&s)),
        Ok(Err(e)) => {
            tracing::warn!("metrics: could not read the ledger's status: {e}");
            state.metrics.set_status(None);
        }
        Err(_) => state.metrics.set_status(None),
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// This OpenAPI 3 document, generated from the routes themselves.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "getOpenApi",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object))
)]
pub(crate) async fn openapi(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        state.openapi.as_str().to_owned(),
    )
        .into_response()
}

/// Transfers per state, the age of the oldest open one, money in flight, pending markers.
#[utoipa::path(
    get,
    path = "/v1/status",
    operation_id = "getStatus",
    tag = "operations",
    responses(
        (status = 200, description = "The status", body = StatusBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn status(State(state): State<AppState>) -> Result<Json<StatusBody>, ApiError> {
    let s = state
        .ledger
        .status()
        .await
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    Ok(Json(StatusBody::from(&s)))
}

/// The ledger's invariants (docs/PROTOCOL.md) and the figures behind each verdict. 200 whether or not
/// they hold: read `ok`.
#[utoipa::path(
    get,
    path = "/v1/verify",
    operation_id = "verifyLedger",
    tag = "operations",
    params(VerifyQuery),
    responses(
        (status = 200, description = "The verdicts", body = VerifyBody),
        (status = 400, description = "A malformed or unknown query parameter (`invalid_input`)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn verify(
    State(state): State<AppState>,
    QueryParams(q): QueryParams<VerifyQuery>,
) -> Result<Json<VerifyBody>, ApiError> {
    let options = if q.at_rest.unwrap_or(false) {
        VerifyOptions::at_rest()
    } else {
        VerifyOptions::default()
    };
    let report = state
        .ledger
        .verify_with(options)
        .await
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    Ok(Json(VerifyBody::from(&report)))
}
