//! `Ledger`: the domain entry point. Orders, accounts, transfers and the sweeper are methods
//! on it (in their own files); it knows money and nothing about HTTP.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::couch::Client;
use crate::design::{self, Installed};
use crate::engine::{
    AccountEngine, BulkWriter, ConflictTally, Entries, Quorum, TxnWriter, WriteQuorum,
};
use crate::error::{Error, Result};
use crate::limits::{HOT_DB_SHARDS, LEASE_MS, REVS_LIMIT, REVS_LIMIT_ONE_COPY};

/// The ledger in one database. Configured once ([`Ledger::builder`]) and cheap to clone: its
/// clones share one worker and its settings; create one and reuse it.
#[derive(Clone, Debug)]
pub struct Ledger {
    pub(crate) inner: Arc<LedgerInner>,
}

#[derive(Debug)]
pub(crate) struct LedgerInner {
    /// The ledger's database: orders (write-once history) and, unless split, everything.
    pub(crate) client: Client,
    /// Where accounts and transfers live: `client` itself, or with
    /// [`LedgerBuilder::hot_database`] a second database that runs no validation.
    pub(crate) hot: Client,
    /// Names this process in transfer claims.
    pub(crate) worker_id: String,
    /// How long this worker's claims last (at most [`LEASE_MS`]).
    pub(crate) lease: Duration,
    /// Group commit of account steps (src/engine/).
    pub(crate) accounts: Arc<AccountEngine>,
    /// Group commit of transfer-document writes.
    pub(crate) txns: Arc<TxnWriter>,
    /// The one `_bulk_docs` queue under both.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) bulk: Arc<BulkWriter>,
    /// Test hook awaited before every protocol write (`LedgerBuilder::pause_hook`, feature
    /// `testing`).
    pub(crate) pause: Option<PauseHook>,
    /// `w` of every ledger write (docs/CLUSTER.md).
    pub(crate) quorum: Arc<Quorum>,
    pub(crate) write_quorum: WriteQuorum,
    /// Conflicts met and resolved by this ledger (engine and sweeper).
    pub(crate) conflicts: Arc<ConflictTally>,
    /// Told how long work advances (see [`LedgerBuilder::progress`]).
    pub(crate) progress: Option<ProgressHook>,
    /// `submit` returns at the decision; settle and `done` follow in the background
    /// ([`LedgerBuilder::background_finish`]).
    pub(crate) background: bool,
    /// The transfers finishing in the background.
    pub(crate) finishing: Finishing,
    /// `submit(…, wait = true)` follows the stepwise protocol (docs/PROTOCOL.md) instead of the one-write
    /// path ([`LedgerBuilder::stepwise_transfers`]).
    pub(crate) stepwise: bool,
    /// Where one-write settles leave settled entries (by default by the
    /// database's copies; tests set it with `LedgerBuilder::one_copy` or `settled_entries`).
    pub(crate) entries: Entries,
    /// [`LedgerBuilder::lookup_first`].
    pub(crate) lookup_first: bool,
}

/// How often [`Ledger::flush`] sends the settles held meanwhile.
const FLUSH_RELEASE_EVERY: Duration = Duration::from_millis(5);

/// Transfers finishing in the background, and a wake-up for [`Ledger::flush`] when none is left.
#[derive(Debug, Default)]
pub(crate) struct Finishing {
    pub(crate) count: std::sync::atomic::AtomicUsize,
    pub(crate) idle: tokio::sync::Notify,
    /// The transfers counted, for a waiter that sends only their held settles (a sweeper
    /// pass); the ledger's own count leaves it empty.
    pub(crate) txns: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Finishing {
    /// Waits until none is left, calling `release` (send the settles held meanwhile) at once
    /// and again every [`FLUSH_RELEASE_EVERY`]: a finish that had not held its settles yet at
    /// the last release would otherwise wait out its whole hold.
    pub(crate) async fn drain(&self, release: impl Fn()) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            release();
            let _ = tokio::time::timeout(FLUSH_RELEASE_EVERY, notified).await;
        }
    }
}

