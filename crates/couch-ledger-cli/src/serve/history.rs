//! `/v1/accounts/{id}/history`: an account's transfers, newest first, a page at a time; and
//! the `at` of `GET /v1/accounts/{id}` (its parameter and `as_of` answer). Bodies here, not
//! in `api.rs`, with their handler: they are this endpoint's alone.

use axum::extract::State;
use axum::Json;
use couch_ledger::{
    parse_time_ms, HistoryCursor, HistoryEntry, HistoryPage, HistoryQuery, HISTORY_LIMIT_DEFAULT,
    HISTORY_LIMIT_MAX,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::api::ErrorBody;
use super::error::ApiError;
use super::extract::{IdPath, QueryParams};
use super::schema::{HistoryCursorText, Id, MinorUnits, Time};
use super::{page_limit, AppState};

// The attributes below must spell these limits as literals.
const _: () = assert!(HISTORY_LIMIT_MAX == 1000);
const _: () = assert!(HISTORY_LIMIT_DEFAULT == 50);

/// `GET /v1/accounts/{id}/history?from=&to=&limit=&after=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct HistoryParams {
    /// Only transfers that took effect at or after this time.
    #[param(value_type = Option<Time>)]
    pub(crate) from: Option<String>,
    /// Only transfers that took effect at or before this time.
    #[param(value_type = Option<Time>)]
    pub(crate) to: Option<String>,
    /// At most this many transfers [default: 50].
    #[param(minimum = 1, maximum = 1000, value_type = Option<u64>)]
    pub(crate) limit: Option<usize>,
    /// Go on after the last transfer of the previous page: its `next`.
    #[param(value_type = Option<HistoryCursorText>)]
    pub(crate) after: Option<String>,
}

/// `GET /v1/accounts/{id}?at=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AccountParams {
    /// Also the balance as of this time (`as_of`): the opening plus every committed or done
    /// transfer that took effect at or before it.
    #[param(value_type = Option<Time>)]
    pub(crate) at: Option<String>,
}

/// One transfer in an account's history (as `account history --json`'s `entries`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HistoryEntryBody {
    /// Transfer id.
    pub(crate) txn: String,
    /// When it took effect (its decision was written), ms since the epoch.
    pub(crate) decided_at: i64,
    /// What it did to this account: −amount as the source, +amount as the destination.
    #[schema(value_type = MinorUnits)]
    pub(crate) delta: i64,
    /// The account's balance right after it.
    #[schema(value_type = MinorUnits)]
    pub(crate) balance_after: i64,
    /// The transfer's other account.
    pub(crate) counterparty: String,
    /// `committed` or `done`: the money has moved either way.
    #[schema(pattern = "^(committed|done)$")]
    pub(crate) state: String,
    /// For a reversal, the transfer it reverses; `null` otherwise.
    #[schema(required = true)]
    pub(crate) reverses: Option<String>,
}

impl From<&HistoryEntry> for HistoryEntryBody {
    fn from(e: &HistoryEntry) -> HistoryEntryBody {
        HistoryEntryBody {
            txn: e.txn.clone(),
            decided_at: e.decided_at,
            delta: e.delta.minor(),
            balance_after: e.balance_after.minor(),
            counterparty: e.counterparty.clone(),
            state: e.state.as_str().to_owned(),
            reverses: e.reverses.clone(),
        }
    }
}

/// A page of an account's history, newest first (as `account history --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HistoryBody {
    /// Account id.
    pub(crate) account: String,
    /// ISO-4217 code, as the account's document holds it.
    pub(crate) currency: String,
    /// Opening balance.
    #[schema(value_type = MinorUnits)]
    pub(crate) opening: i64,
    /// The transfers, newest first.
    pub(crate) entries: Vec<HistoryEntryBody>,
    /// Pass as `after` for the next (older) page; `null` at the end.
    #[schema(value_type = Option<HistoryCursorText>, required = true)]
    pub(crate) next: Option<String>,
}

impl From<&HistoryPage> for HistoryBody {
    fn from(p: &HistoryPage) -> HistoryBody {
        HistoryBody {
            account: p.account.clone(),
            currency: p.currency.clone(),
            opening: p.opening.minor(),
            entries: p.entries.iter().map(HistoryEntryBody::from).collect(),
            next: p.next.as_ref().map(ToString::to_string),
        }
    }
}

/// A time from a query parameter, or a 400 naming it.
pub(crate) fn time_param(field: &str, text: Option<&str>) -> Result<Option<i64>, ApiError> {
    text.map(|t| parse_time_ms(field, t))
        .transpose()
        .map_err(|e| ApiError::invalid(Some(field), e.to_string()))
}

impl HistoryParams {
    fn query(&self) -> Result<HistoryQuery, ApiError> {
        let limit = page_limit(self.limit, HISTORY_LIMIT_DEFAULT, HISTORY_LIMIT_MAX)?;
        let after = self
            .after
            .as_deref()
            .map(HistoryCursor::parse)
            .transpose()
            .map_err(|e| ApiError::invalid(Some("after"), e.to_string()))?;
        Ok(HistoryQuery {
            from: time_param("from", self.from.as_deref())?,
            to: time_param("to", self.to.as_deref())?,
            limit,
            after,
        })
    }
}

/// An account's transfers, newest first: each committed or done transfer that touched it
/// (reversals too, with `reverses`), when it took effect, its delta on this account and the
/// balance right after it; cancelled transfers moved nothing and are not listed. A page at a
/// time: `next` goes on. Read from a view, which on a cluster is one copy's and may lag a
/// moment behind the latest transfers (never a wrong sum of what it has).
#[utoipa::path(
    get,
    path = "/v1/accounts/{id}/history",
    operation_id = "getAccountHistory",
    tag = "accounts",
    params(("id" = Id, Path, description = "The account id"), HistoryParams),
    responses(
        (status = 200, description = "A page of the account's history", body = HistoryBody),
        (status = 400, description = "A malformed id, a bad time, limit or cursor, an unknown parameter (`invalid_input`; `field` names it)", body = ErrorBody),
        (status = 404, description = "No such account (`not_found`)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn history(
    State(state): State<AppState>,
    IdPath(id): IdPath,
    QueryParams(params): QueryParams<HistoryParams>,
) -> Result<Json<HistoryBody>, ApiError> {
    let query = params.query()?;
    let page = state
        .ledger
        .account_history(&id, query)
        .await
        .map_err(|e| ApiError::from_ledger(&e, || format!("no account {id:?}")))?;
    Ok(Json(HistoryBody::from(&page)))
}
