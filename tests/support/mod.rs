//! Test support: one real CouchDB-protocol server per test binary, one fresh database per test.
//!
//! Without `COUCHDB_URL` the first test to ask starts pouchdb-server on a free loopback port
//! (installing it with `npm ci` if needed); it exits with the test binary. With `COUCHDB_URL`
//! (+ `COUCHDB_USER` / `COUCHDB_PASSWORD`) the same tests run against that server, e.g. Apache
//! CouchDB from `docker compose up`.
#![allow(dead_code)]

pub mod proxy;

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use couch_ledger::devserver::DevServer;
use couch_ledger::{Client, Ledger};

/// Where the tests' server is.
pub struct TestServer {
    pub url: String,
    pub user: Option<String>,
    pub password: Option<String>,
    /// The harness's own server; `None` with `COUCHDB_URL`. Behind a lock so a crash test can
    /// kill and restart it.
    pub dev: Option<Mutex<DevServer>>,
}

static SERVER: OnceLock<TestServer> = OnceLock::new();

/// The server of this test binary, started on first use.
pub fn server() -> &'static TestServer {
    SERVER.get_or_init(|| match std::env::var("COUCHDB_URL") {
        Ok(url) if !url.is_empty() => TestServer {
            url,
            user: std::env::var("COUCHDB_USER").ok().filter(|s| !s.is_empty()),
            password: std::env::var("COUCHDB_PASSWORD").ok(),
            dev: None,
        },
        _ => {
            let dev = DevServer::start().expect("start the test server (pouchdb-server)");
            TestServer {
                url: dev.url(),
                user: None,
                password: None,
                dev: Some(Mutex::new(dev)),
            }
        }
    })
}

/// A unique database name for a test: `t_<name>_<random>`.
pub fn db_name(test: &str) -> String {
    let clean: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    format!("t_{clean}_{:08x}", fastrand::u32(..))
}

/// A client builder on the test server with a fresh database name (not created yet).
pub fn builder(test: &str) -> couch_ledger::ClientBuilder {
    let s = server();
    let mut b = Client::builder()
        .url(&s.url)
        .database(db_name(test))
        .request_timeout(Duration::from_secs(60));
    if let Some(user) = &s.user {
        b = b.basic_auth(user, s.password.clone().unwrap_or_default());
    }
    b
}

/// A client on a fresh, created database.
pub async fn client(test: &str) -> Client {
    let c = builder(test).build().expect("client");
    assert!(c.ensure_database().await.expect("create test database"));
    c
}

/// A ledger on a fresh database with the design documents installed.
pub async fn ledger(test: &str) -> Ledger {
    let l = Ledger::new(builder(test).build().expect("client"));
    let report = l.init().await.expect("init");
    assert!(report.created);
    l
}

/// Raw HTTP on the test server, bypassing the library (for writes "not through the library").
pub fn raw() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// `url` joined with a path, credentials applied to the request by the caller via `auth`.
pub fn raw_url(path: &str) -> String {
    format!("{}/{}", server().url.trim_end_matches('/'), path)
}

/// Adds the test server's credentials to a raw request.
pub fn auth(r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let s = server();
    match &s.user {
        Some(u) => r.basic_auth(u, s.password.clone()),
        None => r,
    }
}

/// Waits until `check` returns `Some`, polling, or panics after `deadline`. For conditions that
/// become true eventually (a view catching up, a process finishing): never a bare sleep.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
