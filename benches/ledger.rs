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
//! scale 1, the issue's 10,000 at 5); `BENCH_BIG=1` adds the order-balance latency at 100k
//! documents (≈ 90 s of index build on pouchdb-server), `BENCH_HUGE=1` at 1M documents (also
//! 100k); `BENCH_ONLY=p3,p8` runs only those figures (`p3` comes along with any transfer
//! figure, which divides by it, and `p8` with `p9`; no plot unless every single-write figure
//! ran).
//!
//! `p9` runs the release binary as `couch-ledger serve` and sends `p8`'s transfers to it over
//! HTTP (64 keep-alive callers), alternating round by round with the same transfers through
//! the library in the bench's own process: the service's cost over the library path.

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
use couch_ledger::{
    AccountSpec, Amount, Client, Currency, Ledger, State, TransferRequest, VerifyOptions,
};
use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::task::JoinSet;

// The local server is the program's own helper (not part of the library), compiled in here.
#[path = "../src/cli/devserver.rs"]
mod devserver;
use devserver::DevServer;

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
    // The transfer figures first, the batched one (`p8`) right after `p3`, which the others
    // divide by, and the figures of many small concurrent writes last (`p4_p5`, then the
    // single-write and order figures below): CouchDB 3.4.3 here writes ~30 % slower for the rest
    // of its uptime once it has served thousands of concurrent single-document writes (measured
    // with raw HTTP alone, no ledger: a bulk workload at 2,517–2,721 transfers/s before, 1,771–
    // 1,933 after, still after a minute, fast again after a restart; BENCHMARKS.md),
    // so a figure measured after them measures that server instead. Every figure still divides
    // by its raw side measured in the same rounds.
    Figure {
        key: "p3",
        enabled: always,
        measure: |b| Box::pin(requests_per_transfer(b)),
    },
    Figure {
        key: "p8",
        enabled: always,
        measure: |b| Box::pin(batched_transfers(b)),
    },
    // p8's workload on accounts with a long revision history, with and without init's
    // `_revs_limit`.
    Figure {
        key: "p8_aged",
        enabled: always,
        measure: |b| Box::pin(aged_transfers(b)),
    },
    // p8's workload without pause for minutes (opt-in: BENCH_LONG_S).
    Figure {
        key: "p8_long",
        enabled: |_| long_seconds().is_some(),
        measure: |b| Box::pin(long_transfers(b)),
    },
    // The same transfers through the HTTP service, against the library path (p8's workload).
    Figure {
        key: "p9",
        enabled: |_| cfg!(feature = "serve"),
        measure: |b| Box::pin(served_transfers(b)),
    },
    // p6 and sweeper_rss come from the same run of the sweeper.
    Figure {
        key: "p6",
        enabled: always,
        measure: |b| Box::pin(sweeper(b)),
    },
    // p4_c16 and p5 come from the same rounds.
    Figure {
        key: "p4_p5",
        enabled: always,
        measure: |b| Box::pin(concurrent_transfers(b)),
    },
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
];

/// Figures besides `p1`, `p2` and `p7`; `results.json` names those a run did not
/// measure (`details.not_yet_measured`, empty unless `BENCH_ONLY` left some out).
const PENDING_FIGURES: &[&str] = &["p3", "p4_c16", "p5", "p6", "p8", "p9", "sweeper_rss"];

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
    /// A figure that is a count, not a ratio (`raw` = 1, `ratio` = `ours`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    count: bool,
}

impl Row {
    /// A figure that is a count or a size, not a ratio to raw: `ours` (and `ratio`) is the mean
    /// of `values`, `raw` is 1.
    fn count(key: &str, title: String, unit: &'static str, values: &[f64]) -> Row {
        let n = values.len() as f64;
        let mean = mean(values);
        let spread = if values.len() > 1 {
            let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
            1.96 * variance.sqrt() / n.sqrt()
        } else {
            0.0
        };
        Row {
            key: key.to_owned(),
            title,
            unit,
            ours: mean,
            raw: 1.0,
            ratio: mean,
            ratio_ci95: spread,
            goal: None,
            met: None,
            rounds: BTreeMap::from([("ours", values.to_vec())]),
            client_cpu_us_per_op: BTreeMap::new(),
            note: None,
            count: true,
        }
    }

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
            count: false,
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
    /// Only these figures (`BENCH_ONLY`, comma-separated keys), for working on one figure;
    /// `None`: all of them. The plot needs every single-write figure.
    only: Option<Vec<String>>,
    /// The layout of every ledger the transfer figures use (`BENCH_LAYOUT`, `split` by
    /// default): `split` keeps accounts and transfers in a second database without validation
    /// (`Ledger::with_hot_database`, docs/LAYOUT.md), `single` keeps everything in the one
    /// validated database.
    layout: Layout,
}

