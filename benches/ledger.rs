//! couch-ledger's benchmark: how close the library gets to the server under it (issue 5).
//!
//! `cargo bench --bench ledger` starts pouchdb-server on loopback like the tests do (or uses
//! `COUCHDB_URL`, `COUCHDB_USER`, `COUCHDB_PASSWORD`), measures every figure of [`FIGURES`] in
//! one run, prints a table and writes `target/bench/results.json` and `target/bench/results.svg`.
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
//! Environment: `BENCH_SCALE` (default 1) multiplies the number of rounds of the throughput
//! figures and the queries per round of the latency figures; `BENCH_BIG=1` adds
//! the order-balance latency at 100k documents (≈ 90 s of index build on pouchdb-server),
//! `BENCH_HUGE=1` at 1M documents (also 100k).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use couch_ledger::devserver::DevServer;
use couch_ledger::{Client, Ledger};
use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::task::JoinSet;

// ---- sizes and goals ----------------------------------------------------------------------

// A round measures each side once, back to back, so the rounds are short: other processes'
// use of this machine's two cores changes from one tenth of a second to the next, and a round's
// ratio only holds if both of its measurements saw the same machine. Rounds are scaled by
// `BENCH_SCALE`.

/// Rounds per side of the single-write figure at one connection, each one timed write: the
/// figure is the typical write's rate, ours and raw alternating write by write.
const WRITE_ROUNDS_C1: usize = 300;
/// Rounds per side of the single-write figures from 4 connections up.
const WRITE_ROUNDS: usize = 60;
/// Timed single-document writes per round from 4 connections up (≈ 0.15 s at 680/s), and at
/// least this many per connection. A round also runs `2 × concurrency - 1` untimed writes
/// around them: see [`steady_rate`].
const WRITES_PER_ROUND: usize = 96;
const WRITES_PER_ROUND_PER_CONNECTION_MIN: usize = 2;
/// Rounds per side of `p2`, each one timed `_bulk_docs` request (≈ 70 ms at 7k docs/s).
const BULK_ROUNDS: usize = 45;
/// Rounds per side of a latency figure, whose sides alternate query by query within a round.
const LATENCY_ROUNDS: usize = 9;
/// Concurrency levels of the single-write plot; `p1` is read at 1 and 16.
const PLOT_CONCURRENCY: [usize; 4] = [1, 4, 16, 64];
/// Bytes of filler in a benchmark document, so a body is about 250 bytes like a ledger entry.
const PAYLOAD_BYTES: usize = 160;
/// Documents per `_bulk_docs` request in `p2`.
const BULK_BATCH_DOCS: usize = 500;
/// Documents per `_bulk_docs` request when loading a database for a query figure.
const LOAD_BATCH_DOCS: usize = 1_000;
/// Each order is a purchase and this many payments.
const PAYMENTS_PER_ORDER: usize = 3;
const DOCS_PER_ORDER: usize = 1 + PAYMENTS_PER_ORDER;
/// Orders in `p7`'s database.
const P7_ORDERS: usize = 1_000;
/// Balance queries per side per round, one at a time, ours and raw alternating query by query.
const BALANCE_QUERIES_PER_ROUND: usize = 60;
/// Long enough for a view index build over 1M documents on pouchdb-server.
const REQUEST_TIMEOUT_S: u64 = 3_600;

const GOAL_P1: Goal = Goal::AtLeast(0.95);
const GOAL_P2: Goal = Goal::AtLeast(0.90);
const GOAL_P7: Goal = Goal::AtMost(1.10);

// ---- the figures --------------------------------------------------------------------------

/// One entry of the table of figures: a function measuring it, run when `enabled`.
struct Figure {
    key: &'static str,
    enabled: fn(&Settings) -> bool,
    measure: for<'a> fn(&'a Bench) -> Measuring<'a>,
}

type Measuring<'a> = Pin<Box<dyn Future<Output = Result<Vec<Row>>> + 'a>>;

/// Every figure, in the order they run. A figure may return more than one row (the single-write
/// figures also report couch_rs at the same concurrency).
const FIGURES: &[Figure] = &[
    Figure {
        key: "p1_c1",
        enabled: always,
        measure: |b| Box::pin(single_writes(b, 1, "p1_c1", Some(GOAL_P1))),
    },
    Figure {
        key: "p1_c16",
        enabled: always,
        measure: |b| Box::pin(single_writes(b, 16, "p1_c16", Some(GOAL_P1))),
    },
    Figure {
        key: "writes_c4",
        enabled: always,
        measure: |b| Box::pin(single_writes(b, 4, "writes_c4", None)),
    },
    Figure {
        key: "writes_c64",
        enabled: always,
        measure: |b| Box::pin(single_writes(b, 64, "writes_c64", None)),
    },
    Figure {
        key: "p2",
        enabled: always,
        measure: |b| Box::pin(bulk_ingest(b)),
    },
    Figure {
        key: "p7",
        enabled: always,
        measure: |b| Box::pin(order_balance(b, P7_ORDERS, "p7", Some(GOAL_P7))),
    },
    Figure {
        key: "balance_10k",
        enabled: always,
        measure: |b| {
            Box::pin(order_balance(
                b,
                10_000 / DOCS_PER_ORDER,
                "balance_10k",
                None,
            ))
        },
    },
    Figure {
        key: "balance_100k",
        enabled: |s| s.big || s.huge,
        measure: |b| {
            Box::pin(order_balance(
                b,
                100_000 / DOCS_PER_ORDER,
                "balance_100k",
                None,
            ))
        },
    },
    Figure {
        key: "balance_1m",
        enabled: |s| s.huge,
        measure: |b| {
            Box::pin(order_balance(
                b,
                1_000_000 / DOCS_PER_ORDER,
                "balance_1m",
                None,
            ))
        },
    },
    // ---- EXTENSION POINTS: the transfer figures, to add once the transfer API lands. ------
    // Each is one more entry here and one function below. None is measured yet, so none is
    // reported (no placeholder numbers); `results_json` lists them from `PENDING_FIGURES`.
    //
    // p3      HTTP requests per uncontended transfer: `Client::requests_sent()` before and
    //         after N sequential `Ledger::submit`s between fresh accounts; goal <= 6 (a count,
    //         not a ratio: give the row raw = 1).
    // p4_c16  transfers/s at 16 concurrent ÷ (raw writes/s at 16 ÷ p3); goal >= 0.90. Pair each
    //         transfer round with a raw c16 write round (`Writer::Raw`, `interleaved`) rather
    //         than reusing p1_c16's raw figure from earlier in the run.
    // p5      transfers/s with 16 workers all touching one account ÷ uncontended transfers/s;
    //         goal >= 0.5.
    // p6      stuck transfers finished per second by `sweep_once` (10,000 left `initial`,
    //         loaded with `_bulk_docs`) ÷ (raw bulk docs/s ÷ documents written per transfer);
    //         goal >= 0.5. Pair with a raw `_bulk_docs` round as `bulk_ingest` does.
    // p8      transfers/s through the batched submit path, 64 concurrent callers ÷ (raw bulk
    //         docs/s ÷ documents written per transfer); goal >= 0.5.
    // sweeper_rss  peak RSS of the sweeper finishing the 10,000 transfers (not a goal): run
    //         `couch-ledger sweep --once` as a child process and read its `VmHWM`.
];

