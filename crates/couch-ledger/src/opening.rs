//! Opening records, `opening:{account_id}` (docs/DOCUMENTS.md): the terms an account was created
//! with — currency, opening balance, minimum — written once into the ledger's own database,
//! whose `validate_doc_update` keeps them write-once and undeletable, before the account itself.
//!
//! In the split layout (docs/LAYOUT.md) the account lives in a database without validation,
//! where a writer could raise its `opening` together with its `balance`: every sum `verify`
//! checks would still add up from the document's own figures. `verify` takes each account's
//! terms from its record instead, so such a write shows. The single layout writes them too: one
//! way to create an account, and one way for `verify` to read its terms, in both layouts.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::account_doc::{account_doc_id, AccountDoc};
use crate::couch::{AllDocsRow, ViewQuery};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::limits::READ_BATCH_KEYS_MAX;
use crate::money::Amount;
use crate::orders::RecordStatus;

/// The id prefix of opening records.
pub(crate) const OPENING_PREFIX: &str = "opening:";

/// Tries of a record's create: a 409 or 403 for a record that is gone by the time it is read
/// (it cannot be deleted under the validation, so only a database without it) is written again.
const WRITE_ATTEMPTS_MAX: usize = 3;

/// `opening:{account_id}`.
pub(crate) fn opening_doc_id(account_id: &str) -> String {
    format!("{OPENING_PREFIX}{account_id}")
}

/// `opening:{account_id}` as stored. No date: two processes creating one account write the same
/// body, which a cluster stores as one revision instead of two conflicting ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OpeningRecord {
    #[serde(rename = "_id")]
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) doc_type: String,
    pub(crate) account_id: String,
    pub(crate) currency: String,
    pub(crate) opening: Amount,
    /// `None` (stored as `null`): an unlimited account.
    pub(crate) min_balance: Option<Amount>,
}

impl OpeningRecord {
    pub(crate) fn new(
        account_id: &str,
        currency: &str,
        opening: Amount,
        min_balance: Option<Amount>,
    ) -> OpeningRecord {
        OpeningRecord {
            id: opening_doc_id(account_id),
            doc_type: "opening".to_owned(),
            account_id: account_id.to_owned(),
            currency: currency.to_owned(),
            opening,
            min_balance,
        }
    }

    /// The record of an existing account, from its document (one made before records existed).
    pub(crate) fn of_account(doc: &AccountDoc) -> OpeningRecord {
        OpeningRecord::new(&doc.account_id, &doc.currency, doc.opening, doc.min_balance)
    }

    /// Parses a document read from the server and checks what must hold after a read.
    pub(crate) fn from_value(value: Value) -> Result<OpeningRecord> {
        let id = value
            .get("_id")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned();
        let record: OpeningRecord = serde_json::from_value(value)
            .map_err(|e| Error::decode(format!("{id} is not a valid opening record: {e}")))?;
        if record.doc_type != "opening" {
            return Err(Error::decode(format!(
                "{id} has type {:?}, not opening",
                record.doc_type
            )));
        }
        if record.id != opening_doc_id(&record.account_id) {
            return Err(Error::decode(format!(
                "{id} holds account_id {:?}",
                record.account_id
            )));
        }
        Ok(record)
    }

    /// The first of the account's fixed fields (`currency`, `opening`, `min_balance`) in which
    /// `doc` differs from this record.
    pub(crate) fn differing_term(&self, doc: &AccountDoc) -> Option<&'static str> {
        differing(self.terms(), (&doc.currency, doc.opening, doc.min_balance))
    }

    fn terms(&self) -> Terms<'_> {
        (&self.currency, self.opening, self.min_balance)
    }

    /// This record's value of `field` (one [`OpeningRecord::differing_term`] names), as JSON.
    pub(crate) fn term(&self, field: &str) -> Value {
        match field {
            "currency" => Value::from(self.currency.clone()),
            "opening" => Value::from(self.opening.minor()),
            "min_balance" => self.min_balance.map_or(Value::Null, |m| m.minor().into()),
            other => unreachable!("{other} is not a term of an account"),
        }
    }

    /// The first field in which `stored` (any leaf of this record's id) differs from this
    /// record; a leaf that is not a valid record is an error.
    fn differs_from(&self, stored: Value) -> Result<Option<&'static str>> {
        let stored = OpeningRecord::from_value(stored)?;
        debug_assert_eq!(stored.id, self.id);
        Ok(differing(self.terms(), stored.terms()))
    }
}

