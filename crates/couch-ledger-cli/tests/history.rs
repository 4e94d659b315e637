//! An account's history and its balance at a time, against the transfers a test made: through
//! the library and the command line (the service's side is tests/serve/history.rs).

use std::time::Duration;

use couch_ledger::{
    HistoryCursor, HistoryEntry, HistoryQuery, Ledger, State, VerifyOptions, HISTORY_LIMIT_MAX,
};
use serde_json::Value;

use crate::cli::cli;
use crate::support::{self, eur_transfer, open_account};

/// A transfer the account `a` of [`scenario`] should show: what its document says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    pub(crate) txn: String,
    pub(crate) decided_at: i64,
    pub(crate) delta: i64,
    pub(crate) balance_after: i64,
    pub(crate) reverses: Option<String>,
}

/// The account `a` of a scenario, its opening, and its history newest first.
pub(crate) struct Scenario {
    pub(crate) account: String,
    pub(crate) opening: i64,
    pub(crate) expected: Vec<Expected>,
}

/// Waits until the wall clock is past `ms`, so the next decision has a later time than every
/// one before it (a loop on the clock, not a guess at how long something takes).
async fn past(ms: i64) {
    support::wait_for("the clock to move on", Duration::from_secs(5), || async {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        (now > ms).then_some(())
    })
    .await;
}

/// Transfer `id`'s document.
async fn txn_doc(l: &Ledger, id: &str) -> Value {
    l.hot_client()
        .get::<Value>(&format!("txn:{id}"))
        .await
        .unwrap()
}

/// Accounts `a-{tag}` (opening 100.00) and `b-{tag}`; transfers between them by each path that
/// writes a decision: the one-write path, one cancelled for funds, the stepwise protocol, one
/// left for the sweeper, and a reversal. Returns what `a`'s history must be, from the
/// transfers' own documents.
pub(crate) async fn scenario(l: &Ledger, tag: &str) -> Scenario {
    let (a, b) = (format!("a-{tag}"), format!("b-{tag}"));
    open_account(l, &a, 10_000).await;
    open_account(l, &b, 0).await;
    let stepwise = l.to_builder().stepwise_transfers(true).build().unwrap();
    let mut last = 0;
    let mut moved = Vec::new();
    for (id, from, to, value) in [
        ("t1", &a, &b, 1_000),
        ("t2", &b, &a, 300),
        ("t3", &a, &b, 1_000_000), // more than `a` holds: cancelled, not in the history
        ("t4", &a, &b, 250),       // the stepwise protocol: decided at its commit
        ("t5", &a, &b, 125),       // left initial, decided by the sweeper
    ] {
        past(last).await;
        let id = format!("{id}-{tag}");
        let request = eur_transfer(&id, from, to, value);
        let state = match id.split('-').next() {
            Some("t4") => stepwise.submit(request, true).await.unwrap().state,
            Some("t5") => {
                l.submit(request, false).await.unwrap();
                support::sweep_until_none_open(l, Duration::from_secs(60)).await;
                l.transfer(&id).await.unwrap().state
            }
            _ => l.submit(request, true).await.unwrap().state,
        };
        let doc = txn_doc(l, &id).await;
        let decided_at = doc["decided_at"].as_i64().expect("decided_at written");
        last = decided_at;
        if state == State::Cancelled {
            assert!(id.starts_with("t3"), "{id}");
            continue;
        }
        assert_eq!(state, State::Done, "{id}");
        let delta = if *from == a { -value } else { value };
        moved.push((id, decided_at, delta, None));
    }
    past(last).await;
    let reversed = l.reverse(&format!("t1-{tag}")).await.unwrap();
    assert_eq!(reversed.state, State::Done);
    let doc = txn_doc(l, &reversed.id).await;
    let decided_at = doc["decided_at"].as_i64().expect("decided_at written");
    // The stepwise protocol decides at the commit; `done` later keeps that time.
    assert!(
        decided_at <= doc["last_modified"].as_i64().unwrap(),
        "{doc}"
    );
    moved.push((reversed.id, decided_at, 1_000, Some(format!("t1-{tag}"))));

    let mut balance = 10_000;
    let mut expected: Vec<Expected> = moved
        .into_iter()
        .map(|(txn, decided_at, delta, reverses)| {
            balance += delta;
            Expected {
                txn,
                decided_at,
                delta,
                balance_after: balance,
                reverses,
            }
        })
        .collect();
    expected.reverse();
    assert_eq!(support::balance(l, &a).await, balance);
    Scenario {
        account: a,
        opening: 10_000,
        expected,
    }
}

