//! `/v1/orders`: the order ledger — purchase, payments, refunds, adjustments, shipments,
//! deliveries; an order's balance and entries; outstanding orders; a customer's statement.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use couch_ledger::{
    Adjustment, Delivered, Payment, Purchase, Recorded, Refund, Shipment, OUTSTANDING_LIMIT_MAX,
};

use super::api::{
    AdjustmentRequest, DeliveryRequest, ErrorBody, OrderBody, OrdersQuery, OutstandingBody,
    PaymentRequest, PurchaseBody, PurchaseQuery, RecordedBody, RefundRequest, ShipmentRequest,
    StatementBody,
};
use super::error::ApiError;
use super::extract::{IdPath, JsonBody, QueryParams, RawBody};
use super::schema::Id;
use super::{amount, currency, page_limit, record_status, AppState};

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
    operation_id = "putPurchase",
    tag = "orders",
    params(("order_id" = Id, Path, description = "The order"), PurchaseQuery),
    request_body(content = PurchaseBody, description = "Cloudant's purchase shape, decimal amounts"),
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 202, description = "Written to some copies of a cluster's database, not yet every one (`status: uncertain`): send it again later to confirm", body = RecordedBody),
        (status = 400, description = "Invalid (`invalid_input`; `field` names what, see the body's rules); nothing written", body = ErrorBody),
        (status = 409, description = "The order has a purchase with other content (`mismatch`)", body = ErrorBody),
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
    let mut p: PurchaseBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(None, format!("purchase JSON: {e}")))?;
    match &p.order_id {
        Some(o) if *o != order_id => {
            return Err(ApiError::invalid(
                Some("order_id"),
                format!("the body's order_id {o:?} is not the path's {order_id:?}"),
            ))
        }
        _ => p.order_id = Some(order_id),
    }
    // A code in any case, as everywhere else; the library reads upper case.
    p.currency = p.currency.map(|c| c.to_ascii_uppercase());
    let text = serde_json::to_string(&p).expect("a parsed purchase serializes");
    let p =
        Purchase::from_json(&text, given).map_err(|e| ApiError::from_ledger(&e, String::new))?;
    written(state.ledger.record_purchase(&p).await)
}

/// Record a payment; it takes the balance down. The same payment again (same `ref`) answers
/// 200; the same `ref` with other content, 409.
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/payments",
    operation_id = "recordPayment",
    tag = "orders",
    params(("order_id" = Id, Path, description = "The order")),
    request_body = PaymentRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 202, description = "Written to some copies of a cluster's database, not yet every one (`status: uncertain`): send it again later to confirm", body = RecordedBody),
        (status = 400, description = "Invalid (`invalid_json`, `invalid_input`: a currency not the order's, an amount that would take one of the order's sums beyond 2^53 − 1 minor units…); nothing written", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order (`not_found`)", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content (`mismatch`)", body = ErrorBody),
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
        meta: req.meta.unwrap_or_default(),
    };
    written(state.ledger.record_payment(&p).await)
}

/// Record money given back to the customer; it adds to the balance.
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/refunds",
    operation_id = "recordRefund",
    tag = "orders",
    params(("order_id" = Id, Path, description = "The order")),
    request_body = RefundRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 202, description = "Written to some copies of a cluster's database, not yet every one (`status: uncertain`): send it again later to confirm", body = RecordedBody),
        (status = 400, description = "Invalid (`invalid_json`, `invalid_input`: a currency not the order's, an amount that would take one of the order's sums beyond 2^53 − 1 minor units…); nothing written", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order (`not_found`)", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content (`mismatch`)", body = ErrorBody),
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
        meta: req.meta.unwrap_or_default(),
    };
    written(state.ledger.record_refund(&r).await)
}

/// Record an adjustment of what the customer owes: positive adds, negative takes away.
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/adjustments",
    operation_id = "recordAdjustment",
    tag = "orders",
    params(("order_id" = Id, Path, description = "The order")),
    request_body = AdjustmentRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 202, description = "Written to some copies of a cluster's database, not yet every one (`status: uncertain`): send it again later to confirm", body = RecordedBody),
        (status = 400, description = "Invalid (`invalid_json`, `invalid_input`: a currency not the order's, an amount that would take one of the order's sums beyond 2^53 − 1 minor units…); nothing written", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order (`not_found`)", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content (`mismatch`)", body = ErrorBody),
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
        meta: req.meta.unwrap_or_default(),
    };
    written(state.ledger.record_adjustment(&a).await)
}

/// Record that an order was shipped (a status document; no money).
#[utoipa::path(
    post,
    path = "/v1/orders/{order_id}/shipments",
    operation_id = "recordShipment",
    tag = "orders",
    params(("order_id" = Id, Path, description = "The order")),
    request_body = ShipmentRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 202, description = "Written to some copies of a cluster's database, not yet every one (`status: uncertain`): send it again later to confirm", body = RecordedBody),
        (status = 400, description = "Invalid (`invalid_json`, `invalid_input`; `field` names it); nothing written", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order (`not_found`)", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content (`mismatch`)", body = ErrorBody),
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
    operation_id = "recordDelivery",
    tag = "orders",
    params(("order_id" = Id, Path, description = "The order")),
    request_body = DeliveryRequest,
    responses(
        (status = 201, description = "Recorded", body = RecordedBody),
        (status = 200, description = "Recorded before with the same content", body = RecordedBody),
        (status = 202, description = "Written to some copies of a cluster's database, not yet every one (`status: uncertain`): send it again later to confirm", body = RecordedBody),
        (status = 400, description = "Invalid (`invalid_json`, `invalid_input`; `field` names it); nothing written", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order (`not_found`)", body = ErrorBody),
        (status = 409, description = "This ref recorded with other content (`mismatch`)", body = ErrorBody),
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
    operation_id = "getOrder",
    tag = "orders",
    params(("order_id" = Id, Path, description = "The order")),
    responses(
        (status = 200, description = "The order", body = OrderBody),
        (status = 400, description = "A malformed id (`invalid_input`)", body = ErrorBody),
        (status = 404, description = "No purchase recorded for the order (`not_found`)", body = ErrorBody),
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
    operation_id = "listOutstandingOrders",
    tag = "orders",
    params(OrdersQuery),
    responses(
        (status = 200, description = "A page of outstanding orders", body = OutstandingBody),
        (status = 400, description = "Without outstanding=true, a bad limit or after, an unknown parameter (`invalid_input`)", body = ErrorBody),
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
    let limit = page_limit(q.limit, OUTSTANDING_LIMIT_DEFAULT, OUTSTANDING_LIMIT_MAX)?;
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
    operation_id = "getCustomerStatement",
    tag = "orders",
    params(("account_id" = Id, Path, description = "The customer (a purchase's account_id)")),
    responses(
        (status = 200, description = "The statement", body = StatementBody),
        (status = 400, description = "A malformed id (`invalid_input`)", body = ErrorBody),
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
