//! The reliability suite: nothing lost, nothing counted twice — through crashes at
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
//! bad_inputs=… conflicts_met=… conflicts_resolved=… overdrafts_from_conflicts=… violations=…
//! split_rounds=… background=…`. Every number is counted from what happened: crashes are fail
//! point firings seen as the "simulated crash" error they return, kills are SIGKILLs sent to
//! live processes, faults are what the fault proxy injected, transfers are transfer documents
//! found in the databases afterwards, split_rounds are the R1 rounds and R2 runs made on the
//! split layout (`Ledger::with_hot_database`: accounts and transfers in a second database,
//! which R1's odd rounds and R2 use; the trio parts, R3…R6 use the single layout), background
//! counts the submits that R1's odd workers, finishing in the background
//! (`Ledger::with_background_finish`), had answered at the commit.

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinSet;

use couch_ledger::{
    AccountSpec, Amount, Client, Currency, Error, Ledger, PauseHook, RetryPolicy, State,
    SweepOptions, TransferOutcome, TransferRequest, VerifyOptions, WriteQuorum, FAIL_POINTS,
};
use support::trio::{Balance, Trio};

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
    /// R1 on the trio: new transfers asked for (one round).
    trio_r1_transfers: u64,
    /// R1 on the trio stops asking for new work after this long.
    trio_r1_time_max: Duration,
    /// R2 on the trio: how long processes are killed and restarted.
    trio_r2_soak: Duration,
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
                trio_r1_transfers: 2_000,
                trio_r1_time_max: Duration::from_secs(15 * 60),
                trio_r2_soak: Duration::from_secs(120),
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
                trio_r1_transfers: 300,
                trio_r1_time_max: Duration::from_secs(90),
                trio_r2_soak: Duration::from_secs(20),
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
    /// Trio parts: documents seen holding a conflict on any node during or after the run.
    conflicts_met: AtomicU64,
    /// Trio parts: of those, the ones that held none at the end.
    conflicts_resolved: AtomicU64,
    /// Parts on several copies: moments an account was seen below its minimum,
    /// `(part, account document id, what was seen)`, held until the part ends at rest.
    overdrafts: Mutex<Vec<(String, String, String)>>,
    /// Accounts seen below their minimum for a moment on several copies (two debits checked
    /// against one balance on two branches) and at or above it at rest: taken back by the
    /// ledger, counted, not violations.
    overdrafts_from_conflicts: AtomicU64,
    /// `(part, account document id)` of accounts below their minimum at rest: violations.
    overdrawn_at_rest: Mutex<BTreeSet<(String, String)>>,
    /// R1 rounds and R2 runs that ran on the split layout (accounts and transfers in a second
    /// database, `Ledger::with_hot_database`), checks included.
    split_rounds: AtomicU64,
    /// R1 submits answered `committed` by a worker finishing in the background
    /// (`Ledger::with_background_finish`): half of every round's workers run that way.
    background: AtomicU64,
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

    /// A moment at which `account` (its document id) was seen below its minimum during `part`.
    /// On a database that keeps one copy that is a violation: nothing can be merged there, so
    /// nothing takes it back. Where it keeps several (a cluster, the trio), two debits checked
    /// against one balance on two branches can both land before the merge takes one back
    /// (docs/CLUSTER.md, "What a reader may see"): the sighting is held for
    /// [`Tally::settle_overdrafts`], and an account still below its minimum at rest is a
    /// violation of its own, found by the audit and the independent check.
    fn moment_below_minimum(&self, part: &str, account: &str, line: String, several_copies: bool) {
        if several_copies {
            eprintln!("OVERDRAFT (held: is it taken back?): {line}");
            self.overdrafts
                .lock()
                .unwrap()
                .push((part.to_owned(), account.to_owned(), line));
        } else {
            self.violation(line);
        }
    }

    /// At the end of a part on several copies, after the audit at rest: each account seen
    /// below its minimum for a moment and not overdrawn at rest (`overdrawn_at_rest`) was
    /// taken back by the ledger, an overdraft from conflicting writes (counted once per
    /// account). One still overdrawn at rest is already a violation (a `done` transfer
    /// overdrawing), reported by the audit; its sightings are printed with it.
    fn settle_overdrafts(&self, part: &str) {
        let overdrawn_at_rest: BTreeSet<String> = self
            .overdrawn_at_rest
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == part)
            .map(|(_, account)| account.clone())
            .collect();
        let held: Vec<(String, String, String)> = {
            let mut all = self.overdrafts.lock().unwrap();
            let (mine, rest) = all.drain(..).partition(|(p, _, _)| p == part);
            *all = rest;
            mine
        };
        let mut by_account: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (_, account, line) in held {
            by_account.entry(account).or_default().push(line);
        }
        for (account, lines) in by_account {
            if overdrawn_at_rest.contains(&account) {
                eprintln!(
                    "{part}: {account} still overdrawn at rest (a violation of its own): {} sightings, first: {}",
                    lines.len(),
                    lines[0]
                );
            } else {
                self.overdrafts_from_conflicts
                    .fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "{part}: {account} overdrawn for a moment, taken back by the ledger: {} sightings, first: {}",
                    lines.len(),
                    lines[0]
                );
            }
        }
    }

    /// An account below its minimum at rest: whatever the copies, a violation (the transfers
    /// that ended `done` overdraw it).
    fn overdrawn_at_rest(&self, part: &str, account: &str, line: String) {
        self.overdrawn_at_rest
            .lock()
            .unwrap()
            .insert((part.to_owned(), account.to_owned()));
        self.violation(line);
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
        if std::env::var("RELIABILITY_ERRORS").is_ok() {
            eprintln!("ERROR {part}:{kind}: {e}");
        }
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

/// One step of the transfer graph (docs/PROTOCOL.md), written out here rather than taken from the
/// library.
fn edge(from: State, to: State) -> bool {
    use State::*;
    matches!(
        (from, to),
        (Initial, Pending)
            | (Initial, Cancelled)
            | (Pending, Committed)
            | (Pending, Canceling)
            | (Committed, Done)
            | (Canceling, Cancelled)
    )
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
        let path = format!(
            "_all_docs?include_docs=true&limit=1000&skip={skip}&startkey={}&endkey={}",
            urlencode(&json!(from).to_string()),
            urlencode(&json!(end).to_string())
        );
        let body: Value = raw_db_get(db, &path)
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

/// Databases that live on a trio (R1 and R2 on the replicating setup): name → (the node raw
/// reads go to — after the trio converged, all three hold the same —, the proxy's URL, which
/// the program is run against).
static TRIO_DBS: Mutex<BTreeMap<String, (String, String)>> = Mutex::new(BTreeMap::new());

/// A trio part's name ends with `_trio`.
fn is_trio_part(part: &str) -> bool {
    part.ends_with("_trio")
}

fn trio_db(db: &str) -> Option<(String, String)> {
    TRIO_DBS.lock().unwrap().get(db).cloned()
}

/// A raw GET of `path` (what follows the database's name) in `db`, wherever `db` lives.
fn raw_db_get(db: &str, path: &str) -> reqwest::RequestBuilder {
    match trio_db(db) {
        Some((node, _)) => support::raw().get(format!("{node}/{db}/{path}")),
        None => support::auth(support::raw().get(support::raw_url(&format!("{db}/{path}")))),
    }
}

async fn raw_accounts(db: &str) -> Vec<Value> {
    raw_docs(db, "account:", "account:\u{fff0}").await
}

async fn raw_transfers(db: &str) -> Vec<Value> {
    raw_docs(db, "txn:", "txn:\u{fff0}").await
}

/// Where a part's documents live: orders in `db` (the ledger's database, validated), accounts
/// and transfers in `hot` — `db` itself on the single layout, a second database without
/// validation on the split layout (`Ledger::with_hot_database`). Raw reads of accounts and
/// transfers go to `hot`, of orders to `db`.
#[derive(Debug, Clone)]
struct Dbs {
    db: String,
    hot: String,
}

impl Dbs {
    /// The databases of `l`.
    fn of(l: &Ledger) -> Dbs {
        let dbs = Dbs {
            db: l.client().database().to_owned(),
            hot: l.hot_client().database().to_owned(),
        };
        assert_eq!(
            l.hot_database(),
            dbs.split().then_some(dbs.hot.as_str()),
            "the ledger's hot_database() and hot_client() disagree"
        );
        dbs
    }

    fn split(&self) -> bool {
        self.hot != self.db
    }

    fn layout(&self) -> &'static str {
        if self.split() {
            "split"
        } else {
            "single"
        }
    }

    /// The program's options for this layout, after `--db`: `--hot-db <hot>` when split.
    fn cli_args(&self) -> Vec<String> {
        if self.split() {
            vec!["--hot-db".to_owned(), self.hot.clone()]
        } else {
            Vec::new()
        }
    }
}

impl std::fmt::Display for Dbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.split() {
            write!(f, "{} (accounts and transfers in {})", self.db, self.hot)
        } else {
            write!(f, "{}", self.db)
        }
    }
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
                "{part}: the ledger on {} did not come to rest within {deadline:?}: {status:?}",
                Dbs::of(l)
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The library's auditor, strict (at rest): every failing check is a violation.
async fn audit(part: &str, l: &Ledger, tally: &Tally) {
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    let dbs = Dbs::of(l);
    for c in &report.checks {
        if c.ok {
            continue;
        }
        let line = format!("{part}: audit {} on {dbs}: {}", c.name, c.detail);
        if c.name == "no_overdraft" && !c.documents.is_empty() {
            for account in &c.documents {
                tally.overdrawn_at_rest(part, account, line.clone());
            }
        } else {
            tally.violation(line);
        }
    }
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    eprintln!(
        "{part}: audit at rest of {dbs} ok={} ({})",
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
    dbs: &Dbs,
    book: &Book,
    tally: &Tally,
    poison: &[&str],
) -> u64 {
    // Accounts and transfers are read (and named in every line) in the database that holds
    // them; orders in the ledger's.
    let at = dbs.hot.as_str();
    if dbs.split() {
        // On the split layout the ledger's database holds no account and no transfer.
        let (a, t) = (raw_accounts(&dbs.db).await, raw_transfers(&dbs.db).await);
        if !a.is_empty() || !t.is_empty() {
            tally.violation(format!(
                "{part}: {} holds {} accounts and {} transfers (first {:?}), which belong in {at}",
                dbs.db,
                a.len(),
                t.len(),
                a.iter().chain(&t).next().map(|d| d["_id"].clone())
            ));
        }
    }
    let accounts = raw_accounts(at).await;
    let transfers: Vec<Value> = raw_transfers(at)
        .await
        .into_iter()
        .filter(|t| !poison.contains(&t["_id"].as_str().unwrap_or("")))
        .collect();
    let mut moved: HashMap<String, i128> = HashMap::new();
    let mut states: HashMap<String, State> = HashMap::new();
    let asked = book.asked.lock().unwrap().clone();
    let cancels = book.cancels.lock().unwrap().clone();
    let mut later_attempts: Vec<(String, String)> = Vec::new();
    for t in &transfers {
        let id = t["txn_id"].as_str().unwrap_or_default().to_owned();
        let Some(state) = t["state"].as_str().and_then(State::parse) else {
            tally.violation(format!(
                "{part}: {at}/{} has state {}",
                t["_id"], t["state"]
            ));
            continue;
        };
        states.insert(id.clone(), state);
        if !state.is_terminal() {
            tally.violation(format!("{part}: {at}/txn:{id} is still {state} at rest"));
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
        // A reversal that was cancelled is tried again under `rev2-X`, `rev3-X`…: each
        // with the terms of the reversal asked for, and only after the one before it was
        // cancelled (checked below, once every state is known).
        let retried = retried_reversal(&id);
        if let Some((_, previous)) = &retried {
            later_attempts.push((id.clone(), previous.clone()));
        }
        let asked_terms = asked.get(&id).or_else(|| {
            retried
                .as_ref()
                .and_then(|(first, _)| asked.get(first.as_str()))
        });
        match asked_terms {
            None => tally.violation(format!(
                "{part}: {at}/txn:{id} exists but was never asked for"
            )),
            Some(terms) => {
                let found = Terms {
                    source: src,
                    destination: dst,
                    value,
                    currency: t["currency"].as_str().unwrap_or("").to_owned(),
                    reverses: t["reverses"].as_str().map(str::to_owned),
                };
                if *terms != found {
                    tally.violation(format!(
                        "{part}: {at}/txn:{id} holds {found:?}, asked {terms:?}"
                    ));
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
                tally.violation(format!(
                    "{part}: {at}/txn:{id} cancelled with reason {reason:?}"
                ));
            }
            if reason == "cancelled_by_user" && !cancels.contains(&id) {
                tally.violation(format!(
                    "{part}: {at}/txn:{id} cancelled by a user nobody was"
                ));
            }
        }
    }
    // A later attempt at a reversal only after the one before it was cancelled.
    for (id, previous) in &later_attempts {
        if states.get(previous) != Some(&State::Cancelled) {
            tally.violation(format!(
                "{part}: {at}/txn:{id} exists, but the attempt before it, {previous}, is {:?}",
                states.get(previous)
            ));
        }
    }
    // Reversals only of committed or done transfers.
    for (id, state) in &states {
        if let Some(original) = id.strip_prefix("rev-") {
            if !matches!(states.get(original), Some(State::Done | State::Committed)) {
                tally.violation(format!(
                    "{part}: {at}/txn:{id} ({state}) reverses {original}, which is {:?}",
                    states.get(original)
                ));
            }
        }
    }
    // Acknowledged states: reached or passed.
    for (id, acks) in book.acked.lock().unwrap().iter() {
        match states.get(id) {
            None => tally.violation(format!(
                "{part}: {at}/txn:{id} was acknowledged ({acks:?}) and is gone"
            )),
            Some(&fin) => {
                for &a in acks {
                    if !reachable(a, fin) {
                        tally.violation(format!(
                            "{part}: {at}/txn:{id} was acknowledged {a}, and is {fin} now"
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
                "{part}: {at}/account:{id} balance {balance} ≠ opening {opening} + done transfers = {expected}"
            ));
        }
        if a["pending"].as_array().is_some_and(|p| !p.is_empty()) {
            tally.violation(format!(
                "{part}: {at}/account:{id} holds pending markers at rest: {}",
                a["pending"]
            ));
        }
        if let Some(min) = a["min_balance"].as_i64() {
            if balance < i128::from(min) {
                tally.overdrawn_at_rest(
                    part,
                    &format!("account:{id}"),
                    format!("{part}: {at}/account:{id} balance {balance} below its minimum {min}"),
                );
            }
        }
    }
    for (account, m) in moved {
        if m != 0 {
            tally.violation(format!(
                "{part}: done transfers move {m} on {at}/account:{account}, which does not exist"
            ));
        }
    }
    for (currency, (opening, balance)) in &per_currency {
        if opening != balance {
            tally.violation(format!(
                "{part}: {at}: {currency}: Σ balance {balance} ≠ Σ opening {opening}"
            ));
        }
    }
    // Acknowledged order-ledger entries are there, as written.
    let entries = book.entries.lock().unwrap().clone();
    for (id, fields) in entries {
        let doc: Value = raw_db_get(&dbs.db, &urlencode(&id))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for (k, v) in fields.as_object().unwrap() {
            if doc[k] != *v {
                tally.violation(format!(
                    "{part}: {}/{id} was acknowledged with {k} = {v}, holds {}",
                    dbs.db, doc[k]
                ));
            }
        }
    }
    let done = states.values().filter(|s| **s == State::Done).count();
    let cancelled = states.values().filter(|s| **s == State::Cancelled).count();
    eprintln!(
        "{part}: independent check of {} accounts and {} transfers in {at} ({done} done, {cancelled} cancelled), {} acknowledged",
        accounts.len(),
        transfers.len(),
        book.acked.lock().unwrap().len()
    );
    transfers.len() as u64
}

/// Reads every account raw every `period` until `stop`, checking that no limited account is
/// ever below its minimum, in balance or in available (invariant 3 of docs/PROTOCOL.md, "at every moment"). `db` is
/// the database holding the accounts (the hot one on the split layout).
fn spawn_overdraft_monitor(
    part: &'static str,
    db: String,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let several_copies = is_trio_part(part) || support::copies(&db).await > 1;
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
                    let id = a["_id"].as_str().unwrap_or("?");
                    tally.moment_below_minimum(
                        part,
                        id,
                        format!(
                            "{part}: {db}/{id} overdrawn at a moment: balance {balance}, available {}, min {min}",
                            balance - credits
                        ),
                        several_copies,
                    );
                }
            }
            samples += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        samples
    })
}

/// For `rev{n}-X` (n ≥ 2, a reversal tried again after the one before it was cancelled): the
/// first attempt's id `rev-X` (whose terms were asked for) and the previous attempt's id.
fn retried_reversal(id: &str) -> Option<(String, String)> {
    let (head, original) = id.split_once('-')?;
    let n: u32 = head.strip_prefix("rev")?.parse().ok()?;
    if n < 2 {
        return None;
    }
    let previous = if n == 2 {
        format!("rev-{original}")
    } else {
        format!("rev{}-{original}", n - 1)
    };
    Some((format!("rev-{original}"), previous))
}

/// While set (during `r1_trio`), the ledgers made here write accounts with the server's default
/// quorum (`WriteQuorum::ServerDefault`): account conflicts then happen on the trio and are
/// merged, while transfer documents keep their exclusive writes. `r2_trio` runs the program's
/// default, `WriteQuorum::All`. (R1's workers are made with [`another`] from the part's ledger,
/// which `part_ledger` makes with this quorum; `another_worker` keeps it.)
static ACCOUNTS_AT_DEFAULT_QUORUM: AtomicBool = AtomicBool::new(false);

/// A new worker on a client's database, on the single layout: for R3, R4 and R5, which run
/// only that layout (R4's workers reach the server through its fault proxy). R1 and R2 use
/// [`another`], which keeps their layout.
fn fresh_ledger(client: &Client, lease: Duration) -> Ledger {
    let l = Ledger::new(client.clone()).with_lease(lease).unwrap();
    if ACCOUNTS_AT_DEFAULT_QUORUM.load(Ordering::Relaxed) {
        l.with_write_quorum(WriteQuorum::ServerDefault)
    } else {
        l
    }
}

/// A new worker (as if another process opened the ledger) on `like`'s databases — on the
/// split layout too — with `lease`.
fn another(like: &Ledger, lease: Duration) -> Ledger {
    let l = like.another_worker().with_lease(lease).unwrap();
    assert_eq!(l.hot_database(), like.hot_database());
    l
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
                limit: 100,
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

/// R1's workers wait while more transfers than this are open (left for the sweepers).
const OPEN_BACKLOG_MAX: u64 = 150;

/// Probability (percent) with which each fail point fires in R1. The points on rarer paths
/// (cancellation, orphan repair) fire more often so that every one is hit at the long size.
fn fail_percent(point: &str) -> u32 {
    match point {
        "txn-after-canceling" | "txn-after-undo" => 12,
        "sweeper-after-takeover" => 6,
        "sweeper-after-repair" => 60,
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
            (930..970, _) if late_ok => {
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
async fn run_op(
    part: &'static str,
    op: Op,
    l: Ledger,
    twin: Ledger,
    book: Arc<Book>,
    tally: Arc<Tally>,
) -> bool {
    let crashed = |r: &Result<TransferOutcome, Error>| matches!(r, Err(e) if crash_point(&e.to_string()).is_some());
    let book_result = |r: &Result<TransferOutcome, Error>| match r {
        Ok(o) => {
            if l.finishes_in_background() && o.state == State::Committed {
                tally.background.fetch_add(1, Ordering::Relaxed);
            }
            book.ack(o)
        }
        Err(e) => tally.error(part, e),
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

/// One R1 round in a database of its own: load until `target` new transfers were asked for (or
/// `until` passes), then rest, audit and check. Returns the transfer documents found afterwards
/// (reversals included) and the new transfers asked for. With `trio`, the database is on the
/// replicating trio and every ledger works through its proxy (`part` is then `r1_trio`). With
/// `split`, on the split layout: accounts and transfers in a second database (not on the trio).
#[allow(clippy::too_many_arguments)]
async fn r1_round(
    size: Size,
    seed: u64,
    round: u64,
    target: u64,
    until: Instant,
    tally: Arc<Tally>,
    trio: Option<&Trio>,
    part: &'static str,
    split: bool,
) -> (u64, u64) {
    let started = Instant::now();
    let violations_before = tally.violations();
    let lease = Duration::from_millis(1_000);
    let stale_after = Duration::from_millis(250);
    // Every ledger of the round is made from `base` (`another`), so has its layout; raw reads
    // of accounts and transfers go to `dbs.hot`.
    let base = part_ledger(trio, &format!("{part}_{round}"), split).await;
    let dbs = Dbs::of(&base);
    assert_eq!(dbs.split(), split, "{part} round {round}: layout");
    eprintln!("{part} round {round}: {} layout, on {dbs}", dbs.layout());
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
    let observer = match trio {
        Some(trio) => Some(trio_ready(part, trio, &dbs.db, &tally).await),
        None => None,
    };

    let book = Arc::new(Book::default());
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = spawn_overdraft_monitor(part, dbs.hot.clone(), tally.clone(), stop.clone());
    let sweepers: Vec<_> = (0..3)
        .map(|i| {
            spawn_sweeper(
                part,
                another(&base, lease),
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
    let make = {
        let base = base.clone();
        move || another(&base, lease).with_pause_hook(hook.clone())
    };
    let enough = {
        let asked_new = asked_new.clone();
        move || asked_new.load(Ordering::Relaxed) >= target || Instant::now() > until
    };
    // Open transfers, as the by_state view (of the database of transfers) counts them,
    // refreshed every 500 ms.
    let open = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (open, stop, client) = (open.clone(), stop.clone(), base.hot_client().clone());
        tokio::spawn(async move {
            let q = couch_ledger::ViewQuery {
                group_level: Some(1),
                ..Default::default()
            };
            while !stop.load(Ordering::Relaxed) {
                if let Ok(r) = client.view("transactions", "by_state", &q).await {
                    let n: u64 = r
                        .rows
                        .iter()
                        .filter(|row| !matches!(row.key[0].as_str(), Some("done" | "cancelled")))
                        .filter_map(|row| row.value.as_u64())
                        .sum();
                    open.store(n, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let mut workers = JoinSet::new();
    for w in 0..8 {
        let open = open.clone();
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
            // Odd workers answer at the commit and finish in the background; every ledger they
            // made is flushed before the round rests (a restarted "process" keeps finishing
            // what it had, like one that stopped late).
            let background = w % 2 == 1;
            let make = move || {
                let l = make();
                if background {
                    l.with_background_finish()
                } else {
                    l
                }
            };
            let mut ledger = make();
            let mut made = vec![ledger.clone()];
            let twin = make();
            made.push(twin.clone());
            let mut inflight = JoinSet::new();
            let mut restarts = 0u64;
            loop {
                while inflight.len() < 4 && !enough() {
                    // Back-pressure: work abandoned for the sweepers (crashes, --no-wait, lost
                    // leases) must not pile up faster than they finish it, or the orphan
                    // markers they must find drown under the markers of stuck transfers.
                    if open.load(Ordering::Relaxed) > OPEN_BACKLOG_MAX {
                        if inflight.is_empty() {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                        break;
                    }
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
                        part,
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
                            ledger = make();
                            made.push(ledger.clone());
                            restarts += 1;
                        }
                    }
                    Some(Ok(false)) => {}
                    Some(Err(e)) => tally.violation(format!("{part}: a worker task panicked: {e}")),
                    None => break,
                }
            }
            for l in made {
                l.flush().await;
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
    watcher.await.unwrap();

    // The rest sweep drives everything left under a lease long enough not to lose it to a slow
    // server (correctness never depends on the lease; progress does).
    let rest = another(&base, Duration::from_secs(10));
    let n = match (trio, observer) {
        (Some(trio), Some(observer)) => {
            trio_rest_and_check(part, trio, &dbs.db, &rest, &book, &tally, observer).await
        }
        _ => {
            sweep_to_rest(part, &rest, &tally, 0, Duration::from_secs(300)).await;
            audit(part, &rest, &tally).await;
            let n = independent_check(part, &dbs, &book, &tally, &[]).await;
            tally.settle_overdrafts(part);
            n
        }
    };
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    let asked = asked_new.load(Ordering::Relaxed);
    let clean = tally.violations() == violations_before;
    if split {
        tally.split_rounds.fetch_add(1, Ordering::Relaxed);
    }
    eprintln!(
        "{part} round {round} ({} layout): {n} transfer documents for {asked} new transfers asked, load {load_time:?} (+ rest and audit: {:?} in all); worker process restarts {process_restarts}; sweepers (passes, finished, orphan markers repaired) {sweeper_summary:?}; overdraft samples {samples}",
        dbs.layout(),
        started.elapsed()
    );
    if trio.is_some() {
        // The trio's nodes (and their data) go when the part drops it.
    } else if clean {
        // A clean round's databases are dropped so the server stays small for the next one; a
        // round with violations keeps them for inspection.
        let mut clients = vec![base.client()];
        if dbs.split() {
            clients.push(base.hot_client());
        }
        for c in clients {
            if let Err(e) = c.delete_database().await {
                eprintln!(
                    "{part} round {round}: could not delete {}: {e}",
                    c.database()
                );
            }
        }
    } else {
        eprintln!("{part} round {round}: violations; databases {dbs} kept for inspection");
    }
    (n, asked)
}

/// New transfers per R1 round at most. Each round has a database of its own: one database
/// holding the whole long size grows views and hot account documents until the sweepers fall
/// behind (see RELIABILITY.md), which is a limit of the test server, not of the protocol.
const R1_ROUND_TRANSFERS: u64 = 2_000;

/// R1: rounds until `size.r1_transfers` new transfers were asked for and as many transfer
/// documents exist, and (long size) every fail point fired `size.r1_hits_per_point` times,
/// within `size.r1_time_max`. Even rounds run the single layout, odd rounds the split one
/// (accounts and transfers in a second database); a round takes at most half the transfers, so
/// that every size runs both.
async fn r1(size: Size, seed: u64, tally: Arc<Tally>) {
    let started = Instant::now();
    let until = started + size.r1_time_max;
    let round_max = R1_ROUND_TRANSFERS.min(size.r1_transfers.div_ceil(2).max(200));
    let (mut transfers, mut asked, mut round) = (0u64, 0u64, 0u64);
    let mut split_rounds = 0u64;
    loop {
        let points_short = FAIL_POINTS
            .iter()
            .any(|p| tally.crash_count(p) < size.r1_hits_per_point);
        let missing = size.r1_transfers.saturating_sub(transfers.min(asked));
        if (missing == 0 && !points_short) || Instant::now() > until {
            break;
        }
        // What is still missing, in rounds of at most R1_ROUND_TRANSFERS; a full round more
        // when only fail-point hits are missing.
        let target = match missing {
            0 => round_max,
            missing => missing.clamp(200, round_max),
        };
        let round_seed = seed ^ round.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let split = round % 2 == 1;
        let (documents, asked_here) = r1_round(
            size,
            round_seed,
            round,
            target,
            until,
            tally.clone(),
            None,
            "r1",
            split,
        )
        .await;
        transfers += documents;
        asked += asked_here;
        round += 1;
        split_rounds += u64::from(split);
        let crashes = tally.crashes.lock().unwrap().clone();
        eprintln!(
            "r1: after {round} round(s) ({split_rounds} split), {transfers} transfer documents ({asked} new transfers asked) at {:?}; crashes by fail point {crashes:?}",
            started.elapsed()
        );
    }
    if split_rounds == 0 {
        tally.violation(format!(
            "r1: no round ran on the split layout ({round} round(s) in {:?})",
            started.elapsed()
        ));
    }
    if tally.background.load(Ordering::Relaxed) == 0 {
        tally.violation(
            "r1: no submit was answered at the commit by a worker finishing in the background",
        );
    }
    if transfers.min(asked) < size.r1_transfers {
        tally.violation(format!(
            "r1: {transfers} transfer documents and {asked} new transfers asked, fewer than {}",
            size.r1_transfers
        ));
    }
    if size.long {
        for p in FAIL_POINTS {
            let hits = tally.crash_count(p);
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
        _ => ["r1", "r1_trio", "r2", "r2_trio", "r3", "r4", "r5", "r6"]
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
    if run("r1_trio") {
        r1_trio(size, seed, tally.clone()).await;
        eprintln!("r1_trio finished at {:?}", started.elapsed());
    }
    scenario.teardown();
    if run("r2") {
        r2(size, seed, tally.clone(), None, "r2", true).await;
        eprintln!("r2 finished at {:?}", started.elapsed());
    }
    if run("r2_trio") {
        let trio = Trio::start_with(Balance::PerConnection).await;
        r2(size, seed, tally.clone(), Some(&trio), "r2_trio", false).await;
        eprintln!("r2_trio finished at {:?}", started.elapsed());
    }
    if run("r3") {
        r3(size, seed, tally.clone()).await;
        eprintln!("r3 finished at {:?}", started.elapsed());
    }
    if run("r4") {
        r4(size, seed, tally.clone()).await;
        eprintln!("r4 finished at {:?}", started.elapsed());
    }
    if run("r5") {
        r5(tally.clone()).await;
        eprintln!("r5 finished at {:?}", started.elapsed());
    }
    if run("r6") {
        let refused = r6(seed, tally.clone(), &logs).await;
        tally.bad_inputs.fetch_add(refused, Ordering::Relaxed);
        eprintln!("r6 finished at {:?}", started.elapsed());
    }

    let crashes = tally.crashes.lock().unwrap().clone();
    let errors = tally.errors.lock().unwrap().clone();
    eprintln!("typed errors returned, by part and kind: {errors:?}");
    eprintln!(
        "logs captured: {} bytes; run took {:?}",
        logs.0.lock().unwrap().len(),
        started.elapsed()
    );
    // For a person chasing a failure: the library's log lines of the whole run.
    if let Ok(path) = std::env::var("RELIABILITY_LOG_FILE") {
        if let Err(e) = std::fs::write(&path, &*logs.0.lock().unwrap()) {
            eprintln!("could not write the logs to {path}: {e}");
        }
    }
    let violations = tally.violations();
    let line = format!(
        "RELIABILITY transfers={} crash_points={} crashes={} kills={} server_restarts={} faults={} bad_inputs={} conflicts_met={} conflicts_resolved={} overdrafts_from_conflicts={} violations={} split_rounds={} background={}",
        tally.transfers.load(Ordering::Relaxed),
        crashes.values().filter(|n| **n > 0).count(),
        crashes.values().sum::<u64>(),
        tally.kills.load(Ordering::Relaxed),
        tally.restarts.load(Ordering::Relaxed),
        tally.faults.load(Ordering::Relaxed),
        tally.bad_inputs.load(Ordering::Relaxed),
        tally.conflicts_met.load(Ordering::Relaxed),
        tally.conflicts_resolved.load(Ordering::Relaxed),
        tally.overdrafts_from_conflicts.load(Ordering::Relaxed),
        violations,
        tally.split_rounds.load(Ordering::Relaxed),
        tally.background.load(Ordering::Relaxed),
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

// ---- R1 and R2 on the replicating trio ---------------------------------------------------------
//
// Three pouchdb-server nodes replicating continuously to each other behind a round-robin proxy
// (tests/support/trio.rs): a `_rev` compare-and-swap through two nodes can succeed twice and
// leave a conflict, as on a CouchDB cluster. R1's and R2's workloads run through the proxy; at
// the end the harness waits for the nodes to converge and the sweeper to resolve what
// conflicted, then checks the invariants on node 0 (all three then hold the same).

/// A ledger on a fresh database: on the harness's server (with `split`, on the split layout:
/// accounts and transfers in a second database, `<db>_hot`), or created on the trio's three
/// nodes (replicating) and used through its proxy (single layout only).
async fn part_ledger(trio: Option<&Trio>, name: &str, split: bool) -> Ledger {
    let Some(trio) = trio else {
        return if split {
            support::split_ledger(name).await
        } else {
            support::ledger(name).await
        };
    };
    assert!(
        !split,
        "{name}: the trio parts run the single layout (their convergence and conflict checks \
         watch one database)"
    );
    let db = support::db_name(name);
    trio.database(&db).await;
    TRIO_DBS
        .lock()
        .unwrap()
        .insert(db.clone(), (trio.node(0), trio.url()));
    let l = Ledger::new(
        Client::builder()
            .url(trio.url())
            .database(&db)
            .request_timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    l.init().await.expect("init through the trio's proxy");
    if ACCOUNTS_AT_DEFAULT_QUORUM.load(Ordering::Relaxed) {
        l.with_write_quorum(WriteQuorum::ServerDefault)
    } else {
        l
    }
}

/// Conflicted documents seen on the trio's nodes: id → the conflicting revisions seen.
#[derive(Default)]
struct ConflictLog(Mutex<BTreeMap<String, BTreeSet<String>>>);

impl ConflictLog {
    fn record(&self, conflicted: &[(String, Vec<String>)]) {
        let mut seen = self.0.lock().unwrap();
        for (id, revs) in conflicted {
            seen.entry(id.clone())
                .or_default()
                .extend(revs.iter().cloned());
        }
    }
}

/// The conflict observer of a trio part: polls every node while the part runs.
struct Observer {
    log: Arc<ConflictLog>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

/// The documents of `db` on `node` that hold `_conflicts`, with them; `None` when the node did
/// not answer.
async fn node_conflicts(node: &str, db: &str) -> Option<Vec<(String, Vec<String>)>> {
    let all = support::trio::get_json(&format!(
        "{node}/{db}/_all_docs?include_docs=true&conflicts=true"
    ))
    .await?;
    Some(
        all["rows"]
            .as_array()?
            .iter()
            .filter_map(|row| {
                let revs: Vec<String> = row["doc"]["_conflicts"]
                    .as_array()?
                    .iter()
                    .filter_map(|r| r.as_str().map(str::to_owned))
                    .collect();
                (!revs.is_empty()).then(|| (row["id"].as_str().unwrap_or("?").to_owned(), revs))
            })
            .collect(),
    )
}

/// After a trio part's setup: waits until the three nodes hold the design documents and the
/// accounts (a worker whose connection reaches a node without them would see an unknown
/// account), then starts the conflict observer.
async fn trio_ready(part: &'static str, trio: &Trio, db: &str, tally: &Tally) -> Observer {
    if converged(trio, db, Duration::from_secs(120))
        .await
        .is_none()
    {
        tally.violation(format!("{part}: the trio did not converge after the setup"));
    }
    let log = Arc::new(ConflictLog::default());
    let stop = Arc::new(AtomicBool::new(false));
    let task = {
        let (log, stop, nodes, db) = (log.clone(), stop.clone(), trio.node_urls(), db.to_owned());
        tokio::spawn(async move {
            let mut polls = 0;
            while !stop.load(Ordering::Relaxed) {
                for node in &nodes {
                    if let Some(c) = node_conflicts(node, &db).await {
                        log.record(&c);
                    }
                }
                polls += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            polls
        })
    };
    Observer { log, stop, task }
}

/// Waits until the three nodes hold the same documents at the same revisions (winners and
/// conflicts) and `doc_count`, within `deadline`; the common state, or `None`.
async fn converged(trio: &Trio, db: &str, deadline: Duration) -> Option<support::trio::NodeState> {
    let started = Instant::now();
    loop {
        if let Some(first) = trio.node_state(0, db).await {
            let mut same = true;
            for i in 1..3 {
                if trio.node_state(i, db).await.as_ref() != Some(&first) {
                    same = false;
                    break;
                }
            }
            if same {
                return Some(first);
            }
        }
        if started.elapsed() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sweep passes at rest (nothing open, no marker) that leave the same documents conflicted
/// before a trio part stops waiting for the sweeper to resolve them.
const STUCK_PASSES: u32 = 10;

/// The end of a trio part: until nothing is open, no marker is pending and no document holds a
/// conflict on converged nodes, sweep (through the proxy) and wait for the nodes to converge;
/// then count the conflicts met and resolved, audit and check on node 0, and judge the
/// overdrafts seen. Returns the transfer documents found.
async fn trio_rest_and_check(
    part: &'static str,
    trio: &Trio,
    db: &str,
    rest: &Ledger,
    book: &Book,
    tally: &Tally,
    observer: Observer,
) -> u64 {
    let started = Instant::now();
    let deadline = Duration::from_secs(240);
    let now = SweepOptions {
        limit: 1_000,
        stale_after: Duration::ZERO,
    };
    let mut passes = 0u64;
    // At rest but with the same conflicts pass after pass: the sweeper does not resolve them.
    let mut stuck: (BTreeSet<String>, u32) = (BTreeSet::new(), 0);
    let left: BTreeMap<String, Vec<String>> = loop {
        let Some(state) = converged(trio, db, Duration::from_secs(120)).await else {
            tally.violation(format!("{part}: the trio did not converge within 120 s"));
            break node_conflicts(&trio.node(0), db)
                .await
                .unwrap_or_default()
                .into_iter()
                .collect();
        };
        let conflicted: Vec<(String, Vec<String>)> = state
            .docs
            .iter()
            .filter(|(_, _, c)| !c.is_empty())
            .map(|(id, _, c)| (id.clone(), c.clone()))
            .collect();
        observer.log.record(&conflicted);
        let status = rest.status().await;
        let at_rest = matches!(&status, Ok(s) if s.states.open() == 0 && s.pending_markers == 0);
        if at_rest && conflicted.is_empty() {
            break BTreeMap::new();
        }
        let ids: BTreeSet<String> = conflicted.iter().map(|(id, _)| id.clone()).collect();
        if at_rest && ids == stuck.0 {
            stuck.1 += 1;
        } else {
            stuck = (ids, 0);
        }
        if stuck.1 >= STUCK_PASSES {
            tally.violation(format!(
                "{part}: at rest, but {} documents stay conflicted through {STUCK_PASSES} sweep passes: {:?}",
                conflicted.len(),
                conflicted.iter().map(|(id, _)| id.as_str()).take(10).collect::<Vec<_>>()
            ));
            break conflicted.into_iter().collect();
        }
        if started.elapsed() > deadline {
            tally.violation(format!(
                "{part}: not at rest within {deadline:?} after {passes} sweep passes: {} documents still conflicted ({:?}), status {status:?}",
                conflicted.len(),
                conflicted.iter().map(|(id, _)| id.as_str()).take(10).collect::<Vec<_>>()
            ));
            break conflicted.into_iter().collect();
        }
        match rest.sweep_once(now.clone()).await {
            Ok(o) => tally.problems(part, &o.problems),
            Err(e) => tally.error(part, &e),
        }
        passes += 1;
    };
    observer.stop.store(true, Ordering::Relaxed);
    let polls = observer.task.await.unwrap_or(0);
    let seen = observer.log.0.lock().unwrap().clone();
    let resolved: BTreeSet<String> = seen
        .keys()
        .filter(|id| !left.contains_key(*id))
        .cloned()
        .collect();
    tally
        .conflicts_met
        .fetch_add(seen.len() as u64, Ordering::Relaxed);
    tally
        .conflicts_resolved
        .fetch_add(resolved.len() as u64, Ordering::Relaxed);
    eprintln!(
        "{part}: conflicts met on the trio's nodes ({polls} polls): {} documents, {} conflicting revisions; resolved {}; left {:?}; {passes} rest sweep passes in {:?}",
        seen.len(),
        seen.values().map(BTreeSet::len).sum::<usize>(),
        resolved.len(),
        left.keys().take(20).collect::<Vec<_>>(),
        started.elapsed()
    );
    let on_node = Ledger::new(
        Client::builder()
            .url(trio.node(0))
            .database(db)
            .request_timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    audit(part, &on_node, tally).await;
    // The trio parts run the single layout (`part_ledger`): everything is in `db`.
    let n = independent_check(part, &Dbs::of(&on_node), book, tally, &[]).await;
    tally.settle_overdrafts(part);
    n
}

/// R1 on the trio: a round of R1's workload (crashes at fail points, retries, races, cancels,
/// reversals, late workers, three sweepers), every ledger through the proxy; a short one more
/// when killed workers left fewer transfer documents than asked.
async fn r1_trio(size: Size, seed: u64, tally: Arc<Tally>) {
    let trio = Trio::start_with(Balance::PerConnection).await;
    ACCOUNTS_AT_DEFAULT_QUORUM.store(true, Ordering::Relaxed);
    let target = size.trio_r1_transfers;
    let until = Instant::now() + size.trio_r1_time_max;
    // A worker killed before its first write leaves nothing (on the one-write path the
    // transfer's document is its last write): a short round tops the count up, as r1 does.
    let (mut documents, mut asked, mut round) = (0u64, 0u64, 0u64);
    loop {
        let missing = target.saturating_sub(documents.min(asked));
        if missing == 0 || Instant::now() > until {
            break;
        }
        let (documents_here, asked_here) = r1_round(
            size,
            seed ^ 0x7e10_7e10 ^ round.wrapping_mul(0x2545_f491_4f6c_dd1d),
            round,
            if round == 0 { missing } else { missing.max(20) },
            until,
            tally.clone(),
            Some(&trio),
            "r1_trio",
            false,
        )
        .await;
        documents += documents_here;
        asked += asked_here;
        round += 1;
    }
    if documents.min(asked) < target {
        tally.violation(format!(
            "r1_trio: {documents} transfer documents and {asked} new transfers asked, fewer than {target}"
        ));
    }
    let used: Vec<usize> = trio
        .forwarded
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .collect();
    eprintln!("r1_trio: requests per node {used:?}");
    ACCOUNTS_AT_DEFAULT_QUORUM.store(false, Ordering::Relaxed);
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
                let ok = if n.is_multiple_of(5) {
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
    let n = independent_check("r3", &Dbs::of(&base), &book, &tally, &[]).await;
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

// ---- R4: network faults ----------------------------------------------------------------------

async fn r4(size: Size, seed: u64, tally: Arc<Tally>) {
    let started = Instant::now();
    let server = support::server();
    let upstream = url::Url::parse(&server.url).ok().and_then(|u| {
        let host = u.host_str()?.to_owned();
        let port = u.port_or_known_default()?;
        // The loopback address that answers: `localhost` may resolve to ::1 first while the
        // server (docker-compose publishes on 127.0.0.1) listens on IPv4 only.
        std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
            .ok()?
            .filter(|a| a.ip().is_loopback())
            .find(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(2)).is_ok())
    });
    let Some(upstream) = upstream else {
        eprintln!("r4: SKIPPED — the test server is not on loopback, and the fault proxy only targets loopback");
        return;
    };
    let lease = Duration::from_secs(2);
    let base = support::ledger("r4").await;
    let direct = base.client().clone();
    let db = direct.database().to_owned();
    let accounts: Vec<Acct> = (0..8)
        .map(|i| Acct {
            id: format!("n{i}"),
            currency: eur(),
            opening: 50_000,
            min: Some(0),
        })
        .collect();
    create_accounts(&base, &accounts).await;

    let faults = support::proxy::HttpFaults {
        refuse_permille: 20,
        unavailable_permille: 20,
        too_many_permille: 10,
        reset_after_send_permille: 25,
        garbage_after_send_permille: 10,
        drop_after_send_permille: 3,
        delay_permille: 30,
        delay_ms: 300,
    };
    let proxy = support::proxy::FaultProxy::start_http(upstream, faults, seed ^ 0x44).await;
    let through_proxy = || {
        let mut b = Client::builder()
            .url(proxy.url())
            .database(&db)
            .request_timeout(Duration::from_secs(2))
            .retry(RetryPolicy {
                retries_max: 6,
                delay_base: Duration::from_millis(20),
                delay_max: Duration::from_millis(500),
                retry_after_max: Duration::from_secs(2),
            });
        if let Some(user) = &server.user {
            b = b.basic_auth(user, server.password.clone().unwrap_or_default());
        }
        b.build().unwrap()
    };

    let book = Arc::new(Book::default());
    let stop = Arc::new(AtomicBool::new(false));
    let sweepers: Vec<_> = (0..2)
        .map(|i| {
            spawn_sweeper(
                "r4",
                fresh_ledger(&through_proxy(), lease),
                Duration::from_millis(500),
                tally.clone(),
                stop.clone(),
                seed ^ (0x4400 + i),
            )
        })
        .collect();
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = JoinSet::new();
    for w in 0..4u64 {
        let l = fresh_ledger(&through_proxy(), lease);
        let (book, tally, ok, failed) = (book.clone(), tally.clone(), ok.clone(), failed.clone());
        let per_worker = size.r4_transfers.div_ceil(4);
        workers.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ (0x4410 + w));
            let mut mine: Vec<(String, Terms)> = Vec::new();
            let mut n = 0u64;
            while n < per_worker {
                let r = rng.u32(0..100);
                let result = if r < 10 && !mine.is_empty() {
                    let (id, terms) = mine[rng.usize(..mine.len())].clone();
                    l.submit(terms.request(&id), rng.bool()).await
                } else if r < 15 && !mine.is_empty() {
                    let (id, _) = mine[rng.usize(..mine.len())].clone();
                    book.cancels.lock().unwrap().insert(id.clone());
                    l.cancel(&id).await
                } else if r < 20 && !mine.is_empty() {
                    let (id, t) = mine[rng.usize(..mine.len())].clone();
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
                    l.reverse(&id).await
                } else {
                    n += 1;
                    let from = rng.usize(..8);
                    let to = (from + 1 + rng.usize(..7)) % 8;
                    let id = format!("r4-w{w}-{n}");
                    let terms = Terms {
                        source: format!("n{from}"),
                        destination: format!("n{to}"),
                        value: rng.i64(1..=8_000),
                        currency: "EUR".into(),
                        reverses: None,
                    };
                    book.ask(&id, terms.clone());
                    mine.push((id.clone(), terms.clone()));
                    l.submit(terms.request(&id), rng.u32(0..10) < 8).await
                };
                match result {
                    Ok(o) => {
                        book.ack(&o);
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tally.error("r4", &e);
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        if let Err(e) = r {
            tally.violation(format!("r4: a worker panicked: {e}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in sweepers {
        s.await.unwrap();
    }
    // Faults off; what is left is finished directly.
    proxy.set_http_faults(support::proxy::HttpFaults::default());
    let injected = proxy.counters.total_faults();
    tally.faults.fetch_add(injected, Ordering::Relaxed);
    eprintln!("r4: fault proxy: {}", proxy.counters.summary());
    let rest = fresh_ledger(&direct, lease);
    sweep_to_rest("r4", &rest, &tally, 0, Duration::from_secs(120)).await;
    audit("r4", &rest, &tally).await;
    let n = independent_check("r4", &Dbs::of(&base), &book, &tally, &[]).await;
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    if injected == 0 {
        tally.violation("r4: the fault proxy injected no fault");
    }
    let transfer = raw_transfers(&db).await.first().and_then(|t| {
        t["_id"]
            .as_str()
            .and_then(|id| id.strip_prefix("txn:"))
            .map(str::to_owned)
    });
    let mocked = match transfer {
        Some(transfer) => r4_wiremock(&rest, "n0", &transfer, &tally).await,
        None => {
            tally.violation("r4: no transfer document");
            0
        }
    };
    eprintln!(
        "r4: {n} transfers; {} calls answered, {} failed with a typed error; {injected} faults by the proxy, {mocked} by wiremock; {:?}",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        started.elapsed()
    );
}

/// The real server's reply to `GET /{db}/{id}`, byte for byte.
async fn raw_reply(db: &str, id: &str) -> Vec<u8> {
    let url = support::raw_url(&format!("{db}/{}", urlencode(id)));
    let r = support::auth(support::raw().get(url)).send().await.unwrap();
    assert!(r.status().is_success(), "GET {id}: {}", r.status());
    r.bytes().await.unwrap().to_vec()
}

/// R4's wiremock part: the replies a real server will not give on demand — a 429 with
/// `Retry-After`, a 503, a reply slower than the client's timeout, a garbage body, a server that
/// never recovers — in front of byte-for-byte copies of the real server's replies to the
/// ledger's reads. Each read is retried to the real answer, or fails with a typed error (and the
/// next call gets the answer). Returns the fault replies wiremock sent.
async fn r4_wiremock(real: &Ledger, account: &str, transfer: &str, tally: &Tally) -> u64 {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let db = real.client().database().to_owned();
    let mock = MockServer::start().await;
    let retries_max = 4;
    let ledger = Ledger::new(
        Client::builder()
            .url(mock.uri())
            .database(&db)
            .request_timeout(Duration::from_secs(2))
            .retry(RetryPolicy {
                retries_max,
                delay_base: Duration::from_millis(10),
                delay_max: Duration::from_millis(100),
                retry_after_max: Duration::from_secs(2),
            })
            .build()
            .unwrap(),
    );
    let at = |id: &str| path(format!("/{db}/{}", urlencode(id)));
    let once = |id: &str, reply: ResponseTemplate| {
        Mock::given(method("GET"))
            .and(at(id))
            .respond_with(reply)
            .up_to_n_times(1)
    };
    let real_reply =
        |body: Vec<u8>| ResponseTemplate::new(200).set_body_raw(body, "application/json");
    let unavailable = || {
        ResponseTemplate::new(503)
            .set_body_json(json!({"error": "unavailable", "reason": "injected"}))
    };
    let mut faults = 0u64;
    // Requests that reached wiremock so far.
    let arrived = || async { mock.received_requests().await.unwrap_or_default().len() };

    // 1. An account read through a 429 (Retry-After: 1), a 503 and a reply slower than the
    //    timeout: retried to exactly the real server's answer, the 429's wait honoured.
    let account_id = format!("account:{account}");
    once(
        &account_id,
        ResponseTemplate::new(429).insert_header("Retry-After", "1"),
    )
    .mount(&mock)
    .await;
    once(&account_id, unavailable()).mount(&mock).await;
    once(
        &account_id,
        real_reply(raw_reply(&db, &account_id).await).set_delay(Duration::from_secs(6)),
    )
    .mount(&mock)
    .await;
    Mock::given(method("GET"))
        .and(at(&account_id))
        .respond_with(real_reply(raw_reply(&db, &account_id).await))
        .mount(&mock)
        .await;
    let expected = real.account(account).await.unwrap();
    let started = Instant::now();
    match ledger.account(account).await {
        Ok(got) if got == expected => {}
        other => tally.violation(format!(
            "r4 wiremock: account read through 429/503/slow gave {other:?}, the server {expected:?}"
        )),
    }
    let n = arrived().await;
    if n != 4 || started.elapsed() < Duration::from_secs(1) {
        tally.violation(format!(
            "r4 wiremock: the account read took {n} requests (4 expected) in {:?} (Retry-After: 1 not honoured?)",
            started.elapsed()
        ));
    }
    faults += n.saturating_sub(1) as u64; // all but the last, real reply
    let seen = n;

    // 2. A transfer read answered with a garbage 200 after two 503s: a decode error (a reply
    //    that cannot be understood is not blindly repeated), then the real answer.
    let transfer_id = format!("txn:{transfer}");
    once(&transfer_id, unavailable()).mount(&mock).await;
    once(&transfer_id, unavailable()).mount(&mock).await;
    once(
        &transfer_id,
        ResponseTemplate::new(200).set_body_raw("<html>proxy error</html>", "application/json"),
    )
    .mount(&mock)
    .await;
    Mock::given(method("GET"))
        .and(at(&transfer_id))
        .respond_with(real_reply(raw_reply(&db, &transfer_id).await))
        .mount(&mock)
        .await;
    match ledger.transfer(transfer).await {
        Err(e) if e.is_decode() => tally.error("r4", &e),
        other => tally.violation(format!(
            "r4 wiremock: a garbage body gave {other:?}, not a decode error"
        )),
    }
    let expected = real.transfer(transfer).await.unwrap();
    match ledger.transfer(transfer).await {
        Ok(got) if got == expected => {}
        other => tally.violation(format!(
            "r4 wiremock: the transfer read after the garbage gave {other:?}, the server {expected:?}"
        )),
    }
    let n = arrived().await;
    if n - seen != 4 {
        tally.violation(format!(
            "r4 wiremock: the transfer reads took {} requests (4 expected)",
            n - seen
        ));
    }
    faults += (n - seen).saturating_sub(1) as u64;
    let seen = n;

    // 3. A server that never recovers: retries_max + 1 attempts, then a transient error.
    Mock::given(method("GET"))
        .and(at("account:n1"))
        .respond_with(unavailable())
        .mount(&mock)
        .await;
    match ledger.account("n1").await {
        Err(e) if e.is_transient() && e.status_code() == Some(503) => tally.error("r4", &e),
        other => tally.violation(format!(
            "r4 wiremock: a server that stays unavailable gave {other:?}, not a transient 503"
        )),
    }
    let n = arrived().await - seen;
    if n != retries_max as usize + 1 {
        tally.violation(format!(
            "r4 wiremock: {n} attempts at a server that stays unavailable ({} expected)",
            retries_max + 1
        ));
    }
    faults += n as u64;
    tally.faults.fetch_add(faults, Ordering::Relaxed);
    eprintln!("r4: wiremock: {faults} fault replies (429, 503, slow, garbage) in front of the real server's replies; every read retried to the real answer or failed typed");
    faults
}

// ---- R5: bad input ---------------------------------------------------------------------------

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

/// Raw PUT or DELETE on the test server (as its admin, when it has one): the status.
async fn raw_write(db: &str, method: reqwest::Method, id: &str, doc: Option<Value>) -> u16 {
    let mut url = support::raw_url(&format!("{db}/{}", urlencode(id)));
    if method == reqwest::Method::DELETE {
        let current: Value = support::auth(support::raw().get(&url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        url.push_str(&format!("?rev={}", current["_rev"].as_str().unwrap_or("")));
    }
    let mut req = support::auth(support::raw().request(method, url));
    if let Some(doc) = doc {
        req = req
            .header("Content-Type", "application/json")
            .body(doc.to_string());
    }
    req.send().await.unwrap().status().as_u16()
}

const BIN: &str = env!("CARGO_BIN_EXE_couch-ledger");

/// Runs the program on `db` of the test server, with `args` after the server's settings.
async fn run_cli(db: &str, args: Vec<std::ffi::OsString>) -> std::process::Output {
    let s = support::server();
    let on_trio = trio_db(db).map(|(_, proxy)| proxy);
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.env_remove("RUST_LOG")
        .env_remove("COUCHDB_URL")
        .env_remove("COUCHDB_USER")
        .env_remove("COUCHDB_PASSWORD")
        .env_remove("LEDGER_DB")
        .env_remove("LEDGER_HOT_DB")
        .args(["--url", on_trio.as_deref().unwrap_or(&s.url), "--db", db]);
    if let (Some(user), None) = (&s.user, &on_trio) {
        cmd.args(["--user", user]);
        cmd.env("COUCHDB_PASSWORD", s.password.clone().unwrap_or_default());
    }
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the program finished in time")
        .unwrap()
}

fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
    args.iter().map(|a| a.into()).collect()
}

fn req(id: &str, from: &str, to: &str, value: i64) -> TransferRequest {
    TransferRequest {
        id: Some(id.to_owned()),
        source: from.to_owned(),
        destination: to.to_owned(),
        amount: Amount::new(value).unwrap_or(Amount::ZERO),
        currency: eur(),
    }
}

async fn r5(tally: Arc<Tally>) {
    let started = Instant::now();
    let l = support::ledger("r5").await;
    let db = l.client().database().to_owned();
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
    let pay = |reference: &str, minor: i64, currency: Currency| couch_ledger::Payment {
        order_id: "o1".into(),
        reference: reference.into(),
        amount: Amount::new(minor).unwrap_or(Amount::ZERO),
        currency,
        method: None,
    };
    l.record_payment(&pay("p1", 300, eur())).await.unwrap();

    let mut t = Table::new("r5", &db, tally.clone()).await;
    use Expect::*;

    // -- the library --
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
        l.reverse(&long_id).await,
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
        l.clone().with_lease(Duration::ZERO),
    )
    .await;
    t.lib(
        "ledger: lease above the maximum",
        Invalid(Some("lease")),
        l.clone().with_lease(Duration::from_secs(31)),
    )
    .await;
    t.lib(
        "client: invalid database name",
        Invalid(None),
        Client::builder().database("Bad Name").build(),
    )
    .await;
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

    // -- malformed documents written straight into the database, as its admin --
    let put = reqwest::Method::PUT;
    let acct = |v: Value| {
        let mut d = json!({"type": "account", "account_id": "M", "currency": "EUR", "opening": 0,
            "balance": 0, "min_balance": 0, "pending": [], "settled": []});
        for (k, x) in v.as_object().unwrap() {
            if x.is_null() {
                d.as_object_mut().unwrap().remove(k);
            } else {
                d[k] = x.clone();
            }
        }
        d
    };
    let txn = |v: Value| {
        let mut d = json!({"type": "transaction", "txn_id": "m", "source": "A", "destination": "B",
            "value": 5, "currency": "EUR", "state": "initial", "reason": null, "reverses": null,
            "claim": null, "created_at": 1, "last_modified": 1});
        for (k, x) in v.as_object().unwrap() {
            if x == "<absent>" {
                d.as_object_mut().unwrap().remove(k);
            } else {
                d[k] = x.clone();
            }
        }
        d
    };
    t.raw(
        "raw: account balance as a string",
        put.clone(),
        "account:M",
        Some(acct(json!({"balance": "100"}))),
    )
    .await;
    t.raw(
        "raw: account without a currency",
        put.clone(),
        "account:M",
        Some(acct(json!({"currency": null}))),
    )
    .await;
    t.raw(
        "raw: account with a lower-case currency",
        put.clone(),
        "account:M",
        Some(acct(json!({"currency": "eur"}))),
    )
    .await;
    t.raw(
        "raw: account balance 1.5",
        put.clone(),
        "account:M",
        Some(acct(json!({"balance": 1.5}))),
    )
    .await;
    t.raw(
        "raw: account balance 2^53",
        put.clone(),
        "account:M",
        Some(acct(json!({"balance": 9007199254740992i64}))),
    )
    .await;
    t.raw(
        "raw: account pending delta 0",
        put.clone(),
        "account:M",
        Some(acct(json!({"pending": [{"txn": "x", "delta": 0}]}))),
    )
    .await;
    t.raw(
        "raw: account id and account_id disagree",
        put.clone(),
        "account:M2",
        Some(acct(json!({}))),
    )
    .await;
    t.raw(
        "raw: transfer in an unknown state",
        put.clone(),
        "txn:m",
        Some(txn(json!({"state": "paused"}))),
    )
    .await;
    t.raw(
        "raw: transfer value \"ten\"",
        put.clone(),
        "txn:m",
        Some(txn(json!({"value": "ten"}))),
    )
    .await;
    t.raw(
        "raw: transfer value -5",
        put.clone(),
        "txn:m",
        Some(txn(json!({"value": -5}))),
    )
    .await;
    t.raw(
        "raw: transfer value 1e20",
        put.clone(),
        "txn:m",
        Some(txn(json!({"value": 1e20}))),
    )
    .await;
    t.raw(
        "raw: transfer created done",
        put.clone(),
        "txn:m",
        Some(txn(json!({"state": "done"}))),
    )
    .await;
    t.raw(
        "raw: transfer source is destination",
        put.clone(),
        "txn:m",
        Some(txn(json!({"destination": "A"}))),
    )
    .await;
    t.raw(
        "raw: transfer without last_modified",
        put.clone(),
        "txn:m",
        Some(txn(json!({"last_modified": "<absent>"}))),
    )
    .await;
    t.raw(
        "raw: transfer without a currency",
        put.clone(),
        "txn:m",
        Some(txn(json!({"currency": "<absent>"}))),
    )
    .await;
    t.raw(
        "raw: txn: id with type account",
        put.clone(),
        "txn:m",
        Some(acct(json!({}))),
    )
    .await;
    t.raw("raw: purchase total ≠ pretax + tax + delivery", put.clone(), "purchase:o3", Some(json!({"type": "purchase", "order_id": "o3", "account_id": "c", "currency": "EUR", "basket": [], "delivery": {"option": null, "price": 0, "address": "x"}, "pretax": 1, "tax": 0, "total": 2}))).await;
    t.raw("raw: payment value 0", put.clone(), "payment:o1:z", Some(json!({"type": "payment", "order_id": "o1", "account_id": "c1", "currency": "EUR", "value": 0, "payment_reference": "z"}))).await;
    t.raw("raw: payment without a reference", put.clone(), "payment:o1:z", Some(json!({"type": "payment", "order_id": "o1", "account_id": "c1", "currency": "EUR", "value": 5}))).await;
    t.raw("raw: payment under another order's id", put.clone(), "payment:o9:z", Some(json!({"type": "payment", "order_id": "o1", "account_id": "c1", "currency": "EUR", "value": 5, "payment_reference": "z"}))).await;

    // -- the command line --
    if cli_has_transfers().await {
        use std::os::unix::ffi::OsStringExt;
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
            os(&[
                "transfer",
                "--from",
                "A",
                "--to",
                "B",
                "--amount",
                "99999999999999999999",
                "--currency",
                "EUR",
            ]),
        )
        .await;
        t.cli(
            "cli: amount 1e3",
            Exit(2),
            os(&[
                "transfer",
                "--from",
                "A",
                "--to",
                "B",
                "--amount",
                "1e3",
                "--currency",
                "EUR",
            ]),
        )
        .await;
        t.cli(
            "cli: amount NaN",
            Exit(2),
            os(&[
                "transfer",
                "--from",
                "A",
                "--to",
                "B",
                "--amount",
                "NaN",
                "--currency",
                "EUR",
            ]),
        )
        .await;
        t.cli(
            "cli: oversized id",
            Exit(2),
            os(&[
                "transfer",
                "--from",
                "A",
                "--to",
                "B",
                "--amount",
                "1",
                "--currency",
                "EUR",
                "--id",
                &"k".repeat(300),
            ]),
        )
        .await;
        t.cli(
            "cli: id with a newline",
            Exit(2),
            os(&[
                "transfer",
                "--from",
                "A",
                "--to",
                "B",
                "--amount",
                "1",
                "--currency",
                "EUR",
                "--id",
                "a\nb",
            ]),
        )
        .await;
        t.cli(
            "cli: re-used id, other terms",
            Exit(2),
            os(&[
                "transfer",
                "--from",
                "A",
                "--to",
                "B",
                "--amount",
                "2.00",
                "--currency",
                "EUR",
                "--id",
                "t-done",
            ]),
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
    } else {
        eprintln!("r5: the command line has no transfer commands yet: CLI cases skipped");
    }
    tally.bad_inputs.fetch_add(t.cases, Ordering::Relaxed);

    // A transfer to a missing account is not an error: it ends cancelled, nothing moved.
    let balances = |docs: Vec<Value>| -> Vec<(Value, Value)> {
        docs.into_iter()
            .map(|d| (d["_id"].clone(), d["balance"].clone()))
            .collect()
    };
    let before = balances(raw_accounts(&db).await);
    let o = l
        .submit(req("to-ghost", "A", "ghost", 5), true)
        .await
        .unwrap();
    if (o.state, o.reason.as_deref()) != (State::Cancelled, Some("unknown_account")) {
        tally.violation(format!("r5: a transfer to a missing account came to {o:?}"));
    }
    if balances(raw_accounts(&db).await) != before {
        tally.violation("r5: a transfer to a missing account changed a balance");
    }
    eprintln!(
        "r5: {} bad inputs refused, nothing written; {:?}",
        t.cases,
        started.elapsed()
    );

    r5_poison(tally).await;
}

/// Whether the program has the transfer commands (written in parallel with this suite).
async fn cli_has_transfers() -> bool {
    let out = tokio::process::Command::new(BIN)
        .args(["transfer", "--help"])
        .output()
        .await
        .unwrap();
    out.status.success()
}

/// Poison documents, written before the design documents (whose validation would refuse
/// them), next to good work: the sweeper reports and skips them, finishes the good transfers,
/// never changes a poison document, and the auditor names every one of them.
async fn r5_poison(tally: Arc<Tally>) {
    let l = Ledger::new(support::builder("r5_poison").build().unwrap());
    let c = l.client().clone();
    c.ensure_database().await.unwrap();
    let db = c.database().to_owned();
    let poison = [
        (
            "txn:p-state",
            json!({"type": "transaction", "txn_id": "p-state", "state": "paused", "last_modified": 1}),
        ),
        (
            "txn:p-value",
            json!({"type": "transaction", "txn_id": "p-value", "state": "pending", "source": "A", "destination": "B", "value": "ten", "currency": "EUR", "created_at": 1, "last_modified": 1}),
        ),
        (
            "txn:p-terms",
            json!({"type": "transaction", "txn_id": "p-terms", "state": "committed", "currency": "EUR", "value": 5, "created_at": 1, "last_modified": 1}),
        ),
        (
            "txn:p-huge",
            json!({"type": "transaction", "txn_id": "p-huge", "state": "pending", "source": "A", "destination": "B", "value": 1e20, "currency": "EUR", "created_at": 1, "last_modified": 1}),
        ),
        (
            "txn:p-type",
            json!({"type": "transfer", "txn_id": "p-type", "state": "pending", "last_modified": 1}),
        ),
        (
            "account:P",
            json!({"type": "account", "account_id": "P", "currency": "EUR", "opening": 0, "balance": "lots", "pending": [], "settled": []}),
        ),
    ];
    for (id, doc) in &poison {
        c.put(id, doc).await.unwrap();
    }
    // An account that existed and was deleted.
    let w = c.put("account:gone", &json!({"type": "account", "account_id": "gone", "currency": "EUR", "opening": 0, "balance": 0, "min_balance": 0, "pending": [], "settled": []})).await.unwrap();
    c.delete("account:gone", &w.rev).await.unwrap();
    l.init().await.unwrap();
    let revs = |docs: Vec<Value>| -> HashMap<String, String> {
        docs.into_iter()
            .map(|d| {
                (
                    d["_id"].as_str().unwrap().to_owned(),
                    d["_rev"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let poison_revs: HashMap<String, String> = revs(raw_docs(&db, "account:P", "account:P").await)
        .into_iter()
        .chain(revs(raw_transfers(&db).await))
        .collect();
    let accounts = [
        Acct {
            id: "A".into(),
            currency: eur(),
            opening: 10_000,
            min: Some(0),
        },
        Acct {
            id: "B".into(),
            currency: eur(),
            opening: 10_000,
            min: Some(0),
        },
        Acct {
            id: "C".into(),
            currency: eur(),
            opening: 10_000,
            min: Some(0),
        },
    ];
    create_accounts(&l, &accounts).await;
    let book = Book::default();
    let lease = Duration::from_millis(500);
    let worker = fresh_ledger(&c, lease);
    // Good work, half of it left for the sweeper; one transfer to the deleted account, one to
    // the unreadable one (cancelled, unreadable_account: a business refusal).
    for i in 0..40 {
        let (from, to) = if i % 2 == 0 { ("A", "B") } else { ("B", "A") };
        let id = format!("good-{i}");
        let terms = Terms {
            source: from.into(),
            destination: to.into(),
            value: 10 + i,
            currency: "EUR".into(),
            reverses: None,
        };
        book.ask(&id, terms.clone());
        match worker.submit(terms.request(&id), i % 4 < 2).await {
            Ok(o) => book.ack(&o),
            Err(e) => tally.violation(format!("r5: good transfer {id} failed: {e}")),
        }
    }
    let gone = worker
        .submit(req("to-gone", "A", "gone", 7), false)
        .await
        .unwrap();
    book.ack(&gone);
    book.ask(
        "to-gone",
        Terms {
            source: "A".into(),
            destination: "gone".into(),
            value: 7,
            currency: "EUR".into(),
            reverses: None,
        },
    );
    worker
        .submit(req("to-poison", "C", "P", 9), false)
        .await
        .unwrap();

    // Sweep until every good transfer is finished; the poison stays open and is reported.
    let sweeper = fresh_ledger(&c, lease);
    let mut reported: HashSet<&str> = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // (txn:p-type is not of type transaction: no view maps it, so the sweeper never sees it;
    // the auditor names it.)
    let names = ["p-value", "p-terms", "p-huge", "paused"];
    loop {
        match sweeper
            .sweep_once(SweepOptions {
                limit: 100,
                stale_after: Duration::ZERO,
            })
            .await
        {
            Ok(o) => {
                for p in &o.problems {
                    for n in names {
                        if p.contains(n) {
                            reported.insert(n);
                        }
                    }
                }
            }
            Err(e) => tally.violation(format!("r5: a sweep pass stopped on poison: {e}")),
        }
        let all: Vec<Value> = raw_transfers(&db).await;
        let good_open = all
            .iter()
            .filter(|t| {
                let id = t["_id"].as_str().unwrap_or("");
                (id.starts_with("txn:good-") || id == "txn:to-gone" || id == "txn:to-poison")
                    && !matches!(t["state"].as_str(), Some("done" | "cancelled"))
            })
            .count();
        if good_open == 0 && reported.len() == names.len() {
            break;
        }
        if Instant::now() > deadline {
            tally.violation(format!("r5: good work not finished next to poison ({good_open} open), or poison not reported (reported: {reported:?})"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = l.transfer("to-gone").await.unwrap();
    if (gone.state, gone.reason.as_deref()) != (State::Cancelled, Some("unknown_account")) {
        tally.violation(format!(
            "r5: a transfer to a deleted account came to {gone:?}"
        ));
    }
    let odd = l.transfer("to-poison").await.unwrap();
    if (odd.state, odd.reason.as_deref()) != (State::Cancelled, Some("unreadable_account")) {
        tally.violation(format!(
            "r5: a transfer to an unreadable account came to {odd:?}"
        ));
    }
    // Poison untouched.
    let after: HashMap<String, String> = revs(raw_docs(&db, "account:P", "account:P").await)
        .into_iter()
        .chain(revs(raw_transfers(&db).await))
        .filter(|(id, _)| poison_revs.contains_key(id))
        .collect();
    if after != poison_revs {
        tally.violation(format!(
            "r5: a poison document was changed: {poison_revs:?} → {after:?}"
        ));
    }
    // The auditor names every poison document, and no good transfer.
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    let named: HashSet<String> = report
        .checks
        .iter()
        .filter(|c| !c.ok)
        .flat_map(|c| c.documents.clone())
        .collect();
    for (id, _) in &poison {
        if !named.contains(*id) {
            tally.violation(format!(
                "r5: the audit does not name poison document {id}: {report:#?}"
            ));
        }
    }
    for id in &named {
        if id.starts_with("txn:good-") || id == "txn:to-gone" || id == "txn:to-poison" {
            tally.violation(format!(
                "r5: the audit names good transfer {id}: {report:#?}"
            ));
        }
    }
    // Good accounts: every cent where it belongs.
    let mut moved: HashMap<String, i64> = HashMap::new();
    for t in raw_transfers(&db).await {
        if t["_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("txn:good-"))
            && t["state"] == "done"
        {
            let v = t["value"].as_i64().unwrap();
            *moved
                .entry(t["source"].as_str().unwrap().to_owned())
                .or_default() -= v;
            *moved
                .entry(t["destination"].as_str().unwrap().to_owned())
                .or_default() += v;
        }
    }
    for a in raw_accounts(&db).await {
        let id = a["account_id"].as_str().unwrap_or("");
        let expected = match id {
            "A" | "B" => 10_000 + moved.get(id).copied().unwrap_or(0),
            // The transfer to the unreadable account was cancelled, its debit undone.
            "C" => 10_000,
            _ => continue,
        };
        if a["balance"].as_i64() != Some(expected) {
            tally.violation(format!(
                "r5: account:{id} balance {} ≠ {expected}",
                a["balance"]
            ));
        }
    }
    let acked = book.acked.lock().unwrap().clone();
    for (id, acks) in &acked {
        let fin = l.transfer(id).await.unwrap().state;
        if acks.iter().any(|a| !reachable(*a, fin)) {
            tally.violation(format!("r5: {id} acknowledged {acks:?}, now {fin}"));
        }
    }
    tally
        .bad_inputs
        .fetch_add(poison.len() as u64 + 1, Ordering::Relaxed);
    let n = raw_transfers(&db).await.len() as u64 - 5;
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    eprintln!(
        "r5: {} poison documents (+ a deleted account) reported and skipped, left untouched, named by the audit; {n} good transfers finished beside them",
        poison.len()
    );
}

// ---- R6: security ----------------------------------------------------------------------------

/// The admin password of R6's second pouchdb-server (and of a wiremock client below); R6's
/// clients carry a random one of their own user's (`support::make_user`).
const SECRET: &str = "R6-s3cret-never-print-9c1f";

/// Every state change the graph does not allow, and terms that may never change: refused by
/// the server's validation even for the admin writer (raw HTTP as the test server's admin).
/// Returns how many refusals were checked.
async fn r6_validation(tally: &Tally) -> u64 {
    let l = support::ledger("r6").await;
    let db = l.client().database().to_owned();
    let mut refused = 0u64;
    let expect = |what: String, status: u16, want: u16| {
        if status != want {
            tally.violation(format!(
                "r6: {what}: the server answered {status}, not {want}"
            ));
        }
    };
    let put = reqwest::Method::PUT;
    let get = |id: String| {
        let db = db.clone();
        async move {
            let url = support::raw_url(&format!("{db}/{}", urlencode(&id)));
            support::auth(support::raw().get(url))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };

    // Every immutable type: written once through the library, then an update (even with the
    // same content) and a deletion refused.
    let purchase = couch_ledger::Purchase::from_json(
        r#"{"order_id": "o6", "account_id": "c6", "currency": "EUR",
            "basket": [{"product_id": "p", "price": 5.00, "tax": 0, "quantity": 1}],
            "delivery": {"option": null, "price": 0, "address": "x"},
            "pretax": 5.00, "tax": 0, "total": 5.00}"#,
        None,
    )
    .unwrap();
    l.record_purchase(&purchase).await.unwrap();
    let eur6 = eur();
    l.record_payment(&couch_ledger::Payment {
        order_id: "o6".into(),
        reference: "p".into(),
        amount: amount(100),
        currency: eur6,
        method: None,
    })
    .await
    .unwrap();
    l.record_refund(&couch_ledger::Refund {
        order_id: "o6".into(),
        reference: "r".into(),
        amount: amount(50),
        currency: eur6,
        reason: None,
    })
    .await
    .unwrap();
    l.record_adjustment(&couch_ledger::Adjustment {
        order_id: "o6".into(),
        reference: "a".into(),
        amount: amount(-10),
        currency: eur6,
        reason: None,
    })
    .await
    .unwrap();
    l.record_shipment(&couch_ledger::Shipment {
        order_id: "o6".into(),
        reference: "s".into(),
        carrier: None,
    })
    .await
    .unwrap();
    l.record_delivery(&couch_ledger::Delivered {
        order_id: "o6".into(),
        reference: "d".into(),
    })
    .await
    .unwrap();
    for id in [
        "purchase:o6",
        "payment:o6:p",
        "refund:o6:r",
        "adjustment:o6:a",
        "shipment:o6:s",
        "delivery:o6:d",
    ] {
        let doc = get(id.to_owned()).await;
        expect(
            format!("update of {id} with the same content"),
            raw_write(&db, put.clone(), id, Some(doc.clone())).await,
            403,
        );
        let mut changed = doc.clone();
        changed["order_id"] = json!("o7");
        if doc.get("value").is_some() {
            changed["value"] = json!(1);
        }
        expect(
            format!("update of {id} with other content"),
            raw_write(&db, put.clone(), id, Some(changed)).await,
            403,
        );
        expect(
            format!("deletion of {id}"),
            raw_write(&db, reqwest::Method::DELETE, id, None).await,
            403,
        );
        refused += 3;
    }

    // An account: its currency, opening and id are fixed; it is never deleted.
    create_accounts(
        &l,
        &[Acct {
            id: "K".into(),
            currency: eur(),
            opening: 1_000,
            min: Some(0),
        }],
    )
    .await;
    let k = get("account:K".into()).await;
    for (field, value) in [
        ("currency", json!("USD")),
        ("opening", json!(5)),
        ("account_id", json!("K2")),
        ("type", json!("other")),
    ] {
        let mut changed = k.clone();
        changed[field] = value;
        expect(
            format!("account {field} changed"),
            raw_write(&db, put.clone(), "account:K", Some(changed)).await,
            403,
        );
        refused += 1;
    }
    expect(
        "deletion of an account".into(),
        raw_write(&db, reqwest::Method::DELETE, "account:K", None).await,
        403,
    );
    refused += 1;

    // Transfers in every state, reached along the graph by raw writes the validation accepts.
    let paths: [(&str, &[&str]); 6] = [
        ("initial", &["initial"]),
        ("pending", &["pending"]),
        ("committed", &["pending", "committed"]),
        ("done", &["pending", "committed", "done"]),
        ("canceling", &["pending", "canceling"]),
        ("cancelled", &["initial", "cancelled"]),
    ];
    for (state, path) in paths {
        let id = format!("txn:s-{state}");
        let mut doc = json!({"type": "transaction", "txn_id": format!("s-{state}"), "source": "K",
            "destination": "J", "value": 5, "currency": "EUR", "state": path[0], "reason": null,
            "reverses": null, "claim": null, "created_at": 1, "last_modified": 1});
        for (i, step) in path.iter().enumerate() {
            if i > 0 {
                doc = get(id.clone()).await;
                doc["state"] = json!(step);
            }
            expect(
                format!("{id}: legal write to {step}"),
                raw_write(&db, put.clone(), &id, Some(doc.clone())).await,
                201,
            );
        }
        let current = get(id.clone()).await;
        for to in State::ALL {
            let from = State::parse(state).unwrap();
            if to == from || edge(from, to) {
                continue;
            }
            let mut changed = current.clone();
            changed["state"] = json!(to.as_str());
            expect(
                format!("{id}: {from} → {to}"),
                raw_write(&db, put.clone(), &id, Some(changed)).await,
                403,
            );
            refused += 1;
        }
        expect(
            format!("deletion of {id}"),
            raw_write(&db, reqwest::Method::DELETE, &id, None).await,
            403,
        );
        refused += 1;
    }
    let pending = get("txn:s-pending".into()).await;
    for (field, value) in [
        ("value", json!(6)),
        ("source", json!("Z")),
        ("destination", json!("Z")),
        ("currency", json!("USD")),
        ("reverses", json!("x")),
        ("created_at", json!(2)),
        ("txn_id", json!("other")),
    ] {
        let mut changed = pending.clone();
        changed[field] = value;
        expect(
            format!("transfer term {field} changed"),
            raw_write(&db, put.clone(), "txn:s-pending", Some(changed)).await,
            403,
        );
        refused += 1;
    }
    let new_committed = json!({"type": "transaction", "txn_id": "s-new", "source": "K", "destination": "J", "value": 5, "currency": "EUR", "state": "committed", "created_at": 1, "last_modified": 1});
    expect(
        "a new transfer created committed".into(),
        raw_write(&db, put.clone(), "txn:s-new", Some(new_committed)).await,
        403,
    );
    refused += 1;
    eprintln!(
        "r6: {refused} illegal writes by the admin writer refused by validate_doc_update (403)"
    );
    refused
}

async fn start_dev_server() -> Option<support::devserver::DevServer> {
    tokio::task::spawn_blocking(support::devserver::DevServer::start)
        .await
        .unwrap()
        .map_err(|e| eprintln!("r6: no second server: {e}"))
        .ok()
}

/// Whether `text` holds the secret (or its base64, as in a Basic header).
fn leaks(text: &str, secret: &str) -> bool {
    text.contains(secret)
}

async fn r6(seed: u64, tally: Arc<Tally>, logs: &LogBuffer) -> u64 {
    let started = Instant::now();
    let refused = r6_validation(&tally).await;

    // Credentials: a server with an admin (a second pouchdb-server, or COUCHDB_URL's).
    let own = support::server().dev.is_some();
    let (dev, url, admin, admin_password) = if own {
        let Some(dev) = start_dev_server().await else {
            tally.violation("r6: could not start a second server for the credential checks");
            return refused;
        };
        let url = dev.url();
        let status = support::raw()
            .put(format!("{url}/_config/admins/admin"))
            .body(json!(SECRET).to_string())
            .send()
            .await
            .unwrap()
            .status();
        assert!(status.is_success(), "create the admin: {status}");
        (Some(dev), url, "admin".to_owned(), SECRET.to_owned())
    } else {
        let s = support::server();
        match (&s.user, &s.password) {
            (Some(u), Some(p)) if !p.is_empty() => (None, s.url.clone(), u.clone(), p.clone()),
            _ => {
                eprintln!("r6: SKIPPED credential checks — COUCHDB_URL is set without COUCHDB_USER / COUCHDB_PASSWORD");
                return refused;
            }
        }
    };
    // R6's own user, made for this run with a random password that occurs nowhere else: a match
    // in any text below is a leak, never a coincidence (the suite's own password may be a word
    // that also occurs in names), and the wrong passwords tried below lock out nobody else
    // (CouchDB 3.4's login lockout, SERVERS.md).
    let (user, secret) = support::make_user(&url, Some((&admin, &admin_password)), "r6").await;
    let host_url = url::Url::parse(&url).unwrap();
    let db = support::db_name(&format!("r6_creds_{seed:x}"));
    let builders = |password: &str| {
        let mut in_url = host_url.clone();
        in_url.set_username(&user).unwrap();
        in_url.set_password(Some(password)).unwrap();
        let b = |u: &str| {
            Client::builder()
                .url(u)
                .database(&db)
                .request_timeout(Duration::from_secs(10))
                .retry(RetryPolicy {
                    retries_max: 1,
                    delay_base: Duration::from_millis(10),
                    delay_max: Duration::from_millis(50),
                    retry_after_max: Duration::from_millis(50),
                })
        };
        vec![
            ("basic auth", b(&url).basic_auth(&user, password)),
            ("cookie auth", b(&url).cookie_auth(&user, password)),
            ("credentials in the URL", b(in_url.as_str())),
        ]
    };
    // The database, made by the admin, with R6's user as its only admin and member: so every
    // call below succeeds only if its credentials (the cookie client's session too) were
    // accepted, and an anonymous writer is refused. (pouchdb-server lets anonymous users write
    // a database whose _security names nobody, SERVERS.md; CouchDB 3 is admin-only already.)
    {
        let admin = Client::builder()
            .url(&url)
            .database(&db)
            .basic_auth(&admin, &admin_password)
            .build()
            .unwrap();
        admin.ensure_database().await.unwrap();
        admin
            .set_security(&json!({"admins": {"names": [&user], "roles": []}, "members": {"names": [&user], "roles": []}}))
            .await
            .unwrap();
    }
    let mut printed: Vec<(String, String)> = Vec::new();
    let mut first = true;
    for (kind, builder) in builders(&secret) {
        printed.push((
            format!("Debug of the {kind} builder"),
            format!("{builder:?}"),
        ));
        let client = builder.build().unwrap();
        printed.push((format!("Debug of the {kind} client"), format!("{client:?}")));
        let l = Ledger::new(client.clone())
            .with_lease(Duration::from_millis(500))
            .unwrap();
        printed.push((format!("Debug of the {kind} ledger"), format!("{l:?}")));
        // The whole ledger works with these credentials (the cookie client logs in).
        let work = async {
            l.init().await?;
            if first {
                create_accounts(
                    &l,
                    &[
                        Acct {
                            id: "A".into(),
                            currency: eur(),
                            opening: 1_000,
                            min: Some(0),
                        },
                        Acct {
                            id: "B".into(),
                            currency: eur(),
                            opening: 0,
                            min: Some(0),
                        },
                    ],
                )
                .await;
            }
            let o = l
                .submit(req(&format!("sec-{}", kind.len()), "A", "B", 10), true)
                .await?;
            l.submit(
                req(&format!("sec-nowait-{}", kind.len()), "A", "B", 1),
                false,
            )
            .await?;
            l.sweep_once(SweepOptions {
                limit: 10,
                stale_after: Duration::ZERO,
            })
            .await?;
            let report = l.verify().await?;
            Ok::<_, Error>((o, report.ok))
        };
        match work.await {
            Ok((o, ok)) => {
                if o.state != State::Done || !ok {
                    tally.violation(format!(
                        "r6: with {kind}, a transfer came to {o:?}, audit ok {ok}"
                    ));
                }
            }
            Err(e) => tally.violation(format!("r6: the ledger does not work with {kind}: {e}")),
        }
        first = false;
    }
    // Wrong passwords: refused, and the refusal never carries the password it was given.
    let wrong = format!("{SECRET}-wrong");
    for (kind, builder) in builders(&wrong) {
        let client = builder.build().unwrap();
        let l = Ledger::new(client);
        for r in [
            l.account("A").await.map(drop),
            l.submit(req("sec-wrong", "A", "B", 1), true)
                .await
                .map(drop),
            l.sweep_once(SweepOptions::default()).await.map(drop),
        ] {
            match r {
                // CouchDB 3.4 locks R6's user after a few of these (its login lockout): then
                // the refusal is a 403 that says so, and must not carry the password either.
                Err(e) if e.is_unauthorized() || e.is_locked() => {
                    printed.push((
                        format!("{kind} error"),
                        format!(
                            "{e} | {e:?} | {:?}",
                            std::error::Error::source(&e).map(|s| s.to_string())
                        ),
                    ));
                }
                other => tally.violation(format!(
                    "r6: a wrong password with {kind} came to {other:?}, not 401 (or a lockout)"
                )),
            }
        }
    }
    // An unreachable server: a transport error, without the password.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::builder()
        .url(format!("http://{user}:{secret}@127.0.0.1:{closed}"))
        .database("x")
        .retry(RetryPolicy {
            retries_max: 0,
            ..RetryPolicy::default()
        })
        .build()
        .unwrap();
    match client.server_info().await {
        Err(e) if e.is_transient() => printed.push(("unreachable".into(), format!("{e} | {e:?}"))),
        other => tally.violation(format!("r6: an unreachable server came to {other:?}")),
    }
    for (what, text) in &printed {
        if leaks(text, &secret) || leaks(text, &wrong) {
            tally.violation(format!("r6: the password appears in {what}: {text}"));
        }
    }

    // An anonymous writer is refused.
    let anon_url = format!("{url}/{db}/anonymous-write");
    let status = support::raw()
        .put(&anon_url)
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    if status != 401 && status != 403 {
        tally.violation(format!("r6: an anonymous write answered {status}"));
    }
    // Read as the admin: R6's user may be locked out by now (the wrong passwords above).
    let check = Client::builder()
        .url(&url)
        .basic_auth(&admin, &admin_password)
        .database(&db)
        .build()
        .unwrap();
    if check
        .get_opt::<Value>("anonymous-write")
        .await
        .unwrap()
        .is_some()
    {
        tally.violation("r6: an anonymous write landed");
    }
    eprintln!(
        "r6: anonymous writer refused ({status}) on {}",
        if own {
            "pouchdb-server with an admin and _security members (admin party would accept it)"
        } else {
            "COUCHDB_URL's server"
        }
    );

    // The logs of the whole run: the password nowhere, though the failures were logged.
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
    if leaks(&text, &secret) || leaks(&text, &wrong) {
        tally.violation("r6: the password appears in the captured logs");
    }
    if own && leaks(&text, SECRET) {
        tally.violation("r6: the second server's admin password appears in the captured logs");
    }
    if !text.contains("cookie login refused") {
        tally.violation("r6: the refused cookie login was not logged: is the log capture working?");
    }
    drop(dev);
    eprintln!(
        "r6: credentials absent from {} Debug/error texts and {} bytes of logs; cookie auth exercised; {:?}",
        printed.len(),
        text.len(),
        started.elapsed()
    );
    refused
}

/// A cookie login refused for a wrong password must come back as the server's 401, even from a
/// server that lets anonymous users in: the request is never sent anonymously (found by R6 on
/// pouchdb-server, where the database had no `_security` members yet).
#[tokio::test]
async fn a_refused_cookie_login_is_never_an_anonymous_request() {
    use wiremock::matchers::{header_exists, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    let unauthorized = ResponseTemplate::new(401).set_body_json(
        json!({"error": "unauthorized", "reason": "Name or password is incorrect."}),
    );
    Mock::given(method("POST"))
        .and(path("/_session"))
        .respond_with(unauthorized.clone())
        .mount(&server)
        .await;
    Mock::given(path("/db/doc"))
        .and(header_exists("authorization"))
        .respond_with(unauthorized)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(path("/db/doc"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"_id": "doc", "_rev": "1-a"})),
        )
        .with_priority(2)
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .cookie_auth("admin", SECRET)
        .retry(RetryPolicy {
            retries_max: 0,
            ..RetryPolicy::default()
        })
        .build()
        .unwrap();
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_unauthorized(), "{e}");
    assert!(!e.to_string().contains(SECRET) && !format!("{e:?}").contains(SECRET));
}

// ---- R2: process kill soak -------------------------------------------------------------------

/// The program on the test server's ledger in `dbs` (`--hot-db` too when split) as a child
/// process (stdout piped, stderr dropped).
fn spawn_cli(dbs: &Dbs, args: &[String]) -> tokio::process::Child {
    let s = support::server();
    let on_trio = trio_db(&dbs.db).map(|(_, proxy)| proxy);
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.env_remove("RUST_LOG")
        .env_remove("COUCHDB_URL")
        .env_remove("COUCHDB_USER")
        .env_remove("COUCHDB_PASSWORD")
        .env_remove("LEDGER_DB")
        .env_remove("LEDGER_HOT_DB")
        .args([
            "--url",
            on_trio.as_deref().unwrap_or(&s.url),
            "--db",
            &dbs.db,
        ])
        .args(dbs.cli_args());
    if let (Some(user), None) = (&s.user, &on_trio) {
        cmd.args(["--user", user]);
        cmd.env("COUCHDB_PASSWORD", s.password.clone().unwrap_or_default());
    }
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    cmd.spawn().expect("run couch-ledger")
}

/// SIGKILLs a child if it still runs; `true` when it did (a kill that really happened).
fn kill_if_running(child: &mut tokio::process::Child) -> bool {
    if matches!(child.try_wait(), Ok(None)) && child.start_kill().is_ok() {
        return true;
    }
    false
}

/// R2; with `trio`, on the replicating trio, every process through its proxy (`part` is then
/// `r2_trio`); with `split`, on the split layout (accounts and transfers in a second database,
/// every process run with `--hot-db`; not on the trio).
async fn r2(
    size: Size,
    seed: u64,
    tally: Arc<Tally>,
    trio: Option<&Trio>,
    part: &'static str,
    split: bool,
) {
    let started = Instant::now();
    if !cli_has_transfers().await {
        tally.violation(format!("{part}: the program has no transfer commands"));
        return;
    }
    // Processes get the layout's options (`spawn_cli`); raw reads of accounts and transfers go
    // to `dbs.hot`.
    let base = part_ledger(trio, part, split).await;
    let dbs = Dbs::of(&base);
    assert_eq!(dbs.split(), split, "{part}: layout");
    eprintln!("{part}: {} layout, on {dbs}", dbs.layout());
    let accounts: Vec<Acct> = (0..6)
        .map(|i| Acct {
            id: format!("k{i}"),
            currency: eur(),
            opening: 200_000,
            min: Some(0),
        })
        .collect();
    create_accounts(&base, &accounts).await;
    let observer = match trio {
        Some(trio) => Some(trio_ready(part, trio, &dbs.db, &tally).await),
        None => None,
    };
    let book = Arc::new(Book::default());
    let soak = if trio.is_some() {
        size.trio_r2_soak
    } else {
        size.r2_soak
    };
    let soak_end = Instant::now() + soak;
    let exits = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));

    // Sweepers: `sweep --watch` processes, SIGKILLed at random moments and started again.
    let mut sweepers = JoinSet::new();
    for s in 0..2u64 {
        let (dbs, tally) = (dbs.clone(), tally.clone());
        sweepers.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ (0x2200 + s));
            let watch =
                ["sweep", "--watch", "--stale-after", "1s", "--batch", "200"].map(str::to_owned);
            let mut starts = 0u64;
            while Instant::now() < soak_end {
                let mut child = spawn_cli(&dbs, &watch);
                starts += 1;
                let live = Duration::from_millis(rng.u64(1_500..8_000));
                tokio::time::sleep(live.min(soak_end.saturating_duration_since(Instant::now())))
                    .await;
                if Instant::now() >= soak_end {
                    // The last one stops the way an operator stops it: SIGTERM, exit 0.
                    let pid = child.id().unwrap_or(0).to_string();
                    let _ = std::process::Command::new("kill")
                        .args(["-TERM", &pid])
                        .status();
                    match tokio::time::timeout(Duration::from_secs(60), child.wait()).await {
                        Ok(Ok(status)) if status.success() => {}
                        other => tally.violation(format!(
                            "{part}: sweep --watch did not stop cleanly on SIGTERM: {other:?}"
                        )),
                    }
                    break;
                }
                if kill_if_running(&mut child) {
                    tally.kills.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.violation(format!("{part}: sweep --watch exited by itself"));
                }
                let _ = child.wait().await;
            }
            starts
        });
    }

    // Workers: one `transfer` process after another, some SIGKILLed mid-flight; a killed id is
    // often sent again (same terms), as a caller that never got an answer would.
    let mut workers = JoinSet::new();
    for w in 0..4u64 {
        let (dbs, tally, book, exits) = (dbs.clone(), tally.clone(), book.clone(), exits.clone());
        workers.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ (0x2210 + w));
            let mut unanswered: Vec<(String, Terms)> = Vec::new();
            let mut n = 0u64;
            while Instant::now() < soak_end {
                let (id, terms) = if !unanswered.is_empty() && rng.u32(0..100) < 40 {
                    unanswered.swap_remove(rng.usize(..unanswered.len()))
                } else {
                    n += 1;
                    let from = rng.usize(..6);
                    let to = (from + 1 + rng.usize(..5)) % 6;
                    let value = if rng.u32(0..100) < 5 {
                        50_000_000
                    } else {
                        rng.i64(1..=20_000)
                    };
                    let terms = Terms {
                        source: format!("k{from}"),
                        destination: format!("k{to}"),
                        value,
                        currency: "EUR".into(),
                        reverses: None,
                    };
                    (format!("r2-w{w}-{n}"), terms)
                };
                book.ask(&id, terms.clone());
                let mut args: Vec<String> = [
                    "transfer",
                    "--json",
                    "--from",
                    &terms.source,
                    "--to",
                    &terms.destination,
                    "--amount",
                    &format!("{}.{:02}", terms.value / 100, terms.value % 100),
                    "--currency",
                    "EUR",
                    "--id",
                    &id,
                ]
                .map(str::to_owned)
                .to_vec();
                if rng.u32(0..100) < 20 {
                    args.push("--no-wait".into());
                }
                let mut child = spawn_cli(&dbs, &args);
                let mut stdout = child.stdout.take().unwrap();
                let kill_at =
                    (rng.u32(0..100) < 35).then(|| Duration::from_millis(rng.u64(5..400)));
                let read = async {
                    let mut out = Vec::new();
                    tokio::io::AsyncReadExt::read_to_end(&mut stdout, &mut out)
                        .await
                        .ok();
                    out
                };
                let (out, killed) = match kill_at {
                    Some(at) => {
                        tokio::pin!(read);
                        tokio::select! {
                            out = &mut read => (out, false),
                            () = tokio::time::sleep(at) => {
                                let killed = kill_if_running(&mut child);
                                (read.await, killed)
                            }
                        }
                    }
                    None => (read.await, false),
                };
                let status = child.wait().await.unwrap();
                let kind = if killed {
                    tally.kills.fetch_add(1, Ordering::Relaxed);
                    unanswered.push((id.clone(), terms.clone()));
                    "killed".to_owned()
                } else {
                    match status.code() {
                        Some(code @ (0 | 3)) => {
                            match serde_json::from_slice::<Value>(&out) {
                                Ok(v) => match v["state"].as_str().and_then(State::parse) {
                                    Some(state) => {
                                        // Exit 3: cancelled, or being cancelled (it can only
                                        // end cancelled).
                                        let cancelled =
                                            matches!(state, State::Cancelled | State::Canceling);
                                        if (code == 3) != cancelled {
                                            tally.violation(format!(
                                                "{part}: {id}: exit {code} with state {state}"
                                            ));
                                        }
                                        book.acked
                                            .lock()
                                            .unwrap()
                                            .entry(id.clone())
                                            .or_default()
                                            .push(state);
                                    }
                                    None => tally.violation(format!(
                                        "{part}: {id}: exit {code}, output {v}"
                                    )),
                                },
                                Err(e) => tally.violation(format!(
                                    "{part}: {id}: exit {code}, output not JSON ({e})"
                                )),
                            }
                            format!("exit {code}")
                        }
                        Some(1) => {
                            unanswered.push((id.clone(), terms.clone()));
                            "exit 1".to_owned()
                        }
                        other => {
                            tally.violation(format!("{part}: {id}: exit {other:?}"));
                            format!("exit {other:?}")
                        }
                    }
                };
                *exits.lock().unwrap().entry(kind).or_default() += 1;
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        if let Err(e) = r {
            tally.violation(format!("{part}: a worker panicked: {e}"));
        }
    }
    let mut sweeper_starts = 0;
    while let Some(r) = sweepers.join_next().await {
        sweeper_starts += r.unwrap_or(0);
    }
    // A final sweep (claims of killed processes last the default 30 s lease), then the audit.
    let rest = base.another_worker();
    let n = match (trio, observer) {
        (Some(trio), Some(observer)) => {
            trio_rest_and_check(part, trio, &dbs.db, &rest, &book, &tally, observer).await
        }
        _ => {
            sweep_to_rest(part, &rest, &tally, 0, Duration::from_secs(120)).await;
            audit(part, &rest, &tally).await;
            independent_check(part, &dbs, &book, &tally, &[]).await
        }
    };
    let verify: Vec<std::ffi::OsString> = dbs
        .cli_args()
        .into_iter()
        .chain(["verify".to_owned(), "--json".to_owned()])
        .map(Into::into)
        .collect();
    let r = run_cli(&dbs.db, verify).await;
    let v: Value = serde_json::from_slice(&r.stdout).unwrap_or(Value::Null);
    let failing: Vec<&str> = v["checks"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter(|c| c["ok"] != true)
                .filter_map(|c| c["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    if !matches!(r.status.code(), Some(0 | 1))
        || v["checks"].as_array().is_none()
        || !failing.is_empty()
    {
        tally.violation(format!("{part}: `couch-ledger verify` on {dbs} says {v}"));
    }
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    if split {
        tally.split_rounds.fetch_add(1, Ordering::Relaxed);
    }
    let exits = exits.lock().unwrap().clone();
    eprintln!(
        "{part} ({} layout): {n} transfers by {} processes ({exits:?}); sweep --watch started {sweeper_starts} times; {} SIGKILLs in all; {:?}",
        dbs.layout(),
        exits.values().sum::<u64>(),
        tally.kills.load(Ordering::Relaxed),
        started.elapsed()
    );
}
