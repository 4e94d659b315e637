//! `/v1/orders`: the order ledger — purchase, payments, refunds, adjustments, shipments,
//! deliveries; an order's balance and entries; outstanding orders; a customer's statement.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use couch_ledger::{
    Adjustment, Delivered, Payment, Purchase, Recorded, Refund, Shipment, OUTSTANDING_LIMIT_MAX,
};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::api::{
    AdjustmentRequest, DeliveryRequest, ErrorBody, OrderBody, OrdersQuery, OutstandingBody,
    PaymentRequest, PurchaseBody, PurchaseQuery, RecordedBody, RefundRequest, ShipmentRequest,
    StatementBody,
};
use super::error::ApiError;
use super::extract::{IdPath, JsonBody, QueryParams, RawBody};
use super::{amount, currency, record_status, AppState};

/// `GET /v1/orders` without `limit`.
const OUTSTANDING_LIMIT_DEFAULT: usize = 100;

type Written = Result<(StatusCode, Json<RecordedBody>), ApiError>;

fn written(r: couch_ledger::Result<Recorded>) -> Written {
    let r = r.map_err(|e| ApiError::from_ledger(&e, String::new))?;
    Ok((record_status(r.status), Json(RecordedBody::from(&r))))
}

/// Record the order's purchase in Cloudant's shape (decimal amounts, parsed exactly). The same
/// purchase again answers 200 (`exists`); other content for the order, 409.
#[utoipa::path(
    put,
    path = "/v1/orders/{order_id}/purchase",
    tag = "orders",
    params(("order_id" = String, Path, description = "The order"), PurchaseQuery),
    request_body(content = PurchaseBody, description = "Cloudant's purchase shape, decimal amounts"),
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 400, description = "Invalid (`field` names what); nothing written", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 409, description = "The order has a purchase with other content", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn purchase(
    State(state): State<AppState>,
    IdPath(order_id): IdPath,
    QueryParams(query): QueryParams<PurchaseQuery>,
    RawBody(body): RawBody,
) -> Written {
    let given = query.currency.as_deref().map(currency).transpose()?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::invalid(None, "the purchase is not UTF-8 text"))?;
    let text = with_order_id(text, &order_id)?;
    let p =
        Purchase::from_json(&text, given).map_err(|e| ApiError::from_ledger(&e, String::new))?;
    written(state.ledger.record_purchase(&p).await)
}

/// The purchase's JSON text with `order_id` set to the path's: left as is when it names the
/// same order, added when missing. Amounts are never parsed here (the library reads them as
/// exact decimals), so the other fields are carried as raw JSON text.
fn with_order_id(text: &str, order_id: &str) -> Result<String, ApiError> {
    #[derive(Deserialize)]
    struct OrderIdOnly {
        order_id: Option<String>,
    }
    let bad = |e: serde_json::Error| ApiError::invalid(None, format!("purchase JSON: {e}"));
    let named: OrderIdOnly = serde_json::from_str(text).map_err(bad)?;
    match named.order_id {
        Some(o) if o == order_id => Ok(text.to_owned()),
        Some(o) => Err(ApiError::invalid(
            Some("order_id"),
            format!("the body's order_id {o:?} is not the path's {order_id:?}"),
        )),
        None => {
            let mut fields: BTreeMap<String, Box<RawValue>> =
                serde_json::from_str(text).map_err(bad)?;
            let id = serde_json::to_string(order_id).expect("a string serializes");
            fields.insert(
                "order_id".to_owned(),
                RawValue::from_string(id).expect("a JSON string"),
            );
            Ok(serde_json::to_string(&fields).expect("raw values serialize"))
        }
    }
}

/// Record a payment; it takes the balance down. The same payment again (same `ref`) answers
/// 200; the same `ref` with other content, 409.
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/payments",
    tag = "orders",
    params(("order_id" = String, Path, description = "The order")),
    request_body = PaymentRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 400, description = "Invalid (amount not positive, other currency…); nothing written", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn payment(
    State(state): State<AppState>,
    IdPath(order_id): IdPath,
    JsonBody(req): JsonBody<PaymentRequest>,
) -> Written {
    let p = Payment {
        order_id,
        reference: req.reference,
        amount: amount("amount", req.amount)?,
        currency: currency(&req.currency)?,
        method: req.method,
    };
    written(state.ledger.record_payment(&p).await)
}

