//! Conflicts on a cluster (docs/CLUSTER.md): how the leaves of a conflicted ledger document
//! become one document again. Pure functions; the engine and the sweeper read and write.
//!
//! - An **account** is merged per transfer: its status on each leaf is one of absent, pending
//!   (with the delta), settled or undone, ordered `absent < pending < settled` and
//!   `pending < undone`. The merge takes, per transfer, the join over every leaf; `settled`
//!   against `undone` (both outcomes acted on, which only a non-exclusive fork of the transfer
//!   can cause) is decided by the transfer's own state. The balance is the winner's plus, per
//!   transfer, the merged contribution minus the winner's, so every marker counts once.
//! - A **transfer** keeps the leaf furthest along its state graph; two leaves on different paths
//!   (`committed`/`done` against `canceling`/`cancelled`) are decided by what the accounts show.
//! - A **write-once** document never merges: two different bodies under one id are a violation
//!   for a person to decide.

use std::collections::{BTreeMap, HashMap};

use crate::account_doc::{AccountDoc, Attempt, Marker, Settled};
use crate::limits::SETTLED_AGE_MIN_MS;
use crate::money::Amount;
use crate::state::State;

/// A transfer's status on one account leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Absent,
    /// The delta, when it was applied, and the attempt that applied it (the one-write path).
    Pending(Amount, Option<i64>, Option<Attempt>),
    Settled(i64),
    Undone(i64),
}

impl Status {
    fn of(doc: &AccountDoc, txn: &str) -> Status {
        if let Some(m) = doc.pending.iter().find(|m| m.txn == txn) {
            return Status::Pending(m.delta, m.at, m.attempt);
        }
        match doc.settled.iter().find(|s| s.txn == txn) {
            Some(s) if s.undone => Status::Undone(s.at),
            Some(s) => Status::Settled(s.at),
            None => Status::Absent,
        }
    }
}

/// What the merge needs to know of a transfer, from its (resolved) document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnFacts {
    pub(crate) state: State,
    /// The transfer's delta on the account being merged (−value on its source, +value on its
    /// destination).
    pub(crate) delta: Amount,
    /// The attempt a one-write decision names for the account being merged.
    pub(crate) named: Option<Attempt>,
}

/// Why an account cannot be merged yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub(crate) txn: String,
    pub(crate) why: String,
}

/// Every transfer named on any leaf, in a stable order (the winner's first).
fn transfers(winner: &AccountDoc, losers: &[AccountDoc]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    std::iter::once(winner)
        .chain(losers.iter())
        .flat_map(|d| {
            d.pending
                .iter()
                .map(|m| m.txn.clone())
                .chain(d.settled.iter().map(|s| s.txn.clone()))
                .collect::<Vec<_>>()
        })
        .filter(|t| seen.insert(t.clone()))
        .collect()
}

/// The transfers whose documents the merge of these leaves must read: those the leaves disagree
/// on where a settled or undone entry is involved (its delta, or which outcome holds), and
/// those a losing leaf holds pending where the winner has nothing (whether that marker still
/// counts: [`merge_account`]).
pub(crate) fn facts_needed(winner: &AccountDoc, losers: &[AccountDoc]) -> Vec<String> {
    transfers(winner, losers)
        .into_iter()
        .filter(|t| {
            let all: Vec<Status> = std::iter::once(winner)
                .chain(losers.iter())
                .map(|d| Status::of(d, t))
                .collect();
            let agree = all.windows(2).all(|w| same_kind(w[0], w[1]));
            let attempts: std::collections::HashSet<Option<Attempt>> = all
                .iter()
                .filter_map(|s| match s {
                    Status::Pending(_, _, a) => Some(*a),
                    _ => None,
                })
                .collect();
            let deltas: std::collections::HashSet<Amount> = all
                .iter()
                .filter_map(|s| match s {
                    Status::Pending(d, ..) => Some(*d),
                    _ => None,
                })
                .collect();
            let stale_pending = all[0] == Status::Absent
                && all[1..].iter().any(|s| matches!(s, Status::Pending(..)));
            (!agree
                && all
                    .iter()
                    .any(|s| matches!(s, Status::Settled(_) | Status::Undone(_))))
                || attempts.len() > 1
                || deltas.len() > 1
                || stale_pending
        })
        .collect()
}