/// Everything a [`Ledger`] is assembled from.
#[derive(Debug)]
struct Settings {
    client: Client,
    hot: Client,
    /// `None`: a fresh one when assembled (another worker).
    worker_id: Option<String>,
    lease: Duration,
    pause: Option<PauseHook>,
    progress: Option<ProgressHook>,
    write_quorum: WriteQuorum,
    background: bool,
    stepwise: bool,
    entries: Entries,
    lookup_first: bool,
}

/// How far a long piece of work has got: a sweep pass driving its candidates, `verify`
/// reading the database's documents. For a progress bar; nothing depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// `"sweep"` (candidate transfers handled) or `"verify"` (documents read).
    pub task: &'static str,
    /// Units done so far.
    pub done: u64,
    /// Units in all, when known.
    pub total: Option<u64>,
}

/// The function told about [`Progress`]: called often, so it must be quick.
pub type ProgressFn = dyn Fn(Progress) + Send + Sync;

/// A [`ProgressFn`] shared by a ledger's clones.
#[derive(Clone)]
pub struct ProgressHook(pub Arc<ProgressFn>);

impl fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressHook")
    }
}

/// Conflicts a [`Ledger`] met on ledger documents and resolved, since it was made
/// ([`Ledger::conflict_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ConflictCounts {
    /// Conflicted documents read (an account merged, a transfer's leaves chosen between).
    pub met: u64,
    /// Of those, resolved: the losing leaves deleted.
    pub resolved: u64,
    /// Writes a cluster only accepted (202), read again before moving on.
    pub uncertain_writes: u64,
}

/// A test hook: awaited with the name of the protocol phase (`begin`, `apply`, `commit`,
/// `settle`, `done`, `canceling`, `undo`, `cancelled`) after the worker checked its lease and
/// right before it writes, so a test can hold a worker in the one window the lease cannot
/// protect.
#[derive(Clone)]
pub struct PauseHook(pub Arc<PauseFn>);

/// The function inside a [`PauseHook`]: phase name in, a future to await out.
pub type PauseFn = dyn Fn(&'static str) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

impl fmt::Debug for PauseHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PauseHook")
    }
}

/// What [`Ledger::init`] did.
#[derive(Debug, Clone, Serialize)]
pub struct InitReport {
    /// The database's name.
    pub database: String,
    /// This call created the database.
    pub created: bool,
    /// Each design document's install outcome.
    pub design_docs: Vec<Installed>,
    /// The database of accounts and transfers, when split ([`LedgerBuilder::hot_database`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot: Option<HotReport>,
    /// The `_revs_limit` of the database of accounts and transfers after this call: lowered to
    /// 20, or to 3 where the server keeps one copy of each document (`REVS_LIMIT` and
    /// `REVS_LIMIT_ONE_COPY` in src/limits.rs say why), when it was higher; left alone when an
    /// admin had set it lower; `None` when the server has no such setting (pouchdb-server).
    pub revs_limit: Option<u32>,
    /// Opening records (docs/DOCUMENTS.md) this call wrote for accounts that had none: those
    /// created before records existed. 0 once every account has its record.
    pub opening_records: u64,
}

/// What [`Ledger::init`] did to the database of accounts and transfers of a split ledger.
#[derive(Debug, Clone, Serialize)]
pub struct HotReport {
    /// The database's name.
    pub database: String,
    /// This call created it.
    pub created: bool,
    /// Its design documents (views only: it runs no validation).
    pub design_docs: Vec<Installed>,
}

impl Settings {
    /// Every setting at its default, on `client`'s database alone.
    fn new(client: Client) -> Settings {
        Settings {
            client: client.clone(),
            hot: client,
            worker_id: None,
            lease: Duration::from_millis(LEASE_MS),
            pause: None,
            progress: None,
            write_quorum: WriteQuorum::default(),
            background: false,
            stepwise: false,
            entries: Entries::default(),
            lookup_first: false,
        }
    }
}

/// Refuses a lease of zero or longer than [`LEASE_MS`].
fn check_lease(lease: Duration) -> Result<()> {
    if lease.is_zero() || lease > Duration::from_millis(LEASE_MS) {
        return Err(Error::invalid(
            "lease",
            format!("must be between 1 ms and {LEASE_MS} ms"),
        ));
    }
    Ok(())
}

