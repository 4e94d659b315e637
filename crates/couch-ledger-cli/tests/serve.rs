//! `couch-ledger serve` as a caller sees it: the real binary on a free loopback port against the
//! harness's server, one database per test, driven over HTTP.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_ledger::{AccountSpec, Amount, Currency, Ledger, State as TransferState, VerifyOptions};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support;

// The contract as other programs read it: the OpenAPI document, schemathesis, a generated client.
mod contract;
// Events: a JSON page, Server-Sent Events resumed with Last-Event-ID, webhooks.
mod events;
// An account's history and its balance at a time over HTTP.
mod history;
// Metadata given at creation, returned, and transfers found by it.
mod meta;

const BIN: &str = env!("CARGO_BIN_EXE_couch-ledger");
const CLOUDANT: &str = include_str!("../../../examples/cloudant-purchase.json");
const ORDER: &str = "320afa89017426b994162ab004ce3383";

/// A running `couch-ledger serve`; killed when dropped (a test that stops it checks the exit).
struct Service {
    child: tokio::process::Child,
    base: String,
    http: reqwest::Client,
    /// Everything it wrote on stderr so far (its log lines).
    stderr: Arc<Mutex<String>>,
    /// The task that reads stderr into `stderr`; it ends at the pipe's end, when the process
    /// has exited.
    drain: Option<tokio::task::JoinHandle<()>>,
    key: Option<String>,
}

/// What a request came to.
struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    /// A 4xx/5xx answer in the documented shape, with this code.
    fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(self.body["error"], code, "{}", self.body);
        assert!(self.body["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
}

impl Service {
    /// Starts the binary on `db` (or `url` instead of the harness's server) with `args` after
    /// `serve`, and waits until `/healthz` answers.
    async fn start_on(url: &str, db: &str, args: &[&str], env: &[(&str, &str)]) -> Service {
        let s = support::server();
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(["--url", url, "--db", db, "--json", "serve"])
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("COUCHDB_URL")
            .env_remove("COUCHDB_USER")
            .env_remove("COUCHDB_PASSWORD")
            .env_remove("LEDGER_DB")
            .env_remove("COUCH_LEDGER_API_KEYS")
            .env_remove("COUCH_LEDGER_LISTEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(user) = &s.user {
            cmd.env("COUCHDB_USER", user)
                .env("COUCHDB_PASSWORD", s.password.clone().unwrap_or_default());
        }
        let mut child = cmd.spawn().expect("start couch-ledger serve");
        // Drain stderr into a buffer (a full pipe would block the service's logging).
        let stderr = Arc::new(Mutex::new(String::new()));
        let drain = {
            let (pipe, buffer) = (child.stderr.take().unwrap(), stderr.clone());
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut b = buffer.lock().unwrap();
                    b.push_str(&line);
                    b.push('\n');
                }
            })
        };
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), stdout.next_line())
            .await
            .expect("serve printed where it listens in time")
            .unwrap()
            .unwrap_or_else(|| panic!("serve exited: {}", stderr.lock().unwrap()));
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        let started: Value = serde_json::from_str(&first).expect("--json start line");
        assert_eq!(started["database"], db);
        let base = started["listening"].as_str().unwrap().to_owned();
        let service = Service {
            child,
            base,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .pool_max_idle_per_host(256)
                .build()
                .unwrap(),
            stderr,
            drain: Some(drain),
            key: None,
        };
        support::wait_for("/healthz", Duration::from_secs(30), || async {
            let r = service.get("/healthz").await;
            (r.status == StatusCode::OK).then_some(())
        })
        .await;
        service
    }

    /// On the harness's server, database `db`.
    async fn start(db: &str, args: &[&str]) -> Service {
        Service::start_on(&support::server().url, db, args, &[]).await
    }

    fn with_key(mut self, key: &str) -> Service {
        self.key = Some(key.to_owned());
        self
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let request = match &self.key {
            Some(k) => request.bearer_auth(k),
            None => request,
        };
        let r = request.send().await.expect("the service answers");
        let status = r.status();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(self.http.post(format!("{}{path}", self.base)).json(&body))
            .await
    }

    async fn post_text(&self, path: &str, body: &str) -> Answer {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .body(body.to_owned()),
        )
        .await
    }

    async fn put_text(&self, path: &str, body: &str) -> Answer {
        self.send(
            self.http
                .put(format!("{}{path}", self.base))
                .body(body.to_owned()),
        )
        .await
    }

    /// A transfer with an `Idempotency-Key`.
    async fn transfer_keyed(&self, key: &str, body: Value) -> Answer {
        self.send(
            self.http
                .post(format!("{}/v1/transfers", self.base))
                .header("Idempotency-Key", key)
                .json(&body),
        )
        .await
    }

    /// The value of one sample of `/metrics` (`name{labels}` exactly as printed), 0 when absent.
    async fn metric(&self, sample: &str) -> f64 {
        let r = self.get("/metrics").await;
        assert_eq!(r.status, StatusCode::OK);
        let text = r.body.as_str().unwrap().to_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Once the process has exited: reads its stderr to the end, so that [`Service::log`] holds
    /// every line it wrote (the last ones, written just before the exit, may not have been read
    /// yet when `wait` returns). The pipe ends with the process, so the wait is short.
    async fn log_to_end(&mut self) {
        if let Some(drain) = self.drain.take() {
            tokio::time::timeout(Duration::from_secs(30), drain)
                .await
                .expect("serve's stderr ended after its exit")
                .expect("the stderr reader");
        }
    }

    /// Waits for the process to exit (after a SIGTERM) and asserts it exited 0.
    async fn exited_cleanly(&mut self) {
        let exit = tokio::time::timeout(Duration::from_secs(90), self.child.wait())
            .await
            .expect("serve exited after SIGTERM")
            .unwrap();
        self.log_to_end().await;
        assert_eq!(exit.code(), Some(0), "{}", self.log());
    }
}

