//! The one-write path (docs/ONE_WRITE.md): a transfer decided by one exclusive write of its
//! document, made after both of its accounts were applied.
//!
//! 1. **Apply** both accounts in one engine call, each with a pending marker naming this
//!    attempt (or adopting the marker an earlier attempt of the same transfer left there).
//! 2. **Decide**: create `txn:{id}` `done`, naming the attempt of the marker on each account,
//!    or `cancelled` with the reason of a refusal — or, for a transfer left `initial`, the same
//!    decision as a CAS on its `_rev`. Exclusive: of two deciders one writes, the other meets
//!    a 409 (docs/CLUSTER.md F6 on a cluster).
//! 3. **Follow** a decision made elsewhere: read the document and take its outcome.
//! 4. **Converge** the accounts to the decision: the named markers settled, any other marker
//!    of the transfer undone.
//!
//! The rule that makes adopting a marker safe: **no marker is undone before its transfer's
//! document says how the transfer ended.** A worker that stops before deciding (an error, a
//! crash) leaves its markers for the next attempt or for the sweeper, which gives the transfers
//! nobody decided their document (`initial`, the terms taken from a marker) and drives them.

use crate::clock::Instant;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::account_doc::Attempt;
use crate::couch::RawDoc;
use crate::engine::{now_ms, AccountOp, Decide, OpKind, OpResult};
use crate::error::{Condition, Error, Result};
use crate::ledger::{Finishing, Ledger};
use crate::limits::{DRIVE_PHASES_MAX, SETTLE_HOLD_LEASE_DIVISOR, SETTLE_HOLD_MS};
use crate::orders::RecordStatus;
use crate::state::{transition, Event, State};
#[cfg(feature = "failpoints")]
use crate::transfer::crash;
use crate::transfer::{
    new_txn_doc, unconfirmed, Decided, FinishingGuard, Named, Reason, TransferOutcome,
    TransferRequest, TxnDoc, TxnWritten,
};

/// How many times one submit resolves a transfer's conflict that blocked its accounts before it
/// leaves the error to its caller (and the sweeper).
const UNBLOCKS_MAX: usize = 3;

/// What one attempt's apply calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Both accounts hold a marker of the transfer: decide `done`, naming their attempts.
    Done(Named),
    /// A business refusal: decide `cancelled`.
    Cancel(Reason),
    /// The transfer was decided before (an account shows it settled or undone) or is a
    /// transfer of the stepwise protocol (its marker has no attempt): follow its document.
    Follow,
    /// Not applied this time (a linked apply refused in the same round and that refusal did not
    /// stand, or the deadline passed): apply again.
    Retry,
}

/// What applying in the engine came to: the decision it wrote (and how that write went), or
/// what the answers call for instead.
enum Applied {
    Wrote(Box<TxnDoc>, Result<TxnWritten>),
    Next(Next),
}

/// The attempt a marker answer stands for: this attempt's own, or the one it adopted.
fn marker_of(attempt: Attempt, result: OpResult) -> Option<Attempt> {
    match result {
        OpResult::Applied => Some(attempt),
        OpResult::Adopted(theirs) => Some(theirs),
        _ => None,
    }
}

fn judge(attempt: Attempt, debit: OpResult, credit: OpResult) -> Next {
    let both = [debit, credit];
    let any = |f: fn(&OpResult) -> bool| both.iter().any(f);
    if any(|r| matches!(r, OpResult::Finished | OpResult::AlreadyPending)) {
        return Next::Follow;
    }
    let reason = if any(|r| *r == OpResult::UnknownAccount) {
        Some(Reason::UnknownAccount)
    } else if any(|r| *r == OpResult::Unreadable) {
        Some(Reason::UnreadableAccount)
    } else if any(|r| *r == OpResult::CurrencyMismatch) {
        Some(Reason::CurrencyMismatch)
    } else if any(|r| *r == OpResult::Overflow) {
        Some(Reason::BalanceOverflow)
    } else if any(|r| matches!(r, OpResult::Insufficient | OpResult::Overdrawn)) {
        Some(Reason::InsufficientFunds)
    } else {
        None
    };
    if let Some(reason) = reason {
        return Next::Cancel(reason);
    }
    match (marker_of(attempt, debit), marker_of(attempt, credit)) {
        (Some(source), Some(destination)) => Next::Done(Named {
            source,
            destination,
        }),
        // NotApplied, or an answer an apply never gives.
        _ => Next::Retry,
    }
}