/// Figures of issue 5 that no entry of [`FIGURES`] measures yet; `results.json` names those
/// still missing from a run.
const PENDING_FIGURES: &[&str] = &["p3", "p4_c16", "p5", "p6", "p8", "sweeper_rss"];

fn always(_: &Settings) -> bool {
    true
}

/// A measured figure: ours against raw, and their ratio.
#[derive(Debug, Clone, Serialize)]
struct Row {
    key: String,
    title: String,
    unit: &'static str,
    /// The median of ours (of couch_rs in the couch_rs rows).
    ours: f64,
    /// The median of raw.
    raw: f64,
    /// The median of the rounds' ratios `ours ÷ raw`.
    ratio: f64,
    /// Half the width of an approximate 95 % confidence interval of `ratio`, from the spread
    /// of the rounds' ratios: a goal missed by less than this is not a clear miss.
    ratio_ci95: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    goal: Option<Goal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    met: Option<bool>,
    /// Each round's figure per side, and each round's ratio, in the order measured.
    rounds: BTreeMap<&'static str, Vec<f64>>,
    /// This process's CPU time per operation (µs) on each side: the client's own cost, which on
    /// a machine shared with the server is taken from the server.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    client_cpu_us_per_op: BTreeMap<&'static str, f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

impl Row {
    /// `ours[r]` and `raw[r]` were measured in the same round.
    fn new(key: &str, title: String, unit: &'static str, ours: &[f64], raw: &[f64]) -> Row {
        assert_eq!(
            ours.len(),
            raw.len(),
            "{key}: one figure per side per round"
        );
        assert!(
            raw.iter().all(|r| *r > 0.0),
            "{key}: raw figures must be positive"
        );
        let ratios: Vec<f64> = ours.iter().zip(raw).map(|(o, r)| o / r).collect();
        Row {
            key: key.to_owned(),
            title,
            unit,
            ours: median(ours),
            raw: median(raw),
            ratio: median(&ratios),
            ratio_ci95: median_ci95(&ratios),
            goal: None,
            met: None,
            rounds: BTreeMap::from([
                ("ours", ours.to_vec()),
                ("raw", raw.to_vec()),
                ("ratio", ratios),
            ]),
            note: None,
            client_cpu_us_per_op: BTreeMap::new(),
        }
    }

    /// Records the client CPU per operation of the row's two sides.
    fn cpu(mut self, samples: &Interleaved, sides: [Side; 2], ops: usize) -> Row {
        for (column, side) in ["ours", "raw"].into_iter().zip(sides) {
            if let Some(us) = samples.cpu_us_per_op(side, ops) {
                self.client_cpu_us_per_op.insert(column, us);
            }
        }
        self
    }

    fn goal(mut self, goal: Option<Goal>) -> Row {
        self.met = goal.map(|g| g.met(self.ratio));
        self.goal = goal;
        self
    }

    fn note(mut self, note: impl Into<String>) -> Row {
        self.note = Some(note.into());
        self
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
enum Goal {
    AtLeast(f64),
    AtMost(f64),
}

impl Goal {
    fn met(self, ratio: f64) -> bool {
        match self {
            Goal::AtLeast(min) => ratio >= min,
            Goal::AtMost(max) => ratio <= max,
        }
    }
}

impl std::fmt::Display for Goal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Goal::AtLeast(min) => write!(f, ">= {min:.2}"),
            Goal::AtMost(max) => write!(f, "<= {max:.2}"),
        }
    }
}

// ---- the run ------------------------------------------------------------------------------

struct Settings {
    /// Multiplies rounds and queries (`BENCH_SCALE`).
    scale: f64,
    big: bool,
    huge: bool,
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let scale = match std::env::var("BENCH_SCALE") {
            Ok(s) if !s.is_empty() => s
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| anyhow!("BENCH_SCALE={s:?}: expected a positive number"))?,
            _ => 1.0,
        };
        let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1" || v == "true");
        Ok(Settings {
            scale,
            big: flag("BENCH_BIG"),
            huge: flag("BENCH_HUGE"),
        })
    }

    /// `count` scaled, at least 1.
    fn scaled(&self, count: usize) -> usize {
        ((count as f64 * self.scale).round() as usize).max(1)
    }
}

/// The server under test.
struct Server {
    /// Without credentials and without a trailing slash.
    url: String,
    credentials: Option<(String, String)>,
    /// Kept for its lifetime: dropping it stops the server.
    dev: Option<DevServer>,
}

impl Server {
    fn from_env() -> Result<Server> {
        let url = match std::env::var("COUCHDB_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => {
                let dev = DevServer::start().context("start pouchdb-server")?;
                return Ok(Server {
                    url: dev.url(),
                    credentials: None,
                    dev: Some(dev),
                });
            }
        };
        let mut parsed = url::Url::parse(&url).context("COUCHDB_URL")?;
        let mut credentials = std::env::var("COUCHDB_USER")
            .ok()
            .filter(|u| !u.is_empty())
            .map(|u| (u, std::env::var("COUCHDB_PASSWORD").unwrap_or_default()));
        if !parsed.username().is_empty() {
            // Credentials in the URL, as the library accepts them; never printed.
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            credentials.get_or_insert_with(|| {
                let password = decode(parsed.password().unwrap_or(""));
                (decode(parsed.username()), password)
            });
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
        }
        Ok(Server {
            url: parsed.as_str().trim_end_matches('/').to_owned(),
            credentials,
            dev: None,
        })
    }
}

