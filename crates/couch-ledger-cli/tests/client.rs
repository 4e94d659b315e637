use serde_json::{json, Value};

use crate::support;
use couch_ledger::{ChangesQuery, ViewQuery};

#[tokio::test]
async fn put_get_conflict_and_delete() {
    let c = support::client("put_get").await;
    let w = c
        .put("doc:1", &json!({"type": "note", "n": 1}))
        .await
        .unwrap();
    assert!(w.rev.starts_with("1-"));
    assert!(!w.accepted);
    let doc: Value = c.get("doc:1").await.unwrap();
    assert_eq!(doc["n"], 1);
    // A write without the current _rev is a conflict the caller can match on.
    let e = c
        .put("doc:1", &json!({"type": "note", "n": 2}))
        .await
        .unwrap_err();
    assert!(e.is_conflict(), "{e}");
    let w2 = c
        .put("doc:1", &json!({"type": "note", "n": 2, "_rev": w.rev}))
        .await
        .unwrap();
    assert!(w2.rev.starts_with("2-"));
    c.delete("doc:1", &w2.rev).await.unwrap();
    assert!(c.get_opt::<Value>("doc:1").await.unwrap().is_none());
    let e = c.get::<Value>("doc:1").await.unwrap_err();
    assert!(e.is_not_found());
}

#[tokio::test]
async fn ids_with_odd_characters_round_trip_and_reserved_ids_are_refused() {
    let c = support::client("odd_ids").await;
    for id in ["a b/c?d#e%f", "payment:o1:ref+1", "ünïcode:€", "colon:only"] {
        c.put(id, &json!({"type": "note"})).await.unwrap();
        let doc: Value = c.get(id).await.unwrap();
        assert_eq!(doc["_id"], id);
    }
    for bad in ["_users", "_all_docs", "", "tab\there"] {
        let e = c.put(bad, &json!({})).await.unwrap_err();
        assert!(e.is_invalid_input(), "{bad:?}: {e}");
    }
    // A missing database is an error, not a missing document.
    let other = c.with_database("t_never_created_db").unwrap();
    assert!(other.get_opt::<Value>("x").await.is_err());
}

#[tokio::test]
async fn bulk_docs_report_each_document() {
    let c = support::client("bulk").await;
    c.put("b:2", &json!({"type": "note"})).await.unwrap();
    let results = c
        .bulk_docs(&[
            json!({"_id": "b:1", "type": "note"}),
            json!({"_id": "b:2", "type": "note"}),
            json!({"_id": "b:3", "type": "note"}),
        ])
        .await
        .unwrap();
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok());
    assert!(results[1].is_conflict());
    assert!(results[2].is_ok());
    let rows = c
        .all_docs(&["b:1".into(), "nope".into(), "b:3".into()], true)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].doc.as_ref().unwrap()["_id"], "b:1");
    assert_eq!(rows[1].error.as_deref(), Some("not_found"));
}

