//! The order ledger (Cloudant's "grouping related documents"): a purchase, and then payments,
//! refunds, adjustments, shipments and deliveries, each its own immutable document that is
//! written once and never changed. The `orders/ledger` `_sum` view adds an order's signed
//! amounts up, so its balance is one request.
//!
//! Every id is deterministic (`payment:{order_id}:{reference}`…), so a retried write finds its
//! own document: the same content is [`RecordStatus::Exists`], other content is an error that
//! names the first field that differs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::couch::{ViewQuery, ViewRow};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::money::{plain_decimal, Amount, Currency};

/// The longest order id, reference or account id, in characters.
pub const ID_PART_LEN_MAX: usize = crate::limits::ID_CHARS_MAX;
/// The most orders [`Ledger::outstanding_orders`] returns in one page.
pub const OUTSTANDING_LIMIT_MAX: usize = 1000;

/// The longest free text (a method, reason, carrier, title…), in characters.
pub const TEXT_LEN_MAX: usize = 1000;
/// The most items a basket may hold (a purchase is one document; keep it small).
pub const BASKET_ITEMS_MAX: usize = 1000;
/// Rows asked for in one view or `_all_docs` request when paging.
const VIEW_PAGE_ROWS: usize = 500;
/// View requests one call of [`Ledger::outstanding_orders`] may send before it returns a cursor.
const OUTSTANDING_PAGES_MAX: usize = 20;
/// View requests [`Ledger::customer_statement`] may send; more orders than this covers is an
/// error rather than a statement that silently leaves some out.
const STATEMENT_PAGES_MAX: usize = 20;
/// Attempts at a write-once document (a create that conflicts with a document that is gone by
/// the time we read it is written again).
const WRITE_ATTEMPTS_MAX: usize = 3;

// A page must make progress after skipping the row of its start key.
const _: () = assert!(VIEW_PAGE_ROWS >= 2);
const _: () = assert!(OUTSTANDING_LIMIT_MAX <= VIEW_PAGE_ROWS * OUTSTANDING_PAGES_MAX);

// ---- inputs ---------------------------------------------------------------------------------

/// A purchase: the order's contents and what it costs, in the Cloudant shape. Written once as
/// `purchase:{order_id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purchase {
    /// Names the order; every later entry refers to it.
    pub order_id: String,
    /// The customer's account (the key of their statement).
    pub account_id: String,
    /// The currency of every amount of the order.
    pub currency: Currency,
    /// What was bought.
    pub basket: Vec<BasketItem>,
    /// How it is delivered, and what that costs.
    pub delivery: Delivery,
    /// The price before tax.
    pub pretax: Amount,
    /// The tax.
    pub tax: Amount,
    /// What the customer owes: `pretax + tax + delivery.price`.
    pub total: Amount,
}

/// One line of a basket. A copy of the product's data at the time of sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasketItem {
    /// The product's id in the catalogue.
    pub product_id: String,
    /// Its title.
    pub title: Option<String>,
    /// Its category.
    pub category: Option<String>,
    /// Unit price.
    pub price: Amount,
    /// Unit tax.
    pub tax: Amount,
    /// How many (at least 1).
    pub quantity: u32,
}

/// A purchase's delivery option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The option chosen (`"Next Day"`).
    pub option: Option<String>,
    /// What delivery costs.
    pub price: Amount,
    /// Where to: any JSON (an object of lines, a string…), stored as given.
    pub address: Value,
}

/// Money received from the customer for an order. Written once as
/// `payment:{order_id}:{reference}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    /// The order paid for.
    pub order_id: String,
    /// The payment's reference (the payment provider's id): its idempotency key.
    pub reference: String,
    /// How much, greater than zero.
    pub amount: Amount,
    /// Must be the order's currency.
    pub currency: Currency,
    /// How it was paid (`"credit card"`, `"voucher"`).
    pub method: Option<String>,
}

/// Money given back to the customer. Written once as `refund:{order_id}:{reference}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The order refunded.
    pub order_id: String,
    /// The refund's reference: its idempotency key.
    pub reference: String,
    /// How much, greater than zero.
    pub amount: Amount,
    /// Must be the order's currency.
    pub currency: Currency,
    /// Why.
    pub reason: Option<String>,
}

/// A correction of what the customer owes: positive adds to the balance (a surcharge),
/// negative takes from it (a discount). Written once as `adjustment:{order_id}:{reference}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    /// The order adjusted.
    pub order_id: String,
    /// The adjustment's reference: its idempotency key.
    pub reference: String,
    /// Signed, not zero.
    pub amount: Amount,
    /// Must be the order's currency.
    pub currency: Currency,
    /// Why.
    pub reason: Option<String>,
}

/// An order (or part of it) left with a carrier. A status document: no money. Written once as
/// `shipment:{order_id}:{reference}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipment {
    /// The order shipped.
    pub order_id: String,
    /// The shipment's reference (a tracking number): its idempotency key.
    pub reference: String,
    /// Who carries it.
    pub carrier: Option<String>,
}

/// An order (or part of it) delivered. A status document: no money. Written once as
/// `delivery:{order_id}:{reference}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// The order delivered.
    pub order_id: String,
    /// The delivery's reference: its idempotency key.
    pub reference: String,
}

// ---- outputs --------------------------------------------------------------------------------

/// What a write-once call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordStatus {
    /// This call wrote the document.
    Created,
    /// The document was already there with the same content (a retry, or a re-sent message):
    /// treat it like `Created`.
    Exists,
    /// Written to some copies of a cluster's database but not yet every one (a copy is down or
    /// behind), so another body under the same id, written meanwhile through another node, may
    /// still prevail (docs/CLUSTER.md, "Write-once documents"). Send it again once the copies
    /// agree: `Exists`, or a mismatch when the other body stands.
    Uncertain,
}

impl RecordStatus {
    /// `"created"`, `"exists"` or `"uncertain"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Created => "created",
            RecordStatus::Exists => "exists",
            RecordStatus::Uncertain => "uncertain",
        }
    }
}

/// A ledger document that is now stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recorded {
    /// Its `_id`.
    pub id: String,
    /// Whether this call wrote it.
    pub status: RecordStatus,
}

/// The kind of a money entry of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// The purchase: `+total`.
    Purchase,
    /// A payment: `−value`.
    Payment,
    /// A refund: `+value`.
    Refund,
    /// An adjustment: `+value` (signed).
    Adjustment,
}

impl EntryKind {
    /// The document `type` (and id prefix).
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Purchase => "purchase",
            EntryKind::Payment => "payment",
            EntryKind::Refund => "refund",
            EntryKind::Adjustment => "adjustment",
        }
    }

    fn from_type(t: &str) -> Option<EntryKind> {
        match t {
            "purchase" => Some(EntryKind::Purchase),
            "payment" => Some(EntryKind::Payment),
            "refund" => Some(EntryKind::Refund),
            "adjustment" => Some(EntryKind::Adjustment),
            _ => None,
        }
    }
}