/// An account's fixed fields: currency, opening, minimum.
type Terms<'a> = (&'a str, Amount, Option<Amount>);

/// The first field in which two accounts' fixed fields differ.
fn differing(a: Terms<'_>, b: Terms<'_>) -> Option<&'static str> {
    if a.0 != b.0 {
        Some("currency")
    } else if a.1 != b.1 {
        Some("opening")
    } else if a.2 != b.2 {
        Some("min_balance")
    } else {
        None
    }
}

/// `doc`'s value of an account's fixed field `field`, as JSON.
pub(crate) fn account_term(doc: &AccountDoc, field: &str) -> Value {
    OpeningRecord::of_account(doc).term(field)
}

impl Ledger {
    /// Writes an account's opening record into the ledger's database, once: [`RecordStatus::Created`],
    /// or [`RecordStatus::Exists`] when a record with the same terms is there (a retried or
    /// concurrent create). Every leaf is compared: on a cluster two bodies under one id can
    /// both be stored.
    ///
    /// # Errors
    ///
    /// A record with other terms is there (a mismatch naming the field); the server refused or
    /// failed.
    pub(crate) async fn write_opening_record(
        &self,
        record: &OpeningRecord,
    ) -> Result<RecordStatus> {
        let client = &self.inner.client;
        let id = record.id.as_str();
        for _ in 0..WRITE_ATTEMPTS_MAX {
            let error = match client.put(id, record).await {
                Ok(written) if !written.accepted => return Ok(RecordStatus::Created),
                Ok(_) => {
                    tracing::info!(id, "write accepted (202), not confirmed; re-reading");
                    None
                }
                // CouchDB answers 409 for a create over an existing document; pouchdb-server
                // runs validate_doc_update first, whose write-once rule answers 403. A 403 for a
                // record that does not exist is a real refusal.
                Err(e) if e.is_conflict() || e.is_forbidden() => Some(e),
                Err(e) => return Err(e),
            };
            let Some(leaves) = client.leaves(id).await? else {
                match error {
                    Some(e) if e.is_forbidden() => return Err(e),
                    // Ours was accepted but is not readable yet, or the record went away
                    // between our write and our read: write again.
                    _ => continue,
                }
            };
            for stored in leaves.winner.into_iter().chain(leaves.losers) {
                if let Some(field) = record.differs_from(stored)? {
                    return Err(Error::mismatch(id, field));
                }
            }
            return Ok(if error.is_some() {
                RecordStatus::Exists
            } else {
                RecordStatus::Created
            });
        }
        Err(Error::invariant(format!(
            "{id}: kept conflicting with a record that then disappeared"
        )))
    }

