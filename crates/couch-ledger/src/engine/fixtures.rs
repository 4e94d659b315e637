//! What the engine's unit tests share: ops to queue, and engines on a mock server.

use std::sync::Arc;

use serde_json::{json, Value};

use super::account::AccountEngine;
use super::bulk::BulkWriter;
use super::ops::{AccountOp, OpKind};
use super::quorum::{ConflictTally, Entries, Quorum, WriteQuorum};
use crate::account_doc::Attempt;
use crate::couch::Client;
use crate::money::Amount;

pub(super) fn apply(txn: &str, delta: i64, check: bool, link: Option<u64>) -> AccountOp {
    AccountOp {
        account: "a".into(),
        txn: txn.into(),
        kind: OpKind::Apply {
            delta: Amount::new(delta).unwrap(),
            currency: "EUR".into(),
            check_funds: check,
            deadline: None,
            attempt: None,
            peer: None,
        },
        link,
    }
}

/// A one-write apply of `txn` by attempt `a`, `peer` the other account.
pub(super) fn once(txn: &str, delta: i64, a: u64, peer: &str) -> AccountOp {
    let mut op = apply(txn, delta, delta < 0, None);
    if let OpKind::Apply {
        attempt,
        peer: other,
        ..
    } = &mut op.kind
    {
        *attempt = Some(Attempt::from_bits(a));
        *other = Some(peer.into());
    }
    op
}

pub(super) fn settle(delta: i64) -> OpKind {
    OpKind::Settle {
        named: None,
        delta: Amount::new(delta).unwrap(),
    }
}

pub(super) fn op(txn: &str, kind: OpKind) -> AccountOp {
    AccountOp {
        account: "a".into(),
        txn: txn.into(),
        kind,
        link: None,
    }
}

pub(super) fn client_on(uri: &str) -> Client {
    Client::builder().url(uri).database("db").build().unwrap()
}

pub(super) fn engine_on(uri: &str) -> Arc<AccountEngine> {
    engine_writing(uri, WriteQuorum::default())
}

/// An engine whose account writes go at `quorum`.
pub(super) fn engine_writing(uri: &str, quorum: WriteQuorum) -> Arc<AccountEngine> {
    let bulk = Arc::new(BulkWriter::new(client_on(uri)));
    Arc::new(AccountEngine::new(
        bulk,
        Arc::new(Quorum::new(quorum, Entries::default())),
        Arc::new(ConflictTally::default()),
    ))
}

// ---- a server for one request a round ------------------------------------------------------

/// `_bulk_docs` answered with each document `ok` and a revision of its own; `_all_docs`
/// with each account asked for (balance 1,000; account `a` when no keys are given).
struct Server;

impl wiremock::Respond for Server {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        if request.url.path().ends_with("_all_docs") {
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            let keys: Vec<String> = match body["keys"].as_array() {
                Some(keys) => keys
                    .iter()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect(),
                None => vec!["account:a".into()],
            };
            let rows: Vec<Value> = keys
                .iter()
                .map(|id| {
                    let account = id.trim_start_matches("account:");
                    json!({
                        "id": id, "key": id, "value": {"rev": "1-x"},
                        "doc": {
                            "_id": id, "_rev": "1-x", "type": "account",
                            "account_id": account, "currency": "EUR", "opening": 1000,
                            "balance": 1000, "min_balance": 0, "pending": [], "settled": []
                        }
                    })
                })
                .collect();
            return wiremock::ResponseTemplate::new(200)
                .set_body_json(json!({"total_rows": rows.len(), "offset": 0, "rows": rows}));
        }
        bulk_ok(request, "2-y")
    }
}

/// A `_bulk_docs` answer with each document `ok` at revision `rev`.
pub(super) fn bulk_ok(request: &wiremock::Request, rev: &str) -> wiremock::ResponseTemplate {
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    let results: Vec<Value> = body["docs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| json!({"ok": true, "id": d["_id"], "rev": rev}))
        .collect();
    wiremock::ResponseTemplate::new(201).set_body_json(results)
}

/// The ids in each `_bulk_docs` request `server` received, in order.
pub(super) async fn bulk_ids(server: &wiremock::MockServer) -> Vec<Vec<String>> {
    bulk_docs_sent(server)
        .await
        .into_iter()
        .map(|docs| {
            docs.iter()
                .map(|d| d["_id"].as_str().unwrap().to_owned())
                .collect()
        })
        .collect()
}

/// The documents of each `_bulk_docs` request `server` received, in order.
pub(super) async fn bulk_docs_sent(server: &wiremock::MockServer) -> Vec<Vec<Value>> {
    server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.path().ends_with("_bulk_docs"))
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            body["docs"].as_array().cloned().unwrap_or_default()
        })
        .collect()
}

/// A server answering as [`Server`] does, and an engine on it.
pub(super) async fn one_request_server() -> (wiremock::MockServer, Arc<AccountEngine>) {
    use wiremock::matchers::{method, path_regex};
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(method("GET"))
        .and(path_regex("/db$"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!({})))
        .mount(&server)
        .await;
    wiremock::Mock::given(method("POST"))
        .respond_with(Server)
        .mount(&server)
        .await;
    let engine = engine_on(&server.uri());
    (server, engine)
}
