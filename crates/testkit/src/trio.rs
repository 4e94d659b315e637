//! A cluster-like setup from the stand-in server: three pouchdb-server nodes, continuous
//! replication between every pair, and a round-robin HTTP proxy in front.
//!
//! On a CouchDB cluster a `_rev` compare-and-swap is not exclusive: one `_rev` written through
//! two nodes at the same moment can succeed twice and leave a conflict. Three independent
//! servers that replicate to each other do the same, so tests can show what the ledger does
//! when its only lock is not a lock.
//!
//! How replication is set up, found by experiment on pouchdb-server 4.2.0:
//! - Each node **pulls** from the other two through its own `_replicator` database:
//!   `{"source": "http://other/db", "target": "db", "continuous": true}` (a *local* target).
//!   The daemon marks the document `"_replication_state": "triggered"` once it runs, which
//!   [`Trio::database`] waits for. `POST /_replicate` with `"continuous": true` works as well,
//!   but answers `{"ok": true}` at once and offers nothing to look at afterwards.
//! - **Push to an HTTP target does not work on a database with a `validate_doc_update`**
//!   (the ledger's): pouchdb-validation overwrites a replicated document's `_revisions` with
//!   those of the current winner (`newDoc._revisions = oldDoc._revisions`), so every update
//!   of an existing document (and every planted sibling) arriving by `_bulk_docs` with
//!   `"new_edits": false` is silently dropped (`[]`, no error). New documents replicate;
//!   their updates never do. Writing to a local target skips validation altogether, as
//!   CouchDB's internal replication between a cluster's copies does.
//! - `_local` documents are not replicated (as in CouchDB).
//! - On an HTTP `new_edits: false` write, `validate_doc_update` runs with the request's user
//!   context (`{"name": null, "roles": ["_admin"]}` in admin party) and an `oldDoc` that is
//!   the current winner (not the new revision's parent).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::devserver::DevServer;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use super::{raw, wait_for};

/// Three nodes and a round-robin proxy; everything stops when dropped.
pub struct Trio {
    nodes: Vec<DevServer>,
    proxy_addr: SocketAddr,
    proxy_task: tokio::task::JoinHandle<()>,
    /// Requests forwarded to each node by the proxy.
    pub forwarded: Arc<[AtomicUsize; 3]>,
}

/// How the proxy spreads requests over the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// Each request to the next node: like a cluster with `w = r = 1` — a client may not read
    /// its own write back on the next request (the node it reads from has not replicated it
    /// yet). Stricter than CouchDB's default `w = r = 2`, where a document GET after a write
    /// that answered 201 sees it.
    PerRequest,
    /// Each new connection to the next node, all its requests to that node (an L4 balancer): a
    /// client's sequential requests on one pooled connection read their own writes; concurrent
    /// clients (connections) still write the same `_rev` through different nodes.
    PerConnection,
}

/// One database's contents on one node: `doc_count`, and `(id, winning rev, conflicts)` of
/// every live document (design documents included), in id order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub doc_count: u64,
    pub docs: Vec<(String, String, Vec<String>)>,
}

impl Trio {
    /// Starts three pouchdb-server nodes (in parallel) and a per-request round-robin proxy in
    /// front of them.
    pub async fn start() -> Trio {
        Trio::start_with(Balance::PerRequest).await
    }

    /// [`Trio::start`] with the proxy spreading requests as `balance` says.
    pub async fn start_with(balance: Balance) -> Trio {
        let starts: Vec<_> = (0..3)
            .map(|_| tokio::task::spawn_blocking(DevServer::start))
            .collect();
        let mut nodes = Vec::new();
        for s in starts {
            nodes.push(
                s.await
                    .unwrap()
                    .expect("start a trio node (pouchdb-server)"),
            );
        }
        let upstreams: Vec<SocketAddr> = nodes
            .iter()
            .map(|n| {
                n.url()
                    .trim_start_matches("http://")
                    .parse()
                    .expect("node address")
            })
            .collect();
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let proxy_addr = listener.local_addr().unwrap();
        let forwarded = Arc::new([
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        ]);
        let quorum = Arc::new(QuorumEmulation::new(&nodes));
        let proxy_task = tokio::spawn(round_robin(
            listener,
            upstreams,
            balance,
            forwarded.clone(),
            quorum,
        ));
        Trio {
            nodes,
            proxy_addr,
            proxy_task,
            forwarded,
        }
    }