/// The minimal client a user would write: reqwest with its defaults and a timeout, plus the
/// server's credentials.
#[derive(Clone)]
struct RawHttp {
    client: reqwest::Client,
    credentials: Option<(String, String)>,
}

impl RawHttp {
    fn request(&self, method: Method, url: String) -> reqwest::RequestBuilder {
        let request = self.client.request(method, url);
        match &self.credentials {
            Some((user, password)) => request.basic_auth(user, Some(password)),
            None => request,
        }
    }
}

/// Which client a round measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Ours,
    Raw,
    CouchRs,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::Raw => "raw",
            Side::CouchRs => "couch_rs",
        }
    }
}

/// Single-document writes/s of the three clients at one concurrency: a point of the plot.
///
/// Raw is the median of its rounds; ours and couch_rs are raw times their median paired ratio.
/// Their own medians come from other rounds than raw's, so on a busy machine they can stray
/// from raw's by more than the client makes a difference; the paired estimate cannot.
#[derive(Debug, Clone, Copy, Serialize)]
struct WritePoint {
    concurrency: usize,
    raw: f64,
    ours: f64,
    couch_rs: f64,
}

/// What every figure works with: the server, one client of each kind (connection pools reused
/// across rounds), and what earlier figures measured.
struct Bench {
    settings: Settings,
    server: Server,
    /// Ours, on no particular database: a figure takes `with_database`.
    ours: Client,
    raw: RawHttp,
    couch_rs: couch_rs::Client,
    databases_made: AtomicUsize,
    /// Filled by the figures as they run.
    measured: Mutex<Measured>,
}

#[derive(Default)]
struct Measured {
    write_points: Vec<WritePoint>,
}

impl Bench {
    fn new(settings: Settings, server: Server) -> Result<Bench> {
        let timeout = Duration::from_secs(REQUEST_TIMEOUT_S);
        let mut builder = Client::builder()
            .url(&server.url)
            .database("bench")
            .request_timeout(timeout);
        if let Some((user, password)) = &server.credentials {
            builder = builder.basic_auth(user, password);
        }
        let ours = builder.build()?;
        let raw = RawHttp {
            client: reqwest::Client::builder().timeout(timeout).build()?,
            credentials: server.credentials.clone(),
        };
        let (user, password) = match &server.credentials {
            Some((u, p)) => (Some(u.as_str()), Some(p.as_str())),
            None => (None, None),
        };
        let couch_rs = couch_rs::Client::new_with_timeout(
            &server.url,
            user,
            password,
            Some(REQUEST_TIMEOUT_S),
        )
        .map_err(|e| anyhow!("couch_rs client: {e}"))?;
        Ok(Bench {
            settings,
            server,
            ours,
            raw,
            couch_rs,
            databases_made: AtomicUsize::new(0),
            measured: Mutex::new(Measured::default()),
        })
    }

    /// Creates a fresh, empty database and returns our client on it (its own request counter,
    /// the shared connection pool).
    async fn fresh_database(&self, purpose: &str) -> Result<Client> {
        let n = self.databases_made.fetch_add(1, Ordering::Relaxed);
        let name = format!("bench_{purpose}_{n:03}_{:08x}", fastrand::u32(..));
        let client = self.ours.with_database(&name)?;
        ensure!(
            client.ensure_database().await?,
            "database {name} existed already"
        );
        Ok(client)
    }

    /// A fresh database per side.
    async fn fresh_databases(
        &self,
        purpose: &str,
        sides: &[Side],
    ) -> Result<BTreeMap<Side, Client>> {
        let mut databases = BTreeMap::new();
        for &side in sides {
            let client = self
                .fresh_database(&format!("{purpose}_{}", side.name()))
                .await?;
            databases.insert(side, client);
        }
        Ok(databases)
    }

    /// `base/db/` for raw requests.
    fn raw_prefix(&self, db: &str) -> String {
        format!("{}/{db}/", self.server.url)
    }
}

async fn delete_databases(databases: BTreeMap<Side, Client>) -> Result<()> {
    for client in databases.into_values() {
        client.delete_database().await?;
    }
    Ok(())
}

// ---- running work -------------------------------------------------------------------------

/// Runs job `i` for every `i` in `jobs`, at most `concurrency` at a time (that many workers
/// taking the next index from a shared counter), and returns when each job finished, in order.
/// The first error ends the run.
async fn run_concurrently<F, Fut>(
    jobs: Range<usize>,
    concurrency: usize,
    job: F,
) -> Result<Vec<Instant>>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    assert!(concurrency > 0);
    let next = Arc::new(AtomicUsize::new(jobs.start));
    let end = jobs.end;
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(jobs.len()) {
        let (next, job) = (next.clone(), job.clone());
        workers.spawn(async move {
            let mut finished = Vec::new();
            // Bounded: every turn takes a fresh index, and indices stop at `end`.
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, anyhow::Error>(finished);
                }
                job(i).await?;
                finished.push(Instant::now());
            }
        });
    }
    let mut finished = Vec::with_capacity(jobs.len());
    while let Some(worker) = workers.join_next().await {
        finished.extend(worker??); // on an error, dropping `workers` aborts the others
    }
    finished.sort();
    Ok(finished)
}

/// Jobs needed for a steady-state measurement of `timed` jobs at `concurrency`.
fn jobs_for_steady_rate(timed: usize, concurrency: usize) -> usize {
    timed + 2 * concurrency - 1
}

/// Jobs per second while all `concurrency` workers were busy: from the `concurrency`-th
/// completion to the `concurrency`-th from last, so that neither the ramp-up (connections
/// starting together) nor the ramp-down (the last requests running with fewer beside them)
/// counts. Measured this way a short round gives the rate of a long one.
fn steady_rate(finished: &[Instant], concurrency: usize) -> f64 {
    assert!(
        finished.len() >= 2 * concurrency,
        "too few jobs for a steady rate"
    );
    let (first, last) = (concurrency - 1, finished.len() - concurrency);
    (last - first) as f64 / (finished[last] - finished[first]).as_secs_f64()
}

