//! The account engine's bounds: pruning waits for the transfer to
//! end, an apply past its worker's deadline writes nothing, an account's markers stay under
//! their size cap whatever the traffic, and a 413 is its own error, never retried as is.

use std::sync::Arc;
use std::time::Duration;

use couch_ledger::testing::limits::{
    MARKERS_BYTES_MAX, MARKER_OVERHEAD_BYTES, PRUNE_CONFIRMED_MS, SETTLED_AGE_MIN_MS,
};
use couch_ledger::testing::{entry_key, transfer_of};
use couch_ledger::{Amount, Client, Ledger, PauseHook, RetryPolicy, State};
use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support;
use crate::support::{eur_transfer as request, open_account as open};

fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(d.as_millis()).unwrap()
}

async fn account_doc(l: &Ledger, id: &str) -> Value {
    l.hot_client().get(&format!("account:{id}")).await.unwrap()
}

/// Replaces account `id`'s settled entries with a raw write (not through the engine), written to every copy (on a cluster, a revision
/// only some copies hold makes the engine's next `w` = n write answer 202, and nothing is
/// pruned while writes do).
async fn plant_settled(l: &Ledger, id: &str, settled: Vec<Value>) {
    // After the transfers' markers are settled: a settle landing after the planting would add
    // an entry of its own, dated now (a cluster's copies make that window wider).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut doc = account_doc(l, id).await;
    while doc["pending"].as_array().is_some_and(|p| !p.is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "account {id} still holds markers after 30 s: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        doc = account_doc(l, id).await;
    }
    doc["settled"] = Value::Array(settled);
    let every = support::every_copy(l.hot_client()).await;
    l.hot_client()
        .put_with(&format!("account:{id}"), &doc, &every)
        .await
        .unwrap();
}

/// The key of the entries of transfer `id` as `request` makes it (A→B 10 EUR).
fn key(id: &str) -> String {
    entry_key(id, "A", "B", Amount::new(10).unwrap(), "EUR", None)
}

/// The transfers of an account document's settled entries (each entry's key without its
/// digest).
fn settled_ids(doc: &Value) -> Vec<String> {
    support::settled_entries(doc)
        .into_iter()
        .map(|(txn, _)| transfer_of(&txn).to_owned())
        .collect()
}

