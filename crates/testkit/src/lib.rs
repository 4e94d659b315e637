//! Test support: one real CouchDB-protocol server per test binary, one fresh database per test.
//!
//! Without `COUCHDB_URL` the first test to ask starts pouchdb-server on a free loopback port
//! (installing it with `npm ci` if needed); it exits with the test binary. With `COUCHDB_URL`
//! (+ `COUCHDB_USER` / `COUCHDB_PASSWORD`) the same tests run against that server, e.g. Apache
//! CouchDB from `docker compose up`.

// The local server (not part of the library).
pub use couch_ledger_devserver as devserver;
pub mod proxy;
pub mod tools;
pub mod trio;

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use couch_ledger::{
    AccountSpec, Amount, Client, Currency, Ledger, LedgerBuilder, RecordStatus, TransferRequest,
};
use devserver::DevServer;

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

/// A fresh directory under the system's temporary directory, removed (with what is in it)
/// when dropped, so a test leaves nothing behind, failed or not.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// `<temp>/<name>-<random>`, created.
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{name}-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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

/// A ledger on a fresh database with the design documents installed, configured by
/// `configure`: built from [`ledger`]'s settings once that one initialised the database.
pub async fn ledger_with(
    test: &str,
    configure: impl FnOnce(LedgerBuilder) -> LedgerBuilder,
) -> Ledger {
    let l = ledger(test).await;
    configure(l.to_builder()).build().expect("ledger settings")
}

/// A split ledger (accounts and transfers in a database of their own, `<db>_hot`) on fresh
/// databases, initialised.
pub async fn split_ledger(test: &str) -> Ledger {
    let client = builder(test).build().expect("client");
    let hot = format!("{}_hot", client.database());
    let l = Ledger::builder(client)
        .hot_database(&hot)
        .build()
        .expect("hot database");
    let report = l.init().await.expect("init");
    assert!(report.created);
    assert!(report.hot.expect("a hot report").created);
    l
}

/// The harness's server as a loopback socket address, for a fault proxy in front of it; `None`
/// when it is elsewhere (`COUCHDB_URL` on another host).
pub fn loopback_server_addr() -> Option<std::net::SocketAddr> {
    let u = url::Url::parse(&server().url).ok()?;
    let (host, port) = (u.host_str()?.to_owned(), u.port_or_known_default()?);
    std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
        .ok()?
        .find(|a| a.ip().is_loopback())
}

/// A server on 127.0.0.1 that accepts every connection and never writes a byte back; its URL.
/// (Its thread lives as long as the test binary: connections are held, nothing else is done.)
pub fn silent_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            match conn {
                Ok(c) => held.push(c),
                Err(_) => break,
            }
        }
    });
    url
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

/// What a database holds, to tell whether anything was written: its document counts and every
/// live document's revision. Sequence strings are opaque on CouchDB (a cluster's nodes give
/// different strings for one state, SERVERS.md), so "nothing was written" is never a comparison
/// of `update_seq`: a new document changes `doc_count` and the revisions, an update changes a
/// revision, a deletion changes `doc_count` and `doc_del_count`.
#[derive(Debug, Clone)]
pub struct DbSnapshot {
    pub doc_count: u64,
    /// CouchDB's count of deleted documents (pouchdb-server does not report it; a deletion
    /// shows there in `doc_count` and `revs`).
    pub doc_del_count: Option<u64>,
    /// `(id, rev)` of every live document, design documents included, in id order.
    pub revs: Vec<(String, String)>,
    /// On several copies, each transfer document's body (without `_rev`), when it holds no
    /// conflict: a transfer's decision told to a later caller is sealed there by a child of
    /// the same body (docs/CLUSTER.md, "Telling a decision on a cluster"), which is no change.
    pub txn_bodies: std::collections::BTreeMap<String, String>,
}