/// The client of database `name` beside `client`'s, refused when it is `client`'s own.
fn hot_client(client: &Client, name: &str) -> Result<Client> {
    if name == client.database() {
        return Err(Error::invalid(
            "hot_db",
            "must differ from the ledger's database (it holds what validation guards)",
        ));
    }
    client.with_database(name)
}

/// Builds a [`Ledger`] ([`Ledger::builder`]). Consuming and `#[must_use]`; the first
/// configuration error is kept and reported by [`LedgerBuilder::build`]. A ledger is configured
/// once and its clones share everything; a ledger configured differently is another worker
/// ([`Ledger::to_builder`]).
///
/// ```no_run
/// # fn f(client: couch_ledger::Client) -> couch_ledger::Result<()> {
/// use std::time::Duration;
/// use couch_ledger::Ledger;
///
/// let ledger = Ledger::builder(client)
///     .hot_database("shop_hot")
///     .lease(Duration::from_secs(10))
///     .background_finish(true)
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use]
#[derive(Debug)]
pub struct LedgerBuilder {
    settings: Settings,
    error: Option<Error>,
}

impl LedgerBuilder {
    /// Keeps accounts and transfers in database `name`, a second database that runs no
    /// `validate_doc_update`; orders stay in the ledger's database, validated
    /// (docs/LAYOUT.md) [default: everything in the client's database]. CouchDB runs a
    /// database's validation for every document written, at about a sixth of its plain write
    /// rate (measured on CouchDB 3.4.3, docs/bench/HISTORY.md): a transfer writes about seven
    /// account and transfer documents, so this layout is what lets it go past ~400
    /// transfers/s. What the validation refused there is then left to roles: run
    /// [`Ledger::restrict_to_role`] (it sets both databases) and give that role to the ledger's
    /// own users only. Every process working on one ledger must use the same layout.
    ///
    /// [`LedgerBuilder::build`] fails when `name` is not a valid database name, or is the
    /// ledger's database itself.
    pub fn hot_database(mut self, name: &str) -> Self {
        match hot_client(&self.settings.client, name) {
            Ok(hot) => self.settings.hot = hot,
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// How long this worker's claims on transfers last [default and longest:
    /// [`LEASE_MS`](crate::limits::LEASE_MS)]. Shorter ones let tests and impatient operators
    /// see an abandoned transfer taken over sooner.
    ///
    /// [`LedgerBuilder::build`] fails when `lease` is zero or longer than
    /// [`LEASE_MS`](crate::limits::LEASE_MS) (the settled-marker retention is sized against
    /// that bound).
    pub fn lease(mut self, lease: Duration) -> Self {
        if let Err(e) = check_lease(lease) {
            self.error.get_or_insert(e);
        }
        self.settings.lease = lease;
        self
    }

    /// How many copies an account write must reach [default: [`WriteQuorum::All`]: on a
    /// cluster every ledger write must reach every copy before it counts; see
    /// docs/CLUSTER.md]. No difference on a single node.
    pub fn write_quorum(mut self, write_quorum: WriteQuorum) -> Self {
        self.settings.write_quorum = write_quorum;
        self
    }

    /// Whether transfers finish in the background [default: no]: `submit(…, wait = true)`
    /// returns as soon as its transfer is decided — on the one-write path (the default) `done`
    /// or `cancelled`, the decision written and both balances carrying it; on the stepwise
    /// protocol `committed` — and what is left follows in this process: the settles of the
    /// accounts' markers, folded into the accounts' next writes (held at most
    /// [`SETTLE_HOLD_MS`](crate::limits::SETTLE_HOLD_MS)), and on the stepwise protocol `done`.
    /// Fewer requests and documents per transfer under load (BENCHMARKS.md, `p8`), for the
    /// price of a destination's credit that stays unavailable (docs/PROTOCOL.md: `available`) a
    /// little longer in other processes.
    ///
    /// Nothing is lost if the process stops before they finish: the transfer is decided, and
    /// the sweeper settles its markers like any transfer whose worker crashed after its
    /// decision. Call [`Ledger::flush`] before a clean stop (or before reading the ledger as a
    /// whole, e.g. [`Ledger::verify`]) to let them finish here. A long-running process (the
    /// service) is the natural user; a command that exits after one transfer is not.
    pub fn background_finish(mut self, background: bool) -> Self {
        self.settings.background = background;
        self
    }

    /// Whether a transfer's document is read before it is applied (`submit(…, wait = true)`
    /// on the one-write path) [default: no]: a re-sent id is answered from its document — the
    /// transfer as it is, or the mismatch of its terms — with nothing written. Without it an
    /// id is found taken only at the decision, after both accounts took a marker, which is
    /// then undone (money unchanged, two writes per account); a ledger remembers the transfers
    /// it ended itself (the most recent ones, up to a bound) and answers those from their
    /// document either way. Costs one request a transfer: for a process making one transfer
    /// (the command line), not for a busy one.
    pub fn lookup_first(mut self, lookup_first: bool) -> Self {
        self.settings.lookup_first = lookup_first;
        self
    }

    /// Whether transfers are made by the stepwise protocol (docs/PROTOCOL.md) [default: no]:
    /// `submit(…, wait = true)` creates the transfer `pending` under a claim, applies both
    /// accounts, writes `committed`, settles both and writes `done` — every step its own write,
    /// each state visible in the `transactions/*` views while it lasts (money in flight in
    /// `transactions/pending`).
    ///
    /// By default a transfer takes the one-write path instead (docs/ONE_WRITE.md): both
    /// accounts applied with markers, then the transfer's document created once in its final
    /// state — three documents and two requests before the answer where this takes seven and
    /// four (BENCHMARKS.md). Both make the same ledger; every process of one ledger may use
    /// either. Reversals, [`Ledger::cancel`] of a pending transfer and the sweeper's drive of a
    /// transfer left `pending`, `committed` or `canceling` are stepwise whatever this says.
    pub fn stepwise_transfers(mut self, stepwise: bool) -> Self {
        self.settings.stepwise = stepwise;
        self
    }

    /// Tells `hook` how long work advances ([`Progress`]): a sweep pass
    /// ([`Ledger::sweep_once`]) and [`Ledger::verify`] [default: no hook].
    pub fn progress(mut self, hook: ProgressHook) -> Self {
        self.settings.progress = Some(hook);
        self
    }

    /// Test support: a hook awaited before every protocol write ([`PauseHook`]).
    #[cfg(feature = "testing")]
    pub fn pause_hook(mut self, hook: PauseHook) -> Self {
        self.settings.pause = Some(hook);
        self
    }

    /// Test support: the worker id the ledger writes into its claims, instead of a fresh one:
    /// two ledgers configured differently acting as one worker, a transfer claimed by either
    /// taken as its own by both. Two processes sharing an id would break the claims' exclusion:
    /// tests only.
    #[cfg(feature = "testing")]
    pub fn worker_id(mut self, worker_id: impl Into<String>) -> Self {
        self.settings.worker_id = Some(worker_id.into());
        self
    }

    /// Test support: acts as on a database that keeps one copy of each document (CouchDB's
    /// single node, `cluster.n` = 1) whatever the server says: a one-write transfer's settles
    /// and undos leave no settled entry, and an account conflict is reported, never merged
    /// (docs/ONE_WRITE.md). What every ledger does on such a database; on a server that keeps
    /// several copies this is wrong (a cluster's own writes can make conflicts, and their merge
    /// needs the entries): tests only.
    #[cfg(feature = "testing")]
    pub fn one_copy(mut self) -> Self {
        self.settings.entries = Entries::Never;
        self
    }

    /// Test support: acts as on a database that keeps several copies of each document whatever
    /// the server says: it keeps settled entries of one-write transfers, merges account
    /// conflicts, and its sweeper reads every candidate again by id — also where the database
    /// keeps one copy, where the ledger does none of these by default (docs/ONE_WRITE.md). For
    /// tests that plant a cluster's conflicts (`new_edits=false`) on a single node, to test the
    /// merge a cluster needs. Every process writing the database must do the same, or the
    /// entries the merge relies on are missing: tests only.
    #[cfg(feature = "testing")]
    pub fn settled_entries(mut self) -> Self {
        self.settings.entries = Entries::Always;
        self
    }

    /// The ledger, a worker of its own (a fresh worker id, its own account engine).
    ///
    /// # Errors
    ///
    /// The first setting refused: a hot database that is not a valid database name or is the
    /// ledger's own ([`LedgerBuilder::hot_database`]), a lease out of bounds
    /// ([`LedgerBuilder::lease`]).
    pub fn build(self) -> Result<Ledger> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(Ledger::assemble(self.settings)),
        }
    }
}