/// Sends SIGTERM to a process.
fn sigterm(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A fresh ledger database and its name.
async fn ledger(test: &str) -> (Ledger, String) {
    let l = support::ledger(test).await;
    let db = l.client().database().to_owned();
    (l, db)
}

async fn doc_count(l: &Ledger) -> u64 {
    l.client().database_info().await.unwrap()["doc_count"]
        .as_u64()
        .unwrap()
}

async fn account(l: &Ledger, id: &str, currency: &str, opening: i64, min: Option<i64>) {
    l.create_account(AccountSpec {
        account_id: id.to_owned(),
        currency: Currency::from_code(currency).unwrap(),
        opening: Amount::new(opening).unwrap(),
        min_balance: min.map(|m| Amount::new(m).unwrap()),
        meta: Default::default(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn serve_accounts_and_transfers_idempotent_by_header() {
    let (l, db) = ledger("serve_transfers").await;
    let svc = Service::start(&db, &["--no-sweep"]).await;

    let alice = json!({"account_id": "alice", "currency": "GBP", "opening": 100_000});
    let r = svc.post("/v1/accounts", alice.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["id"], "account:alice");
    assert_eq!(r.body["status"], "created");
    let r = svc.post("/v1/accounts", alice).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["status"], "exists");
    let r = svc
        .post(
            "/v1/accounts",
            json!({"account_id": "alice", "currency": "GBP", "opening": 1}),
        )
        .await;
    r.assert_error(409, "mismatch");
    assert_eq!(r.body["field"], "opening");
    let r = svc
        .post(
            "/v1/accounts",
            json!({"account_id": "shop", "currency": "gbp", "min_balance": null}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);

    let r = svc.get("/v1/accounts/alice").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.body,
        json!({"account": "alice", "currency": "GBP", "opening": 100000, "balance": 100000,
               "available": 100000, "posted": 100000, "min_balance": 0, "pending": [], "meta": {}})
    );
    let r = svc.get("/v1/accounts/shop").await;
    assert_eq!(r.body["min_balance"], Value::Null);
    svc.get("/v1/accounts/nobody")
        .await
        .assert_error(404, "not_found");
    let r = svc.get("/v1/accounts").await;
    let names: Vec<&str> = r.body["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["account"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alice", "shop"]);

    // Idempotency by header: the key is the id; the same terms again are 200 exists.
    let pay = json!({"from": "alice", "to": "shop", "amount": 10_000, "currency": "GBP"});
    let r = svc.transfer_keyed("order-42", pay.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(
        r.body,
        json!({"id": "order-42", "state": "done", "reason": null, "status": "created"})
    );
    let r = svc.transfer_keyed("order-42", pay.clone()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["status"], "exists");
    assert_eq!(r.body["state"], "done");
    // The same key with other terms: 409, and the body names the transfer.
    let mut other = pay.clone();
    other["amount"] = json!(10_001);
    let r = svc.transfer_keyed("order-42", other).await;
    r.assert_error(409, "mismatch");
    assert_eq!(r.body["id"], "order-42");
    assert_eq!(r.body["field"], "value");
    // The body's id and the header must agree.
    let mut with_id = pay.clone();
    with_id["id"] = json!("order-43");
    let r = svc.transfer_keyed("order-42", with_id.clone()).await;
    r.assert_error(400, "invalid_input");
    // The id in the body works like the header.
    let r = svc.post("/v1/transfers", with_id.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.body["id"], "order-43");
    assert_eq!(
        svc.post("/v1/transfers", with_id).await.status,
        StatusCode::OK
    );
    assert_eq!(l.account("alice").await.unwrap().balance.minor(), 80_000);

    // Without an id: a UUID v7 made by the service, in the answer.
    let mut too_much = pay.clone();
    too_much["amount"] = json!(1_000_000);
    let r = svc.post("/v1/transfers", too_much).await;
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "a cancelled transfer is created too"
    );
    assert_eq!(r.body["state"], "cancelled");
    assert_eq!(r.body["reason"], "insufficient_funds");
    let id = r.body["id"].as_str().unwrap().to_owned();
    assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 7);

    let r = svc.get("/v1/transfers/order-42").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["source"], "alice");
    assert_eq!(r.body["destination"], "shop");
    assert_eq!(r.body["amount"], 10_000);
    assert_eq!(r.body["state"], "done");
    svc.get("/v1/transfers/nope")
        .await
        .assert_error(404, "not_found");

    // Cancel: not a done transfer (409); an unknown one is 404.
    let r = svc.post("/v1/transfers/order-42/cancel", json!({})).await;
    r.assert_error(409, "not_cancellable");
    assert_eq!(r.body["id"], "order-42");
    svc.post("/v1/transfers/nope/cancel", json!({}))
        .await
        .assert_error(404, "not_found");
    // wait=false leaves it initial; cancel takes it to cancelled; it cannot be reversed.
    let mut later = pay.clone();
    later["wait"] = json!(false);
    let r = svc.transfer_keyed("later-1", later).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.body["state"], "initial");
    let r = svc.post("/v1/transfers/later-1/cancel", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["state"], "cancelled");
    assert_eq!(r.body["reason"], "cancelled_by_user");
    svc.post("/v1/transfers/later-1/reverse", json!({}))
        .await
        .assert_error(409, "not_reversible");

    // Reverse once: 201, then the same reversal 200.
    let r = svc.post("/v1/transfers/order-42/reverse", json!({})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["id"], "rev-order-42");
    assert_eq!(r.body["reverses"], "order-42");
    assert_eq!(r.body["state"], "done");
    let r = svc.post("/v1/transfers/order-42/reverse", json!({})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["status"], "exists");
    svc.post("/v1/transfers/nope/reverse", json!({}))
        .await
        .assert_error(404, "not_found");
    assert_eq!(l.account("alice").await.unwrap().balance.minor(), 90_000);

    let r = svc.get("/v1/status").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["states"]["done"], 3);
    assert_eq!(r.body["states"]["cancelled"], 2);
    assert_eq!(r.body["in_flight"], 0);
    let r = svc.get("/v1/verify?at_rest=true").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["ok"], true, "{}", r.body);
    assert!(r.body["checks"].as_array().unwrap().len() >= 7);

    // One log line per request, with the transfer's id.
    let log = svc.log();
    assert!(
        log.lines().any(|l| l.contains("path=/v1/transfers")
            && l.contains("status=201")
            && l.contains("transfer_id=\"order-42\"")),
        "{log}"
    );
}

