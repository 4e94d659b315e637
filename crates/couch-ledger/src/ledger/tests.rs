//! `Ledger`'s own tests: its settings and what `init` sends, against a mocked server.

use super::*;
use serde_json::json;
use wiremock::matchers::{body_string, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A client of database `db` on `server`.
fn client_of(server: &MockServer) -> Client {
    Client::builder()
        .url(server.uri())
        .database("db")
        .build()
        .unwrap()
}

/// A mock server whose database `db` answers `GET _revs_limit` with `get` and `GET /db`
/// with `cluster.n` = `copies` (no `cluster` when `None`), and a `PUT _revs_limit` of `to`
/// with `put`, expected exactly `puts` times.
async fn server(
    get: ResponseTemplate,
    copies: Option<u32>,
    to: u32,
    put: ResponseTemplate,
    puts: u64,
) -> (MockServer, Client) {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/db/_revs_limit"))
        .respond_with(get)
        .mount(&server)
        .await;
    let mut info = json!({"db_name": "db", "doc_count": 0});
    if let Some(n) = copies {
        info["cluster"] = json!({"q": 2, "n": n, "w": 1, "r": 1});
    }
    Mock::given(method("GET"))
        .and(path("/db"))
        .respond_with(ResponseTemplate::new(200).set_body_json(info))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/db/_revs_limit"))
        .and(body_string(to.to_string()))
        .respond_with(put)
        .expect(puts)
        .mount(&server)
        .await;
    let client = client_of(&server);
    (server, client)
}

/// A client of database `db` on a server never asked (building a ledger sends nothing).
fn offline_client() -> Client {
    Client::builder()
        .url("http://127.0.0.1:9")
        .database("db")
        .build()
        .unwrap()
}

#[test]
fn a_builder_reports_its_first_refused_setting() {
    let field = |b: LedgerBuilder| b.build().unwrap_err().field().map(str::to_owned);
    let c = offline_client();
    let b = || Ledger::builder(c.clone());
    assert_eq!(field(b().lease(Duration::ZERO)), Some("lease".into()));
    assert_eq!(
        field(b().lease(Duration::from_millis(LEASE_MS + 1))),
        Some("lease".into())
    );
    assert_eq!(field(b().hot_database("db")), Some("hot_db".into()));
    assert!(b()
        .hot_database("Bad Name")
        .build()
        .unwrap_err()
        .is_invalid_input());
    assert_eq!(
        field(b().lease(Duration::ZERO).hot_database("db")),
        Some("lease".into())
    );
    assert_eq!(
        field(b().hot_database("db").lease(Duration::ZERO)),
        Some("hot_db".into())
    );
    // A refused setting is not forgotten by a valid one after it.
    assert_eq!(
        field(b().lease(Duration::ZERO).lease(Duration::from_secs(1))),
        Some("lease".into())
    );
    assert!(b().lease(Duration::from_millis(LEASE_MS)).build().is_ok());
}

#[test]
fn a_ledger_is_built_with_its_settings_and_to_builder_makes_another_worker() {
    let l = Ledger::builder(offline_client())
        .hot_database("db_hot")
        .lease(Duration::from_secs(10))
        .background_finish(true)
        .build()
        .unwrap();
    let check = |other: &Ledger| {
        assert_eq!(other.lease(), Duration::from_secs(10));
        assert_eq!(other.hot_database(), Some("db_hot"));
        assert!(other.finishes_in_background());
    };
    check(&l);
    assert_eq!(l.clone().worker_id(), l.worker_id());
    let other = l.to_builder().build().unwrap();
    check(&other);
    assert_ne!(other.worker_id(), l.worker_id());
    let another = l.another_worker();
    check(&another);
    assert_ne!(another.worker_id(), l.worker_id());
    let plain = l.to_builder().background_finish(false).build().unwrap();
    assert!(!plain.finishes_in_background());
    assert_eq!(plain.hot_database(), Some("db_hot"));
    let default = Ledger::new(offline_client());
    assert_eq!(default.lease(), Duration::from_millis(LEASE_MS));
    assert_eq!(default.hot_database(), None);
    assert!(!default.finishes_in_background());
}

/// The deprecated `with_*` methods still configure the same worker, and refuse what the
/// builder refuses.
#[test]
#[allow(deprecated)]
fn the_deprecated_with_methods_configure_the_same_worker() {
    let l = Ledger::new(offline_client());
    let id = l.worker_id().to_owned();
    let l = l
        .with_lease(Duration::from_secs(10))
        .unwrap()
        .with_hot_database("db_hot")
        .unwrap()
        .with_background_finish()
        .with_stepwise_transfers()
        .with_lookup_first()
        .with_write_quorum(WriteQuorum::ServerDefault);
    assert_eq!(l.worker_id(), id);
    assert_eq!(l.lease(), Duration::from_secs(10));
    assert_eq!(l.hot_database(), Some("db_hot"));
    assert!(l.finishes_in_background());
    assert!(l.inner.stepwise && l.inner.lookup_first);
    assert_eq!(l.inner.write_quorum, WriteQuorum::ServerDefault);
    let l = l.with_progress(ProgressHook(Arc::new(|_| {})));
    assert!(l.inner.progress.is_some());
    assert_eq!(l.worker_id(), id);
    let e = l.clone().with_lease(Duration::ZERO).unwrap_err();
    assert_eq!(e.field(), Some("lease"));
    let e = l.with_hot_database("db").unwrap_err();
    assert_eq!(e.field(), Some("hot_db"));
}

fn limit(n: u32) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_string(n.to_string())
}