/// One money entry of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// The document's `_id`.
    pub id: String,
    /// What it is.
    #[serde(rename = "type")]
    pub kind: EntryKind,
    /// What it adds to the balance: a payment is negative.
    pub amount: Amount,
}

/// An order's money, read from the ledger in one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderSummary {
    /// The order.
    pub order_id: String,
    /// Its currency.
    pub currency: Currency,
    /// The purchase total.
    pub total: Amount,
    /// Sum of the adjustments (signed).
    pub adjusted: Amount,
    /// Sum of the payments (positive).
    pub paid: Amount,
    /// Sum of the refunds (positive).
    pub refunded: Amount,
    /// `total + adjusted − paid + refunded`: positive, the customer owes; negative, the merchant
    /// owes the customer.
    pub balance: Amount,
    /// Every money entry, the purchase first, then by id.
    pub entries: Vec<Entry>,
}

/// An order and its balance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderBalance {
    /// The order.
    pub order_id: String,
    /// Its currency; `None` only when the ledger holds entries for an order without a purchase
    /// (documents written around this library).
    pub currency: Option<Currency>,
    /// Positive: the customer owes; negative: the merchant owes.
    pub balance: Amount,
}

/// What a customer's orders add up to in one currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CurrencyBalance {
    /// The currency.
    pub currency: Currency,
    /// The sum of the balances of the customer's orders in it.
    pub balance: Amount,
}

/// A customer's orders and balances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Statement {
    /// The customer's account.
    pub account_id: String,
    /// Every order of the account, by order id, settled ones included.
    pub orders: Vec<OrderBalance>,
    /// Totals, one per currency (amounts in two currencies are never added), by code.
    pub totals: Vec<CurrencyBalance>,
}

/// One page of orders that are not settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutstandingPage {
    /// Orders whose balance is not zero, by order id.
    pub orders: Vec<OrderBalance>,
    /// Pass this as `after` to get the next page; `None` when there is no more.
    pub next: Option<String>,
}

// ---- validation -----------------------------------------------------------------------------

