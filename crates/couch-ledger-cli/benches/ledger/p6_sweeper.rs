//! p6 and sweeper_rss: one run of the release binary's sweeper over stuck transfers,
//! bracketed by raw bulk rounds.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use couch_ledger::Ledger;
use serde_json::Value;

use crate::bench::Bench;
use crate::output::thousands;
use crate::p8_batched::RAW_BULK_BATCHES;
use crate::rounds::process_cpu;
use crate::row::{Goal, Row};
use crate::sizes::BULK_BATCH_DOCS;
use crate::transfers::{
    account_id, fresh_ledger, initial_transfer_doc, ledger_args, load_accounts, load_docs, unix_ms,
    verify_and_drop, RawBulk,
};

/// Transfers left `initial` for the sweeper (× `BENCH_SCALE`): 2,000 at the default scale,
/// the 10,000 at `BENCH_SCALE=5`. On pouchdb-server the sweeper finishes one or two
/// hundred a second and the audit after it reads them all again, so 10,000 alone would take
/// the bench past its five minutes.
pub const P6_TRANSFERS: usize = 2_000;
/// Accounts the stuck transfers move money between, at random.
pub const P6_POOL_ACCOUNTS: usize = 500;
/// Raw bulk rounds right before the sweeper's pass, and as many right after it.
pub const P6_RAW_ROUNDS_EACH_SIDE: usize = 4;
pub const GOAL_P6: Goal = Goal::AtLeast(0.5);

/// A ledger holding `transfers` transfers left `initial` between random accounts of a pool,
/// loaded with `_bulk_docs` in the shape `submit(…, wait = false)` writes (docs/DOCUMENTS.md),
/// and its views brought up to date (what a sweeper watching the database all along would
/// have found). Untimed. Also returns the views' indexing rate (docs/s, over the three views
/// `status` reads).
pub async fn load_stuck(bench: &Bench, purpose: &str, transfers: usize) -> Result<(Ledger, f64)> {
    let ledger = fresh_ledger(bench, purpose).await?;
    let accounts: Vec<String> = (0..P6_POOL_ACCOUNTS).map(|i| account_id("p", i)).collect();
    load_accounts(&ledger, &accounts).await?;
    let then = unix_ms() - 60_000;
    let docs: Vec<Value> = (0..transfers)
        .map(|i| initial_transfer_doc(i, "stuck", then, P6_POOL_ACCOUNTS))
        .collect();
    load_docs(ledger.hot_client(), &docs).await?;
    let started = Instant::now();
    let status = ledger.status().await?;
    let indexed_per_s = (transfers + P6_POOL_ACCOUNTS) as f64 / started.elapsed().as_secs_f64();
    ensure!(
        status.states.initial == transfers as u64,
        "{purpose}: {} transfers initial, {transfers} loaded",
        status.states.initial
    );
    Ok((ledger, indexed_per_s))
}

/// What one run of the sweeper binary took.
pub struct SweeperRun {
    pub seconds: f64,
    /// `VmHWM`, KiB.
    pub peak_rss_kib: u64,
    /// Its user + system CPU time, as last read while it ran.
    pub cpu_seconds: f64,
}

/// `VmHWM` (peak resident set, KiB) and user + system CPU seconds of a running process.
pub fn process_usage(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let hwm = line.split_whitespace().nth(1)?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces: utime and
    // stime are the 12th and 13th, in clock ticks (USER_HZ, 100 per second on Linux).
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace();
    let utime: f64 = fields.nth(11)?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((hwm, (utime + stime) / 100.0))
}

/// How often the sweeper child's `VmHWM` is read: it only grows, so the last reading before
/// the child exits misses at most what it gained in this last interval.
pub const RSS_POLL_MS: u64 = 10;

/// The program, built by Cargo for a bench target with the bench's (release) profile.
pub const PROGRAM: &str = env!("CARGO_BIN_EXE_couch-ledger");

/// The program on the bench's server and database `db`, nothing else from the environment,
/// stdout piped, killed if dropped. Credentials go through the environment, never on a command
/// line others can read.
pub fn program(bench: &Bench, ledger: &Ledger) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(PROGRAM);
    command
        .args(["--url", &bench.server.url])
        .args(ledger_args(ledger))
        .env_remove("LEDGER_HOT_DB")
        .env_remove("COUCHDB_URL")
        .env_remove("LEDGER_DB")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    match &bench.server.credentials {
        Some((user, password)) => {
            command
                .env("COUCHDB_USER", user)
                .env("COUCHDB_PASSWORD", password);
        }
        None => {
            command
                .env_remove("COUCHDB_USER")
                .env_remove("COUCHDB_PASSWORD");
        }
    }
    command
}