fn same_kind(a: Status, b: Status) -> bool {
    match (a, b) {
        (Status::Pending(x, ..), Status::Pending(y, ..)) => x == y,
        _ => std::mem::discriminant(&a) == std::mem::discriminant(&b),
    }
}

/// The merged account: the winner's document (and `_rev`, so the write is a CAS on it) with,
/// per transfer, the join of every leaf's status, and the balance moved by the difference.
/// `now` dates nothing; it only tells an old settled entry (which the winner may have pruned)
/// from a young one.
pub(crate) fn merge_account(
    winner: &AccountDoc,
    losers: &[AccountDoc],
    facts: &HashMap<String, TxnFacts>,
    now: i64,
) -> Result<AccountDoc, Blocked> {
    let mut merged = winner.clone();
    let mut pending: Vec<Marker> = Vec::new();
    let mut settled: BTreeMap<usize, Settled> = BTreeMap::new();
    let mut balance = winner.balance;
    for (order, t) in transfers(winner, losers).into_iter().enumerate() {
        let leaves = OnLeaves {
            txn: &t,
            winner,
            losers,
            fact: facts.get(&t),
        };
        let mine = Status::of(winner, &t);
        let theirs: Vec<Status> = losers.iter().map(|d| Status::of(d, &t)).collect();
        let joined = leaves.join(mine, &theirs)?;
        if leaves.counts_nothing(mine, joined, now) {
            continue;
        }
        balance = leaves.rebalance(balance, mine, joined, &theirs)?;
        match joined {
            Status::Absent => {}
            Status::Pending(delta, at, attempt) => pending.push(leaves.marker(delta, at, attempt)),
            Status::Settled(at) => {
                settled.insert(order, Settled::at(t.clone(), at, false, Vec::new()));
            }
            Status::Undone(at) => {
                let of = leaves.undone_attempts().unwrap_or_default();
                settled.insert(order, Settled::at(t.clone(), at, true, of));
            }
        }
    }
    merged.balance = balance;
    merged.pending = pending;
    merged.settled = settled.into_values().collect();
    Ok(merged)
}

/// One transfer of a merge, over every leaf of the account.
struct OnLeaves<'a> {
    txn: &'a str,
    winner: &'a AccountDoc,
    losers: &'a [AccountDoc],
    /// Its document, where the merge read it.
    fact: Option<&'a TxnFacts>,
}

