//! Crash tests: a process "dies" at each fail point of the protocol in turn, and the sweeper
//! finishes (or cancels) what it left. Fail points are process-wide, so this binary holds one
//! test that runs the scenarios one after the other. Run with
//! `cargo test --features failpoints --test failpoints`.

use couch_ledger_testkit as support;

use std::time::Duration;

use serde_json::{json, Value};

use couch_ledger::{
    AccountSpec, Amount, Currency, Ledger, State, SweepOptions, TransferRequest, VerifyOptions,
    FAIL_POINTS,
};

fn request(id: &str, value: i64) -> TransferRequest {
    TransferRequest {
        id: Some(id.into()),
        source: "A".into(),
        destination: "B".into(),
        amount: Amount::new(value).unwrap(),
        currency: Currency::from_code("EUR").unwrap(),
        meta: Default::default(),
    }
}

fn now_sweep() -> SweepOptions {
    SweepOptions {
        limit: 100,
        stale_after: Duration::ZERO,
    }
}

async fn open(l: &Ledger, id: &str, opening: i64) {
    l.create_account(AccountSpec {
        account_id: id.into(),
        currency: Currency::from_code("EUR").unwrap(),
        opening: Amount::new(opening).unwrap(),
        min_balance: Some(Amount::ZERO),
        meta: Default::default(),
    })
    .await
    .unwrap();
}

/// A worker that re-applied `txn` on B after it was settled and pruned: an orphan marker.
async fn duplicate_marker(l: &Ledger, txn: &str, delta: i64) {
    let mut b: Value = l.hot_client().get("account:B").await.unwrap();
    let settled: Vec<Value> = b["settled"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["txn"] != txn)
        .cloned()
        .collect();
    b["settled"] = json!(settled);
    b["pending"] = json!([{"txn": txn, "delta": delta, "at": 1}]);
    b["balance"] = json!(b["balance"].as_i64().unwrap() + delta);
    l.hot_client().put("account:B", &b).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fail_point_is_recovered_by_the_sweeper() {
    let scenario = fail::FailScenario::setup();
    // A short lease so a "crashed" worker's claim expires quickly; the sweeper uses the same
    // ledger (same worker id): its claims must expire too before it takes over.
    let l = support::ledger_with("failpoints", |b| b.lease(Duration::from_millis(1_000))).await;
    let opening = 1_000_000;
    open(&l, "A", opening).await;
    open(&l, "B", 0).await;
    let mut moved = 0;

    // The stepwise protocol's points (`txn-…`, and the sweeper's takeover and orphan repair,
    // which only the stepwise protocol meets) crash a stepwise ledger; the one-write path's
    // (`once-…`) the default one — the same worker (worker id), so the sweeper above holds for
    // both.
    let stepwise = l
        .to_builder()
        .worker_id(l.worker_id())
        .stepwise_transfers(true)
        .build()
        .unwrap();
    for (i, &point) in FAIL_POINTS.iter().enumerate() {
        let id = format!("fp{i}");
        let cancels = matches!(point, "txn-after-canceling" | "txn-after-undo");
        let value = if cancels { 10 * opening } else { 100 };
        let worker = if point.starts_with("once-") {
            &l
        } else {
            &stepwise
        };
        match point {
            "sweeper-after-takeover" => {
                worker.submit(request(&id, value), false).await.unwrap();
                fail::cfg(point, "1*return").unwrap();
                let o = worker.sweep_once(now_sweep()).await.unwrap();
                assert_eq!(o.failed, 1, "{point}: {o:?}");
                assert!(o.problems.iter().any(|p| p.contains(point)), "{o:?}");
            }
            "sweeper-after-repair" => {
                let t = worker.submit(request(&id, value), true).await.unwrap();
                assert_eq!(t.state, State::Done);
                duplicate_marker(&l, &id, value).await;
                fail::cfg(point, "1*return").unwrap();
                let e = l.sweep_once(now_sweep()).await.unwrap_err();
                assert!(e.to_string().contains(point), "{point}: {e}");
            }
            _ => {
                fail::cfg(point, "1*return").unwrap();
                let e = worker.submit(request(&id, value), true).await.unwrap_err();
                assert!(e.to_string().contains(point), "{point}: {e}");
            }
        }
        fail::remove(point);

        let (l2, id2) = (&l, &id);
        let finished = support::wait_for(
            &format!("{point}: the sweeper to finish {id}"),
            Duration::from_secs(30),
            move || async move {
                l2.sweep_once(now_sweep()).await.unwrap();
                // A one-write transfer that crashed before its decision has no document yet.
                let t = match l2.transfer(id2).await {
                    Ok(t) => t,
                    Err(e) if e.is_not_found() => return None,
                    Err(e) => panic!("{e}"),
                };
                let markers = l2.status().await.unwrap().pending_markers;
                (t.state.is_terminal() && markers == 0).then_some(t)
            },
        )
        .await;
        // (Crashed before its decision, a one-write transfer gets its document from the sweeper
        // once its markers are older than the lease, and is driven to `done`.)
        if cancels {
            assert_eq!(finished.state, State::Cancelled, "{point}");
            assert_eq!(
                finished.reason.as_deref(),
                Some("insufficient_funds"),
                "{point}"
            );
        } else {
            assert_eq!(finished.state, State::Done, "{point}");
            moved += value;
        }
        let a = l.account("A").await.unwrap().balance.minor();
        let b = l.account("B").await.unwrap().balance.minor();
        assert_eq!(
            (a, b),
            (opening - moved, moved),
            "{point}: each effect exactly once"
        );
        let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
        assert!(report.ok, "{point}: {report:#?}");
        eprintln!("{point}: recovered to {}", finished.state);
    }
    scenario.teardown();
}
