//! One simulated run, chosen entirely by its seed: a cluster, several ledger processes (each a
//! real [`Ledger`] with its own engine, talking to the cluster through a [`SimTransport`]),
//! callers submitting transfers, reversals, cancels and order entries, sweepers, and faults —
//! nodes stopped and started, answers lost after the server acted, processes killed mid-work.
//! Then every fault is healed, the copies converge, an admin's sweeper finishes the work, and
//! the oracle checks the money.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_ledger::testing::WireRequest;
use couch_ledger::{
    AccountSpec, Amount, Client, Currency, Ledger, PauseHook, Payment, Purchase, RecordStatus,
    State, SweepOptions, TransferRequest, VerifyOptions, WriteQuorum,
};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::sim::cluster::{Cluster, Config};
use crate::sim::http::{Crash, Route, SimTransport};

mod steered;
pub use steered::{run_steered, STEERED};

/// The wall clock's start in every run (2026-11-26), so runs replay exactly.
const EPOCH_MS: i64 = 1_795_000_000_000;
const LEDGER_DB: &str = "ledger";
const HOT_DB: &str = "ledger_hot";
const LEASE: Duration = Duration::from_secs(10);
/// The orders every run records a purchase of, and pays.
const ORDERS: [&str; 2] = ["o1", "o2"];

/// What a run did and what it found wrong.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub seed: u64,
    pub scenario: String,
    pub violations: Vec<String>,
    pub transfers: u64,
    pub node_restarts: u64,
    pub stemmed_branches: u64,
    pub conflicts_merged: u64,
    pub lost_replies: u64,
    pub crashes: u64,
    pub requests: u64,
    pub trace: u64,
}

/// Runs seed `seed` on a fresh paused runtime of this thread.
pub fn run_seed(seed: u64, long: bool) -> Outcome {
    on_sim_runtime(seed, move || Run::new(seed, long).play())
}

/// Runs what `play` makes on a fresh paused runtime of this thread, the simulated wall clock
/// starting at [`EPOCH_MS`] and its randomness from `seed`.
fn on_sim_runtime<F>(seed: u64, play: impl FnOnce() -> F) -> Outcome
where
    F: std::future::Future<Output = Outcome>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let play = async move {
        couch_ledger::testing::simulate_wall_clock(Some(EPOCH_MS), seed);
        START.with(|s| s.set(Some(Instant::now())));
        play().await
    };
    with_sim_log(|| rt.block_on(play))
}

/// Runs `f` with the ledger's own log on, stamped with the simulated time, when `SIM_LOG`
/// names a filter.
fn with_sim_log<T>(f: impl FnOnce() -> T) -> T {
    match std::env::var("SIM_LOG") {
        Ok(filter) => {
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_timer(SimTime)
                .with_writer(std::io::stderr)
                .finish();
            tracing::subscriber::with_default(subscriber, f)
        }
        Err(_) => f(),
    }
}

/// Log timestamps in simulated seconds since the run began.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let ms = couch_ledger_now_ms() - EPOCH_MS;
        write!(w, "{:>4}.{:03}", ms / 1000, ms % 1000)
    }
}

/// The simulated wall clock (what the ledger reads).
fn couch_ledger_now_ms() -> i64 {
    EPOCH_MS
        + i64::try_from(START.with(|s| s.get().map_or(0, |t| t.elapsed().as_millis()))).unwrap_or(0)
}