impl Ledger {
    /// A ledger on the client's database with every setting at its default:
    /// `Ledger::builder(client).build()`, which cannot fail.
    pub fn new(client: Client) -> Ledger {
        Ledger::assemble(Settings::new(client))
    }

    /// A builder of a ledger on the client's database: its second database, lease, write
    /// quorum, how it makes and answers transfers, and the progress hook, each at its default
    /// until set.
    pub fn builder(client: Client) -> LedgerBuilder {
        LedgerBuilder {
            settings: Settings::new(client),
            error: None,
        }
    }

    /// A builder holding this ledger's settings — its databases, lease, write quorum and ways
    /// of making transfers, not its hooks — for another worker on the same ledger configured
    /// differently (what it builds is, like [`Ledger::another_worker`], a worker of its own).
    pub fn to_builder(&self) -> LedgerBuilder {
        LedgerBuilder {
            settings: Settings {
                worker_id: None,
                pause: None,
                progress: None,
                ..self.settings()
            },
            error: None,
        }
    }

    fn assemble(settings: Settings) -> Ledger {
        let Settings {
            client,
            hot,
            worker_id,
            lease,
            pause,
            progress,
            write_quorum,
            background,
            stepwise,
            entries,
            lookup_first,
        } = settings;
        let worker_id = worker_id.unwrap_or_else(crate::clock::uuid_v7);
        let quorum = Arc::new(Quorum::new(write_quorum, entries));
        let conflicts = Arc::new(ConflictTally::default());
        let bulk = Arc::new(BulkWriter::new(hot.clone()));
        let accounts = Arc::new(AccountEngine::new(
            Arc::clone(&bulk),
            Arc::clone(&quorum),
            Arc::clone(&conflicts),
        ));
        Ledger {
            inner: Arc::new(LedgerInner {
                txns: Arc::new(TxnWriter::new(Arc::clone(&accounts))),
                accounts,
                bulk,
                client,
                hot,
                worker_id,
                lease,
                pause,
                quorum,
                write_quorum,
                conflicts,
                progress,
                background,
                finishing: Finishing::default(),
                stepwise,
                entries,
                lookup_first,
            }),
        }
    }