#[tokio::test]
async fn views_changes_uuids_local_and_security() {
    let c = support::client("views").await;
    support::put_on_every_copy(
        &c,
        "_design/t",
        &json!({"views": {"v": {"map": "function(doc){ if (doc.k) emit(doc.k, doc.n); }", "reduce": "_sum"}}}),
    )
    .await;
    // On every copy: the view below is answered by one copy of each shard range.
    for (i, k) in ["a", "a", "b"].iter().enumerate() {
        support::put_on_every_copy(&c, &format!("d{i}"), &json!({"k": k, "n": i + 1})).await;
    }
    let r = c
        .view(
            "t",
            "v",
            &ViewQuery {
                group: Some(true),
                key: Some(json!("a")),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.rows[0].value, json!(3));
    let r = c
        .view(
            "t",
            "v",
            &ViewQuery {
                reduce: Some(false),
                keys: Some(vec![json!("b")]),
                include_docs: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.rows[0].doc.as_ref().unwrap()["_id"], "d2");

    let ch = c.changes(&ChangesQuery::default()).await.unwrap();
    assert_eq!(ch.results.len(), 4);
    let ch = c
        .changes(&ChangesQuery {
            doc_ids: Some(vec!["d1".into()]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ch.results.len(), 1);
    assert_eq!(ch.results[0].id, "d1");

    // A longpoll since the end wakes on the next write.
    let since = ch.last_seq.clone();
    let all = c.changes(&ChangesQuery::default()).await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move {
        c2.changes(&ChangesQuery {
            since: Some(all.last_seq),
            longpoll: true,
            timeout: Some(std::time::Duration::from_secs(20)),
            ..Default::default()
        })
        .await
    });
    c.put("late", &json!({"k": "z"})).await.unwrap();
    let woke = waiter.await.unwrap().unwrap();
    assert!(
        woke.results.iter().any(|r| r.id == "late"),
        "{woke:?} since {since}"
    );

    let ids = c.uuids(3).await.unwrap();
    assert_eq!(ids.len(), 3);
    assert_ne!(ids[0], ids[1]);

    assert!(c.get_local::<Value>("cursor").await.unwrap().is_none());
    c.put_local("cursor", &json!({"seq": 5})).await.unwrap();
    let l: Value = c.get_local("cursor").await.unwrap().unwrap();
    assert_eq!(l["seq"], 5);

    let sec = c.security().await.unwrap();
    assert!(sec.is_object());
}

#[tokio::test]
async fn continuous_changes_stream_yields_rows() {
    let c = support::client("stream").await;
    c.put("s1", &json!({"type": "note"})).await.unwrap();
    let mut stream = c
        .changes_stream(&ChangesQuery::default(), std::time::Duration::from_secs(20))
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.id, "s1");
    c.put("s2", &json!({"type": "note"})).await.unwrap();
    let second = stream.next().await.unwrap().unwrap();
    assert_eq!(second.id, "s2");
}

/// `init` keeps the accounts' revision history short where the server has `_revs_limit`
/// (CouchDB, Cloudant; pouchdb-server has none, and `init` says so with `None`): to
/// `REVS_LIMIT_ONE_COPY` where the database keeps one copy of each document, else to
/// `REVS_LIMIT`; and never raises a limit an admin set lower.
#[tokio::test]
async fn init_lowers_the_revs_limit_and_never_raises_it() {
    use couch_ledger::testing::limits::{REVS_LIMIT, REVS_LIMIT_ONE_COPY};
    let l = couch_ledger::Ledger::new(support::builder("revs_limit").build().unwrap());
    let first = l.init().await.unwrap();
    let now = l.client().revs_limit().await.unwrap();
    assert_eq!(first.revs_limit, now, "init reports what the server has");
    let Some(limit) = now else {
        return; // a server without the setting: nothing more to see
    };
    let target = if l.client().stated_copies().await.unwrap() == Some(1) {
        REVS_LIMIT_ONE_COPY
    } else {
        REVS_LIMIT
    };
    assert_eq!(limit, target);
    l.client().set_revs_limit(target - 1).await.unwrap();
    assert_eq!(l.init().await.unwrap().revs_limit, Some(target - 1));
    assert_eq!(l.client().revs_limit().await.unwrap(), Some(target - 1));
    l.client().set_revs_limit(1000).await.unwrap();
    assert_eq!(l.init().await.unwrap().revs_limit, Some(target));
    assert_eq!(l.client().revs_limit().await.unwrap(), Some(target));

    // Split: the limit is the hot database's, where the accounts are.
    let hot = format!("{}_hot", l.client().database());
    let split = couch_ledger::Ledger::builder(l.client().clone())
        .hot_database(&hot)
        .build()
        .unwrap();
    let report = split.init().await.unwrap();
    assert_eq!(report.revs_limit, Some(target));
    assert_eq!(split.hot_client().revs_limit().await.unwrap(), Some(target));
    split.hot_client().delete_database().await.unwrap();
}

#[tokio::test]
async fn init_installs_design_docs_once() {
    let l = couch_ledger::Ledger::new(support::builder("init_twice").build().unwrap());
    let first = l.init().await.unwrap();
    assert!(first.created);
    assert_eq!(first.design_docs.len(), 3);
    assert!(first
        .design_docs
        .iter()
        .all(|d| d.status == couch_ledger::design::InstallStatus::Created));
    let before = support::db_snapshot(l.client().database()).await;
    let second = l.init().await.unwrap();
    assert!(!second.created);
    assert!(second
        .design_docs
        .iter()
        .all(|d| d.status == couch_ledger::design::InstallStatus::Unchanged));
    let after = support::db_snapshot(l.client().database()).await;
    assert_eq!(before, after, "a second init must write nothing");

    // Drift (a hand edit) is repaired and reported as updated.
    let mut doc: Value = l.client().get("_design/orders").await.unwrap();
    doc["views"]["ledger"]["map"] = json!("function(doc){}");
    l.client().put("_design/orders", &doc).await.unwrap();
    let third = l.init().await.unwrap();
    let orders = third
        .design_docs
        .iter()
        .find(|d| d.id == "_design/orders")
        .unwrap();
    assert_eq!(orders.status, couch_ledger::design::InstallStatus::Updated);
}

/// An earlier version's `_design/accounts` (the account views before they moved into
/// `_design/transactions`) is drift until `init` deletes it; one of that name that is not ours
/// is left alone.
#[tokio::test]
async fn init_removes_the_design_document_an_earlier_version_installed() {
    use couch_ledger::design::{drift, InstallStatus};
    let l = couch_ledger::Ledger::new(support::builder("init_retired").build().unwrap());
    l.init().await.unwrap();
    let old = json!({
        "language": "javascript",
        "views": {"balances": {"map": "function (doc) { emit(doc._id, 1); }", "reduce": "_sum"}},
        "couch_ledger_checksum": "0".repeat(64),
    });
    let retired = || l.client().get_opt::<Value>("_design/accounts");
    l.client().put("_design/accounts", &old).await.unwrap();
    let drifted = drift(l.client()).await.unwrap();
    assert_eq!(
        drifted
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
        ["_design/accounts"],
        "{drifted:?}"
    );

    let again = l.init().await.unwrap();
    let statuses: Vec<(&str, InstallStatus)> = again
        .design_docs
        .iter()
        .map(|d| (d.id.as_str(), d.status))
        .collect();
    assert!(
        statuses.contains(&("_design/accounts", InstallStatus::Removed)),
        "{statuses:?}"
    );
    assert!(retired().await.unwrap().is_none());
    assert_eq!(drift(l.client()).await.unwrap(), vec![]);
    let third = l.init().await.unwrap();
    assert!(third
        .design_docs
        .iter()
        .all(|d| d.status == InstallStatus::Unchanged));

    // Somebody else's design document of that name: not ours to delete, not drift.
    let theirs = json!({"language": "javascript", "views": {}});
    l.client().put("_design/accounts", &theirs).await.unwrap();
    assert_eq!(drift(l.client()).await.unwrap(), vec![]);
    l.init().await.unwrap();
    assert!(retired().await.unwrap().is_some());
}
