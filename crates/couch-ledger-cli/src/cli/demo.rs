//! `couch-ledger demo`: the seed scenarios end to end, narrated, on a fresh database.
//!
//! One function per scenario, each taking the ledger and the [`Story`] it tells into and
//! checking (`ensure!`) that every step did what it says: [`cloudant_order`] (seed 004),
//! [`mongodb_two_phase`] (seeds 002, 003) and [`couchbase_multiphase`] (seed 000), called in
//! that order by [`run`]. Each scenario reads as the list of its scenes, one function a scene,
//! defined below it in the order they run.
//!
//! Longer than most files, and one on purpose: it is one narrated run, read top to bottom in
//! the order it happens, whose scenes share the narration helpers in the middle; split, one run
//! would be followed across files.

use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context as _};
use clap::Args;
use couch_ledger::design::InstallStatus;
use couch_ledger::{
    AccountSpec, AccountView, Adjustment, Amount, Currency, Ledger, Payment, Purchase,
    RecordStatus, Refund, Shipment, State, SweepOptions, TransferRequest, TransitionError,
    VerifyOptions, VerifyReport, ViewQuery,
};
use couch_ledger_devserver::{self as devserver, DevServer};
use serde_json::{json, Value};

use super::output::{install_status, money};
use super::{Context, Exit, Out, UsageError};
use couch_ledger::redact_url;

/// The Cloudant example order (examples/cloudant-purchase.json), embedded so the demo runs
/// from any directory.
const CLOUDANT_PURCHASE: &str = include_str!("../../../../examples/cloudant-purchase.json");

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
    let (url, local) = pick_server(ctx).await?;
    let settings = &ctx.settings;
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
    mongodb_two_phase(&ledger, &mut story).await?;
    couchbase_multiphase(&ledger, &mut story).await?;

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

/// The server the demo runs on: the one the user named, as is; else the default URL when a
/// server answers there and will take the demo's writes (a login is set, or anonymous clients
/// are admins there); else a local pouchdb-server of our own, stopped (dropped) at the end.
async fn pick_server(ctx: &Context) -> anyhow::Result<(String, Option<DevServer>)> {
    let settings = &ctx.settings;
    if settings.url_explicit {
        return Ok((settings.url.clone(), None));
    }
    let shown = settings.shown_url();
    let why = if !devserver::url_answers(&settings.url) {
        format!("no CouchDB at {shown}")
    } else if settings.has_login() || devserver::anonymous_is_admin(&settings.url) {
        return Ok((settings.url.clone(), None));
    } else {
        format!(
            "the server at {shown} lets only its admins create databases, and no login is set \
             (COUCHDB_USER and COUCHDB_PASSWORD, or --url) to run the demo there"
        )
    };
    let _ = writeln!(
        std::io::stderr(),
        "{why}; starting a local pouchdb-server for the demo"
    );
    let dev = tokio::task::spawn_blocking(DevServer::start)
        .await
        .context("the local server's start-up task failed")?
        // Not the user's input at fault: an operational error (exit 1).
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("could not start a local pouchdb-server")?;
    Ok((dev.url(), Some(dev)))
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

    record_the_purchase(ledger, story, &purchase, gbp).await?;
    let card = pay_by_card_and_voucher(ledger, story, &order, gbp).await?;
    pay_again(ledger, story, &card, gbp).await?;
    return_one_item(ledger, story, &order, gbp).await?;
    let balance = refund_the_return(ledger, story, &order, gbp).await?;
    ship(ledger, story, &order, gbp, balance).await
}

/// The order's purchase, then its balance: the total, owed.
async fn record_the_purchase(
    ledger: &Ledger,
    story: &mut Story<'_>,
    purchase: &Purchase,
    gbp: Currency,
) -> anyhow::Result<()> {
    let m = |a| money(gbp, a);
    let r = ledger.record_purchase(purchase).await.context("purchase")?;
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

    let balance = ledger
        .order_balance(&purchase.order_id)
        .await
        .context("balance")?;
    ensure!(balance == purchase.total, "the balance should be the total");
    story.step(
        "balance_owed",
        &format!(
            "The order's balance, one view request: {} — the customer owes it.",
            m(balance)
        ),
        json!({"balance": balance}),
    )?;
    Ok(())
}