/// Each side's figure per round, and the CPU time this process spent on each side.
struct Interleaved {
    figures: BTreeMap<Side, Vec<f64>>,
    cpu: BTreeMap<Side, Duration>,
}

impl Interleaved {
    /// `side`'s client CPU time per operation in µs, when the platform tells CPU time.
    fn cpu_us_per_op(&self, side: Side, ops: usize) -> Option<f64> {
        let cpu = self.cpu.get(&side)?;
        Some(cpu.as_secs_f64() * 1e6 / ops as f64)
    }
}

/// Measures every side once per round, rotating which side goes first, so that drift of the
/// machine or the server hits all sides alike.
async fn interleaved<F, Fut>(sides: &[Side], rounds: usize, mut measure: F) -> Result<Interleaved>
where
    F: FnMut(Side, usize) -> Fut,
    Fut: Future<Output = Result<f64>>,
{
    let mut figures: BTreeMap<Side, Vec<f64>> = BTreeMap::new();
    let mut cpu: Option<BTreeMap<Side, Duration>> = Some(BTreeMap::new());
    for round in 0..rounds {
        for k in 0..sides.len() {
            let side = sides[(round + k) % sides.len()];
            let cpu_before = process_cpu();
            let value = measure(side, round)
                .await
                .with_context(|| format!("{} round {round}", side.name()))?;
            figures.entry(side).or_default().push(value);
            // Only this process's client work: the server is another process.
            let used = cpu_before
                .zip(process_cpu())
                .and_then(|(before, after)| after.checked_sub(before));
            cpu = cpu.zip(used).map(|(mut cpu, used)| {
                *cpu.entry(side).or_default() += used;
                cpu
            });
        }
    }
    Ok(Interleaved {
        figures,
        cpu: cpu.unwrap_or_default(),
    })
}

/// CPU time this process has used so far, all threads, from the scheduler's per-thread
/// accounting (nanoseconds, unlike the 10 ms ticks of `/proc/self/stat`); `None` off Linux.
fn process_cpu() -> Option<Duration> {
    let mut total_ms = 0.0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let sched = std::fs::read_to_string(task.ok()?.path().join("sched")).ok()?;
        let line = sched
            .lines()
            .find(|l| l.starts_with("se.sum_exec_runtime"))?;
        total_ms += line.split(':').nth(1)?.trim().parse::<f64>().ok()?;
    }
    Some(Duration::from_secs_f64(total_ms / 1e3))
}

/// Half-width of an approximate 95 % confidence interval of the median of `values`: the
/// median's standard error is about 1.25 σ / √n, with σ estimated robustly as IQR / 1.35.
fn median_ci95(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let iqr = sorted[3 * n / 4] - sorted[n / 4];
    1.96 * 1.2533 * (iqr / 1.349) / (n as f64).sqrt()
}

fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty());
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

// ---- p1: single-document writes -----------------------------------------------------------

/// The document every write figure writes: about 250 bytes of JSON, with a fixed-width id so
/// every side sends bodies of the same size.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct BenchDoc {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "_rev", skip_serializing_if = "Option::is_none")]
    rev: Option<String>,
    #[serde(rename = "type")]
    kind: String,
    seq: u64,
    payload: String,
}

impl BenchDoc {
    fn new(i: usize) -> BenchDoc {
        BenchDoc {
            id: format!("d{i:08}"),
            rev: None,
            kind: "bench_item".to_owned(),
            seq: i as u64,
            payload: "x".repeat(PAYLOAD_BYTES),
        }
    }
}

impl couch_rs::document::TypedCouchDocument for BenchDoc {
    fn get_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.id)
    }
    fn get_rev(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.rev.as_deref().unwrap_or(""))
    }
    fn set_rev(&mut self, rev: &str) {
        self.rev = Some(rev.to_owned());
    }
    fn set_id(&mut self, id: &str) {
        id.clone_into(&mut self.id);
    }
    fn merge_ids(&mut self, other: &Self) {
        self.set_id(&other.id);
        self.rev.clone_from(&other.rev);
    }
}

/// One client's way to create a new document with a known id.
#[derive(Clone)]
enum Writer {
    /// `Client::put`.
    Ours(Client),
    /// A PUT with `Content-Type: application/json`, checking the status, reading the body.
    Raw { http: RawHttp, db_prefix: String },
    /// `Database::save`, couch_rs's PUT of the document's `_id`.
    CouchRs(Arc<couch_rs::database::Database>),
}

impl Writer {
    async fn new(bench: &Bench, side: Side, db: &Client) -> Result<Writer> {
        Ok(match side {
            Side::Ours => Writer::Ours(db.clone()),
            Side::Raw => Writer::Raw {
                http: bench.raw.clone(),
                db_prefix: bench.raw_prefix(db.database()),
            },
            Side::CouchRs => {
                let database = bench
                    .couch_rs
                    .db(db.database())
                    .await
                    .map_err(|e| anyhow!("couch_rs db: {e}"))?;
                Writer::CouchRs(Arc::new(database))
            }
        })
    }

    async fn create(&self, i: usize) -> Result<()> {
        let mut doc = BenchDoc::new(i);
        match self {
            Writer::Ours(client) => {
                client.put(&doc.id, &doc).await?;
            }
            Writer::Raw { http, db_prefix } => {
                let response = http
                    .request(Method::PUT, format!("{db_prefix}{}", doc.id))
                    .header(CONTENT_TYPE, "application/json")
                    .body(serde_json::to_vec(&doc)?)
                    .send()
                    .await?;
                ensure!(response.status().is_success(), "PUT: {}", response.status());
                response.bytes().await?;
            }
            Writer::CouchRs(database) => {
                database
                    .save(&mut doc)
                    .await
                    .map_err(|e| anyhow!("couch_rs save: {e}"))?;
            }
        }
        Ok(())
    }