/// An order id, reference or account id: it becomes part of a document id, where `:` separates
/// the parts (`payment:a:b:c` could be order `a:b` or order `a` — two different payments could
/// collide) and a leading `_` is reserved by CouchDB.
pub(crate) fn check_id_part(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.chars().count() > ID_PART_LEN_MAX {
        return Err(Error::invalid(
            field,
            format!("must be at most {ID_PART_LEN_MAX} characters"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            format!("{value:?} holds a control character"),
        ));
    }
    if value.starts_with('_') {
        return Err(Error::invalid(
            field,
            format!("{value:?} begins with '_', which CouchDB reserves"),
        ));
    }
    if value.contains(':') {
        return Err(Error::invalid(
            field,
            format!("{value:?} contains ':', which separates the parts of a ledger id"),
        ));
    }
    if value.trim() != value {
        return Err(Error::invalid(
            field,
            format!("{value:?} begins or ends with white space"),
        ));
    }
    Ok(())
}

/// Free text: a length bound and no control characters (it ends up in terminals and logs).
fn check_text(field: &str, value: Option<&str>) -> Result<()> {
    let Some(value) = value else { return Ok(()) };
    if value.chars().count() > TEXT_LEN_MAX {
        return Err(Error::invalid(
            field,
            format!("must be at most {TEXT_LEN_MAX} characters"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            format!("{value:?} holds a control character"),
        ));
    }
    Ok(())
}

fn check_not_negative(field: &str, amount: Amount) -> Result<()> {
    if amount.minor() < 0 {
        return Err(Error::invalid(field, "must not be negative"));
    }
    Ok(())
}

fn check_positive(field: &str, amount: Amount) -> Result<()> {
    if !amount.is_positive() {
        return Err(Error::invalid(field, "must be greater than zero"));
    }
    Ok(())
}

impl Purchase {
    /// Checks everything that can be checked without the server: ids, texts, amounts not
    /// negative, quantities positive, and `total = pretax + tax + delivery.price`.
    ///
    /// # Errors
    ///
    /// An invalid-input error naming the first field at fault.
    pub fn validate(&self) -> Result<()> {
        check_id_part("order_id", &self.order_id)?;
        check_id_part("account_id", &self.account_id)?;
        if self.basket.is_empty() {
            return Err(Error::invalid("basket", "must hold at least one item"));
        }
        if self.basket.len() > BASKET_ITEMS_MAX {
            return Err(Error::invalid(
                "basket",
                format!("must hold at most {BASKET_ITEMS_MAX} items"),
            ));
        }
        for (i, item) in self.basket.iter().enumerate() {
            let at = |f: &str| format!("basket[{i}].{f}");
            if item.product_id.is_empty() {
                return Err(Error::invalid(&at("product_id"), "must not be empty"));
            }
            check_text(&at("product_id"), Some(&item.product_id))?;
            check_text(&at("title"), item.title.as_deref())?;
            check_text(&at("category"), item.category.as_deref())?;
            check_not_negative(&at("price"), item.price)?;
            check_not_negative(&at("tax"), item.tax)?;
            if item.quantity == 0 {
                return Err(Error::invalid(&at("quantity"), "must be at least 1"));
            }
        }
        check_text("delivery.option", self.delivery.option.as_deref())?;
        check_not_negative("delivery.price", self.delivery.price)?;
        check_not_negative("pretax", self.pretax)?;
        check_not_negative("tax", self.tax)?;
        let sum = self
            .pretax
            .checked_add(self.tax)
            .and_then(|s| s.checked_add(self.delivery.price))
            .map_err(|_| Error::invalid("total", "pretax + tax + delivery.price overflows"))?;
        if sum != self.total {
            let f = |a: Amount| self.currency.format(a);
            return Err(Error::invalid(
                "total",
                format!(
                    "{} {} does not equal pretax + tax + delivery.price ({} + {} + {} = {})",
                    f(self.total),
                    self.currency,
                    f(self.pretax),
                    f(self.tax),
                    f(self.delivery.price),
                    f(sum)
                ),
            ));
        }
        Ok(())
    }

    /// Reads a purchase from JSON in the Cloudant shape with **decimal** amounts in the
    /// currency's units (`"price": 8.33`, or as strings `"8.33"`), parsed exactly — never
    /// through floating point. `currency` is used when the JSON has no `"currency"` field; when
    /// both are given they must agree. A `"type"` field must be `"purchase"`; an `"_id"` field is
    /// ignored (the ledger's id is `purchase:{order_id}`); any other unknown field is refused.
    /// The result is [validated](Purchase::validate).
    ///
    /// ```
    /// use couch_ledger::{Currency, Purchase};
    /// let json = r#"{"order_id": "o1", "account_id": "c1", "currency": "GBP",
    ///   "basket": [{"product_id": "A56", "price": 8.33, "tax": 0.2, "quantity": 2}],
    ///   "delivery": {"option": "Next Day", "price": 2.99, "address": "17 Front Street"},
    ///   "pretax": 16.66, "tax": 0.4, "total": 20.05}"#;
    /// let p = Purchase::from_json(json, None)?;
    /// assert_eq!(p.total.minor(), 2005);
    /// assert_eq!(p.basket[0].tax.minor(), 20);
    /// # Ok::<(), couch_ledger::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Malformed JSON, a missing or unknown field, no currency or two that disagree, an amount
    /// that is not exact in the currency (`8.333` in GBP, `1e3`), or a failed validation.
    pub fn from_json(text: &str, currency: Option<Currency>) -> Result<Purchase> {
        let file: PurchaseFile = serde_json::from_str(text)
            .map_err(|e| Error::invalid_input(format!("purchase JSON: {e}")))?;
        if let Some(kind) = &file.kind {
            if kind != "purchase" {
                return Err(Error::invalid(
                    "type",
                    format!("must be \"purchase\", got {kind:?}"),
                ));
            }
        }
        let currency = match (file.currency.as_deref(), currency) {
            (Some(code), given) => {
                let c = Currency::from_code(code)?;
                if let Some(given) = given {
                    if given != c {
                        return Err(Error::invalid(
                            "currency",
                            format!("the purchase says {c}, but {given} was given"),
                        ));
                    }
                }
                c
            }
            (None, Some(given)) => given,
            (None, None) => {
                return Err(Error::invalid(
                    "currency",
                    "the purchase has no \"currency\" field and none was given",
                ))
            }
        };
        let money = |field: &str, raw: &RawValue| decimal(currency, field, raw);
        let mut basket = Vec::with_capacity(file.basket.len());
        for (i, item) in file.basket.iter().enumerate() {
            let at = |f: &str| format!("basket[{i}].{f}");
            basket.push(BasketItem {
                product_id: item.product_id.clone(),
                title: item.title.clone(),
                category: item.category.clone(),
                price: money(&at("price"), &item.price)?,
                tax: money(&at("tax"), &item.tax)?,
                quantity: quantity(&at("quantity"), &item.quantity)?,
            });
        }
        let purchase = Purchase {
            order_id: file.order_id,
            account_id: file.account_id,
            currency,
            basket,
            delivery: Delivery {
                option: file.delivery.option,
                price: money("delivery.price", &file.delivery.price)?,
                address: file.delivery.address,
            },
            pretax: money("pretax", &file.pretax)?,
            tax: money("tax", &file.tax)?,
            total: money("total", &file.total)?,
        };
        purchase.validate()?;
        Ok(purchase)
    }
}

/// A purchase as a JSON file holds it: amounts as exact decimal text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurchaseFile {
    #[serde(rename = "_id")]
    _id: Option<serde::de::IgnoredAny>,
    #[serde(rename = "type")]
    kind: Option<String>,
    order_id: String,
    account_id: String,
    currency: Option<String>,
    basket: Vec<BasketItemFile>,
    delivery: DeliveryFile,
    pretax: Box<RawValue>,
    tax: Box<RawValue>,
    total: Box<RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BasketItemFile {
    product_id: String,
    title: Option<String>,
    category: Option<String>,
    price: Box<RawValue>,
    tax: Box<RawValue>,
    quantity: Box<RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveryFile {
    option: Option<String>,
    price: Box<RawValue>,
    address: Value,
}

/// A decimal amount from its JSON text (a number or a string), exactly.
fn decimal(currency: Currency, field: &str, raw: &RawValue) -> Result<Amount> {
    let text = raw.get().trim();
    let decimal: String = if text.starts_with('"') {
        serde_json::from_str(text).map_err(|e| Error::invalid(field, e.to_string()))?
    } else if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        // A JSON number is read by its value, whatever its spelling (`8.330`, `833e-2`).
        plain_decimal(text).ok_or_else(|| {
            Error::invalid(
                field,
                format!("{text} is not an amount (write a decimal number like 8.33)"),
            )
        })?
    } else {
        return Err(Error::invalid(
            field,
            format!("{text} is not an amount (write a decimal number like 8.33)"),
        ));
    };
    currency.parse(&decimal).map_err(|e| {
        // `parse` names its field "amount"; name ours instead.
        let why = e.to_string();
        let why = why
            .strip_prefix("invalid amount: ")
            .unwrap_or(&why)
            .to_owned();
        Error::invalid(field, format!("{why} (in {currency})"))
    })
}

/// A quantity from its JSON text: a positive integer.
fn quantity(field: &str, raw: &RawValue) -> Result<u32> {
    let raw = raw.get().trim();
    // A JSON number is read by its value: `2.0` and `2e0` are 2.
    let plain = plain_decimal(raw);
    let text = plain.as_deref().unwrap_or(raw);
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::invalid(
            field,
            format!("{raw} is not a positive integer"),
        ));
    }
    let n: u32 = text
        .parse()
        .map_err(|_| Error::invalid(field, format!("{raw} is too large")))?;
    if n == 0 {
        return Err(Error::invalid(field, "must be at least 1"));
    }
    Ok(n)
}

impl Payment {
    /// Checks what can be checked without the server: ids, a positive amount, the method text.
    ///
    /// # Errors
    ///
    /// An invalid-input error naming the field.
    pub fn validate(&self) -> Result<()> {
        check_id_part("order_id", &self.order_id)?;
        check_id_part("reference", &self.reference)?;
        check_positive("amount", self.amount)?;
        check_text("method", self.method.as_deref())
    }
}

impl Refund {
    /// Checks what can be checked without the server: ids, a positive amount, the reason text.
    ///
    /// # Errors
    ///
    /// An invalid-input error naming the field.
    pub fn validate(&self) -> Result<()> {
        check_id_part("order_id", &self.order_id)?;
        check_id_part("reference", &self.reference)?;
        check_positive("amount", self.amount)?;
        check_text("reason", self.reason.as_deref())
    }
}

impl Adjustment {
    /// Checks what can be checked without the server: ids, a non-zero amount, the reason text.
    ///
    /// # Errors
    ///
    /// An invalid-input error naming the field.
    pub fn validate(&self) -> Result<()> {
        check_id_part("order_id", &self.order_id)?;
        check_id_part("reference", &self.reference)?;
        if self.amount == Amount::ZERO {
            return Err(Error::invalid("amount", "must not be zero"));
        }
        check_text("reason", self.reason.as_deref())
    }
}

impl Shipment {
    /// Checks the ids and the carrier text.
    ///
    /// # Errors
    ///
    /// An invalid-input error naming the field.
    pub fn validate(&self) -> Result<()> {
        check_id_part("order_id", &self.order_id)?;
        check_id_part("reference", &self.reference)?;
        check_text("carrier", self.carrier.as_deref())
    }
}