impl PartialEq for DbSnapshot {
    fn eq(&self, other: &DbSnapshot) -> bool {
        let same_body = |id: &str| {
            id.starts_with("txn:")
                && self.txn_bodies.contains_key(id)
                && self.txn_bodies.get(id) == other.txn_bodies.get(id)
        };
        self.doc_count == other.doc_count
            && self.doc_del_count == other.doc_del_count
            && self.revs.len() == other.revs.len()
            && self
                .revs
                .iter()
                .zip(&other.revs)
                .all(|((a, ra), (b, rb))| a == b && (ra == rb || same_body(a)))
    }
}

impl Eq for DbSnapshot {}

/// The [`DbSnapshot`] of the test server's database `db`, read with raw HTTP.
pub async fn db_snapshot(db: &str) -> DbSnapshot {
    let get = |path: String| async move {
        let reply = auth(raw().get(raw_url(&path))).send().await.unwrap();
        assert!(
            reply.status().is_success(),
            "GET {path}: {}",
            reply.status()
        );
        reply.json::<serde_json::Value>().await.unwrap()
    };
    let info = get(db.to_owned()).await;
    let all = get(format!("{db}/_all_docs")).await;
    let revs: Vec<(String, String)> = all["rows"]
        .as_array()
        .expect("_all_docs rows")
        .iter()
        .map(|row| {
            (
                row["id"].as_str().expect("row id").to_owned(),
                row["value"]["rev"].as_str().expect("row rev").to_owned(),
            )
        })
        .collect();
    let n = copies(db).await;
    if n > 1 {
        // `_all_docs` lists what the copy it read of each shard range holds: the ids of a few
        // reads (each may read other copies) until two in a row add none.
        let mut ids: std::collections::BTreeSet<String> =
            revs.into_iter().map(|(id, _)| id).collect();
        let mut quiet = 0;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let again = get(format!("{db}/_all_docs")).await;
            let before = ids.len();
            ids.extend(
                again["rows"]
                    .as_array()
                    .expect("_all_docs rows")
                    .iter()
                    .filter_map(|row| row["id"].as_str().map(str::to_owned)),
            );
            quiet = if ids.len() == before { quiet + 1 } else { 0 };
            if quiet == 2 {
                break;
            }
        }
        return snapshot_of_every_copy(db, n, ids).await;
    }
    DbSnapshot {
        doc_count: info["doc_count"].as_u64().expect("doc_count"),
        doc_del_count: info["doc_del_count"].as_u64(),
        revs,
        txn_bodies: std::collections::BTreeMap::new(),
    }
}

/// On several copies: `_all_docs` and `GET /db` are answered by one copy of each shard range,
/// which may not hold a write another copy answered yet (an account written at 202 under load
/// read back at its revision 1; a new account not listed). Each listed document's revision is
/// read instead from every
/// copy that answers (`open_revs=all` with `r` = n, which merges the copies' trees: the
/// winning live leaf's); `doc_count` counts the live ones, and `doc_del_count` is left out.
async fn snapshot_of_every_copy(
    db: &str,
    n: u64,
    listed: std::collections::BTreeSet<String>,
) -> DbSnapshot {
    let mut revs = Vec::with_capacity(listed.len());
    let mut txn_bodies = std::collections::BTreeMap::new();
    for id in listed {
        let leaves = leaves_read(db, &id, Some(n)).await;
        let winner = leaves.iter().max_by_key(|d| {
            let rev = d["_rev"].as_str().unwrap_or("0-");
            let (pos, hash) = rev.split_once('-').unwrap_or(("0", rev));
            (pos.parse::<u64>().unwrap_or(0), hash.to_owned())
        });
        let Some(winner) = winner else { continue };
        if id.starts_with("txn:") && leaves.len() == 1 {
            let mut body = winner.clone();
            if let Some(o) = body.as_object_mut() {
                o.remove("_rev");
            }
            txn_bodies.insert(id.clone(), body.to_string());
        }
        if let Some(rev) = winner["_rev"].as_str() {
            revs.push((id, rev.to_owned()));
        }
    }
    DbSnapshot {
        doc_count: revs.len() as u64,
        doc_del_count: None,
        revs,
        txn_bodies,
    }
}

