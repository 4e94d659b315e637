//! What the transfer figures share: their accounts and ledgers, runs of transfers checked
//! `done`, the raw bulk limit they are divided by, the audit after their load, and what `p3`
//! found a transfer costs.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, ensure, Result};
use couch_ledger::{Amount, Client, Currency, Ledger, State, TransferRequest, VerifyOptions};
use serde::Serialize;
use serde_json::{json, Value};

use crate::bench::{Bench, Side};
use crate::p1_writes::BenchDoc;
use crate::p2_bulk::BulkWriter;
use crate::p8_batched::P8_POOL_ACCOUNTS;
use crate::rounds::{run_concurrently, steady_rate};
use crate::settings::Layout;
use crate::sizes::{BULK_BATCH_DOCS, LOAD_BATCH_DOCS};

/// Every benchmark account's opening balance and minimum: far more than a figure moves, so no
/// transfer is refused for funds — and every figure checks that each of its transfers ended
/// `done`.
pub const ACCOUNT_OPENING_MINOR: i64 = 1_000_000_000;
pub const ACCOUNT_MIN_BALANCE_MINOR: i64 = 0;
pub const TRANSFER_CURRENCY: &str = "EUR";

/// One account of a benchmark ledger: `{prefix}{i}`, fixed width.
pub fn account_id(prefix: &str, i: usize) -> String {
    format!("{prefix}{i:07}")
}

/// An amount that differs from transfer to transfer (a constant amount would let a wrong
/// balance hide behind a symmetric one), in minor units.
pub fn transfer_amount(i: usize) -> i64 {
    100 + (i % 900) as i64
}

pub fn transfer_request(
    id: String,
    source: String,
    destination: String,
    i: usize,
) -> Result<TransferRequest> {
    Ok(TransferRequest {
        id: Some(id),
        source,
        destination,
        amount: Amount::new(transfer_amount(i))?,
        currency: Currency::from_code(TRANSFER_CURRENCY)?,
        meta: Default::default(),
    })
}

/// Submits a transfer, waits for it and fails unless it ended `done`.
pub async fn transfer_done(ledger: &Ledger, request: TransferRequest) -> Result<()> {
    let outcome = ledger.submit(request, true).await?;
    // A ledger finishing in the background answers at the commit; the round's flush waits
    // for the rest (and the audit after the load checks every transfer ended done).
    let background = ledger.finishes_in_background() && outcome.state == State::Committed;
    ensure!(
        outcome.state == State::Done || background,
        "transfer {} ended {} ({:?})",
        outcome.id,
        outcome.state,
        outcome.reason
    );
    Ok(())
}

/// A fresh ledger database with its design documents.
pub async fn fresh_ledger(bench: &Bench, purpose: &str) -> Result<Ledger> {
    fresh_ledger_in(bench, purpose, bench.settings.layout).await
}

/// A fresh, initialised ledger of `layout`: split, its hot database is `<db>_hot`.
pub async fn fresh_ledger_in(bench: &Bench, purpose: &str, layout: Layout) -> Result<Ledger> {
    let client = bench.fresh_database(purpose).await?;
    let hot = format!("{}_hot", client.database());
    let ledger = match layout {
        Layout::Single => Ledger::new(client),
        Layout::Split => Ledger::builder(client).hot_database(&hot).build()?,
    };
    ledger.init().await?;
    Ok(ledger)
}

/// HTTP requests the ledger's clients have sent (both databases' when split).
pub fn requests_of(ledger: &Ledger) -> u64 {
    let mut n = ledger.client().requests_sent();
    if ledger.hot_database().is_some() {
        n += ledger.hot_client().requests_sent();
    }
    n
}

/// Document writes so far in the ledger's databases (`update_seq`, both when split).
pub async fn writes_of(ledger: &Ledger) -> Result<u64> {
    let mut n = update_seq(ledger.client()).await?;
    if ledger.hot_database().is_some() {
        n += update_seq(ledger.hot_client()).await?;
    }
    Ok(n)
}

/// The `--db` (and `--hot-db`) arguments of the program on `ledger`.
pub fn ledger_args(ledger: &Ledger) -> Vec<String> {
    let mut args = vec!["--db".to_owned(), ledger.client().database().to_owned()];
    if let Some(hot) = ledger.hot_database() {
        args.extend(["--hot-db".to_owned(), hot.to_owned()]);
    }
    args
}

