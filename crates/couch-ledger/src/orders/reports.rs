//! Reading the order ledger: an order's balance and summary, a customer's statement, and the
//! orders not settled.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::model::{
    check_id_part, purchase_id, unknown_order, CurrencyBalance, Entry, EntryKind, OrderBalance,
    OrderSummary, OutstandingPage, Statement,
};
use crate::couch::{ViewQuery, ViewRow};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::meta::Metadata;
use crate::money::{Amount, Currency};

/// The most orders [`Ledger::outstanding_orders`] returns in one page.
pub const OUTSTANDING_LIMIT_MAX: usize = 1000;
/// Rows asked for in one view or `_all_docs` request when paging.
const VIEW_PAGE_ROWS: usize = 500;
/// View requests one call of [`Ledger::outstanding_orders`] may send before it returns a cursor.
const OUTSTANDING_PAGES_MAX: usize = 20;
/// View requests [`Ledger::customer_statement`] may send; more orders than this covers is an
/// error rather than a statement that silently leaves some out.
const STATEMENT_PAGES_MAX: usize = 20;

// A page must make progress after skipping the row of its start key.
const _: () = assert!(VIEW_PAGE_ROWS >= 2);
const _: () = assert!(OUTSTANDING_LIMIT_MAX <= VIEW_PAGE_ROWS * OUTSTANDING_PAGES_MAX);

/// A reduced or emitted view value as an exact amount: an integer within ±(2^53 − 1). A
/// fraction means a document with a non-integer amount got past validation; it is reported,
/// never rounded.
pub(crate) fn exact_amount(value: &Value, what: &str) -> Result<Amount> {
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

impl Ledger {
    /// An order's balance in one request (`orders/ledger`, `group=true`): positive, the
    /// customer owes; zero, settled; negative, the merchant owes the customer.
    ///
    /// # Errors
    ///
    /// An invalid or unknown order id (invalid input); a reduced value that is not an exact
    /// integer in range; the server failed.
    pub async fn order_balance(&self, order_id: &str) -> Result<Amount> {
        let query = ViewQuery {
            group: Some(true),
            ..ViewQuery::default()
        };
        match self.ledger_of(order_id, query).await?.as_slice() {
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
        let query = ViewQuery {
            reduce: Some(false),
            include_docs: Some(true),
            ..ViewQuery::default()
        };
        summarize(order_id, &self.ledger_of(order_id, query).await?)
    }

    /// The `orders/ledger` rows of one order (its id checked first): `query` keyed by it.
    async fn ledger_of(&self, order_id: &str, query: ViewQuery) -> Result<Vec<ViewRow>> {
        check_id_part("order_id", order_id)?;
        let query = ViewQuery {
            key: Some(json!(order_id)),
            ..query
        };
        Ok(self
            .inner
            .client
            .view("orders", "ledger", &query)
            .await?
            .rows)
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
}

/// An order's summary from its `orders/ledger` rows (with their documents), each row checked
/// against its document.
fn summarize(order_id: &str, rows: &[ViewRow]) -> Result<OrderSummary> {
    if rows.is_empty() {
        return Err(unknown_order(order_id));
    }
    let broken = |m: String| order_broken(order_id, m);
    let mut currency: Option<Currency> = None;
    let mut sums = Sums::default();
    let mut entries = Vec::with_capacity(rows.len());
    for row in rows {
        let entry = row_entry(order_id, row, &mut currency)?;
        sums.add(order_id, entry.kind, entry.amount)?;
        entries.push(entry);
    }
    let total = sums
        .total
        .ok_or_else(|| broken("it has entries but no purchase".to_owned()))?;
    let currency = currency.ok_or_else(|| broken("no document was readable".to_owned()))?;
    let overflow = |_| broken("the balance overflows".to_owned());
    let balance = total
        .checked_add(sums.adjusted)
        .and_then(|b| b.checked_sub(sums.paid))
        .and_then(|b| b.checked_add(sums.refunded))
        .map_err(overflow)?;
    if balance != sums.rows {
        return Err(broken(format!(
            "the balance {} differs from the sum of its rows {}",
            balance.minor(),
            sums.rows.minor()
        )));
    }
    entries.sort_by(|a, b| {
        (a.kind != EntryKind::Purchase, &a.id).cmp(&(b.kind != EntryKind::Purchase, &b.id))
    });
    Ok(OrderSummary {
        order_id: order_id.to_owned(),
        currency,
        total,
        adjusted: sums.adjusted,
        paid: sums.paid,
        refunded: sums.refunded,
        balance,
        entries,
    })
}

/// An order whose rows do not add up: `m` says how.
fn order_broken(order_id: &str, m: String) -> Error {
    Error::invariant(format!("order {order_id:?}: {m}"))
}

/// One `orders/ledger` row as an entry: its amount from the view, its kind from its document
/// (whose amount must be the view's, and whose currency the order's: `currency`, set by the
/// first document) or, without one, from its id's prefix.
fn row_entry(order_id: &str, row: &ViewRow, currency: &mut Option<Currency>) -> Result<Entry> {
    let broken = |m: String| order_broken(order_id, m);
    let id = row
        .id
        .clone()
        .ok_or_else(|| Error::decode("orders/ledger map row without an id"))?;
    let value = exact_amount(&row.value, &id)?;
    let (kind, from_doc) = match &row.doc {
        Some(doc) if doc.is_object() => {
            let (kind, signed) = doc_entry(order_id, &id, doc, currency)?;
            (kind, Some(signed))
        }
        // Without its document (a view that lags a deletion) the id's prefix still says what
        // the row is.
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
    let meta = match &row.doc {
        Some(Value::Object(doc)) => Metadata::stored(doc),
        _ => Metadata::new(),
    };
    Ok(Entry {
        id,
        kind,
        amount: value,
        meta,
    })
}

/// The kind of the entry `doc` (with the id `id`) and its amount signed as the view gives it
/// (a payment negative); its currency must be the order's, `currency`, set by the first
/// document.
fn doc_entry(
    order_id: &str,
    id: &str,
    doc: &Value,
    currency: &mut Option<Currency>,
) -> Result<(EntryKind, Amount)> {
    let broken = |m: String| order_broken(order_id, m);
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
    Ok((kind, signed))
}

/// An order's sums, entry by entry.
#[derive(Default)]
struct Sums {
    /// The purchase's total; one purchase an order.
    total: Option<Amount>,
    adjusted: Amount,
    /// Payments, counted positive (the view's values are negative).
    paid: Amount,
    refunded: Amount,
    /// The view's values as they are, which the balance must equal.
    rows: Amount,
}

impl Sums {
    /// Adds the entry of `kind` whose view value is `value`.
    fn add(&mut self, order_id: &str, kind: EntryKind, value: Amount) -> Result<()> {
        let broken = |m: String| order_broken(order_id, m);
        let overflow = |_| broken("the sum overflows".to_owned());
        self.rows = self.rows.checked_add(value).map_err(overflow)?;
        match kind {
            EntryKind::Purchase => {
                if self.total.replace(value).is_some() {
                    return Err(broken("more than one purchase".to_owned()));
                }
            }
            EntryKind::Adjustment => {
                self.adjusted = self.adjusted.checked_add(value).map_err(overflow)?
            }
            EntryKind::Payment => self.paid = self.paid.checked_sub(value).map_err(overflow)?,
            EntryKind::Refund => {
                self.refunded = self.refunded.checked_add(value).map_err(overflow)?
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
