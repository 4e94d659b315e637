//! The rules of docs/PROTOCOL.md for one op on one account, and which settled entries may be
//! pruned: pure functions on an account document in memory, no I/O.

use std::collections::HashSet;

use super::ops::{AccountOp, OpKind, OpResult};
use crate::account_doc::{marker_bytes, pending_bytes, AccountDoc, Attempt, Marker, Settled};
use crate::error::{Condition, Error, Result};
use crate::limits::{
    CLOCK_SKEW_MAX_MS, ID_CHARS_MAX, MARKERS_BYTES_MAX, MARKERS_UNDO_SLACK_BYTES,
    MARKER_OVERHEAD_BYTES, SETTLED_AGE_MIN_MS, SETTLED_PRUNE_BATCH_MIN,
};
use crate::money::Amount;
use crate::transfer::transfer_of;

/// An account whose markers reached [`MARKERS_BYTES_MAX`] refuses new applies until pruning
/// made room: transient (the transfer is retried, by its worker or the sweeper).
fn account_full(account: &str, bytes: usize) -> Error {
    Error::ledger(
        Condition::AccountFull,
        format!(
            "account {account} holds {bytes} bytes of transfer markers, the most it may \
             ({MARKERS_BYTES_MAX}); retry once its settled transfers are done and pruned"
        ),
    )
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
    let legacy;
    let op = match legacy_entry(doc, &op.txn) {
        Some(bare) => {
            legacy = AccountOp {
                txn: bare,
                ..op.clone()
            };
            &legacy
        }
        None => op,
    };
    match &op.kind {
        OpKind::Resolve => Ok(OpResult::Finished),
        OpKind::Apply {
            delta,
            currency,
            check_funds,
            attempt,
            peer,
            ..
        } => Apply {
            delta: *delta,
            currency,
            check_funds: *check_funds,
            attempt: *attempt,
            peer,
        }
        .evaluate(doc, op, now, failed_links),
        OpKind::Settle { named, delta } => settle(doc, op, now, entries, *named, *delta),
        OpKind::Undo { decided } => undo(doc, op, now, entries, *decided),
    }
}

/// Where `doc` holds no entry of the key `key` but one of its transfer written before entry keys
/// held their terms' digest (the bare id), that id: such an entry stands for its transfer's
/// terms, and an op of the transfer acts on it.
fn legacy_entry(doc: &AccountDoc, key: &str) -> Option<String> {
    let bare = transfer_of(key);
    if bare == key {
        return None;
    }
    let holds =
        |t: &str| doc.pending.iter().any(|m| m.txn == t) || doc.settled.iter().any(|s| s.txn == t);
    (!holds(key) && holds(bare)).then(|| bare.to_owned())
}

/// The terms of an apply ([`OpKind::Apply`]) that decide what it comes to.
struct Apply<'a> {
    delta: Amount,
    currency: &'a str,
    check_funds: bool,
    attempt: Option<Attempt>,
    peer: &'a Option<String>,
}