/// Submits transfers `{prefix}-{i}` of 10 from A to B through `l` until A's settled entries
/// satisfy `pruned`, and returns them. An entry is pruned only once every copy is known to
/// hold it for `PRUNE_CONFIRMED_MS`: the first write confirms the entries planted before it,
/// a write after that prunes them. Fails after that time and a minute more, counted from the
/// last write of the account this ledger saw answered 202 (six minutes at most).
async fn write_until(l: &Ledger, prefix: &str, pruned: impl Fn(&[String]) -> bool) -> Vec<String> {
    // Nothing is pruned until every copy took the account's writes for PRUNE_CONFIRMED_MS
    // (docs/CLUSTER.md, "Pruning"): a write answered 202 on a loaded cluster starts that wait
    // again, and so the deadline, up to a bound.
    let wait = Duration::from_millis(PRUNE_CONFIRMED_MS) + Duration::from_secs(60);
    let start = tokio::time::Instant::now();
    let bound = start + Duration::from_secs(360);
    let mut deadline = start + wait;
    let mut unconfirmed = l.unconfirmed_account_writes();
    let several = support::copies(l.hot_client().database()).await > 1;
    for i in 0.. {
        let id = format!("{prefix}-{i}");
        match l.submit(request(&id, "A", "B", 10), true).await {
            Ok(outcome) => assert_eq!(outcome.state, State::Done),
            // A loaded cluster can answer a decision's write 202 (docs/CLUSTER.md, "A 202 on
            // a healthy cluster"): not told, it is finished by a sweep before the next write.
            Err(e) if several && e.is_unconfirmed() => {
                support::sweep_until_none_open(l, Duration::from_secs(120)).await;
            }
            Err(e) => panic!("{id}: {e}"),
        }
        let ids = settled_ids(&account_doc(l, "A").await);
        if pruned(&ids) {
            return ids;
        }
        let now = tokio::time::Instant::now();
        let seen = l.unconfirmed_account_writes();
        if seen != unconfirmed {
            unconfirmed = seen;
            deadline = (now + wait).min(bound);
        }
        assert!(
            now < deadline,
            "not pruned within {PRUNE_CONFIRMED_MS} ms and a minute of the last account write \
             answered 202 ({unconfirmed} such writes in {:?}): {ids:?}",
            now - start
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    unreachable!()
}

/// Item 5: a settled entry is pruned only once its transfer reads done or cancelled, however
/// old its timestamp says it is (that timestamp is another host's clock). A transfer whose
/// document holds a conflict (`done` beside `cancelled`) has not ended either, whatever its
/// winner says: a resolution judges between its leaves by what the accounts show, so its
/// entries stay.
#[tokio::test]
async fn a_settled_entry_of_an_open_transfer_is_not_pruned() {
    // Entries as a cluster keeps them (none of one-write transfers on one copy).
    let l = support::ledger_with("eb-prune", |b| b.settled_entries()).await;
    open(&l, "A", 10_000).await;
    open(&l, "B", 0).await;
    let done = l
        .submit(request("t-done", "A", "B", 10), true)
        .await
        .unwrap();
    assert_eq!(done.state, State::Done);
    // Left to the sweeper: `initial`, not ended.
    let open_t = l
        .submit(request("t-open", "A", "B", 10), false)
        .await
        .unwrap();
    assert!(!matches!(open_t.state, State::Done | State::Cancelled));
    // Ended by another worker (this one would know its own end stands alone, and read
    // nothing), then given a `cancelled` sibling that loses to `done`, as two deciders on a
    // cluster leave it.
    let forked = l
        .another_worker()
        .submit(request("t-forked", "A", "B", 10), true)
        .await
        .unwrap();
    assert_eq!(forked.state, State::Done);
    let db = l.hot_client().database().to_owned();
    support::plant_sibling(&db, "txn:t-forked", &"0".repeat(32), |doc| {
        doc["state"] = json!("cancelled");
        doc["reason"] = json!("insufficient_funds");
        doc.as_object_mut().unwrap().remove("markers");
    })
    .await;
    let old = now_ms() - i64::try_from(SETTLED_AGE_MIN_MS).unwrap() - 60_000;
    let mut settled = vec![
        json!({"txn": key("t-open"), "at": old}),
        json!({"txn": key("t-done"), "at": old}),
        json!({"txn": key("t-forked"), "at": old}),
    ];
    // Enough old entries (of transfers that never existed) to make pruning worth a read.
    settled.extend((0..40).map(|i| json!({"txn": key(&format!("gone-{i}")), "at": old})));
    plant_settled(&l, "A", settled).await;

    let ids = write_until(&l, "t-next", |ids| {
        !ids.iter().any(|t| t.starts_with("gone-") || t == "t-done")
    })
    .await;
    assert!(
        ids.contains(&"t-open".to_owned()),
        "pruned an open transfer: {ids:?}"
    );
    assert!(
        ids.contains(&"t-forked".to_owned()),
        "pruned a transfer whose document holds a conflict: {ids:?}"
    );
    assert!(
        !ids.contains(&"t-done".to_owned()),
        "kept an ended one: {ids:?}"
    );
    assert!(!ids.iter().any(|t| t.starts_with("gone-")), "{ids:?}");
    assert!(ids.contains(&"t-next-0".to_owned()), "{ids:?}");
}

/// The settled entries of transfers this ledger ended itself are pruned, once old
/// enough, without reading those transfers again (that read held up every engine round that
/// pruned); entries of transfers it did not end are still read first.
#[tokio::test]
async fn entries_of_transfers_this_ledger_ended_are_pruned_without_a_read() {
    // Entries as a cluster keeps them (none of one-write transfers on one copy).
    let l = support::ledger_with("eb-ended", |b| b.settled_entries()).await;
    open(&l, "A", 100_000).await;
    open(&l, "B", 0).await;
    let ids: Vec<String> = (0..40).map(|i| format!("t-own-{i}")).collect();
    for id in &ids {
        let outcome = l.submit(request(id, "A", "B", 10), true).await.unwrap();
        assert_eq!(outcome.state, State::Done);
    }
    // The same entries, dated old enough to be pruned.
    let old = now_ms() - i64::try_from(SETTLED_AGE_MIN_MS).unwrap() - 60_000;
    plant_settled(
        &l,
        "A",
        ids.iter()
            .map(|t| json!({"txn": key(t), "at": old}))
            .collect(),
    )
    .await;
    let reads = l.prune_reads();
    let left = write_until(&l, "t-next", |ids| {
        !ids.iter().any(|t| t.starts_with("t-own-"))
    })
    .await;
    assert!(
        left.iter().all(|t| t.starts_with("t-next-")),
        "every old entry of an ended transfer goes: {left:?}"
    );
    assert_eq!(l.prune_reads(), reads, "no transfer was read to prune them");

    // Another ledger on the same databases did not end them: it reads them first.
    let other = l.another_worker();
    plant_settled(
        &l,
        "A",
        ids.iter()
            .map(|t| json!({"txn": key(t), "at": old}))
            .collect(),
    )
    .await;
    let left = write_until(&other, "t-other", |ids| {
        !ids.iter().any(|t| t.starts_with("t-own-"))
    })
    .await;
    assert!(left.iter().all(|t| t.starts_with("t-")), "{left:?}");
    assert!(
        other.prune_reads() > 0,
        "the other ledger read the transfers"
    );
}

/// Item 5: the lease is checked at every engine attempt, not only when the op is queued. A
/// worker stalled right before its apply (past its deadline) writes nothing.
#[tokio::test]
async fn an_apply_past_its_deadline_writes_nothing() {
    let base = support::ledger("eb-deadline").await;
    open(&base, "A", 1_000).await;
    open(&base, "B", 0).await;
    let before_a = account_doc(&base, "A").await;
    let before_b = account_doc(&base, "B").await;
    let lease = Duration::from_millis(600);
    // The hook runs after the drive's own deadline check: the stall is the paused worker.
    let hook = PauseHook(Arc::new(move |phase| {
        let stall = phase == "apply";
        Box::pin(async move {
            if stall {
                tokio::time::sleep(lease + Duration::from_millis(200)).await;
            }
        })
    }));
    let l = base
        .to_builder()
        .lease(lease)
        .pause_hook(hook)
        .build()
        .unwrap();
    let result = l.submit(request("t-late", "A", "B", 100), true).await;
    match &result {
        Ok(o) => assert_ne!(o.state, State::Done, "a late apply landed: {o:?}"),
        Err(e) => assert!(e.is_transient(), "{e}"),
    }
    let after_a = account_doc(&l, "A").await;
    let after_b = account_doc(&l, "B").await;
    assert_eq!(after_a["_rev"], before_a["_rev"], "account A was written");
    assert_eq!(after_b["_rev"], before_b["_rev"], "account B was written");
    assert_eq!(after_a["balance"], 1_000);
}

/// Item 8: an account under a burst of transfers never holds more than the marker cap; the
/// applies past it are refused with a transient error, nothing half-written on that account.
#[tokio::test]
async fn an_account_under_a_burst_stays_under_the_cap() {
    let l = support::ledger("eb-cap").await;
    open(&l, "A", 1_000_000).await;
    open(&l, "B", 0).await;
    // Young entries (never prunable) filling the cap but for room for two more markers.
    let id_len = 190;
    let per = id_len + MARKER_OVERHEAD_BYTES;
    let burst_key = entry_key("burst-00", "A", "B", Amount::new(1).unwrap(), "EUR", None);
    let burst_marker = burst_key.len() + MARKER_OVERHEAD_BYTES;
    let n = (MARKERS_BYTES_MAX - 2 * burst_marker - burst_marker / 2) / per;
    let now = now_ms();
    let settled: Vec<Value> = (0..n)
        .map(|i| json!({"txn": format!("{i:0>190}"), "at": now}))
        .collect();
    plant_settled(&l, "A", settled).await;
    let room = MARKERS_BYTES_MAX - n * per;
    assert!(room >= 2 * burst_marker, "{room}");

    let mut burst = tokio::task::JoinSet::new();
    for i in 0..10 {
        let l = l.clone();
        burst.spawn(async move {
            l.submit(request(&format!("burst-{i:02}"), "A", "B", 1), true)
                .await
        });
    }
    let results = burst.join_all().await;
    let refused = results
        .iter()
        .filter(
            |r| matches!(r, Err(e) if e.is_transient() && e.to_string().contains("account_full")),
        )
        .count();
    assert!(refused >= 1, "no apply was refused: {results:?}");
    let doc = account_doc(&l, "A").await;
    let pending = doc["pending"].as_array().unwrap().iter();
    let markers: usize = pending
        .map(|m| m["txn"].as_str().unwrap().to_owned())
        .chain(
            support::settled_entries(&doc)
                .into_iter()
                .map(|(txn, _)| txn),
        )
        .map(|txn| txn.len() + MARKER_OVERHEAD_BYTES)
        .sum();
    assert!(
        markers <= MARKERS_BYTES_MAX,
        "{markers} > {MARKERS_BYTES_MAX}"
    );
    let size = serde_json::to_vec(&doc).unwrap().len();
    assert!(size < 1_000_000 * 2 / 3, "account is {size} bytes");
}

/// Item 8: a 413 is reported as too large, and not retried as is.
#[tokio::test]
async fn a_413_is_too_large_and_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/db/_bulk_docs"))
        .respond_with(ResponseTemplate::new(413).set_body_json(
            json!({"error": "document_too_large", "reason": "request entity too large"}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    let client = Client::builder()
        .url(server.uri())
        .database("db")
        .retry(RetryPolicy {
            retries_max: 5,
            delay_base: Duration::from_millis(1),
            delay_max: Duration::from_millis(5),
            retry_after_max: Duration::from_millis(5),
        })
        .build()
        .unwrap();
    let e = client
        .bulk_docs(&[json!({"_id": "account:a", "type": "account"})])
        .await
        .unwrap_err();
    assert!(e.is_too_large(), "{e}");
    assert!(!e.is_transient(), "{e}");
    server.verify().await;
}

/// A stand-in server that keeps documents in memory and answers 413 to any `_bulk_docs` of
/// more than one document, as a server with a small request limit would to a batch of large
/// accounts. (No real server here refuses by size on demand.)
struct SmallRequests {
    docs: std::sync::Mutex<std::collections::HashMap<String, Value>>,
    refused: std::sync::atomic::AtomicUsize,
}

impl wiremock::Respond for SmallRequests {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let mut docs = self.docs.lock().unwrap();
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        match request.url.path() {
            "/db/_bulk_docs" => {
                let batch = body["docs"].as_array().cloned().unwrap_or_default();
                if batch.len() > 1 {
                    self.refused
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return ResponseTemplate::new(413).set_body_json(
                        json!({"error": "too_large", "reason": "the request entity is too large"}),
                    );
                }
                let mut out = Vec::new();
                for mut d in batch {
                    let id = d["_id"].as_str().unwrap().to_owned();
                    let n = docs.get(&id).map_or(0, |old| {
                        old["_rev"]
                            .as_str()
                            .unwrap()
                            .split('-')
                            .next()
                            .unwrap()
                            .parse()
                            .unwrap()
                    });
                    let rev = format!("{}-{:032x}", n + 1, fastrand::u128(..));
                    d["_rev"] = json!(rev);
                    docs.insert(id.clone(), d);
                    out.push(json!({"ok": true, "id": id, "rev": rev}));
                }
                ResponseTemplate::new(201).set_body_json(out)
            }
            "/db/_all_docs" => {
                let rows: Vec<Value> = body["keys"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|k| match docs.get(k.as_str().unwrap()) {
                        Some(d) => {
                            json!({"id": k, "key": k, "value": {"rev": d["_rev"]}, "doc": d})
                        }
                        None => json!({"key": k, "error": "not_found"}),
                    })
                    .collect();
                ResponseTemplate::new(200)
                    .set_body_json(json!({"total_rows": rows.len(), "rows": rows}))
            }
            other => {
                let id = percent_decode(other.trim_start_matches("/db/"));
                match docs.get(&id) {
                    Some(d) => ResponseTemplate::new(200).set_body_json(d.clone()),
                    None => ResponseTemplate::new(404)
                        .set_body_json(json!({"error": "not_found", "reason": "missing"})),
                }
            }
        }
    }
}

fn percent_decode(s: &str) -> String {
    s.replace("%3A", ":").replace("%3a", ":")
}

/// When the server refuses a write as too large (413), the engine splits it
/// and sends the parts, instead of failing the transfer or resending the same request.
#[tokio::test]
async fn the_engine_splits_a_write_the_server_finds_too_large() {
    let server = MockServer::start().await;
    let stand_in = Arc::new(SmallRequests {
        docs: Default::default(),
        refused: Default::default(),
    });
    for (id, opening) in [("A", 1_000), ("B", 0)] {
        stand_in.docs.lock().unwrap().insert(
            format!("account:{id}"),
            json!({"_id": format!("account:{id}"), "_rev": "1-a", "type": "account",
                   "account_id": id, "currency": "EUR", "opening": opening, "balance": opening,
                   "min_balance": 0, "pending": [], "settled": []}),
        );
    }
    struct Shared(Arc<SmallRequests>);
    impl wiremock::Respond for Shared {
        fn respond(&self, r: &wiremock::Request) -> ResponseTemplate {
            self.0.respond(r)
        }
    }
    Mock::given(wiremock::matchers::any())
        .respond_with(Shared(stand_in.clone()))
        .mount(&server)
        .await;
    let client = Client::builder()
        .url(server.uri())
        .database("db")
        .build()
        .unwrap();
    let l = Ledger::new(client);
    let o = l.submit(request("big", "A", "B", 250), true).await.unwrap();
    assert_eq!(o.state, State::Done, "{o:?}");
    assert!(
        stand_in.refused.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the two accounts were never sent together: nothing to split"
    );
    let docs = stand_in.docs.lock().unwrap();
    assert_eq!(docs["account:A"]["balance"], 750);
    assert_eq!(docs["account:B"]["balance"], 250);
    assert_eq!(docs["txn:big"]["state"], "done");
}