thread_local! {
    static START: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// The shape of one run, drawn from its seed.
#[derive(Debug, Clone, Default)]
struct Plan {
    /// The shape of the measured node loss (docs/CLUSTER.md, "A node that came back").
    forensics: bool,
    /// One id sent at once with two terms, by a one-write process and a stepwise one.
    two_terms: bool,
    /// Busy accounts near their minimum on a loaded cluster.
    hot: bool,
    /// Workers dying between their apply and their decision, the same ids sent again through
    /// a stepwise process while the sweeper decides them.
    recovery: bool,
    split: bool,
    slots: Vec<ProcessPlan>,
    accounts: Vec<(String, i64, Option<i64>)>,
    transfers: usize,
    duration_s: u64,
    same_id_permille: u32,
    other_terms_permille: u32,
    /// Per mille of the transfers a one-write process sends that a stepwise process sends
    /// again seconds later, with the same terms or others (the recovery shape).
    resend_permille: u32,
    no_wait_permille: u32,
    reverse_permille: u32,
    payments: usize,
    /// (node, stop at s, down for s)
    outages: Vec<(usize, u64, u64)>,
    /// (slot, at s)
    crashes: Vec<(usize, u64)>,
    sweep_every_s: u64,
}

#[derive(Debug, Clone, Copy)]
struct ProcessPlan {
    route: Route,
    admin: bool,
    stepwise: bool,
    background: bool,
    server_default: bool,
    /// Per mille of its account writes applying a one-write marker after which the process
    /// dies (the server took the write, the decision is not made), a new process taking its
    /// place.
    crash_permille: u32,
    stall: Stall,
}

/// A process that stops for a while right before some of its protocol writes, after its lease
/// check (the ledger's pause hook), as a process does in a pause of its runtime or its machine:
/// `permille` of those writes, each for up to `ms`. It lets the steps of one transfer's drivers
/// (a decision and its settles, a cancel and its undos) interleave with another process's reads
/// and resolutions in orders the network's own delays rarely give.
#[derive(Debug, Clone, Copy, Default)]
struct Stall {
    permille: u32,
    ms: u64,
}

/// The pause hook of a process stalling as `stall` says, drawn from the cluster's random
/// generator while process faults are on.
fn stall_hook(cluster: &Arc<Cluster>, slot: usize, stall: Stall) -> Option<PauseHook> {
    if stall.permille == 0 {
        return None;
    }
    let cluster = Arc::clone(cluster);
    Some(PauseHook(Arc::new(move |phase: &'static str| {
        let ms = {
            let mut s = cluster.lock();
            (s.config.process_crashes && s.rng.u32(..1000) < stall.permille)
                .then(|| s.rng.u64(..stall.ms))
        };
        Box::pin(async move {
            if let Some(ms) = ms {
                tracing::info!(target: "sim", slot, phase, ms, "a process stalls before a write");
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
        })
    })))
}

/// What a caller was told.
#[derive(Debug, Clone)]
enum Told {
    Transfer {
        id: String,
        source: String,
        destination: String,
        amount: i64,
        state: State,
        /// A reversal: the transfer it reverses. Its terms are that transfer's as its document
        /// ends (the id may have been sent with other terms too, and those may be the ones
        /// that stand), the accounts swapped — not the terms one caller of that id sent.
        reverses: Option<String>,
    },
    Payment {
        id: String,
        amount: i64,
    },
}

/// A client of the simulated cluster's ledger database through `transport`.
fn sim_client(transport: &Arc<SimTransport>) -> Client {
    Client::builder()
        .url("http://couchdb.sim:5984")
        .database(LEDGER_DB)
        .request_timeout(Duration::from_secs(10))
        .transport(transport.clone())
        .build()
        .expect("client")
}

/// A process's ledger on `client`'s database, as its plan says: split or not, stepwise or
/// one-write, finishing in the background or not, the write quorum; the run's lease; its
/// stalls' hook.
fn process_ledger(
    client: Client,
    split: bool,
    plan: ProcessPlan,
    stall: Option<PauseHook>,
) -> Ledger {
    let mut ledger = Ledger::builder(client)
        .stepwise_transfers(plan.stepwise)
        .background_finish(plan.background)
        .lease(LEASE);
    if let Some(hook) = stall {
        ledger = ledger.pause_hook(hook);
    }
    if split {
        ledger = ledger.hot_database(HOT_DB);
    }
    if plan.server_default {
        ledger = ledger.write_quorum(WriteQuorum::ServerDefault);
    }
    ledger.build().expect("ledger settings")
}

struct Slot {
    plan: ProcessPlan,
    ledger: Ledger,
    transport: Arc<SimTransport>,
    tasks: Vec<JoinHandle<()>>,
}

struct Run {
    seed: u64,
    long: bool,
    rng: fastrand::Rng,
    plan: Plan,
    config: Config,
    cluster: Arc<Cluster>,
    slots: Arc<Mutex<Vec<Slot>>>,
    told: Arc<Mutex<Vec<Told>>>,
    started: Instant,
    crashes: Arc<AtomicU64>,
    terms: Arc<Mutex<BTreeMap<String, Terms>>>,
    awaiting: Arc<Mutex<BTreeMap<String, usize>>>,
}

fn draw_plan(seed: u64, rng: &mut fastrand::Rng, long: bool) -> (Plan, Config) {
    let mut config = Config {
        q: rng.u64(1..=4),
        repl_ms: (rng.u64(1..20), rng.u64(50..3000)),
        slow_copy_one_in: rng.u32(3..30),
        transient_permille: if rng.bool() { 0 } else { rng.u32(0..20) },
        lost_reply_permille: if rng.bool() { 0 } else { rng.u32(0..25) },
        ..Config::default()
    };
    if rng.u32(..4) == 0 {
        config.default_w = 1;
    }
    let slots = (0..rng.usize(2..=4))
        .map(|_| ProcessPlan {
            route: if rng.u32(..4) == 0 {
                Route::Pinned(rng.usize(..config.nodes))
            } else {
                Route::RoundRobin
            },
            admin: rng.u32(..5) != 0,
            stepwise: rng.u32(..5) == 0,
            background: rng.u32(..3) == 0,
            server_default: rng.u32(..6) == 0,
            crash_permille: 0,
            stall: Stall::default(),
        })
        .collect();
    let accounts = (0..rng.usize(3..=7))
        .map(|i| {
            let opening = rng.i64(2_000..50_000);
            let min = if rng.u32(..5) == 0 { None } else { Some(0) };
            (format!("a{i}"), opening, min)
        })
        .collect();
    let duration_s = if long {
        rng.u64(150..260)
    } else {
        rng.u64(10..60)
    };
    let transfers = if long {
        rng.usize(250..450)
    } else {
        rng.usize(15..90)
    };
    let mut outages = Vec::new();
    if long || rng.u32(..3) == 0 {
        let node = rng.usize(..config.nodes);
        let at = rng.u64(1..duration_s.max(2) / 2 + 1);
        let down = if long {
            rng.u64(70..170)
        } else {
            rng.u64(3..25)
        };
        outages.push((node, at, down));
    }
    let mut crashes = Vec::new();
    for _ in 0..rng.usize(0..=2) {
        if rng.bool() {
            crashes.push((0, rng.u64(1..duration_s)));
        }
    }
    let mut plan = Plan {
        forensics: false,
        two_terms: false,
        hot: false,
        recovery: false,
        split: rng.bool(),
        slots,
        accounts,
        transfers,
        duration_s,
        same_id_permille: rng.u32(0..150),
        // One id resent with other terms (`two_terms_drawn`).
        other_terms_permille: match rng.u32(0..40) {
            p if two_terms_drawn() => p,
            _ => 0,
        },
        resend_permille: 0,
        no_wait_permille: rng.u32(0..80),
        reverse_permille: rng.u32(0..60),
        payments: rng.usize(0..12),
        outages,
        crashes,
        sweep_every_s: rng.u64(1..6),
    };
    if long && rng.u32(..3) == 0 {
        forensics(rng, &mut plan, &mut config);
    } else if !long && rng.u32(..6) == 0 && two_terms_drawn() {
        two_terms(&mut plan, &mut config);
    } else if !long && (hot_drawn() || rng.u32(..6) == 0) {
        hot(rng, &mut plan, &mut config);
    }
    if config.late_copy_one_in == 0 && rng.u32(..3) == 0 {
        // A loaded cluster: some copy writes answered after the coordinator stopped waiting.
        config.late_copy_one_in = rng.u32(5..30);
    }
    // Drawn from a generator of its own, so that the seeds which do not take this shape draw
    // exactly what they drew before it existed.
    let mut own = fastrand::Rng::with_seed(seed ^ 0x7265_636f_7665_7279);
    if !long && recovery_drawn(&mut own) {
        recovery(&mut own, &mut plan, &mut config);
    }
    if trio_drawn() {
        trio(&mut plan, &mut config);
    }
    (plan, config)
}

/// Whether one id is ever resent with other terms (in any shape, and the two-terms shape
/// itself, docs/CLUSTER.md, "One id, two terms, two paths"): unless `SIM_TWO_TERMS=0`, which
/// replays the draws of the seeds cited from before it was drawn by default.
pub fn two_terms_drawn() -> bool {
    std::env::var("SIM_TWO_TERMS").map_or(true, |v| v != "0")
}

/// Whether this short run takes the recovery shape: one in six by default, every one with
/// `SIM_RECOVERY=1`, none with `SIM_RECOVERY=0` (which replays the draws of the seeds cited
/// from before it existed).
fn recovery_drawn(rng: &mut fastrand::Rng) -> bool {
    match std::env::var("SIM_RECOVERY").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => rng.u32(..6) == 0,
    }
}

/// The `SIM_RECOVERY` setting to replay a seed with, when it is not the default.
pub fn recovery_setting() -> &'static str {
    match std::env::var("SIM_RECOVERY").as_deref() {
        Ok("0") => " SIM_RECOVERY=0",
        Ok("1") => " SIM_RECOVERY=1",
        _ => "",
    }
}

/// Whether every short run takes the hot shape (`SIM_HOT=1`), rather than one in six
/// (docs/CLUSTER.md, "A loaded cluster's 202s").
pub fn hot_drawn() -> bool {
    std::env::var("SIM_HOT").is_ok_and(|v| v == "1")
}

/// Whether every run takes the trio's shape: under `SIM_TRIO=1`, or for the runner's own group
/// of trio seeds (docs/CLUSTER.md, "Open: reads of one copy").
pub fn trio_drawn() -> bool {
    TRIO.load(Ordering::Relaxed) || std::env::var("SIM_TRIO").is_ok_and(|v| v == "1")
}

/// Set by the runner for its group of trio seeds.
static TRIO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every seed run from now on take the trio's shape.
pub fn set_trio() {
    TRIO.store(true, Ordering::Relaxed);
}