/// Two payments, by card and by voucher, settle the order; the card payment, for the next
/// scene to send again.
async fn pay_by_card_and_voucher(
    ledger: &Ledger,
    story: &mut Story<'_>,
    order: &str,
    gbp: Currency,
) -> anyhow::Result<Payment> {
    let m = |a| money(gbp, a);
    let card = Payment {
        order_id: order.to_owned(),
        reference: "AB9977G244FF2F667".into(),
        amount: gbp.parse("6.46")?,
        currency: gbp,
        method: Some("credit card".into()),
        meta: Default::default(),
    };
    let r = ledger.record_payment(&card).await.context("card payment")?;
    let balance = ledger.order_balance(order).await.context("balance")?;
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
        order_id: order.to_owned(),
        reference: "Q88775662377224".into(),
        amount: gbp.parse("20.00")?,
        currency: gbp,
        method: Some("voucher".into()),
        meta: Default::default(),
    };
    let r = ledger
        .record_payment(&voucher)
        .await
        .context("voucher payment")?;
    let summary = ledger.order(order).await.context("order")?;
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
    Ok(card)
}

/// The card payment sent again: as it was, it exists and writes nothing; with another amount,
/// it is refused.
async fn pay_again(
    ledger: &Ledger,
    story: &mut Story<'_>,
    card: &Payment,
    gbp: Currency,
) -> anyhow::Result<()> {
    let m = |a| money(gbp, a);
    // Counts, not the update sequence: sequences are opaque strings on CouchDB.
    let counts = |info: Value| (info["doc_count"].clone(), info["doc_del_count"].clone());
    let before = counts(ledger.client().database_info().await?);
    let r = ledger
        .record_payment(card)
        .await
        .context("re-sent payment")?;
    let after = counts(ledger.client().database_info().await?);
    let balance = ledger
        .order_balance(&card.order_id)
        .await
        .context("balance")?;
    ensure!(
        r.status == RecordStatus::Exists,
        "a re-sent payment should exist"
    );
    ensure!(before == after, "a re-sent payment should write nothing");
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
    Ok(())
}

/// A paperback sent back: an adjustment takes it off the order, which the merchant now owes,
/// so it is outstanding.
async fn return_one_item(
    ledger: &Ledger,
    story: &mut Story<'_>,
    order: &str,
    gbp: Currency,
) -> anyhow::Result<()> {
    let m = |a| money(gbp, a);
    let ret = Adjustment {
        order_id: order.to_owned(),
        reference: "RET-B32-1".into(),
        amount: gbp.parse("-3.49")?,
        currency: gbp,
        reason: Some("one paperback returned".into()),
        meta: Default::default(),
    };
    let r = ledger.record_adjustment(&ret).await.context("adjustment")?;
    let balance = ledger.order_balance(order).await.context("balance")?;
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
    Ok(())
}

/// The refund of the return settles the order again: its balance, zero.
async fn refund_the_return(
    ledger: &Ledger,
    story: &mut Story<'_>,
    order: &str,
    gbp: Currency,
) -> anyhow::Result<Amount> {
    let m = |a| money(gbp, a);
    let refund = Refund {
        order_id: order.to_owned(),
        reference: "RET-B32-1".into(),
        amount: gbp.parse("3.49")?,
        currency: gbp,
        reason: Some("one paperback returned".into()),
        meta: Default::default(),
    };
    let r = ledger.record_refund(&refund).await.context("refund")?;
    let balance = ledger.order_balance(order).await.context("balance")?;
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
    Ok(balance)
}

/// The shipment, a status document: the order's `balance` does not move.
async fn ship(
    ledger: &Ledger,
    story: &mut Story<'_>,
    order: &str,
    gbp: Currency,
    balance: Amount,
) -> anyhow::Result<()> {
    let r = ledger
        .record_shipment(&Shipment {
            order_id: order.to_owned(),
            reference: "RM-1234567".into(),
            carrier: Some("Royal Mail".into()),
        })
        .await
        .context("shipment")?;
    let after = ledger.order_balance(order).await.context("balance")?;
    ensure!(after == balance, "a shipment moves no money");
    story.step(
        "ship",
        &format!(
            "The shipment {} is a status document: recorded, and the balance does not move ({}).",
            r.id,
            money(gbp, after)
        ),
        json!({"id": r.id, "status": r.status.as_str(), "balance": after}),
    )?;
    Ok(())
}

// ---- transfers: the MongoDB and Couchbase seeds -----------------------------------------------

/// How long the claims of the demo's "crashing" writer last: short, so the demo waits only
/// briefly before the sweeper may take its transfer over, long enough for two steps.
const CRASH_LEASE_MS: u64 = 2_000;

/// Steps one transfer may take in the demo before it must have finished (begin, apply, commit,
/// settle, done — or cancel, undo, cancelled — with room to spare).
const DEMO_STEPS_MAX: usize = 16;

