//! What the order ledger records and answers — the inputs (a purchase, payments, refunds,
//! adjustments, shipments, deliveries) and the outputs (what a write found, an order's
//! summary, statements) — and the checks an input passes before anything is written.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::meta::Metadata;
use crate::money::{plain_decimal, Amount, Currency};

/// The longest order id, reference or account id, in characters.
pub const ID_PART_LEN_MAX: usize = crate::limits::ID_CHARS_MAX;

/// The longest free text (a method, reason, carrier, title…), in characters.
pub const TEXT_LEN_MAX: usize = 1000;
/// The most items a basket may hold (a purchase is one document; keep it small).
pub const BASKET_ITEMS_MAX: usize = 1000;

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
    /// Written once with the entry and returned with it; not part of what the entry
    /// records: the same reference again with other metadata is the same entry.
    pub meta: Metadata,
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
    /// Written once with the entry and returned with it; not part of what the entry
    /// records: the same reference again with other metadata is the same entry.
    pub meta: Metadata,
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
    /// Written once with the entry and returned with it; not part of what the entry
    /// records: the same reference again with other metadata is the same entry.
    pub meta: Metadata,
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

    pub(super) fn from_type(t: &str) -> Option<EntryKind> {
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
    /// What its writer attached (empty when the view's row came without its document).
    pub meta: Metadata,
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
        check_text("method", self.method.as_deref())?;
        self.meta.check()
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
        check_text("reason", self.reason.as_deref())?;
        self.meta.check()
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
        check_text("reason", self.reason.as_deref())?;
        self.meta.check()
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

// ---- ids and errors shared by recording and reading -------------------------------------------

pub(super) fn purchase_id(order_id: &str) -> String {
    format!("purchase:{order_id}")
}

pub(super) fn unknown_order(order_id: &str) -> Error {
    Error::invalid(
        "order_id",
        format!("unknown order {order_id:?}: no purchase is recorded for it"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CLOUDANT: &str = include_str!("../../../../examples/cloudant-purchase.json");

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
}
