//! The HTTP layer against wiremock: the faults a real server will not produce on demand.
//!
//! Retries (which statuses, how many, which requests), `Retry-After`, timeouts, refused
//! connections, garbage bodies, status → error mapping, authentication on the wire, and
//! credentials that must never reach an error, a `Debug` or a log line. No real server here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_ledger::{Client, RetryPolicy};
use serde_json::{json, Value};
use wiremock::matchers::{basic_auth, body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// The password of every client built here: it must never show up in what the library prints.
const PASSWORD: &str = "s3cr3t-pw";

/// Fast retries so the suite does not sleep: 1 ms base, 10 ms cap.
fn fast(retries_max: u32) -> RetryPolicy {
    RetryPolicy {
        retries_max,
        delay_base: Duration::from_millis(1),
        delay_max: Duration::from_millis(10),
        retry_after_max: Duration::from_millis(10),
    }
}

/// A client on database `db` of the mock server, with fast retries.
fn client(server: &MockServer, retries_max: u32) -> Client {
    Client::builder()
        .url(server.uri())
        .database("db")
        .request_timeout(Duration::from_secs(10))
        .retry(fast(retries_max))
        .build()
        .expect("client")
}

/// Requests the mock server received so far.
async fn received(server: &MockServer) -> Vec<Request> {
    server
        .received_requests()
        .await
        .expect("request recording is on")
}

/// A port with nothing listening on it.
fn closed_port() -> u16 {
    // Not a port the system hands out (an ephemeral one, released, could be taken by another
    // test's server before the client connects): nothing listens on port 1 of the loopback.
    let port = 1;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "something listens on 127.0.0.1:{port}; these tests need it closed"
    );
    port
}

/// Answers with `replies` in order, repeating the last one.
struct Sequence {
    replies: Vec<ResponseTemplate>,
    next: AtomicUsize,
}

impl Sequence {
    fn new(replies: Vec<ResponseTemplate>) -> Sequence {
        assert!(!replies.is_empty());
        Sequence {
            replies,
            next: AtomicUsize::new(0),
        }
    }
}

impl Respond for Sequence {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let i = self.next.fetch_add(1, Ordering::SeqCst);
        self.replies[i.min(self.replies.len() - 1)].clone()
    }
}

fn couch_error(status: u16, error: &str, reason: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({"error": error, "reason": reason}))
}

fn doc_ok() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"_id": "doc", "_rev": "1-a", "n": 1}))
}

/// Every way an error can be printed: Display, Debug, alternate forms, and the whole
/// `source()` chain (each link in Display and Debug, plus the joined `{:#}`-style chain).
fn printed(e: &couch_ledger::Error) -> Vec<String> {
    let mut texts = vec![
        format!("{e}"),
        format!("{e:?}"),
        format!("{e:#}"),
        format!("{e:#?}"),
    ];
    let mut chain = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        chain.push_str(": ");
        chain.push_str(&s.to_string());
        texts.push(format!("{s:?}"));
        source = s.source();
    }
    texts.push(chain);
    texts
}

fn assert_no_secret(what: &str, e: &couch_ledger::Error) {
    for text in printed(e) {
        assert!(
            !text.contains(PASSWORD),
            "{what}: the password leaked: {text}"
        );
    }
}

// ---- retries ------------------------------------------------------------------------------

#[tokio::test]
async fn a_503_is_retried_and_the_get_succeeds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .respond_with(Sequence::new(vec![
            couch_error(503, "service_unavailable", "busy"),
            doc_ok(),
        ]))
        .mount(&server)
        .await;
    let c = client(&server, 3);
    let doc: Value = c.get("doc").await.expect("succeeds after one retry");
    assert_eq!(doc["n"], 1);
    assert_eq!(received(&server).await.len(), 2);
    assert_eq!(c.requests_sent(), 2);
}

#[tokio::test]
async fn a_429_waits_for_retry_after() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .respond_with(Sequence::new(vec![
            couch_error(429, "too_many_requests", "slow down").insert_header("Retry-After", "1"),
            doc_ok(),
        ]))
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .request_timeout(Duration::from_secs(10))
        .retry(RetryPolicy {
            retry_after_max: Duration::from_secs(5),
            ..fast(3)
        })
        .build()
        .unwrap();
    let start = Instant::now();
    let doc: Value = c.get("doc").await.expect("succeeds after the wait");
    let elapsed = start.elapsed();
    assert_eq!(doc["n"], 1);
    assert_eq!(received(&server).await.len(), 2);
    // The backoff alone is at most 10 ms: only Retry-After explains a wait of a second.
    assert!(
        elapsed >= Duration::from_millis(900),
        "waited only {elapsed:?}"
    );
}