/// `[source, destination] → sum` rows of a `transactions` view (`pending`, `committed`), as
/// minor units.
async fn view_sums(ledger: &Ledger, view: &str) -> anyhow::Result<Vec<(String, String, i64)>> {
    let q = ViewQuery {
        group: Some(true),
        ..ViewQuery::default()
    };
    let rows = ledger
        .client()
        .view("transactions", view, &q)
        .await
        .with_context(|| format!("the transactions/{view} view"))?
        .rows;
    rows.into_iter()
        .map(|r| {
            let part = |i: usize| r.key.get(i).and_then(Value::as_str).map(str::to_owned);
            match (part(0), part(1), r.value.as_i64()) {
                (Some(s), Some(d), Some(v)) => Ok((s, d, v)),
                _ => Err(anyhow::anyhow!(
                    "transactions/{view}: unexpected row {} → {}",
                    r.key,
                    r.value
                )),
            }
        })
        .collect()
}

/// `[A, B] → 100.00 EUR, …` or `empty`.
fn sums_words(rows: &[(String, String, i64)], currency: Currency) -> String {
    if rows.is_empty() {
        return "empty".to_owned();
    }
    rows.iter()
        .map(|(s, d, v)| match Amount::new(*v) {
            Ok(a) => format!("[{s}, {d}] → {}", money(currency, a)),
            Err(_) => format!("[{s}, {d}] → {v} minor units"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn sums_json(rows: &[(String, String, i64)]) -> Value {
    Value::Array(
        rows.iter()
            .map(|(s, d, v)| json!({"key": [s, d], "value": v}))
            .collect(),
    )
}

/// Two accounts' views, read now.
async fn pair(ledger: &Ledger, a: &str, b: &str) -> anyhow::Result<(AccountView, AccountView)> {
    let first = ledger
        .account(a)
        .await
        .with_context(|| format!("account {a}"))?;
    let second = ledger
        .account(b)
        .await
        .with_context(|| format!("account {b}"))?;
    Ok((first, second))
}

fn account_json(v: &AccountView) -> Value {
    json!({"account": v.account, "balance": v.balance, "available": v.available,
           "posted": v.posted, "pending": v.pending.iter()
               .map(|p| json!({"txn": p.txn, "delta": p.delta})).collect::<Vec<_>>()})
}

/// `A 900.00 EUR (pending: t1 −100.00 EUR)`.
fn account_words(v: &AccountView, currency: Currency) -> String {
    let mut s = format!("{} {}", v.account, money(currency, v.balance));
    if !v.pending.is_empty() {
        let pending: Vec<String> = v
            .pending
            .iter()
            .map(|p| format!("{} {}", p.txn, money(currency, p.delta)))
            .collect();
        s.push_str(&format!(" (pending: {})", pending.join(", ")));
    }
    s
}

async fn open_account(
    ledger: &Ledger,
    id: &str,
    currency: Currency,
    opening: &str,
) -> anyhow::Result<()> {
    let r = ledger
        .create_account(AccountSpec {
            account_id: id.to_owned(),
            currency,
            opening: currency.parse(opening)?,
            min_balance: Some(Amount::ZERO),
            meta: Default::default(),
        })
        .await
        .with_context(|| format!("create account {id}"))?;
    ensure!(
        r.status == RecordStatus::Created,
        "account {id} should be new"
    );
    Ok(())
}

/// Wall-clock milliseconds since the epoch (what a transfer's claim expiry is written in).
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Steps a transfer until it is `done` or `cancelled`.
async fn step_to_end(ledger: &Ledger, id: &str) -> anyhow::Result<State> {
    for _ in 0..DEMO_STEPS_MAX {
        let t = ledger
            .step(id)
            .await
            .with_context(|| format!("step {id}"))?;
        if t.state.is_terminal() {
            return Ok(t.state);
        }
    }
    anyhow::bail!("transfer {id} did not finish within {DEMO_STEPS_MAX} steps")
}

fn request(id: &str, from: &str, to: &str, amount: Amount, currency: Currency) -> TransferRequest {
    TransferRequest {
        id: Some(id.to_owned()),
        source: from.to_owned(),
        destination: to.to_owned(),
        amount,
        currency,
        meta: Default::default(),
    }
}

/// MongoDB's "Perform Two Phase Commits" (seeds 002, 003): A = B = 1000, transfer 100, every
/// state in turn; then what goes wrong in real life: a crash half-way, a cancel, a reversal,
/// insufficient funds.
async fn mongodb_two_phase(ledger: &Ledger, story: &mut Story<'_>) -> anyhow::Result<()> {
    story.scenario(
        "mongodb_two_phase",
        "MongoDB's two-phase commit: 100.00 from A to B through every state, then a crash \
         half-way finished by the sweeper, a cancel, a reversal and insufficient funds",
    )?;
    let eur = Currency::from_code("EUR").expect("EUR is known");
    open_a_and_b(ledger, story, eur).await?;
    let hundred = eur.parse("100.00")?;
    t1_initial(ledger, story, eur, hundred).await?;
    t1_pending(ledger, story, eur, hundred).await?;
    t1_applied(ledger, story, eur).await?;
    t1_committed(ledger, story, eur, hundred).await?;
    t1_settled(ledger, story, eur).await?;
    t1_done(ledger, story, eur).await?;
    let expires_at = t2_crash(ledger, story, eur).await?;
    t2_swept(ledger, story, eur, expires_at).await?;
    t3_cancelled(ledger, story, eur).await?;
    t1_cancel_refused(ledger, story).await?;
    let (a, b) = t1_reversed(ledger, story, eur, hundred).await?;
    t4_insufficient_funds(ledger, story, eur, &a, &b).await?;

    let report = verify_at_rest(ledger).await?;
    story.step(
        "verify",
        &format!(
            "verify (at rest): every invariant holds — {}.",
            report
                .checks
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        json!({"ok": report.ok, "checks": report.checks.len()}),
    )?;
    Ok(())
}

/// Accounts A and B, 1000.00 each.
async fn open_a_and_b(ledger: &Ledger, story: &mut Story<'_>, eur: Currency) -> anyhow::Result<()> {
    let m = |a| money(eur, a);
    open_account(ledger, "A", eur, "1000.00").await?;
    open_account(ledger, "B", eur, "1000.00").await?;
    let (a, b) = pair(ledger, "A", "B").await?;
    story.step(
        "accounts",
        &format!(
            "Accounts A and B open with {} and {} (minimum balance 0.00): the documents \
             account:A and account:B, each with an empty pending set.",
            m(a.balance),
            m(b.balance)
        ),
        json!({"accounts": [account_json(&a), account_json(&b)]}),
    )?;
    Ok(())
}

/// t1 written, `initial`: no account touched, nothing pending.
async fn t1_initial(
    ledger: &Ledger,
    story: &mut Story<'_>,
    eur: Currency,
    hundred: Amount,
) -> anyhow::Result<()> {
    let t = ledger
        .submit(request("t1", "A", "B", hundred, eur), false)
        .await
        .context("submit t1")?;
    ensure!(t.state == State::Initial, "t1 should be initial");
    let pending = view_sums(ledger, "pending").await?;
    ensure!(pending.is_empty(), "nothing is pending yet");
    story.step(
        "initial",
        &format!(
            "Transfer t1 ({} from A to B) is written as txn:t1 in state initial, with its \
             terms: no account is touched and the pending view is {}.",
            money(eur, hundred),
            sums_words(&pending, eur)
        ),
        json!({"id": t.id, "state": t.state.as_str(), "pending_view": sums_json(&pending)}),
    )?;
    Ok(())
}

/// begin: t1 `pending` and in the pending view; the balances not moved yet.
async fn t1_pending(
    ledger: &Ledger,
    story: &mut Story<'_>,
    eur: Currency,
    hundred: Amount,
) -> anyhow::Result<()> {
    let m = |a| money(eur, a);
    let v = ledger.step("t1").await.context("begin t1")?;
    ensure!(v.state == State::Pending, "t1 should be pending");
    let pending = view_sums(ledger, "pending").await?;
    ensure!(
        pending == [("A".to_owned(), "B".to_owned(), hundred.minor())],
        "the pending view should show t1"
    );
    let (a, b) = pair(ledger, "A", "B").await?;
    ensure!(a.balance.minor() == 100_000 && b.balance.minor() == 100_000);
    story.step(
        "pending",
        &format!(
            "begin: t1 is pending, claimed by this process for {} s. The pending view shows {} \
             in flight; the balances have not moved yet ({}, {}).",
            ledger.lease().as_secs(),
            sums_words(&pending, eur),
            m(a.balance),
            m(b.balance)
        ),
        json!({"state": v.state.as_str(), "pending_view": sums_json(&pending),
               "accounts": [account_json(&a), account_json(&b)]}),
    )?;
    Ok(())
}

/// apply: both balances moved, each account holding t1's marker; B's credit not spendable yet.
async fn t1_applied(ledger: &Ledger, story: &mut Story<'_>, eur: Currency) -> anyhow::Result<()> {
    let v = ledger.step("t1").await.context("apply t1")?;
    ensure!(v.state == State::Pending, "t1 is still pending after apply");
    let (a, b) = pair(ledger, "A", "B").await?;
    ensure!(a.balance.minor() == 90_000 && b.balance.minor() == 110_000);
    ensure!(
        b.available.minor() == 100_000,
        "a credit is not spendable yet"
    );
    story.step(
        "applied",
        &format!(
            "apply: each account is updated in one atomic write that also records t1 in its \
             pending set: {}; {}. B's available balance is still {}: a credit that could be \
             rolled back is not spendable yet.",
            account_words(&a, eur),
            account_words(&b, eur),
            money(eur, b.available)
        ),
        json!({"state": v.state.as_str(), "accounts": [account_json(&a), account_json(&b)]}),
    )?;
    Ok(())
}

/// commit: t1 moves from the pending view to the committed one.
async fn t1_committed(
    ledger: &Ledger,
    story: &mut Story<'_>,
    eur: Currency,
    hundred: Amount,
) -> anyhow::Result<()> {
    let v = ledger.step("t1").await.context("commit t1")?;
    ensure!(v.state == State::Committed, "t1 should be committed");
    let pending = view_sums(ledger, "pending").await?;
    let committed = view_sums(ledger, "committed").await?;
    ensure!(pending.is_empty(), "t1 left the pending view");
    ensure!(
        committed == [("A".to_owned(), "B".to_owned(), hundred.minor())],
        "the committed view should show t1"
    );
    story.step(
        "committed",
        &format!(
            "commit: t1 is committed. The pending view is {}; the committed view shows {} \
             (applied, not yet settled on the accounts).",
            sums_words(&pending, eur),
            sums_words(&committed, eur)
        ),
        json!({"state": v.state.as_str(), "pending_view": sums_json(&pending),
               "committed_view": sums_json(&committed)}),
    )?;
    Ok(())
}

/// settle: both accounts drop t1's marker; t1 still `committed`.
async fn t1_settled(ledger: &Ledger, story: &mut Story<'_>, eur: Currency) -> anyhow::Result<()> {
    let v = ledger.step("t1").await.context("settle t1")?;
    ensure!(
        v.state == State::Committed,
        "t1 is still committed after settle"
    );
    let (a, b) = pair(ledger, "A", "B").await?;
    ensure!(a.pending.is_empty() && b.pending.is_empty());
    story.step(
        "settled",
        &format!(
            "settle: both accounts drop t1 from their pending sets and remember it as settled \
             (so a repeated step is recognised and skipped): {}; {}, available {}.",
            account_words(&a, eur),
            account_words(&b, eur),
            money(eur, b.available)
        ),
        json!({"state": v.state.as_str(), "accounts": [account_json(&a), account_json(&b)]}),
    )?;
    Ok(())
}

/// t1 `done`, in neither view: the tutorial's result.
async fn t1_done(ledger: &Ledger, story: &mut Story<'_>, eur: Currency) -> anyhow::Result<()> {
    let m = |a| money(eur, a);
    let v = ledger.step("t1").await.context("finish t1")?;
    ensure!(v.state == State::Done, "t1 should be done");
    let pending = view_sums(ledger, "pending").await?;
    let committed = view_sums(ledger, "committed").await?;
    ensure!(pending.is_empty() && committed.is_empty());
    let (a, b) = pair(ledger, "A", "B").await?;
    story.step(
        "done",
        &format!(
            "done: t1 is done and in neither view (pending {}, committed {}). A has {}, B has \
             {}: the tutorial's result.",
            sums_words(&pending, eur),
            sums_words(&committed, eur),
            m(a.balance),
            m(b.balance)
        ),
        json!({"state": v.state.as_str(), "accounts": [account_json(&a), account_json(&b)]}),
    )?;
    Ok(())
}

/// Another writer begins and applies t2, then is gone (dropped) before committing; its claim's
/// expiry, for the sweep to wait out.
async fn t2_crash(ledger: &Ledger, story: &mut Story<'_>, eur: Currency) -> anyhow::Result<i64> {
    // A writer that dies half-way: its own worker id and a short lease.
    let crashing = Ledger::builder(ledger.client().clone())
        .lease(Duration::from_millis(CRASH_LEASE_MS))
        .build()
        .context("a short lease")?;
    let fifty = eur.parse("50.00")?;
    crashing
        .submit(request("t2", "A", "B", fifty, eur), false)
        .await
        .context("submit t2")?;
    crashing.step("t2").await.context("begin t2")?;
    let v = crashing.step("t2").await.context("apply t2")?;
    ensure!(v.state == State::Pending, "t2 should be pending");
    let expires_at = v.claim.as_ref().map_or(0, |c| c.expires_at);
    drop(crashing);
    let (a, b) = pair(ledger, "A", "B").await?;
    ensure!(a.pending.len() == 1 && b.pending.len() == 1);
    story.step(
        "crash",
        &format!(
            "Another writer starts t2 ({} from A to B), applies it to both accounts and then \
             crashes before committing: t2 stays pending and the accounts hold its markers: \
             {}; {}.",
            money(eur, fifty),
            account_words(&a, eur),
            account_words(&b, eur)
        ),
        json!({"id": "t2", "state": v.state.as_str(),
               "accounts": [account_json(&a), account_json(&b)]}),
    )?;
    Ok(expires_at)
}

/// Once the crashed writer's claim (expiring at `expires_at`) has expired, a sweep finishes
/// t2: moved exactly once.
async fn t2_swept(
    ledger: &Ledger,
    story: &mut Story<'_>,
    eur: Currency,
    expires_at: i64,
) -> anyhow::Result<()> {
    let m = |a| money(eur, a);
    // The sweeper leaves a transfer alone while its claim is live: wait for it to expire.
    let wait_ms = expires_at
        .saturating_sub(now_ms())
        .clamp(0, CRASH_LEASE_MS as i64)
        + 50;
    tokio::time::sleep(Duration::from_millis(wait_ms.unsigned_abs())).await;
    let swept = ledger
        .sweep_once(SweepOptions {
            limit: 100,
            stale_after: Duration::ZERO,
        })
        .await
        .context("sweep")?;
    let t2 = ledger.transfer("t2").await.context("read t2")?;
    ensure!(t2.state == State::Done, "the sweep should finish t2");
    ensure!(swept.advanced == 1, "the sweep should advance one transfer");
    let (a, b) = pair(ledger, "A", "B").await?;
    ensure!(a.balance.minor() == 85_000 && b.balance.minor() == 115_000);
    story.step(
        "sweep",
        &format!(
            "Once the crashed writer's claim has expired, a sweep (stale after 0s) finds t2 in \
             the by_state view, re-reads it and takes it over: the markers show the accounts \
             were already updated, so it does not apply them again; it commits, settles and \
             finishes t2 (advanced {}, remaining {}). A {}, B {}: moved exactly once.",
            swept.advanced,
            swept.remaining,
            m(a.balance),
            m(b.balance)
        ),
        json!({"sweep": {"examined": swept.examined, "advanced": swept.advanced,
                         "cancelled": swept.cancelled, "remaining": swept.remaining},
               "state": t2.state.as_str(), "accounts": [account_json(&a), account_json(&b)]}),
    )?;
    Ok(())
}

/// t3 begun and applied, then cancelled: its deltas undone on both accounts.
async fn t3_cancelled(ledger: &Ledger, story: &mut Story<'_>, eur: Currency) -> anyhow::Result<()> {
    let m = |a| money(eur, a);
    let twenty = eur.parse("20.00")?;
    ledger
        .submit(request("t3", "A", "B", twenty, eur), false)
        .await
        .context("submit t3")?;
    ledger.step("t3").await.context("begin t3")?;
    ledger.step("t3").await.context("apply t3")?;
    let (applied, _) = pair(ledger, "A", "B").await?;
    let c = ledger.cancel("t3").await.context("cancel t3")?;
    ensure!(c.state == State::Cancelled, "t3 should be cancelled");
    let (a, b) = pair(ledger, "A", "B").await?;
    ensure!(a.balance.minor() == 85_000 && b.balance.minor() == 115_000);
    story.step(
        "cancel",
        &format!(
            "t3 ({} from A to B) is begun and applied (A {}), then cancelled: canceling undoes \
             its delta on both accounts, then cancelled (reason {}). A {}, B {} again.",
            m(twenty),
            m(applied.balance),
            c.reason.as_deref().unwrap_or("none"),
            m(a.balance),
            m(b.balance)
        ),
        json!({"id": c.id, "state": c.state.as_str(), "reason": c.reason,
               "accounts": [account_json(&a), account_json(&b)]}),
    )?;
    Ok(())
}

/// Cancelling the done t1 is refused.
async fn t1_cancel_refused(ledger: &Ledger, story: &mut Story<'_>) -> anyhow::Result<()> {
    let e = ledger
        .cancel("t1")
        .await
        .err()
        .context("cancelling a done transfer should be refused")?;
    ensure!(
        e.transition() == Some(TransitionError::AlreadyDone),
        "expected AlreadyDone, got: {e}"
    );
    story.step(
        "cancel_done",
        &format!("Cancelling t1 is refused ({e}): a done transfer is never rolled back."),
        json!({"refused": true, "error": e.to_string()}),
    )?;
    Ok(())
}

/// t1 reversed by a new transfer from B to A, and reversing it again moves nothing; the
/// accounts after the reversal.
async fn t1_reversed(
    ledger: &Ledger,
    story: &mut Story<'_>,
    eur: Currency,
    hundred: Amount,
) -> anyhow::Result<(AccountView, AccountView)> {
    let m = |a| money(eur, a);
    let r = ledger.reverse("t1").await.context("reverse t1")?;
    ensure!(r.state == State::Done && r.status == RecordStatus::Created);
    let (a, b) = pair(ledger, "A", "B").await?;
    ensure!(a.balance.minor() == 95_000 && b.balance.minor() == 105_000);
    story.step(
        "reverse",
        &format!(
            "Instead t1 is reversed: a new transfer {} of {} from B to A, driven to {}. A {}, B \
             {}.",
            r.id,
            m(hundred),
            r.state,
            m(a.balance),
            m(b.balance)
        ),
        json!({"id": r.id, "state": r.state.as_str(), "status": r.status.as_str(),
               "accounts": [account_json(&a), account_json(&b)]}),
    )?;

    let again = ledger.reverse("t1").await.context("reverse t1 again")?;
    ensure!(again.status == RecordStatus::Exists && again.id == r.id);
    let (a2, b2) = pair(ledger, "A", "B").await?;
    ensure!(a2.balance == a.balance && b2.balance == b.balance);
    story.step(
        "reverse_again",
        &format!(
            "Reversing t1 again finds {} (its id is derived from t1): \"exists\", nothing moves \
             a second time. A {}, B {}.",
            again.id,
            m(a2.balance),
            m(b2.balance)
        ),
        json!({"id": again.id, "state": again.state.as_str(), "status": again.status.as_str()}),
    )?;
    Ok((a, b))
}

/// t4 asks for more than A (`a`, with `b` beside it) has: cancelled, nothing moves.
async fn t4_insufficient_funds(
    ledger: &Ledger,
    story: &mut Story<'_>,
    eur: Currency,
    a: &AccountView,
    b: &AccountView,
) -> anyhow::Result<()> {
    let m = |a| money(eur, a);
    let big = eur.parse("5000.00")?;
    let t4 = ledger
        .submit(request("t4", "A", "B", big, eur), true)
        .await
        .context("submit t4")?;
    ensure!(t4.state == State::Cancelled, "t4 should be cancelled");
    ensure!(t4.reason.as_deref() == Some("insufficient_funds"));
    let (a3, b3) = pair(ledger, "A", "B").await?;
    ensure!(a3.balance == a.balance && b3.balance == b.balance);
    story.step(
        "insufficient_funds",
        &format!(
            "t4 asks for {} from A, which has {} available: it ends cancelled with reason {} \
             and no balance moves (the command line exits 3).",
            m(big),
            m(a.available),
            t4.reason.as_deref().unwrap_or("none")
        ),
        json!({"id": t4.id, "state": t4.state.as_str(), "reason": t4.reason}),
    )?;
    Ok(())
}

/// `verify` at rest, which must pass.
async fn verify_at_rest(ledger: &Ledger) -> anyhow::Result<VerifyReport> {
    let report = ledger
        .verify_with(VerifyOptions::at_rest())
        .await
        .context("verify")?;
    ensure!(report.ok, "verify should pass: {report:?}");
    Ok(report)
}

/// Couchbase's "multi-phase transactions" (seed 000): Alice 200 and James 100, a transfer of
/// 100 tracked by the `pending` and `committed` views, with a second transfer in flight to show
/// what the views and `status` add up.
async fn couchbase_multiphase(ledger: &Ledger, story: &mut Story<'_>) -> anyhow::Result<()> {
    story.scenario(
        "couchbase_multiphase",
        "Couchbase's multi-phase transactions: Alice pays James 100.00 while James pays Alice \
         30.00; the pending and committed views and `status` show the money in flight",
    )?;
    let usd = Currency::from_code("USD").expect("USD is known");
    let hundred = usd.parse("100.00")?;
    let thirty = usd.parse("30.00")?;
    c1_waiting(ledger, story, usd, hundred).await?;
    c1_and_c2_pending(ledger, story, usd, hundred, thirty).await?;
    c1_updated(ledger, story, usd).await?;
    c1_committed(ledger, story, usd, hundred, thirty).await?;
    both_done(ledger, story, usd).await?;

    let report = verify_at_rest(ledger).await?;
    story.step(
        "verify",
        "verify (at rest): every invariant still holds, across both scenarios' accounts and \
         currencies.",
        json!({"ok": report.ok, "checks": report.checks.len()}),
    )?;
    Ok(())
}

/// Alice and James open, and c1 is recorded, not started: `status` counts it initial.
async fn c1_waiting(
    ledger: &Ledger,
    story: &mut Story<'_>,
    usd: Currency,
    hundred: Amount,
) -> anyhow::Result<()> {
    let m = |a| money(usd, a);
    open_account(ledger, "Alice", usd, "200.00").await?;
    open_account(ledger, "James", usd, "100.00").await?;
    ledger
        .submit(request("c1", "Alice", "James", hundred, usd), false)
        .await
        .context("submit c1")?;
    let status = ledger.status().await.context("status")?;
    story.step(
        "waiting",
        &format!(
            "Alice has {}, James {}. The transfer c1 ({} from Alice to James) is recorded, \
             not started (the seed's \"waiting\", our initial): status counts {} initial and \
             {} minor units in flight.",
            m(usd.parse("200.00")?),
            m(usd.parse("100.00")?),
            m(hundred),
            status.states.initial,
            status.in_flight.minor()
        ),
        json!({"states": status.states, "in_flight": status.in_flight}),
    )?;
    Ok(())
}

/// c1 begun, and c2 the other way: both pending, both in flight.
async fn c1_and_c2_pending(
    ledger: &Ledger,
    story: &mut Story<'_>,
    usd: Currency,
    hundred: Amount,
    thirty: Amount,
) -> anyhow::Result<()> {
    let m = |a| money(usd, a);
    ledger.step("c1").await.context("begin c1")?;
    ledger
        .submit(request("c2", "James", "Alice", thirty, usd), false)
        .await
        .context("submit c2")?;
    ledger.step("c2").await.context("begin c2")?;
    let pending = view_sums(ledger, "pending").await?;
    let status = ledger.status().await.context("status")?;
    ensure!(pending.len() == 2, "both transfers should be pending");
    ensure!(status.in_flight.minor() == hundred.minor() + thirty.minor());
    story.step(
        "pending",
        &format!(
            "c1 and, the other way, c2 ({}) are pending. The pending view, one row per \
             [from, to]: {}. status: {} pending, money in flight {} minor units ({}).",
            m(thirty),
            sums_words(&pending, usd),
            status.states.pending,
            status.in_flight.minor(),
            m(status.in_flight)
        ),
        json!({"pending_view": sums_json(&pending), "states": status.states,
               "in_flight": status.in_flight}),
    )?;
    Ok(())
}

/// c1 applied: both accounts note it among their active transactions.
async fn c1_updated(ledger: &Ledger, story: &mut Story<'_>, usd: Currency) -> anyhow::Result<()> {
    ledger.step("c1").await.context("apply c1")?;
    let (alice, james) = pair(ledger, "Alice", "James").await?;
    ensure!(alice.pending.len() == 1 && james.pending.len() == 1);
    story.step(
        "updated",
        &format!(
            "c1 updates both account records, each noting c1 in its list of active \
             transactions (our pending set): {}; {}.",
            account_words(&alice, usd),
            account_words(&james, usd)
        ),
        json!({"accounts": [account_json(&alice), account_json(&james)]}),
    )?;
    Ok(())
}

/// c1 committed: in the committed view; only c2 still in flight.
async fn c1_committed(
    ledger: &Ledger,
    story: &mut Story<'_>,
    usd: Currency,
    hundred: Amount,
    thirty: Amount,
) -> anyhow::Result<()> {
    let v = ledger.step("c1").await.context("commit c1")?;
    ensure!(v.state == State::Committed, "c1 should be committed");
    let pending = view_sums(ledger, "pending").await?;
    let committed = view_sums(ledger, "committed").await?;
    let status = ledger.status().await.context("status")?;
    ensure!(committed == [("Alice".to_owned(), "James".to_owned(), hundred.minor())]);
    ensure!(status.in_flight == thirty, "only c2 is in flight");
    story.step(
        "committed",
        &format!(
            "c1 is committed: it moves from the pending view to the committed view ({}). The \
             pending view now holds only c2 ({}); money in flight {}.",
            sums_words(&committed, usd),
            sums_words(&pending, usd),
            money(usd, status.in_flight)
        ),
        json!({"pending_view": sums_json(&pending), "committed_view": sums_json(&committed),
               "in_flight": status.in_flight}),
    )?;
    Ok(())
}

/// c1 and c2 stepped to `done`: both views empty, the balances final.
async fn both_done(ledger: &Ledger, story: &mut Story<'_>, usd: Currency) -> anyhow::Result<()> {
    let m = |a| money(usd, a);
    ensure!(step_to_end(ledger, "c1").await? == State::Done);
    ensure!(step_to_end(ledger, "c2").await? == State::Done);
    let pending = view_sums(ledger, "pending").await?;
    let committed = view_sums(ledger, "committed").await?;
    let status = ledger.status().await.context("status")?;
    let (alice, james) = pair(ledger, "Alice", "James").await?;
    ensure!(pending.is_empty() && committed.is_empty());
    ensure!(alice.balance.minor() == 13_000 && james.balance.minor() == 17_000);
    ensure!(alice.pending.is_empty() && james.pending.is_empty());
    story.step(
        "done",
        &format!(
            "Both finish: each account drops the transfer from its list, then the transfer is \
             done and leaves both views (pending {}, committed {}). Alice {}, James {}; money \
             in flight {}; {} transfers done, {} cancelled in this database.",
            sums_words(&pending, usd),
            sums_words(&committed, usd),
            m(alice.balance),
            m(james.balance),
            m(status.in_flight),
            status.states.done,
            status.states.cancelled
        ),
        json!({"states": status.states, "in_flight": status.in_flight,
               "accounts": [account_json(&alice), account_json(&james)]}),
    )?;
    Ok(())
}