/// The decision the engine made (`Ok`), or the simulated crash that kept it from one.
type Made = Arc<Mutex<Option<std::result::Result<TxnDoc, Error>>>>;

/// What the engine calls once both applies of `terms` by `attempt` are answered: the decision
/// their answers call for (the document and its id) for the engine to write, kept in `made`
/// too; `None` when they call for none, or when the document cannot be written (its error in
/// `made`).
fn decider(terms: TxnDoc, attempt: Attempt, made: Made) -> Decide {
    Box::new(move |debit, credit| {
        fail_point!("once-after-apply", |_| {
            *made.lock().unwrap_or_else(|e| e.into_inner()) = Some(Err(crash("once-after-apply")));
            None
        });
        let doc = match judge(attempt, debit, credit) {
            Next::Done(named) => decision(&terms, State::Done, Some(named), None),
            Next::Cancel(reason) => decision(&terms, State::Cancelled, None, Some(reason)),
            Next::Follow | Next::Retry => return None,
        };
        let raw = doc
            .check()
            .map_err(|m| Error::invariant(format!("refusing to write {}: {m}", doc.id)))
            .and_then(|()| RawDoc::new(&doc.id, &doc));
        let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
        match raw {
            Ok(raw) => {
                let id = doc.id.clone();
                *made = Some(Ok(doc));
                Some((id, raw))
            }
            Err(e) => {
                *made = Some(Err(e));
                None
            }
        }
    })
}

/// How a call answers about the transfer `existing` it followed: `created` when it is the
/// decision this call tried to write (`tried`), `exists` otherwise.
fn answer_status(existing: &TxnDoc, tried: Option<&TxnDoc>) -> RecordStatus {
    let ours = tried.is_some_and(|t| {
        existing.created_at == t.created_at
            && existing.state == t.state
            && existing.markers == t.markers
    });
    if ours {
        RecordStatus::Created
    } else {
        RecordStatus::Exists
    }
}

/// "Not decided in time": the worker's deadline passed before its accounts were applied (the
/// sweeper's pass, whose transfer's document exists already, tries again next pass).
fn undecided(id: &str) -> Error {
    Error::ledger(
        Condition::Undecided,
        format!(
            "transfer {id} could not be applied within this worker's lease; the sweeper \
             finishes it"
        ),
    )
}