/// `call_timeout` bounds a call with its retries: slow tries are cut to what is left of it, a
/// `Retry-After` longer than what is left is not waited for, and the observer is told of each
/// retry. Without it each try has the whole request timeout (a library user's choice).
#[tokio::test]
async fn a_call_timeout_bounds_the_retries_and_each_retry_is_told() {
    #[derive(Default)]
    struct Retries(Mutex<Vec<(u32, bool, Option<Duration>)>>);
    impl couch_ledger::Observer for Retries {
        fn retrying(&self, e: &couch_ledger::RetryEvent<'_>) {
            self.0
                .lock()
                .unwrap()
                .push((e.next_try, e.timed_out, e.left));
        }
    }
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/slow"))
        .respond_with(doc_ok().set_delay(Duration::from_secs(30)))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/db/later"))
        .respond_with(
            couch_error(503, "service_unavailable", "busy").insert_header("Retry-After", "30"),
        )
        .mount(&server)
        .await;
    let retries = Arc::new(Retries::default());
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .request_timeout(Duration::from_millis(700))
        .call_timeout(Duration::from_secs(2))
        .retry(RetryPolicy {
            retry_after_max: Duration::from_secs(60),
            ..fast(10)
        })
        .observer(retries.clone())
        .build()
        .unwrap();
    let start = Instant::now();
    let e = c.get::<Value>("slow").await.unwrap_err();
    let took = start.elapsed();
    assert!(e.is_timeout(), "{e}");
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    assert!(took >= Duration::from_millis(1900), "took {took:?}");
    assert!(
        e.to_string().contains(&server.uri()),
        "names the server: {e}"
    );
    assert!(e.to_string().contains("did not answer within 2"), "{e}");
    let told = retries.0.lock().unwrap().clone();
    assert!(told.len() >= 2, "{told:?}");
    assert!(
        told.iter()
            .all(|(_, timed_out, left)| *timed_out
                && left.is_some_and(|l| l < Duration::from_secs(2))),
        "{told:?}"
    );
    assert_eq!(told[0].0, 2, "the first retry is the second try: {told:?}");

    let start = Instant::now();
    let e = c.get::<Value>("later").await.unwrap_err();
    assert_eq!(e.status_code(), Some(503), "{e}");
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "a 30 s Retry-After does not fit in 2 s: {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_retry_after_as_an_http_date_is_honoured() {
    let server = MockServer::start().await;
    // Two seconds ahead, in the date's whole seconds: a wait of more than one second.
    let at = std::time::SystemTime::now() + Duration::from_secs(2);
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .respond_with(Sequence::new(vec![
            couch_error(503, "service_unavailable", "maintenance")
                .insert_header("Retry-After", httpdate::fmt_http_date(at).as_str()),
            doc_ok(),
        ]))
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .request_timeout(Duration::from_secs(10))
        .retry(RetryPolicy {
            retry_after_max: Duration::from_secs(10),
            ..fast(3)
        })
        .build()
        .unwrap();
    let start = Instant::now();
    let doc: Value = tokio::time::timeout(Duration::from_secs(20), c.get("doc"))
        .await
        .expect("the wait for the date is bounded")
        .expect("succeeds after the wait");
    let elapsed = start.elapsed();
    assert_eq!(doc["n"], 1);
    assert_eq!(received(&server).await.len(), 2);
    // The backoff alone is at most 10 ms: only the date explains a wait of a second.
    assert!(
        elapsed >= Duration::from_millis(900),
        "waited only {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "waited {elapsed:?}");
}

#[tokio::test]
async fn a_retry_after_beyond_the_policy_is_capped() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .respond_with(Sequence::new(vec![
            couch_error(503, "service_unavailable", "maintenance")
                .insert_header("Retry-After", "3600"),
            doc_ok(),
        ]))
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .request_timeout(Duration::from_secs(10))
        .retry(RetryPolicy {
            retry_after_max: Duration::from_millis(100),
            ..fast(3)
        })
        .build()
        .unwrap();
    let start = Instant::now();
    // Uncapped, this would sleep an hour: bound it so a regression fails instead of hanging.
    let doc: Value = tokio::time::timeout(Duration::from_secs(20), c.get("doc"))
        .await
        .expect("Retry-After: 3600 was not capped by retry_after_max")
        .expect("succeeds after the capped wait");
    let elapsed = start.elapsed();
    assert_eq!(doc["n"], 1);
    assert_eq!(received(&server).await.len(), 2);
    // The capped Retry-After is still honoured: at least retry_after_max, not the backoff.
    assert!(
        elapsed >= Duration::from_millis(100),
        "waited only {elapsed:?}"
    );
}

