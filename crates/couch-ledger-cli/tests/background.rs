//! Background finish (`LedgerBuilder::background_finish`) on the stepwise protocol
//! (`LedgerBuilder::stepwise_transfers`): `submit` answers at the commit, the settles (held to
//! fold into their accounts' next writes) and `done` follow in a task of the ledger's own; `flush`
//! waits for them; a finish that stops is the sweeper's to end, once. (The one-write path's
//! background finish: tests/one_write.rs, and the split-layout test below runs both.)

use std::time::Duration;

use crate::support;
use crate::support::assert_at_rest;
use crate::support::{balance, eur_transfer as request, open_account as open, writes_in};
use couch_ledger::{Ledger, RecordStatus, State, SweepOptions};

async fn assert_no_marker(l: &Ledger, accounts: &[&str]) {
    for id in accounts {
        let a = l.account(id).await.unwrap();
        assert!(a.pending.is_empty(), "{id} still holds a marker: {a:?}");
    }
}

/// `flush`, bounded: a finish that never ends fails the test instead of hanging it.
async fn flush(l: &Ledger) {
    tokio::time::timeout(Duration::from_secs(30), l.flush())
        .await
        .expect("flush did not return within 30 s");
    assert_eq!(l.finishing(), 0, "flush returned with finishes in flight");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `submit(…, true)` answers `committed` with both balances already moved and the finish
/// still in flight (a submit that waited for `done` fails here); `flush` ends every finish:
/// each transfer reads `done`, no account holds a marker, the audit at rest passes.
#[tokio::test]
async fn a_background_finish_answers_committed_and_flush_ends_it_done() {
    let l = support::ledger_with("bg_committed", |b| {
        b.stepwise_transfers(true).background_finish(true)
    })
    .await;
    assert!(l.finishes_in_background());
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    open(&l, "C", 0).await;

    let transfers = [
        ("t1", "A", "B", 100),
        ("t2", "A", "C", 200),
        ("t3", "C", "B", 50),
        ("t4", "B", "A", 25),
    ];
    let mut expected = [("A", 1_000), ("B", 0), ("C", 0)];
    for (id, from, to, value) in transfers {
        let o = l.submit(request(id, from, to, value), true).await.unwrap();
        assert_eq!(
            (o.id.as_str(), o.state, o.status, o.reason.as_deref()),
            (id, State::Committed, RecordStatus::Created, None),
            "{id}: the answer comes at the commit"
        );
        // Counted before the answer: the settle and `done` have not run yet.
        assert!(
            l.finishing() >= 1,
            "{id}: no finish in flight after the answer"
        );
        for (account, expect) in expected.iter_mut() {
            if *account == from {
                *expect -= value;
            } else if *account == to {
                *expect += value;
            }
        }
        // The money has moved already: both balances carry it.
        for (account, expect) in expected {
            assert_eq!(balance(&l, account).await, expect, "{id}: {account}");
        }
    }

    flush(&l).await;
    for (id, ..) in transfers {
        let t = l.transfer(id).await.unwrap();
        assert_eq!(t.state, State::Done, "{id}: {t:?}");
        assert!(t.claim.is_none(), "{id}: a done transfer holds no claim");
    }
    for (account, expect) in expected {
        let a = l.account(account).await.unwrap();
        assert_eq!(
            (a.balance.minor(), a.available.minor()),
            (expect, expect),
            "{account}: settled, so all of it is available"
        );
    }
    assert_no_marker(&l, &["A", "B", "C"]).await;
    // Nothing left: a second flush returns at once.
    flush(&l).await;
    assert_at_rest(&l).await;
}

/// Twenty transfers in a row into one merchant: the settles held back go out with the
/// accounts' next applies, so fewer documents are written than the 7 per transfer of the
/// ordinary drive (create, apply ×2, commit, settle ×2, done) — counted here on a ledger
/// without background finish doing the same transfers, so the counter itself is checked.
#[tokio::test]
async fn settles_held_for_folding_go_out_with_the_accounts_next_write() {
    let n: u64 = 20;
    let customers = ["c0", "c1", "c2", "c3"];
    // Runs the n transfers one after the other; returns the documents they wrote.
    async fn run(l: &Ledger, customers: &[&str], n: u64) -> u64 {
        for c in customers {
            open(l, c, 10_000).await;
        }
        open(l, "merchant", 0).await;
        let db = l.hot_client().database().to_owned();
        let before = writes_in(&db).await;
        for i in 0..n {
            let from = customers[i as usize % customers.len()];
            let o = l
                .submit(request(&format!("m{i}"), from, "merchant", 10), true)
                .await
                .unwrap();
            let expected = if l.finishes_in_background() {
                State::Committed
            } else {
                State::Done
            };
            assert_eq!(o.state, expected, "m{i}: {o:?}");
        }
        flush(l).await;
        writes_in(&db).await - before
    }

    let plain = support::ledger_with("bg_fold_plain", |b| b.stepwise_transfers(true)).await;
    let unfolded = run(&plain, &customers, n).await;
    assert_eq!(
        unfolded,
        7 * n,
        "the ordinary drive writes 7 documents a transfer"
    );
    assert_eq!(plain.settles_folded(), 0);

    let l = support::ledger_with("bg_fold", |b| {
        b.stepwise_transfers(true).background_finish(true)
    })
    .await;
    let written = run(&l, &customers, n).await;
    let folded = l.settles_folded();
    eprintln!(
        "{n} transfers: {written} documents ({:.2} a transfer, {unfolded} unfolded), \
         {folded} settles folded",
        written as f64 / n as f64
    );
    assert!(folded > 0, "no settle went out with another write");
    assert!(
        written < 7 * n,
        "{written} documents for {n} transfers: nothing saved"
    );
    // Each folded settle shares its account's write with another op: one document less each.
    assert!(
        written <= 7 * n - folded,
        "{written} documents, {folded} folded: a folded settle wrote a document of its own"
    );
    for i in 0..n {
        assert_eq!(
            l.transfer(&format!("m{i}")).await.unwrap().state,
            State::Done
        );
    }
    assert_eq!(balance(&l, "merchant").await, 10 * n as i64);
    let mut all = customers.to_vec();
    all.push("merchant");
    assert_no_marker(&l, &all).await;
    assert_at_rest(&l).await;
}

/// A credit whose settle is still held back is spendable by its account's next transfer in
/// this process: the held settle goes first in that transfer's apply round (the documented
/// delay of `available` is for other processes only).
#[tokio::test]
async fn a_held_credit_is_spendable_by_the_next_transfer_in_this_process() {
    let l = support::ledger_with("bg_held_credit", |b| {
        b.stepwise_transfers(true).background_finish(true)
    })
    .await;
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    open(&l, "C", 0).await;
    let first = l.submit(request("in", "A", "B", 300), true).await.unwrap();
    assert_eq!(first.state, State::Committed);
    // At once, while "in"'s settle on B is held (250 ms at most): all of it goes on.
    let next = l.submit(request("out", "B", "C", 300), true).await.unwrap();
    assert_eq!(
        (next.state, next.reason.as_deref()),
        (State::Committed, None),
        "the held credit was not spendable"
    );
    assert!(l.settles_folded() >= 1, "the settle on B was not folded");
    flush(&l).await;
    assert_eq!(l.transfer("in").await.unwrap().state, State::Done);
    assert_eq!(l.transfer("out").await.unwrap().state, State::Done);
    assert_eq!(
        (
            balance(&l, "A").await,
            balance(&l, "B").await,
            balance(&l, "C").await
        ),
        (700, 0, 300)
    );
    assert_no_marker(&l, &["A", "B", "C"]).await;
    assert_at_rest(&l).await;
}

/// A background finish held before its settle (as if its process stalled) while its lease runs
/// out: the transfer stays `committed`, the sweeper of another worker ends it `done`, and the
/// stalled finish, released, writes nothing more — the money moved exactly once.
#[tokio::test]
async fn a_stalled_background_finish_is_finished_by_the_sweeper_exactly_once() {
    let base = support::ledger("bg_stalled").await;
    // The sweeper's drive (two settles and `done`) runs under this lease too: on a cluster every
    // write goes to each copy, and a loaded one took longer than 500 ms ("lease ran out in
    // state committed").
    let several = support::copies(base.hot_client().database()).await > 1;
    let lease = Duration::from_millis(if several { 3_000 } else { 500 });
    let (g, hook) = support::gate("settle");
    let l = base
        .to_builder()
        .stepwise_transfers(true)
        .lease(lease)
        .pause_hook(hook)
        .background_finish(true)
        .build()
        .unwrap();
    // Each setting keeps what the ones before set.
    assert!(l.finishes_in_background());
    assert_eq!(l.lease(), lease);
    open(&l, "A", 1_000).await;
    open(&l, "B", 500).await;

    // Bounded: a submit that waited for the settle would wait behind the gate for good.
    let o = tokio::time::timeout(
        Duration::from_secs(20),
        l.submit(request("stall", "A", "B", 300), true),
    )
    .await
    .expect("submit did not answer at the commit")
    .unwrap();
    assert_eq!(o.state, State::Committed, "{o:?}");
    // The background finish reached its settle and waits there (the hook is awaited in it).
    tokio::time::timeout(Duration::from_secs(10), g.reached.notified())
        .await
        .expect("the background finish never reached its settle");
    assert_eq!(l.finishing(), 1);
    let t = l.transfer("stall").await.unwrap();
    assert_eq!(t.state, State::Committed);
    let claim = t.claim.expect("a committed transfer under a claim");
    assert_eq!(claim.owner, l.worker_id());
    support::wait_for(
        "the background finish's claim to expire",
        Duration::from_secs(10),
        || async { (now_ms() > claim.expires_at).then_some(()) },
    )
    .await;

    let sweeper = l.another_worker();
    assert_ne!(sweeper.worker_id(), l.worker_id());
    let swept = sweeper
        .sweep_once(SweepOptions {
            limit: 10,
            stale_after: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!((swept.advanced, swept.failed), (1, 0), "{swept:?}");
    assert_eq!(l.transfer("stall").await.unwrap().state, State::Done);
    assert_eq!(l.finishing(), 1, "the stalled finish is still in flight");
    let hot = l.hot_client().database().to_owned();
    let swept_state = support::db_snapshot(&hot).await;

    // The stalled finish resumes: its settle finds the markers settled, its `done` is not its
    // to write any more (lease gone). It ends having written nothing; nothing moves twice.
    g.release.notify_one();
    flush(&l).await;
    assert_eq!(
        support::db_snapshot(&hot).await,
        swept_state,
        "the stalled finish wrote after the sweeper had finished its transfer"
    );
    assert_eq!(l.transfer("stall").await.unwrap().state, State::Done);
    assert_eq!(balance(&l, "A").await, 1_000 - 300, "debited once");
    assert_eq!(balance(&l, "B").await, 500 + 300, "credited once");
    assert_no_marker(&l, &["A", "B"]).await;
    // Nothing left for another pass.
    let again = sweeper
        .sweep_once(SweepOptions {
            limit: 10,
            stale_after: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!((again.examined, again.advanced), (0, 0), "{again:?}");
    assert_at_rest(&l).await;
}

/// A transfer refused for funds is decided before the answer, as without background finish:
/// `cancelled` with its reason, nothing left finishing, balances and markers untouched.
#[tokio::test]
async fn a_refused_transfer_in_background_mode_is_cancelled_before_the_answer() {
    let l = support::ledger_with("bg_refused", |b| b.background_finish(true)).await;
    open(&l, "A", 100).await;
    open(&l, "B", 0).await;
    let o = l
        .submit(request("broke", "A", "B", 500), true)
        .await
        .unwrap();
    assert_eq!(
        (o.state, o.reason.as_deref()),
        (State::Cancelled, Some("insufficient_funds"))
    );
    assert_eq!(
        l.finishing(),
        0,
        "a cancelled transfer has nothing to finish"
    );
    let t = l.transfer("broke").await.unwrap();
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (State::Cancelled, Some("insufficient_funds"))
    );
    assert_eq!(balance(&l, "A").await, 100);
    assert_eq!(balance(&l, "B").await, 0);
    assert_no_marker(&l, &["A", "B"]).await;
    flush(&l).await;
    assert_eq!(l.settles_folded(), 0);
    assert_at_rest(&l).await;
}

/// The same on the split layout, by either protocol: answers at the decision (`committed`
/// stepwise, `done` on the one-write path), every transfer `done` after `flush`, the transfers
/// in the hot database, the audit at rest passes.
#[tokio::test]
async fn a_split_ledger_finishes_in_the_background_too() {
    split_ledger_in_background(true).await;
    split_ledger_in_background(false).await;
}

async fn split_ledger_in_background(stepwise: bool) {
    let name = if stepwise {
        "bg_split"
    } else {
        "bg_split_once"
    };
    let answer = if stepwise {
        State::Committed
    } else {
        State::Done
    };
    let l = support::split_ledger(name)
        .await
        .to_builder()
        .stepwise_transfers(stepwise)
        .background_finish(true)
        .build()
        .unwrap();
    assert!(l.finishes_in_background() && l.hot_database().is_some());
    open(&l, "A", 1_000).await;
    open(&l, "B", 0).await;
    for i in 0..3 {
        let o = l
            .submit(request(&format!("s{i}"), "A", "B", 100), true)
            .await
            .unwrap();
        assert_eq!(o.state, answer, "s{i}: {o:?}");
        assert!(l.finishing() >= 1);
    }
    assert_eq!(balance(&l, "A").await, 700);
    assert_eq!(balance(&l, "B").await, 300);
    flush(&l).await;
    let hot = l.hot_database().unwrap().to_owned();
    let ids: Vec<String> = support::db_snapshot(&hot)
        .await
        .revs
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    for i in 0..3 {
        assert_eq!(
            l.transfer(&format!("s{i}")).await.unwrap().state,
            State::Done
        );
        assert!(ids.contains(&format!("txn:s{i}")), "{ids:?}");
    }
    assert_no_marker(&l, &["A", "B"]).await;
    assert_at_rest(&l).await;
}
