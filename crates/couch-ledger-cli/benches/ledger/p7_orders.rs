//! p7 and balance_10k…1m: the latency of an order's balance, ours against a raw view query,
//! on a database of orders.

use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Result};
use couch_ledger::Ledger;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::bench::{Bench, RawHttp};
use crate::output::thousands;
use crate::rounds::median;
use crate::row::{Goal, Row};
use crate::sizes::{
    BALANCE_QUERIES_PER_ROUND, DOCS_PER_ORDER, LATENCY_ROUNDS, LOAD_BATCH_DOCS, PAYMENTS_PER_ORDER,
};

pub fn order_id(order: usize) -> String {
    format!("o{order:07}")
}

pub const DELIVERY_PRICE: i64 = 495;

/// An order's one basket line: unit price and quantity, in minor units.
pub fn basket_line(order: usize) -> (i64, i64) {
    (1_000 + (order % 97) as i64 * 13, 1 + (order % 3) as i64)
}

/// An order's purchase total, in minor units: pretax + 10 % tax + delivery.
pub fn purchase_total(order: usize) -> i64 {
    let (price, quantity) = basket_line(order);
    let pretax = price * quantity;
    pretax + pretax / 10 + DELIVERY_PRICE
}

pub fn payment_value(order: usize) -> i64 {
    purchase_total(order) / 5
}

/// What the ledger view must answer for an order: its total less its payments.
pub fn expected_balance(order: usize) -> i64 {
    purchase_total(order) - PAYMENTS_PER_ORDER as i64 * payment_value(order)
}

/// An order's documents in the shapes `validate_doc_update` accepts: the purchase (Cloudant's
/// shape, minor units) and its payments.
pub fn order_docs(order: usize) -> Vec<Value> {
    let oid = order_id(order);
    let account = format!("c{:05}", order % 1_000);
    let (price, quantity) = basket_line(order);
    let pretax = price * quantity;
    let mut docs = vec![json!({
        "_id": format!("purchase:{oid}"),
        "type": "purchase",
        "order_id": oid,
        "account_id": account,
        "currency": "USD",
        "basket": [{
            "product_id": format!("p{:04}", order % 97),
            "title": "Bench widget",
            "category": "widgets",
            "price": price,
            "tax": price / 10,
            "quantity": quantity,
        }],
        "delivery": {"option": "standard", "price": DELIVERY_PRICE, "address": "1 Bench Road"},
        "pretax": pretax,
        "tax": pretax / 10,
        "total": purchase_total(order),
    })];
    for k in 0..PAYMENTS_PER_ORDER {
        docs.push(json!({
            "_id": format!("payment:{oid}:r{k}"),
            "type": "payment",
            "order_id": oid,
            "payment_reference": format!("r{k}"),
            "account_id": account,
            "currency": "USD",
            "value": payment_value(order),
            "method": "card",
        }));
    }
    docs
}

/// A fresh ledger database (design documents installed) holding `orders` orders, loaded with
/// `_bulk_docs`.
pub async fn load_orders(bench: &Bench, orders: usize) -> Result<Ledger> {
    let ledger = Ledger::new(bench.fresh_database(&format!("orders{orders}")).await?);
    ledger.init().await?;
    let orders_per_batch = LOAD_BATCH_DOCS / DOCS_PER_ORDER;
    for first in (0..orders).step_by(orders_per_batch) {
        let docs: Vec<Value> = (first..(first + orders_per_batch).min(orders))
            .flat_map(order_docs)
            .collect();
        let results = ledger.client().bulk_docs(&docs).await?;
        if let Some(bad) = results.iter().find(|r| !r.is_ok()) {
            bail!("loading orders: {bad:?}");
        }
    }
    Ok(ledger)
}

/// Balance-query latency (ms) on a database of `orders` orders: ours against a raw GET of
/// `_design/orders/_view/ledger?group=true&key="…"`. Both ask for the same random orders,
/// alternating query by query (who goes first alternating too); a round's figure per side is
/// its median latency.
pub async fn order_balance(
    bench: &Bench,
    orders: usize,
    key: &str,
    goal: Option<Goal>,
) -> Result<Vec<Row>> {
    let load_started = Instant::now();
    let ledger = load_orders(bench, orders).await?;
    let load = load_started.elapsed();
    let client = ledger.client();
    let view = format!(
        "{}_design/orders/_view/ledger",
        bench.raw_prefix(client.database())
    );
    // The first query builds the index; every timed query finds it up to date.
    let index_started = Instant::now();
    ensure!(ours_balance(&ledger, 0).await? == expected_balance(0));
    let index_build = index_started.elapsed();
    ensure!(raw_balance(&bench.raw, &view, 0).await? == expected_balance(0));

    let queries = bench.settings.scaled(BALANCE_QUERIES_PER_ROUND);
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for round in 0..LATENCY_ROUNDS {
        let mut rng = fastrand::Rng::with_seed(round as u64);
        let (mut ours_ms, mut raw_ms) = (Vec::with_capacity(queries), Vec::with_capacity(queries));
        for q in 0..queries {
            let order = rng.usize(..orders);
            let first_ours = q % 2 == 0;
            for ours_turn in [first_ours, !first_ours] {
                let started = Instant::now();
                let (balance, latencies) = if ours_turn {
                    (ours_balance(&ledger, order).await?, &mut ours_ms)
                } else {
                    (raw_balance(&bench.raw, &view, order).await?, &mut raw_ms)
                };
                latencies.push(started.elapsed().as_secs_f64() * 1e3);
                ensure!(
                    balance == expected_balance(order),
                    "order {order}: balance {balance} (ours: {ours_turn})"
                );
            }
        }
        ours.push(median(&ours_ms));
        raw.push(median(&raw_ms));
    }
    client.delete_database().await?;
    let row = Row::new(
        key,
        format!(
            "order balance latency, {} docs",
            thousands(orders * DOCS_PER_ORDER)
        ),
        "ms",
        &ours,
        &raw,
    )
    .goal(goal)
    .note(format!(
        "ours = Ledger::order_balance; loaded in {:.1} s, index built in {:.1} s",
        load.as_secs_f64(),
        index_build.as_secs_f64()
    ));
    Ok(vec![row])
}

/// Our way to an order's balance: `Ledger::order_balance`, one `group=true&key=` view query
/// whose reduced value is checked to be an exact amount for that key.
pub async fn ours_balance(ledger: &Ledger, order: usize) -> Result<i64> {
    Ok(ledger.order_balance(&order_id(order)).await?.minor())
}

/// The raw way: one GET and a typed parse of the one number.
pub async fn raw_balance(http: &RawHttp, view: &str, order: usize) -> Result<i64> {
    #[derive(Deserialize)]
    struct Reply {
        rows: Vec<ReplyRow>,
    }
    #[derive(Deserialize)]
    struct ReplyRow {
        value: i64,
    }
    // Order ids are alphanumeric: the JSON key only needs its quotes encoded.
    let url = format!("{view}?group=true&key=%22{}%22", order_id(order));
    let response = http.request(Method::GET, url).send().await?;
    ensure!(
        response.status().is_success(),
        "view: {}",
        response.status()
    );
    let reply: Reply = serde_json::from_slice(&response.bytes().await?)?;
    reply
        .rows
        .first()
        .map(|row| row.value)
        .ok_or_else(|| anyhow!("no balance row for order {order}"))
}