#[tokio::test]
async fn server_errors_are_retried_until_retries_max_and_the_last_status_is_reported() {
    // Each transient status alone…
    for status in [500u16, 502, 503, 504] {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/db/doc"))
            .respond_with(couch_error(status, "unknown_error", "try later"))
            .mount(&server)
            .await;
        let c = client(&server, 3);
        let e = c.get::<Value>("doc").await.unwrap_err();
        assert!(e.is_transient(), "{status}: {e}");
        assert_eq!(e.status_code(), Some(status), "{e}");
        assert_eq!(
            received(&server).await.len(),
            4,
            "{status}: retries_max + 1"
        );
        assert_eq!(c.requests_sent(), 4);
    }
    // …and a mix: every one is retried, and the error is the last answer's.
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .respond_with(Sequence::new(vec![
            ResponseTemplate::new(500),
            ResponseTemplate::new(502),
            ResponseTemplate::new(504),
        ]))
        .mount(&server)
        .await;
    let c = client(&server, 2);
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert_eq!(e.status_code(), Some(504), "{e}");
    assert_eq!(received(&server).await.len(), 3);
}

#[tokio::test]
async fn retries_max_zero_sends_once() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let c = client(&server, 0);
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert_eq!(e.status_code(), Some(503));
    assert_eq!(received(&server).await.len(), 1);
}

#[tokio::test]
async fn a_409_on_put_is_a_conflict_at_once() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/db/doc"))
        .respond_with(couch_error(409, "conflict", "Document update conflict."))
        .mount(&server)
        .await;
    let c = client(&server, 5);
    let e = c.put("doc", &json!({"n": 1})).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    assert!(!e.is_transient(), "{e}");
    assert_eq!(e.couch_error(), Some("conflict"));
    assert_eq!(e.reason(), Some("Document update conflict."));
    assert_eq!(received(&server).await.len(), 1);
}

#[tokio::test]
async fn bulk_docs_is_retried_only_when_every_doc_has_an_id() {
    // Without an `_id` a repeat would make copies: one attempt, even on a 503.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/db/_bulk_docs"))
        .respond_with(Sequence::new(vec![
            couch_error(503, "service_unavailable", "busy"),
            ResponseTemplate::new(201).set_body_json(json!([
                {"ok": true, "id": "a", "rev": "1-a"},
                {"ok": true, "id": "x", "rev": "1-x"},
            ])),
        ]))
        .mount(&server)
        .await;
    let c = client(&server, 5);
    let e = c
        .bulk_docs(&[json!({"_id": "a", "n": 1}), json!({"n": 2})])
        .await
        .unwrap_err();
    assert_eq!(e.status_code(), Some(503), "{e}");
    assert!(e.is_transient(), "{e}");
    assert_eq!(received(&server).await.len(), 1);

    // Every document named: a repeat finds its own writes, so it is retried.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/db/_bulk_docs"))
        .respond_with(Sequence::new(vec![
            couch_error(503, "service_unavailable", "busy"),
            ResponseTemplate::new(201).set_body_json(json!([
                {"ok": true, "id": "a", "rev": "1-a"},
                {"id": "b", "error": "conflict", "reason": "Document update conflict."},
            ])),
        ]))
        .mount(&server)
        .await;
    let c = client(&server, 5);
    let results = c
        .bulk_docs(&[json!({"_id": "a", "n": 1}), json!({"_id": "b", "n": 2})])
        .await
        .expect("retried after the 503");
    assert_eq!(received(&server).await.len(), 2);
    assert_eq!(results.len(), 2);
    assert!(results[0].is_ok());
    assert!(results[1].is_conflict());
}

