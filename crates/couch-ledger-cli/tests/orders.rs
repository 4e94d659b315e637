use serde_json::{json, Value};

use crate::support;
use couch_ledger::{
    Adjustment, Amount, Currency, Delivered, EntryKind, Ledger, Payment, Purchase, RecordStatus,
    Refund, Shipment,
};

const CLOUDANT: &str = include_str!("../../../examples/cloudant-purchase.json");
const ORDER: &str = "320afa89017426b994162ab004ce3383";

fn gbp() -> Currency {
    Currency::from_code("GBP").unwrap()
}

fn cloudant() -> Purchase {
    Purchase::from_json(CLOUDANT, Some(gbp())).unwrap()
}

/// A small purchase of `total` minor units (all of it pretax) for `account`.
pub(crate) fn purchase(order: &str, account: &str, total: i64, currency: Currency) -> Purchase {
    let mut p = cloudant();
    p.order_id = order.to_owned();
    p.account_id = account.to_owned();
    p.currency = currency;
    p.basket.truncate(1);
    p.pretax = Amount::new(total).unwrap();
    p.tax = Amount::ZERO;
    p.delivery.price = Amount::ZERO;
    p.total = Amount::new(total).unwrap();
    p
}

fn payment(order: &str, reference: &str, minor: i64) -> Payment {
    Payment {
        order_id: order.to_owned(),
        reference: reference.to_owned(),
        amount: Amount::new(minor).unwrap(),
        currency: gbp(),
        method: Some("credit card".to_owned()),
        meta: Default::default(),
    }
}

fn gbp_amount(text: &str) -> Amount {
    gbp().parse(text).unwrap()
}

/// What the database holds: what a refused write must leave as it was.
async fn db_state(l: &Ledger) -> support::DbSnapshot {
    support::db_snapshot(l.client().database()).await
}

#[tokio::test]
async fn the_cloudant_example_is_settled_by_two_payments() {
    let l = support::ledger("cloudant").await;
    let r = l.record_purchase(&cloudant()).await.unwrap();
    assert_eq!(r.id, format!("purchase:{ORDER}"));
    assert_eq!(r.status, RecordStatus::Created);
    assert_eq!(l.order_balance(ORDER).await.unwrap().minor(), 2646);

    let card = Payment {
        amount: gbp_amount("6.46"),
        ..payment(ORDER, "AB9977G244FF2F667", 0)
    };
    let r = l.record_payment(&card).await.unwrap();
    assert_eq!(r.status, RecordStatus::Created);
    assert_eq!(r.id, format!("payment:{ORDER}:AB9977G244FF2F667"));
    assert_eq!(l.order_balance(ORDER).await.unwrap().minor(), 2000);
    let voucher = Payment {
        amount: gbp_amount("20.00"),
        method: Some("voucher".into()),
        ..payment(ORDER, "Q88775662377224", 0)
    };
    assert_eq!(
        l.record_payment(&voucher).await.unwrap().status,
        RecordStatus::Created
    );
    assert_eq!(l.order_balance(ORDER).await.unwrap(), Amount::ZERO);

    let s = l.order(ORDER).await.unwrap();
    assert_eq!(s.order_id, ORDER);
    assert_eq!(s.currency, gbp());
    assert_eq!(s.total.minor(), 2646);
    assert_eq!(s.paid.minor(), 2646);
    assert_eq!(s.adjusted, Amount::ZERO);
    assert_eq!(s.refunded, Amount::ZERO);
    assert_eq!(s.balance, Amount::ZERO);
    assert_eq!(s.entries.len(), 3);
    assert_eq!(s.entries[0].kind, EntryKind::Purchase);
    assert_eq!(s.entries[0].amount.minor(), 2646);
    let mut payments: Vec<i64> = s.entries[1..].iter().map(|e| e.amount.minor()).collect();
    payments.sort();
    assert_eq!(payments, [-2000, -646]);
    assert!(s.entries[1..].iter().all(|e| e.kind == EntryKind::Payment));

    // The stored documents keep the Cloudant shape in minor units, account copied over.
    let doc: Value = l.client().get(&format!("purchase:{ORDER}")).await.unwrap();
    assert_eq!(doc["basket"][0]["price"], 833);
    assert_eq!(doc["basket"][0]["tax"], 20);
    assert_eq!(doc["delivery"]["price"], 299);
    assert_eq!(doc["delivery"]["address"]["postcode"], "W1A 1AA");
    assert_eq!(doc["currency"], "GBP");
    let doc: Value = l
        .client()
        .get(&format!("payment:{ORDER}:Q88775662377224"))
        .await
        .unwrap();
    assert_eq!(doc["account_id"], "985522332");
    assert_eq!(doc["value"], 2000);
    assert_eq!(doc["method"], "voucher");
    assert_eq!(doc["payment_reference"], "Q88775662377224");
}

