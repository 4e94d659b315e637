//! couch-ledger's benchmark: how close the library gets to the server under it.
//!
//! `cargo bench --bench ledger` starts pouchdb-server on loopback like the tests do (or uses
//! `COUCHDB_URL`, `COUCHDB_USER`, `COUCHDB_PASSWORD`), measures every figure of [`FIGURES`] in
//! one run, prints a table and writes `target/bench/results.json` and `target/bench/results.svg`.
//! BENCHMARKS.md explains each figure and holds the latest results.
//!
//! A figure is a ratio of ours to a minimal raw reqwest loop doing the same HTTP work against the
//! same server. The server, not the client, is the limit, and a 2-core machine shared with the
//! server (and often with compilers) drifts by tens of percent from one second to the next, so
//! ours and raw never run in separate phases. They alternate in short rounds (a fraction of a
//! second each, the order rotating every round; balance queries alternate query by query), each
//! round's ratio compares measurements taken back to back, and a figure's ratio is the median of
//! its rounds' ratios; the "ours" and "raw" columns are each side's median. Every figure writes
//! into fresh databases, one per side.
//!
//! The transfer figures (`p3`…`p8`) run the library's transfer protocol and, after their load,
//! audit every ledger database they wrote with `Ledger::verify_with(at_rest)`: a violated
//! invariant fails the bench. `p6` is one run of the release binary's sweeper, which cannot
//! alternate with raw rounds: raw rounds bracket it instead.
//!
//! Environment: `BENCH_SCALE` (default 1) multiplies the number of rounds of the throughput
//! figures, the queries per round of the latency figures and `p6`'s stuck transfers (2,000 at
//! scale 1, the 10,000 at 5); `BENCH_BIG=1` adds the order-balance latency at 100k
//! documents (≈ 90 s of index build on pouchdb-server), `BENCH_HUGE=1` at 1M documents (also
//! 100k); `BENCH_ONLY=p3,p8` runs only those figures (`p3` comes along with any transfer
//! figure, which divides by it, and `p8` with `p9`; no plot unless every single-write figure
//! ran).
//!
//! `p9` runs the release binary as `couch-ledger serve` and sends `p8`'s transfers to it over
//! HTTP (64 keep-alive callers), alternating round by round with the same transfers through
//! the library in the bench's own process: the service's cost over the library path.
//! `BENCH_WEBHOOK=1` also gives that service a webhook pointing at a receiver in the bench
//! process, which checks every delivery's signature, prints the lag from each transfer's
//! decision to its `transfer.done`, and fails the bench if one is badly signed or never comes.
//!
//! One module a figure (or a pair measured in the same rounds), beside what they share: the
//! settings and the server, the bench's clients, the interleaved rounds, the transfer
//! machinery and the document floor; `output` prints the table and writes the JSON, `chart`
//! draws the SVG.

// The local server (not part of the library).
use couch_ledger_devserver as devserver;

// The sizes and goals the figures share.
mod sizes;
// `BENCH_*` settings, the layout, and the server under test.
mod settings;
// The bench's clients (ours, raw reqwest, couch_rs) and what the figures measured.
mod bench;
// A measured figure (`Row`) and its goal.
mod row;
// The table of figures, in the order they run.
mod figures;
// Concurrent jobs, interleaved rounds, steady rates, medians.
mod rounds;
// Transfers: accounts, ledgers, runs of transfers, raw bulk limits, what `p3` found.
mod transfers;
// `p8_floor`, `p8_phases`, `p8_one_request`: documents batched ideally.
mod floor;
// p1: single-document writes.
mod p1_writes;
// p2: bulk ingest.
mod p2_bulk;
// p3: requests per transfer.
mod p3_requests;
// p4 and p5: concurrent transfers, spread and into one account.
mod p4_p5_concurrent;
// p6 and sweeper_rss: the sweeper binary over stuck transfers.
mod p6_sweeper;
// p7 and the balance figures: order-balance latency.
mod p7_orders;
// p8 and the figures of its rounds: the batched submit path.
mod p8_batched;
// BENCH_EVENTS=1: an events follower during p8's rounds, and its lag.
mod events_lag;
// p8_long and p8_aged: p8's workload for minutes, and on accounts with a long history.
mod p8_long_aged;
// p9: p8's transfers through `couch-ledger serve`.
mod p9_serve;
// BENCH_WEBHOOK=1: a webhook receiver for p9's service, and its events' lag (on axum and
// hmac, which come with the `serve` feature).
#[cfg(feature = "serve")]
mod webhook_lag;
// The table on stdout and `results.json`.
mod output;
// `results.svg`.
mod chart;

