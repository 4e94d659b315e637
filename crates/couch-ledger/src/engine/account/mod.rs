//! The account engine: its queue of account ops and transfer-document writes, the ops it holds
//! back to go with their account's next write, the pairs of applies whose decision it writes
//! itself, its driver task, and what it remembers of accounts between rounds. The parts of a
//! round are its own files: `round` (read, decide, write, retry), `read` (accounts, a
//! conflict's leaves merged) and `txn` (the transfer documents a round writes, and the
//! [`TxnWriter`] that queues them).

mod read;
mod round;
mod txn;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use super::bulk::BulkWriter;
use super::ops::{AccountOp, Decide, Decided, Hold, OpKind, OpResult, TxnWrite};
use super::queue::{DriverGuard, Queue};
use super::quorum::{ConflictTally, Quorum};
use crate::account_doc::AccountDoc;
use crate::clock::Instant;
use crate::couch::{Client, RawDoc};
use crate::error::{Error, Result};
use crate::limits::{
    ACCOUNT_BATCH_OPS_MAX, ACCOUNT_CACHE_MAX, ENDED_KNOWN_MAX, ENGINE_ROUNDS_MAX,
    PRUNE_CONFIRMED_MS, TXN_BATCH_DOCS_MAX,
};

pub(crate) use self::txn::TxnWriter;

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
    /// Account writes only accepted (202) or conflicts seen, each holding its account's pruning
    /// back ([`AccountEngine::unconfirm`]).
    unconfirmed: AtomicU64,
    /// Per account, its settled entries every copy is known to hold, and since when: seen in a
    /// revision this engine wrote that every copy took. Only those may be pruned
    /// ([`PRUNE_CONFIRMED_MS`]).
    confirmed: Mutex<HashMap<String, HashMap<String, Instant>>>,
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
            unconfirmed: AtomicU64::new(0),
            confirmed: Mutex::new(HashMap::new()),
        }
    }

    /// Records that this ledger wrote `txn`'s end and that it stands alone (`done` or
    /// `cancelled` created with a 201, or any end answered 201 on one copy).
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

    /// Account writes only accepted (202), or conflicts seen, so far: each held its account's
    /// pruning back for [`PRUNE_CONFIRMED_MS`].
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn unconfirmed(&self) -> u64 {
        self.unconfirmed.load(Ordering::Relaxed)
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
        self.unconfirmed.fetch_add(1, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fixtures::{
        bulk_docs_sent, bulk_ids, bulk_ok, engine_on, once, one_request_server, op, settle,
    };
    use serde_json::json;

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

    /// The linked one-write applies of transfer `t` (100 from `a` to `b`, attempt 7).
    fn pair(engine: &AccountEngine) -> [AccountOp; 2] {
        let link = Some(engine.next_link());
        [("a", "b", -100), ("b", "a", 100)].map(|(account, peer, delta)| AccountOp {
            account: account.into(),
            link,
            ..once("t", delta, 7, peer)
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

    /// `server` answers a read of every copy of account `a` (`open_revs=all`, `r` = 3) with
    /// `rows`.
    async fn every_copy_holds(server: &wiremock::MockServer, rows: serde_json::Value) {
        use wiremock::matchers::{method, path_regex, query_param};
        wiremock::Mock::given(method("GET"))
            .and(path_regex("/db/account(:|%3A)a$"))
            .and(query_param("open_revs", "all"))
            .and(query_param("r", "3"))
            .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(rows))
            .mount(server)
            .await;
    }

    /// The revisions `server` was sent deletes of, in order.
    async fn deleted_revs(server: &wiremock::MockServer) -> Vec<String> {
        bulk_docs_sent(server)
            .await
            .into_iter()
            .flatten()
            .filter(|d| d["_deleted"] == true)
            .map(|d| d["_rev"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    /// Account `a` as a leaf at revision `rev`, holding nothing of any transfer.
    fn leaf(rev: &str) -> serde_json::Value {
        json!({
            "_id": "account:a", "_rev": rev, "type": "account", "account_id": "a",
            "currency": "EUR", "opening": 1000, "balance": 1000, "min_balance": 0,
            "pending": [], "settled": []
        })
    }

    /// The documents `server` was sent to write, deletes left out, in order.
    async fn written_docs(server: &wiremock::MockServer) -> Vec<serde_json::Value> {
        bulk_docs_sent(server)
            .await
            .into_iter()
            .flatten()
            .filter(|d| d["_deleted"] != true)
            .collect()
    }

    /// A conflict pass over account `a` on `server`, which must succeed.
    async fn resolve_a(server: &wiremock::MockServer) {
        let engine = engine_on(&server.uri());
        let resolve = AccountOp {
            account: "a".into(),
            txn: String::new(),
            kind: OpKind::Resolve,
            link: None,
        };
        let results = engine.run(vec![resolve]).await;
        assert!(results[0].is_ok(), "{results:?}");
    }

    /// `server` answers `_all_docs` with, per key asked, the row `row(key)`.
    async fn all_docs_answers(
        server: &wiremock::MockServer,
        row: impl Fn(&str) -> serde_json::Value + Send + Sync + 'static,
    ) {
        use wiremock::matchers::{method, path};
        wiremock::Mock::given(method("POST"))
            .and(path("/db/_all_docs"))
            .respond_with(move |r: &wiremock::Request| {
                let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                let rows: Vec<serde_json::Value> = body["keys"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|k| row(k.as_str().unwrap()))
                    .collect();
                wiremock::ResponseTemplate::new(200).set_body_json(json!({
                    "total_rows": rows.len(), "offset": 0, "rows": rows
                }))
            })
            .mount(server)
            .await;
    }

    /// A server whose database `db` states three copies of each document, and takes every
    /// document of a `_bulk_docs` at revision `3-y`.
    async fn three_copies() -> wiremock::MockServer {
        use wiremock::matchers::{method, path, path_regex};
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(method("GET"))
            .and(path_regex("/db$"))
            .respond_with(
                wiremock::ResponseTemplate::new(200)
                    .set_body_json(json!({"cluster": {"n": 3, "q": 1}})),
            )
            .mount(&server)
            .await;
        wiremock::Mock::given(method("POST"))
            .and(path("/db/_bulk_docs"))
            .respond_with(|r: &wiremock::Request| bulk_ok(r, "3-y"))
            .mount(&server)
            .await;
        server
    }

    /// A cluster whose `_all_docs` copy holds account `a` with two losing leaves, while the copy
    /// answering `open_revs` holds only the first (the second has not reached it yet): the
    /// merge joins the first and deletes only it. Deleting the second too would throw away
    /// the marker only it holds (a stress on three replicating servers lost a credit so).
    #[tokio::test]
    async fn a_merge_deletes_only_the_losing_leaves_it_read() {
        use wiremock::matchers::{method, path, path_regex, query_param};
        use wiremock::{Mock, ResponseTemplate};
        let server = three_copies().await;
        let mut winner = leaf("2-w");
        winner["_conflicts"] = json!(["2-l1", "2-l2"]);
        Mock::given(method("POST"))
            .and(path("/db/_all_docs"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "total_rows": 1, "offset": 0,
                "rows": [{"id": "account:a", "key": "account:a", "value": {"rev": "2-w"},
                          "doc": winner}]
            })))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path_regex("/db/account(:|%3A)a$"))
            .and(query_param("open_revs", r#"["2-l1","2-l2"]"#))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([
                {"ok": leaf("2-l1")},
                {"missing": "2-l2"}
            ])))
            .mount(&server)
            .await;
        let engine = engine_on(&server.uri());
        let results = engine.run(vec![op("u", settle(5))]).await;
        assert!(results[0].is_ok(), "{results:?}");
        let deleted = deleted_revs(&server).await;
        assert_eq!(deleted, ["2-l1"], "only the leaf read is deleted");
    }

    /// Account `a` (opening 100, minimum 0) at revision `rev`, holding `txn`'s debit pending.
    fn debited(rev: &str, txn: &str, delta: i64) -> serde_json::Value {
        json!({
            "_id": "account:a", "_rev": rev, "type": "account", "account_id": "a",
            "currency": "EUR", "opening": 100, "balance": 100 + delta, "min_balance": 0,
            "pending": [{"txn": txn, "delta": delta, "at": 1}], "settled": []
        })
    }

    /// A retry of an apply whose debit of 80 is on the copies a quorum read asks, while a rival
    /// debit of 70 (another writer on the same revision, both answered 202) reached only the
    /// third copy: the read shows its own marker and no conflict. Answered from that read, the
    /// debit would stand beside the rival's and the account end at −50 once the copies
    /// replicate. The engine reads every copy first, merges both leaves and takes its own debit
    /// back (`Withdrawn`): the transfer is cancelled.
    #[tokio::test]
    async fn an_apply_that_finds_its_marker_answers_from_a_read_of_every_copy() {
        let server = three_copies().await;
        let transfer = |txn: &str, value: i64| {
            json!({"id": format!("txn:{txn}"), "key": format!("txn:{txn}"),
                   "value": {"rev": "1-t"},
                   "doc": {"_id": format!("txn:{txn}"), "_rev": "1-t", "type": "transfer",
                           "txn_id": txn, "state": "pending", "source": "a",
                           "destination": "b", "value": value, "currency": "EUR"}})
        };
        all_docs_answers(&server, move |id| match id {
            "txn:t1" => transfer("t1", 80),
            "txn:t2" => transfer("t2", 70),
            id => json!({"id": id, "key": id, "value": {"rev": "2-mine"},
                         "doc": debited("2-mine", "t1", -80)}),
        })
        .await;
        every_copy_holds(
            &server,
            json!([
                {"ok": debited("2-mine", "t1", -80)},
                {"ok": debited("2-rival", "t2", -70)}
            ]),
        )
        .await;
        let engine = engine_on(&server.uri());
        let results = engine
            .run(vec![crate::engine::fixtures::apply("t1", -80, true, None)])
            .await;
        assert!(
            matches!(results[0], Ok(OpResult::Withdrawn)),
            "the debit found on one branch is answered from the merge of every copy: {results:?}"
        );
        let written = written_docs(&server).await;
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(written[0]["balance"], 30, "only the rival's debit stands");
    }

    /// A conflict pass reads its account from every copy. A quorum read of a cluster keys the
    /// copies' answers on the winning revision alone, so where a lagging copy agrees on the
    /// winner and answers first, `_all_docs?conflicts=true` shows no conflict that the other
    /// copies hold; the pass then merged nothing and counted the conflict resolved, a credit
    /// left on the losing leaf (a real 3-node cluster). Here the quorum read shows account `a`
    /// alone while `open_revs=all` with `r` = 3 shows its losing leaf too: the pass merges and
    /// deletes it.
    #[tokio::test]
    async fn a_conflict_pass_reads_its_account_from_every_copy() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, ResponseTemplate};
        let server = three_copies().await;
        Mock::given(method("POST"))
            .and(path("/db/_all_docs"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "total_rows": 1, "offset": 0,
                "rows": [{"id": "account:a", "key": "account:a", "value": {"rev": "2-w"},
                          "doc": leaf("2-w")}]
            })))
            .mount(&server)
            .await;
        every_copy_holds(&server, json!([{"ok": leaf("2-w")}, {"ok": leaf("2-l")}])).await;
        resolve_a(&server).await;
        let deleted = deleted_revs(&server).await;
        assert_eq!(
            deleted,
            ["2-l"],
            "the leaf only every copy's read shows is merged away"
        );
    }

    /// A merge keeps a losing leaf's marker pending though its transfer's document reads
    /// `cancelled`; the decision's convergence undoes it later. A read, of one copy or of
    /// every copy, cannot exclude a rival decision: another attempt's `done` may stand on the
    /// other copies, or still be created on a copy that lacked the document (each create
    /// answered 202). Left out against `cancelled`, the debit was gone for good once the
    /// resolution kept `done` (`SIM_TRIO=1` seed 0x69: +28 on h0; `SIM_BASE=1000` 0x428: +156).
    #[tokio::test]
    async fn a_merge_keeps_a_marker_pending_whatever_its_transfer_reads() {
        let server = three_copies().await;
        let t1 = |rev: &str, state: &str| {
            json!({"_id": "txn:t1", "_rev": rev, "type": "transfer", "txn_id": "t1",
                   "state": state, "source": "a", "destination": "b", "value": 50,
                   "currency": "EUR"})
        };
        let cancelled = t1("3-c", "cancelled");
        all_docs_answers(&server, move |id| match id {
            "txn:t1" => json!({"id": "txn:t1", "key": "txn:t1",
                               "value": {"rev": "3-c"}, "doc": cancelled}),
            id => json!({"id": id, "key": id, "value": {"rev": "2-w"}, "doc": leaf("2-w")}),
        })
        .await;
        every_copy_holds(
            &server,
            json!([{"ok": leaf("2-w")}, {"ok": debited("2-l", "t1", -50)}]),
        )
        .await;
        resolve_a(&server).await;
        let written = written_docs(&server).await;
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(written[0]["pending"][0]["txn"], "t1", "{written:?}");
        assert_eq!(written[0]["balance"], 950, "the debit still counts");
    }

    /// Account `a` at revision `rev` holding `count` settled entries, `e0`…, ten minutes old.
    fn with_settled(rev: &str, count: usize) -> serde_json::Value {
        let at = crate::clock::now_ms() - 600_000;
        let settled: Vec<serde_json::Value> = (0..count)
            .map(|i| json!({"txn": format!("e{i}"), "at": at, "undone": false}))
            .collect();
        json!({
            "_id": "account:a", "_rev": rev, "type": "account", "account_id": "a",
            "currency": "EUR", "opening": 1000, "balance": 1000, "min_balance": 0,
            "pending": [], "settled": settled
        })
    }

    /// `_bulk_get` with `r` = 3 answered with these results.
    async fn bulk_get_answers(server: &wiremock::MockServer, results: serde_json::Value) {
        use wiremock::matchers::{method, path, query_param};
        wiremock::Mock::given(method("POST"))
            .and(path("/db/_bulk_get"))
            .and(query_param("r", "3"))
            .respond_with(
                wiremock::ResponseTemplate::new(200).set_body_json(json!({ "results": results })),
            )
            .mount(server)
            .await;
    }

    /// The settled entries account `a` is written with when a credit is applied to it while
    /// its 40 old entries may be pruned as far as this engine knows (their transfers ended
    /// here, every copy took them over a minute ago), its quorum read shows `read` and every
    /// copy's leaves of it are `leaves`.
    async fn settled_written_beside(
        read: serde_json::Value,
        leaves: serde_json::Value,
    ) -> (usize, bool) {
        use wiremock::matchers::{method, path};
        let server = three_copies().await;
        wiremock::Mock::given(method("POST"))
            .and(path("/db/_all_docs"))
            .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!({
                "total_rows": 1, "offset": 0,
                "rows": [{"id": "account:a", "key": "account:a", "value": {"rev": "2-w"},
                          "doc": read}]
            })))
            .mount(&server)
            .await;
        bulk_get_answers(&server, json!([{"id": "account:a", "docs": leaves}])).await;
        let engine = engine_on(&server.uri());
        let long_ago = Instant::now() - Duration::from_millis(PRUNE_CONFIRMED_MS + 1_000);
        for i in 0..40 {
            engine.ended.lock().unwrap().note(&format!("e{i}"));
            engine
                .confirmed
                .lock()
                .unwrap()
                .entry("a".into())
                .or_default()
                .insert(format!("e{i}"), long_ago);
        }
        let results = engine
            .run(vec![crate::engine::fixtures::apply("n", 5, false, None)])
            .await;
        assert!(results[0].is_ok(), "{results:?}");
        let written: Vec<serde_json::Value> = bulk_docs_sent(&server)
            .await
            .into_iter()
            .flatten()
            .filter(|d| d["_id"] == "account:a" && d["_deleted"] != true)
            .collect();
        assert_eq!(written.len(), 1, "{written:?}");
        // Entries settled at one moment are written as one group (docs/DOCUMENTS.md).
        let settled = written[0]["settled"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|group| group["txns"].as_array().map_or(1, Vec::len))
            .sum();
        (settled, !engine.prunable("a").is_empty())
    }

    /// A prune on several copies reads the account from every copy first, and prunes nothing
    /// while a copy holds a leaf the quorum read did not show (a quorum read of a cluster keys
    /// the copies' answers by their winner alone): pruning past entries only the hidden leaf
    /// holds would make the merge that meets it take them as pruned here and drop their
    /// deltas. With one live leaf (a deleted one beside it) the same round prunes them all, and
    /// so it does beside a losing leaf this branch joined already (`merged`: a member may not
    /// delete it, and it would otherwise keep the account from ever pruning).
    #[tokio::test]
    async fn a_prune_waits_while_a_copy_holds_a_conflict_the_read_hid() {
        let w = with_settled("2-w", 40);
        let (kept, still_prunable) = settled_written_beside(
            w.clone(),
            json!([{"ok": w}, {"ok": with_settled("2-hidden", 3)}]),
        )
        .await;
        assert_eq!(kept, 40, "nothing pruned while a copy holds another leaf");
        assert!(
            !still_prunable,
            "the account's entries are no longer known confirmed"
        );
        let (kept, _) = settled_written_beside(
            w.clone(),
            json!([{"ok": w}, {"ok": {"_id": "account:a", "_rev": "3-gone", "_deleted": true}}]),
        )
        .await;
        assert_eq!(
            kept, 0,
            "one live leaf: every old entry of an ended transfer goes"
        );
        let mut joined = w.clone();
        joined["merged"] = json!(["2-joined"]);
        let mut read = joined.clone();
        read["_conflicts"] = json!(["2-joined"]);
        let (kept, _) = settled_written_beside(
            read,
            json!([{"ok": joined}, {"ok": with_settled("2-joined", 3)}]),
        )
        .await;
        assert_eq!(
            kept, 0,
            "a leaf this branch joined already keeps nothing from pruning"
        );
    }

    /// On several copies, a transfer reads as ended, for pruning, only when every copy's leaves
    /// are one, `done` or `cancelled` (or it was never written): the quorum read here says
    /// `t1` is `done` with no conflict, while a copy holds a `cancelled` leaf of it.
    #[tokio::test]
    async fn a_transfer_ends_for_pruning_only_as_one_leaf_on_every_copy() {
        use wiremock::matchers::{method, path};
        let server = three_copies().await;
        let txn = |id: &str, rev: &str, state: &str| {
            json!({"ok": {"_id": format!("txn:{id}"), "_rev": rev, "type": "transfer",
                          "txn_id": id, "state": state}})
        };
        wiremock::Mock::given(method("POST"))
            .and(path("/db/_all_docs"))
            .respond_with(wiremock::ResponseTemplate::new(500))
            .mount(&server)
            .await;
        bulk_get_answers(
            &server,
            json!([
                {"id": "txn:t1", "docs": [txn("t1", "3-a", "done"), txn("t1", "3-b", "cancelled")]},
                {"id": "txn:t2", "docs": [txn("t2", "3-a", "done")]},
                {"id": "txn:t3", "docs": [{"error": {"id": "txn:t3", "rev": "undefined",
                                                      "error": "not_found", "reason": "missing"}}]},
                {"id": "txn:t4", "docs": [txn("t4", "2-a", "pending")]}
            ]),
        )
        .await;
        let engine = engine_on(&server.uri());
        let ids: Vec<String> = ["t1", "t2", "t3", "t4"].map(String::from).to_vec();
        let mut ended: Vec<String> = engine
            .read_terminal(&ids)
            .await
            .unwrap()
            .into_iter()
            .collect();
        ended.sort();
        assert_eq!(ended, ["t2", "t3"]);
    }

    /// At the server's default quorum, an account write goes with `w` = every copy only when
    /// it takes a new debit on an account with a minimum: that debit's funds check must be
    /// exclusive, or two debits could each pass on a branch of its own and, both decided
    /// before a merge met them, leave the account below its minimum for good (the simulator's
    /// `SIM_TRIO=1 SIM_LONG=1 SIM_SEED=0x81f`, s3 at −1,141). Credits and debits of an account
    /// without a minimum go at the server's default.
    #[tokio::test]
    async fn at_the_servers_default_quorum_only_a_limited_debit_waits_for_every_copy() {
        use crate::engine::fixtures::{apply, engine_writing};
        for (account, delta, w) in [
            ("limited", -10, Some("3")),
            ("limited", 10, None),
            ("open", -10, None),
        ] {
            let server = three_copies().await;
            all_docs_answers(&server, |key| {
                let id = key.trim_start_matches("account:");
                let mut doc = json!({
                    "_id": key, "_rev": "2-r", "type": "account", "account_id": id,
                    "currency": "EUR", "opening": 100, "balance": 100, "pending": [],
                    "settled": []
                });
                if id == "limited" {
                    doc["min_balance"] = json!(0);
                }
                json!({"id": key, "key": key, "value": {"rev": "2-r"}, "doc": doc})
            })
            .await;
            let engine = engine_writing(&server.uri(), crate::WriteQuorum::ServerDefault);
            let op = AccountOp {
                account: account.into(),
                ..apply("t", delta, delta < 0, None)
            };
            let results = engine.run(vec![op]).await;
            assert!(results[0].is_ok(), "{account} {delta}: {results:?}");
            let requests = server.received_requests().await.unwrap_or_default();
            let w_sent: Vec<Option<String>> = requests
                .iter()
                .filter(|r| r.url.path() == "/db/_bulk_docs")
                .map(|r| {
                    let w = r.url.query_pairs().find(|(k, _)| k == "w");
                    w.map(|(_, v)| v.into_owned())
                })
                .collect();
            assert_eq!(w_sent, [w.map(String::from)], "{account} {delta}");
        }
    }
}