impl Delivered {
    /// Checks the ids.
    ///
    /// # Errors
    ///
    /// An invalid-input error naming the field.
    pub fn validate(&self) -> Result<()> {
        check_id_part("order_id", &self.order_id)?;
        check_id_part("reference", &self.reference)
    }
}

// ---- documents ------------------------------------------------------------------------------

fn purchase_id(order_id: &str) -> String {
    format!("purchase:{order_id}")
}

fn entry_id(kind: &str, order_id: &str, reference: &str) -> String {
    format!("{kind}:{order_id}:{reference}")
}

fn purchase_doc(p: &Purchase) -> Value {
    let basket: Vec<Value> = p
        .basket
        .iter()
        .map(|i| {
            json!({
                "product_id": i.product_id,
                "title": i.title,
                "category": i.category,
                "price": i.price,
                "tax": i.tax,
                "quantity": i.quantity,
            })
        })
        .collect();
    json!({
        "_id": purchase_id(&p.order_id),
        "type": "purchase",
        "order_id": p.order_id,
        "account_id": p.account_id,
        "currency": p.currency,
        "basket": basket,
        "delivery": {
            "option": p.delivery.option,
            "price": p.delivery.price,
            "address": p.delivery.address,
        },
        "pretax": p.pretax,
        "tax": p.tax,
        "total": p.total,
    })
}

/// What a money entry needs from its order's purchase.
struct OrderTerms {
    account_id: String,
}

fn unknown_order(order_id: &str) -> Error {
    Error::invalid(
        "order_id",
        format!("unknown order {order_id:?}: no purchase is recorded for it"),
    )
}

/// The first field where `ours` and `stored` differ, as a path (`value`, `basket[1].price`),
/// ignoring CouchDB's own top-level fields (`_id`, `_rev`…). `None` when they are the same.
fn first_difference(ours: &Value, stored: &Value) -> Option<String> {
    let strip = |v: &Value| -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| !k.starts_with('_'))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Map<_, _>>(),
            ),
            other => other.clone(),
        }
    };
    difference("", &strip(ours), &strip(stored))
}

fn difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, av) in a {
                match b.get(k) {
                    None => return Some(join(k)),
                    Some(bv) => {
                        if let Some(d) = difference(&join(k), av, bv) {
                            return Some(d);
                        }
                    }
                }
            }
            b.keys().find(|k| !a.contains_key(*k)).map(|k| join(k))
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let at = format!("{path}[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => {
                        if let Some(d) = difference(&at, x, y) {
                            return Some(d);
                        }
                    }
                    _ => return Some(at),
                }
            }
            None
        }
        _ if a == b => None,
        _ => Some(if path.is_empty() {
            "document".to_owned()
        } else {
            path.to_owned()
        }),
    }
}

/// A reduced or emitted view value as an exact amount: an integer within ±(2^53 − 1). A
/// fraction means a document with a non-integer amount got past validation; it is reported,
/// never rounded.
fn exact_amount(value: &Value, what: &str) -> Result<Amount> {
    let Some(n) = value.as_i64() else {
        return Err(Error::decode(format!(
            "{what}: {value} is not an integer number of minor units"
        )));
    };
    Amount::new(n).map_err(|_| Error::invariant(format!("{what}: {n} is out of range")))
}

fn row_key_str<'a>(row: &'a ViewRow, what: &str) -> Result<&'a str> {
    row.key
        .as_str()
        .ok_or_else(|| Error::decode(format!("{what}: key {} is not a string", row.key)))
}

// ---- the ledger -----------------------------------------------------------------------------

impl Ledger {
    /// Records a purchase as `purchase:{order_id}`.
    ///
    /// # Errors
    ///
    /// Invalid input (see [`Purchase::validate`]); the order exists with other content
    /// ([`Error::is_mismatch`], naming the first field that differs); the server failed.
    pub async fn record_purchase(&self, purchase: &Purchase) -> Result<Recorded> {
        purchase.validate()?;
        let id = purchase_id(&purchase.order_id);
        self.write_once(&id, purchase_doc(purchase)).await
    }

    /// Records a payment as `payment:{order_id}:{reference}`; it takes the order's balance down.
    ///
    /// # Errors
    ///
    /// Invalid input: see [`Payment::validate`], an unknown order, a currency other than the
    /// order's. This reference recorded with other content ([`Error::is_mismatch`]). The server
    /// failed.
    pub async fn record_payment(&self, payment: &Payment) -> Result<Recorded> {
        payment.validate()?;
        let order = self
            .order_terms(&payment.order_id, Some(payment.currency))
            .await?;
        let id = entry_id("payment", &payment.order_id, &payment.reference);
        self.check_order_room(&payment.order_id, &id, EntryKind::Payment, payment.amount)
            .await?;
        let doc = json!({
            "_id": id,
            "type": "payment",
            "order_id": payment.order_id,
            "account_id": order.account_id,
            "currency": payment.currency,
            "value": payment.amount,
            "method": payment.method,
            "payment_reference": payment.reference,
        });
        self.write_once(&id, doc).await
    }

    /// Records a refund as `refund:{order_id}:{reference}`: money given back, so it adds to
    /// the order's balance. When goods come back, a negative adjustment takes them off the
    /// order first (the balance goes below zero: the merchant owes), and the refund settles it.
    ///
    /// # Errors
    ///
    /// As [`Ledger::record_payment`].
    pub async fn record_refund(&self, refund: &Refund) -> Result<Recorded> {
        refund.validate()?;
        let order = self
            .order_terms(&refund.order_id, Some(refund.currency))
            .await?;
        let id = entry_id("refund", &refund.order_id, &refund.reference);
        self.check_order_room(&refund.order_id, &id, EntryKind::Refund, refund.amount)
            .await?;
        let doc = json!({
            "_id": id,
            "type": "refund",
            "order_id": refund.order_id,
            "account_id": order.account_id,
            "currency": refund.currency,
            "value": refund.amount,
            "reason": refund.reason,
            "refund_reference": refund.reference,
        });
        self.write_once(&id, doc).await
    }

    /// Records an adjustment as `adjustment:{order_id}:{reference}`; its signed amount is added
    /// to the order's balance.
    ///
    /// # Errors
    ///
    /// As [`Ledger::record_payment`] (the amount must not be zero).
    pub async fn record_adjustment(&self, adjustment: &Adjustment) -> Result<Recorded> {
        adjustment.validate()?;
        let order = self
            .order_terms(&adjustment.order_id, Some(adjustment.currency))
            .await?;
        let id = entry_id("adjustment", &adjustment.order_id, &adjustment.reference);
        self.check_order_room(
            &adjustment.order_id,
            &id,
            EntryKind::Adjustment,
            adjustment.amount,
        )
        .await?;
        let doc = json!({
            "_id": id,
            "type": "adjustment",
            "order_id": adjustment.order_id,
            "account_id": order.account_id,
            "currency": adjustment.currency,
            "value": adjustment.amount,
            "reason": adjustment.reason,
            "reference": adjustment.reference,
        });
        self.write_once(&id, doc).await
    }

