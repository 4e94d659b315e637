//! The cluster-like harness: three replicating pouchdb-server nodes behind a
//! round-robin proxy do what a CouchDB cluster does — writes spread to every node, a `_rev`
//! compare-and-swap through two nodes can succeed twice and leave a conflict, a planted
//! sibling conflicts everywhere — and the ledger runs through the proxy.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support;
use crate::support::trio::{self, get_json, put_json, Balance, Trio};
use couch_ledger::{AccountSpec, Amount, Client, Currency, Ledger, State, TransferRequest};

const CONVERGE: Duration = Duration::from_secs(30);

async fn trio_db(test: &str) -> (Trio, String) {
    let trio = Trio::start().await;
    let db = support::db_name(test);
    trio.database(&db).await;
    (trio, db)
}

/// PUTs `body` as `id` (at `rev`) on the server at `url`; the status and the new revision.
async fn put_doc(url: &str, db: &str, id: &str, rev: Option<&str>, body: Value) -> (u16, String) {
    let mut body = body;
    if let Some(rev) = rev {
        body["_rev"] = json!(rev);
    }
    let (status, reply) = put_json(&format!("{url}/{db}/{id}"), &body).await;
    (
        status.as_u16(),
        reply["rev"].as_str().unwrap_or_default().to_owned(),
    )
}