    /// Writes the opening record of every account that has none, from the account document as
    /// it is: accounts created before records existed. Returns how many it wrote. Reads the
    /// accounts' ids (a view, no documents) and looks their records up by id; only the
    /// accounts without one are read whole. Accounts this program cannot read are left out
    /// (`verify` names them).
    ///
    /// # Errors
    ///
    /// A record appeared meanwhile with other terms than its account's; the server failed.
    pub(crate) async fn write_missing_opening_records(&self) -> Result<u64> {
        let mut accounts = Vec::new();
        let q = ViewQuery {
            reduce: Some(false),
            ..ViewQuery::default()
        };
        self.inner
            .hot
            .view_in_pages("transactions", "account_balances", q, |row| {
                let account = row.id.as_deref().and_then(|id| id.strip_prefix("account:"));
                if let Some(account) = account {
                    accounts.push(account.to_owned());
                }
                Ok(())
            })
            .await?;
        let mut written = 0;
        for chunk in accounts.chunks(READ_BATCH_KEYS_MAX) {
            let keys: Vec<String> = chunk.iter().map(|a| opening_doc_id(a)).collect();
            let rows = self.inner.client.all_docs(&keys, false).await?;
            let missing: Vec<String> = chunk
                .iter()
                .zip(rows)
                .filter(|(_, row)| !is_live(row))
                .map(|(account, _)| account_doc_id(account))
                .collect();
            for row in self.inner.hot.all_docs(&missing, true).await? {
                let Some(Ok(account)) = row.doc.map(AccountDoc::from_value) else {
                    continue;
                };
                let record = OpeningRecord::of_account(&account);
                if self.write_opening_record(&record).await? == RecordStatus::Created {
                    written += 1;
                }
            }
        }
        Ok(written)
    }
}

/// An `_all_docs` row of a document that exists and is not deleted.
fn is_live(row: &AllDocsRow) -> bool {
    let deleted = row
        .value
        .as_ref()
        .and_then(|v| v.get("deleted"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    row.error.is_none() && row.id.is_some() && !deleted
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(value: Value) -> Result<OpeningRecord> {
        OpeningRecord::from_value(value)
    }

    #[test]
    fn records_are_read_and_checked() {
        let base = json!({
            "_id": "opening:a", "_rev": "1-x", "type": "opening", "account_id": "a",
            "currency": "EUR", "opening": 1000, "min_balance": 0
        });
        let r = record(base.clone()).unwrap();
        assert_eq!(r.opening.minor(), 1000);
        assert_eq!(r.min_balance, Some(Amount::ZERO));
        let mut unlimited = base.clone();
        unlimited["min_balance"] = Value::Null;
        assert_eq!(record(unlimited).unwrap().min_balance, None);
        for (field, bad) in [
            ("_id", json!("opening:b")),
            ("type", json!("account")),
            ("opening", json!(10.5)),
            ("opening", json!(9007199254740992i64)),
            ("currency", json!(5)),
        ] {
            let mut doc = base.clone();
            doc[field] = bad.clone();
            assert!(record(doc).is_err(), "{field}: {bad}");
        }
    }

    #[test]
    fn the_differing_term_is_named() {
        let account = AccountDoc::from_value(json!({
            "_id": "account:a", "type": "account", "account_id": "a", "currency": "EUR",
            "opening": 1000, "balance": 1000, "min_balance": 0, "pending": [], "settled": []
        }))
        .unwrap();
        let r = OpeningRecord::of_account(&account);
        assert_eq!(r.id, "opening:a");
        assert_eq!(r.differing_term(&account), None);
        let mut raised = account.clone();
        raised.opening = Amount::new(1500).unwrap();
        raised.balance = Amount::new(1500).unwrap();
        assert_eq!(r.differing_term(&raised), Some("opening"));
        assert_eq!(account_term(&raised, "opening"), json!(1500));
        assert_eq!(r.term("opening"), json!(1000));
        let mut unlimited = account.clone();
        unlimited.min_balance = None;
        assert_eq!(r.differing_term(&unlimited), Some("min_balance"));
        assert_eq!(account_term(&unlimited, "min_balance"), Value::Null);
        let mut other = account;
        other.currency = "GBP".into();
        assert_eq!(r.differing_term(&other), Some("currency"));
        // The stored body compares the same way, and serializes with `min_balance: null`.
        let stored = serde_json::to_value(OpeningRecord::of_account(&unlimited)).unwrap();
        assert_eq!(stored["min_balance"], Value::Null);
        assert_eq!(r.differs_from(stored).unwrap(), Some("min_balance"));
    }
}
