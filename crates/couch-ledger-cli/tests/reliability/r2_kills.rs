//! R2, process kill soak: `couch-ledger transfer` processes one after another and `sweep
//! --watch` processes beside them, SIGKILLed at random moments and started again; a killed
//! transfer is often sent again under its id. Afterwards nothing is lost or counted twice.

use std::collections::BTreeMap;
use std::process::ExitStatus;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinSet;

use couch_ledger::{Ledger, State};

use crate::shared::{
    cli_has_transfers, create_accounts, eur_accounts, kill_if_running, part_ledger, run_cli,
    spawn_cli, Book, Dbs, Size, Tally, Terms,
};
use crate::support::trio::Trio;
use crate::trio::{rest_and_check, trio_ready, Observer};

/// Exits of the transfer processes, by kind (`killed`, `exit 0`, …).
type Exits = Arc<Mutex<BTreeMap<String, u64>>>;

/// R2; with `trio`, on the replicating trio, every process through its proxy (`part` is then
/// `r2_trio`); with `split`, on the split layout (accounts and transfers in a second database,
/// every process run with `--hot-db`; not on the trio).
pub async fn r2(
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
    create_accounts(&base, &eur_accounts("k", 6, 200_000)).await;
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
    let exits = Exits::default();

    let mut sweepers = JoinSet::new();
    for s in 0..2u64 {
        let rng = fastrand::Rng::with_seed(seed ^ (0x2200 + s));
        sweepers.spawn(sweeper_processes(
            part,
            dbs.clone(),
            tally.clone(),
            rng,
            soak_end,
        ));
    }
    let mut workers = JoinSet::new();
    for w in 0..4u64 {
        let worker = TransferProcesses {
            part,
            w,
            dbs: dbs.clone(),
            tally: tally.clone(),
            book: book.clone(),
            exits: exits.clone(),
        };
        let rng = fastrand::Rng::with_seed(seed ^ (0x2210 + w));
        workers.spawn(worker.run(rng, soak_end));
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
    let n = r2_rest_and_check(part, trio.zip(observer), &base, &dbs, &book, &tally).await;
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

/// A sweeper: `sweep --watch` processes, SIGKILLed at random moments and started again until
/// `soak_end`; the last one stops the way an operator stops it. Returns the processes started.
async fn sweeper_processes(
    part: &'static str,
    dbs: Dbs,
    tally: Arc<Tally>,
    mut rng: fastrand::Rng,
    soak_end: Instant,
) -> u64 {
    let watch = ["sweep", "--watch", "--stale-after", "1s", "--batch", "200"].map(str::to_owned);
    let mut starts = 0u64;
    while Instant::now() < soak_end {
        let mut child = spawn_cli(&dbs, &watch);
        starts += 1;
        let live = Duration::from_millis(rng.u64(1_500..8_000));
        tokio::time::sleep(live.min(soak_end.saturating_duration_since(Instant::now()))).await;
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
}

/// A worker: one `transfer` process after another, some SIGKILLed mid-flight; a killed id is
/// often sent again (same terms), as a caller that never got an answer would.
struct TransferProcesses {
    part: &'static str,
    w: u64,
    dbs: Dbs,
    tally: Arc<Tally>,
    book: Arc<Book>,
    exits: Exits,
}

impl TransferProcesses {
    async fn run(self, mut rng: fastrand::Rng, soak_end: Instant) {
        let mut unanswered: Vec<(String, Terms)> = Vec::new();
        let mut n = 0u64;
        while Instant::now() < soak_end {
            let (id, terms) = if !unanswered.is_empty() && rng.u32(0..100) < 40 {
                unanswered.swap_remove(rng.usize(..unanswered.len()))
            } else {
                n += 1;
                (format!("r2-w{}-{n}", self.w), new_terms(&mut rng))
            };
            self.book.ask(&id, terms.clone());
            let (out, killed, status) = self.transfer(&id, &terms, &mut rng).await;
            let kind = if killed {
                self.tally.kills.fetch_add(1, Ordering::Relaxed);
                unanswered.push((id.clone(), terms.clone()));
                "killed".to_owned()
            } else {
                match status.code() {
                    Some(code @ (0 | 3)) => {
                        self.answered(&id, code, &out);
                        format!("exit {code}")
                    }
                    Some(1) => {
                        unanswered.push((id.clone(), terms.clone()));
                        "exit 1".to_owned()
                    }
                    other => {
                        self.tally
                            .violation(format!("{}: {id}: exit {other:?}", self.part));
                        format!("exit {other:?}")
                    }
                }
            };
            *self.exits.lock().unwrap().entry(kind).or_default() += 1;
        }
    }

    /// Runs `couch-ledger transfer --json` for `id`, sometimes `--no-wait`, SIGKILLed after a
    /// random moment a third of the time. Returns its stdout, whether it was killed, and how it
    /// exited.
    async fn transfer(
        &self,
        id: &str,
        terms: &Terms,
        rng: &mut fastrand::Rng,
    ) -> (Vec<u8>, bool, ExitStatus) {
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
            id,
        ]
        .map(str::to_owned)
        .to_vec();
        if rng.u32(0..100) < 20 {
            args.push("--no-wait".into());
        }
        let mut child = spawn_cli(&self.dbs, &args);
        let mut stdout = child.stdout.take().unwrap();
        let kill_at = (rng.u32(0..100) < 35).then(|| Duration::from_millis(rng.u64(5..400)));
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
        (out, killed, status)
    }

    /// An answer (exit 0 or 3): its JSON's state is acknowledged, and exit 3 goes with a
    /// cancelled transfer, or one being cancelled (it can only end cancelled).
    fn answered(&self, id: &str, code: i32, out: &[u8]) {
        let part = self.part;
        match serde_json::from_slice::<Value>(out) {
            Ok(v) => match v["state"].as_str().and_then(State::parse) {
                Some(state) => {
                    let cancelled = matches!(state, State::Cancelled | State::Canceling);
                    if (code == 3) != cancelled {
                        self.tally
                            .violation(format!("{part}: {id}: exit {code} with state {state}"));
                    }
                    self.book
                        .acked
                        .lock()
                        .unwrap()
                        .entry(id.to_owned())
                        .or_default()
                        .push(state);
                }
                None => self
                    .tally
                    .violation(format!("{part}: {id}: exit {code}, output {v}")),
            },
            Err(e) => self
                .tally
                .violation(format!("{part}: {id}: exit {code}, output not JSON ({e})")),
        }
    }
}

/// A new transfer between two of R2's six accounts; one in twenty for more than any holds.
fn new_terms(rng: &mut fastrand::Rng) -> Terms {
    Terms::random_eur(rng, "k", 6, |rng| {
        if rng.u32(0..100) < 5 {
            50_000_000
        } else {
            rng.i64(1..=20_000)
        }
    })
}

/// The end of R2: a final sweep (claims of killed processes last the default 30 s lease), the
/// audit and the independent check (on the trio, after the nodes converged), then the
/// program's own `verify`. Returns the transfer documents found.
async fn r2_rest_and_check(
    part: &'static str,
    on_trio: Option<(&Trio, Observer)>,
    base: &Ledger,
    dbs: &Dbs,
    book: &Book,
    tally: &Tally,
) -> u64 {
    let rest = base.another_worker();
    let deadline = Duration::from_secs(120);
    let n = rest_and_check(part, on_trio, &rest, dbs, book, tally, deadline).await;
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
    n
}