    /// The proxy's URL: each request goes to the next node in turn.
    pub fn url(&self) -> String {
        format!("http://{}", self.proxy_addr)
    }

    /// The three nodes' URLs.
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(DevServer::url).collect()
    }

    /// Node `i`'s URL.
    pub fn node(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Creates `db` on all three nodes and continuous replication between every pair (each node
    /// pulls from the other two: six replications), and waits until all six run.
    pub async fn database(&self, db: &str) {
        let urls = self.node_urls();
        for url in &urls {
            let reply = raw().put(format!("{url}/{db}")).send().await.unwrap();
            assert!(
                reply.status().is_success(),
                "PUT {url}/{db}: {}",
                reply.status()
            );
        }
        for (i, url) in urls.iter().enumerate() {
            for (j, other) in urls.iter().enumerate() {
                if i == j {
                    continue;
                }
                let doc = json!({
                    "_id": format!("{db}-from-{j}"),
                    "source": format!("{other}/{db}"),
                    "target": db,
                    "continuous": true,
                });
                let reply = post_json(&format!("{url}/_replicator"), &doc).await;
                assert!(
                    reply.0.is_success(),
                    "replication {j} -> {i}: {} {}",
                    reply.0,
                    reply.1
                );
            }
        }
        for (i, url) in urls.iter().enumerate() {
            for j in (0..3).filter(|&j| j != i) {
                let doc_url = format!("{url}/_replicator/{db}-from-{j}");
                wait_for(
                    &format!("replication {j} -> {i} of {db} triggered"),
                    Duration::from_secs(30),
                    || async {
                        let doc = get_json(&doc_url).await?;
                        (doc["_replication_state"] == "triggered").then_some(())
                    },
                )
                .await;
            }
        }
    }

    /// `db` on node `i`: its document count and every live document's winner and conflicts.
    pub async fn node_state(&self, i: usize, db: &str) -> Option<NodeState> {
        let url = self.node(i);
        let info = get_json(&format!("{url}/{db}")).await?;
        let all = get_json(&format!(
            "{url}/{db}/_all_docs?include_docs=true&conflicts=true"
        ))
        .await?;
        let docs = all["rows"]
            .as_array()?
            .iter()
            .map(|row| {
                let mut conflicts: Vec<String> = row["doc"]["_conflicts"]
                    .as_array()
                    .map(|c| {
                        c.iter()
                            .filter_map(|r| r.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                conflicts.sort();
                Some((
                    row["id"].as_str()?.to_owned(),
                    row["value"]["rev"].as_str()?.to_owned(),
                    conflicts,
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(NodeState {
            doc_count: info["doc_count"].as_u64()?,
            docs,
        })
    }

    /// Waits until all three nodes hold the same documents at the same revisions (the same
    /// winners and the same conflicts, and the same `doc_count`); returns how long it took and
    /// the common state. Panics after `deadline`.
    pub async fn wait_converged(&self, db: &str, deadline: Duration) -> (Duration, NodeState) {
        let start = Instant::now();
        let state = wait_for(
            &format!("{db} converged on three nodes"),
            deadline,
            || async {
                let first = self.node_state(0, db).await?;
                for i in 1..3 {
                    if self.node_state(i, db).await? != first {
                        return None;
                    }
                }
                Some(first)
            },
        )
        .await;
        (start.elapsed(), state)
    }

    /// The ids of `db`'s documents with `_conflicts`, as node 0 sees them (call after
    /// [`Trio::wait_converged`]), with their conflicting revisions.
    pub async fn conflicts(&self, db: &str) -> BTreeMap<String, Vec<String>> {
        let state = self.node_state(0, db).await.expect("read node 0");
        state
            .docs
            .into_iter()
            .filter(|(_, _, c)| !c.is_empty())
            .map(|(id, _, c)| (id, c))
            .collect()
    }

    /// Plants a sibling of `id`'s winning revision on node 0 (see [`plant_sibling`]); returns
    /// its revision. Replication spreads the conflict.
    pub async fn plant_sibling(&self, db: &str, id: &str, body: &Value) -> String {
        plant_sibling(&self.node(0), db, id, body, None).await
    }
}

impl Drop for Trio {
    fn drop(&mut self) {
        // Connection tasks live in the accept task's JoinSet and are aborted with it.
        self.proxy_task.abort();
        // The nodes' DevServers kill their processes and remove their data when dropped.
    }
}

/// Plants a conflict: writes, with `_bulk_docs` and `"new_edits": false`, a sibling of the
/// winning revision of `id` in `db` on the server at `url` — the same parent (or a new root
/// when the winner is a first revision), the same generation, the body `body`. `hash` is the
/// new revision's hash (32 hex digits; `None`: random). A sibling wins over the old winner
/// when its hash is greater (`Some("f".repeat(32))` wins, all zeros loses). Returns the
/// planted revision, after checking that the document now has it as a leaf.
///
/// On pouchdb-server a database with a `validate_doc_update` drops such a write silently (see
/// the module's comment); then the sibling goes into a scratch database and is replicated
/// once into `db` (a local target, so validation is skipped). On CouchDB the direct write
/// works (`validate_doc_update` runs on it).
pub async fn plant_sibling(
    url: &str,
    db: &str,
    id: &str,
    body: &Value,
    hash: Option<&str>,
) -> String {
    let base = url.trim_end_matches('/');
    let current = get_json(&format!("{base}/{db}/{}?revs=true", enc(id)))
        .await
        .unwrap_or_else(|| panic!("plant_sibling: {db}/{id} not found on {base}"));
    let start = current["_revisions"]["start"].as_u64().expect("_revisions");
    let ancestors: Vec<Value> = current["_revisions"]["ids"]
        .as_array()
        .expect("_revisions.ids")
        .iter()
        .skip(1)
        .cloned()
        .collect();
    let hash = hash
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)));
    let rev = format!("{start}-{hash}");
    let mut doc = body.as_object().cloned().unwrap_or_default();
    doc.insert("_id".into(), json!(id));
    doc.insert("_rev".into(), json!(rev));
    let mut ids = vec![json!(hash)];
    ids.extend(ancestors);
    doc.insert("_revisions".into(), json!({"start": start, "ids": ids}));
    let batch = json!({"new_edits": false, "docs": [doc]});

    let write = |target: String| {
        let batch = batch.clone();
        async move {
            let (status, reply) = post_json(&format!("{target}/_bulk_docs"), &batch).await;
            assert!(status.is_success(), "plant _bulk_docs: {status} {reply}");
            let errors: Vec<&Value> = reply
                .as_array()
                .map(|a| a.iter().filter(|r| r.get("error").is_some()).collect())
                .unwrap_or_default();
            assert!(errors.is_empty(), "plant _bulk_docs: {reply}");
        }
    };
    write(format!("{base}/{db}")).await;
    if !has_leaf(base, db, id, &rev).await {
        // pouchdb-server with validation: through a scratch database and a local target.
        let scratch = format!("{db}_plant_{:08x}", fastrand::u32(..));
        let reply = raw().put(format!("{base}/{scratch}")).send().await.unwrap();
        assert!(
            reply.status().is_success(),
            "PUT scratch: {}",
            reply.status()
        );
        write(format!("{base}/{scratch}")).await;
        let (status, reply) = post_json(
            &format!("{base}/_replicate"),
            &json!({"source": format!("{base}/{scratch}"), "target": db, "doc_ids": [id]}),
        )
        .await;
        assert!(status.is_success(), "plant _replicate: {status} {reply}");
        let _ = raw().delete(format!("{base}/{scratch}")).send().await;
    }
    assert!(
        has_leaf(base, db, id, &rev).await,
        "planted {id} {rev} is not a leaf on {base}"
    );
    rev
}

/// The leaf revisions of `id` on the server at `url` (`open_revs=all`), winner first unknown.
pub async fn leaves(url: &str, db: &str, id: &str) -> Vec<String> {
    let reply = raw()
        .get(format!(
            "{}/{db}/{}?open_revs=all",
            url.trim_end_matches('/'),
            enc(id)
        ))
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap();
    assert!(reply.status().is_success(), "open_revs: {}", reply.status());
    let v: Value = reply.json().await.unwrap();
    let mut revs: Vec<String> = v
        .as_array()
        .expect("open_revs array")
        .iter()
        .filter_map(|r| r["ok"]["_rev"].as_str().map(str::to_owned))
        .collect();
    revs.sort();
    revs
}

async fn has_leaf(url: &str, db: &str, id: &str, rev: &str) -> bool {
    leaves(url, db, id).await.iter().any(|r| r == rev)
}

/// CouchDB's (and PouchDB's) deterministic winner among leaf revisions: the highest
/// generation, then the greatest hash as a string.
pub fn winner<'a>(revs: &[&'a str]) -> &'a str {
    revs.iter()
        .copied()
        .max_by_key(|r| {
            let (n, h) = r.split_once('-').expect("N-hash");
            (n.parse::<u64>().expect("generation"), h.to_owned())
        })
        .expect("at least one rev")
}

fn enc(id: &str) -> String {
    percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// GET returning the JSON body of a 2xx reply, `None` otherwise.
pub async fn get_json(url: &str) -> Option<Value> {
    let reply = raw().get(url).send().await.ok()?;
    if !reply.status().is_success() {
        return None;
    }
    reply.json().await.ok()
}

/// POST a JSON body; the status and the JSON reply.
pub async fn post_json(url: &str, body: &Value) -> (reqwest::StatusCode, Value) {
    let reply = raw()
        .post(url)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = reply.status();
    (status, reply.json().await.unwrap_or(Value::Null))
}

/// PUT a JSON body; the status and the JSON reply.
pub async fn put_json(url: &str, body: &Value) -> (reqwest::StatusCode, Value) {
    let reply = raw()
        .put(url)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = reply.status();
    (status, reply.json().await.unwrap_or(Value::Null))
}

// ---- the round-robin proxy -------------------------------------------------------------------

/// Accepts connections; each request (or each connection, [`Balance`]) goes to the next node
/// in turn (a keep-alive client connection holds one upstream connection per node, opened when
/// first needed), like a load balancer in front of a cluster.
async fn round_robin(
    listener: TcpListener,
    upstreams: Vec<SocketAddr>,
    balance: Balance,
    forwarded: Arc<[AtomicUsize; 3]>,
    quorum: Arc<QuorumEmulation>,
) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            break;
        };
        while connections.try_join_next().is_some() {}
        let (upstreams, next, forwarded) = (upstreams.clone(), next.clone(), forwarded.clone());
        let quorum = quorum.clone();
        connections.spawn(async move {
            let fixed = (balance == Balance::PerConnection)
                .then(|| next.fetch_add(1, Ordering::Relaxed) % upstreams.len());
            let _ = serve(client, upstreams, fixed, next, forwarded, quorum).await;
        });
    }
}

