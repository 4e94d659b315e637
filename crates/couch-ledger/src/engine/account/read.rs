//! The account engine's reads: accounts with their conflicts (a conflict's leaves merged into
//! one document, its losers deleted once the merge stands), and the transfers whose settled
//! entries may be pruned.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;

use serde_json::Value;

use super::AccountEngine;
use crate::account_doc::{account_doc_id, AccountDoc};
use crate::clock::now_ms;
use crate::conflict::{facts_needed, merge_account, TxnFacts};
use crate::couch::{take_conflicts, winner_of, BulkResult};
use crate::error::{Condition, Error, Result};
use crate::limits::READ_BATCH_KEYS_MAX;
use crate::money::Amount;
use crate::transfer::{digest_of, key_doc_id, transfer_of, TxnDoc};

impl AccountEngine {
    /// Of these transfers, those whose document reads `done` or `cancelled` with no conflict,
    /// or does not exist (no transfer, nothing can apply it): the settled entries that may be
    /// pruned. A transfer whose document holds a conflict has not ended yet, whatever its
    /// winner says: its resolution judges the commit path against the cancel path by what its
    /// accounts show (`choose_transfer_leaf`), so their entries stay until one leaf is left —
    /// pruned from under a resolution that cannot delete its losers (a member's), they turned
    /// a transfer the accounts had undone back into `done` (simulator, the hot shape).
    pub(super) async fn read_terminal(&self, txns: &[String]) -> Result<HashSet<String>> {
        let copies = self.quorum.several_copies(&self.client).await?;
        let mut out = HashSet::new();
        for chunk in txns.chunks(READ_BATCH_KEYS_MAX) {
            let keys: Vec<String> = chunk.iter().map(|t| key_doc_id(t)).collect();
            let ended: Vec<bool> = match copies {
                // Several copies: every leaf of every copy. A quorum read of a cluster keys the
                // copies' answers by their winner alone, so a copy that lacks a rival leaf can
                // answer "no conflict" for the quorum (docs/CLUSTER.md, "Open: reads of one
                // copy").
                Some(n) => self
                    .client
                    .leaves_of(&keys, Some(n))
                    .await?
                    .iter()
                    .map(|leaves| leaves_ended(leaves))
                    .collect(),
                None => self
                    .client
                    .all_docs_with_conflicts(&keys)
                    .await?
                    .iter()
                    .map(|row| match &row.doc {
                        Some(doc) => doc.get("_conflicts").is_none() && is_ended(doc),
                        // `error: not_found`: never written. A deleted one (`doc: null` with a
                        // value) cannot happen (validation forbids it) and is kept, to be safe.
                        None => row.error.as_deref() == Some("not_found"),
                    })
                    .collect(),
            };
            for (txn, end) in chunk.iter().zip(ended) {
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
    pub(super) async fn read(&self, accounts: &[String]) -> Result<Vec<(String, AccountRead)>> {
        let mut out = Vec::with_capacity(accounts.len());
        for chunk in accounts.chunks(READ_BATCH_KEYS_MAX) {
            let keys: Vec<String> = chunk.iter().map(|a| account_doc_id(a)).collect();
            let rows = self.client.all_docs_with_conflicts(&keys).await?;
            for (account, row) in chunk.iter().zip(rows) {
                out.push((account.clone(), self.account_read(row.doc, &[]).await?));
            }
        }
        Ok(out)
    }

    /// Reads accounts as [`AccountEngine::read`] does, each from every copy that answers
    /// (`open_revs=all` with `r` = n, one request per account): the leaves of a rival write
    /// that reached only some copies are among those merged. On one copy, or one server, the
    /// plain read is of every copy already.
    pub(super) async fn read_every_copy(
        &self,
        accounts: &[String],
    ) -> Result<Vec<(String, AccountRead)>> {
        let Some(copies) = self.quorum.several_copies(&self.client).await? else {
            return self.read(accounts).await;
        };
        let mut out = Vec::with_capacity(accounts.len());
        for account in accounts {
            let leaves = self
                .client
                .live_leaves(&account_doc_id(account), Some(copies))
                .await?;
            let winner = winner_of(&leaves);
            out.push((account.clone(), self.account_read(winner, &leaves).await?));
        }
        Ok(out)
    }

    /// One account as a read with conflicts returned it (`None`: missing or deleted): merged
    /// from every leaf when it holds a conflict. `leaves`: the bodies of its leaves where the
    /// read gave them (else they are read).
    async fn account_read(&self, raw: Option<Value>, leaves: &[Value]) -> Result<AccountRead> {
        let Some(mut raw @ Value::Object(_)) = raw else {
            return Ok(AccountRead::Found(Box::new(Found {
                doc: None,
                losers: Vec::new(),
                dirty: false,
            })));
        };
        let losers = take_conflicts(&mut raw);
        match AccountDoc::from_value(raw.clone()) {
            Err(e) => Ok(AccountRead::Unreadable(raw, e)),
            Ok(mut doc) => {
                // Leaves this branch joined already stay out of any merge (and out of the list
                // once they are gone).
                doc.merged.retain(|r| losers.contains(r));
                if losers.iter().all(|r| doc.merged.contains(r)) {
                    Ok(AccountRead::Found(Box::new(Found {
                        doc: Some(doc),
                        losers,
                        dirty: false,
                    })))
                } else {
                    self.merge(doc, losers, leaves).await
                }
            }
        }
    }

    /// Merges a conflicted account's leaves ([`merge_account`]), reading the transfers the
    /// leaves disagree on. A loser this program cannot read, or a transfer that is itself in
    /// conflict, leaves the account as it is for now (an error for its ops: the sweeper
    /// resolves the transfer first).
    async fn merge(
        &self,
        winner: AccountDoc,
        losers: Vec<String>,
        read: &[Value],
    ) -> Result<AccountRead> {
        let id = winner.id.clone();
        self.conflicts.met.fetch_add(1, Ordering::Relaxed);
        self.unconfirm(&winner.account_id);
        if let Some(e) = self.not_mergeable(&id, losers.len()).await {
            return Ok(AccountRead::Failed(e));
        }
        let (leaves, revs) = match self.read_leaves(&winner, &losers, read).await? {
            ControlFlow::Continue(read) => read,
            ControlFlow::Break(failed) => return Ok(failed),
        };
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
            // The losers were joined already, deleted meanwhile, or not on the copy the leaves
            // were read from: nothing to merge now, and only the joined ones may go.
            let joined = joined_losers(&folded, &[], &losers);
            return Ok(AccountRead::Found(Box::new(Found {
                doc: Some(winner),
                losers: joined,
                dirty: false,
            })));
        }
        let needed = facts_needed(&winner, &leaves);
        let facts = match self.read_facts(&winner, &needed).await? {
            ControlFlow::Continue(facts) => facts,
            ControlFlow::Break(failed) => return Ok(failed),
        };
        match merge_account(&winner, &leaves, &facts, now_ms()) {
            Ok(mut merged) => {
                // Every leaf joined here is recorded on the merged branch while it lasts: a
                // member's sweeper may not delete it, and the next merge must not join it
                // again over what this branch settled and pruned since.
                merged.merged = joined_losers(&folded, &revs, &losers);
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
                // Only the leaves joined may be deleted: a loser `_all_docs` named that the
                // leaves' read did not return (a copy it has not reached yet) holds what no
                // branch here has, and stays for a later merge.
                let joined = merged.merged.clone();
                Ok(AccountRead::Found(Box::new(Found {
                    doc: Some(merged),
                    losers: joined,
                    dirty,
                })))
            }
            Err(b) => Ok(AccountRead::Failed(Error::ledger(
                Condition::Conflicted,
                format!(
                    "{id} holds a conflict that cannot be merged yet: transfer {}: {}",
                    b.txn, b.why
                ),
            ))),
        }
    }

    /// Why the conflict of `id` cannot be merged now, if it cannot: its database keeps one copy
    /// of each document ([`unmergeable`]), or how many it keeps could not be read.
    async fn not_mergeable(&self, id: &str, losers: usize) -> Option<Error> {
        match self.quorum.keeps_entries(&self.client).await {
            Some(true) => None,
            Some(false) => Some(unmergeable(id, losers)),
            None => Some(Error::ledger(
                Condition::Unavailable,
                format!(
                    "{id} holds a conflict, and the database's copies could not be read to \
                     tell whether its branches can be merged; tried again later"
                ),
            )),
        }
    }

    /// The losing leaves of `winner`'s conflict, and their revisions, but for those this branch
    /// joined already (not read again): taken from `read` where it holds them, else read.
    /// `Break`: a leaf is not a valid account, the merge waits for a person.
    async fn read_leaves(
        &self,
        winner: &AccountDoc,
        losers: &[String],
        read: &[Value],
    ) -> Result<ControlFlow<AccountRead, (Vec<AccountDoc>, Vec<String>)>> {
        let id = &winner.id;
        let unread: Vec<String> = losers
            .iter()
            .filter(|r| !winner.merged.contains(r))
            .cloned()
            .collect();
        let rev_of = |body: &Value| body.get("_rev").and_then(Value::as_str).map(str::to_owned);
        let mut bodies: Vec<Value> = read
            .iter()
            .filter(|b| rev_of(b).is_some_and(|r| unread.contains(&r)))
            .cloned()
            .collect();
        let missing: Vec<String> = unread
            .iter()
            .filter(|r| !bodies.iter().any(|b| rev_of(b).as_ref() == Some(*r)))
            .cloned()
            .collect();
        bodies.extend(self.client.revisions(id, &missing).await?);
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
                    return Ok(ControlFlow::Break(AccountRead::Failed(Error::invariant(
                        format!(
                            "{id} holds a conflict with a leaf that is not a valid account \
                             ({e}); a person must resolve it"
                        ),
                    ))))
                }
                (Ok(_), None) => return Err(Error::decode(format!("a leaf of {id} has no _rev"))),
            }
        }
        Ok(ControlFlow::Continue((leaves, revs)))
    }

    /// What the merge needs of the transfers `needed`, from their documents (one not there,
    /// or not about this account, is left out). `Break`: a transfer holds a conflict itself,
    /// to be resolved first. An entry's key names its terms, so a document read from one copy
    /// that shows other terms than the key's (its rival leaf reached only the other copies)
    /// makes that key a cancelled transfer's here, moving nothing, and the entry is kept until
    /// the sweeper takes it back (docs/CLUSTER.md, "One id, two terms, two paths").
    async fn read_facts(
        &self,
        winner: &AccountDoc,
        needed: &[String],
    ) -> Result<ControlFlow<AccountRead, HashMap<String, TxnFacts>>> {
        let mut facts = HashMap::new();
        if needed.is_empty() {
            return Ok(ControlFlow::Continue(facts));
        }
        let keys: Vec<String> = needed.iter().map(|t| key_doc_id(t)).collect();
        let rows = self.client.all_docs_with_conflicts(&keys).await?;
        for (txn, row) in needed.iter().zip(rows) {
            let Some(doc) = row.doc.filter(Value::is_object) else {
                continue;
            };
            if doc.get("_conflicts").is_some() {
                return Ok(ControlFlow::Break(AccountRead::Failed(
                    Error::blocked_by_transfer(&winner.id, transfer_of(txn)),
                )));
            }
            if let Some(f) = txn_facts(&doc, txn, &winner.account_id) {
                facts.insert(txn.clone(), f);
            }
        }
        Ok(ControlFlow::Continue(facts))
    }

    /// Deletes the losing leaves of a conflict whose merge now stands as the winner. A leaf
    /// deleted already is fine; a refusal (only an admin may delete ledger revisions) leaves
    /// the conflict for `verify` to report and an admin's sweeper to finish.
    pub(super) async fn delete_losers(
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
}

