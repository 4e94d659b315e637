//! The account document, `account:{id}` (docs/DOCUMENTS.md): its shape, the balances derived
//! from its markers, and the bounds on them. Below the engine, which is the only writer of an
//! account's balance and markers (by `_rev` compare-and-swap).
//!
//! An account carries, besides its balance, the markers of the transfers that touched it:
//! `pending` (applied to `balance`, not yet settled) and `settled` (recently settled or undone,
//! kept until their transfer reads `done` or `cancelled` and they are old enough,
//! `crate::limits::SETTLED_AGE_MIN_MS`). Those markers are what make every account step of a
//! transfer idempotent. Their size is bounded (`crate::limits::MARKERS_BYTES_MAX`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::meta::Metadata;
use crate::money::Amount;

/// A transfer applied to an account's balance and not yet settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingEntry {
    /// Transfer id.
    pub txn: String,
    /// The signed change it made to `balance`.
    pub delta: Amount,
}

/// An account as [`Ledger::account`](crate::Ledger::account) reads it, with the balances of
/// docs/PROTOCOL.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccountView {
    /// Account id.
    pub account: String,
    /// ISO-4217 code.
    pub currency: String,
    /// Opening balance.
    pub opening: Amount,
    /// What the document stores: every applied delta, settled or not.
    pub balance: Amount,
    /// `balance − Σ positive pending deltas`: a credit that might still be rolled back is not
    /// spendable.
    pub available: Amount,
    /// `balance − Σ all pending deltas`: only settled transfers.
    pub posted: Amount,
    /// `None` = unlimited.
    pub min_balance: Option<Amount>,
    /// Transfers applied and not yet settled.
    pub pending: Vec<PendingEntry>,
    /// What its creator attached ([`AccountSpec::meta`](crate::AccountSpec::meta)).
    pub meta: Metadata,
}

// ---- the document ---------------------------------------------------------------------------

/// `account:{id}` as stored. Unknown fields are kept (`extra`) so a CAS write never drops what
/// another version of the program added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct AccountDoc {
    #[serde(rename = "_id")]
    pub(crate) id: String,
    #[serde(rename = "_rev", default, skip_serializing_if = "Option::is_none")]
    pub(crate) rev: Option<String>,
    #[serde(rename = "type")]
    pub(crate) doc_type: String,
    pub(crate) account_id: String,
    pub(crate) currency: String,
    pub(crate) opening: Amount,
    pub(crate) balance: Amount,
    #[serde(default)]
    pub(crate) min_balance: Option<Amount>,
    #[serde(default)]
    pub(crate) pending: Vec<Marker>,
    #[serde(default, with = "settled_groups")]
    pub(crate) settled: Vec<Settled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) created_at: Option<i64>,
    /// Losing leaves of a conflict whose content this branch already joined (docs/CLUSTER.md):
    /// their revisions, kept while they are still leaves (a member may not delete them; an
    /// admin's sweeper does). A merge never joins them again: this branch may have settled and
    /// pruned since what they still hold pending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) merged: Vec<String>,
    /// The latest `at` of any settled entry this branch ever pruned: a merge takes an entry the
    /// winner lacks as pruned there only when it is no younger than this (docs/CLUSTER.md). A
    /// branch that never pruned (accounts at the server's default quorum, where nothing is
    /// pruned) lacks an entry only because it never had it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pruned_to: Option<i64>,
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

/// One entry of `pending`. `at` (when it was applied, wall ms) is our addition to the documented
/// `{txn, delta}`: the `transactions/account_pending` view orders markers by it so the sweeper finds old
/// (possibly orphaned) ones without reading young, in-flight ones.
///
/// A marker applied on the one-write path (docs/ONE_WRITE.md) also carries the `attempt` that
/// applied it, which the transfer's decision names, and `peer`, the transfer's other account
/// (with the delta and the account's currency: the transfer's terms, for the sweeper's
/// `abandoned` decision). Markers of the stepwise protocol have neither.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Marker {
    pub(crate) txn: String,
    pub(crate) delta: Amount,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) attempt: Option<Attempt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) peer: Option<String>,
    /// The other attempts this marker stands for: on a cluster two attempts of one transfer can
    /// each add a marker on its own branch of an account; the merge keeps one marker (the delta
    /// counted once) carrying every attempt, so whichever the decision names is this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) aliases: Vec<Attempt>,
}