/// A user of its own for a test that sends wrong passwords: created in the server's `_users`
/// with a random password that occurs nowhere else. CouchDB 3.4 locks a user out after a few
/// failed logins (SERVERS.md), so a wrong password is never tried as the user the suite runs
/// as, which every other test needs. Returns `(name, password)`.
pub async fn make_user(
    server_url: &str,
    admin: Option<(&str, &str)>,
    test: &str,
) -> (String, String) {
    let name = format!(
        "u_{}_{:016x}",
        db_name(test).trim_start_matches("t_"),
        fastrand::u64(..)
    );
    let password = format!("pw{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let base = server_url.trim_end_matches('/');
    let put = |path: String, body: serde_json::Value| {
        let mut r = raw()
            .put(format!("{base}/{path}"))
            .header("Content-Type", "application/json")
            .body(body.to_string());
        if let Some((user, pass)) = admin {
            r = r.basic_auth(user, Some(pass));
        }
        r.send()
    };
    ensure_users_db(base, admin).await;
    let reply = put(
        format!("_users/org.couchdb.user:{name}"),
        serde_json::json!({"name": name, "password": password, "roles": [], "type": "user"}),
    )
    .await
    .unwrap();
    assert!(
        reply.status().is_success(),
        "create user {name}: {}",
        reply.status()
    );
    (name, password)
}

/// Makes sure the server has a `_users` database: a CouchDB 3 node set up by hand may have none
/// until someone creates it (412 = it exists).
pub async fn ensure_users_db(base: &str, admin: Option<(&str, &str)>) {
    let with_admin = |r: reqwest::RequestBuilder| match admin {
        Some((user, pass)) => r.basic_auth(user, Some(pass)),
        None => r,
    };
    let base = base.trim_end_matches('/');
    let probe = with_admin(raw().get(format!("{base}/_users")))
        .send()
        .await
        .unwrap();
    if probe.status().as_u16() == 404 {
        let status = with_admin(raw().put(format!("{base}/_users")))
            .send()
            .await
            .unwrap()
            .status();
        assert!(
            status.is_success() || status.as_u16() == 412,
            "PUT /_users: {status}"
        );
    }
}

/// [`make_user`] on the test server, as the suite's user.
pub async fn test_user(test: &str) -> (String, String) {
    let s = server();
    let admin = s
        .user
        .as_deref()
        .map(|u| (u, s.password.as_deref().unwrap_or("")));
    make_user(&s.url, admin, test).await
}

/// An account document's settled entries as `(transfer, undone)`, in either stored form
/// (docs/DOCUMENTS.md): groups `{at, txns, undone: [..]}`, or one object per entry
/// `{txn, at, undone: bool}` as earlier versions wrote them.
pub fn settled_entries(doc: &serde_json::Value) -> Vec<(String, bool)> {
    let ids = |list: &serde_json::Value| -> Vec<String> {
        list.as_array()
            .into_iter()
            .flatten()
            .map(|t| t.as_str().expect("a transfer id").to_owned())
            .collect()
    };
    let mut entries = Vec::new();
    for e in doc["settled"].as_array().expect("settled is a list") {
        if let Some(txn) = e["txn"].as_str() {
            entries.push((txn.to_owned(), e["undone"] == true));
        } else {
            entries.extend(ids(&e["txns"]).into_iter().map(|t| (t, false)));
            entries.extend(ids(&e["undone"]).into_iter().map(|t| (t, true)));
        }
    }
    entries
}

/// Drops from an account document's `settled` every entry of a transfer `keep` refuses, in
/// either stored form (a group left empty is dropped).
pub fn retain_settled(doc: &mut serde_json::Value, keep: impl Fn(&str) -> bool) {
    let list = doc["settled"].as_array_mut().expect("settled is a list");
    for e in list.iter_mut() {
        for field in ["txns", "undone"] {
            if let Some(ids) = e.get_mut(field).and_then(|v| v.as_array_mut()) {
                ids.retain(|t| keep(t.as_str().expect("a transfer id")));
            }
        }
    }
    list.retain(|e| match e["txn"].as_str() {
        Some(txn) => keep(txn),
        None => ["txns", "undone"]
            .iter()
            .any(|f| e[*f].as_array().is_some_and(|ids| !ids.is_empty())),
    });
}

/// The live (not deleted) leaves of document `id` in database `db` (`?open_revs=all`), bodies
/// included, in the server's order.
pub async fn live_leaves(db: &str, id: &str) -> Vec<serde_json::Value> {
    leaves_read(db, id, None).await
}

/// The live leaves of `id` (`open_revs=all`), from `r` copies when given.
async fn leaves_read(db: &str, id: &str, r: Option<u64>) -> Vec<serde_json::Value> {
    let path = if id.starts_with("_design/") {
        id.to_owned()
    } else {
        id.replace(':', "%3A")
    };
    let r = r.map(|n| format!("&r={n}")).unwrap_or_default();
    let url = raw_url(&format!("{db}/{path}?open_revs=all{r}"));
    let reply = auth(raw().get(url))
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap();
    assert!(
        reply.status().is_success(),
        "open_revs {id}: {}",
        reply.status()
    );
    let leaves: serde_json::Value = reply.json().await.unwrap();
    leaves
        .as_array()
        .expect("open_revs answers an array")
        .iter()
        .filter_map(|l| l.get("ok"))
        .filter(|d| d["_deleted"] != true)
        .cloned()
        .collect()
}

/// Writes `doc` as `id` through `client` so that every copy the database keeps holds it when
/// this returns (`w` = `cluster.n`, and a 201, not a 202): a test that plants a document and
/// then reads a view sees the plant whichever copy answers the view (on a cluster a view is
/// answered by one copy of each shard range). On one copy this is a plain write.
pub async fn put_on_every_copy(client: &Client, id: &str, doc: &serde_json::Value) {
    let written = client
        .put_with(id, doc, &every_copy(client).await)
        .await
        .expect("the plant");
    if !written.accepted {
        return;
    }
    // A loaded cluster answers 202 when a copy is late: the plant stands once every copy holds
    // it as the one leaf (30 s at most).
    let db = client.database().to_owned();
    let n = copies(&db).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leaves = leaves_read(&db, id, Some(n)).await;
        let revs: Vec<&str> = leaves.iter().filter_map(|l| l["_rev"].as_str()).collect();
        if revs == [written.rev.as_str()] {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id}: the write reached fewer copies than the database keeps (202), and every copy \
             did not hold it alone within 30 s: {revs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `attempt` run again, every 500 ms for up to 15 s, until `done` holds of its answer, where
/// database `db` keeps several copies: views and `_changes` answer from one copy of each shard
/// range, which may not hold a write just made. Once elsewhere. The last answer.
pub async fn again_on_several_copies<T, F, Fut>(
    db: &str,
    mut attempt: F,
    done: impl Fn(&T) -> bool,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let several = copies(db).await > 1;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let answer = attempt().await;
        if done(&answer) || !several || Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Write options that make a write answer 201 only once every copy the database keeps holds
/// it (`w` = `cluster.n`; the server's default on one copy).
pub async fn every_copy(client: &Client) -> couch_ledger::WriteOptions {
    let copies = client.copies().await.expect("the database's copies");
    couch_ledger::WriteOptions {
        w: (copies > 1).then_some(copies),
    }
}

/// Whether database `db` states several copies of each document (`cluster.n` > 1: a CouchDB
/// cluster behind `COUCHDB_URL`). A test of the one-copy path (`LedgerBuilder::one_copy`, a knob
/// that makes a ledger treat its database as a single node's) skips there: on a cluster that
/// premise is false, and the copies' lag shows in it as flakiness, not as a finding.
pub async fn keeps_several_copies(db: &str) -> bool {
    let several = copies(db).await > 1;
    if several {
        eprintln!("SKIPPED: {db} keeps several copies; a one-copy test does not apply");
    }
    several
}

/// The copies database `db` states it keeps of each document (`cluster.n`; 1 where the server
/// states none, as pouchdb-server).
pub async fn copies(db: &str) -> u64 {
    let info: serde_json::Value = auth(raw().get(raw_url(db)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    info["cluster"]["n"].as_u64().unwrap_or(1)
}

/// Plants a sibling of document `id`'s current revision in database `db`, as a cluster's
/// concurrent writer or a replication would (a `_bulk_docs` with `"new_edits": false`): the
/// same parent, the body `edit` makes of the current one, revision hash `hash` (32 hex
/// digits; a larger one wins). Returns the planted revision; asserts the conflict is there.
///
/// CouchDB stores such a write from an admin. pouchdb-server silently drops it when the
/// database has any `validate_doc_update` (it answers `[]`, as for a success, and stores
/// nothing; 4.2.0), so there the validation is taken away for the plant and put back as it was.
/// (`trio::plant_sibling` does the same on the replicating trio without touching the validation,
/// which would replicate.)
pub async fn plant_sibling(
    db: &str,
    id: &str,
    hash: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> String {
    let doc_url = raw_url(&format!("{db}/{}", id.replace(':', "%3A")));
    let current: serde_json::Value = auth(raw().get(format!("{doc_url}?revs=true")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (sibling, rev) = sibling_of(&current, hash, edit);
    // On a cluster, on every copy (`w` = the copies): the sweeper's views, answered by any
    // one of them, must see the conflict.
    let copies = copies(db).await;
    let w = if copies > 1 {
        format!("?w={copies}")
    } else {
        String::new()
    };
    let bulk_url = raw_url(&format!("{db}/_bulk_docs{w}"));
    post_sibling(&bulk_url, &sibling).await;
    if copies > 1 {
        // On a cluster a read may not show the plant at once (a read of `r` copies that agree
        // on the winner need not name a losing leaf): give it a few seconds before taking it
        // for dropped below.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !leaves(&doc_url).await.contains(&rev) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    if !leaves(&doc_url).await.contains(&rev) {
        // pouchdb-server dropped it: lift the validation for the plant, then put it back.
        without_validation(db, post_sibling(&bulk_url, &sibling)).await;
    }
    assert!(
        leaves(&doc_url).await.contains(&rev),
        "the sibling {rev} was not stored"
    );
    rev
}

/// The sibling of `current` (a document read with `?revs=true`) that `edit` makes, with
/// revision hash `hash` under the same parent; and its revision.
fn sibling_of(
    current: &serde_json::Value,
    hash: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> (serde_json::Value, String) {
    use serde_json::{json, Value};
    let start = current["_revisions"]["start"].as_u64().expect("revisions");
    let ancestors: Vec<Value> = current["_revisions"]["ids"].as_array().unwrap()[1..].to_vec();
    let mut sibling = current.clone();
    edit(&mut sibling);
    let rev = format!("{start}-{hash}");
    sibling["_rev"] = json!(rev);
    let mut ids = vec![json!(hash)];
    ids.extend(ancestors);
    sibling["_revisions"] = json!({"start": start, "ids": ids});
    (sibling, rev)
}

/// Writes `sibling` as it is (`"new_edits": false`) with the `_bulk_docs` at `bulk_url`.
async fn post_sibling(bulk_url: &str, sibling: &serde_json::Value) {
    let planted = auth(raw().post(bulk_url))
        .header("Content-Type", "application/json")
        .body(serde_json::json!({"docs": [sibling], "new_edits": false}).to_string())
        .send()
        .await
        .unwrap();
    assert!(planted.status().is_success(), "plant: {}", planted.status());
}

/// The leaf revisions of the document at `doc_url`: the winner, then the conflicts.
async fn leaves(doc_url: &str) -> Vec<String> {
    let now: serde_json::Value = auth(raw().get(format!("{doc_url}?conflicts=true")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    std::iter::once(now["_rev"].clone())
        .chain(now["_conflicts"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// Runs `plant` with database `db`'s validation design document taken away, then puts that
/// document back as it was (asserts there is one).
async fn without_validation(db: &str, plant: impl std::future::Future<Output = ()>) {
    let validation_url = raw_url(&format!("{db}/_design/validation"));
    let r = auth(raw().get(&validation_url)).send().await.unwrap();
    assert!(
        r.status().is_success(),
        "the plant was dropped, and there is no validation"
    );
    let mut v: serde_json::Value = r.json().await.unwrap();
    let url = format!("{validation_url}?rev={}", v["_rev"].as_str().unwrap());
    assert!(auth(raw().delete(url))
        .send()
        .await
        .unwrap()
        .status()
        .is_success());
    plant.await;
    v.as_object_mut().unwrap().remove("_rev");
    let back = auth(raw().put(&validation_url))
        .header("Content-Type", "application/json")
        .body(v.to_string())
        .send()
        .await
        .unwrap();
    assert!(
        back.status().is_success(),
        "validation back: {}",
        back.status()
    );
}

/// Holds a worker once, right before it writes in `phase` (after its lease check), until
/// `release` is notified; `reached` is notified when it got there.
pub struct Gate {
    pub phase: &'static str,
    pub armed: std::sync::atomic::AtomicBool,
    pub reached: tokio::sync::Notify,
    pub release: tokio::sync::Notify,
}

impl Gate {
    /// Waits until the worker got to the gate, at most a minute: a worker that took another
    /// path (an error before the phase) fails the test instead of hanging it.
    pub async fn wait_reached(&self) {
        tokio::time::timeout(Duration::from_secs(60), self.reached.notified())
            .await
            .unwrap_or_else(|_| panic!("the worker did not reach the {} gate in 60 s", self.phase));
    }
}

/// A [`Gate`] at `phase` and the pause hook that holds a worker there
/// (`LedgerBuilder::pause_hook`).
pub fn gate(phase: &'static str) -> (std::sync::Arc<Gate>, couch_ledger::PauseHook) {
    use std::sync::atomic::Ordering;
    let g = std::sync::Arc::new(Gate {
        phase,
        armed: std::sync::atomic::AtomicBool::new(true),
        reached: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let hook_gate = g.clone();
    let hook = couch_ledger::PauseHook(std::sync::Arc::new(move |p| {
        let g = hook_gate.clone();
        Box::pin(async move {
            if p == g.phase && g.armed.swap(false, Ordering::SeqCst) {
                g.reached.notify_one();
                g.release.notified().await;
            }
        })
    }));
    (g, hook)
}

// ---- accounts and transfers in EUR -------------------------------------------------------------

pub fn eur() -> Currency {
    Currency::from_code("EUR").unwrap()
}

/// Opens account `id` in EUR with `opening` minor units and a minimum balance of 0.
pub async fn open_account(l: &Ledger, id: &str, opening: i64) {
    let created = l
        .create_account(AccountSpec {
            account_id: id.into(),
            currency: eur(),
            opening: Amount::new(opening).unwrap(),
            min_balance: Some(Amount::ZERO),
            meta: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(created.status, RecordStatus::Created);
}

/// Transfer `id`: `value` minor units of EUR from `from` to `to`.
pub fn eur_transfer(id: &str, from: &str, to: &str, value: i64) -> TransferRequest {
    TransferRequest {
        id: Some(id.into()),
        source: from.into(),
        destination: to.into(),
        amount: Amount::new(value).unwrap(),
        currency: eur(),
        meta: Default::default(),
    }
}

/// Account `id`'s balance in minor units.
pub async fn balance(l: &Ledger, id: &str) -> i64 {
    l.account(id).await.unwrap().balance.minor()
}

/// Document writes so far in database `db`: the sum of its live documents' revision
/// generations (a creation is generation 1, each update one more). Unlike `update_seq` this
/// reads the same on pouchdb-server and CouchDB, for documents without conflicts.
pub async fn writes_in(db: &str) -> u64 {
    db_snapshot(db)
        .await
        .revs
        .iter()
        .map(|(id, rev)| {
            let generation = rev.split('-').next().unwrap_or_default();
            generation
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{id}: revision {rev} has no generation"))
        })
        .sum()
}

/// Sweeps (every transfer stale at once) until none is open, no account holds a pending marker
/// and no ledger document a conflict, failing the test if `within` passes first: at rest as
/// `verify` judges it. On a cluster the pass that ends a transfer can leave its markers to be
/// settled (or repaired) by the next, and a conflict the views did not list yet to a later pass
/// (two sweepers' writes of one transfer, each on some copies: measured on CouchDB 3.4.3).
pub async fn sweep_to_rest(l: &Ledger, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        sweep_until_none_open(l, within).await;
        let status = l.status().await.unwrap();
        if status.states.open() == 0 && status.pending_markers == 0 && status.conflicts == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not at rest after {within:?} of sweeping: {status:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// On a database of several copies: sweeps until each of `ids` holds one live leaf on every
/// copy that answers (an `open_revs=all` read with `r` = `cluster.n`, which merges the copies'
/// revision trees) holding no pending marker, and the ledger is at rest ([`sweep_to_rest`]),
/// and returns those leaves in
/// the order of `ids`. A read of one copy can show a document without a rival leaf that
/// reached only the other copies (two decisions of one id, each a 202): an outcome judged
/// before this may not be the one that stays. Fails the test if `within` passes first.
pub async fn sweep_until_one_leaf(
    l: &Ledger,
    ids: &[String],
    within: std::time::Duration,
) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + within;
    let client = l.hot_client();
    let copies = u32::try_from(copies(client.database()).await).expect("a few copies");
    loop {
        sweep_to_rest(l, within).await;
        let mut leaves = Vec::with_capacity(ids.len());
        for id in ids {
            leaves.push(client.live_leaves(id, Some(copies)).await.unwrap());
        }
        // The status's count of pending markers reads a view (one copy): the leaves say.
        let settled = |leaf: &serde_json::Value| {
            leaf["pending"]
                .as_array()
                .is_none_or(|pending| pending.is_empty())
        };
        if leaves.iter().all(|l| l.len() == 1 && settled(&l[0])) {
            return leaves.into_iter().flatten().collect();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not one leaf on every copy after {within:?} of sweeping: {:#?}",
            ids.iter().zip(&leaves).collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// `verify` at rest passes: at once on one copy; on several copies within 60 s, sweeping
/// between its runs, as a deployment's sweeper would: a copy may not have every write yet when
/// `verify` reads, and a conflict that reached the copies after the last sweep is merged by
/// the next.
pub async fn assert_at_rest(l: &Ledger) {
    let several = copies(l.hot_client().database()).await > 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let report = l
            .verify_with(couch_ledger::VerifyOptions::at_rest())
            .await
            .unwrap();
        if report.ok {
            return;
        }
        assert!(several && Instant::now() < deadline, "{report:#?}");
        // A conflict whose leaves reached the copies after the sweeper's last pass (its
        // conflict view reads one copy) is merged by the next one.
        let options = couch_ledger::SweepOptions {
            limit: 1_000,
            stale_after: Duration::ZERO,
        };
        l.sweep_once(options).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Sweeps (every transfer stale at once) until none is open, failing the test if `within`
/// passes first: on a cluster a pass can leave a transfer whose document or accounts hold a
/// conflict for a later pass.
pub async fn sweep_until_none_open(l: &Ledger, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    let options = couch_ledger::SweepOptions {
        limit: 1_000,
        stale_after: std::time::Duration::ZERO,
    };
    loop {
        let pass = l.sweep_once(options.clone()).await.unwrap();
        let status = l.status().await.unwrap();
        if status.states.open() == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "transfers still open after {within:?} of sweeping: {status:?}, last pass {pass:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
