//! The reliability suite (issue 4): nothing lost, nothing counted twice — through crashes at
//! every protocol step, killed worker and sweeper processes, a killed server, network faults,
//! concurrent workers and bad input. See RELIABILITY.md.
//!
//! `cargo test --release --features failpoints --test reliability -- --nocapture` runs R1…R6 at
//! CI size; `RELIABILITY_LONG=1` runs the long size; `RELIABILITY_SEED=<n>` replays a seed;
//! `RELIABILITY_PARTS=r1,r4` runs only some parts (for development: the summary line then
//! covers only those).
//!
//! Fail points are process-wide, so every part that touches the server runs inside ONE test,
//! in order, and the summary line is printed at its end:
//! `RELIABILITY transfers=… crash_points=… crashes=… kills=… server_restarts=… faults=…
//! bad_inputs=… violations=…`. Every number is counted from what happened: crashes are fail
//! point firings seen as the "simulated crash" error they return, kills are SIGKILLs sent to
//! live processes, faults are what the fault proxy injected, transfers are transfer documents
//! found in the databases afterwards.

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinSet;

use couch_ledger::{
    AccountSpec, Amount, Client, Currency, Error, Ledger, PauseHook, RetryPolicy, State,
    SweepOptions, TransferOutcome, TransferRequest, VerifyOptions, FAIL_POINTS,
};

// ---- sizes and counters ----------------------------------------------------------------------

/// How big a run is.
#[derive(Debug, Clone, Copy)]
struct Size {
    long: bool,
    /// New transfers R1 asks for (at least).
    r1_transfers: u64,
    /// At the long size, R1 goes on until every fail point fired this often.
    r1_hits_per_point: u64,
    /// R1 stops asking for new work after this long whatever the counts.
    r1_time_max: Duration,
    /// EUR accounts in R1.
    r1_accounts: usize,
    /// R2: how long processes are killed and restarted.
    r2_soak: Duration,
    /// R3: server kills.
    r3_restarts: u32,
    /// R4: new transfers through the fault proxy.
    r4_transfers: u64,
}

impl Size {
    fn from_env() -> Size {
        let long = std::env::var("RELIABILITY_LONG").is_ok_and(|v| !v.is_empty() && v != "0");
        if long {
            Size {
                long,
                r1_transfers: 10_000,
                r1_hits_per_point: 100,
                r1_time_max: Duration::from_secs(45 * 60),
                r1_accounts: 48,
                r2_soak: Duration::from_secs(180),
                r3_restarts: 10,
                r4_transfers: 2_000,
            }
        } else {
            Size {
                long,
                r1_transfers: 1_000,
                r1_hits_per_point: 0,
                r1_time_max: Duration::from_secs(240),
                r1_accounts: 16,
                r2_soak: Duration::from_secs(40),
                r3_restarts: 3,
                r4_transfers: 300,
            }
        }
    }
}

/// What happened, counted as it happened.
#[derive(Default)]
struct Tally {
    /// Fail point → firings observed (as the crash error they return).
    crashes: Mutex<BTreeMap<&'static str, u64>>,
    kills: AtomicU64,
    restarts: AtomicU64,
    faults: AtomicU64,
    bad_inputs: AtomicU64,
    /// Transfer documents found in each part's database afterwards.
    transfers: AtomicU64,
    /// Errors that operations returned, by part and kind (each one typed: "fails clearly").
    errors: Mutex<BTreeMap<String, u64>>,
    /// Broken promises, one line each.
    violations: Mutex<Vec<String>>,
}

impl Tally {
    fn violation(&self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("VIOLATION: {line}");
        self.violations.lock().unwrap().push(line);
    }

    fn violations(&self) -> usize {
        self.violations.lock().unwrap().len()
    }

    /// Counts `text` if it is a simulated crash; `true` when it was one.
    fn crash_in(&self, text: &str) -> bool {
        match crash_point(text) {
            Some(point) => {
                *self.crashes.lock().unwrap().entry(point).or_default() += 1;
                true
            }
            None => false,
        }
    }

    fn crash_count(&self, point: &str) -> u64 {
        self.crashes
            .lock()
            .unwrap()
            .get(point)
            .copied()
            .unwrap_or(0)
    }

    /// Books an operation's error: a crash, or a typed error of some kind.
    fn error(&self, part: &str, e: &Error) {
        if self.crash_in(&e.to_string()) {
            return;
        }
        let kind = error_kind(e);
        *self
            .errors
            .lock()
            .unwrap()
            .entry(format!("{part}:{kind}"))
            .or_default() += 1;
    }

    /// Books a sweep pass's problem lines: crashes, and what else it could not do.
    fn problems(&self, part: &str, problems: &[String]) {
        for p in problems {
            if self.crash_in(p) {
                continue;
            }
            let kind = if p.contains("lease ran out") {
                "sweep-lease-ran-out"
            } else if p.contains("stopped in state") {
                "sweep-stopped-midway"
            } else if p.contains("could not reach") || p.contains("timed out") {
                "sweep-transport"
            } else if p.contains("server answered 409") {
                "sweep-conflict"
            } else {
                "sweep-other"
            };
            *self
                .errors
                .lock()
                .unwrap()
                .entry(format!("{part}:{kind}"))
                .or_default() += 1;
        }
    }
}