    /// Runs `create` for every index of `jobs`, `concurrency` at a time; when each finished.
    async fn create_all(&self, jobs: Range<usize>, concurrency: usize) -> Result<Vec<Instant>> {
        let writer = self.clone();
        run_concurrently(jobs, concurrency, move |i| {
            let writer = writer.clone();
            async move { writer.create(i).await }
        })
        .await
    }
}

/// Single-document creates/s at `concurrency`: ours, raw and couch_rs, each in its own fresh
/// database, alternating round by round.
async fn single_writes(
    bench: &Bench,
    concurrency: usize,
    key: &str,
    goal: Option<Goal>,
) -> Result<Vec<Row>> {
    let (rounds, timed) = if concurrency == 1 {
        (WRITE_ROUNDS_C1, 1)
    } else {
        let timed = WRITES_PER_ROUND.max(WRITES_PER_ROUND_PER_CONNECTION_MIN * concurrency);
        (WRITE_ROUNDS, timed)
    };
    let rounds = bench.settings.scaled(rounds);
    let writes = jobs_for_steady_rate(timed, concurrency);
    let sides = [Side::Ours, Side::Raw, Side::CouchRs];
    let databases = bench
        .fresh_databases(&format!("writes_c{concurrency}"), &sides)
        .await?;
    let mut writers = BTreeMap::new();
    for side in sides {
        let writer = Writer::new(bench, side, &databases[&side]).await?;
        // Untimed, after the last round's ids: fills the pool with `concurrency` connections.
        let warm_up = rounds * writes;
        writer
            .create_all(warm_up..warm_up + concurrency, concurrency)
            .await?;
        writers.insert(side, writer);
    }
    let ours_requests_before = databases[&Side::Ours].requests_sent();
    let samples = interleaved(&sides, rounds, |side, round| {
        let writer = writers[&side].clone();
        async move {
            let first = round * writes;
            let finished = writer
                .create_all(first..first + writes, concurrency)
                .await?;
            Ok(steady_rate(&finished, concurrency))
        }
    })
    .await?;
    // One request per write, or retries distorted the figure.
    let ours_requests = databases[&Side::Ours].requests_sent() - ours_requests_before;
    let retried = ours_requests - (rounds * writes) as u64;
    delete_databases(databases).await?;

    let (ours, raw, peer) = (
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Raw],
        &samples.figures[&Side::CouchRs],
    );
    let ops = rounds * writes; // every write of a round takes CPU, timed or not
    let mut ours_row = Row::new(
        key,
        format!("single-doc writes/s, c{concurrency}"),
        "writes/s",
        ours,
        raw,
    )
    .goal(goal)
    .cpu(&samples, [Side::Ours, Side::Raw], ops);
    if retried > 0 {
        ours_row = ours_row.note(format!("{retried} requests of ours were retries"));
    }
    let peer_row = Row::new(
        &format!("couch_rs_c{concurrency}"),
        format!("couch_rs single-doc writes/s, c{concurrency} (peer)"),
        "writes/s",
        peer,
        raw,
    )
    .cpu(&samples, [Side::CouchRs, Side::Raw], ops);
    let point = WritePoint {
        concurrency,
        raw: ours_row.raw,
        ours: ours_row.raw * ours_row.ratio,
        couch_rs: peer_row.raw * peer_row.ratio,
    };
    bench
        .measured
        .lock()
        .expect("lock")
        .write_points
        .push(point);
    Ok(vec![ours_row, peer_row])
}

// ---- p2: bulk ingest ----------------------------------------------------------------------

/// One client's way to write a batch of new documents in one `_bulk_docs` request.
#[derive(Clone)]
enum BulkWriter {
    /// `Client::bulk_docs`.
    Ours(Client),
    /// A POST of `{"docs": […]}`, checking the status, reading the body.
    Raw { http: RawHttp, url: String },
}

impl BulkWriter {
    fn new(bench: &Bench, side: Side, db: &Client) -> BulkWriter {
        match side {
            Side::Ours => BulkWriter::Ours(db.clone()),
            Side::Raw => BulkWriter::Raw {
                http: bench.raw.clone(),
                url: format!("{}_bulk_docs", bench.raw_prefix(db.database())),
            },
            Side::CouchRs => unreachable!("p2 compares ours with raw only"),
        }
    }

    async fn write(&self, docs: &[BenchDoc]) -> Result<()> {
        #[derive(Serialize)]
        struct Body<'a> {
            docs: &'a [BenchDoc],
        }
        match self {
            BulkWriter::Ours(client) => {
                let results = client.bulk_docs(docs).await?;
                ensure!(results.iter().all(|r| r.is_ok()), "a bulk write failed");
            }
            BulkWriter::Raw { http, url } => {
                let response = http
                    .request(Method::POST, url.clone())
                    .header(CONTENT_TYPE, "application/json")
                    .body(serde_json::to_vec(&Body { docs })?)
                    .send()
                    .await?;
                let status = response.status();
                ensure!(status.is_success(), "_bulk_docs: {status}");
                response.bytes().await?;
            }
        }
        Ok(())
    }
}

/// Docs/s through `_bulk_docs` in batches of [`BULK_BATCH_DOCS`], one request after another:
/// ours (`Client::bulk_docs`) and a raw POST of the same documents, each in its own database.
async fn bulk_ingest(bench: &Bench) -> Result<Vec<Row>> {
    let rounds = bench.settings.scaled(BULK_ROUNDS);
    let per_round = jobs_for_steady_rate(1, 1);
    // Every round's batches, then one batch to open each side's connection.
    let docs: Vec<BenchDoc> = (0..(rounds * per_round + 1) * BULK_BATCH_DOCS)
        .map(BenchDoc::new)
        .collect();
    let batch = |b: usize| &docs[b * BULK_BATCH_DOCS..(b + 1) * BULK_BATCH_DOCS];
    let sides = [Side::Ours, Side::Raw];
    let databases = bench.fresh_databases("bulk", &sides).await?;
    let mut writers = BTreeMap::new();
    for side in sides {
        let writer = BulkWriter::new(bench, side, &databases[&side]);
        writer.write(batch(rounds * per_round)).await?;
        writers.insert(side, writer);
    }
    let samples = interleaved(&sides, rounds, |side, round| {
        let writer = &writers[&side];
        async move {
            let mut finished = Vec::with_capacity(per_round);
            for b in round * per_round..(round + 1) * per_round {
                writer.write(batch(b)).await?;
                finished.push(Instant::now());
            }
            Ok(steady_rate(&finished, 1) * BULK_BATCH_DOCS as f64)
        }
    })
    .await?;
    for (side, db) in &databases {
        let info = db.database_info().await?;
        let expected = docs.len() as u64;
        ensure!(
            info["doc_count"].as_u64() == Some(expected),
            "{}: doc_count {} ≠ {expected}",
            side.name(),
            info["doc_count"]
        );
    }
    delete_databases(databases).await?;
    let row = Row::new(
        "p2",
        format!("bulk ingest docs/s, batches of {BULK_BATCH_DOCS}"),
        "docs/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Raw],
    )
    .goal(Some(GOAL_P2))
    .cpu(&samples, [Side::Ours, Side::Raw], rounds * per_round);
    Ok(vec![row])
}

