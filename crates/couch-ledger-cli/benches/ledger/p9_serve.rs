//! p9: p8's transfers over HTTP through `couch-ledger serve`, against the same transfers
//! through the library, alternating round by round; and each side's latency.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use couch_ledger::Ledger;
use serde_json::{json, Value};

use crate::bench::{Bench, Side};
use crate::p6_sweeper::{process_usage, program, PROGRAM};
use crate::p8_batched::{P8_CONCURRENCY, P8_POOL_ACCOUNTS, TRANSFERS_PER_ROUND_C64};
use crate::rounds::{
    interleaved, jobs_for_steady_rate, quantile, run_concurrently, steady_rate, Interleaved,
};
use crate::row::{Goal, Row};
use crate::sizes::REQUEST_TIMEOUT_S;
use crate::transfers::{
    account_id, fresh_ledger, load_accounts, pool_pair, transfer_amount, transfer_done,
    transfer_request, verify_and_drop, TRANSFER_CURRENCY,
};

/// Rounds per side of `p9`.
pub const P9_ROUNDS: usize = 8;
pub const GOAL_P9: Goal = Goal::AtLeast(0.8);

/// The release binary running `couch-ledger serve` on a free loopback port; killed if dropped.
pub struct ServeProcess {
    pub child: tokio::process::Child,
    pub base: String,
}