/// The fail point a "simulated crash" error text names.
fn crash_point(text: &str) -> Option<&'static str> {
    let at = text.find("simulated crash at fail point ")?;
    let rest = &text[at + "simulated crash at fail point ".len()..];
    FAIL_POINTS
        .iter()
        .copied()
        .filter(|p| rest.starts_with(p))
        .max_by_key(|p| p.len())
}

/// What kind of typed error this is (every library error answers one of these questions).
fn error_kind(e: &Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_transient() {
        "transient"
    } else if e.is_conflict() {
        "conflict"
    } else if e.is_not_found() {
        "not-found"
    } else if e.is_forbidden() {
        "forbidden"
    } else if e.is_unauthorized() {
        "unauthorized"
    } else if e.transition().is_some() {
        "transition"
    } else if e.is_mismatch() {
        "mismatch"
    } else if e.is_invalid_input() {
        "invalid-input"
    } else if e.is_decode() {
        "decode"
    } else if e.is_invariant() {
        "invariant"
    } else {
        "other"
    }
}

// ---- the world of a part ---------------------------------------------------------------------

fn eur() -> Currency {
    Currency::from_code("EUR").unwrap()
}

fn usd() -> Currency {
    Currency::from_code("USD").unwrap()
}

fn amount(minor: i64) -> Amount {
    Amount::new(minor).unwrap()
}

/// An account of a part's world.
#[derive(Debug, Clone)]
struct Acct {
    id: String,
    currency: Currency,
    opening: i64,
    min: Option<i64>,
}

async fn create_accounts(l: &Ledger, accounts: &[Acct]) {
    for a in accounts {
        l.create_account(AccountSpec {
            account_id: a.id.clone(),
            currency: a.currency,
            opening: amount(a.opening),
            min_balance: a.min.map(amount),
        })
        .await
        .unwrap();
    }
}

/// The terms a transfer id was asked with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Terms {
    source: String,
    destination: String,
    value: i64,
    currency: String,
    reverses: Option<String>,
}

impl Terms {
    fn request(&self, id: &str) -> TransferRequest {
        TransferRequest {
            id: Some(id.to_owned()),
            source: self.source.clone(),
            destination: self.destination.clone(),
            amount: amount(self.value),
            currency: Currency::from_code(&self.currency).unwrap(),
        }
    }
}

/// What a part asked for and what the ledger acknowledged, for the checks afterwards.
#[derive(Default)]
struct Book {
    /// Every transfer id asked for, with its terms.
    asked: Mutex<HashMap<String, Terms>>,
    /// Every state an `Ok` answer reported for an id.
    acked: Mutex<HashMap<String, Vec<State>>>,
    /// Ids a cancel was asked for.
    cancels: Mutex<HashSet<String>>,
    /// Order-ledger documents acknowledged: id → the fields that must be there afterwards.
    entries: Mutex<HashMap<String, Value>>,
}

impl Book {
    fn ask(&self, id: &str, terms: Terms) {
        self.asked.lock().unwrap().insert(id.to_owned(), terms);
    }

    fn ack(&self, o: &TransferOutcome) {
        self.acked
            .lock()
            .unwrap()
            .entry(o.id.clone())
            .or_default()
            .push(o.state);
    }

    fn terms(&self, id: &str) -> Option<Terms> {
        self.asked.lock().unwrap().get(id).cloned()
    }
}

/// `to` is `from` or further along the transfer graph.
fn reachable(from: State, to: State) -> bool {
    use State::*;
    from == to
        || match from {
            Initial => true,
            Pending => matches!(to, Committed | Done | Canceling | Cancelled),
            Committed => to == Done,
            Canceling => to == Cancelled,
            Done | Cancelled => false,
        }
}

// ---- raw reads (not through the library) ------------------------------------------------------

