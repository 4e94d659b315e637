//! Extractors whose refusals are answered like every other error (`{"error", "message"}`),
//! not with axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Bytes of a request body at most (a purchase is one small document).
pub(crate) const BODY_BYTES_MAX: usize = 1024 * 1024;

/// A JSON body, any content type (curl's `-d` sends a form type), parsed with serde: unknown
/// fields, a fraction where minor units are due, a missing field are all 400 `invalid_json`.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = RawBody::from_request(req, state).await?.0;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("the request body is not what this endpoint takes: {e}"),
            )
        })
    }
}

/// The body's bytes, at most [`BODY_BYTES_MAX`].
pub(crate) struct RawBody(pub(crate) Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(req, state)
            .await
            .map(RawBody)
            .map_err(|e| {
                let status = e.status();
                if status == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        status,
                        "too_large",
                        format!("the request body is over {BODY_BYTES_MAX} bytes"),
                    )
                } else {
                    ApiError::new(status, "invalid_input", e.body_text())
                }
            })
    }
}

/// Query parameters; unknown or malformed ones are 400.
pub(crate) struct QueryParams<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryParams(q.0))
            .map_err(|e| ApiError::invalid(None, e.body_text()))
    }
}

/// The one `{…}` segment of a path (an account, transfer or order id), percent-decoded.
pub(crate) struct IdPath(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|p| IdPath(p.0))
            .map_err(|e| ApiError::invalid(None, e.body_text()))
    }
}