#[tokio::test]
async fn a_bulk_docs_reply_with_the_wrong_number_of_entries_is_a_decode_error() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/db/_bulk_docs"))
        .respond_with(
            ResponseTemplate::new(201)
                .set_body_json(json!([{"ok": true, "id": "a", "rev": "1-a"}])),
        )
        .mount(&server)
        .await;
    let c = client(&server, 3);
    let e = c
        .bulk_docs(&[json!({"_id": "a"}), json!({"_id": "b"})])
        .await
        .unwrap_err();
    assert!(e.is_decode(), "{e}");
    assert_eq!(e.status_code(), None);
    assert_eq!(received(&server).await.len(), 1);
}

// ---- status → result mapping --------------------------------------------------------------

#[tokio::test]
async fn a_202_on_put_is_surfaced_as_accepted() {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/db/quorum"))
        .respond_with(
            ResponseTemplate::new(202)
                .set_body_json(json!({"ok": true, "id": "quorum", "rev": "1-q"})),
        )
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/db/full"))
        .respond_with(
            ResponseTemplate::new(201)
                .set_body_json(json!({"ok": true, "id": "full", "rev": "1-f"})),
        )
        .mount(&server)
        .await;
    let c = client(&server, 3);
    let w = c.put("quorum", &json!({"n": 1})).await.unwrap();
    assert!(w.accepted);
    assert_eq!(w.id, "quorum");
    assert_eq!(w.rev, "1-q");
    let w = c.put("full", &json!({"n": 1})).await.unwrap();
    assert!(!w.accepted, "201 is a write that reached its quorum");
}

#[tokio::test]
async fn a_garbage_body_is_a_decode_error_naming_the_body() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .respond_with(ResponseTemplate::new(200).set_body_string("not json"))
        .mount(&server)
        .await;
    let c = client(&server, 3);
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_decode(), "{e}");
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("not json"), "{e}");
    // A body that arrived whole is not retried: the server would send the same again.
    assert_eq!(received(&server).await.len(), 1);
}

#[tokio::test]
async fn an_html_500_is_a_status_error() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .respond_with(ResponseTemplate::new(500).set_body_raw(
            "<html><body><h1>500 Internal Server Error</h1></body></html>",
            "text/html",
        ))
        .mount(&server)
        .await;
    let c = client(&server, 1);
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert_eq!(e.status_code(), Some(500), "{e}");
    assert!(!e.is_decode(), "{e}");
    assert!(e.is_transient(), "{e}");
    assert_eq!(e.couch_error(), None);
    assert_eq!(received(&server).await.len(), 2);
}

#[tokio::test]
async fn a_missing_document_is_none_but_a_missing_database_is_an_error() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/missing"))
        .respond_with(couch_error(404, "not_found", "missing"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/nodb/missing"))
        .respond_with(couch_error(404, "not_found", "Database does not exist."))
        .mount(&server)
        .await;
    let c = client(&server, 3);
    assert_eq!(c.get_opt::<Value>("missing").await.unwrap(), None);
    let e = c.get::<Value>("missing").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    let other = c.with_database("nodb").unwrap();
    let e = other.get_opt::<Value>("missing").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert_eq!(e.reason(), Some("Database does not exist."));
    // 404 is an answer, not a fault: never retried.
    assert_eq!(received(&server).await.len(), 3);
}

#[tokio::test]
async fn a_401_is_unauthorized_and_a_403_is_forbidden_with_its_reason() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/locked"))
        .respond_with(couch_error(
            401,
            "unauthorized",
            "Name or password is incorrect.",
        ))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/db/refused"))
        .respond_with(couch_error(403, "forbidden", "amount must be positive"))
        .mount(&server)
        .await;
    let c = client(&server, 3);
    let e = c.get::<Value>("locked").await.unwrap_err();
    assert!(e.is_unauthorized(), "{e}");
    assert!(!e.is_transient(), "{e}");
    let e = c.put("refused", &json!({"amount": -1})).await.unwrap_err();
    assert!(e.is_forbidden(), "{e}");
    assert_eq!(e.couch_error(), Some("forbidden"));
    assert_eq!(e.reason(), Some("amount must be positive"));
    assert!(e.to_string().contains("amount must be positive"), "{e}");
    assert_eq!(received(&server).await.len(), 2);
}

// ---- timeouts and the network --------------------------------------------------------------

