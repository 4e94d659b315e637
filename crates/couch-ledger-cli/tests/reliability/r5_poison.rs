//! R5, poison: documents the design documents' validation would refuse, written before them,
//! beside good work. The sweeper reports and skips them and finishes the good transfers; no
//! poison document is changed; the auditor names every one of them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use couch_ledger::{Client, Ledger, State, SweepOptions, VerifyOptions};

use crate::shared::{
    create_accounts, eur, fresh_ledger, raw_accounts, raw_docs, raw_transfers, reachable, req,
    Acct, Book, Tally, Terms,
};
use crate::support;

/// Poison documents: a transfer in a state that does not exist, with a value that is not a
/// number, without terms, with a value beyond 2^53, of another type; an account whose balance
/// is not a number.
fn poison_docs() -> [(&'static str, Value); 6] {
    [
        (
            "txn:p-state",
            json!({"type": "transaction", "txn_id": "p-state", "state": "paused", "last_modified": 1}),
        ),
        (
            "txn:p-value",
            json!({"type": "transaction", "txn_id": "p-value", "state": "pending", "source": "A", "destination": "B", "value": "ten", "currency": "EUR", "created_at": 1, "last_modified": 1}),
        ),
        (
            "txn:p-terms",
            json!({"type": "transaction", "txn_id": "p-terms", "state": "committed", "currency": "EUR", "value": 5, "created_at": 1, "last_modified": 1}),
        ),
        (
            "txn:p-huge",
            json!({"type": "transaction", "txn_id": "p-huge", "state": "pending", "source": "A", "destination": "B", "value": 1e20, "currency": "EUR", "created_at": 1, "last_modified": 1}),
        ),
        (
            "txn:p-type",
            json!({"type": "transfer", "txn_id": "p-type", "state": "pending", "last_modified": 1}),
        ),
        (
            "account:P",
            json!({"type": "account", "account_id": "P", "currency": "EUR", "opening": 0, "balance": "lots", "pending": [], "settled": []}),
        ),
    ]
}

/// Every document's revision, by id.
fn revs(docs: Vec<Value>) -> HashMap<String, String> {
    docs.into_iter()
        .map(|d| {
            (
                d["_id"].as_str().unwrap().to_owned(),
                d["_rev"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The revisions of the poison account and of every transfer document in `db`.
async fn poison_revisions(db: &str) -> HashMap<String, String> {
    revs(raw_docs(db, "account:P", "account:P").await)
        .into_iter()
        .chain(revs(raw_transfers(db).await))
        .collect()
}

/// Poison documents, written before the design documents (whose validation would refuse
/// them), next to good work: the sweeper reports and skips them, finishes the good transfers,
/// never changes a poison document, and the auditor names every one of them.
pub async fn r5_poison(tally: Arc<Tally>) {
    let l = Ledger::new(support::builder("r5_poison").build().unwrap());
    let c = l.client().clone();
    let db = c.database().to_owned();
    let poison = poison_docs();
    plant(&l, &poison).await;
    let poison_revs = poison_revisions(&db).await;
    let book = Book::default();
    let lease = Duration::from_millis(500);
    good_work(&l, &fresh_ledger(&c, lease), &book, &tally).await;
    sweep_beside_poison(&fresh_ledger(&c, lease), &db, &tally).await;
    refused_for_business(&l, &tally).await;
    // Poison untouched.
    let after: HashMap<String, String> = poison_revisions(&db)
        .await
        .into_iter()
        .filter(|(id, _)| poison_revs.contains_key(id))
        .collect();
    if after != poison_revs {
        tally.violation(format!(
            "r5: a poison document was changed: {poison_revs:?} → {after:?}"
        ));
    }
    audit_names_poison(&l, &poison, &tally).await;
    good_accounts(&db, &tally).await;
    let acked = book.acked.lock().unwrap().clone();
    for (id, acks) in &acked {
        let fin = l.transfer(id).await.unwrap().state;
        if acks.iter().any(|a| !reachable(*a, fin)) {
            tally.violation(format!("r5: {id} acknowledged {acks:?}, now {fin}"));
        }
    }
    tally
        .bad_inputs
        .fetch_add(poison.len() as u64 + 1, Ordering::Relaxed);
    let n = raw_transfers(&db).await.len() as u64 - 5;
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    eprintln!(
        "r5: {} poison documents (+ a deleted account) reported and skipped, left untouched, named by the audit; {n} good transfers finished beside them",
        poison.len()
    );
}

/// Writes the poison documents and an account that existed and was deleted into a fresh
/// database, then installs the design documents.
async fn plant(l: &Ledger, poison: &[(&str, Value)]) {
    let c: &Client = l.client();
    c.ensure_database().await.unwrap();
    for (id, doc) in poison {
        c.put(id, doc).await.unwrap();
    }

    // An account that existed and was deleted.
    let w = c.put("account:gone", &json!({"type": "account", "account_id": "gone", "currency": "EUR", "opening": 0, "balance": 0, "min_balance": 0, "pending": [], "settled": []})).await.unwrap();
    c.delete("account:gone", &w.rev).await.unwrap();
    l.init().await.unwrap();
}

/// Good work, half of it left for the sweeper; one transfer to the deleted account, one to the
/// unreadable one (cancelled, unreadable_account: a business refusal).
async fn good_work(l: &Ledger, worker: &Ledger, book: &Book, tally: &Tally) {
    let accounts = [
        Acct {
            id: "A".into(),
            currency: eur(),
            opening: 10_000,
            min: Some(0),
        },
        Acct {
            id: "B".into(),
            currency: eur(),
            opening: 10_000,
            min: Some(0),
        },
        Acct {
            id: "C".into(),
            currency: eur(),
            opening: 10_000,
            min: Some(0),
        },
    ];
    create_accounts(l, &accounts).await;
    for i in 0..40 {
        let (from, to) = if i % 2 == 0 { ("A", "B") } else { ("B", "A") };
        let id = format!("good-{i}");
        let terms = Terms::eur(from, to, 10 + i);
        book.ask(&id, terms.clone());
        match worker.submit(terms.request(&id), i % 4 < 2).await {
            Ok(o) => book.ack(&o),
            Err(e) => tally.violation(format!("r5: good transfer {id} failed: {e}")),
        }
    }
    let gone = worker
        .submit(req("to-gone", "A", "gone", 7), false)
        .await
        .unwrap();
    book.ack(&gone);
    book.ask("to-gone", Terms::eur("A", "gone", 7));
    worker
        .submit(req("to-poison", "C", "P", 9), false)
        .await
        .unwrap();
}

/// Sweeps until every good transfer is finished; the poison stays open and is reported.
async fn sweep_beside_poison(sweeper: &Ledger, db: &str, tally: &Tally) {
    let mut reported: HashSet<&str> = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // (txn:p-type is not of type transaction: no view maps it, so the sweeper never sees it;
    // the auditor names it.)
    let names = ["p-value", "p-terms", "p-huge", "paused"];
    loop {
        match sweeper
            .sweep_once(SweepOptions {
                limit: 100,
                stale_after: Duration::ZERO,
            })
            .await
        {
            Ok(o) => {
                for p in &o.problems {
                    for n in names {
                        if p.contains(n) {
                            reported.insert(n);
                        }
                    }
                }
            }
            Err(e) => tally.violation(format!("r5: a sweep pass stopped on poison: {e}")),
        }
        let all: Vec<Value> = raw_transfers(db).await;
        let good_open = all
            .iter()
            .filter(|t| {
                let id = t["_id"].as_str().unwrap_or("");
                (id.starts_with("txn:good-") || id == "txn:to-gone" || id == "txn:to-poison")
                    && !matches!(t["state"].as_str(), Some("done" | "cancelled"))
            })
            .count();
        if good_open == 0 && reported.len() == names.len() {
            break;
        }
        if Instant::now() > deadline {
            tally.violation(format!("r5: good work not finished next to poison ({good_open} open), or poison not reported (reported: {reported:?})"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A transfer to the deleted account and one to the unreadable one end cancelled, for the
/// business reason each deserves.
async fn refused_for_business(l: &Ledger, tally: &Tally) {
    let gone = l.transfer("to-gone").await.unwrap();
    if (gone.state, gone.reason.as_deref()) != (State::Cancelled, Some("unknown_account")) {
        tally.violation(format!(
            "r5: a transfer to a deleted account came to {gone:?}"
        ));
    }
    let odd = l.transfer("to-poison").await.unwrap();
    if (odd.state, odd.reason.as_deref()) != (State::Cancelled, Some("unreadable_account")) {
        tally.violation(format!(
            "r5: a transfer to an unreadable account came to {odd:?}"
        ));
    }
}

/// The auditor names every poison document, and no good transfer.
async fn audit_names_poison(l: &Ledger, poison: &[(&str, Value)], tally: &Tally) {
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    let named: HashSet<String> = report
        .checks
        .iter()
        .filter(|c| !c.ok)
        .flat_map(|c| c.documents.clone())
        .collect();
    for (id, _) in poison {
        if !named.contains(*id) {
            tally.violation(format!(
                "r5: the audit does not name poison document {id}: {report:#?}"
            ));
        }
    }
    for id in &named {
        if id.starts_with("txn:good-") || id == "txn:to-gone" || id == "txn:to-poison" {
            tally.violation(format!(
                "r5: the audit names good transfer {id}: {report:#?}"
            ));
        }
    }
}

/// Good accounts: every cent where it belongs.
async fn good_accounts(db: &str, tally: &Tally) {
    let mut moved: HashMap<String, i64> = HashMap::new();
    for t in raw_transfers(db).await {
        if t["_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("txn:good-"))
            && t["state"] == "done"
        {
            let v = t["value"].as_i64().unwrap();
            *moved
                .entry(t["source"].as_str().unwrap().to_owned())
                .or_default() -= v;
            *moved
                .entry(t["destination"].as_str().unwrap().to_owned())
                .or_default() += v;
        }
    }
    for a in raw_accounts(db).await {
        let id = a["account_id"].as_str().unwrap_or("");
        let expected = match id {
            "A" | "B" => 10_000 + moved.get(id).copied().unwrap_or(0),
            // The transfer to the unreadable account was cancelled, its debit undone.
            "C" => 10_000,
            _ => continue,
        };
        if a["balance"].as_i64() != Some(expected) {
            tally.violation(format!(
                "r5: account:{id} balance {} ≠ {expected}",
                a["balance"]
            ));
        }
    }
}