/// How many transfers (and markers) one sweep pass looks at (`SIM_PASS_LIMIT=N`): by default
/// the background sweepers' 200 and the finisher's 10,000, larger than any run's backlog. A small
/// limit makes a pass see only the oldest part of a backlog, as the real sweeper's `--batch` does
/// on a large one, where what is stuck ahead can take every pass (docs/CLUSTER.md, "Open: one
/// id, two terms, two paths").
pub fn pass_limit() -> Option<usize> {
    match PASS_LIMIT.load(Ordering::Relaxed) {
        0 => std::env::var("SIM_PASS_LIMIT")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n: &usize| *n > 0),
        n => Some(n),
    }
}

/// The pass limit of the seeds run now, set by the runner for its group of small passes; 0 for
/// `SIM_PASS_LIMIT`'s.
static PASS_LIMIT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Makes every pass of the seeds run from now on look at `n` transfers and markers at most.
pub fn set_pass_limit(n: usize) {
    PASS_LIMIT.store(n, Ordering::Relaxed);
}

/// The shape of the reliability suite's trio (three replicating servers behind a balancer):
/// every process writes accounts at the server's default quorum, which is one copy, and every
/// read without its own `r` asks one copy, so a conflict's leaves may be listed by one copy and
/// read from another that lacks some of them; no node stops; more ids sent twice and more
/// reversals than the default draw.
fn trio(plan: &mut Plan, config: &mut Config) {
    config.default_w = 1;
    config.default_r = 1;
    plan.outages.clear();
    for s in &mut plan.slots {
        s.server_default = true;
        s.route = Route::RoundRobin;
    }
    plan.same_id_permille = plan.same_id_permille.max(80);
    plan.reverse_permille = plan.reverse_permille.max(30);
}

/// Busy accounts near their minimum on a loaded cluster: a few accounts of little money, many
/// transfers in a short time from several processes at `w` = n, and many writes answered 202
/// before a slow copy took them — where a debit's own branch, read from the copies that took
/// it, can hide a rival debit that reached only the slow copy.
fn hot(rng: &mut fastrand::Rng, plan: &mut Plan, config: &mut Config) {
    plan.hot = true;
    config.late_copy_one_in = rng.u32(2..6);
    plan.accounts = (0..rng.usize(2..=4))
        .map(|i| (format!("h{i}"), rng.i64(1_000..4_000), Some(0)))
        .collect();
    plan.duration_s = rng.u64(3..8);
    plan.transfers = rng.usize(100..220);
    for s in &mut plan.slots {
        s.server_default = false;
        s.route = Route::RoundRobin;
    }
    // The outage drawn for the plan's own length may outlast this one's.
    plan.outages.clear();
    while plan.slots.len() < 5 {
        plan.slots.push(plan.slots[0]);
    }
}

/// Where the one-write and the stepwise paths meet on one account: two processes, one of each,
/// writing accounts at the server's default quorum (so rival writes leave branches), and many
/// transfers sent again at once with other terms through the other process.
fn two_terms(plan: &mut Plan, config: &mut Config) {
    let process = |stepwise| ProcessPlan {
        route: Route::RoundRobin,
        admin: true,
        stepwise,
        background: false,
        server_default: true,
        crash_permille: 0,
        stall: Stall::default(),
    };
    config.default_w = 1;
    plan.two_terms = true;
    plan.slots = vec![process(false), process(true)];
    plan.other_terms_permille = 400;
    plan.same_id_permille = 100;
}

/// Where the sweeper's recovery meets a caller sending the id again (docs/CLUSTER.md, "Telling a
/// decision on a cluster"): one-write workers that die after an account write (between their
/// apply and their decision, or their decision and their settles), the sweeper giving the
/// undecided transfer its document and deciding it, and many of those ids sent again through a
/// stepwise process seconds later, with the same terms or others — while copies take writes
/// seconds late, or a node is away, so that the re-send's create can land on a copy that lacks
/// the sweeper's document and stand beside it, for a reader to resolve.
fn recovery(rng: &mut fastrand::Rng, plan: &mut Plan, config: &mut Config) {
    plan.recovery = true;
    plan.hot = false;
    plan.two_terms = false;
    config.late_copy_one_in = rng.u32(2..4);
    config.late_copy_ms = rng.u64(1_500..8_000);
    config.repl_ms = (rng.u64(1..20), rng.u64(2_000..8_000));
    let stall = |rng: &mut fastrand::Rng| Stall {
        permille: rng.u32(50..300),
        ms: rng.u64(500..15_000),
    };
    let worker = |rng: &mut fastrand::Rng| ProcessPlan {
        route: Route::RoundRobin,
        admin: rng.u32(..4) != 0,
        stepwise: false,
        background: rng.u32(..3) == 0,
        server_default: rng.u32(..3) == 0,
        crash_permille: rng.u32(100..500),
        stall: stall(rng),
    };
    let stepwise = |rng: &mut fastrand::Rng| ProcessPlan {
        route: Route::RoundRobin,
        admin: true,
        stepwise: true,
        background: false,
        server_default: rng.u32(..3) == 0,
        crash_permille: 0,
        stall: stall(rng),
    };
    plan.slots = (0..rng.usize(1..=2)).map(|_| worker(rng)).collect();
    plan.slots.push(stepwise(rng));
    plan.duration_s = rng.u64(10..30);
    plan.transfers = rng.usize(20..70);
    plan.sweep_every_s = rng.u64(1..3);
    plan.resend_permille = rng.u32(300..800);
    plan.other_terms_permille = 0;
    plan.crashes.clear();
    plan.outages.clear();
    if rng.bool() {
        let at = rng.u64(1..plan.duration_s / 2 + 1);
        plan.outages
            .push((rng.usize(..config.nodes), at, rng.u64(3..15)));
    }
}

/// The load of the measured node loss: two service processes through the balancer, six busy
/// accounts of 50,000, a fifth of the transfers sent twice at once, and one node stopped ten
/// seconds in for 150 seconds while the load goes on (CouchDB's default `_revs_limit` is
/// exceeded on its stale copies many times over).
fn forensics(rng: &mut fastrand::Rng, plan: &mut Plan, config: &mut Config) {
    let process = ProcessPlan {
        route: Route::RoundRobin,
        admin: true,
        stepwise: false,
        background: false,
        server_default: false,
        crash_permille: 0,
        stall: Stall::default(),
    };
    config.default_w = 2;
    plan.forensics = true;
    plan.split = false;
    plan.slots = vec![process; 2];
    plan.accounts = (0..6).map(|i| (format!("s{i}"), 50_000, Some(0))).collect();
    plan.duration_s = 180;
    plan.transfers = rng.usize(450..650);
    plan.same_id_permille = 200;
    plan.other_terms_permille = 0;
    plan.no_wait_permille = 0;
    plan.reverse_permille = 0;
    plan.payments = 0;
    plan.outages = vec![(config.nodes - 1, 10, 150)];
    plan.crashes.clear();
}