#[tokio::test]
async fn a_slow_reply_times_out_and_a_get_is_retried() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(doc_ok().set_delay(Duration::from_secs(5)))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(201)
                .set_body_json(json!([{"ok": true, "id": "x", "rev": "1-x"}]))
                .set_delay(Duration::from_secs(5)),
        )
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .request_timeout(Duration::from_millis(200))
        .retry(fast(2))
        .build()
        .unwrap();
    // Were the timeout not applied, the delayed 200 would arrive and this would succeed.
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(e.is_transient(), "{e}");
    assert_eq!(e.status_code(), None);
    assert_eq!(
        received(&server).await.len(),
        3,
        "a GET is retried after a timeout"
    );

    // A POST that may have landed is not repeated.
    let e = c.bulk_docs(&[json!({"n": 1})]).await.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert_eq!(received(&server).await.len(), 4);
}

#[tokio::test]
async fn a_refused_connection_is_transient_and_retried() {
    let port = closed_port();
    let c = Client::builder()
        .url(format!("http://127.0.0.1:{port}"))
        .database("db")
        .request_timeout(Duration::from_secs(10))
        .retry(fast(2))
        .build()
        .unwrap();
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(!e.is_timeout(), "{e}");
    assert_eq!(e.status_code(), None);
    assert_eq!(c.requests_sent(), 3, "retried retries_max times");
    let shown = e.to_string();
    assert!(!shown.contains('\n'), "one line: {shown}");
    assert!(shown.contains("could not reach"), "{shown}");
    assert!(shown.contains("db/doc"), "names the request: {shown}");
    assert!(
        std::error::Error::source(&e).is_some(),
        "keeps the cause: {e:?}"
    );
}

#[tokio::test]
async fn a_cookie_login_that_cannot_reach_the_server_is_transient_not_unauthorized() {
    let port = closed_port();
    let c = Client::builder()
        .url(format!("http://127.0.0.1:{port}"))
        .database("db")
        .cookie_auth("admin", "pw")
        .request_timeout(Duration::from_secs(10))
        .retry(fast(2))
        .build()
        .unwrap();
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(!e.is_unauthorized(), "{e}");
    // Each attempt tried to log in first and stopped there: the GET never went out.
    assert_eq!(c.requests_sent(), 3, "one login try per attempt");
}

// ---- what goes on the wire -----------------------------------------------------------------

#[tokio::test]
async fn every_request_sends_json_headers_and_encoded_ids() {
    let server = MockServer::start().await;
    Mock::given(header("content-type", "application/json"))
        .and(header("accept", "application/json"))
        .and(method("GET"))
        .and(path("/db/a%2Fb%3Fc%20d%3Ae"))
        .respond_with(doc_ok())
        .mount(&server)
        .await;
    Mock::given(header("content-type", "application/json"))
        .and(header("accept", "application/json"))
        .and(method("PUT"))
        .and(path("/db/a%2Fb%3Fc%20d%3Ae"))
        .respond_with(
            ResponseTemplate::new(201)
                .set_body_json(json!({"ok": true, "id": "a/b?c d:e", "rev": "1-a"})),
        )
        .mount(&server)
        .await;
    Mock::given(header("content-type", "application/json"))
        .and(header("accept", "application/json"))
        .and(method("POST"))
        .and(path("/db/_bulk_docs"))
        .respond_with(
            ResponseTemplate::new(201)
                .set_body_json(json!([{"ok": true, "id": "x", "rev": "1-x"}])),
        )
        .mount(&server)
        .await;
    // Anything else (a missing header, a decoded path) gets a 400 the test cannot mistake.
    Mock::given(wiremock::matchers::any())
        .respond_with(couch_error(400, "bad_request", "unexpected request"))
        .with_priority(10)
        .mount(&server)
        .await;
    let c = client(&server, 0);
    let doc: Value = c
        .get("a/b?c d:e")
        .await
        .expect("GET with headers, encoded id");
    assert_eq!(doc["n"], 1);
    c.put("a/b?c d:e", &json!({"n": 1}))
        .await
        .expect("PUT with headers, encoded id");
    c.bulk_docs(&[json!({"_id": "x"})])
        .await
        .expect("POST with headers");
    let requests = received(&server).await;
    assert_eq!(requests.len(), 3);
    for r in &requests {
        // What went over the wire, not what a matcher decoded.
        assert!(
            r.url.query().is_none(),
            "the '?' of the id must not start a query: {}",
            r.url
        );
        assert_eq!(r.headers["content-type"], "application/json");
        assert_eq!(r.headers["accept"], "application/json");
    }
    assert_eq!(requests[0].url.path(), "/db/a%2Fb%3Fc%20d%3Ae");
}

