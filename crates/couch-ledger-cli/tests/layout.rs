//! The split layout (docs/LAYOUT.md): accounts and transfers in a second database
//! that runs no validation, orders in the ledger's validated database. Everything a ledger
//! does must find its documents where they live: transfers, the sweeper, conflicts, `status`,
//! `verify`, `init`, `_security`.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support;
use crate::support::assert_at_rest;
use crate::support::{eur_transfer as request, open_account as open};
use couch_ledger::{
    AccountSpec, Amount, Currency, Ledger, Payment, Purchase, RecordStatus, State, SweepOptions,
    VerifyOptions,
};

fn now_sweep() -> SweepOptions {
    SweepOptions {
        limit: 100,
        stale_after: Duration::ZERO,
    }
}

/// The ids in database `db` (design documents included), read raw.
async fn ids_in(db: &str) -> BTreeSet<String> {
    support::db_snapshot(db)
        .await
        .revs
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

#[tokio::test]
async fn a_split_ledger_keeps_accounts_and_transfers_out_of_the_validated_database() {
    let l = support::split_ledger("split_basics").await;
    let main = l.client().database().to_owned();
    let hot = l.hot_database().expect("split").to_owned();
    assert_eq!(l.hot_client().database(), hot);

    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    let mut purchase = Purchase::from_json(
        include_str!("../../../examples/cloudant-purchase.json"),
        Some(Currency::from_code("GBP").unwrap()),
    )
    .unwrap();
    purchase.order_id = "o1".into();
    l.record_purchase(&purchase).await.unwrap();
    l.record_payment(&Payment {
        order_id: "o1".into(),
        reference: "p1".into(),
        amount: Amount::new(100).unwrap(),
        currency: Currency::from_code("GBP").unwrap(),
        method: None,
        meta: Default::default(),
    })
    .await
    .unwrap();
    let done = l.submit(request("t1", "A", "B", 250), true).await.unwrap();
    assert_eq!(done.state, State::Done);
    let refused = l
        .submit(request("t2", "A", "B", 5_000), true)
        .await
        .unwrap();
    assert_eq!(refused.state, State::Cancelled);
    assert_eq!(l.account("A").await.unwrap().balance.minor(), 750);
    assert_eq!(l.account("B").await.unwrap().balance.minor(), 250);
    assert_eq!(
        l.order_balance("o1").await.unwrap(),
        purchase
            .total
            .checked_sub(Amount::new(100).unwrap())
            .unwrap()
    );

    let main_ids = ids_in(&main).await;
    let hot_ids = ids_in(&hot).await;
    assert_eq!(
        main_ids,
        [
            "_design/orders",
            "_design/transactions",
            "_design/validation",
            "opening:A",
            "opening:B",
            "payment:o1:p1",
            "purchase:o1",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect(),
        "the ledger's database holds the history (the accounts' opening records included) and \
         the design documents"
    );
    assert_eq!(
        hot_ids,
        [
            "_design/transactions",
            "account:A",
            "account:B",
            "txn:t1",
            "txn:t2",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect(),
        "the hot database holds accounts, transfers and their views — no validation"
    );

    let status = l.status().await.unwrap();
    assert_eq!((status.states.done, status.states.cancelled), (1, 1));
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    assert!(report.ok, "{report:#?}");
    let exactly_once = report.check("exactly_once").unwrap();
    assert!(
        exactly_once.detail.contains("1 committed or done"),
        "{exactly_once:?}"
    );
    let design = report.check("design_documents").unwrap();
    assert!(design.detail.contains(&hot), "{design:?}");

    // A second init changes nothing, in either database.
    let again = l.init().await.unwrap();
    assert!(!again.created && !again.hot.as_ref().unwrap().created);
    assert!(again
        .design_docs
        .iter()
        .chain(&again.hot.unwrap().design_docs)
        .all(|d| d.status == couch_ledger::design::InstallStatus::Unchanged));

    // A ledger opened without the hot database does not see the split ledger's accounts.
    let unsplit = Ledger::new(l.client().clone());
    assert!(unsplit.account("A").await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn the_hot_database_must_be_another_database() {
    let client = support::builder("split_same").build().unwrap();
    let db = client.database().to_owned();
    let e = Ledger::builder(client.clone())
        .hot_database(&db)
        .build()
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e:?}");
    let e = Ledger::builder(client)
        .hot_database("Bad Name")
        .build()
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e:?}");
}

#[tokio::test]
async fn the_sweeper_finishes_transfers_left_in_the_hot_database() {
    let l = support::split_ledger("split_sweep").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    for i in 0..5 {
        let left = l
            .submit(request(&format!("s{i}"), "A", "B", 10), false)
            .await
            .unwrap();
        assert_eq!(left.state, State::Initial);
    }
    assert_eq!(l.status().await.unwrap().states.initial, 5);
    // Another worker (as another process would) sweeps.
    let sweeper = l.another_worker();
    let out = sweeper.sweep_once(now_sweep()).await.unwrap();
    assert_eq!((out.advanced, out.failed), (5, 0), "{out:?}");
    assert_eq!(l.account("B").await.unwrap().balance.minor(), 50);
    assert_at_rest(&l).await;
}

#[tokio::test]
async fn a_conflict_in_the_hot_database_is_reported_and_resolved() {
    // A cluster's conflict, planted: the entries a cluster keeps, on any server.
    let l = support::split_ledger("split_conflict")
        .await
        .to_builder()
        .settled_entries()
        .build()
        .unwrap();
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    l.submit(request("c1", "A", "B", 100), true).await.unwrap();
    let hot = l.hot_database().unwrap().to_owned();
    // A sibling of B that holds c1 undone, as another node could have written it: a merge
    // follows the transfer (done), so B keeps c1's credit.
    support::plant_sibling(&hot, "account:B", &"f".repeat(32), |doc| {
        doc["balance"] = json!(0);
        doc["settled"] = json!([{"txn": "c1", "at": 1, "undone": true}]);
    })
    .await;
    assert_eq!(l.status().await.unwrap().conflicts, 1);
    let report = l.verify().await.unwrap();
    let conflicts = report.check("conflicts").unwrap();
    assert!(!conflicts.ok, "{report:#?}");
    assert!(conflicts.documents.contains(&"account:B".to_owned()));

    let out = l.sweep_once(now_sweep()).await.unwrap();
    assert_eq!(
        (out.conflicts_resolved, out.conflicts_unresolved),
        (1, 0),
        "{out:?}"
    );
    assert_eq!(l.status().await.unwrap().conflicts, 0);
    assert_eq!(l.account("B").await.unwrap().balance.minor(), 100);
    assert_at_rest(&l).await;
}

#[tokio::test]
async fn restrict_to_role_guards_both_databases() {
    let l = support::split_ledger("split_role").await;
    l.restrict_to_role("ledger-writer").await.unwrap();
    for client in [l.client(), l.hot_client()] {
        // A cluster stores the security object with each shard copy and reads it from one, so
        // a read just after the write may meet a copy that has not taken it yet.
        let what = format!("{}'s members to be ledger-writer", client.database());
        support::wait_for(&what, Duration::from_secs(30), || async {
            let security: Value = client.security().await.unwrap();
            (security["members"]["roles"] == json!(["ledger-writer"])).then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn a_design_document_missing_from_the_hot_database_is_drift_and_init_repairs_it() {
    let l = support::split_ledger("split_drift").await;
    let hot = l.hot_client();
    let doc: Value = hot.get("_design/transactions").await.unwrap();
    hot.delete("_design/transactions", doc["_rev"].as_str().unwrap())
        .await
        .unwrap();
    let drift = l.design_drift().await.unwrap();
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert!(drift[0].1.contains(hot.database()), "{drift:?}");
    let again = l.init().await.unwrap();
    let hot_docs = again.hot.unwrap().design_docs;
    assert!(
        hot_docs.iter().any(|d| d.id == "_design/transactions"
            && d.status == couch_ledger::design::InstallStatus::Created),
        "{hot_docs:?}"
    );
    assert!(l.design_drift().await.unwrap().is_empty());
}

/// A reversal cancelled for funds is tried again under the next id on the split layout too:
/// the earlier reversal is looked for where transfers live, the hot database. Read in the
/// ledger's database it is never found, and every later `reverse` answers the cancelled one.
#[tokio::test]
async fn a_reversal_cancelled_for_funds_is_tried_again_in_the_hot_database() {
    let l = support::split_ledger("split_reverse_again").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    open(&l, "C", 0).await;
    let pay = l.submit(request("pay", "A", "B", 300), true).await.unwrap();
    assert_eq!(pay.state, State::Done);
    let spend = l
        .submit(request("spend", "B", "C", 300), true)
        .await
        .unwrap();
    assert_eq!(spend.state, State::Done);
    let first = l.reverse("pay").await.unwrap();
    assert_eq!(
        (first.id.as_str(), first.state, first.reason.as_deref()),
        ("rev-pay", State::Cancelled, Some("insufficient_funds"))
    );

    // The money comes back: reversing again makes the next attempt, which moves it.
    let back = l
        .submit(request("back", "C", "B", 300), true)
        .await
        .unwrap();
    assert_eq!(back.state, State::Done);
    let second = l.reverse("pay").await.unwrap();
    assert_eq!(
        (second.id.as_str(), second.state, second.status),
        ("rev2-pay", State::Done, RecordStatus::Created)
    );
    assert_eq!(
        l.transfer("rev2-pay").await.unwrap().reverses.as_deref(),
        Some("pay")
    );
    assert_eq!(support::balance(&l, "A").await, 1_000);
    assert_eq!(support::balance(&l, "B").await, 0);

    // Once done, it is found, never made again: nothing moves.
    let third = l.reverse("pay").await.unwrap();
    assert_eq!(
        (third.id.as_str(), third.state, third.status),
        ("rev2-pay", State::Done, RecordStatus::Exists)
    );
    assert_eq!(support::balance(&l, "A").await, 1_000);
    assert_eq!(support::balance(&l, "B").await, 0);
    assert_eq!(support::balance(&l, "C").await, 0);
    let hot = l.hot_database().unwrap().to_owned();
    let reversals: Vec<String> = ids_in(&hot)
        .await
        .into_iter()
        .filter(|id| id.starts_with("txn:rev"))
        .collect();
    assert_eq!(reversals, ["txn:rev-pay", "txn:rev2-pay"]);
    assert_at_rest(&l).await;
}

/// In the hot database nothing validates an account: a writer there can raise its `opening`
/// and its `balance` by the same amount, and every sum of the document's own figures still
/// adds up. `verify` takes the opening from the account's record in the ledger's validated
/// database, and names the account.
#[tokio::test]
async fn verify_names_an_account_whose_opening_was_raised_in_the_hot_database() {
    let l = support::split_ledger("split_forged_opening").await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    for (id, from, to, value) in [("f1", "A", "B", 300), ("f2", "B", "A", 100)] {
        let done = l.submit(request(id, from, to, value), true).await.unwrap();
        assert_eq!(done.state, State::Done);
    }
    assert_at_rest(&l).await;

    // 5,000 from nowhere on B, opening and balance alike, with a plain PUT.
    let hot = l.hot_client();
    let mut b: Value = hot.get("account:B").await.unwrap();
    b["opening"] = json!(b["opening"].as_i64().unwrap() + 5_000);
    b["balance"] = json!(b["balance"].as_i64().unwrap() + 5_000);
    hot.put("account:B", &b).await.unwrap();
    assert_eq!(support::balance(&l, "B").await, 5_200);

    // On several copies `verify` reads views of one copy of each shard range, which may not
    // hold the forged write yet.
    let report = support::again_on_several_copies(
        hot.database(),
        || async { l.verify_with(VerifyOptions::at_rest()).await.unwrap() },
        |r| !r.ok,
    )
    .await;
    assert!(!report.ok, "{report:#?}");
    for name in ["conservation", "exactly_once", "opening_records"] {
        let check = report
            .check(name)
            .unwrap_or_else(|| panic!("no check {name}: {report:#?}"));
        assert!(!check.ok, "{name}: {report:#?}");
        assert!(check.detail.contains("account:B"), "{name}: {check:?}");
        assert_eq!(
            check
                .documents
                .iter()
                .filter(|d| d.starts_with("account:"))
                .collect::<Vec<_>>(),
            ["account:B"],
            "{name}: {check:?}"
        );
    }
    let records = report.check("opening_records").unwrap();
    assert!(
        records
            .detail
            .contains("account:B: opening 5000 differs from its opening record's 0 (opening:B)"),
        "{records:?}"
    );
    let conservation = report.check("conservation").unwrap();
    assert!(
        conservation
            .detail
            .contains("account:B (+5000 unexplained)"),
        "{conservation:?}"
    );

    // A record written beside it in the hot database, with the raised opening, is not one:
    // records are read from the ledger's database only.
    let forged = json!({"type": "opening", "account_id": "B", "currency": "EUR",
                        "opening": 5_000, "min_balance": 0});
    hot.put("opening:B", &forged).await.unwrap();
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    let records = report.check("opening_records").unwrap();
    assert!(
        !records.ok && !report.check("conservation").unwrap().ok,
        "{report:#?}"
    );
    let misplaced = format!("{}/opening:B", hot.database());
    assert!(records.documents.contains(&misplaced), "{records:?}");
}

/// A create that stopped between its two writes — the opening record written, the account not
/// — is completed by the same create; one with other terms is refused by the record.
#[tokio::test]
async fn an_account_create_that_stopped_after_its_record_is_completed_by_the_same_create() {
    let l = support::split_ledger("split_half_created").await;
    // What the first write of `create_account` leaves: the record, in the ledger's database.
    let record = json!({"type": "opening", "account_id": "A", "currency": "EUR",
                        "opening": 1_000, "min_balance": 0});
    l.client().put("opening:A", &record).await.unwrap();
    // On several copies `verify` reads the records through a view of one copy of each shard
    // range, which may not hold the record yet: asked again for up to 15 s.
    let several = support::copies(l.client().database()).await > 1;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
        assert!(report.ok, "{report:#?}");
        let records = report.check("opening_records").unwrap();
        if records.detail.contains("1 records without an account") {
            break;
        }
        assert!(
            several && std::time::Instant::now() < deadline,
            "{records:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let other = l
        .create_account(AccountSpec {
            account_id: "A".into(),
            currency: support::eur(),
            opening: Amount::new(2_000).unwrap(),
            min_balance: Some(Amount::ZERO),
            meta: Default::default(),
        })
        .await
        .unwrap_err();
    assert!(other.is_mismatch(), "{other:?}");
    assert!(l.account("A").await.unwrap_err().is_not_found());

    open(&l, "A", 1_000).await;
    assert_eq!(support::balance(&l, "A").await, 1_000);
    let again = l
        .create_account(AccountSpec {
            account_id: "A".into(),
            currency: support::eur(),
            opening: Amount::new(1_000).unwrap(),
            min_balance: Some(Amount::ZERO),
            meta: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(again.status, RecordStatus::Exists);
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    assert!(report.ok, "{report:#?}");
    assert!(
        !report
            .check("opening_records")
            .unwrap()
            .detail
            .contains("without an account"),
        "{report:#?}"
    );
}

/// Accounts created before opening records existed have none: `verify` says to run `init`,
/// which writes them from the account documents, once.
#[tokio::test]
async fn init_writes_the_opening_records_of_accounts_created_before_them() {
    let l = support::split_ledger("split_old_accounts").await;
    open(&l, "A", 1_000).await;
    // B as an earlier version created it: the account alone.
    let old = json!({"type": "account", "account_id": "B", "currency": "EUR", "opening": 500,
                     "balance": 500, "min_balance": null, "pending": [], "settled": [],
                     "created_at": 1});
    l.hot_client().put("account:B", &old).await.unwrap();
    l.submit(request("o1", "B", "A", 700), true).await.unwrap();

    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    let records = report.check("opening_records").unwrap();
    assert!(!records.ok, "{report:#?}");
    assert_eq!(records.documents, ["account:B"], "{records:?}");
    assert!(
        records.detail.contains("account:B has no opening record")
            && records.detail.contains("couch-ledger init"),
        "{records:?}"
    );
    // Counted with its own figures meanwhile: the money adds up.
    assert!(report.check("conservation").unwrap().ok, "{report:#?}");

    let init = l.init().await.unwrap();
    assert_eq!(init.opening_records, 1);
    let written: Value = l.client().get("opening:B").await.unwrap();
    assert_eq!(
        (&written["opening"], &written["min_balance"]),
        (&json!(500), &Value::Null)
    );
    assert_at_rest(&l).await;
    assert_eq!(l.init().await.unwrap().opening_records, 0);
}