    /// Records a shipment as `shipment:{order_id}:{reference}` (no money).
    ///
    /// # Errors
    ///
    /// Invalid ids or carrier, an unknown order, this reference recorded with other content, or
    /// the server failed.
    pub async fn record_shipment(&self, shipment: &Shipment) -> Result<Recorded> {
        shipment.validate()?;
        self.order_terms(&shipment.order_id, None).await?;
        let id = entry_id("shipment", &shipment.order_id, &shipment.reference);
        let doc = json!({
            "_id": id,
            "type": "shipment",
            "order_id": shipment.order_id,
            "reference": shipment.reference,
            "carrier": shipment.carrier,
        });
        self.write_once(&id, doc).await
    }

    /// Records a delivery as `delivery:{order_id}:{reference}` (no money).
    ///
    /// # Errors
    ///
    /// Invalid ids, an unknown order, or the server failed.
    pub async fn record_delivery(&self, delivered: &Delivered) -> Result<Recorded> {
        delivered.validate()?;
        self.order_terms(&delivered.order_id, None).await?;
        let id = entry_id("delivery", &delivered.order_id, &delivered.reference);
        let doc = json!({
            "_id": id,
            "type": "delivery",
            "order_id": delivered.order_id,
            "reference": delivered.reference,
        });
        self.write_once(&id, doc).await
    }

    /// An order's balance in one request (`orders/ledger`, `group=true`): positive, the
    /// customer owes; zero, settled; negative, the merchant owes the customer.
    ///
    /// # Errors
    ///
    /// An invalid or unknown order id (invalid input); a reduced value that is not an exact
    /// integer in range; the server failed.
    pub async fn order_balance(&self, order_id: &str) -> Result<Amount> {
        check_id_part("order_id", order_id)?;
        let reply = self
            .inner
            .client
            .view(
                "orders",
                "ledger",
                &ViewQuery {
                    key: Some(json!(order_id)),
                    group: Some(true),
                    ..ViewQuery::default()
                },
            )
            .await?;
        match reply.rows.as_slice() {
            [] => Err(unknown_order(order_id)),
            [row] => {
                if row_key_str(row, "orders/ledger")? != order_id {
                    return Err(Error::decode(format!(
                        "orders/ledger answered key {} for {order_id:?}",
                        row.key
                    )));
                }
                exact_amount(&row.value, &format!("balance of order {order_id:?}"))
            }
            rows => Err(Error::decode(format!(
                "orders/ledger answered {} grouped rows for one key",
                rows.len()
            ))),
        }
    }

    /// An order's money and entries in one request (`orders/ledger`, `reduce=false`,
    /// `include_docs=true`). The balance is computed from the documents and checked against the
    /// sum of the view's rows (they must agree: invariant 7, docs/PROTOCOL.md).
    ///
    /// # Errors
    ///
    /// An invalid or unknown order id (invalid input); the ledger broken (entries without a
    /// purchase, mixed currencies, a view row that disagrees with its document: an invariant
    /// error); the server failed.
    pub async fn order(&self, order_id: &str) -> Result<OrderSummary> {
        check_id_part("order_id", order_id)?;
        let reply = self
            .inner
            .client
            .view(
                "orders",
                "ledger",
                &ViewQuery {
                    key: Some(json!(order_id)),
                    reduce: Some(false),
                    include_docs: Some(true),
                    ..ViewQuery::default()
                },
            )
            .await?;
        summarize(order_id, &reply.rows)
    }

    /// [`Ledger::order`] read from the order's documents instead of the `orders/ledger` view:
    /// the ids under the order's prefixes in the primary index (`_all_docs`, one request per
    /// kind of money entry), then every one of them by id with its conflicts. A view is built
    /// from each copy's index and, on a cluster, may be answered by a copy that has not seen an
    /// entry written through another node a moment ago; documents read by id are read from a
    /// quorum of copies (docs/CLUSTER.md, "Views only find candidates"). A document holding a
    /// conflict is an error naming it (never one body picked).
    ///
    /// # Errors
    ///
    /// As [`Ledger::order`]; a conflicted entry (an invariant error naming it).
    pub async fn order_fresh(&self, order_id: &str) -> Result<OrderSummary> {
        check_id_part("order_id", order_id)?;
        let client = &self.inner.client;
        let mut ids = vec![purchase_id(order_id)];
        for kind in ["adjustment", "payment", "refund"] {
            let start = format!("{kind}:{order_id}:");
            let end = format!("{start}\u{fff0}");
            for row in client.all_docs_range(&start, &end).await? {
                if let Some(id) = row.id {
                    ids.push(id);
                }
            }
        }
        let mut rows = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(crate::limits::READ_BATCH_KEYS_MAX) {
            for (id, row) in chunk
                .iter()
                .zip(client.all_docs_with_conflicts(chunk).await?)
            {
                let Some(doc) = row.doc.filter(Value::is_object) else {
                    continue;
                };
                if let Some(losers) = doc.get("_conflicts") {
                    return Err(Error::invariant(format!(
                        "order {order_id:?}: {id} holds a conflict (other bodies {losers}); a \
                         person must decide which is true"
                    )));
                }
                let field = if id.starts_with("purchase:") {
                    "total"
                } else {
                    "value"
                };
                let amount = exact_amount(&doc[field], &format!("{id} {field}"))?;
                let signed = if id.starts_with("payment:") {
                    amount.neg()
                } else {
                    amount
                };
                rows.push(crate::couch::ViewRow {
                    id: Some(id.clone()),
                    key: json!(order_id),
                    value: json!(signed.minor()),
                    doc: Some(doc),
                });
            }
        }
        summarize(order_id, &rows)
    }
}

