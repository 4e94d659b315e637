//! One round of the account engine: read the accounts its ops need, decide every op in memory,
//! write every changed account at once (with the transfer documents queued meanwhile), and
//! retry the accounts that conflicted. An op is answered here, once its outcome is certain.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;

use serde_json::Value;

use super::read::{AccountRead, Found};
use super::{AccountEngine, QueuedOp, QueuedTxn, Reply};
use crate::account_doc::{account_doc_id, AccountDoc};
use crate::clock::{now_ms, Instant};
use crate::couch::{BulkResult, RawDoc};
use crate::engine::bulk::{bulk_error, duplicate, results_by_id};
use crate::engine::ops::{AccountOp, OpKind, OpResult};
use crate::engine::rules::{evaluate_with, prune_candidates, prune_settled};
use crate::error::{Error, Result};
use crate::limits::{ACCOUNT_CAS_ATTEMPTS_MAX, BULK_BYTES_MAX};

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

/// Each open account's working copy in an attempt, and whether this attempt changed it.
type Copies = HashMap<String, (Option<AccountDoc>, bool)>;

/// A round of ops as its attempts go.
struct Round {
    ops: Vec<OpSlot>,
    /// The ops' accounts, in queue order.
    accounts: Vec<String>,
    slots: HashMap<String, Slot>,
    /// The accounts with ops still to answer.
    open: HashSet<String>,
    /// Whether settles and undos leave settled entries ([`Quorum::keeps_entries`]).
    ///
    /// [`Quorum::keeps_entries`]: crate::engine::Quorum::keeps_entries
    entries: bool,
    /// Whether a 201 to an account write means every copy took it.
    every_copy: bool,
    /// Links whose failure is final (answered): later attempts keep honouring them.
    failed_links: HashSet<u64>,
    /// Transfers whose state this round read for pruning, and those found done/cancelled.
    checked: HashSet<String>,
    terminal: HashSet<String>,
    /// Accounts whose next read must be of every copy ([`AccountEngine::read_every_copy`]):
    /// written with a 202, or holding an apply's marker this round did not write.
    wide: HashSet<String>,
    /// Accounts read from every copy in this round: a marker found there is on the one leaf
    /// every copy holds.
    widened: HashSet<String>,
}

impl Round {
    /// Whether a conflict pass's op ([`OpKind::Resolve`]) on `account` is still unanswered:
    /// its account is read from every copy.
    fn resolving(&self, account: &str) -> bool {
        self.ops
            .iter()
            .any(|o| o.reply.is_some() && o.op.account == account && o.op.kind == OpKind::Resolve)
    }

    /// The working copy of each open account, as this round holds it (none yet: it does not
    /// exist), marked changed when it is a merge still to write.
    fn working_copies(&self) -> Copies {
        let mut work: Copies = HashMap::new();
        for a in &self.accounts {
            if self.open.contains(a) {
                let slot = self.slots.get(a);
                let doc = slot.and_then(|s| s.doc.clone());
                work.insert(a.clone(), (doc, slot.is_some_and(|s| s.dirty)));
            }
        }
        work
    }

