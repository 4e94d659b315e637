//! The one-write path (docs/ONE_WRITE.md) against the real server: a transfer submitted with
//! `wait = true` applies both accounts with pending markers `{txn, delta, at, attempt, peer}`,
//! then creates `txn:{id}` once, directly `done` (naming the attempt of the marker on each
//! account) or `cancelled`, then converges the markers (settled when named, undone otherwise).
//! A marker's and an entry's `txn` is the transfer's entry key, `{id}~{digest of its terms}`:
//! the same id sent with other terms is another key, whose markers sit beside the first's.
//!
//! What is checked here:
//! - one document write per transfer document, five documents a lone transfer, fewer when the
//!   settles fold (background finish);
//! - idempotency: the same id again (settled entries present, pruned, or never written) answers
//!   the existing outcome and moves nothing; many concurrent submits of one id apply it once;
//!   the same id with other terms is one transfer and a mismatch;
//! - business refusals decide `cancelled` by the same single create;
//! - a worker stopped after its apply: the sweeper gives the transfer its document only once the
//!   lease passed (`initial`, the terms from the markers) and drives it `done`, adopting the
//!   markers, every answer agreeing with that decision; before that, a retry adopts them and
//!   decides `done` and the stopped worker follows; two attempts under one id with other terms
//!   each land their own markers, the first to decide stands and the other is told a mismatch,
//!   its markers undone by the sweeper: what a caller was told did not happen never happens
//!   later;
//! - transfers left `initial` are finished by one CAS; a `cancel` racing the sweeper wins;
//! - the sweeper converges what a dead worker left after its decision: named markers settled
//!   (never undone), markers of attempts the decision does not name undone.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support;
use crate::support::assert_at_rest;
use crate::support::{balance, eur_transfer as request, open_account as open, writes_in};
use couch_ledger::testing::{entry_key, transfer_of};
use couch_ledger::{
    Amount, Ledger, RecordStatus, State, SweepOptions, SweepOutcome, TransferOutcome, VerifyOptions,
};

// ---- helpers ---------------------------------------------------------------------------------

fn now_sweep() -> SweepOptions {
    SweepOptions {
        limit: 100,
        stale_after: Duration::ZERO,
    }
}

async fn balances(l: &Ledger, ids: &[&str]) -> Vec<i64> {
    let mut out = Vec::new();
    for id in ids {
        out.push(balance(l, id).await);
    }
    out
}

async fn assert_no_marker(l: &Ledger, accounts: &[&str]) {
    for id in accounts {
        let a = l.account(id).await.unwrap();
        assert!(a.pending.is_empty(), "{id} still holds a marker: {a:?}");
    }
}

/// `txn:{id}` as stored, read raw.
async fn raw_txn(l: &Ledger, id: &str) -> Value {
    l.hot_client()
        .get::<Value>(&format!("txn:{id}"))
        .await
        .unwrap_or_else(|e| panic!("txn:{id}: {e}"))
}

/// The sum of the revision generations of `ids` (each written that many times), read through
/// the library's reads (the server's read quorum).
async fn generations(l: &Ledger, ids: &[&str]) -> u64 {
    let mut sum = 0;
    for id in ids {
        let doc: Value = l.hot_client().get(id).await.unwrap();
        let rev = doc["_rev"]
            .as_str()
            .unwrap_or_else(|| panic!("{id}: no _rev"));
        let generation = rev.split('-').next().and_then(|g| g.parse::<u64>().ok());
        sum += generation.unwrap_or_else(|| panic!("{id}: revision {rev} has no generation"));
    }
    sum
}

/// `account:{id}` as stored, read raw.
async fn raw_account(l: &Ledger, id: &str) -> Value {
    l.hot_client()
        .get::<Value>(&format!("account:{id}"))
        .await
        .unwrap_or_else(|e| panic!("account:{id}: {e}"))
}

/// The entry key (`{id}~{digest}`) of the markers and entries of `request(id, from, to, value)`
/// on its accounts: the terms' key the library computes, so a test reads and plants exactly
/// what the engine writes.
fn key(id: &str, from: &str, to: &str, value: i64) -> String {
    let key = entry_key(id, from, to, Amount::new(value).unwrap(), "EUR", None);
    assert_eq!(transfer_of(&key), id, "{key}");
    key
}

/// The raw pending markers of account `id` under entry key `key`.
async fn raw_markers(l: &Ledger, id: &str, key: &str) -> Vec<Value> {
    raw_account(l, id).await["pending"]
        .as_array()
        .expect("pending is a list")
        .iter()
        .filter(|m| m["txn"] == key)
        .cloned()
        .collect()
}

/// An attempt token: 12 lower-case hex digits.
fn is_attempt(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| s.len() == 12 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

fn rev_generation(doc: &Value) -> u64 {
    let rev = doc["_rev"].as_str().expect("a _rev");
    rev.split('-')
        .next()
        .unwrap()
        .parse()
        .expect("a generation")
}

/// Asserts a one-write `done` document: created once (`1-`) unless `generation` says otherwise,
/// both markers named; returns `(source attempt, destination attempt)`.
fn assert_done_once(doc: &Value, generation: u64) -> (String, String) {
    assert_eq!(doc["state"], "done", "{doc:#}");
    // On a server of several copies, a later caller told the decision seals it first: a
    // child of the same body (docs/CLUSTER.md, "Telling a decision on a cluster"). Only an
    // external server (`COUCHDB_URL`) can be one; the harness's cannot.
    let sealed = std::env::var("COUCHDB_URL").is_ok();
    assert!(
        rev_generation(doc) == generation || (sealed && rev_generation(doc) > generation),
        "generation {generation} expected: {doc:#}"
    );
    assert!(
        doc["claim"].is_null(),
        "a decided transfer holds no claim: {doc:#}"
    );
    let (s, d) = (&doc["markers"]["source"], &doc["markers"]["destination"]);
    assert!(is_attempt(s) && is_attempt(d), "markers not named: {doc:#}");
    (
        s.as_str().unwrap().to_owned(),
        d.as_str().unwrap().to_owned(),
    )
}

/// `(state, status, reason)` of an answer, for one assertion.
fn answer(o: &TransferOutcome) -> (State, RecordStatus, Option<&str>) {
    (o.state, o.status, o.reason.as_deref())
}

/// Wall-clock ms, as markers carry them.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A worker's lease short enough for a test to wait past, long enough for both applies to land
/// within it: on a loaded cluster, where each write goes to every copy, 300 ms ran out first
/// ("no worker reached the decide gate").
async fn short_lease(l: &Ledger) -> Duration {
    let several = support::copies(l.hot_client().database()).await > 1;
    Duration::from_millis(if several { 3_000 } else { 300 })
}

/// Waits (polling, bounded) until `since` is at least `d` ago.
async fn wait_past(what: &str, since: Instant, d: Duration) {
    support::wait_for(what, d + Duration::from_secs(10), || async {
        (since.elapsed() > d).then_some(())
    })
    .await;
}

/// Waits for a gate to be reached, bounded.
async fn reached(g: &support::Gate) {
    tokio::time::timeout(Duration::from_secs(20), g.reached.notified())
        .await
        .unwrap_or_else(|_| panic!("no worker reached the {:?} gate", g.phase));
}

// ---- 1. one write of the document ------------------------------------------------------------

// A lone transfer: document written once (`1-`, done, markers named), 5 documents, no marker.
#[tokio::test]
async fn a_transfer_is_decided_by_one_write_of_its_document() {
    let l = support::ledger("ow_one_write").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let db = l.hot_client().database().to_owned();
    // On one copy the whole database is counted, so a stray write anywhere shows. On several,
    // `_all_docs` reads one copy of each shard, which may not have the accounts' last revision
    // yet (a count one too high, measured on CouchDB 3.4.3): the transfer's own documents are
    // counted instead, each read at the read quorum, which overlaps every write quorum.
    let several = support::copies(&db).await > 1;
    let before = if several {
        generations(&l, &["account:A", "account:B"]).await
    } else {
        writes_in(&db).await
    };

    let o = l.submit(request("t1", "A", "B", 100), true).await.unwrap();
    assert_eq!(answer(&o), (State::Done, RecordStatus::Created, None));
    assert_eq!(o.id, "t1");
    let after = if several {
        generations(&l, &["account:A", "account:B", "txn:t1"]).await
    } else {
        writes_in(&db).await
    };
    assert_eq!(
        after - before,
        5,
        "a lone transfer writes 2 applies, 1 create and 2 settles"
    );

    let doc = raw_txn(&l, "t1").await;
    let (s, d) = assert_done_once(&doc, 1);
    assert_eq!(s, d, "one attempt applied both accounts");
    assert_eq!(
        (
            &doc["source"],
            &doc["destination"],
            &doc["value"],
            &doc["currency"]
        ),
        (&json!("A"), &json!("B"), &json!(100), &json!("EUR"))
    );
    let view = l.transfer("t1").await.unwrap();
    assert_eq!((view.state, view.amount.minor()), (State::Done, 100));
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);
    let a = l.account("A").await.unwrap();
    assert_eq!((a.available.minor(), a.posted.minor()), (900, 900));
    assert_at_rest(&l).await;
}