/// Writes `docs` with `_bulk_docs` in batches of [`LOAD_BATCH_DOCS`], failing on any refusal.
pub async fn load_docs(client: &Client, docs: &[Value]) -> Result<()> {
    for batch in docs.chunks(LOAD_BATCH_DOCS) {
        let results = client.bulk_docs(batch).await?;
        if let Some(bad) = results.iter().find(|r| !r.is_ok()) {
            bail!("loading {}: {bad:?}", client.database());
        }
    }
    Ok(())
}

/// Creates accounts with `_bulk_docs` in the shape `Ledger::create_account` writes
/// (docs/DOCUMENTS.md), their opening records first: thousands of single PUTs would cost more
/// than the figures they feed. `p3` creates its accounts through the API.
pub async fn load_accounts(ledger: &Ledger, accounts: &[String]) -> Result<()> {
    load_docs(ledger.client(), &opening_docs(accounts)).await?;
    load_docs(ledger.hot_client(), &account_docs(accounts)).await
}

/// The accounts' opening records, as `Ledger::create_account` writes them into the ledger's
/// database: what `verify` takes their openings from.
pub fn opening_docs(accounts: &[String]) -> Vec<Value> {
    accounts
        .iter()
        .map(|account| {
            json!({
                "_id": format!("opening:{account}"),
                "type": "opening",
                "account_id": account,
                "currency": TRANSFER_CURRENCY,
                "opening": ACCOUNT_OPENING_MINOR,
                "min_balance": ACCOUNT_MIN_BALANCE_MINOR,
            })
        })
        .collect()
}

/// New accounts as `Ledger::create_account` writes them.
pub fn account_docs(accounts: &[String]) -> Vec<Value> {
    let now = unix_ms();
    accounts
        .iter()
        .map(|account| {
            json!({
                "_id": format!("account:{account}"),
                "type": "account",
                "account_id": account,
                "currency": TRANSFER_CURRENCY,
                "opening": ACCOUNT_OPENING_MINOR,
                "balance": ACCOUNT_OPENING_MINOR,
                "min_balance": ACCOUNT_MIN_BALANCE_MINOR,
                "pending": [],
                "settled": [],
                "created_at": now,
            })
        })
        .collect()
}

pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The database's update sequence as a count of document writes: a number on pouchdb-server;
/// on CouchDB 3 an opaque string whose numeric prefix sums the shards' counters.
pub async fn update_seq(client: &Client) -> Result<u64> {
    let info = client.database_info().await?;
    let seq = &info["update_seq"];
    seq.as_u64()
        .or_else(|| {
            seq.as_str()
                .and_then(|s| s.split('-').next())
                .and_then(|n| n.parse().ok())
        })
        .ok_or_else(|| anyhow!("update_seq {seq} is not a count"))
}

/// Checks the invariants of docs/PROTOCOL.md on a ledger at rest (every transfer finished, no marker pending,
/// exactly-once strictly) and fails the bench loudly on any violation: a fast but wrong ledger
/// is worthless. Then deletes the database. Returns how long the audit took.
pub async fn verify_and_drop(ledger: &Ledger) -> Result<Duration> {
    verify_and_drop_but(ledger, &[]).await
}

/// [`verify_and_drop`], except the checks named in `waived` (a database set up without one of
/// the design documents on purpose).
pub async fn verify_and_drop_but(ledger: &Ledger, waived: &[&str]) -> Result<Duration> {
    let started = Instant::now();
    let report = ledger.verify_with(VerifyOptions::at_rest()).await?;
    let took = started.elapsed();
    let failed = report
        .checks
        .iter()
        .any(|c| !c.ok && !waived.contains(&c.name.as_str()));
    if failed {
        let broken: Vec<String> = report
            .checks
            .iter()
            .filter(|c| !c.ok && !waived.contains(&c.name.as_str()))
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        bail!(
            "INVARIANT VIOLATED in {} after the load — the figures are void:\n  {}",
            ledger.client().database(),
            broken.join("\n  ")
        );
    }
    drop_ledger(ledger).await?;
    Ok(took)
}

/// Deletes the ledger's database, and its hot database when split.
pub async fn drop_ledger(ledger: &Ledger) -> Result<()> {
    ledger.client().delete_database().await?;
    if ledger.hot_database().is_some() {
        ledger.hot_client().delete_database().await?;
    }
    Ok(())
}

/// `p3`'s transfer `i`: between two accounts of its own.
pub fn fresh_pair(i: usize) -> (String, String) {
    (account_id("s", i), account_id("d", i))
}

