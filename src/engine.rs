//! Group commit: the in-process engine that applies account steps and writes transfer documents
//! for every transfer this process drives, batching concurrent ones into few requests.
//!
//! CouchDB makes one document's write atomic and nothing more, and a hot account is one
//! document: one CAS per transfer step on it means a queue of 409s (SERVERS.md: 10 updates/s
//! from 16 clients on pouchdb-server). So callers do not write accounts themselves. They enqueue
//! ops — "apply this delta for txn T on account A", "settle T on A", "undo T on A" — and await
//! their answer. One driver task at a time takes everything queued and, per round:
//!
//! 1. reads the accounts it holds no copy of with one `_all_docs?include_docs` request (it keeps
//!    the last doc + `_rev` it read or wrote: a stale copy only costs a 409 and a re-read);
//! 2. applies all ops in memory, in queue order — the idempotency rules of docs/PROTOCOL.md live in
//!    [`evaluate`];
//! 3. writes every changed account in one `_bulk_docs`, each with its `_rev` (a CAS, so the
//!    request is safe to repeat); a per-document conflict re-reads that account and re-runs its
//!    ops, at most [`ACCOUNT_CAS_ATTEMPTS_MAX`] times.
//!
//! An op is answered only once its outcome is certain: after the write that carries it landed,
//! or — when it changes nothing (skipped, insufficient funds) — once it was decided on a copy
//! read in this round, never on a cached copy that may be stale.
//!
//! Transfer documents go through the same kind of queue ([`TxnWriter`]): concurrent CAS writes
//! of different transfers share one `_bulk_docs`. Below both, a [`BulkWriter`] sends what the two
//! hand over while its previous request is in flight as one `_bulk_docs` (they write the same
//! database): on pouchdb-server a request costs as much as some 30–40 small documents.
//!
//! While a round's requests are in flight, new ops queue up; the next round takes them all.
//! So one caller alone pays no waiting, and 64 concurrent callers share about one request per
//! phase.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub(crate) use crate::clock::now_ms;
use crate::clock::Instant;

use serde_json::Value;
use tokio::sync::oneshot;

use crate::account_doc::{
    account_doc_id, marker_bytes, pending_bytes, AccountDoc, Attempt, Marker, Settled,
};
use crate::conflict::{facts_needed, merge_account, TxnFacts};
use crate::couch::{take_conflicts, BulkResult, Client, RawDoc, WriteOptions};
use crate::error::{Error, Result};
use crate::limits::{
    ACCOUNT_BATCH_OPS_MAX, ACCOUNT_CACHE_MAX, ACCOUNT_CAS_ATTEMPTS_MAX, BULK_BYTES_MAX,
    CLOCK_SKEW_MAX_MS, COPIES_RECHECK_MS, ENDED_KNOWN_MAX, ENGINE_ROUNDS_MAX, GATHER_YIELDS_MAX,
    ID_CHARS_MAX, MARKERS_BYTES_MAX, MARKERS_UNDO_SLACK_BYTES, MARKER_OVERHEAD_BYTES,
    PRUNE_CONFIRMED_MS, READ_BATCH_KEYS_MAX, SETTLED_AGE_MIN_MS, SETTLED_PRUNE_BATCH_MIN,
    TXN_BATCH_DOCS_MAX,
};
use crate::money::Amount;

/// A copy of an error for each of several waiters ([`Error::duplicate`]).
pub(crate) fn duplicate(e: &Error) -> Error {
    e.duplicate()
}

/// A per-document failure in a `_bulk_docs` reply, as the error a single write would have had.
fn bulk_error(id: &str, r: &BulkResult) -> Error {
    let status = match r.error.as_deref() {
        Some("conflict") => Some(409),
        Some("forbidden") => Some(403),
        Some("unauthorized") => Some(401),
        _ => None,
    };
    match status {
        Some(s) => {
            Error::status(s, r.error.clone(), r.reason.clone()).with_request("POST", "_bulk_docs")
        }
        None => Error::decode(format!(
            "_bulk_docs answered {:?} ({:?}) for {id}",
            r.error, r.reason
        )),
    }
}

/// An account whose markers reached [`MARKERS_BYTES_MAX`] refuses new applies until pruning
/// made room: 429, transient (the transfer is retried, by its worker or the sweeper).
fn account_full(account: &str, bytes: usize) -> Error {
    Error::status(
        429,
        Some("account_full".to_owned()),
        Some(format!(
            "account {account} holds {bytes} bytes of transfer markers, the most it may \
             ({MARKERS_BYTES_MAX}); retry once its settled transfers are done and pruned"
        )),
    )
}

/// A `_bulk_docs` reply keyed by document id. Never by position: pouchdb-server, with a
/// `validate_doc_update` installed, answers refusals first and the rest in the order their
/// validations finished (pouchdb-bulkdocs-wrapper). Every batch holds each id at most once.
fn results_by_id(results: Vec<BulkResult>) -> HashMap<String, BulkResult> {
    results
        .into_iter()
        .filter_map(|r| r.id.clone().map(|id| (id, r)))
        .collect()
}

// ---- cluster: write quorum and conflict counts -----------------------------------------------

/// How many copies an **account** write must reach before the server may answer 201
/// (docs/CLUSTER.md). Transfer documents are always written with `w` = every copy: their fork
/// decisions (commit or cancel) must be exclusive whatever this says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WriteQuorum {
    /// `w` = every copy (`cluster.n` of the database; nothing is sent on a single node): a 201
    /// is then exclusive, so no rival revision of the same parent can exist or appear, and two
    /// debits cannot both pass their funds check on one balance. With a copy down every write
    /// answers 202 and is re-read before the protocol moves on.
    #[default]
    All,
    /// The server's default (`w` = 2 of 3 on CouchDB and Cloudant) for account writes: faster
    /// with a slow copy; a rival write through another node may then land too, and the
    /// conflict is merged (each transfer counted once). An overdraft such a merge causes is
    /// taken back from the debit whose worker has not committed yet, and reported by `verify`
    /// and `status` while it lasts.
    ///
    /// Exercised in every CI run by `r1_trio` (three replicating servers, conflicts merged),
    /// where it once showed two defects, both fixed and tested (docs/CLUSTER.md, "What the
    /// tests show"); never tried on a real cluster here. Prefer [`WriteQuorum::All`] unless a
    /// slow copy makes it too slow.
    ServerDefault,
}

/// Where a one-write transfer's settles and undos leave a settled entry on its accounts
/// (docs/ONE_WRITE.md, "Settled entries").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))] // two ways are tests' settings
pub(crate) enum Entries {
    /// Where the database keeps several copies of each document, or does not say; none where it
    /// states one copy (`cluster.n` = 1, CouchDB's single node).
    #[default]
    ByCopies,
    /// Everywhere, and the rest as on several copies too (`Ledger::with_settled_entries`: tests
    /// that plant a cluster's conflicts on a single node).
    Always,
    /// Nowhere, whatever the server says (`Ledger::with_one_copy`: tests on a server that does
    /// not say).
    Never,
}

/// The write options of every ledger write, and whether settled entries are kept, learned once
/// from the database.
#[derive(Debug)]
pub(crate) struct Quorum {
    mode: WriteQuorum,
    /// `cluster.n` as the server states it (`None`: it does not say), and when it was read.
    stated: Mutex<Option<(Instant, Option<u32>)>>,
    entries: Entries,
}

impl Quorum {
    pub(crate) fn new(mode: WriteQuorum, entries: Entries) -> Quorum {
        Quorum {
            mode,
            stated: Mutex::new(None),
            entries,
        }
    }

    /// `cluster.n` as the server states it, read again every [`COPIES_RECHECK_MS`] (a database
    /// moved from one node to a cluster: this process keeps settled entries, and `w`, within
    /// that much of the move); `Err` while the database cannot be read.
    async fn stated(&self, client: &Client) -> Result<Option<u32>> {
        let fresh = |at: &Instant| at.elapsed() < Duration::from_millis(COPIES_RECHECK_MS);
        if let Some((at, n)) = *self.stated.lock().unwrap_or_else(|e| e.into_inner()) {
            if fresh(&at) {
                return Ok(n);
            }
        }
        let n = client.stated_copies().await?;
        *self.stated.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), n));
        Ok(n)
    }

    /// Whether one-write settles and undos leave settled entries, which merging an account's
    /// branches needs: `Some(true)` where the database keeps several copies or does not say
    /// (a cluster, Cloudant, pouchdb-server), `Some(false)` where it states one copy. No branch
    /// of an account can come from the ledger's own writes there (every write is an exclusive
    /// compare-and-swap), so the entries would only cost: ~18 % of `p8` on CouchDB 3.4.3
    /// (docs/bench/HISTORY.md). An account conflict that reaches such a database anyway (an
    /// admin's replication into it, history forged with `new_edits=false`) is reported, never
    /// merged (`AccountEngine::merge`). `None`: the database could not be read now.
    pub(crate) async fn keeps_entries(&self, client: &Client) -> Option<bool> {
        match self.entries {
            Entries::Always => Some(true),
            Entries::Never => Some(false),
            Entries::ByCopies => match self.stated(client).await {
                Ok(n) => Some(n != Some(1)),
                Err(e) => {
                    tracing::debug!("could not read the database's copies: {e}");
                    None
                }
            },
        }
    }

    /// Whether the database states one copy of each document (`cluster.n` = 1, a single node):
    /// a document read by id there, from a view row too (`include_docs`), is the only copy
    /// there is, read then. `None`: the database could not be read now.
    pub(crate) async fn one_copy(&self, client: &Client) -> Option<bool> {
        match self.entries {
            // The test knobs: as on one copy, or as on several, whatever the server says.
            Entries::Never => return Some(true),
            Entries::Always => return Some(false),
            Entries::ByCopies => {}
        }
        match self.stated(client).await {
            Ok(n) => Some(n == Some(1)),
            Err(e) => {
                tracing::debug!("could not read the database's copies: {e}");
                None
            }
        }
    }

    /// Whether a 201 to an account write means every copy took it: the database keeps one copy
    /// (or does not say: one server), or account writes go with `w` = n. `false` while the
    /// database cannot be read.
    pub(crate) async fn acks_every_copy(&self, client: &Client) -> bool {
        match self.stated(client).await {
            Ok(Some(n)) if n > 1 => self.mode == WriteQuorum::All,
            Ok(_) => true,
            Err(_) => false,
        }
    }

    /// Forgets the copies read, as [`COPIES_RECHECK_MS`] passing does.
    #[cfg(test)]
    fn expire(&self) {
        *self.stated.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `w` = the database's copies when there are several and the write must be exclusive (a
    /// transfer document always, an account under [`WriteQuorum::All`]); nothing otherwise, or
    /// while the database cannot be read (the server's default applies).
    pub(crate) async fn write_options(&self, client: &Client, transfer: bool) -> WriteOptions {
        if !transfer && self.mode == WriteQuorum::ServerDefault {
            return WriteOptions::default();
        }
        match self.stated(client).await {
            Ok(Some(n)) if n > 1 => WriteOptions { w: Some(n) },
            Ok(_) => WriteOptions::default(),
            Err(e) => {
                tracing::debug!("could not read the database's copies: {e}");
                WriteOptions::default()
            }
        }
    }
}

/// Conflicts this process met and resolved, and writes a cluster only accepted (202).
#[derive(Debug, Default)]
pub(crate) struct ConflictTally {
    pub(crate) met: AtomicU64,
    pub(crate) resolved: AtomicU64,
    pub(crate) uncertain: AtomicU64,
}

// ---- a queue with at most one driver ---------------------------------------------------------

struct Queue<T> {
    state: Mutex<QueueState<T>>,
}

struct QueueState<T> {
    items: VecDeque<T>,
    /// A driver task is running (or about to): pushers must not start another.
    driving: bool,
}

impl<T> Queue<T> {
    fn new() -> Queue<T> {
        Queue {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                driving: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        // A panic elsewhere while holding this short lock leaves plain data behind: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends; `true` when the caller must start the driver.
    fn push(&self, items: impl IntoIterator<Item = T>) -> bool {
        let mut s = self.lock();
        s.items.extend(items);
        !std::mem::replace(&mut s.driving, true)
    }

    /// Marks the queue driven when it was not: `true` when the caller must start the driver
    /// (after a [`Queue::push_front`]; from the driver itself, as `Pair::answer` calls it, it
    /// is always `false`: the guard for a call from anywhere else).
    fn start_if_idle(&self) -> bool {
        let mut s = self.lock();
        !std::mem::replace(&mut s.driving, true)
    }

    /// Puts items back at the head, in order (deferred to the next round).
    fn push_front(&self, items: Vec<T>) {
        let mut s = self.lock();
        for item in items.into_iter().rev() {
            s.items.push_front(item);
        }
    }

    fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Lets the tasks woken by the last answers run before a batch is taken, so that their next
    /// steps join it instead of waiting a whole request for the one after: yields to the runtime
    /// until the queue stops growing for two turns, at most [`GATHER_YIELDS_MAX`] times (no
    /// timer: a few microseconds when nothing more comes).
    async fn gather(&self) {
        let mut last = self.len();
        let mut stable = 0;
        for _ in 0..GATHER_YIELDS_MAX {
            tokio::task::yield_now().await;
            let n = self.len();
            if n == last {
                stable += 1;
                if stable >= 2 {
                    return;
                }
            } else {
                stable = 0;
                last = n;
            }
        }
    }

    /// Takes up to `max` items. An empty answer also ends the driver's turn, atomically with
    /// the emptiness check, so a concurrent push either lands in this driver's next round or
    /// starts a new driver.
    fn take(&self, max: usize) -> Vec<T> {
        let mut s = self.lock();
        let n = s.items.len().min(max);
        let batch: Vec<T> = s.items.drain(..n).collect();
        if batch.is_empty() {
            s.driving = false;
        }
        batch
    }
}

/// Ends a driver's turn if it stops abnormally (a panic): the waiting callers get an error
/// instead of hanging, and the next push starts a new driver.
struct DriverGuard<'a, T> {
    queue: &'a Queue<T>,
    armed: bool,
}

impl<T> Drop for DriverGuard<'_, T> {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.queue.lock();
            s.items.clear();
            s.driving = false;
        }
    }
}

// ---- account ops -----------------------------------------------------------------------------