impl OnLeaves<'_> {
    fn blocked(&self, why: String) -> Blocked {
        Blocked {
            txn: self.txn.to_owned(),
            why,
        }
    }

    /// Whether some leaf's pending marker of the transfer is the one of attempt `n`.
    fn carried(&self, n: Attempt) -> bool {
        std::iter::once(self.winner)
            .chain(self.losers.iter())
            .flat_map(|d| d.pending.iter())
            .any(|m| m.txn == self.txn && m.carries(n))
    }

    /// Every leaf of the account.
    fn leaves(&self) -> impl Iterator<Item = &AccountDoc> {
        std::iter::once(self.winner).chain(self.losers.iter())
    }

    /// The attempts whose marker the transfer's undone entries on these leaves took back, where
    /// each is a `done` decision's settle of a marker it does not name; `None` when one of them
    /// names none (a cancel's undo, a stepwise marker's, an entry of an earlier version): that
    /// entry ends the transfer on the account whatever the attempt, and is what the resolution
    /// of a forked transfer document reads as the cancel path's evidence.
    fn undone_attempts(&self) -> Option<Vec<Attempt>> {
        let mut all = Vec::new();
        for s in self.leaves().flat_map(|d| d.settled.iter()) {
            if s.txn != self.txn || !s.undone {
                continue;
            }
            if s.attempts.is_empty() {
                return None;
            }
            all.extend_from_slice(&s.attempts);
        }
        all.sort_unstable();
        all.dedup();
        Some(all)
    }

    /// Whether some leaf's pending marker of the transfer carries an attempt that no undone
    /// entry of it took back.
    fn pending_beside_undo(&self) -> bool {
        let Some(undone) = self.undone_attempts() else {
            return false;
        };
        self.leaves()
            .flat_map(|d| d.pending.iter())
            .filter(|m| m.txn == self.txn)
            .any(|m| m.attempts().iter().any(|a| !undone.contains(a)))
    }

    /// Whether a pending marker of the transfer outlives an undone entry of it on another leaf
    /// (else the undo ends it).
    fn pending_outlives_undo(&self, pending: Status) -> bool {
        let Status::Pending(delta, _, attempt) = pending else {
            return false;
        };
        let Some(f) = self.fact else {
            return false;
        };
        // A one-write `done` names the marker it counts: an undone entry beside it is another
        // attempt's, never the named marker's end — which is settling, not undoing.
        let named_held = f.state == State::Done && f.named.is_some_and(|n| self.carried(n));
        // A stepwise transfer that went on to its commit: an undone entry of it is a take-back
        // from before the commit (a debit withdrawn from an account a merge left overdrawn,
        // whose cancel never came) on a branch its later apply did not see; the commit counts
        // the marker.
        let committed_after_take_back = f.named.is_none()
            && f.delta == delta
            && matches!(f.state, State::Committed | State::Done);
        // A one-write marker undone on one leaf and pending on another, while the transfer's
        // document as read is undecided: the undo came from a decision this read does not see
        // (a leaf of a conflicted document on a copy not read, whose settle undid the marker
        // as "not named"). Whether that decision stands is for the resolution of the document
        // to say: the marker stays pending and is converged then (settled if the kept decision
        // names it, else undone again).
        let one_write = attempt.is_some();
        let undecided = one_write && matches!(f.state, State::Initial | State::Pending);
        // A one-write `done` whose leaf read here may not be the one that stays, and undone
        // entries that are all the settles of `done` decisions of other attempts' markers than
        // one still pending on another leaf (a rival `done` leaf naming another attempt, settled
        // on a branch that lacked this marker): those undos say nothing of this marker, which
        // the decision that stands may name. A cancel's undo names no attempt, so it never
        // lets a marker through (a `cancelled` leaf beside the `done` one read here may be the
        // one kept, and its undo is the evidence the resolution reads). It stays pending and is converged by that decision (settled if named, else
        // undone). Before, the undo won and the transfer's credit was gone where the other leaf
        // stayed (0x4a1 of the trio shape, docs/CLUSTER.md).
        let other_attempts_undone =
            one_write && f.state == State::Done && self.pending_beside_undo();
        named_held || committed_after_take_back || undecided || other_attempts_undone
    }

    /// The join of the winner's status (`mine`) and the losers' (`theirs`).
    fn join(&self, mine: Status, theirs: &[Status]) -> Result<Status, Blocked> {
        let fact = self.fact;
        let mut joined = mine;
        for s in theirs.iter().copied() {
            joined = match (joined, s) {
                (Status::Absent, x) | (x, Status::Absent) => x,
                (Status::Pending(a, at, x), Status::Pending(b, bt, y)) => {
                    if a != b {
                        return Err(self.blocked(format!(
                            "two leaves hold different deltas ({} and {}) for one transfer",
                            a.minor(),
                            b.minor()
                        )));
                    }
                    // Two attempts of one transfer, each on its own branch (one-write path,
                    // docs/ONE_WRITE.md): one marker, the delta counted once, carrying both
                    // attempts (written below), so whichever a decision names is this one.
                    Status::Pending(a, at.or(bt), x.min(y).or(x).or(y))
                }
                (p @ Status::Pending(..), u @ Status::Undone(_))
                | (u @ Status::Undone(_), p @ Status::Pending(..)) => {
                    if self.pending_outlives_undo(p) {
                        p
                    } else {
                        u
                    }
                }
                (Status::Pending(..), x @ Status::Settled(_))
                | (x @ Status::Settled(_), Status::Pending(..)) => x,
                (Status::Settled(a), Status::Settled(b)) => Status::Settled(a.min(b)),
                (Status::Undone(a), Status::Undone(b)) => Status::Undone(a.min(b)),
                (Status::Settled(a), Status::Undone(b))
                | (Status::Undone(b), Status::Settled(a)) => match fact.map(|f| f.state) {
                    Some(State::Committed | State::Done) => Status::Settled(a),
                    Some(State::Canceling | State::Cancelled) => Status::Undone(b),
                    other => {
                        return Err(self.blocked(format!(
                            "one leaf settled it and another undid it, and the \
                             transfer reads {other:?}"
                        )))
                    }
                },
            };
        }
        Ok(joined)
    }

    /// Whether the joined status is left out of the merge: what the winner lacks and whose
    /// contribution is in its balance already, or never was.
    fn counts_nothing(&self, mine: Status, joined: Status, now: i64) -> bool {
        if mine != Status::Absent {
            return false;
        }
        let age_min = i64::try_from(SETTLED_AGE_MIN_MS).expect("fits");
        // A marker the winner lacks, of a transfer that ended without counting it (cancelled;
        // a one-write `done` naming another attempt; a stepwise `done`, written only after its
        // markers were settled, so a pending one is a late repeat or a stale copy of one
        // settled elsewhere), is joined as pending: the decision's convergence then undoes it
        // (the orphan repair), the way it converges any marker of that decision. Its delta
        // counts meanwhile as any pending marker does (a debit held, a credit not available).
        // Left out here on the strength of the document read, it was gone for good where a
        // rival decision the read did not show was the one kept: two attempts of one id decided
        // `cancelled` and `done`, each created with a 202, the `done` attempt's debit left out
        // against `cancelled` (`SIM_TRIO=1` 0x69: +28 on h0; a read of every copy cannot see a
        // create that lands after it on a copy that lacked the document). Where the winner had
        // it and took it back (settled or undone, then pruned), the convergence takes it back
        // again; that a `done` never names a marker the winner pruned is the prune rule's to
        // ensure (docs/CLUSTER.md).
        // A settled entry the winner lacks may be one it pruned (only old entries of finished
        // transfers are pruned, and the winner records how far it pruned): then its delta is in
        // the winner's balance already. An entry younger than anything the winner pruned was
        // never on the winner's branch: it counts.
        if let Status::Settled(at) | Status::Undone(at) = joined {
            let pruned = at <= now.saturating_sub(age_min)
                && self.winner.pruned_to.is_some_and(|p| at <= p)
                && self.fact.is_some_and(|f| f.state.is_terminal());
            if pruned {
                tracing::info!(
                    account = %self.winner.account_id,
                    txn = %self.txn,
                    joined = ?joined,
                    age_ms = now.saturating_sub(at),
                    "a merge took an entry the winner lacks as pruned there"
                );
                return true;
            }
        }
        false
    }

    /// `balance` moved by the change from the winner's status to the joined one.
    fn rebalance(
        &self,
        balance: Amount,
        mine: Status,
        joined: Status,
        theirs: &[Status],
    ) -> Result<Amount, Blocked> {
        // Only a change of status can change the balance (and need the delta).
        let (before, after) = if same_kind(mine, joined) {
            (Amount::ZERO, Amount::ZERO)
        } else {
            (
                self.contribution(mine, mine, theirs)?,
                self.contribution(joined, mine, theirs)?,
            )
        };
        if before == after {
            return Ok(balance);
        }
        tracing::debug!(
            account = %self.winner.account_id,
            txn = %self.txn,
            winner = ?mine,
            merged = ?joined,
            change = after.minor() - before.minor(),
            "a merge moved the balance"
        );
        after
            .checked_sub(before)
            .and_then(|d| balance.checked_add(d))
            .map_err(|e| self.blocked(format!("the merged balance is out of range: {e}")))
    }

    /// What status `s` adds to the balance. A settled entry's delta: its document's (a leaf's
    /// pending marker of the same id may hold other terms), else any leaf's marker.
    fn contribution(&self, s: Status, mine: Status, theirs: &[Status]) -> Result<Amount, Blocked> {
        match s {
            Status::Absent | Status::Undone(_) => Ok(Amount::ZERO),
            Status::Pending(d, ..) => Ok(d),
            Status::Settled(_) => self
                .fact
                .map(|f| f.delta)
                .or_else(|| {
                    theirs
                        .iter()
                        .chain(std::iter::once(&mine))
                        .find_map(|x| match x {
                            Status::Pending(d, ..) => Some(*d),
                            _ => None,
                        })
                })
                .ok_or_else(|| {
                    self.blocked("its delta is on no leaf and its document was not read".into())
                }),
        }
    }

    /// The joined pending marker: every leaf's marker of it as one, carrying all their attempts,
    /// the one a decision names first; the peer from any of them.
    fn marker(&self, delta: Amount, at: Option<i64>, attempt: Option<Attempt>) -> Marker {
        let markers: Vec<&Marker> = std::iter::once(self.winner)
            .chain(self.losers.iter())
            .flat_map(|d| d.pending.iter())
            .filter(|m| m.txn == self.txn && m.delta == delta)
            .collect();
        let mut all: Vec<Attempt> = markers.iter().flat_map(|m| m.attempts()).collect();
        all.sort_unstable();
        all.dedup();
        let named = self.fact.and_then(|f| f.named).filter(|n| all.contains(n));
        let primary = named.or(attempt);
        all.retain(|a| Some(*a) != primary);
        let peer = markers.iter().find_map(|m| m.peer.clone());
        Marker {
            txn: self.txn.to_owned(),
            delta,
            at,
            attempt: primary,
            peer,
            aliases: all,
        }
    }
}

