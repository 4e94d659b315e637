//! `/v1/transfers`: submit (idempotent by id or `Idempotency-Key`), read, cancel, reverse.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use couch_ledger::{State as TxnState, TransferOutcome, TransferRequest};

use super::api::{CreateTransfer, ErrorBody, OutcomeBody, TransferBody};
use super::error::ApiError;
use super::extract::{IdPath, RawBody};
use super::schema::{Id, IdempotencyKey};
use super::{amount, currency, parse_json, record_status, AppState, TransferId};

/// The header that carries a transfer's idempotency key (its id).
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Move money from one account to another with the two-phase protocol, driven to its end
/// before the answer unless `wait` is false. 201 whatever the end state (`done`, or
/// `cancelled` with its `reason`: nothing moved; `initial` where the accounts did not answer
/// within the worker's lease, left to the sweeper); the same id again with the same terms
/// answers 200 (`exists`) with the transfer's state; with other terms, 409. Every answer,
/// errors included, carries the transfer's `id` (made before anything is written).
#[utoipa::path(
    post,
    path = "/v1/transfers",
    operation_id = "createTransfer",
    tag = "transfers",
    request_body = CreateTransfer,
    params(
        ("Idempotency-Key" = Option<IdempotencyKey>, Header, nullable = false, description = "The transfer's id, instead of `id` in the body; when both are given they must be equal (else 400)")
    ),
    responses(
        (status = 201, description = "Created: `done`, or `cancelled` with its `reason` (or `initial`: with `wait: false`, or when the accounts did not answer within the worker's lease on a slow server; the sweeper finishes it, read it again)", body = OutcomeBody),
        (status = 200, description = "Exists: sent before with the same terms", body = OutcomeBody),
        (status = 400, description = "Invalid input (`invalid_json`, `invalid_input`; `field` names it; `from` = `to`; the header and the body's id differ); nothing written", body = ErrorBody),
        (status = 409, description = "The id exists with other terms (`mismatch`)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Response {
    let header_id = match headers.get(IDEMPOTENCY_KEY).map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => Some(v.trim().to_owned()),
        Some(Err(_)) => {
            state.metrics.transfer("rejected");
            return ApiError::invalid(Some("id"), "the Idempotency-Key header is not text")
                .into_response();
        }
    };
    let parsed = parse_json::<CreateTransfer>(&body);
    let body_id = parsed.as_ref().ok().and_then(|r| r.id.clone());
    let id = match (header_id, body_id) {
        (Some(h), Some(b)) if h != b => {
            state.metrics.transfer("rejected");
            return ApiError::invalid(
                Some("id"),
                format!("the Idempotency-Key header ({h:?}) and the body's id ({b:?}) differ"),
            )
            .with_id(&h)
            .into_response();
        }
        (Some(h), _) => h,
        (None, Some(b)) => b,
        (None, None) => uuid::Uuid::now_v7().to_string(),
    };
    let result = match parsed {
        Ok(req) => submit(&state, id.clone(), req).await,
        Err(e) => Err(e),
    };
    answer(&state, &id, result, None)
}

async fn submit(
    state: &AppState,
    id: String,
    req: CreateTransfer,
) -> Result<TransferOutcome, ApiError> {
    let request = TransferRequest {
        id: Some(id),
        source: req.from,
        destination: req.to,
        amount: amount("amount", req.amount)?,
        currency: currency(&req.currency)?,
        meta: req.meta.unwrap_or_default(),
    };
    let (ledger, wait) = (state.ledger.clone(), req.wait.unwrap_or(true));
    to_the_end(async move { ledger.submit(request, wait).await }).await
}

/// Runs a transfer call as a task of its own: a caller that hangs up mid-request does not cut
/// the protocol short (it would be safe — the sweeper finishes any step — but later), and a
/// stop signal lets it finish.
async fn to_the_end<F>(call: F) -> Result<TransferOutcome, ApiError>
where
    F: std::future::Future<Output = couch_ledger::Result<TransferOutcome>> + Send + 'static,
{
    match tokio::spawn(call).await {
        Ok(result) => result.map_err(|e| ApiError::from_ledger(&e, String::new)),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the transfer task failed: {e}"),
        )),
    }
}

/// A transfer call's answer, counted in the metrics by outcome.
fn answer(
    state: &AppState,
    id: &str,
    result: Result<TransferOutcome, ApiError>,
    reverses: Option<&str>,
) -> Response {
    match result {
        Ok(o) => {
            state.metrics.transfer(o.state.as_str());
            let mut body = OutcomeBody::from(&o);
            body.reverses = reverses.map(str::to_owned);
            let mut response = (record_status(o.status), Json(body)).into_response();
            response.extensions_mut().insert(TransferId(o.id));
            response
        }
        Err(e) => {
            state.metrics.transfer(if e.status().is_client_error() {
                "rejected"
            } else {
                "error"
            });
            e.with_id(id).into_response()
        }
    }
}