fn ok() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"ok": true}))
}

#[tokio::test]
async fn init_lowers_couchdbs_default_revs_limit_by_the_copies_kept() {
    for (copies, to) in [
        (Some(1), REVS_LIMIT_ONE_COPY),
        (Some(3), REVS_LIMIT),
        (None, REVS_LIMIT),
    ] {
        let (server, client) = server(limit(1000), copies, to, ok(), 1).await;
        assert_eq!(
            tune_revs_limit(&client).await.unwrap(),
            Some(to),
            "{copies:?}"
        );
        server.verify().await;
    }
}

#[tokio::test]
async fn init_leaves_a_lower_revs_limit_alone() {
    for (copies, lower) in [
        (Some(3), REVS_LIMIT - 1),
        (Some(1), REVS_LIMIT_ONE_COPY),
        (Some(1), 1),
        (Some(3), 1),
    ] {
        let (server, client) = server(limit(lower), copies, 0, ok(), 0).await;
        assert_eq!(
            tune_revs_limit(&client).await.unwrap(),
            Some(lower),
            "{copies:?}"
        );
        server.verify().await;
    }
}

/// Right after `init` installed the design documents, a balancer can pass the view query to
/// a node that has not received them: `init` asks again until the view answers.
#[tokio::test]
async fn init_waits_for_the_installed_views_to_answer() {
    let server = MockServer::start().await;
    let view = "/db/_design/transactions/_view/account_balances";
    Mock::given(method("GET"))
        .and(path(view))
        .respond_with(
            ResponseTemplate::new(404)
                .set_body_json(json!({"error": "not_found", "reason": "missing"})),
        )
        .up_to_n_times(2)
        .expect(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(view))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"total_rows": 0, "offset": 0, "rows": []})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let ledger = Ledger::new(client_of(&server));
    assert_eq!(ledger.opening_records_once_views_answer().await.unwrap(), 0);
    server.verify().await;
}

#[tokio::test]
async fn init_raises_the_one_copy_limit_where_copies_were_added() {
    for copies in [Some(3), None] {
        let (server, client) =
            server(limit(REVS_LIMIT_ONE_COPY), copies, REVS_LIMIT, ok(), 1).await;
        assert_eq!(
            tune_revs_limit(&client).await.unwrap(),
            Some(REVS_LIMIT),
            "{copies:?}"
        );
        server.verify().await;
    }
}

#[tokio::test]
async fn a_server_without_revs_limit_is_left_alone() {
    // pouchdb-server takes the path for a document id: 400; or a 404.
    let answers = [
        ResponseTemplate::new(400).set_body_json(json!({
            "error": "bad_request",
            "reason": "Only reserved document ids may start with underscore."
        })),
        ResponseTemplate::new(404)
            .set_body_json(json!({"error": "not_found", "reason": "missing"})),
    ];
    for answer in answers {
        let (server, client) = server(answer, Some(1), 0, ok(), 0).await;
        assert_eq!(tune_revs_limit(&client).await.unwrap(), None);
        server.verify().await;
    }
}

#[tokio::test]
async fn a_refused_revs_limit_fails_init() {
    let refused = ResponseTemplate::new(403).set_body_json(
        json!({"error": "forbidden", "reason": "You are not a db or server admin."}),
    );
    let (_server, client) = server(limit(1000), Some(1), REVS_LIMIT_ONE_COPY, refused, 1).await;
    let error = tune_revs_limit(&client).await.unwrap_err();
    assert!(error.is_forbidden(), "{error}");
}