// Background finish: the settles fold into the next transfer's writes (< 5 documents each).
#[tokio::test]
async fn background_finish_folds_the_settles_into_the_next_transfer() {
    let l = support::ledger_with("ow_fold", |b| b.background_finish(true)).await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let db = l.hot_client().database().to_owned();
    let before = writes_in(&db).await;

    let first = l.submit(request("f1", "A", "B", 100), true).await.unwrap();
    assert_eq!(answer(&first), (State::Done, RecordStatus::Created, None));
    assert!(l.finishing() >= 1, "the settles of f1 are not in flight");
    let second = l.submit(request("f2", "A", "B", 100), true).await.unwrap();
    assert_eq!(answer(&second), (State::Done, RecordStatus::Created, None));
    tokio::time::timeout(Duration::from_secs(30), l.flush())
        .await
        .expect("flush did not return within 30 s");
    assert_eq!(l.finishing(), 0);

    let written = writes_in(&db).await - before;
    let folded = l.settles_folded();
    assert!(folded >= 1, "no settle went out with another write");
    assert!(
        written < 2 * 5,
        "{written} documents for 2 transfers: the settles did not fold"
    );
    assert!(
        written <= 2 * 5 - folded,
        "{written} documents, {folded} settles folded: a folded settle wrote on its own"
    );
    for id in ["f1", "f2"] {
        assert_done_once(&raw_txn(&l, id).await, 1);
    }
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, [800, 200]);
    assert_at_rest(&l).await;
}

// ---- 2.–3. the same id again -----------------------------------------------------------------

// The same id again answers the decision (`Exists`), writes nothing, moves nothing.
#[tokio::test]
async fn the_same_id_again_answers_the_decision_and_writes_nothing() {
    // With settled entries (a cluster's; on one copy a retry from a worker that does not know
    // the transfer ended writes markers and undoes them: the test below this one's next).
    let l = support::ledger_with("ow_again", |b| b.settled_entries()).await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let first = l.submit(request("k", "A", "B", 300), true).await.unwrap();
    assert_eq!(answer(&first), (State::Done, RecordStatus::Created, None));
    let db = l.hot_client().database().to_owned();
    let snapshot = support::db_snapshot(&db).await;

    for _ in 0..2 {
        let again = l.submit(request("k", "A", "B", 300), true).await.unwrap();
        assert_eq!(answer(&again), (State::Done, RecordStatus::Exists, None));
    }
    // From another worker too (nothing shared in memory).
    let other = l.another_worker();
    let again = other
        .submit(request("k", "A", "B", 300), true)
        .await
        .unwrap();
    assert_eq!(answer(&again), (State::Done, RecordStatus::Exists, None));
    assert_eq!(
        support::db_snapshot(&db).await,
        snapshot,
        "a retry of a decided transfer wrote"
    );
    assert_done_once(&raw_txn(&l, "k").await, 1);
    assert_eq!(balances(&l, &["A", "B"]).await, [700, 300]);
    assert_no_marker(&l, &["A", "B"]).await;
    assert_at_rest(&l).await;
}

// A retry after the settled entries were pruned: its new markers are undone, nothing moves.
#[tokio::test]
async fn a_retry_after_the_settled_entries_were_pruned_moves_nothing() {
    let l = support::ledger_with("ow_pruned", |b| b.settled_entries()).await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let first = l.submit(request("p", "A", "B", 250), true).await.unwrap();
    assert_eq!(answer(&first), (State::Done, RecordStatus::Created, None));
    let named = assert_done_once(&raw_txn(&l, "p").await, 1);
    let p = key("p", "A", "B", 250);
    // Plant: the settled entries pruned from both accounts.
    for id in ["A", "B"] {
        let mut doc = raw_account(&l, id).await;
        assert!(
            support::settled_entries(&doc).iter().any(|(t, _)| *t == p),
            "{id} has no settled entry for p: {doc:#}"
        );
        doc["settled"] = json!([]);
        l.hot_client()
            .put(&format!("account:{id}"), &doc)
            .await
            .unwrap();
    }

    let again = l.submit(request("p", "A", "B", 250), true).await.unwrap();
    assert_eq!(answer(&again), (State::Done, RecordStatus::Exists, None));
    assert_eq!(
        assert_done_once(&raw_txn(&l, "p").await, 1),
        named,
        "the decision changed"
    );
    assert_eq!(balances(&l, &["A", "B"]).await, [750, 250], "applied twice");
    assert_no_marker(&l, &["A", "B"]).await;
    assert_at_rest(&l).await;
}

// On one copy (no settled entries ever): every retry's markers are undone, nothing moves.
#[tokio::test]
async fn a_retry_on_one_copy_without_any_entry_moves_nothing() {
    let l = support::ledger_with("ow_one_copy", |b| b.one_copy()).await;
    if support::keeps_several_copies(l.hot_client().database()).await {
        return;
    }
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let first = l.submit(request("c", "A", "B", 400), true).await.unwrap();
    assert_eq!(answer(&first), (State::Done, RecordStatus::Created, None));
    for id in ["A", "B"] {
        let doc = raw_account(&l, id).await;
        assert!(
            support::settled_entries(&doc).is_empty(),
            "one copy: {id} keeps a settled entry: {doc:#}"
        );
    }
    let named = assert_done_once(&raw_txn(&l, "c").await, 1);

    for round in 0..2 {
        let again = l.submit(request("c", "A", "B", 400), true).await.unwrap();
        assert_eq!(
            answer(&again),
            (State::Done, RecordStatus::Exists, None),
            "retry {round}"
        );
        assert_eq!(
            balances(&l, &["A", "B"]).await,
            [600, 400],
            "retry {round} moved money"
        );
        assert_no_marker(&l, &["A", "B"]).await;
    }
    let other = l.another_worker();
    let again = other
        .submit(request("c", "A", "B", 400), true)
        .await
        .unwrap();
    assert_eq!(answer(&again), (State::Done, RecordStatus::Exists, None));
    assert_eq!(assert_done_once(&raw_txn(&l, "c").await, 1), named);
    assert_eq!(balances(&l, &["A", "B"]).await, [600, 400]);
    assert_no_marker(&l, &["A", "B"]).await;
    assert_at_rest(&l).await;
}