#[tokio::test]
async fn a_resent_entry_exists_and_other_content_is_a_mismatch() {
    let l = support::ledger("resend").await;
    l.record_purchase(&cloudant()).await.unwrap();
    let p = payment(ORDER, "AB9977G244FF2F667", 646);
    l.record_payment(&p).await.unwrap();
    let before = db_state(&l).await;

    let again = l.record_payment(&p).await.unwrap();
    assert_eq!(again.status, RecordStatus::Exists);
    assert_eq!(again.id, format!("payment:{ORDER}:AB9977G244FF2F667"));
    assert_eq!(
        l.record_purchase(&cloudant()).await.unwrap().status,
        RecordStatus::Exists
    );
    assert_eq!(db_state(&l).await, before, "a re-sent entry writes nothing");

    let e = l
        .record_payment(&payment(ORDER, "AB9977G244FF2F667", 700))
        .await
        .unwrap_err();
    assert!(e.is_mismatch(), "{e}");
    assert!(e.is_invalid_input());
    assert_eq!(e.field(), Some("value"));
    let other_method = Payment {
        method: Some("voucher".into()),
        ..p.clone()
    };
    let e = l.record_payment(&other_method).await.unwrap_err();
    assert_eq!(e.field(), Some("method"), "{e}");
    let mut other_purchase = cloudant();
    other_purchase.basket[1].title = Some("Middlemarch".into());
    let e = l.record_purchase(&other_purchase).await.unwrap_err();
    assert!(e.is_mismatch(), "{e}");
    assert_eq!(e.field(), Some("basket[1].title"));
    assert_eq!(db_state(&l).await, before, "a mismatch writes nothing");
    assert_eq!(l.order_balance(ORDER).await.unwrap().minor(), 2000);

    // Status documents are idempotent the same way.
    let s = Shipment {
        order_id: ORDER.into(),
        reference: "RM1".into(),
        carrier: Some("Royal Mail".into()),
    };
    assert_eq!(
        l.record_shipment(&s).await.unwrap().status,
        RecordStatus::Created
    );
    assert_eq!(
        l.record_shipment(&s).await.unwrap().status,
        RecordStatus::Exists
    );
    let e = l
        .record_shipment(&Shipment {
            carrier: None,
            ..s.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("carrier"), "{e}");
    let d = Delivered {
        order_id: ORDER.into(),
        reference: "RM1".into(),
    };
    assert_eq!(
        l.record_delivery(&d).await.unwrap().status,
        RecordStatus::Created
    );
    assert_eq!(
        l.record_delivery(&d).await.unwrap().status,
        RecordStatus::Exists
    );
    assert_eq!(
        l.order_balance(ORDER).await.unwrap().minor(),
        2000,
        "status documents move no money"
    );
}

#[tokio::test]
async fn entries_for_an_unknown_order_are_refused() {
    let l = support::ledger("unknown_order").await;
    let before = db_state(&l).await;
    let e = l
        .record_payment(&payment("nope", "r1", 100))
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_eq!(e.field(), Some("order_id"));
    assert!(e.to_string().contains("unknown order"), "{e}");
    let e = l
        .record_shipment(&Shipment {
            order_id: "nope".into(),
            reference: "s".into(),
            carrier: None,
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("unknown order"), "{e}");
    let e = l.order_balance("nope").await.unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("unknown order"),
        "{e}"
    );
    let e = l.order("nope").await.unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("unknown order"),
        "{e}"
    );
    assert_eq!(db_state(&l).await, before);
}

