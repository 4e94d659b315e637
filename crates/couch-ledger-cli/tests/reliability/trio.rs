//! R1 and R2 on the replicating trio.
//!
//! Three pouchdb-server nodes replicating continuously to each other behind a round-robin proxy
//! (crates/testkit/src/trio.rs): a `_rev` compare-and-swap through two nodes can succeed twice and
//! leave a conflict, as on a CouchDB cluster. R1's and R2's workloads run through the proxy; at
//! the end the harness waits for the nodes to converge and the sweeper to resolve what
//! conflicted, then checks the invariants on node 0 (all three then hold the same).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_ledger::{Client, Ledger, SweepOptions};

use crate::r1_crashes::r1_round;
use crate::shared::{
    audit, independent_check, sweep_to_rest, Book, Dbs, Size, Tally, ACCOUNTS_AT_DEFAULT_QUORUM,
};
use crate::support;
use crate::support::trio::{Balance, Trio};

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
pub struct Observer {
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
pub async fn trio_ready(part: &'static str, trio: &Trio, db: &str, tally: &Tally) -> Observer {
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
    let (left, passes) = sweep_until_settled(part, trio, db, rest, tally, &observer.log).await;
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
    let before = tally.violations();
    audit(part, &on_node, tally).await;
    // The trio parts run the single layout (`part_ledger`): everything is in `db`.
    let n = independent_check(part, &Dbs::of(&on_node), book, tally, &[]).await;
    if tally.violations() > before {
        entries_against_documents(part, &trio.node(0), db).await;
    }
    tally.settle_overdrafts(part);
    n
}

/// For a person chasing a failed audit: every entry of an account that disagrees with its
/// transfer's document (settled entries are kept on the trio, which states three copies, and
/// never pruned with accounts at the default quorum).
async fn entries_against_documents(part: &str, node: &str, db: &str) {
    let Some(all) =
        support::trio::get_json(&format!("{node}/{db}/_all_docs?include_docs=true")).await
    else {
        eprintln!("{part}: could not read {db} to compare entries with documents");
        return;
    };
    let rows = all["rows"].as_array().cloned().unwrap_or_default();
    let docs: BTreeMap<String, serde_json::Value> = rows
        .iter()
        .map(|r| (r["id"].as_str().unwrap_or("").to_owned(), r["doc"].clone()))
        .collect();
    // Per account: txn -> "settled" | "undone" (entries are stored in groups by time).
    let entry_of = |a: &serde_json::Value, txn: &str| -> Option<&'static str> {
        for g in a["settled"].as_array().into_iter().flatten() {
            if g["txns"].as_array().into_iter().flatten().any(|t| t == txn) {
                return Some("settled");
            }
            if g["undone"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t == txn)
            {
                return Some("undone");
            }
        }
        None
    };
    let mut mismatched = BTreeSet::new();
    for (id, t) in docs.iter().filter(|(id, _)| id.starts_with("txn:")) {
        let txn = &id["txn:".len()..];
        let state = t["state"].as_str().unwrap_or("?");
        for side in ["source", "destination"] {
            let account = t[side].as_str().unwrap_or("?");
            let Some(a) = docs.get(&format!("account:{account}")) else {
                continue;
            };
            let pending = a["pending"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["txn"] == txn);
            let entry = entry_of(a, txn);
            let fits = match state {
                "done" | "committed" => entry == Some("settled"),
                "cancelled" => entry != Some("settled") && !pending,
                _ => true,
            };
            if !fits {
                mismatched.insert(txn.to_owned());
                eprintln!(
                    "ENTRY {part}: {txn} is {state} (value {}), but {account} ({side}) holds {} {}",
                    t["value"],
                    entry.unwrap_or("no entry"),
                    if pending { "and a pending marker" } else { "" }
                );
            }
        }
    }
    print_logs_of(part, &mismatched);
}

/// The captured log lines that name one of `txns` (at most [`LOG_LINES_MAX`] per transfer),
/// so that a failed run in CI shows what the ledger did with them.
fn print_logs_of(part: &str, txns: &BTreeSet<String>) {
    const LOG_LINES_MAX: usize = 80;
    if txns.is_empty() {
        return;
    }
    let logs = crate::shared::capture_logs();
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    for txn in txns {
        // The id, not a longer one it begins (`r1-w3-39` in `r1-w3-390`).
        let names = |l: &str| {
            l.match_indices(txn.as_str()).any(|(at, _)| {
                !l[at + txn.len()..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            })
        };
        let lines: Vec<&str> = text.lines().filter(|l| names(l)).collect();
        eprintln!(
            "{part}: {} log lines name {txn}{}",
            lines.len(),
            if lines.len() > LOG_LINES_MAX {
                format!(" (the last {LOG_LINES_MAX})")
            } else {
                String::new()
            }
        );
        for line in &lines[lines.len().saturating_sub(LOG_LINES_MAX)..] {
            eprintln!("  {line}");
        }
    }
}

/// The end of an R1 round or of R2: on the trio, [`trio_rest_and_check`]; elsewhere, sweep
/// `rest` to rest within `deadline`, audit, check independently, and judge the overdrafts seen
/// (R2 watches none). Returns the transfer documents found.
pub async fn rest_and_check(
    part: &'static str,
    on_trio: Option<(&Trio, Observer)>,
    rest: &Ledger,
    dbs: &Dbs,
    book: &Book,
    tally: &Tally,
    deadline: Duration,
) -> u64 {
    if let Some((trio, observer)) = on_trio {
        return trio_rest_and_check(part, trio, &dbs.db, rest, book, tally, observer).await;
    }
    sweep_to_rest(part, rest, tally, 0, deadline).await;
    audit(part, rest, tally).await;
    let n = independent_check(part, dbs, book, tally, &[]).await;
    tally.settle_overdrafts(part);
    n
}

/// Sweeps through the proxy and waits for the nodes to converge, until the ledger is at rest
/// with no document conflicted, the same conflicts stay through [`STUCK_PASSES`] passes at
/// rest, or time runs out. Returns the documents left conflicted and the passes made.
async fn sweep_until_settled(
    part: &'static str,
    trio: &Trio,
    db: &str,
    rest: &Ledger,
    tally: &Tally,
    log: &ConflictLog,
) -> (BTreeMap<String, Vec<String>>, u64) {
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
        log.record(&conflicted);
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
        let first_ids = || {
            conflicted
                .iter()
                .map(|(id, _)| id.as_str())
                .take(10)
                .collect::<Vec<_>>()
        };
        if stuck.1 >= STUCK_PASSES {
            tally.violation(format!(
                "{part}: at rest, but {} documents stay conflicted through {STUCK_PASSES} sweep passes: {:?}",
                conflicted.len(),
                first_ids()
            ));
            break conflicted.into_iter().collect();
        }
        if started.elapsed() > deadline {
            tally.violation(format!(
                "{part}: not at rest within {deadline:?} after {passes} sweep passes: {} documents still conflicted ({:?}), status {status:?}",
                conflicted.len(),
                first_ids()
            ));
            break conflicted.into_iter().collect();
        }
        match rest.sweep_once(now.clone()).await {
            Ok(o) => tally.problems(part, &o.problems),
            Err(e) => tally.error(part, &e),
        }
        passes += 1;
    };
    (left, passes)
}

/// R1 on the trio: a round of R1's workload (crashes at fail points, retries, races, cancels,
/// reversals, late workers, three sweepers), every ledger through the proxy; a short one more
/// when killed workers left fewer transfer documents than asked.
pub async fn r1_trio(size: Size, seed: u64, tally: Arc<Tally>) {
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
