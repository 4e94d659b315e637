//! Recording: each entry of an order written once under its deterministic id, and a retried
//! write told from a different one by comparing what is stored.

use serde_json::{json, Map, Value};

use super::model::{
    purchase_id, unknown_order, Adjustment, Delivered, EntryKind, Payment, Purchase, RecordStatus,
    Recorded, Refund, Shipment,
};
use crate::couch::WriteOptions;
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::meta::{self, Metadata};
use crate::money::{Amount, Currency};

/// Attempts at a write-once document (a create that conflicts with a document that is gone by
/// the time we read it is written again).
const WRITE_ATTEMPTS_MAX: usize = 3;

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

/// A money entry of an order, as [`Ledger::record_money`] writes it.
struct MoneyEntry<'a> {
    kind: EntryKind,
    order_id: &'a str,
    reference: &'a str,
    currency: Currency,
    amount: Amount,
    /// The kind's own fields, in the order they follow the common ones.
    fields: [(&'static str, Value); 2],
    meta: &'a Metadata,
}

/// What a money entry needs from its order's purchase.
struct OrderTerms {
    account_id: String,
}

/// The first field where `ours` and `stored` differ, as a path (`value`, `basket[1].price`),
/// ignoring CouchDB's own top-level fields (`_id`, `_rev`…) and the metadata, which is not part
/// of what an entry records (the first write's stays). `None` when they are the same.
fn first_difference(ours: &Value, stored: &Value) -> Option<String> {
    let strip = |v: &Value| -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| !k.starts_with('_') && *k != meta::FIELD)
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

/// What the live leaves of a write-once id say of `doc`, whose own revision is `ours` when it
/// is known to be stored (`None`: found among the leaves, or not stored).
///
/// Write-once bodies are never edited nor deleted (the validation refuses both to everyone),
/// and each is a first revision: the winner, the body every view counts, is the greatest
/// revision id among them, and a body beaten by another live one never counts again
/// (docs/CLUSTER.md, "Write-once documents").
fn judge(all: &[Value], doc: &Value, ours: Option<&str>) -> Judged {
    let ours = ours.map(rev_order).or_else(|| {
        all.iter()
            .find(|leaf| first_difference(doc, leaf).is_none())
            .and_then(|leaf| rev_of(leaf))
    });
    let others: Vec<(&Value, String)> = all
        .iter()
        .filter_map(|leaf| first_difference(doc, leaf).map(|field| (leaf, field)))
        .collect();
    let Some(ours) = ours else {
        return match others.first() {
            Some((_, field)) => Judged::Beaten(field.clone()),
            None => Judged::Alone,
        };
    };
    if let Some((_, field)) = others.iter().find(|(leaf, _)| rev_of(leaf) > Some(ours)) {
        return Judged::Beaten(field.clone());
    }
    if others.is_empty() {
        Judged::Alone
    } else {
        Judged::Ahead
    }
}

/// A write-once body among the leaves of its id.
#[derive(Debug, PartialEq)]
enum Judged {
    /// The only body there (or nothing else is).
    Alone,
    /// Stored, and the greatest body there: it counts, unless a greater one that had not
    /// reached the copies read shows up.
    Ahead,
    /// Another body (this field differs) is greater, or ours is not stored: ours never counts.
    Beaten(String),
}

/// A leaf's revision in CouchDB's order.
fn rev_of(leaf: &Value) -> Option<(u64, &str)> {
    leaf.get("_rev").and_then(Value::as_str).map(rev_order)
}

/// A revision `N-hash` in CouchDB's order: its generation, then its hash.
fn rev_order(rev: &str) -> (u64, &str) {
    match rev.split_once('-') {
        Some((n, hash)) => (n.parse().unwrap_or(0), hash),
        None => (0, rev),
    }
}

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
        self.record_money(MoneyEntry {
            kind: EntryKind::Payment,
            order_id: &payment.order_id,
            reference: &payment.reference,
            currency: payment.currency,
            amount: payment.amount,
            fields: [
                ("method", json!(payment.method)),
                ("payment_reference", json!(payment.reference)),
            ],
            meta: &payment.meta,
        })
        .await
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
        self.record_money(MoneyEntry {
            kind: EntryKind::Refund,
            order_id: &refund.order_id,
            reference: &refund.reference,
            currency: refund.currency,
            amount: refund.amount,
            fields: [
                ("reason", json!(refund.reason)),
                ("refund_reference", json!(refund.reference)),
            ],
            meta: &refund.meta,
        })
        .await
    }

    /// Records an adjustment as `adjustment:{order_id}:{reference}`; its signed amount is added
    /// to the order's balance.
    ///
    /// # Errors
    ///
    /// As [`Ledger::record_payment`] (the amount must not be zero).
    pub async fn record_adjustment(&self, adjustment: &Adjustment) -> Result<Recorded> {
        adjustment.validate()?;
        self.record_money(MoneyEntry {
            kind: EntryKind::Adjustment,
            order_id: &adjustment.order_id,
            reference: &adjustment.reference,
            currency: adjustment.currency,
            amount: adjustment.amount,
            fields: [
                ("reason", json!(adjustment.reason)),
                ("reference", json!(adjustment.reference)),
            ],
            meta: &adjustment.meta,
        })
        .await
    }

    /// Records a shipment as `shipment:{order_id}:{reference}` (no money).
    ///
    /// # Errors
    ///
    /// Invalid ids or carrier, an unknown order, this reference recorded with other content, or
    /// the server failed.
    pub async fn record_shipment(&self, shipment: &Shipment) -> Result<Recorded> {
        shipment.validate()?;
        let carrier = ("carrier", json!(shipment.carrier));
        self.record_status(
            "shipment",
            &shipment.order_id,
            &shipment.reference,
            Some(carrier),
        )
        .await
    }

    /// Records a delivery as `delivery:{order_id}:{reference}` (no money).
    ///
    /// # Errors
    ///
    /// Invalid ids, an unknown order, or the server failed.
    pub async fn record_delivery(&self, delivered: &Delivered) -> Result<Recorded> {
        delivered.validate()?;
        self.record_status("delivery", &delivered.order_id, &delivered.reference, None)
            .await
    }

    /// Records a money entry of an order (a payment, refund or adjustment, validated) as
    /// `{kind}:{order_id}:{reference}`, once its order is known, in its currency, and has room
    /// for the amount: the order's account, the currency and the amount, then the kind's own
    /// fields.
    async fn record_money(&self, entry: MoneyEntry<'_>) -> Result<Recorded> {
        let order = self
            .order_terms(entry.order_id, Some(entry.currency))
            .await?;
        let id = entry_id(entry.kind.as_str(), entry.order_id, entry.reference);
        self.check_order_room(entry.order_id, &id, entry.kind, entry.amount)
            .await?;
        let mut doc = json!({
            "_id": id,
            "type": entry.kind.as_str(),
            "order_id": entry.order_id,
            "account_id": order.account_id,
            "currency": entry.currency,
            "value": entry.amount,
        });
        for (name, value) in entry.fields {
            doc[name] = value;
        }
        if let Value::Object(fields) = &mut doc {
            entry.meta.store(fields);
        }
        self.write_once(&id, doc).await
    }

    /// Records a status entry of an order (a shipment or delivery, validated; no money) as
    /// `{kind}:{order_id}:{reference}` once its order is known, with the kind's own field if
    /// it has one.
    async fn record_status(
        &self,
        kind: &str,
        order_id: &str,
        reference: &str,
        field: Option<(&str, Value)>,
    ) -> Result<Recorded> {
        self.order_terms(order_id, None).await?;
        let id = entry_id(kind, order_id, reference);
        let mut doc = json!({
            "_id": id,
            "type": kind,
            "order_id": order_id,
            "reference": reference,
        });
        if let Some((name, value)) = field {
            doc[name] = value;
        }
        self.write_once(&id, doc).await
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
    /// exists, every leaf is compared with ours (docs/CLUSTER.md): on a cluster two bodies
    /// under one id can both be stored. Ours alone is `Exists`; ours beaten by a greater body,
    /// or not stored beside another, is a mismatch naming the field (ours never counts); ours
    /// the greatest of several is `Uncertain` (it counts, and the conflict stays for a person).
    /// Taken by some copies only (202), it is `Uncertain` unless the read back shows a greater
    /// body (a mismatch).
    async fn write_once(&self, id: &str, doc: Value) -> Result<Recorded> {
        let client = &self.inner.client;
        // The copies must be known: a 201 at the server's default `w` is not every copy's, and
        // would be told `created` while a rival body may still win on the others.
        let options = WriteOptions {
            w: self.inner.quorum.several_copies(client).await?,
        };
        let recorded = |status| Recorded {
            id: id.to_owned(),
            status,
        };
        for _ in 0..WRITE_ATTEMPTS_MAX {
            match client.put_with(id, &doc, &options).await {
                Ok(written) if written.accepted => {
                    tracing::info!(id, "write accepted (202), not on every copy yet");
                    let bodies = self.bodies(id).await?;
                    return match judge(&bodies, &doc, Some(&written.rev)) {
                        Judged::Beaten(field) => Err(Error::mismatch(id, &field)),
                        _ => Ok(recorded(RecordStatus::Uncertain)),
                    };
                }
                Ok(written) => {
                    debug_assert_eq!(written.id, id);
                    return Ok(recorded(RecordStatus::Created));
                }
                // CouchDB answers 409 for a create over an existing document. pouchdb-server
                // runs validate_doc_update first, whose write-once rule answers 403; a 403 for
                // a document that does not exist is a real refusal.
                Err(e) if e.is_conflict() || e.is_forbidden() => {
                    let bodies = self.bodies(id).await?;
                    if bodies.is_empty() {
                        if e.is_forbidden() {
                            return Err(e);
                        }
                        // Deleted between our write and our read: write again.
                        continue;
                    }
                    return match judge(&bodies, &doc, None) {
                        Judged::Alone => Ok(recorded(RecordStatus::Exists)),
                        Judged::Ahead => Ok(recorded(RecordStatus::Uncertain)),
                        Judged::Beaten(field) => Err(Error::mismatch(id, &field)),
                    };
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::invariant(format!(
            "{id}: kept conflicting with a document that then disappeared"
        )))
    }

    /// Every live body of the write-once `id`, from every copy that answers (`open_revs=all`,
    /// `r` = the copies): a quorum read can hide a body most copies hold (docs/CLUSTER.md).
    /// Empty when it does not exist.
    async fn bodies(&self, id: &str) -> Result<Vec<Value>> {
        let client = &self.inner.client;
        let copies = self.inner.quorum.several_copies(client).await?;
        client.live_leaves(id, copies).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two bodies under one write-once id: the greater revision counts (CouchDB's winner), so
    /// its caller is told `uncertain` (another body stands beside it), and the other's caller
    /// a mismatch, whichever answer (202, or 409 and a read) each met. One body alone is
    /// `exists`; a body not stored beside another is a mismatch.
    #[test]
    fn a_body_counts_only_when_no_greater_body_stands_beside_it() {
        let body = |rev: &str, value: i64| json!({"_id": "p", "_rev": rev, "value": value});
        let ours = json!({"_id": "p", "value": 100});
        let two = [body("1-b", 200), body("1-a", 100)];
        assert_eq!(judge(&two, &ours, None), Judged::Beaten("value".into()));
        assert_eq!(
            judge(&two, &ours, Some("1-a")),
            Judged::Beaten("value".into())
        );
        let two = [body("1-a", 200), body("1-b", 100)];
        assert_eq!(judge(&two, &ours, None), Judged::Ahead);
        assert_eq!(judge(&two, &ours, Some("1-b")), Judged::Ahead);
        let alone = [body("1-a", 100)];
        assert_eq!(judge(&alone, &ours, None), Judged::Alone);
        assert_eq!(judge(&alone, &ours, Some("1-a")), Judged::Alone);
        let other = [body("1-a", 200)];
        assert_eq!(judge(&other, &ours, None), Judged::Beaten("value".into()));
        // A 202 of ours the read did not see yet, beside a lesser body: ours counts.
        assert_eq!(judge(&other, &ours, Some("1-b")), Judged::Ahead);
        assert!(rev_order("10-a") > rev_order("9-b"));
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
}
