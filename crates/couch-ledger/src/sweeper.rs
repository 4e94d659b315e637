//! The sweeper (docs/PROTOCOL.md): finds transfers that stopped half-way and drives each to `done` or
//! `cancelled`; repairs orphan markers; reports the ledger's status.
//!
//! A pass ([`Ledger::sweep_once`]) is bounded: it reads its candidates from the views —
//! `transactions/by_state` for open transfers not modified for `stale_after`, oldest first, and
//! `transactions/account_pending` for markers older than that — re-reads every candidate (views lag), and
//! acts only on a transfer whose `last_modified` is old enough and whose claim has expired. It
//! takes the transfer over with a CAS of a new claim (so of two sweepers one wins, the other
//! skips) and drives it with the same code a writer uses. Up to
//! [`SWEEP_CONCURRENCY_MAX`] transfers are driven at once so their account steps share the
//! group-commit engine's requests.
//!
//! [`Ledger::sweep_watch`] loops passes, woken by the `_changes` feed of transfers and by a
//! periodic timer as a safety net, until its shutdown future resolves.
//!
//! Long, and one file on purpose: it is one worker, its pass read as numbered steps (each a
//! function below it), the loop that runs passes, and the status built from the same views and
//! counts; split, one pass would be followed across files.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use serde::Serialize;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::account_doc::{account_doc_id, AccountDoc};
use crate::couch::{AllDocsRow, ChangesQuery, Client, ViewQuery};
use crate::engine::{now_ms, AccountOp, OpKind, OpResult};
use crate::error::{Error, Result};
use crate::ledger::{Finishing, Ledger};
use crate::limits::{
    PROBLEMS_MAX, READS_IN_FLIGHT_MAX, READ_BATCH_KEYS_MAX, STALE_AFTER_DEFAULT_MS,
    SWEEP_CONCURRENCY_MAX, SWEEP_LIMIT_MAX, WATCH_BACKOFF_MAX_MS, WATCH_WAIT_MAX_MS,
    WATCH_WAIT_MIN_MS,
};
use crate::money::Amount;
use crate::state::State;
#[cfg(feature = "failpoints")]
use crate::transfer::crash;
use crate::transfer::{key_doc_id, transfer_of, TxnDoc};

/// The states a transfer can be stuck in.
const OPEN_STATES: [State; 4] = [
    State::Initial,
    State::Pending,
    State::Committed,
    State::Canceling,
];

/// How one pass runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepOptions {
    /// At most this many transfers (and this many markers) looked at in one pass.
    pub limit: usize,
    /// Only transfers not modified for this long (and whose claim expired) are taken over.
    pub stale_after: Duration,
}

impl Default for SweepOptions {
    fn default() -> SweepOptions {
        SweepOptions {
            limit: 1_000,
            stale_after: Duration::from_millis(STALE_AFTER_DEFAULT_MS),
        }
    }
}

/// What one pass (or, summed, a watch) did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepOutcome {
    /// Candidate transfers re-read.
    pub examined: u64,
    /// Transfers this pass drove to `done`.
    pub advanced: u64,
    /// Transfers this pass drove to `cancelled`.
    pub cancelled: u64,
    /// Candidates left alone: not stale yet, claimed by a live worker, taken by another
    /// sweeper first, already finished, or not understood (see `problems`).
    pub skipped: u64,
    /// Candidates whose drive failed (server error, lease ran out); they stay for a later pass.
    pub failed: u64,
    /// Transfers still open (`initial`, `pending`, `committed`, `canceling`) after the pass:
    /// those open when it began (counted from the index its query had just brought up to
    /// date) and those it opened itself (undecided markers given their document), less those
    /// it ended. Transfers other processes wrote or ended meanwhile are not counted (a count
    /// after the pass would first make the index take in everything the pass wrote).
    pub remaining: u64,
    /// Orphan markers undone (a pending marker whose transfer had already finished).
    pub repaired_markers: u64,
    /// Malformed transfers passed over without a read: found by an earlier pass (they are
    /// reported then, in `skipped` and `problems`) and remembered in
    /// `_local/couch-ledger-sweeper-skip`.
    pub skipped_malformed: u64,
    /// Ledger documents found holding a conflict (the `transactions/conflicts` view) and left
    /// with one leaf: accounts merged, transfers resolved (docs/CLUSTER.md).
    pub conflicts_resolved: u64,
    /// Conflicted ledger documents left as they are, each named in `problems`: write-once
    /// documents with two different bodies (a person decides), or what could not be resolved
    /// now (a later pass tries again).
    pub conflicts_unresolved: u64,
    /// What could not be handled, one line each (at most 1,000: the counts stay exact beyond).
    pub problems: Vec<String>,
}

impl SweepOutcome {
    fn problem(&mut self, line: String) {
        if self.problems.len() < PROBLEMS_MAX {
            self.problems.push(line);
        }
    }

    fn add(&mut self, other: SweepOutcome) {
        self.examined += other.examined;
        self.advanced += other.advanced;
        self.cancelled += other.cancelled;
        self.skipped += other.skipped;
        self.failed += other.failed;
        self.remaining = other.remaining;
        self.repaired_markers += other.repaired_markers;
        self.skipped_malformed += other.skipped_malformed;
        self.conflicts_resolved += other.conflicts_resolved;
        self.conflicts_unresolved = other.conflicts_unresolved;
        for p in other.problems {
            self.problem(p);
        }
    }
}

/// Transfers per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StateCounts {
    /// Written, not started.
    pub initial: u64,
    /// Claimed; deltas may be applied.
    pub pending: u64,
    /// Applied; settling.
    pub committed: u64,
    /// Finished.
    pub done: u64,
    /// Rolling back.
    pub canceling: u64,
    /// Rolled back.
    pub cancelled: u64,
}

impl StateCounts {
    /// The count of one state.
    pub fn get(&self, state: State) -> u64 {
        match state {
            State::Initial => self.initial,
            State::Pending => self.pending,
            State::Committed => self.committed,
            State::Done => self.done,
            State::Canceling => self.canceling,
            State::Cancelled => self.cancelled,
        }
    }

    fn slot(&mut self, state: State) -> &mut u64 {
        match state {
            State::Initial => &mut self.initial,
            State::Pending => &mut self.pending,
            State::Committed => &mut self.committed,
            State::Done => &mut self.done,
            State::Canceling => &mut self.canceling,
            State::Cancelled => &mut self.cancelled,
        }
    }

    /// Transfers not yet `done` or `cancelled`.
    pub fn open(&self) -> u64 {
        OPEN_STATES.iter().map(|s| self.get(*s)).sum()
    }
}

/// What [`Ledger::status`] reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerStatus {
    /// Transfers per state.
    pub states: StateCounts,
    /// Age of the oldest open transfer (by `last_modified`), seconds; `None` when none is open.
    pub oldest_open_age_s: Option<u64>,
    /// Money in `pending` transfers (the `transactions/pending` view's `_sum`), over every
    /// currency: with several currencies this adds their minor units together. Kept for the
    /// `--json` contract; [`LedgerStatus::in_flight_by_currency`] is the figure to read.
    pub in_flight: Amount,
    /// Money in `pending` transfers per currency (`transactions/in_flight`, grouped).
    pub in_flight_by_currency: std::collections::BTreeMap<String, Amount>,
    /// Pending markers held by accounts (transfers applied and not yet settled or undone).
    pub pending_markers: u64,
    /// Ledger documents holding a conflict (`transactions/conflicts`): 0 on one node; on a
    /// cluster, conflicts the sweeper has not resolved yet (docs/CLUSTER.md).
    pub conflicts: u64,
    /// Accounts below their minimum balance (`transactions/account_overdrawn`): 0 on one node; on a
    /// cluster with [`WriteQuorum::ServerDefault`](crate::WriteQuorum), what merged concurrent
    /// debits can leave.
    pub overdrawn: u64,
}