// On one copy an account conflict is reported and never merged: a planted branch that still
// holds the counted marker of a transfer the winner settled without an entry looks, to any
// merge, like a branch that applied it where the winner never did. Both leaves stay as they
// are, the account's ops fail with the reason, the sweeper and `verify` report it, and once a
// person removed the wrong leaf the ledger goes on. Both ways CouchDB can pick the winner.
#[tokio::test]
async fn an_account_conflict_on_one_copy_is_reported_never_merged() {
    for (planted, hash) in [("wins", "f"), ("loses", "0")] {
        let name = format!("ow_one_copy_conflict_{planted}");
        let l = support::ledger_with(&name, |b| b.one_copy()).await;
        if support::keeps_several_copies(l.hot_client().database()).await {
            return;
        }
        let db = l.hot_client().database().to_owned();
        open(&l, "A", 1_000).await;
        open(&l, "B", 0).await;
        let first = l.submit(request("c", "A", "B", 400), true).await.unwrap();
        assert_eq!(answer(&first), (State::Done, RecordStatus::Created, None));
        let (named_a, _) = assert_done_once(&raw_txn(&l, "c").await, 1);
        let settled = raw_account(&l, "A").await;
        assert_eq!(settled["balance"], json!(600));
        assert!(support::settled_entries(&settled).is_empty(), "{settled:#}");
        // A branch of A that applied c and never settled it: the same balance, c pending.
        let c = key("c", "A", "B", 400);
        let branch = support::plant_sibling(&db, "account:A", &hash.repeat(32), |doc| {
            doc["pending"] = json!([{
                "txn": c, "delta": -400, "at": now_ms(), "attempt": named_a, "peer": "B",
            }]);
        })
        .await;
        let leaves_of_a = || async {
            let mut leaves = support::live_leaves(&db, "account:A").await;
            leaves.sort_by_key(|d| d["_rev"].as_str().unwrap_or_default().to_owned());
            leaves
        };
        let leaves_before = leaves_of_a().await;
        assert_eq!(
            leaves_before.len(),
            2,
            "{planted}: the conflict was planted"
        );

        // A process that reads A (this one's engine still holds A's last revision, which it
        // would go on writing until its next read of A).
        let l = l.another_worker();
        let refused = l
            .submit(request("d", "A", "B", 100), true)
            .await
            .expect_err("a transfer on the conflicted account");
        assert!(refused.is_invariant(), "{planted}: {refused}");
        assert!(
            refused.to_string().contains("a person must resolve it"),
            "{planted}: {refused}"
        );
        let swept = l.sweep_once(now_sweep()).await.unwrap();
        assert!(swept.conflicts_unresolved >= 1, "{planted}: {swept:#?}");
        assert!(
            swept.problems.iter().any(|p| p.contains("account:A")),
            "{planted}: {swept:#?}"
        );
        let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
        assert!(!report.ok, "{planted}: verify passed a conflicted account");
        // Neither leaf of A was written: no merge, no guess.
        assert_eq!(
            leaves_of_a().await,
            leaves_before,
            "{planted}: the conflicted account was written"
        );

        // A person (an admin) deletes the wrong leaf, the planted one (the ledger settled c),
        // naming the revision kept, as the validation asks; d goes on.
        let kept = leaves_before
            .iter()
            .map(|d| d["_rev"].as_str().unwrap().to_owned())
            .find(|r| *r != branch)
            .unwrap();
        let url = support::raw_url(&format!("{db}/account%3AA?rev={branch}"));
        let deleted = support::auth(support::raw().put(url))
            .json(&json!({"_deleted": true, "merged_into": kept}))
            .send()
            .await
            .unwrap();
        assert!(deleted.status().is_success(), "{}", deleted.status());
        let again = l.submit(request("d", "A", "B", 100), true).await.unwrap();
        assert_eq!(again.state, State::Done, "{planted}");
        assert_eq!(balances(&l, &["A", "B"]).await, [500, 500], "{planted}");
        l.sweep_once(now_sweep()).await.unwrap();
        assert_no_marker(&l, &["A", "B"]).await;
        assert_at_rest(&l).await;
    }
}

// On one copy a transfer's conflict between the commit and the cancel path is reported, never
// resolved: the accounts' settled entries that would tell which path they followed are not
// kept there.
#[tokio::test]
async fn a_transfers_forked_conflict_on_one_copy_is_reported_never_resolved() {
    let l = support::ledger_with("ow_one_copy_fork", |b| b.one_copy()).await;
    if support::keeps_several_copies(l.hot_client().database()).await {
        return;
    }
    let db = l.hot_client().database().to_owned();
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    l.submit(request("c", "A", "B", 400), true).await.unwrap();
    support::plant_sibling(&db, "txn:c", &"0".repeat(32), |doc| {
        doc["state"] = json!("cancelled");
        doc["reason"] = json!("insufficient_funds");
        doc.as_object_mut().unwrap().remove("markers");
    })
    .await;
    let before = support::live_leaves(&db, "txn:c").await;
    assert_eq!(before.len(), 2, "the fork was planted");

    let e = l
        .another_worker()
        .transfer("c")
        .await
        .expect_err("a forked transfer read on one copy");
    assert!(e.is_invariant(), "{e}");
    assert!(e.to_string().contains("a person must decide"), "{e}");
    let swept = l.another_worker().sweep_once(now_sweep()).await.unwrap();
    assert!(swept.conflicts_unresolved >= 1, "{swept:#?}");
    assert_eq!(
        support::live_leaves(&db, "txn:c").await.len(),
        2,
        "a leaf of the forked transfer was deleted"
    );
    assert_eq!(balances(&l, &["A", "B"]).await, [600, 400]);
}

// A stepwise drive that adopts one-write markers settles them as the stepwise protocol does,
// leaving settled entries, also on one copy (found by a review): a stepwise worker
// begins t and dies; the client re-sends t to a one-write worker, whose create meets the
// `pending` document, so it drives t stepwise over its own markers (adopted), settles both,
// and dies before `done`. Without the entries the sweeper then read both settles as `Absent`
// (a copy behind) and left t `committed` for good, and a re-send applied new markers that the
// next pass settled too: 100 moved twice.
#[tokio::test]
async fn a_stepwise_drive_over_one_write_markers_moves_the_money_once_on_one_copy() {
    let lease = Duration::from_millis(800);
    let l = support::ledger_with("ow_stepwise_adopts", |b| b.one_copy().lease(lease)).await;
    if support::keeps_several_copies(l.hot_client().database()).await {
        return;
    }
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    // A stepwise worker writes t and begins it (pending, claimed), then stops.
    let first = l.to_builder().stepwise_transfers(true).build().unwrap();
    first
        .submit(request("t", "A", "B", 100), false)
        .await
        .unwrap();
    assert_eq!(first.step("t").await.unwrap().state, State::Pending);
    let begun = Instant::now();
    wait_past("the stepwise worker's lease", begun, lease).await;
    // The re-send, on the one-write path: it stops right before writing `done`.
    let (g, hook) = support::gate("done");
    let second = l.to_builder().pause_hook(hook).build().unwrap();
    let stopped =
        tokio::spawn(async move { second.submit(request("t", "A", "B", 100), true).await });
    reached(&g).await;
    stopped.abort();
    let _ = stopped.await;
    assert_eq!(l.transfer("t").await.unwrap().state, State::Committed);
    let t = key("t", "A", "B", 100);
    for id in ["A", "B"] {
        let doc = raw_account(&l, id).await;
        assert!(
            support::settled_entries(&doc)
                .iter()
                .any(|(k, undone)| *k == t && !undone),
            "the stepwise settle left no entry on {id}: {doc:#}"
        );
    }
    let settled = Instant::now();
    wait_past("the stopped worker's lease", settled, lease).await;
    let swept = l.another_worker().sweep_once(now_sweep()).await.unwrap();
    assert_eq!((swept.advanced, swept.failed), (1, 0), "{swept:#?}");
    // The client re-sends t once more: answered done, nothing moves.
    let again = l
        .another_worker()
        .submit(request("t", "A", "B", 100), true)
        .await
        .unwrap();
    assert_eq!(again.state, State::Done);
    l.another_worker().sweep_once(now_sweep()).await.unwrap();
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100], "moved twice");
    assert_no_marker(&l, &["A", "B"]).await;
    assert_at_rest(&l).await;
}

// ---- 4.–5. concurrent submits of one id ------------------------------------------------------

// Eight concurrent submits of one id on four workers: all answer done, money moves once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_submits_of_one_id_apply_it_once() {
    let l = support::ledger("ow_concurrent").await;
    let several = support::copies(l.hot_client().database()).await > 1;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let workers = [
        l.clone(),
        l.another_worker(),
        l.another_worker(),
        l.another_worker(),
    ];
    for round in 0..3 {
        let id = format!("same{round}");
        let mut tasks = Vec::new();
        for i in 0..8 {
            let w = workers[i % workers.len()].clone();
            let r = request(&id, "A", "B", 100);
            tasks.push(tokio::spawn(async move { w.submit(r, true).await }));
        }
        let mut created = 0;
        let mut unconfirmed = 0;
        for t in tasks {
            let o = match t.await.unwrap() {
                Ok(o) => o,
                // On a cluster the racing decisions can each reach only some copies (a
                // conflict of the transfer's document): nobody is told an outcome that could
                // still flip. Once swept, sending the id again tells how it ended.
                Err(e) if several && e.is_unconfirmed() => {
                    unconfirmed += 1;
                    continue;
                }
                Err(e) => panic!("{id}: {e}"),
            };
            assert_eq!((o.state, o.reason.as_deref()), (State::Done, None), "{id}");
            if o.status == RecordStatus::Created {
                created += 1;
            }
        }
        if unconfirmed > 0 {
            eprintln!("{id}: {unconfirmed} of 8 answered unconfirmed; sweeping, then asking again");
            support::sweep_until_none_open(&l, Duration::from_secs(120)).await;
            // The re-send seals the decision on every copy before it is told; a seal another
            // caller's write met on some copies is a 202, and a later send is told.
            let o = support::wait_for(
                "the re-sent id to be told",
                Duration::from_secs(60),
                || async {
                    match l.submit(request(&id, "A", "B", 100), true).await {
                        Err(e) if e.is_unconfirmed() => None,
                        told => Some(told.unwrap()),
                    }
                },
            )
            .await;
            assert_eq!((o.state, o.reason.as_deref()), (State::Done, None), "{id}");
        } else {
            assert!(created >= 1, "{id}: nobody answered Created");
        }
        assert_done_once(&raw_txn(&l, &id).await, 1);
        let n = i64::from(round) + 1;
        assert_eq!(
            balances(&l, &["A", "B"]).await,
            [1_000 - 100 * n, 100 * n],
            "{id}: not applied exactly once"
        );
        assert_no_marker(&l, &["A", "B"]).await;
    }
    assert_at_rest(&l).await;
}

