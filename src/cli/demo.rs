//! `couch-ledger demo`: the seed scenarios end to end, narrated, on a fresh database.
//!
//! One function per scenario, each taking the ledger and the [`Story`] it tells into. To add
//! one (the transfers of the MongoDB/Couchbase seeds), write `async fn transfers(ledger,
//! story)` like [`cloudant_order`] and call it in [`run`] after the others.

use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context as _};
use clap::Args;
use couch_ledger::design::InstallStatus;
use couch_ledger::devserver::{self, DevServer};
use couch_ledger::{
    Adjustment, Currency, Ledger, Payment, Purchase, RecordStatus, Refund, Shipment,
};
use serde_json::{json, Value};

use super::args::redact_url;
use super::output::{install_status, money};
use super::{Context, Exit, Out, UsageError};

/// The Cloudant example order (examples/cloudant-purchase.json), embedded so the demo runs
/// from any directory.
const CLOUDANT_PURCHASE: &str = include_str!("../../examples/cloudant-purchase.json");

#[derive(Args)]
pub(crate) struct DemoArgs {}

/// What the demo says and records: narration on stdout as it goes, and with `--json` one
/// object at the end with every step's outcome.
pub(crate) struct Story<'a> {
    out: &'a mut Out,
    scenarios: Vec<Value>,
}

impl Story<'_> {
    /// Starts a scenario.
    fn scenario(&mut self, name: &str, about: &str) -> std::io::Result<()> {
        self.scenarios
            .push(json!({"name": name, "about": about, "steps": []}));
        self.out.say("")?;
        self.out.say(&format!("== {about}"))
    }

    /// One step: what it shows, in words, and its outcome for `--json`.
    fn step(&mut self, name: &str, says: &str, outcome: Value) -> std::io::Result<()> {
        let scenario = self
            .scenarios
            .last_mut()
            .expect("a step belongs to a scenario");
        scenario["steps"]
            .as_array_mut()
            .expect("steps is an array")
            .push(json!({"step": name, "says": says, "outcome": outcome}));
        self.out.say(&format!("- {says}"))
    }
}

pub(crate) async fn run(_args: DemoArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let settings = &ctx.settings;
    // A server the user named is used as is; otherwise the default URL when something answers
    // there; otherwise our own local pouchdb-server, stopped (dropped) at the end.
    let (url, local): (String, Option<DevServer>) =
        if settings.url_explicit || devserver::url_answers(&settings.url) {
            (settings.url.clone(), None)
        } else {
            let _ = writeln!(
                std::io::stderr(),
                "no CouchDB at {}; starting a local pouchdb-server for the demo",
                settings.shown_url()
            );
            let dev = tokio::task::spawn_blocking(DevServer::start)
                .await
                .context("the local server's start-up task failed")?
                // Not the user's input at fault: an operational error (exit 1).
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("could not start a local pouchdb-server")?;
            (dev.url(), Some(dev))
        };
    let db = if settings.db_on_command_line {
        settings.db.clone()
    } else {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!("demo_{secs}_{:06x}", fastrand::u32(..0x100_0000))
    };
    // The local server has no users: our credentials are for the user's server only.
    let client = settings
        .client(&url, &db, local.is_none())
        .context("invalid server settings")?;
    let ledger = Ledger::new(client);
    let mut story = Story {
        out: &mut ctx.out,
        scenarios: Vec::new(),
    };
    story.out.say(&format!(
        "couch-ledger demo on {} (database {db})",
        if local.is_some() {
            format!("a local pouchdb-server at {url}")
        } else {
            redact_url(&url)
        }
    ))?;

    setup(&ledger, &mut story, settings.db_on_command_line).await?;
    cloudant_order(&ledger, &mut story).await?;
    // Further scenarios (transfers, sweeper) go here, one function each.

    let scenarios = std::mem::take(&mut story.scenarios);
    story.out.say("")?;
    story.out.say(&if local.is_some() {
        "done: every step behaved as described. The local pouchdb-server stops now, and its \
         data goes with it."
            .to_owned()
    } else {
        format!(
            "done: every step behaved as described. The database {db} stays on the server for \
             you to look at."
        )
    })?;
    let value = json!({
        "ok": true,
        "server": if local.is_some() { "local pouchdb-server".to_owned() } else { redact_url(&url) },
        "database": db,
        "scenarios": scenarios,
    });
    if ctx.out.is_json() {
        ctx.out.print(&value, "")?;
    }
    drop(local);
    Ok(Exit::Success)
}