    /// What this ledger was assembled from, its worker id and hooks included.
    fn settings(&self) -> Settings {
        let i = &self.inner;
        Settings {
            client: i.client.clone(),
            hot: i.hot.clone(),
            worker_id: Some(i.worker_id.clone()),
            lease: i.lease,
            pause: i.pause.clone(),
            progress: i.progress.clone(),
            write_quorum: i.write_quorum,
            background: i.background,
            stepwise: i.stepwise,
            entries: i.entries,
            lookup_first: i.lookup_first,
        }
    }

    /// The same ledger (the same worker) with another write quorum
    /// ([`LedgerBuilder::write_quorum`]). Clones made earlier keep theirs.
    #[deprecated(note = "configure once: Ledger::builder(client)….build()")]
    pub fn with_write_quorum(self, write_quorum: WriteQuorum) -> Ledger {
        Ledger::assemble(Settings {
            write_quorum,
            ..self.settings()
        })
    }

    /// The same ledger (the same worker) finishing transfers in the background
    /// ([`LedgerBuilder::background_finish`]). Clones made earlier keep theirs.
    #[deprecated(note = "configure once: Ledger::builder(client)….build()")]
    pub fn with_background_finish(self) -> Ledger {
        Ledger::assemble(Settings {
            background: true,
            ..self.settings()
        })
    }

    /// The same ledger (the same worker) reading a transfer's document before applying it
    /// ([`LedgerBuilder::lookup_first`]). Clones made earlier keep theirs.
    #[deprecated(note = "configure once: Ledger::builder(client)….build()")]
    pub fn with_lookup_first(self) -> Ledger {
        Ledger::assemble(Settings {
            lookup_first: true,
            ..self.settings()
        })
    }