#[tokio::test]
async fn basic_auth_is_sent_from_the_builder_and_from_the_url() {
    let server = MockServer::start().await;
    Mock::given(basic_auth("admin", PASSWORD))
        .and(path("/db/doc"))
        .respond_with(doc_ok())
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::any())
        .respond_with(couch_error(
            401,
            "unauthorized",
            "Name or password is incorrect.",
        ))
        .with_priority(10)
        .mount(&server)
        .await;
    let port = server.address().port();
    let from_builder = Client::builder()
        .url(server.uri())
        .database("db")
        .basic_auth("admin", PASSWORD)
        .retry(fast(0))
        .build()
        .unwrap();
    let from_url = Client::builder()
        .url(format!("http://admin:{PASSWORD}@127.0.0.1:{port}"))
        .database("db")
        .retry(fast(0))
        .build()
        .unwrap();
    let anonymous = client(&server, 0);
    for (name, c) in [("builder", &from_builder), ("url", &from_url)] {
        let doc: Value = c.get("doc").await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(doc["n"], 1);
    }
    let e = anonymous.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_unauthorized(), "without credentials: {e}");
    // The URL's credentials went into the header, not into the request line.
    for r in received(&server).await {
        assert!(!r.url.as_str().contains(PASSWORD), "{}", r.url);
    }
}

#[tokio::test]
async fn cookie_auth_logs_in_once_and_sends_the_session_cookie() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/_session"))
        .and(body_partial_json(
            json!({"name": "admin", "password": PASSWORD}),
        ))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("Set-Cookie", "AuthSession=abc; Version=1; Path=/; HttpOnly")
                .set_body_json(json!({"ok": true, "name": "admin", "roles": ["_admin"]})),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .and(header("cookie", "AuthSession=abc"))
        .respond_with(doc_ok())
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::any())
        .respond_with(couch_error(401, "unauthorized", "You are not authorized."))
        .with_priority(10)
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .cookie_auth("admin", PASSWORD)
        .retry(fast(0))
        .build()
        .unwrap();
    for _ in 0..2 {
        let doc: Value = c.get("doc").await.expect("GET with the session cookie");
        assert_eq!(doc["n"], 1);
    }
    let requests = received(&server).await;
    let shape: Vec<(String, String)> = requests
        .iter()
        .map(|r| (r.method.to_string(), r.url.path().to_owned()))
        .collect();
    let expected = [
        ("POST", "/_session"),
        ("GET", "/db/doc"),
        ("GET", "/db/doc"),
    ];
    assert_eq!(
        shape,
        expected.map(|(m, p)| (m.to_owned(), p.to_owned())),
        "one login, then the cookie"
    );
    for r in &requests {
        assert!(
            r.headers.get("authorization").is_none(),
            "no basic auth with cookies"
        );
    }
}

#[tokio::test]
async fn cookie_auth_logs_in_again_after_a_401() {
    let server = MockServer::start().await;
    // The first session is expired by the time it is used; the second one works.
    Mock::given(method("POST"))
        .and(path("/_session"))
        .respond_with(
            ResponseTemplate::new(200).insert_header("Set-Cookie", "AuthSession=abc; Path=/"),
        )
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/_session"))
        .respond_with(
            ResponseTemplate::new(200).insert_header("Set-Cookie", "AuthSession=def; Path=/"),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .and(header("cookie", "AuthSession=abc"))
        .respond_with(couch_error(401, "unauthorized", "Session expired."))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .and(header("cookie", "AuthSession=def"))
        .respond_with(doc_ok())
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .cookie_auth("admin", PASSWORD)
        .retry(fast(0))
        .build()
        .unwrap();
    let doc: Value = c.get("doc").await.expect("one re-login, then success");
    assert_eq!(doc["n"], 1);
    let cookies: Vec<(String, Option<String>)> = received(&server)
        .await
        .iter()
        .map(|r| {
            let cookie = r
                .headers
                .get("cookie")
                .map(|v| v.to_str().unwrap().to_owned());
            (format!("{} {}", r.method, r.url.path()), cookie)
        })
        .collect();
    assert_eq!(
        cookies,
        vec![
            ("POST /_session".to_owned(), None),
            ("GET /db/doc".to_owned(), Some("AuthSession=abc".to_owned())),
            ("POST /_session".to_owned(), None),
            ("GET /db/doc".to_owned(), Some("AuthSession=def".to_owned())),
        ]
    );
}

#[tokio::test]
async fn cookie_auth_relogs_only_once() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/_session"))
        .respond_with(
            ResponseTemplate::new(200).insert_header("Set-Cookie", "AuthSession=abc; Path=/"),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(couch_error(401, "unauthorized", "Session expired."))
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .cookie_auth("admin", PASSWORD)
        .retry(fast(5))
        .build()
        .unwrap();
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_unauthorized(), "{e}");
    // login, GET, login again, GET: then the 401 is the answer.
    assert_eq!(received(&server).await.len(), 4);
}