/// Which accounts transfer `i`, made by worker `w`, moves money between.
pub type Pairing = fn(usize, usize) -> (String, String);

/// Each worker between two accounts of its own: nobody else touches them.
pub fn own_pair(w: usize, _: usize) -> (String, String) {
    (account_id("s", w), account_id("d", w))
}

/// Two different accounts of `p8`'s pool, drawn at random (seeded by `i`).
pub fn pool_pair(_: usize, i: usize) -> (String, String) {
    pool_pair_of(i, P8_POOL_ACCOUNTS)
}

pub fn pool_pair_of(i: usize, pool: usize) -> (String, String) {
    let mut rng = fastrand::Rng::with_seed(i as u64);
    let source = rng.usize(..pool);
    let destination = (source + 1 + rng.usize(..pool - 1)) % pool;
    (account_id("p", source), account_id("p", destination))
}

/// Transfers `jobs` (ids `{side}{i}`), by `concurrency` workers each taking the next index,
/// worker `w`'s transfer `i` between `pairing(w, i)`; every one checked `done`. When each
/// finished, in order; the first error ends the run.
pub async fn run_transfers(
    ledger: &Ledger,
    side: &'static str,
    jobs: Range<usize>,
    concurrency: usize,
    pairing: Pairing,
) -> Result<Vec<Instant>> {
    let started = Instant::now();
    let finished = {
        let ledger = ledger.clone();
        run_concurrently(jobs, concurrency, move |w, i| {
            let ledger = ledger.clone();
            async move {
                let (source, destination) = pairing(w, i);
                let request = transfer_request(format!("{side}{i:07}"), source, destination, i)?;
                transfer_done(&ledger, request).await
            }
        })
        .await?
    };
    // A ledger finishing in the background (p8): what was still settling when the last caller
    // had its answer, and the time to let it end — before the next side's round starts, so
    // none of this round's work runs in another side's time.
    let backlog = ledger.finishing();
    let answered = started.elapsed();
    ledger.flush().await;
    FLUSHES.lock().expect("not poisoned").push(Flush {
        database: ledger.client().database().to_owned(),
        backlog,
        answered,
        flushed: started.elapsed(),
        jobs: finished.len(),
    });
    Ok(finished)
}

/// What `p8`'s rounds left to finish in the background, and how long that took: the rounds'
/// transfers/s to the last answer and to the last `done`.
pub fn finish_summary(flushes: &[Flush], folded: u64) -> String {
    let jobs: usize = flushes.iter().map(|f| f.jobs).sum();
    let answered: f64 = flushes.iter().map(|f| f.answered.as_secs_f64()).sum();
    let flushed: f64 = flushes.iter().map(|f| f.flushed.as_secs_f64()).sum();
    let backlog_max = flushes.iter().map(|f| f.backlog).max().unwrap_or(0);
    let backlog_mean =
        flushes.iter().map(|f| f.backlog).sum::<usize>() as f64 / flushes.len().max(1) as f64;
    format!(
        "{backlog_mean:.0} transfers still finishing at a round's last answer (at most \
         {backlog_max}); whole rounds {:.1} transfers/s to the last answer, {:.1} to the last \
         done; {folded} settles folded into another write of their account",
        jobs as f64 / answered.max(1e-9),
        jobs as f64 / flushed.max(1e-9)
    )
}

/// One round of [`run_transfers`] as seen by a ledger finishing in the background.
pub struct Flush {
    pub database: String,
    /// Transfers still finishing when the last caller had its answer.
    pub backlog: usize,
    /// From the round's start to the last answer, and to the end of the flush after it.
    pub answered: Duration,
    pub flushed: Duration,
    pub jobs: usize,
}

pub static FLUSHES: std::sync::Mutex<Vec<Flush>> = std::sync::Mutex::new(Vec::new());

/// [`run_transfers`]' steady rate (transfers/s). For a ledger finishing in the background the
/// time the round's flush took after its last answer is added to the window: every settle and
/// `done` of the window's transfers is then inside it (with the tail's, so the figure errs low).
pub async fn transfer_round(
    ledger: &Ledger,
    side: &'static str,
    jobs: Range<usize>,
    concurrency: usize,
    pairing: Pairing,
) -> Result<f64> {
    let finished = run_transfers(ledger, side, jobs, concurrency, pairing).await?;
    if !ledger.finishes_in_background() {
        return Ok(steady_rate(&finished, concurrency));
    }
    let tail = {
        let flushes = FLUSHES.lock().expect("not poisoned");
        let last = flushes.last().expect("run_transfers recorded its flush");
        last.flushed.saturating_sub(last.answered)
    };
    let (first, last) = (concurrency - 1, finished.len() - concurrency);
    Ok((last - first) as f64 / ((finished[last] - finished[first]) + tail).as_secs_f64())
}