/// Which path of the graph a state is on, and how far along it.
fn rank(state: State) -> (Option<bool>, u8) {
    match state {
        State::Initial => (None, 0),
        State::Pending => (None, 1),
        State::Committed => (Some(true), 2),
        State::Done => (Some(true), 3),
        State::Canceling => (Some(false), 2),
        // `initial → cancelled` is the cancel path too.
        State::Cancelled => (Some(false), 3),
    }
}

/// What the accounts of a transfer show of it, over every leaf of both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Evidence {
    /// Some account leaf holds it settled (the commit path acted).
    pub(crate) settled: bool,
    /// Some account leaf holds it undone (the cancel path acted).
    pub(crate) undone: bool,
    /// Every leaf on the commit path is a one-write `done` (it names its markers). Such a
    /// decision beside another leaf was never told nor settled: telling and settling it wait
    /// until it stands alone on every copy (`Ledger::confirm_decision`), and one created with
    /// a 201 has no rival. A `committed` leaf may have been told (the background finish
    /// answers `committed`).
    pub(crate) commit_untold: bool,
}

impl Evidence {
    pub(crate) fn add(&mut self, doc: &AccountDoc, txn: &str) {
        match Status::of(doc, txn) {
            Status::Settled(_) => self.settled = true,
            Status::Undone(_) => self.undone = true,
            _ => {}
        }
    }
}