/// One transfer: its terms, state, reason and claim.
#[utoipa::path(
    get,
    path = "/v1/transfers/{id}",
    operation_id = "getTransfer",
    tag = "transfers",
    params(("id" = Id, Path, description = "The transfer id")),
    responses(
        (status = 200, description = "The transfer", body = TransferBody),
        (status = 400, description = "A malformed id (`invalid_input`)", body = ErrorBody),
        (status = 404, description = "No such transfer (`not_found`)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn get(State(state): State<AppState>, IdPath(id): IdPath) -> Response {
    match state.ledger.transfer(&id).await {
        Ok(t) => {
            let mut response = Json(TransferBody::from(&t)).into_response();
            response.extensions_mut().insert(TransferId(id));
            response
        }
        Err(e) => ApiError::from_ledger(&e, || format!("no transfer {id:?}"))
            .with_id(&id)
            .into_response(),
    }
}

/// Cancel a transfer not yet committed (undoing whatever it applied). A cancelled one is
/// answered as it is; a committed or done one is 409 (reverse it instead).
#[utoipa::path(
    post,
    path = "/v1/transfers/{id}/cancel",
    operation_id = "cancelTransfer",
    tag = "transfers",
    params(("id" = Id, Path, description = "The transfer id")),
    responses(
        (status = 200, description = "Cancelled (now or before)", body = OutcomeBody),
        (status = 400, description = "A malformed id (`invalid_input`)", body = ErrorBody),
        (status = 404, description = "No such transfer (`not_found`)", body = ErrorBody),
        (status = 409, description = "Committed or done: reverse it instead (`not_cancellable`); or in a state no cancel applies to (`invalid_state`)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn cancel(State(state): State<AppState>, IdPath(id): IdPath) -> Response {
    let (ledger, txn) = (state.ledger.clone(), id.clone());
    match tokio::spawn(async move { ledger.cancel(&txn).await }).await {
        Ok(Ok(o)) => {
            let mut response = Json(OutcomeBody::from(&o)).into_response();
            response.extensions_mut().insert(TransferId(o.id));
            response
        }
        Ok(Err(e)) => ApiError::from_ledger(&e, || format!("no transfer {id:?}"))
            .with_id(&id)
            .into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the cancel task failed: {e}"),
        )
        .with_id(&id)
        .into_response(),
    }
}

/// Undo a committed or done transfer with a new one in the other direction, id `rev-{id}`,
/// driven to its end; once only (again answers the first reversal, 200).
#[utoipa::path(
    post,
    path = "/v1/transfers/{id}/reverse",
    operation_id = "reverseTransfer",
    tag = "transfers",
    params(("id" = Id, Path, description = "The transfer to reverse")),
    responses(
        (status = 201, description = "The reversal (its own id, `reverses`)", body = OutcomeBody),
        (status = 200, description = "Reversed before: the first reversal", body = OutcomeBody),
        (status = 400, description = "A malformed id (`invalid_input`)", body = ErrorBody),
        (status = 404, description = "No such transfer (`not_found`)", body = ErrorBody),
        (status = 409, description = "Not committed or done, or it cannot be reversed again (`not_reversible`)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn reverse(State(state): State<AppState>, IdPath(id): IdPath) -> Response {
    let result = async {
        let t = state
            .ledger
            .transfer(&id)
            .await
            .map_err(|e| ApiError::from_ledger(&e, || format!("no transfer {id:?}")))?;
        if !matches!(t.state, TxnState::Committed | TxnState::Done) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "not_reversible",
                format!(
                    "transfer {id} is {}: only a committed or done transfer can be reversed",
                    t.state
                ),
            ));
        }
        let (ledger, txn) = (state.ledger.clone(), id.clone());
        to_the_end(async move { ledger.reverse(&txn).await })
            .await
            .map_err(|e| {
                // The id was read above, so what the library refuses now is the transfer's
                // state, not the request: still settling, every attempt cancelled, or a
                // reversal id that would be too long.
                if e.status() == StatusCode::BAD_REQUEST && e.field() == Some("id") {
                    e.recoded(StatusCode::CONFLICT, "not_reversible")
                } else {
                    e
                }
            })
    }
    .await;
    answer(&state, &id, result, Some(&id))
}