#[tokio::test]
async fn money_in_another_currency_is_refused() {
    let l = support::ledger("currency_mismatch").await;
    l.record_purchase(&cloudant()).await.unwrap();
    let before = db_state(&l).await;
    let eur = Currency::from_code("EUR").unwrap();
    let e = l
        .record_payment(&Payment {
            currency: eur,
            ..payment(ORDER, "r1", 646)
        })
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_eq!(e.field(), Some("currency"));
    assert!(e.to_string().contains("GBP"), "{e}");
    let e = l
        .record_refund(&Refund {
            order_id: ORDER.into(),
            reference: "r1".into(),
            amount: Amount::new(1).unwrap(),
            currency: eur,
            reason: None,
            meta: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("currency"), "{e}");
    assert_eq!(db_state(&l).await, before);
}

#[tokio::test]
async fn purchases_whose_totals_do_not_add_up_are_refused() {
    let l = support::ledger("bad_totals").await;
    let before = db_state(&l).await;
    let mut p = cloudant();
    p.total = gbp_amount("26.47");
    let e = l.record_purchase(&p).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_eq!(e.field(), Some("total"));
    assert!(e.to_string().contains("26.46"), "{e}");

    let mut p = cloudant();
    p.basket[0].quantity = 0;
    assert_eq!(
        l.record_purchase(&p).await.unwrap_err().field(),
        Some("basket[0].quantity")
    );
    let mut p = cloudant();
    p.basket[1].price = Amount::new(-1).unwrap();
    assert_eq!(
        l.record_purchase(&p).await.unwrap_err().field(),
        Some("basket[1].price")
    );
    let mut p = cloudant();
    p.tax = Amount::new(-332).unwrap();
    p.pretax = gbp_amount("26.79");
    assert_eq!(
        l.record_purchase(&p).await.unwrap_err().field(),
        Some("tax")
    );
    // An overflow is refused, never wrapped.
    let mut p = cloudant();
    p.pretax = Amount::new(couch_ledger::AMOUNT_ABS_MAX).unwrap();
    assert_eq!(
        l.record_purchase(&p).await.unwrap_err().field(),
        Some("total")
    );
    // From JSON: decimals that do not add up, or are not exact.
    let bad = CLOUDANT.replace("\"total\": 26.46", "\"total\": 26.45");
    assert_eq!(
        Purchase::from_json(&bad, Some(gbp())).unwrap_err().field(),
        Some("total")
    );
    let bad = CLOUDANT.replace("\"price\": 8.33", "\"price\": 8.333");
    assert_eq!(
        Purchase::from_json(&bad, Some(gbp())).unwrap_err().field(),
        Some("basket[0].price")
    );
    assert_eq!(db_state(&l).await, before);
}

#[tokio::test]
async fn ids_that_could_collide_or_are_reserved_are_refused() {
    let l = support::ledger("bad_ids").await;
    l.record_purchase(&cloudant()).await.unwrap();
    let before = db_state(&l).await;
    let long = "x".repeat(201);
    for bad in [
        "_design",
        "_x",
        "a:b",
        "a\u{7}b",
        "tab\there",
        "new\nline",
        "",
        long.as_str(),
    ] {
        let mut p = cloudant();
        p.order_id = bad.to_owned();
        let e = l.record_purchase(&p).await.unwrap_err();
        assert!(e.is_invalid_input(), "{bad:?}: {e}");
        assert_eq!(e.field(), Some("order_id"), "{bad:?}");

        let mut p = cloudant();
        p.account_id = bad.to_owned();
        assert_eq!(
            l.record_purchase(&p).await.unwrap_err().field(),
            Some("account_id"),
            "{bad:?}"
        );
        let e = l
            .record_payment(&payment(ORDER, bad, 100))
            .await
            .unwrap_err();
        assert_eq!(e.field(), Some("reference"), "{bad:?}: {e}");
        let e = l.record_payment(&payment(bad, "r", 100)).await.unwrap_err();
        assert_eq!(e.field(), Some("order_id"), "{bad:?}: {e}");
        assert!(l.order_balance(bad).await.unwrap_err().is_invalid_input());
    }
    // "payment:a:b:c" would be order "a:b" ref "c" or order "a" ref "b:c": ':' is refused.
    let e = l
        .record_payment(&payment(ORDER, "b:c", 100))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("':'"), "{e}");
    assert_eq!(db_state(&l).await, before);
}