/// What a transfer's document says to the merge of `account`: its state, its delta on the
/// account, and the attempt a one-write decision names there. `None` when the document does
/// not say, or names the account on neither side.
fn txn_facts(doc: &Value, key: &str, account: &str) -> Option<TxnFacts> {
    // An entry of other terms than the document's: no decision of the document counts it.
    if let Some(digest) = digest_of(key) {
        let terms = serde_json::from_value::<TxnDoc>(doc.clone()).ok()?;
        if terms.entry_key().rsplit_once('~').map(|(_, d)| d) != Some(digest) {
            return Some(TxnFacts {
                state: crate::state::State::Cancelled,
                delta: Amount::ZERO,
                named: None,
            });
        }
    }
    let state = doc
        .get("state")
        .and_then(Value::as_str)
        .and_then(crate::state::State::parse);
    let value = doc
        .get("value")
        .and_then(Value::as_i64)
        .and_then(|v| Amount::new(v).ok());
    let side = if doc.get("source").and_then(Value::as_str) == Some(account) {
        Some(true)
    } else if doc.get("destination").and_then(Value::as_str) == Some(account) {
        Some(false)
    } else {
        None
    };
    let (Some(state), Some(value), Some(debit)) = (state, value, side) else {
        return None;
    };
    let delta = if debit { value.neg() } else { value };
    let role = if debit { "source" } else { "destination" };
    let named = doc
        .get("markers")
        .and_then(|m| m.get(role))
        .and_then(Value::as_str)
        .and_then(|a| a.parse().ok());
    Some(TxnFacts {
        state,
        delta,
        named,
    })
}

