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
use crate::money::Amount;

/// A transfer applied to an account's balance and not yet settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingEntry {
    /// Transfer id.
    pub txn: String,
    /// The signed change it made to `balance`.
    pub delta: Amount,
}

/// An account as [`Ledger::account`] reads it, with the balances of SPEC §5.
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
    #[serde(default)]
    pub(crate) settled: Vec<Settled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) created_at: Option<i64>,
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

/// One entry of `pending`. `at` (when it was applied, wall ms) is our addition to the documented
/// `{txn, delta}`: the `accounts/pending` view orders markers by it so the sweeper finds old
/// (possibly orphaned) ones without reading young, in-flight ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Marker {
    pub(crate) txn: String,
    pub(crate) delta: Amount,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) at: Option<i64>,
}

/// One entry of `settled`: the transfer is finished on this account, either settled (its delta
/// stays) or undone (`undone: true`, its delta was reversed). Either way a later apply, settle
/// or undo of it on this account is skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Settled {
    pub(crate) txn: String,
    pub(crate) at: i64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) undone: bool,
}

/// Serialized bytes of one `pending` or `settled` entry of transfer `txn`, at most (JSON escapes
/// `"` and `\\` with one more byte each; ids hold no control character).
pub(crate) fn marker_bytes(txn: &str) -> usize {
    let escapes = txn.bytes().filter(|b| matches!(b, b'"' | b'\\')).count();
    txn.len() + escapes + crate::limits::MARKER_OVERHEAD_BYTES
}

impl AccountDoc {
    /// Serialized bytes of all markers, at most: what
    /// [`MARKERS_BYTES_MAX`](crate::limits::MARKERS_BYTES_MAX) bounds.
    pub(crate) fn markers_bytes(&self) -> usize {
        let pending: usize = self.pending.iter().map(|m| marker_bytes(&m.txn)).sum();
        let settled: usize = self.settled.iter().map(|s| marker_bytes(&s.txn)).sum();
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
                    txn: m.txn.clone(),
                    delta: m.delta,
                })
                .collect(),
        })
    }
}

/// `account:{id}`.
pub(crate) fn account_doc_id(account_id: &str) -> String {
    format!("account:{account_id}")
}