type Upstream = (BufReader<OwnedReadHalf>, OwnedWriteHalf);

async fn serve(
    client: TcpStream,
    upstreams: Vec<SocketAddr>,
    fixed: Option<usize>,
    next: Arc<AtomicUsize>,
    forwarded: Arc<[AtomicUsize; 3]>,
    quorum: Arc<QuorumEmulation>,
) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let (cr, mut cw) = client.into_split();
    let mut cr = BufReader::new(cr);
    let mut open: Vec<Option<Upstream>> = upstreams.iter().map(|_| None).collect();
    loop {
        let Some(head) = read_head(&mut cr).await? else {
            return Ok(());
        };
        let mut request = head.clone();
        copy_body(&mut cr, &head, false, &mut request, true).await?;
        if let Some(reply) = quorum.answer(&head, &request[head.len()..]).await {
            cw.write_all(&reply).await?;
            continue;
        }
        let i = fixed.unwrap_or_else(|| next.fetch_add(1, Ordering::Relaxed) % upstreams.len());
        forwarded[i].fetch_add(1, Ordering::Relaxed);
        // A kept-alive upstream connection the node closed while idle fails before any reply
        // byte: send the request again on a fresh one (once).
        let mut reply = None;
        for _ in 0..2 {
            let reused = open[i].is_some();
            if !reused {
                let s = TcpStream::connect(upstreams[i]).await?;
                let _ = s.set_nodelay(true);
                let (r, w) = s.into_split();
                open[i] = Some((BufReader::new(r), w));
            }
            let (sr, sw) = open[i].as_mut().expect("connected");
            let sent = sw.write_all(&request).await;
            let head = match sent {
                Ok(()) => read_head(sr).await,
                Err(e) => Err(e),
            };
            match head {
                Ok(Some(h)) => {
                    reply = Some(h);
                    break;
                }
                Ok(None) | Err(_) if reused => open[i] = None,
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        let Some(reply) = reply else {
            return Ok(());
        };
        let (sr, _) = open[i].as_mut().expect("connected");
        let status = String::from_utf8_lossy(&reply);
        let bodiless = head.starts_with(b"HEAD ")
            || status.starts_with("HTTP/1.1 204")
            || status.starts_with("HTTP/1.1 304");
        cw.write_all(&reply).await?;
        let ended = copy_body(sr, &reply, bodiless, &mut cw, false).await?;
        let close =
            |h: &[u8]| header(h, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if ended || close(&reply) {
            open[i] = None;
        }
        if ended || close(&reply) || close(&head) {
            let _ = cw.shutdown().await;
            return Ok(());
        }
    }
}

/// What a CouchDB cluster (n = 3) does that three replicating servers do not: a `_bulk_docs`
/// with `?w=3` is answered 201 for a document only once **every** copy holds the revision, and
/// two writes on the same parent cannot both get there (each copy takes one child of a leaf
/// from interactive writers: SERVERS.md, docs/CLUSTER.md F1/F6). The emulation: each document
/// has a leader node (by a hash of its id) that takes every `w = 3` write of it, so a stale
/// `_rev` is a 409 there; a write that landed is confirmed once the other two nodes hold the
/// revision (`_revs_diff`), within [`QUORUM_WAIT`], else it is answered `202 Accepted`, as a
/// cluster does when fewer than `w` copies answered in time. `GET /db` says `cluster.n = 3` so
/// that the ledger asks for `w = 3`. Writes without `w`, and every read, go round-robin.
pub struct QuorumEmulation {
    nodes: Vec<String>,
    http: reqwest::Client,
}

/// How long a `w = 3` write waits for the other copies before it is answered 202.
const QUORUM_WAIT: Duration = Duration::from_secs(3);

impl QuorumEmulation {
    fn new(nodes: &[DevServer]) -> QuorumEmulation {
        QuorumEmulation {
            nodes: nodes.iter().map(DevServer::url).collect(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    /// The whole HTTP reply for requests this emulation answers itself, `None` for the rest.
    async fn answer(&self, head: &[u8], body: &[u8]) -> Option<Vec<u8>> {
        let text = String::from_utf8_lossy(head);
        let line = text.lines().next()?;
        let mut parts = line.split(' ');
        let (method, target) = (parts.next()?, parts.next()?);
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let auth = header(head, "authorization");
        match (method, segments.as_slice()) {
            ("GET", [db]) if !db.is_empty() && !db.starts_with('_') && query.is_empty() => {
                let mut r = self.http.get(format!("{}/{db}", self.nodes[0]));
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                let reply = r.send().await.ok()?;
                let status = reply.status().as_u16();
                let mut info: Value = reply.json().await.ok()?;
                if status == 200 {
                    info["cluster"] = json!({"q": 1, "n": 3, "w": 2, "r": 2});
                }
                Some(http_reply(status, &info))
            }
            ("POST", [db, "_bulk_docs"]) if query.split('&').any(|kv| kv == "w=3") => {
                Some(self.bulk_docs(db, body, auth.as_deref()).await)
            }
            _ => None,
        }
    }

    fn leader(id: &str) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        usize::try_from(h % 3).expect("small")
    }

    async fn bulk_docs(&self, db: &str, body: &[u8], auth: Option<&str>) -> Vec<u8> {
        let Ok(request) = serde_json::from_slice::<Value>(body) else {
            return http_reply(400, &json!({"error": "bad_request"}));
        };
        let docs = request["docs"].as_array().cloned().unwrap_or_default();
        let mut groups: BTreeMap<usize, Vec<(usize, Value)>> = BTreeMap::new();
        for (i, doc) in docs.iter().enumerate() {
            let id = doc["_id"].as_str().unwrap_or("");
            groups
                .entry(Self::leader(id))
                .or_default()
                .push((i, doc.clone()));
        }
        let mut results: Vec<Value> = vec![Value::Null; docs.len()];
        for (node, group) in groups {
            let batch: Vec<&Value> = group.iter().map(|(_, d)| d).collect();
            let mut r = self
                .http
                .post(format!("{}/{db}/_bulk_docs", self.nodes[node]))
                .json(&json!({ "docs": batch }));
            if let Some(a) = auth {
                r = r.header("Authorization", a);
            }
            let Ok(reply) = r.send().await else {
                return http_reply(503, &json!({"error": "unavailable"}));
            };
            let status = reply.status().as_u16();
            let answer: Value = reply.json().await.unwrap_or(Value::Null);
            let Some(rows) = answer.as_array() else {
                return http_reply(status, &answer);
            };
            // Match by id: pouchdb-server may reorder its answers.
            for row in rows {
                let id = row["id"].as_str();
                if let Some((i, _)) = group
                    .iter()
                    .find(|(i, d)| d["_id"].as_str() == id && results[*i].is_null())
                {
                    results[*i] = row.clone();
                }
            }
        }
        // Confirm the writes on every copy: one `_revs_diff` per node and poll.
        let written: Vec<(usize, String, String)> = results
            .iter()
            .enumerate()
            .filter(|(_, row)| row.get("error").is_none())
            .filter_map(|(i, row)| {
                Some((
                    i,
                    row["id"].as_str()?.to_owned(),
                    row["rev"].as_str()?.to_owned(),
                ))
            })
            .collect();
        let missing = self.missing_somewhere(db, &written, auth).await;
        for i in &missing {
            results[*i]["accepted"] = json!(true);
        }
        http_reply(
            if missing.is_empty() { 201 } else { 202 },
            &Value::Array(results),
        )
    }

    /// Of these writes, the indexes of those some node still lacks after [`QUORUM_WAIT`].
    async fn missing_somewhere(
        &self,
        db: &str,
        written: &[(usize, String, String)],
        auth: Option<&str>,
    ) -> Vec<usize> {
        let deadline = Instant::now() + QUORUM_WAIT;
        let mut missing: Vec<usize> = Vec::new();
        for node in &self.nodes {
            let mut left: Vec<&(usize, String, String)> = written.iter().collect();
            loop {
                let mut ask = serde_json::Map::new();
                for (_, id, rev) in &left {
                    ask.entry(id.clone())
                        .or_insert_with(|| json!([]))
                        .as_array_mut()
                        .expect("array")
                        .push(json!(rev));
                }
                let mut r = self
                    .http
                    .post(format!("{node}/{db}/_revs_diff"))
                    .json(&Value::Object(ask));
                if let Some(a) = auth {
                    r = r.header("Authorization", a);
                }
                let answer: Option<Value> = match r.send().await {
                    Ok(reply) => reply.json().await.ok(),
                    Err(_) => None,
                };
                left.retain(|(_, id, rev)| {
                    answer.as_ref().is_none_or(|a| {
                        a.get(id.as_str()).is_some_and(|m| {
                            m["missing"]
                                .as_array()
                                .is_some_and(|l| l.iter().any(|x| x.as_str() == Some(rev)))
                        })
                    })
                });
                if left.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    missing.extend(left.iter().map(|(i, _, _)| *i));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
        missing.sort_unstable();
        missing.dedup();
        missing
    }
}

/// A complete HTTP/1.1 reply with a JSON body.
fn http_reply(status: u16, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    let reason = match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        400 => "Bad Request",
        _ => "Status",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// Reads an HTTP head (through the blank line); `None` at a clean end of stream.
async fn read_head<R: AsyncBufReadExt + Unpin>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let n = r.read_until(b'\n', &mut head).await?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        if head.ends_with(b"\r\n\r\n") {
            return Ok(Some(head));
        }
        if head.len() > 64 * 1024 {
            return Err(std::io::Error::other("HTTP head too long"));
        }
    }
}

fn header(head: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(head)
        .lines()
        .skip(1)
        .find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
}

/// Copies one message body (Content-Length, chunked, or — for a reply only — to the end of the
/// stream) from `r` to `w` as it comes; `true` when the stream ended with it. A request without
/// a length has no body.
async fn copy_body<R, W>(
    r: &mut R,
    head: &[u8],
    bodiless: bool,
    w: &mut W,
    request: bool,
) -> std::io::Result<bool>
where
    R: AsyncBufReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    if bodiless {
        return Ok(false);
    }
    if header(head, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        loop {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            w.write_all(&line).await?;
            let text = String::from_utf8_lossy(&line);
            let size = usize::from_str_radix(text.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other("bad chunk size"))?;
            if size == 0 {
                loop {
                    let mut t = Vec::new();
                    let n = r.read_until(b'\n', &mut t).await?;
                    w.write_all(&t).await?;
                    if n == 0 || t == b"\r\n" {
                        return Ok(false);
                    }
                }
            }
            let mut chunk = vec![0u8; size + 2];
            r.read_exact(&mut chunk).await?;
            w.write_all(&chunk).await?;
        }
    }
    let mut buf = vec![0u8; 16 * 1024];
    if let Some(len) = header(head, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        let mut left = len;
        while left > 0 {
            let n = r.read(&mut buf[..left.min(16 * 1024)]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            w.write_all(&buf[..n]).await?;
            left -= n;
        }
        return Ok(false);
    }
    if request {
        return Ok(false);
    }
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(true);
        }
        w.write_all(&buf[..n]).await?;
    }
}
