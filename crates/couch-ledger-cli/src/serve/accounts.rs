//! `/v1/accounts`: create, read one, list.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use couch_ledger::AccountSpec;

use super::api::{AccountBody, AccountList, AsOfBody, CreateAccount, ErrorBody, RecordedBody};
use super::error::ApiError;
use super::extract::{IdPath, JsonBody, QueryParams};
use super::history::{time_param, AccountParams};
use super::schema::Id;
use super::{amount, currency, record_status, AppState};

/// Create an account. The same terms again answer 200 (`exists`); other terms, 409.
#[utoipa::path(
    post,
    path = "/v1/accounts",
    operation_id = "createAccount",
    tag = "accounts",
    request_body = CreateAccount,
    responses(
        (status = 201, description = "Created", body = RecordedBody),
        (status = 200, description = "Exists with the same currency, opening and minimum", body = RecordedBody),
        (status = 400, description = "Invalid input (`invalid_json`, `invalid_input`; `field` names it); nothing written", body = ErrorBody),
        (status = 409, description = "Exists with other terms (`mismatch`; `field` names the first)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CreateAccount>,
) -> Result<(StatusCode, Json<RecordedBody>), ApiError> {
    let c = currency(&req.currency)?;
    let spec = AccountSpec {
        account_id: req.account_id.clone(),
        currency: c,
        opening: amount("opening", req.opening)?,
        min_balance: req
            .min_balance
            .map(|m| amount("min_balance", m))
            .transpose()?,
        meta: req.meta.unwrap_or_default(),
    };
    let r = state
        .ledger
        .create_account(spec)
        .await
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    let mut body = RecordedBody::from(&r);
    body.account = Some(req.account_id);
    Ok((record_status(r.status), Json(body)))
}

/// One account's balances and the transfers applied to it and not yet settled; with `at`, also
/// its balance as of that time (`as_of`), read from a view that on a cluster is one copy's and
/// may lag a moment behind the latest transfers.
#[utoipa::path(
    get,
    path = "/v1/accounts/{id}",
    operation_id = "getAccount",
    tag = "accounts",
    params(("id" = Id, Path, description = "The account id"), AccountParams),
    responses(
        (status = 200, description = "The account", body = AccountBody),
        (status = 400, description = "A malformed id or time (`invalid_input`)", body = ErrorBody),
        (status = 404, description = "No such account (`not_found`)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    IdPath(id): IdPath,
    QueryParams(params): QueryParams<AccountParams>,
) -> Result<Json<AccountBody>, ApiError> {
    let read = match time_param("at", params.at.as_deref())? {
        None => state.ledger.account(&id).await.map(|view| (view, None)),
        Some(at) => state.ledger.balance_at(&id, at).await.map(|b| {
            let as_of = AsOfBody {
                at: b.at,
                balance: b.balance.minor(),
            };
            (b.account, Some(as_of))
        }),
    };
    let (view, as_of) =
        read.map_err(|e| ApiError::from_ledger(&e, || format!("no account {id:?}")))?;
    let mut body = AccountBody::from(&view);
    body.as_of = as_of;
    Ok(Json(body))
}

/// Every account with its balances.
#[utoipa::path(
    get,
    path = "/v1/accounts",
    operation_id = "listAccounts",
    tag = "accounts",
    responses(
        (status = 200, description = "The accounts", body = AccountList),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<AccountList>, ApiError> {
    let accounts = state
        .ledger
        .all_accounts()
        .await
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    Ok(Json(AccountList {
        accounts: accounts.iter().map(AccountBody::from).collect(),
    }))
}