/// `init`, twice: the second writes nothing.
async fn setup(ledger: &Ledger, story: &mut Story<'_>, db_given: bool) -> anyhow::Result<()> {
    story.scenario("setup", "Setting up: the database and its design documents")?;
    let first = ledger.init().await.context("init failed")?;
    if !first.created && db_given {
        return Err(UsageError::new(format!(
            "the demo needs a fresh database, and {} exists: leave out --db",
            first.database
        ))
        .into());
    }
    let names: Vec<&str> = first.design_docs.iter().map(|d| d.id.as_str()).collect();
    story.step(
        "init",
        &format!(
            "init created the database {} and installed {} design documents ({}): the views \
             and a validate_doc_update that makes ledger documents write-once on the server.",
            first.database,
            names.len(),
            names.join(", ")
        ),
        json!({"created": first.created, "design_docs": first.design_docs.iter()
            .map(|d| json!({"id": d.id, "status": install_status(d.status)})).collect::<Vec<_>>()}),
    )?;
    let second = ledger.init().await.context("init (again) failed")?;
    ensure!(
        second
            .design_docs
            .iter()
            .all(|d| d.status == InstallStatus::Unchanged),
        "a second init should change nothing"
    );
    story.step(
        "init_again",
        "init again: every design document is unchanged (same checksum), so nothing is written \
         and no view is rebuilt.",
        json!({"created": second.created, "design_docs": second.design_docs.iter()
            .map(|d| json!({"id": d.id, "status": install_status(d.status)})).collect::<Vec<_>>()}),
    )?;
    Ok(())
}