impl Run {
    fn new(seed: u64, long: bool) -> Run {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed_c0ff_ee00_0001);
        let (mut plan, config) = draw_plan(seed, &mut rng, long);
        let n_slots = plan.slots.len();
        for c in &mut plan.crashes {
            c.0 = rng.usize(..n_slots);
        }
        Run::with(seed, long, rng, plan, config)
    }

    /// A run of `plan` on a cluster of `config`.
    fn with(seed: u64, long: bool, rng: fastrand::Rng, plan: Plan, config: Config) -> Run {
        let cluster = Cluster::new(config.clone(), seed);
        Run {
            seed,
            long,
            rng,
            plan,
            config,
            cluster,
            slots: Arc::new(Mutex::new(Vec::new())),
            told: Arc::new(Mutex::new(Vec::new())),
            started: Instant::now(),
            crashes: Arc::new(AtomicU64::new(0)),
            terms: Arc::new(Mutex::new(BTreeMap::new())),
            awaiting: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    fn ledger(&self, plan: ProcessPlan) -> (Ledger, Arc<SimTransport>) {
        let transport = SimTransport::new(Arc::clone(&self.cluster), plan.route, plan.admin);
        let client = sim_client(&transport);
        let ledger = process_ledger(client, self.plan.split, plan, None);
        (ledger, transport)
    }

    /// What starts and replaces the run's processes.
    fn procs(&self) -> Procs {
        Procs {
            cluster: Arc::clone(&self.cluster),
            slots: Arc::clone(&self.slots),
            split: self.plan.split,
            every: Duration::from_secs(self.plan.sweep_every_s),
            crashes: Arc::clone(&self.crashes),
            told: Arc::clone(&self.told),
            started: self.started,
            terms: Arc::clone(&self.terms),
            resend_permille: self.plan.resend_permille,
            accounts: self.plan.accounts.iter().map(|a| a.0.clone()).collect(),
            awaiting: Arc::clone(&self.awaiting),
        }
    }

    fn violation(&self, out: &mut Outcome, what: impl Into<String>) {
        out.violations.push(what.into());
    }

    fn scenario(&self) -> String {
        format!(
            "{}{} layout, q={}, w={}, {} processes ({}), {} accounts, {} transfers over {} s, outages {:?}, crashes {:?}, lost replies {}‰, 503s {}‰, late copies 1 in {} (≤ {} ms){}",
            if trio_drawn() {
                "trio, "
            } else if self.plan.forensics {
                "forensics, "
            } else if self.plan.two_terms {
                "two terms, "
            } else if self.plan.recovery {
                "recovery, "
            } else if self.plan.hot {
                "hot, "
            } else if self.long {
                "long, "
            } else {
                ""
            },
            if self.plan.split { "split" } else { "single" },
            self.config.q,
            self.config.default_w,
            self.plan.slots.len(),
            self.plan
                .slots
                .iter()
                .map(|p| format!(
                    "{}{}{}{}{}{}{}",
                    match p.route {
                        Route::RoundRobin => "rr".to_owned(),
                        Route::Pinned(n) => format!("node{n}"),
                    },
                    if p.admin { "" } else { " member" },
                    if p.stepwise { " stepwise" } else { "" },
                    if p.background { " background" } else { "" },
                    if p.server_default { " w-default" } else { "" },
                    if p.crash_permille > 0 {
                        format!(" dies after {}‰ of its applies", p.crash_permille)
                    } else {
                        String::new()
                    },
                    if p.stall.permille > 0 {
                        format!(
                            " stalls before {}‰ of its writes (≤ {} ms)",
                            p.stall.permille, p.stall.ms
                        )
                    } else {
                        String::new()
                    },
                ))
                .collect::<Vec<_>>()
                .join("; "),
            self.plan.accounts.len(),
            self.plan.transfers,
            self.plan.duration_s,
            self.plan.outages,
            self.plan.crashes,
            self.config.lost_reply_permille,
            self.config.transient_permille,
            self.config.late_copy_one_in,
            self.config.late_copy_ms,
            if self.plan.resend_permille > 0 {
                format!(", {}‰ resent stepwise", self.plan.resend_permille)
            } else {
                String::new()
            },
        )
    }

    async fn play(mut self) -> Outcome {
        let mut out = Outcome {
            seed: self.seed,
            scenario: self.scenario(),
            ..Outcome::default()
        };
        let Some(eur) = self.set_up(&mut out).await else {
            return out;
        };
        self.started = Instant::now();
        let procs = self.procs();
        for (i, p) in self.plan.slots.clone().into_iter().enumerate() {
            let (ledger, transport) = procs.process(i, p);
            self.slots.lock().unwrap().push(Slot {
                plan: p,
                ledger,
                transport,
                tasks: Vec::new(),
            });
        }
        let n_slots = self.plan.slots.len();
        for slot in 0..n_slots {
            self.spawn_sweeper(slot);
        }
        if self.plan.recovery {
            let procs = self.procs();
            self.cluster
                .watch(Some(Arc::new(move |request: &WireRequest| {
                    procs.watch(request)
                })));
        }
        self.schedule_faults();
        self.schedule_work(eur, &ORDERS);
        // The workload's time, then its stragglers.
        tokio::time::sleep(Duration::from_secs(self.plan.duration_s + 5)).await;
        self.wrap_up(out, eur).await
    }

    /// With every fault off: the ledger's databases, design documents, accounts and orders.
    /// `None` (and a violation) when one of them could not be made.
    async fn set_up(&mut self, out: &mut Outcome) -> Option<Currency> {
        let (lost, transient) = {
            let mut s = self.cluster.lock();
            let l = s.config.lost_reply_permille;
            let t = s.config.transient_permille;
            s.config.lost_reply_permille = 0;
            s.config.transient_permille = 0;
            (l, t)
        };
        let admin = ProcessPlan {
            route: Route::RoundRobin,
            admin: true,
            stepwise: false,
            background: false,
            server_default: false,
            crash_permille: 0,
            stall: Stall::default(),
        };
        let (setup, _) = self.ledger(admin);
        if let Err(e) = setup.init().await {
            self.violation(out, format!("init failed: {e}"));
            return None;
        }
        let eur = Currency::from_code("EUR").expect("EUR");
        for (id, opening, min) in &self.plan.accounts {
            let spec = AccountSpec {
                account_id: id.clone(),
                currency: eur,
                opening: Amount::new(*opening).expect("amount"),
                min_balance: min.map(|m| Amount::new(m).expect("amount")),
                meta: Default::default(),
            };
            if let Err(e) = setup.create_account(spec).await {
                self.violation(out, format!("creating account {id} failed: {e}"));
                return None;
            }
        }
        for o in ORDERS {
            let text = format!(
                r#"{{"order_id":"{o}","account_id":"c1","basket":[{{"product_id":"p","title":"t","category":"c","price":100.00,"tax":0,"quantity":1}}],"delivery":{{"option":"std","price":0,"address":{{"street":"s"}}}},"pretax":100.00,"tax":0,"total":100.00}}"#
            );
            let purchase = Purchase::from_json(&text, Some(eur)).expect("purchase");
            if let Err(e) = setup.record_purchase(&purchase).await {
                self.violation(out, format!("recording purchase {o} failed: {e}"));
                return None;
            }
        }
        {
            let mut s = self.cluster.lock();
            s.config.lost_reply_permille = lost;
            s.config.transient_permille = transient;
        }
        Some(eur)
    }

    /// Every fault healed, the work finished, the oracle's verdict, the run's counts.
    async fn wrap_up(&mut self, mut out: Outcome, eur: Currency) -> Outcome {
        self.heal_and_finish(&mut out, eur).await;
        let stats = self.cluster.stats();
        out.node_restarts = stats.node_restarts;
        out.stemmed_branches = stats.stemmed_branches;
        out.lost_replies = stats.lost_replies;
        out.requests = stats.requests;
        out.trace = stats.trace;
        out.crashes = self.crashes.load(Ordering::Relaxed);
        out
    }

    fn spawn_sweeper(&self, slot: usize) {
        spawn_sweeper(
            &self.slots,
            slot,
            Duration::from_secs(self.plan.sweep_every_s),
        );
    }

    fn schedule_faults(&mut self) {
        for (node, at, down) in self.plan.outages.clone() {
            let cluster = Arc::clone(&self.cluster);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(at)).await;
                cluster.stop_node(node);
                tokio::time::sleep(Duration::from_secs(down)).await;
                cluster.start_node(node);
            });
        }
        let procs = self.procs();
        for (slot, at) in self.plan.crashes.clone() {
            let procs = procs.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(at)).await;
                procs.replace(slot).await;
            });
        }
    }

    fn schedule_work(&mut self, eur: Currency, orders: &[&str]) {
        let procs = self.procs();
        let n_accounts = self.plan.accounts.len();
        let n_slots = self.plan.slots.len();
        let span_ms = self.plan.duration_s * 1000;
        let mut sent = 0u64;
        for i in 0..self.plan.transfers {
            let s = self.rng.usize(..n_accounts);
            let mut d = self.rng.usize(..n_accounts);
            if d == s {
                d = (d + 1) % n_accounts;
            }
            let opening = self.plan.accounts[s].1;
            let amount = self.rng.i64(1..=(opening / 8).max(2));
            let id = format!("t{i}");
            let at = Duration::from_millis(self.rng.u64(0..span_ms));
            let wait = self.rng.u32(..1000) >= self.plan.no_wait_permille;
            let slot = self.rng.usize(..n_slots);
            let source = self.plan.accounts[s].0.clone();
            let destination = self.plan.accounts[d].0.clone();
            self.terms.lock().unwrap().insert(
                id.clone(),
                Terms {
                    source: source.clone(),
                    destination: destination.clone(),
                    amount,
                },
            );
            procs.submit(slot, at, &id, &source, &destination, amount, wait, eur);
            sent += 1;
            if self.rng.u32(..1000) < self.plan.same_id_permille {
                // The same transfer again through another process, a moment later.
                let other = self.rng.usize(..n_slots);
                let later = at + Duration::from_millis(self.rng.u64(0..300));
                procs.submit(other, later, &id, &source, &destination, amount, true, eur);
            }
            if self.rng.u32(..1000) < self.plan.other_terms_permille {
                let (other, later) = if self.plan.two_terms {
                    // Through the other path, at once.
                    let later = at + Duration::from_millis(self.rng.u64(0..20));
                    ((slot + 1) % n_slots, later)
                } else {
                    let other = self.rng.usize(..n_slots);
                    (other, at + Duration::from_millis(self.rng.u64(0..300)))
                };
                // Other terms: one minor unit more, or (half the time, where a third account
                // exists) the same amount to another destination.
                let elsewhere = (0..n_accounts)
                    .map(|k| (d + 1 + k) % n_accounts)
                    .find(|&k| k != s && k != d);
                let (to, value) = match elsewhere {
                    Some(k) if self.rng.bool() => (self.plan.accounts[k].0.clone(), amount),
                    _ => (destination.clone(), amount + 1),
                };
                procs.submit(other, later, &id, &source, &to, value, true, eur);
            }
            if self.plan.resend_permille > 0
                && !self.plan.slots[slot].stepwise
                && self.rng.u32(..1000) < self.plan.resend_permille
            {
                // Sent again through a stepwise process, seconds later.
                let stepwise: Vec<usize> = (0..n_slots)
                    .filter(|&k| self.plan.slots[k].stepwise)
                    .collect();
                let other = stepwise[self.rng.usize(..stepwise.len())];
                let later = at + Duration::from_millis(self.rng.u64(1_000..16_000));
                let first = Terms {
                    source: source.clone(),
                    destination: destination.clone(),
                    amount,
                };
                let (to, value) = first.resent(self.rng.u32(..3), &procs.accounts, d + 1);
                procs.submit(other, later, &id, &source, &to, value, true, eur);
            }
            if !wait && self.rng.bool() {
                let other = self.rng.usize(..n_slots);
                let later = at + Duration::from_millis(self.rng.u64(0..3000));
                let id2 = id.clone();
                let told = Arc::clone(&self.told);
                procs.spawn_on(other, later, move |ledger| {
                    tokio::spawn(async move {
                        if let Ok(o) = ledger.cancel(&id2).await {
                            if o.state == State::Cancelled {
                                told.lock().unwrap().push(Told::Transfer {
                                    id: o.id,
                                    source: String::new(),
                                    destination: String::new(),
                                    amount: 0,
                                    state: o.state,
                                    reverses: None,
                                });
                            }
                        }
                    })
                });
            }
            if self.rng.u32(..1000) < self.plan.reverse_permille {
                let other = self.rng.usize(..n_slots);
                let later = at + Duration::from_millis(self.rng.u64(500..10_000));
                let id2 = id.clone();
                let told = Arc::clone(&self.told);
                let (src, dst) = (source.clone(), destination.clone());
                procs.spawn_on(other, later, move |ledger| {
                    tokio::spawn(async move {
                        if let Ok(o) = ledger.reverse(&id2).await {
                            told.lock().unwrap().push(Told::Transfer {
                                id: o.id,
                                source: dst,
                                destination: src,
                                amount,
                                state: o.state,
                                reverses: Some(id2),
                            });
                        }
                    })
                });
            }
        }
        for i in 0..self.plan.payments {
            let order = orders[i % orders.len()].to_owned();
            let reference = format!("r{i}");
            let amount = self.rng.i64(1..=500);
            let at = Duration::from_millis(self.rng.u64(0..span_ms));
            let copies = if self.rng.u32(..3) == 0 { 2 } else { 1 };
            for c in 0..copies {
                let other_amount = c == 1 && self.rng.bool();
                let amount = if other_amount { amount + 100 } else { amount };
                let slot = self.rng.usize(..n_slots);
                let at = at + Duration::from_millis(self.rng.u64(0..50));
                let told = Arc::clone(&self.told);
                let order = order.clone();
                let reference = reference.clone();
                procs.spawn_on(slot, at, move |ledger| {
                    tokio::spawn(async move {
                        let p = Payment {
                            order_id: order.clone(),
                            reference: reference.clone(),
                            amount: Amount::new(amount).expect("amount"),
                            currency: eur,
                            method: None,
                            meta: Default::default(),
                        };
                        match ledger.record_payment(&p).await {
                            Ok(r) if r.status != RecordStatus::Uncertain => {
                                told.lock()
                                    .unwrap()
                                    .push(Told::Payment { id: r.id, amount });
                            }
                            _ => {}
                        }
                    })
                });
            }
        }
        let _ = sent;
    }

    /// Every fault healed: nodes up, no lost answers, no more crashes; callers finish; the
    /// copies converge; an admin's sweeper finishes what is left; then the oracle.
    async fn heal_and_finish(&mut self, out: &mut Outcome, _eur: Currency) {
        {
            let mut s = self.cluster.lock();
            s.config.lost_reply_permille = 0;
            s.config.transient_permille = 0;
            // The load is over: every copy answers in time again.
            s.config.late_copy_one_in = 0;
            s.config.process_crashes = false;
            drop(s);
            // (It holds the processes, which hold the cluster.)
            self.cluster.watch(None);
        }
        let n = self.config.nodes;
        for node in 0..n {
            self.cluster.start_node(node);
        }
        self.cluster.join_all();
        // Let callers still running finish (each is bounded by the ledger's own deadlines).
        tokio::time::sleep(Duration::from_secs(120)).await;
        let stuck: usize = {
            let mut s = self.slots.lock().unwrap();
            let mut stuck = 0;
            for slot in s.iter_mut() {
                for t in slot.tasks.drain(..) {
                    if !t.is_finished() {
                        stuck += 1;
                    }
                    t.abort();
                }
            }
            stuck
        };
        let _ = stuck;
        tokio::time::sleep(Duration::from_secs(20)).await;
        self.cluster.converge();
        let finisher_plan = ProcessPlan {
            route: Route::RoundRobin,
            admin: true,
            stepwise: false,
            background: false,
            server_default: false,
            crash_permille: 0,
            stall: Stall::default(),
        };
        let (finisher, _) = self.ledger(finisher_plan);
        let mut rested = false;
        // With small passes, enough of them to go through the whole backlog twice.
        let passes = pass_limit().map_or(40, |n| 40 + 2 * (self.plan.transfers * 2).div_ceil(n));
        for _ in 0..passes {
            let _ = finisher
                .sweep_once(SweepOptions {
                    limit: pass_limit().unwrap_or(10_000),
                    stale_after: Duration::from_secs(1),
                })
                .await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            self.cluster.converge();
            if self.at_rest() {
                rested = true;
                break;
            }
            // Claims of dead workers run out.
            tokio::time::sleep(LEASE).await;
        }
        if !rested {
            self.violation(
                out,
                format!(
                    "termination: not at rest after the sweeper: {}",
                    self.unrest()
                ),
            );
        }
        self.oracle(out);
        match finisher.verify_with(VerifyOptions::at_rest()).await {
            Ok(report) if report.ok => {}
            Ok(report) => {
                for c in report.checks.iter().filter(|c| !c.ok) {
                    // Two bodies of a write-once entry wait for a person: `verify` says so.
                    let for_a_person = c.name == "conflicts"
                        && !c.documents.is_empty()
                        && c.documents.iter().all(|id| self.write_once_conflict(id));
                    if !for_a_person {
                        self.violation(out, format!("verify: {}: {}", c.name, c.detail));
                    }
                }
            }
            Err(e) => self.violation(out, format!("verify failed: {e}")),
        }
        let counts = finisher.conflict_counts();
        out.conflicts_merged += counts.resolved;
        for slot in self.slots.lock().unwrap().iter() {
            out.conflicts_merged += slot.ledger.conflict_counts().resolved;
        }
    }

    /// The final state: every document of both databases, as node 0 holds it (the copies agree).
    fn docs(&self) -> Vec<(String, Value, usize)> {
        let s = self.cluster.lock();
        let mut out = Vec::new();
        for db in [LEDGER_DB, HOT_DB] {
            if let Some(d) = s.dbs.get(db) {
                for (id, e) in &d.copies[0].docs {
                    let Some(w) = e.tree.winner() else { continue };
                    if e.tree.is_deleted(&w) {
                        continue;
                    }
                    let body = crate::sim::cluster::doc_json(id, &e.tree, &w, true);
                    out.push((id.clone(), body, e.tree.conflicts().len()));
                }
            }
        }
        out
    }

    fn unrest(&self) -> String {
        let mut what = Vec::new();
        for (id, doc, conflicts) in self.docs() {
            if conflicts > 0 && !id.starts_with("_design/") && !write_once(&doc) {
                what.push(format!("{id} in conflict"));
            }
            match doc.get("type").and_then(Value::as_str) {
                Some("transaction") => {
                    let state = doc.get("state").and_then(Value::as_str).unwrap_or("?");
                    if state != "done" && state != "cancelled" {
                        what.push(format!("{id} {state}"));
                    }
                }
                Some("account") => {
                    let pending = doc
                        .get("pending")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    if pending > 0 {
                        what.push(format!("{id} holds {pending} pending markers"));
                    }
                }
                _ => {}
            }
        }
        what.truncate(12);
        what.join(", ")
    }

    /// Whether `id` is a write-once entry holding other bodies under its id.
    fn write_once_conflict(&self, id: &str) -> bool {
        self.docs()
            .iter()
            .any(|(d, doc, conflicts)| d == id && *conflicts > 0 && write_once(doc))
    }

    fn at_rest(&self) -> bool {
        self.unrest().is_empty()
    }

    fn oracle(&self, out: &mut Outcome) {
        // The copies agree.
        {
            let s = self.cluster.lock();
            for (name, d) in &s.dbs {
                for (id, e) in &d.copies[0].docs {
                    for c in &d.copies[1..] {
                        if !c.docs.get(id).is_some_and(|o| o.tree.same_as(&e.tree)) {
                            out.violations.push(format!(
                                "model: copies of {name}/{id} disagree after converging"
                            ));
                        }
                    }
                }
            }
        }
        let docs = self.docs();
        let mut accounts: BTreeMap<String, Value> = BTreeMap::new();
        let mut txns: BTreeMap<String, Value> = BTreeMap::new();
        let mut entries: BTreeMap<String, Value> = BTreeMap::new();
        let mut two_bodies = BTreeSet::new();
        for (id, doc, conflicts) in docs {
            if conflicts > 0 && write_once(&doc) {
                // Left for a person (docs/CLUSTER.md): allowed only where no caller was told
                // its body is the one stored (checked with the answers below).
                two_bodies.insert(id.clone());
            } else if conflicts > 0 && !id.starts_with("_design/") {
                out.violations.push(format!(
                    "conflict left after the sweeper: {id} ({conflicts} losing leaves)"
                ));
            }
            match doc.get("type").and_then(Value::as_str) {
                Some("account") => {
                    accounts.insert(id, doc);
                }
                Some("transaction") => {
                    txns.insert(id, doc);
                }
                Some("payment") => {
                    entries.insert(id, doc);
                }
                _ => {}
            }
        }
        out.transfers = txns.len() as u64;
        let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_i64).unwrap_or(0);
        // Each balance = opening + its done (and committed) transfers, each counted once.
        let mut moved: BTreeMap<String, i64> = BTreeMap::new();
        for t in txns.values() {
            let state = t.get("state").and_then(Value::as_str).unwrap_or("");
            if state == "done" || state == "committed" {
                let v = num(t, "value");
                let s = t.get("source").and_then(Value::as_str).unwrap_or("");
                let d = t.get("destination").and_then(Value::as_str).unwrap_or("");
                *moved.entry(s.to_owned()).or_default() -= v;
                *moved.entry(d.to_owned()).or_default() += v;
            }
        }
        let (mut sum_open, mut sum_bal) = (0i64, 0i64);
        for (id, opening, min) in &self.plan.accounts {
            let Some(a) = accounts.get(&format!("account:{id}")) else {
                out.violations.push(format!("account {id} is gone"));
                continue;
            };
            let balance = num(a, "balance");
            sum_open += opening;
            sum_bal += balance;
            let expected = opening + moved.get(id).copied().unwrap_or(0);
            if balance != expected {
                out.violations.push(format!(
                    "exactly-once: account {id} balance {balance}, opening {opening} + its done transfers {} = {expected} (off by {:+})",
                    moved.get(id).copied().unwrap_or(0),
                    balance - expected
                ));
            }
            if num(a, "opening") != *opening {
                out.violations.push(format!(
                    "account {id} opening changed to {}",
                    num(a, "opening")
                ));
            }
            if let Some(m) = min {
                if balance < *m {
                    out.violations.push(format!(
                        "overdraft at rest: account {id} balance {balance} < {m}"
                    ));
                }
            }
        }
        if sum_open != sum_bal {
            out.violations.push(format!(
                "conservation: Σ balances {sum_bal} ≠ Σ openings {sum_open} ({:+})",
                sum_bal - sum_open
            ));
        }
        // What callers were told stays true.
        for told in self.told.lock().unwrap().iter() {
            match told {
                Told::Transfer {
                    id,
                    source,
                    destination,
                    amount,
                    state,
                    reverses,
                } => {
                    if !matches!(state, State::Done | State::Cancelled) {
                        continue;
                    }
                    let Some(t) = txns.get(&format!("txn:{id}")) else {
                        out.violations.push(format!(
                            "transfer {id} was answered {state} but has no document"
                        ));
                        continue;
                    };
                    let final_state = t.get("state").and_then(Value::as_str).unwrap_or("?");
                    // A reversal is of the reversed transfer as its document ends.
                    let reversed = reverses
                        .as_ref()
                        .and_then(|r| txns.get(&format!("txn:{r}")));
                    let (source, destination, amount) = match reversed {
                        Some(r) => (
                            r.get("destination").and_then(Value::as_str).unwrap_or("?"),
                            r.get("source").and_then(Value::as_str).unwrap_or("?"),
                            num(r, "value"),
                        ),
                        None => (source.as_str(), destination.as_str(), *amount),
                    };
                    let same = t.get("source").and_then(Value::as_str) == Some(source)
                        && t.get("destination").and_then(Value::as_str) == Some(destination)
                        && num(t, "value") == amount;
                    // `cancelled` promises that the caller's terms moved nothing under the id:
                    // the id ending `done` with other terms (sent at once from elsewhere, its
                    // leaf kept over the one this caller read) keeps that promise.
                    let cancelled_other_terms = *state == State::Cancelled
                        && final_state == "done"
                        && !source.is_empty()
                        && !same;
                    if final_state != state.to_string() && !cancelled_other_terms {
                        out.violations.push(format!(
                            "transfer {id} was answered {state} and ended {final_state}"
                        ));
                    }
                    if *state == State::Done && !source.is_empty() && !same {
                        out.violations.push(format!(
                            "transfer {id} was answered done for {source}→{destination} {amount} but its document holds other terms"
                        ));
                    }
                }
                Told::Payment { id, .. } if two_bodies.contains(id) => {
                    out.violations.push(format!(
                        "payment {id} was answered written, but another body is stored beside it"
                    ));
                }
                Told::Payment { id, amount } => match entries.get(id) {
                    None => out
                        .violations
                        .push(format!("payment {id} was answered written but is missing")),
                    Some(p) if num(p, "value") != *amount => out.violations.push(format!(
                        "payment {id} was answered written with {amount} but holds {}",
                        num(p, "value")
                    )),
                    Some(_) => {}
                },
            }
        }
    }
}

