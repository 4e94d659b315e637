//! Design documents as files, installed like migrations.
//!
//! Every file under `design_docs/` is embedded at compile time. `design_docs/<name>/` becomes
//! `_design/<name>`: `views/<view>/map.js` and `views/<view>/reduce` (a built-in reducer name),
//! and `validate_doc_update.js`. Each document carries a SHA-256 checksum of its content;
//! installing writes only a document whose checksum differs, because a changed view makes
//! CouchDB rebuild its whole index.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::couch::Client;
use crate::error::{Error, Result};

include!(concat!(env!("OUT_DIR"), "/design_files.rs"));

/// The field of a design document that holds our checksum.
const CHECKSUM_FIELD: &str = "couch_ledger_checksum";

/// Design documents earlier versions installed and this one does not: `init` deletes them
/// (only when they carry [`CHECKSUM_FIELD`], i.e. they are ours) and drift names them, because
/// CouchDB keeps indexing every design document's views on every write. `_design/accounts`
/// held the account views until they moved into `_design/transactions` as `account_*` (one
/// design document is one index pass per document written: ~40 % less indexing time than the
/// hot database's two, docs/bench/HISTORY.md).
const RETIRED: &[&str] = &["_design/accounts"];

/// What installing did to one design document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InstallStatus {
    /// It did not exist.
    Created,
    /// It was there with the same checksum; nothing was written.
    Unchanged,
    /// It was there with other content (an older version, or edited by hand) and was replaced.
    Updated,
    /// An earlier version's design document this one no longer has; it was deleted.
    Removed,
}

/// One design document's install outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Installed {
    /// `_design/<name>`.
    pub id: String,
    /// What happened.
    pub status: InstallStatus,
}

/// A design document built from the embedded files.
#[derive(Debug, Clone)]
pub struct DesignDoc {
    /// `_design/<name>`.
    pub id: String,
    /// The document body without `_id`, `_rev` or the checksum.
    pub body: Value,
    /// Hex SHA-256 of `body`'s canonical JSON.
    pub checksum: String,
}

/// The design documents this version of the library carries, sorted by id.
///
/// # Panics
///
/// If the embedded files do not have the documented layout (a build mistake, caught by tests).
pub fn design_docs() -> Vec<DesignDoc> {
    let mut docs: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for (path, content) in DESIGN_FILES {
        let parts: Vec<&str> = path.split('/').collect();
        let doc = docs.entry(parts[0].to_owned()).or_insert_with(|| {
            let mut m = Map::new();
            m.insert("language".into(), json!("javascript"));
            m
        });
        match parts.as_slice() {
            [_, "validate_doc_update.js"] => {
                doc.insert("validate_doc_update".into(), json!(content.trim()));
            }
            [_, "views", view, file @ ("map.js" | "reduce")] => {
                let views = doc
                    .entry("views")
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .expect("views is an object");
                let entry = views
                    .entry(view.to_string())
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .expect("view is an object");
                let key = if *file == "map.js" { "map" } else { "reduce" };
                let text = content.trim();
                if key == "reduce" {
                    assert!(
                        text.starts_with('_'),
                        "{path}: only built-in reducers (_sum, _count, _stats) are allowed"
                    );
                }
                entry.insert(key.into(), json!(text));
            }
            _ => panic!("design_docs/{path}: unexpected file"),
        }
    }
    docs.into_iter()
        .map(|(name, body)| {
            let body = Value::Object(body);
            let checksum = checksum(&body);
            DesignDoc {
                id: format!("_design/{name}"),
                body,
                checksum,
            }
        })
        .collect()
}

fn checksum(body: &Value) -> String {
    // serde_json's map is ordered by key, so this text is canonical.
    let text = serde_json::to_string(body).expect("serializable");
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Which database a set of design documents is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The ledger's database: every design document, the validation among them.
    Ledger,
    /// The database of accounts and transfers of a split ledger
    /// ([`LedgerBuilder::hot_database`](crate::LedgerBuilder::hot_database)): their views only, and
    /// no `validate_doc_update` — that is the point of it.
    Hot,
}

impl Scope {
    fn includes(self, doc: &DesignDoc) -> bool {
        match self {
            Scope::Ledger => true,
            Scope::Hot => doc.id == "_design/transactions",
        }
    }

    /// The design documents of this scope, sorted by id.
    pub fn design_docs(self) -> Vec<DesignDoc> {
        design_docs()
            .into_iter()
            .filter(|d| self.includes(d))
            .collect()
    }
}

/// Installs every design document, writing only those whose checksum differs.
///
/// # Errors
///
/// The server refused (design documents need admin rights on CouchDB) or failed.
pub async fn install(client: &Client) -> Result<Vec<Installed>> {
    install_in(client, Scope::Ledger).await
}

/// Installs the design documents of `scope`, writing only those whose checksum differs.
///
/// # Errors
///
/// As [`install`].
pub async fn install_in(client: &Client, scope: Scope) -> Result<Vec<Installed>> {
    let mut out = Vec::new();
    for doc in scope.design_docs() {
        out.push(install_one(client, &doc).await?);
    }
    for id in RETIRED {
        if remove_retired(client, id).await? {
            out.push(Installed {
                id: (*id).to_owned(),
                status: InstallStatus::Removed,
            });
        }
    }
    Ok(out)
}

/// Deletes the retired design document `id` if it is ours (it carries our checksum field; a
/// design document of that name someone else wrote is left alone). Whether it deleted it.
async fn remove_retired(client: &Client, id: &str) -> Result<bool> {
    // Two installers may race; a conflict is read again. Bounded.
    for _ in 0..5 {
        let Some(current) = client.get_opt::<Value>(id).await? else {
            return Ok(false);
        };
        if current.get(CHECKSUM_FIELD).is_none() {
            return Ok(false);
        }
        let rev = current
            .get("_rev")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::decode(format!("{id} has no _rev")))?;
        match client.delete(id, rev).await {
            Ok(_) => {
                tracing::info!(%id, "retired design document removed");
                return Ok(true);
            }
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::invariant(format!(
        "{id}: kept conflicting with another installer"
    )))
}

