//! Errors as HTTP answers: a status and `{"error": code, "message": …}` (docs/SERVICE.md). The
//! library's error is asked questions (`is_mismatch()`, `is_transient()`…), never parsed.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use couch_ledger::{Condition, TransitionError};

use super::api::ErrorBody;
use super::TransferId;

/// Seconds a caller is asked to wait when CouchDB could not be reached (the library has
/// already retried with backoff before giving up).
const RETRY_AFTER_UNAVAILABLE_S: u32 = 5;
/// Seconds to wait after a write that kept conflicting (someone else is busy on the same
/// documents).
const RETRY_AFTER_BUSY_S: u32 = 1;

/// An answer other than success.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    field: Option<String>,
    id: Option<String>,
    retry_after_s: Option<u32>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            id: None,
            retry_after_s: None,
        }
    }

    /// 400: the request is wrong; nothing was written.
    pub(crate) fn invalid(field: Option<&str>, message: impl Into<String>) -> Self {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", message);
        e.field = field.map(str::to_owned);
        e
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this endpoint needs `Authorization: Bearer <API key>`",
        )
    }

    /// The transfer this error is about: the body carries its id.
    pub(crate) fn with_id(mut self, id: &str) -> Self {
        self.id = Some(id.to_owned());
        self
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    pub(crate) fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// The same answer under another status and code; the message and field are kept.
    pub(crate) fn recoded(mut self, status: StatusCode, code: &'static str) -> Self {
        self.status = status;
        self.code = code;
        self
    }

    /// The library's error as an answer. `missing` is said for a 404 of the document itself.
    pub(crate) fn from_ledger(e: &couch_ledger::Error, missing: impl FnOnce() -> String) -> Self {
        let message = e.to_string();
        let field = e.field().map(str::to_owned);
        let mut out = if e.is_mismatch() {
            ApiError::new(StatusCode::CONFLICT, "mismatch", message)
        } else if is_unknown_order(e) {
            ApiError::not_found(message)
        } else if e.is_invalid_input() {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", message)
        } else if let Some(t) = e.transition() {
            let code = match t {
                TransitionError::AlreadyDone | TransitionError::AlreadyCommitted => {
                    "not_cancellable"
                }
                _ => "invalid_state",
            };
            ApiError::new(StatusCode::CONFLICT, code, message)
        } else if e.condition() == Some(Condition::NotFound)
            || (e.is_not_found() && matches!(e.reason(), Some("missing" | "deleted")))
        {
            ApiError::not_found(missing())
        } else if let Some(c) = e.condition().filter(|_| e.is_transient()) {
            // The ledger's own "not yet" (a decision on some copies of a cluster, a transfer
            // not decided within its lease, an account full of markers): said in its words, to
            // be tried again.
            let mut n = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, c.code(), message);
            n.retry_after_s = Some(RETRY_AFTER_UNAVAILABLE_S);
            n
        } else if e.is_not_found() {
            // The database itself is missing: the service is not ready (run init).
            let mut n = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                format!("{message} (is the database initialised? run `couch-ledger init`)"),
            );
            n.retry_after_s = Some(RETRY_AFTER_UNAVAILABLE_S);
            n
        } else if e.is_transient() {
            let mut n = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "couchdb_unavailable",
                message,
            );
            n.retry_after_s = Some(RETRY_AFTER_UNAVAILABLE_S);
            n
        } else if e.is_conflict() {
            let mut n = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message);
            n.retry_after_s = Some(RETRY_AFTER_BUSY_S);
            n
        } else if e.is_unauthorized() || e.is_forbidden() {
            ApiError::new(StatusCode::BAD_GATEWAY, "couchdb_refused", message)
        } else if e.is_decode() {
            ApiError::new(StatusCode::BAD_GATEWAY, "bad_gateway", message)
        } else {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
        };
        out.field = field;
        out
    }
}

/// The library reports an order without a purchase as invalid input (the CLI's exit 2); over
/// HTTP an unknown id is a 404. Its message is the only thing that tells it from a malformed
/// id, and the tests pin it.
fn is_unknown_order(e: &couch_ledger::Error) -> bool {
    e.is_invalid_input() && e.field() == Some("order_id") && e.to_string().contains("unknown order")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(
                status = self.status.as_u16(),
                code = self.code,
                "{}",
                self.message
            );
        }
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
            field: self.field,
            id: self.id.clone(),
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(id) = self.id {
            response.extensions_mut().insert(TransferId(id));
        }
        response
    }
}