// One id, other terms, at once: each request lands its own markers (its terms' key), one is
// done and the other a mismatch; once swept (the mismatch's markers undone), balances = the
// document.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_id_with_other_terms_at_once_is_one_transfer() {
    let lease = Duration::from_millis(300);
    let l = support::ledger("ow_terms").await;
    let several = support::copies(l.hot_client().database()).await > 1;
    let accounts = ["A", "B", "C"];
    open(&l, "A", 10_000).await;
    open(&l, "B", 0).await;
    open(&l, "C", 0).await;
    let mut expected = vec![10_000, 0, 0];
    let sweeper = l.to_builder().lease(lease).build().unwrap();
    let pairs = [
        (("A", "B", 100), ("A", "C", 100)),
        (("A", "B", 100), ("A", "B", 70)),
    ];
    for round in 0..3 {
        for (p, (one, two)) in pairs.iter().enumerate() {
            let id = format!("x{p}_{round}");
            let (w1, w2) = (l.another_worker(), l.another_worker());
            let (r1, r2) = (
                request(&id, one.0, one.1, one.2),
                request(&id, two.0, two.1, two.2),
            );
            let (a1, a2) = tokio::join!(
                tokio::spawn(async move { w1.submit(r1, true).await }),
                tokio::spawn(async move { w2.submit(r2, true).await })
            );
            let answers = [(one, a1.unwrap()), (two, a2.unwrap())];
            let answered = Instant::now();
            eprintln!(
                "{id}: {:?}",
                answers
                    .iter()
                    .map(|(t, a)| (
                        t,
                        a.as_ref()
                            .map(|o| o.state)
                            .map_err(|e| e.field().map(str::to_owned))
                    ))
                    .collect::<Vec<_>>()
            );
            // At most one caller decides, `done` (the other's markers are another key's, landed
            // beside its own); the other is told its id is taken (a mismatch).
            let mut decided = None;
            for (terms, a) in &answers {
                match a {
                    Ok(o) => {
                        assert_eq!(
                            (o.state, o.reason.as_deref()),
                            (State::Done, None),
                            "{id} {terms:?}: {o:?}"
                        );
                        assert!(decided.is_none(), "{id}: both decided: {answers:?}");
                        decided = Some(**terms);
                    }
                    // On a cluster the two decisions can each reach only some copies: neither
                    // is told, and the sweep below ends the transfer.
                    Err(e) if several && e.is_unconfirmed() => {}
                    Err(e) => assert!(e.is_mismatch(), "{id} {terms:?}: {e}"),
                }
            }
            // Past the lease: what nobody decided, the sweeper drives.
            wait_past("the lease", answered, lease + Duration::from_millis(50)).await;
            let swept = sweeper.sweep_once(now_sweep()).await.unwrap();
            let doc = if several {
                // A pass can leave the transfer's conflict, or its accounts', to the next one;
                // and a read of one copy can miss a rival leaf the other copies hold: judged
                // once every copy holds one leaf of each.
                let ids: Vec<String> = std::iter::once(format!("txn:{id}"))
                    .chain(accounts.iter().map(|a| format!("account:{a}")))
                    .collect();
                let leaves =
                    support::sweep_until_one_leaf(&sweeper, &ids, Duration::from_secs(120)).await;
                leaves[0].clone()
            } else {
                assert_eq!(swept.failed, 0, "{id}: {swept:?}");
                raw_txn(&l, &id).await
            };
            let value = doc["value"].as_i64().unwrap();
            let (src, dst) = (
                doc["source"].as_str().unwrap(),
                doc["destination"].as_str().unwrap(),
            );
            match decided {
                Some((from, to, v)) => {
                    assert_done_once(&doc, 1);
                    assert_eq!((src, dst, value), (from, to, v), "{id}: {doc:#}");
                }
                // Both decisions reached only some copies (each told `unconfirmed`): the sweep
                // ended the document on one caller's terms, done or cancelled.
                None if several => {
                    let kept = [one, two]
                        .into_iter()
                        .any(|t| (t.0, t.1, t.2) == (src, dst, value));
                    assert!(kept, "{id}: terms of neither caller: {doc:#}");
                    match doc["state"].as_str() {
                        // Decided by a caller (created `done`), or, where the callers' terms
                        // met on the accounts before any document, by the sweeper's recovery
                        // (created `initial`, then decided).
                        Some("done") => {
                            let generation = rev_generation(&doc);
                            assert!(generation <= 2, "{id}: {doc:#}");
                            assert_done_once(&doc, generation);
                        }
                        Some("cancelled") => {}
                        other => panic!("{id}: ended {other:?}: {doc:#}"),
                    }
                }
                None => panic!("{id}: neither caller decided: {answers:?}"),
            }
            if doc["state"] == "done" {
                let idx = |a: &str| accounts.iter().position(|x| *x == a).unwrap();
                expected[idx(src)] -= value;
                expected[idx(dst)] += value;
            }
            assert_no_marker(&l, &accounts).await;
            assert_eq!(
                balances(&l, &accounts).await,
                expected,
                "{id}: balances disagree with the document {doc:#}"
            );
        }
    }
    assert_at_rest(&l).await;
}

// ---- 6. refusals -----------------------------------------------------------------------------

// A refusal is decided `cancelled` (with its reason) by one create (`1-`), nothing applied.
#[tokio::test]
async fn refusals_are_decided_cancelled_by_one_create() {
    let l = support::ledger("ow_refused").await;
    open(&l, "A", 100).await;
    open(&l, "B", 0).await;
    let db = l.hot_client().database().to_owned();
    for (id, to, value, reason) in [
        ("broke", "B", 500, "insufficient_funds"),
        ("nowhere", "Z", 50, "unknown_account"),
    ] {
        let before = writes_in(&db).await;
        let o = l.submit(request(id, "A", to, value), true).await.unwrap();
        assert_eq!(
            answer(&o),
            (State::Cancelled, RecordStatus::Created, Some(reason)),
            "{id}"
        );
        let doc = raw_txn(&l, id).await;
        assert_eq!(
            (&doc["state"], &doc["reason"], rev_generation(&doc)),
            (&json!("cancelled"), &json!(reason), 1),
            "{id}: {doc:#}"
        );
        assert!(
            doc["markers"].is_null(),
            "{id}: a cancel names no marker: {doc:#}"
        );
        let view = l.transfer(id).await.unwrap();
        assert_eq!(
            (view.state, view.reason.as_deref()),
            (State::Cancelled, Some(reason))
        );
        assert_eq!(balances(&l, &["A", "B"]).await, [100, 0], "{id}");
        assert_no_marker(&l, &["A", "B"]).await;
        // Decided: the same id again answers it and writes nothing.
        let mid = writes_in(&db).await;
        assert!(mid - before >= 1, "{id}: no document written");
        let again = l.submit(request(id, "A", to, value), true).await.unwrap();
        assert_eq!(
            answer(&again),
            (State::Cancelled, RecordStatus::Exists, Some(reason)),
            "{id}"
        );
        assert_eq!(balances(&l, &["A", "B"]).await, [100, 0], "{id}");
        assert_no_marker(&l, &["A", "B"]).await;
    }
    assert!(l.account("Z").await.unwrap_err().is_not_found());
    assert_at_rest(&l).await;
}

// ---- 7.–8. a worker stopped after its apply --------------------------------------------------

