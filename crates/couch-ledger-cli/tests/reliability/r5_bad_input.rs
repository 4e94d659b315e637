//! R5, bad input: every malformed call of the library, every malformed document written
//! straight into the database and every malformed command line is refused with the error it
//! deserves, and nothing is written.

use std::ffi::OsString;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use couch_ledger::{AccountSpec, Amount, Client, Currency, Error, Ledger, State, SweepOptions};

use crate::r5_poison::r5_poison;
use crate::shared::{
    amount, cli_has_transfers, create_accounts, eur, os, raw_accounts, raw_write, req, run_cli,
    usd, Acct, Tally,
};
use crate::support;

/// What a bad input must come to.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// `is_invalid_input()` (not a mismatch), optionally about this field.
    Invalid(Option<&'static str>),
    /// `is_mismatch()` naming this field.
    Mismatch(&'static str),
    /// 404.
    NotFound,
    /// A refused state change (`transition()`).
    Transition,
    /// The program exits with this code and prints nothing on stdout.
    Exit(i32),
}

/// The table: every case must fail as expected and leave the database as it was.
struct Table {
    part: &'static str,
    db: String,
    before: support::DbSnapshot,
    cases: u64,
    tally: Arc<Tally>,
}

impl Table {
    async fn new(part: &'static str, db: &str, tally: Arc<Tally>) -> Table {
        Table {
            part,
            db: db.to_owned(),
            before: support::db_snapshot(db).await,
            cases: 0,
            tally,
        }
    }

    /// Checks that nothing was written since the last case.
    async fn unchanged(&mut self, name: &str) {
        let now = support::db_snapshot(&self.db).await;
        if now != self.before {
            self.tally.violation(format!(
                "{}: {name}: the database changed ({:?} → {now:?})",
                self.part, self.before
            ));
            self.before = now;
        }
    }

    async fn lib<T: std::fmt::Debug>(&mut self, name: &str, expect: Expect, r: Result<T, Error>) {
        self.cases += 1;
        let ok = match (&r, expect) {
            (Err(e), Expect::Invalid(field)) => {
                e.is_invalid_input()
                    && !e.is_mismatch()
                    && field.is_none_or(|f| e.field() == Some(f))
            }
            (Err(e), Expect::Mismatch(field)) => e.is_mismatch() && e.field() == Some(field),
            (Err(e), Expect::NotFound) => e.is_not_found(),
            (Err(e), Expect::Transition) => e.transition().is_some(),
            _ => false,
        };
        if !ok {
            self.tally.violation(format!(
                "{}: {name}: expected {expect:?}, got {r:?}",
                self.part
            ));
        }
        self.unchanged(name).await;
    }

    /// A raw write (PUT or DELETE as the admin writer) that the server's validation must
    /// refuse with 403.
    async fn raw(&mut self, name: &str, method: reqwest::Method, id: &str, doc: Option<Value>) {
        self.cases += 1;
        let status = raw_write(&self.db, method, id, doc).await;
        if status != 403 {
            self.tally.violation(format!(
                "{}: {name}: the server answered {status}, not 403",
                self.part
            ));
        }
        self.unchanged(name).await;
    }

    /// The real program with `args` (after the server's settings): exit code and no stdout.
    async fn cli(&mut self, name: &str, expect: Expect, args: Vec<std::ffi::OsString>) {
        self.cases += 1;
        let out = run_cli(&self.db, args).await;
        let Expect::Exit(code) = expect else {
            unreachable!()
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines = stderr.lines().filter(|l| !l.trim().is_empty()).count();
        if out.status.code() != Some(code) || !out.stdout.is_empty() || lines == 0 {
            self.tally.violation(format!(
                "{}: {name}: expected exit {code}, nothing on stdout and an error line; got {:?}, stdout {:?}, stderr {:?}",
                self.part,
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                stderr
            ));
        }
        self.unchanged(name).await;
    }
}

pub async fn r5(tally: Arc<Tally>) {
    let started = Instant::now();
    let (l, long_id) = r5_ledger().await;
    let db = l.client().database().to_owned();
    let mut t = Table::new("r5", &db, tally.clone()).await;
    submit_cases(&mut t, &l).await;
    amount_cases(&mut t).await;
    account_cases(&mut t, &l).await;
    state_and_setting_cases(&mut t, &l, &long_id).await;
    order_cases(&mut t, &l).await;
    raw_account_cases(&mut t).await;
    raw_transfer_cases(&mut t).await;
    raw_order_cases(&mut t).await;
    if cli_has_transfers().await {
        cli_amount_cases(&mut t).await;
        cli_id_cases(&mut t).await;
        cli_account_and_state_cases(&mut t).await;
        cli_file_cases(&mut t).await;
    } else {
        eprintln!("r5: the command line has no transfer commands yet: CLI cases skipped");
    }
    tally.bad_inputs.fetch_add(t.cases, Ordering::Relaxed);
    to_a_missing_account(&l, &db, &tally).await;
    eprintln!(
        "r5: {} bad inputs refused, nothing written; {:?}",
        t.cases,
        started.elapsed()
    );

    r5_poison(tally).await;
}

/// R5's ledger: accounts A and B in EUR, U in USD, a done transfer, one whose id is as long as
/// a reversal's may grow from, a cancelled one, an order with a payment. Returns it and the
/// long id.
async fn r5_ledger() -> (Ledger, String) {
    let l = support::ledger("r5").await;
    let accounts = [
        Acct {
            id: "A".into(),
            currency: eur(),
            opening: 100_000,
            min: Some(0),
        },
        Acct {
            id: "B".into(),
            currency: eur(),
            opening: 0,
            min: Some(0),
        },
        Acct {
            id: "U".into(),
            currency: usd(),
            opening: 100,
            min: Some(0),
        },
    ];
    create_accounts(&l, &accounts).await;
    l.submit(req("t-done", "A", "B", 100), true).await.unwrap();
    let long_id = "L".repeat(198);
    l.submit(req(&long_id, "A", "B", 1), true).await.unwrap();
    let c = l
        .submit(req("t-can", "B", "A", 1_000_000), true)
        .await
        .unwrap();
    assert_eq!(c.state, State::Cancelled);
    let purchase = couch_ledger::Purchase::from_json(
        r#"{"order_id": "o1", "account_id": "c1", "currency": "EUR",
            "basket": [{"product_id": "p1", "price": 10.00, "tax": 0, "quantity": 1}],
            "delivery": {"option": null, "price": 0, "address": "here"},
            "pretax": 10.00, "tax": 0, "total": 10.00}"#,
        None,
    )
    .unwrap();
    l.record_purchase(&purchase).await.unwrap();
    l.record_payment(&pay("p1", 300, eur())).await.unwrap();
    (l, long_id)
}

/// A payment of R5's order `o1`.
fn pay(reference: &str, minor: i64, currency: Currency) -> couch_ledger::Payment {
    couch_ledger::Payment {
        order_id: "o1".into(),
        reference: reference.into(),
        amount: Amount::new(minor).unwrap_or(Amount::ZERO),
        currency,
        method: None,
        meta: Default::default(),
    }
}

/// The library: transfer requests with bad ids, accounts or amounts.
async fn submit_cases(t: &mut Table, l: &Ledger) {
    use Expect::*;
    t.lib(
        "submit: empty id",
        Invalid(Some("id")),
        l.submit(req("", "A", "B", 1), true).await,
    )
    .await;
    t.lib(
        "submit: id begins with _",
        Invalid(Some("id")),
        l.submit(req("_x", "A", "B", 1), true).await,
    )
    .await;
    t.lib(
        "submit: id holds ':'",
        Invalid(Some("id")),
        l.submit(req("a:b", "A", "B", 1), true).await,
    )
    .await;
    t.lib(
        "submit: id holds a control character",
        Invalid(Some("id")),
        l.submit(req("a\u{7}b", "A", "B", 1), true).await,
    )
    .await;
    t.lib(
        "submit: oversized id (201 characters)",
        Invalid(Some("id")),
        l.submit(req(&"x".repeat(201), "A", "B", 1), true).await,
    )
    .await;
    t.lib(
        "submit: id with surrounding white space",
        Invalid(Some("id")),
        l.submit(req(" x", "A", "B", 1), true).await,
    )
    .await;
    t.lib(
        "submit: bad source id",
        Invalid(Some("source")),
        l.submit(req("k", "", "B", 1), true).await,
    )
    .await;
    t.lib(
        "submit: source is destination",
        Invalid(Some("destination")),
        l.submit(req("k", "A", "A", 1), true).await,
    )
    .await;
    t.lib(
        "submit: zero amount",
        Invalid(Some("amount")),
        l.submit(req("k", "A", "B", 0), true).await,
    )
    .await;
    t.lib(
        "submit: negative amount",
        Invalid(Some("amount")),
        l.submit(req("k", "A", "B", -5), false).await,
    )
    .await;
}

/// The library: amounts and currencies that do not exist.
async fn amount_cases(t: &mut Table) {
    use Expect::*;
    t.lib(
        "amount: 2^53 minor units",
        Invalid(Some("amount")),
        Amount::new(1 << 53),
    )
    .await;
    t.lib(
        "amount: i64::MIN",
        Invalid(Some("amount")),
        Amount::new(i64::MIN),
    )
    .await;
    t.lib(
        "currency: lower-case code",
        Invalid(Some("currency")),
        Currency::from_code("eur"),
    )
    .await;
    t.lib(
        "currency: unknown code",
        Invalid(Some("currency")),
        Currency::from_code("EURO"),
    )
    .await;
    t.lib("amount: 6.465 EUR", Invalid(None), eur().parse("6.465"))
        .await;
    t.lib("amount: 1e3", Invalid(None), eur().parse("1e3"))
        .await;
    t.lib("amount: non-numeric", Invalid(None), eur().parse("ten"))
        .await;
    t.lib(
        "amount: huge decimal",
        Invalid(None),
        eur().parse("99999999999999999999"),
    )
    .await;
}

/// The library: a known id with other terms, accounts that cannot be made or read.
async fn account_cases(t: &mut Table, l: &Ledger) {
    use Expect::*;
    t.lib(
        "submit: known id, other amount",
        Mismatch("value"),
        l.submit(req("t-done", "A", "B", 101), true).await,
    )
    .await;
    t.lib(
        "submit: known id, other destination",
        Mismatch("destination"),
        l.submit(req("t-done", "A", "U", 100), false).await,
    )
    .await;
    t.lib(
        "account: opening below minimum",
        Invalid(Some("opening")),
        l.create_account(AccountSpec {
            account_id: "N".into(),
            currency: eur(),
            opening: amount(-1),
            min_balance: Some(Amount::ZERO),
            meta: Default::default(),
        })
        .await,
    )
    .await;
    t.lib(
        "account: id holds ':'",
        Invalid(None),
        l.create_account(AccountSpec {
            account_id: "N:1".into(),
            currency: eur(),
            opening: Amount::ZERO,
            min_balance: None,
            meta: Default::default(),
        })
        .await,
    )
    .await;
    t.lib(
        "account: exists in another currency",
        Mismatch("currency"),
        l.create_account(AccountSpec {
            account_id: "A".into(),
            currency: usd(),
            opening: amount(100_000),
            min_balance: Some(Amount::ZERO),
            meta: Default::default(),
        })
        .await,
    )
    .await;
    t.lib(
        "account: read with an empty id",
        Invalid(None),
        l.account("").await,
    )
    .await;
    t.lib("account: missing", NotFound, l.account("nobody").await)
        .await;
}

/// The library: state changes the graph refuses, settings out of bounds.
async fn state_and_setting_cases(t: &mut Table, l: &Ledger, long_id: &str) {
    use Expect::*;
    t.lib("transfer: missing", NotFound, l.transfer("nope").await)
        .await;
    t.lib("cancel: missing", NotFound, l.cancel("nope").await)
        .await;
    t.lib(
        "cancel: a done transfer",
        Transition,
        l.cancel("t-done").await,
    )
    .await;
    t.lib(
        "reverse: a cancelled transfer",
        Invalid(Some("id")),
        l.reverse("t-can").await,
    )
    .await;
    t.lib(
        "reverse: the reversal id would be too long",
        Invalid(Some("id")),
        l.reverse(long_id).await,
    )
    .await;
    t.lib(
        "sweep: limit 0",
        Invalid(Some("limit")),
        l.sweep_once(SweepOptions {
            limit: 0,
            stale_after: Duration::ZERO,
        })
        .await,
    )
    .await;
    t.lib(
        "sweep: limit above the maximum",
        Invalid(Some("limit")),
        l.sweep_once(SweepOptions {
            limit: couch_ledger::limits::SWEEP_LIMIT_MAX + 1,
            stale_after: Duration::ZERO,
        })
        .await,
    )
    .await;
    t.lib(
        "ledger: zero lease",
        Invalid(Some("lease")),
        l.to_builder().lease(Duration::ZERO).build(),
    )
    .await;
    t.lib(
        "ledger: lease above the maximum",
        Invalid(Some("lease")),
        l.to_builder().lease(Duration::from_secs(31)).build(),
    )
    .await;
    t.lib(
        "client: invalid database name",
        Invalid(None),
        Client::builder().database("Bad Name").build(),
    )
    .await;
}

/// The library: payments and purchases that do not add up.
async fn order_cases(t: &mut Table, l: &Ledger) {
    use Expect::*;
    t.lib(
        "payment: unknown order",
        Invalid(Some("order_id")),
        l.record_payment(&couch_ledger::Payment {
            order_id: "o-none".into(),
            ..pay("p9", 1, eur())
        })
        .await,
    )
    .await;
    t.lib(
        "payment: other currency than the order",
        Invalid(Some("currency")),
        l.record_payment(&pay("p9", 1, usd())).await,
    )
    .await;
    t.lib(
        "payment: zero amount",
        Invalid(Some("amount")),
        l.record_payment(&pay("p9", 0, eur())).await,
    )
    .await;
    t.lib(
        "payment: known reference, other amount",
        Mismatch("value"),
        l.record_payment(&pay("p1", 301, eur())).await,
    )
    .await;
    t.lib(
        "purchase: not JSON",
        Invalid(None),
        couch_ledger::Purchase::from_json("{not json", None),
    )
    .await;
    t.lib("purchase: total is not pretax + tax + delivery", Invalid(Some("total")), couch_ledger::Purchase::from_json(r#"{"order_id": "o2", "account_id": "c1", "currency": "EUR", "basket": [{"product_id": "p", "price": 1, "tax": 0, "quantity": 1}], "delivery": {"option": null, "price": 0, "address": "x"}, "pretax": 1, "tax": 0, "total": 2}"#, None)).await;
    t.lib("purchase: a price as a float beyond 2^53", Invalid(None), couch_ledger::Purchase::from_json(r#"{"order_id": "o2", "account_id": "c1", "currency": "EUR", "basket": [{"product_id": "p", "price": 1e20, "tax": 0, "quantity": 1}], "delivery": {"option": null, "price": 0, "address": "x"}, "pretax": 1e20, "tax": 0, "total": 1e20}"#, None)).await;
    t.lib(
        "purchase: a missing field",
        Invalid(None),
        couch_ledger::Purchase::from_json(r#"{"order_id": "o2", "currency": "EUR"}"#, None),
    )
    .await;
}

/// An account document as the ledger writes it, with `changes` (a null removes the field).
fn account_doc(changes: Value) -> Value {
    let mut d = json!({"type": "account", "account_id": "M", "currency": "EUR", "opening": 0,
        "balance": 0, "min_balance": 0, "pending": [], "settled": []});
    for (k, x) in changes.as_object().unwrap() {
        if x.is_null() {
            d.as_object_mut().unwrap().remove(k);
        } else {
            d[k] = x.clone();
        }
    }
    d
}

/// A transfer document as the ledger writes it, with `changes` (`"<absent>"` removes the field).
fn transfer_doc(changes: Value) -> Value {
    let mut d = json!({"type": "transaction", "txn_id": "m", "source": "A", "destination": "B",
        "value": 5, "currency": "EUR", "state": "initial", "reason": null, "reverses": null,
        "claim": null, "created_at": 1, "last_modified": 1});
    for (k, x) in changes.as_object().unwrap() {
        if x == "<absent>" {
            d.as_object_mut().unwrap().remove(k);
        } else {
            d[k] = x.clone();
        }
    }
    d
}

/// Malformed account documents written straight into the database, as its admin.
async fn raw_account_cases(t: &mut Table) {
    let put = reqwest::Method::PUT;
    t.raw(
        "raw: account balance as a string",
        put.clone(),
        "account:M",
        Some(account_doc(json!({"balance": "100"}))),
    )
    .await;
    t.raw(
        "raw: account without a currency",
        put.clone(),
        "account:M",
        Some(account_doc(json!({"currency": null}))),
    )
    .await;
    t.raw(
        "raw: account with a lower-case currency",
        put.clone(),
        "account:M",
        Some(account_doc(json!({"currency": "eur"}))),
    )
    .await;
    t.raw(
        "raw: account balance 1.5",
        put.clone(),
        "account:M",
        Some(account_doc(json!({"balance": 1.5}))),
    )
    .await;
    t.raw(
        "raw: account balance 2^53",
        put.clone(),
        "account:M",
        Some(account_doc(json!({"balance": 9007199254740992i64}))),
    )
    .await;
    t.raw(
        "raw: account pending delta 0",
        put.clone(),
        "account:M",
        Some(account_doc(json!({"pending": [{"txn": "x", "delta": 0}]}))),
    )
    .await;
    t.raw(
        "raw: account id and account_id disagree",
        put.clone(),
        "account:M2",
        Some(account_doc(json!({}))),
    )
    .await;
}

/// Malformed transfer documents written straight into the database, as its admin.
async fn raw_transfer_cases(t: &mut Table) {
    let put = reqwest::Method::PUT;
    t.raw(
        "raw: transfer in an unknown state",
        put.clone(),
        "txn:m",
        Some(transfer_doc(json!({"state": "paused"}))),
    )
    .await;
    t.raw(
        "raw: transfer value \"ten\"",
        put.clone(),
        "txn:m",
        Some(transfer_doc(json!({"value": "ten"}))),
    )
    .await;
    t.raw(
        "raw: transfer value -5",
        put.clone(),
        "txn:m",
        Some(transfer_doc(json!({"value": -5}))),
    )
    .await;
    t.raw(
        "raw: transfer value 1e20",
        put.clone(),
        "txn:m",
        Some(transfer_doc(json!({"value": 1e20}))),
    )
    .await;
    t.raw(
        "raw: transfer created done",
        put.clone(),
        "txn:m",
        Some(transfer_doc(json!({"state": "done"}))),
    )
    .await;
    t.raw(
        "raw: transfer source is destination",
        put.clone(),
        "txn:m",
        Some(transfer_doc(json!({"destination": "A"}))),
    )
    .await;
    t.raw(
        "raw: transfer without last_modified",
        put.clone(),
        "txn:m",
        Some(transfer_doc(json!({"last_modified": "<absent>"}))),
    )
    .await;
    t.raw(
        "raw: transfer without a currency",
        put.clone(),
        "txn:m",
        Some(transfer_doc(json!({"currency": "<absent>"}))),
    )
    .await;
    t.raw(
        "raw: txn: id with type account",
        put.clone(),
        "txn:m",
        Some(account_doc(json!({}))),
    )
    .await;
}

/// Malformed order documents written straight into the database, as its admin.
async fn raw_order_cases(t: &mut Table) {
    let put = reqwest::Method::PUT;
    t.raw("raw: purchase total ≠ pretax + tax + delivery", put.clone(), "purchase:o3", Some(json!({"type": "purchase", "order_id": "o3", "account_id": "c", "currency": "EUR", "basket": [], "delivery": {"option": null, "price": 0, "address": "x"}, "pretax": 1, "tax": 0, "total": 2}))).await;
    t.raw("raw: payment value 0", put.clone(), "payment:o1:z", Some(json!({"type": "payment", "order_id": "o1", "account_id": "c1", "currency": "EUR", "value": 0, "payment_reference": "z"}))).await;
    t.raw("raw: payment without a reference", put.clone(), "payment:o1:z", Some(json!({"type": "payment", "order_id": "o1", "account_id": "c1", "currency": "EUR", "value": 5}))).await;
    t.raw("raw: payment under another order's id", put.clone(), "payment:o9:z", Some(json!({"type": "payment", "order_id": "o1", "account_id": "c1", "currency": "EUR", "value": 5, "payment_reference": "z"}))).await;
}

/// `transfer --from A --to B --amount <amount> --currency EUR`, then `--id <id>` if given.
fn transfer_args(amount: &str, id: Option<&str>) -> Vec<OsString> {
    let mut args = os(&[
        "transfer",
        "--from",
        "A",
        "--to",
        "B",
        "--amount",
        amount,
        "--currency",
        "EUR",
    ]);
    if let Some(id) = id {
        args.extend(os(&["--id", id]));
    }
    args
}

/// The command line: amounts and account ids that are not text, or not amounts.
async fn cli_amount_cases(t: &mut Table) {
    use std::os::unix::ffi::OsStringExt;
    use Expect::*;
    let bad_utf8 = std::ffi::OsString::from_vec(vec![b'1', 0xff, 0xfe]);
    let mut args = os(&[
        "transfer",
        "--from",
        "A",
        "--to",
        "B",
        "--currency",
        "EUR",
        "--amount",
    ]);
    args.push(bad_utf8.clone());
    t.cli("cli: non-UTF-8 amount", Exit(2), args).await;
    let mut args = os(&[
        "transfer",
        "--to",
        "B",
        "--amount",
        "1",
        "--currency",
        "EUR",
        "--from",
    ]);
    args.push(bad_utf8);
    t.cli("cli: non-UTF-8 account", Exit(2), args).await;
    t.cli(
        "cli: huge amount",
        Exit(2),
        transfer_args("99999999999999999999", None),
    )
    .await;
    t.cli("cli: amount 1e3", Exit(2), transfer_args("1e3", None))
        .await;
    t.cli("cli: amount NaN", Exit(2), transfer_args("NaN", None))
        .await;
}

/// The command line: ids the ledger refuses, a re-used id, a missing account.
async fn cli_id_cases(t: &mut Table) {
    use Expect::*;
    t.cli(
        "cli: oversized id",
        Exit(2),
        transfer_args("1", Some(&"k".repeat(300))),
    )
    .await;
    t.cli(
        "cli: id with a newline",
        Exit(2),
        transfer_args("1", Some("a\nb")),
    )
    .await;
    t.cli(
        "cli: re-used id, other terms",
        Exit(2),
        transfer_args("2.00", Some("t-done")),
    )
    .await;
    t.cli(
        "cli: missing --to",
        Exit(2),
        os(&[
            "transfer",
            "--from",
            "A",
            "--amount",
            "1",
            "--currency",
            "EUR",
        ]),
    )
    .await;
}

/// The command line: accounts that cannot be made, state changes the graph refuses, sweep
/// settings out of bounds.
async fn cli_account_and_state_cases(t: &mut Table) {
    use Expect::*;
    t.cli(
        "cli: account opening below minimum",
        Exit(2),
        os(&[
            "account",
            "create",
            "N",
            "--currency",
            "EUR",
            "--opening",
            "-5",
            "--min-balance",
            "0",
        ]),
    )
    .await;
    t.cli(
        "cli: account in an unknown currency",
        Exit(2),
        os(&["account", "create", "N", "--currency", "EURO"]),
    )
    .await;
    t.cli(
        "cli: account exists in another currency",
        Exit(2),
        os(&[
            "account",
            "create",
            "A",
            "--currency",
            "USD",
            "--opening",
            "1000",
        ]),
    )
    .await;
    t.cli(
        "cli: cancel an unknown transfer",
        Exit(2),
        os(&["cancel", "nope"]),
    )
    .await;
    t.cli(
        "cli: cancel a done transfer",
        Exit(2),
        os(&["cancel", "t-done"]),
    )
    .await;
    t.cli(
        "cli: reverse a cancelled transfer",
        Exit(2),
        os(&["reverse", "t-can"]),
    )
    .await;
    t.cli(
        "cli: sweep with a bad duration",
        Exit(2),
        os(&["sweep", "--once", "--stale-after", "5x"]),
    )
    .await;
    t.cli(
        "cli: sweep with batch 0",
        Exit(2),
        os(&["sweep", "--once", "--batch", "0"]),
    )
    .await;
}

/// The command line: purchase files that are not UTF-8, or too big.
async fn cli_file_cases(t: &mut Table) {
    use Expect::*;
    let dir = std::env::temp_dir().join(format!("r5-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let not_utf8 = dir.join("not-utf8.json");
    std::fs::write(&not_utf8, b"{\"order_id\": \"o\xff\xfe\"}").unwrap();
    t.cli(
        "cli: purchase file not UTF-8",
        Exit(2),
        vec![
            "purchase".into(),
            "--file".into(),
            not_utf8.clone().into_os_string(),
        ],
    )
    .await;
    let huge = dir.join("huge.json");
    std::fs::write(&huge, vec![b'['; 8 << 20]).unwrap();
    t.cli(
        "cli: purchase file of 8 MiB",
        Exit(2),
        vec![
            "purchase".into(),
            "--file".into(),
            huge.clone().into_os_string(),
        ],
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A transfer to a missing account is not an error: it ends cancelled, nothing moved.
async fn to_a_missing_account(l: &Ledger, db: &str, tally: &Tally) {
    let balances = |docs: Vec<Value>| -> Vec<(Value, Value)> {
        docs.into_iter()
            .map(|d| (d["_id"].clone(), d["balance"].clone()))
            .collect()
    };
    let before = balances(raw_accounts(db).await);
    let o = l
        .submit(req("to-ghost", "A", "ghost", 5), true)
        .await
        .unwrap();
    if (o.state, o.reason.as_deref()) != (State::Cancelled, Some("unknown_account")) {
        tally.violation(format!("r5: a transfer to a missing account came to {o:?}"));
    }
    if balances(raw_accounts(db).await) != before {
        tally.violation("r5: a transfer to a missing account changed a balance");
    }
}