impl Apply<'_> {
    /// A marker or entry of this transfer's key that is there already (pending or settled)
    /// answers; else the apply lands, unless a linked apply failed or a check refuses it. The
    /// key holds the transfer's terms: the same id sent with other terms is another key, whose
    /// marker lands beside this one and is undone once the document that stands names other
    /// terms (docs/CLUSTER.md).
    fn evaluate(
        &self,
        doc: &mut AccountDoc,
        op: &AccountOp,
        now: i64,
        failed_links: &HashSet<u64>,
    ) -> Result<OpResult> {
        let in_pending = doc.pending.iter().position(|m| m.txn == op.txn);
        if let Some(answer) = self.found(doc, op, in_pending, now)? {
            return Ok(answer);
        }
        if op.link.is_some_and(|l| failed_links.contains(&l)) {
            return Ok(OpResult::NotApplied);
        }
        self.land(doc, op, now)
    }

    /// On one node a debit's own check keeps `available >= min_balance` for good; below it, a
    /// conflict merge added a rival debit.
    fn merged_overdraft(&self, doc: &AccountDoc) -> bool {
        self.check_funds
            && self.delta.minor() < 0
            && doc
                .min_balance
                .is_some_and(|min| doc.available().is_ok_and(|a| a < min))
    }

    /// The answer when the transfer is on the account already, pending (at `in_pending`) or
    /// settled; `None` when it is not there.
    fn found(
        &self,
        doc: &mut AccountDoc,
        op: &AccountOp,
        in_pending: Option<usize>,
        now: i64,
    ) -> Result<Option<OpResult>> {
        let in_settled = doc.settled.iter().any(|s| s.txn == op.txn);
        if let (Some(_), Some(pos)) = (self.attempt, in_pending) {
            // The one-write path: the marker of an attempt of this very transfer (a retry
            // still running, or one that died before deciding) counts as this one's; a
            // stepwise marker means the transfer's document exists and is followed. Never
            // undone here: no marker is undone before its transfer is decided
            // (docs/ONE_WRITE.md).
            let Some(theirs) = doc.pending[pos].attempt else {
                return Ok(Some(OpResult::AlreadyPending));
            };
            if self.merged_overdraft(doc) {
                return Ok(Some(OpResult::Overdrawn));
            }
            return Ok(Some(OpResult::Adopted(theirs)));
        }
        if self.attempt.is_some() && in_settled {
            // Settled or undone here: the transfer was decided; its document says how.
            return Ok(Some(OpResult::Finished));
        }
        if let Some(pos) = in_pending {
            // A one-write attempt's marker of this key, adopted by a stepwise drive: a `done`
            // decision may name it (a 202 whose leaf a resolution keeps), so it is not taken
            // back before the transfer is decided: the drive cancels first, as the one-write
            // path does (simulator, `SIM_HOT=1` seed 0xae: +144, the debit withdrawn under
            // the `done` that named it).
            if doc.pending[pos].attempt.is_some() && self.merged_overdraft(doc) {
                return Ok(Some(OpResult::Overdrawn));
            }
            // This op's issuer holds the transfer's lease and has not committed (it waits
            // for this answer): its debit is the one to take back.
            if self.merged_overdraft(doc) {
                let applied = doc.pending[pos].delta;
                doc.balance = doc.balance.checked_sub(applied)?;
                doc.pending.remove(pos);
                doc.settled.push(Settled::new(&op.txn, now, true));
                tracing::warn!(
                    account = %doc.account_id,
                    txn = %op.txn,
                    "a merged conflict overdrew the account; taking this transfer's debit back"
                );
                return Ok(Some(OpResult::Withdrawn));
            }
            return Ok(Some(OpResult::AlreadyPending));
        }
        if in_settled {
            // Undone while the transfer is being applied: a cancel undid it (the commit
            // CAS of this drive will fail and follow), or an earlier attempt's debit was
            // taken back after a merged overdraft and that worker stopped before writing
            // `canceling`. Either way only a cancel is consistent: a commit now would keep
            // the other account's delta alone (money from nowhere).
            let undone = doc.settled.iter().any(|s| s.txn == op.txn && s.undone);
            return Ok(Some(if undone {
                OpResult::Withdrawn
            } else {
                OpResult::Finished
            }));
        }
        Ok(None)
    }

    /// A new pending marker and the balance moved — unless the currency differs, the markers
    /// are full, funds are short or the balance would overflow.
    fn land(&self, doc: &mut AccountDoc, op: &AccountOp, now: i64) -> Result<OpResult> {
        if doc.currency != self.currency {
            return Ok(OpResult::CurrencyMismatch);
        }
        let marker = Marker {
            txn: op.txn.clone(),
            delta: self.delta,
            at: Some(now),
            attempt: self.attempt,
            // The stepwise protocol's markers keep their documented shape, `{txn, delta, at}`:
            // its apply sends the peer only to be compared with a one-write marker's.
            peer: self.attempt.and(self.peer.clone()),
            aliases: Vec::new(),
        };
        let bytes = doc.markers_bytes();
        if bytes + pending_bytes(&marker) > MARKERS_BYTES_MAX {
            return Err(account_full(&doc.account_id, bytes));
        }
        if self.check_funds && self.delta.minor() < 0 {
            if let Some(min) = doc.min_balance {
                let Ok(after) = doc.available().and_then(|a| a.checked_add(self.delta)) else {
                    return Ok(OpResult::Overflow);
                };
                if after < min {
                    return Ok(OpResult::Insufficient);
                }
            }
        }
        // Past 2^53 − 1 the server could not hold the balance exactly: refused like an
        // overdraft, so the transfer is cancelled instead of failing on every retry.
        let Ok(balance) = doc.balance.checked_add(self.delta) else {
            return Ok(OpResult::Overflow);
        };
        doc.balance = balance;
        doc.pending.push(marker);
        Ok(OpResult::Applied)
    }
}