/// Of a transfer's leaf states, the index of the one to keep: the furthest along the graph;
/// between the commit and the cancel path, the one the accounts acted on — the commit path
/// when they show a settle, or nothing while a commit may have been reported to a caller; the
/// cancel path when they show only undos, or nothing beside a commit path of one-write `done`
/// leaves only ([`Evidence::commit_untold`]): the cancel path's undos may be on their way (a
/// stepwise drive undoes right after its `canceling` write), and kept over them that `done`
/// would end counted on neither account, as nothing settles a one-write marker undone.
/// `None` when the accounts show both (a person must decide).
///
/// `leaves` are each leaf's state and revision. Between leaves equally far along, the one kept
/// is CouchDB's winner among them (the longer revision path, then the greater revision id),
/// whatever order they were read in: resolvers that read different copies (one holding a leaf
/// extended, another the leaf before it and a third leaf) each keep the greatest leaf they see,
/// so none deletes the greatest of all, and the document keeps a live leaf. Kept by read order
/// instead, two resolvers each deleted the leaf the other kept and the transfer ended deleted
/// with its accounts' markers held (simulator, a loaded cluster's 202s).
pub(crate) fn choose_transfer_leaf(leaves: &[(State, &str)], evidence: Evidence) -> Option<usize> {
    let states: Vec<State> = leaves.iter().map(|(s, _)| *s).collect();
    let paths: Vec<bool> = states.iter().filter_map(|s| rank(*s).0).collect();
    let forked = paths.iter().any(|p| *p) && paths.iter().any(|p| !*p);
    let keep_commit = if forked {
        match (evidence.settled, evidence.undone) {
            (true, true) => return None,
            (false, true) => false,
            (false, false) => !evidence.commit_untold,
            (true, false) => true,
        }
    } else {
        true
    };
    leaves
        .iter()
        .enumerate()
        .filter(|(_, (s, _))| !forked || rank(*s).0 == Some(keep_commit))
        .max_by_key(|(_, (s, rev))| (rank(*s).1, revision_order(rev)))
        .map(|(i, _)| i)
}