use std::time::Instant;

use anyhow::{ensure, Context as _, Result};
use serde_json::Value;

use bench::Bench;
use figures::{Figure, FIGURES};
use output::{
    load_average, output_dir, print_summary, print_table, results_json, server_name, utc_now,
    MachineLoad,
};
use row::Row;
use settings::{Server, Settings};
use sizes::PLOT_CONCURRENCY;

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; a filter argument is not supported (all figures run, by
    // design, so that their ratios come from one run).
    let settings = Settings::from_env()?;
    let started = Instant::now();
    let server = Server::from_env()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(settings, server, started))
}

async fn run(settings: Settings, server: Server, started: Instant) -> Result<()> {
    let load_start = load_average();
    let bench = Bench::new(settings, server)?;
    let server_info = bench
        .ours
        .server_info()
        .await
        .context("GET / on the server")?;
    eprintln!(
        "couch-ledger bench: {} at {}, scale {}, load {}",
        server_name(&server_info),
        bench.server.url,
        bench.settings.scale,
        load_start.as_deref().unwrap_or("?")
    );
    let rows = measure(&bench).await?;
    let elapsed = started.elapsed();
    print_table(&rows);
    print_summary(&bench, elapsed, load_start.as_deref());
    let load = MachineLoad {
        start: load_start,
        end: load_average(),
    };
    write_results(&bench, &rows, &server_info, &load, elapsed)
}

/// Every selected figure, in the order of [`FIGURES`]; each one's rows said as it ends.
async fn measure(bench: &Bench) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let selected = |f: &&Figure| {
        (f.enabled)(&bench.settings)
            && bench
                .settings
                .only
                .as_ref()
                .is_none_or(|keys| keys.iter().any(|k| k == f.key))
    };
    for figure in FIGURES.iter().filter(selected) {
        let figure_started = Instant::now();
        let measured = (figure.measure)(bench)
            .await
            .with_context(|| format!("figure {}", figure.key))?;
        for row in &measured {
            eprintln!(
                "  {:<13} ours {:>10.1}  raw {:>10.1} {:<8} ratio {:.3}",
                row.key, row.ours, row.raw, row.unit, row.ratio
            );
        }
        eprintln!(
            "  ({} took {:.1} s)",
            figure.key,
            figure_started.elapsed().as_secs_f64()
        );
        rows.extend(measured);
    }
    Ok(rows)
}

/// Writes `results.json` and, when every single-write figure ran, `results.svg`.
fn write_results(
    bench: &Bench,
    rows: &[Row],
    server_info: &Value,
    load: &MachineLoad,
    elapsed: std::time::Duration,
) -> Result<()> {
    let dir = output_dir();
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let json_path = dir.join("results.json");
    let results = results_json(bench, rows, server_info, load, elapsed);
    std::fs::write(&json_path, serde_json::to_string_pretty(&results)? + "\n")?;
    let subtitle = format!(
        "{} · {} cores · medians of interleaved rounds · {}",
        server_name(server_info),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        &utc_now()[..10]
    );
    let svg_path = dir.join("results.svg");
    let measured = bench.measured.lock().expect("lock");
    let mut levels: Vec<usize> = measured
        .write_points
        .iter()
        .map(|p| p.concurrency)
        .collect();
    levels.sort_unstable();
    if bench.settings.only.is_some() && levels != PLOT_CONCURRENCY {
        println!("wrote {} (BENCH_ONLY: no plot)", json_path.display());
        return Ok(());
    }
    ensure!(levels == PLOT_CONCURRENCY, "plot levels {levels:?}");
    std::fs::write(&svg_path, chart::plot_svg(&measured, &subtitle)?)?;
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}