impl Ledger {
    /// `submit(…, wait = true)` of a transfer that is not a reversal: apply, decide, converge.
    pub(crate) async fn submit_once(
        &self,
        id: &str,
        request: &TransferRequest,
    ) -> Result<TransferOutcome> {
        let now = now_ms();
        let (_, deadline) = self.new_claim();
        let terms = new_txn_doc(id, request, None, None, now);
        // A re-sent id, answered from its document with nothing written: known to have ended
        // here, or looked up first (`LedgerBuilder::lookup_first`).
        if self.inner.accounts.has_ended(id) {
            return self.follow_once(&terms, None, Vec::new()).await;
        }
        if self.inner.lookup_first {
            match self.read_txn(id).await {
                // Ended, or taken by other terms: answered as it is. One still open (left
                // `initial`, or a stepwise one) goes the usual way, which finishes it.
                Ok(existing)
                    if existing.state.is_terminal()
                        || existing.differing_term(&terms).is_some() =>
                {
                    return self.follow_once(&terms, None, Vec::new()).await;
                }
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let attempt = Attempt::random();
        let mut touched: Vec<String> = Vec::new();
        // Transfers' conflicts resolved for this submit (`unblocked`).
        let mut unblocks = 0;
        for _ in 0..DRIVE_PHASES_MAX {
            // The engine decides as soon as both applies are answered and writes the decision
            // in its next round (`AccountEngine::run_decided`).
            let applied = self
                .apply_decided(&terms, attempt, deadline, &mut touched)
                .await;
            let applied = match applied {
                Err(e) if unblocks < UNBLOCKS_MAX && self.unblocked(&e, deadline).await => {
                    unblocks += 1;
                    continue;
                }
                other => other?,
            };
            match applied {
                Applied::Wrote(decision, written) => {
                    return self.decided_once(&terms, *decision, written, touched).await;
                }
                Applied::Next(Next::Retry) if Instant::now() >= deadline => {
                    return self.leave_for_sweeper(&terms, touched).await;
                }
                Applied::Next(Next::Retry) => continue,
                Applied::Next(_) => return self.follow_once(&terms, None, touched).await,
            }
        }
        Err(Error::invariant(format!(
            "transfer {id} was not applied within {DRIVE_PHASES_MAX} attempts"
        )))
    }

    /// Whether an apply that failed because an account's conflict waits on a transfer that is
    /// itself in conflict (a cluster: two deciders' writes both landed, e.g. two callers of one
    /// id at once) may go again: that transfer's conflict resolved here, as the sweeper would,
    /// before `deadline`. A transfer that cannot be resolved (different terms under one id,
    /// no right to delete a leaf) leaves the error to the caller.
    async fn unblocked(&self, e: &Error, deadline: Instant) -> bool {
        let Some(txn) = e.blocking_transfer() else {
            return false;
        };
        if Instant::now() >= deadline {
            return false;
        }
        match self.read_txn(txn).await {
            Ok(_) => {
                tracing::info!(
                    txn,
                    "resolved a transfer's conflict that blocked an account"
                );
                true
            }
            Err(resolving) => {
                tracing::warn!(txn, error = %resolving, "could not resolve a transfer's conflict");
                false
            }
        }
    }

    /// Step 2's outcome: the decision written (converge and answer), someone else's there
    /// (follow it), or this one only on some copies (not final: left to the sweeper, which
    /// resolves any rival and converges the accounts once the copies agree).
    async fn decided_once(
        &self,
        terms: &TxnDoc,
        decision: TxnDoc,
        written: Result<TxnWritten>,
        touched: Vec<String>,
    ) -> Result<TransferOutcome> {
        match written? {
            TxnWritten::Uncertain => Err(unconfirmed(&terms.txn_id)),
            TxnWritten::Written(rev) => {
                fail_point!("once-after-decide", |_| Err(crash("once-after-decide")));
                let mut doc = decision;
                doc.rev = Some(rev);
                self.converge_decided(doc, touched, RecordStatus::Created)
                    .await
            }
            TxnWritten::Taken => self.follow_once(terms, Some(&decision), touched).await,
        }
    }

    /// Steps 1 and 2 in the engine: both accounts applied, and the decision the answers call
    /// for written by the engine in its next round (`AccountEngine::run_decided`). Records the
    /// accounts holding a marker of the transfer in `touched`.
    async fn apply_decided(
        &self,
        terms: &TxnDoc,
        attempt: Attempt,
        deadline: Instant,
        touched: &mut Vec<String>,
    ) -> Result<Applied> {
        let made: Made = Arc::new(Mutex::new(None));
        let decide = decider(terms.clone(), attempt, Arc::clone(&made));
        self.pause_at("apply").await;
        // A test's pause at `decide` holds the decision's write in the engine, on this path.
        let hold = self.inner.pause.as_ref().map(|hook| (hook.0)("decide"));
        let ops = self.apply_ops(terms, attempt, deadline);
        let decided = self.inner.accounts.run_decided(ops, decide, hold).await;
        let (debit, credit) = (decided.debit?, decided.credit?);
        tracing::debug!(
            txn = %terms.txn_id,
            %attempt,
            source_result = ?debit,
            destination_result = ?credit,
            "one-write apply (decided in the engine)"
        );
        for (account, result) in [(&terms.source, debit), (&terms.destination, credit)] {
            if marker_of(attempt, result).is_some() && !touched.contains(account) {
                touched.push(account.clone());
            }
        }
        let made = made.lock().unwrap_or_else(|e| e.into_inner()).take();
        match (decided.write, made) {
            (Some(rx), Some(Ok(doc))) => {
                let written = rx.await.unwrap_or_else(|_| {
                    Err(Error::invariant(
                        "the transfer writer stopped before answering",
                    ))
                });
                let written = self.txn_written(&doc, written).await;
                Ok(Applied::Wrote(Box::new(doc), written))
            }
            (_, Some(Err(e))) => Err(e),
            (_, _) => match judge(attempt, debit, credit) {
                Next::Done(_) | Next::Cancel(_) => Err(Error::invariant(format!(
                    "transfer {}: the account engine stopped before writing its decision",
                    terms.txn_id
                ))),
                next => Ok(Applied::Next(next)),
            },
        }
    }

    /// The worker's lease ran out before both accounts were applied (a very slow server): the
    /// transfer is written `initial`, as `submit(…, wait = false)` writes it, and answered as it
    /// stands; the sweeper drives it (adopting whatever marker this attempt left).
    async fn leave_for_sweeper(
        &self,
        terms: &TxnDoc,
        touched: Vec<String>,
    ) -> Result<TransferOutcome> {
        tracing::warn!(
            txn = %terms.txn_id,
            "lease ran out before the accounts were applied; leaving the transfer to the sweeper"
        );
        let mut initial = terms.clone();
        initial.last_modified = now_ms();
        match self.write_txn(&initial).await? {
            Some(rev) => {
                initial.rev = Some(rev);
                Ok(initial.outcome(RecordStatus::Created))
            }
            None => self.follow_once(terms, None, touched).await,
        }
    }

    /// The two applies of `terms` by `attempt` (debit, credit), linked.
    fn apply_ops(&self, terms: &TxnDoc, attempt: Attempt, deadline: Instant) -> [AccountOp; 2] {
        let link = Some(self.inner.accounts.next_link());
        let key = terms.entry_key();
        let op = |account: &str, peer: &str, delta, check_funds| AccountOp {
            account: account.to_owned(),
            txn: key.clone(),
            kind: OpKind::Apply {
                delta,
                currency: terms.currency.clone(),
                check_funds,
                deadline: Some(deadline),
                attempt: Some(attempt),
                peer: Some(peer.to_owned()),
            },
            link,
        };
        [
            op(&terms.source, &terms.destination, terms.value.neg(), true),
            op(&terms.destination, &terms.source, terms.value, false),
        ]
    }

    /// Step 1: both accounts in one engine call. Records in `touched` each account found holding
    /// a marker of the transfer (this attempt's or an adopted one).
    async fn apply_once(
        &self,
        terms: &TxnDoc,
        attempt: Attempt,
        deadline: Instant,
        touched: &mut Vec<String>,
    ) -> Result<Next> {
        self.pause_at("apply").await;
        let ops = self.apply_ops(terms, attempt, deadline);
        let mut answers = self.inner.accounts.run(ops.to_vec()).await.into_iter();
        let debit = answers.next().expect("two answers")?;
        let credit = answers.next().expect("two answers")?;
        tracing::debug!(
            txn = %terms.txn_id,
            %attempt,
            source = %terms.source,
            source_result = ?debit,
            destination = %terms.destination,
            destination_result = ?credit,
            "one-write apply"
        );
        for (account, result) in [(&terms.source, debit), (&terms.destination, credit)] {
            if marker_of(attempt, result).is_some() && !touched.contains(account) {
                touched.push(account.clone());
            }
        }
        fail_point!("once-after-apply", |_| Err(crash("once-after-apply")));
        Ok(judge(attempt, debit, credit))
    }

    /// Step 3: the document exists (a 409 on the create, or an account showing the transfer
    /// decided). `tried`: the decision this call tried to write.
    async fn follow_once(
        &self,
        terms: &TxnDoc,
        tried: Option<&TxnDoc>,
        touched: Vec<String>,
    ) -> Result<TransferOutcome> {
        let id = &terms.txn_id;
        for _ in 0..DRIVE_PHASES_MAX {
            let existing = self.read_followed(id, tried).await?;
            if let Some(field) = existing.differing_term(terms) {
                if existing.state.is_terminal() {
                    // Decided: this call's markers are not its markers (unless it named them).
                    self.converge_now(&existing, &touched).await;
                }
                return Err(Error::mismatch(&terms.id, field));
            }
            let status = answer_status(&existing, tried);
            match existing.state {
                State::Done | State::Cancelled => {
                    self.confirm_decision(&existing, Decided::Read).await?;
                    return self.converge_decided(existing, touched, status).await;
                }
                State::Initial => {
                    // Left for the sweeper by `submit(…, wait = false)`: decide it here, the
                    // same decision as a CAS on its revision.
                    let Some(tried) = tried else {
                        return Ok(existing.outcome(status));
                    };
                    if let Some(decided) = self.decide_left(id, &existing, tried).await? {
                        return self.converge_decided(decided, touched, status).await;
                    }
                }
                State::Pending | State::Committed | State::Canceling => {
                    return self.follow_stepwise(terms, existing, status).await;
                }
            }
        }
        Err(Error::invariant(format!(
            "transfer {id} kept changing while this call followed it"
        )))
    }

    /// Step 3's read of the transfer `id`. Not there: after this call's decision was tried
    /// (`tried`), a create answered 202 whose revision the read did not reach yet; otherwise an
    /// account showed it decided, and a document missing then is an invariant broken.
    async fn read_followed(&self, id: &str, tried: Option<&TxnDoc>) -> Result<TxnDoc> {
        match self.read_txn(id).await {
            Ok(doc) => Ok(doc),
            Err(e) if e.is_not_found() => Err(match tried {
                // A create answered 202 whose revision this read did not reach yet.
                Some(_) => Error::ledger(
                    Condition::Uncertain,
                    format!(
                        "the decision of transfer {id} was accepted but not confirmed; submit \
                         it again with the same id"
                    ),
                ),
                None => Error::invariant(format!(
                    "an account shows transfer {id} decided, but its document does not exist"
                )),
            }),
            Err(e) => Err(e),
        }
    }

    /// The decision `tried` written over the transfer `id` left `initial` (`existing`), as a
    /// CAS on its revision: the document written, or `None` when someone else wrote first
    /// (followed on the next read).
    async fn decide_left(
        &self,
        id: &str,
        existing: &TxnDoc,
        tried: &TxnDoc,
    ) -> Result<Option<TxnDoc>> {
        let mut decided = existing.clone();
        decided.state = tried.state;
        decided.reason = tried.reason.clone();
        decided.markers = tried.markers;
        decided.claim = None;
        decided.last_modified = now_ms();
        decided.mark_decided(decided.last_modified);
        match self.write_txn_outcome(&decided).await? {
            TxnWritten::Written(rev) => {
                decided.rev = Some(rev);
                // Written over `initial`: a rival decision created on a copy that lacked the
                // document may stand beside it.
                self.confirm_decision(&decided, Decided::WrittenHere)
                    .await?;
                Ok(Some(decided))
            }
            TxnWritten::Uncertain => Err(unconfirmed(id)),
            TxnWritten::Taken => Ok(None),
        }
    }

    /// A transfer of the stepwise protocol (a reversal, or one begun by `step`) met under this
    /// call's id: its own drive counts whatever marker of it the accounts hold, so it is
    /// driven here when nobody holds it, and answered as it ends (or stands).
    async fn follow_stepwise(
        &self,
        terms: &TxnDoc,
        existing: TxnDoc,
        status: RecordStatus,
    ) -> Result<TransferOutcome> {
        if !existing.claim_free(now_ms(), &self.inner.worker_id, true) {
            return Ok(existing.outcome(status));
        }
        let (end, decided) = match self.take_over(&existing).await? {
            Some(drive) => self.drive(drive).await?.with_how(),
            None => (self.read_txn(&terms.txn_id).await?, Decided::Read),
        };
        // On a cluster the drive may have met other terms of this id and kept those
        // (`resolve_transfer`): then this call's transfer never happened.
        if let Some(field) = end.differing_term(terms) {
            return Err(Error::mismatch(&terms.id, field));
        }
        self.confirm_decision(&end, decided).await?;
        Ok(end.outcome(status))
    }

    /// Step 4 after a decision: converges `touched` (and, for a `done` one, both of its
    /// accounts) and answers. With the background finish the settles of a `done` transfer are
    /// held for the accounts' next writes and the answer comes at once.
    async fn converge_decided(
        &self,
        doc: TxnDoc,
        touched: Vec<String>,
        status: RecordStatus,
    ) -> Result<TransferOutcome> {
        let outcome = doc.outcome(status);
        if touched.is_empty() {
            return Ok(outcome);
        }
        if self.inner.background {
            self.converge_in_background(doc, touched, None);
        } else {
            self.converge(&doc, &touched, false).await;
        }
        Ok(outcome)
    }

    /// Converges `touched` to `doc`'s decision in a task of its own, the settles held for the
    /// accounts' next writes; counted in [`Ledger::flush`] (which sends what is still held and
    /// waits for it), and in `also` when given (a sweeper pass waits for its own drives only).
    fn converge_in_background(
        &self,
        doc: TxnDoc,
        touched: Vec<String>,
        also: Option<Arc<Finishing>>,
    ) {
        self.inner.finishing.count.fetch_add(1, Ordering::AcqRel);
        if let Some(also) = &also {
            also.count.fetch_add(1, Ordering::AcqRel);
            also.txns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(doc.entry_key());
        }
        let ledger = self.clone();
        tokio::spawn(async move {
            // Counted out even if it panics, so a wait for them never lasts forever.
            let _counted = FinishingGuard(&ledger.inner.finishing);
            let _also = also.as_deref().map(FinishingGuard);
            ledger.converge(&doc, &touched, true).await;
        });
    }

    /// Converges `accounts` now to `doc`, a decision read, once it stands alone on every copy
    /// ([`Ledger::confirm_decision`]); until then nothing is settled or undone here, and the
    /// sweeper converges the markers once it does. Settles and undos are what a resolution of
    /// the document's leaves reads its outcome from, so acting on a leaf a rival may still
    /// join splits the accounts between two outcomes.
    pub(crate) async fn converge_now(&self, doc: &TxnDoc, accounts: &[String]) {
        match self.confirm_decision(doc, Decided::Read).await {
            Ok(()) => self.converge(doc, accounts, false).await,
            Err(e) => tracing::info!(
                txn = %doc.txn_id,
                "a decision read is not yet alone on every copy; its markers are left to the sweeper: {e}"
            ),
        }
    }

    /// Converges `accounts` to `doc`'s decision: settles (held for the accounts' next writes when
    /// `hold`) and undos. A failure is logged: what is left pending, the sweeper converges.
    async fn converge(&self, doc: &TxnDoc, accounts: &[String], hold: bool) {
        self.pause_at("converge").await;
        let mut seen = HashSet::new();
        let key = doc.entry_key();
        let ops: Vec<AccountOp> = accounts
            .iter()
            .filter(|a| seen.insert(a.as_str()))
            .filter_map(|account| {
                doc.convergence(account, &key).map(|kind| AccountOp {
                    account: account.clone(),
                    txn: key.clone(),
                    kind,
                    link: None,
                })
            })
            .collect();
        if ops.is_empty() {
            return;
        }
        let settles_only = ops.iter().all(|o| matches!(o.kind, OpKind::Settle { .. }));
        let answers = if hold && settles_only {
            // Far inside any lease, whatever this ledger was given.
            let hold = std::time::Duration::from_millis(SETTLE_HOLD_MS)
                .min(self.inner.lease / SETTLE_HOLD_LEASE_DIVISOR);
            self.inner.accounts.run_held(ops.clone(), hold).await
        } else {
            self.inner.accounts.run(ops.clone()).await
        };
        for (answer, op) in answers.into_iter().zip(ops) {
            match answer {
                Ok(OpResult::Repaired) => tracing::warn!(
                    txn = %doc.txn_id,
                    account = %op.account,
                    "undid a marker the decision does not name"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    txn = %doc.txn_id,
                    account = %op.account,
                    "could not converge the account to the decision (the sweeper will): {e}"
                ),
            }
        }
    }

    /// Lets a test hold the worker right before a write of this path.
    async fn pause_at(&self, phase: &'static str) {
        if let Some(hook) = &self.inner.pause {
            (hook.0)(phase).await;
        }
    }

    /// The sweeper's one-write path for a transfer left `initial`: apply with an attempt, then
    /// the decision as a CAS `initial → done | cancelled` on its revision, then converge. No
    /// claim is written: two drivers at once make one effect (the second adopts the first's
    /// markers; one CAS wins, the other follows). Returns the transfer as it ended and whether
    /// this call decided it. The settles are not waited for: they are held for the accounts'
    /// next writes (the pass's other drives share them), counted in `pass`, whose end sends
    /// what is still held and waits for it. Waiting here held each drive for the whole hold,
    /// so a pass of 256 drives at a time finished ~256 transfers a second.
    pub(crate) async fn decide_initial(
        &self,
        doc: TxnDoc,
        pass: &Arc<Finishing>,
    ) -> Result<(TxnDoc, bool)> {
        debug_assert_eq!(doc.state, State::Initial);
        let (_, deadline) = self.new_claim();
        let attempt = Attempt::random();
        let mut touched: Vec<String> = Vec::new();
        for _ in 0..DRIVE_PHASES_MAX {
            let next = self
                .apply_once(&doc, attempt, deadline, &mut touched)
                .await?;
            let (state, markers, reason) = match next {
                Next::Done(named) => (State::Done, Some(named), None),
                Next::Cancel(reason) => (State::Cancelled, None, Some(reason)),
                Next::Retry if Instant::now() >= deadline => return Err(undecided(&doc.txn_id)),
                Next::Retry => continue,
                // Decided meanwhile, or taken by the stepwise protocol: follow the document.
                Next::Follow => break,
            };
            let event = if state == State::Done {
                Event::Decide
            } else {
                Event::Reject
            };
            let mut decided = doc.clone();
            decided.state = transition(doc.state, event)?;
            decided.markers = markers;
            decided.reason = reason.map(|r| r.as_str().to_owned());
            decided.claim = None;
            decided.last_modified = now_ms();
            decided.mark_decided(decided.last_modified);
            self.pause_at("decide").await;
            match self.write_txn_outcome(&decided).await? {
                TxnWritten::Written(rev) => {
                    fail_point!("once-after-decide", |_| Err(crash("once-after-decide")));
                    decided.rev = Some(rev);
                    // Written over `initial`: a rival created on a copy that lacked the document
                    // may stand beside it, and a settle made now would not be seen by the
                    // resolution that keeps the rival (it reads settled entries). Until the
                    // decision stands alone on every copy its markers are the sweeper's.
                    match self.confirm_decision(&decided, Decided::WrittenHere).await {
                        Ok(()) => self.converge_in_background(
                            decided.clone(),
                            touched,
                            Some(Arc::clone(pass)),
                        ),
                        Err(e) if e.is_unconfirmed() => tracing::info!(
                            txn = %doc.txn_id,
                            "decided, but not yet alone on every copy; its markers are left to a later pass"
                        ),
                        Err(e) => return Err(e),
                    }
                    return Ok((decided, true));
                }
                // Not final: a later pass finds it decided, or in conflict, and goes on.
                TxnWritten::Uncertain => return Err(unconfirmed(&doc.txn_id)),
                TxnWritten::Taken => break,
            }
        }
        // Someone else wrote first: follow what they wrote.
        let now = self.read_txn(&doc.txn_id).await?;
        if now.state.is_terminal() {
            self.converge_now(&now, &touched).await;
            return Ok((now, false));
        }
        if now.state == State::Initial {
            return Ok((now, false));
        }
        // Taken over by the stepwise protocol (`step`): its drive.
        match self.take_over(&now).await? {
            Some(drive) => Ok((self.drive(drive).await?.doc, true)),
            None => Ok((self.read_txn(&doc.txn_id).await?, false)),
        }
    }
}

/// The decision document: `terms` in `state`, created now.
fn decision(
    terms: &TxnDoc,
    state: State,
    markers: Option<Named>,
    reason: Option<Reason>,
) -> TxnDoc {
    let mut doc = terms.clone();
    doc.state = state;
    doc.markers = markers;
    doc.reason = reason.map(|r| r.as_str().to_owned());
    doc.claim = None;
    doc.last_modified = now_ms();
    doc.mark_decided(doc.last_modified);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(bits: u64) -> Attempt {
        Attempt::from_bits(bits)
    }

    #[test]
    fn both_markers_decide_done_naming_each_attempt() {
        use OpResult as R;
        assert_eq!(
            judge(a(1), R::Applied, R::Applied),
            Next::Done(Named {
                source: a(1),
                destination: a(1)
            })
        );
        assert_eq!(
            judge(a(1), R::Adopted(a(7)), R::Applied),
            Next::Done(Named {
                source: a(7),
                destination: a(1)
            })
        );
    }

    #[test]
    fn a_decided_transfer_is_followed_before_anything_else() {
        use OpResult as R;
        assert_eq!(judge(a(1), R::Insufficient, R::Finished), Next::Follow);
        assert_eq!(judge(a(1), R::Withdrawn, R::Finished), Next::Follow);
        assert_eq!(judge(a(1), R::AlreadyPending, R::Applied), Next::Follow);
    }

    #[test]
    fn refusals_cancel_with_the_most_telling_reason() {
        use OpResult as R;
        assert_eq!(
            judge(a(1), R::Insufficient, R::NotApplied),
            Next::Cancel(Reason::InsufficientFunds)
        );
        assert_eq!(
            judge(a(1), R::Overdrawn, R::Applied),
            Next::Cancel(Reason::InsufficientFunds)
        );
        assert_eq!(
            judge(a(1), R::Insufficient, R::UnknownAccount),
            Next::Cancel(Reason::UnknownAccount)
        );
        assert_eq!(judge(a(1), R::Applied, R::NotApplied), Next::Retry);
    }
}