/// A revision id in CouchDB's order of winners: its position, then its hash.
fn revision_order(rev: &str) -> (u64, &str) {
    match rev.split_once('-') {
        Some((pos, hash)) => (pos.parse().unwrap_or(0), hash),
        None => (0, rev),
    }
}

/// Between `done` leaves of one terms that name different attempts (one id decided by two
/// workers at once, each decision a 202, so both stored): the index of the leaf whose named
/// markers the accounts still hold pending on more of the two accounts, so that the settles of
/// the decision kept settle those markers instead of undoing them as "not named" (the other
/// leaf's settles may have undone the other attempt's markers already: keeping that leaf would
/// leave the transfer counted nowhere). An account where the transfer is settled already
/// counts it whichever leaf is kept. `keep` on a tie, and when it is not such a leaf.
/// `named[i]` is leaf i's `(source, destination)` attempts where it is a one-write `done`;
/// `pending` is every pending marker of the transfer on any leaf of its source and of its
/// destination, `settled` whether any leaf of each holds it settled.
pub(crate) fn prefer_held_markers(
    named: &[Option<(Attempt, Attempt)>],
    keep: usize,
    pending: [&[Marker]; 2],
    settled: [bool; 2],
) -> usize {
    let held = |a: Attempt, side: usize| {
        usize::from(settled[side] || pending[side].iter().any(|m| m.carries(a)))
    };
    let score = |i: usize| named[i].map(|(s, d)| held(s, 0) + held(d, 1));
    let Some(kept) = score(keep) else {
        return keep;
    };
    (0..named.len())
        .filter_map(|i| score(i).map(|n| (n, i)))
        .filter(|(n, _)| *n > kept)
        .max_by_key(|(n, i)| (*n, std::cmp::Reverse(*i)))
        .map_or(keep, |(_, i)| i)
}

/// Whether some leaf holds a pending marker carrying `attempt` (transfer `txn`), or a settle
/// of the transfer.
fn attempt_held(leaves: &[AccountDoc], txn: &str, attempt: Attempt) -> bool {
    leaves.iter().any(|leaf| {
        leaf.pending
            .iter()
            .any(|m| m.txn == txn && m.carries(attempt))
            || leaf.settled.iter().any(|s| s.txn == txn && !s.undone)
    })
}

/// Whether an account's leaves show the one-write marker of `attempt` (transfer `txn`) taken
/// back: the transfer recorded undone there by an undo that ended every attempt's marker (a
/// cancel's, the convergence to a `cancelled` document) or named this one, and no leaf holding
/// a pending marker carrying the attempt or a settle of the transfer. With another terms'
/// `cancelled` leaf under the same id, that undo came from a convergence to it that read no
/// conflict yet (one copy): keeping the `done` leaf would leave it counted on neither account.
pub(crate) fn marker_taken_back(leaves: &[AccountDoc], txn: &str, attempt: Attempt) -> bool {
    let held = attempt_held(leaves, txn, attempt);
    let undone = leaves.iter().any(|leaf| {
        leaf.settled.iter().any(|s| {
            s.txn == txn && s.undone && (s.attempts.is_empty() || s.attempts.contains(&attempt))
        })
    });
    undone && !held
}

#[cfg(test)]
mod tests;