// ---- p7: order balance --------------------------------------------------------------------

fn order_id(order: usize) -> String {
    format!("o{order:07}")
}

const DELIVERY_PRICE: i64 = 495;

/// An order's one basket line: unit price and quantity, in minor units.
fn basket_line(order: usize) -> (i64, i64) {
    (1_000 + (order % 97) as i64 * 13, 1 + (order % 3) as i64)
}

/// An order's purchase total, in minor units: pretax + 10 % tax + delivery.
fn purchase_total(order: usize) -> i64 {
    let (price, quantity) = basket_line(order);
    let pretax = price * quantity;
    pretax + pretax / 10 + DELIVERY_PRICE
}

fn payment_value(order: usize) -> i64 {
    purchase_total(order) / 5
}

/// What the ledger view must answer for an order: its total less its payments.
fn expected_balance(order: usize) -> i64 {
    purchase_total(order) - PAYMENTS_PER_ORDER as i64 * payment_value(order)
}

/// An order's documents in the shapes `validate_doc_update` accepts: the purchase (Cloudant's
/// shape, minor units) and its payments.
fn order_docs(order: usize) -> Vec<Value> {
    let oid = order_id(order);
    let account = format!("c{:05}", order % 1_000);
    let (price, quantity) = basket_line(order);
    let pretax = price * quantity;
    let mut docs = vec![json!({
        "_id": format!("purchase:{oid}"),
        "type": "purchase",
        "order_id": oid,
        "account_id": account,
        "currency": "USD",
        "basket": [{
            "product_id": format!("p{:04}", order % 97),
            "title": "Bench widget",
            "category": "widgets",
            "price": price,
            "tax": price / 10,
            "quantity": quantity,
        }],
        "delivery": {"option": "standard", "price": DELIVERY_PRICE, "address": "1 Bench Road"},
        "pretax": pretax,
        "tax": pretax / 10,
        "total": purchase_total(order),
    })];
    for k in 0..PAYMENTS_PER_ORDER {
        docs.push(json!({
            "_id": format!("payment:{oid}:r{k}"),
            "type": "payment",
            "order_id": oid,
            "payment_reference": format!("r{k}"),
            "account_id": account,
            "currency": "USD",
            "value": payment_value(order),
            "method": "card",
        }));
    }
    docs
}

/// A fresh ledger database (design documents installed) holding `orders` orders, loaded with
/// `_bulk_docs`.
async fn load_orders(bench: &Bench, orders: usize) -> Result<Ledger> {
    let ledger = Ledger::new(bench.fresh_database(&format!("orders{orders}")).await?);
    ledger.init().await?;
    let orders_per_batch = LOAD_BATCH_DOCS / DOCS_PER_ORDER;
    for first in (0..orders).step_by(orders_per_batch) {
        let docs: Vec<Value> = (first..(first + orders_per_batch).min(orders))
            .flat_map(order_docs)
            .collect();
        let results = ledger.client().bulk_docs(&docs).await?;
        if let Some(bad) = results.iter().find(|r| !r.is_ok()) {
            bail!("loading orders: {bad:?}");
        }
    }
    Ok(ledger)
}

/// Balance-query latency (ms) on a database of `orders` orders: ours against a raw GET of
/// `_design/orders/_view/ledger?group=true&key="…"`. Both ask for the same random orders,
/// alternating query by query (who goes first alternating too); a round's figure per side is
/// its median latency.
async fn order_balance(
    bench: &Bench,
    orders: usize,
    key: &str,
    goal: Option<Goal>,
) -> Result<Vec<Row>> {
    let load_started = Instant::now();
    let ledger = load_orders(bench, orders).await?;
    let load = load_started.elapsed();
    let client = ledger.client();
    let view = format!(
        "{}_design/orders/_view/ledger",
        bench.raw_prefix(client.database())
    );
    // The first query builds the index; every timed query finds it up to date.
    let index_started = Instant::now();
    ensure!(ours_balance(&ledger, 0).await? == expected_balance(0));
    let index_build = index_started.elapsed();
    ensure!(raw_balance(&bench.raw, &view, 0).await? == expected_balance(0));

    let queries = bench.settings.scaled(BALANCE_QUERIES_PER_ROUND);
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for round in 0..LATENCY_ROUNDS {
        let mut rng = fastrand::Rng::with_seed(round as u64);
        let (mut ours_ms, mut raw_ms) = (Vec::with_capacity(queries), Vec::with_capacity(queries));
        for q in 0..queries {
            let order = rng.usize(..orders);
            let first_ours = q % 2 == 0;
            for ours_turn in [first_ours, !first_ours] {
                let started = Instant::now();
                let (balance, latencies) = if ours_turn {
                    (ours_balance(&ledger, order).await?, &mut ours_ms)
                } else {
                    (raw_balance(&bench.raw, &view, order).await?, &mut raw_ms)
                };
                latencies.push(started.elapsed().as_secs_f64() * 1e3);
                ensure!(
                    balance == expected_balance(order),
                    "order {order}: balance {balance} (ours: {ours_turn})"
                );
            }
        }
        ours.push(median(&ours_ms));
        raw.push(median(&raw_ms));
    }
    client.delete_database().await?;
    let row = Row::new(
        key,
        format!(
            "order balance latency, {} docs",
            thousands(orders * DOCS_PER_ORDER)
        ),
        "ms",
        &ours,
        &raw,
    )
    .goal(goal)
    .note(format!(
        "ours = Ledger::order_balance; loaded in {:.1} s, index built in {:.1} s",
        load.as_secs_f64(),
        index_build.as_secs_f64()
    ));
    Ok(vec![row])
}