impl Marker {
    /// Whether this marker is the one of attempt `a` (its own, or one merged into it).
    pub(crate) fn carries(&self, a: Attempt) -> bool {
        self.attempt == Some(a) || self.aliases.contains(&a)
    }

    /// Every attempt this marker stands for, sorted; none for a stepwise marker.
    pub(crate) fn attempts(&self) -> Vec<Attempt> {
        let mut all: Vec<Attempt> = self
            .attempt
            .into_iter()
            .chain(self.aliases.iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// One worker's try at applying a transfer on the one-write path: 48 random bits, stored as 12
/// lower-case hex digits. A transfer's decision names the attempt of the marker it counts on
/// each account; a marker of any other attempt (a late retry after the entry was pruned) is
/// undone, never counted (docs/ONE_WRITE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Attempt(u64);

impl Attempt {
    /// The largest token: 48 bits.
    const MAX: u64 = (1 << 48) - 1;

    /// A new random attempt.
    pub(crate) fn random() -> Attempt {
        Attempt(crate::clock::random_u64() & Attempt::MAX)
    }

    #[cfg(test)]
    pub(crate) fn from_bits(bits: u64) -> Attempt {
        Attempt(bits & Attempt::MAX)
    }
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:012x}", self.0)
    }
}

impl std::str::FromStr for Attempt {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Attempt, String> {
        let ok = s.len() == 12 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !ok {
            return Err(format!(
                "{s:?} is not an attempt (12 lower-case hex digits)"
            ));
        }
        u64::from_str_radix(s, 16)
            .map(Attempt)
            .map_err(|e| e.to_string())
    }
}

impl Serialize for Attempt {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Attempt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Attempt, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One entry of `settled`: the transfer is finished on this account, either settled (its delta
/// stays) or undone (its delta was reversed). Either way a later apply, settle or undo of it on
/// this account is skipped. Stored grouped by `at` ([`settled_groups`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) txn: String,
    /// When it was settled or undone, rounded up to [`SETTLED_AT_STEP_MS`](crate::limits::SETTLED_AT_STEP_MS)
    /// ([`settled_at`]): never earlier than the truth, so pruning by age stays on the safe side,
    /// and the entries of a few seconds share one group.
    pub(crate) at: i64,
    pub(crate) undone: bool,
    /// Of an entry undone by the settle of a `done` decision that does not name the one-write
    /// marker it met, that marker's attempts (its own and those merged into it): a merge then
    /// knows the undo says nothing of another attempt's marker on another branch, which the
    /// decision that stays may name (docs/CLUSTER.md). Empty for every other undone entry (a
    /// cancel's undo, a stepwise marker's, an entry of an earlier version): such an entry ends
    /// the transfer on the account whatever the attempt.
    pub(crate) attempts: Vec<Attempt>,
}

impl Settled {
    /// An entry recorded at `now` (wall ms).
    pub(crate) fn new(txn: &str, now: i64, undone: bool) -> Settled {
        Settled {
            txn: txn.to_owned(),
            at: settled_at(now),
            undone,
            attempts: Vec::new(),
        }
    }

    /// An entry as stored: `at` already a step (a read, or a test's).
    pub(crate) fn at(txn: String, at: i64, undone: bool, attempts: Vec<Attempt>) -> Settled {
        Settled {
            txn,
            at,
            undone,
            attempts,
        }
    }