// A worker stopped after its apply: the sweeper drives it only past the lease; answers agree.
#[tokio::test]
async fn a_worker_stopped_after_its_apply_is_decided_by_the_sweeper_once_its_lease_passed() {
    let l = support::ledger("ow_stopped").await;
    let lease = short_lease(&l).await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let (g, hook) = support::gate("decide");
    let slow = l
        .to_builder()
        .lease(lease)
        .pause_hook(hook)
        .build()
        .unwrap();
    let worker = tokio::spawn(async move { slow.submit(request("ab", "A", "B", 100), true).await });
    reached(&g).await;
    let applied = Instant::now();

    // Applied, undecided: a marker on each account, no document.
    let ab = key("ab", "A", "B", 100);
    let mut attempts = Vec::new();
    for (id, peer, delta) in [("A", "B", -100), ("B", "A", 100)] {
        let m = raw_markers(&l, id, &ab).await;
        assert_eq!(m.len(), 1, "{id}: {m:?}");
        assert!(is_attempt(&m[0]["attempt"]), "{id}: {m:?}");
        assert_eq!(
            (&m[0]["peer"], &m[0]["delta"]),
            (&json!(peer), &json!(delta))
        );
        attempts.push(m[0]["attempt"].as_str().unwrap().to_owned());
    }
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);
    assert!(l.transfer("ab").await.unwrap_err().is_not_found());
    // A sweeper whose lease (30 s) has not passed since the apply decides nothing.
    let early = l.another_worker().sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (early.cancelled, early.advanced, early.repaired_markers),
        (0, 0, 0),
        "{early:?}"
    );
    assert!(l.transfer("ab").await.unwrap_err().is_not_found());
    assert_eq!(raw_markers(&l, "A", &ab).await.len(), 1);
    assert_eq!(raw_markers(&l, "B", &ab).await.len(), 1);

    // Past the lease, while the worker is still stopped: the sweeper gives the transfer its
    // document (`initial`, the terms from the markers) and drives it `done`, adopting the stopped
    // worker's markers.
    wait_past("the lease", applied, lease + Duration::from_millis(50)).await;
    let sweeper = l.to_builder().lease(lease).build().unwrap();
    let swept = sweeper.sweep_once(now_sweep()).await.unwrap();
    assert_eq!(swept.failed, 0, "{swept:?}");
    let doc = raw_txn(&l, "ab").await;
    assert_eq!(
        (
            &doc["source"],
            &doc["destination"],
            &doc["value"],
            &doc["currency"]
        ),
        (&json!("A"), &json!("B"), &json!(100), &json!("EUR")),
        "terms reconstructed from the markers: {doc:#}"
    );
    assert_eq!((swept.advanced, swept.cancelled), (1, 0), "{swept:?}");
    let (s, d) = assert_done_once(&doc, 2);
    assert_eq!([s, d].as_slice(), attempts.as_slice(), "{doc:#}");
    let (state, reason, expected) = (State::Done, None, [900, 100]);
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, expected);

    // The stopped worker resumes: it writes nothing, and does not contradict the decision.
    let db = l.hot_client().database().to_owned();
    let decided = support::db_snapshot(&db).await;
    g.release.notify_one();
    let late = tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("the worker did not return")
        .unwrap();
    match late {
        Ok(o) => assert_eq!(
            answer(&o),
            (state, RecordStatus::Exists, reason),
            "the stopped worker contradicts the decision"
        ),
        Err(e) => {
            assert!(e.is_transient(), "{e}");
            assert_eq!(e.transfer_id(), Some("ab"));
        }
    }
    assert_eq!(
        support::db_snapshot(&db).await,
        decided,
        "the stopped worker wrote after the sweeper had decided"
    );

    // The caller retries: the answer is the decision, nothing moves.
    let retry = l.submit(request("ab", "A", "B", 100), true).await.unwrap();
    assert_eq!(answer(&retry), (state, RecordStatus::Exists, reason));
    assert_eq!(balances(&l, &["A", "B"]).await, expected);
    assert_no_marker(&l, &["A", "B"]).await;
    let again = sweeper.sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (again.cancelled, again.advanced, again.repaired_markers),
        (0, 0, 0),
        "{again:?}"
    );
    assert_at_rest(&l).await;
}

/// Sweep passes of one transfer and one marker each, by a ledger whose lease is `lease`, until
/// `transfers` have ended, `accounts` hold no pending marker and nothing is in conflict (six
/// at most): the passes made.
async fn passes_of_one(
    l: &Ledger,
    lease: Duration,
    transfers: &[&str],
    accounts: &[&str],
) -> Vec<SweepOutcome> {
    let sweeper = l.to_builder().lease(lease).build().unwrap();
    let one = SweepOptions {
        limit: 1,
        stale_after: Duration::ZERO,
    };
    let mut passes = Vec::new();
    for _ in 0..6 {
        passes.push(sweeper.sweep_once(one.clone()).await.unwrap());
        let mut rest = l.status().await.is_ok_and(|s| s.conflicts == 0);
        for id in transfers {
            rest &= l.transfer(id).await.is_ok_and(|t| t.state.is_terminal());
        }
        for id in accounts {
            rest &= l.account(id).await.is_ok_and(|a| a.pending.is_empty());
        }
        if rest {
            break;
        }
    }
    passes
}

// One id sent at once with other terms, on a cluster: two leaves of A hold its markers of the
// two terms (100 and 101: two entry keys), B the first terms' credit only, and no document says
// which stand. The merge of A keeps both markers side by side, as any two transfers' (before,
// every write of A waited for a decision of the transfer, and on a real 3-node cluster three
// accounts stayed held with 2,357 markers stuck). Passes of one transfer and one marker each,
// an older stale marker of another transfer (u, left `initial`) among them, end everything: t
// is decided on one terms, the other terms' marker is undone, u is finished, and the balances
// are what the documents say.
#[tokio::test]
async fn an_account_whose_leaves_hold_other_terms_under_one_id_keeps_both_and_one_stands() {
    // A cluster's conflict, planted: on a single node too, as a cluster's ledger acts.
    let l = support::ledger_with("ow_rival_first", |b| b.settled_entries()).await;
    let lease = short_lease(&l).await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    open(&l, "C", 1_000).await;
    // u (C -> A, 50), left `initial`, with C's marker applied by a worker that stopped: the
    // oldest stale marker.
    let left = l.submit(request("u", "C", "A", 50), false).await.unwrap();
    assert_eq!(left.state, State::Initial);
    let old = now_ms() - 20_000;
    let put = |id: &'static str, doc: Value| {
        let l = l.clone();
        async move {
            l.hot_client()
                .put(&format!("account:{id}"), &doc)
                .await
                .unwrap();
        }
    };
    let mut c = raw_account(&l, "C").await;
    c["pending"] =
        json!([{"txn": "u", "delta": -50, "at": old, "attempt": "0c0c0c0c0c0c", "peer": "A"}]);
    c["balance"] = json!(950);
    put("C", c).await;
    // t (A -> B) applied by two attempts with other terms, each on its own leaf of A; B holds
    // the first's credit. No document.
    let at = old + 5_000;
    let (of_100, of_101) = (key("t", "A", "B", 100), key("t", "A", "B", 101));
    let mut a = raw_account(&l, "A").await;
    a["pending"] =
        json!([{"txn": of_100, "delta": -100, "at": at, "attempt": "0a0a0a0a0a0a", "peer": "B"}]);
    a["balance"] = json!(900);
    put("A", a).await;
    let mut b = raw_account(&l, "B").await;
    b["pending"] =
        json!([{"txn": of_100, "delta": 100, "at": at, "attempt": "0a0a0a0a0a0a", "peer": "A"}]);
    b["balance"] = json!(100);
    put("B", b).await;
    let db = l.hot_client().database().to_owned();
    support::plant_sibling(&db, "account:A", &"f".repeat(32), |doc| {
        doc["pending"] = json!([{"txn": of_101, "delta": -101, "at": at,
                                  "attempt": "0b0b0b0b0b0b", "peer": "B"}]);
        doc["balance"] = json!(899);
    })
    .await;
    assert_eq!(
        l.status().await.unwrap().conflicts,
        1,
        "A holds the two leaves"
    );

    let passes = passes_of_one(&l, lease, &["t", "u"], &["A", "B", "C"]).await;
    let t = l
        .transfer("t")
        .await
        .unwrap_or_else(|e| panic!("t was never given its document ({e}) in {passes:#?}"));
    // Each terms' marker is there to adopt on A, and B takes a credit: whichever the sweeper
    // reached first is done.
    assert_eq!(t.state, State::Done, "{t:?} after {passes:#?}");
    assert!(
        [100, 101].contains(&t.amount.minor()),
        "{t:?}: terms of neither attempt"
    );
    let u = l.transfer("u").await.unwrap();
    assert_eq!(u.state, State::Done, "{u:?} after {passes:#?}");
    let moved = t.amount.minor();
    let all = balances(&l, &["A", "B", "C"]).await;
    assert_eq!(
        all,
        [1_050 - moved, moved, 950],
        "{t:?}\nA {:#}\nB {:#}\n{passes:#?}",
        raw_account(&l, "A").await,
        raw_account(&l, "B").await
    );
    assert_at_rest(&l).await;
}

