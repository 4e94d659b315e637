//! `GET /v1/accounts/{id}/history` and `GET /v1/accounts/{id}?at=` against the transfers a
//! test made (the scenario of tests/history.rs).

use super::*;
use crate::history::{from_json, scenario, Expected};

/// Every page of the account's history over HTTP, `limit` at a time, following `next`.
async fn pages(svc: &Service, account: &str, limit: u32) -> Vec<Expected> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let mut request = svc
            .http
            .get(format!("{}/v1/accounts/{account}/history", svc.base))
            .query(&[("limit", limit.to_string())]);
        if let Some(a) = &after {
            request = request.query(&[("after", a)]);
        }
        let r = svc.send(request).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.body["opening"], 10_000);
        out.extend(r.body["entries"].as_array().unwrap().iter().map(from_json));
        match r.body["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return out,
        }
    }
    panic!("more than 100 pages");
}

#[tokio::test]
async fn serve_history_and_balance_at_agree_with_the_transfers() {
    let (l, db) = ledger("serve_history").await;
    let svc = Service::start(&db, &["--no-sweep"]).await;
    let s = scenario(&l, "s").await;
    let account = s.account.clone();
    let whole = support::wait_for("the history view", Duration::from_secs(30), || async {
        let got = pages(&svc, &account, 1000).await;
        (got.len() == s.expected.len()).then_some(got)
    })
    .await;
    assert_eq!(whole, s.expected);
    assert_eq!(pages(&svc, &account, 2).await, s.expected);

    let oldest = s.expected.last().unwrap();
    let newest = &s.expected[0];
    for (at, want) in [
        ((oldest.decided_at - 1).to_string(), s.opening),
        (oldest.decided_at.to_string(), oldest.balance_after),
        (
            couch_ledger::format_time_ms(newest.decided_at),
            newest.balance_after,
        ),
    ] {
        let r = svc
            .send(
                svc.http
                    .get(format!("{}/v1/accounts/{account}", svc.base))
                    .query(&[("at", &at)]),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.body["as_of"]["balance"], want, "at {at}: {}", r.body);
        assert_eq!(r.body["balance"], newest.balance_after);
    }
    // Without `at` the answer is as it always was.
    let r = svc.get(&format!("/v1/accounts/{account}")).await;
    assert!(r.body.get("as_of").is_none(), "{}", r.body);

    for (path, field) in [
        (format!("/v1/accounts/{account}?at=yesterday"), "at"),
        (
            format!("/v1/accounts/{account}/history?from=2025-02-30T00:00:00Z"),
            "from",
        ),
        (
            format!("/v1/accounts/{account}/history?limit=1001"),
            "limit",
        ),
        (format!("/v1/accounts/{account}/history?limit=0"), "limit"),
        (format!("/v1/accounts/{account}/history?after=x"), "after"),
    ] {
        let r = svc.get(&path).await;
        r.assert_error(400, "invalid_input");
        assert_eq!(r.body["field"], field, "{path}: {}", r.body);
    }
    let r = svc.get("/v1/accounts/nobody/history").await;
    r.assert_error(404, "not_found");
    let r = svc
        .get(&format!("/v1/accounts/{account}/history?sort=asc"))
        .await;
    r.assert_error(400, "invalid_input");
}