/// Our way to an order's balance: `Ledger::order_balance`, one `group=true&key=` view query
/// whose reduced value is checked to be an exact amount for that key.
async fn ours_balance(ledger: &Ledger, order: usize) -> Result<i64> {
    Ok(ledger.order_balance(&order_id(order)).await?.minor())
}

/// The raw way: one GET and a typed parse of the one number.
async fn raw_balance(http: &RawHttp, view: &str, order: usize) -> Result<i64> {
    #[derive(Deserialize)]
    struct Reply {
        rows: Vec<ReplyRow>,
    }
    #[derive(Deserialize)]
    struct ReplyRow {
        value: i64,
    }
    // Order ids are alphanumeric: the JSON key only needs its quotes encoded.
    let url = format!("{view}?group=true&key=%22{}%22", order_id(order));
    let response = http.request(Method::GET, url).send().await?;
    ensure!(
        response.status().is_success(),
        "view: {}",
        response.status()
    );
    let reply: Reply = serde_json::from_slice(&response.bytes().await?)?;
    reply
        .rows
        .first()
        .map(|row| row.value)
        .ok_or_else(|| anyhow!("no balance row for order {order}"))
}

// ---- output -------------------------------------------------------------------------------

fn thousands(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "\n{:<13} {:<46} {:>10} {:>10} {:>9} {:>7} {:>6} {:>8} {:>5}",
        "figure", "what", "ours", "raw", "unit", "ratio", "±95%", "goal", "met?"
    );
    println!("{}", "-".repeat(122));
    for row in rows {
        let goal = row.goal.map_or("-".to_owned(), |g| g.to_string());
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        println!(
            "{:<13} {:<46} {:>10.1} {:>10.1} {:>9} {:>7.3} {:>6.3} {:>8} {:>5}",
            row.key, row.title, row.ours, row.raw, row.unit, row.ratio, row.ratio_ci95, goal, met
        );
    }
    println!(
        "\nclient CPU per operation, µs (this process, the harness's share included and alike \
         for every side; the server is another process):"
    );
    for row in rows.iter().filter(|r| !r.client_cpu_us_per_op.is_empty()) {
        let cpu = &row.client_cpu_us_per_op;
        let shown = |column: &str| {
            cpu.get(column)
                .map_or("?".to_owned(), |us| format!("{us:.0}"))
        };
        println!(
            "  {:<13} {:>6} vs raw {:>6}",
            row.key,
            shown("ours"),
            shown("raw")
        );
    }
    for row in rows.iter().filter(|r| r.note.is_some()) {
        println!("  {}: {}", row.key, row.note.as_deref().unwrap_or_default());
    }
}

/// What the run knows about the machine: its load at the start and at the end tells a reader
/// how much else was running.
struct MachineLoad {
    start: Option<String>,
    end: Option<String>,
}

fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// `pouchdb-server 4.2.0`, `Apache CouchDB 3.4.3`, … from the server's welcome document.
fn server_name(welcome: &Value) -> String {
    let version = welcome
        .get("version")
        .and_then(Value::as_str)
        .unwrap_or("?");
    let product = if welcome.get("express-pouchdb").is_some() {
        "pouchdb-server"
    } else if welcome.get("couchdb").is_some() {
        welcome
            .pointer("/vendor/name")
            .and_then(Value::as_str)
            .unwrap_or("CouchDB")
    } else {
        "a CouchDB-protocol server"
    };
    format!("{product} {version}")
}

fn results_json(
    bench: &Bench,
    rows: &[Row],
    server_info: &Value,
    load: &MachineLoad,
    elapsed: Duration,
) -> Value {
    let mut top = serde_json::Map::new();
    for row in rows.iter().filter(|r| r.goal.is_some()) {
        top.insert(row.key.clone(), json!(row.ratio));
    }
    let figures: serde_json::Map<String, Value> = rows
        .iter()
        .map(|r| {
            (
                r.key.clone(),
                serde_json::to_value(r).expect("a row serializes"),
            )
        })
        .collect();
    let measured = bench.measured.lock().expect("lock");
    top.insert(
        "details".to_owned(),
        json!({
            "date": utc_now(),
            "duration_s": elapsed.as_secs_f64(),
            "rounds_per_side": {
                "writes_c1": bench.settings.scaled(WRITE_ROUNDS_C1),
                "writes": bench.settings.scaled(WRITE_ROUNDS),
                "bulk": bench.settings.scaled(BULK_ROUNDS),
                "latency": LATENCY_ROUNDS,
            },
            "method": "ours and raw alternate in short rounds in one run; ratio = median of the rounds' ours/raw ratios; ours/raw = each side's median",
            "scale": bench.settings.scale,
            "server": {
                "name": server_name(server_info),
                "url": bench.server.url,
                "started_by_bench": bench.server.dev.is_some(),
                "welcome": server_info,
            },
            "machine": {
                "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
                "cpu": cpu_model(),
                "os": std::env::consts::OS,
                "arch": std::env::consts::ARCH,
                "load_average_1_5_15m": {"start": load.start, "end": load.end},
                "nice": nice(),
            },
            "figures": figures,
            "single_writes_by_concurrency": measured.write_points,
            "not_yet_measured": PENDING_FIGURES
                .iter()
                .filter(|key| rows.iter().all(|r| r.key != **key))
                .collect::<Vec<_>>(),
        }),
    );
    Value::Object(top)
}

/// This process's nice value (the server, its child, inherits it): a run at a higher priority
/// than the other work on the machine is steadier, and should say so.
fn nice() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split_whitespace().nth(16)?.parse().ok()
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

/// `YYYY-MM-DDTHH:MM:SSZ` now, without a date crate (days to civil date: H. Hinnant).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A step for about five gridlines up to `max`: 1, 2 or 5 times a power of ten.
fn grid_step(max: f64) -> f64 {
    let rough = (max / 5.0).max(1.0);
    let power = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * power)
}

