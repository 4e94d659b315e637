//! Accounts: creating and reading `account:{id}` documents. Their shape and balance rules are
//! in `account_doc`, a layer below the engine that changes them.

use serde_json::{Map, Value};

use crate::account_doc::{account_doc_id, AccountDoc};
pub use crate::account_doc::{AccountView, PendingEntry};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::meta::Metadata;
use crate::money::{Amount, Currency};
use crate::opening::OpeningRecord;
use crate::orders::{RecordStatus, Recorded};

/// What to create: [`Ledger::create_account`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountSpec {
    /// The account's id (`account:{account_id}` is its document).
    pub account_id: String,
    /// Its currency; never changes.
    pub currency: Currency,
    /// Opening balance; never changes.
    pub opening: Amount,
    /// The lowest `available` balance a debit may leave; `None` = unlimited (an issuer or
    /// external account that may go negative).
    pub min_balance: Option<Amount>,
    /// Written once with the account's document and returned with it; not one of its fixed
    /// fields: the same spec again with other metadata is the same account, and keeps the
    /// first's.
    pub meta: Metadata,
}

/// Checks an account or transfer id: the same rule as every part of a ledger document id
/// (non-empty, at most [`ID_CHARS_MAX`](crate::limits::ID_CHARS_MAX) characters, no control character or surrounding white
/// space, not beginning with `_`, no `:`).
pub(crate) use crate::orders::check_id_part as validate_id;

impl Ledger {
    /// Creates an account. Idempotent: the same spec again is [`RecordStatus::Exists`] (the
    /// balance may have moved since; only the fixed fields are compared).
    ///
    /// Two writes: the account's opening record (`opening:{id}`, write-once, in the ledger's
    /// validated database: what `verify` takes the account's terms from, docs/DOCUMENTS.md),
    /// then the account. The record comes first, so an account never exists without one; a
    /// create that stopped between the two is completed by the same call again, which finds
    /// the record with the same terms and goes on. An account made before records existed gets
    /// its record from its own document.
    ///
    /// # Errors
    ///
    /// Invalid input (a bad id, an opening below a limited account's `min_balance`); the
    /// account or its record exists with another currency, opening or minimum (a mismatch
    /// naming the field); the server failed.
    pub async fn create_account(&self, spec: AccountSpec) -> Result<Recorded> {
        validate_id("account", &spec.account_id)?;
        spec.meta.check()?;
        if let Some(min) = spec.min_balance {
            if spec.opening < min {
                return Err(Error::invalid(
                    "opening",
                    // In the currency's units: the command line takes decimals, and a bare
                    // `-500` would read as 500 euros rather than 5.
                    format!(
                        "{} {c} is below the account's minimum balance {} {c}",
                        spec.currency.format(spec.opening),
                        spec.currency.format(min),
                        c = spec.currency,
                    ),
                ));
            }
        }
        let id = account_doc_id(&spec.account_id);
        let mut doc = AccountDoc {
            id: id.clone(),
            rev: None,
            doc_type: "account".to_owned(),
            account_id: spec.account_id.clone(),
            currency: spec.currency.code().to_owned(),
            opening: spec.opening,
            balance: spec.opening,
            min_balance: spec.min_balance,
            pending: Vec::new(),
            settled: Vec::new(),
            created_at: Some(crate::engine::now_ms()),
            merged: Vec::new(),
            pruned_to: None,
            extra: Map::new(),
        };
        spec.meta.store(&mut doc.extra);
        let client = &self.inner.hot;
        // The account is read first: one that exists (made before records existed, perhaps)
        // must not get a record of the terms asked now, which a record would keep for good.
        if let Some(existing) = client.get_opt::<Value>(&id).await? {
            let existing = AccountDoc::from_value(existing)?;
            same_terms(&existing, &doc)?;
            self.write_opening_record(&OpeningRecord::of_account(&existing))
                .await?;
            return Ok(Recorded {
                id,
                status: RecordStatus::Exists,
            });
        }
        // Another create with other terms that got here first owns the record: a mismatch.
        self.write_opening_record(&OpeningRecord::new(
            &spec.account_id,
            spec.currency.code(),
            spec.opening,
            spec.min_balance,
        ))
        .await?;
        match client.put(&id, &doc).await {
            Ok(_) => {
                return Ok(Recorded {
                    id,
                    status: RecordStatus::Created,
                })
            }
            Err(e) if e.is_conflict() => {}
            // pouchdb-server validates against the existing document before it notices the
            // create conflicts: an account created with other fixed fields is refused there.
            Err(e) if e.is_forbidden() && self.changed_under_us(&id, None).await? => {}
            Err(e) => return Err(e),
        }
        // It exists (or our own retried create landed): same fixed fields → Exists.
        let existing: Value = client.get(&id).await?;
        same_terms(&AccountDoc::from_value(existing)?, &doc)?;
        Ok(Recorded {
            id,
            status: RecordStatus::Exists,
        })
    }