/// Every document of `db` with an id in `[start, end]`, read raw with `_all_docs` in pages.
async fn raw_docs(db: &str, start: &str, end: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = start.to_owned();
    let mut skip = 0;
    loop {
        let url = support::raw_url(&format!(
            "{db}/_all_docs?include_docs=true&limit=1000&skip={skip}&startkey={}&endkey={}",
            urlencode(&json!(from).to_string()),
            urlencode(&json!(end).to_string())
        ));
        let body: Value = support::auth(support::raw().get(url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let rows = body["rows"].as_array().cloned().unwrap_or_default();
        let n = rows.len();
        for r in rows {
            from = r["id"].as_str().unwrap_or_default().to_owned();
            if r["doc"].is_object() {
                out.push(r["doc"].clone());
            }
        }
        skip = 1;
        if n < 1000 {
            return out;
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn raw_accounts(db: &str) -> Vec<Value> {
    raw_docs(db, "account:", "account:\u{fff0}").await
}

async fn raw_transfers(db: &str) -> Vec<Value> {
    raw_docs(db, "txn:", "txn:\u{fff0}").await
}

/// `(update_seq, doc_count)` of a database, raw.
async fn raw_db_state(db: &str) -> (Value, u64) {
    let body: Value = support::auth(support::raw().get(support::raw_url(db)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (
        body["update_seq"].clone(),
        body["doc_count"].as_u64().unwrap_or(0),
    )
}

// ---- rest, audit and the independent check ---------------------------------------------------

/// Sweeps until nothing is open and no marker is pending (`expect_open` poison transfers
/// aside), within `deadline`. Fail points must be off.
async fn sweep_to_rest(
    part: &str,
    l: &Ledger,
    tally: &Tally,
    expect_open: u64,
    deadline: Duration,
) {
    let started = Instant::now();
    let now = SweepOptions {
        limit: 1_000,
        stale_after: Duration::ZERO,
    };
    loop {
        match l.sweep_once(now.clone()).await {
            Ok(o) => {
                tally.problems(part, &o.problems);
                let markers = l.status().await.map(|s| s.pending_markers).unwrap_or(1);
                if o.remaining <= expect_open && markers == 0 {
                    return;
                }
            }
            Err(e) => tally.error(part, &e),
        }
        if started.elapsed() > deadline {
            let status = l.status().await;
            tally.violation(format!(
                "{part}: the ledger did not come to rest within {deadline:?}: {status:?}"
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The library's auditor, strict (at rest): every failing check is a violation.
async fn audit(part: &str, l: &Ledger, tally: &Tally) {
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    for c in &report.checks {
        if !c.ok {
            tally.violation(format!("{part}: audit {}: {}", c.name, c.detail));
        }
    }
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    eprintln!(
        "{part}: audit at rest ok={} ({})",
        report.ok,
        names.join(", ")
    );
}

/// The test's own check, from the raw documents (no view, no library code): per currency
/// Σ balance = Σ opening; every account's balance = opening + Σ in − Σ out over its done (or
/// committed) transfers; nothing open, no marker; no overdraft; every transfer one that was
/// asked for, with its terms; every acknowledged state reached or passed; a reversal only of
/// a committed or done transfer; `cancelled_by_user` only where a cancel was asked.
/// Returns the number of transfer documents.
async fn independent_check(
    part: &str,
    db: &str,
    book: &Book,
    tally: &Tally,
    poison: &[&str],
) -> u64 {
    let accounts = raw_accounts(db).await;
    let transfers: Vec<Value> = raw_transfers(db)
        .await
        .into_iter()
        .filter(|t| !poison.contains(&t["_id"].as_str().unwrap_or("")))
        .collect();
    let mut moved: HashMap<String, i128> = HashMap::new();
    let mut states: HashMap<String, State> = HashMap::new();
    let asked = book.asked.lock().unwrap().clone();
    let cancels = book.cancels.lock().unwrap().clone();
    for t in &transfers {
        let id = t["txn_id"].as_str().unwrap_or_default().to_owned();
        let Some(state) = t["state"].as_str().and_then(State::parse) else {
            tally.violation(format!("{part}: {} has state {}", t["_id"], t["state"]));
            continue;
        };
        states.insert(id.clone(), state);
        if !state.is_terminal() {
            tally.violation(format!("{part}: txn:{id} is still {state} at rest"));
        }
        let value = t["value"].as_i64().unwrap_or(0);
        let (src, dst) = (
            t["source"].as_str().unwrap_or("").to_owned(),
            t["destination"].as_str().unwrap_or("").to_owned(),
        );
        if matches!(state, State::Committed | State::Done) {
            *moved.entry(src.clone()).or_default() -= i128::from(value);
            *moved.entry(dst.clone()).or_default() += i128::from(value);
        }
        match asked.get(&id) {
            None => tally.violation(format!("{part}: txn:{id} exists but was never asked for")),
            Some(terms) => {
                let found = Terms {
                    source: src,
                    destination: dst,
                    value,
                    currency: t["currency"].as_str().unwrap_or("").to_owned(),
                    reverses: t["reverses"].as_str().map(str::to_owned),
                };
                if *terms != found {
                    tally.violation(format!("{part}: txn:{id} holds {found:?}, asked {terms:?}"));
                }
            }
        }
        if state == State::Cancelled {
            let reason = t["reason"].as_str().unwrap_or("");
            let known = [
                "insufficient_funds",
                "unknown_account",
                "currency_mismatch",
                "cancelled_by_user",
            ];
            if !known.contains(&reason) {
                tally.violation(format!("{part}: txn:{id} cancelled with reason {reason:?}"));
            }
            if reason == "cancelled_by_user" && !cancels.contains(&id) {
                tally.violation(format!("{part}: txn:{id} cancelled by a user nobody was"));
            }
        }
    }
    // Reversals only of committed or done transfers.
    for (id, state) in &states {
        if let Some(original) = id.strip_prefix("rev-") {
            if !matches!(states.get(original), Some(State::Done | State::Committed)) {
                tally.violation(format!(
                    "{part}: txn:{id} ({state}) reverses {original}, which is {:?}",
                    states.get(original)
                ));
            }
        }
    }
    // Acknowledged states: reached or passed.
    for (id, acks) in book.acked.lock().unwrap().iter() {
        match states.get(id) {
            None => tally.violation(format!(
                "{part}: txn:{id} was acknowledged ({acks:?}) and is gone"
            )),
            Some(&fin) => {
                for &a in acks {
                    if !reachable(a, fin) {
                        tally.violation(format!(
                            "{part}: txn:{id} was acknowledged {a}, and is {fin} now"
                        ));
                    }
                }
            }
        }
    }
    // Accounts: conservation, exactly-once, no marker, no overdraft.
    let mut per_currency: BTreeMap<String, (i128, i128)> = BTreeMap::new();
    for a in &accounts {
        let id = a["account_id"].as_str().unwrap_or_default();
        let opening = i128::from(a["opening"].as_i64().unwrap_or(0));
        let balance = i128::from(a["balance"].as_i64().unwrap_or(0));
        let c = per_currency
            .entry(a["currency"].as_str().unwrap_or("?").to_owned())
            .or_default();
        c.0 += opening;
        c.1 += balance;
        let expected = opening + moved.remove(id).unwrap_or(0);
        if balance != expected {
            tally.violation(format!(
                "{part}: account:{id} balance {balance} ≠ opening {opening} + done transfers = {expected}"
            ));
        }
        if a["pending"].as_array().is_some_and(|p| !p.is_empty()) {
            tally.violation(format!(
                "{part}: account:{id} holds pending markers at rest: {}",
                a["pending"]
            ));
        }
        if let Some(min) = a["min_balance"].as_i64() {
            if balance < i128::from(min) {
                tally.violation(format!(
                    "{part}: account:{id} balance {balance} below its minimum {min}"
                ));
            }
        }
    }
    for (account, m) in moved {
        if m != 0 {
            tally.violation(format!(
                "{part}: done transfers move {m} on account:{account}, which does not exist"
            ));
        }
    }
    for (currency, (opening, balance)) in &per_currency {
        if opening != balance {
            tally.violation(format!(
                "{part}: {currency}: Σ balance {balance} ≠ Σ opening {opening}"
            ));
        }
    }
    // Acknowledged order-ledger entries are there, as written.
    let entries = book.entries.lock().unwrap().clone();
    for (id, fields) in entries {
        let url = support::raw_url(&format!("{db}/{}", urlencode(&id)));
        let doc: Value = support::auth(support::raw().get(url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for (k, v) in fields.as_object().unwrap() {
            if doc[k] != *v {
                tally.violation(format!(
                    "{part}: {id} was acknowledged with {k} = {v}, holds {}",
                    doc[k]
                ));
            }
        }
    }
    let done = states.values().filter(|s| **s == State::Done).count();
    let cancelled = states.values().filter(|s| **s == State::Cancelled).count();
    eprintln!(
        "{part}: independent check of {} accounts and {} transfers ({done} done, {cancelled} cancelled), {} acknowledged",
        accounts.len(),
        transfers.len(),
        book.acked.lock().unwrap().len()
    );
    transfers.len() as u64
}

/// Reads every account raw every `period` until `stop`, checking that no limited account is
/// ever below its minimum, in balance or in available (SPEC §7.3 "at every moment").
fn spawn_overdraft_monitor(
    part: &'static str,
    db: String,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut samples = 0;
        while !stop.load(Ordering::Relaxed) {
            for a in raw_accounts(&db).await {
                let Some(min) = a["min_balance"].as_i64() else {
                    continue;
                };
                let balance = a["balance"].as_i64().unwrap_or(0);
                let credits: i64 = a["pending"]
                    .as_array()
                    .map(|p| {
                        p.iter()
                            .filter_map(|m| m["delta"].as_i64())
                            .filter(|d| *d > 0)
                            .sum()
                    })
                    .unwrap_or(0);
                if balance < min || balance - credits < min {
                    tally.violation(format!(
                        "{part}: {} overdrawn at a moment: balance {balance}, available {}, min {min}",
                        a["_id"],
                        balance - credits
                    ));
                }
            }
            samples += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        samples
    })
}

fn fresh_ledger(client: &Client, lease: Duration) -> Ledger {
    Ledger::new(client.clone()).with_lease(lease).unwrap()
}

/// A sweeper task: passes until `stop`, crashes and problems booked.
fn spawn_sweeper(
    part: &'static str,
    l: Ledger,
    stale_after: Duration,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> tokio::task::JoinHandle<(u64, u64, u64)> {
    tokio::spawn(async move {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (mut passes, mut finished, mut repaired) = (0u64, 0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let options = SweepOptions {
                limit: 200,
                stale_after,
            };
            match l.sweep_once(options).await {
                Ok(o) => {
                    tally.problems(part, &o.problems);
                    finished += o.advanced + o.cancelled;
                    repaired += o.repaired_markers;
                }
                Err(e) => tally.error(part, &e),
            }
            passes += 1;
            tokio::time::sleep(Duration::from_millis(rng.u64(20..120))).await;
        }
        (passes, finished, repaired)
    })
}

// ---- R1: crash simulation --------------------------------------------------------------------

tokio::task_local! {
    /// Set around a submit that must stall in front of its first account write, past its
    /// lease (a paused worker: the one window the lease cannot protect).
    static LATE: Arc<AtomicBool>;
}

/// The pause hook of every R1 worker: inside a [`LATE`] scope, the first `apply` waits.
fn late_hook(wait: Duration) -> PauseHook {
    PauseHook(Arc::new(move |phase| {
        let stall = phase == "apply"
            && LATE
                .try_with(|flag| flag.swap(false, Ordering::SeqCst))
                .unwrap_or(false);
        Box::pin(async move {
            if stall {
                tokio::time::sleep(wait).await;
            }
        })
    }))
}

/// Probability (percent) with which each fail point fires in R1. The points on rarer paths
/// (cancellation, orphan repair) fire more often so that every one is hit at the long size.
fn fail_percent(point: &str) -> u32 {
    match point {
        "txn-after-canceling" | "txn-after-undo" => 12,
        "sweeper-after-takeover" => 6,
        "sweeper-after-repair" => 40,
        _ => 4,
    }
}

fn fail_points_on() {
    for p in FAIL_POINTS {
        fail::cfg(*p, &format!("{}%return", fail_percent(p))).unwrap();
    }
}

fn fail_points_off() {
    for p in FAIL_POINTS {
        fail::remove(*p);
    }
}

/// One R1 operation, decided by the worker's random stream.
#[derive(Debug, Clone)]
enum Op {
    Submit {
        id: String,
        terms: Terms,
        wait: bool,
    },
    Retry {
        id: String,
        terms: Terms,
        wait: bool,
    },
    Cancel {
        id: String,
    },
    Reverse {
        id: String,
    },
    Race {
        id: String,
        terms: Terms,
    },
    Late {
        id: String,
        terms: Terms,
    },
}

struct Worker {
    index: usize,
    rng: fastrand::Rng,
    next: u64,
    /// Ids this worker asked for (for retries, cancels, reversals).
    history: Vec<(String, Terms)>,
}

impl Worker {
    fn new_id(&mut self) -> String {
        self.next += 1;
        format!("r1-w{}-{}", self.index, self.next)
    }

    fn pick_terms(&mut self, eur_accounts: usize) -> Terms {
        let r = self.rng.u32(0..1000);
        let value = if self.rng.u32(0..100) < 5 {
            1_000_000
        } else {
            self.rng.i64(1..=6_000)
        };
        let e = |i: usize| format!("e{i}");
        let (source, destination, currency) = if r < 40 {
            // Money enters from the unlimited issuer.
            (
                "issuer".to_owned(),
                e(self.rng.usize(..eur_accounts)),
                "EUR",
            )
        } else if r < 70 {
            let a = self.rng.usize(..eur_accounts);
            if self.rng.bool() {
                ("ghost".to_owned(), e(a), "EUR")
            } else {
                (e(a), "ghost".to_owned(), "EUR")
            }
        } else if r < 95 {
            // Into an account of another currency.
            (e(self.rng.usize(..eur_accounts)), "u0".to_owned(), "EUR")
        } else if r < 130 {
            let from = self.rng.usize(..2);
            (format!("u{from}"), format!("u{}", 1 - from), "USD")
        } else {
            let from = self.rng.usize(..eur_accounts);
            let to = (from + 1 + self.rng.usize(..eur_accounts - 1)) % eur_accounts;
            (e(from), e(to), "EUR")
        };
        Terms {
            source,
            destination,
            value,
            currency: currency.to_owned(),
            reverses: None,
        }
    }

    fn pick(&mut self, eur_accounts: usize, late_ok: bool) -> Op {
        let r = self.rng.u32(0..1000);
        let old = (!self.history.is_empty())
            .then(|| self.history[self.rng.usize(..self.history.len())].clone());
        match (r, old) {
            (680..760, Some((id, terms))) => Op::Retry {
                id,
                terms,
                wait: self.rng.bool(),
            },
            (760..830, Some((id, _))) => Op::Cancel { id },
            (830..900, Some((id, _))) => Op::Reverse { id },
            (900..930, _) => {
                let id = self.new_id();
                let terms = self.pick_terms(eur_accounts);
                Op::Race { id, terms }
            }
            (930..950, _) if late_ok => {
                let id = self.new_id();
                let mut terms = self.pick_terms(eur_accounts);
                terms.value = terms.value.min(500);
                Op::Late { id, terms }
            }
            _ => {
                let id = self.new_id();
                let terms = self.pick_terms(eur_accounts);
                Op::Submit {
                    id,
                    terms,
                    wait: r >= 130,
                }
            }
        }
    }
}

/// Runs one op; `true` when the worker "crashed" (and so restarts with a fresh process).
async fn run_op(op: Op, l: Ledger, twin: Ledger, book: Arc<Book>, tally: Arc<Tally>) -> bool {
    let crashed = |r: &Result<TransferOutcome, Error>| matches!(r, Err(e) if crash_point(&e.to_string()).is_some());
    let book_result = |r: &Result<TransferOutcome, Error>| match r {
        Ok(o) => book.ack(o),
        Err(e) => tally.error("r1", e),
    };
    match op {
        Op::Submit { id, terms, wait } | Op::Retry { id, terms, wait } => {
            book.ask(&id, terms.clone());
            let r = l.submit(terms.request(&id), wait).await;
            book_result(&r);
            crashed(&r)
        }
        Op::Cancel { id } => {
            book.cancels.lock().unwrap().insert(id.clone());
            let r = l.cancel(&id).await;
            book_result(&r);
            crashed(&r)
        }
        Op::Reverse { id } => {
            if let Some(t) = book.terms(&id) {
                book.ask(
                    &format!("rev-{id}"),
                    Terms {
                        source: t.destination,
                        destination: t.source,
                        value: t.value,
                        currency: t.currency,
                        reverses: Some(id.clone()),
                    },
                );
            }
            let r = l.reverse(&id).await;
            book_result(&r);
            crashed(&r)
        }
        Op::Race { id, terms } => {
            // The same id from two processes at once: one transfer.
            book.ask(&id, terms.clone());
            let (a, b) = tokio::join!(
                l.submit(terms.request(&id), true),
                twin.submit(terms.request(&id), true)
            );
            book_result(&a);
            book_result(&b);
            crashed(&a)
        }
        Op::Late { id, terms } => {
            // A worker stalls before its account writes past its lease while a user cancels
            // the transfer; its late writes land on a cancelled transfer (orphan markers that
            // it, or the sweeper, must undo).
            book.ask(&id, terms.clone());
            book.cancels.lock().unwrap().insert(id.clone());
            let flag = Arc::new(AtomicBool::new(true));
            let (a, b) = tokio::join!(
                LATE.scope(flag, l.submit(terms.request(&id), true)),
                async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    twin.cancel(&id).await
                }
            );
            book_result(&a);
            book_result(&b);
            crashed(&a)
        }
    }
}

async fn r1(size: Size, seed: u64, tally: Arc<Tally>) {
    let started = Instant::now();
    let lease = Duration::from_millis(1_000);
    let stale_after = Duration::from_millis(250);
    let base = support::ledger("r1").await;
    let client = base.client().clone();
    let db = client.database().to_owned();
    let mut accounts: Vec<Acct> = (0..size.r1_accounts)
        .map(|i| Acct {
            id: format!("e{i}"),
            currency: eur(),
            opening: 20_000,
            min: Some(0),
        })
        .collect();
    accounts.push(Acct {
        id: "issuer".into(),
        currency: eur(),
        opening: 0,
        min: None,
    });
    for u in 0..2 {
        accounts.push(Acct {
            id: format!("u{u}"),
            currency: usd(),
            opening: 20_000,
            min: Some(0),
        });
    }
    create_accounts(&base, &accounts).await;

    let book = Arc::new(Book::default());
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = spawn_overdraft_monitor("r1", db.clone(), tally.clone(), stop.clone());
    let sweepers: Vec<_> = (0..3)
        .map(|i| {
            spawn_sweeper(
                "r1",
                fresh_ledger(&client, lease),
                stale_after,
                tally.clone(),
                stop.clone(),
                seed ^ (0x5eed_0000 + i),
            )
        })
        .collect();
    fail_points_on();

    let asked_new = Arc::new(AtomicU64::new(0));
    let hook = late_hook(lease * 3 / 2);
    let make = move |client: &Client| fresh_ledger(client, lease).with_pause_hook(hook.clone());
    let enough = {
        let tally = tally.clone();
        let asked_new = asked_new.clone();
        move || {
            let asked = asked_new.load(Ordering::Relaxed);
            if started.elapsed() > size.r1_time_max {
                return true;
            }
            asked >= size.r1_transfers
                && FAIL_POINTS
                    .iter()
                    .all(|p| tally.crash_count(p) >= size.r1_hits_per_point)
        }
    };
    let mut workers = JoinSet::new();
    for w in 0..8 {
        let client = client.clone();
        let (book, tally, asked_new) = (book.clone(), tally.clone(), asked_new.clone());
        let enough = enough.clone();
        let make = make.clone();
        workers.spawn(async move {
            let mut worker = Worker {
                index: w,
                rng: fastrand::Rng::with_seed(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9)),
                next: 0,
                history: Vec::new(),
            };
            let mut ledger = make(&client);
            let twin = make(&client);
            let mut inflight = JoinSet::new();
            let mut restarts = 0u64;
            loop {
                while inflight.len() < 4 && !enough() {
                    let op = worker.pick(size.r1_accounts, true);
                    match &op {
                        Op::Submit { id, terms, .. }
                        | Op::Race { id, terms }
                        | Op::Late { id, terms } => {
                            asked_new.fetch_add(1, Ordering::Relaxed);
                            worker.history.push((id.clone(), terms.clone()));
                        }
                        _ => {}
                    }
                    inflight.spawn(run_op(
                        op,
                        ledger.clone(),
                        twin.clone(),
                        book.clone(),
                        tally.clone(),
                    ));
                }
                match inflight.join_next().await {
                    Some(Ok(true)) => {
                        // The process "died" at a fail point: half the time it comes back as
                        // a new process (new worker id, empty caches), else it goes on.
                        if worker.rng.bool() {
                            ledger = make(&client);
                            restarts += 1;
                        }
                    }
                    Some(Ok(false)) => {}
                    Some(Err(e)) => tally.violation(format!("r1: a worker task panicked: {e}")),
                    None => break,
                }
            }
            restarts
        });
    }
    let mut process_restarts = 0;
    while let Some(r) = workers.join_next().await {
        process_restarts += r.unwrap();
    }
    let load_time = started.elapsed();
    fail_points_off();
    stop.store(true, Ordering::Relaxed);
    let mut sweeper_summary = Vec::new();
    for s in sweepers {
        sweeper_summary.push(s.await.unwrap());
    }
    let samples = monitor.await.unwrap();

    let rest = fresh_ledger(&client, lease);
    sweep_to_rest("r1", &rest, &tally, 0, Duration::from_secs(120)).await;
    audit("r1", &rest, &tally).await;
    let n = independent_check("r1", &db, &book, &tally, &[]).await;
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    if n < size.r1_transfers {
        tally.violation(format!(
            "r1: only {n} transfer documents for {} asked",
            size.r1_transfers
        ));
    }
    let crashes = tally.crashes.lock().unwrap().clone();
    eprintln!(
        "r1: {n} transfers in {load_time:?} (+ rest and audit: {:?} in all); worker process restarts {process_restarts}; sweepers (passes, finished, orphan markers repaired) {sweeper_summary:?}; overdraft samples {samples}",
        started.elapsed()
    );
    eprintln!("r1: crashes by fail point {crashes:?}");
    if size.long {
        for p in FAIL_POINTS {
            let hits = crashes.get(p).copied().unwrap_or(0);
            if hits < size.r1_hits_per_point {
                tally.violation(format!(
                    "r1: fail point {p} fired {hits} times, fewer than {}",
                    size.r1_hits_per_point
                ));
            }
        }
    }
}

// ---- the suite -------------------------------------------------------------------------------

/// A `tracing` writer into a shared buffer: R6 searches everything the library logged.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

static LOGS: OnceLock<LogBuffer> = OnceLock::new();

/// Installs, once and before any callsite is hit, a global subscriber that records the
/// library's logs (debug and up) for the whole run. Global, so that every thread of the
/// multi-threaded runtime logs into it and no callsite's interest is cached as "never"
/// (the caveat in tests/http_faults.rs `credentials_never_appear_in_logs`).
fn capture_logs() -> LogBuffer {
    LOGS.get_or_init(|| {
        let logs = LogBuffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "couch_ledger=debug,reqwest=debug,hyper=info,warn",
            ))
            .with_ansi(false)
            .with_writer(logs.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        logs
    })
    .clone()
}

fn parts() -> Vec<String> {
    match std::env::var("RELIABILITY_PARTS") {
        Ok(p) if !p.is_empty() => p.split(',').map(|s| s.trim().to_lowercase()).collect(),
        _ => ["r1", "r2", "r3", "r4", "r5", "r6"]
            .map(str::to_owned)
            .to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reliability() {
    let logs = capture_logs();
    let seed = match std::env::var("RELIABILITY_SEED") {
        Ok(s) if !s.is_empty() => s.parse().expect("RELIABILITY_SEED is a u64"),
        _ => fastrand::u64(..),
    };
    let size = Size::from_env();
    let parts = parts();
    eprintln!(
        "RELIABILITY seed={seed} size={} parts={} (replay: RELIABILITY_SEED={seed}{})",
        if size.long { "long" } else { "ci" },
        parts.join(","),
        if size.long { " RELIABILITY_LONG=1" } else { "" }
    );
    let scenario = fail::FailScenario::setup();
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let run = |p: &str| parts.iter().any(|x| x == p);
    if run("r1") {
        r1(size, seed, tally.clone()).await;
        eprintln!("r1 finished at {:?}", started.elapsed());
    }
    scenario.teardown();
    if run("r3") {
        r3(size, seed, tally.clone()).await;
        eprintln!("r3 finished at {:?}", started.elapsed());
    }

    let crashes = tally.crashes.lock().unwrap().clone();
    let errors = tally.errors.lock().unwrap().clone();
    eprintln!("typed errors returned, by part and kind: {errors:?}");
    eprintln!(
        "logs captured: {} bytes; run took {:?}",
        logs.0.lock().unwrap().len(),
        started.elapsed()
    );
    let violations = tally.violations();
    let line = format!(
        "RELIABILITY transfers={} crash_points={} crashes={} kills={} server_restarts={} faults={} bad_inputs={} violations={}",
        tally.transfers.load(Ordering::Relaxed),
        crashes.values().filter(|n| **n > 0).count(),
        crashes.values().sum::<u64>(),
        tally.kills.load(Ordering::Relaxed),
        tally.restarts.load(Ordering::Relaxed),
        tally.faults.load(Ordering::Relaxed),
        tally.bad_inputs.load(Ordering::Relaxed),
        violations,
    );
    println!("{line}");
    eprintln!("{line}");
    assert_eq!(
        violations,
        0,
        "seed {seed}: {:#?}",
        tally.violations.lock().unwrap()
    );
}

// ---- R3: server crash ------------------------------------------------------------------------

/// Kills the harness's own server with SIGKILL (data kept) or starts it again, off the runtime.
async fn server_kill_or_restart(restart: bool) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        let dev = support::server().dev.as_ref().expect("own server");
        let mut dev = dev.lock().unwrap_or_else(|e| e.into_inner());
        if restart {
            dev.restart().map_err(|e| e.to_string())
        } else {
            match dev.pid() {
                Some(_) => {
                    dev.kill();
                    Ok(())
                }
                None => Err("the server was not running".to_owned()),
            }
        }
    })
    .await
    .unwrap()
}

async fn r3(size: Size, seed: u64, tally: Arc<Tally>) {
    if support::server().dev.is_none() {
        eprintln!("r3: SKIPPED — COUCHDB_URL is set, so there is no own server to kill (server_restarts counts 0)");
        return;
    }
    let started = Instant::now();
    let lease = Duration::from_secs(2);
    let base = support::ledger("r3").await;
    let client = base.client().clone();
    let db = client.database().to_owned();
    let accounts: Vec<Acct> = (0..8)
        .map(|i| Acct {
            id: format!("s{i}"),
            currency: eur(),
            opening: 100_000,
            min: Some(0),
        })
        .collect();
    create_accounts(&base, &accounts).await;
    // An order whose payments the load records too (write-once documents).
    let purchase = couch_ledger::Purchase::from_json(
        r#"{"order_id": "r3-order", "account_id": "c1", "currency": "EUR",
            "basket": [{"product_id": "p1", "price": 1000000, "tax": 0, "quantity": 1}],
            "delivery": {"option": null, "price": 0, "address": "here"},
            "pretax": 1000000, "tax": 0, "total": 1000000}"#,
        None,
    )
    .unwrap();
    base.record_purchase(&purchase).await.unwrap();

    let book = Arc::new(Book::default());
    let stop = Arc::new(AtomicBool::new(false));
    // Successes seen after the last restart: the clients carried on by themselves.
    let after_last = Arc::new(AtomicU64::new(0));
    let last_restart_done = Arc::new(AtomicBool::new(false));
    let failed_during = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for w in 0..4u64 {
        let l = fresh_ledger(&client, lease);
        let (book, tally, stop) = (book.clone(), tally.clone(), stop.clone());
        let (after_last, last_restart_done, failed_during) = (
            after_last.clone(),
            last_restart_done.clone(),
            failed_during.clone(),
        );
        workers.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ (0x3300 + w));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let ok = if n % 5 == 0 {
                    let payment = couch_ledger::Payment {
                        order_id: "r3-order".into(),
                        reference: format!("w{w}-{n}"),
                        amount: amount(rng.i64(1..=100)),
                        currency: eur(),
                        method: None,
                    };
                    match l.record_payment(&payment).await {
                        Ok(r) => {
                            book.entries.lock().unwrap().insert(
                                r.id,
                                json!({"type": "payment", "value": payment.amount.minor()}),
                            );
                            true
                        }
                        Err(e) => {
                            tally.error("r3", &e);
                            false
                        }
                    }
                } else {
                    let from = rng.usize(..8);
                    let to = (from + 1 + rng.usize(..7)) % 8;
                    let id = format!("r3-w{w}-{n}");
                    let terms = Terms {
                        source: format!("s{from}"),
                        destination: format!("s{to}"),
                        value: rng.i64(1..=5_000),
                        currency: "EUR".into(),
                        reverses: None,
                    };
                    book.ask(&id, terms.clone());
                    match l.submit(terms.request(&id), rng.u32(0..10) < 8).await {
                        Ok(o) => {
                            book.ack(&o);
                            true
                        }
                        Err(e) => {
                            tally.error("r3", &e);
                            false
                        }
                    }
                };
                if ok && last_restart_done.load(Ordering::Relaxed) {
                    after_last.fetch_add(1, Ordering::Relaxed);
                }
                if !ok {
                    failed_during.fetch_add(1, Ordering::Relaxed);
                    // A failed call is retried by the caller's next iteration, not hammered.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
    }
    let sweeper = spawn_sweeper(
        "r3",
        fresh_ledger(&client, lease),
        Duration::from_millis(500),
        tally.clone(),
        stop.clone(),
        seed ^ 0x33,
    );

    let mut rng = fastrand::Rng::with_seed(seed ^ 0x3333);
    for i in 0..size.r3_restarts {
        tokio::time::sleep(Duration::from_millis(rng.u64(1_000..3_000))).await;
        let acked_before = book.acked.lock().unwrap().len();
        match server_kill_or_restart(false).await {
            Ok(()) => {}
            Err(e) => {
                tally.violation(format!("r3: kill {i}: {e}"));
                continue;
            }
        }
        // The server is down for a moment; calls in flight fail or wait in their retries.
        tokio::time::sleep(Duration::from_millis(rng.u64(100..1_500))).await;
        if let Err(e) = server_kill_or_restart(true).await {
            tally.violation(format!("r3: restart {i}: {e}"));
            break;
        }
        tally.restarts.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "r3: server killed and restarted ({} of {}), {acked_before} transfers acknowledged before",
            i + 1,
            size.r3_restarts
        );
    }
    last_restart_done.store(true, Ordering::Relaxed);
    // The clients must carry on by themselves after the last restart.
    let carried_on = {
        let after_last = after_last.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if after_last.load(Ordering::Relaxed) >= 20 {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    if !carried_on {
        tally.violation(format!(
            "r3: the clients did not carry on after the last restart ({} successes in 30 s)",
            after_last.load(Ordering::Relaxed)
        ));
    }
    stop.store(true, Ordering::Relaxed);
    while workers.join_next().await.is_some() {}
    sweeper.await.unwrap();

    let rest = fresh_ledger(&client, lease);
    sweep_to_rest("r3", &rest, &tally, 0, Duration::from_secs(120)).await;
    audit("r3", &rest, &tally).await;
    let n = independent_check("r3", &db, &book, &tally, &[]).await;
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    eprintln!(
        "r3: {} restarts; {} calls failed (typed) while the server was down; {} acknowledged order entries; {} successes after the last restart; {:?}",
        tally.restarts.load(Ordering::Relaxed),
        failed_during.load(Ordering::Relaxed),
        book.entries.lock().unwrap().len(),
        after_last.load(Ordering::Relaxed),
        started.elapsed()
    );
}