/// Where `txn` is on the account: the place of its pending marker, and whether it has a settled
/// (or undone) entry.
fn place(doc: &AccountDoc, txn: &str) -> (Option<usize>, bool) {
    let in_pending = doc.pending.iter().position(|m| m.txn == txn);
    let in_settled = doc.settled.iter().any(|s| s.txn == txn);
    (in_pending, in_settled)
}

/// A settle ([`OpKind::Settle`]) of the marker of `delta` (and of the attempt `named`, on the
/// one-write path); any other pending marker of the transfer is undone.
fn settle(
    doc: &mut AccountDoc,
    op: &AccountOp,
    now: i64,
    entries: bool,
    named: Option<Attempt>,
    delta: Amount,
) -> Result<OpResult> {
    let (in_pending, in_settled) = place(doc, &op.txn);
    match in_pending {
        Some(pos) if named.is_some_and(|n| !doc.pending[pos].carries(n)) => {
            // Not the marker the document counts: a late apply of a decided transfer. A
            // marker without attempt under a named decision is a stepwise drive's, which a
            // conflicted document let run beside the decision.
            let marker = doc.pending.remove(pos);
            doc.balance = doc.balance.checked_sub(marker.delta)?;
            if entries {
                // Named with its attempts: a `done` decision's settle took it back, which a
                // merge tells from a cancel's undo (docs/CLUSTER.md).
                doc.settled.push(Settled::undone_of(&marker, now));
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
        None if in_settled => Ok(settle_undone(doc, op, now, named, delta)?),
        None => Ok(OpResult::Absent),
    }
}

/// A stepwise settle (sent only for a committed transfer) that finds the transfer undone here:
/// the undo was a take-back from before the commit (a debit withdrawn from an account a merge
/// left overdrawn, whose cancel never came), and the commit was reached through a branch that
/// did not see it. The commit counts the delta: it is applied again and the entry turned
/// settled, as a merge of settled against undone follows the transfer's state. Otherwise
/// (settled already, or the one-write path, whose decision names its marker): finished.
fn settle_undone(
    doc: &mut AccountDoc,
    op: &AccountOp,
    now: i64,
    named: Option<Attempt>,
    delta: Amount,
) -> Result<OpResult> {
    let undone = named.is_none() && doc.settled.iter().any(|s| s.txn == op.txn && s.undone);
    if !undone {
        return Ok(OpResult::Finished);
    }
    doc.balance = doc.balance.checked_add(delta)?;
    doc.settled.retain(|s| s.txn != op.txn);
    doc.settled.push(Settled::new(&op.txn, now, false));
    tracing::warn!(
        account = %doc.account_id,
        txn = %op.txn,
        "settled a committed transfer this branch had taken back before its commit"
    );
    Ok(OpResult::Applied)
}

/// An undo ([`OpKind::Undo`]): the pending marker's delta reversed, the transfer recorded
/// undone here.
fn undo(
    doc: &mut AccountDoc,
    op: &AccountOp,
    now: i64,
    entries: bool,
    decided: bool,
) -> Result<OpResult> {
    let (in_pending, in_settled) = place(doc, &op.txn);
    match in_pending {
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
    let mut latest = doc.pruned_to;
    doc.settled.retain(|s| {
        let goes = prunable(&s.txn) && s.at <= now.saturating_sub(age_min);
        if goes {
            latest = latest.max(Some(s.at));
        }
        !goes
    });
    doc.pruned_to = latest;
    doc.settled.len() != before
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

#[cfg(test)]
mod tests;