/// One account as [`AccountEngine::read`] found it.
pub(super) enum AccountRead {
    Found(Box<Found>),
    /// The document is there but not a valid account: the raw document and why.
    Unreadable(Value, Error),
    /// A conflict that cannot be merged now: the ops on this account fail with this error.
    Failed(Error),
}

/// A readable account (or none), merged from its leaves when it held a conflict.
pub(super) struct Found {
    pub(super) doc: Option<AccountDoc>,
    pub(super) losers: Vec<String>,
    pub(super) dirty: bool,
}

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

/// The losing revisions a merge has joined, so that its branch may delete them: those this
/// branch or a leaf joined folded in before (`folded`) and those read and joined now (`read`),
/// among the current `losers`; in order, once each. A loser that is in neither was not read
/// (the copy that answered the leaves' read does not hold it yet): deleting it would throw away
/// what only it holds.
fn joined_losers(folded: &HashSet<String>, read: &[String], losers: &[String]) -> Vec<String> {
    let mut joined: Vec<String> = folded
        .iter()
        .chain(read.iter())
        .filter(|r| losers.contains(r))
        .cloned()
        .collect();
    joined.sort();
    joined.dedup();
    joined
}

/// A transfer document's state is `done` or `cancelled`.
fn is_ended(doc: &Value) -> bool {
    matches!(
        doc.get("state").and_then(Value::as_str),
        Some("done" | "cancelled")
    )
}

/// A transfer whose leaves, read from every copy, say it has ended: one leaf, live and ended,
/// or none at all (never written). A deleted leaf cannot happen (validation forbids it) and
/// keeps it open, to be safe.
fn leaves_ended(leaves: &[Value]) -> bool {
    match leaves {
        [] => true,
        [doc] => doc.get("_deleted").and_then(Value::as_bool) != Some(true) && is_ended(doc),
        _ => false,
    }
}