#[tokio::test]
async fn amounts_must_be_positive_and_adjustments_not_zero() {
    let l = support::ledger("amount_signs").await;
    l.record_purchase(&cloudant()).await.unwrap();
    let before = db_state(&l).await;
    for minor in [0, -1] {
        let e = l
            .record_payment(&payment(ORDER, "p", minor))
            .await
            .unwrap_err();
        assert_eq!(e.field(), Some("amount"), "{minor}: {e}");
        let e = l
            .record_refund(&Refund {
                order_id: ORDER.into(),
                reference: "r".into(),
                amount: Amount::new(minor).unwrap(),
                currency: gbp(),
                reason: None,
                meta: Default::default(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.field(), Some("amount"), "{minor}: {e}");
    }
    let e = l
        .record_adjustment(&Adjustment {
            order_id: ORDER.into(),
            reference: "a".into(),
            amount: Amount::ZERO,
            currency: gbp(),
            reason: None,
            meta: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("amount"), "{e}");
    assert_eq!(db_state(&l).await, before);
}

#[tokio::test]
async fn refunds_and_adjustments_move_the_balance_both_ways() {
    let l = support::ledger("refund_adjust").await;
    l.record_purchase(&cloudant()).await.unwrap();
    l.record_payment(&payment(ORDER, "full", 2646))
        .await
        .unwrap();
    assert_eq!(l.order_balance(ORDER).await.unwrap(), Amount::ZERO);
    let adjust = |reference: &str, text: &str| Adjustment {
        order_id: ORDER.into(),
        reference: reference.into(),
        amount: gbp_amount(text),
        currency: gbp(),
        reason: Some("goods returned".into()),
        meta: Default::default(),
    };
    // Goods come back: the order is worth less, the merchant owes the customer.
    l.record_adjustment(&adjust("ret1", "-5.00")).await.unwrap();
    assert_eq!(l.order_balance(ORDER).await.unwrap().minor(), -500);
    // The refund pays it back.
    l.record_refund(&Refund {
        order_id: ORDER.into(),
        reference: "ret1".into(),
        amount: gbp_amount("5.00"),
        currency: gbp(),
        reason: Some("goods returned".into()),
        meta: Default::default(),
    })
    .await
    .unwrap();
    assert_eq!(l.order_balance(ORDER).await.unwrap(), Amount::ZERO);
    // A surcharge: the customer owes again.
    l.record_adjustment(&adjust("fee", "1.50")).await.unwrap();
    assert_eq!(l.order_balance(ORDER).await.unwrap().minor(), 150);
    // An overpayment: negative again.
    l.record_payment(&payment(ORDER, "over", 1000))
        .await
        .unwrap();
    assert_eq!(l.order_balance(ORDER).await.unwrap().minor(), -850);

    let s = l.order(ORDER).await.unwrap();
    assert_eq!(s.total.minor(), 2646);
    assert_eq!(s.adjusted.minor(), -350);
    assert_eq!(s.paid.minor(), 3646);
    assert_eq!(s.refunded.minor(), 500);
    assert_eq!(s.balance.minor(), -850);
    assert_eq!(s.entries.len(), 6);
    let sum = s
        .entries
        .iter()
        .try_fold(Amount::ZERO, |acc, e| acc.checked_add(e.amount))
        .unwrap();
    assert_eq!(sum, s.balance);
}

#[tokio::test]
async fn a_customer_statement_lists_orders_and_totals_per_currency() {
    let l = support::ledger("statement").await;
    let eur = Currency::from_code("EUR").unwrap();
    l.record_purchase(&purchase("a1", "alice", 1000, gbp()))
        .await
        .unwrap();
    l.record_purchase(&purchase("a2", "alice", 2500, gbp()))
        .await
        .unwrap();
    l.record_purchase(&purchase("a3", "alice", 700, eur))
        .await
        .unwrap();
    l.record_purchase(&purchase("b1", "bob", 999, gbp()))
        .await
        .unwrap();
    l.record_payment(&payment("a1", "p", 1000)).await.unwrap();
    l.record_payment(&payment("a2", "p", 500)).await.unwrap();

    let s = l.customer_statement("alice").await.unwrap();
    assert_eq!(s.account_id, "alice");
    let orders: Vec<(&str, i64)> = s
        .orders
        .iter()
        .map(|o| (o.order_id.as_str(), o.balance.minor()))
        .collect();
    assert_eq!(orders, [("a1", 0), ("a2", 2000), ("a3", 700)]);
    assert_eq!(s.orders[2].currency, Some(eur));
    let totals: Vec<(&str, i64)> = s
        .totals
        .iter()
        .map(|t| (t.currency.code(), t.balance.minor()))
        .collect();
    assert_eq!(totals, [("EUR", 700), ("GBP", 2000)]);

    let s = l.customer_statement("bob").await.unwrap();
    assert_eq!(s.orders.len(), 1);
    assert_eq!(s.totals[0].balance.minor(), 999);
    let s = l.customer_statement("carol").await.unwrap();
    assert!(s.orders.is_empty() && s.totals.is_empty());
    assert!(l
        .customer_statement("_x")
        .await
        .unwrap_err()
        .is_invalid_input());
}

#[tokio::test]
async fn outstanding_orders_come_in_pages() {
    let l = support::ledger("outstanding").await;
    for o in ["o1", "o2", "o3", "o4", "o5"] {
        l.record_purchase(&purchase(o, "c", 1000, gbp()))
            .await
            .unwrap();
    }
    l.record_payment(&payment("o2", "p", 1000)).await.unwrap();
    l.record_payment(&payment("o4", "p", 1000)).await.unwrap();
    // Overpaid: the merchant owes; outstanding too.
    l.record_payment(&payment("o5", "p", 1200)).await.unwrap();

    let first = l.outstanding_orders(2, None).await.unwrap();
    let got: Vec<(&str, i64)> = first
        .orders
        .iter()
        .map(|o| (o.order_id.as_str(), o.balance.minor()))
        .collect();
    assert_eq!(got, [("o1", 1000), ("o3", 1000)]);
    assert_eq!(first.orders[0].currency, Some(gbp()));
    let next = first.next.expect("a next page");
    let second = l.outstanding_orders(2, Some(&next)).await.unwrap();
    let got: Vec<(&str, i64)> = second
        .orders
        .iter()
        .map(|o| (o.order_id.as_str(), o.balance.minor()))
        .collect();
    assert_eq!(got, [("o5", -200)]);
    assert_eq!(second.next, None);

    let all = l.outstanding_orders(10, None).await.unwrap();
    assert_eq!(all.orders.len(), 3);
    assert_eq!(all.next, None);
    // Exactly `limit` left: no empty page after it.
    let exact = l.outstanding_orders(3, None).await.unwrap();
    assert_eq!(exact.orders.len(), 3);
    assert_eq!(exact.next, None);
    for bad in [0, couch_ledger::OUTSTANDING_LIMIT_MAX + 1] {
        let e = l.outstanding_orders(bad, None).await.unwrap_err();
        assert_eq!(e.field(), Some("limit"));
    }
}

#[tokio::test]
async fn the_server_refuses_updates_and_deletes_of_ledger_documents() {
    let l = support::ledger("immutable").await;
    l.record_purchase(&cloudant()).await.unwrap();
    l.record_payment(&payment(ORDER, "AB9977G244FF2F667", 646))
        .await
        .unwrap();
    let db = l.client().database().to_owned();
    let http = support::raw();
    for id in [
        format!("purchase:{ORDER}"),
        format!("payment:{ORDER}:AB9977G244FF2F667"),
    ] {
        let path = format!("{db}/{}", id.replace(':', "%3A"));
        let mut doc: Value = support::auth(http.get(support::raw_url(&path)))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let rev = doc["_rev"].as_str().unwrap().to_owned();
        assert!(rev.starts_with("1-"), "{rev}");
        // An update with the right _rev: refused by validate_doc_update.
        if doc.get("total").is_some() {
            doc["total"] = json!(1);
            doc["pretax"] = json!(1);
            doc["tax"] = json!(0);
            doc["delivery"]["price"] = json!(0);
        } else {
            doc["value"] = json!(1);
        }
        let put = support::auth(http.put(support::raw_url(&path)))
            .json(&doc)
            .send()
            .await
            .unwrap();
        assert_eq!(put.status().as_u16(), 403, "update of {id}");
        let del = support::auth(http.delete(support::raw_url(&format!("{path}?rev={rev}"))))
            .send()
            .await
            .unwrap();
        assert_eq!(del.status().as_u16(), 403, "delete of {id}");
        let after: Value = l.client().get(&id).await.unwrap();
        assert_eq!(after["_rev"], json!(rev), "{id} is still at revision 1");
    }
    assert_eq!(l.order_balance(ORDER).await.unwrap().minor(), 2000);
}

#[tokio::test]
async fn the_view_balance_equals_the_sum_of_the_documents() {
    let l = support::ledger("view_vs_docs").await;
    for (o, total) in [("v1", 1000), ("v2", 2999), ("v3", 5)] {
        l.record_purchase(&purchase(o, "c", total, gbp()))
            .await
            .unwrap();
    }
    l.record_payment(&payment("v1", "p1", 400)).await.unwrap();
    l.record_payment(&payment("v1", "p2", 600)).await.unwrap();
    l.record_payment(&payment("v2", "p1", 3000)).await.unwrap();
    l.record_refund(&Refund {
        order_id: "v2".into(),
        reference: "r1".into(),
        amount: Amount::new(1).unwrap(),
        currency: gbp(),
        reason: None,
        meta: Default::default(),
    })
    .await
    .unwrap();
    l.record_adjustment(&Adjustment {
        order_id: "v3".into(),
        reference: "a1".into(),
        amount: Amount::new(-5).unwrap(),
        currency: gbp(),
        reason: None,
        meta: Default::default(),
    })
    .await
    .unwrap();
    l.record_shipment(&Shipment {
        order_id: "v3".into(),
        reference: "s1".into(),
        carrier: None,
    })
    .await
    .unwrap();

    // Every document, read raw, summed by the rules of docs/DOCUMENTS.md.
    let db = l.client().database().to_owned();
    let all: Value = support::auth(support::raw().get(support::raw_url(&format!(
        "{db}/_all_docs?include_docs=true"
    ))))
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let mut sums: std::collections::BTreeMap<String, i64> = Default::default();
    for row in all["rows"].as_array().unwrap() {
        let doc = &row["doc"];
        let signed = match doc["type"].as_str() {
            Some("purchase") => doc["total"].as_i64().unwrap(),
            Some("payment") => -doc["value"].as_i64().unwrap(),
            Some("refund" | "adjustment") => doc["value"].as_i64().unwrap(),
            _ => continue,
        };
        *sums
            .entry(doc["order_id"].as_str().unwrap().to_owned())
            .or_default() += signed;
    }
    assert_eq!(sums.len(), 3);
    for (order, sum) in &sums {
        assert_eq!(
            l.order_balance(order).await.unwrap().minor(),
            *sum,
            "{order}"
        );
        assert_eq!(
            l.order(order).await.unwrap().balance.minor(),
            *sum,
            "{order}"
        );
    }
    assert_eq!(sums["v1"], 0);
    assert_eq!(sums["v2"], 0);
    assert_eq!(sums["v3"], 0);
}

/// `order_fresh` (`order show --fresh`) reads the order's documents by id, not the view: the
/// same summary as `order`, and a conflicted entry is named, never one body picked.
#[tokio::test]
async fn an_order_read_fresh_from_its_documents_equals_the_view_and_names_a_conflict() {
    let l = support::ledger("order_fresh").await;
    l.record_purchase(&purchase("of1", "cust", 5_000, gbp()))
        .await
        .unwrap();
    l.record_payment(&payment("of1", "p1", 1_200))
        .await
        .unwrap();
    l.record_payment(&payment("of1", "p2", 300)).await.unwrap();
    // Another order whose ids sort right after: never counted in of1's.
    l.record_purchase(&purchase("of10", "cust", 700, gbp()))
        .await
        .unwrap();
    l.record_payment(&payment("of10", "p1", 700)).await.unwrap();
    let viewed = l.order("of1").await.unwrap();
    let fresh = l.order_fresh("of1").await.unwrap();
    assert_eq!(fresh, viewed);
    assert_eq!(fresh.balance.minor(), 3_500);
    assert_eq!(fresh.entries.len(), 3);
    assert!(l
        .order_fresh("nosuch")
        .await
        .unwrap_err()
        .is_invalid_input());

    let db = l.client().database().to_owned();
    support::plant_sibling(&db, "payment:of1:p2", &"f".repeat(32), |doc| {
        doc["value"] = json!(3_000);
    })
    .await;
    let e = l.order_fresh("of1").await.unwrap_err();
    assert!(e.to_string().contains("payment:of1:p2"), "{e}");
    assert!(e.to_string().contains("conflict"), "{e}");
}