    /// Step 2, second half: decides every open op in queue order on its account's working
    /// copy. The deadline is judged once per attempt, after its reads.
    fn decide(&self, work: &mut Copies, now: i64) -> Vec<Option<Result<OpResult>>> {
        let instant = Instant::now();
        let mut links_now = self.failed_links.clone();
        let mut decided: Vec<Option<Result<OpResult>>> =
            (0..self.ops.len()).map(|_| None).collect();
        for (i, o) in self.ops.iter().enumerate() {
            if o.reply.is_none() || !self.open.contains(&o.op.account) {
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
            let result = evaluate_with(doc.as_mut(), &o.op, now, &links_now, self.entries);
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
        decided
    }

    /// Every attempt met a conflict: the accounts still open give up this round.
    fn give_up(mut self) {
        for a in self.open {
            tracing::warn!(account = %a, "account kept conflicting; giving up this round");
            answer_account(&mut self.ops, &a, |_| {
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
}

impl AccountEngine {
    /// One round: the account ops, and the transfer documents queued meanwhile, written in the
    /// same `_bulk_docs` as the round's first account write (or alone when it writes none). So a
    /// transfer's decision, queued as soon as its accounts' round answered, goes out with the
    /// next transfers' account writes: one request per round carries both phases.
    pub(super) async fn round(&self, ops: Vec<QueuedOp>, txns: Vec<QueuedTxn>) {
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
        let mut round = self.start_round(batch).await;
        for _attempt in 0..ACCOUNT_CAS_ATTEMPTS_MAX {
            if round.open.is_empty() {
                return;
            }
            // 1. Read every open account we hold no trustworthy copy of, in one request.
            if self.read_open(&mut round).await.is_break() {
                return;
            }
            // 2. Decide every open op in queue order, each account on its own working copy,
            //    pruned first of settled entries whose transfer reads done or cancelled (one
            //    read of those transfers, only when some account has enough to prune).
            let now = now_ms();
            let mut work = round.working_copies();
            self.prune(&mut round, &mut work, now).await;
            let mut decided = round.decide(&mut work, now);
            // 3. Accounts that need no write are answered — if their copy is fresh.
            let writes = self.answer_unwritten(&mut round, work, &mut decided).await;
            if writes.is_empty() {
                continue;
            }
            let debits = writes.iter().any(|doc| {
                let read = round
                    .slots
                    .get(&doc.account_id)
                    .and_then(|s| s.doc.as_ref());
                takes_a_limited_debit(read, doc)
            });
            // 4. `_bulk_docs` for every changed account (one request unless they pass
            //    [`BULK_BYTES_MAX`]), each a CAS on its `_rev` — with the queued transfer
            //    documents, handed to the bulk writer at the same moment so they share it.
            let results = match txns.take() {
                Some(t) => self.write_accounts_with(&writes, debits, t).await,
                None => self.write_accounts(&writes, debits).await,
            };
            self.answer_written(&mut round, writes, results, &mut decided)
                .await;
        }
        round.give_up();
    }

    /// A round before its first attempt: its ops, their accounts in queue order, the copies of
    /// them this engine holds, and what the database's copies say of settled entries and 201s.
    async fn start_round(&self, batch: Vec<QueuedOp>) -> Round {
        let ops: Vec<OpSlot> = batch
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
        // A conflict pass's accounts are read from every copy, never from the cache: a quorum
        // read's `_conflicts` are those of the copy that answered first among copies that agree
        // on the winner, so a conflict most copies hold can read as none, and the pass would
        // count it resolved with nothing merged (a real cluster: a planted leaf winning on a
        // copy the other leaf had not reached yet).
        let wide: HashSet<String> = ops
            .iter()
            .filter(|o| o.op.kind == OpKind::Resolve)
            .map(|o| o.op.account.clone())
            .collect();
        let slots: HashMap<String, Slot> = {
            let cache = self.cache();
            accounts
                .iter()
                .filter(|a| !wide.contains(*a))
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
        let open: HashSet<String> = accounts.iter().cloned().collect();
        // Unknown for now (the database could not be read): kept, which is always safe.
        let entries = self
            .quorum
            .keeps_entries(&self.client)
            .await
            .unwrap_or(true);
        // Whether a 201 to an account write means every copy took it.
        let every_copy = self.quorum.acks_every_copy(&self.client).await;
        Round {
            ops,
            accounts,
            slots,
            open,
            entries,
            every_copy,
            failed_links: HashSet::new(),
            checked: HashSet::new(),
            terminal: HashSet::new(),
            wide,
            widened: HashSet::new(),
        }
    }

    /// Step 1: reads every open account the round holds no trustworthy copy of, in one request.
    /// `Break` when that request failed: nothing was written in this attempt, every open op is
    /// answered with its error, and the round is over.
    async fn read_open(&self, round: &mut Round) -> ControlFlow<()> {
        let to_read: Vec<String> = round
            .accounts
            .iter()
            .filter(|a| round.open.contains(*a) && !round.slots.contains_key(*a))
            .cloned()
            .collect();
        if to_read.is_empty() {
            return ControlFlow::Continue(());
        }
        let (wide, narrow): (Vec<String>, Vec<String>) =
            to_read.into_iter().partition(|a| round.wide.contains(a));
        let read = async {
            let mut read = self.read(&narrow).await?;
            if !wide.is_empty() {
                read.extend(self.read_every_copy(&wide).await?);
                for a in wide {
                    round.wide.remove(&a);
                    round.widened.insert(a);
                }
            }
            Ok::<_, Error>(read)
        };
        match read.await {
            Ok(read) => {
                for (account, doc) in read {
                    self.take_read(round, account, doc);
                }
                ControlFlow::Continue(())
            }
            Err(e) => {
                for o in &mut round.ops {
                    if round.open.contains(&o.op.account) {
                        o.answer(Err(duplicate(&e)));
                    }
                }
                ControlFlow::Break(())
            }
        }
    }

    /// One account as step 1 read it: a copy for the round to decide on, or its ops answered.
    fn take_read(&self, round: &mut Round, account: String, doc: AccountRead) {
        match doc {
            AccountRead::Found(found) => {
                let Found { doc, losers, dirty } = *found;
                if let Some(d) = &doc {
                    if losers.is_empty() {
                        self.remember(d);
                    }
                }
                round.slots.insert(
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
                answer_account(&mut round.ops, &account, |_| Err(duplicate(&e)));
                round.open.remove(&account);
            }
            AccountRead::Unreadable(raw, e) => {
                // An apply is refused for good (the transfer is cancelled naming the
                // account); a settle or undo can only tell from the raw markers whether there
                // is work it cannot do.
                tracing::warn!(%account, "unreadable account document: {e}");
                for o in round.ops.iter_mut() {
                    if o.reply.is_none() || o.op.account != account {
                        continue;
                    }
                    let answer = unreadable_answer(&raw, &o.op, &e);
                    if matches!(answer, Ok(OpResult::Unreadable)) {
                        if let Some(link) = o.op.link {
                            round.failed_links.insert(link);
                        }
                    }
                    o.answer(answer);
                }
                round.open.remove(&account);
            }
        }
    }

    /// Step 2, first half: drops from the working copies the settled entries that may go — every
    /// copy known to hold them, and their transfer known to have ended, or read `done` or
    /// `cancelled` now (one read, of the transfers this round has not checked yet).
    async fn prune(&self, round: &mut Round, work: &mut Copies, now: i64) {
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
                .filter(|t| !round.checked.contains(t) && seen.insert(t.clone()))
                .collect()
        };
        let (known, candidates): (Vec<String>, Vec<String>) = {
            let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
            candidates
                .into_iter()
                .partition(|t| ended.ids.contains(crate::transfer::transfer_of(t)))
        };
        round.checked.extend(known.iter().cloned());
        round.terminal.extend(known);
        if !candidates.is_empty() {
            self.prune_reads.fetch_add(1, Ordering::Relaxed);
            match self.read_terminal(&candidates).await {
                Ok(done) => {
                    round.checked.extend(candidates);
                    round.terminal.extend(done);
                }
                // Pruning is best effort: the size cap holds without it.
                Err(e) => {
                    tracing::warn!("could not read transfers to prune settled entries: {e}")
                }
            }
        }
        if round.terminal.is_empty() {
            return;
        }
        let mut pruned: Copies = HashMap::new();
        for (a, (doc, _)) in work.iter() {
            if let Some(doc) = doc {
                let eligible = &prunable[a];
                let mut after = doc.clone();
                if prune_settled(&mut after, now, |t| {
                    round.terminal.contains(t) && eligible.contains(t)
                }) {
                    pruned.insert(a.clone(), (Some(after), true));
                }
            }
        }
        let known: Vec<(String, HashSet<String>)> = pruned
            .iter()
            .filter_map(|(a, (doc, _))| doc.as_ref().map(|d| (a.clone(), known_leaves(d))))
            .collect();
        for a in self.hiding_conflicts(known).await {
            pruned.remove(&a);
        }
        work.extend(pruned);
    }

    /// Of these accounts about to be pruned, each with the leaves its copy knows of, those that
    /// may hold a leaf the read of them did not show: on several copies, each is read from
    /// every copy (one request for all), and one with a live leaf it does not know is left
    /// unpruned and unconfirmed. A quorum read of a cluster keys the copies' answers by their
    /// winner alone, so a copy that lacks a rival leaf can answer for the quorum, `_conflicts`
    /// and all; pruning past entries that only the hidden leaf holds would make the merge that
    /// finally meets it take them as pruned on the winner and drop their deltas. Every account
    /// when the copies cannot be read now (pruning is best effort).
    async fn hiding_conflicts(&self, known: Vec<(String, HashSet<String>)>) -> Vec<String> {
        let accounts: Vec<String> = known.iter().map(|(a, _)| a.clone()).collect();
        if accounts.is_empty() {
            return accounts;
        }
        let copies = match self.quorum.several_copies(&self.client).await {
            Ok(Some(n)) => n,
            Ok(None) => return Vec::new(),
            Err(e) => {
                tracing::warn!("could not read the database's copies to prune: {e}");
                return accounts;
            }
        };
        let ids: Vec<String> = accounts.iter().map(|a| account_doc_id(a)).collect();
        let leaves = match self.client.leaves_of(&ids, Some(copies)).await {
            Ok(leaves) => leaves,
            Err(e) => {
                tracing::warn!("could not read every copy of the accounts to prune: {e}");
                return accounts;
            }
        };
        let mut hiding = Vec::new();
        for ((account, known), leaves) in known.into_iter().zip(leaves) {
            let unknown = leaves.iter().any(|l| {
                l.get("_deleted").and_then(Value::as_bool) != Some(true)
                    && !l
                        .get("_rev")
                        .and_then(Value::as_str)
                        .is_some_and(|r| known.contains(r))
            });
            if unknown {
                tracing::info!(%account, "a copy holds a leaf the read did not show; not pruning");
                self.unconfirm(&account);
                hiding.push(account);
            }
        }
        hiding
    }

    /// Step 3: answers the accounts that need no write — if their copy is fresh (read or written
    /// in this round), after deleting the losing leaves of a conflict their read merged; a
    /// decision on a cached copy is dropped with the copy, to be read and made again. The
    /// changed accounts, to write.
    async fn answer_unwritten(
        &self,
        round: &mut Round,
        mut work: Copies,
        decided: &mut [Option<Result<OpResult>>],
    ) -> Vec<AccountDoc> {
        let mut writes: Vec<AccountDoc> = Vec::new();
        for a in &round.accounts {
            if !round.open.contains(a) {
                continue;
            }
            let (doc, changed) = work.remove(a).expect("open account has a copy");
            if changed {
                writes.push(doc.expect("a changed account exists"));
            } else if round.slots.get(a).is_some_and(|s| s.fresh)
                && !round.widened.contains(a)
                && found_marker(&round.ops, decided, a)
                && !matches!(self.quorum.several_copies(&self.client).await, Ok(None))
            {
                // An apply answered from a marker this round did not write: on a cluster the
                // read showed some copies, and a rival debit's branch on the others would be
                // merged beside it only later, both debits counted against one balance. Read
                // every copy first, and decide again there.
                round.slots.remove(a);
                round.wide.insert(a.clone());
            } else if round.slots.get(a).is_some_and(|s| s.fresh) {
                if let Some(slot) = round.slots.get_mut(a) {
                    let winner = slot.doc.as_ref().and_then(|d| d.rev.clone());
                    let losers = std::mem::take(&mut slot.losers);
                    let refused = self
                        .delete_losers(&account_doc_id(a), losers, winner.as_deref())
                        .await;
                    fail_resolves(&mut round.ops, a, refused);
                }
                answer_decided(&mut round.ops, decided, a, &mut round.failed_links);
                round.open.remove(a);
            } else {
                // Decided on a cached copy that may be stale: read it and decide again.
                round.slots.remove(a);
                self.forget(a);
            }
        }
        writes
    }

    /// Step 4: what each account's write came to. A 201 answers its ops with this attempt's
    /// decisions; a 202 or a conflict drops the copy, to be read and decided again; any other
    /// refusal, or a request whose outcome is unknown, answers them with its error.
    async fn answer_written(
        &self,
        round: &mut Round,
        writes: Vec<AccountDoc>,
        results: Vec<Result<BulkResult>>,
        decided: &mut [Option<Result<OpResult>>],
    ) {
        for (mut doc, r) in writes.into_iter().zip(results) {
            let a = doc.account_id.clone();
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    // Unknown whether it landed (or refused as too large): drop the
                    // copy and fail these ops; the caller's protocol step is
                    // idempotent and will be redone.
                    round.slots.remove(&a);
                    self.forget(&a);
                    answer_account(&mut round.ops, &a, |_| Err(duplicate(&e)));
                    round.open.remove(&a);
                    continue;
                }
            };
            if r.is_ok() && !r.accepted {
                doc.rev = r.rev.clone();
                self.remember(&doc);
                if round.every_copy {
                    self.confirm(&doc);
                }
                let losers = round
                    .slots
                    .get_mut(&a)
                    .map(|s| std::mem::take(&mut s.losers))
                    .unwrap_or_default();
                let refused = self
                    .delete_losers(&doc.id, losers, doc.rev.as_deref())
                    .await;
                fail_resolves(&mut round.ops, &a, refused);
                round.slots.insert(
                    a.clone(),
                    Slot {
                        doc: Some(doc),
                        fresh: true,
                        losers: Vec::new(),
                        dirty: false,
                    },
                );
                answer_decided(&mut round.ops, decided, &a, &mut round.failed_links);
                round.open.remove(&a);
            } else if r.is_ok() {
                // 202: on some copies only, maybe in conflict with a rival that reached the
                // others. Never taken as written: read again (with conflicts, merged) and
                // decide again — an op whose write did land finds its own marker.
                tracing::info!(account = %a, "account write accepted (202), not confirmed; re-reading");
                self.unconfirm(&a);
                self.conflicts.uncertain.fetch_add(1, Ordering::Relaxed);
                round.slots.remove(&a);
                round.wide.insert(a.clone());
                self.forget(&a);
            } else if r.is_conflict() {
                round.slots.remove(&a);
                self.forget(&a);
                if round.resolving(&a) {
                    // Read again from every copy: a quorum read may hide the conflict again.
                    round.wide.insert(a.clone());
                }
            } else {
                let e = bulk_error(&account_doc_id(&a), &r);
                answer_account(&mut round.ops, &a, |_| Err(duplicate(&e)));
                round.open.remove(&a);
            }
        }
    }

    /// Writes accounts with `_bulk_docs`, in requests of at most [`BULK_BYTES_MAX`] bytes; a
    /// request the server refuses as too large (413) is split in two and sent again, down to
    /// one document, whose 413 is its answer. One answer per document, in order: its result,
    /// or the error of the request that carried it (unknown whether it landed). `debits`: some
    /// write takes a new debit on a limited account, so every request goes exclusive.
    pub(super) async fn write_accounts(
        &self,
        writes: &[AccountDoc],
        debits: bool,
    ) -> Vec<Result<BulkResult>> {
        let mut answers: Vec<Option<Result<BulkResult>>> = writes.iter().map(|_| None).collect();
        let (raw, mut chunks) = serialized_in_chunks(writes, &mut answers);
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
            let options = self.quorum.write_options(&self.client, debits).await;
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
                    let size = raw[chunk[0]].as_ref().map_or(0, RawDoc::bytes);
                    answers[chunk[0]] = Some(Err(too_large_alone(&writes[chunk[0]].id, size, &e)));
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
}

/// Whether `written` holds a debit marker that `read` (the account as this attempt read it, or
/// `None` for an account created now) lacks, on an account with a minimum: its funds check
/// passed on this branch alone unless the write reaches every copy (`WriteQuorum`).
fn takes_a_limited_debit(read: Option<&AccountDoc>, written: &AccountDoc) -> bool {
    written.min_balance.is_some()
        && written.pending.iter().any(|m| {
            m.delta.is_negative() && !read.is_some_and(|r| r.pending.iter().any(|p| p.txn == m.txn))
        })
}

/// The accounts `writes` serialized, each once (the same bytes size the chunks and go on the
/// wire), and their indexes in chunks of at most [`BULK_BYTES_MAX`] bytes (a document larger
/// than that alone in its chunk). One that cannot be serialized has its error in `answers` and
/// no chunk.
fn serialized_in_chunks(
    writes: &[AccountDoc],
    answers: &mut [Option<Result<BulkResult>>],
) -> (Vec<Option<RawDoc>>, VecDeque<Vec<usize>>) {
    let mut chunks: VecDeque<Vec<usize>> = VecDeque::new();
    let mut chunk: Vec<usize> = Vec::new();
    let mut bytes = 0usize;
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
    (raw, chunks)
}

/// The answer for the account `id` (`size` bytes) that the server refused as too large (`e`,
/// a 413) even in a request of its own.
fn too_large_alone(id: &str, size: usize, e: &Error) -> Error {
    Error::status(
        413,
        Some("too_large".to_owned()),
        Some(format!(
            "the server refuses {id} as too large ({size} bytes) even alone"
        )),
    )
    .with_request("POST", "_bulk_docs")
    .with_source(e.to_string())
}

/// What an op on an account whose document cannot be read comes to. An apply is a business
/// refusal ([`OpResult::Unreadable`]): the transfer is cancelled, never stuck. A settle or undo
/// reads the raw markers: no marker of the transfer means nothing to do (it was never applied
/// here), a marker means work this program cannot do on that document — an error, so the
/// transfer waits for a person to repair the account, which `verify` reports.
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

/// Whether an unanswered apply on `account` was decided from a marker of its transfer that was
/// there already (`AlreadyPending` or `Adopted`): its answer says the debit or credit stands.
fn found_marker(ops: &[OpSlot], decided: &[Option<Result<OpResult>>], account: &str) -> bool {
    ops.iter().zip(decided).any(|(o, d)| {
        o.reply.is_some()
            && o.op.account == account
            && matches!(o.op.kind, OpKind::Apply { .. })
            && matches!(d, Some(Ok(OpResult::AlreadyPending | OpResult::Adopted(_))))
    })
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

/// The leaves a working copy of an account knows of: its own revision, and the losing leaves its
/// branch joined already (`merged`, kept while they are still leaves: a member may not delete
/// them).
fn known_leaves(doc: &AccountDoc) -> HashSet<String> {
    doc.rev.iter().chain(doc.merged.iter()).cloned().collect()
}
