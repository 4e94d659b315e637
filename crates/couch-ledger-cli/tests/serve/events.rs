//! `GET /v1/events`: a JSON page, and a Server-Sent Events stream that a consumer leaves and
//! resumes with `Last-Event-ID` (the scenario of tests/events.rs).

use std::collections::HashSet;

use super::*;
use crate::events::{assert_scenario, scenario};

/// One SSE event as a consumer reads it.
#[derive(Debug, Clone)]
struct Sse {
    id: String,
    event: String,
    data: Value,
}

/// Reads a stream until `enough` holds for the events so far (or fails after `within`), then
/// drops the connection: the consumer leaves.
async fn consume(
    http: &reqwest::Client,
    base: &str,
    last_event_id: Option<&str>,
    within: Duration,
    enough: impl Fn(&[Sse]) -> bool,
) -> Vec<Sse> {
    let mut request = http
        .get(format!("{base}/v1/events"))
        .header("accept", "text/event-stream")
        .timeout(within + Duration::from_secs(5));
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let mut response = request.send().await.expect("the service answers");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let mut buffer = String::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while !enough(&events) {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{within:?} passed with {} events: {events:#?}",
                    events.len()
                )
            })
            .expect("the stream reads")
            .expect("the stream stays open");
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}:")))
                    .map(|v| v.trim_start().to_owned())
            };
            // A comment (`:`), the keep-alive, has no event.
            if let Some(event) = field("event") {
                events.push(Sse {
                    id: field("id").unwrap_or_default(),
                    event,
                    data: serde_json::from_str(&field("data").unwrap()).unwrap(),
                });
            }
        }
    }
    events
}

#[tokio::test]
async fn an_sse_consumer_that_leaves_and_resumes_misses_and_repeats_nothing() {
    let (l, db) = ledger("serve_events").await;
    let svc = Service::start(&db, &["--no-sweep"]).await;
    let s = scenario(&l, "v").await;
    // The JSON page: the same events.
    let page = svc.get("/v1/events?limit=1000").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let paged: Vec<String> = page.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_scenario(&paged, &s);
    let total = paged.len();

    // Five events, leave, resume with the last id; then the rest.
    let first = consume(&svc.http, &svc.base, None, Duration::from_secs(30), |e| {
        e.len() >= 5
    })
    .await;
    let first = &first[..5];
    let id_of = |e: &Sse| e.data["id"].as_str().unwrap().to_owned();
    let resumed = consume(
        &svc.http,
        &svc.base,
        Some(&first[4].id),
        Duration::from_secs(30),
        // The fifth again when its change made one more event after it (the same id).
        |e| e.iter().filter(|e| id_of(e) != id_of(&first[4])).count() >= total - 5,
    )
    .await;
    let mut seen: Vec<String> = first.iter().map(id_of).collect();
    let again: Vec<String> = resumed.iter().map(id_of).collect();
    assert!(
        !again[1..].contains(&seen[4]) && !seen[..4].iter().any(|i| again.contains(i)),
        "nothing before the cursor again: {again:?}"
    );
    let fifth = seen[4].clone();
    seen.extend(again.into_iter().filter(|i| *i != fifth));
    assert_scenario(&seen, &s);
    let fact = |i: &&String| !i.starts_with("order.");
    let (seen_set, paged_set): (HashSet<&String>, HashSet<&String>) = (
        seen.iter().filter(fact).collect(),
        paged.iter().filter(fact).collect(),
    );
    assert_eq!(
        seen_set, paged_set,
        "the stream and the page give the same events"
    );
    for e in first.iter().chain(&resumed) {
        assert_eq!(e.event, e.data["type"], "{e:?}");
        assert_eq!(e.id, e.data["cursor"], "the SSE id is the cursor: {e:?}");
    }
    let t1 = first
        .iter()
        .chain(&resumed)
        .find(|e| e.data["id"] == "transfer.done:t1-v")
        .unwrap();
    let shown = svc.get("/v1/transfers/t1-v").await;
    for field in [
        "id",
        "source",
        "destination",
        "amount",
        "currency",
        "state",
        "created_at",
    ] {
        assert_eq!(t1.data["data"][field], shown.body[field], "{field}");
    }

    // A stream held open gets a transfer made while it waits, and nothing before its cursor.
    let last = resumed.last().unwrap().id.clone();
    let watcher = {
        let (http, base, last) = (svc.http.clone(), svc.base.clone(), last.clone());
        tokio::spawn(async move {
            consume(&http, &base, Some(&last), Duration::from_secs(60), |e| {
                !e.is_empty()
            })
            .await
        })
    };
    let done = l
        .submit(support::eur_transfer("t9-v", "ea-v", "eb-v", 10), true)
        .await;
    assert_eq!(done.unwrap().state, TransferState::Done);
    let next = watcher.await.unwrap();
    assert_eq!(next[0].data["id"], "transfer.done:t9-v", "{next:?}");

    // Bad input is a 400 naming the parameter, before any stream starts.
    for (path, field) in [
        ("/v1/events?after=not%20a%20cursor", "after"),
        ("/v1/events?types=transfer.pending", "types"),
        ("/v1/events?limit=0", "limit"),
        ("/v1/events?limit=1001", "limit"),
    ] {
        let r = svc.get(path).await;
        r.assert_error(400, "invalid_input");
        assert_eq!(r.body["field"], field, "{path}: {}", r.body);
    }
}