// The same, where only losing leaves hold the markers of the two terms: each of A and B has
// three leaves, the winner knowing nothing of t (a branch that took other writes), one loser
// with each terms' marker. No view lists t (views read winners), so the pass reaches it only
// through the conflict pass's merge, which brings both terms' markers onto the winner side by
// side; then t is given a document from one of them and decided, and the other terms' markers
// are undone.
#[tokio::test]
async fn an_account_whose_losing_leaves_alone_hold_markers_of_other_terms_is_merged_and_ended() {
    // A cluster's conflict, planted: on a single node too, as a cluster's ledger acts.
    let l = support::ledger_with("ow_rival_losers", |b| b.settled_entries()).await;
    let lease = short_lease(&l).await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let at = now_ms() - 20_000;
    let db = l.hot_client().database().to_owned();
    let (of_100, of_101) = (key("t", "A", "B", 100), key("t", "A", "B", 101));
    for (id, sign, peer, opening) in [("A", -1, "B", 1_000), ("B", 1, "A", 0)] {
        let mut doc = raw_account(&l, id).await;
        doc["pending"] = json!([{"txn": of_100, "delta": sign * 100, "at": at,
                                  "attempt": "0a0a0a0a0a0a", "peer": peer}]);
        doc["balance"] = json!(opening + sign * 100);
        l.hot_client()
            .put(&format!("account:{id}"), &doc)
            .await
            .unwrap();
        support::plant_sibling(&db, &format!("account:{id}"), &"0".repeat(32), |d| {
            d["pending"] = json!([{"txn": of_101, "delta": sign * 101, "at": at,
                                    "attempt": "0b0b0b0b0b0b", "peer": peer}]);
            d["balance"] = json!(opening + sign * 101);
        })
        .await;
        support::plant_sibling(&db, &format!("account:{id}"), &"f".repeat(32), |d| {
            d["pending"] = json!([]);
            d["balance"] = json!(opening);
        })
        .await;
        let winner = raw_account(&l, id).await;
        assert_eq!(
            winner["pending"],
            json!([]),
            "{id}'s winner holds no marker: {winner:#}"
        );
    }
    assert_eq!(
        l.status().await.unwrap().conflicts,
        2,
        "A and B hold the leaves"
    );

    let passes = passes_of_one(&l, lease, &["t"], &["A", "B"]).await;
    let t = l
        .transfer("t")
        .await
        .unwrap_or_else(|e| panic!("t was never given its document ({e}) in {passes:#?}"));
    // Both terms' markers are complete (a debit and a credit each): whichever the sweeper
    // reached first is adopted and done.
    assert_eq!(t.state, State::Done, "{t:?} after {passes:#?}");
    assert!(
        [100, 101].contains(&t.amount.minor()),
        "{t:?}: terms of neither attempt"
    );
    let moved = t.amount.minor();
    let all = balances(&l, &["A", "B"]).await;
    assert_eq!(all, [1_000 - moved, moved], "{t:?}\n{passes:#?}");
    assert_at_rest(&l).await;
}

// A retry adopts a stopped worker's markers and decides done; the worker follows; once.
#[tokio::test]
async fn a_retry_adopts_the_markers_of_a_stopped_worker_and_both_answer_done() {
    let l = support::ledger("ow_adopt").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let (g, hook) = support::gate("decide");
    let slow = l.to_builder().pause_hook(hook).build().unwrap();
    let worker = tokio::spawn(async move { slow.submit(request("ad", "A", "B", 100), true).await });
    reached(&g).await;
    let ad = key("ad", "A", "B", 100);
    let mut attempts = Vec::new();
    for id in ["A", "B"] {
        let m = raw_markers(&l, id, &ad).await;
        assert_eq!(m.len(), 1, "{id}: {m:?}");
        attempts.push(m[0]["attempt"].as_str().unwrap().to_owned());
    }

    let retry = l
        .another_worker()
        .submit(request("ad", "A", "B", 100), true)
        .await
        .unwrap();
    assert_eq!(answer(&retry), (State::Done, RecordStatus::Created, None));
    let (s, d) = assert_done_once(&raw_txn(&l, "ad").await, 1);
    assert_eq!(
        [s, d].as_slice(),
        attempts.as_slice(),
        "the decision does not name the adopted markers"
    );
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);
    assert_no_marker(&l, &["A", "B"]).await;

    g.release.notify_one();
    let first = tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("the stopped worker did not return")
        .unwrap()
        .unwrap();
    assert_eq!(answer(&first), (State::Done, RecordStatus::Exists, None));
    assert_done_once(&raw_txn(&l, "ad").await, 1);
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100], "applied twice");
    assert_no_marker(&l, &["A", "B"]).await;
    assert_at_rest(&l).await;
}

// ---- 9.–10. transfers left `initial` ---------------------------------------------------------

// A transfer left `initial` is finished by one CAS (`2-`) naming the markers, by sweep or submit.
#[tokio::test]
async fn an_initial_transfer_is_finished_by_one_cas() {
    let l = support::ledger("ow_initial").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let db = l.hot_client().database().to_owned();

    let left = l.submit(request("i1", "A", "B", 100), false).await.unwrap();
    assert_eq!(answer(&left), (State::Initial, RecordStatus::Created, None));
    assert_eq!(rev_generation(&raw_txn(&l, "i1").await), 1);
    let before = writes_in(&db).await;
    let swept = l.another_worker().sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (swept.advanced, swept.failed, swept.remaining),
        (1, 0, 0),
        "{swept:?}"
    );
    assert_eq!(
        writes_in(&db).await - before,
        5,
        "2 applies, 1 CAS, 2 settles"
    );
    let (s, d) = assert_done_once(&raw_txn(&l, "i1").await, 2);
    assert_eq!(s, d);
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);

    // Left `initial`, then submitted again waiting: decided by the second call.
    let left = l.submit(request("i2", "A", "B", 50), false).await.unwrap();
    assert_eq!(left.state, State::Initial);
    let decided = l.submit(request("i2", "A", "B", 50), true).await.unwrap();
    assert_eq!(answer(&decided), (State::Done, RecordStatus::Exists, None));
    assert_done_once(&raw_txn(&l, "i2").await, 2);
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, [850, 150]);
    // Nothing left for the sweeper.
    let swept = l.sweep_once(now_sweep()).await.unwrap();
    assert_eq!((swept.examined, swept.advanced), (0, 0), "{swept:?}");
    assert_at_rest(&l).await;
}

// Many transfers left `initial` on a few accounts: one pass decides them all, its drives not
// waiting for their settles (held for the accounts' next writes), and sends what is still held
// before it returns: no marker is left when the pass answers.
#[tokio::test]
async fn a_pass_over_many_initial_transfers_leaves_no_marker_behind() {
    let l = support::ledger("ow_initial_many").await;
    let accounts = ["A", "B", "C", "D"];
    for id in accounts {
        open(&l, id, 1_000).await;
    }
    let n = 24;
    for i in 0..n {
        let (from, to) = (accounts[i % 4], accounts[(i + 1) % 4]);
        let left = l
            .submit(
                request(&format!("m{i}"), from, to, 10 * (i as i64 % 4 + 1)),
                false,
            )
            .await
            .unwrap();
        assert_eq!(left.state, State::Initial);
    }
    let swept = l.another_worker().sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (swept.advanced, swept.failed, swept.remaining),
        (n as u64, 0, 0),
        "{swept:?}"
    );
    assert_no_marker(&l, &accounts).await;
    // A paid 6 × 10 and received 6 × 40; B, C and D each paid 60 more than they received.
    assert_eq!(balances(&l, &accounts).await, [1_180, 940, 940, 940]);
    for i in 0..n {
        assert_done_once(&raw_txn(&l, &format!("m{i}")).await, 2);
    }
    assert_at_rest(&l).await;
}

// A sweeper pass in a process that also submits (`serve`) waits for its own drives' settles,
// sending only theirs: not for the transfers the process is finishing in the background (under
// a steady load those never all end, and the pass would not either), nor sending their held
// settles ahead of the accounts' next writes.
#[tokio::test]
async fn a_pass_waits_for_its_own_settles_only() {
    let l = support::ledger_with("ow_pass_own", |b| b.background_finish(true)).await;
    for id in ["A", "B", "C", "D"] {
        open(&l, id, 1_000).await;
    }
    // A transfer left `initial` a minute ago (its date moved back by hand).
    l.submit(request("old", "C", "D", 50), false).await.unwrap();
    let mut old = raw_txn(&l, "old").await;
    old["last_modified"] = json!(old["last_modified"].as_i64().unwrap() - 60_000);
    l.hot_client().put("txn:old", &old).await.unwrap();

    let answered = std::time::Instant::now();
    let done = l.submit(request("bg", "A", "B", 100), true).await.unwrap();
    assert_eq!(done.state, State::Done);
    assert_eq!(
        l.finishing(),
        1,
        "its settles held for the accounts' next writes"
    );
    // bg's markers are fresh: a pass taking over what is 30 s old drives `old` only.
    let options = SweepOptions {
        limit: 100,
        stale_after: Duration::from_secs(30),
    };
    let swept = l.sweep_once(options).await.unwrap();
    assert_eq!((swept.advanced, swept.failed), (1, 0), "{swept:?}");
    assert_no_marker(&l, &["C", "D"]).await;
    // The hold is 1 s: a pass that answered well inside it left bg's held settles alone.
    if answered.elapsed() < std::time::Duration::from_millis(500) {
        assert_eq!(
            l.finishing(),
            1,
            "the pass sent another caller's held settles"
        );
    }
    l.flush().await;
    assert_eq!(l.finishing(), 0);
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(
        balances(&l, &["A", "B", "C", "D"]).await,
        [900, 1_100, 950, 1_050]
    );
    assert_at_rest(&l).await;
}