/// `id` on node `url` with `?conflicts=true`: its winning rev and its sorted `_conflicts`.
async fn winner_and_conflicts(url: &str, db: &str, id: &str) -> (String, Vec<String>) {
    let doc = get_json(&format!("{url}/{db}/{id}?conflicts=true"))
        .await
        .unwrap_or_else(|| panic!("{id} on {url}"));
    let mut conflicts: Vec<String> = doc["_conflicts"]
        .as_array()
        .map(|a| a.iter().map(|r| r.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    conflicts.sort();
    (doc["_rev"].as_str().unwrap().to_owned(), conflicts)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test]
async fn a_write_through_the_proxy_reaches_all_three_nodes() {
    let (trio, db) = trio_db("cluster spread").await;
    let proxy = trio.url();

    // Ten writes through the proxy, each waited for on all three nodes.
    let mut times = Vec::new();
    for n in 0..10 {
        let id = format!("doc{n}");
        let (status, rev) = put_doc(&proxy, &db, &id, None, json!({"n": n})).await;
        assert_eq!(status, 201, "PUT {id} through the proxy");
        let (took, state) = trio.wait_converged(&db, CONVERGE).await;
        times.push(took);
        assert_eq!(state.doc_count, n + 1);
        for url in trio.node_urls() {
            let doc = get_json(&format!("{url}/{db}/{id}")).await.unwrap();
            assert_eq!(
                (doc["_rev"].as_str(), &doc["n"]),
                (Some(rev.as_str()), &json!(n))
            );
        }
    }
    // An update through the proxy replicates too (it lands on another node than the create).
    let (rev0, _) = winner_and_conflicts(&trio.node(0), &db, "doc0").await;
    let (status, rev1) = put_doc(&proxy, &db, "doc0", Some(rev0.as_str()), json!({"n": 100})).await;
    assert_eq!(status, 201);
    let (took, _) = trio.wait_converged(&db, CONVERGE).await;
    times.push(took);
    for url in trio.node_urls() {
        assert_eq!(
            winner_and_conflicts(&url, &db, "doc0").await,
            (rev1.clone(), vec![])
        );
    }
    // Every node served requests.
    for (i, n) in trio.forwarded.iter().enumerate() {
        assert!(
            n.load(std::sync::atomic::Ordering::Relaxed) > 0,
            "node {i} got no request"
        );
    }
    // `_local` documents stay on their node: one written before a normal document is not on
    // the others once that later document has arrived everywhere.
    let (status, _) = put_json(&format!("{}/{db}/_local/here", trio.node(0)), &json!({})).await;
    assert!(status.is_success());
    put_doc(&trio.node(0), &db, "after_local", None, json!({})).await;
    trio.wait_converged(&db, CONVERGE).await;
    assert!(get_json(&format!("{}/{db}/_local/here", trio.node(0)))
        .await
        .is_some());
    for i in 1..3 {
        assert!(
            get_json(&format!("{}/{db}/_local/here", trio.node(i)))
                .await
                .is_none(),
            "_local replicated to node {i}"
        );
    }
    times.sort();
    eprintln!(
        "CLUSTER convergence after one write: p50 {:?} max {:?} over {} writes",
        percentile(&times, 0.5),
        times.last().unwrap(),
        times.len()
    );
}

#[tokio::test]
async fn two_writers_on_one_rev_through_two_nodes_both_succeed_and_conflict() {
    let (trio, db) = trio_db("cluster two writers").await;
    let n0 = trio.node(0);

    // One node alone is exclusive: the second write of the same rev is 409.
    let (_, r1) = put_doc(&n0, &db, "solo", None, json!({"v": 0})).await;
    assert_eq!(
        put_doc(&n0, &db, "solo", Some(r1.as_str()), json!({"v": 1}))
            .await
            .0,
        201
    );
    assert_eq!(
        put_doc(&n0, &db, "solo", Some(r1.as_str()), json!({"v": 2}))
            .await
            .0,
        409
    );

    // Two nodes are not: the same parent, two bodies, at the same moment.
    let (hot, a, b) = race_until_both_win(
        &trio,
        &db,
        "hot",
        json!({"balance": 90, "by": "one"}),
        json!({"balance": 80, "by": "two"}),
    )
    .await;
    assert_ne!(a, b);
    trio.wait_converged(&db, CONVERGE).await;
    let win = trio::winner(&[&a, &b]).to_owned();
    let lose = if win == a { b.clone() } else { a.clone() };
    for url in trio.node_urls() {
        assert_eq!(
            winner_and_conflicts(&url, &db, &hot).await,
            (win.clone(), vec![lose.clone()]),
            "on {url}"
        );
        let mut both = vec![win.clone(), lose.clone()];
        both.sort();
        assert_eq!(trio::leaves(&url, &db, &hot).await, both);
    }
    assert_eq!(
        trio.conflicts(&db).await.into_keys().collect::<Vec<_>>(),
        [hot]
    );

    // Identical bodies on the same parent make the same revision: no conflict.
    let body = json!({"balance": 70});
    let (same, a, b) = race_until_both_win(&trio, &db, "same", body.clone(), body).await;
    assert_eq!(a, b, "same parent and body, same revision id");
    trio.wait_converged(&db, CONVERGE).await;
    for url in trio.node_urls() {
        assert_eq!(
            winner_and_conflicts(&url, &db, &same).await,
            (a.clone(), vec![])
        );
    }
    assert!(!trio.conflicts(&db).await.contains_key(&same));
}

/// Writes a new document `{prefix}-{try}` on node 0, waits until every node has it, then PUTs
/// `body_a` through node 1 and `body_b` through node 2 on its revision at the same moment,
/// until both writers succeed: the document's id and the two new revisions. A try where
/// replication carried one write to the other node before the other writer's request arrived
/// (that writer answered 409, as one node does) is left behind and the race run again on a
/// new document; the loaded machines CI runs on make that happen now and then. Panics when
/// ten tries never had both win.
async fn race_until_both_win(
    trio: &Trio,
    db: &str,
    prefix: &str,
    body_a: Value,
    body_b: Value,
) -> (String, String, String) {
    let (n0, n1, n2) = (trio.node(0), trio.node(1), trio.node(2));
    let mut outcomes = Vec::new();
    for attempt in 0..10 {
        let id = format!("{prefix}-{attempt}");
        let (_, parent) = put_doc(&n0, db, &id, None, json!({"balance": 100})).await;
        trio.wait_converged(db, CONVERGE).await;
        let (a, b) = tokio::join!(
            put_doc(&n1, db, &id, Some(parent.as_str()), body_a.clone()),
            put_doc(&n2, db, &id, Some(parent.as_str()), body_b.clone()),
        );
        if (a.0, b.0) == (201, 201) {
            return (id, a.1, b.1);
        }
        outcomes.push((a.0, b.0));
    }
    panic!("two writers of one revision never both succeeded on their nodes: {outcomes:?}");
}

#[tokio::test]
async fn two_writers_race_fifty_times() {
    let (trio, db) = trio_db("cluster race").await;
    let [n0, n1, n2] = [trio.node(0), trio.node(1), trio.node(2)];
    const TRIES: usize = 50;
    let docs: Vec<Value> = (0..TRIES)
        .map(|i| json!({"_id": format!("r{i:02}"), "v": 0}))
        .collect();
    let (status, reply) =
        trio::post_json(&format!("{n0}/{db}/_bulk_docs"), &json!({"docs": docs})).await;
    assert!(status.is_success(), "{reply}");
    let parents: Vec<String> = reply
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rev"].as_str().unwrap().to_owned())
        .collect();
    trio.wait_converged(&db, CONVERGE).await;

    // Each try: one document, its rev written through nodes 1 and 2 at the same moment.
    let mut both_ok = 0;
    let mut outcomes = std::collections::BTreeMap::new();
    for (i, parent) in parents.iter().enumerate() {
        let id = format!("r{i:02}");
        let (a, b) = tokio::join!(
            put_doc(&n1, &db, &id, Some(parent), json!({"v": 1})),
            put_doc(&n2, &db, &id, Some(parent), json!({"v": 2})),
        );
        *outcomes.entry((a.0, b.0)).or_insert(0) += 1;
        if (a.0, b.0) == (201, 201) {
            both_ok += 1;
        }
    }
    let (took, _) = trio.wait_converged(&db, CONVERGE).await;
    let conflicts = trio.conflicts(&db).await;
    eprintln!(
        "CLUSTER race: {} of {TRIES} pairs both 201, {} documents in conflict, outcomes {outcomes:?}, converged in {took:?}",
        both_ok,
        conflicts.len()
    );
    assert_eq!(
        conflicts.len(),
        both_ok,
        "every double success is one conflict"
    );
    assert!(both_ok > 0, "the race never produced a conflict");
    for (id, revs) in &conflicts {
        assert_eq!(revs.len(), 1, "{id}: {revs:?}");
    }
}

#[tokio::test]
async fn a_planted_sibling_conflicts_on_all_three_nodes() {
    let (trio, db) = trio_db("cluster planted").await;
    let n0 = trio.node(0);

    // Without validation: the direct `new_edits: false` write.
    let (_, first) = put_doc(&n0, &db, "plain", None, json!({"v": 1})).await;
    trio.wait_converged(&db, CONVERGE).await;
    let planted = trio
        .plant_sibling(&db, "plain", &json!({"v": "planted"}))
        .await;
    assert!(
        planted.starts_with("1-"),
        "a sibling of a first revision is a new root"
    );

    // With a `validate_doc_update` (pouchdb-server drops the direct write: the fallback),
    // a sibling of a second revision, made to win.
    let ddoc = json!({"validate_doc_update":
        "function (newDoc) { if (newDoc.forbidden) throw({forbidden: 'no'}); }"});
    put_doc(&n0, &db, "_design/v", None, ddoc).await;
    let (_, r1) = put_doc(&n0, &db, "guarded", None, json!({"v": 1})).await;
    let (_, r2) = put_doc(&n0, &db, "guarded", Some(r1.as_str()), json!({"v": 2})).await;
    trio.wait_converged(&db, CONVERGE).await;
    let wins = trio::plant_sibling(
        &trio.node(1),
        &db,
        "guarded",
        &json!({"v": "planted"}),
        Some(&"f".repeat(32)),
    )
    .await;
    assert_eq!(wins, format!("2-{}", "f".repeat(32)));

    trio.wait_converged(&db, CONVERGE).await;
    for url in trio.node_urls() {
        let expect_plain = trio::winner(&[&first, &planted]).to_owned();
        let other = if expect_plain == first {
            planted.clone()
        } else {
            first.clone()
        };
        assert_eq!(
            winner_and_conflicts(&url, &db, "plain").await,
            (expect_plain, vec![other])
        );
        assert_eq!(
            winner_and_conflicts(&url, &db, "guarded").await,
            (wins.clone(), vec![r2.clone()])
        );
        let doc = get_json(&format!("{url}/{db}/guarded")).await.unwrap();
        assert_eq!(doc["v"], "planted");
    }
    let conflicts = trio.conflicts(&db).await;
    assert_eq!(conflicts.keys().collect::<Vec<_>>(), ["guarded", "plain"]);
}

#[tokio::test]
async fn the_ledger_works_through_the_round_robin_proxy() {
    // Per connection: the ledger reads its own writes back (on a per-request proxy a read
    // often reaches a node the write has not replicated to yet: an account just created is
    // unknown, the transfer just written is 404 — pouchdb nodes are w = r = 1).
    let trio = Trio::start_with(Balance::PerConnection).await;
    let db = support::db_name("cluster ledger");
    trio.database(&db).await;
    let through_proxy = || {
        Ledger::new(
            Client::builder()
                .url(trio.url())
                .database(&db)
                .request_timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
        )
    };
    // One ledger sets up (its connection goes to one node)...
    let setup = through_proxy();
    let report = setup.init().await.expect("init through the proxy");
    assert!(
        !report.created,
        "the trio created the database on every node"
    );
    let eur = Currency::from_code("EUR").unwrap();
    for (id, opening) in [("A", 100_000), ("B", 100_000)] {
        setup
            .create_account(AccountSpec {
                account_id: id.into(),
                currency: eur,
                opening: Amount::new(opening).unwrap(),
                min_balance: Some(Amount::new(0).unwrap()),
                meta: Default::default(),
            })
            .await
            .expect("create account through the proxy");
    }
    // ...replication brings the design documents and accounts to every node...
    let (_, state) = trio.wait_converged(&db, CONVERGE).await;
    assert!(state
        .docs
        .iter()
        .any(|(id, _, _)| id.starts_with("_design/")));
    // ...and another (its own connection: the next node) transfers.
    let worker = through_proxy();
    let request = TransferRequest {
        id: Some("t1".into()),
        source: "A".into(),
        destination: "B".into(),
        amount: Amount::new(10_000).unwrap(),
        currency: eur,
        meta: Default::default(),
    };
    let outcome = worker
        .submit(request, true)
        .await
        .expect("transfer through the proxy");
    assert_eq!(outcome.state, State::Done, "{outcome:?}");
    let used: Vec<usize> = trio
        .forwarded
        .iter()
        .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    assert!(
        used.iter().filter(|&&n| n > 0).count() >= 2,
        "two nodes served: {used:?}"
    );

    // Every node ends with the transfer done and the money moved.
    trio.wait_converged(&db, CONVERGE).await;
    assert!(trio.conflicts(&db).await.is_empty());
    for url in trio.node_urls() {
        let on_node = Ledger::new(Client::builder().url(&url).database(&db).build().unwrap());
        let t = on_node.transfer("t1").await.unwrap();
        assert_eq!(
            (t.state, t.amount.minor()),
            (State::Done, 10_000),
            "on {url}"
        );
        let a = on_node.account("A").await.unwrap().balance.minor();
        let b = on_node.account("B").await.unwrap().balance.minor();
        assert_eq!((a, b), (90_000, 110_000), "on {url}");
    }
    eprintln!("CLUSTER ledger: t1 done on every node; requests per node {used:?}");
}