    /// The same ledger (the same worker) making transfers by the stepwise protocol
    /// ([`LedgerBuilder::stepwise_transfers`]). Clones made earlier keep theirs.
    #[deprecated(note = "configure once: Ledger::builder(client)….build()")]
    pub fn with_stepwise_transfers(self) -> Ledger {
        Ledger::assemble(Settings {
            stepwise: true,
            ..self.settings()
        })
    }

    /// Waits until every transfer this ledger (or a clone of it) is finishing in the background
    /// ([`LedgerBuilder::background_finish`]) has ended, settles held for folding going out now.
    /// Returns at once when there are none. Transfers submitted while it waits are waited for
    /// too, so stop submitting first (or bound it with a timeout, as `serve` does at a stop). A
    /// finish that failed (logged) leaves its transfer `committed` for the sweeper: `flush`
    /// returning does not mean every transfer is `done`. Covers this ledger and its clones, not
    /// other workers built from its settings ([`Ledger::to_builder`], [`Ledger::another_worker`]).
    pub async fn flush(&self) {
        self.inner
            .finishing
            .drain(|| self.inner.accounts.release_held())
            .await;
    }

    /// `submit` answers at the decision and finishes in the background
    /// ([`LedgerBuilder::background_finish`]).
    pub fn finishes_in_background(&self) -> bool {
        self.inner.background
    }