    /// Reads an account with its balances.
    ///
    /// # Errors
    ///
    /// A bad id; no such account (404, [`Error::is_not_found`]); a document that is not a valid
    /// account (amounts out of range, wrong shape); the server failed.
    pub async fn account(&self, account_id: &str) -> Result<AccountView> {
        validate_id("account", account_id)?;
        let value: Value = self.inner.hot.get(&account_doc_id(account_id)).await?;
        AccountDoc::from_value(value)?.view()
    }
}

/// An existing account's fixed fields against those asked: a mismatch naming the first that
/// differs.
fn same_terms(existing: &AccountDoc, asked: &AccountDoc) -> Result<()> {
    match OpeningRecord::of_account(asked).differing_term(existing) {
        Some(field) => Err(Error::mismatch(&existing.id, field)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account_doc::{
        marker_bytes, pending_bytes, settled_at, settled_bytes, settled_groups, Marker, Settled,
    };
    use crate::limits::ID_CHARS_MAX;
    use serde_json::json;

    #[test]
    fn ids_are_checked() {
        for ok in ["alice", "a-b_c.d", "ünï", &"x".repeat(ID_CHARS_MAX)] {
            validate_id("account", ok).unwrap();
        }
        for bad in ["", "_a", "a:b", "a\nb", &"x".repeat(ID_CHARS_MAX + 1)] {
            assert!(
                validate_id("account", bad).unwrap_err().is_invalid_input(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn balances_follow_the_markers() {
        let doc = AccountDoc::from_value(json!({
            "_id": "account:a", "_rev": "3-x", "type": "account", "account_id": "a",
            "currency": "EUR", "opening": 1000, "balance": 1200, "min_balance": 0,
            "pending": [{"txn": "t1", "delta": -300}, {"txn": "t2", "delta": 500}],
            "settled": [{"txn": "t0", "at": 1}], "created_at": 1, "other": true
        }))
        .unwrap();
        assert_eq!(doc.available().unwrap().minor(), 700);
        assert_eq!(doc.posted().unwrap().minor(), 1000);
        // Unknown fields survive a round trip (a CAS write never drops them).
        assert_eq!(serde_json::to_value(&doc).unwrap()["other"], true);
    }

    #[test]
    fn marker_bytes_bound_the_serialized_entries() {
        use crate::limits::MARKER_OVERHEAD_BYTES;
        for txn in ["", "t", "a\"b\\c", &"\u{1F600}".repeat(ID_CHARS_MAX)] {
            let pending = Marker {
                txn: txn.to_owned(),
                delta: Amount::new(-9_007_199_254_740_991).unwrap(),
                at: Some(i64::MIN),
                attempt: None,
                peer: None,
                aliases: Vec::new(),
            };
            // With the one-write path's attempt and peer (an id of quotes and 4-byte characters).
            let peer = format!("\"\\{}", "\u{1F600}".repeat(ID_CHARS_MAX - 2));
            let once = Marker {
                attempt: Some(crate::account_doc::Attempt::from_bits(u64::MAX)),
                peer: Some(peer),
                ..pending.clone()
            };
            let o = serde_json::to_vec(&once).unwrap().len() + 1;
            assert!(o <= pending_bytes(&once), "{o} > {}", pending_bytes(&once));
            let settled = Settled {
                txn: txn.to_owned(),
                at: i64::MIN,
                undone: true,
                attempts: Vec::new(),
            };
            // +1: the comma between two entries of a list. A settled entry at worst is a group
            // of its own: `[{"at":…,"undone":["…"]}]` less the brackets.
            let p = serde_json::to_vec(&pending).unwrap().len() + 1;
            let mut out = Vec::new();
            settled_groups::serialize(
                std::slice::from_ref(&settled),
                &mut serde_json::Serializer::new(&mut out),
            )
            .unwrap();
            let s = out.len() - 2 + 1;
            assert!(p <= marker_bytes(txn), "{p} > {}", marker_bytes(txn));
            assert!(s <= marker_bytes(txn), "{s} > {}", marker_bytes(txn));
            // An undone one-write marker's entry names its attempts, and its id once more.
            let of = Settled {
                attempts: (0..3)
                    .map(|i| crate::account_doc::Attempt::from_bits(u64::MAX - i))
                    .collect(),
                ..settled.clone()
            };
            let mut out = Vec::new();
            settled_groups::serialize(
                std::slice::from_ref(&of),
                &mut serde_json::Serializer::new(&mut out),
            )
            .unwrap();
            let s = out.len() - 2 + 1;
            assert!(s <= settled_bytes(&of), "{s} > {}", settled_bytes(&of));
            assert_eq!(settled_bytes(&settled), marker_bytes(txn));
        }
        assert!(marker_bytes("") == MARKER_OVERHEAD_BYTES);
    }

    fn account_with(settled: serde_json::Value) -> crate::error::Result<AccountDoc> {
        AccountDoc::from_value(json!({
            "_id": "account:a", "type": "account", "account_id": "a", "currency": "EUR",
            "opening": 0, "balance": 0, "min_balance": null, "pending": [], "settled": settled
        }))
    }

    fn entry(txn: &str, at: i64, undone: bool) -> Settled {
        Settled {
            txn: txn.into(),
            at,
            undone,
            attempts: Vec::new(),
        }
    }

    #[test]
    fn settled_entries_are_stored_in_groups_of_one_date() {
        let mut doc = account_with(json!([])).unwrap();
        doc.settled = vec![
            entry("t1", 5_000, false),
            entry("t2", 5_000, true),
            entry("t3", 5_000, false),
            entry("t4", 10_000, true),
            entry("t5", 5_000, false),
        ];
        let stored = serde_json::to_value(&doc).unwrap();
        assert_eq!(
            stored["settled"],
            json!([
                {"at": 5_000, "txns": ["t1", "t3"], "undone": ["t2"]},
                {"at": 10_000, "undone": ["t4"]},
                {"at": 5_000, "txns": ["t5"]}
            ])
        );
        // Read back: the same entries (settled before undone within a group).
        let back = AccountDoc::from_value(stored).unwrap();
        let mut want = doc.settled.clone();
        want.swap(1, 2);
        assert_eq!(back.settled, want);
    }

    #[test]
    fn settled_entries_of_earlier_versions_are_read_and_rewritten_grouped() {
        let doc = account_with(json!([
            {"txn": "old1", "at": 7},
            {"txn": "old2", "at": 7, "undone": true},
            {"txn": "old3", "at": 8, "undone": false},
            {"at": 10_000, "txns": ["new1"], "undone": ["new2"]},
            {"at": 15_000}
        ]))
        .unwrap();
        assert_eq!(
            doc.settled,
            [
                entry("old1", 7, false),
                entry("old2", 7, true),
                entry("old3", 8, false),
                entry("new1", 10_000, false),
                entry("new2", 10_000, true),
            ]
        );
        assert_eq!(
            serde_json::to_value(&doc).unwrap()["settled"],
            json!([
                {"at": 7, "txns": ["old1"], "undone": ["old2"]},
                {"at": 8, "txns": ["old3"]},
                {"at": 10_000, "txns": ["new1"], "undone": ["new2"]}
            ])
        );
    }

    #[test]
    fn an_undone_one_write_marker_keeps_its_attempts() {
        let a: crate::account_doc::Attempt = "0000000000ab".parse().unwrap();
        let b: crate::account_doc::Attempt = "0000000000cd".parse().unwrap();
        let mut doc = account_with(json!([])).unwrap();
        doc.settled = vec![
            entry("t1", 5_000, false),
            Settled {
                attempts: vec![a, b],
                ..entry("t2", 5_000, true)
            },
            entry("t3", 5_000, true),
        ];
        let stored = serde_json::to_value(&doc).unwrap();
        assert_eq!(
            stored["settled"],
            json!([{
                "at": 5_000, "txns": ["t1"], "undone": ["t2", "t3"],
                "undone_attempts": {"t2": ["0000000000ab", "0000000000cd"]}
            }])
        );
        assert_eq!(AccountDoc::from_value(stored).unwrap().settled, doc.settled);
    }

    #[test]
    fn malformed_settled_entries_are_refused() {
        for bad in [
            json!([{"at": 1, "txns": ["t"], "undone_attempts": {"t": ["0000000000ab"]}}]),
            json!([{"at": 1, "undone": ["t"], "undone_attempts": {"t": ["xyz"]}}]),
            json!([{"txn": "t", "at": 1, "undone": true, "undone_attempts": {"t": ["0000000000ab"]}}]),
            json!([{"txn": "t", "at": 1, "undone": ["u"]}]),
            json!([{"txn": "t", "at": 1, "txns": ["u"]}]),
            json!([{"at": 1, "undone": true}]),
            json!([{"txns": ["t"]}]),
            json!([{"at": 1, "txns": "t"}]),
            json!([{"at": 1, "txns": [1]}]),
            json!([{"at": 1.5, "txns": ["t"]}]),
            json!([{"at": 1, "txns": ["t"], "other": 1}]),
            json!(["t"]),
            json!({"at": 1}),
        ] {
            assert!(account_with(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn settled_dates_are_rounded_up_never_down() {
        use crate::limits::SETTLED_AT_STEP_MS as STEP;
        for now in [
            0,
            1,
            STEP - 1,
            STEP,
            STEP + 1,
            1_763_800_001_234,
            -1,
            -STEP - 1,
            i64::MAX,
        ] {
            let at = settled_at(now);
            assert!(at >= now, "{now} → {at}");
            assert!(at == i64::MAX || at % STEP == 0, "{now} → {at}");
            assert!(at - now < STEP, "{now} → {at}");
        }
        assert_eq!(Settled::new("t", 1, true), entry("t", STEP, true));
    }

    #[test]
    fn malformed_accounts_are_refused() {
        let base = json!({
            "_id": "account:a", "type": "account", "account_id": "a", "currency": "EUR",
            "opening": 0, "balance": 0, "min_balance": null, "pending": [], "settled": []
        });
        AccountDoc::from_value(base.clone()).unwrap();
        let mut wrong_id = base.clone();
        wrong_id["_id"] = json!("account:b");
        assert!(AccountDoc::from_value(wrong_id).is_err());
        let mut float = base.clone();
        float["balance"] = json!(2.5);
        assert!(AccountDoc::from_value(float).is_err());
        let mut huge = base;
        huge["balance"] = json!(9007199254740992i64);
        assert!(AccountDoc::from_value(huge).is_err());
    }
}