    /// The undone entry of `marker`, taken back at `now` by a `done` decision's settle that
    /// does not name it.
    pub(crate) fn undone_of(marker: &Marker, now: i64) -> Settled {
        Settled {
            attempts: marker.attempts(),
            ..Settled::new(&marker.txn, now, true)
        }
    }
}

/// `now` rounded up to the next multiple of
/// [`SETTLED_AT_STEP_MS`](crate::limits::SETTLED_AT_STEP_MS).
pub(crate) fn settled_at(now: i64) -> i64 {
    let step = crate::limits::SETTLED_AT_STEP_MS;
    match now.checked_rem(step) {
        Some(0) | None => now,
        Some(r) if r > 0 => now.saturating_add(step - r),
        Some(r) => now.saturating_sub(r),
    }
}

/// How `settled` is stored (docs/DOCUMENTS.md): a list of groups, one per run of entries with the
/// same `at`, `{"at": ms, "txns": [settled ids], "undone": [undone ids]}` (an empty list is left
/// out) — 3 bytes an entry besides its id where an object per entry took ~45, and each byte of
/// an account is rewritten by every write of it (docs/bench/HISTORY.md). Reading also takes
/// the entries of earlier versions, one object each, `{"txn": id, "at": ms, "undone": true}`,
/// in any mix; the next write stores them grouped. An earlier version cannot read a grouped
/// entry: it refuses the account as malformed rather than skip its entries.
pub(crate) mod settled_groups {
    use serde::de::Error as _;
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use std::collections::BTreeMap;

    use super::{Attempt, Settled};

    #[derive(Serialize)]
    struct GroupOut<'a> {
        at: i64,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        txns: Vec<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        undone: Vec<&'a str>,
        /// Of the undone transfers whose one-write marker was taken back, its attempts.
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        undone_attempts: BTreeMap<&'a str, &'a [Attempt]>,
    }

    pub(crate) fn serialize<S: Serializer>(settled: &[Settled], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        let mut rest = settled;
        while let Some(first) = rest.first() {
            let run = rest.iter().take_while(|e| e.at == first.at).count();
            let (group, tail) = rest.split_at(run);
            let ids = |undone: bool| {
                group
                    .iter()
                    .filter(|e| e.undone == undone)
                    .map(|e| e.txn.as_str())
                    .collect()
            };
            let undone_attempts = group
                .iter()
                .filter(|e| e.undone && !e.attempts.is_empty())
                .map(|e| (e.txn.as_str(), e.attempts.as_slice()))
                .collect();
            seq.serialize_element(&GroupOut {
                at: first.at,
                txns: ids(false),
                undone: ids(true),
                undone_attempts,
            })?;
            rest = tail;
        }
        seq.end()
    }