/// What the run's processes need to be started, and started again after a crash.
#[derive(Clone)]
struct Procs {
    cluster: Arc<Cluster>,
    slots: Arc<Mutex<Vec<Slot>>>,
    split: bool,
    every: Duration,
    crashes: Arc<AtomicU64>,
    told: Arc<Mutex<Vec<Told>>>,
    started: Instant,
    /// The terms each transfer id was first sent with, for the re-sends after a crash.
    terms: Arc<Mutex<BTreeMap<String, Terms>>>,
    /// Per mille of the transfers whose marker a dying process wrote that another process
    /// sends again about when the sweeper recovers them (the recovery shape).
    resend_permille: u32,
    accounts: Vec<String>,
    /// Transfers a dying process applied, by id, to be sent again (through another process
    /// than this one) as soon as a sweeper creates their document `initial`.
    awaiting: Arc<Mutex<BTreeMap<String, usize>>>,
}

/// The transfers of the one-write markers (those naming an attempt) the account write `write`
/// applied: its markers stamped within the last second (the others were there before it).
fn applied_markers(write: &[u8]) -> Vec<String> {
    let Ok(body) = serde_json::from_slice::<Value>(write) else {
        return Vec::new();
    };
    body.get("docs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|d| d.get("type").and_then(Value::as_str) == Some("account"))
        .filter_map(|d| d.get("pending").and_then(Value::as_array))
        .flatten()
        .filter(|m| {
            m.get("attempt").is_some_and(|a| !a.is_null())
                && m.get("at")
                    .and_then(Value::as_i64)
                    .is_some_and(|at| at >= couch_ledger_now_ms() - 1_000)
        })
        .filter_map(|m| m.get("txn").and_then(Value::as_str))
        .map(|key| key.split('~').next().unwrap_or(key).to_owned())
        .collect()
}

/// A transfer's source, destination and amount, as a caller sent them.
#[derive(Debug, Clone)]
struct Terms {
    source: String,
    destination: String,
    amount: i64,
}

impl Terms {
    /// The destination and amount a re-send of these terms goes with, as `change` says: one
    /// minor unit more (0), the same amount to the first other account of `accounts` from
    /// `from` on (1, where there is one), or the same terms.
    fn resent(&self, change: u32, accounts: &[String], from: usize) -> (String, i64) {
        let n = accounts.len();
        let elsewhere = (0..n)
            .map(|k| &accounts[(from + k) % n])
            .find(|a| **a != self.source && **a != self.destination);
        match (change, elsewhere) {
            (0, _) => (self.destination.clone(), self.amount + 1),
            (1, Some(a)) => (a.clone(), self.amount),
            _ => (self.destination.clone(), self.amount),
        }
    }
}

impl Procs {
    /// A new process for `slot`, as `plan` says: one that may die after an account write
    /// tells a task of its own, which replaces it.
    fn process(&self, slot: usize, plan: ProcessPlan) -> (Ledger, Arc<SimTransport>) {
        let transport = if plan.crash_permille > 0 {
            let (died, mut deaths) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
            let procs = self.clone();
            tokio::spawn(async move {
                if let Some(write) = deaths.recv().await {
                    procs.resend_after_crash(slot, &write);
                    procs.replace(slot).await;
                }
            });
            SimTransport::crashing(
                Arc::clone(&self.cluster),
                plan.route,
                plan.admin,
                Crash {
                    permille: plan.crash_permille,
                    fatal: Box::new(|write: &[u8]| !applied_markers(write).is_empty()),
                    on_crash: Box::new(move |write: &[u8]| {
                        let _ = died.send(write.to_vec());
                    }),
                },
            )
        } else {
            SimTransport::new(Arc::clone(&self.cluster), plan.route, plan.admin)
        };
        let client = sim_client(&transport);
        let stall = stall_hook(&self.cluster, slot, plan.stall);
        (process_ledger(client, self.split, plan, stall), transport)
    }

    /// Registers a caller task with its slot, so a crash of that process stops it.
    fn spawn_on(
        &self,
        slot: usize,
        at: Duration,
        f: impl FnOnce(Ledger) -> tokio::task::JoinHandle<()> + Send + 'static,
    ) {
        let slots = Arc::clone(&self.slots);
        let started = self.started;
        let handle = tokio::spawn(async move {
            tokio::time::sleep_until(started + at).await;
            let ledger = slots.lock().unwrap()[slot].ledger.clone();
            let inner = f(ledger);
            slots.lock().unwrap()[slot].tasks.push(inner);
        });
        drop(handle);
    }

    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        slot: usize,
        at: Duration,
        id: &str,
        source: &str,
        destination: &str,
        amount: i64,
        wait: bool,
        eur: Currency,
    ) {
        let told = Arc::clone(&self.told);
        let request = TransferRequest {
            id: Some(id.to_owned()),
            source: source.to_owned(),
            destination: destination.to_owned(),
            amount: Amount::new(amount).expect("amount"),
            currency: eur,
            meta: Default::default(),
        };
        let (source, destination) = (source.to_owned(), destination.to_owned());
        self.spawn_on(slot, at, move |ledger| {
            tokio::spawn(async move {
                if let Ok(o) = ledger.submit(request, wait).await {
                    told.lock().unwrap().push(Told::Transfer {
                        id: o.id,
                        source,
                        destination,
                        amount,
                        state: o.state,
                        reverses: None,
                    });
                }
            })
        });
    }

    /// The transfers whose pending markers the account write `write` of a dying process applied,
    /// sent again (three in four, in the recovery shape) through another process, with their terms or
    /// others, about when the sweeper recovers them: their markers are past the lease then, and
    /// a pass gives the undecided ones their document `initial` and decides it
    /// (docs/CLUSTER.md, "Telling a decision on a cluster").
    fn resend_after_crash(&self, slot: usize, write: &[u8]) {
        if self.resend_permille == 0 {
            return;
        }
        let mut ids = applied_markers(write);
        ids.sort();
        ids.dedup();
        tracing::info!(target: "sim", slot, ?ids, "a process died after an account write");
        let now = self.started.elapsed();
        for id in ids {
            let (how, later) = {
                let mut s = self.cluster.lock();
                (
                    s.rng.u32(..4),
                    now + LEASE + Duration::from_millis(s.rng.u64(0..5_000)),
                )
            };
            match how {
                0 => {}
                1 => self.resend(&id, slot, later),
                _ => {
                    self.awaiting.lock().unwrap().insert(id, slot);
                }
            }
        }
    }

    /// Watches the writes of every process: a sweeper's create of the document `initial` of a
    /// transfer a dying process applied (its recovery, the next step being its one-write
    /// decision) has the id sent again through another process a moment later, so that the
    /// re-send's create can land on a copy the sweeper's has not reached yet.
    fn watch(&self, request: &WireRequest) {
        if !matches!(request.method.as_str(), "PUT" | "POST")
            || self.awaiting.lock().unwrap().is_empty()
        {
            return;
        }
        let Some(body) = request
            .body
            .as_deref()
            .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        else {
            return;
        };
        let docs = match body.get("docs").and_then(Value::as_array) {
            Some(docs) => docs.clone(),
            None => vec![body],
        };
        // A `PUT` names its document in the path.
        let in_path = request
            .path
            .rsplit('/')
            .next()
            .map(|seg| seg.replace("%3A", ":").replace("%3a", ":"));
        for d in docs {
            let created_initial = d.get("_rev").is_none_or(Value::is_null)
                && d.get("state").and_then(Value::as_str) == Some("initial");
            let named = d
                .get("_id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| in_path.clone());
            let Some(id) = named.as_deref().and_then(|i| i.strip_prefix("txn:")) else {
                continue;
            };
            if !created_initial {
                continue;
            }
            let Some(died) = self.awaiting.lock().unwrap().remove(id) else {
                continue;
            };
            // At once while a copy lacks the document (a create can land there), else a few
            // seconds on.
            let db = request.path.split('/').next().unwrap_or_default();
            let lacking = self.cluster.some_copy_lacks(db, &format!("txn:{id}"));
            let ms = if lacking { 0..20 } else { 500..5_000 };
            let later =
                self.started.elapsed() + Duration::from_millis(self.cluster.lock().rng.u64(ms));
            tracing::info!(target: "sim", %id, lacking, "a sweeper recovers a dead process's transfer");
            self.resend(id, died, later);
        }
    }

    /// Sends `id` again at `later` through another process than `died`'s, with its terms or
    /// others.
    fn resend(&self, id: &str, died: usize, later: Duration) {
        let Some(t) = self.terms.lock().unwrap().get(id).cloned() else {
            return;
        };
        let n_slots = self.slots.lock().unwrap().len();
        let (other, change, pick) = {
            let mut s = self.cluster.lock();
            (
                (died + 1 + s.rng.usize(..n_slots.max(2) - 1)) % n_slots,
                s.rng.u32(..3),
                s.rng.usize(..self.accounts.len()),
            )
        };
        let (to, value) = t.resent(change, &self.accounts, pick);
        tracing::info!(target: "sim", %id, slot = other, at = ?later, %to, value, "re-sent after its process died");
        let eur = Currency::from_code("EUR").expect("EUR");
        self.submit(other, later, id, &t.source, &to, value, true, eur);
    }

    /// The process in `slot` dies (its requests never come back, its tasks stop); a new one
    /// takes the slot a moment later, with a sweeper of its own.
    async fn replace(self, slot: usize) {
        let plan = {
            let mut s = self.slots.lock().unwrap();
            let slot = &mut s[slot];
            slot.transport.dead.store(true, Ordering::Relaxed);
            for t in slot.tasks.drain(..) {
                t.abort();
            }
            slot.plan
        };
        self.crashes.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (ledger, transport) = self.process(slot, plan);
        {
            let mut s = self.slots.lock().unwrap();
            s[slot].ledger = ledger;
            s[slot].transport = transport;
        }
        spawn_sweeper(&self.slots, slot, self.every);
    }
}

/// A process's sweeper: a pass every `every`, by whichever ledger holds the slot then.
fn spawn_sweeper(slots: &Arc<Mutex<Vec<Slot>>>, slot: usize, every: Duration) {
    let shared = Arc::clone(slots);
    let handle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let ledger = shared.lock().unwrap()[slot].ledger.clone();
            let _ = ledger
                .sweep_once(SweepOptions {
                    limit: pass_limit().unwrap_or(200),
                    stale_after: Duration::from_secs(2),
                })
                .await;
        }
    });
    slots.lock().unwrap()[slot].tasks.push(handle);
}

/// A write-once entry (an order's entry, an opening record): never merged, never deleted.
fn write_once(doc: &Value) -> bool {
    !matches!(
        doc.get("type").and_then(Value::as_str),
        Some("account" | "transaction") | None
    )
}
