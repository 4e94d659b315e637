//! Metadata through the service: given when an account, a transfer or a payment is created,
//! returned wherever it is read, and `GET /v1/transfers?meta[KEY]=VALUE` a page at a time.

use super::*;

#[tokio::test]
async fn serve_metadata_round_trips_and_finds_transfers() {
    let (_l, db) = ledger("serve_meta").await;
    let svc = Service::start(&db, &["--no-sweep"]).await;
    for (id, opening) in [("a", 10_000), ("b", 0)] {
        let r = svc
            .post(
                "/v1/accounts",
                json!({"account_id": id, "currency": "EUR", "opening": opening,
                       "meta": {"owner": id}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    assert_eq!(
        svc.get("/v1/accounts/a").await.body["meta"],
        json!({"owner": "a"})
    );
    for n in 0..3 {
        let r = svc
            .post(
                "/v1/transfers",
                json!({"id": format!("t{n}"), "from": "a", "to": "b", "amount": 10 + n,
                       "currency": "EUR", "meta": {"order_id": "A-1", "n": n.to_string()}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    let t = svc.get("/v1/transfers/t1").await.body;
    assert_eq!(t["meta"], json!({"order_id": "A-1", "n": "1"}));
    assert!(t["decided_at"].as_i64().is_some(), "{t}");

    // Both spellings of the pair, in pages of two; newest first, each transfer once.
    for name in ["meta[order_id]", "meta.order_id"] {
        let whole = support::wait_for("the view", Duration::from_secs(30), || async {
            let r = svc
                .send(
                    svc.http
                        .get(format!("{}/v1/transfers", svc.base))
                        .query(&[(name, "A-1")]),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            (r.body["transfers"].as_array().unwrap().len() == 3).then_some(r.body)
        })
        .await;
        let ids: Vec<&str> = whole["transfers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap())
            .collect();
        let mut paged = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..10 {
            let mut q = vec![
                (name.to_owned(), "A-1".to_owned()),
                ("limit".into(), "2".into()),
            ];
            if let Some(a) = &after {
                q.push(("after".into(), a.clone()));
            }
            let r = svc
                .send(svc.http.get(format!("{}/v1/transfers", svc.base)).query(&q))
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            for t in r.body["transfers"].as_array().unwrap() {
                paged.push(t["id"].as_str().unwrap().to_owned());
            }
            match r.body["next"].as_str() {
                Some(n) => after = Some(n.to_owned()),
                None => break,
            }
        }
        assert_eq!(paged, ids, "{name}: pages of two list what one page does");
        let mut sorted = paged.clone();
        sorted.sort();
        assert_eq!(sorted, ["t0", "t1", "t2"]);
    }

    // Bad input names the field.
    for (path, field) in [
        ("/v1/transfers", "meta"),
        ("/v1/transfers?meta[a]=1&meta[b]=2", "meta"),
        ("/v1/transfers?meta[bad%20key]=1", "meta"),
        ("/v1/transfers?meta[a]=1&limit=0", "limit"),
        ("/v1/transfers?meta[a]=1&after=x", "after"),
        ("/v1/transfers?meta[a]=1&sort=asc", "sort"),
    ] {
        let r = svc.get(path).await;
        r.assert_error(400, "invalid_input");
        assert_eq!(r.body["field"], field, "{path}: {}", r.body);
    }
    let r = svc
        .post(
            "/v1/transfers",
            json!({"from": "a", "to": "b", "amount": 1, "currency": "EUR",
                   "meta": {"k": 1}}),
        )
        .await;
    r.assert_error(400, "invalid_json");
    let r = svc
        .post(
            "/v1/transfers",
            json!({"from": "a", "to": "b", "amount": 1, "currency": "EUR",
                   "meta": {"no spaces": "v"}}),
        )
        .await;
    r.assert_error(400, "invalid_input");
    assert_eq!(r.body["field"], "meta", "{}", r.body);
}