/// Where a bench ledger keeps its accounts and transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Single,
    Split,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Single => "single",
            Layout::Split => "split",
        }
    }
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
        let only = std::env::var("BENCH_ONLY")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| {
                let mut keys: Vec<String> = s.split(',').map(|k| k.trim().to_owned()).collect();
                // The transfer figures divide by what p3 measured.
                // p9 is shown beside p8, measured in the same run.
                if keys.iter().any(|k| k == "p9") && !keys.iter().any(|k| k == "p8") {
                    keys.push("p8".to_owned());
                }
                let transfers = ["p4_p5", "p6", "p8"];
                if keys.iter().any(|k| transfers.contains(&k.as_str())) {
                    keys.push("p3".to_owned());
                }
                keys
            });
        if let Some(keys) = &only {
            for key in keys {
                ensure!(
                    FIGURES.iter().any(|f| f.key == key),
                    "BENCH_ONLY: no figure {key:?}"
                );
            }
        }
        let layout = match std::env::var("BENCH_LAYOUT").as_deref() {
            Ok("single") => Layout::Single,
            Ok("split") | Ok("") | Err(_) => Layout::Split,
            Ok(other) => bail!("BENCH_LAYOUT={other:?}: expected split or single"),
        };
        Ok(Settings {
            scale,
            big: flag("BENCH_BIG"),
            huge: flag("BENCH_HUGE"),
            only,
            layout,
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
    /// `p5`: our transfers, all paying into one account.
    Hot,
    /// `p6`, `p8`: raw `_bulk_docs` of transfer documents into a ledger database, where
    /// `validate_doc_update` runs for every document.
    Validated,
    /// `p9`: transfers sent over HTTP to `couch-ledger serve`.
    Serve,
    /// `p10_other`: our transfers on the other layout (`BENCH_OTHER_LAYOUT=1`).
    OtherLayout,
    /// `p8_aged`: our transfers in a database left at CouchDB's default `_revs_limit`.
    DefaultRevsLimit,
    /// `p8_floor`: only the documents a transfer cannot do without ([`DocumentFloor`]).
    Floor,
    /// `p8_phases`: today's documents, batched ideally ([`FloorShape::Phases`]).
    Phases,
    /// `p8_one_request`: a transfer in one request, batched ideally ([`FloorShape::OneRequest`],
    /// `BENCH_ONE_REQUEST=1`).
    OneRequest,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::Raw => "raw",
            Side::CouchRs => "couch_rs",
            Side::Hot => "hot",
            Side::Validated => "validated",
            Side::Serve => "serve",
            Side::OtherLayout => "other_layout",
            Side::DefaultRevsLimit => "default_revs_limit",
            Side::Floor => "floor",
            Side::Phases => "phases",
            Side::OneRequest => "one_request",
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
    /// What `p3` found a transfer costs, for the transfer figures after it.
    transfer_cost: Option<TransferCost>,
    /// Transfers/s against concurrency (`p3`, `p4_c16`, `p8`), for the plot.
    transfer_points: Vec<TransferPoint>,
    /// `p8`'s limits, transfers/s: raw bulk docs/s ÷ documents written per transfer, into a
    /// plain database and into a validated one.
    bulk_limits: Option<BulkLimits>,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct BulkLimits {
    plain: f64,
    validated: f64,
}

/// Transfers/s at one concurrency, beside the limit that figure divides by.
#[derive(Debug, Clone, Copy, Serialize)]
struct TransferPoint {
    concurrency: usize,
    /// Transfers/s.
    ours: f64,
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

/// Runs job `(w, i)` for every `i` in `jobs`, at most `concurrency` at a time: worker `w` of
/// `concurrency` takes the next index from a shared counter. Returns when each job finished,
/// in order. The first error ends the run.
async fn run_concurrently<F, Fut>(
    jobs: Range<usize>,
    concurrency: usize,
    job: F,
) -> Result<Vec<Instant>>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    assert!(concurrency > 0);
    let next = Arc::new(AtomicUsize::new(jobs.start));
    let end = jobs.end;
    let mut workers = JoinSet::new();
    for w in 0..concurrency.min(jobs.len()) {
        let (next, job) = (next.clone(), job.clone());
        workers.spawn(async move {
            let mut finished = Vec::new();
            // Bounded: every turn takes a fresh index, and indices stop at `end`.
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, anyhow::Error>(finished);
                }
                job(w, i).await?;
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

/// Each side's figure per round, and the CPU time this process (and, with
/// `BENCH_SERVER_PID`, the server's process) spent on each side.
struct Interleaved {
    figures: BTreeMap<Side, Vec<f64>>,
    cpu: BTreeMap<Side, Duration>,
    server_cpu: BTreeMap<Side, Duration>,
}

impl Interleaved {
    /// `side`'s client CPU time per operation in µs, when the platform tells CPU time.
    fn cpu_us_per_op(&self, side: Side, ops: usize) -> Option<f64> {
        let cpu = self.cpu.get(&side)?;
        Some(cpu.as_secs_f64() * 1e6 / ops as f64)
    }

    /// `side`'s server CPU time per operation in µs, when `BENCH_SERVER_PID` names the
    /// server's process on this machine.
    fn server_cpu_us_per_op(&self, side: Side, ops: usize) -> Option<f64> {
        let cpu = self.server_cpu.get(&side)?;
        Some(cpu.as_secs_f64() * 1e6 / ops as f64)
    }
}

/// CPU time (user + system) the server's process has used so far, when `BENCH_SERVER_PID`
/// names it (a server on this machine: CouchDB's `beam.smp`, or pouchdb-server's node), from
/// `/proc/<pid>/stat` (clock ticks of 10 ms: enough over a round of a second or more).
fn server_cpu() -> Option<Duration> {
    let pid = std::env::var("BENCH_SERVER_PID").ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok()?;
    // The fields after the command, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
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
    let mut server: BTreeMap<Side, Duration> = BTreeMap::new();
    for round in 0..rounds {
        for k in 0..sides.len() {
            let side = sides[(round + k) % sides.len()];
            let cpu_before = process_cpu();
            let server_before = server_cpu();
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
            if let Some(used) = server_before
                .zip(server_cpu())
                .and_then(|(before, after)| after.checked_sub(before))
            {
                *server.entry(side).or_default() += used;
            }
        }
    }
    Ok(Interleaved {
        figures,
        cpu: cpu.unwrap_or_default(),
        server_cpu: server,
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
            Side::Hot
            | Side::Validated
            | Side::Serve
            | Side::OtherLayout
            | Side::DefaultRevsLimit
            | Side::Floor
            | Side::Phases
            | Side::OneRequest => {
                unreachable!("{side:?} writes transfers")
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
        run_concurrently(jobs, concurrency, move |_, i| {
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
            Side::CouchRs
            | Side::Hot
            | Side::Validated
            | Side::Serve
            | Side::OtherLayout
            | Side::DefaultRevsLimit
            | Side::Floor
            | Side::Phases
            | Side::OneRequest => {
                unreachable!("bulk writes are ours or raw")
            }
        }
    }

    async fn write<T: Serialize>(&self, docs: &[T]) -> Result<()> {
        #[derive(Serialize)]
        struct Body<'a, T> {
            docs: &'a [T],
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

// ---- transfers: p3, p4, p5, p6, p8, sweeper_rss --------------------------------------------

/// Every benchmark account's opening balance and minimum: far more than a figure moves, so no
/// transfer is refused for funds — and every figure checks that each of its transfers ended
/// `done`.
const ACCOUNT_OPENING_MINOR: i64 = 1_000_000_000;
const ACCOUNT_MIN_BALANCE_MINOR: i64 = 0;
const TRANSFER_CURRENCY: &str = "EUR";

/// One account of a benchmark ledger: `{prefix}{i}`, fixed width.
fn account_id(prefix: &str, i: usize) -> String {
    format!("{prefix}{i:07}")
}

/// An amount that differs from transfer to transfer (a constant amount would let a wrong
/// balance hide behind a symmetric one), in minor units.
fn transfer_amount(i: usize) -> i64 {
    100 + (i % 900) as i64
}

fn transfer_request(
    id: String,
    source: String,
    destination: String,
    i: usize,
) -> Result<TransferRequest> {
    Ok(TransferRequest {
        id: Some(id),
        source,
        destination,
        amount: Amount::new(transfer_amount(i))?,
        currency: Currency::from_code(TRANSFER_CURRENCY)?,
    })
}

/// Submits a transfer, waits for it and fails unless it ended `done`.
async fn transfer_done(ledger: &Ledger, request: TransferRequest) -> Result<()> {
    let outcome = ledger.submit(request, true).await?;
    // A ledger finishing in the background answers at the commit; the round's flush waits
    // for the rest (and the audit after the load checks every transfer ended done).
    let background = ledger.finishes_in_background() && outcome.state == State::Committed;
    ensure!(
        outcome.state == State::Done || background,
        "transfer {} ended {} ({:?})",
        outcome.id,
        outcome.state,
        outcome.reason
    );
    Ok(())
}

/// A fresh ledger database with its design documents.
async fn fresh_ledger(bench: &Bench, purpose: &str) -> Result<Ledger> {
    fresh_ledger_in(bench, purpose, bench.settings.layout).await
}

/// A fresh, initialised ledger of `layout`: split, its hot database is `<db>_hot`.
async fn fresh_ledger_in(bench: &Bench, purpose: &str, layout: Layout) -> Result<Ledger> {
    let client = bench.fresh_database(purpose).await?;
    let hot = format!("{}_hot", client.database());
    let ledger = match layout {
        Layout::Single => Ledger::new(client),
        Layout::Split => Ledger::new(client).with_hot_database(&hot)?,
    };
    ledger.init().await?;
    Ok(ledger)
}

/// HTTP requests the ledger's clients have sent (both databases' when split).
fn requests_of(ledger: &Ledger) -> u64 {
    let mut n = ledger.client().requests_sent();
    if ledger.hot_database().is_some() {
        n += ledger.hot_client().requests_sent();
    }
    n
}

/// Document writes so far in the ledger's databases (`update_seq`, both when split).
async fn writes_of(ledger: &Ledger) -> Result<u64> {
    let mut n = update_seq(ledger.client()).await?;
    if ledger.hot_database().is_some() {
        n += update_seq(ledger.hot_client()).await?;
    }
    Ok(n)
}

/// The `--db` (and `--hot-db`) arguments of the program on `ledger`.
fn ledger_args(ledger: &Ledger) -> Vec<String> {
    let mut args = vec!["--db".to_owned(), ledger.client().database().to_owned()];
    if let Some(hot) = ledger.hot_database() {
        args.extend(["--hot-db".to_owned(), hot.to_owned()]);
    }
    args
}

/// Writes `docs` with `_bulk_docs` in batches of [`LOAD_BATCH_DOCS`], failing on any refusal.
async fn load_docs(client: &Client, docs: &[Value]) -> Result<()> {
    for batch in docs.chunks(LOAD_BATCH_DOCS) {
        let results = client.bulk_docs(batch).await?;
        if let Some(bad) = results.iter().find(|r| !r.is_ok()) {
            bail!("loading {}: {bad:?}", client.database());
        }
    }
    Ok(())
}

/// Creates accounts with `_bulk_docs` in the shape `Ledger::create_account` writes
/// (docs/DOCUMENTS.md), their opening records first: thousands of single PUTs would cost more
/// than the figures they feed. `p3` creates its accounts through the API.
async fn load_accounts(ledger: &Ledger, accounts: &[String]) -> Result<()> {
    load_docs(ledger.client(), &opening_docs(accounts)).await?;
    load_docs(ledger.hot_client(), &account_docs(accounts)).await
}

/// The accounts' opening records, as `Ledger::create_account` writes them into the ledger's
/// database: what `verify` takes their openings from.
fn opening_docs(accounts: &[String]) -> Vec<Value> {
    accounts
        .iter()
        .map(|account| {
            json!({
                "_id": format!("opening:{account}"),
                "type": "opening",
                "account_id": account,
                "currency": TRANSFER_CURRENCY,
                "opening": ACCOUNT_OPENING_MINOR,
                "min_balance": ACCOUNT_MIN_BALANCE_MINOR,
            })
        })
        .collect()
}

/// New accounts as `Ledger::create_account` writes them.
fn account_docs(accounts: &[String]) -> Vec<Value> {
    let now = unix_ms();
    accounts
        .iter()
        .map(|account| {
            json!({
                "_id": format!("account:{account}"),
                "type": "account",
                "account_id": account,
                "currency": TRANSFER_CURRENCY,
                "opening": ACCOUNT_OPENING_MINOR,
                "balance": ACCOUNT_OPENING_MINOR,
                "min_balance": ACCOUNT_MIN_BALANCE_MINOR,
                "pending": [],
                "settled": [],
                "created_at": now,
            })
        })
        .collect()
}

/// Creates the accounts with the revision history of [`AGED_REVISIONS`] writes (planted with
/// `new_edits=false`, as replication writes; the server stems it to the database's
/// `_revs_limit`), so the ledger meets them as it meets accounts a long-running shop has written
/// a thousand times.
async fn load_aged_accounts(bench: &Bench, ledger: &Ledger, accounts: &[String]) -> Result<()> {
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

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The database's update sequence as a count of document writes: a number on pouchdb-server;
/// on CouchDB 3 an opaque string whose numeric prefix sums the shards' counters.
async fn update_seq(client: &Client) -> Result<u64> {
    let info = client.database_info().await?;
    let seq = &info["update_seq"];
    seq.as_u64()
        .or_else(|| {
            seq.as_str()
                .and_then(|s| s.split('-').next())
                .and_then(|n| n.parse().ok())
        })
        .ok_or_else(|| anyhow!("update_seq {seq} is not a count"))
}

/// Checks the invariants of docs/PROTOCOL.md on a ledger at rest (every transfer finished, no marker pending,
/// exactly-once strictly) and fails the bench loudly on any violation: a fast but wrong ledger
/// is worthless. Then deletes the database. Returns how long the audit took.
async fn verify_and_drop(ledger: &Ledger) -> Result<Duration> {
    verify_and_drop_but(ledger, &[]).await
}

/// [`verify_and_drop`], except the checks named in `waived` (a database set up without one of
/// the design documents on purpose).
async fn verify_and_drop_but(ledger: &Ledger, waived: &[&str]) -> Result<Duration> {
    let started = Instant::now();
    let report = ledger.verify_with(VerifyOptions::at_rest()).await?;
    let took = started.elapsed();
    let failed = report
        .checks
        .iter()
        .any(|c| !c.ok && !waived.contains(&c.name.as_str()));
    if failed {
        let broken: Vec<String> = report
            .checks
            .iter()
            .filter(|c| !c.ok && !waived.contains(&c.name.as_str()))
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        bail!(
            "INVARIANT VIOLATED in {} after the load — the figures are void:\n  {}",
            ledger.client().database(),
            broken.join("\n  ")
        );
    }
    ledger.client().delete_database().await?;
    if ledger.hot_database().is_some() {
        ledger.hot_client().delete_database().await?;
    }
    Ok(took)
}

/// `p3`'s transfer `i`: between two accounts of its own.
fn fresh_pair(i: usize) -> (String, String) {
    (account_id("s", i), account_id("d", i))
}

/// Which accounts transfer `i`, made by worker `w`, moves money between.
type Pairing = fn(usize, usize) -> (String, String);

/// Each worker between two accounts of its own: nobody else touches them.
fn own_pair(w: usize, _: usize) -> (String, String) {
    (account_id("s", w), account_id("d", w))
}

/// Each worker from an account of its own into the one merchant account.
fn into_merchant(w: usize, _: usize) -> (String, String) {
    (account_id("s", w), P5_MERCHANT.to_owned())
}

/// Two different accounts of `p8`'s pool, drawn at random (seeded by `i`).
fn pool_pair(_: usize, i: usize) -> (String, String) {
    pool_pair_of(i, P8_POOL_ACCOUNTS)
}

fn pool_pair_of(i: usize, pool: usize) -> (String, String) {
    let mut rng = fastrand::Rng::with_seed(i as u64);
    let source = rng.usize(..pool);
    let destination = (source + 1 + rng.usize(..pool - 1)) % pool;
    (account_id("p", source), account_id("p", destination))
}

/// Transfers `jobs` (ids `{side}{i}`), by `concurrency` workers each taking the next index,
/// worker `w`'s transfer `i` between `pairing(w, i)`; every one checked `done`. When each
/// finished, in order; the first error ends the run.
async fn run_transfers(
    ledger: &Ledger,
    side: &'static str,
    jobs: Range<usize>,
    concurrency: usize,
    pairing: Pairing,
) -> Result<Vec<Instant>> {
    let started = Instant::now();
    let finished = {
        let ledger = ledger.clone();
        run_concurrently(jobs, concurrency, move |w, i| {
            let ledger = ledger.clone();
            async move {
                let (source, destination) = pairing(w, i);
                let request = transfer_request(format!("{side}{i:07}"), source, destination, i)?;
                transfer_done(&ledger, request).await
            }
        })
        .await?
    };
    // A ledger finishing in the background (p8): what was still settling when the last caller
    // had its answer, and the time to let it end — before the next side's round starts, so
    // none of this round's work runs in another side's time.
    let backlog = ledger.finishing();
    let answered = started.elapsed();
    ledger.flush().await;
    FLUSHES.lock().expect("not poisoned").push(Flush {
        database: ledger.client().database().to_owned(),
        backlog,
        answered,
        flushed: started.elapsed(),
        jobs: finished.len(),
    });
    Ok(finished)
}

/// What `p8`'s rounds left to finish in the background, and how long that took: the rounds'
/// transfers/s to the last answer and to the last `done`.
fn finish_summary(flushes: &[Flush], folded: u64) -> String {
    let jobs: usize = flushes.iter().map(|f| f.jobs).sum();
    let answered: f64 = flushes.iter().map(|f| f.answered.as_secs_f64()).sum();
    let flushed: f64 = flushes.iter().map(|f| f.flushed.as_secs_f64()).sum();
    let backlog_max = flushes.iter().map(|f| f.backlog).max().unwrap_or(0);
    let backlog_mean =
        flushes.iter().map(|f| f.backlog).sum::<usize>() as f64 / flushes.len().max(1) as f64;
    format!(
        "{backlog_mean:.0} transfers still finishing at a round's last answer (at most \
         {backlog_max}); whole rounds {:.1} transfers/s to the last answer, {:.1} to the last \
         done; {folded} settles folded into another write of their account",
        jobs as f64 / answered.max(1e-9),
        jobs as f64 / flushed.max(1e-9)
    )
}

/// One round of [`run_transfers`] as seen by a ledger finishing in the background.
struct Flush {
    database: String,
    /// Transfers still finishing when the last caller had its answer.
    backlog: usize,
    /// From the round's start to the last answer, and to the end of the flush after it.
    answered: Duration,
    flushed: Duration,
    jobs: usize,
}

static FLUSHES: std::sync::Mutex<Vec<Flush>> = std::sync::Mutex::new(Vec::new());

/// [`run_transfers`]' steady rate (transfers/s). For a ledger finishing in the background the
/// time the round's flush took after its last answer is added to the window: every settle and
/// `done` of the window's transfers is then inside it (with the tail's, so the figure errs low).
async fn transfer_round(
    ledger: &Ledger,
    side: &'static str,
    jobs: Range<usize>,
    concurrency: usize,
    pairing: Pairing,
) -> Result<f64> {
    let finished = run_transfers(ledger, side, jobs, concurrency, pairing).await?;
    if !ledger.finishes_in_background() {
        return Ok(steady_rate(&finished, concurrency));
    }
    let tail = {
        let flushes = FLUSHES.lock().expect("not poisoned");
        let last = flushes.last().expect("run_transfers recorded its flush");
        last.flushed.saturating_sub(last.answered)
    };
    let (first, last) = (concurrency - 1, finished.len() - concurrency);
    Ok((last - first) as f64 / ((finished[last] - finished[first]) + tail).as_secs_f64())
}

/// Raw `_bulk_docs` rounds: the server's bulk-write limit that `p6` and `p8` are divided by,
/// measured in the same rounds. Plain: new ~250-byte documents into a database of their own,
/// as `p2`'s raw side. Validated: new transfer documents (state `initial`) into a ledger
/// database, where the server runs `validate_doc_update` for each; the limit the ledger's own
/// writes meet.
struct RawBulk {
    writer: BulkWriter,
    client: Client,
    validated: bool,
    next_doc: AtomicUsize,
}

impl RawBulk {
    async fn new(bench: &Bench, purpose: &str, validated: bool) -> Result<RawBulk> {
        let client = if validated {
            fresh_ledger_in(bench, &format!("{purpose}_validated"), Layout::Single)
                .await?
                .client()
                .clone()
        } else {
            bench.fresh_database(&format!("{purpose}_raw")).await?
        };
        let raw = RawBulk {
            writer: BulkWriter::new(bench, Side::Raw, &client),
            client,
            validated,
            next_doc: AtomicUsize::new(0),
        };
        raw.round(1).await?; // opens the connection; untimed
        Ok(raw)
    }

    /// Docs/s of `batches` batches of [`BULK_BATCH_DOCS`] new documents, one request after
    /// another; with two batches or more the first (which may open a connection) is left out,
    /// like `p2`'s steady rate.
    async fn round(&self, batches: usize) -> Result<f64> {
        assert!(batches > 0);
        let mut finished = Vec::with_capacity(batches + 1);
        finished.push(Instant::now());
        for _ in 0..batches {
            let first = self.next_doc.fetch_add(BULK_BATCH_DOCS, Ordering::Relaxed);
            let ids = first..first + BULK_BATCH_DOCS;
            if self.validated {
                let then = unix_ms();
                let docs: Vec<Value> = ids
                    .map(|i| initial_transfer_doc(i, "raw", then, P8_POOL_ACCOUNTS))
                    .collect();
                self.writer.write(&docs).await?;
            } else {
                let docs: Vec<BenchDoc> = ids.map(BenchDoc::new).collect();
                self.writer.write(&docs).await?;
            }
            finished.push(Instant::now());
        }
        let skip = usize::from(batches >= 2);
        let span = finished[batches] - finished[skip];
        Ok((batches - skip) as f64 * BULK_BATCH_DOCS as f64 / span.as_secs_f64())
    }

    async fn drop_database(self) -> Result<()> {
        self.client.delete_database().await?;
        Ok(())
    }
}

/// Transfer `{prefix}{i}` as `submit(…, wait = false)` writes it (docs/DOCUMENTS.md): state
/// `initial`, between two random accounts of a pool, last modified at `then` + i ms (so a
/// sweeper takes them oldest first in this order).
fn initial_transfer_doc(i: usize, prefix: &str, then: i64, pool: usize) -> Value {
    let (source, destination) = pool_pair_of(i, pool);
    let id = format!("{prefix}{i:07}");
    json!({
        "_id": format!("txn:{id}"),
        "type": "transaction",
        "txn_id": id,
        "source": source,
        "destination": destination,
        "value": transfer_amount(i),
        "currency": TRANSFER_CURRENCY,
        "state": "initial",
        "reason": null,
        "reverses": null,
        "claim": null,
        "created_at": then + i as i64,
        "last_modified": then + i as i64,
    })
}

/// `p8_floor`'s writers, each with its own share of the account pool (their writes never meet).
/// One: with `p8`'s 64 transfers in flight, one request of 64 at a time measured highest on
/// CouchDB 3.4.3 here (3,529 transfers/s, against 2,412 for two writers of 32 and
/// 2,394 for four of 16), and the floor is the best the server does.
const FLOOR_WRITERS: usize = 1;
/// Transfers per `_bulk_docs` of one floor writer: with [`FLOOR_WRITERS`], `p8`'s 64 transfers
/// in flight.
const FLOOR_TRANSFERS_PER_REQUEST: usize = P8_CONCURRENCY / FLOOR_WRITERS;

/// What no protocol can write less of: for each transfer, its transfer document
/// created once, already in its final state, and one update of each of its two accounts (the
/// balance only, no markers). Written into the hot database of a fresh split ledger (the same
/// `_revs_limit` and design documents as `p8`'s), [`FLOOR_TRANSFERS_PER_REQUEST`] transfers per
/// `_bulk_docs` by [`FLOOR_WRITERS`] writers at once, the accounts at random as `p8` picks them
/// (consecutive ones were used before, which CouchDB takes much faster:
/// `BENCH_FLOOR_ORDERED=1`), never a read, never a conflict: the rate at which this server
/// takes the documents a ledger of docs/DOCUMENTS.md's shape must write. A protocol that keeps one
/// document per transfer and changes both accounts by compare-and-swap cannot go faster on this
/// server, whatever it does between the writes.
///
/// [`FloorShape::Phases`] writes today's documents the same ideal way (`p8_phases`).
struct DocumentFloor {
    shape: FloorShape,
    ledger: Ledger,
    /// Each writer's documents, as last written.
    writers: std::sync::Mutex<Vec<FloorWriter>>,
    next_transfer: AtomicUsize,
}

/// One [`DocumentFloor`] writer's documents between its requests.
struct FloorWriter {
    /// Its accounts, as last written (with `_rev`).
    accounts: Vec<Value>,
    /// [`FloorShape::OneRequest`]: the transfer documents its last request created `initial`,
    /// with the markers their decision names, decided in its next request.
    undecided: Vec<(Value, Value)>,
}

/// What a [`DocumentFloor`] writes for each transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FloorShape {
    /// The transfer document once, in its final state; each account once, balance only: one
    /// request per [`FLOOR_TRANSFERS_PER_REQUEST`] transfers.
    Floor,
    /// The documents the ledger writes today (the one-write path, docs/ONE_WRITE.md), batched
    /// as well as they can be: per [`FLOOR_TRANSFERS_PER_REQUEST`] transfers, two requests one
    /// after another — both accounts of each transfer updated with its pending marker (attempt
    /// and peer; the previous marker settled, folded in as the ledger folds it, its entry kept
    /// among at most 32, as pruning keeps them few on a server with several copies), then the
    /// transfer documents created `done`, naming the markers. Three documents a transfer.
    /// (The stepwise protocol's documents were five a transfer in four requests.)
    Phases,
    /// A protocol answering after one request (`BENCH_ONE_REQUEST=1`):
    /// per [`FLOOR_TRANSFERS_PER_REQUEST`] transfers one request holding both accounts of each
    /// with its marker (as [`FloorShape::Phases`]), its transfer document created `initial`,
    /// and the previous request's transfer documents moved to `done` naming their markers
    /// (the decision follows the answer in the next request). Four documents a transfer.
    OneRequest,
}

/// Settled entries a [`FloorShape::Phases`] account keeps.
const PHASES_SETTLED_KEPT: usize = 32;

impl DocumentFloor {
    async fn new(bench: &Bench, shape: FloorShape) -> Result<DocumentFloor> {
        let purpose = match shape {
            FloorShape::Floor => "p8_floor",
            FloorShape::Phases => "p8_phases",
            FloorShape::OneRequest => "p8_one_request",
        };
        let ledger = fresh_ledger_in(bench, purpose, Layout::Split).await?;
        let ids: Vec<String> = (0..P8_POOL_ACCOUNTS).map(|i| account_id("f", i)).collect();
        let mut docs = account_docs(&ids);
        let results = ledger.hot_client().bulk_docs(&docs).await?;
        ensure!(
            results.len() == docs.len(),
            "p8_floor: short _bulk_docs answer"
        );
        for (doc, result) in docs.iter_mut().zip(results) {
            let rev = result
                .rev
                .ok_or_else(|| anyhow!("p8_floor: loading accounts: {:?}", result.error))?;
            doc["_rev"] = json!(rev);
        }
        let writers: Vec<FloorWriter> = docs
            .chunks(P8_POOL_ACCOUNTS / FLOOR_WRITERS)
            .map(|accounts| FloorWriter {
                accounts: accounts.to_vec(),
                undecided: Vec::new(),
            })
            .collect();
        let floor = DocumentFloor {
            shape,
            ledger,
            writers: std::sync::Mutex::new(writers),
            next_transfer: AtomicUsize::new(0),
        };
        floor
            .round(FLOOR_WRITERS * FLOOR_TRANSFERS_PER_REQUEST)
            .await?; // connections; untimed
        Ok(floor)
    }

    /// Transfers/s of `transfers` transfers' documents (rounded up to whole requests).
    /// An error leaves the floor unusable (its accounts' revisions are lost with the writer).
    async fn round(&self, transfers: usize) -> Result<f64> {
        let per_writer = transfers.div_ceil(FLOOR_WRITERS);
        let requests = per_writer.div_ceil(FLOOR_TRANSFERS_PER_REQUEST);
        let taken = std::mem::take(&mut *self.writers.lock().expect("not poisoned"));
        ensure!(
            taken.len() == FLOOR_WRITERS,
            "p8_floor: a round failed before"
        );
        let first = self.next_transfer.fetch_add(
            FLOOR_WRITERS * requests * FLOOR_TRANSFERS_PER_REQUEST,
            Ordering::Relaxed,
        );
        let started = Instant::now();
        let mut writers = JoinSet::new();
        for (w, writer) in taken.into_iter().enumerate() {
            let client = self.ledger.hot_client().clone();
            let first = first + w * requests * FLOOR_TRANSFERS_PER_REQUEST;
            writers.spawn(floor_writer(self.shape, client, writer, first, requests));
        }
        let mut back = Vec::with_capacity(FLOOR_WRITERS);
        while let Some(writer) = writers.join_next().await {
            back.push(writer??);
        }
        let span = started.elapsed();
        *self.writers.lock().expect("not poisoned") = back;
        let written = FLOOR_WRITERS * requests * FLOOR_TRANSFERS_PER_REQUEST;
        Ok(written as f64 / span.as_secs_f64())
    }

    async fn drop_databases(self) -> Result<()> {
        self.ledger.client().delete_database().await?;
        self.ledger.hot_client().delete_database().await?;
        Ok(())
    }
}

/// One [`DocumentFloor`] writer: `requests` `_bulk_docs` one after another, each creating
/// [`FLOOR_TRANSFERS_PER_REQUEST`] transfer documents and updating the two accounts of each
/// (all distinct within a request). Returns its documents as last written.
async fn floor_writer(
    shape: FloorShape,
    client: Client,
    writer: FloorWriter,
    first: usize,
    requests: usize,
) -> Result<FloorWriter> {
    let FloorWriter {
        mut accounts,
        mut undecided,
    } = writer;
    let pairs_per_request = FLOOR_TRANSFERS_PER_REQUEST;
    ensure!(
        accounts.len() >= 2 * pairs_per_request,
        "p8_floor: too few accounts per writer"
    );
    let now = unix_ms();
    for r in 0..requests {
        let mut docs = Vec::with_capacity(3 * pairs_per_request);
        let mut touched = Vec::with_capacity(2 * pairs_per_request);
        // The accounts at random, as p8's callers pick them (distinct within one request, as
        // one request cannot update a document twice); `BENCH_FLOOR_ORDERED=1`: consecutive
        // pairs, as before (CouchDB updates neighbouring ids much faster).
        let n = accounts.len();
        let picks: Vec<usize> = if std::env::var("BENCH_FLOOR_ORDERED").is_ok() {
            (0..2 * pairs_per_request)
                .map(|j| (2 * r * pairs_per_request + j) % n)
                .collect()
        } else {
            fastrand::Rng::with_seed((first + r * pairs_per_request) as u64)
                .choose_multiple(0..n, 2 * pairs_per_request)
        };
        for k in 0..pairs_per_request {
            let i = first + r * pairs_per_request + k;
            let (from, to) = (picks[2 * k], picks[2 * k + 1]);
            let amount = transfer_amount(i);
            for (slot, delta) in [(from, -amount), (to, amount)] {
                let balance = accounts[slot]["balance"]
                    .as_i64()
                    .and_then(|b| b.checked_add(delta))
                    .ok_or_else(|| anyhow!("p8_floor: balance out of range"))?;
                accounts[slot]["balance"] = json!(balance);
                if shape != FloorShape::Floor {
                    // The marker of this transfer (its attempt and the other account named, as
                    // the one-write path writes it), the previous one settled: folded in.
                    let peer = accounts[if slot == from { to } else { from }]["account_id"].clone();
                    let account = &mut accounts[slot];
                    let mut settled: Vec<Value> = account["settled"]
                        .get(0)
                        .and_then(|group| group["txns"].as_array().cloned())
                        .unwrap_or_default();
                    if let Some(marker) = account["pending"].get(0) {
                        settled.push(marker["txn"].clone());
                    }
                    let drop = settled.len().saturating_sub(PHASES_SETTLED_KEPT);
                    settled.drain(..drop);
                    account["settled"] = if settled.is_empty() {
                        json!([])
                    } else {
                        json!([{ "at": now, "txns": settled }])
                    };
                    account["pending"] = json!([{
                        "txn": format!("floor{i:07}"), "delta": delta, "at": now,
                        "attempt": format!("{:012x}", i * 7919), "peer": peer,
                    }]);
                }
                touched.push(slot);
            }
            let id = format!("floor{i:07}");
            docs.push(json!({
                "_id": format!("txn:{id}"),
                "type": "transaction",
                "txn_id": id,
                "source": accounts[from]["account_id"],
                "destination": accounts[to]["account_id"],
                "value": amount,
                "currency": TRANSFER_CURRENCY,
                "state": "done",
                "reason": null,
                "reverses": null,
                "claim": null,
                "created_at": now,
                "last_modified": now,
            }));
        }
        docs.extend(touched.iter().map(|&slot| accounts[slot].clone()));
        let results = match shape {
            FloorShape::Floor => client.bulk_docs(&docs).await?,
            FloorShape::OneRequest => {
                // This request's transfer documents `initial`, the last request's decided.
                let created = pairs_per_request;
                for txn in &mut docs[..created] {
                    txn["state"] = json!("initial");
                }
                let deciding = std::mem::take(&mut undecided);
                docs.extend(deciding.iter().map(|(txn, markers)| {
                    let mut done = txn.clone();
                    done["state"] = json!("done");
                    done["markers"] = markers.clone();
                    done
                }));
                let results = client.bulk_docs(&docs).await?;
                if let Some(bad) = results[docs.len() - deciding.len()..]
                    .iter()
                    .find(|r| !r.is_ok())
                {
                    bail!("p8_one_request: a decision failed: {bad:?}");
                }
                for (txn, result) in docs[..created].iter().zip(&results) {
                    let mut txn = txn.clone();
                    txn["_rev"] = json!(result.rev.clone().unwrap_or_default());
                    let attempt = json!(floor_attempt(&txn));
                    undecided.push((txn, json!({ "source": attempt, "destination": attempt })));
                }
                results
            }
            FloorShape::Phases => {
                // The accounts first, then the transfer documents created in their final
                // state, naming the markers' attempts.
                let (txns, account_docs) = docs.split_at_mut(pairs_per_request);
                let written = client.bulk_docs(account_docs).await?;
                for txn in txns.iter_mut() {
                    let attempt = floor_attempt(txn);
                    txn["markers"] = json!({ "source": attempt, "destination": attempt });
                }
                let mut results = client.bulk_docs(txns).await?;
                results.extend(written);
                results
            }
        };
        ensure!(
            results.len() == docs.len(),
            "p8_floor: short _bulk_docs answer"
        );
        let account_results = &results[pairs_per_request..pairs_per_request + touched.len()];
        for (&slot, result) in touched.iter().zip(account_results) {
            let rev = result
                .rev
                .clone()
                .ok_or_else(|| anyhow!("p8_floor: an account write failed: {:?}", result.error))?;
            accounts[slot]["_rev"] = json!(rev);
        }
        if let Some(bad) = results[..pairs_per_request].iter().find(|r| !r.is_ok()) {
            bail!("p8_floor: a transfer document failed: {bad:?}");
        }
    }
    Ok(FloorWriter {
        accounts,
        undecided,
    })
}

/// The attempt a floor writer's markers of transfer document `txn` carry.
fn floor_attempt(txn: &Value) -> String {
    let n = txn["txn_id"].as_str().unwrap_or_default()["floor".len()..]
        .parse::<usize>()
        .unwrap_or(0);
    format!("{:012x}", n * 7919)
}

/// What `p3` measured, for the figures after it.
#[derive(Debug, Clone, Copy, Serialize)]
struct TransferCost {
    /// HTTP requests per transfer between accounts this process has not seen yet.
    requests_cold: f64,
    /// ... between accounts the engine holds a copy of.
    requests_warm: f64,
    /// Document writes per transfer (the database's update sequence), transfers one at a
    /// time: what the protocol writes when nothing is shared.
    docs_written: f64,
}

impl Bench {
    fn transfer_cost(&self) -> Result<TransferCost> {
        self.measured
            .lock()
            .expect("lock")
            .transfer_cost
            .ok_or_else(|| anyhow!("p3 must run before the other transfer figures"))
    }
}

// ---- p3: requests per transfer ----

/// Transfers `p3` makes one after another, each between two accounts of its own.
const P3_TRANSFERS: usize = 50;
const GOAL_P3: Goal = Goal::AtMost(6.0);

/// HTTP requests per uncontended transfer, counted by the client at the HTTP layer: transfers
/// one at a time, each between a fresh pair of accounts made with `create_account` (cold: the
/// engine has to read both accounts), then one more on each pair (warm: it holds both).
async fn requests_per_transfer(bench: &Bench) -> Result<Vec<Row>> {
    let ledger = fresh_ledger(bench, "p3").await?;
    let currency = Currency::from_code(TRANSFER_CURRENCY)?;
    for i in 0..P3_TRANSFERS {
        let (source, destination) = fresh_pair(i);
        for account in [source, destination] {
            ledger
                .create_account(AccountSpec {
                    account_id: account,
                    currency,
                    opening: Amount::new(ACCOUNT_OPENING_MINOR)?,
                    min_balance: Some(Amount::new(ACCOUNT_MIN_BALANCE_MINOR)?),
                })
                .await?;
        }
    }
    let measure = |pass: &'static str| {
        let ledger = ledger.clone();
        async move {
            let seq_before = writes_of(&ledger).await?;
            let (mut requests, mut seconds) = (Vec::new(), Vec::new());
            for i in 0..P3_TRANSFERS {
                let (source, destination) = fresh_pair(i);
                let request = transfer_request(format!("{pass}{i:04}"), source, destination, i)?;
                let (sent, started) = (requests_of(&ledger), Instant::now());
                transfer_done(&ledger, request).await?;
                seconds.push(started.elapsed().as_secs_f64());
                requests.push((requests_of(&ledger) - sent) as f64);
            }
            let written = writes_of(&ledger).await? - seq_before;
            Ok::<_, anyhow::Error>((requests, seconds, written as f64 / P3_TRANSFERS as f64))
        }
    };
    let (cold, cold_s, docs_cold) = measure("cold").await?;
    let (warm, warm_s, docs_warm) = measure("warm").await?;
    let cost = TransferCost {
        requests_cold: mean(&cold),
        requests_warm: mean(&warm),
        docs_written: docs_cold,
    };
    {
        let mut measured = bench.measured.lock().expect("lock");
        measured.transfer_cost = Some(cost);
        measured.transfer_points.push(TransferPoint {
            concurrency: 1,
            ours: 1.0 / median(&cold_s),
        });
    }
    let verified = verify_and_drop(&ledger).await?;
    let p3 = Row::count(
        "p3",
        "HTTP requests per uncontended transfer, cold".to_owned(),
        "requests",
        &cold,
    )
    .goal(Some(GOAL_P3))
    .note(format!(
        "{P3_TRANSFERS} sequential transfers, each between two accounts the engine has not read \
         yet: {:.2} requests, {:.1} documents written, {:.1} ms each (median); audited in {:.1} s",
        cost.requests_cold,
        docs_cold,
        median(&cold_s) * 1e3,
        verified.as_secs_f64()
    ));
    let p3_warm = Row::count(
        "p3_warm",
        "HTTP requests per uncontended transfer, warm".to_owned(),
        "requests",
        &warm,
    )
    .note(format!(
        "the same pairs again, both accounts cached by the engine (no read before the apply): \
         {:.2} requests, {:.1} documents written, {:.1} ms each (median)",
        cost.requests_warm,
        docs_warm,
        median(&warm_s) * 1e3
    ));
    Ok(vec![p3, p3_warm])
}

fn mean(values: &[f64]) -> f64 {
    assert!(!values.is_empty());
    values.iter().sum::<f64>() / values.len() as f64
}

// ---- p4 and p5: concurrent transfers ----

/// Rounds per side of `p4_c16` and `p5`.
const TRANSFER_ROUNDS: usize = 10;
/// Timed transfers per round at 16 workers (plus `2 × 16 − 1` untimed around them).
const TRANSFERS_PER_ROUND_C16: usize = 96;
const TRANSFER_CONCURRENCY: usize = 16;
const GOAL_P4: Goal = Goal::AtLeast(0.90);
const GOAL_P5: Goal = Goal::AtLeast(0.5);
/// The account every transfer of `p5`'s hot side pays into.
const P5_MERCHANT: &str = "merchant";

/// `p4_c16` and `p5`, from the same rounds of three sides, each a ledger or database of its
/// own, in rotating order:
///
/// - uncontended: 16 workers, each transferring between two accounts of its own;
/// - hot: 16 workers, each transferring from an account of its own into one merchant account;
/// - raw: single-document creates at 16 connections (`p1_c16`'s raw loop).
///
/// `p4_c16` = uncontended transfers/s ÷ (raw writes/s ÷ `p3`): against a client that made
/// `p3` requests per transfer, one after another, each at the raw write rate. `p5` = hot ÷
/// uncontended.
async fn concurrent_transfers(bench: &Bench) -> Result<Vec<Row>> {
    let cost = bench.transfer_cost()?;
    let rounds = bench.settings.scaled(TRANSFER_ROUNDS);
    let c = TRANSFER_CONCURRENCY;
    let transfers = jobs_for_steady_rate(TRANSFERS_PER_ROUND_C16, c);
    let writes = jobs_for_steady_rate(WRITES_PER_ROUND, c);
    let spread = fresh_ledger(bench, "p4").await?;
    let accounts: Vec<String> = (0..c)
        .flat_map(|w| {
            let (s, d) = own_pair(w, 0);
            [s, d]
        })
        .collect();
    load_accounts(&spread, &accounts).await?;
    let hot = fresh_ledger(bench, "p5_hot").await?;
    let mut accounts: Vec<String> = (0..c).map(|w| into_merchant(w, 0).0).collect();
    accounts.push(P5_MERCHANT.to_owned());
    load_accounts(&hot, &accounts).await?;
    let raw_db = bench.fresh_database("p4_raw").await?;
    let raw = Writer::new(bench, Side::Raw, &raw_db).await?;
    // Untimed, after the last round's ids: connections open, the engines read the accounts.
    let warm_up = rounds * transfers..rounds * transfers + 2 * c;
    raw.create_all(rounds * writes..rounds * writes + c, c)
        .await?;
    run_transfers(&spread, "t", warm_up.clone(), c, own_pair).await?;
    run_transfers(&hot, "t", warm_up, c, into_merchant).await?;
    let requests_before = [requests_of(&spread), requests_of(&hot)];
    let sides = [Side::Ours, Side::Hot, Side::Raw];
    let samples = interleaved(&sides, rounds, |side, round| {
        let (spread, hot, raw) = (&spread, &hot, &raw);
        async move {
            let jobs = round * transfers..(round + 1) * transfers;
            match side {
                Side::Ours => transfer_round(spread, "t", jobs, c, own_pair).await,
                Side::Hot => transfer_round(hot, "t", jobs, c, into_merchant).await,
                _ => {
                    let first = round * writes;
                    let finished = raw.create_all(first..first + writes, c).await?;
                    // The transfers/s of a client making p3 requests per transfer.
                    Ok(steady_rate(&finished, c) / cost.requests_cold)
                }
            }
        }
    })
    .await?;
    let made = (rounds * transfers) as f64;
    let requests = [
        (requests_of(&spread) - requests_before[0]) as f64 / made,
        (requests_of(&hot) - requests_before[1]) as f64 / made,
    ];
    let merchant: Value = hot.hot_client().get("account:merchant").await?;
    let merchant_kib = serde_json::to_vec(&merchant)?.len() as f64 / 1024.0;
    raw_db.delete_database().await?;
    let verified = verify_and_drop(&spread).await? + verify_and_drop(&hot).await?;
    let ops = rounds * transfers;
    let p4 = Row::new(
        "p4_c16",
        format!("transfers/s, c{c}, uncontended"),
        "xfers/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Raw],
    )
    .goal(Some(GOAL_P4))
    .cpu(&samples, [Side::Ours, Side::Raw], ops)
    .note(format!(
        "raw = raw c{c} single-doc writes/s ÷ p3 ({:.2}) in the same rounds (÷ p3_warm, {:.2}, \
         the ratio would be {:.3}); {:.2} requests per transfer here (group commit); audited \
         with p5 in {:.1} s",
        cost.requests_cold,
        cost.requests_warm,
        median(&ratios(&samples, Side::Ours, Side::Raw)) * cost.requests_warm / cost.requests_cold,
        requests[0],
        verified.as_secs_f64()
    ));
    let p5 = Row::new(
        "p5",
        format!("transfers/s, c{c}, all into one account"),
        "xfers/s",
        &samples.figures[&Side::Hot],
        &samples.figures[&Side::Ours],
    )
    .goal(Some(GOAL_P5))
    .cpu(&samples, [Side::Hot, Side::Ours], ops)
    .note(format!(
        "ours = 16 workers paying into one merchant account, raw = p4_c16's uncontended \
         transfers in the same rounds; {:.2} requests per transfer; the merchant account ended \
         at {merchant_kib:.0} KiB (its settled markers are kept ≥ 5 min)",
        requests[1]
    ));
    bench
        .measured
        .lock()
        .expect("lock")
        .transfer_points
        .push(TransferPoint {
            concurrency: c,
            ours: p4.ours,
        });
    Ok(vec![p4, p5])
}

/// Each round's `a ÷ b`.
fn ratios(samples: &Interleaved, a: Side, b: Side) -> Vec<f64> {
    samples.figures[&a]
        .iter()
        .zip(&samples.figures[&b])
        .map(|(a, b)| a / b)
        .collect()
}

// ---- p6 and sweeper_rss: the sweeper ----

/// Transfers left `initial` for the sweeper (× `BENCH_SCALE`): 2,000 at the default scale,
/// the issue's 10,000 at `BENCH_SCALE=5`. On pouchdb-server the sweeper finishes one or two
/// hundred a second and the audit after it reads them all again, so 10,000 alone would take
/// the bench past its five minutes.
const P6_TRANSFERS: usize = 2_000;
/// Accounts the stuck transfers move money between, at random.
const P6_POOL_ACCOUNTS: usize = 500;
/// Raw bulk rounds right before the sweeper's pass, and as many right after it.
const P6_RAW_ROUNDS_EACH_SIDE: usize = 4;
const GOAL_P6: Goal = Goal::AtLeast(0.5);

/// A ledger holding `transfers` transfers left `initial` between random accounts of a pool,
/// loaded with `_bulk_docs` in the shape `submit(…, wait = false)` writes (docs/DOCUMENTS.md),
/// and its views brought up to date (what a sweeper watching the database all along would
/// have found). Untimed. Also returns the views' indexing rate (docs/s, over the three views
/// `status` reads).
async fn load_stuck(bench: &Bench, purpose: &str, transfers: usize) -> Result<(Ledger, f64)> {
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
struct SweeperRun {
    seconds: f64,
    /// `VmHWM`, KiB.
    peak_rss_kib: u64,
    /// Its user + system CPU time, as last read while it ran.
    cpu_seconds: f64,
}

/// `VmHWM` (peak resident set, KiB) and user + system CPU seconds of a running process.
fn process_usage(pid: u32) -> Option<(u64, f64)> {
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
const RSS_POLL_MS: u64 = 10;

/// The program, built by Cargo for a bench target with the bench's (release) profile.
const PROGRAM: &str = env!("CARGO_BIN_EXE_couch-ledger");

/// The program on the bench's server and database `db`, nothing else from the environment,
/// stdout piped, killed if dropped. Credentials go through the environment, never on a command
/// line others can read.
fn program(bench: &Bench, ledger: &Ledger) -> tokio::process::Command {
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
async fn run_sweeper(bench: &Bench, ledger: &Ledger, transfers: usize) -> Result<SweeperRun> {
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
async fn sweeper(bench: &Bench) -> Result<Vec<Row>> {
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

// ---- p8: the batched submit path ----

/// When `p8`'s `submit` calls return (`BENCH_FINISH`): `background` (the default) answers at
/// the commit and finishes in the background, settles folded into later account writes
/// (`Ledger::with_background_finish`); `wait` answers at `done`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Finish {
    Background,
    Wait,
}

impl Finish {
    fn apply(self, ledger: Ledger) -> Ledger {
        match self {
            Finish::Background => ledger.with_background_finish(),
            Finish::Wait => ledger,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Finish::Background => "background finish",
            Finish::Wait => "waiting for done",
        }
    }
}

fn p8_finish() -> Finish {
    match std::env::var("BENCH_FINISH").as_deref() {
        Ok("wait") => Finish::Wait,
        _ => Finish::Background,
    }
}

/// Rounds per side of `p8`.
const P8_ROUNDS: usize = 8;
/// Concurrent `submit` callers of `p8`.
const P8_CONCURRENCY: usize = 64;
/// Timed transfers per round of `p9` (plus `2 × 64 − 1` untimed around them).
const TRANSFERS_PER_ROUND_C64: usize = 192;
/// Timed transfers per round of `p8` (from 192 at first): rounds long enough that what a
/// background finish still holds at a round's end (at most `SETTLE_HOLD_MS` of settles) is a
/// small part of it, the same in both modes so that they compare.
const P8_TRANSFERS_PER_ROUND: usize = 1_024;
/// `p8`'s callers transfer between random accounts of this pool.
const P8_POOL_ACCOUNTS: usize = 512;
/// Raw `_bulk_docs` batches per raw round of `p8` and `p6`.
const RAW_BULK_BATCHES: usize = 3;
const GOAL_P8: Goal = Goal::AtLeast(0.5);

/// `BENCH_LONG_S`: how long `p8_long` runs, in seconds (unset: it does not run).
fn long_seconds() -> Option<u64> {
    std::env::var("BENCH_LONG_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&s| s > 0)
}

/// `p8_long`'s windows, in seconds: each reports its rate and the accounts' size.
const P8_LONG_WINDOW_S: u64 = 30;

/// The settled entries of an account document, stored grouped (`{at, txns, undone}`) or one
/// object each (`{txn, at}`, the older shape).
fn settled_count(doc: &Value) -> usize {
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
async fn long_transfers(bench: &Bench) -> Result<Vec<Row>> {
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
const AGED_REVISIONS: usize = 1_000;
/// CouchDB's default `_revs_limit`.
const COUCHDB_DEFAULT_REVS_LIMIT: u32 = 1_000;
/// Accounts per `_bulk_docs` when planting them (each carries ~34 KB of revision ids).
const AGED_LOAD_BATCH_DOCS: usize = 32;
/// Rounds per side of `p8_aged`.
const P8_AGED_ROUNDS: usize = 4;

/// `p8_aged`: `p8`'s workload (64 callers, the same pool, the same finish) on accounts that
/// already carry the revision history of [`AGED_REVISIONS`] writes, in a ledger set up by
/// `init` (which lowers the `_revs_limit` of the accounts' database) ÷ the same in a ledger
/// whose `_revs_limit` was put back to CouchDB's default, alternating round by round. `p8`
/// starts from new accounts and never sees this; a shop's accounts have it after their first
/// thousand writes. A server without `_revs_limit` (pouchdb-server) has nothing to compare:
/// the figure is not measured there.
async fn aged_transfers(bench: &Bench) -> Result<Vec<Row>> {
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
            ledger.client().delete_database().await?;
            if ledger.hot_database().is_some() {
                ledger.hot_client().delete_database().await?;
            }
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

/// Transfers/s of 64 concurrent `submit(…, wait = true)` callers between random accounts of a
/// pool ÷ (raw bulk docs/s ÷ documents written per transfer). The group-commit engine
/// (src/engine/) gathers what the callers queue while its previous request is in flight, so
/// each protocol phase of a whole group is about one `_bulk_docs`; every caller still gets its
/// own transfer's outcome. The grouping is checked, not assumed: requests per transfer.
///
/// A third side in the same rounds, raw `_bulk_docs` into a validated ledger database, gives
/// `p8_validated`: the same transfers/s against the limit the ledger's writes really meet.
async fn batched_transfers(bench: &Bench) -> Result<Vec<Row>> {
    let cost = bench.transfer_cost()?;
    let rounds = bench.settings.scaled(P8_ROUNDS);
    let c = P8_CONCURRENCY;
    let finish = p8_finish();
    let transfers = jobs_for_steady_rate(P8_TRANSFERS_PER_ROUND, c);
    let ledger = finish.apply(fresh_ledger(bench, "p8").await?);
    let accounts: Vec<String> = (0..P8_POOL_ACCOUNTS).map(|i| account_id("p", i)).collect();
    load_accounts(&ledger, &accounts).await?;
    let raw = RawBulk::new(bench, "p8", false).await?;
    let validated = RawBulk::new(bench, "p8", true).await?;
    let floor = DocumentFloor::new(bench, FloorShape::Floor).await?;
    let phases = DocumentFloor::new(bench, FloorShape::Phases).await?;
    // A protocol answering after one request, weighed before building it (docs/ONE_WRITE.md, "Why
    // two requests"): opt-in, its documents batched ideally beside the floor and today's.
    let with_one_request = std::env::var("BENCH_ONE_REQUEST").is_ok_and(|v| v == "1");
    let one_request = if with_one_request {
        Some(DocumentFloor::new(bench, FloorShape::OneRequest).await?)
    } else {
        None
    };
    // The other layout, for comparison in the same rounds (what the split buys).
    // Opt-in (`BENCH_OTHER_LAYOUT=1`): a fourth side in the same rounds lowers `p8` itself on
    // this two-core machine (measured: 0.183 with one, 0.222 without).
    let with_other = std::env::var("BENCH_OTHER_LAYOUT").is_ok_and(|v| v == "1");
    let other_layout = match bench.settings.layout {
        Layout::Split => Layout::Single,
        Layout::Single => Layout::Split,
    };
    let other = finish.apply(fresh_ledger_in(bench, "p8o", other_layout).await?);
    if with_other {
        load_accounts(&other, &accounts).await?;
    }
    // Untimed, after the last round's ids: the engine reads the pool, connections open.
    let warm_up = rounds * transfers..rounds * transfers + 2 * c;
    run_transfers(&ledger, "t", warm_up.clone(), c, pool_pair).await?;
    if with_other {
        run_transfers(&other, "t", warm_up, c, pool_pair).await?;
    }
    FLUSHES.lock().expect("not poisoned").clear();
    let requests_before = requests_of(&ledger);
    let (seq_before, validated_before) = (
        writes_of(&ledger).await?,
        update_seq(ledger.client()).await?,
    );
    let (account_rounds_before, txn_rounds_before) = ledger.engine_rounds();
    let mut sides = vec![
        Side::Ours,
        Side::Raw,
        Side::Validated,
        Side::Floor,
        Side::Phases,
    ];
    if with_other {
        sides.push(Side::OtherLayout);
    }
    if with_one_request {
        sides.push(Side::OneRequest);
    }
    let samples = interleaved(&sides, rounds, |side, round| {
        let (ledger, raw, validated, other) = (&ledger, &raw, &validated, &other);
        let (floor, phases, one_request) = (&floor, &phases, &one_request);
        async move {
            match side {
                Side::Ours => {
                    let jobs = round * transfers..(round + 1) * transfers;
                    transfer_round(ledger, "t", jobs, c, pool_pair).await
                }
                Side::OtherLayout => {
                    let jobs = round * transfers..(round + 1) * transfers;
                    transfer_round(other, "t", jobs, c, pool_pair).await
                }
                Side::Raw => Ok(raw.round(RAW_BULK_BATCHES).await? / cost.docs_written),
                Side::Floor => floor.round(P8_TRANSFERS_PER_ROUND).await,
                Side::Phases => phases.round(P8_TRANSFERS_PER_ROUND).await,
                Side::OneRequest => match one_request {
                    Some(shape) => shape.round(P8_TRANSFERS_PER_ROUND).await,
                    None => bail!("p8: the one-request side was not set up"),
                },
                _ => Ok(validated.round(RAW_BULK_BATCHES).await? / cost.docs_written),
            }
        }
    })
    .await?;
    let made = (rounds * transfers) as f64;
    let requests = (requests_of(&ledger) - requests_before) as f64 / made;
    let docs = (writes_of(&ledger).await? - seq_before) as f64 / made;
    // Documents written into the ledger's database, where validate_doc_update runs for each.
    let validated_docs = (update_seq(ledger.client()).await? - validated_before) as f64 / made;
    let (account_rounds, txn_rounds) = ledger.engine_rounds();
    // One transfer document a transfer on the one-write path (p8's): created once, decided.
    let txn_docs_per_request = made / (txn_rounds - txn_rounds_before) as f64;
    let transfers_per_account_round = made / (account_rounds - account_rounds_before) as f64;
    eprintln!(
        "  p8 grouping: {requests:.3} HTTP requests per transfer ({:.1} transfers per request), \
         {txn_docs_per_request:.1} transfer documents per _bulk_docs",
        1.0 / requests
    );
    let floor_transfers = rounds * P8_TRANSFERS_PER_ROUND;
    let server_us = [
        (
            "p8",
            samples.server_cpu_us_per_op(Side::Ours, rounds * transfers),
        ),
        (
            "phases",
            samples.server_cpu_us_per_op(Side::Phases, floor_transfers),
        ),
        (
            "floor",
            samples.server_cpu_us_per_op(Side::Floor, floor_transfers),
        ),
    ];
    if server_us.iter().all(|(_, us)| us.is_some()) {
        let line: Vec<String> = server_us
            .iter()
            .map(|(side, us)| format!("{side} {:.0}", us.unwrap_or_default()))
            .collect();
        eprintln!(
            "  p8 server CPU per transfer (BENCH_SERVER_PID), µs: {}",
            line.join(", ")
        );
    }
    let flushes: Vec<Flush> = std::mem::take(&mut *FLUSHES.lock().expect("not poisoned"))
        .into_iter()
        .filter(|f| f.database == ledger.client().database())
        .collect();
    let finishing = finish_summary(&flushes, ledger.settles_folded());
    if finish == Finish::Background {
        eprintln!("  p8 background finish: {finishing}");
    }
    // A batched path that does not batch would make this figure a lie.
    ensure!(
        requests < 1.0,
        "p8: {requests:.2} requests per transfer: the submits were not grouped"
    );
    raw.drop_database().await?;
    validated.drop_database().await?;
    floor.drop_databases().await?;
    phases.drop_databases().await?;
    if let Some(shape) = one_request {
        shape.drop_databases().await?;
    }
    let verified = verify_and_drop(&ledger).await?;
    if with_other {
        verify_and_drop(&other).await?;
    } else {
        other.client().delete_database().await?;
        if other.hot_database().is_some() {
            other.hot_client().delete_database().await?;
        }
    }
    let layout = bench.settings.layout.name();
    let ops = rounds * transfers;
    let p8 = Row::new(
        "p8",
        format!(
            "transfers/s, c{c}, batched submit ({layout} layout, {})",
            finish.name()
        ),
        "xfers/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Raw],
    )
    .goal(Some(GOAL_P8))
    .cpu(&samples, [Side::Ours, Side::Raw], ops)
    .note(format!(
        "{layout} layout (BENCH_LAYOUT), {} (BENCH_FINISH){}; {c} callers, \
         {P8_POOL_ACCOUNTS} accounts; raw = raw _bulk_docs docs/s (batches of \
         {BULK_BATCH_DOCS}) ÷ {:.1} documents written per transfer (p3); grouping: {requests:.3} \
         requests per transfer, {txn_docs_per_request:.1} transfer documents per _bulk_docs, \
         {transfers_per_account_round:.1} transfers per account-engine round, {docs:.2} \
         documents written per transfer (accounts shared within a group); audited in {:.1} s",
        finish.name(),
        if finish == Finish::Background {
            format!(": {finishing}")
        } else {
            String::new()
        },
        cost.docs_written,
        verified.as_secs_f64()
    ));
    let p8_validated = Row::new(
        "p8_validated",
        format!("transfers/s, c{c}, ÷ validated bulk limit"),
        "xfers/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Validated],
    )
    .cpu(&samples, [Side::Ours, Side::Validated], ops)
    .note(format!(
        "p8's transfers against raw _bulk_docs of transfer documents into a ledger database \
         (validate_doc_update runs per document) ÷ {:.1}, same rounds; validated ÷ plain bulk \
         docs/s: {:.3}",
        cost.docs_written,
        median(&ratios(&samples, Side::Validated, Side::Raw))
    ));
    // The layout figures, from the same rounds. A document written into the ledger's database
    // is validated (its validate_doc_update runs for each); a split ledger writes accounts and
    // transfers into its hot database, which has none. `p10` divides by plain `_bulk_docs`
    // docs/s (not per transfer), so it is comparable across protocols and layouts that write
    // different numbers of documents.
    let p8_docs = Row::count(
        "p8_docs",
        "documents written per transfer under p8's load".to_owned(),
        "docs",
        &[docs],
    );
    let p8_validated_docs = Row::count(
        "p8_validated_docs",
        "validated documents written per transfer under p8's load".to_owned(),
        "docs",
        &[validated_docs],
    )
    .note(match bench.settings.layout {
        Layout::Single => {
            "the single layout: every document goes to the one validated database".to_owned()
        }
        Layout::Split => "the split layout: the documents written into the ledger's validated \
                          database (accounts and transfers go to the hot one, unvalidated)"
            .to_owned(),
    });
    let raw_docs_per_s: Vec<f64> = samples.figures[&Side::Raw]
        .iter()
        .map(|per_transfer| per_transfer * cost.docs_written)
        .collect();
    let p10 = Row::new(
        "p10",
        format!("transfers/s, c{c}, batched ({layout}), ÷ plain _bulk_docs docs/s"),
        "xfers/s",
        &samples.figures[&Side::Ours],
        &raw_docs_per_s,
    )
    .note(
        "p8's transfers/s over raw _bulk_docs docs/s into a database without validation, same \
         rounds (2,000 transfers/s on CouchDB 3.4 here is about 0.085)"
            .to_owned(),
    );
    // What the document model allows: the floor's transfers/s, and the
    // best `p10` any protocol writing those documents could show.
    let p8_floor = Row::new(
        "p8_floor",
        format!("transfers/s, c{c}, ÷ the document floor"),
        "xfers/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Floor],
    )
    .note(format!(
        "p8's transfers/s over the floor's (DocumentFloor): per transfer only what the ledger's \
         documents make necessary, its transfer document created once in its final state and \
         one update of each account (balance only), {FLOOR_TRANSFERS_PER_REQUEST} transfers \
         per _bulk_docs from {FLOOR_WRITERS} writer(s) at once ({c} in flight, as p8), no read, \
         no conflict, same rounds; the floor is the most transfers/s this server takes from \
         any protocol with one document per transfer and a write of each account"
    ));
    let p8_phases = Row::new(
        "p8_phases",
        format!("transfers/s, c{c}, ÷ today's documents batched ideally"),
        "xfers/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Phases],
    )
    .note(format!(
        "p8's transfers/s over the same floor writer's writing the documents today's protocol \
         writes (FloorShape::Phases, the one-write path: both accounts with their marker and \
         the previous settle folded in, then the transfer documents created done; 3 a \
         transfer) in two requests per {FLOOR_TRANSFERS_PER_REQUEST} transfers, same rounds: \
         how much of p8's \
         distance to the floor is its engine's batching (this ratio) and how much the \
         protocol's documents and phases (the phases' own rate ÷ the floor's: {:.3})",
        median(&ratios(&samples, Side::Phases, Side::Floor))
    ));
    let p10_floor = Row::new(
        "p10_floor",
        "the document floor's transfers/s ÷ plain _bulk_docs docs/s".to_owned(),
        "xfers/s",
        &samples.figures[&Side::Floor],
        &raw_docs_per_s,
    )
    .note(
        "the highest p10 a protocol writing one transfer document and both accounts per \
         transfer could reach on this server (same rounds as p10)"
            .to_owned(),
    );
    let p8_one_request = with_one_request.then(|| {
        Row::new(
            "p8_one_request",
            "one request a transfer (4 documents) ÷ the document floor".to_owned(),
            "xfers/s",
            &samples.figures[&Side::OneRequest],
            &samples.figures[&Side::Floor],
        )
        .note(format!(
            "FloorShape::OneRequest's transfers/s over the floor's, same rounds \
             (BENCH_ONE_REQUEST=1): each transfer's accounts with their markers and its \
             document created initial in one request, the document decided in the next; \
             beside it today's two requests (FloorShape::Phases) ÷ the floor: {:.3}",
            median(&ratios(&samples, Side::Phases, Side::Floor))
        ))
    });
    let other_name = other_layout.name();
    let p10_other = with_other.then(|| {
        Row::new(
            "p10_other",
            format!("transfers/s, c{c}, batched ({other_name}), ÷ plain _bulk_docs docs/s"),
            "xfers/s",
            &samples.figures[&Side::OtherLayout],
            &raw_docs_per_s,
        )
        .note(format!(
            "p8's workload on the {other_name} layout, same rounds, audited after \
             (BENCH_OTHER_LAYOUT=1): what the layout choice buys"
        ))
    });
    let mut measured = bench.measured.lock().expect("lock");
    measured.transfer_points.push(TransferPoint {
        concurrency: c,
        ours: p8.ours,
    });
    measured.bulk_limits = Some(BulkLimits {
        plain: p8.raw,
        validated: p8_validated.raw,
    });
    let mut rows = vec![
        p8,
        p8_validated,
        p8_docs,
        p8_validated_docs,
        p10,
        p8_floor,
        p8_phases,
        p10_floor,
    ];
    rows.extend(p8_one_request);
    rows.extend(p10_other);
    Ok(rows)
}

// ---- p9: the same transfers through `couch-ledger serve` ----

/// Rounds per side of `p9`.
const P9_ROUNDS: usize = 8;
const GOAL_P9: Goal = Goal::AtLeast(0.8);

/// The release binary running `couch-ledger serve` on a free loopback port; killed if dropped.
struct ServeProcess {
    child: tokio::process::Child,
    base: String,
}

impl ServeProcess {
    /// Starts it on `db` without its sweeper (every transfer is finished by its caller) and
    /// waits for the line saying where it listens.
    async fn start(bench: &Bench, ledger: &Ledger) -> Result<ServeProcess> {
        use tokio::io::AsyncBufReadExt as _;
        let exe = PROGRAM;
        let mut command = program(bench, ledger);
        command
            .args(["--json", "serve", "--listen", "127.0.0.1:0", "--no-sweep"])
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

    fn pid(&self) -> Result<u32> {
        self.child.id().context("serve exited")
    }

    /// SIGTERM, then it must exit 0 (it finishes what is in flight first).
    async fn stop(mut self) -> Result<()> {
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

/// Each call's latency in seconds, appended by concurrent callers.
type Latencies = Arc<Mutex<Vec<f64>>>;

/// The `q`-quantile of `values` (nearest rank).
fn quantile(values: &[f64], q: f64) -> f64 {
    assert!(!values.is_empty());
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// One round of `p9`'s HTTP side: transfers `jobs` (ids `h{i}`) between `p8`'s pool accounts
/// by `concurrency` callers over keep-alive connections, each checked 201 and `done`; every
/// request's latency (s) appended to `latencies`. Returns the steady rate.
async fn http_transfer_round(
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
                .header("Idempotency-Key", format!("h{i:07}"))
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
                "transfer h{i:07} through serve: {status} {answer}"
            );
            Ok(())
        }
    })
    .await?;
    Ok(steady_rate(&finished, concurrency))
}

/// One round of `p9`'s library side: `p8`'s transfers through `Ledger::submit` in this
/// process, with each call's latency (s) appended to `latencies`.
async fn library_transfer_round(
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
async fn served_transfers(bench: &Bench) -> Result<Vec<Row>> {
    let rounds = bench.settings.scaled(P9_ROUNDS);
    let c = P8_CONCURRENCY;
    let transfers = jobs_for_steady_rate(TRANSFERS_PER_ROUND_C64, c);
    let accounts: Vec<String> = (0..P8_POOL_ACCOUNTS).map(|i| account_id("p", i)).collect();
    let library = fresh_ledger(bench, "p9_library").await?;
    load_accounts(&library, &accounts).await?;
    let served = fresh_ledger(bench, "p9_serve").await?;
    load_accounts(&served, &accounts).await?;
    let service = ServeProcess::start(bench, &served).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(REQUEST_TIMEOUT_S))
        .pool_max_idle_per_host(c)
        .build()?;
    let http_latencies: Latencies = Arc::default();
    let library_latencies: Latencies = Arc::default();
    // Untimed, after the last round's ids: both engines read the pool, connections open.
    let warm_up = rounds * transfers..rounds * transfers + 2 * c;
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
    service.stop().await?;
    verify_and_drop(&served).await?;
    verify_and_drop(&library).await?;
    let ops = rounds * transfers;
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
    let quantiles = quantiles.into_inner().expect("lock");
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
    Ok(vec![p9, latency_row("p50"), latency_row("p99")])
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
        let raw = if row.count {
            "-".to_owned()
        } else {
            format!("{:.1}", row.raw)
        };
        println!(
            "{:<13} {:<46} {:>10.1} {:>10} {:>9} {:>7.3} {:>6.3} {:>8} {:>5}",
            row.key, row.title, row.ours, raw, row.unit, row.ratio, row.ratio_ci95, goal, met
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
                "p4_p5": bench.settings.scaled(TRANSFER_ROUNDS),
                "p8": bench.settings.scaled(P8_ROUNDS),
                "p9": bench.settings.scaled(P9_ROUNDS),
                "p6_raw": 2 * P6_RAW_ROUNDS_EACH_SIDE,
            },
            "p6_stuck_transfers": bench.settings.scaled(P6_TRANSFERS),
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
            "transfer_cost": measured.transfer_cost,
            "transfers_by_concurrency": measured.transfer_points,
            "transfer_bulk_limits": measured.bulk_limits,
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

/// One line of a chart: a label, a style and its points (concurrency, value).
struct Series {
    label: String,
    color: &'static str,
    dash: &'static str,
    points: Vec<(usize, f64)>,
}

/// A line chart of per-second figures against concurrency (log scale), one line per series,
/// with axes, gridlines and a legend, drawn `top` pixels down the image.
fn line_chart(svg: &mut String, top: f64, title: &str, y_label: &str, series: &[Series]) {
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 560.0;
    let plot_top = top + 60.0;
    let plot_bottom = top + 380.0;
    let top_value = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let step = grid_step(top_value * 1.1);
    let y_max = (top_value * 1.1 / step).ceil().max(1.0) * step;
    let mut levels: Vec<usize> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    levels.sort_unstable();
    levels.dedup();
    let max_c = levels.last().copied().unwrap_or(1).max(2) as f64;
    let x = |c: usize| LEFT + 30.0 + (c as f64).log2() / max_c.log2() * (RIGHT - LEFT - 60.0);
    let y = |v: f64| plot_bottom - v / y_max * (plot_bottom - plot_top);

    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{:.1}" font-size="17" font-weight="bold">{}</text>"#,
        top + 28.0,
        xml_escape(title)
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
        r##"<line x1="{LEFT}" y1="{plot_bottom}" x2="{RIGHT}" y2="{plot_bottom}" stroke="#222"/><line x1="{LEFT}" y1="{plot_top}" x2="{LEFT}" y2="{plot_bottom}" stroke="#222"/>"##
    );
    for &c in &levels {
        let xx = x(c);
        let _ = writeln!(
            svg,
            r##"<line x1="{xx:.1}" y1="{plot_bottom}" x2="{xx:.1}" y2="{:.1}" stroke="#222"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#333">{c}</text>"##,
            plot_bottom + 5.0,
            plot_bottom + 20.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">concurrent callers (log scale)</text>"#,
        (LEFT + RIGHT) / 2.0,
        plot_bottom + 45.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(24 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (plot_top + plot_bottom) / 2.0,
        xml_escape(y_label)
    );
    // The lines, with a marker at each measured point, and the legend right of the plot.
    for (i, line) in series.iter().enumerate() {
        let Series {
            label,
            color,
            dash,
            points,
        } = line;
        let path: Vec<String> = points
            .iter()
            .map(|&(c, v)| format!("{:.1},{:.1}", x(c), y(v)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2.5" stroke-dasharray="{dash}"/>"#,
            path.join(" ")
        );
        for &(c, v) in points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"><title>{}: {v:.0}/s at {c}</title></circle>"#,
                x(c),
                y(v),
                xml_escape(label)
            );
        }
        let ly = plot_top + 10.0 + i as f64 * 24.0;
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
}

/// The plot: single-document writes/s against concurrency (ours, raw, couch_rs) and, when the
/// transfer figures ran, transfers/s against concurrency beside the limits they are divided by.
fn plot_svg(measured: &Measured, subtitle: &str) -> String {
    const W: f64 = 860.0;
    const CHART_H: f64 = 475.0;
    let mut points = measured.write_points.clone();
    points.sort_by_key(|p| p.concurrency);
    let mut transfers = measured.transfer_points.clone();
    transfers.sort_by_key(|p| p.concurrency);
    let with_transfers = !transfers.is_empty() && measured.transfer_cost.is_some();
    let h = if with_transfers {
        2.0 * CHART_H + 20.0
    } else {
        CHART_H + 20.0
    };

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r##"<text x="80" y="{:.1}" font-size="12" fill="#555">{}</text>"##,
        h - 12.0,
        xml_escape(subtitle)
    );
    let writes = |label: &str, color, dash, value: fn(&WritePoint) -> f64| Series {
        label: label.to_owned(),
        color,
        dash,
        points: points.iter().map(|p| (p.concurrency, value(p))).collect(),
    };
    line_chart(
        &mut svg,
        0.0,
        "Single-document writes per second against concurrency",
        "writes per second",
        &[
            writes("raw reqwest (limit)", "#444444", "7 4", |p| p.raw),
            writes("couch-ledger (ours)", "#1f6fd1", "none", |p| p.ours),
            writes("couch_rs 0.13 (peer)", "#e07b00", "2 3", |p| p.couch_rs),
        ],
    );
    let _ = writeln!(
        svg,
        r##"<text x="80" y="{:.1}" font-size="11" fill="#666">raw: median of its rounds; ours and couch_rs: raw × their median ratio to raw in the same rounds</text>"##,
        CHART_H - 22.0
    );
    if let (true, Some(cost)) = (with_transfers, measured.transfer_cost) {
        let span = |value: f64| {
            let first = transfers.first().map_or(1, |p| p.concurrency);
            let last = transfers.last().map_or(1, |p| p.concurrency);
            vec![(first, value), (last, value)]
        };
        let mut series = vec![
            Series {
                label: "couch-ledger transfers (ours)".to_owned(),
                color: "#1f6fd1",
                dash: "none",
                points: transfers.iter().map(|p| (p.concurrency, p.ours)).collect(),
            },
            Series {
                label: format!("raw writes/s ÷ {:.0} requests", cost.requests_cold),
                color: "#444444",
                dash: "7 4",
                points: points
                    .iter()
                    .map(|p| (p.concurrency, p.raw / cost.requests_cold))
                    .collect(),
            },
        ];
        if let Some(limits) = measured.bulk_limits {
            series.push(Series {
                label: format!("raw bulk docs/s ÷ {:.0} docs", cost.docs_written),
                color: "#2a9d3a",
                dash: "7 4",
                points: span(limits.plain),
            });
            series.push(Series {
                label: "… into a validated ledger db".to_owned(),
                color: "#b5179e",
                dash: "2 3",
                points: span(limits.validated),
            });
        }
        line_chart(
            &mut svg,
            CHART_H,
            "Transfers per second against concurrency",
            "transfers per second",
            &series,
        );
        let _ = writeln!(
            svg,
            r##"<text x="80" y="{:.1}" font-size="11" fill="#666">c1: p3, one at a time; c16: p4_c16, own account pairs; c64: p8, batched submit; limits measured in the same runs</text>"##,
            2.0 * CHART_H - 22.0
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
         c4-c64 {}, p2 {}, latency {LATENCY_ROUNDS} x {} queries, p4/p5 {}, p8 {}; p6: one \
         sweeper pass of {}, bracketed by {} raw rounds)\nmeasured in {:.0} s, load average {} → {}",
        bench.settings.scaled(WRITE_ROUNDS_C1),
        bench.settings.scaled(WRITE_ROUNDS),
        bench.settings.scaled(BULK_ROUNDS),
        bench.settings.scaled(BALANCE_QUERIES_PER_ROUND),
        bench.settings.scaled(TRANSFER_ROUNDS),
        bench.settings.scaled(P8_ROUNDS),
        bench.settings.scaled(P6_TRANSFERS),
        2 * P6_RAW_ROUNDS_EACH_SIDE,
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
    std::fs::write(&svg_path, plot_svg(&measured, &subtitle))?;
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}