async fn install_one(client: &Client, doc: &DesignDoc) -> Result<Installed> {
    // Two installers may race; the loser re-reads and judges again. Bounded.
    for _ in 0..5 {
        let existing: Option<Value> = client.get_opt(&doc.id).await?;
        let mut body = doc.body.clone();
        let obj = body.as_object_mut().expect("design doc is an object");
        obj.insert(CHECKSUM_FIELD.into(), json!(doc.checksum));
        let status = match &existing {
            None => InstallStatus::Created,
            Some(current) => {
                if current.get(CHECKSUM_FIELD).and_then(Value::as_str) == Some(&doc.checksum)
                    && stored_matches(current, &doc.body)
                {
                    return Ok(Installed {
                        id: doc.id.clone(),
                        status: InstallStatus::Unchanged,
                    });
                }
                let rev = current
                    .get("_rev")
                    .cloned()
                    .ok_or_else(|| Error::decode(format!("{} has no _rev", doc.id)))?;
                obj.insert("_rev".into(), rev);
                InstallStatus::Updated
            }
        };
        match client.put(&doc.id, &body).await {
            Ok(_) => {
                tracing::info!(id = %doc.id, ?status, "design document installed");
                return Ok(Installed {
                    id: doc.id.clone(),
                    status,
                });
            }
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::invariant(format!(
        "{}: kept conflicting with another installer",
        doc.id
    )))
}

/// The design documents that are missing or differ from this version's, each with what is
/// wrong, in one request. Without `_design/validation` the server no longer keeps history
/// write-once (an admin can delete it; CouchDB allows that), so the auditor reports this.
/// Every field this version installs is compared; fields someone added beside them are not
/// judged (an added `validate_doc_update` can only refuse more, never let more through).
///
/// # Errors
///
/// The server failed.
pub async fn drift(client: &Client) -> Result<Vec<(String, String)>> {
    drift_in(client, Scope::Ledger).await
}

/// [`drift`] for the design documents of `scope`.
///
/// # Errors
///
/// The server failed.
pub async fn drift_in(client: &Client, scope: Scope) -> Result<Vec<(String, String)>> {
    let docs = scope.design_docs();
    let ids: Vec<String> = docs.iter().map(|d| d.id.clone()).collect();
    let rows = client.all_docs(&ids, true).await?;
    let mut out = Vec::new();
    for (doc, row) in docs.iter().zip(rows) {
        let problem = match row.doc.filter(Value::is_object) {
            None => "is missing (run init)",
            Some(current) => {
                if current.get(CHECKSUM_FIELD).and_then(Value::as_str) == Some(&doc.checksum)
                    && stored_matches(&current, &doc.body)
                {
                    continue;
                }
                "differs from this version's (run init)"
            }
        };
        out.push((doc.id.clone(), format!("{} {problem}", doc.id)));
    }
    let retired: Vec<String> = RETIRED.iter().map(|id| (*id).to_owned()).collect();
    for (id, row) in retired.iter().zip(client.all_docs(&retired, true).await?) {
        if row
            .doc
            .as_ref()
            .is_some_and(|d| d.get(CHECKSUM_FIELD).is_some())
        {
            out.push((
                id.clone(),
                format!("{id} is an earlier version's, indexed for nothing (run init)"),
            ));
        }
    }
    Ok(out)
}

/// The stored document really holds our content (not a hand edit that kept the checksum
/// field): drift is repaired, not hidden.
fn stored_matches(current: &Value, body: &Value) -> bool {
    let Some(current) = current.as_object() else {
        return false;
    };
    body.as_object()
        .expect("design doc is an object")
        .iter()
        .all(|(k, v)| current.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_docs_have_the_views_of_the_spec() {
        let docs = design_docs();
        let ids: Vec<&str> = docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "_design/orders",
                "_design/transactions",
                "_design/validation"
            ]
        );
        assert!(RETIRED.iter().all(|r| !ids.contains(r)));
        let views = |i: usize| {
            docs[i].body["views"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(views(0), ["by_account", "ledger"]);
        assert_eq!(
            views(1),
            [
                "account_balances",
                "account_history",
                "account_overdrawn",
                "account_pending",
                "by_account",
                "by_meta",
                "by_state",
                "committed",
                "conflicts",
                "in_flight",
                "pending"
            ]
        );
        let reduce = |view: &str| docs[1].body["views"][view]["reduce"].clone();
        assert_eq!(reduce("account_overdrawn"), "_count");
        assert_eq!(reduce("account_pending"), "_count");
        assert_eq!(reduce("account_balances"), "_sum");
        assert_eq!(reduce("account_history"), "_sum");
        assert_eq!(reduce("conflicts"), "_count");
        assert_eq!(reduce("in_flight"), "_sum");
        assert_eq!(reduce("by_state"), "_count");
        assert_eq!(reduce("by_meta"), Value::Null, "a map without reduce");
        assert!(docs[2].body["validate_doc_update"]
            .as_str()
            .unwrap()
            .starts_with("function"));
        assert_eq!(docs[1].checksum.len(), 64);
        assert_ne!(docs[0].checksum, docs[1].checksum);
        let hot: Vec<String> = Scope::Hot.design_docs().into_iter().map(|d| d.id).collect();
        assert_eq!(hot, ["_design/transactions"], "one index pass per document");
    }
}