/// Record money given back to the customer; it adds to the balance.
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/refunds",
    tag = "orders",
    params(("order_id" = String, Path, description = "The order")),
    request_body = RefundRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 400, description = "Invalid; nothing written", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn refund(
    State(state): State<AppState>,
    IdPath(order_id): IdPath,
    JsonBody(req): JsonBody<RefundRequest>,
) -> Written {
    let r = Refund {
        order_id,
        reference: req.reference,
        amount: amount("amount", req.amount)?,
        currency: currency(&req.currency)?,
        reason: req.reason,
    };
    written(state.ledger.record_refund(&r).await)
}

/// Record an adjustment of what the customer owes: positive adds, negative takes away.
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/adjustments",
    tag = "orders",
    params(("order_id" = String, Path, description = "The order")),
    request_body = AdjustmentRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 400, description = "Invalid (a zero amount…); nothing written", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn adjustment(
    State(state): State<AppState>,
    IdPath(order_id): IdPath,
    JsonBody(req): JsonBody<AdjustmentRequest>,
) -> Written {
    let a = Adjustment {
        order_id,
        reference: req.reference,
        amount: amount("amount", req.amount)?,
        currency: currency(&req.currency)?,
        reason: req.reason,
    };
    written(state.ledger.record_adjustment(&a).await)
}

/// Record that an order was shipped (a status document; no money).
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/shipments",
    tag = "orders",
    params(("order_id" = String, Path, description = "The order")),
    request_body = ShipmentRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 400, description = "Invalid; nothing written", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn shipment(
    State(state): State<AppState>,
    IdPath(order_id): IdPath,
    JsonBody(req): JsonBody<ShipmentRequest>,
) -> Written {
    let s = Shipment {
        order_id,
        reference: req.reference,
        carrier: req.carrier,
    };
    s.validate()
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    written(state.ledger.record_shipment(&s).await)
}

/// Record that an order was delivered (a status document; no money).
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/deliveries",
    tag = "orders",
    params(("order_id" = String, Path, description = "The order")),
    request_body = DeliveryRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 400, description = "Invalid; nothing written", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn delivery(
    State(state): State<AppState>,
    IdPath(order_id): IdPath,
    JsonBody(req): JsonBody<DeliveryRequest>,
) -> Written {
    let d = Delivered {
        order_id,
        reference: req.reference,
    };
    d.validate()
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    written(state.ledger.record_delivery(&d).await)
}

/// An order's total, adjustments, payments, refunds and balance, and its entries (one view
/// request).
#[utoipa::path(
    get,
    path = "/v1/orders/{order_id}",
    tag = "orders",
    params(("order_id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "The order", body = OrderBody),
        (status = 400, description = "A malformed id", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    IdPath(order_id): IdPath,
) -> Result<Json<OrderBody>, ApiError> {
    let s = state
        .ledger
        .order(&order_id)
        .await
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    Ok(Json(OrderBody::from(&s)))
}

/// Orders that are not settled, by order id, a page at a time (`outstanding=true` is
/// required: it is the only listing).
#[utoipa::path(
    get,
    path = "/v1/orders",
    tag = "orders",
    params(OrdersQuery),
    responses(
        (status = 200, description = "A page of outstanding orders", body = OutstandingBody),
        (status = 400, description = "Without outstanding=true, or a bad limit", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    QueryParams(q): QueryParams<OrdersQuery>,
) -> Result<Json<OutstandingBody>, ApiError> {
    if q.outstanding != Some(true) {
        return Err(ApiError::invalid(
            Some("outstanding"),
            "only the outstanding orders can be listed: add outstanding=true",
        ));
    }
    let limit = q.limit.unwrap_or(OUTSTANDING_LIMIT_DEFAULT);
    if limit == 0 || limit > OUTSTANDING_LIMIT_MAX {
        return Err(ApiError::invalid(
            Some("limit"),
            format!("must be between 1 and {OUTSTANDING_LIMIT_MAX}"),
        ));
    }
    let page = state
        .ledger
        .outstanding_orders(limit, q.after.as_deref())
        .await
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    Ok(Json(OutstandingBody::from(&page)))
}

/// A customer's orders (by the purchases' `account_id`) with their balances, and totals per
/// currency.
#[utoipa::path(
    get,
    path = "/v1/customers/{account_id}/statement",
    tag = "orders",
    params(("account_id" = String, Path, description = "The customer (a purchase's account_id)")),
    responses(
        (status = 200, description = "The statement", body = StatementBody),
        (status = 400, description = "A malformed id", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 503, description = "CouchDB unreachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn statement(
    State(state): State<AppState>,
    IdPath(account_id): IdPath,
) -> Result<Json<StatementBody>, ApiError> {
    let s = state
        .ledger
        .customer_statement(&account_id)
        .await
        .map_err(|e| ApiError::from_ledger(&e, String::new))?;
    Ok(Json(StatementBody::from(&s)))
}
