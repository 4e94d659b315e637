//! R1, crash simulation: workers that "die" at every fail point of the protocol, retries,
//! races of one id from two processes, cancels, reversals and late workers, with three
//! sweepers finishing what they leave; rounds on both layouts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use couch_ledger::{Client, Error, Ledger, PauseHook, State, TransferOutcome, FAIL_POINTS};

use crate::shared::{
    another, another_with, crash_point, create_accounts, eur, eur_accounts, part_ledger,
    spawn_overdraft_monitor, spawn_sweeper, usd, Acct, Book, Dbs, Size, Tally, Terms,
};
use crate::support::trio::Trio;
use crate::trio::{rest_and_check, trio_ready};

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
            // Answered before its end: at the commit (stepwise), or at the decision with the
            // settles still running in a task of this worker (one-write, which answers `done`).
            if l.finishes_in_background() && (o.state == State::Committed || l.finishing() > 0) {
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
                book.ask(&format!("rev-{id}"), t.reversal(&id));
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
pub async fn r1_round(
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
    // Every ledger of the round is made from `base` (`another`), so has its layout; raw reads
    // of accounts and transfers go to `dbs.hot`.
    let base = part_ledger(trio, &format!("{part}_{round}"), split).await;
    let dbs = Dbs::of(&base);
    assert_eq!(dbs.split(), split, "{part} round {round}: layout");
    eprintln!("{part} round {round}: {} layout, on {dbs}", dbs.layout());
    create_accounts(&base, &r1_accounts(size)).await;
    let observer = match trio {
        Some(trio) => Some(trio_ready(part, trio, &dbs.db, &tally).await),
        None => None,
    };

    let book = Arc::new(Book::default());
    let lease = Duration::from_millis(1_000);
    let load = Load {
        part,
        seed,
        eur_accounts: size.r1_accounts,
        target,
        until,
        base: base.clone(),
        lease,
        hook: late_hook(lease * 3 / 2),
        book: book.clone(),
        tally: tally.clone(),
        asked_new: Arc::new(AtomicU64::new(0)),
        open: Arc::new(AtomicU64::new(0)),
    };
    let report = run_load(&load, &dbs, started).await;

    // The rest sweep drives everything left under a lease long enough not to lose it to a slow
    // server (correctness never depends on the lease; progress does).
    let rest = another(&base, Duration::from_secs(10));
    let on_trio = trio.zip(observer);
    let n = rest_and_check(
        part,
        on_trio,
        &rest,
        &dbs,
        &book,
        &tally,
        Duration::from_secs(300),
    )
    .await;
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    let asked = load.asked_new.load(Ordering::Relaxed);
    let clean = tally.violations() == violations_before;
    if split {
        tally.split_rounds.fetch_add(1, Ordering::Relaxed);
    }
    eprintln!(
        "{part} round {round} ({} layout): {n} transfer documents for {asked} new transfers asked, load {:?} (+ rest and audit: {:?} in all); worker process restarts {}; sweepers (passes, finished, orphan markers repaired) {:?}; overdraft samples {}",
        dbs.layout(),
        report.load_time,
        started.elapsed(),
        report.process_restarts,
        report.sweepers,
        report.overdraft_samples
    );
    if trio.is_some() {
        // The trio's nodes (and their data) go when the part drops it.
    } else if clean {
        drop_round_databases(part, round, &base, &dbs).await;
    } else {
        eprintln!("{part} round {round}: violations; databases {dbs} kept for inspection");
    }
    (n, asked)
}

/// What a round's load did, for its report line.
struct LoadReport {
    /// From the round's start to the last worker's end.
    load_time: Duration,
    process_restarts: u64,
    /// Each sweeper's (passes, finished, orphan markers repaired).
    sweepers: Vec<(u64, u64, u64)>,
    overdraft_samples: u64,
}

/// The load of a round: eight workers with the fail points on, three sweepers, the overdraft
/// monitor and the watcher of open transfers, until the round has enough; then the fail points
/// off and everything stopped.
async fn run_load(load: &Load, dbs: &Dbs, started: Instant) -> LoadReport {
    let (part, tally) = (load.part, &load.tally);
    let stale_after = Duration::from_millis(250);
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = spawn_overdraft_monitor(part, dbs.hot.clone(), tally.clone(), stop.clone());
    let sweepers: Vec<_> = (0..3)
        .map(|i| {
            spawn_sweeper(
                part,
                another(&load.base, load.lease),
                stale_after,
                tally.clone(),
                stop.clone(),
                load.seed ^ (0x5eed_0000 + i),
            )
        })
        .collect();
    fail_points_on();
    let watcher = spawn_open_watcher(
        load.base.hot_client().clone(),
        load.open.clone(),
        stop.clone(),
    );
    let mut workers = JoinSet::new();
    for w in 0..8 {
        workers.spawn(r1_worker(w, load.clone()));
    }
    let mut process_restarts = 0;
    while let Some(r) = workers.join_next().await {
        process_restarts += r.unwrap();
    }
    let load_time = started.elapsed();
    fail_points_off();
    stop.store(true, Ordering::Relaxed);
    let mut summary = Vec::new();
    for s in sweepers {
        summary.push(s.await.unwrap());
    }
    let overdraft_samples = monitor.await.unwrap();
    watcher.await.unwrap();
    LoadReport {
        load_time,
        process_restarts,
        sweepers: summary,
        overdraft_samples,
    }
}

/// R1's accounts: EUR accounts with a minimum of 0, an unlimited issuer, two USD accounts.
fn r1_accounts(size: Size) -> Vec<Acct> {
    let mut accounts = eur_accounts("e", size.r1_accounts, 20_000);
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
    accounts
}

/// What an R1 round's workers share.
#[derive(Clone)]
struct Load {
    part: &'static str,
    seed: u64,
    eur_accounts: usize,
    /// New transfers to ask for.
    target: u64,
    /// No new work after this.
    until: Instant,
    /// Every ledger of the round is made from it.
    base: Ledger,
    lease: Duration,
    hook: PauseHook,
    book: Arc<Book>,
    tally: Arc<Tally>,
    /// New transfers asked for so far.
    asked_new: Arc<AtomicU64>,
    /// Open transfers, as the watcher last counted them.
    open: Arc<AtomicU64>,
}

impl Load {
    fn enough(&self) -> bool {
        self.asked_new.load(Ordering::Relaxed) >= self.target || Instant::now() > self.until
    }

    /// A new worker "process" on the round's databases, finishing in the background or not.
    fn make(&self, background: bool) -> Ledger {
        another_with(&self.base, self.lease, |b| {
            b.pause_hook(self.hook.clone())
                .background_finish(background)
        })
    }
}

/// Open transfers, as the by_state view (of the database of transfers) counts them, stored in
/// `open` every 500 ms until `stop`.
fn spawn_open_watcher(
    client: Client,
    open: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
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
}

/// R1's worker `w`: up to four operations in flight until the round has enough; a crash at a
/// fail point restarts its "process" half the time. Returns its process restarts.
async fn r1_worker(w: usize, load: Load) -> u64 {
    let mut worker = Worker {
        index: w,
        rng: fastrand::Rng::with_seed(load.seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9)),
        next: 0,
        history: Vec::new(),
    };
    // Odd workers answer at the commit and finish in the background; every ledger they made
    // is flushed before the round rests (a restarted "process" keeps finishing what it had,
    // like one that stopped late).
    let background = w % 2 == 1;
    let mut ledger = load.make(background);
    let mut made = vec![ledger.clone()];
    let twin = load.make(background);
    made.push(twin.clone());
    let mut inflight = JoinSet::new();
    let mut restarts = 0u64;
    loop {
        top_up(&mut worker, &mut inflight, &load, &ledger, &twin).await;
        match inflight.join_next().await {
            Some(Ok(true)) => {
                // The process "died" at a fail point: half the time it comes back as a new
                // process (new worker id, empty caches), else it goes on.
                if worker.rng.bool() {
                    ledger = load.make(background);
                    made.push(ledger.clone());
                    restarts += 1;
                }
            }
            Some(Ok(false)) => {}
            Some(Err(e)) => load
                .tally
                .violation(format!("{}: a worker task panicked: {e}", load.part)),
            None => break,
        }
    }
    for l in made {
        l.flush().await;
    }
    restarts
}