/// A line chart of single-document writes/s against concurrency (log scale), one line per
/// client, with axes, gridlines and a legend.
fn plot_svg(points: &[WritePoint], subtitle: &str) -> String {
    const W: f64 = 800.0;
    const H: f64 = 460.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 560.0;
    const TOP: f64 = 70.0;
    const BOTTOM: f64 = 390.0;
    let mut points = points.to_vec();
    points.sort_by_key(|p| p.concurrency);
    let top_value = points
        .iter()
        .flat_map(|p| [p.ours, p.raw, p.couch_rs])
        .fold(0.0, f64::max);
    let step = grid_step(top_value * 1.1);
    let y_max = (top_value * 1.1 / step).ceil().max(1.0) * step;
    let max_c = points.last().map_or(1, |p| p.concurrency).max(2) as f64;
    let x = |c: usize| LEFT + 30.0 + (c as f64).log2() / max_c.log2() * (RIGHT - LEFT - 60.0);
    let y = |v: f64| BOTTOM - v / y_max * (BOTTOM - TOP);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="28" font-size="17" font-weight="bold">Single-document writes per second against concurrency</text>"#
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="50" font-size="12" fill="#555">{}</text>"##,
        xml_escape(subtitle)
    );
    // Horizontal gridlines with their values.
    let lines = (y_max / step).round() as usize;
    for k in 0..=lines {
        let v = k as f64 * step;
        let yy = y(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{RIGHT}" y2="{yy:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#333">{v}</text>"##,
            LEFT - 8.0,
            yy + 4.0
        );
    }
    // Axes, ticks at the measured concurrencies, axis labels.
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{BOTTOM}" x2="{RIGHT}" y2="{BOTTOM}" stroke="#222"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{BOTTOM}" stroke="#222"/>"##
    );
    for p in &points {
        let xx = x(p.concurrency);
        let _ = writeln!(
            svg,
            r##"<line x1="{xx:.1}" y1="{BOTTOM}" x2="{xx:.1}" y2="{:.1}" stroke="#222"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
            BOTTOM + 5.0,
            BOTTOM + 20.0,
            p.concurrency
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">concurrent requests (log scale)</text>"#,
        (LEFT + RIGHT) / 2.0,
        BOTTOM + 45.0
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="{:.1}" font-size="11" fill="#666">raw: median of its rounds; ours and couch_rs: raw × their median ratio to raw in the same rounds</text>"##,
        H - 8.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(24 {:.1}) rotate(-90)" text-anchor="middle">writes per second</text>"#,
        (TOP + BOTTOM) / 2.0
    );
    // The lines, with a marker at each measured point.
    struct Series {
        label: &'static str,
        color: &'static str,
        dash: &'static str,
        value: fn(&WritePoint) -> f64,
    }
    let series = [
        Series {
            label: "raw reqwest (limit)",
            color: "#444444",
            dash: "7 4",
            value: |p| p.raw,
        },
        Series {
            label: "couch-ledger (ours)",
            color: "#1f6fd1",
            dash: "none",
            value: |p| p.ours,
        },
        Series {
            label: "couch_rs 0.13 (peer)",
            color: "#e07b00",
            dash: "2 3",
            value: |p| p.couch_rs,
        },
    ];
    for (i, line) in series.iter().enumerate() {
        let Series {
            label,
            color,
            dash,
            value,
        } = line;
        let path: Vec<String> = points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.concurrency), y(value(p))))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2.5" stroke-dasharray="{dash}"/>"#,
            path.join(" ")
        );
        for p in &points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"><title>{label}: {:.0} writes/s at {}</title></circle>"#,
                x(p.concurrency),
                y(value(p)),
                value(p),
                p.concurrency
            );
        }
        // Legend, right of the plot.
        let ly = TOP + 10.0 + i as f64 * 24.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2.5" stroke-dasharray="{dash}"/><circle cx="{:.1}" cy="{ly:.1}" r="4" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            RIGHT + 20.0,
            RIGHT + 50.0,
            RIGHT + 35.0,
            RIGHT + 58.0,
            ly + 4.0,
            xml_escape(label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn output_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench")
}

// ---- main ---------------------------------------------------------------------------------

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
    let mut rows = Vec::new();
    for figure in FIGURES.iter().filter(|f| (f.enabled)(&bench.settings)) {
        let figure_started = Instant::now();
        let measured = (figure.measure)(&bench)
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
    let elapsed = started.elapsed();
    print_table(&rows);
    let load_start_shown = load_start.clone().unwrap_or_else(|| "?".to_owned());
    println!(
        "ratio = median over rounds of ours ÷ raw measured back to back (rounds per side: c1 {}, \
         c4-c64 {}, p2 {}, latency {LATENCY_ROUNDS} x {} queries)\nmeasured in {:.0} s, load average {} → {}",
        bench.settings.scaled(WRITE_ROUNDS_C1),
        bench.settings.scaled(WRITE_ROUNDS),
        bench.settings.scaled(BULK_ROUNDS),
        bench.settings.scaled(BALANCE_QUERIES_PER_ROUND),
        elapsed.as_secs_f64(),
        load_start_shown,
        load_average().as_deref().unwrap_or("?")
    );

    let dir = output_dir();
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let json_path = dir.join("results.json");
    let load = MachineLoad {
        start: load_start,
        end: load_average(),
    };
    let results = results_json(&bench, &rows, &server_info, &load, elapsed);
    std::fs::write(&json_path, serde_json::to_string_pretty(&results)? + "\n")?;
    let subtitle = format!(
        "{} · {} cores · medians of interleaved rounds · {}",
        server_name(&server_info),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        &utc_now()[..10]
    );
    let svg_path = dir.join("results.svg");
    let mut points = bench.measured.lock().expect("lock").write_points.clone();
    points.sort_by_key(|p| p.concurrency);
    let levels: Vec<usize> = points.iter().map(|p| p.concurrency).collect();
    ensure!(levels == PLOT_CONCURRENCY, "plot levels {levels:?}");
    std::fs::write(&svg_path, plot_svg(&points, &subtitle))?;
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}
