//! `GET /v1/transfers?meta[KEY]=VALUE`: transfers found by their metadata, newest first, a page
//! at a time. The pair is also accepted as `meta.KEY=VALUE`. Bodies here, with their handler:
//! they are this endpoint's alone.

use axum::extract::{Query, State};
use axum::Json;
use couch_ledger::{
    MetaCursor, MetaPage, MetaQuery, META_SEARCH_LIMIT_DEFAULT, META_SEARCH_LIMIT_MAX,
};
use serde::Serialize;
use utoipa::ToSchema;

use super::api::{ErrorBody, TransferBody};
use super::error::ApiError;
use super::schema::{MetaCursorText, MetaFilter};
use super::AppState;

// The attributes below must spell these limits as literals.
const _: () = assert!(META_SEARCH_LIMIT_MAX == 1000);
const _: () = assert!(META_SEARCH_LIMIT_DEFAULT == 50);

/// A page of transfers found by their metadata (as `transfer list --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TransferListBody {
    /// The transfers, newest first by creation time, each as `GET /v1/transfers/{id}` answers.
    pub(crate) transfers: Vec<TransferBody>,
    /// Pass as `after` for the next (older) page; `null` at the end.
    #[schema(value_type = Option<MetaCursorText>, required = true)]
    pub(crate) next: Option<String>,
}

impl From<&MetaPage> for TransferListBody {
    fn from(p: &MetaPage) -> TransferListBody {
        TransferListBody {
            transfers: p.transfers.iter().map(TransferBody::from).collect(),
            next: p.next.as_ref().map(ToString::to_string),
        }
    }
}

/// The metadata key a query parameter names: `meta[KEY]` or `meta.KEY`.
fn meta_key(name: &str) -> Option<&str> {
    if let Some(rest) = name.strip_prefix("meta[") {
        return rest.strip_suffix(']');
    }
    name.strip_prefix("meta.")
}

/// The query from the raw parameters; an unknown, repeated or malformed one is a 400 naming it.
fn query(pairs: Vec<(String, String)>) -> Result<MetaQuery, ApiError> {
    let (mut limit, mut after, mut pair) = (None, None, None);
    for (name, value) in pairs {
        let repeated = || ApiError::invalid(Some(&name), format!("{name} is given twice"));
        match name.as_str() {
            "limit" => {
                let n: usize = value.parse().map_err(|_| {
                    ApiError::invalid(Some("limit"), format!("{value:?} is not a number"))
                })?;
                if limit.replace(n).is_some() {
                    return Err(repeated());
                }
            }
            "after" => {
                let c = MetaCursor::parse(&value)
                    .map_err(|e| ApiError::invalid(Some("after"), e.to_string()))?;
                if after.replace(c).is_some() {
                    return Err(repeated());
                }
            }
            other => {
                let Some(key) = meta_key(other) else {
                    return Err(ApiError::invalid(
                        Some(other),
                        format!("unknown parameter {other:?}: limit, after, meta[KEY]"),
                    ));
                };
                if pair.replace((key.to_owned(), value)).is_some() {
                    return Err(ApiError::invalid(
                        Some("meta"),
                        "name exactly one meta[KEY]=VALUE",
                    ));
                }
            }
        }
    }
    let Some((key, value)) = pair else {
        return Err(ApiError::invalid(
            Some("meta"),
            "name the transfers to find: meta[KEY]=VALUE (or meta.KEY=VALUE)",
        ));
    };
    Ok(MetaQuery {
        key,
        value,
        limit: limit.unwrap_or(META_SEARCH_LIMIT_DEFAULT),
        after,
    })
}

/// The transfers whose metadata holds one key and value, newest first by creation time, a page
/// at a time: `next` goes on. Read from a view, which on a cluster is one copy's and may lag a
/// moment behind the latest transfers.
#[utoipa::path(
    get,
    path = "/v1/transfers",
    operation_id = "listTransfers",
    tag = "transfers",
    params(
        ("meta" = MetaFilter, Query, style = DeepObject, explode = true, description = "The key and value to find: `meta[KEY]=VALUE` (or `meta.KEY=VALUE`)"),
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 1000, description = "At most this many transfers [default: 50]"),
        ("after" = Option<MetaCursorText>, Query, description = "Go on after the last transfer of the previous page: its `next`"),
    ),
    responses(
        (status = 200, description = "A page of transfers", body = TransferListBody),
        (status = 400, description = "No pair or two, a key or value metadata cannot hold, a bad limit or cursor, an unknown parameter (`invalid_input`; `field` names it)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Json<TransferListBody>, ApiError> {
    let query = query(pairs)?;
    let page = state
        .ledger
        .transfers_by_meta(&query)
        .await
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    Ok(Json(TransferListBody::from(&page)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn both_spellings_of_the_pair_are_read_and_anything_else_is_refused() {
        for name in ["meta[order]", "meta.order"] {
            let q = query(pairs(&[(name, "A-1"), ("limit", "5")])).unwrap();
            assert_eq!(
                (q.key.as_str(), q.value.as_str(), q.limit),
                ("order", "A-1", 5)
            );
        }
        for bad in [
            pairs(&[]),
            pairs(&[("meta[a]", "1"), ("meta[b]", "2")]),
            pairs(&[("meta[a]", "1"), ("other", "x")]),
            pairs(&[("meta[a]", "1"), ("limit", "x")]),
            pairs(&[("meta[a]", "1"), ("after", "nope")]),
        ] {
            assert!(query(bad.clone()).is_err(), "{bad:?}");
        }
    }
}