/// What to do to one account for one transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// Add `delta` to the balance and a pending marker (docs/PROTOCOL.md, steps 3 and 4).
    Apply {
        delta: Amount,
        /// The transfer's currency; the account's must be the same.
        currency: String,
        /// A debit: refuse when `available + delta < min_balance`.
        check_funds: bool,
        /// The worker's monotonic deadline: an attempt that decides after it refuses the apply
        /// ([`OpResult::NotApplied`]) and writes nothing. Checked at every attempt of a round, after
        /// the accounts were read, so a decision always rests on a state read before it.
        deadline: Option<Instant>,
        /// The one-write path (docs/ONE_WRITE.md): the marker carries this attempt and `peer`,
        /// and a pending marker of the transfer already there is adopted
        /// ([`OpResult::Adopted`]) or found to hold other terms ([`OpResult::Mismatch`]).
        /// `None`: the stepwise protocol.
        attempt: Option<Attempt>,
        /// The transfer's other account (the one-write path).
        peer: Option<String>,
        /// The transfer's document exists with these terms (always on the stepwise protocol;
        /// on the one-write path when deciding a transfer left `initial`). A pending marker of
        /// it with other terms is then a one-write attempt under the same id that no decision
        /// can ever name: it is undone before this apply (docs/ONE_WRITE.md).
        exists: bool,
    },
    /// Move the marker from pending to settled (step 6). Only a marker of the transfer's terms
    /// (`delta`, its document's change to this account) is settled; with `named` (the one-write
    /// path) only the marker of that attempt. Any other pending marker of the transfer is not
    /// the one its document counts — the same id sent with other terms, or a late attempt — and
    /// is undone ([`OpResult::Repaired`]), the settle still to come.
    Settle {
        named: Option<Attempt>,
        delta: Amount,
    },
    /// Reverse a pending marker's delta and record the transfer as finished here (cancel).
    /// `decided`: sent to converge the account to its transfer's final document on the
    /// one-write path (`one_write::convergence`): a late apply of the transfer then meets that
    /// document and is undone again, so on a database of one copy the undo of a one-write
    /// marker leaves no settled entry. The stepwise protocol's undos (`false`) always leave one:
    /// its late applies are skipped by it.
    Undo { decided: bool },
    /// Change nothing: read the account fresh, so that a conflict it holds is merged and its
    /// losing leaves deleted (the sweeper's conflict pass).
    Resolve,
}

/// One queued op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AccountOp {
    /// Account id (not the document id).
    pub(crate) account: String,
    pub(crate) txn: String,
    pub(crate) kind: OpKind,
    /// Applies of one transfer share a link: when one of them fails (insufficient funds…) in a
    /// round, the later ones of that round are not applied (there would only be an undo).
    pub(crate) link: Option<u64>,
}

/// The answer to an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpResult {
    /// This op changed the account, and the write carrying it landed.
    Applied,
    /// Apply: the marker is there already (another worker, or a retry, applied it). On the
    /// one-write path: a marker of the stepwise protocol (the transfer's document exists).
    AlreadyPending,
    /// Apply on the one-write path: a pending marker of this transfer with the same delta is
    /// there already, applied by this attempt: it is left as it is and counts as the caller's.
    Adopted(Attempt),
    /// Apply on the one-write path: a pending marker of this transfer with another delta or
    /// another peer (the same id with other terms; the term named). Nothing changed.
    Mismatch(&'static str),
    /// Apply on the one-write path of a debit whose marker is there (adopted) on an account a
    /// cluster merge left below its minimum: nothing changed; the transfer is to be decided
    /// `cancelled` (insufficient funds) before the marker is undone (docs/ONE_WRITE.md).
    Overdrawn,
    /// Settle of a named attempt that found a pending marker of the transfer with another
    /// attempt (a late apply, never counted): it was undone. The write landed.
    Repaired,
    /// The transfer is in the account's settled set (settled or undone): nothing to do.
    Finished,
    /// Settle / undo: no marker and no settled entry (never applied here, or long pruned).
    Absent,
    /// Apply of a debit: `available − value < min_balance`.
    Insufficient,
    /// No such account.
    UnknownAccount,
    /// The account's currency is not the transfer's.
    CurrencyMismatch,
    /// Apply not attempted: a linked apply of the same transfer failed in this round, or the
    /// worker's deadline had passed when the round decided it.
    NotApplied,
    /// Apply: the new balance (or available amount) would pass 2^53 − 1 minor units, the
    /// most CouchDB and JavaScript hold exactly.
    Overflow,
    /// Apply: the account's document is there but not a valid account for this program
    /// (written by another tool, e.g. `balance: 100.0`).
    Unreadable,
    /// Apply of a debit whose marker was found applied on an account that the merge of a
    /// cluster conflict left below its minimum (two debits checked against one balance on two
    /// copies): this op's delta was taken back in the same write, recorded undone, and the
    /// transfer is cancelled for insufficient funds (docs/CLUSTER.md, overdraft). Also the
    /// answer of an apply that finds the transfer already recorded undone on the account.
    Withdrawn,
}

impl OpResult {
    fn is_failure(self) -> bool {
        matches!(
            self,
            OpResult::Insufficient
                | OpResult::UnknownAccount
                | OpResult::CurrencyMismatch
                | OpResult::Overflow
                | OpResult::Unreadable
                | OpResult::Withdrawn
                | OpResult::Mismatch(_)
                | OpResult::Overdrawn
        )
    }

    /// The write carrying this op changed the account.
    fn changes(self) -> bool {
        matches!(
            self,
            OpResult::Applied | OpResult::Withdrawn | OpResult::Repaired
        )
    }
}

struct QueuedOp {
    op: AccountOp,
    reply: Reply,
}

/// Where an op's answer goes.
enum Reply {
    /// Straight to its caller.
    One(oneshot::Sender<Result<OpResult>>),
    /// To the pair of applies of one transfer whose decision the engine writes itself
    /// ([`AccountEngine::run_decided`]): the op's place in the pair.
    Pair(Arc<Mutex<Pair>>, usize),
}

impl Reply {
    fn send(self, result: Result<OpResult>) {
        match self {
            // A caller that stopped waiting (its future dropped) does not need the answer;
            // the op's effect stands, and every step is idempotent.
            Reply::One(reply) => {
                let _ = reply.send(result);
            }
            Reply::Pair(pair, at) => Pair::answer(&pair, at, result),
        }
    }
}

/// Given both apply answers of a transfer, the decision to write: its document's id and the
/// document — or `None` (nothing to write now: the caller follows, or applies again).
pub(crate) type Decide = Box<dyn FnOnce(OpResult, OpResult) -> Option<(String, RawDoc)> + Send>;

/// What [`AccountEngine::run_decided`] answers: both apply answers, and the write of the
/// decision the engine made of them, if it made one.
pub(crate) struct Decided {
    pub(crate) debit: Result<OpResult>,
    pub(crate) credit: Result<OpResult>,
    pub(crate) write: Option<oneshot::Receiver<Result<TxnWrite>>>,
}

/// A future the decision's write waits for before it is queued: a test's pause at `decide`
/// (`PauseHook`); production passes none and queues at once.
pub(crate) type Hold = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The two applies of a transfer in flight, and what to do once both are answered.
pub(crate) struct Pair {
    answers: [Option<Result<OpResult>>; 2],
    decide: Option<Decide>,
    hold: Option<Hold>,
    reply: Option<oneshot::Sender<Decided>>,
    engine: std::sync::Weak<AccountEngine>,
}

impl Pair {
    /// Records one answer; on the second, decides and queues the decision at the head of the
    /// engine's queue (its very next round), then answers the caller.
    fn answer(pair: &Arc<Mutex<Pair>>, at: usize, result: Result<OpResult>) {
        let mut p = pair.lock().unwrap_or_else(|e| e.into_inner());
        p.answers[at] = Some(result);
        if p.answers.iter().any(Option::is_none) {
            return;
        }
        let [Some(debit), Some(credit)] = std::mem::take(&mut p.answers) else {
            return;
        };
        let (Some(decide), Some(reply)) = (p.decide.take(), p.reply.take()) else {
            return;
        };
        let hold = p.hold.take();
        let engine = p.engine.upgrade();
        drop(p);
        let mut write = None;
        if let (Ok(d), Ok(c), Some(engine)) = (&debit, &credit, engine) {
            if let Some((id, doc)) = decide(*d, *c) {
                let (tx, rx) = oneshot::channel();
                let queue = move || {
                    engine
                        .queue
                        .push_front(vec![Work::Txn(QueuedTxn { id, doc, reply: tx })]);
                    if engine.queue.start_if_idle() {
                        tokio::spawn(Arc::clone(&engine).drive());
                    }
                };
                match hold {
                    None => queue(),
                    Some(hold) => {
                        tokio::spawn(async move {
                            hold.await;
                            queue();
                        });
                    }
                }
                write = Some(rx);
            }
        }
        let _ = reply.send(Decided {
            debit,
            credit,
            write,
        });
    }
}

/// Every queued op's answer, in order (an error for one the engine dropped unanswered).
async fn answers_of(receivers: Vec<oneshot::Receiver<Result<OpResult>>>) -> Vec<Result<OpResult>> {
    let mut answers = Vec::with_capacity(receivers.len());
    for rx in receivers {
        answers.push(rx.await.unwrap_or_else(|_| {
            Err(Error::invariant(
                "the account-op engine stopped before answering",
            ))
        }));
    }
    answers
}

/// One op during a round: answered once `reply` is taken.
struct OpSlot {
    op: AccountOp,
    reply: Option<Reply>,
}

impl OpSlot {
    fn answer(&mut self, result: Result<OpResult>) {
        if let Some(reply) = self.reply.take() {
            reply.send(result);
        }
    }
}

/// An account as this round knows it.
struct Slot {
    /// `None`: the account does not exist.
    doc: Option<AccountDoc>,
    /// Read (or written) in this round: a decision that writes nothing may rely on it.
    fresh: bool,
    /// The losing leaves of a conflict found by the read: deleted once `doc`, merged from
    /// every leaf, is written (or found to need no write).
    losers: Vec<String>,
    /// `doc` is a merge that differs from the winning leaf: it must be written.
    dirty: bool,
}

/// The account-op engine of one [`Ledger`](crate::Ledger).
pub(crate) struct AccountEngine {
    client: Client,
    bulk: Arc<BulkWriter>,
    quorum: Arc<Quorum>,
    conflicts: Arc<ConflictTally>,
    /// Account ops and transfer-document writes: a round writes both in one `_bulk_docs`.
    queue: Queue<Work>,
    /// Rounds that wrote transfer documents.
    txn_rounds: AtomicU64,
    /// Last known doc + `_rev` per account id. Only the driver touches it; the lock is for
    /// `Sync`, held for no await.
    cache: Mutex<HashMap<String, AccountDoc>>,
    links: AtomicU64,
    /// Rounds run (for tests and logs: how well ops were grouped).
    rounds: AtomicU64,
    /// Settles held back to go out with their account's next write ([`AccountEngine::run_held`]).
    held: Mutex<Vec<HeldOp>>,
    /// Held ops that went out with another op of their account (not those released at the end
    /// of their hold or by a flush).
    folded: AtomicU64,
    /// Transfers this ledger wrote `done` or `cancelled`: their settled entries are pruned
    /// without reading them again.
    ended: Mutex<Ended>,
    /// Reads of transfers made to prune settled entries.
    prune_reads: AtomicU64,
    /// Per account, its settled entries every copy is known to hold, and since when: seen in a
    /// revision this engine wrote that every copy took. Only those may be pruned
    /// ([`PRUNE_CONFIRMED_MS`]).
    confirmed: Mutex<HashMap<String, HashMap<String, Instant>>>,
}