// A re-sent id on a database that keeps one copy (no settled entries to find it by): the
// ledger that ended it remembers it, and a ledger that looks first finds its document; either
// answers with nothing written. One that neither remembers nor looks finds it taken only at the
// decision: with other terms, its markers (their own key) stay until the sweeper undoes them,
// as the document that stands holds the first terms; the money ends unchanged.
#[tokio::test]
async fn a_re_sent_id_is_answered_with_nothing_written_when_known_or_looked_up() {
    let l = support::ledger_with("ow_resent", |b| b.one_copy()).await;
    if support::keeps_several_copies(l.hot_client().database()).await {
        return;
    }
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let db = l.hot_client().database().to_owned();
    let done = l.submit(request("r1", "A", "B", 100), true).await.unwrap();
    assert_eq!(answer(&done), (State::Done, RecordStatus::Created, None));
    l.flush().await;
    let before = support::db_snapshot(&db).await;

    // Remembered by the ledger that ended it: the same terms, then other terms.
    let again = l.submit(request("r1", "A", "B", 100), true).await.unwrap();
    assert_eq!(answer(&again), (State::Done, RecordStatus::Exists, None));
    let e = l
        .submit(request("r1", "A", "B", 101), true)
        .await
        .unwrap_err();
    assert!(e.is_mismatch(), "{e}");
    assert_eq!(support::db_snapshot(&db).await, before, "nothing written");

    // Another process, looking first.
    let looking = l.to_builder().lookup_first(true).build().unwrap();
    let again = looking
        .submit(request("r1", "A", "B", 100), true)
        .await
        .unwrap();
    assert_eq!(answer(&again), (State::Done, RecordStatus::Exists, None));
    let e = looking
        .submit(request("r1", "B", "A", 100), true)
        .await
        .unwrap_err();
    assert!(e.is_mismatch(), "{e}");
    assert_eq!(support::db_snapshot(&db).await, before, "nothing written");

    // Another process, not looking: the accounts were touched, the caller told a mismatch,
    // and its markers (of the key of 101) are the sweeper's to undo.
    let e = l
        .another_worker()
        .submit(request("r1", "A", "B", 101), true)
        .await
        .unwrap_err();
    assert!(e.is_mismatch(), "{e}");
    assert_eq!(e.field(), Some("value"));
    let lost = key("r1", "A", "B", 101);
    for id in ["A", "B"] {
        let m = raw_markers(&l, id, &lost).await;
        assert_eq!(m.len(), 1, "{id}: the losing terms' marker: {m:?}");
    }
    let swept = l.another_worker().sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (swept.repaired_markers, swept.advanced, swept.failed),
        (2, 0, 0),
        "{swept:?}"
    );
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);
    assert_done_once(&raw_txn(&l, "r1").await, 1);

    // Looking first at a transfer left `initial`: still open, so it is finished, not answered
    // as it stands.
    let left = l.submit(request("r2", "A", "B", 10), false).await.unwrap();
    assert_eq!(left.state, State::Initial);
    let finished = l
        .to_builder()
        .lookup_first(true)
        .build()
        .unwrap()
        .submit(request("r2", "A", "B", 10), true)
        .await
        .unwrap();
    assert_eq!(answer(&finished), (State::Done, RecordStatus::Exists, None));
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, [890, 110]);
    assert_at_rest(&l).await;
}

// A cancel of an `initial` transfer beats a sweeper paused before its CAS; its markers undone.
#[tokio::test]
async fn a_cancel_wins_over_a_sweeper_deciding_an_initial_transfer() {
    let l = support::ledger("ow_cancel_initial").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    l.submit(request("ci", "A", "B", 100), false).await.unwrap();
    let (g, hook) = support::gate("decide");
    let sweeper = l.to_builder().pause_hook(hook).build().unwrap();
    let pass = tokio::spawn(async move { sweeper.sweep_once(now_sweep()).await });
    reached(&g).await;
    // The sweeper applied both accounts.
    let ci = key("ci", "A", "B", 100);
    assert_eq!(raw_markers(&l, "A", &ci).await.len(), 1);
    assert_eq!(raw_markers(&l, "B", &ci).await.len(), 1);
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);

    let c = l.cancel("ci").await.unwrap();
    assert_eq!(
        (c.state, c.reason.as_deref()),
        (State::Cancelled, Some("cancelled_by_user"))
    );
    g.release.notify_one();
    let swept = tokio::time::timeout(Duration::from_secs(20), pass)
        .await
        .expect("the sweep did not return")
        .unwrap()
        .unwrap();
    assert_eq!(
        (swept.advanced, swept.cancelled, swept.failed),
        (0, 0, 0),
        "{swept:?}"
    );
    let view = l.transfer("ci").await.unwrap();
    assert_eq!(
        (view.state, view.reason.as_deref()),
        (State::Cancelled, Some("cancelled_by_user"))
    );
    assert!(raw_txn(&l, "ci").await["markers"].is_null());
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, [1_000, 0]);
    assert_at_rest(&l).await;
}

// A submit that meets another attempt's marker of other terms under its id lands its own
// marker beside it (other terms are another entry key, counted apart) and decides first:
// `done` on its terms. The other attempt, deciding later, is told its id is taken (a mismatch);
// its markers are left to the sweeper, which undoes them as the document that stands holds
// other terms. Money moves once, on the decided terms, and every answer stays true.
#[tokio::test]
async fn a_submit_meeting_other_terms_under_its_id_lands_beside_them_and_decides_first() {
    let l = support::ledger("ow_mismatch_wait").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    open(&l, "C", 0).await;
    let (to_b, to_c) = (key("mw", "A", "B", 100), key("mw", "A", "C", 100));
    assert_ne!(to_b, to_c, "other terms, one key");
    let (g, hook) = support::gate("decide");
    let slow = l.to_builder().pause_hook(hook).build().unwrap();
    let worker = tokio::spawn(async move { slow.submit(request("mw", "A", "B", 100), true).await });
    reached(&g).await;
    assert_eq!(raw_markers(&l, "A", &to_b).await.len(), 1);
    assert_eq!(raw_markers(&l, "B", &to_b).await.len(), 1);

    // The other terms, held at their decision too: both markers sit on A side by side, each
    // with its own delta, and the account shows both under the transfer's id.
    let (g2, hook2) = support::gate("decide");
    let other = l.to_builder().pause_hook(hook2).build().unwrap();
    let second =
        tokio::spawn(async move { other.submit(request("mw", "A", "C", 100), true).await });
    reached(&g2).await;
    for k in [&to_b, &to_c] {
        let m = raw_markers(&l, "A", k).await;
        assert_eq!(m.len(), 1, "A, {k}: {m:?}");
        assert_eq!(m[0]["delta"], json!(-100), "{m:?}");
    }
    let a = l.account("A").await.unwrap();
    let shown: Vec<(&str, i64)> = a
        .pending
        .iter()
        .map(|p| (p.txn.as_str(), p.delta.minor()))
        .collect();
    assert_eq!(shown, [("mw", -100), ("mw", -100)], "{a:?}");
    assert_eq!(balances(&l, &["A", "B", "C"]).await, [800, 100, 100]);

    g2.release.notify_one();
    let o = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the second submit did not return")
        .unwrap()
        .unwrap();
    assert_eq!(answer(&o), (State::Done, RecordStatus::Created, None));
    let doc = raw_txn(&l, "mw").await;
    assert_done_once(&doc, 1);
    assert_eq!(doc["destination"], json!("C"), "{doc:#}");
    assert!(
        raw_markers(&l, "A", &to_c).await.is_empty(),
        "A's debit not settled"
    );

    // The stopped attempt resumes: its create meets the decision, with other terms.
    g.release.notify_one();
    let e = tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("the stopped worker did not return")
        .unwrap()
        .unwrap_err();
    assert!(e.is_mismatch(), "{e}");
    assert_eq!(e.field(), Some("destination"));
    // Its markers are not its own to take back (it cannot tell the document it read stands
    // alone on every copy): they wait for the sweeper.
    assert_eq!(raw_markers(&l, "A", &to_b).await.len(), 1);
    assert_eq!(raw_markers(&l, "B", &to_b).await.len(), 1);
    assert_eq!(balances(&l, &["A", "B", "C"]).await, [800, 100, 100]);
    let swept = l.another_worker().sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (swept.repaired_markers, swept.advanced, swept.failed),
        (2, 0, 0),
        "{swept:?}"
    );
    assert_no_marker(&l, &["A", "B", "C"]).await;
    assert_eq!(balances(&l, &["A", "B", "C"]).await, [900, 0, 100]);
    assert_done_once(&raw_txn(&l, "mw").await, 1);
    // The decided terms again answer the decision, and move nothing.
    let again = l.submit(request("mw", "A", "C", 100), true).await.unwrap();
    assert_eq!(answer(&again), (State::Done, RecordStatus::Exists, None));
    assert_eq!(balances(&l, &["A", "B", "C"]).await, [900, 0, 100]);
    assert_at_rest(&l).await;
}