#[tokio::test]
async fn serve_orders_purchase_payments_and_balances() {
    let (l, db) = ledger("serve_orders").await;
    let svc = Service::start(&db, &["--no-sweep"]).await;
    let purchase = format!("/v1/orders/{ORDER}/purchase?currency=GBP");

    let r = svc.put_text(&purchase, CLOUDANT).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["id"], format!("purchase:{ORDER}"));
    assert_eq!(
        svc.put_text(&purchase, CLOUDANT).await.status,
        StatusCode::OK
    );
    // The same order with other content.
    let changed = CLOUDANT.replace("17 Front Street", "18 Front Street");
    svc.put_text(&purchase, &changed)
        .await
        .assert_error(409, "mismatch");
    // The path names the order: a body without order_id takes it; another one is refused.
    let mut without: serde_json::Map<String, Value> = serde_json::from_str(CLOUDANT).unwrap();
    without.remove("order_id");
    let without = serde_json::to_string(&without).unwrap();
    let r = svc
        .put_text("/v1/orders/second/purchase?currency=GBP", &without)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["id"], "purchase:second");
    svc.put_text("/v1/orders/third/purchase?currency=GBP", CLOUDANT)
        .await
        .assert_error(400, "invalid_input");

    let payments = format!("/v1/orders/{ORDER}/payments");
    let card = json!({"ref": "AB9977G244FF2F667", "amount": 646, "currency": "GBP",
                      "method": "credit card"});
    let r = svc.post(&payments, card.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(
        r.body,
        json!({"id": format!("payment:{ORDER}:AB9977G244FF2F667"), "status": "created"})
    );
    assert_eq!(
        svc.post(&payments, card.clone()).await.status,
        StatusCode::OK
    );
    let mut other = card;
    other["amount"] = json!(647);
    svc.post(&payments, other)
        .await
        .assert_error(409, "mismatch");
    let voucher = json!({"ref": "Q88775662377224", "amount": 2000, "currency": "GBP"});
    assert_eq!(
        svc.post(&payments, voucher).await.status,
        StatusCode::CREATED
    );
    let adjust = json!({"ref": "goodwill", "amount": -150, "currency": "GBP", "reason": "late"});
    let r = svc
        .post(&format!("/v1/orders/{ORDER}/adjustments"), adjust)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let refund = json!({"ref": "rf1", "amount": 150, "currency": "GBP"});
    let r = svc
        .post(&format!("/v1/orders/{ORDER}/refunds"), refund)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = svc
        .post(
            &format!("/v1/orders/{ORDER}/shipments"),
            json!({"ref": "trk-1", "carrier": "Royal Mail"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = svc
        .post(
            &format!("/v1/orders/{ORDER}/deliveries"),
            json!({"ref": "trk-1"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    let r = svc.get(&format!("/v1/orders/{ORDER}")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["order_id"], ORDER);
    assert_eq!(r.body["currency"], "GBP");
    assert_eq!(r.body["total"], 2646);
    assert_eq!(r.body["adjusted"], -150);
    assert_eq!(r.body["paid"], 2646);
    assert_eq!(r.body["refunded"], 150);
    assert_eq!(r.body["balance"], 0);
    assert_eq!(r.body["entries"].as_array().unwrap().len(), 5);
    assert_eq!(r.body["entries"][0]["type"], "purchase");
    assert_eq!(
        l.order_balance(ORDER).await.unwrap().minor(),
        0,
        "the library agrees"
    );

    // Unknown orders are 404, reading and paying.
    svc.get("/v1/orders/nothere")
        .await
        .assert_error(404, "not_found");
    svc.post(
        "/v1/orders/nothere/payments",
        json!({"ref": "x", "amount": 1, "currency": "GBP"}),
    )
    .await
    .assert_error(404, "not_found");

    // Outstanding: only "second" still owes.
    let r = svc.get("/v1/orders?outstanding=true&limit=10").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.body,
        json!({"orders": [{"order_id": "second", "currency": "GBP", "balance": 2646}],
               "next": null})
    );
    svc.get("/v1/orders")
        .await
        .assert_error(400, "invalid_input");
    let r = svc.get("/v1/customers/985522332/statement").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["orders"].as_array().unwrap().len(), 2);
    assert_eq!(
        r.body["totals"],
        json!([{"currency": "GBP", "balance": 2646}])
    );
}

#[tokio::test]
async fn serve_bad_input_is_refused_and_writes_nothing() {
    let (l, db) = ledger("serve_bad_input").await;
    account(&l, "alice", "EUR", 10_000, Some(0)).await;
    account(&l, "bob", "EUR", 0, Some(0)).await;
    let gbp = Currency::from_code("GBP").unwrap();
    l.record_purchase(&couch_ledger::Purchase::from_json(CLOUDANT, Some(gbp)).unwrap())
        .await
        .unwrap();
    let svc = Service::start(&db, &["--no-sweep"]).await;
    let before = doc_count(&l).await;

    let transfer = |patch: Value| {
        let mut t = json!({"from": "alice", "to": "bob", "amount": 100, "currency": "EUR"});
        for (k, v) in patch.as_object().unwrap() {
            t[k] = v.clone();
        }
        t
    };
    let bad_transfers = [
        transfer(json!({"amount": 6.46})),
        transfer(json!({"amount": "100"})),
        transfer(json!({"amount": 0})),
        transfer(json!({"amount": -5})),
        transfer(json!({"amount": 9_007_199_254_740_992i64})),
        transfer(json!({"currency": "XXX"})),
        transfer(json!({"to": "alice"})),
        transfer(json!({"from": "a:b"})),
        transfer(json!({"to": "_design"})),
        transfer(json!({"id": "x:y"})),
        transfer(json!({"colour": "blue"})),
        json!({"from": "alice", "to": "bob", "currency": "EUR"}),
        json!([1, 2]),
    ];
    for body in bad_transfers {
        let r = svc.post("/v1/transfers", body.clone()).await;
        assert!(
            matches!(r.status.as_u16(), 400 | 422),
            "{body} → {} {}",
            r.status,
            r.body
        );
        assert!(r.body["error"].is_string(), "{}", r.body);
        assert!(
            r.body["id"].is_string(),
            "a transfer error names its id: {}",
            r.body
        );
    }
    let r = svc.post_text("/v1/transfers", "{not json").await;
    r.assert_error(400, "invalid_json");
    let r = svc.transfer_keyed("bad:key", transfer(json!({}))).await;
    r.assert_error(400, "invalid_input");
    assert_eq!(r.body["id"], "bad:key");

    let bad_accounts = [
        json!({"account_id": "carol", "currency": "EUR", "opening": 1.5}),
        json!({"account_id": "carol", "currency": "EURO"}),
        json!({"account_id": "_carol", "currency": "EUR"}),
        json!({"account_id": "c:arol", "currency": "EUR"}),
        json!({"account_id": "carol", "currency": "EUR", "opening": 5, "min_balance": 10}),
        json!({"account_id": "carol", "currency": "EUR", "overdraft": true}),
        json!({"currency": "EUR"}),
    ];
    for body in bad_accounts {
        let r = svc.post("/v1/accounts", body.clone()).await;
        assert!(
            matches!(r.status.as_u16(), 400 | 422),
            "{body} → {}",
            r.body
        );
        assert!(r.body["error"].is_string());
    }

    let payments = format!("/v1/orders/{ORDER}/payments");
    for body in [
        json!({"ref": "p1", "amount": 6.46, "currency": "GBP"}),
        json!({"ref": "p1", "amount": 0, "currency": "GBP"}),
        json!({"ref": "p1", "amount": 646, "currency": "EUR"}),
        json!({"ref": "p:1", "amount": 646, "currency": "GBP"}),
        json!({"amount": 646, "currency": "GBP"}),
    ] {
        let r = svc.post(&payments, body.clone()).await;
        assert!(
            matches!(r.status.as_u16(), 400 | 422),
            "{body} → {}",
            r.body
        );
    }
    let r = svc
        .post(
            &format!("/v1/orders/{ORDER}/adjustments"),
            json!({"ref": "a1", "amount": 0, "currency": "GBP"}),
        )
        .await;
    r.assert_error(400, "invalid_input");
    // Purchases: a decimal not exact in the currency, a wrong total, no currency at all.
    for (path, body) in [
        (
            "/v1/orders/o2/purchase?currency=GBP",
            CLOUDANT.replace("8.33", "8.333"),
        ),
        (
            "/v1/orders/o2/purchase?currency=GBP",
            CLOUDANT.replace("26.46", "26.47"),
        ),
        ("/v1/orders/o2/purchase", CLOUDANT.to_owned()),
        ("/v1/orders/o2/purchase?currency=GBP", "[]".to_owned()),
    ] {
        let body = body.replace(ORDER, "o2");
        let r = svc.put_text(path, &body).await;
        r.assert_error(400, "invalid_input");
    }
    svc.get("/v1/orders?outstanding=true&limit=0")
        .await
        .assert_error(400, "invalid_input");
    svc.get("/v1/orders?outstanding=true&colour=blue")
        .await
        .assert_error(400, "invalid_input");

    // Nothing was written by any of them.
    assert_eq!(doc_count(&l).await, before);
    assert!(l.transfer("bad:key").await.is_err());
    assert_eq!(l.account("alice").await.unwrap().balance.minor(), 10_000);
}

#[tokio::test]
async fn serve_auth_needs_a_key_on_v1_and_logs_json_without_it() {
    let (_l, db) = ledger("serve_auth").await;
    let file_key = "file-key-0123456789abcdef";
    let env_key = "env-key-0123456789abcdef";
    let keys = std::env::temp_dir().join(format!("couch-ledger-keys-{}", fastrand::u64(..)));
    std::fs::write(&keys, format!("# the shop's key\n{file_key}\n\n")).unwrap();
    let svc = Service::start_on(
        &support::server().url,
        &db,
        &[
            "--no-sweep",
            "--api-keys-file",
            keys.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        &[(
            "COUCH_LEDGER_API_KEYS",
            &format!("other-key-0123456789abc, {env_key}"),
        )],
    )
    .await;
    std::fs::remove_file(&keys).unwrap();

    // No key, a wrong key, the wrong scheme: 401, with WWW-Authenticate.
    let r = svc.get("/v1/status").await;
    r.assert_error(401, "unauthorized");
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    let wrong = svc
        .send(
            svc.http
                .get(format!("{}/v1/status", svc.base))
                .bearer_auth("file-key-0123456789abcdeX"),
        )
        .await;
    wrong.assert_error(401, "unauthorized");
    let basic = svc
        .send(
            svc.http
                .get(format!("{}/v1/accounts", svc.base))
                .basic_auth(file_key, Some("")),
        )
        .await;
    basic.assert_error(401, "unauthorized");
    let r = svc
        .post(
            "/v1/transfers",
            json!({"from": "a", "to": "b", "amount": 1, "currency": "EUR"}),
        )
        .await;
    r.assert_error(401, "unauthorized");
    // The operator's endpoints stay open.
    assert_eq!(svc.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(svc.get("/readyz").await.status, StatusCode::OK);
    assert_eq!(svc.get("/openapi.json").await.status, StatusCode::OK);
    assert!(svc.metric("couch_ledger_status_up").await >= 0.0);

    // Either key lets a caller in.
    let mut svc = svc.with_key(file_key);
    assert_eq!(svc.get("/v1/status").await.status, StatusCode::OK);
    svc.key = Some(env_key.to_owned());
    let r = svc
        .post(
            "/v1/accounts",
            json!({"account_id": "a", "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    // JSON log lines: one per request, the fields named, never a key.
    let log = svc.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let requests: Vec<&Value> = lines.iter().filter(|l| l["message"] == "request").collect();
    assert!(requests.len() >= 8, "{log}");
    let r401 = requests
        .iter()
        .find(|l| l["status"] == 401 && l["path"] == "/v1/status")
        .expect("a 401 line");
    assert_eq!(r401["method"], "GET");
    assert!(r401["duration_ms"].is_number());
    for key in [file_key, env_key] {
        assert!(!log.contains(key), "a key in the log: {log}");
    }
}

#[tokio::test]
async fn serve_200_concurrent_transfers_all_created() {
    const TRANSFERS: usize = 200;
    const ACCOUNTS: usize = 20;
    let (l, db) = ledger("serve_concurrent").await;
    for i in 0..ACCOUNTS {
        account(&l, &format!("acc{i:02}"), "EUR", 1_000_000, Some(0)).await;
    }
    let svc = Arc::new(Service::start(&db, &["--no-sweep"]).await);
    let done_before = svc
        .metric("couch_ledger_transfers_total{outcome=\"done\"}")
        .await;
    let requests_before = svc
        .metric("couch_ledger_http_requests_total{method=\"POST\",route=\"/v1/transfers\",status=\"201\"}")
        .await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..TRANSFERS {
        let svc = svc.clone();
        tasks.spawn(async move {
            let (from, to) = (i % ACCOUNTS, (i * 7 + 1) % ACCOUNTS);
            let to = if to == from { (to + 1) % ACCOUNTS } else { to };
            let body = json!({"from": format!("acc{from:02}"), "to": format!("acc{to:02}"),
                              "amount": 100 + i, "currency": "EUR"});
            let r = svc.transfer_keyed(&format!("c{i:03}"), body).await;
            (r.status, r.body)
        });
    }
    let several = support::copies(&db).await > 1;
    let mut created = 0;
    let mut unconfirmed = 0;
    while let Some(done) = tasks.join_next().await {
        let (status, body) = done.unwrap();
        // A loaded cluster can answer a decision's write 202 (docs/CLUSTER.md, "A 202 on a
        // healthy cluster"): the caller is not told, and the sweep below finishes it.
        if several && status == StatusCode::SERVICE_UNAVAILABLE && body["error"] == "unconfirmed" {
            unconfirmed += 1;
            continue;
        }
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["state"], "done", "{body}");
        created += 1;
    }
    assert_eq!(created + unconfirmed, TRANSFERS);
    if unconfirmed > 0 {
        eprintln!("{unconfirmed} of {TRANSFERS} answered unconfirmed; sweeping");
        support::sweep_until_none_open(&l, Duration::from_secs(120)).await;
    }
    let done_after = svc
        .metric("couch_ledger_transfers_total{outcome=\"done\"}")
        .await;
    assert!(
        done_after - done_before >= created as f64,
        "{done_before} → {done_after}"
    );
    let requests_after = svc
        .metric("couch_ledger_http_requests_total{method=\"POST\",route=\"/v1/transfers\",status=\"201\"}")
        .await;
    assert!(requests_after - requests_before >= created as f64);
    // One ledger per process: the callers shared the group commit, so CouchDB saw fewer
    // requests than transfers × the protocol's steps.
    let couch_posts = svc
        .metric("couch_ledger_couchdb_requests_total{method=\"POST\",status=\"201\"}")
        .await;
    assert!(
        couch_posts > 0.0 && couch_posts < (TRANSFERS * 5) as f64,
        "{couch_posts}"
    );
    assert!(
        svc.metric("couch_ledger_couchdb_request_duration_seconds_count")
            .await
            > 0.0
    );
    // Read from a view at each scrape, which may lag the last writes on a cluster.
    support::wait_for(
        "every transfer counted done",
        Duration::from_secs(30),
        || async {
            let done = svc
                .metric("couch_ledger_transfers_by_state{state=\"done\"}")
                .await;
            (done == TRANSFERS as f64).then_some(())
        },
    )
    .await;
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    assert!(report.ok, "{report:?}");
}

#[tokio::test]
async fn serve_stops_gracefully_on_sigterm_finishing_requests_in_flight() {
    const IN_FLIGHT: usize = 12;
    let (l, db) = ledger("serve_sigterm").await;
    account(&l, "src", "EUR", 1_000_000, Some(0)).await;
    account(&l, "dst", "EUR", 0, Some(0)).await;
    // Every CouchDB reply held back, so the transfers are surely in flight at the signal.
    let upstream = support::loopback_server_addr();
    let Some(upstream) = upstream else {
        eprintln!("skipped: the test server is not on loopback (the delaying proxy needs it)");
        return;
    };
    let faults = support::proxy::HttpFaults {
        delay_permille: 1000,
        delay_ms: 700,
        ..Default::default()
    };
    let proxy = support::proxy::FaultProxy::start_http(upstream, faults, 13).await;
    let svc = Arc::new(Service::start_on(&proxy.url(), &db, &["--no-sweep"], &[]).await);

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..IN_FLIGHT {
        let svc = svc.clone();
        tasks.spawn(async move {
            let body = json!({"from": "src", "to": "dst", "amount": 10 + i, "currency": "EUR"});
            let r = svc.transfer_keyed(&format!("t{i:02}"), body).await;
            (r.status, r.body)
        });
    }
    // All of them being answered (and the scrape that asks).
    support::wait_for("the transfers in flight", Duration::from_secs(60), || {
        let svc = svc.clone();
        async move {
            let n = svc.metric("couch_ledger_http_requests_in_flight").await;
            (n > IN_FLIGHT as f64).then_some(())
        }
    })
    .await;
    sigterm(svc.pid());
    while let Some(done) = tasks.join_next().await {
        let (status, body) = done.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["state"], "done", "{body}");
    }
    let mut svc = Arc::into_inner(svc).expect("the tasks let go of it");
    svc.exited_cleanly().await;
    assert!(svc.log().contains("stopping"), "{}", svc.log());
    // Nothing is accepted any more.
    assert!(reqwest::get(format!("{}/healthz", svc.base)).await.is_err());
    assert_eq!(
        l.account("dst").await.unwrap().balance.minor(),
        (0..IN_FLIGHT as i64).map(|i| 10 + i).sum::<i64>()
    );
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    assert!(report.ok, "{report:?}");
}

/// `--answer-at-commit`: every transfer is answered at its decision (`done` on the one-write
/// path: the money moved), and what was still settling when SIGTERM came is finished before the
/// process exits — with no sweeper running, nothing else would.
#[tokio::test]
async fn serve_answer_at_commit_answers_at_the_decision_and_finishes_before_it_stops() {
    const TRANSFERS: usize = 30;
    let (l, db) = ledger("serve_answer_at_commit").await;
    account(&l, "src", "EUR", 1_000_000, Some(0)).await;
    account(&l, "dst", "EUR", 0, Some(0)).await;
    let svc = Arc::new(Service::start(&db, &["--no-sweep", "--answer-at-commit"]).await);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..TRANSFERS {
        let svc = svc.clone();
        tasks.spawn(async move {
            let body = json!({"from": "src", "to": "dst", "amount": 100 + i, "currency": "EUR"});
            let r = svc.transfer_keyed(&format!("a{i:02}"), body).await;
            (r.status, r.body)
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (status, body) = done.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["state"], "done", "{body}");
    }
    // Answered at the decision: the balance carries every transfer already.
    let moved: i64 = (0..TRANSFERS as i64).map(|i| 100 + i).sum();
    assert_eq!(l.account("dst").await.unwrap().balance.minor(), moved);
    sigterm(svc.pid());
    let mut svc = Arc::into_inner(svc).expect("the tasks let go of it");
    svc.exited_cleanly().await;
    for i in 0..TRANSFERS {
        let t = l.transfer(&format!("a{i:02}")).await.unwrap();
        assert_eq!(t.state, TransferState::Done, "a{i:02}: {}", svc.log());
    }
    let dst = l.account("dst").await.unwrap();
    assert_eq!(dst.balance.minor(), moved);
    assert!(dst.pending.is_empty(), "{:?}", dst.pending);
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    assert!(report.ok, "{report:?}");
}

#[tokio::test]
async fn serve_operator_endpoints_sweeper_and_an_unreachable_couchdb() {
    let (l, db) = ledger("serve_ops").await;
    account(&l, "a", "EUR", 1_000, Some(0)).await;
    account(&l, "b", "EUR", 0, Some(0)).await;
    let svc = Service::start(&db, &["--stale-after", "0s"]).await;

    let r = svc.get("/healthz").await;
    assert_eq!(r.body, json!({"status": "ok"}));
    let r = svc.get("/readyz").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["ready"], true);

    // The document lists every endpoint with its methods.
    let doc = svc.get("/openapi.json").await.body;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let expected = [
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
        ("post", "/v1/accounts"),
        ("get", "/v1/accounts"),
        ("get", "/v1/accounts/{id}"),
        ("post", "/v1/transfers"),
        ("get", "/v1/transfers/{id}"),
        ("post", "/v1/transfers/{id}/cancel"),
        ("post", "/v1/transfers/{id}/reverse"),
        ("put", "/v1/orders/{order_id}/purchase"),
        ("post", "/v1/orders/{order_id}/payments"),
        ("post", "/v1/orders/{order_id}/refunds"),
        ("post", "/v1/orders/{order_id}/adjustments"),
        ("get", "/v1/orders/{order_id}"),
        ("get", "/v1/orders"),
        ("get", "/v1/status"),
        ("get", "/v1/verify"),
    ];
    for (method, path) in expected {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing"
        );
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["api_key"]["scheme"],
        "bearer"
    );
    assert!(doc["components"]["schemas"]["CreateTransfer"].is_object());

    // The sweeper inside finishes a transfer written for it.
    let r = svc
        .post(
            "/v1/transfers",
            json!({"id": "later", "from": "a", "to": "b", "amount": 300, "currency": "EUR",
                   "wait": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.body["state"], "initial");
    support::wait_for(
        "the sweeper to finish the transfer",
        Duration::from_secs(60),
        || async {
            let r = svc.get("/v1/transfers/later").await;
            (r.body["state"] == "done").then_some(())
        },
    )
    .await;
    assert!(svc.metric("couch_ledger_sweeper_passes_total").await >= 1.0);
    assert!(
        svc.metric("couch_ledger_sweeper_transfers_total{result=\"advanced\"}")
            .await
            >= 1.0
    );
    let metrics = svc.get("/metrics").await;
    assert!(metrics.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = metrics.body.as_str().unwrap();
    for name in [
        "couch_ledger_transfers_total{outcome=\"initial\"}",
        "couch_ledger_transfers_by_state{state=\"done\"}",
        "couch_ledger_oldest_open_transfer_age_seconds",
        "couch_ledger_sweeper_passes_total",
        "couch_ledger_sweeper_pass_failures_total",
        "couch_ledger_couchdb_requests_total{",
        "couch_ledger_couchdb_retries_total",
        "couch_ledger_couchdb_request_duration_seconds_bucket",
        "couch_ledger_http_request_duration_seconds_bucket",
        "couch_ledger_status_up 1",
    ] {
        assert!(text.contains(name), "{name} not in\n{text}");
    }

    // A design document gone: not ready (503).
    let validation: Value = l.client().get("_design/validation").await.unwrap();
    l.client()
        .delete("_design/validation", validation["_rev"].as_str().unwrap())
        .await
        .unwrap();
    let r = svc.get("/readyz").await;
    r.assert_error(503, "not_ready");
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("_design/validation"));

    // CouchDB unreachable: /readyz and /v1 answer 503 with Retry-After.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let down = Service::start_on(&dead_url, &db, &["--no-sweep", "--timeout", "2s"], &[]).await;
    let r = down.get("/readyz").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    let r = down.get("/v1/accounts/a").await;
    r.assert_error(503, "couchdb_unavailable");
    assert!(r.headers.contains_key("retry-after"));
    let r = down
        .transfer_keyed(
            "while-down",
            json!({"from": "a", "to": "b", "amount": 1, "currency": "EUR"}),
        )
        .await;
    r.assert_error(503, "couchdb_unavailable");
    assert_eq!(r.body["id"], "while-down");
    assert!(down.metric("couch_ledger_couchdb_retries_total").await > 0.0);
    assert_eq!(down.metric("couch_ledger_status_up").await, 0.0);
}

#[tokio::test]
async fn serve_the_node_example_client_runs_against_it() {
    let (_l, db) = ledger("serve_node").await;
    let svc = Service::start(&db, &["--no-sweep"]).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/service-client.mjs"
    );
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(script)
            .env("LEDGER_URL", &svc.base)
            .env("RUN_ID", "t1")
            .env_remove("LEDGER_API_KEY")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the example finished in time")
    .expect("node runs (it also runs the test server)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().last(), Some("ok"), "{stdout}");
    let r = svc.get("/v1/orders/order-t1").await;
    assert_eq!(r.body["balance"], 0);
    let r = svc.get("/v1/accounts/shop-t1").await;
    assert_eq!(r.body["balance"], 2646);
}

/// SIGTERM with a transfer in flight and the sweeper on a step, against a CouchDB that accepts
/// connections and never answers: the process is gone within `--shutdown-timeout` (plus a
/// little), exit 1, saying what it stopped without.
#[tokio::test]
async fn serve_stops_within_the_shutdown_timeout_whatever_couchdb_does() {
    const SHUTDOWN_S: u64 = 2;
    // Every connection is accepted and held open without a byte written back.
    let silent = support::silent_server();
    let mut svc = Service::start_on(
        &silent,
        "ledger",
        &["--timeout", "60s", "--shutdown-timeout", "2s"],
        &[],
    )
    .await;
    // A transfer of its own client, so the service stays ours to wait for.
    let url = format!("{}/v1/transfers", svc.base);
    let request = tokio::spawn(async move {
        let body = json!({"from": "src", "to": "dst", "amount": 10, "currency": "EUR"});
        reqwest::Client::new()
            .post(url)
            .header("Idempotency-Key", "stuck")
            .json(&body)
            .send()
            .await
    });
    // The transfer is in flight (the scrape that asks is one too).
    support::wait_for("the transfer in flight", Duration::from_secs(30), || {
        let svc = &svc;
        async move {
            let n = svc.metric("couch_ledger_http_requests_in_flight").await;
            (n >= 2.0).then_some(())
        }
    })
    .await;
    let started = std::time::Instant::now();
    sigterm(svc.pid());
    let exit = tokio::time::timeout(Duration::from_secs(60), svc.child.wait())
        .await
        .expect("serve exited after SIGTERM")
        .unwrap();
    request.abort();
    let took = started.elapsed();
    svc.log_to_end().await;
    assert!(
        took < Duration::from_secs(SHUTDOWN_S + 2),
        "took {took:?}: {}",
        svc.log()
    );
    assert_eq!(exit.code(), Some(1), "{}", svc.log());
    assert!(svc.log().contains("--shutdown-timeout"), "{}", svc.log());
}

/// Every answer of the service is its JSON error shape, 404 and 405 included, on every kind of
/// path (with and without a key, with a path parameter).
#[tokio::test]
async fn serve_404_and_405_are_json_errors_everywhere() {
    let (_l, db) = ledger("serve_404_405").await;
    let svc = Service::start(&db, &["--no-sweep"]).await;
    for (method, path, status, code) in [
        (reqwest::Method::GET, "/nothing", 404, "not_found"),
        (reqwest::Method::GET, "/v1/nothing", 404, "not_found"),
        (
            reqwest::Method::DELETE,
            "/v1/accounts",
            405,
            "method_not_allowed",
        ),
        (
            reqwest::Method::PATCH,
            "/v1/accounts/a",
            405,
            "method_not_allowed",
        ),
        (
            reqwest::Method::DELETE,
            "/v1/transfers/t",
            405,
            "method_not_allowed",
        ),
        (
            reqwest::Method::GET,
            "/v1/transfers/t/cancel",
            405,
            "method_not_allowed",
        ),
        (reqwest::Method::POST, "/healthz", 405, "method_not_allowed"),
        (reqwest::Method::POST, "/metrics", 405, "method_not_allowed"),
        (
            reqwest::Method::DELETE,
            "/openapi.json",
            405,
            "method_not_allowed",
        ),
    ] {
        let r = svc
            .send(
                svc.http
                    .request(method.clone(), format!("{}{path}", svc.base)),
            )
            .await;
        assert_eq!(r.status.as_u16(), status, "{method} {path}: {}", r.body);
        assert_eq!(r.body["error"], code, "{method} {path}: {}", r.body);
        assert!(
            r.body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{method} {path}: {}",
            r.body
        );
    }
}