    /// Transfers finishing in the background right now ([`LedgerBuilder::background_finish`]).
    pub fn finishing(&self) -> usize {
        self.inner
            .finishing
            .count
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The same ledger (the same worker) with its accounts and transfers in database `name`
    /// ([`LedgerBuilder::hot_database`]). Clones made earlier keep theirs.
    ///
    /// # Errors
    ///
    /// `name` is not a valid database name, or is the ledger's database itself.
    #[deprecated(note = "configure once: Ledger::builder(client)….build()")]
    pub fn with_hot_database(self, name: &str) -> Result<Ledger> {
        let hot = hot_client(&self.inner.client, name)?;
        Ok(Ledger::assemble(Settings {
            hot,
            ..self.settings()
        }))
    }

    /// Another worker on the same ledger: the same databases, lease and settings, a worker id
    /// and account engine of its own (as if another process had opened the ledger). The test
    /// and progress hooks are not carried over. [`Ledger::to_builder`] makes one configured
    /// differently.
    pub fn another_worker(&self) -> Ledger {
        Ledger::assemble(self.to_builder().settings)
    }

    /// The database of accounts and transfers, when it is not the ledger's database
    /// ([`LedgerBuilder::hot_database`]).
    pub fn hot_database(&self) -> Option<&str> {
        self.is_split().then(|| self.inner.hot.database())
    }

    /// The client of the database that holds accounts and transfers: [`Ledger::client`]'s
    /// unless the ledger is split ([`LedgerBuilder::hot_database`]).
    pub fn hot_client(&self) -> &Client {
        &self.inner.hot
    }

    /// Design documents missing or differing from this version's, in every database of the
    /// ledger: `(id, what is wrong)`, the id prefixed with the database when split.
    ///
    /// # Errors
    ///
    /// The server failed.
    pub async fn design_drift(&self) -> Result<Vec<(String, String)>> {
        let mut out = design::drift(&self.inner.client).await?;
        if self.is_split() {
            let hot = &self.inner.hot;
            for (id, what) in design::drift_in(hot, design::Scope::Hot).await? {
                out.push((
                    format!("{}/{id}", hot.database()),
                    format!("{}: {what}", hot.database()),
                ));
            }
        }
        Ok(out)
    }

    /// Accounts and transfers live in a database of their own.
    pub(crate) fn is_split(&self) -> bool {
        self.inner.hot.database() != self.inner.client.database()
    }

    /// The ledger's databases: the ledger's own, then the hot one if split.
    pub(crate) fn databases(&self) -> Vec<&Client> {
        if self.is_split() {
            vec![&self.inner.client, &self.inner.hot]
        } else {
            vec![&self.inner.client]
        }
    }

    /// Conflicts on ledger documents this ledger met and resolved so far, and the writes a
    /// cluster only accepted (202).
    pub fn conflict_counts(&self) -> ConflictCounts {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.inner.conflicts;
        ConflictCounts {
            met: c.met.load(Relaxed),
            resolved: c.resolved.load(Relaxed),
            uncertain_writes: c.uncertain.load(Relaxed),
        }
    }

    /// The same ledger (the same worker) with claims that last `lease`
    /// ([`LedgerBuilder::lease`]). Clones made earlier keep the old lease.
    ///
    /// # Errors
    ///
    /// `lease` is zero or longer than [`LEASE_MS`](crate::limits::LEASE_MS).
    #[deprecated(note = "configure once: Ledger::builder(client)….build()")]
    pub fn with_lease(self, lease: Duration) -> Result<Ledger> {
        check_lease(lease)?;
        Ok(Ledger::assemble(Settings {
            lease,
            ..self.settings()
        }))
    }

    /// The same ledger (the same worker) telling `hook` how long work advances
    /// ([`LedgerBuilder::progress`]). Clones made earlier do not tell it.
    #[deprecated(note = "configure once: Ledger::builder(client)….build()")]
    pub fn with_progress(self, hook: ProgressHook) -> Ledger {
        Ledger::assemble(Settings {
            progress: Some(hook),
            ..self.settings()
        })
    }

    /// Tells the progress hook, if any.
    pub(crate) fn report_progress(&self, task: &'static str, done: u64, total: Option<u64>) {
        if let Some(hook) = &self.inner.progress {
            (hook.0)(Progress { task, done, total });
        }
    }

    /// Test support: rounds run by the account-op engine and the transfer writer so far (how
    /// well concurrent work was grouped into requests).
    #[cfg(feature = "testing")]
    pub fn engine_rounds(&self) -> (u64, u64) {
        (self.inner.accounts.rounds(), self.inner.txns.rounds())
    }

    /// Test support: `_bulk_docs` requests the account engine and the transfer writer sent
    /// together, and how many of them carried both's documents.
    #[cfg(feature = "testing")]
    pub fn bulk_requests(&self) -> (u64, u64) {
        self.inner.bulk.stats()
    }

    /// Test support: settles held back by a background finish that went out with another
    /// write of their account (no document of their own).
    #[cfg(feature = "testing")]
    pub fn settles_folded(&self) -> u64 {
        self.inner.accounts.folded()
    }

    /// Test support: reads of transfers the account engine made to prune settled entries
    /// (none for transfers this ledger ended itself).
    #[cfg(feature = "testing")]
    pub fn prune_reads(&self) -> u64 {
        self.inner.accounts.prune_reads()
    }

    /// Test support: account writes this ledger's engine saw only accepted (202), or in
    /// conflict, so far; each holds that account's pruning back for
    /// [`PRUNE_CONFIRMED_MS`](crate::limits::PRUNE_CONFIRMED_MS) (docs/CLUSTER.md).
    #[cfg(feature = "testing")]
    pub fn unconfirmed_account_writes(&self) -> u64 {
        self.inner.accounts.unconfirmed()
    }

    /// How long this worker's claims on transfers last.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The CouchDB client underneath.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// This process's worker id (written into the claims of transfers it drives).
    pub fn worker_id(&self) -> &str {
        &self.inner.worker_id
    }

    /// Sets the database's `_security` so that only users with `role` (and admins) can read
    /// and write it, keeping the admins and member names already there. With the ledger's users
    /// members rather than admins, the validation guards every write they make, and what it
    /// cannot guard — deleting `_design/validation`, `_purge`, `_security` itself — is left to
    /// admins (docs/SECURITY.md). A split ledger ([`LedgerBuilder::hot_database`]) gets the same
    /// on both databases: in the hot one, which runs no validation, the role is the only guard.
    /// Returns the `_security` object written to the ledger's database.
    ///
    /// # Errors
    ///
    /// `role` is empty or starts with `_` (CouchDB reserves those); the server refused (an
    /// admin is needed) or failed.
    pub async fn restrict_to_role(&self, role: &str) -> Result<serde_json::Value> {
        if role.is_empty() || role.starts_with('_') || role.chars().any(char::is_whitespace) {
            return Err(Error::invalid(
                "role",
                format!("{role:?} is not a role name (non-empty, no spaces, not starting with _)"),
            ));
        }
        let mut written = serde_json::Value::Null;
        for client in self.databases() {
            let mut security = client.security().await?;
            if !security.is_object() {
                security = serde_json::json!({});
            }
            for part in ["admins", "members"] {
                if !security[part].is_object() {
                    security[part] = serde_json::json!({"names": [], "roles": []});
                }
            }
            security["members"]["roles"] = serde_json::json!([role]);
            client.set_security(&security).await?;
            if written.is_null() {
                written = security;
            }
        }
        Ok(written)
    }

    /// Creates the database if needed and installs the design documents, writing only those
    /// that changed; then writes the opening record of every account that has none (accounts
    /// created before records existed: `verify` fails on those until then). Safe to run any
    /// number of times, from several processes at once.
    ///
    /// # Errors
    ///
    /// The server refused (both steps need admin rights on CouchDB) or failed.
    pub async fn init(&self) -> Result<InitReport> {
        // The database of accounts and transfers gets HOT_DB_SHARDS shards (CouchDB's `q`):
        // their writes touch accounts at random, and more shards take them faster
        // (limits::HOT_DB_SHARDS). The history alone keeps the server's default.
        let shards = |hot: bool| hot.then_some(HOT_DB_SHARDS);
        let created = self
            .inner
            .client
            .ensure_database_with(shards(!self.is_split()))
            .await?;
        let design_docs = design::install(&self.inner.client).await?;
        let hot = if self.is_split() {
            let hot = &self.inner.hot;
            let created = hot.ensure_database_with(shards(true)).await?;
            let design_docs = design::install_in(hot, design::Scope::Hot).await?;
            Some(HotReport {
                database: hot.database().to_owned(),
                created,
                design_docs,
            })
        } else {
            None
        };
        let revs_limit = tune_revs_limit(&self.inner.hot).await?;
        // Learn the database's copies now (the `w` of ledger writes on a cluster), not in the
        // first transfer.
        self.inner.quorum.write_options(&self.inner.hot, true).await;
        // After the validation is installed, which guards the records from then on.
        let opening_records = self.opening_records_once_views_answer().await?;
        Ok(InitReport {
            database: self.inner.client.database().to_owned(),
            created,
            design_docs,
            hot,
            revs_limit,
            opening_records,
        })
    }
}

/// Sets the database's `_revs_limit` for the copies it keeps ([`revs_limit_for`]): lowers a
/// higher limit, never raises a lower one, except [`REVS_LIMIT_ONE_COPY`] on a database that
/// now keeps several copies (it was set for one copy; a copy that falls behind by more writes
/// than the limit meets the rest as a conflict). `None` on a server without `_revs_limit`.
async fn tune_revs_limit(client: &Client) -> Result<Option<u32>> {
    let Some(current) = client.revs_limit().await? else {
        return Ok(None);
    };
    let target = revs_limit_for(client.stated_copies().await?);
    let raise_ours = current == REVS_LIMIT_ONE_COPY && target > current;
    if current > target || raise_ours {
        client.set_revs_limit(target).await?;
        return Ok(Some(target));
    }
    Ok(Some(current))
}

/// How long `init` waits for the design documents it just installed to answer through the
/// server it talks to: a balancer may pass the view query to a node that has not received them
/// yet (a set of replicating servers; a cluster answers at once).
const INSTALLED_VIEWS_WAIT: Duration = Duration::from_secs(60);

impl Ledger {
    /// [`Ledger::write_missing_opening_records`], asked again while the view it reads answers
    /// 404 (its design document not on that node yet), for at most [`INSTALLED_VIEWS_WAIT`].
    async fn opening_records_once_views_answer(&self) -> Result<u64> {
        let deadline = tokio::time::Instant::now() + INSTALLED_VIEWS_WAIT;
        loop {
            match self.write_missing_opening_records().await {
                Err(e)
                    if e.is_not_found()
                        && !e.is_missing_database()
                        && tokio::time::Instant::now() < deadline =>
                {
                    tracing::info!("the installed views do not answer yet ({e}); asking again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                other => return other,
            }
        }
    }
}

/// [`REVS_LIMIT_ONE_COPY`] where the server says it keeps one copy of each document, else
/// [`REVS_LIMIT`].
fn revs_limit_for(copies: Option<u32>) -> u32 {
    if copies == Some(1) {
        REVS_LIMIT_ONE_COPY
    } else {
        REVS_LIMIT
    }
}

#[cfg(test)]
mod tests;
