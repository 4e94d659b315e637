//! A simulated CouchDB cluster and the runs that drive the ledger against it.

pub mod cluster;
pub mod http;
pub mod run;
pub mod tree;
pub mod views;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use run::{run_seed, Outcome};

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Runs the seeds, prints what they found; the exit code (0 when no violation).
pub fn main() -> i32 {
    tree::checks::run();
    views::checks::run();
    let started = Instant::now();
    if let Ok(name) = std::env::var("SIM_STEERED") {
        return i32::from(steered(Some(&name)) > 0);
    }
    if let Some(seed) = env_u64("SIM_SEED") {
        let long = std::env::var("SIM_LONG").is_ok_and(|v| v == "1");
        let out = run_seed(seed, long);
        if !out.violations.is_empty() {
            print_failure(&out, long);
        }
        report(std::slice::from_ref(&out), started, 1, "");
        println!("scenario: {}", out.scenario);
        println!("trace digest: {:016x}", out.trace);
        return i32::from(!out.violations.is_empty());
    }
    let seeds = env_u64("SIM_SEEDS").unwrap_or(300);
    let long_every = env_u64("SIM_LONG_EVERY").unwrap_or(10).max(1);
    let threads = env_u64("SIM_THREADS").unwrap_or(2).max(1) as usize;
    let base = env_u64("SIM_BASE").unwrap_or(0);
    let results = run_group(seeds, base, long_every, threads);
    let mut failed = report(&results, started, seeds, "") + replay(&results, base, long_every);
    // Then seeds whose every sweep pass looks at one transfer and one marker, as the real
    // sweeper's `--batch` on a backlog larger than it: what is stuck ahead must not take every
    // pass (`SIM_SMALL_PASS_SEEDS`, default a fifth of the seeds; none under `SIM_PASS_LIMIT`,
    // which sets the limit of every seed).
    let small = env_u64("SIM_SMALL_PASS_SEEDS").unwrap_or(seeds / 5);
    if run::pass_limit().is_none() && small > 0 {
        run::set_pass_limit(1);
        let started = Instant::now();
        let results = run_group(small, base, long_every, threads);
        failed += report(&results, started, small, "pass_limit=1 ");
    }
    failed += steered(None);
    // Then seeds in the trio's shape, with every sweep pass as large as by default
    // (`SIM_TRIO_SEEDS`, default a fifth of the seeds; none under `SIM_TRIO=1`, where every seed
    // takes it).
    let trio = env_u64("SIM_TRIO_SEEDS").unwrap_or(seeds / 5);
    if !run::trio_drawn() && trio > 0 {
        run::set_pass_limit(0);
        run::set_trio();
        let started = Instant::now();
        let results = run_group(trio, base, long_every, threads);
        failed += report(&results, started, trio, "trio ");
    }
    not_drawn(trio);
    i32::from(failed > 0)
}

/// Runs the steered runs (`only`: the one of that name), prints their line and what each
/// found wrong; their violations.
fn steered(only: Option<&str>) -> usize {
    let started = Instant::now();
    let names: Vec<&str> = run::STEERED
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| only.is_none_or(|o| o == *name))
        .collect();
    if names.is_empty() {
        let known: Vec<&str> = run::STEERED.iter().map(|(name, _)| *name).collect();
        println!(
            "SIMULATION no steered run is named {:?}; the steered runs: {}",
            only.unwrap_or_default(),
            known.join(", ")
        );
        return 1;
    }
    let mut violations = 0;
    for name in &names {
        let out = run::run_steered(name);
        if !out.violations.is_empty() {
            println!("SIMULATION steered run {name} FAILED ({})", out.scenario);
            for v in out.violations.iter().take(20) {
                println!("  - {v}");
            }
            println!(
                "  replay: SIM_STEERED={name} cargo test --release --features failpoints --test simulation"
            );
        }
        violations += out.violations.len();
    }
    println!(
        "SIMULATION steered runs={} violations={violations} ({:.1} s)",
        names.len(),
        started.elapsed().as_secs_f64()
    );
    violations
}

/// Runs seeds `base..base + seeds` on `threads` threads; every `long_every`-th a long run.
fn run_group(seeds: u64, base: u64, long_every: u64, threads: usize) -> Vec<Outcome> {
    let next = AtomicU64::new(0);
    let results: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= seeds {
                    return;
                }
                let seed = base + i;
                let long = i % long_every == long_every - 1;
                let out = run_seed(seed, long);
                if !out.violations.is_empty() {
                    print_failure(&out, long);
                }
                results.lock().unwrap().push(out);
            });
        }
    });
    results.into_inner().unwrap()
}

/// Same seed, same run: two seeds again, their digests compared. How many differed.
fn replay(results: &[Outcome], base: u64, long_every: u64) -> usize {
    let mut replay_violations = 0;
    for out in results.iter().take(2) {
        let long = (out.seed - base) % long_every == long_every - 1;
        let again = run_seed(out.seed, long);
        if again.trace != out.trace {
            replay_violations += 1;
            println!(
                "SIMULATION seed {:#x} did not replay: trace digest {:016x} then {:016x}",
                out.seed, out.trace, again.trace
            );
        }
    }
    replay_violations
}

fn print_failure(out: &Outcome, long: bool) {
    println!("SIMULATION seed {:#x} FAILED ({})", out.seed, out.scenario);
    for v in out.violations.iter().take(20) {
        println!("  - {v}");
    }
    println!(
        "  replay: SIM_SEED={:#x}{}{}{}{}{}{} cargo test --release --features failpoints --test simulation",
        out.seed,
        if long { " SIM_LONG=1" } else { "" },
        if run::two_terms_drawn() { "" } else { " SIM_TWO_TERMS=0" },
        if run::trio_drawn() { " SIM_TRIO=1" } else { "" },
        if run::hot_drawn() { " SIM_HOT=1" } else { "" },
        run::recovery_setting(),
        run::pass_limit().map_or(String::new(), |n| format!(" SIM_PASS_LIMIT={n}"))
    );
}

/// Prints a group's `SIMULATION` line (`label` before its fields); its violations.
fn report(results: &[Outcome], started: Instant, seeds: u64, label: &str) -> usize {
    let sum = |f: fn(&Outcome) -> u64| results.iter().map(f).sum::<u64>();
    let violations: usize = results.iter().map(|o| o.violations.len()).sum();
    println!(
        "SIMULATION {label}seeds={seeds} transfers={} node_restarts={} stemmed_branches={} conflicts_merged={} lost_replies={} crashes={} requests={} violations={violations} ({:.1} s)",
        sum(|o| o.transfers),
        sum(|o| o.node_restarts),
        sum(|o| o.stemmed_branches),
        sum(|o| o.conflicts_merged),
        sum(|o| o.lost_replies),
        sum(|o| o.crashes),
        sum(|o| o.requests),
        started.elapsed().as_secs_f64()
    );
    violations
}

/// Says which shapes the seeds left out (`trio`: the size of the trio group).
fn not_drawn(trio: u64) {
    if !run::two_terms_drawn() {
        println!(
            "SIMULATION NOT DRAWN: one id resent at once with other terms (SIM_TWO_TERMS=0); \
             unset it to draw them"
        );
    }
    if trio == 0 && !run::trio_drawn() {
        println!(
            "SIMULATION NOT DRAWN: the trio's shape (accounts written to one copy, every read of \
             one copy; SIM_TRIO_SEEDS=0); unset it to draw it"
        );
    }
}