    /// `undone` is a flag in an entry of earlier versions, a list of ids in a group.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Undone {
        Flag(bool),
        Ids(Vec<String>),
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct EntryIn {
        at: i64,
        #[serde(default)]
        txn: Option<String>,
        #[serde(default)]
        txns: Option<Vec<String>>,
        #[serde(default)]
        undone: Option<Undone>,
        #[serde(default)]
        undone_attempts: BTreeMap<String, Vec<Attempt>>,
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Settled>, D::Error> {
        let mut settled = Vec::new();
        for entry in Vec::<EntryIn>::deserialize(d)? {
            let at = entry.at;
            let mut attempts = entry.undone_attempts;
            match (entry.txn, entry.txns, entry.undone) {
                (Some(txn), None, undone @ (None | Some(Undone::Flag(_))))
                    if attempts.is_empty() =>
                {
                    let undone = matches!(undone, Some(Undone::Flag(true)));
                    settled.push(Settled::at(txn, at, undone, Vec::new()));
                }
                (None, txns, undone @ (None | Some(Undone::Ids(_)))) => {
                    for txn in txns.unwrap_or_default() {
                        settled.push(Settled::at(txn, at, false, Vec::new()));
                    }
                    if let Some(Undone::Ids(ids)) = undone {
                        for txn in ids {
                            let of = attempts.remove(&txn).unwrap_or_default();
                            settled.push(Settled::at(txn, at, true, of));
                        }
                    }
                    if let Some(txn) = attempts.keys().next() {
                        return Err(D::Error::custom(format!(
                            "a settled group names the attempts of {txn:?}, which it does not \
                             list undone"
                        )));
                    }
                }
                _ => {
                    return Err(D::Error::custom(
                        "a settled entry is either {txn, at, undone: bool} or {at, txns: [..], \
                         undone: [..]}",
                    ))
                }
            }
        }
        Ok(settled)
    }
}

/// Serialized bytes of one `pending` or `settled` entry of transfer `txn`, at most (JSON escapes
/// `"` and `\\` with one more byte each; ids hold no control character).
pub(crate) fn marker_bytes(txn: &str) -> usize {
    let escapes = txn.bytes().filter(|b| matches!(b, b'"' | b'\\')).count();
    txn.len() + escapes + crate::limits::MARKER_OVERHEAD_BYTES
}

/// Serialized bytes of one pending marker, at most: [`marker_bytes`] for `{txn, delta, at}`, and
/// what its `attempt` (`,"attempt":"` + 12 digits + `"`) and `peer` (an account id, escaped like
/// a transfer id) add.
pub(crate) fn pending_bytes(m: &Marker) -> usize {
    let attempt = if m.attempt.is_some() { 25 } else { 0 } + 15 * m.aliases.len();
    let peer = m.peer.as_deref().map_or(0, |p| {
        let escapes = p.bytes().filter(|b| matches!(b, b'"' | b'\\')).count();
        p.len() + escapes + 10
    });
    marker_bytes(&m.txn) + attempt + peer
}

/// Serialized bytes of one settled entry, at most: [`marker_bytes`], and for the attempts of an
/// undone one-write marker, its id again as the key of `undone_attempts` (with the field's name,
/// should the entry be a group of its own) and each attempt (`"` + 12 digits + `",`).
pub(crate) fn settled_bytes(s: &Settled) -> usize {
    if s.attempts.is_empty() {
        return marker_bytes(&s.txn);
    }
    2 * marker_bytes(&s.txn) + 15 * s.attempts.len()
}

impl AccountDoc {
    /// Serialized bytes of all markers, at most: what
    /// [`MARKERS_BYTES_MAX`](crate::limits::MARKERS_BYTES_MAX) bounds.
    pub(crate) fn markers_bytes(&self) -> usize {
        let pending: usize = self.pending.iter().map(pending_bytes).sum();
        let settled: usize = self.settled.iter().map(settled_bytes).sum();
        pending + settled
    }

    /// Parses a document read from the server and asserts what must hold after a read.
    pub(crate) fn from_value(value: Value) -> Result<AccountDoc> {
        let id = value
            .get("_id")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned();
        let doc: AccountDoc = serde_json::from_value(value)
            .map_err(|e| Error::decode(format!("{id} is not a valid account document: {e}")))?;
        if doc.doc_type != "account" {
            return Err(Error::decode(format!(
                "{id} has type {:?}, not account",
                doc.doc_type
            )));
        }
        if doc.id != account_doc_id(&doc.account_id) {
            return Err(Error::decode(format!(
                "{id} holds account_id {:?}",
                doc.account_id
            )));
        }
        // The balances derived from the markers must be representable too.
        doc.available()?;
        doc.posted()?;
        Ok(doc)
    }

    /// `balance − Σ positive pending deltas`.
    pub(crate) fn available(&self) -> Result<Amount> {
        let mut available = self.balance;
        for m in self.pending.iter().filter(|m| m.delta.is_positive()) {
            available = available.checked_sub(m.delta)?;
        }
        Ok(available)
    }

    /// `balance − Σ pending deltas`.
    pub(crate) fn posted(&self) -> Result<Amount> {
        let mut posted = self.balance;
        for m in &self.pending {
            posted = posted.checked_sub(m.delta)?;
        }
        Ok(posted)
    }

    pub(crate) fn view(&self) -> Result<AccountView> {
        Ok(AccountView {
            account: self.account_id.clone(),
            currency: self.currency.clone(),
            opening: self.opening,
            balance: self.balance,
            available: self.available()?,
            posted: self.posted()?,
            min_balance: self.min_balance,
            pending: self
                .pending
                .iter()
                .map(|m| PendingEntry {
                    txn: crate::transfer::transfer_of(&m.txn).to_owned(),
                    delta: m.delta,
                })
                .collect(),
            meta: Metadata::stored(&self.extra),
        })
    }
}

/// `account:{id}`.
pub(crate) fn account_doc_id(account_id: &str) -> String {
    format!("account:{account_id}")
}