/// An entry as `--json` and the service print it (every one of the scenario's is `done`).
pub(crate) fn from_json(e: &Value) -> Expected {
    assert_eq!(e["state"], "done", "{e}");
    Expected {
        txn: e["txn"].as_str().unwrap().to_owned(),
        decided_at: e["decided_at"].as_i64().unwrap(),
        delta: e["delta"].as_i64().unwrap(),
        balance_after: e["balance_after"].as_i64().unwrap(),
        reverses: e["reverses"].as_str().map(str::to_owned),
    }
}

fn as_expected(e: &HistoryEntry) -> Expected {
    Expected {
        txn: e.txn.clone(),
        decided_at: e.decided_at,
        delta: e.delta.minor(),
        balance_after: e.balance_after.minor(),
        reverses: e.reverses.clone(),
    }
}

/// Every page of `account`'s history `limit` at a time, following `next`; bounded.
async fn all_pages(l: &Ledger, account: &str, limit: usize) -> Vec<HistoryEntry> {
    let mut out = Vec::new();
    let mut after: Option<HistoryCursor> = None;
    for _ in 0..100 {
        let query = HistoryQuery {
            limit,
            after: after.clone(),
            ..HistoryQuery::default()
        };
        let page = l.account_history(account, query).await.unwrap();
        assert!(page.entries.len() <= limit);
        out.extend(page.entries);
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
    panic!("more than 100 pages");
}

/// The whole history, once the view shows every transfer of `s` (it may lag on a cluster).
async fn settled_history(l: &Ledger, s: &Scenario) -> Vec<HistoryEntry> {
    support::wait_for("the history view", Duration::from_secs(30), || async {
        let page = l
            .account_history(&s.account, HistoryQuery::default())
            .await
            .unwrap();
        (page.entries.len() == s.expected.len()).then_some(page.entries)
    })
    .await
}

#[tokio::test]
async fn history_lists_each_done_transfer_with_its_balance_and_pages_without_gaps() {
    let l = support::ledger("history_lib").await;
    let s = scenario(&l, "h").await;
    let whole = settled_history(&l, &s).await;
    let got: Vec<Expected> = whole.iter().map(as_expected).collect();
    assert_eq!(got, s.expected);
    let counterparties: Vec<&str> = whole.iter().map(|e| e.counterparty.as_str()).collect();
    assert!(
        counterparties.iter().all(|c| *c == "b-h"),
        "{counterparties:?}"
    );
    assert!(whole.iter().all(|e| e.state == State::Done));

    // Pages of every size give the same entries, none missed or repeated.
    for limit in [1, 2, 3, HISTORY_LIMIT_MAX] {
        let paged: Vec<Expected> = all_pages(&l, &s.account, limit)
            .await
            .iter()
            .map(as_expected)
            .collect();
        assert_eq!(paged, s.expected, "limit {limit}");
    }

    // `from` and `to` are inclusive bounds on the time a transfer took effect.
    let t2 = &s.expected[s.expected.len() - 2];
    let only = HistoryQuery {
        from: Some(t2.decided_at),
        to: Some(t2.decided_at),
        ..HistoryQuery::default()
    };
    let page = l.account_history(&s.account, only).await.unwrap();
    let got: Vec<Expected> = page.entries.iter().map(as_expected).collect();
    assert_eq!(got, std::slice::from_ref(t2));
    let later = HistoryQuery {
        from: Some(t2.decided_at + 1),
        limit: 1,
        ..HistoryQuery::default()
    };
    let mut walked = Vec::new();
    let mut query = later;
    for _ in 0..10 {
        let page = l.account_history(&s.account, query.clone()).await.unwrap();
        walked.extend(page.entries.iter().map(as_expected));
        match page.next {
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    assert_eq!(walked, s.expected[..s.expected.len() - 2]);

    // The history and verify count the same transfers.
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    assert!(report.ok, "{report:#?}");
}

#[tokio::test]
async fn balance_at_a_time_before_between_and_after_the_transfers() {
    let l = support::ledger("history_at").await;
    let s = scenario(&l, "at").await;
    settled_history(&l, &s).await;
    let oldest = s.expected.last().unwrap();
    let at = |ms: i64| {
        let l = l.clone();
        let account = s.account.clone();
        async move { l.balance_at(&account, ms).await.unwrap().balance.minor() }
    };
    assert_eq!(at(oldest.decided_at - 1).await, s.opening, "before any");
    assert_eq!(at(0).await, s.opening);
    for (i, e) in s.expected.iter().enumerate() {
        assert_eq!(at(e.decided_at).await, e.balance_after, "at {}", e.txn);
        let before = s.expected.get(i + 1).map_or(s.opening, |o| o.balance_after);
        if s.expected
            .get(i + 1)
            .is_none_or(|o| o.decided_at < e.decided_at - 1)
        {
            assert_eq!(at(e.decided_at - 1).await, before, "just before {}", e.txn);
        }
    }
    let now = l
        .balance_at(&s.account, i64::from(i32::MAX) * 1_000_000)
        .await
        .unwrap();
    assert_eq!(
        now.balance, now.account.balance,
        "after every transfer: the balance now"
    );
    assert_eq!(now.balance.minor(), s.expected[0].balance_after);
}

#[tokio::test]
async fn history_refuses_bad_limits_times_and_unknown_accounts() {
    let l = support::ledger("history_bad").await;
    open_account(&l, "a", 100).await;
    for (query, field) in [
        (
            HistoryQuery {
                limit: 0,
                ..HistoryQuery::default()
            },
            "limit",
        ),
        (
            HistoryQuery {
                limit: HISTORY_LIMIT_MAX + 1,
                ..HistoryQuery::default()
            },
            "limit",
        ),
    ] {
        let e = l.account_history("a", query).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        assert_eq!(e.field(), Some(field));
        assert!(e.to_string().contains("1000"), "{e}");
    }
    let e = couch_ledger::parse_time_ms("at", "yesterday").unwrap_err();
    assert!(e.to_string().contains("RFC 3339"), "{e}");
    let e = l
        .account_history("nobody", HistoryQuery::default())
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(l.balance_at("nobody", 0).await.unwrap_err().is_not_found());
    let page = l
        .account_history("a", HistoryQuery::default())
        .await
        .unwrap();
    assert!(page.entries.is_empty() && page.next.is_none(), "{page:?}");
    assert_eq!(l.balance_at("a", 0).await.unwrap().balance.minor(), 100);
}

/// The command line's pages, followed by their `next`, as `(txn, decided_at, delta,
/// balance_after, reverses)`.
async fn cli_pages(db: &str, account: &str, limit: &str) -> Vec<Expected> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let mut args = vec!["--json", "account", "history", account, "--limit", limit];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let r = cli(db, &args).await;
        assert_eq!(r.code, 0, "{}", r.describe());
        let v = r.json();
        assert_eq!(v["account"], account);
        assert_eq!(v["currency"], "EUR");
        out.extend(v["entries"].as_array().unwrap().iter().map(from_json));
        match v["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return out,
        }
    }
    panic!("more than 100 pages");
}

#[tokio::test]
async fn history_and_balance_at_through_the_command_line() {
    let l = support::ledger("history_cli").await;
    let db = l.client().database().to_owned();
    let s = scenario(&l, "c").await;
    settled_history(&l, &s).await;
    assert_eq!(cli_pages(&db, &s.account, "2").await, s.expected);

    let oldest = s.expected.last().unwrap();
    let newest = &s.expected[0];
    for (at, want) in [
        ((oldest.decided_at - 1).to_string(), s.opening),
        (oldest.decided_at.to_string(), oldest.balance_after),
        (
            couch_ledger::format_time_ms(newest.decided_at),
            newest.balance_after,
        ),
        ("2999-01-01T00:00:00+01:00".to_owned(), newest.balance_after),
    ] {
        let r = cli(&db, &["--json", "account", "show", &s.account, "--at", &at]).await;
        assert_eq!(r.code, 0, "{}", r.describe());
        let v = r.json();
        assert_eq!(v["as_of"]["balance"], want, "--at {at}: {v}");
        assert_eq!(v["balance"], newest.balance_after, "the balance now: {v}");
    }
    let r = cli(&db, &["account", "show", &s.account, "--at", "0"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(
        r.stdout
            .contains("as of 1970-01-01T00:00:00.000Z: 100.00 EUR"),
        "{}",
        r.stdout
    );
    let r = cli(&db, &["account", "history", &s.account, "--limit", "1"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.contains("(reversal of t1-c)"), "{}", r.stdout);
    assert!(r.stdout.contains("more: --after"), "{}", r.stdout);

    // Bad input: exit 2, one line saying what is accepted, nothing on stdout.
    for (args, says) in [
        (
            vec!["account", "show", &s.account, "--at", "yesterday"],
            "RFC 3339",
        ),
        (
            vec![
                "account",
                "show",
                &s.account,
                "--at",
                "2025-02-30T00:00:00Z",
            ],
            "--at",
        ),
        (
            vec!["account", "history", &s.account, "--from", "soon"],
            "--from",
        ),
        (
            vec!["account", "history", &s.account, "--limit", "1001"],
            "between 1 and 1000",
        ),
        (
            vec!["account", "history", &s.account, "--limit", "0"],
            "--limit",
        ),
        (
            vec!["account", "history", &s.account, "--after", "nonsense"],
            "--after",
        ),
        (vec!["account", "history", "nobody"], "no account"),
    ] {
        let r = cli(&db, &args).await;
        assert_eq!(r.code, 2, "{args:?}: {}", r.describe());
        assert!(r.stdout.is_empty(), "{}", r.describe());
        assert!(r.stderr.contains(says), "{args:?}: {}", r.describe());
    }
}