/// Cloudant's "grouping related documents": a purchase and two payments, each its own
/// immutable document; the order's balance is a `_sum` view.
async fn cloudant_order(ledger: &Ledger, story: &mut Story<'_>) -> anyhow::Result<()> {
    story.scenario(
        "cloudant_order",
        "Cloudant's e-commerce ledger: an order is a purchase plus payments, each its own \
         immutable document; its balance is the sum a view keeps",
    )?;
    let gbp = Currency::from_code("GBP").expect("GBP is known");
    let purchase = Purchase::from_json(CLOUDANT_PURCHASE, Some(gbp))
        .context("the embedded example purchase")?;
    let order = purchase.order_id.clone();
    let m = |a| money(gbp, a);

    let r = ledger
        .record_purchase(&purchase)
        .await
        .context("purchase")?;
    ensure!(
        r.status == RecordStatus::Created,
        "the purchase should be new"
    );
    story.step(
        "purchase",
        &format!(
            "Recorded the purchase {} for account {}: {} items, {} delivery; total {} = pretax \
             {} + tax {} + delivery {} (decimals from the JSON, parsed exactly).",
            r.id,
            purchase.account_id,
            purchase.basket.len(),
            purchase.delivery.option.as_deref().unwrap_or("standard"),
            m(purchase.total),
            gbp.format(purchase.pretax),
            gbp.format(purchase.tax),
            gbp.format(purchase.delivery.price),
        ),
        json!({"id": r.id, "status": r.status.as_str(), "total": purchase.total}),
    )?;

    let balance = ledger.order_balance(&order).await.context("balance")?;
    ensure!(balance == purchase.total, "the balance should be the total");
    story.step(
        "balance_owed",
        &format!(
            "The order's balance, one view request: {} — the customer owes it.",
            m(balance)
        ),
        json!({"balance": balance}),
    )?;

    let card = Payment {
        order_id: order.clone(),
        reference: "AB9977G244FF2F667".into(),
        amount: gbp.parse("6.46")?,
        currency: gbp,
        method: Some("credit card".into()),
    };
    let r = ledger.record_payment(&card).await.context("card payment")?;
    let balance = ledger.order_balance(&order).await.context("balance")?;
    story.step(
        "pay_card",
        &format!(
            "A payment of {} by credit card ({}): the balance is now {}.",
            m(card.amount),
            r.id,
            m(balance)
        ),
        json!({"id": r.id, "status": r.status.as_str(), "balance": balance}),
    )?;

    let voucher = Payment {
        order_id: order.clone(),
        reference: "Q88775662377224".into(),
        amount: gbp.parse("20.00")?,
        currency: gbp,
        method: Some("voucher".into()),
    };
    let r = ledger
        .record_payment(&voucher)
        .await
        .context("voucher payment")?;
    let summary = ledger.order(&order).await.context("order")?;
    ensure!(summary.balance.minor() == 0, "the order should be settled");
    ensure!(summary.entries.len() == 3, "three entries expected");
    let entries: Vec<String> = summary
        .entries
        .iter()
        .map(|e| format!("{} {}", e.kind.as_str(), gbp.format(e.amount)))
        .collect();
    story.step(
        "pay_voucher",
        &format!(
            "A payment of {} by voucher ({}): the balance is {} — settled. The order's three \
             entries: {}; paid {}.",
            m(voucher.amount),
            r.id,
            m(summary.balance),
            entries.join(", "),
            m(summary.paid)
        ),
        json!({"id": r.id, "status": r.status.as_str(), "balance": summary.balance,
               "paid": summary.paid, "entries": summary.entries.len()}),
    )?;

    let seq_before = ledger.client().database_info().await?["update_seq"].clone();
    let r = ledger
        .record_payment(&card)
        .await
        .context("re-sent payment")?;
    let seq_after = ledger.client().database_info().await?["update_seq"].clone();
    let balance = ledger.order_balance(&order).await.context("balance")?;
    ensure!(
        r.status == RecordStatus::Exists,
        "a re-sent payment should exist"
    );
    ensure!(
        seq_before == seq_after,
        "a re-sent payment should write nothing"
    );
    story.step(
        "pay_again",
        &format!(
            "The card payment is sent again (a retry, a duplicate message): it already exists \
             with the same content, so it reports \"exists\", nothing is written, and the \
             balance stays {}.",
            m(balance)
        ),
        json!({"id": r.id, "status": r.status.as_str(), "balance": balance}),
    )?;

    let other = Payment {
        amount: gbp.parse("7.00")?,
        ..card.clone()
    };
    let e = ledger
        .record_payment(&other)
        .await
        .err()
        .context("the same reference with another amount should be refused")?;
    ensure!(e.is_mismatch(), "expected a mismatch, got: {e}");
    story.step(
        "pay_conflict",
        &format!(
            "The same reference with another amount ({}) is refused: {e}.",
            m(other.amount)
        ),
        json!({"refused": true, "field": e.field(), "error": e.to_string()}),
    )?;

    let ret = Adjustment {
        order_id: order.clone(),
        reference: "RET-B32-1".into(),
        amount: gbp.parse("-3.49")?,
        currency: gbp,
        reason: Some("one paperback returned".into()),
    };
    let r = ledger.record_adjustment(&ret).await.context("adjustment")?;
    let balance = ledger.order_balance(&order).await.context("balance")?;
    ensure!(balance.minor() == -349, "the return should leave -3.49");
    story.step(
        "adjust",
        &format!(
            "The customer sends one paperback back: an adjustment of {} takes it off the order \
             ({}). The balance is {} — below zero, the merchant owes the customer.",
            m(ret.amount),
            r.id,
            m(balance)
        ),
        json!({"id": r.id, "status": r.status.as_str(), "balance": balance}),
    )?;

    let page = ledger
        .outstanding_orders(10, None)
        .await
        .context("outstanding orders")?;
    ensure!(
        page.orders.iter().any(|o| o.order_id == order),
        "the order should be outstanding"
    );
    story.step(
        "outstanding",
        &format!(
            "Outstanding orders (balance not zero, either way): {}.",
            page.orders
                .iter()
                .map(|o| format!("{} {}", o.order_id, m(o.balance)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        json!({"orders": page.orders.iter()
            .map(|o| json!({"order_id": o.order_id, "balance": o.balance})).collect::<Vec<_>>()}),
    )?;

    let refund = Refund {
        order_id: order.clone(),
        reference: "RET-B32-1".into(),
        amount: gbp.parse("3.49")?,
        currency: gbp,
        reason: Some("one paperback returned".into()),
    };
    let r = ledger.record_refund(&refund).await.context("refund")?;
    let balance = ledger.order_balance(&order).await.context("balance")?;
    ensure!(balance.minor() == 0, "the refund should settle the order");
    story.step(
        "refund",
        &format!(
            "The merchant refunds {} to the card ({}): the balance is {} — settled again.",
            m(refund.amount),
            r.id,
            m(balance)
        ),
        json!({"id": r.id, "status": r.status.as_str(), "balance": balance}),
    )?;

    let r = ledger
        .record_shipment(&Shipment {
            order_id: order.clone(),
            reference: "RM-1234567".into(),
            carrier: Some("Royal Mail".into()),
        })
        .await
        .context("shipment")?;
    let after = ledger.order_balance(&order).await.context("balance")?;
    ensure!(after == balance, "a shipment moves no money");
    story.step(
        "ship",
        &format!(
            "The shipment {} is a status document: recorded, and the balance does not move ({}).",
            r.id,
            m(after)
        ),
        json!({"id": r.id, "status": r.status.as_str(), "balance": after}),
    )?;

    Ok(())
}