// ---- secrets ------------------------------------------------------------------------------

/// A mock server that fails in every way a request can fail with an answer.
async fn failing_server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/_session"))
        .respond_with(
            ResponseTemplate::new(200).insert_header("Set-Cookie", "AuthSession=abc; Path=/"),
        )
        .mount(&server)
        .await;
    Mock::given(path("/db/unauthorized"))
        .respond_with(couch_error(
            401,
            "unauthorized",
            "Name or password is incorrect.",
        ))
        .mount(&server)
        .await;
    Mock::given(path("/db/broken"))
        .respond_with(couch_error(500, "internal_server_error", "boom"))
        .mount(&server)
        .await;
    Mock::given(path("/db/garbage"))
        .respond_with(ResponseTemplate::new(200).set_body_string("<html>not json</html>"))
        .mount(&server)
        .await;
    server
}

/// Clients carrying the password every way the builder takes one, against `port`.
fn secret_clients(port: u16) -> Vec<(&'static str, Client)> {
    let url = format!("http://127.0.0.1:{port}");
    let build = |b: couch_ledger::ClientBuilder| {
        b.database("db")
            .request_timeout(Duration::from_secs(10))
            .retry(fast(2))
            .build()
            .unwrap()
    };
    vec![
        (
            "credentials in the URL",
            build(Client::builder().url(format!("http://admin:{PASSWORD}@127.0.0.1:{port}"))),
        ),
        (
            "basic auth",
            build(Client::builder().url(&url).basic_auth("admin", PASSWORD)),
        ),
        (
            "cookie auth",
            build(Client::builder().url(&url).cookie_auth("admin", PASSWORD)),
        ),
    ]
}

/// Runs every failing request on every client, checking each error; returns how many failed.
async fn provoke_errors(server: &MockServer) -> usize {
    let port = server.address().port();
    let closed = closed_port();
    let mut failures = 0;
    let clients = secret_clients(port).into_iter().map(|(n, c)| (n, c, true));
    let unreachable = secret_clients(closed)
        .into_iter()
        .map(|(n, c)| (n, c, false));
    for (name, c, reachable) in clients.chain(unreachable) {
        let debug = format!("{c:?}");
        assert!(
            !debug.contains(PASSWORD),
            "{name}: Debug of the client: {debug}"
        );
        assert!(debug.contains("admin"), "{name}: {debug}");
        let ids: &[&str] = if reachable {
            &["unauthorized", "broken", "garbage"]
        } else {
            &["refused"]
        };
        for id in ids {
            let e = c.get::<Value>(id).await.unwrap_err();
            assert_no_secret(&format!("{name}, GET {id}"), &e);
            match *id {
                "unauthorized" => assert!(e.is_unauthorized(), "{name}: {e}"),
                "broken" => assert_eq!(e.status_code(), Some(500), "{name}: {e}"),
                "garbage" => assert!(e.is_decode(), "{name}: {e}"),
                _ => assert!(e.is_transient() && e.status_code().is_none(), "{name}: {e}"),
            }
            failures += 1;
        }
        let e = c
            .bulk_docs(&[json!({"_id": "a"})])
            .await
            .expect_err("no _bulk_docs mock: 404, or nothing listening");
        assert_no_secret(&format!("{name}, _bulk_docs"), &e);
        failures += 1;
    }
    failures
}