/// `t=…,v1=…` checked against the body with the secret, as a receiver does.
fn assert_signed(secret: &str, signature: &str, body: &str) {
    use hmac::{Hmac, Mac};
    let (t, v1) = signature
        .split_once(',')
        .and_then(|(t, v)| Some((t.strip_prefix("t=")?, v.strip_prefix("v1=")?)))
        .unwrap_or_else(|| panic!("signature {signature:?}"));
    let seconds: u64 = t.parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        now.abs_diff(seconds) < 600,
        "signed at {seconds}, now {now}"
    );
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.{body}").as_bytes());
    let want: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(v1, want, "the signature of {body}");
}

/// Event ids of the requests a receiver got, in the order it got them, each checked signed.
fn delivered(requests: &[wiremock::Request], secret: &str) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            let body = std::str::from_utf8(&r.body).unwrap();
            let signature = r.headers["couch-ledger-signature"].to_str().unwrap();
            assert_signed(secret, signature, body);
            let event: Value = serde_json::from_str(body).unwrap();
            assert_eq!(
                r.headers["couch-ledger-event-id"],
                event["id"].as_str().unwrap()
            );
            event["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test]
async fn a_webhook_receiver_that_was_down_gets_every_event_signed_in_order() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let (l, db) = ledger("serve_webhook").await;
    // A free port where nothing listens yet: the receiver is down.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = support::TempDir::new("couch-ledger-webhook");
    let secret = "whsec-0123456789abcdef0123456789";
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let url = format!("http://127.0.0.1:{port}/hook");
    let args = [
        "--no-sweep",
        "--webhook-url",
        &url,
        "--webhook-secret-file",
        secret_file.to_str().unwrap(),
        "--webhook-retry-max",
        "500ms",
    ];
    let mut svc = Service::start(&db, &args).await;
    let s = scenario(&l, "w").await;
    support::wait_for("a failed delivery", Duration::from_secs(60), || async {
        let log = svc.log();
        (log.matches("webhook: delivery").count() >= 3).then_some(())
    })
    .await;

    let receiver = MockServer::builder()
        .listener(std::net::TcpListener::bind(("127.0.0.1", port)).unwrap())
        .start()
        .await;
    Mock::given(method("POST"))
        .and(path("/hook"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&receiver)
        .await;
    // Every fact delivered, each signed; an order's transitions as the service's reader met
    // the entries (on a database of several shards another read may place them elsewhere).
    let is_fact = |i: &String| !i.starts_with("order.");
    let requests = support::wait_for("every event delivered", Duration::from_secs(60), || async {
        let got = receiver.received_requests().await.unwrap();
        let facts: HashSet<String> = delivered(&got, secret)
            .into_iter()
            .filter(is_fact)
            .collect();
        facts.is_superset(&s.ids).then_some(got)
    })
    .await;
    let ids = delivered(&requests, secret);
    let facts: Vec<String> = ids.iter().filter(|i| is_fact(i)).cloned().collect();
    let unique: HashSet<&String> = facts.iter().collect();
    assert_eq!(unique.len(), facts.len(), "delivered twice: {ids:?}");
    let total = requests.len();

    // A restart goes on from the cursor kept in the database: what was not delivered yet and
    // the next event; of what was, at most the event in flight at the stop again.
    sigterm(svc.pid());
    svc.exited_cleanly().await;
    let svc = Service::start(&db, &args).await;
    let done = l
        .submit(support::eur_transfer("t9-w", "ea-w", "eb-w", 10), true)
        .await;
    assert_eq!(done.unwrap().state, TransferState::Done);
    let requests = support::wait_for(
        "the new event delivered",
        Duration::from_secs(60),
        || async {
            // The events left at the stop come first (the one in flight may come again).
            let got = receiver.received_requests().await.unwrap();
            let new = delivered(&got[total.min(got.len())..], secret);
            new.contains(&"transfer.done:t9-w".to_owned())
                .then_some(got)
        },
    )
    .await;
    let after = delivered(&requests[total..], secret);
    assert!(
        after.contains(&"transfer.done:t9-w".to_owned()),
        "{after:?}"
    );
    // At most the events of the write in flight at the stop come again (one write makes at
    // most two); nothing older.
    let again: Vec<&String> = after.iter().filter(|i| ids.contains(i)).collect();
    assert!(
        again.len() <= 2,
        "delivered again after the restart: {again:?}"
    );
    drop(svc);
}

#[tokio::test]
async fn webhook_flags_are_checked_before_the_service_starts() {
    let dir = support::TempDir::new("couch-ledger-webhook-flags");
    let short = dir.path().join("short");
    std::fs::write(&short, "tiny\n").unwrap();
    let short = short.to_str().unwrap();
    for (args, says) in [
        (
            vec!["--webhook-url", "http://127.0.0.1:9/h"],
            "--webhook-secret-file",
        ),
        (
            vec!["--webhook-url", "not a url", "--webhook-secret-file", short],
            "--webhook-url",
        ),
        (
            vec![
                "--webhook-url",
                "http://127.0.0.1:9/h",
                "--webhook-secret-file",
                short,
            ],
            "16 bytes",
        ),
        (vec!["--webhook-secret-file", short], "--webhook-url"),
    ] {
        let mut all = vec![
            "--url",
            "http://127.0.0.1:9",
            "serve",
            "--listen",
            "127.0.0.1:0",
        ];
        all.extend(args.iter().copied());
        let out = tokio::process::Command::new(BIN)
            .args(&all)
            .env_remove("COUCH_LEDGER_WEBHOOK_URL")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