/// Transfers known to have ended, because this ledger wrote their end (`done` or `cancelled`,
/// answered 201). An end is final, so a settled entry of one of them may be pruned, once old
/// enough, without reading its transfer: the read an engine round would otherwise make before
/// deciding anything (measured in `p8_long`: the rate fell from ~610 to ~340 transfers/s when
/// pruning began). At most [`ENDED_KNOWN_MAX`] ids, the oldest forgotten first; a forgotten or
/// never-known one (another process ended it) is read as before.
#[derive(Default)]
struct Ended {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Ended {
    fn note(&mut self, txn: &str) {
        if self.ids.insert(txn.to_owned()) {
            self.order.push_back(txn.to_owned());
            while self.order.len() > ENDED_KNOWN_MAX {
                if let Some(old) = self.order.pop_front() {
                    self.ids.remove(&old);
                }
            }
        }
    }
}

/// An op waiting to be folded into its account's next write, until `due`.
struct HeldOp {
    due: Instant,
    queued: QueuedOp,
}

impl fmt::Debug for AccountEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccountEngine")
            .field("rounds", &self.rounds.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl AccountEngine {
    pub(crate) fn new(
        bulk: Arc<BulkWriter>,
        quorum: Arc<Quorum>,
        conflicts: Arc<ConflictTally>,
    ) -> AccountEngine {
        AccountEngine {
            client: bulk.client.clone(),
            bulk,
            quorum,
            conflicts,
            queue: Queue::new(),
            txn_rounds: AtomicU64::new(0),
            cache: Mutex::new(HashMap::new()),
            links: AtomicU64::new(1),
            rounds: AtomicU64::new(0),
            held: Mutex::new(Vec::new()),
            folded: AtomicU64::new(0),
            ended: Mutex::new(Ended::default()),
            prune_reads: AtomicU64::new(0),
            confirmed: Mutex::new(HashMap::new()),
        }
    }

    /// Records that this ledger wrote `txn`'s end (`done` or `cancelled`, answered 201).
    pub(crate) fn note_ended(&self, txn: &str) {
        self.ended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(txn);
    }

    /// Whether this engine saw `txn` end (its decision written here), among the last
    /// `ENDED_KNOWN_MAX`.
    pub(crate) fn has_ended(&self, txn: &str) -> bool {
        self.ended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ids
            .contains(txn)
    }

    /// Reads of transfers made to prune settled entries, so far.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn prune_reads(&self) -> u64 {
        self.prune_reads.load(Ordering::Relaxed)
    }

    fn held(&self) -> MutexGuard<'_, Vec<HeldOp>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Like [`AccountEngine::run`], for ops that need not go out now (the settles of a transfer
    /// finishing in the background): each waits until a round writes its account for another
    /// op, and goes with it (no document, no request of its own), or until `hold` has passed,
    /// or [`AccountEngine::release_held`].
    pub(crate) async fn run_held(
        self: &Arc<Self>,
        ops: Vec<AccountOp>,
        hold: Duration,
    ) -> Vec<Result<OpResult>> {
        let due = Instant::now() + hold;
        let mut receivers = Vec::with_capacity(ops.len());
        {
            let mut held = self.held();
            for op in ops {
                let (reply, rx) = oneshot::channel();
                receivers.push(rx);
                held.push(HeldOp {
                    due,
                    queued: QueuedOp {
                        op,
                        reply: Reply::One(reply),
                    },
                });
            }
        }
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            // Against the deadline itself, not the clock: the timer's clock may be another's.
            engine.release(|h| h.due <= due);
        });
        answers_of(receivers).await
    }

    /// Sends every held op now ([`crate::Ledger::flush`]).
    pub(crate) fn release_held(self: &Arc<Self>) {
        self.release(|_| true);
    }

    /// Sends the held ops of the transfers `txns` now (a sweeper pass's own, at its end).
    pub(crate) fn release_held_of(self: &Arc<Self>, txns: &HashSet<String>) {
        self.release(|h| txns.contains(&h.queued.op.txn));
    }

    /// Moves the held ops `which` picks into the queue (starting its driver if needed).
    fn release(self: &Arc<Self>, which: impl Fn(&HeldOp) -> bool) {
        let due: Vec<Work> = {
            let mut held = self.held();
            let (out, keep): (Vec<HeldOp>, Vec<HeldOp>) = held.drain(..).partition(|h| which(h));
            *held = keep;
            out.into_iter().map(|h| Work::Op(h.queued)).collect()
        };
        if !due.is_empty() && self.queue.push(due) {
            tokio::spawn(Arc::clone(self).drive());
        }
    }

    /// The held ops of the accounts `batch` writes anyway, to go first in its round.
    fn fold_held(&self, batch: &[QueuedOp]) -> Vec<QueuedOp> {
        let mut held = self.held();
        if held.is_empty() {
            return Vec::new();
        }
        let accounts: HashSet<&str> = batch.iter().map(|q| q.op.account.as_str()).collect();
        let (fold, keep): (Vec<HeldOp>, Vec<HeldOp>) = held
            .drain(..)
            .partition(|h| accounts.contains(h.queued.op.account.as_str()));
        *held = keep;
        self.folded.fetch_add(fold.len() as u64, Ordering::Relaxed);
        fold.into_iter().map(|h| h.queued).collect()
    }

    /// Held ops that went out folded into another op's write so far.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn folded(&self) -> u64 {
        self.folded.load(Ordering::Relaxed)
    }

    /// A fresh link id for the applies of one transfer.
    pub(crate) fn next_link(&self) -> u64 {
        self.links.fetch_add(1, Ordering::Relaxed)
    }

    fn cache(&self) -> MutexGuard<'_, HashMap<String, AccountDoc>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enqueues `ops` together (so they can share a round) and waits for every answer, in order.
    pub(crate) async fn run(self: &Arc<Self>, ops: Vec<AccountOp>) -> Vec<Result<OpResult>> {
        let mut receivers = Vec::with_capacity(ops.len());
        let queued: Vec<Work> = ops
            .into_iter()
            .map(|op| {
                let (reply, rx) = oneshot::channel();
                receivers.push(rx);
                Work::Op(QueuedOp {
                    op,
                    reply: Reply::One(reply),
                })
            })
            .collect();
        if self.queue.push(queued) {
            tokio::spawn(Arc::clone(self).drive());
        }
        answers_of(receivers).await
    }

    /// The two applies of a one-write transfer (debit, credit), and its decision written by the
    /// engine itself: once both are answered, `decide` makes the decision of them and the engine
    /// writes it in its very next round, beside the next transfers' applies — without waiting
    /// for the caller to wake and queue it (docs/ONE_WRITE.md, "The engine").
    pub(crate) async fn run_decided(
        self: &Arc<Self>,
        ops: [AccountOp; 2],
        decide: Decide,
        hold: Option<Hold>,
    ) -> Decided {
        let (reply, rx) = oneshot::channel();
        let pair = Arc::new(Mutex::new(Pair {
            answers: [None, None],
            decide: Some(decide),
            hold,
            reply: Some(reply),
            engine: Arc::downgrade(self),
        }));
        let queued: Vec<Work> = ops
            .into_iter()
            .enumerate()
            .map(|(at, op)| {
                Work::Op(QueuedOp {
                    op,
                    reply: Reply::Pair(Arc::clone(&pair), at),
                })
            })
            .collect();
        if self.queue.push(queued) {
            tokio::spawn(Arc::clone(self).drive());
        }
        rx.await.unwrap_or_else(|_| {
            let stopped = || {
                Err(Error::invariant(
                    "the account-op engine stopped before answering",
                ))
            };
            Decided {
                debit: stopped(),
                credit: stopped(),
                write: None,
            }
        })
    }

    async fn drive(self: Arc<Self>) {
        let mut guard = DriverGuard {
            queue: &self.queue,
            armed: true,
        };
        for _ in 0..ENGINE_ROUNDS_MAX {
            self.queue.gather().await;
            let batch = self.queue.take(ACCOUNT_BATCH_OPS_MAX);
            if batch.is_empty() {
                guard.armed = false;
                return;
            }
            let mut ops: Vec<QueuedOp> = Vec::with_capacity(batch.len());
            let mut txns: Vec<QueuedTxn> = Vec::new();
            let mut later: Vec<Work> = Vec::new();
            let mut ids: HashSet<String> = HashSet::new();
            for work in batch {
                match work {
                    Work::Op(q) => ops.push(q),
                    // Two writes of one document in one request would race inside the server:
                    // the later one waits for the next round (it will most likely conflict, as
                    // it should).
                    Work::Txn(q) if txns.len() < TXN_BATCH_DOCS_MAX && ids.insert(q.id.clone()) => {
                        txns.push(q)
                    }
                    Work::Txn(q) => later.push(Work::Txn(q)),
                }
            }
            if !later.is_empty() {
                self.queue.push_front(later);
            }
            let mut folded = self.fold_held(&ops);
            folded.extend(ops);
            // Settles first: a settle only ever makes an account's credit spendable, so a debit
            // of the same round must not be judged before it (a committed credit answered to its
            // caller, then refused to that caller's next transfer as insufficient funds).
            let (mut ops, rest): (Vec<QueuedOp>, Vec<QueuedOp>) = folded
                .into_iter()
                .partition(|q| matches!(q.op.kind, OpKind::Settle { .. }));
            ops.extend(rest);
            self.round(ops, txns).await;
        }
        // Still busy after the bound: hand the queue (still marked as driven) to a new task.
        guard.armed = false;
        tokio::spawn(Arc::clone(&self).drive_boxed());
    }

    /// `drive` behind a box: a task that spawns its own successor needs a named future type.
    fn drive_boxed(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.drive())
    }

    /// One round: the account ops, and the transfer documents queued meanwhile, written in the
    /// same `_bulk_docs` as the round's first account write (or alone when it writes none). So a
    /// transfer's decision, queued as soon as its accounts' round answered, goes out with the
    /// next transfers' account writes: one request per round carries both phases.
    async fn round(&self, ops: Vec<QueuedOp>, txns: Vec<QueuedTxn>) {
        let mut txns = (!txns.is_empty()).then_some(txns);
        if !ops.is_empty() {
            self.round_ops(ops, &mut txns).await;
        }
        if let Some(txns) = txns {
            self.write_txns(txns).await;
        }
    }

    /// One group of ops: read what is needed, decide in memory, write once, retry conflicts.
    /// The first write takes `txns` along.
    async fn round_ops(&self, batch: Vec<QueuedOp>, txns: &mut Option<Vec<QueuedTxn>>) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        let mut ops: Vec<OpSlot> = batch
            .into_iter()
            .map(|q| OpSlot {
                op: q.op,
                reply: Some(q.reply),
            })
            .collect();
        let mut accounts: Vec<String> = Vec::new();
        {
            let mut seen = HashSet::new();
            for o in &ops {
                if seen.insert(o.op.account.clone()) {
                    accounts.push(o.op.account.clone());
                }
            }
        }
        let mut slots: HashMap<String, Slot> = {
            let cache = self.cache();
            accounts
                .iter()
                .filter_map(|a| {
                    cache.get(a).map(|doc| {
                        (
                            a.clone(),
                            Slot {
                                doc: Some(doc.clone()),
                                fresh: false,
                                losers: Vec::new(),
                                dirty: false,
                            },
                        )
                    })
                })
                .collect()
        };
        let mut open: HashSet<String> = accounts.iter().cloned().collect();
        // Unknown for now (the database could not be read): kept, which is always safe.
        let entries = self
            .quorum
            .keeps_entries(&self.client)
            .await
            .unwrap_or(true);
        // Whether a 201 to an account write means every copy took it.
        let every_copy = self.quorum.acks_every_copy(&self.client).await;
        // Links whose failure is final (answered): later attempts keep honouring them.
        let mut failed_links: HashSet<u64> = HashSet::new();
        // Transfers whose state this round read for pruning, and those found done/cancelled.
        let mut checked: HashSet<String> = HashSet::new();
        let mut terminal: HashSet<String> = HashSet::new();

        for _attempt in 0..ACCOUNT_CAS_ATTEMPTS_MAX {
            if open.is_empty() {
                return;
            }
            // 1. Read every open account we hold no trustworthy copy of, in one request.
            let to_read: Vec<String> = accounts
                .iter()
                .filter(|a| open.contains(*a) && !slots.contains_key(*a))
                .cloned()
                .collect();
            if !to_read.is_empty() {
                match self.read(&to_read).await {
                    Ok(read) => {
                        for (account, doc) in read {
                            match doc {
                                AccountRead::Found(found) => {
                                    let Found { doc, losers, dirty } = *found;
                                    if let Some(d) = &doc {
                                        if losers.is_empty() {
                                            self.remember(d);
                                        }
                                    }
                                    slots.insert(
                                        account,
                                        Slot {
                                            doc,
                                            fresh: true,
                                            losers,
                                            dirty,
                                        },
                                    );
                                }
                                AccountRead::Failed(e) => {
                                    tracing::warn!(%account, "{e}");
                                    answer_account(&mut ops, &account, |_| Err(duplicate(&e)));
                                    open.remove(&account);
                                }
                                AccountRead::Unreadable(raw, e) => {
                                    // An apply is refused for good (the transfer is cancelled
                                    // naming the account); a settle or undo can only tell
                                    // from the raw markers whether there is work it cannot do.
                                    tracing::warn!(%account, "unreadable account document: {e}");
                                    for o in ops.iter_mut() {
                                        if o.reply.is_none() || o.op.account != account {
                                            continue;
                                        }
                                        let answer = unreadable_answer(&raw, &o.op, &e);
                                        if matches!(answer, Ok(OpResult::Unreadable)) {
                                            if let Some(link) = o.op.link {
                                                failed_links.insert(link);
                                            }
                                        }
                                        o.answer(answer);
                                    }
                                    open.remove(&account);
                                }
                            }
                        }
                    }
                    Err(e) => {
                        // Nothing was written in this attempt: every open op fails alike.
                        for o in &mut ops {
                            if open.contains(&o.op.account) {
                                o.answer(Err(duplicate(&e)));
                            }
                        }
                        return;
                    }
                }
            }

            // 2. Decide every open op in queue order, each account on its own working copy,
            //    pruned first of settled entries whose transfer reads done or cancelled (one
            //    read of those transfers, only when some account has enough to prune).
            let now = now_ms();
            let mut work: HashMap<String, (Option<AccountDoc>, bool)> = HashMap::new();
            for a in &accounts {
                if open.contains(a) {
                    let slot = slots.get(a);
                    let doc = slot.and_then(|s| s.doc.clone());
                    work.insert(a.clone(), (doc, slot.is_some_and(|s| s.dirty)));
                }
            }
            let prunable: HashMap<String, HashSet<String>> =
                work.keys().map(|a| (a.clone(), self.prunable(a))).collect();
            let candidates: Vec<String> = {
                let mut seen = HashSet::new();
                work.iter()
                    .filter_map(|(a, (doc, _))| doc.as_ref().map(|d| (a, d)))
                    .flat_map(|(a, doc)| {
                        let eligible = &prunable[a];
                        prune_candidates(doc, now, |t| eligible.contains(t))
                    })
                    .filter(|t| !checked.contains(t) && seen.insert(t.clone()))
                    .collect()
            };
            let (known, candidates): (Vec<String>, Vec<String>) = {
                let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
                candidates.into_iter().partition(|t| ended.ids.contains(t))
            };
            checked.extend(known.iter().cloned());
            terminal.extend(known);
            if !candidates.is_empty() {
                self.prune_reads.fetch_add(1, Ordering::Relaxed);
                match self.read_terminal(&candidates).await {
                    Ok(done) => {
                        checked.extend(candidates);
                        terminal.extend(done);
                    }
                    // Pruning is best effort: the size cap holds without it.
                    Err(e) => {
                        tracing::warn!("could not read transfers to prune settled entries: {e}")
                    }
                }
            }
            if !terminal.is_empty() {
                for (a, (doc, changed)) in work.iter_mut() {
                    if let Some(doc) = doc.as_mut() {
                        let eligible = &prunable[a];
                        if prune_settled(doc, now, |t| terminal.contains(t) && eligible.contains(t))
                        {
                            *changed = true;
                        }
                    }
                }
            }
            // The deadline is judged once per attempt, after the reads above.
            let instant = Instant::now();
            let mut links_now = failed_links.clone();
            let mut decided: Vec<Option<Result<OpResult>>> = (0..ops.len()).map(|_| None).collect();
            for (i, o) in ops.iter().enumerate() {
                if o.reply.is_none() || !open.contains(&o.op.account) {
                    continue;
                }
                let (doc, changed) = work
                    .get_mut(&o.op.account)
                    .expect("open account has a copy");
                if let OpKind::Apply {
                    deadline: Some(deadline),
                    ..
                } = &o.op.kind
                {
                    if instant >= *deadline {
                        // Not attempted, writes nothing. `NotApplied` (not an error, not a
                        // business refusal): the drive retries the step, and its own lease
                        // check ends it as `LeaseLost`.
                        decided[i] = Some(Ok(OpResult::NotApplied));
                        continue;
                    }
                }
                let result = evaluate_with(doc.as_mut(), &o.op, now, &links_now, entries);
                if let Ok(r) = &result {
                    if r.is_failure() {
                        if let Some(link) = o.op.link {
                            links_now.insert(link);
                        }
                    }
                    if r.changes() {
                        *changed = true;
                    }
                }
                decided[i] = Some(result);
            }

            // 3. Accounts that need no write are answered — if their copy is fresh.
            let mut writes: Vec<AccountDoc> = Vec::new();
            for a in &accounts {
                if !open.contains(a) {
                    continue;
                }
                let (doc, changed) = work.remove(a).expect("open account has a copy");
                if changed {
                    writes.push(doc.expect("a changed account exists"));
                } else if slots.get(a).is_some_and(|s| s.fresh) {
                    if let Some(slot) = slots.get_mut(a) {
                        let winner = slot.doc.as_ref().and_then(|d| d.rev.clone());
                        let losers = std::mem::take(&mut slot.losers);
                        let refused = self
                            .delete_losers(&account_doc_id(a), losers, winner.as_deref())
                            .await;
                        fail_resolves(&mut ops, a, refused);
                    }
                    answer_decided(&mut ops, &mut decided, a, &mut failed_links);
                    open.remove(a);
                } else {
                    // Decided on a cached copy that may be stale: read it and decide again.
                    slots.remove(a);
                    self.forget(a);
                }
            }
            if writes.is_empty() {
                continue;
            }

            // 4. `_bulk_docs` for every changed account (one request unless they pass
            //    [`BULK_BYTES_MAX`]), each a CAS on its `_rev` — with the queued transfer
            //    documents, handed to the bulk writer at the same moment so they share it.
            let results = match txns.take() {
                Some(t) => self.write_accounts_with(&writes, t).await,
                None => self.write_accounts(&writes).await,
            };
            for (mut doc, r) in writes.into_iter().zip(results) {
                let a = doc.account_id.clone();
                let r = match r {
                    Ok(r) => r,
                    Err(e) => {
                        // Unknown whether it landed (or refused as too large): drop the
                        // copy and fail these ops; the caller's protocol step is
                        // idempotent and will be redone.
                        slots.remove(&a);
                        self.forget(&a);
                        answer_account(&mut ops, &a, |_| Err(duplicate(&e)));
                        open.remove(&a);
                        continue;
                    }
                };
                if r.is_ok() && !r.accepted {
                    doc.rev = r.rev.clone();
                    self.remember(&doc);
                    if every_copy {
                        self.confirm(&doc);
                    }
                    let losers = slots
                        .get_mut(&a)
                        .map(|s| std::mem::take(&mut s.losers))
                        .unwrap_or_default();
                    let refused = self
                        .delete_losers(&doc.id, losers, doc.rev.as_deref())
                        .await;
                    fail_resolves(&mut ops, &a, refused);
                    slots.insert(
                        a.clone(),
                        Slot {
                            doc: Some(doc),
                            fresh: true,
                            losers: Vec::new(),
                            dirty: false,
                        },
                    );
                    answer_decided(&mut ops, &mut decided, &a, &mut failed_links);
                    open.remove(&a);
                } else if r.is_ok() {
                    // 202: on some copies only, maybe in conflict with a rival that reached the
                    // others. Never taken as written: read again (with conflicts, merged) and
                    // decide again — an op whose write did land finds its own marker.
                    tracing::info!(account = %a, "account write accepted (202), not confirmed; re-reading");
                    self.unconfirm(&a);
                    self.conflicts.uncertain.fetch_add(1, Ordering::Relaxed);
                    slots.remove(&a);
                    self.forget(&a);
                } else if r.is_conflict() {
                    slots.remove(&a);
                    self.forget(&a);
                } else {
                    let e = bulk_error(&account_doc_id(&a), &r);
                    answer_account(&mut ops, &a, |_| Err(duplicate(&e)));
                    open.remove(&a);
                }
            }
        }
        for a in open {
            tracing::warn!(account = %a, "account kept conflicting; giving up this round");
            answer_account(&mut ops, &a, |_| {
                Err(Error::status(
                    409,
                    Some("conflict".to_owned()),
                    Some(format!(
                        "account {a} changed under every one of {ACCOUNT_CAS_ATTEMPTS_MAX} attempts"
                    )),
                ))
            });
        }
    }

    /// Writes accounts with `_bulk_docs`, in requests of at most [`BULK_BYTES_MAX`] bytes; a
    /// request the server refuses as too large (413) is split in two and sent again, down to
    /// one document, whose 413 is its answer. One answer per document, in order: its result,
    /// or the error of the request that carried it (unknown whether it landed).
    async fn write_accounts(&self, writes: &[AccountDoc]) -> Vec<Result<BulkResult>> {
        let mut answers: Vec<Option<Result<BulkResult>>> = writes.iter().map(|_| None).collect();
        let mut chunks: VecDeque<Vec<usize>> = VecDeque::new();
        let mut chunk: Vec<usize> = Vec::new();
        let mut bytes = 0usize;
        // Each account serialized once: the same bytes size the chunks and go on the wire.
        let mut raw: Vec<Option<RawDoc>> = Vec::with_capacity(writes.len());
        for (i, doc) in writes.iter().enumerate() {
            let serialized = RawDoc::new(&doc.id, doc);
            let size = serialized.as_ref().map_or(0, RawDoc::bytes);
            match serialized {
                Ok(r) => raw.push(Some(r)),
                Err(e) => {
                    answers[i] = Some(Err(e));
                    raw.push(None);
                    continue;
                }
            }
            if !chunk.is_empty() && bytes + size > BULK_BYTES_MAX {
                chunks.push_back(std::mem::take(&mut chunk));
                bytes = 0;
            }
            chunk.push(i);
            bytes += size;
        }
        if !chunk.is_empty() {
            chunks.push_back(chunk);
        }
        while let Some(chunk) = chunks.pop_front() {
            let docs: Vec<RawDoc> = chunk
                .iter()
                .filter_map(|&i| {
                    raw[i].as_ref().map(|r| RawDoc {
                        id: r.id.clone(),
                        json: r.json.clone(),
                    })
                })
                .collect();
            let options = self.quorum.write_options(&self.client, false).await;
            match self.bulk.write(docs, options).await {
                Ok(results) => {
                    let mut by_id = results_by_id(results);
                    for &i in &chunk {
                        let id = &writes[i].id;
                        answers[i] = Some(by_id.remove(id).ok_or_else(|| {
                            Error::decode(format!("_bulk_docs did not answer for {id}"))
                        }));
                    }
                }
                Err(e) if e.is_too_large() && chunk.len() > 1 => {
                    tracing::warn!(docs = chunk.len(), "_bulk_docs too large (413); splitting");
                    let (a, b) = chunk.split_at(chunk.len() / 2);
                    chunks.push_front(b.to_vec());
                    chunks.push_front(a.to_vec());
                }
                Err(e) if e.is_too_large() => {
                    let doc = &writes[chunk[0]];
                    let size = raw[chunk[0]].as_ref().map_or(0, RawDoc::bytes);
                    let e = Error::status(
                        413,
                        Some("too_large".to_owned()),
                        Some(format!(
                            "the server refuses {} as too large ({size} bytes) even alone",
                            doc.id
                        )),
                    )
                    .with_request("POST", "_bulk_docs")
                    .with_source(e.to_string());
                    answers[chunk[0]] = Some(Err(e));
                }
                Err(e) => {
                    for &i in &chunk {
                        answers[i] = Some(Err(duplicate(&e)));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(Error::invariant("an account write was not sent"))))
            .collect()
    }

    /// Of these transfers, those whose document reads `done` or `cancelled`, or does not exist
    /// (no transfer, nothing can apply it): the settled entries that may be pruned.
    async fn read_terminal(&self, txns: &[String]) -> Result<HashSet<String>> {
        let mut out = HashSet::new();
        for chunk in txns.chunks(READ_BATCH_KEYS_MAX) {
            let keys: Vec<String> = chunk.iter().map(|t| format!("txn:{t}")).collect();
            let rows = self.client.all_docs(&keys, true).await?;
            for (txn, row) in chunk.iter().zip(rows) {
                let end = match &row.doc {
                    Some(doc) => matches!(
                        doc.get("state").and_then(Value::as_str),
                        Some("done" | "cancelled")
                    ),
                    // `error: not_found`: never written. A deleted one (`doc: null` with a
                    // value) cannot happen (validation forbids it) and is kept, to be safe.
                    None => row.error.as_deref() == Some("not_found"),
                };
                if end {
                    out.insert(txn.clone());
                }
            }
        }
        Ok(out)
    }

    /// Reads accounts with `_all_docs?include_docs&conflicts`: per account, its document
    /// (`None` when it does not exist) — merged from every leaf when it holds a conflict, with
    /// the losing revisions to delete — or the raw document and the error when it is not a
    /// valid account, or the error that keeps a conflict from being merged now.
    async fn read(&self, accounts: &[String]) -> Result<Vec<(String, AccountRead)>> {
        let mut out = Vec::with_capacity(accounts.len());
        for chunk in accounts.chunks(READ_BATCH_KEYS_MAX) {
            let keys: Vec<String> = chunk.iter().map(|a| account_doc_id(a)).collect();
            let rows = self.client.all_docs_with_conflicts(&keys).await?;
            for (account, row) in chunk.iter().zip(rows) {
                let read = match row.doc {
                    Some(mut raw @ Value::Object(_)) => {
                        let losers = take_conflicts(&mut raw);
                        match AccountDoc::from_value(raw.clone()) {
                            Err(e) => AccountRead::Unreadable(raw, e),
                            Ok(mut doc) => {
                                // Leaves this branch joined already stay out of any merge
                                // (and out of the list once they are gone).
                                doc.merged.retain(|r| losers.contains(r));
                                if losers.iter().all(|r| doc.merged.contains(r)) {
                                    AccountRead::Found(Box::new(Found {
                                        doc: Some(doc),
                                        losers,
                                        dirty: false,
                                    }))
                                } else {
                                    self.merge(doc, losers).await?
                                }
                            }
                        }
                    }
                    // Missing (`error: not_found`) or deleted (`doc: null`).
                    _ => AccountRead::Found(Box::new(Found {
                        doc: None,
                        losers: Vec::new(),
                        dirty: false,
                    })),
                };
                out.push((account.clone(), read));
            }
        }
        Ok(out)
    }

    /// Merges a conflicted account's leaves ([`merge_account`]), reading the transfers the
    /// leaves disagree on. A loser this program cannot read, or a transfer that is itself in
    /// conflict, leaves the account as it is for now (an error for its ops: the sweeper
    /// resolves the transfer first).
    async fn merge(&self, winner: AccountDoc, losers: Vec<String>) -> Result<AccountRead> {
        let id = winner.id.clone();
        self.conflicts.met.fetch_add(1, Ordering::Relaxed);
        self.unconfirm(&winner.account_id);
        match self.quorum.keeps_entries(&self.client).await {
            Some(true) => {}
            Some(false) => return Ok(AccountRead::Failed(unmergeable(&id, losers.len()))),
            None => {
                return Ok(AccountRead::Failed(Error::status(
                    503,
                    Some("unavailable".to_owned()),
                    Some(format!(
                        "{id} holds a conflict, and the database's copies could not be read to \
                         tell whether its branches can be merged; tried again later"
                    )),
                )))
            }
        }
        // Leaves this branch joined already are not read again.
        let unread: Vec<String> = losers
            .iter()
            .filter(|r| !winner.merged.contains(r))
            .cloned()
            .collect();
        let bodies = self.client.revisions(&id, &unread).await?;
        let mut leaves = Vec::with_capacity(bodies.len());
        let mut revs = Vec::with_capacity(bodies.len());
        for mut body in bodies {
            take_conflicts(&mut body);
            let rev = body.get("_rev").and_then(Value::as_str).map(str::to_owned);
            match (AccountDoc::from_value(body), rev) {
                (Ok(doc), Some(rev)) => {
                    leaves.push(doc);
                    revs.push(rev);
                }
                (Err(e), _) => {
                    return Ok(AccountRead::Failed(Error::invariant(format!(
                        "{id} holds a conflict with a leaf that is not a valid account ({e}); \
                         a person must resolve it"
                    ))))
                }
                (Ok(_), None) => return Err(Error::decode(format!("a leaf of {id} has no _rev"))),
            }
        }
        // A leaf another leaf joined already is not joined again either.
        let folded: HashSet<String> = winner
            .merged
            .iter()
            .chain(leaves.iter().flat_map(|d| d.merged.iter()))
            .cloned()
            .collect();
        let (leaves, revs): (Vec<AccountDoc>, Vec<String>) = leaves
            .into_iter()
            .zip(revs)
            .filter(|(_, rev)| !folded.contains(rev))
            .unzip();
        if leaves.is_empty() {
            // The losers were deleted meanwhile, or joined already: nothing to merge.
            return Ok(AccountRead::Found(Box::new(Found {
                doc: Some(winner),
                losers,
                dirty: false,
            })));
        }
        let needed = facts_needed(&winner, &leaves);
        let mut facts = HashMap::new();
        if !needed.is_empty() {
            let keys: Vec<String> = needed.iter().map(|t| format!("txn:{t}")).collect();
            let rows = self.client.all_docs_with_conflicts(&keys).await?;
            for (txn, row) in needed.iter().zip(rows) {
                let Some(doc) = row.doc.filter(Value::is_object) else {
                    continue;
                };
                if doc.get("_conflicts").is_some() {
                    return Ok(AccountRead::Failed(Error::blocked_by_transfer(&id, txn)));
                }
                let state = doc
                    .get("state")
                    .and_then(Value::as_str)
                    .and_then(crate::state::State::parse);
                let value = doc
                    .get("value")
                    .and_then(Value::as_i64)
                    .and_then(|v| Amount::new(v).ok());
                let side = if doc.get("source").and_then(Value::as_str) == Some(&winner.account_id)
                {
                    Some(true)
                } else if doc.get("destination").and_then(Value::as_str) == Some(&winner.account_id)
                {
                    Some(false)
                } else {
                    None
                };
                if let (Some(state), Some(value), Some(debit)) = (state, value, side) {
                    let delta = if debit { value.neg() } else { value };
                    let role = if debit { "source" } else { "destination" };
                    let named = doc
                        .get("markers")
                        .and_then(|m| m.get(role))
                        .and_then(Value::as_str)
                        .and_then(|a| a.parse().ok());
                    facts.insert(
                        txn.clone(),
                        TxnFacts {
                            state,
                            delta,
                            named,
                        },
                    );
                }
            }
        }
        match merge_account(&winner, &leaves, &facts, now_ms()) {
            Ok(mut merged) => {
                // Every leaf joined here is recorded on the merged branch while it lasts: a
                // member's sweeper may not delete it, and the next merge must not join it
                // again over what this branch settled and pruned since.
                let mut joined: Vec<String> =
                    folded.into_iter().chain(revs.iter().cloned()).collect();
                joined.retain(|r| losers.contains(r));
                joined.sort();
                joined.dedup();
                merged.merged = joined;
                let dirty = merged.balance != winner.balance
                    || merged.pending != winner.pending
                    || merged.settled != winner.settled
                    || merged.merged != winner.merged;
                tracing::info!(
                    account = %winner.account_id,
                    leaves = revs.len() + 1,
                    dirty,
                    "merging a conflicted account"
                );
                Ok(AccountRead::Found(Box::new(Found {
                    doc: Some(merged),
                    losers,
                    dirty,
                })))
            }
            Err(b) => Ok(AccountRead::Failed(Error::status(
                409,
                Some("conflict".to_owned()),
                Some(format!(
                    "{id} holds a conflict that cannot be merged yet: transfer {}: {}",
                    b.txn, b.why
                )),
            ))),
        }
    }

    /// Deletes the losing leaves of a conflict whose merge now stands as the winner. A leaf
    /// deleted already is fine; a refusal (only an admin may delete ledger revisions) leaves
    /// the conflict for `verify` to report and an admin's sweeper to finish.
    async fn delete_losers(
        &self,
        id: &str,
        losers: Vec<String>,
        merged_into: Option<&str>,
    ) -> Option<Error> {
        if losers.is_empty() {
            return None;
        }
        let stubs: Vec<Value> = losers
            .iter()
            .map(|rev| {
                serde_json::json!({
                    "_id": id, "_rev": rev, "_deleted": true, "merged_into": merged_into,
                })
            })
            .collect();
        let options = self.quorum.write_options(&self.client, false).await;
        match self.client.bulk_docs_with(&stubs, &options).await {
            Ok(results) => {
                let refused: Vec<&BulkResult> = results
                    .iter()
                    .filter(|r| !r.is_ok() && !r.is_conflict())
                    .collect();
                if refused.is_empty() {
                    self.conflicts.resolved.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                let reasons: Vec<String> = refused
                    .iter()
                    .map(|r| r.reason.clone().unwrap_or_default())
                    .collect();
                tracing::warn!(%id, "could not delete the losing leaves of a merged conflict: {reasons:?}");
                Some(Error::status(
                    403,
                    Some("forbidden".to_owned()),
                    Some(format!(
                        "{id} is merged, but its losing leaves could not be deleted (an admin's \
                         sweeper can): {}",
                        reasons.join("; ")
                    )),
                ))
            }
            Err(e) => {
                tracing::warn!(%id, "could not delete the losing leaves of a merged conflict: {e}");
                Some(e)
            }
        }
    }

    /// Every copy took `doc` (a 201 with `w` = n): its settled entries are on all of them.
    fn confirm(&self, doc: &AccountDoc) {
        let now = Instant::now();
        let mut confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        if confirmed.len() >= ACCOUNT_CACHE_MAX && !confirmed.contains_key(&doc.account_id) {
            // Bounded like the cache: forgetting only delays pruning.
            confirmed.clear();
        }
        let entries = confirmed.entry(doc.account_id.clone()).or_default();
        entries.retain(|txn, _| doc.settled.iter().any(|s| &s.txn == txn));
        for s in &doc.settled {
            entries.entry(s.txn.clone()).or_insert(now);
        }
    }

    /// A write of `account` was only accepted (202), or a conflict of it was seen: a copy may
    /// be behind or hold a branch of its own; nothing of it is pruned until every copy takes
    /// its writes again, for [`PRUNE_CONFIRMED_MS`].
    fn unconfirm(&self, account: &str) {
        self.confirmed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(account);
    }

    /// The settled entries of `account` that may be pruned as far as the copies go.
    fn prunable(&self, account: &str) -> HashSet<String> {
        let Some(since) = Instant::now().checked_sub(Duration::from_millis(PRUNE_CONFIRMED_MS))
        else {
            return HashSet::new();
        };
        self.confirmed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(account)
            .map(|entries| {
                entries
                    .iter()
                    .filter(|(_, at)| **at <= since)
                    .map(|(txn, _)| txn.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn remember(&self, doc: &AccountDoc) {
        let mut cache = self.cache();
        if cache.len() >= ACCOUNT_CACHE_MAX && !cache.contains_key(&doc.account_id) {
            // Crude but bounded: a cleared cache only costs reads.
            cache.clear();
        }
        cache.insert(doc.account_id.clone(), doc.clone());
    }

    fn forget(&self, account: &str) {
        self.cache().remove(account);
    }

    /// Rounds run so far.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }
}

/// One account as [`AccountEngine::read`] found it.
enum AccountRead {
    Found(Box<Found>),
    /// The document is there but not a valid account: the raw document and why.
    Unreadable(Value, Error),
    /// A conflict that cannot be merged now: the ops on this account fail with this error.
    Failed(Error),
}

/// A readable account (or none), merged from its leaves when it held a conflict.
struct Found {
    doc: Option<AccountDoc>,
    losers: Vec<String>,
    dirty: bool,
}

/// What an op on an account whose document cannot be read comes to. An apply is a business
/// refusal ([`OpResult::Unreadable`]): the transfer is cancelled, never stuck. A settle or undo
/// reads the raw markers: no marker of the transfer means nothing to do (it was never applied
/// here), a marker means work this program cannot do on that document — an error, so the
/// transfer waits for a person to repair the account, which `verify` reports.
/// An account conflict on a database that keeps one copy of each document: the ledger keeps no
/// settled entries of one-write transfers there (`Quorum::keeps_entries`), so a branch's
/// settled transfers look as if it never had them, and no merge can tell one from the other.
/// The ledger's own writes never make such a branch (every one is an exclusive
/// compare-and-swap); an admin's replication into the database or a forged history did. The
/// account's ops fail until a person resolves it (docs/ONE_WRITE.md, "Conflicts on one copy").
pub(crate) fn unmergeable(id: &str, losers: usize) -> Error {
    Error::invariant(format!(
        "{id} holds a conflict ({} leaves); on a database that keeps one copy of each document the \
         ledger keeps no settled entries of one-write transfers, so it cannot tell which \
         transfers each leaf settled and will not merge them: a person must resolve it \
         (docs/ONE_WRITE.md, \"Conflicts on one copy\")",
        losers + 1
    ))
}

fn unreadable_answer(raw: &Value, op: &AccountOp, e: &Error) -> Result<OpResult> {
    let holds = |field: &str| {
        raw.get(field)
            .and_then(Value::as_array)
            .is_some_and(|list| {
                list.iter()
                    .any(|m| m.get("txn").and_then(Value::as_str) == Some(op.txn.as_str()))
            })
    };
    match op.kind {
        OpKind::Apply { .. } if holds("pending") => Err(duplicate(e)),
        OpKind::Apply { .. } => Ok(OpResult::Unreadable),
        OpKind::Settle { .. } | OpKind::Undo { .. } if holds("pending") => Err(duplicate(e)),
        OpKind::Settle { .. } | OpKind::Undo { .. } if holds("settled") => Ok(OpResult::Finished),
        OpKind::Settle { .. } | OpKind::Undo { .. } => Ok(OpResult::Absent),
        OpKind::Resolve => Err(duplicate(e)),
    }
}

/// A conflict pass's ops on `account` ([`OpKind::Resolve`]) fail with `refused` when the losing
/// leaves could not be deleted: the conflict is still there. Other ops stand (their write landed).
fn fail_resolves(ops: &mut [OpSlot], account: &str, refused: Option<Error>) {
    let Some(e) = refused else { return };
    for o in ops.iter_mut() {
        if o.reply.is_some() && o.op.account == account && o.op.kind == OpKind::Resolve {
            o.answer(Err(duplicate(&e)));
        }
    }
}

/// Answers every unanswered op of `account` with what `f` makes of it.
fn answer_account(ops: &mut [OpSlot], account: &str, f: impl Fn(&AccountOp) -> Result<OpResult>) {
    for o in ops.iter_mut() {
        if o.reply.is_some() && o.op.account == account {
            let r = f(&o.op);
            o.answer(r);
        }
    }
}

/// Answers the ops of `account` with the decisions of this attempt.
fn answer_decided(
    ops: &mut [OpSlot],
    decided: &mut [Option<Result<OpResult>>],
    account: &str,
    failed_links: &mut HashSet<u64>,
) {
    for (o, d) in ops.iter_mut().zip(decided.iter_mut()) {
        if o.reply.is_none() || o.op.account != account {
            continue;
        }
        let Some(result) = d.take() else {
            continue;
        };
        if let Ok(r) = &result {
            if r.is_failure() {
                if let Some(link) = o.op.link {
                    failed_links.insert(link);
                }
            }
        }
        o.answer(result);
    }
}

/// The rules of docs/PROTOCOL.md for one op on one account, in memory. `Applied` means `doc` changed.
#[cfg(test)]
pub(crate) fn evaluate(
    doc: Option<&mut AccountDoc>,
    op: &AccountOp,
    now: i64,
    failed_links: &HashSet<u64>,
) -> Result<OpResult> {
    evaluate_with(doc, op, now, failed_links, true)
}

/// [`evaluate`]; with `entries` false (a database of one copy) a one-write marker's settle or
/// undo leaves no settled entry: the attempts its transfer's decision names keep a late apply
/// from counting (docs/ONE_WRITE.md), and no merge of branches needs the entry.
pub(crate) fn evaluate_with(
    doc: Option<&mut AccountDoc>,
    op: &AccountOp,
    now: i64,
    failed_links: &HashSet<u64>,
    entries: bool,
) -> Result<OpResult> {
    let Some(doc) = doc else {
        return Ok(OpResult::UnknownAccount);
    };
    let in_pending = doc.pending.iter().position(|m| m.txn == op.txn);
    let in_settled = doc.settled.iter().any(|s| s.txn == op.txn);
    match &op.kind {
        OpKind::Resolve => Ok(OpResult::Finished),
        OpKind::Apply {
            delta,
            currency,
            check_funds,
            attempt,
            peer,
            exists,
            ..
        } => {
            // On one node a debit's own check keeps `available >= min_balance` for good; below
            // it, a conflict merge added a rival debit.
            let merged_overdraft = |doc: &AccountDoc| {
                *check_funds
                    && delta.minor() < 0
                    && doc
                        .min_balance
                        .is_some_and(|min| doc.available().is_ok_and(|a| a < min))
            };
            let mut in_pending = in_pending;
            if let Some(pos) = in_pending {
                let found = &doc.pending[pos];
                let other_peer = found.peer.is_some() && peer.is_some() && found.peer != *peer;
                let other_terms = found.delta != *delta || other_peer;
                if other_terms && *exists && found.attempt.is_some() {
                    // A one-write attempt of this id with other terms than its document's: no
                    // decision can name it. Taken back (no undone entry: this apply follows).
                    let stray = doc.pending.remove(pos);
                    doc.balance = doc.balance.checked_sub(stray.delta)?;
                    tracing::warn!(
                        account = %doc.account_id,
                        txn = %op.txn,
                        "undid a marker of this transfer's id with other terms than its document's"
                    );
                    in_pending = None;
                } else if other_terms && attempt.is_some() {
                    let term = if found.delta != *delta {
                        "value"
                    } else if delta.minor() < 0 {
                        "destination"
                    } else {
                        "source"
                    };
                    return Ok(OpResult::Mismatch(term));
                }
            }
            if let (Some(_), Some(pos)) = (attempt, in_pending) {
                // The one-write path: the marker of an attempt of this very transfer (a retry
                // still running, or one that died before deciding) counts as this one's; a
                // stepwise marker means the transfer's document exists and is followed. Never
                // undone here: no marker is undone before its transfer is decided
                // (docs/ONE_WRITE.md).
                let Some(theirs) = doc.pending[pos].attempt else {
                    return Ok(OpResult::AlreadyPending);
                };
                if merged_overdraft(doc) {
                    return Ok(OpResult::Overdrawn);
                }
                return Ok(OpResult::Adopted(theirs));
            }
            if attempt.is_some() && in_settled {
                // Settled or undone here: the transfer was decided; its document says how.
                return Ok(OpResult::Finished);
            }
            if let Some(pos) = in_pending {
                // This op's issuer holds the transfer's lease and has not committed (it waits
                // for this answer): its debit is the one to take back.
                if merged_overdraft(doc) {
                    let applied = doc.pending[pos].delta;
                    doc.balance = doc.balance.checked_sub(applied)?;
                    doc.pending.remove(pos);
                    doc.settled.push(Settled::new(&op.txn, now, true));
                    tracing::warn!(
                        account = %doc.account_id,
                        txn = %op.txn,
                        "a merged conflict overdrew the account; taking this transfer's debit back"
                    );
                    return Ok(OpResult::Withdrawn);
                }
                return Ok(OpResult::AlreadyPending);
            }
            if in_settled {
                // Undone while the transfer is being applied: a cancel undid it (the commit
                // CAS of this drive will fail and follow), or an earlier attempt's debit was
                // taken back after a merged overdraft and that worker stopped before writing
                // `canceling`. Either way only a cancel is consistent: a commit now would keep
                // the other account's delta alone (money from nowhere).
                let undone = doc.settled.iter().any(|s| s.txn == op.txn && s.undone);
                return Ok(if undone {
                    OpResult::Withdrawn
                } else {
                    OpResult::Finished
                });
            }
            if op.link.is_some_and(|l| failed_links.contains(&l)) {
                return Ok(OpResult::NotApplied);
            }
            if doc.currency != *currency {
                return Ok(OpResult::CurrencyMismatch);
            }
            let marker = Marker {
                txn: op.txn.clone(),
                delta: *delta,
                at: Some(now),
                attempt: *attempt,
                peer: peer.clone(),
                aliases: Vec::new(),
            };
            let bytes = doc.markers_bytes();
            if bytes + pending_bytes(&marker) > MARKERS_BYTES_MAX {
                return Err(account_full(&doc.account_id, bytes));
            }
            if *check_funds && delta.minor() < 0 {
                if let Some(min) = doc.min_balance {
                    let Ok(after) = doc.available().and_then(|a| a.checked_add(*delta)) else {
                        return Ok(OpResult::Overflow);
                    };
                    if after < min {
                        return Ok(OpResult::Insufficient);
                    }
                }
            }
            // Past 2^53 − 1 the server could not hold the balance exactly: refused like an
            // overdraft, so the transfer is cancelled instead of failing on every retry.
            let Ok(balance) = doc.balance.checked_add(*delta) else {
                return Ok(OpResult::Overflow);
            };
            doc.balance = balance;
            doc.pending.push(marker);
            Ok(OpResult::Applied)
        }
        OpKind::Settle { named, delta } => match in_pending {
            Some(pos)
                if doc.pending[pos].delta != *delta
                    || named.is_some_and(|n| !doc.pending[pos].carries(n)) =>
            {
                // Not the marker the document counts: a late apply of a decided transfer, or
                // the same id sent with other terms (a cluster let both apply, each on its own
                // branch). A marker without attempt under a named decision is a stepwise
                // drive's, which a conflicted document let run beside the decision.
                let delta = doc.pending[pos].delta;
                doc.balance = doc.balance.checked_sub(delta)?;
                doc.pending.remove(pos);
                if entries {
                    doc.settled.push(Settled::new(&op.txn, now, true));
                }
                tracing::warn!(
                    account = %doc.account_id,
                    txn = %op.txn,
                    "undid a marker the transfer's document does not count"
                );
                Ok(OpResult::Repaired)
            }
            Some(pos) => {
                let marker = doc.pending.remove(pos);
                // Only a one-write settle (of the marker its decision names) may go without an
                // entry: the stepwise protocol's settle (`named` None) leaves one whatever
                // marker it settles — a stepwise drive adopts a one-write marker of the same
                // terms, and its next settle, or a late apply, must find the entry.
                if entries || named.is_none() || marker.attempt.is_none() {
                    doc.settled.push(Settled::new(&op.txn, now, false));
                }
                Ok(OpResult::Applied)
            }
            None if in_settled => Ok(OpResult::Finished),
            None => Ok(OpResult::Absent),
        },
        OpKind::Undo { decided } => match in_pending {
            Some(pos) => {
                let marker = doc.pending.remove(pos);
                doc.balance = doc.balance.checked_sub(marker.delta)?;
                // Recorded like a settle so that a late apply of this transfer is skipped
                // instead of re-adding a marker someone would have to undo again (a one-write
                // marker's late apply is not counted anyway: no decision names it).
                if entries || !decided || marker.attempt.is_none() {
                    doc.settled.push(Settled::new(&op.txn, now, true));
                }
                Ok(OpResult::Applied)
            }
            None if in_settled => Ok(OpResult::Finished),
            None => {
                let bytes = doc.markers_bytes();
                if bytes + marker_bytes(&op.txn) > MARKERS_BYTES_MAX + MARKERS_UNDO_SLACK_BYTES {
                    return Err(account_full(&doc.account_id, bytes));
                }
                // Nothing was applied here, but an apply of this transfer may still be on its
                // way (a worker that read it pending): the undone entry makes it skip, instead
                // of landing for a moment (a wrong balance, a spurious insufficient_funds) until
                // an orphan repair takes it back.
                doc.settled.push(Settled::new(&op.txn, now, true));
                Ok(OpResult::Applied)
            }
        },
    }
}

/// The settled entries of `doc` worth reading the transfer of, to prune them: those older than
/// [`SETTLED_AGE_MIN_MS`] (the youngest the rule lets go), once at least
/// [`SETTLED_PRUNE_BATCH_MIN`] of them have gathered (one read serves them all) or the account
/// is about full — so most writes read nothing more, and a busy account carries about a
/// minute of entries rather than an hour's (each one rewritten by every write of the account:
/// docs/bench/HISTORY.md). None either when a marker is dated more than [`CLOCK_SKEW_MAX_MS`] ahead of
/// this host: a clock is off by more than the pruning rule allows for.
pub(crate) fn prune_candidates(
    doc: &AccountDoc,
    now: i64,
    eligible: impl Fn(&str) -> bool,
) -> Vec<String> {
    let skew = i64::try_from(CLOCK_SKEW_MAX_MS).expect("fits");
    let age_min = i64::try_from(SETTLED_AGE_MIN_MS).expect("fits");
    let ahead = doc
        .pending
        .iter()
        .filter_map(|m| m.at)
        .chain(doc.settled.iter().map(|s| s.at))
        .any(|at| at > now.saturating_add(skew));
    if ahead {
        tracing::warn!(
            account = %doc.account_id,
            "a marker is dated more than {CLOCK_SKEW_MAX_MS} ms ahead of this host; not pruning"
        );
        return Vec::new();
    }
    let old: Vec<&Settled> = doc
        .settled
        .iter()
        .filter(|s| s.at <= now.saturating_sub(age_min) && eligible(&s.txn))
        .collect();
    if old.is_empty() {
        return Vec::new();
    }
    let nearly_full =
        doc.markers_bytes() + 4 * ID_CHARS_MAX + MARKER_OVERHEAD_BYTES > MARKERS_BYTES_MAX;
    if nearly_full || old.len() >= SETTLED_PRUNE_BATCH_MIN {
        old.into_iter().map(|s| s.txn.clone()).collect()
    } else {
        Vec::new()
    }
}

/// Drops the settled entries `prunable` allows (their transfer read `done` or `cancelled`, every
/// copy known to hold them) that are older than [`SETTLED_AGE_MIN_MS`]; never any other (age
/// alone would trust other hosts' clocks). `true` when it dropped something.
pub(crate) fn prune_settled(
    doc: &mut AccountDoc,
    now: i64,
    prunable: impl Fn(&str) -> bool,
) -> bool {
    let age_min = i64::try_from(SETTLED_AGE_MIN_MS).expect("fits");
    let before = doc.settled.len();
    doc.settled
        .retain(|s| !(prunable(&s.txn) && s.at <= now.saturating_sub(age_min)));
    doc.settled.len() != before
}

// ---- transfer documents ----------------------------------------------------------------------

/// The outcome of one transfer-document write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TxnWrite {
    /// Landed; the new `_rev`.
    Written(String),
    /// Stale `_rev`, or (for a create) the document exists.
    Conflict,
    /// `202`: stored on some copies, maybe beside a rival revision; the new `_rev`. The writer
    /// confirms it on every copy or reads the document again (with its conflicts) and follows
    /// what it finds.
    Uncertain(String),
}

type TxnReply = oneshot::Sender<Result<TxnWrite>>;

struct QueuedTxn {
    id: String,
    doc: RawDoc,
    reply: oneshot::Sender<Result<TxnWrite>>,
}

/// What the account engine's queue holds: account ops, and transfer-document writes.
enum Work {
    Op(QueuedOp),
    Txn(QueuedTxn),
}

impl AccountEngine {
    /// Writes one transfer document (a create without `_rev`, a CAS with one) in the engine's
    /// next round, beside that round's account writes.
    pub(crate) async fn write_txn(self: &Arc<Self>, id: String, doc: RawDoc) -> Result<TxnWrite> {
        let (reply, rx) = oneshot::channel();
        if self.queue.push([Work::Txn(QueuedTxn { id, doc, reply })]) {
            tokio::spawn(Arc::clone(self).drive());
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::invariant(
                "the transfer writer stopped before answering",
            ))
        })
    }

    /// Writes a round's transfer documents (each id at most once) and answers each.
    async fn write_txns(&self, batch: Vec<QueuedTxn>) {
        self.txn_rounds.fetch_add(1, Ordering::Relaxed);
        let (docs, batch): (Vec<RawDoc>, Vec<(String, TxnReply)>) =
            batch.into_iter().map(|q| (q.doc, (q.id, q.reply))).unzip();
        let options = self.quorum.write_options(&self.client, true).await;
        let results = self.bulk.write(docs, options).await.map(results_by_id);
        answer_txns(batch, results);
    }

    /// A round's account writes and its transfer documents in one `_bulk_docs` (the
    /// transfers' decisions go out with the next transfers' applies), when both ask for the same
    /// `w` and fit in [`BULK_BYTES_MAX`]; else (and after a 413) one after the other. The
    /// accounts' answers as [`AccountEngine::write_accounts`] gives them; each transfer document
    /// answered to its writer.
    async fn write_accounts_with(
        &self,
        writes: &[AccountDoc],
        txns: Vec<QueuedTxn>,
    ) -> Vec<Result<BulkResult>> {
        let accounts_w = self.quorum.write_options(&self.client, false).await;
        let txns_w = self.quorum.write_options(&self.client, true).await;
        let raw: Option<Vec<RawDoc>> = writes
            .iter()
            .map(|doc| RawDoc::new(&doc.id, doc).ok())
            .collect();
        let bytes = raw.as_ref().map_or(usize::MAX, |r| {
            r.iter()
                .chain(txns.iter().map(|q| &q.doc))
                .map(RawDoc::bytes)
                .sum()
        });
        let (Some(raw), true) = (raw, accounts_w == txns_w && bytes <= BULK_BYTES_MAX) else {
            let (results, ()) = tokio::join!(self.write_accounts(writes), self.write_txns(txns));
            return results;
        };
        self.txn_rounds.fetch_add(1, Ordering::Relaxed);
        let (txn_docs, batch): (Vec<RawDoc>, Vec<(String, TxnReply)>) =
            txns.into_iter().map(|q| (q.doc, (q.id, q.reply))).unzip();
        let mut docs = raw;
        docs.extend(txn_docs.iter().cloned());
        self.bulk.note_shared();
        match self.bulk.write(docs, accounts_w).await {
            Ok(results) => {
                let mut by_id = results_by_id(results);
                let accounts = writes
                    .iter()
                    .map(|doc| {
                        by_id.remove(&doc.id).ok_or_else(|| {
                            Error::decode(format!("_bulk_docs did not answer for {}", doc.id))
                        })
                    })
                    .collect();
                answer_txns(batch, Ok(by_id));
                accounts
            }
            Err(e) if e.is_too_large() => {
                // Each on its own, where the accounts split further as they need.
                let txns: Vec<QueuedTxn> = batch
                    .into_iter()
                    .zip(txn_docs)
                    .map(|((id, reply), doc)| QueuedTxn { id, doc, reply })
                    .collect();
                let (results, ()) =
                    tokio::join!(self.write_accounts(writes), self.write_txns(txns));
                results
            }
            Err(e) => {
                answer_txns(batch, Err(duplicate(&e)));
                writes.iter().map(|_| Err(duplicate(&e))).collect()
            }
        }
    }

    /// Rounds that wrote transfer documents so far.
    pub(crate) fn txn_rounds(&self) -> u64 {
        self.txn_rounds.load(Ordering::Relaxed)
    }
}

/// Answers each transfer-document write from the `_bulk_docs` results of its request (by id), or
/// with the error of the request.
fn answer_txns(batch: Vec<(String, TxnReply)>, results: Result<HashMap<String, BulkResult>>) {
    let mut by_id = match results {
        Ok(by_id) => by_id,
        Err(e) => {
            for (_, reply) in batch {
                let _ = reply.send(Err(duplicate(&e)));
            }
            return;
        }
    };
    for (id, reply) in batch {
        let Some(r) = by_id.remove(&id) else {
            let e = Error::decode(format!("_bulk_docs did not answer for {id}"));
            let _ = reply.send(Err(e));
            continue;
        };
        let answer = if r.is_ok() && r.accepted {
            Ok(TxnWrite::Uncertain(r.rev.clone().unwrap_or_default()))
        } else if r.is_ok() {
            Ok(TxnWrite::Written(r.rev.clone().unwrap_or_default()))
        } else if r.is_conflict() {
            Ok(TxnWrite::Conflict)
        } else {
            Err(bulk_error(&id, &r))
        };
        let _ = reply.send(answer);
    }
}

/// Transfer-document writes, batched by the account engine with its account writes.
pub(crate) struct TxnWriter {
    engine: Arc<AccountEngine>,
}

impl fmt::Debug for TxnWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxnWriter")
            .field("rounds", &self.engine.txn_rounds())
            .finish_non_exhaustive()
    }
}

impl TxnWriter {
    pub(crate) fn new(engine: Arc<AccountEngine>) -> TxnWriter {
        TxnWriter { engine }
    }

    /// Writes one document (a create without `_rev`, a CAS with one).
    pub(crate) async fn write(&self, id: String, doc: RawDoc) -> Result<TxnWrite> {
        self.engine.write_txn(id, doc).await
    }

    /// Rounds that wrote transfer documents so far.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn rounds(&self) -> u64 {
        self.engine.txn_rounds()
    }
}