/// Starts operations until four are in flight or the round has enough.
async fn top_up(
    worker: &mut Worker,
    inflight: &mut JoinSet<bool>,
    load: &Load,
    ledger: &Ledger,
    twin: &Ledger,
) {
    while inflight.len() < 4 && !load.enough() {
        // Back-pressure: work abandoned for the sweepers (crashes, --no-wait, lost leases)
        // must not pile up faster than they finish it, or the orphan markers they must find
        // drown under the markers of stuck transfers.
        if load.open.load(Ordering::Relaxed) > OPEN_BACKLOG_MAX {
            if inflight.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            break;
        }
        let op = worker.pick(load.eur_accounts, true);
        match &op {
            Op::Submit { id, terms, .. } | Op::Race { id, terms } | Op::Late { id, terms } => {
                load.asked_new.fetch_add(1, Ordering::Relaxed);
                worker.history.push((id.clone(), terms.clone()));
            }
            _ => {}
        }
        inflight.spawn(run_op(
            load.part,
            op,
            ledger.clone(),
            twin.clone(),
            load.book.clone(),
            load.tally.clone(),
        ));
    }
}

/// A clean round's databases are dropped so the server stays small for the next one; a round
/// with violations keeps them for inspection.
async fn drop_round_databases(part: &str, round: u64, base: &Ledger, dbs: &Dbs) {
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
pub async fn r1(size: Size, seed: u64, tally: Arc<Tally>) {
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
            "r1: no submit was answered before its end by a worker finishing in the background",
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