/// Runs the release binary's `couch-ledger sweep --once --stale-after 0s --batch <transfers>
/// --json` on the ledger, reading its `VmHWM` from `/proc` while it runs, and checks that it
/// finished every transfer.
pub async fn run_sweeper(bench: &Bench, ledger: &Ledger, transfers: usize) -> Result<SweeperRun> {
    let exe = PROGRAM;
    let mut command = program(bench, ledger);
    command
        .args(["--json", "sweep", "--once", "--stale-after", "0s"])
        .args(["--batch", &transfers.to_string()])
        .stderr(std::process::Stdio::piped());
    let started = Instant::now();
    let child = command.spawn().with_context(|| format!("run {exe}"))?;
    let pid = child.id().context("the sweeper exited at once")?;
    let usage = Arc::new(Mutex::new((0u64, 0f64)));
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let poller = {
        let (usage, running) = (usage.clone(), running.clone());
        tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                if let Some((hwm, cpu)) = process_usage(pid) {
                    let mut usage = usage.lock().expect("lock");
                    *usage = (usage.0.max(hwm), cpu);
                }
                tokio::time::sleep(Duration::from_millis(RSS_POLL_MS)).await;
            }
        })
    };
    let output = child.wait_with_output().await?;
    let seconds = started.elapsed().as_secs_f64();
    running.store(false, Ordering::Relaxed);
    poller.await?;
    ensure!(
        output.status.success(),
        "{exe} sweep: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let outcome: Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "sweep --json printed {:?}",
            String::from_utf8_lossy(&output.stdout)
        )
    })?;
    ensure!(
        outcome["advanced"].as_u64() == Some(transfers as u64)
            && outcome["failed"].as_u64() == Some(0)
            && outcome["remaining"].as_u64() == Some(0),
        "sweep --once did not finish the {transfers} transfers: {outcome}"
    );
    let (peak_rss_kib, cpu_seconds) = *usage.lock().expect("lock");
    ensure!(
        peak_rss_kib > 0,
        "no VmHWM read for the sweeper (pid {pid})"
    );
    Ok(SweeperRun {
        seconds,
        peak_rss_kib,
        cpu_seconds,
    })
}

/// `p6` and `sweeper_rss` from one run of the sweeper binary over the stuck transfers, in one
/// pass (`--batch` all of them): transfers finished per second (process start included) ÷
/// (raw bulk docs/s ÷ documents written per transfer), and the process's peak RSS. The pass
/// is one process lasting many seconds, so it cannot alternate with raw rounds: it is
/// bracketed by them instead, and the ratio is the median over the raw rounds.
pub async fn sweeper(bench: &Bench) -> Result<Vec<Row>> {
    let cost = bench.transfer_cost()?;
    let transfers = bench.settings.scaled(P6_TRANSFERS);
    let load_started = Instant::now();
    let (ledger, indexed_per_s) = load_stuck(bench, "p6", transfers).await?;
    let load = load_started.elapsed();
    let raw = RawBulk::new(bench, "p6", false).await?;
    let mut raw_rates = Vec::new();
    let mut raw_cpu = Duration::ZERO;
    let mut run = None;
    for bracket in 0..2 {
        if bracket == 1 {
            run = Some(run_sweeper(bench, &ledger, transfers).await?);
        }
        for _ in 0..P6_RAW_ROUNDS_EACH_SIDE {
            let cpu_before = process_cpu();
            raw_rates.push(raw.round(RAW_BULK_BATCHES).await? / cost.docs_written);
            if let Some(used) = cpu_before
                .zip(process_cpu())
                .and_then(|(before, after)| after.checked_sub(before))
            {
                raw_cpu += used;
            }
        }
    }
    let run = run.expect("the sweeper ran");
    raw.drop_database().await?;
    let verified = verify_and_drop(&ledger).await?;
    let rate = transfers as f64 / run.seconds;
    let mut p6 = Row::new(
        "p6",
        "stuck transfers finished/s by the sweeper".to_owned(),
        "xfers/s",
        &vec![rate; raw_rates.len()],
        &raw_rates,
    )
    .goal(Some(GOAL_P6))
    .note(format!(
        "{transfers} transfers left initial ({P6_POOL_ACCOUNTS} accounts), finished by one \
         `couch-ledger sweep --once --stale-after 0s --batch {transfers}` in {:.1} s; raw = raw \
         _bulk_docs docs/s ÷ {:.1} documents written per transfer (p3), {P6_RAW_ROUNDS_EACH_SIDE} \
         rounds right before the pass and {P6_RAW_ROUNDS_EACH_SIDE} right after; loaded in \
         {:.1} s, of which the views indexed {indexed_per_s:.0} docs/s; audited in {:.1} s",
        run.seconds,
        cost.docs_written,
        load.as_secs_f64(),
        verified.as_secs_f64()
    ));
    // The sweeper's own CPU (another process), and this process's for the raw rounds, per
    // transfer's worth of documents.
    p6.client_cpu_us_per_op
        .insert("ours", run.cpu_seconds * 1e6 / transfers as f64);
    let raw_docs = raw_rates.len() * RAW_BULK_BATCHES * BULK_BATCH_DOCS;
    p6.client_cpu_us_per_op.insert(
        "raw",
        raw_cpu.as_secs_f64() * 1e6 / raw_docs as f64 * cost.docs_written,
    );
    let rss = Row::count(
        "sweeper_rss",
        format!("sweeper peak RSS, {} stuck, one pass", thousands(transfers)),
        "MiB",
        &[run.peak_rss_kib as f64 / 1024.0],
    )
    .note(format!(
        "VmHWM of the release binary's `sweep --once --stale-after 0s --batch {transfers}` \
         (p6's pass), read from /proc every {RSS_POLL_MS} ms while it ran"
    ));
    Ok(vec![p6, rss])
}