// ---- the requests ------------------------------------------------------------------------------

/// The account engine's `_bulk_docs` sender: one request per call, sent from the caller's own
/// task (the engine's driver: a round's account writes and the transfer documents queued
/// meanwhile go out together, `AccountEngine::write_accounts_with`). A queue of
/// its own, merging the batches of two writers, only added a hand-over between tasks to every
/// request (~1.8 ms between two requests under `p8`'s load).
pub(crate) struct BulkWriter {
    client: Client,
    requests: AtomicU64,
    /// Requests that carried account and transfer documents together.
    shared: AtomicU64,
}

impl fmt::Debug for BulkWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkWriter")
            .field("requests", &self.requests.load(Ordering::Relaxed))
            .field("shared", &self.shared.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl BulkWriter {
    pub(crate) fn new(client: Client) -> BulkWriter {
        BulkWriter {
            client,
            requests: AtomicU64::new(0),
            shared: AtomicU64::new(0),
        }
    }

    /// Writes `docs` (each with its `_id`) with `_bulk_docs`: one result per document, in
    /// order, or the error of the request that carried them (unknown whether they landed).
    pub(crate) async fn write(
        &self,
        docs: Vec<RawDoc>,
        options: WriteOptions,
    ) -> Result<Vec<BulkResult>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let docs: Vec<&RawDoc> = docs.iter().collect();
        self.client.bulk_docs_raw(&docs, &options).await
    }

    /// Counts a request that carried both kinds of documents.
    fn note_shared(&self) {
        self.shared.fetch_add(1, Ordering::Relaxed);
    }

    /// `_bulk_docs` requests sent, and how many of them carried account and transfer documents
    /// together.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn stats(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.shared.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn account(balance: i64, min: Option<i64>) -> AccountDoc {
        AccountDoc::from_value(json!({
            "_id": "account:a", "_rev": "1-x", "type": "account", "account_id": "a",
            "currency": "EUR", "opening": balance, "balance": balance, "min_balance": min,
            "pending": [], "settled": []
        }))
        .unwrap()
    }

    fn apply(txn: &str, delta: i64, check: bool, link: Option<u64>) -> AccountOp {
        AccountOp {
            account: "a".into(),
            txn: txn.into(),
            kind: OpKind::Apply {
                delta: Amount::new(delta).unwrap(),
                currency: "EUR".into(),
                check_funds: check,
                deadline: None,
                attempt: None,
                peer: None,
                exists: true,
            },
            link,
        }
    }

    /// A one-write apply of `txn` by attempt `a`, `peer` the other account.
    fn once(txn: &str, delta: i64, a: u64, peer: &str, exists: bool) -> AccountOp {
        AccountOp {
            account: "a".into(),
            txn: txn.into(),
            kind: OpKind::Apply {
                delta: Amount::new(delta).unwrap(),
                currency: "EUR".into(),
                check_funds: delta < 0,
                deadline: None,
                attempt: Some(Attempt::from_bits(a)),
                peer: Some(peer.into()),
                exists,
            },
            link: None,
        }
    }

    fn settle_named(txn: &str, a: u64, delta: i64) -> AccountOp {
        op(
            txn,
            OpKind::Settle {
                named: Some(Attempt::from_bits(a)),
                delta: Amount::new(delta).unwrap(),
            },
        )
    }

    fn settle(delta: i64) -> OpKind {
        OpKind::Settle {
            named: None,
            delta: Amount::new(delta).unwrap(),
        }
    }

    #[test]
    fn a_one_write_apply_adopts_the_marker_of_another_attempt_with_the_same_terms() {
        let none = HashSet::new();
        let mut doc = account(1_000, Some(0));
        assert_eq!(
            evaluate(Some(&mut doc), &once("t", -300, 1, "b", false), 1, &none).unwrap(),
            OpResult::Applied
        );
        let m = &doc.pending[0];
        assert_eq!(
            (m.attempt, m.peer.as_deref()),
            (Some(Attempt::from_bits(1)), Some("b"))
        );
        // A second attempt: the first's marker counts as its own, nothing changes.
        assert_eq!(
            evaluate(Some(&mut doc), &once("t", -300, 2, "b", false), 2, &none).unwrap(),
            OpResult::Adopted(Attempt::from_bits(1))
        );
        assert_eq!((doc.balance.minor(), doc.pending.len()), (700, 1));
        // Other terms under the same id: a mismatch naming the term, nothing changes.
        assert_eq!(
            evaluate(Some(&mut doc), &once("t", -200, 3, "b", false), 3, &none).unwrap(),
            OpResult::Mismatch("value")
        );
        assert_eq!(
            evaluate(Some(&mut doc), &once("t", -300, 3, "c", false), 3, &none).unwrap(),
            OpResult::Mismatch("destination")
        );
        assert_eq!((doc.balance.minor(), doc.pending.len()), (700, 1));
        // Where the transfer's document says other terms, that marker can never be named: it
        // is taken back and this apply lands.
        assert_eq!(
            evaluate(Some(&mut doc), &once("t", -300, 4, "c", true), 4, &none).unwrap(),
            OpResult::Applied
        );
        assert_eq!(doc.balance.minor(), 700);
        assert_eq!(doc.pending.len(), 1);
        assert_eq!(doc.pending[0].peer.as_deref(), Some("c"));
        assert!(
            doc.settled.is_empty(),
            "no entry: this transfer is being applied"
        );
    }

    #[test]
    fn a_one_write_apply_follows_a_decided_transfer_and_a_stepwise_marker() {
        let none = HashSet::new();
        let mut doc = account(1_000, Some(0));
        evaluate(Some(&mut doc), &apply("s", -100, true, None), 1, &none).unwrap();
        assert_eq!(
            evaluate(Some(&mut doc), &once("s", -100, 1, "b", false), 2, &none).unwrap(),
            OpResult::AlreadyPending,
            "a stepwise marker: its document exists, follow it"
        );
        evaluate(Some(&mut doc), &op("s", settle(-100)), 3, &none).unwrap();
        assert_eq!(
            evaluate(Some(&mut doc), &once("s", -100, 1, "b", false), 4, &none).unwrap(),
            OpResult::Finished
        );
        assert_eq!(doc.balance.minor(), 900);
    }

    #[test]
    fn a_named_settle_settles_its_marker_and_undoes_another_attempts() {
        let none = HashSet::new();
        // The named attempt: settled, with an entry (several copies) or none (one copy).
        for entries in [true, false] {
            let mut doc = account(1_000, Some(0));
            evaluate(Some(&mut doc), &once("t", 250, 7, "b", false), 1, &none).unwrap();
            assert_eq!(
                evaluate_with(
                    Some(&mut doc),
                    &settle_named("t", 7, 250),
                    2,
                    &none,
                    entries
                )
                .unwrap(),
                OpResult::Applied
            );
            assert_eq!((doc.balance.minor(), doc.pending.len()), (1_250, 0));
            assert_eq!(doc.settled.len(), usize::from(entries));
            // Again: nothing left to do.
            let again = evaluate_with(
                Some(&mut doc),
                &settle_named("t", 7, 250),
                3,
                &none,
                entries,
            );
            let expect = if entries {
                OpResult::Finished
            } else {
                OpResult::Absent
            };
            assert_eq!(again.unwrap(), expect);
        }
        // Another attempt's marker (a late apply after the entry went): undone, never counted.
        let mut doc = account(1_000, Some(0));
        evaluate(Some(&mut doc), &once("t", 250, 8, "b", false), 1, &none).unwrap();
        assert_eq!(
            evaluate_with(Some(&mut doc), &settle_named("t", 7, 250), 2, &none, false).unwrap(),
            OpResult::Repaired
        );
        assert_eq!((doc.balance.minor(), doc.pending.len()), (1_000, 0));
        // A marker that carries the named attempt among its merged ones is the decision's
        // marker; one without attempt (a stepwise drive's, beside the decision) or with other
        // terms is not: undone.
        for (attempt, aliases, delta, settled) in [
            (Some(9), vec![7], 250, true),
            (None, vec![], 250, false),
            (Some(7), vec![], 240, false),
        ] {
            let mut doc = account(1_000, Some(0));
            doc.balance = Amount::new(1_000 + delta).unwrap();
            doc.pending.push(Marker {
                txn: "t".into(),
                delta: Amount::new(delta).unwrap(),
                at: Some(1),
                attempt: attempt.map(Attempt::from_bits),
                peer: Some("b".into()),
                aliases: aliases.into_iter().map(Attempt::from_bits).collect(),
            });
            let (answer, balance) = if settled {
                (OpResult::Applied, 1_250)
            } else {
                (OpResult::Repaired, 1_000)
            };
            assert_eq!(
                evaluate(Some(&mut doc), &settle_named("t", 7, 250), 2, &none).unwrap(),
                answer
            );
            assert_eq!((doc.balance.minor(), doc.pending.len()), (balance, 0));
        }
    }

    #[test]
    fn a_stepwise_settle_settles_only_a_marker_of_its_terms() {
        let none = HashSet::new();
        // A one-write marker of the same terms (adopted by the stepwise drive): settled.
        let mut doc = account(1_000, Some(0));
        evaluate(Some(&mut doc), &once("t", -300, 1, "b", false), 1, &none).unwrap();
        assert_eq!(
            evaluate(Some(&mut doc), &op("t", settle(-300)), 2, &none).unwrap(),
            OpResult::Applied
        );
        assert_eq!((doc.balance.minor(), doc.pending.len()), (700, 0));
        // One of the same id with other terms: undone, this transfer's marker still to settle.
        let mut doc = account(1_000, Some(0));
        evaluate(Some(&mut doc), &once("t", -270, 1, "b", false), 1, &none).unwrap();
        assert_eq!(
            evaluate(Some(&mut doc), &op("t", settle(-300)), 2, &none).unwrap(),
            OpResult::Repaired
        );
        assert_eq!((doc.balance.minor(), doc.pending.len()), (1_000, 0));
    }

    #[test]
    fn an_adopted_debit_on_an_account_a_merge_overdrew_is_refused_not_taken_back() {
        let none = HashSet::new();
        let mut doc = account(500, Some(0));
        evaluate(Some(&mut doc), &once("t1", -300, 1, "b", false), 1, &none).unwrap();
        // A rival branch's debit merged in: below the minimum.
        doc.balance = Amount::new(-100).unwrap();
        assert_eq!(
            evaluate(Some(&mut doc), &once("t1", -300, 2, "b", false), 2, &none).unwrap(),
            OpResult::Overdrawn
        );
        assert_eq!(
            doc.pending.len(),
            1,
            "undone only after its transfer is decided"
        );
        assert_eq!(doc.balance.minor(), -100);
    }

    fn op(txn: &str, kind: OpKind) -> AccountOp {
        AccountOp {
            account: "a".into(),
            txn: txn.into(),
            kind,
            link: None,
        }
    }

    #[test]
    fn a_debit_found_on_an_account_a_merge_overdrew_is_taken_back() {
        let none = HashSet::new();
        // Two debits of 300 on a balance of 500, each checked on its own copy, merged.
        let mut doc = account(500, Some(0));
        evaluate(Some(&mut doc), &apply("t1", -300, true, None), 1, &none).unwrap();
        doc.balance = Amount::new(-100).unwrap();
        doc.pending.push(Marker {
            txn: "t2".into(),
            delta: Amount::new(-300).unwrap(),
            at: Some(1),
            attempt: None,
            peer: None,
            aliases: Vec::new(),
        });
        assert_eq!(
            evaluate(Some(&mut doc), &apply("t2", -300, true, None), 2, &none).unwrap(),
            OpResult::Withdrawn
        );
        assert_eq!(doc.balance.minor(), 200);
        assert_eq!(doc.pending.len(), 1);
        assert!(doc.settled.iter().any(|s| s.txn == "t2" && s.undone));
        // Back above the minimum: the other debit's repeat is a plain skip.
        assert_eq!(
            evaluate(Some(&mut doc), &apply("t1", -300, true, None), 3, &none).unwrap(),
            OpResult::AlreadyPending
        );
        assert_eq!(doc.balance.minor(), 200);
    }

    #[test]
    fn apply_settle_undo_are_idempotent() {
        let none = HashSet::new();
        let mut doc = account(1000, Some(0));
        assert_eq!(
            evaluate(Some(&mut doc), &apply("t", -300, true, None), 1, &none).unwrap(),
            OpResult::Applied
        );
        assert_eq!(doc.balance.minor(), 700);
        assert_eq!(
            evaluate(Some(&mut doc), &apply("t", -300, true, None), 2, &none).unwrap(),
            OpResult::AlreadyPending
        );
        assert_eq!(doc.balance.minor(), 700);
        assert_eq!(
            evaluate(Some(&mut doc), &op("t", settle(-300)), 3, &none).unwrap(),
            OpResult::Applied
        );
        assert!(doc.pending.is_empty());
        // A late apply after the settle finds the settled entry and skips.
        assert_eq!(
            evaluate(Some(&mut doc), &apply("t", -300, true, None), 4, &none).unwrap(),
            OpResult::Finished
        );
        assert_eq!(
            evaluate(
                Some(&mut doc),
                &op("t", OpKind::Undo { decided: false }),
                5,
                &none
            )
            .unwrap(),
            OpResult::Finished
        );
        assert_eq!(doc.balance.minor(), 700);
        // An undo that finds nothing leaves an undone entry, so a late apply of that transfer
        // skips instead of landing
        assert_eq!(
            evaluate(
                Some(&mut doc),
                &op("u", OpKind::Undo { decided: false }),
                5,
                &none
            )
            .unwrap(),
            OpResult::Applied
        );
        assert_eq!(doc.balance.minor(), 700);
        assert!(doc.settled.iter().any(|s| s.txn == "u" && s.undone));
        // (answered as a failure, so its drive cancels: the transfer is being cancelled)
        assert_eq!(
            evaluate(Some(&mut doc), &apply("u", -100, true, None), 6, &none).unwrap(),
            OpResult::Withdrawn
        );
        assert_eq!(doc.balance.minor(), 700);
        assert_eq!(
            evaluate(Some(&mut doc), &op("v", settle(-100)), 7, &none).unwrap(),
            OpResult::Absent
        );
    }

    #[test]
    fn undo_reverses_and_blocks_a_late_apply() {
        let none = HashSet::new();
        let mut doc = account(1000, Some(0));
        evaluate(Some(&mut doc), &apply("t", 250, false, None), 1, &none).unwrap();
        assert_eq!(doc.balance.minor(), 1250);
        assert_eq!(
            doc.available().unwrap().minor(),
            1000,
            "a pending credit is not spendable"
        );
        assert_eq!(
            evaluate(
                Some(&mut doc),
                &op("t", OpKind::Undo { decided: false }),
                2,
                &none
            )
            .unwrap(),
            OpResult::Applied
        );
        assert_eq!(doc.balance.minor(), 1000);
        assert!(doc.settled[0].undone);
        // A late apply of an undone transfer is refused as a failure: its drive cancels, never
        // commits the other account's delta alone.
        let late = evaluate(Some(&mut doc), &apply("t", 250, false, None), 3, &none).unwrap();
        assert_eq!(late, OpResult::Withdrawn);
        assert_eq!(doc.balance.minor(), 1000);
        assert_eq!(doc.settled.len(), 1);
    }

    #[test]
    fn funds_are_checked_against_available_and_links_stop_the_pair() {
        let mut links = HashSet::new();
        let mut doc = account(100, Some(0));
        evaluate(Some(&mut doc), &apply("c", 500, false, None), 1, &links).unwrap();
        // 600 on the books, but only 100 available.
        assert_eq!(
            evaluate(Some(&mut doc), &apply("d", -101, true, Some(7)), 2, &links).unwrap(),
            OpResult::Insufficient
        );
        assert_eq!(
            evaluate(Some(&mut doc), &apply("d", -100, true, None), 2, &links).unwrap(),
            OpResult::Applied
        );
        links.insert(9);
        assert_eq!(
            evaluate(Some(&mut doc), &apply("e", 5, false, Some(9)), 3, &links).unwrap(),
            OpResult::NotApplied
        );
        // Unlimited accounts go negative; other currencies and missing accounts are refused.
        let mut issuer = account(0, None);
        assert_eq!(
            evaluate(Some(&mut issuer), &apply("f", -5, true, None), 1, &links).unwrap(),
            OpResult::Applied
        );
        let mut usd = apply("g", 5, false, None);
        if let OpKind::Apply { currency, .. } = &mut usd.kind {
            *currency = "USD".into();
        }
        assert_eq!(
            evaluate(Some(&mut issuer), &usd, 1, &links).unwrap(),
            OpResult::CurrencyMismatch
        );
        assert_eq!(
            evaluate(None, &usd, 1, &links).unwrap(),
            OpResult::UnknownAccount
        );
    }

    #[test]
    fn pruning_needs_a_terminal_transfer_and_an_old_entry() {
        let now = 10_000_000_000i64;
        let old = now - i64::try_from(SETTLED_AGE_MIN_MS).unwrap() - 1;
        let young = now - 1;
        let mut doc = account(0, None);
        for i in 0..SETTLED_PRUNE_BATCH_MIN {
            doc.settled.push(Settled {
                txn: format!("old{i}"),
                at: old,
                undone: false,
            });
        }
        for txn in ["open", "young"] {
            doc.settled.push(Settled {
                txn: txn.into(),
                at: if txn == "young" { young } else { old },
                undone: false,
            });
        }
        let every = |_: &str| true;
        let candidates = prune_candidates(&doc, now, every);
        assert_eq!(candidates.len(), SETTLED_PRUNE_BATCH_MIN + 1);
        // Entries not known to be on every copy are not candidates.
        assert!(prune_candidates(&doc, now, |t| t == "open").is_empty());
        assert!(!candidates.contains(&"young".to_owned()));
        // The transfer read says: every `old*` ended, `open` did not; `young` ended too.
        let mut terminal: HashSet<String> = (0..SETTLED_PRUNE_BATCH_MIN)
            .map(|i| format!("old{i}"))
            .collect();
        terminal.insert("young".into());
        // Nothing the copies rule forbids goes, whatever its transfer.
        assert!(!prune_settled(&mut doc, now, |_| false));
        assert!(prune_settled(&mut doc, now, |t| terminal.contains(t)));
        let left: Vec<&str> = doc.settled.iter().map(|s| s.txn.as_str()).collect();
        assert_eq!(left, ["open", "young"]);
        // Too few old entries on a small account: nothing to read.
        assert!(prune_candidates(&doc, now, every).is_empty());
        // A marker dated far ahead of this host: a clock is off, no pruning at all.
        let mut skewed = account(0, None);
        for i in 0..SETTLED_PRUNE_BATCH_MIN {
            skewed.settled.push(Settled {
                txn: format!("old{i}"),
                at: old,
                undone: false,
            });
        }
        skewed.settled.push(Settled {
            txn: "future".into(),
            at: now + i64::try_from(CLOCK_SKEW_MAX_MS).unwrap() + 1,
            undone: false,
        });
        assert!(prune_candidates(&skewed, now, every).is_empty());
    }

    #[test]
    fn applies_stop_at_the_size_cap_and_undos_at_the_slack() {
        let none = HashSet::new();
        let mut doc = account(0, None);
        let id = "x".repeat(100);
        let per = marker_bytes(&id);
        let n = MARKERS_BYTES_MAX / per;
        for i in 0..n {
            doc.settled.push(Settled {
                txn: format!("{i:0>100}"),
                at: 1,
                undone: false,
            });
        }
        assert!(doc.markers_bytes() <= MARKERS_BYTES_MAX);
        let e = evaluate(
            Some(&mut doc),
            &apply(&"t".repeat(100), 5, false, None),
            2,
            &none,
        )
        .unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().contains("account_full"), "{e}");
        assert_eq!(doc.balance.minor(), 0);
        // An undo that finds nothing still records its entry, within the slack.
        assert_eq!(
            evaluate(
                Some(&mut doc),
                &op("u", OpKind::Undo { decided: false }),
                3,
                &none
            )
            .unwrap(),
            OpResult::Applied
        );
        assert!(doc.markers_bytes() <= MARKERS_BYTES_MAX + MARKERS_UNDO_SLACK_BYTES);
    }

    #[test]
    fn an_empty_take_ends_the_turn() {
        let q: Queue<u32> = Queue::new();
        assert!(q.push([1, 2]));
        assert!(!q.push([3]), "one driver at a time");
        assert_eq!(q.take(2), vec![1, 2]);
        assert_eq!(q.take(2), vec![3]);
        assert!(q.take(2).is_empty());
        assert!(q.push([4]), "the next push starts a driver again");
    }

    /// Settled entries follow the copies the database states, read again once the last read
    /// expired (a database given copies while the ledger runs), and the knobs override them.
    #[tokio::test]
    async fn settled_entries_follow_the_stated_copies_and_the_knobs() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};
        let server = MockServer::start().await;
        let info = |n: Option<u32>| {
            let cluster = n.map(|n| json!({"q": 2, "n": n, "w": 1, "r": 1}));
            ResponseTemplate::new(200).set_body_json(json!({"db_name": "db", "cluster": cluster}))
        };
        for n in [Some(1), Some(3), None] {
            Mock::given(method("GET"))
                .and(path("/db"))
                .respond_with(info(n))
                .up_to_n_times(1)
                .expect(1)
                .mount(&server)
                .await;
        }
        let client = client_on(&server.uri());
        let q = Quorum::new(WriteQuorum::default(), Entries::default());
        assert_eq!(q.keeps_entries(&client).await, Some(false), "n = 1");
        assert_eq!(q.keeps_entries(&client).await, Some(false), "read once");
        assert_eq!(q.write_options(&client, true).await.w, None);
        q.expire();
        assert_eq!(q.keeps_entries(&client).await, Some(true), "n = 3 now");
        assert_eq!(q.write_options(&client, true).await.w, Some(3));
        q.expire();
        assert_eq!(q.keeps_entries(&client).await, Some(true), "not stated");
        server.verify().await;
        // The knobs ask nothing.
        for (entries, keeps) in [(Entries::Always, true), (Entries::Never, false)] {
            let q = Quorum::new(WriteQuorum::default(), entries);
            assert_eq!(q.keeps_entries(&client).await, Some(keeps), "{entries:?}");
        }
        // A database that cannot be read: unknown (entries written, merges wait).
        let gone = client_on("http://127.0.0.1:9");
        let q = Quorum::new(WriteQuorum::default(), Entries::default());
        assert_eq!(q.keeps_entries(&gone).await, None);
    }

    fn client_on(uri: &str) -> Client {
        Client::builder().url(uri).database("db").build().unwrap()
    }

    fn engine_on(uri: &str) -> Arc<AccountEngine> {
        let bulk = Arc::new(BulkWriter::new(client_on(uri)));
        Arc::new(AccountEngine::new(
            bulk,
            Arc::new(Quorum::new(WriteQuorum::default(), Entries::default())),
            Arc::new(ConflictTally::default()),
        ))
    }

    fn hold(engine: &AccountEngine, account: &str, txn: &str, due: Instant) {
        let (reply, _rx) = oneshot::channel();
        engine.held().push(HeldOp {
            due,
            queued: QueuedOp {
                op: AccountOp {
                    account: account.to_owned(),
                    txn: txn.to_owned(),
                    kind: settle(1),
                    link: None,
                },
                reply: Reply::One(reply),
            },
        });
    }

    #[tokio::test]
    async fn held_ops_go_with_a_batch_of_their_account_else_at_their_time() {
        let engine = engine_on("http://127.0.0.1:9");
        let later = Instant::now() + std::time::Duration::from_secs(60);
        hold(&engine, "a", "t1", later);
        hold(&engine, "b", "t2", later);
        hold(&engine, "a", "t3", later);
        let (reply, _rx) = oneshot::channel();
        let batch = vec![QueuedOp {
            op: op("t9", settle(1)),
            reply: Reply::One(reply),
        }];
        // `op` is on account "a": both of a's held settles join, b's stays held.
        let folded = engine.fold_held(&batch);
        let txns: Vec<&str> = folded.iter().map(|q| q.op.txn.as_str()).collect();
        assert_eq!(txns, ["t1", "t3"]);
        assert_eq!(engine.folded(), 2);
        assert_eq!(engine.held().len(), 1);
        // Not due: a release of the due ones leaves it; its time (or a flush) sends it.
        engine.release(|h| h.due <= Instant::now());
        assert_eq!(engine.held().len(), 1);
        engine.release_held();
        assert!(engine.held().is_empty());
        assert_eq!(engine.folded(), 2, "released, not folded");
    }

    // ---- one request a round ---------------------------------------------------------------

    /// `_bulk_docs` answered with each document `ok` and a revision of its own; `_all_docs`
    /// with each account asked for (balance 1,000; account `a` when no keys are given).
    struct Server;

    impl wiremock::Respond for Server {
        fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
            if request.url.path().ends_with("_all_docs") {
                let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                let keys: Vec<String> = match body["keys"].as_array() {
                    Some(keys) => keys
                        .iter()
                        .filter_map(|k| k.as_str().map(String::from))
                        .collect(),
                    None => vec!["account:a".into()],
                };
                let rows: Vec<Value> = keys
                    .iter()
                    .map(|id| {
                        let account = id.trim_start_matches("account:");
                        json!({
                            "id": id, "key": id, "value": {"rev": "1-x"},
                            "doc": {
                                "_id": id, "_rev": "1-x", "type": "account",
                                "account_id": account, "currency": "EUR", "opening": 1000,
                                "balance": 1000, "min_balance": 0, "pending": [], "settled": []
                            }
                        })
                    })
                    .collect();
                return wiremock::ResponseTemplate::new(200)
                    .set_body_json(json!({"total_rows": rows.len(), "offset": 0, "rows": rows}));
            }
            let body: Value = serde_json::from_slice(&request.body).unwrap();
            let results: Vec<Value> = body["docs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| json!({"ok": true, "id": d["_id"], "rev": "2-y"}))
                .collect();
            wiremock::ResponseTemplate::new(201).set_body_json(results)
        }
    }

    #[tokio::test]
    async fn a_round_writes_its_accounts_and_the_transfer_documents_queued_in_one_request() {
        let (server, engine) = one_request_server().await;
        // An apply and a transfer document, queued before the driver takes its batch.
        let (op_reply, op_rx) = oneshot::channel();
        let (txn_reply, txn_rx) = oneshot::channel();
        assert!(engine.queue.push([
            Work::Op(QueuedOp {
                op: apply("t", -100, true, None),
                reply: Reply::One(op_reply),
            }),
            Work::Txn(QueuedTxn {
                id: "txn:u".into(),
                doc: RawDoc::new("txn:u", &json!({"_id": "txn:u", "state": "done"})).unwrap(),
                reply: txn_reply,
            }),
        ]));
        tokio::spawn(Arc::clone(&engine).drive());
        assert_eq!(op_rx.await.unwrap().unwrap(), OpResult::Applied);
        assert_eq!(
            txn_rx.await.unwrap().unwrap(),
            TxnWrite::Written("2-y".into())
        );
        assert_eq!(
            bulk_ids(&server).await,
            [vec!["account:a", "txn:u"]],
            "one _bulk_docs for both"
        );
        assert_eq!(engine.bulk.stats(), (1, 1));
    }

    /// The ids in each `_bulk_docs` request `server` received, in order.
    async fn bulk_ids(server: &wiremock::MockServer) -> Vec<Vec<String>> {
        server
            .received_requests()
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.url.path().ends_with("_bulk_docs"))
            .map(|r| {
                let body: Value = serde_json::from_slice(&r.body).unwrap();
                body["docs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d["_id"].as_str().unwrap().to_owned())
                    .collect()
            })
            .collect()
    }

    /// A server answering as [`Server`] does, and an engine on it.
    async fn one_request_server() -> (wiremock::MockServer, Arc<AccountEngine>) {
        use wiremock::matchers::{method, path_regex};
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(method("GET"))
            .and(path_regex("/db$"))
            .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!({})))
            .mount(&server)
            .await;
        wiremock::Mock::given(method("POST"))
            .respond_with(Server)
            .mount(&server)
            .await;
        let engine = engine_on(&server.uri());
        (server, engine)
    }

    /// The linked one-write applies of transfer `t` (100 from `a` to `b`, attempt 7).
    fn pair(engine: &AccountEngine) -> [AccountOp; 2] {
        let link = Some(engine.next_link());
        [("a", "b", -100), ("b", "a", 100)].map(|(account, peer, delta)| AccountOp {
            account: account.into(),
            link,
            ..once("t", delta, 7, peer, false)
        })
    }

    #[tokio::test]
    async fn the_engine_writes_a_pairs_decision_in_the_round_after_both_applies() {
        let (server, engine) = one_request_server().await;
        let [debit, credit] = pair(&engine);
        let seen: Arc<Mutex<Option<(OpResult, OpResult)>>> = Arc::default();
        let decide: Decide = {
            let seen = Arc::clone(&seen);
            Box::new(move |d, c| {
                *seen.lock().unwrap() = Some((d, c));
                let doc = RawDoc::new("txn:t", &json!({"_id": "txn:t", "state": "done"})).unwrap();
                Some(("txn:t".into(), doc))
            })
        };
        let decided = engine.run_decided([debit, credit], decide, None).await;
        assert_eq!(decided.debit.unwrap(), OpResult::Applied);
        assert_eq!(decided.credit.unwrap(), OpResult::Applied);
        assert_eq!(
            *seen.lock().unwrap(),
            Some((OpResult::Applied, OpResult::Applied)),
            "decided of both answers"
        );
        let written = decided.write.expect("a decision to write").await.unwrap();
        assert_eq!(written.unwrap(), TxnWrite::Written("2-y".into()));
        assert_eq!(
            bulk_ids(&server).await,
            [vec!["account:a", "account:b"], vec!["txn:t"]],
            "the applies in one round, the decision in the next"
        );
    }

    #[tokio::test]
    async fn a_pair_the_engine_cannot_decide_answers_without_a_write() {
        let (server, engine) = one_request_server().await;
        let [debit, credit] = pair(&engine);
        let decided = engine
            .run_decided([debit, credit], Box::new(|_, _| None), None)
            .await;
        assert_eq!(decided.debit.unwrap(), OpResult::Applied);
        assert_eq!(decided.credit.unwrap(), OpResult::Applied);
        assert!(decided.write.is_none());
        assert_eq!(bulk_ids(&server).await, [vec!["account:a", "account:b"]]);
    }
}