// Two attempts with other terms, each holding one account (each its own key: they do not hold
// each other off). The first caller adopts its terms' marker on A, lands its credit on B beside
// the other terms' and decides `done`; the second is told its id is taken (a mismatch naming
// the field), and every marker of its terms, the one it found and the one it added, is undone
// by the sweeper: what it was told did not happen never happens, and money moves once.
#[tokio::test]
async fn two_attempts_that_each_won_one_account_end_with_the_first_decision_alone() {
    let lease = Duration::from_millis(300);
    let l = support::ledger("ow_split_race").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let (of_100, of_70) = (key("sr", "A", "B", 100), key("sr", "A", "B", 70));
    // Plant what the race leaves: each account applied by the attempt that reached it first (or
    // a worker whose apply failed on B after A, then a submit with other terms that got B).
    let at = now_ms();
    for (id, k, delta, attempt, peer) in [
        ("A", &of_100, -100, "0a0a0a0a0a0a", "B"),
        ("B", &of_70, 70, "0b0b0b0b0b0b", "A"),
    ] {
        let mut doc = raw_account(&l, id).await;
        doc["pending"] =
            json!([{"txn": k, "delta": delta, "at": at, "attempt": attempt, "peer": peer}]);
        doc["balance"] = json!(doc["balance"].as_i64().unwrap() + delta);
        l.hot_client()
            .put(&format!("account:{id}"), &doc)
            .await
            .unwrap();
    }
    let planted = Instant::now();

    // The first caller adopts A's marker of its terms and applies B: its terms decided done.
    let first = l
        .another_worker()
        .submit(request("sr", "A", "B", 100), true)
        .await
        .unwrap();
    assert_eq!(answer(&first), (State::Done, RecordStatus::Created, None));
    let doc = raw_txn(&l, "sr").await;
    let (source, _) = assert_done_once(&doc, 1);
    assert_eq!(source, "0a0a0a0a0a0a", "A's marker not adopted: {doc:#}");
    assert_eq!(doc["value"], json!(100), "{doc:#}");
    // The second finds the id taken by other terms: a mismatch naming the field.
    let e = l
        .another_worker()
        .submit(request("sr", "A", "B", 70), true)
        .await
        .unwrap_err();
    assert!(e.is_mismatch(), "{e}");
    assert_eq!(e.field(), Some("value"));
    for id in ["A", "B"] {
        let m = raw_markers(&l, id, &of_70).await;
        assert_eq!(m.len(), 1, "{id}: the second terms' marker: {m:?}");
        assert!(
            raw_markers(&l, id, &of_100).await.is_empty(),
            "{id}: not settled"
        );
    }
    assert_eq!(balances(&l, &["A", "B"]).await, [830, 170]);

    // What is left (the second terms' markers) is undone by the sweeper: the transfer is
    // decided on other terms, and those are never executed.
    wait_past("the lease", planted, lease + Duration::from_millis(50)).await;
    let sweeper = l.to_builder().lease(lease).build().unwrap();
    let swept = sweeper.sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (swept.repaired_markers, swept.advanced, swept.failed),
        (2, 0, 0),
        "{swept:?}"
    );
    assert_done_once(&raw_txn(&l, "sr").await, 1);
    assert_no_marker(&l, &["A", "B"]).await;
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);
    assert_at_rest(&l).await;
}

// ---- 11.–12. the sweeper converges decided transfers -----------------------------------------

// A worker dead after its decision: the sweeper settles the named markers (not undone).
#[tokio::test]
async fn the_sweeper_settles_the_named_markers_of_a_worker_that_died_after_deciding() {
    let l = support::ledger("ow_died_decided").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let (g, hook) = support::gate("converge");
    let dying = l.to_builder().pause_hook(hook).build().unwrap();
    assert!(!dying.finishes_in_background());
    let worker =
        tokio::spawn(async move { dying.submit(request("dd", "A", "B", 100), true).await });
    reached(&g).await;
    // The process dies here: the task is dropped at its converge.
    worker.abort();
    assert!(worker.await.unwrap_err().is_cancelled());

    let (s, d) = assert_done_once(&raw_txn(&l, "dd").await, 1);
    let dd = key("dd", "A", "B", 100);
    assert_eq!(raw_markers(&l, "A", &dd).await[0]["attempt"], json!(s));
    assert_eq!(raw_markers(&l, "B", &dd).await[0]["attempt"], json!(d));
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    assert!(
        !report.check("no_pending_markers").unwrap().ok,
        "{report:#?}"
    );

    // On several copies a pass's view of pending markers reads one copy of each shard range,
    // which may not hold both markers yet, and a settle answered 202 is read again and found
    // done (not counted): passes go on until both markers are gone, never counting more than 2.
    let several = support::copies(l.hot_client().database()).await > 1;
    let sweeper = l.another_worker();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut repaired = 0;
    loop {
        let swept = sweeper.sweep_once(now_sweep()).await.unwrap();
        assert_eq!(
            (swept.cancelled, swept.advanced, swept.failed),
            (0, 0, 0),
            "{swept:?}"
        );
        repaired += swept.repaired_markers;
        if !several {
            assert_eq!(repaired, 2, "{swept:?}");
            break;
        }
        assert!(repaired <= 2, "a marker repaired twice: {swept:?}");
        let mut gone = true;
        for id in ["A", "B"] {
            gone &= l.account(id).await.unwrap().pending.is_empty();
        }
        if gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "markers still pending after 30 s ({repaired} repaired): {swept:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_done_once(&raw_txn(&l, "dd").await, 1);
    assert_eq!(
        balances(&l, &["A", "B"]).await,
        [900, 100],
        "the decided transfer was undone"
    );
    assert_no_marker(&l, &["A", "B"]).await;
    let b = l.account("B").await.unwrap();
    assert_eq!(
        b.available.minor(),
        100,
        "the credit is spendable once settled"
    );
    assert_at_rest(&l).await;
}

// A marker of an attempt a `done` decision does not name is undone by the sweeper.
#[tokio::test]
async fn the_sweeper_undoes_a_marker_of_an_attempt_the_decision_does_not_name() {
    let l = support::ledger("ow_unnamed").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    l.submit(request("un", "A", "B", 100), true).await.unwrap();
    let (_, named_b) = assert_done_once(&raw_txn(&l, "un").await, 1);
    let stray = if named_b == "0123456789ab" {
        "ba9876543210"
    } else {
        "0123456789ab"
    };
    // Plant: a late apply of "un" on B by another attempt, its entry pruned.
    let un = key("un", "A", "B", 100);
    let mut b = raw_account(&l, "B").await;
    support::retain_settled(&mut b, |t| t != un);
    b["pending"] = json!([{"txn": un, "delta": 100, "at": 1, "attempt": stray, "peer": "A"}]);
    b["balance"] = json!(200);
    // On every copy: `verify` and the sweeper read views, answered by any one of them.
    support::put_on_every_copy(l.hot_client(), "account:B", &b).await;
    assert!(!l.verify_with(VerifyOptions::at_rest()).await.unwrap().ok);

    let swept = l.sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (swept.repaired_markers, swept.cancelled, swept.failed),
        (1, 0, 0),
        "{swept:?}"
    );
    assert_eq!(balances(&l, &["A", "B"]).await, [900, 100]);
    assert_no_marker(&l, &["A", "B"]).await;
    assert_done_once(&raw_txn(&l, "un").await, 1);
    assert_at_rest(&l).await;
}