/// Raw `_bulk_docs` rounds: the server's bulk-write limit that `p6` and `p8` are divided by,
/// measured in the same rounds. Plain: new ~250-byte documents into a database of their own,
/// as `p2`'s raw side. Validated: new transfer documents (state `initial`) into a ledger
/// database, where the server runs `validate_doc_update` for each; the limit the ledger's own
/// writes meet.
pub struct RawBulk {
    pub writer: BulkWriter,
    pub client: Client,
    pub validated: bool,
    pub next_doc: AtomicUsize,
}

impl RawBulk {
    pub async fn new(bench: &Bench, purpose: &str, validated: bool) -> Result<RawBulk> {
        let client = if validated {
            fresh_ledger_in(bench, &format!("{purpose}_validated"), Layout::Single)
                .await?
                .client()
                .clone()
        } else {
            bench.fresh_database(&format!("{purpose}_raw")).await?
        };
        let raw = RawBulk {
            writer: BulkWriter::new(bench, Side::Raw, &client),
            client,
            validated,
            next_doc: AtomicUsize::new(0),
        };
        raw.round(1).await?; // opens the connection; untimed
        Ok(raw)
    }

    /// Docs/s of `batches` batches of [`BULK_BATCH_DOCS`] new documents, one request after
    /// another; with two batches or more the first (which may open a connection) is left out,
    /// like `p2`'s steady rate.
    pub async fn round(&self, batches: usize) -> Result<f64> {
        assert!(batches > 0);
        let mut finished = Vec::with_capacity(batches + 1);
        finished.push(Instant::now());
        for _ in 0..batches {
            let first = self.next_doc.fetch_add(BULK_BATCH_DOCS, Ordering::Relaxed);
            let ids = first..first + BULK_BATCH_DOCS;
            if self.validated {
                let then = unix_ms();
                let docs: Vec<Value> = ids
                    .map(|i| initial_transfer_doc(i, "raw", then, P8_POOL_ACCOUNTS))
                    .collect();
                self.writer.write(&docs).await?;
            } else {
                let docs: Vec<BenchDoc> = ids.map(BenchDoc::new).collect();
                self.writer.write(&docs).await?;
            }
            finished.push(Instant::now());
        }
        let skip = usize::from(batches >= 2);
        let span = finished[batches] - finished[skip];
        Ok((batches - skip) as f64 * BULK_BATCH_DOCS as f64 / span.as_secs_f64())
    }

    pub async fn drop_database(self) -> Result<()> {
        self.client.delete_database().await?;
        Ok(())
    }
}

/// Transfer `{prefix}{i}` as `submit(…, wait = false)` writes it (docs/DOCUMENTS.md): state
/// `initial`, between two random accounts of a pool, last modified at `then` + i ms (so a
/// sweeper takes them oldest first in this order).
pub fn initial_transfer_doc(i: usize, prefix: &str, then: i64, pool: usize) -> Value {
    let (source, destination) = pool_pair_of(i, pool);
    let id = format!("{prefix}{i:07}");
    json!({
        "_id": format!("txn:{id}"),
        "type": "transaction",
        "txn_id": id,
        "source": source,
        "destination": destination,
        "value": transfer_amount(i),
        "currency": TRANSFER_CURRENCY,
        "state": "initial",
        "reason": null,
        "reverses": null,
        "claim": null,
        "created_at": then + i as i64,
        "last_modified": then + i as i64,
    })
}

/// What `p3` measured, for the figures after it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TransferCost {
    /// HTTP requests per transfer between accounts this process has not seen yet.
    pub requests_cold: f64,
    /// ... between accounts the engine holds a copy of.
    pub requests_warm: f64,
    /// Document writes per transfer (the database's update sequence), transfers one at a
    /// time: what the protocol writes when nothing is shared.
    pub docs_written: f64,
}

impl Bench {
    pub fn transfer_cost(&self) -> Result<TransferCost> {
        self.measured
            .lock()
            .expect("lock")
            .transfer_cost
            .ok_or_else(|| anyhow!("p3 must run before the other transfer figures"))
    }
}