/// An order's summary from its `orders/ledger` rows (with their documents), each row checked
/// against its document.
fn summarize(order_id: &str, rows: &[crate::couch::ViewRow]) -> Result<OrderSummary> {
    {
        if rows.is_empty() {
            return Err(unknown_order(order_id));
        }
        let broken = |m: String| Error::invariant(format!("order {order_id:?}: {m}"));
        let mut currency: Option<Currency> = None;
        let mut total: Option<Amount> = None;
        let (mut adjusted, mut paid, mut refunded, mut row_sum) =
            (Amount::ZERO, Amount::ZERO, Amount::ZERO, Amount::ZERO);
        let mut entries = Vec::with_capacity(rows.len());
        for row in rows {
            let id = row
                .id
                .clone()
                .ok_or_else(|| Error::decode("orders/ledger map row without an id"))?;
            let value = exact_amount(&row.value, &id)?;
            let (kind, from_doc) = match &row.doc {
                Some(doc) if doc.is_object() => {
                    let kind = doc["type"]
                        .as_str()
                        .and_then(EntryKind::from_type)
                        .ok_or_else(|| broken(format!("{id} has no money type")))?;
                    let code = doc["currency"]
                        .as_str()
                        .ok_or_else(|| broken(format!("{id} has no currency")))?;
                    let c = Currency::from_code(code)
                        .map_err(|_| broken(format!("{id} has an unknown currency {code:?}")))?;
                    if *currency.get_or_insert(c) != c {
                        return Err(broken(format!("{id} is in {c}, other entries are not")));
                    }
                    let field = if kind == EntryKind::Purchase {
                        "total"
                    } else {
                        "value"
                    };
                    let amount = exact_amount(&doc[field], &format!("{id} {field}"))?;
                    let signed = if kind == EntryKind::Payment {
                        amount.neg()
                    } else {
                        amount
                    };
                    (kind, Some(signed))
                }
                // Without its document (a view that lags a deletion) the id's prefix still
                // says what the row is.
                _ => {
                    let prefix = id.split(':').next().unwrap_or("");
                    let kind = EntryKind::from_type(prefix)
                        .ok_or_else(|| broken(format!("{id} is not a money entry")))?;
                    (kind, None)
                }
            };
            if let Some(signed) = from_doc {
                if signed != value {
                    return Err(broken(format!(
                        "the view says {} for {id}, its document {}",
                        value.minor(),
                        signed.minor()
                    )));
                }
            }
            let overflow = |_| broken("the sum overflows".to_owned());
            row_sum = row_sum.checked_add(value).map_err(overflow)?;
            match kind {
                EntryKind::Purchase => {
                    if total.replace(value).is_some() {
                        return Err(broken("more than one purchase".to_owned()));
                    }
                }
                EntryKind::Adjustment => {
                    adjusted = adjusted.checked_add(value).map_err(overflow)?
                }
                EntryKind::Payment => paid = paid.checked_sub(value).map_err(overflow)?,
                EntryKind::Refund => refunded = refunded.checked_add(value).map_err(overflow)?,
            }
            entries.push(Entry {
                id,
                kind,
                amount: value,
            });
        }
        let total = total.ok_or_else(|| broken("it has entries but no purchase".to_owned()))?;
        let currency = currency.ok_or_else(|| broken("no document was readable".to_owned()))?;
        let overflow = |_| broken("the balance overflows".to_owned());
        let balance = total
            .checked_add(adjusted)
            .and_then(|b| b.checked_sub(paid))
            .and_then(|b| b.checked_add(refunded))
            .map_err(overflow)?;
        if balance != row_sum {
            return Err(broken(format!(
                "the balance {} differs from the sum of its rows {}",
                balance.minor(),
                row_sum.minor()
            )));
        }
        entries.sort_by(|a, b| {
            (a.kind != EntryKind::Purchase, &a.id).cmp(&(b.kind != EntryKind::Purchase, &b.id))
        });
        Ok(OrderSummary {
            order_id: order_id.to_owned(),
            currency,
            total,
            adjusted,
            paid,
            refunded,
            balance,
            entries,
        })
    }
}

impl Ledger {
    /// A customer's orders with their balances (settled ones too) and totals per currency,
    /// from `orders/by_account` (`group_level=2`) and the purchases' currencies.
    ///
    /// # Errors
    ///
    /// An invalid account id; more orders than one statement covers (10,000); a view value that
    /// is not an exact integer; the server failed.
    pub async fn customer_statement(&self, account_id: &str) -> Result<Statement> {
        check_id_part("account_id", account_id)?;
        let mut balances: Vec<(String, Amount)> = Vec::new();
        let mut after: Option<String> = None;
        let mut complete = false;
        for _ in 0..STATEMENT_PAGES_MAX {
            let start = match &after {
                Some(o) => json!([account_id, o]),
                None => json!([account_id]),
            };
            let reply = self
                .inner
                .client
                .view(
                    "orders",
                    "by_account",
                    &ViewQuery {
                        start_key: Some(start),
                        end_key: Some(json!([account_id, {}])),
                        group_level: Some(2),
                        limit: Some(VIEW_PAGE_ROWS as u64),
                        ..ViewQuery::default()
                    },
                )
                .await?;
            let at_end = reply.rows.len() < VIEW_PAGE_ROWS;
            for row in &reply.rows {
                let order_id = match row.key.as_array().map(Vec::as_slice) {
                    Some([a, Value::String(o)]) if a == account_id => o.clone(),
                    _ => {
                        return Err(Error::decode(format!(
                            "orders/by_account answered key {}",
                            row.key
                        )))
                    }
                };
                if after.as_deref() == Some(order_id.as_str()) {
                    continue;
                }
                let balance = exact_amount(&row.value, &format!("balance of {order_id:?}"))?;
                balances.push((order_id, balance));
            }
            if at_end {
                complete = true;
                break;
            }
            after = balances.last().map(|(o, _)| o.clone());
        }
        if !complete {
            return Err(Error::invalid(
                "account_id",
                format!(
                    "{account_id:?} has more orders than one statement covers ({})",
                    STATEMENT_PAGES_MAX * (VIEW_PAGE_ROWS - 1)
                ),
            ));
        }
        let orders = self.with_currencies(balances).await?;
        let mut totals: BTreeMap<&'static str, CurrencyBalance> = BTreeMap::new();
        for order in &orders {
            let Some(currency) = order.currency else {
                continue;
            };
            let entry = totals.entry(currency.code()).or_insert(CurrencyBalance {
                currency,
                balance: Amount::ZERO,
            });
            entry.balance = entry.balance.checked_add(order.balance).map_err(|_| {
                Error::invariant(format!("{account_id:?}: the statement total overflows"))
            })?;
        }
        Ok(Statement {
            account_id: account_id.to_owned(),
            orders,
            totals: totals.into_values().collect(),
        })
    }