/// The `_local` document where the sweeper remembers malformed transfers (written by a tool
/// that bypassed the validation, or before it existed), so that they never again take a place
/// in a pass's batch: `{"ids": {"txn:…": "why"}}`.
pub const SKIP_LIST: &str = "couch-ledger-sweeper-skip";

/// At most this many malformed transfers are remembered.
const SKIP_LIST_MAX: usize = 10_000;

/// Pages of `by_state` one pass reads per state, past malformed transfers.
const SKIP_PAGES_MAX: usize = 100;

#[derive(Debug, Default)]
struct SkipList {
    rev: Option<String>,
    ids: std::collections::BTreeMap<String, String>,
    changed: bool,
}

impl SkipList {
    fn add(&mut self, id: &str, why: &str) {
        if self.ids.len() < SKIP_LIST_MAX && !self.ids.contains_key(id) {
            self.ids.insert(id.to_owned(), why.to_owned());
            self.changed = true;
        }
    }
}

/// One candidate's fate in a pass.
enum Swept {
    Advanced,
    Cancelled,
    Skipped,
    Failed(String),
}

impl Ledger {
    /// One bounded pass of the sweeper. Never stops for one bad document: what it cannot
    /// understand is reported in `problems` and counted in `skipped` or `failed`.
    ///
    /// # Errors
    ///
    /// `limit` is 0 or above [`SWEEP_LIMIT_MAX`]; the views could not be read (the pass did
    /// nothing then, or only some of its drives).
    pub async fn sweep_once(&self, options: SweepOptions) -> Result<SweepOutcome> {
        if options.limit == 0 || options.limit > SWEEP_LIMIT_MAX {
            return Err(Error::invalid(
                "limit",
                format!("must be between 1 and {SWEEP_LIMIT_MAX}"),
            ));
        }
        let now = now_ms();
        let stale_ms = i64::try_from(options.stale_after.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now.saturating_sub(stale_ms);
        let limit = options.limit as u64;
        let mut out = SweepOutcome::default();
        let mut phases = PhaseClock::start();

        // 0. Conflicted ledger documents first, so that what follows reads resolved ones.
        self.resolve_conflicts(limit, &mut out).await?;

        // 1. Open transfers not modified since the cutoff, oldest first — past the malformed
        //    ones, which would otherwise fill every batch (they sort oldest and never move).
        let mut skip = self.read_skip_list().await?;
        let (queue, mut fetched) = self
            .stale_transfers(cutoff, limit, &mut skip, &mut out)
            .await?;
        phases.mark("candidates (by_state)");
        // The open transfers now, from the index the query above brought up to date (cheap);
        // `remaining` is these less the ones this pass ends. A count after the pass would first
        // make the index take in every document the pass wrote: a third of a pass's time on
        // CouchDB 3.4.3, more than half on pouchdb-server (docs/bench/HISTORY.md).
        let at_start = self.count_open(&mut out).await?;
        phases.mark("count");
        let (mut candidates, mut seen) = oldest_first(queue, options.limit);

        // 2. Markers applied before the cutoff and still pending: orphans, or markers of
        //    transfers that are themselves stuck.
        let markers = self.stale_markers(cutoff, limit, &mut out).await?;
        phases.mark("account_pending");

        // 3. Re-read every transfer involved (views lag).
        let docs = self
            .reread(&candidates, &markers, &mut seen, &mut fetched, &mut out)
            .await?;
        phases.mark("re-read");

        // 4. Orphan markers: converge those of decided transfers (undo, or settle the marker a
        //    one-write decision names); decide `abandoned` the one-write transfers nobody
        //    decided; drive the stuck ones.
        let (mut undo, undecided) = sort_markers(&markers, &docs, &mut candidates, &mut out);
        let recovered = if undecided.is_empty() {
            Vec::new()
        } else {
            self.recover_undecided(&undecided, &mut undo, &mut out)
                .await?
        };

        // 5. Take over and drive the stale ones, a bounded number at a time (and the undecided
        //    ones given their document above).
        let recovered_opened = recovered.len() as u64;
        let pass = self
            .drive_stale(&candidates, recovered, &docs, cutoff, &mut skip, &mut out)
            .await;
        phases.mark("drives");
        self.finish_held(&pass).await;
        phases.mark("held settles");

        // 6. Orphan undos (and settles of named markers), all in one engine call, each only
        //    while its decision stands alone on every copy.
        let undo = self.standing_on_every_copy(undo).await?;
        self.converge_orphans(undo, &mut out).await?;
        self.keep_skip_list(&skip, &mut out).await;
        phases.mark("repairs");
        // Open at the start, and those the pass opened itself (undecided markers given their
        // document), less those it ended.
        out.remaining =
            (at_start.open() + recovered_opened).saturating_sub(out.advanced + out.cancelled);
        Ok(out)
    }

    /// Step 1 of a pass: per open state, the transfers not modified since `cutoff` (their last
    /// change and id), and the documents the rows carried (with their conflicts), by id. Those
    /// on the skip list found by earlier passes are passed over by id; new malformed ones are
    /// told by the document the view row carries, remembered, and paged past within this pass,
    /// so one pass reaches `limit` real candidates however many malformed ones stand before
    /// them.
    async fn stale_transfers(
        &self,
        cutoff: i64,
        limit: u64,
        skip: &mut SkipList,
        out: &mut SweepOutcome,
    ) -> Result<(Vec<(i64, String)>, HashMap<String, Value>)> {
        let client = &self.inner.hot;
        let mut queue: Vec<(i64, String)> = Vec::new();
        let mut fetched: HashMap<String, Value> = HashMap::new();
        for state in OPEN_STATES {
            let mut found: u64 = 0;
            let mut after: Option<(Value, String)> = None;
            for _ in 0..SKIP_PAGES_MAX {
                let (start_key, start_key_doc_id, skip_rows) = match &after {
                    Some((key, id)) => (key.clone(), Some(id.clone()), Some(1)),
                    None => (json!([state.as_str()]), None, None),
                };
                let q = ViewQuery {
                    start_key: Some(start_key),
                    start_key_doc_id,
                    skip: skip_rows,
                    end_key: Some(json!([state.as_str(), cutoff])),
                    reduce: Some(false),
                    include_docs: Some(true),
                    conflicts: Some(true),
                    limit: Some(limit),
                    ..ViewQuery::default()
                };
                let rows = client.view("transactions", "by_state", &q).await?.rows;
                let full = rows.len() as u64 == limit;
                for row in rows {
                    let Some(id) = row.id else { continue };
                    after = Some((row.key.clone(), id.clone()));
                    if skip.ids.contains_key(&id) {
                        out.skipped_malformed += 1;
                        continue;
                    }
                    if let Some(doc) = row.doc.filter(Value::is_object) {
                        if let Err(e) = TxnDoc::from_value(doc.clone()) {
                            out.skipped += 1;
                            out.problem(format!("{id}: {e}"));
                            skip.add(&id, &e.to_string());
                            continue;
                        }
                        fetched.insert(id.clone(), doc);
                    }
                    let modified = row.key.get(1).and_then(Value::as_i64).unwrap_or(0);
                    queue.push((modified, id));
                    found += 1;
                }
                if !full || found >= limit {
                    break;
                }
            }
        }
        Ok((queue, fetched))
    }

    /// The open transfers per state; a state this program does not know is a problem of the
    /// pass.
    async fn count_open(&self, out: &mut SweepOutcome) -> Result<StateCounts> {
        let (at_start, unknown) = state_counts_and_unknown(self).await?;
        for (name, n) in unknown {
            out.problem(format!(
                "{n} transfers in state {name:?}, which this program does not know"
            ));
        }
        Ok(at_start)
    }

    /// Step 2 of a pass: the markers applied before `cutoff` and still pending (account
    /// document id, transfer).
    async fn stale_markers(
        &self,
        cutoff: i64,
        limit: u64,
        out: &mut SweepOutcome,
    ) -> Result<Vec<(String, String)>> {
        let q = ViewQuery {
            end_key: Some(json!([cutoff, {}])),
            reduce: Some(false),
            limit: Some(limit),
            ..ViewQuery::default()
        };
        let mut markers: Vec<(String, String)> = Vec::new();
        for row in self
            .inner
            .hot
            .view("transactions", "account_pending", &q)
            .await?
            .rows
        {
            match (row.id, row.key.get(1).and_then(Value::as_str)) {
                (Some(account_doc), Some(txn)) => markers.push((account_doc, txn.to_owned())),
                (id, _) => out.problem(format!(
                    "transactions/account_pending row without a transfer: {id:?}"
                )),
            }
        }
        Ok(markers)
    }

    /// Step 3 of a pass: the documents of the candidates and of the markers' transfers, by id.
    /// Where the database keeps one copy of each document, the candidates' documents came with
    /// the rows of step 1: read by id, from the only copy, when the query ran (after the index
    /// caught up) — that is the re-read, and reading them again cost a fifth of a pass on
    /// CouchDB 3.4.3 (docs/bench/HISTORY.md). Where it keeps several, a view's row and its
    /// document come from one copy, which may lag: every one is read again by id.
    async fn reread(
        &self,
        candidates: &[String],
        markers: &[(String, String)],
        seen: &mut HashSet<String>,
        fetched: &mut HashMap<String, Value>,
        out: &mut SweepOutcome,
    ) -> Result<HashMap<String, Option<Value>>> {
        let mut ids: Vec<String> = candidates.to_vec();
        for (_, txn) in markers {
            let id = key_doc_id(txn);
            if seen.insert(id.clone()) {
                ids.push(id);
            }
        }
        let one_copy = self.inner.quorum.one_copy(&self.inner.hot).await == Some(true);
        let (read_now, came_with_rows): (Vec<String>, Vec<String>) = ids
            .iter()
            .cloned()
            .partition(|id| !(one_copy && fetched.contains_key(id)));
        let mut docs = self.read_docs(&read_now).await?;
        for id in came_with_rows {
            let doc = self.settled_doc(&id, fetched.remove(&id)).await;
            docs.insert(id, doc);
        }
        out.examined = ids.len() as u64;
        Ok(docs)
    }

    /// Step 5 of a pass: takes over and drives each candidate still stale and unclaimed, and
    /// the recovered transfers, at most [`SWEEP_CONCURRENCY_MAX`] at a time, until every drive
    /// ended. What the drives left to finish in the background is in the pass returned.
    async fn drive_stale(
        &self,
        candidates: &[String],
        recovered: Vec<TxnDoc>,
        docs: &HashMap<String, Option<Value>>,
        cutoff: i64,
        skip: &mut SkipList,
        out: &mut SweepOutcome,
    ) -> Arc<Finishing> {
        let progress_total = handled(out) + (candidates.len() + recovered.len()) as u64;
        let mut tasks: JoinSet<Swept> = JoinSet::new();
        // The settles the drives left to finish in the background.
        let pass = Arc::new(Finishing::default());
        for id in candidates {
            let doc = match docs.get(id) {
                Some(Some(value)) if holds_conflict(value) => {
                    out.skipped += 1;
                    out.problem(unresolved_conflict(id));
                    continue;
                }
                Some(Some(value)) => match TxnDoc::from_value(value.clone()) {
                    Ok(doc) => doc,
                    Err(e) => {
                        out.skipped += 1;
                        out.problem(format!("{id}: {e}"));
                        skip.add(id, &e.to_string());
                        continue;
                    }
                },
                // Gone since the view was built (transfers are never deleted: a view artefact).
                _ => {
                    out.skipped += 1;
                    continue;
                }
            };
            let eligible = !doc.state.is_terminal()
                && doc.last_modified <= cutoff
                && doc.claim_free(now_ms(), &self.inner.worker_id, false);
            if !eligible {
                out.skipped += 1;
                continue;
            }
            self.start_drive(&mut tasks, out, progress_total, doc, &pass)
                .await;
        }
        for doc in recovered {
            self.start_drive(&mut tasks, out, progress_total, doc, &pass)
                .await;
        }
        while let Some(done) = tasks.join_next().await {
            tally(out, done);
            self.report_progress("sweep", handled(out), Some(progress_total));
        }
        pass
    }

    /// The drives left their settles held for their accounts' next writes, finishing in the
    /// background; none is coming now: out they go, and the pass waits for them (its own: not
    /// for transfers other callers of this ledger are finishing, as `serve`'s).
    async fn finish_held(&self, pass: &Finishing) {
        pass.drain(|| {
            let txns = pass.txns.lock().unwrap_or_else(|e| e.into_inner());
            self.inner.accounts.release_held_of(&txns);
        })
        .await;
    }

    /// Of the orphan ops, on several copies, those whose transfer reads, from every copy
    /// (`_bulk_get`, `r` = n, one request per batch), as one live leaf that still asks for the
    /// op; all of them on one copy. The documents step 3 read come from one copy each: a copy
    /// that lacks a rival leaf shows a decision with no conflict, and acting on it can undo
    /// the markers of the `done` leaf the resolution keeps (the simulator's `SIM_TRIO=1
    /// SIM_LONG=1 SIM_SEED=0x12b`: +522 on s2). The ops left out wait for a later pass, after
    /// the conflict pass resolved the document.
    async fn standing_on_every_copy(&self, ops: Vec<AccountOp>) -> Result<Vec<AccountOp>> {
        let hot = &self.inner.hot;
        let copies = match self.inner.quorum.several_copies(hot).await? {
            Some(n) if !ops.is_empty() => n,
            _ => return Ok(ops),
        };
        let mut ids: Vec<String> = ops.iter().map(|op| key_doc_id(&op.txn)).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut standing: HashMap<String, TxnDoc> = HashMap::new();
        for chunk in ids.chunks(READ_BATCH_KEYS_MAX) {
            let leaves = hot.leaves_of(chunk, Some(copies)).await?;
            for (id, leaves) in chunk.iter().zip(leaves) {
                let mut live = leaves
                    .into_iter()
                    .filter(|l| l.get("_deleted").and_then(Value::as_bool) != Some(true));
                if let (Some(only), None) = (live.next(), live.next()) {
                    if let Ok(doc) = TxnDoc::from_value(only) {
                        standing.insert(id.clone(), doc);
                    }
                }
            }
        }
        Ok(ops
            .into_iter()
            .filter(|op| {
                let asked = standing
                    .get(&key_doc_id(&op.txn))
                    .and_then(|doc| doc.convergence(&op.account, &op.txn));
                let stands = asked.as_ref() == Some(&op.kind);
                if !stands {
                    tracing::info!(txn = %op.txn, account = %op.account, "an orphan marker's decision does not stand alone on every copy; left for a later pass");
                }
                stands
            })
            .collect())
    }

    /// Step 6 of a pass: the orphan undos (and settles of named markers), all in one engine
    /// call.
    async fn converge_orphans(&self, undo: Vec<AccountOp>, out: &mut SweepOutcome) -> Result<()> {
        if !undo.is_empty() {
            let answers = self.inner.accounts.run(undo.clone()).await;
            for (answer, op) in answers.into_iter().zip(&undo) {
                match answer {
                    Ok(OpResult::Applied | OpResult::Repaired) => {
                        out.repaired_markers += 1;
                        tracing::warn!(txn = %op.txn, account = %op.account, kind = ?op.kind, "converged an orphan marker");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        out.failed += 1;
                        out.problem(format!(
                            "could not undo the marker of {} on {}: {e}",
                            op.txn, op.account
                        ));
                    }
                }
            }
            fail_point!("sweeper-after-repair", |_| Err(crash(
                "sweeper-after-repair"
            )));
        }
        Ok(())
    }

    /// Remembers the malformed transfers this pass found for the next passes, and reports
    /// those it passed over by that list.
    async fn keep_skip_list(&self, skip: &SkipList, out: &mut SweepOutcome) {
        if skip.changed {
            self.write_skip_list(skip).await;
        }
        if out.skipped_malformed > 0 {
            out.problem(format!(
                "{} malformed transfers skipped without a read (listed in _local/{SKIP_LIST}; \
                 `verify` names them; delete that document to have them looked at again)",
                out.skipped_malformed
            ));
        }
    }

    /// Resolves the conflicted ledger documents the `transactions/conflicts` view lists:
    /// transfers first (an account's merge may depend on its transfer's outcome), then accounts,
    /// merged by the engine; a write-once document with two bodies is reported. Where the view
    /// holds `limit` rows or more, each kind is read from its own range, up to `limit` each
    /// ([`conflict_ranges`]).
    async fn resolve_conflicts(&self, limit: u64, out: &mut SweepOutcome) -> Result<()> {
        let whole = ViewQuery {
            reduce: Some(false),
            limit: Some(limit),
            ..ViewQuery::default()
        };
        let mut rows = Vec::new();
        for client in self.databases() {
            let all = client.view("transactions", "conflicts", &whole).await?.rows;
            if (all.len() as u64) < limit {
                rows.extend(all);
                continue;
            }
            // A pass's worth or more: each kind from its own range, transfers first.
            for (start, end) in conflict_ranges() {
                let q = ViewQuery {
                    start_key: Some(start),
                    end_key: Some(end),
                    inclusive_end: Some(false),
                    ..whole.clone()
                };
                rows.extend(client.view("transactions", "conflicts", &q).await?.rows);
            }
        }
        let mut accounts: Vec<AccountOp> = Vec::new();
        for row in rows {
            let Some(id) = row.id else { continue };
            let kind = row.key.get(0).and_then(Value::as_str).unwrap_or("?");
            match kind {
                "transaction" => {
                    let txn = id.strip_prefix("txn:").unwrap_or(&id);
                    match self.read_txn(txn).await {
                        Ok(_) => out.conflicts_resolved += 1,
                        Err(e) => {
                            out.conflicts_unresolved += 1;
                            out.problem(format!("{id}: {e}"));
                        }
                    }
                }
                "account" => accounts.push(AccountOp {
                    account: id.strip_prefix("account:").unwrap_or(&id).to_owned(),
                    txn: String::new(),
                    kind: OpKind::Resolve,
                    link: None,
                }),
                // Two bodies under one write-once id: both callers were told `uncertain` (or one
                // `created` by an earlier version). Which payment happened is a business question,
                // and the validation lets nobody delete a write-once document.
                _ => {
                    out.conflicts_unresolved += 1;
                    out.problem(format!(
                        "{id}: a write-once {kind} holds {} other bodies under its id; never \
                         picked by the program — a person decides which is true and deletes \
                         the others",
                        row.value
                    ));
                }
            }
        }
        if !accounts.is_empty() {
            let answers = self.inner.accounts.run(accounts.clone()).await;
            for (answer, op) in answers.into_iter().zip(&accounts) {
                match answer {
                    Ok(_) => out.conflicts_resolved += 1,
                    Err(e) => {
                        out.conflicts_unresolved += 1;
                        out.problem(format!("account:{}: {e}", op.account));
                    }
                }
            }
        }
        Ok(())
    }

    /// The one-write transfers whose markers (`marks`: account, transfer) are stale and whose
    /// document does not exist: nobody decided them (their worker stopped between its apply and
    /// its decision, docs/ONE_WRITE.md). Each gets its document created `initial`, with the
    /// terms its marker gives (its account, `peer`, the delta, the account's currency), and is
    /// returned to be driven like any `initial` transfer: its markers adopted, decided `done`
    /// (or cancelled if its other account refuses). The create is exclusive: a worker's
    /// decision written meanwhile makes it a 409, and that decision is followed (its markers
    /// converge, by ops pushed to `converge`). A marker without attempt (the stepwise protocol
    /// writes the document first) is reported.
    async fn recover_undecided(
        &self,
        marks: &[(String, String)],
        converge: &mut Vec<AccountOp>,
        out: &mut SweepOutcome,
    ) -> Result<Vec<TxnDoc>> {
        let accounts = self.marked_accounts(marks).await?;
        let lease_ms = i64::try_from(self.inner.lease.as_millis()).unwrap_or(i64::MAX);
        let mut seen: HashSet<String> = HashSet::new();
        let mut recovered = Vec::new();
        for (account, txn) in marks {
            let holder = accounts.get(&account_doc_id(account)).cloned().flatten();
            let Some((initial, peer)) =
                undecided_document(account, txn, holder, lease_ms, &mut seen, out)
            else {
                continue;
            };
            if let Some(created) = self
                .create_undecided(account, txn, &peer, initial, converge, out)
                .await
            {
                recovered.push(created);
            }
        }
        Ok(recovered)
    }

    /// The accounts of `marks` as they are, by document id: the winning leaf (`None`: not
    /// there, or not an account).
    async fn marked_accounts(
        &self,
        marks: &[(String, String)],
    ) -> Result<HashMap<String, Option<AccountDoc>>> {
        let ids: Vec<String> = marks.iter().map(|(a, _)| account_doc_id(a)).collect();
        let mut accounts = HashMap::new();
        for chunk in ids.chunks(READ_BATCH_KEYS_MAX) {
            let rows = self.inner.hot.all_docs_with_conflicts(chunk).await?;
            for (id, row) in chunk.iter().zip(rows) {
                let doc = row.doc.filter(Value::is_object).and_then(|mut v| {
                    crate::couch::take_conflicts(&mut v);
                    AccountDoc::from_value(v).ok()
                });
                accounts.insert(id.clone(), doc);
            }
        }
        Ok(accounts)
    }

    /// Creates the undecided transfer's document `initial` (exclusive): the document, with its
    /// revision, to be driven. Written meanwhile by its worker or another sweeper: followed,
    /// the markers of `account` and `peer` converging (ops pushed to `converge`) if it is
    /// decided, left to the by_state scan if it is open; `None` either way.
    async fn create_undecided(
        &self,
        account: &str,
        txn: &str,
        peer: &str,
        mut initial: TxnDoc,
        converge: &mut Vec<AccountOp>,
        out: &mut SweepOutcome,
    ) -> Option<TxnDoc> {
        match self.write_txn(&initial).await {
            Ok(Some(rev)) => {
                tracing::warn!(%txn, "nobody decided this transfer; driving it from its markers");
                initial.rev = Some(rev);
                return Some(initial);
            }
            // Written meanwhile (by its worker, or another sweeper): follow it.
            Ok(None) => match self.read_txn(transfer_of(txn)).await {
                Ok(found) if found.state.is_terminal() => {
                    for a in [account, peer] {
                        if let Some(kind) = found.convergence(a, txn) {
                            converge.push(AccountOp {
                                account: a.to_owned(),
                                txn: txn.to_owned(),
                                kind,
                                link: None,
                            });
                        }
                    }
                }
                // Open: the by_state scan finds it (its driver adopts the marker).
                Ok(_) => {}
                Err(e) => {
                    out.failed += 1;
                    out.problem(format!("{}: {e}", key_doc_id(txn)));
                }
            },
            Err(e) => {
                out.failed += 1;
                out.problem(format!("{}: {e}", key_doc_id(txn)));
            }
        }
        None
    }

    /// Starts `doc`'s drive in `tasks` once fewer than [`SWEEP_CONCURRENCY_MAX`] run, tallying
    /// the ones that end meanwhile.
    async fn start_drive(
        &self,
        tasks: &mut JoinSet<Swept>,
        out: &mut SweepOutcome,
        total: u64,
        doc: TxnDoc,
        pass: &Arc<Finishing>,
    ) {
        while tasks.len() >= SWEEP_CONCURRENCY_MAX {
            if let Some(done) = tasks.join_next().await {
                tally(out, done);
                self.report_progress("sweep", handled(out), Some(total));
            }
        }
        let (ledger, pass) = (self.clone(), Arc::clone(pass));
        tasks.spawn(async move { ledger.sweep_one(doc, &pass).await });
    }

    /// Takes one candidate over and drives it: an `initial` one on the one-write path (apply,
    /// then one CAS to its end), any other by the stepwise protocol.
    async fn sweep_one(&self, doc: TxnDoc, pass: &Arc<Finishing>) -> Swept {
        let id = doc.txn_id.clone();
        if doc.state == State::Initial && !self.inner.stepwise {
            return match self.decide_initial(doc, pass).await {
                Ok((end, true)) => match end.state {
                    State::Done => Swept::Advanced,
                    State::Cancelled => Swept::Cancelled,
                    other => Swept::Failed(format!("{id}: stopped in state {other}")),
                },
                // Decided (or taken) by another driver meanwhile.
                Ok((_, false)) => Swept::Skipped,
                Err(e) => Swept::Failed(format!("{id}: {e}")),
            };
        }
        let drive = match self.take_over(&doc).await {
            Ok(Some(drive)) => drive,
            Ok(None) => return Swept::Skipped,
            Err(e) => return Swept::Failed(format!("{id}: {e}")),
        };
        fail_point!("sweeper-after-takeover", |_| Swept::Failed(format!(
            "{id}: {}",
            crash("sweeper-after-takeover")
        )));
        match self.drive(drive).await {
            Ok(end) if end.lease_lost => {
                Swept::Failed(format!("{id}: lease ran out in state {}", end.doc.state))
            }
            Ok(end) => match end.doc.state {
                State::Done => Swept::Advanced,
                State::Cancelled => Swept::Cancelled,
                other => Swept::Failed(format!("{id}: stopped in state {other}")),
            },
            Err(e) => Swept::Failed(format!("{id}: {e}")),
        }
    }

    /// The malformed transfers earlier passes found (an empty list when there is none yet).
    async fn read_skip_list(&self) -> Result<SkipList> {
        let stored: Option<Value> = self.inner.hot.get_local(SKIP_LIST).await?;
        let mut list = SkipList::default();
        if let Some(v) = stored {
            list.rev = v.get("_rev").and_then(Value::as_str).map(str::to_owned);
            if let Some(ids) = v.get("ids").and_then(Value::as_object) {
                for (id, why) in ids.iter().take(SKIP_LIST_MAX) {
                    list.ids
                        .insert(id.clone(), why.as_str().unwrap_or("").to_owned());
                }
            }
        }
        Ok(list)
    }

    /// Stores the list; a failure (another sweeper wrote it first, the server) is logged only:
    /// the next pass finds the same documents again and retries.
    async fn write_skip_list(&self, list: &SkipList) {
        let mut doc = json!({"ids": list.ids});
        if let Some(rev) = &list.rev {
            doc["_rev"] = json!(rev);
        }
        if let Err(e) = self.inner.hot.put_local(SKIP_LIST, &doc).await {
            tracing::warn!("could not store the list of malformed transfers: {e}");
        }
    }

    /// Reads documents by id with `_all_docs?include_docs` (a fresh read, unlike a view):
    /// `None` for a missing or deleted one.
    async fn read_docs(&self, ids: &[String]) -> Result<HashMap<String, Option<Value>>> {
        let mut out = HashMap::with_capacity(ids.len());
        // The chunks are read a few at a time: the server answers reads on all its cores, where
        // one after another left a pass waiting (2,000 candidates: 0.35 s on CouchDB 3.4.3 here,
        // one chunk at a time).
        let mut chunks: Vec<(usize, Result<Vec<AllDocsRow>>)> = Vec::new();
        let mut reads = JoinSet::new();
        for (i, chunk) in ids.chunks(READ_BATCH_KEYS_MAX).enumerate() {
            if reads.len() >= READS_IN_FLIGHT_MAX {
                if let Some(done) = reads.join_next().await {
                    chunks.push(done.map_err(|e| Error::invariant(format!("a read task: {e}")))?);
                }
            }
            let (client, chunk) = (self.inner.hot.clone(), chunk.to_vec());
            reads.spawn(async move { (i, client.all_docs_with_conflicts(&chunk).await) });
        }
        while let Some(done) = reads.join_next().await {
            chunks.push(done.map_err(|e| Error::invariant(format!("a read task: {e}")))?);
        }
        chunks.sort_by_key(|(i, _)| *i);
        for ((_, rows), chunk) in chunks.into_iter().zip(ids.chunks(READ_BATCH_KEYS_MAX)) {
            let rows = rows?;
            for (id, row) in chunk.iter().zip(rows) {
                let doc = self.settled_doc(id, row.doc).await;
                out.insert(id.clone(), doc);
            }
        }
        Ok(out)
    }

    /// A transfer document as read with its conflicts, made ready to decide on: a conflicted
    /// one is resolved first (the view of conflicts may not list it yet); `None` for a missing
    /// or deleted one. One that cannot be resolved (a member may not delete its losing leaf)
    /// keeps its `_conflicts` ([`holds_conflict`]): the pass neither drives it nor converges a
    /// marker to it. CouchDB's winning leaf is not the outcome: it may be the other terms'
    /// `cancelled` while the resolution keeps a `done`, and undoing that `done`'s markers by it
    /// left the transfer `done` and counted on neither account (simulator, `SIM_TWO_TERMS=1
    /// SIM_BASE=5000` seed 0x13cc).
    async fn settled_doc(&self, id: &str, doc: Option<Value>) -> Option<Value> {
        let mut doc = doc.filter(Value::is_object);
        if doc.as_ref().is_some_and(holds_conflict) {
            let txn = id.strip_prefix("txn:").unwrap_or(id);
            match self.read_txn(txn).await {
                Ok(resolved) => doc = serde_json::to_value(&resolved).ok(),
                Err(e) => {
                    tracing::warn!(%id, "a conflicted transfer is left for a pass that can resolve it: {e}");
                    return doc;
                }
            }
        }
        if let Some(d) = doc.as_mut().and_then(Value::as_object_mut) {
            d.remove("_conflicts");
        }
        doc
    }

    /// Runs passes until `shutdown` resolves: after each pass it waits for a change to a
    /// transfer (`_changes` longpoll, with its own deadline since pouchdb-server ignores
    /// `timeout`) or for `stale_after / 2` (clamped to 100 ms..30 s), whichever comes first. A
    /// pass in progress when `shutdown` resolves is finished, never cut off mid-step. A failed
    /// pass is logged and retried after a back-off that doubles up to 10 s.
    ///
    /// Returns the sum of the passes (`remaining` from the last one).
    ///
    /// # Errors
    ///
    /// Invalid options (see [`Ledger::sweep_once`]); server failures are logged and retried,
    /// never returned.
    pub async fn sweep_watch<F>(&self, options: SweepOptions, shutdown: F) -> Result<SweepOutcome>
    where
        F: Future<Output = ()>,
    {
        self.sweep_watch_with(options, shutdown, |_| {}).await
    }

    /// [`Ledger::sweep_watch`], calling `on_pass` with the outcome of every pass that completed
    /// (for progress lines; a failed pass is logged instead).
    ///
    /// # Errors
    ///
    /// As [`Ledger::sweep_watch`].
    pub async fn sweep_watch_with<F, P>(
        &self,
        options: SweepOptions,
        shutdown: F,
        mut on_pass: P,
    ) -> Result<SweepOutcome>
    where
        F: Future<Output = ()>,
        P: FnMut(&SweepOutcome),
    {
        self.sweep_watch_each(options, shutdown, |pass| {
            if let Ok(outcome) = pass {
                on_pass(outcome);
            }
        })
        .await
    }

    /// [`Ledger::sweep_watch`], calling `on_pass` after every pass with its outcome, or with
    /// the error of a pass that failed (it is logged and retried after a back-off as well):
    /// for a service's metrics of passes and failures.
    ///
    /// # Errors
    ///
    /// As [`Ledger::sweep_watch`].
    pub async fn sweep_watch_each<F, P>(
        &self,
        options: SweepOptions,
        shutdown: F,
        mut on_pass: P,
    ) -> Result<SweepOutcome>
    where
        F: Future<Output = ()>,
        P: FnMut(std::result::Result<&SweepOutcome, &Error>),
    {
        if options.limit == 0 || options.limit > SWEEP_LIMIT_MAX {
            return Err(Error::invalid(
                "limit",
                format!("must be between 1 and {SWEEP_LIMIT_MAX}"),
            ));
        }
        tokio::pin!(shutdown);
        let wait_min = Duration::from_millis(WATCH_WAIT_MIN_MS);
        let period =
            (options.stale_after / 2).clamp(wait_min, Duration::from_millis(WATCH_WAIT_MAX_MS));
        let backoff_max = Duration::from_millis(WATCH_BACKOFF_MAX_MS);
        let mut backoff = wait_min;
        let mut totals = SweepOutcome::default();
        let mut since: Option<Value> = None;
        loop {
            if since.is_none() {
                since = self.feed_position().await;
            }
            // One pass, never interrupted: shutdown is noted and honoured after it.
            let (result, stopping) = self.whole_pass(options.clone(), shutdown.as_mut()).await;
            match result {
                Ok(outcome) => {
                    if outcome.advanced + outcome.cancelled + outcome.failed > 0 {
                        tracing::info!(?outcome, "sweep pass");
                    }
                    on_pass(Ok(&outcome));
                    totals.add(outcome);
                    backoff = wait_min;
                }
                Err(e) => {
                    tracing::warn!("sweep pass failed, retrying in {backoff:?}: {e}");
                    on_pass(Err(&e));
                    if stopping {
                        return Ok(totals);
                    }
                    tokio::select! {
                        () = &mut shutdown => return Ok(totals),
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(backoff_max);
                    continue;
                }
            }
            if stopping
                || self
                    .wait_between_passes(&mut since, wait_min, period, shutdown.as_mut())
                    .await
            {
                return Ok(totals);
            }
        }
    }

    /// Where the transfers' feed stands before a pass, so that a change during the pass wakes
    /// the next wait at once; `None` (logged) when it cannot be read.
    async fn feed_position(&self) -> Option<Value> {
        match self.inner.hot.database_info().await {
            Ok(info) => info.get("update_seq").cloned(),
            Err(e) => {
                tracing::warn!("sweep_watch: could not read the update sequence: {e}");
                None
            }
        }
    }

    /// One pass, never interrupted, and whether `shutdown` resolved during it (it is not
    /// polled again then).
    async fn whole_pass<F>(
        &self,
        options: SweepOptions,
        mut shutdown: std::pin::Pin<&mut F>,
    ) -> (Result<SweepOutcome>, bool)
    where
        F: Future<Output = ()>,
    {
        let mut stopping = false;
        let pass = self.sweep_once(options);
        tokio::pin!(pass);
        let result = loop {
            tokio::select! {
                r = &mut pass => break r,
                () = &mut shutdown, if !stopping => stopping = true,
            }
        };
        (result, stopping)
    }

    /// The wait between passes: at least `wait_min`, then a change to a transfer after `since`
    /// or `period`, whichever comes first. `since` moves to where the feed stands (`None` when
    /// the feed failed: it is read again before the next pass). `true` when `shutdown` resolved
    /// meanwhile.
    async fn wait_between_passes<F>(
        &self,
        since: &mut Option<Value>,
        wait_min: Duration,
        period: Duration,
        mut shutdown: std::pin::Pin<&mut F>,
    ) -> bool
    where
        F: Future<Output = ()>,
    {
        // A busy database would wake us constantly: at least `wait_min` between passes.
        tokio::select! {
            () = &mut shutdown => return true,
            () = tokio::time::sleep(wait_min) => {}
        }
        let query = ChangesQuery {
            since: since.clone(),
            longpoll: true,
            timeout: Some(period),
            view: Some(("transactions".to_owned(), "by_state".to_owned())),
            ..ChangesQuery::default()
        };
        let changes = tokio::time::timeout(period, self.inner.hot.changes(&query));
        tokio::select! {
            () = &mut shutdown => return true,
            r = changes => match r {
                Ok(Ok(reply)) => *since = Some(reply.last_seq),
                Ok(Err(e)) => {
                    tracing::warn!("sweep_watch: changes feed failed: {e}");
                    *since = None;
                }
                Err(_) => {} // the period ran out: scan anyway
            },
        }
        false
    }

    /// Transfers per state, the oldest open one's age, money in flight and pending markers.
    ///
    /// # Errors
    ///
    /// The views could not be read.
    pub async fn status(&self) -> Result<LedgerStatus> {
        let states = state_counts(self).await?;
        let oldest = oldest_open(self).await?;
        let client = &self.inner.hot;
        let q = ViewQuery::default();
        let in_flight = match client
            .view("transactions", "pending", &q)
            .await?
            .rows
            .first()
        {
            Some(row) => {
                let minor = row.value.as_i64().ok_or_else(|| {
                    Error::decode(format!(
                        "transactions/pending sum {} is not an integer",
                        row.value
                    ))
                })?;
                Amount::new(minor)?
            }
            None => Amount::ZERO,
        };
        let grouped = ViewQuery {
            group: Some(true),
            ..ViewQuery::default()
        };
        let mut in_flight_by_currency = std::collections::BTreeMap::new();
        for row in client
            .view("transactions", "in_flight", &grouped)
            .await?
            .rows
        {
            let (Some(code), Some(minor)) = (row.key.as_str(), row.value.as_i64()) else {
                return Err(Error::decode(format!(
                    "transactions/in_flight row {} → {} is not a currency and an integer",
                    row.key, row.value
                )));
            };
            in_flight_by_currency.insert(code.to_owned(), Amount::new(minor)?);
        }
        Ok(LedgerStatus {
            states,
            oldest_open_age_s: oldest
                .map(|t| u64::try_from(now_ms().saturating_sub(t).max(0)).unwrap_or(0) / 1000),
            in_flight,
            in_flight_by_currency,
            pending_markers: marker_count(self).await?,
            conflicts: conflict_count(self).await?,
            overdrawn: view_count(self, "transactions", "account_overdrawn").await?,
        })
    }
}

/// Documents holding a conflict, in every database of the ledger.
async fn conflict_count(ledger: &Ledger) -> Result<u64> {
    let mut n = 0;
    for client in ledger.databases() {
        n += view_count_in(client, "transactions", "conflicts").await?;
    }
    Ok(n)
}

/// The `_count` of a whole view of the database of accounts and transfers.
async fn view_count(ledger: &Ledger, ddoc: &str, view: &str) -> Result<u64> {
    view_count_in(&ledger.inner.hot, ddoc, view).await
}

/// The `_count` of a whole view.
async fn view_count_in(client: &Client, ddoc: &str, view: &str) -> Result<u64> {
    let rows = client.view(ddoc, view, &ViewQuery::default()).await?.rows;
    match rows.first() {
        None => Ok(0),
        Some(row) => row.value.as_u64().ok_or_else(|| {
            Error::decode(format!("{ddoc}/{view} count {} is not a number", row.value))
        }),
    }
}

fn tally(out: &mut SweepOutcome, done: std::result::Result<Swept, tokio::task::JoinError>) {
    match done {
        Ok(Swept::Advanced) => out.advanced += 1,
        Ok(Swept::Cancelled) => out.cancelled += 1,
        Ok(Swept::Skipped) => out.skipped += 1,
        Ok(Swept::Failed(why)) => {
            out.failed += 1;
            out.problem(why);
        }
        Err(e) => {
            out.failed += 1;
            out.problem(format!("a drive task ended abnormally: {e}"));
        }
    }
}

/// Candidates a pass has dealt with so far, one way or another (its progress).
fn handled(out: &SweepOutcome) -> u64 {
    out.advanced + out.cancelled + out.skipped + out.failed
}

/// The first `limit` stale transfers, oldest first, each once; and the ids taken.
fn oldest_first(mut queue: Vec<(i64, String)>, limit: usize) -> (Vec<String>, HashSet<String>) {
    queue.sort();
    let mut candidates: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for (_, id) in queue {
        if candidates.len() < limit && seen.insert(id.clone()) {
            candidates.push(id);
        }
    }
    (candidates, seen)
}

/// Whether a document read with its conflicts still holds one.
fn holds_conflict(doc: &Value) -> bool {
    doc.get("_conflicts").is_some()
}

/// The problem a pass reports for a transfer whose conflict it could not resolve.
fn unresolved_conflict(id: &str) -> String {
    format!(
        "{id}: holds a conflict this pass could not resolve (the log says why; deleting a \
         losing leaf needs an admin): neither driven nor converged until a pass resolves it"
    )
}

/// Step 4 of a pass, the stale markers (account document, transfer): of a decided transfer,
/// the op that converges it; of a transfer stuck `committed` or `canceling`, the transfer
/// joins the candidates; of a transfer with no document, the account and transfer, to
/// recover. Returns the converging ops and the markers to recover.
fn sort_markers(
    markers: &[(String, String)],
    docs: &HashMap<String, Option<Value>>,
    candidates: &mut Vec<String>,
    out: &mut SweepOutcome,
) -> (Vec<AccountOp>, Vec<(String, String)>) {
    let mut in_candidates: HashSet<String> = candidates.iter().cloned().collect();
    let mut reported: HashSet<String> = HashSet::new();
    let mut undo: Vec<AccountOp> = Vec::new();
    let mut undecided: Vec<(String, String)> = Vec::new();
    for (account_doc, txn) in markers {
        let id = key_doc_id(txn);
        let Some(account) = account_doc.strip_prefix("account:") else {
            out.problem(format!(
                "{account_doc}: pending marker on a non-account document"
            ));
            continue;
        };
        let Some(Some(value)) = docs.get(&id) else {
            undecided.push((account.to_owned(), txn.clone()));
            continue;
        };
        if holds_conflict(value) {
            if !in_candidates.contains(&id) && reported.insert(id.clone()) {
                out.skipped += 1;
                out.problem(unresolved_conflict(&id));
            }
            continue;
        }
        let doc = match TxnDoc::from_value(value.clone()) {
            Ok(doc) => doc,
            Err(e) => {
                // A candidate reports its own problem in step 5.
                if !in_candidates.contains(&id) && reported.insert(id.clone()) {
                    out.skipped += 1;
                    out.problem(format!("{id}: {e}"));
                }
                continue;
            }
        };
        match doc.state {
            // A one-write `done` names the marker it counts: settled, any other undone. The
            // stepwise `done` is written only after both markers were settled: a pending
            // one is a late repeat; undoing it keeps the transfer exactly-once.
            State::Done | State::Cancelled => {
                if let Some(kind) = doc.convergence(account, txn) {
                    undo.push(AccountOp {
                        account: account.to_owned(),
                        txn: txn.clone(),
                        kind,
                        link: None,
                    });
                }
            }
            State::Committed | State::Canceling => {
                if in_candidates.insert(id.clone()) {
                    candidates.push(id);
                }
            }
            // Its own drive applies or undoes it; by_state finds it if it is stuck (an
            // `initial` one's driver, on the one-write path, adopts the marker).
            State::Pending | State::Initial => {}
        }
    }
    (undo, undecided)
}

/// The ranges of the `transactions/conflicts` view (keyed `[type, _id]`) a pass reads, each up
/// to its limit: transfers, accounts, then every write-once type (those sort between the two).
/// One read of the whole view took the first `limit` rows in key order: accounts, then
/// write-once documents, then transfers. The write-once ones wait for a person and stay, so
/// once there were `limit` of them (or of accounts that wait for their transfer) no pass ever
/// reached a conflicted transfer again (the simulator's `pass_limit=1` seeds: 0x5, transfers
/// left in conflict).
fn conflict_ranges() -> [(Value, Value); 3] {
    [
        (json!(["transaction"]), json!(["transaction", {}])),
        (json!(["account"]), json!(["account", {}])),
        (json!(["account", {}]), json!(["transaction"])),
    ]
}

/// The document `initial` of the undecided transfer `txn`, with the terms its marker on
/// `account` gives (its account, `peer`, the delta, the account's currency), and that peer.
/// `None` for a marker converged since the view was built, one past which a live worker may
/// still decide (younger than `lease_ms`: counted skipped), a transfer met before (`seen`), and
/// a marker without attempt (the stepwise protocol writes the document first), which is
/// reported.
fn undecided_document(
    account: &str,
    txn: &str,
    doc: Option<AccountDoc>,
    lease_ms: i64,
    seen: &mut HashSet<String>,
    out: &mut SweepOutcome,
) -> Option<(TxnDoc, String)> {
    let marker = doc
        .as_ref()
        .and_then(|d| d.pending.iter().find(|m| m.txn == txn).cloned());
    let (Some(doc), Some(marker)) = (doc, marker) else {
        // Converged since the view was built.
        return None;
    };
    let (Some(_), Some(peer)) = (marker.attempt, marker.peer.clone()) else {
        out.skipped += 1;
        out.problem(format!(
            "account:{account} holds a pending marker of transfer {txn}, which does not exist"
        ));
        return None;
    };
    // Past any lease of its worker (which decides nothing after it), so that a live worker is
    // not raced to a decision it was about to make.
    if marker.at.unwrap_or(0) > now_ms().saturating_sub(lease_ms) {
        out.skipped += 1;
        return None;
    }
    if !seen.insert(transfer_of(txn).to_owned()) {
        return None;
    }
    let (source, destination) = if marker.delta.is_positive() {
        (peer.clone(), account.to_owned())
    } else {
        (account.to_owned(), peer.clone())
    };
    let now = now_ms();
    let initial = TxnDoc {
        id: key_doc_id(txn),
        rev: None,
        doc_type: "transaction".to_owned(),
        txn_id: transfer_of(txn).to_owned(),
        source,
        destination,
        value: if marker.delta.is_positive() {
            marker.delta
        } else {
            marker.delta.neg()
        },
        currency: doc.currency.clone(),
        state: State::Initial,
        reason: None,
        reverses: None,
        claim: None,
        created_at: marker.at.unwrap_or(now),
        last_modified: now,
        markers: None,
        decided_at: None,
        extra: serde_json::Map::new(),
    };
    Some((initial, peer))
}

/// Transfers per state (`transactions/by_state`, `group_level=1`).
pub(crate) async fn state_counts(ledger: &Ledger) -> Result<StateCounts> {
    Ok(state_counts_and_unknown(ledger).await?.0)
}

/// How long each phase of a sweep pass took, logged at debug level as each ends (where a pass's
/// time goes, for whoever tunes one).
struct PhaseClock {
    last: Instant,
}

impl PhaseClock {
    fn start() -> PhaseClock {
        PhaseClock {
            last: Instant::now(),
        }
    }

    fn mark(&mut self, phase: &str) {
        let now = Instant::now();
        let ms = u64::try_from((now - self.last).as_millis()).unwrap_or(u64::MAX);
        tracing::debug!(phase, ms, "sweep pass phase");
        self.last = now;
    }
}

/// Transfers per state, and the names and counts of states this program does not know.
async fn state_counts_and_unknown(ledger: &Ledger) -> Result<(StateCounts, Vec<(String, u64)>)> {
    let q = ViewQuery {
        group_level: Some(1),
        ..ViewQuery::default()
    };
    let mut counts = StateCounts::default();
    let mut unknown = Vec::new();
    for row in ledger
        .inner
        .hot
        .view("transactions", "by_state", &q)
        .await?
        .rows
    {
        let name = row.key.get(0).and_then(Value::as_str).unwrap_or("");
        let n = row.value.as_u64().unwrap_or(0);
        match State::parse(name) {
            Some(state) => *counts.slot(state) += n,
            None => unknown.push((name.to_owned(), n)),
        }
    }
    Ok((counts, unknown))
}

/// `last_modified` of the oldest open transfer.
pub(crate) async fn oldest_open(ledger: &Ledger) -> Result<Option<i64>> {
    let mut oldest: Option<i64> = None;
    for state in OPEN_STATES {
        let q = ViewQuery {
            start_key: Some(json!([state.as_str()])),
            end_key: Some(json!([state.as_str(), {}])),
            reduce: Some(false),
            limit: Some(1),
            ..ViewQuery::default()
        };
        let rows = ledger
            .inner
            .hot
            .view("transactions", "by_state", &q)
            .await?
            .rows;
        if let Some(t) = rows
            .first()
            .and_then(|r| r.key.get(1))
            .and_then(Value::as_i64)
        {
            oldest = Some(oldest.map_or(t, |o| o.min(t)));
        }
    }
    Ok(oldest)
}

/// Pending markers held by accounts (`transactions/account_pending`, `_count`).
pub(crate) async fn marker_count(ledger: &Ledger) -> Result<u64> {
    let rows = ledger
        .inner
        .hot
        .view("transactions", "account_pending", &ViewQuery::default())
        .await?
        .rows;
    Ok(rows.first().and_then(|r| r.value.as_u64()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account_doc::Attempt;
    use crate::transfer::Named;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    /// Transfer `txn` (100 from `a` to `b`) at revision `rev` in `state`; a one-write `done`
    /// when `named`.
    fn transfer(txn: &str, rev: &str, state: &str, named: bool) -> Value {
        let mut doc = TxnDoc::from_value(json!({
            "_id": crate::transfer::txn_doc_id(txn), "_rev": rev, "type": "transaction", "txn_id": txn,
            "source": "a", "destination": "b", "value": 100, "currency": "EUR",
            "state": state, "reason": null, "reverses": null, "claim": null,
            "created_at": 1, "last_modified": 2
        }))
        .unwrap();
        if named {
            doc.markers = Some(Named {
                source: Attempt::from_bits(7),
                destination: Attempt::from_bits(7),
            });
        }
        serde_json::to_value(doc).unwrap()
    }

    fn undo(txn: &str) -> AccountOp {
        AccountOp {
            account: "a".into(),
            txn: txn.into(),
            kind: OpKind::Undo { decided: true },
            link: None,
        }
    }

    async fn ledger_stating(copies: u32) -> (MockServer, Ledger) {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/db"))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"cluster": {"n": copies, "q": 1}})),
            )
            .mount(&server)
            .await;
        let deleted = json!({"_id": "txn:t2", "_rev": "3-x", "_deleted": true});
        let leaves = json!({"results": [
            {"id": "txn:t1", "docs": [{"ok": transfer("t1", "3-d", "done", false)},
                                      {"ok": transfer("t1", "3-c", "cancelled", false)}]},
            {"id": "txn:t2", "docs": [{"ok": transfer("t2", "3-c", "cancelled", false)},
                                      {"ok": deleted}]},
            {"id": "txn:t3", "docs": [{"ok": transfer("t3", "3-d", "done", true)}]}
        ]});
        Mock::given(method("POST"))
            .and(path("/db/_bulk_get"))
            .respond_with(ResponseTemplate::new(200).set_body_json(leaves))
            .mount(&server)
            .await;
        let client = Client::builder()
            .url(server.uri())
            .database("db")
            .build()
            .unwrap();
        (server, Ledger::builder(client).build().unwrap())
    }

    /// An orphan marker is converged only by a decision that stands alone on every copy and
    /// still asks for that op: not beside a rival leaf (t1), nor where the one leaf every
    /// copy holds asks another op than the one-copy read did (t3: a one-write `done` settles
    /// its named marker; the undo came from a `cancelled` leaf one copy showed). On one copy
    /// the read step 3 made is the only copy, and nothing more is read.
    #[tokio::test]
    async fn an_orphan_marker_is_converged_only_by_a_decision_standing_alone_on_every_copy() {
        let ops = || vec![undo("t1"), undo("t2"), undo("t3")];
        let (server, ledger) = ledger_stating(3).await;
        let kept = ledger.standing_on_every_copy(ops()).await.unwrap();
        let txns: Vec<&str> = kept.iter().map(|op| op.txn.as_str()).collect();
        assert_eq!(txns, ["t2"]);
        let requests = server.received_requests().await.unwrap();
        let read = requests
            .iter()
            .find(|r| r.url.path() == "/db/_bulk_get")
            .expect("every copy read");
        assert!(read.url.query_pairs().any(|(k, v)| k == "r" && v == "3"));

        let (server, ledger) = ledger_stating(1).await;
        let kept = ledger.standing_on_every_copy(ops()).await.unwrap();
        assert_eq!(kept, ops());
        let requests = server.received_requests().await.unwrap();
        assert!(requests.iter().all(|r| r.url.path() != "/db/_bulk_get"));
    }
}
