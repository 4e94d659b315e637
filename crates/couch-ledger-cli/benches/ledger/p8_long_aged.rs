//! p8_long (opt-in) and p8_aged: p8's workload for minutes on one ledger, and on accounts
//! that carry a thousand revisions.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use couch_ledger::Ledger;
use reqwest::Method;
use serde_json::{json, Value};

use crate::bench::{Bench, Side};
use crate::p8_batched::{p8_finish, P8_CONCURRENCY, P8_POOL_ACCOUNTS, P8_TRANSFERS_PER_ROUND};
use crate::rounds::{interleaved, jobs_for_steady_rate};
use crate::row::Row;
use crate::transfers::{
    account_docs, account_id, drop_ledger, fresh_ledger, load_accounts, load_docs, opening_docs,
    pool_pair, run_transfers, transfer_round, verify_and_drop,
};

/// `BENCH_LONG_S`: how long `p8_long` runs, in seconds (unset: it does not run).
pub fn long_seconds() -> Option<u64> {
    std::env::var("BENCH_LONG_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&s| s > 0)
}

/// `p8_long`'s windows, in seconds: each reports its rate and the accounts' size.
pub const P8_LONG_WINDOW_S: u64 = 30;

/// The settled entries of an account document, stored grouped (`{at, txns, undone}`) or one
/// object each (`{txn, at}`, the older shape).
pub fn settled_count(doc: &Value) -> usize {
    let list = |v: &Value| v.as_array().map_or(0, Vec::len);
    doc["settled"].as_array().map_or(0, |entries| {
        entries
            .iter()
            .map(|e| {
                if e.get("txn").is_some() {
                    1
                } else {
                    list(&e["txns"]) + list(&e["undone"])
                }
            })
            .sum()
    })
}

/// `p8_long` (opt-in, `BENCH_LONG_S=N`): `p8`'s workload (64 callers, the same pool and
/// finish) without pause for N seconds on one ledger, reported per window of
/// [`P8_LONG_WINDOW_S`]: transfers/s (to the last `done`: each chunk of transfers is flushed
/// inside its window), and the settled entries and bytes the pool's accounts carry. It shows
/// what `p8`'s rounds are too short to: a settled entry may be pruned only after
/// `SETTLED_AGE_MIN_MS` (60 s), so an account's size, and every write's cost, settles only
/// after a minute or more. The figure: the last window's rate ÷ the first's.
pub async fn long_transfers(bench: &Bench) -> Result<Vec<Row>> {
    let total = Duration::from_secs(long_seconds().unwrap_or(0));
    let window = Duration::from_secs(P8_LONG_WINDOW_S);
    let c = P8_CONCURRENCY;
    let finish = p8_finish();
    let ledger = finish.apply(fresh_ledger(bench, "p8l").await?);
    let accounts: Vec<String> = (0..P8_POOL_ACCOUNTS).map(|i| account_id("p", i)).collect();
    let keys: Vec<String> = accounts.iter().map(|a| format!("account:{a}")).collect();
    load_accounts(&ledger, &accounts).await?;
    let chunk = P8_TRANSFERS_PER_ROUND;
    let started = Instant::now();
    let mut next = 0;
    let mut rates = Vec::new();
    while started.elapsed() < total {
        let begun = Instant::now();
        let mut made = 0;
        while begun.elapsed() < window {
            run_transfers(&ledger, "t", next..next + chunk, c, pool_pair).await?;
            next += chunk;
            made += chunk;
        }
        let rate = made as f64 / begun.elapsed().as_secs_f64();
        let rows = ledger.hot_client().all_docs(&keys, true).await?;
        let (mut entries, mut bytes) = (0usize, 0usize);
        for doc in rows.iter().filter_map(|r| r.doc.as_ref()) {
            entries += settled_count(doc);
            bytes += serde_json::to_vec(doc)?.len();
        }
        let n = rows.len().max(1);
        eprintln!(
            "  p8_long {:>4} s: {rate:7.1} transfers/s; accounts carry {:.1} settled entries, \
             {} bytes on average",
            started.elapsed().as_secs(),
            entries as f64 / n as f64,
            bytes / n
        );
        rates.push(rate);
    }
    ensure!(!rates.is_empty(), "p8_long ran no window");
    let verified = verify_and_drop(&ledger).await?;
    let first = rates[0];
    let last = *rates.last().expect("a window");
    let row = Row::new(
        "p8_long",
        format!(
            "transfers/s, c{c}, after {} s ÷ in the first {P8_LONG_WINDOW_S} s",
            total.as_secs()
        ),
        "xfers/s",
        &[last],
        &[first],
    )
    .note(format!(
        "p8's workload ({}) without pause for {} s in windows of {P8_LONG_WINDOW_S} s: {}; \
         audited in {:.1} s",
        finish.name(),
        total.as_secs(),
        rates
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        verified.as_secs_f64()
    ));
    Ok(vec![row])
}

/// Revisions each account of `p8_aged` starts with: what CouchDB keeps, at its default
/// `_revs_limit`, of an account written a thousand times or more.
pub const AGED_REVISIONS: usize = 1_000;
/// CouchDB's default `_revs_limit`.
pub const COUCHDB_DEFAULT_REVS_LIMIT: u32 = 1_000;
/// Accounts per `_bulk_docs` when planting them (each carries ~34 KB of revision ids).
pub const AGED_LOAD_BATCH_DOCS: usize = 32;
/// Rounds per side of `p8_aged`.
pub const P8_AGED_ROUNDS: usize = 4;

/// `p8_aged`: `p8`'s workload (64 callers, the same pool, the same finish) on accounts that
/// already carry the revision history of [`AGED_REVISIONS`] writes, in a ledger set up by
/// `init` (which lowers the `_revs_limit` of the accounts' database) ÷ the same in a ledger
/// whose `_revs_limit` was put back to CouchDB's default, alternating round by round. `p8`
/// starts from new accounts and never sees this; a shop's accounts have it after their first
/// thousand writes. A server without `_revs_limit` (pouchdb-server) has nothing to compare:
/// the figure is not measured there.
pub async fn aged_transfers(bench: &Bench) -> Result<Vec<Row>> {
    let rounds = bench.settings.scaled(P8_AGED_ROUNDS);
    let c = P8_CONCURRENCY;
    let finish = p8_finish();
    let transfers = jobs_for_steady_rate(P8_TRANSFERS_PER_ROUND, c);
    let accounts: Vec<String> = (0..P8_POOL_ACCOUNTS).map(|i| account_id("p", i)).collect();
    let tuned = finish.apply(fresh_ledger(bench, "p8a").await?);
    let default = finish.apply(fresh_ledger(bench, "p8d").await?);
    let tuned_limit = tuned.hot_client().revs_limit().await?;
    if tuned_limit.is_none() {
        // Nothing to compare: both sides would be the same database. (pouchdb-server keeps a
        // thousand revisions too, and slows down alike: 71 transfers/s measured.)
        eprintln!("  p8_aged: the server has no _revs_limit; not measured");
        for ledger in [&tuned, &default] {
            drop_ledger(ledger).await?;
        }
        return Ok(Vec::new());
    }
    default
        .hot_client()
        .set_revs_limit(COUCHDB_DEFAULT_REVS_LIMIT)
        .await?;
    let default_limit = default.hot_client().revs_limit().await?;
    let warm_up = rounds * transfers..rounds * transfers + 2 * c;
    for ledger in [&tuned, &default] {
        load_aged_accounts(bench, ledger, &accounts).await?;
        run_transfers(ledger, "t", warm_up.clone(), c, pool_pair).await?;
    }
    let samples = interleaved(
        &[Side::Ours, Side::DefaultRevsLimit],
        rounds,
        |side, round| {
            let ledger = if side == Side::Ours { &tuned } else { &default };
            let jobs = round * transfers..(round + 1) * transfers;
            async move { transfer_round(ledger, "t", jobs, c, pool_pair).await }
        },
    )
    .await?;
    let verified = verify_and_drop(&tuned).await? + verify_and_drop(&default).await?;
    let shown = |limit: Option<u32>| {
        limit.map_or("none (the server has no such setting)".to_owned(), |l| {
            l.to_string()
        })
    };
    let row = Row::new(
        "p8_aged",
        format!("transfers/s, c{c}, accounts at {AGED_REVISIONS} revisions, ÷ at the default _revs_limit"),
        "xfers/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::DefaultRevsLimit],
    )
    .cpu(&samples, [Side::Ours, Side::DefaultRevsLimit], rounds * transfers)
    .note(format!(
        "p8's workload ({}) on {P8_POOL_ACCOUNTS} accounts planted with {AGED_REVISIONS} \
         revisions each; ours: the accounts' database as init leaves it (_revs_limit {}); \
         raw: the same with _revs_limit {}; audited in {:.1} s",
        finish.name(),
        shown(tuned_limit),
        shown(default_limit),
        verified.as_secs_f64()
    ));
    Ok(vec![row])
}

/// Creates the accounts with the revision history of [`AGED_REVISIONS`] writes (planted with
/// `new_edits=false`, as replication writes; the server stems it to the database's
/// `_revs_limit`), so the ledger meets them as it meets accounts a long-running shop has written
/// a thousand times.
pub async fn load_aged_accounts(bench: &Bench, ledger: &Ledger, accounts: &[String]) -> Result<()> {
    load_docs(ledger.client(), &opening_docs(accounts)).await?;
    let docs: Vec<Value> = account_docs(accounts)
        .into_iter()
        .enumerate()
        .map(|(k, mut doc)| {
            let ids: Vec<String> = (0..AGED_REVISIONS)
                .map(|i| format!("{:016x}{:016x}", k, AGED_REVISIONS - i))
                .collect();
            doc["_rev"] = json!(format!("{AGED_REVISIONS}-{}", ids[0]));
            doc["_revisions"] = json!({"start": AGED_REVISIONS, "ids": ids});
            doc
        })
        .collect();
    let url = format!(
        "{}_bulk_docs",
        bench.raw_prefix(ledger.hot_client().database())
    );
    for batch in docs.chunks(AGED_LOAD_BATCH_DOCS) {
        let response = bench
            .raw
            .request(Method::POST, url.clone())
            .json(&json!({"docs": batch, "new_edits": false}))
            .send()
            .await?;
        ensure!(
            response.status().is_success(),
            "planting aged accounts: {} {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
    }
    Ok(())
}