    /// Orders whose balance is not zero — positive (the customer owes) and negative (the
    /// merchant owes) — by order id, at most `limit` of them, starting after the order id
    /// `after` (the `next` of the previous page). Walks `orders/ledger` with `group=true` a
    /// bounded number of view pages per call; when that bound is reached first, the page may
    /// hold fewer than `limit` orders and `next` says where to go on.
    ///
    /// # Errors
    ///
    /// `limit` not in `1..=1000` or an invalid `after`; a view value that is not an exact
    /// integer; the server failed.
    pub async fn outstanding_orders(
        &self,
        limit: usize,
        after: Option<&str>,
    ) -> Result<OutstandingPage> {
        if limit == 0 || limit > OUTSTANDING_LIMIT_MAX {
            return Err(Error::invalid(
                "limit",
                format!("must be between 1 and {OUTSTANDING_LIMIT_MAX}"),
            ));
        }
        if let Some(after) = after {
            check_id_part("after", after)?;
        }
        let mut cursor: Option<String> = after.map(str::to_owned);
        let mut found: Vec<(String, Amount)> = Vec::new();
        let mut next: Option<String> = None;
        let mut done = false;
        'pages: for _ in 0..OUTSTANDING_PAGES_MAX {
            let reply = self
                .inner
                .client
                .view(
                    "orders",
                    "ledger",
                    &ViewQuery {
                        start_key: cursor.as_ref().map(|c| json!(c)),
                        group: Some(true),
                        limit: Some(VIEW_PAGE_ROWS as u64),
                        ..ViewQuery::default()
                    },
                )
                .await?;
            let at_end = reply.rows.len() < VIEW_PAGE_ROWS;
            let mut last_key = cursor.clone();
            for row in &reply.rows {
                let key = row_key_str(row, "orders/ledger")?;
                if cursor.as_deref() == Some(key) {
                    continue;
                }
                let balance = exact_amount(&row.value, &format!("balance of order {key:?}"))?;
                if balance != Amount::ZERO {
                    if found.len() == limit {
                        // There is more: the next page starts after the last one returned.
                        next = found.last().map(|(o, _)| o.clone());
                        done = true;
                        break 'pages;
                    }
                    found.push((key.to_owned(), balance));
                }
                last_key = Some(key.to_owned());
            }
            if at_end {
                done = true;
                break;
            }
            cursor = last_key;
        }
        if !done {
            // The scan bound was reached: go on after the last order looked at.
            next = cursor;
        }
        let orders = self.with_currencies(found).await?;
        Ok(OutstandingPage { orders, next })
    }

    /// Adds each order's currency, read from its purchase (`_all_docs`, a page at a time).
    async fn with_currencies(&self, balances: Vec<(String, Amount)>) -> Result<Vec<OrderBalance>> {
        let mut out = Vec::with_capacity(balances.len());
        for chunk in balances.chunks(VIEW_PAGE_ROWS) {
            let keys: Vec<String> = chunk.iter().map(|(o, _)| purchase_id(o)).collect();
            let rows = self.inner.client.all_docs(&keys, true).await?;
            for ((order_id, balance), row) in chunk.iter().zip(rows) {
                let currency = match row.doc.as_ref().and_then(|d| d["currency"].as_str()) {
                    Some(code) => Some(Currency::from_code(code).map_err(|_| {
                        Error::invariant(format!(
                            "purchase of {order_id:?} has an unknown currency {code:?}"
                        ))
                    })?),
                    None => None,
                };
                out.push(OrderBalance {
                    order_id: order_id.clone(),
                    currency,
                    balance: *balance,
                });
            }
        }
        Ok(out)
    }

    /// The account and currency of an order, from its purchase; checks `currency` when given.
    async fn order_terms(&self, order_id: &str, currency: Option<Currency>) -> Result<OrderTerms> {
        let id = purchase_id(order_id);
        let doc: Value = self
            .inner
            .client
            .get_opt(&id)
            .await?
            .ok_or_else(|| unknown_order(order_id))?;
        let account_id = doc["account_id"]
            .as_str()
            .ok_or_else(|| Error::invariant(format!("{id} has no account_id")))?
            .to_owned();
        let code = doc["currency"]
            .as_str()
            .ok_or_else(|| Error::invariant(format!("{id} has no currency")))?;
        let order_currency = Currency::from_code(code)
            .map_err(|_| Error::invariant(format!("{id} has an unknown currency {code:?}")))?;
        if let Some(c) = currency {
            if c != order_currency {
                return Err(Error::invalid(
                    "currency",
                    format!("order {order_id:?} is in {order_currency}, not {c}"),
                ));
            }
        }
        Ok(OrderTerms { account_id })
    }

    /// Refuses a money entry that would take one of the order's sums (its adjustments,
    /// payments, refunds or balance) beyond ±(2^53 − 1) minor units, where the order could no
    /// longer be read: an invalid amount, like any other. One view request. An entry already
    /// written under `id` is left to `write_once` (the same content again is `Exists`). Entries
    /// written at the same moment can pass it together; reading the order then reports the
    /// overflow as the invariant it breaks.
    async fn check_order_room(
        &self,
        order_id: &str,
        id: &str,
        kind: EntryKind,
        amount: Amount,
    ) -> Result<()> {
        let order = self.order(order_id).await?;
        if order.entries.iter().any(|e| e.id == id) {
            return Ok(());
        }
        let (sum, name, to_balance) = match kind {
            EntryKind::Payment => (order.paid, "payments", amount.neg()),
            EntryKind::Refund => (order.refunded, "refunds", amount),
            EntryKind::Adjustment => (order.adjusted, "adjustments", amount),
            EntryKind::Purchase => unreachable!("a purchase is not added to an order"),
        };
        let beyond = |what: &str| {
            Error::invalid(
                "amount",
                format!(
                    "{} would take order {order_id:?}'s {what} beyond ±(2^53 − 1) minor units",
                    amount.minor()
                ),
            )
        };
        sum.checked_add(amount).map_err(|_| beyond(name))?;
        order
            .balance
            .checked_add(to_balance)
            .map_err(|_| beyond("balance"))?;
        Ok(())
    }

    /// Creates a write-once document: PUT without `_rev`, with `w` = every copy of a cluster's
    /// database. Taken by every copy (201), it is the only body there can ever be under its id
    /// (each copy took it as a new document, and refuses another now): `Created`. When it
    /// exists the stored document is compared with ours — the same is `Exists`, different is a
    /// mismatch naming the field; every leaf is compared (docs/CLUSTER.md): on a cluster two
    /// bodies under one id can both be stored, and one of them differing from ours is a
    /// mismatch even when ours won. Taken by some copies only (202), it is `Uncertain` unless
    /// the read back shows another body (a mismatch).
    async fn write_once(&self, id: &str, doc: Value) -> Result<Recorded> {
        let client = &self.inner.client;
        let options = self.inner.quorum.write_options(client, true).await;
        for _ in 0..WRITE_ATTEMPTS_MAX {
            match client.put_with(id, &doc, &options).await {
                Ok(written) => {
                    debug_assert_eq!(written.id, id);
                    let mut status = RecordStatus::Created;
                    if written.accepted {
                        tracing::info!(id, "write accepted (202), not on every copy yet");
                        if let Some(field) = self.differing_leaf(id, &doc).await? {
                            return Err(Error::mismatch(id, &field));
                        }
                        status = RecordStatus::Uncertain;
                    }
                    return Ok(Recorded {
                        id: id.to_owned(),
                        status,
                    });
                }
                // CouchDB answers 409 for a create over an existing document. pouchdb-server
                // runs validate_doc_update first, whose write-once rule answers 403; a 403 for
                // a document that does not exist is a real refusal.
                Err(e) if e.is_conflict() || e.is_forbidden() => {
                    match client.leaves(id).await? {
                        Some(leaves) => {
                            let difference = leaves
                                .winner
                                .iter()
                                .chain(&leaves.losers)
                                .find_map(|stored| first_difference(&doc, stored));
                            return match difference {
                                None => Ok(Recorded {
                                    id: id.to_owned(),
                                    status: RecordStatus::Exists,
                                }),
                                Some(field) => Err(Error::mismatch(id, &field)),
                            };
                        }
                        None if e.is_forbidden() => return Err(e),
                        // Deleted between our write and our read: write again.
                        None => continue,
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::invariant(format!(
            "{id}: kept conflicting with a document that then disappeared"
        )))
    }

    /// The first field in which some leaf of `id` differs from `doc`, if any.
    async fn differing_leaf(&self, id: &str, doc: &Value) -> Result<Option<String>> {
        Ok(self.inner.client.leaves(id).await?.and_then(|leaves| {
            leaves
                .winner
                .iter()
                .chain(&leaves.losers)
                .find_map(|stored| first_difference(doc, stored))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLOUDANT: &str = include_str!("../examples/cloudant-purchase.json");

    fn gbp() -> Currency {
        Currency::from_code("GBP").unwrap()
    }

    #[test]
    fn the_cloudant_purchase_parses_exactly() {
        let p = Purchase::from_json(CLOUDANT, Some(gbp())).unwrap();
        assert_eq!(p.order_id, "320afa89017426b994162ab004ce3383");
        assert_eq!(p.account_id, "985522332");
        assert_eq!(p.total.minor(), 2646);
        assert_eq!(p.pretax.minor(), 2015);
        assert_eq!(p.tax.minor(), 332);
        assert_eq!(p.delivery.price.minor(), 299);
        assert_eq!(p.basket.len(), 2);
        assert_eq!(p.basket[0].price.minor(), 833);
        assert_eq!(p.basket[0].tax.minor(), 20);
        assert_eq!(p.basket[0].quantity, 2);
        assert_eq!(p.basket[1].tax.minor(), 0);
        assert_eq!(p.delivery.address["town"], "Middlemarch");
        // No currency in the file and none given.
        let e = Purchase::from_json(CLOUDANT, None).unwrap_err();
        assert_eq!(e.field(), Some("currency"), "{e}");
    }

    fn with(field: &str, value: Value) -> String {
        let mut v: Value = serde_json::from_str(CLOUDANT).unwrap();
        let mut target = &mut v;
        let parts: Vec<&str> = field.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            target = match p.parse::<usize>() {
                Ok(i) => &mut target[i],
                Err(_) => &mut target[*p],
            };
        }
        target[parts[parts.len() - 1]] = value;
        v.to_string()
    }

    #[test]
    fn bad_purchases_name_the_field() {
        let cases: &[(&str, Value, &str)] = &[
            ("total", json!(26.47), "total"),
            ("total", json!(26.465), "total"),
            ("total", json!("1e3"), "total"),
            ("total", json!(null), "total"),
            ("pretax", json!(-1), "pretax"),
            ("basket.0.price", json!(-8.33), "basket[0].price"),
            ("basket.0.quantity", json!(0), "basket[0].quantity"),
            ("basket.0.quantity", json!(1.5), "basket[0].quantity"),
            ("order_id", json!("_x"), "order_id"),
            ("order_id", json!("a:b"), "order_id"),
            ("order_id", json!("a\u{1}b"), "order_id"),
            ("account_id", json!(""), "account_id"),
            ("currency", json!("EUR"), "currency"),
            ("type", json!("payment"), "type"),
        ];
        for (field, value, named) in cases {
            let e = Purchase::from_json(&with(field, value.clone()), Some(gbp())).unwrap_err();
            assert!(e.is_invalid_input(), "{field}: {e}");
            assert_eq!(e.field(), Some(*named), "{field}={value}: {e}");
        }
        // Unknown fields and malformed JSON are refused, with the position.
        let e = Purchase::from_json(&with("discount", json!(5)), Some(gbp())).unwrap_err();
        assert!(e.to_string().contains("discount"), "{e}");
        let e = Purchase::from_json("{\"order_id\": ", Some(gbp())).unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        // The file's currency and the caller's must agree; strings are amounts too.
        let p = Purchase::from_json(&with("currency", json!("GBP")), Some(gbp())).unwrap();
        assert_eq!(p.currency, gbp());
        let p = Purchase::from_json(&with("total", json!("26.46")), Some(gbp())).unwrap();
        assert_eq!(p.total.minor(), 2646);
    }

    #[test]
    fn id_parts_are_checked() {
        for ok in ["320afa89", "AB9977G244FF2F667", "ünï-cöde", "a b"] {
            check_id_part("order_id", ok).unwrap();
        }
        let long = "x".repeat(ID_PART_LEN_MAX + 1);
        for bad in [
            "",
            "_x",
            "a:b",
            "a\tb",
            "a\u{7f}",
            " a",
            "a ",
            long.as_str(),
        ] {
            let e = check_id_part("reference", bad).unwrap_err();
            assert_eq!(e.field(), Some("reference"), "{bad:?}");
        }
    }

    #[test]
    fn first_difference_names_the_path() {
        let a = json!({"_id": "x", "value": 646, "method": "card", "basket": [{"price": 1}]});
        let b = json!({"_id": "x", "_rev": "1-a", "value": 646, "method": "card", "basket": [{"price": 1}]});
        assert_eq!(first_difference(&a, &b), None);
        let c = json!({"_id": "x", "_rev": "1-a", "value": 700, "method": "card", "basket": [{"price": 1}]});
        assert_eq!(first_difference(&a, &c).as_deref(), Some("value"));
        let d = json!({"value": 646, "method": "card", "basket": [{"price": 2}]});
        assert_eq!(first_difference(&a, &d).as_deref(), Some("basket[0].price"));
        let e = json!({"value": 646, "method": "card", "basket": [{"price": 1}], "extra": 1});
        assert_eq!(first_difference(&a, &e).as_deref(), Some("extra"));
        let f = json!({"value": 646, "basket": [{"price": 1}]});
        assert_eq!(first_difference(&a, &f).as_deref(), Some("method"));
    }

    #[test]
    fn view_values_must_be_exact() {
        assert_eq!(exact_amount(&json!(2646), "t").unwrap().minor(), 2646);
        assert_eq!(exact_amount(&json!(-5), "t").unwrap().minor(), -5);
        assert!(exact_amount(&json!(26.46), "t").unwrap_err().is_decode());
        assert!(exact_amount(&json!(1e300), "t").unwrap_err().is_decode());
        assert!(exact_amount(&json!(9007199254740992i64), "t")
            .unwrap_err()
            .is_invariant());
        assert!(exact_amount(&json!("1"), "t").is_err());
    }
}
