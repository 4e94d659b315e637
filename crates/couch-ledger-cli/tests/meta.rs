//! Metadata on transfers, accounts and order entries: written once, returned wherever the
//! document is read, and transfers found by it a page at a time — through the library and the
//! command line (the service's side is in tests/serve/meta.rs).

use std::collections::BTreeSet;
use std::time::Duration;

use couch_ledger::{Ledger, MetaCursor, MetaQuery, Metadata, Payment, META_KEYS_MAX};
use serde_json::{json, Value};

use crate::cli::cli;
use crate::orders::purchase;
use crate::support::{self, eur, eur_transfer, open_account};

fn meta(pairs: &[(&str, &str)]) -> Metadata {
    let mut m = Metadata::new();
    for (k, v) in pairs {
        m.insert(*k, *v).unwrap();
    }
    m
}

/// Every page of the transfers with `key` = `value`, `limit` at a time: their ids in order.
async fn all_pages(l: &Ledger, key: &str, value: &str, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after: Option<MetaCursor> = None;
    loop {
        let mut q = MetaQuery::new(key, value);
        q.limit = limit;
        q.after = after.clone();
        let page = l.transfers_by_meta(&q).await.unwrap();
        assert!(
            page.transfers.len() <= limit,
            "a page holds at most its limit"
        );
        ids.extend(page.transfers.iter().map(|t| t.id.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => return ids,
        }
        assert!(ids.len() < 100, "the pages never end: {ids:?}");
    }
}

/// Waits until the view lists `want` transfers for the pair (a view may lag on a cluster).
async fn listed(l: &Ledger, key: &str, value: &str, want: usize) {
    support::wait_for(
        "the view to list the transfers",
        Duration::from_secs(30),
        || async {
            let mut q = MetaQuery::new(key, value);
            q.limit = 1000;
            let n = l.transfers_by_meta(&q).await.unwrap().transfers.len();
            (n == want).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn metadata_is_written_once_returned_everywhere_and_finds_transfers_page_by_page() {
    let l = support::ledger("meta_round_trip").await;
    let mut spec = couch_ledger::AccountSpec {
        account_id: "shop".into(),
        currency: eur(),
        opening: couch_ledger::Amount::new(100_000).unwrap(),
        min_balance: Some(couch_ledger::Amount::ZERO),
        meta: meta(&[("owner", "Ada"), ("tier", "gold")]),
    };
    l.create_account(spec.clone()).await.unwrap();
    open_account(&l, "bank", 0).await;
    let shop = l.account("shop").await.unwrap();
    assert_eq!(shop.meta, spec.meta, "an account's metadata reads back");
    // The same account again with other metadata: the same account, the first's kept.
    spec.meta = meta(&[("owner", "Eve")]);
    l.create_account(spec).await.unwrap();
    assert_eq!(
        l.account("shop").await.unwrap().meta.get("owner"),
        Some("Ada")
    );

    // Transfers by each path that writes a transfer's document, tagged with one order.
    let stepwise = l.to_builder().stepwise_transfers(true).build().unwrap();
    let order = meta(&[("order_id", "A-42"), ("channel", "web")]);
    let mut made = Vec::new();
    for (n, path) in ["one-write", "stepwise", "no-wait", "one-write", "one-write"]
        .iter()
        .enumerate()
    {
        let id = format!("t{n}");
        let mut r = eur_transfer(&id, "shop", "bank", 100 + n as i64);
        r.meta = order.clone();
        match *path {
            "stepwise" => stepwise.submit(r, true).await.unwrap(),
            "no-wait" => l.submit(r, false).await.unwrap(),
            _ => l.submit(r, true).await.unwrap(),
        };
        made.push(id);
    }
    // Another order's transfer and one without metadata are never listed.
    let mut other = eur_transfer("other", "shop", "bank", 1);
    other.meta = meta(&[("order_id", "A-43")]);
    l.submit(other, true).await.unwrap();
    l.submit(eur_transfer("plain", "shop", "bank", 1), true)
        .await
        .unwrap();
    support::sweep_until_none_open(&l, Duration::from_secs(60)).await;

    for id in &made {
        let t = l.transfer(id).await.unwrap();
        assert_eq!(t.meta, order, "{id}: its metadata reads back");
        assert!(t.decided_at.is_some(), "{id}: decided, and says when");
    }
    assert!(l.transfer("plain").await.unwrap().meta.is_empty());
    // A transfer sent again with other metadata is the same transfer, its first metadata kept.
    let mut again = eur_transfer("t0", "shop", "bank", 100);
    again.meta = meta(&[("order_id", "B-1")]);
    let o = l.submit(again, true).await.unwrap();
    assert_eq!(o.status, couch_ledger::RecordStatus::Exists);
    assert_eq!(l.transfer("t0").await.unwrap().meta, order);

    // Found by one pair, newest first by creation, in pages of every size; nothing else listed.
    listed(&l, "order_id", "A-42", made.len()).await;
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    for limit in [1, 2, 3, 1000] {
        let ids = all_pages(&l, "order_id", "A-42", limit).await;
        assert_eq!(
            ids.iter().collect::<BTreeSet<_>>(),
            made.iter().collect::<BTreeSet<_>>(),
            "limit {limit}: each transfer once"
        );
        assert_eq!(ids.len(), made.len(), "limit {limit}: no repeat");
        let times: Vec<i64> = creation_times(&l, &ids).await;
        assert!(
            times.windows(2).all(|w| w[0] >= w[1]),
            "limit {limit}: newest first: {ids:?} {times:?}"
        );
        assert_eq!(ids.len(), newest_first.len());
    }
    assert_eq!(all_pages(&l, "channel", "web", 2).await.len(), made.len());
    assert!(all_pages(&l, "order_id", "nothing", 5).await.is_empty());
    // A key or value metadata cannot hold is refused before anything is read.
    for (k, v) in [("a.b", "1"), ("k", ""), ("", "v")] {
        let e = l
            .transfers_by_meta(&MetaQuery::new(k, v))
            .await
            .unwrap_err();
        assert!(e.is_invalid_input(), "{k:?}={v:?}: {e}");
    }
}

/// The creation times of transfers `ids`, in that order.
async fn creation_times(l: &Ledger, ids: &[String]) -> Vec<i64> {
    let mut times = Vec::new();
    for id in ids {
        times.push(l.transfer(id).await.unwrap().created_at);
    }
    times
}

#[tokio::test]
async fn bad_metadata_is_refused_before_anything_is_written() {
    let l = support::ledger("meta_refused").await;
    open_account(&l, "a", 1_000).await;
    open_account(&l, "b", 0).await;
    let before = support::db_snapshot(l.client().database()).await;
    // Past the limits by building the map as a request body would (serde), not by `insert`.
    let too_many: Metadata = serde_json::from_value(json!((0..=META_KEYS_MAX)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect::<std::collections::BTreeMap<_, _>>()))
    .unwrap();
    let bad_key: Metadata = serde_json::from_value(json!({"no spaces": "v"})).unwrap();
    let control: Metadata = serde_json::from_value(json!({"k": "a\u{7}b"})).unwrap();
    for bad in [too_many, bad_key, control] {
        let mut r = eur_transfer("t", "a", "b", 10);
        r.meta = bad.clone();
        let e = l.submit(r, true).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        assert_eq!(e.field(), Some("meta"));
        let spec = couch_ledger::AccountSpec {
            account_id: "c".into(),
            currency: eur(),
            opening: couch_ledger::Amount::ZERO,
            min_balance: None,
            meta: bad,
        };
        assert_eq!(
            l.create_account(spec).await.unwrap_err().field(),
            Some("meta")
        );
    }
    assert_eq!(
        support::db_snapshot(l.client().database()).await,
        before,
        "nothing written"
    );
}

#[tokio::test]
async fn the_database_refuses_a_changed_or_malformed_metadata() {
    let l = support::ledger("meta_validated").await;
    l.create_account(couch_ledger::AccountSpec {
        account_id: "a".into(),
        currency: eur(),
        opening: couch_ledger::Amount::new(1_000).unwrap(),
        min_balance: Some(couch_ledger::Amount::ZERO),
        meta: meta(&[("k", "v")]),
    })
    .await
    .unwrap();
    open_account(&l, "b", 0).await;
    let mut r = eur_transfer("t", "a", "b", 10);
    r.meta = meta(&[("k", "v")]);
    l.submit(r, true).await.unwrap();
    let c = l.client();
    // On a cluster a read may come from a copy behind the last write, and a write over that
    // revision is a conflict before validation runs: read again until the copies agree.
    let write = |id: &'static str, change: Change| {
        let c = c.clone();
        async move {
            support::wait_for(id, Duration::from_secs(30), || async {
                let mut doc: Value = c.get(id).await.unwrap();
                change(&mut doc);
                match c.put(id, &doc).await {
                    Err(e) if e.is_conflict() => None,
                    written => Some(written),
                }
            })
            .await
        }
    };
    type Change = fn(&mut Value);
    let changes: [(&str, Change); 3] = [
        ("changed", |d| d["meta"] = json!({"k": "other"})),
        ("dropped", |d| {
            d.as_object_mut().unwrap().remove("meta");
        }),
        ("not text", |d| d["meta"] = json!({"k": 1})),
    ];
    for id in ["txn:t", "account:a"] {
        for (what, change) in changes {
            let e = write(id, change).await.unwrap_err();
            assert!(e.is_forbidden(), "{id} with its metadata {what}: {e}");
        }
    }
    // The same metadata written again is not a change.
    write("txn:t", |_| {}).await.unwrap();
}

#[tokio::test]
async fn order_entries_keep_their_metadata_and_show_it() {
    let l = support::ledger("meta_entries").await;
    l.record_purchase(&purchase("o1", "cust", 1_000, eur()))
        .await
        .unwrap();
    let p = Payment {
        order_id: "o1".into(),
        reference: "psp-1".into(),
        amount: couch_ledger::Amount::new(400).unwrap(),
        currency: eur(),
        method: None,
        meta: meta(&[("psp", "stripe"), ("charge", "ch_1")]),
    };
    l.record_payment(&p).await.unwrap();
    // The same payment with other metadata is the same entry (not a mismatch); the first's stays.
    let mut again = p.clone();
    again.meta = meta(&[("psp", "adyen")]);
    assert_eq!(
        l.record_payment(&again).await.unwrap().status,
        couch_ledger::RecordStatus::Exists
    );
    let summary = support::wait_for("the order's view", Duration::from_secs(30), || async {
        let s = l.order("o1").await.ok()?;
        (s.entries.len() == 2).then_some(s)
    })
    .await;
    let entry = summary
        .entries
        .iter()
        .find(|e| e.id == "payment:o1:psp-1")
        .unwrap();
    assert_eq!(entry.meta, p.meta);
}

#[tokio::test]
async fn the_command_line_attaches_shows_and_lists_metadata() {
    let l = support::ledger("meta_cli").await;
    let db = l.client().database().to_owned();
    let r = cli(
        &db,
        &[
            "account",
            "create",
            "a",
            "--currency",
            "EUR",
            "--opening",
            "50",
            "--meta",
            "owner=Ada",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    open_account(&l, "b", 0).await;
    let shown = cli(&db, &["--json", "account", "show", "a"]).await.json();
    assert_eq!(shown["meta"], json!({"owner": "Ada"}));
    for n in 0..3 {
        let id = format!("t{n}");
        let r = cli(
            &db,
            &[
                "transfer",
                "--from",
                "a",
                "--to",
                "b",
                "--amount",
                "1",
                "--currency",
                "EUR",
                "--id",
                &id,
                "--meta",
                "order=A-1",
                "--meta",
                "note=x=y",
            ],
        )
        .await;
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    let t = cli(&db, &["--json", "transfer", "show", "t0"]).await.json();
    assert_eq!(t["meta"], json!({"order": "A-1", "note": "x=y"}));
    assert!(t["decided_at"].as_i64().is_some(), "{t}");
    let words = cli(&db, &["transfer", "show", "t0"]).await.stdout;
    assert!(words.contains("meta       order=A-1"), "{words}");
    assert!(words.contains("decided"), "{words}");

    listed(&l, "order", "A-1", 3).await;
    let first = cli(
        &db,
        &[
            "--json",
            "transfer",
            "list",
            "--meta",
            "order=A-1",
            "--limit",
            "2",
        ],
    )
    .await
    .json();
    assert_eq!(first["transfers"].as_array().unwrap().len(), 2);
    let next = first["next"].as_str().expect("a next page").to_owned();
    let rest = cli(
        &db,
        &[
            "--json",
            "transfer",
            "list",
            "--meta",
            "order=A-1",
            "--after",
            &next,
        ],
    )
    .await
    .json();
    let mut ids: Vec<String> = first["transfers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["transfers"].as_array().unwrap())
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(rest["next"], Value::Null);
    ids.sort();
    assert_eq!(ids, ["t0", "t1", "t2"]);

    // Bad input is exit 2, names the flag, and writes nothing.
    let before = support::db_snapshot(&db).await;
    let transfer = |meta: &'static str| {
        let mut args = vec!["transfer", "--from", "a", "--to", "b", "--amount", "1"];
        args.extend(["--currency", "EUR", "--meta", meta]);
        args
    };
    for args in [
        transfer("novalue"),
        transfer("bad key=v"),
        vec!["transfer", "list", "--meta", "k"],
        vec!["transfer", "list", "--meta", "k=v", "--after", "nope"],
        vec!["transfer", "list", "--meta", "k=v", "--limit", "0"],
    ] {
        let r = cli(&db, &args).await;
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("--"),
            "{args:?} names the flag: {}",
            r.stderr
        );
    }
    assert_eq!(support::db_snapshot(&db).await, before, "nothing written");
}

#[tokio::test]
async fn an_account_created_event_carries_the_accounts_metadata() {
    let l = support::ledger("meta_account_event").await;
    let tagged = couch_ledger::AccountSpec {
        account_id: "tagged".into(),
        currency: eur(),
        opening: couch_ledger::Amount::new(500).unwrap(),
        min_balance: Some(couch_ledger::Amount::ZERO),
        meta: meta(&[("owner", "Ada")]),
    };
    l.create_account(tagged).await.unwrap();
    open_account(&l, "plain", 0).await;
    let query = couch_ledger::EventQuery {
        kinds: Some(vec![couch_ledger::EventKind::AccountCreated]),
        limit: 10,
        ..couch_ledger::EventQuery::default()
    };
    // On several copies the feed is read from one copy of each shard range, which may not hold
    // both accounts yet: read again for up to 15 s.
    let several = support::copies(l.hot_client().database()).await > 1;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let page = loop {
        let page = l.events(&query).await.unwrap();
        if page.events.len() >= 2 || !several || std::time::Instant::now() >= deadline {
            break page;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let data: Vec<(String, Value)> = page
        .events
        .iter()
        .map(|e| (e.id.clone(), serde_json::to_value(&e.data).unwrap()))
        .collect();
    assert_eq!(data.len(), 2, "{data:?}");
    for (id, d) in &data {
        let want = if d["account"] == "tagged" {
            json!({"owner": "Ada"})
        } else {
            json!({})
        };
        assert_eq!(d["meta"], want, "{id}: {d}");
    }
}