#[tokio::test]
async fn credentials_never_appear_in_errors_or_debug() {
    let server = failing_server().await;
    let failures = provoke_errors(&server).await;
    assert_eq!(failures, 3 * 4 + 3 * 2);
    // The cookie client did log in with the password, so it was there to leak.
    let logins = received(&server)
        .await
        .into_iter()
        .filter(|r| r.url.path() == "/_session")
        .count();
    assert!(logins >= 1);
}

#[test]
fn credentials_never_appear_in_builder_debug_or_configuration_errors() {
    let builders = [
        Client::builder().url(format!("http://admin:{PASSWORD}@127.0.0.1:5984")),
        Client::builder().basic_auth("admin", PASSWORD),
        Client::builder().cookie_auth("admin", PASSWORD),
    ];
    for b in builders {
        let debug = format!("{b:?}");
        assert!(!debug.contains(PASSWORD), "{debug}");
        assert!(debug.contains("admin"), "{debug}");
    }
    // A URL that does not parse still must not be echoed with its password.
    let b = Client::builder().url(format!("http://admin:{PASSWORD}@127.0.0.1:notaport"));
    let debug = format!("{b:?}");
    assert!(!debug.contains(PASSWORD), "{debug}");
    let e = b.build().unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_no_secret("invalid URL", &e);
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

// A current-thread runtime: the subscriber is this thread's default, and every task of the
// test (reqwest's connections included) runs on this thread.
#[tokio::test(flavor = "current_thread")]
async fn credentials_never_appear_in_logs() {
    // tracing caches whether a callsite is wanted, globally. With a single registered
    // dispatcher it asks only the default of the thread that first hits the callsite: a
    // concurrent test on another thread (no subscriber) would get our `debug!`s cached as
    // "never", and this thread's subscriber would miss them. A second registered dispatcher,
    // alive for the whole test, makes tracing ask every live one.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let logs = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(logs.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);

    let server = failing_server().await;
    provoke_errors(&server).await;
    // A refused cookie login is logged too.
    let refusing = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(couch_error(
            401,
            "unauthorized",
            "Name or password is incorrect.",
        ))
        .mount(&refusing)
        .await;
    let c = Client::builder()
        .url(refusing.uri())
        .database("db")
        .cookie_auth("admin", PASSWORD)
        .retry(fast(0))
        .build()
        .unwrap();
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_unauthorized(), "{e}");
    drop(guard);

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("retrying"),
        "the retries were logged:\n{text}"
    );
    assert!(
        text.contains("cookie login refused"),
        "the refused login was logged:\n{text}"
    );
    assert!(
        !text.contains(PASSWORD),
        "the password leaked into the logs:\n{text}"
    );
}

/// CouchDB 3.4's login lockout: a 403 whose reason says the account is locked is its own error
/// (`is_locked`), naming the user and never the password, not retried (waiting minutes inside a
/// call helps nobody), and not confused with a validation refusal.
#[tokio::test]
async fn a_locked_user_is_its_own_error_and_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(403).set_body_json(json!({
            "error": "forbidden",
            "reason": "Account is temporarily locked due to multiple authentication failures"
        })))
        .mount(&server)
        .await;
    for builder in [
        Client::builder().basic_auth("shop", PASSWORD),
        Client::builder().cookie_auth("shop", PASSWORD),
    ] {
        let c = builder
            .url(server.uri())
            .database("db")
            .retry(fast(3))
            .build()
            .unwrap();
        let e = c.get::<Value>("account:A").await.unwrap_err();
        assert!(e.is_locked(), "{e:?}");
        assert!(e.is_forbidden() && !e.is_unauthorized() && !e.is_transient());
        let text = format!("{e} {e:?}");
        assert!(
            e.to_string().starts_with(
                "the server has locked user shop after failed logins; wait or ask an admin"
            ),
            "{e}"
        );
        assert!(!text.contains(PASSWORD), "{text}");
    }
    // One GET each (the cookie client's refused login is a POST): nothing retried.
    let gets = received(&server)
        .await
        .iter()
        .filter(|r| r.method.as_str() == "GET")
        .count();
    assert_eq!(gets, 2);
    // A validation refusal is still a plain 403.
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(403)
                .set_body_json(json!({"error": "forbidden", "reason": "account: field 'x'"})),
        )
        .mount(&server)
        .await;
    let e = client(&server, 0)
        .get::<Value>("account:A")
        .await
        .unwrap_err();
    assert!(e.is_forbidden() && !e.is_locked(), "{e:?}");
}
