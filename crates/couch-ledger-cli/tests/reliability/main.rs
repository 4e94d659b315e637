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
//! split layout (`LedgerBuilder::hot_database`: accounts and transfers in a second database,
//! which R1's odd rounds and R2 use; the trio parts, R3…R6 use the single layout), background
//! counts the submits that R1's odd workers, finishing in the background
//! (`LedgerBuilder::background_finish`), had answered before their end (at the commit, or at a
//! one-write decision whose settles still ran).
//!
//! One file a part, in the order they run; `shared` holds what several parts use.

use couch_ledger_testkit as support;

// What several parts use: sizes, the tally, the world of a part, raw reads, the checks at rest.
mod shared;
// R1: crashes at every fail point, retries, races, cancels, reversals, late workers.
mod r1_crashes;
// R1's workload on the replicating trio, and the trio's convergence and conflict checks.
mod trio;
// R2: `couch-ledger` worker and sweeper processes SIGKILLed at random moments.
mod r2_kills;
// R3: the server killed and restarted under load.
mod r3_server_crash;
// R4: network faults from a proxy, and replies only a mock server gives.
mod r4_network;
// R5: bad input through the library, raw writes and the command line, all refused.
mod r5_bad_input;
// R5: poison documents beside good work.
mod r5_poison;
// R6: the server's validation of illegal writes, and credentials that never leak.
mod r6_security;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use shared::{capture_logs, LogBuffer, Size, Tally};
use support::trio::{Balance, Trio};

/// The parts to run (`RELIABILITY_PARTS`, comma-separated), all of them by default.
fn parts() -> Vec<String> {
    match std::env::var("RELIABILITY_PARTS") {
        Ok(p) if !p.is_empty() => p.split(',').map(|s| s.trim().to_lowercase()).collect(),
        _ => ["r1", "r1_trio", "r2", "r2_trio", "r3", "r4", "r5", "r6"]
            .map(str::to_owned)
            .to_vec(),
    }
}

/// `RELIABILITY_SEED`, or a fresh random seed.
fn seed() -> u64 {
    match std::env::var("RELIABILITY_SEED") {
        Ok(s) if !s.is_empty() => s.parse().expect("RELIABILITY_SEED is a u64"),
        _ => fastrand::u64(..),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reliability() {
    let logs = capture_logs();
    let seed = seed();
    let size = Size::from_env();
    let parts = parts();
    eprintln!(
        "RELIABILITY seed={seed} size={} parts={} (replay: RELIABILITY_SEED={seed}{})",
        if size.long { "long" } else { "ci" },
        parts.join(","),
        if size.long { " RELIABILITY_LONG=1" } else { "" }
    );
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    run_parts(&parts, size, seed, &tally, &logs, started).await;
    report(&tally, &logs, started);
    let violations = tally.violations();
    let line = summary_line(&tally);
    println!("{line}");
    eprintln!("{line}");
    assert_eq!(
        violations,
        0,
        "seed {seed}: {:#?}",
        tally.violations.lock().unwrap()
    );
}

/// Runs the chosen parts in order; the fail points are set up around the parts that fire them.
async fn run_parts(
    parts: &[String],
    size: Size,
    seed: u64,
    tally: &Arc<Tally>,
    logs: &LogBuffer,
    started: Instant,
) {
    let run = |p: &str| parts.iter().any(|x| x == p);
    let finished = |p: &str| eprintln!("{p} finished at {:?}", started.elapsed());
    let scenario = fail::FailScenario::setup();
    if run("r1") {
        r1_crashes::r1(size, seed, tally.clone()).await;
        finished("r1");
    }
    if run("r1_trio") {
        trio::r1_trio(size, seed, tally.clone()).await;
        finished("r1_trio");
    }
    scenario.teardown();
    if run("r2") {
        r2_kills::r2(size, seed, tally.clone(), None, "r2", true).await;
        finished("r2");
    }
    if run("r2_trio") {
        let trio = Trio::start_with(Balance::PerConnection).await;
        r2_kills::r2(size, seed, tally.clone(), Some(&trio), "r2_trio", false).await;
        finished("r2_trio");
    }
    if run("r3") {
        r3_server_crash::r3(size, seed, tally.clone()).await;
        finished("r3");
    }
    if run("r4") {
        r4_network::r4(size, seed, tally.clone()).await;
        finished("r4");
    }
    if run("r5") {
        r5_bad_input::r5(tally.clone()).await;
        finished("r5");
    }
    if run("r6") {
        let refused = r6_security::r6(seed, tally.clone(), logs).await;
        tally.bad_inputs.fetch_add(refused, Ordering::Relaxed);
        finished("r6");
    }
}

/// What a person chasing a failure wants besides the summary: the typed errors, the size of
/// the captured logs and, with `RELIABILITY_LOG_FILE`, the library's log lines of the whole run.
fn report(tally: &Tally, logs: &LogBuffer, started: Instant) {
    let errors = tally.errors.lock().unwrap().clone();
    eprintln!("typed errors returned, by part and kind: {errors:?}");
    eprintln!(
        "logs captured: {} bytes; run took {:?}",
        logs.0.lock().unwrap().len(),
        started.elapsed()
    );
    if let Ok(path) = std::env::var("RELIABILITY_LOG_FILE") {
        if let Err(e) = std::fs::write(&path, &*logs.0.lock().unwrap()) {
            eprintln!("could not write the logs to {path}: {e}");
        }
    }
}

/// The `RELIABILITY …` line other tools grep for.
fn summary_line(tally: &Tally) -> String {
    let crashes = tally.crashes.lock().unwrap().clone();
    format!(
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
        tally.violations(),
        tally.split_rounds.load(Ordering::Relaxed),
        tally.background.load(Ordering::Relaxed),
    )
}
