//! What callers hand the engine and what it answers: account ops and their results, the
//! decision of a pair of applies, and the outcome of a transfer-document write.

use tokio::sync::oneshot;

use crate::account_doc::Attempt;
use crate::clock::Instant;
use crate::couch::RawDoc;
use crate::error::Result;
use crate::money::Amount;

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
        /// ([`OpResult::Adopted`]).
        /// `None`: the stepwise protocol.
        attempt: Option<Attempt>,
        /// The transfer's other account (the one-write path).
        peer: Option<String>,
    },
    /// Move the marker from pending to settled (step 6); with `named` (the one-write path) only
    /// the marker of that attempt: a marker of another attempt (a late apply) is not the one
    /// the document counts, and is undone ([`OpResult::Repaired`]), the settle still to come.
    /// `delta` is the document's change to this account, applied again by a stepwise settle
    /// that finds the transfer undone here (`settle_undone` in rules.rs).
    Settle {
        named: Option<Attempt>,
        delta: Amount,
    },
    /// Reverse a pending marker's delta and record the transfer as finished here (cancel).
    /// `decided`: sent to converge the account to its transfer's final document on the
    /// one-write path (`one_write::convergence`): a late apply of the transfer then meets that
    /// document and is undone again, so on a database of one copy the undo of a one-write
    /// marker leaves no settled entry. The stepwise protocol's undos (`false`) always leave one:
    /// its late applies are skipped by it. An op's key holds its transfer's terms
    /// (`transfer::entry_key`): a marker of other terms under the same id is another key's,
    /// never this undo's.
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
    pub(super) fn is_failure(self) -> bool {
        matches!(
            self,
            OpResult::Insufficient
                | OpResult::UnknownAccount
                | OpResult::CurrencyMismatch
                | OpResult::Overflow
                | OpResult::Unreadable
                | OpResult::Withdrawn
                | OpResult::Overdrawn
        )
    }

    /// The write carrying this op changed the account.
    pub(super) fn changes(self) -> bool {
        matches!(
            self,
            OpResult::Applied | OpResult::Withdrawn | OpResult::Repaired
        )
    }
}

/// Given both apply answers of a transfer, the decision to write: its document's id and the
/// document — or `None` (nothing to write now: the caller follows, or applies again).
pub(crate) type Decide = Box<dyn FnOnce(OpResult, OpResult) -> Option<(String, RawDoc)> + Send>;

/// What [`AccountEngine::run_decided`](super::AccountEngine::run_decided) answers: both apply
/// answers, and the write of the decision the engine made of them, if it made one.
pub(crate) struct Decided {
    pub(crate) debit: Result<OpResult>,
    pub(crate) credit: Result<OpResult>,
    pub(crate) write: Option<oneshot::Receiver<Result<TxnWrite>>>,
}

/// A future the decision's write waits for before it is queued: a test's pause at `decide`
/// (`PauseHook`); production passes none and queues at once.
pub(crate) type Hold = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

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