impl ServeProcess {
    /// Starts it on `db` without its sweeper (every transfer is finished by its caller), with
    /// `extra` flags of `serve`, and waits for the line saying where it listens.
    pub async fn start(bench: &Bench, ledger: &Ledger, extra: &[OsString]) -> Result<ServeProcess> {
        use tokio::io::AsyncBufReadExt as _;
        let exe = PROGRAM;
        let mut command = program(bench, ledger);
        command
            .args(["--json", "serve", "--listen", "127.0.0.1:0", "--no-sweep"])
            .args(extra)
            .env_remove("COUCH_LEDGER_API_KEYS")
            // Its request log is written (as in production) and thrown away.
            .stderr(std::process::Stdio::null());
        let mut child = command
            .spawn()
            .with_context(|| format!("run {exe} serve"))?;
        let stdout = child.stdout.take().context("serve's stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("serve did not say where it listens within 60 s")??
            .context("serve exited at start")?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let started: Value = serde_json::from_str(&first)
            .with_context(|| format!("serve --json printed {first:?}"))?;
        let base = started["listening"]
            .as_str()
            .with_context(|| format!("serve --json printed {first:?}"))?
            .to_owned();
        Ok(ServeProcess { child, base })
    }

    pub fn pid(&self) -> Result<u32> {
        self.child.id().context("serve exited")
    }

    /// SIGTERM, then it must exit 0 (it finishes what is in flight first).
    pub async fn stop(mut self) -> Result<()> {
        let pid = self.pid()?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        ensure!(status.success(), "kill -TERM {pid}");
        let exit = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .context("serve did not stop within 60 s of SIGTERM")??;
        ensure!(exit.success(), "serve exited {exit} after SIGTERM");
        Ok(())
    }
}

/// The id (and `Idempotency-Key`) of the HTTP side's transfer `i`.
fn http_transfer_id(i: usize) -> String {
    format!("h{i:07}")
}

/// Each call's latency in seconds, appended by concurrent callers.
pub type Latencies = Arc<Mutex<Vec<f64>>>;

/// One round of `p9`'s HTTP side: transfers `jobs` (ids `h{i}`) between `p8`'s pool accounts
/// by `concurrency` callers over keep-alive connections, each checked 201 and `done`; every
/// request's latency (s) appended to `latencies`. Returns the steady rate.
pub async fn http_transfer_round(
    http: &reqwest::Client,
    base: &str,
    jobs: Range<usize>,
    concurrency: usize,
    latencies: &Latencies,
) -> Result<f64> {
    let (http, url, latencies) = (
        http.clone(),
        format!("{base}/v1/transfers"),
        latencies.clone(),
    );
    let finished = run_concurrently(jobs, concurrency, move |w, i| {
        let (http, url, latencies) = (http.clone(), url.clone(), latencies.clone());
        async move {
            let (source, destination) = pool_pair(w, i);
            let body = json!({"from": source, "to": destination, "amount": transfer_amount(i),
                              "currency": TRANSFER_CURRENCY});
            let started = Instant::now();
            let response = http
                .post(&url)
                .header("Idempotency-Key", http_transfer_id(i))
                .json(&body)
                .send()
                .await?;
            let status = response.status();
            let answer: Value = response.json().await?;
            latencies
                .lock()
                .expect("lock")
                .push(started.elapsed().as_secs_f64());
            ensure!(
                status == reqwest::StatusCode::CREATED && answer["state"] == "done",
                "transfer {} through serve: {status} {answer}",
                http_transfer_id(i)
            );
            Ok(())
        }
    })
    .await?;
    Ok(steady_rate(&finished, concurrency))
}

/// One round of `p9`'s library side: `p8`'s transfers through `Ledger::submit` in this
/// process, with each call's latency (s) appended to `latencies`.
pub async fn library_transfer_round(
    ledger: &Ledger,
    jobs: Range<usize>,
    concurrency: usize,
    latencies: &Latencies,
) -> Result<f64> {
    let (ledger, latencies) = (ledger.clone(), latencies.clone());
    let finished = run_concurrently(jobs, concurrency, move |w, i| {
        let (ledger, latencies) = (ledger.clone(), latencies.clone());
        async move {
            let (source, destination) = pool_pair(w, i);
            let request = transfer_request(format!("l{i:07}"), source, destination, i)?;
            let started = Instant::now();
            transfer_done(&ledger, request).await?;
            latencies
                .lock()
                .expect("lock")
                .push(started.elapsed().as_secs_f64());
            Ok(())
        }
    })
    .await?;
    Ok(steady_rate(&finished, concurrency))
}

/// `p9`: transfers/s of 64 concurrent HTTP callers (keep-alive) through `couch-ledger serve`
/// ÷ transfers/s of 64 concurrent `Ledger::submit` callers in this process (`p8`'s workload:
/// random pairs of a 512-account pool) — the two sides alternating round by round, each in a
/// ledger database of its own. Both share the group-commit engine across their callers (the
/// service holds one `Ledger`), so the ratio is what the HTTP layer costs: parsing, routing,
/// the request log, a second process on the same cores. `p9_p50` and `p9_p99`: each side's
/// per-transfer latency in the same rounds (median over rounds of each round's quantile).
pub async fn served_transfers(bench: &Bench) -> Result<Vec<Row>> {
    let rounds = bench.settings.scaled(P9_ROUNDS);
    let c = P8_CONCURRENCY;
    let transfers = jobs_for_steady_rate(TRANSFERS_PER_ROUND_C64, c);
    let (library, served) = p9_ledgers(bench).await?;
    // BENCH_WEBHOOK=1: the service also POSTs every event to a receiver in this process (the
    // receiver needs axum and hmac, which come with the `serve` feature, as p9 does).
    #[cfg(feature = "serve")]
    let webhook = crate::webhook_lag::WebhookLag::start_if_wanted().await?;
    #[cfg(feature = "serve")]
    let webhook_args = webhook.as_ref().map(|w| w.serve_args()).unwrap_or_default();
    #[cfg(not(feature = "serve"))]
    let webhook_args = Vec::new();
    let service = ServeProcess::start(bench, &served, &webhook_args).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(REQUEST_TIMEOUT_S))
        .pool_max_idle_per_host(c)
        .build()?;
    let http_latencies: Latencies = Arc::default();
    let library_latencies: Latencies = Arc::default();
    // Untimed, after the last round's ids: both engines read the pool, connections open.
    let warm_up_end = rounds * transfers + 2 * c;
    let warm_up = rounds * transfers..warm_up_end;
    http_transfer_round(&http, &service.base, warm_up.clone(), c, &http_latencies).await?;
    library_transfer_round(&library, warm_up, c, &library_latencies).await?;
    let cpu_before = process_usage(service.pid()?).map(|(_, cpu)| cpu);
    let quantiles: Mutex<BTreeMap<(Side, &str), Vec<f64>>> = Mutex::new(BTreeMap::new());
    let sides = [Side::Serve, Side::Ours];
    let samples = interleaved(&sides, rounds, |side, round| {
        let (http, base, library) = (&http, &service.base, &library);
        let latencies = match side {
            Side::Serve => http_latencies.clone(),
            _ => library_latencies.clone(),
        };
        let quantiles = &quantiles;
        async move {
            latencies.lock().expect("lock").clear();
            let jobs = round * transfers..(round + 1) * transfers;
            let rate = match side {
                Side::Serve => http_transfer_round(http, base, jobs, c, &latencies).await?,
                _ => library_transfer_round(library, jobs, c, &latencies).await?,
            };
            let took = latencies.lock().expect("lock").clone();
            let mut quantiles = quantiles.lock().expect("lock");
            for (name, q) in [("p50", 0.50), ("p99", 0.99)] {
                quantiles
                    .entry((side, name))
                    .or_default()
                    .push(quantile(&took, q) * 1e3);
            }
            Ok(rate)
        }
    })
    .await?;
    let serve_cpu_s = cpu_before
        .zip(process_usage(service.pid()?).map(|(_, cpu)| cpu))
        .map(|(before, after)| after - before);
    // After serve's CPU is read: the deliveries catching up after the rounds are not the cost
    // of the rounds' transfers. Every HTTP transfer, the warm-up's too, must have its event.
    #[cfg(feature = "serve")]
    if let Some(webhook) = webhook {
        let made: Vec<String> = (0..warm_up_end).map(http_transfer_id).collect();
        webhook.finish(&made).await?;
    }
    service.stop().await?;
    verify_and_drop(&served).await?;
    verify_and_drop(&library).await?;
    let quantiles = quantiles.into_inner().expect("lock");
    let rows = p9_rows(
        bench,
        &samples,
        &quantiles,
        transfers,
        rounds * transfers,
        serve_cpu_s,
    );
    Ok(rows)
}

/// `p9`'s two ledgers, each in a fresh database holding `p8`'s pool of accounts: the library
/// side's and the service's.
async fn p9_ledgers(bench: &Bench) -> Result<(Ledger, Ledger)> {
    let accounts: Vec<String> = (0..P8_POOL_ACCOUNTS).map(|i| account_id("p", i)).collect();
    let library = fresh_ledger(bench, "p9_library").await?;
    load_accounts(&library, &accounts).await?;
    let served = fresh_ledger(bench, "p9_serve").await?;
    load_accounts(&served, &accounts).await?;
    Ok((library, served))
}

/// `p9`, `p9_p50` and `p9_p99` from the rounds: the rates, each round's latency quantiles by
/// side and name, the calls per round and in all, and serve's own CPU seconds.
fn p9_rows(
    bench: &Bench,
    samples: &Interleaved,
    quantiles: &BTreeMap<(Side, &str), Vec<f64>>,
    transfers: usize,
    ops: usize,
    serve_cpu_s: Option<f64>,
) -> Vec<Row> {
    let c = P8_CONCURRENCY;
    let p8_same_run = bench
        .measured
        .lock()
        .expect("lock")
        .transfer_points
        .iter()
        .find(|p| p.concurrency == c && p.ours > 0.0)
        .map(|p| p.ours);
    let p9 = Row::new(
        "p9",
        format!("transfers/s, c{c} HTTP callers via serve"),
        "xfers/s",
        &samples.figures[&Side::Serve],
        &samples.figures[&Side::Ours],
    )
    .goal(Some(GOAL_P9))
    .note(format!(
        "{c} keep-alive HTTP callers → one `couch-ledger serve` (release binary, request log \
         on, sweeper off) ÷ {c} `submit` callers in the bench process (p8's workload{}), \
         alternating rounds, a ledger database each; serve's own CPU {}; audited",
        p8_same_run.map_or(String::new(), |p| format!(
            "; p8 itself measured {p:.1} transfers/s earlier in this run"
        )),
        serve_cpu_s.map_or("?".to_owned(), |s| format!(
            "{:.0} µs per transfer",
            s * 1e6 / ops as f64
        ))
    ));
    let latency_row = |name: &'static str| {
        Row::new(
            &format!("p9_{name}"),
            format!("transfer latency {name}, c{c}, serve vs library"),
            "ms",
            &quantiles[&(Side::Serve, name)],
            &quantiles[&(Side::Ours, name)],
        )
        .note(format!(
            "each round's {name} of the {transfers} calls' latencies (HTTP request to answer; \
             submit call to return), median over rounds; raw = the library path"
        ))
    };
    vec![p9, latency_row("p50"), latency_row("p99")]
}
