//! The part of CouchDB's HTTP API the ledger uses, answered by the simulated cluster: each
//! simulated process talks to it through a [`SimTransport`] (its requests routed by a
//! round-robin balancer, or pinned to one node), which can also be killed (a process crash:
//! its requests never come back).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use couch_ledger::testing::{Exchange, Transport, WireFailure, WireReply, WireRequest};
use serde_json::{json, Map, Value};

use crate::sim::cluster::{doc_json, Cluster, CopyWrite, DocEntry, DocWrite};
use crate::sim::tree::Rev;
use crate::sim::views;

/// How a process reaches the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Each request to the next node in the balancer's rotation.
    RoundRobin,
    /// Every request to this node.
    Pinned(usize),
}

/// One simulated process's connection to the cluster.
pub struct SimTransport {
    pub cluster: Arc<Cluster>,
    pub route: Route,
    /// A member's requests: deleting a ledger document is refused (validation).
    pub admin: bool,
    next: AtomicUsize,
    pub dead: Arc<AtomicBool>,
    /// A process that may die right after a write the server took: a worker stopped between
    /// two steps, as a fail point would stop it.
    crash: Option<Arc<Crash>>,
}

/// A test of a write's body.
pub type WriteTest = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// What is done with a write's body.
pub type WriteHook = Box<dyn Fn(&[u8]) + Send + Sync>;

/// When a process dies after a write, and what is told when it does.
pub struct Crash {
    /// Per mille of the writes `fatal` picks after which the process dies.
    pub permille: u32,
    /// Whether a `_bulk_docs` body is a write this process may die after.
    pub fatal: WriteTest,
    /// Called once, with the write's body, when one kills the process (its slot is taken by a
    /// new process).
    pub on_crash: WriteHook,
}

impl SimTransport {
    pub fn new(cluster: Arc<Cluster>, route: Route, admin: bool) -> Arc<SimTransport> {
        Self::with(cluster, route, admin, None)
    }

    /// A process that may die after a `_bulk_docs` write, as `crash` says.
    pub fn crashing(
        cluster: Arc<Cluster>,
        route: Route,
        admin: bool,
        crash: Crash,
    ) -> Arc<SimTransport> {
        Self::with(cluster, route, admin, Some(Arc::new(crash)))
    }

    fn with(
        cluster: Arc<Cluster>,
        route: Route,
        admin: bool,
        crash: Option<Arc<Crash>>,
    ) -> Arc<SimTransport> {
        Arc::new(SimTransport {
            cluster,
            route,
            admin,
            next: AtomicUsize::new(0),
            dead: Arc::new(AtomicBool::new(false)),
            crash,
        })
    }
}

/// Kills the process if `request`, just taken by the server, is a write it dies after as
/// `crash` says (`dead` set, `on_crash` called).
fn die_after(cluster: &Cluster, dead: &AtomicBool, crash: &Crash, request: &WireRequest) {
    if request.method != "POST" || !request.path.ends_with("/_bulk_docs") {
        return;
    }
    let body = request.body.as_deref().unwrap_or_default();
    if !(crash.fatal)(body) {
        return;
    }
    let dies = {
        let mut s = cluster.lock();
        s.config.process_crashes
            && s.rng.u32(..1000) < crash.permille
            && !dead.swap(true, Ordering::Relaxed)
    };
    if dies {
        (crash.on_crash)(body);
    }
}

impl Transport for SimTransport {
    fn exchange(&self, request: WireRequest) -> Exchange {
        let crash = self.crash.clone();
        let cluster = Arc::clone(&self.cluster);
        let dead = Arc::clone(&self.dead);
        let admin = self.admin;
        let nodes = cluster.lock().config.nodes;
        let node = match self.route {
            Route::Pinned(n) => n,
            Route::RoundRobin => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                (0..nodes)
                    .map(|i| (start + i) % nodes)
                    .find(|n| cluster.in_rotation(*n))
                    .unwrap_or(start % nodes)
            }
        };
        Box::pin(async move {
            if dead.load(Ordering::Relaxed) {
                return std::future::pending().await;
            }
            let latency = cluster.lock().rng.u64(0..=2);
            tokio::time::sleep(Duration::from_millis(latency)).await;
            if !cluster.node_up(node) {
                return Err(failure(false, "connection refused (node down)"));
            }
            let (transient, lost) = {
                let mut s = cluster.lock();
                s.stats.requests += 1;
                let t = s.config.transient_permille;
                let l = s.config.lost_reply_permille;
                (s.rng.u32(..1000) < t, s.rng.u32(..1000) < l)
            };
            if transient {
                cluster.lock().stats.transient_errors += 1;
                return Ok(reply(
                    503,
                    json!({"error": "service_unavailable", "reason": "simulated"}),
                ));
            }
            let answer = handle(&cluster, &request, admin).await;
            if let Some(watcher) = cluster.watcher() {
                watcher(&request);
            }
            if let Some(crash) = &crash {
                die_after(&cluster, &dead, crash, &request);
            }
            if dead.load(Ordering::Relaxed) {
                return std::future::pending().await;
            }
            let mut trace =
                format!("{} {} {:?} ", request.method, request.path, request.query).into_bytes();
            trace.extend_from_slice(request.body.as_deref().unwrap_or_default());
            trace.extend_from_slice(format!(" -> {} ", answer.status).as_bytes());
            trace.extend_from_slice(&answer.body);
            cluster.trace(&trace);
            if !cluster.node_up(node) {
                return Err(failure(false, "connection reset (node stopped)"));
            }
            if lost {
                cluster.lock().stats.lost_replies += 1;
                tokio::time::sleep(request.timeout.unwrap_or(Duration::from_secs(10))).await;
                return Err(failure(true, "timed out (the answer was lost)"));
            }
            Ok(answer)
        })
    }
}

fn failure(timeout: bool, what: &str) -> WireFailure {
    WireFailure {
        timeout,
        source: what.into(),
    }
}

fn reply(status: u16, body: Value) -> WireReply {
    WireReply {
        status,
        retry_after: None,
        body: serde_json::to_vec(&body).expect("json"),
    }
}

fn not_found(reason: &str) -> WireReply {
    reply(404, json!({"error": "not_found", "reason": reason}))
}

fn bad(reason: &str) -> WireReply {
    reply(400, json!({"error": "bad_request", "reason": reason}))
}

fn decode_segment(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

fn flag(r: &WireRequest, name: &str) -> bool {
    r.param(name) == Some("true")
}

fn json_param(r: &WireRequest, name: &str) -> Option<Value> {
    r.param(name).and_then(|v| serde_json::from_str(v).ok())
}

async fn handle(cluster: &Arc<Cluster>, r: &WireRequest, admin: bool) -> WireReply {
    let segments: Vec<String> = if r.path.is_empty() {
        Vec::new()
    } else {
        r.path.split('/').map(decode_segment).collect()
    };
    let body: Option<Value> = r
        .body
        .as_deref()
        .and_then(|b| serde_json::from_slice(b).ok());
    let method = r.method.as_str();
    match segments.as_slice() {
        [] => reply(
            200,
            json!({"couchdb": "Welcome", "version": "3.4.3", "vendor": {"name": "simulated"}}),
        ),
        [u] if u == "_uuids" => {
            let n: usize = r.param("count").and_then(|c| c.parse().ok()).unwrap_or(1);
            let ids: Vec<String> = (0..n).map(|_| cluster.next_uuid()).collect();
            reply(200, json!({"uuids": ids}))
        }
        [u] if u == "_up" => reply(200, json!({"status": "ok"})),
        [db] => database(cluster, db, method, r),
        [db, x] if !cluster.lock().dbs.contains_key(db) && x != "_session" => {
            not_found("Database does not exist.")
        }
        [db, x] if x == "_bulk_docs" && method == "POST" => {
            bulk_docs(cluster, db, r, body, admin).await
        }
        [db, x] if x == "_all_docs" => all_docs(cluster, db, r, body),
        [db, x] if x == "_bulk_get" && method == "POST" => {
            bulk_get(cluster, db, quorum(r, cluster, "r"), body)
        }
        [db, x] if x == "_changes" => changes(cluster, db, r, body).await,
        [db, x] if x == "_security" => {
            if method == "PUT" {
                if let Some(d) = cluster.lock().dbs.get_mut(db.as_str()) {
                    d.security = body.unwrap_or(json!({}));
                }
                reply(200, json!({"ok": true}))
            } else {
                let s = cluster.lock().dbs[db.as_str()].security.clone();
                reply(200, s)
            }
        }
        [db, x] if x == "_revs_limit" => {
            if method == "PUT" {
                let n = body.and_then(|b| b.as_u64()).unwrap_or(1000) as usize;
                if let Some(d) = cluster.lock().dbs.get_mut(db.as_str()) {
                    d.revs_limit = n;
                }
                reply(200, json!({"ok": true}))
            } else {
                let n = cluster.lock().dbs[db.as_str()].revs_limit;
                reply(200, json!(n))
            }
        }
        [db, x, name] if x == "_local" => {
            let id = format!("_local/{name}");
            let mut s = cluster.lock();
            let d = s.dbs.get_mut(db.as_str()).expect("checked");
            if method == "PUT" {
                let mut doc = body.unwrap_or(json!({}));
                let n = d
                    .local
                    .get(&id)
                    .and_then(|v| v.get("_rev"))
                    .and_then(Value::as_str)
                    .and_then(|r| r.strip_prefix("0-"))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                let rev = format!("0-{}", n + 1);
                doc["_id"] = json!(id);
                doc["_rev"] = json!(rev);
                d.local.insert(id.clone(), doc);
                reply(201, json!({"ok": true, "id": id, "rev": rev}))
            } else {
                match d.local.get(&id) {
                    Some(doc) => reply(200, doc.clone()),
                    None => not_found("missing"),
                }
            }
        }
        [db, x, ddoc, v, view] if x == "_design" && v == "_view" => {
            query_view(cluster, db, ddoc, view, r, body)
        }
        [db, x, ddoc] if x == "_design" => {
            document(
                cluster,
                db,
                &format!("_design/{ddoc}"),
                method,
                r,
                body,
                admin,
            )
            .await
        }
        [db, id] => document(cluster, db, id, method, r, body, admin).await,
        _ => not_found("no such path in the simulation"),
    }
}

fn database(cluster: &Arc<Cluster>, db: &str, method: &str, r: &WireRequest) -> WireReply {
    match method {
        "PUT" => {
            let q = r.param("q").and_then(|q| q.parse().ok());
            if cluster.create_db(db, q) {
                reply(201, json!({"ok": true}))
            } else {
                reply(
                    412,
                    json!({"error": "file_exists", "reason": "The database could not be created, the file already exists."}),
                )
            }
        }
        "DELETE" => {
            if cluster.lock().dbs.remove(db).is_some() {
                reply(200, json!({"ok": true}))
            } else {
                not_found("Database does not exist.")
            }
        }
        _ => {
            let s = cluster.lock();
            let Some(d) = s.dbs.get(db) else {
                return not_found("Database does not exist.");
            };
            let copy = &d.copies[0];
            let count = copy.docs.values().filter(|e| e.tree.live()).count();
            reply(
                200,
                json!({
                    "db_name": db,
                    "update_seq": format!("{}-sim", copy.seq),
                    "doc_count": count,
                    "doc_del_count": copy.docs.len() - count,
                    "cluster": {"q": d.q, "n": s.config.nodes, "w": s.config.default_w, "r": s.config.default_r},
                    "props": {},
                }),
            )
        }
    }
}

/// `_id`, `_rev` and `_deleted` of a document a client sent, and the body CouchDB stores.
fn doc_write(mut doc: Value, id: Option<&str>) -> Result<DocWrite, WireReply> {
    let Some(obj) = doc.as_object_mut() else {
        return Err(bad("Document must be a JSON object"));
    };
    let id = match (id, obj.remove("_id")) {
        (Some(id), _) => id.to_owned(),
        (None, Some(Value::String(id))) => id,
        _ => return Err(bad("a document without _id (the simulation names none)")),
    };
    let parent = match obj.remove("_rev") {
        Some(Value::String(r)) => Some(Rev::parse(&r).ok_or_else(|| bad("Invalid rev format"))?),
        _ => None,
    };
    let deleted = obj
        .remove("_deleted")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    obj.remove("_revisions");
    obj.remove("_conflicts");
    Ok(DocWrite {
        id,
        parent,
        deleted,
        body: doc,
    })
}

fn quorum(r: &WireRequest, cluster: &Cluster, name: &str) -> usize {
    r.param(name)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| {
            let s = cluster.lock();
            if name == "w" {
                s.config.default_w
            } else {
                s.config.default_r
            }
        })
}

async fn bulk_docs(
    cluster: &Arc<Cluster>,
    db: &str,
    r: &WireRequest,
    body: Option<Value>,
    admin: bool,
) -> WireReply {
    let Some(docs) = docs_of(&body) else {
        return bad("POST body must include `docs` parameter.");
    };
    if body.as_ref().and_then(|b| b.get("new_edits")) == Some(&json!(false)) {
        return bad("new_edits=false is not simulated");
    }
    let mut writes = Vec::with_capacity(docs.len());
    for d in docs {
        match doc_write(d.clone(), None) {
            Ok(w) => writes.push(w),
            Err(e) => return e,
        }
    }
    let ids: Vec<String> = writes.iter().map(|w| w.id.clone()).collect();
    let w = quorum(r, cluster, "w");
    let results = cluster.write(db, writes, w, admin).await;
    let mut all_quorum = true;
    let rows: Vec<Value> = ids
        .iter()
        .zip(results)
        .map(|(id, r)| match r {
            Ok((rev, q)) => {
                all_quorum &= q;
                if q {
                    json!({"ok": true, "id": id, "rev": rev.to_string()})
                } else {
                    // As chttpd marks a document below the quorum in a 202 answer.
                    json!({"ok": true, "id": id, "rev": rev.to_string(), "accepted": true})
                }
            }
            Err(CopyWrite::Forbidden) => json!({"id": id, "error": "forbidden", "reason": "only an admin may delete a ledger document"}),
            Err(_) => json!({"id": id, "error": "conflict", "reason": "Document update conflict."}),
        })
        .collect();
    if !all_quorum {
        cluster.lock().stats.writes_accepted += 1;
    }
    reply(if all_quorum { 201 } else { 202 }, Value::Array(rows))
}

async fn document(
    cluster: &Arc<Cluster>,
    db: &str,
    id: &str,
    method: &str,
    r: &WireRequest,
    body: Option<Value>,
    admin: bool,
) -> WireReply {
    match method {
        "PUT" | "DELETE" => {
            let doc = if method == "DELETE" {
                json!({"_rev": r.param("rev"), "_deleted": true})
            } else {
                let mut doc = body.unwrap_or(json!({}));
                if let Some(rev) = r.param("rev") {
                    doc["_rev"] = json!(rev);
                }
                doc
            };
            let write = match doc_write(doc, Some(id)) {
                Ok(w) => w,
                Err(e) => return e,
            };
            let w = quorum(r, cluster, "w");
            match cluster.write(db, vec![write], w, admin).await.remove(0) {
                Ok((rev, q)) => {
                    if !q {
                        cluster.lock().stats.writes_accepted += 1;
                    }
                    reply(
                        if q { 201 } else { 202 },
                        json!({"ok": true, "id": id, "rev": rev.to_string()}),
                    )
                }
                Err(CopyWrite::Forbidden) => reply(
                    403,
                    json!({"error": "forbidden", "reason": "only an admin may delete a ledger document"}),
                ),
                Err(_) => reply(
                    409,
                    json!({"error": "conflict", "reason": "Document update conflict."}),
                ),
            }
        }
        _ => {
            let rq = quorum(r, cluster, "r");
            if r.param("open_revs") == Some("all") {
                return open_revs_all(cluster, db, id, rq, flag(r, "revs"));
            }
            if let Some(revs) = json_param(r, "open_revs") {
                return open_revs(cluster, db, id, &revs, rq);
            }
            let Some((tree, _)) = cluster.read_doc(db, id, rq) else {
                return not_found("missing");
            };
            let Some(winner) = tree.winner() else {
                return not_found("missing");
            };
            if tree.is_deleted(&winner) {
                return not_found("deleted");
            }
            reply(200, doc_json(id, &tree, &winner, flag(r, "conflicts")))
        }
    }
}

/// `open_revs=all`: every leaf held by any of the `r` copies read (CouchDB merges the copies'
/// revision trees), deleted ones too, as `{"ok": doc}` rows, each with its `_revisions` when
/// `history` (`revs=true`); a 404 when no copy read holds the document.
fn open_revs_all(cluster: &Arc<Cluster>, db: &str, id: &str, r: usize, history: bool) -> WireReply {
    match merged_leaves(cluster, db, id, r, history) {
        Ok(rows) if rows.is_empty() => not_found("missing"),
        Ok(rows) => reply(200, Value::Array(rows)),
        Err(missing_db) => missing_db,
    }
}

/// A request body's `docs` list (`_bulk_docs`, `_bulk_get`).
fn docs_of(body: &Option<Value>) -> Option<&Vec<Value>> {
    body.as_ref()?.get("docs")?.as_array()
}

/// `POST _bulk_get` with ids and no `rev`: per id, every leaf of the `r` copies read, as
/// `open_revs=all` gives them (CouchDB's batched `fabric:open_revs`), or a `not_found` error.
fn bulk_get(cluster: &Arc<Cluster>, db: &str, r: usize, body: Option<Value>) -> WireReply {
    let Some(docs) = docs_of(&body) else {
        return bad("Missing JSON list of 'docs'.");
    };
    let mut results = Vec::new();
    for d in docs {
        let Some(id) = d.get("id").and_then(Value::as_str) else {
            return bad("document id missed");
        };
        if d.get("rev").is_some() {
            return bad("the simulator answers _bulk_get without `rev` only");
        }
        let rows = match merged_leaves(cluster, db, id, r, false) {
            Ok(rows) => rows,
            Err(missing_db) => return missing_db,
        };
        let rows = if rows.is_empty() {
            vec![
                json!({"error": {"id": id, "rev": "undefined", "error": "not_found", "reason": "missing"}}),
            ]
        } else {
            rows
        };
        results.push(json!({"id": id, "docs": rows}));
    }
    reply(200, json!({ "results": results }))
}

/// The leaves of `id` merged over the `r` copies read, as `{"ok": doc}` rows (empty when no
/// copy read holds it); `Err` with the reply when the database does not exist.
fn merged_leaves(
    cluster: &Arc<Cluster>,
    db: &str,
    id: &str,
    r: usize,
    history: bool,
) -> Result<Vec<Value>, WireReply> {
    let trees = trees_read(cluster, db, id, r)?;
    let mut seen = std::collections::HashSet::new();
    let mut rows = Vec::new();
    for t in &trees {
        for leaf in t.leaves() {
            // A leaf of one copy that another copy has built on is no leaf of the merged tree.
            let built_on = trees.iter().any(|o| o.contains(&leaf) && !o.is_leaf(&leaf));
            if !built_on && t.body(&leaf).is_some() && seen.insert(leaf.to_string()) {
                let mut doc = doc_json(id, t, &leaf, false);
                if history {
                    let ids: Vec<String> =
                        t.history(&leaf).iter().map(|r| r.hash.clone()).collect();
                    doc["_revisions"] = json!({"start": leaf.pos, "ids": ids});
                }
                rows.push(json!({"ok": doc}));
            }
        }
    }
    Ok(rows)
}

/// The revision trees of `id` on the `r` copies read (those that hold it); `Err` with the
/// reply when the database does not exist.
fn trees_read(
    cluster: &Arc<Cluster>,
    db: &str,
    id: &str,
    r: usize,
) -> Result<Vec<crate::sim::tree::Tree>, WireReply> {
    let copies = cluster.read_copies(db, id, r);
    let s = cluster.lock();
    let Some(d) = s.dbs.get(db) else {
        return Err(not_found("Database does not exist."));
    };
    Ok(copies
        .iter()
        .filter_map(|c| d.copies[*c].docs.get(id).map(|e| e.tree.clone()))
        .collect())
}

fn open_revs(cluster: &Arc<Cluster>, db: &str, id: &str, revs: &Value, r: usize) -> WireReply {
    let trees = match trees_read(cluster, db, id, r) {
        Ok(trees) => trees,
        Err(missing_db) => return missing_db,
    };
    let wanted: Vec<String> = revs
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let rows: Vec<Value> = wanted
        .iter()
        .map(|w| {
            let found = Rev::parse(w).and_then(|rev| {
                trees
                    .iter()
                    .find(|t| t.is_leaf(&rev) && t.body(&rev).is_some())
                    .map(|t| doc_json(id, t, &rev, false))
            });
            match found {
                Some(doc) => json!({"ok": doc}),
                None => json!({"missing": w}),
            }
        })
        .collect();
    reply(200, Value::Array(rows))
}

fn all_docs(cluster: &Arc<Cluster>, db: &str, r: &WireRequest, body: Option<Value>) -> WireReply {
    let include = flag(r, "include_docs");
    let conflicts = flag(r, "conflicts");
    if let Some(keys) = body
        .as_ref()
        .and_then(|b| b.get("keys"))
        .and_then(Value::as_array)
    {
        let rq = quorum(r, cluster, "r");
        let rows: Vec<Value> = keys
            .iter()
            .map(|k| {
                let id = k.as_str().unwrap_or_default();
                match cluster.read_doc(db, id, rq) {
                    None => json!({"key": id, "error": "not_found"}),
                    Some((tree, _)) => {
                        let Some(w) = tree.winner() else {
                            return json!({"key": id, "error": "not_found"});
                        };
                        if tree.is_deleted(&w) {
                            json!({"id": id, "key": id, "value": {"rev": w.to_string(), "deleted": true}, "doc": null})
                        } else {
                            let mut row = json!({"id": id, "key": id, "value": {"rev": w.to_string()}});
                            if include {
                                row["doc"] = doc_json(id, &tree, &w, conflicts);
                            }
                            row
                        }
                    }
                }
            })
            .collect();
        return reply(
            200,
            json!({"total_rows": rows.len(), "offset": 0, "rows": rows}),
        );
    }
    let start = json_param(r, "startkey");
    let end = json_param(r, "endkey");
    let shards = cluster.shard_copies(db);
    let start = start.as_ref().and_then(Value::as_str).map(str::to_owned);
    let end = end.as_ref().and_then(Value::as_str).map(str::to_owned);
    let mut rows: Vec<(String, Value)> = Vec::new();
    cluster.scan(db, &shards, |id, e, _| {
        let in_range =
            start.as_deref().is_none_or(|s| id >= s) && end.as_deref().is_none_or(|s| id <= s);
        if !in_range || !e.tree.live() {
            return;
        }
        let w = e.tree.winner().expect("live");
        let mut row = json!({"id": id, "key": id, "value": {"rev": w.to_string()}});
        if include {
            row["doc"] = doc_json(id, &e.tree, &w, conflicts);
        }
        rows.push((id.to_owned(), row));
    });
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let rows: Vec<Value> = rows.into_iter().map(|(_, r)| r).collect();
    reply(
        200,
        json!({"total_rows": rows.len(), "offset": 0, "rows": rows}),
    )
}

fn query_view(
    cluster: &Arc<Cluster>,
    db: &str,
    ddoc: &str,
    view: &str,
    r: &WireRequest,
    body: Option<Value>,
) -> WireReply {
    let shards = cluster.shard_copies(db);
    let include = flag(r, "include_docs");
    let conflicts = flag(r, "conflicts");
    let Some(mut rows) = cluster.view_rows(db, &shards, ddoc, view, include, conflicts) else {
        return not_found("missing_named_view");
    };
    let total = rows.len();
    rows.sort_by(|a, b| views::collate(&a.0, &b.0).then_with(|| a.1.cmp(&b.1)));
    let descending = flag(r, "descending");
    if descending {
        rows.reverse();
    }
    let key = json_param(r, "key");
    let keys: Option<Vec<Value>> = body
        .as_ref()
        .and_then(|b| b.get("keys"))
        .and_then(Value::as_array)
        .cloned();
    let start = json_param(r, "startkey");
    let end = json_param(r, "endkey");
    let start_id = r.param("startkey_docid").map(str::to_owned);
    let inclusive_end = r.param("inclusive_end") != Some("false");
    let before = |a: &Value, b: &Value| {
        let o = views::collate(a, b);
        if descending {
            o.reverse()
        } else {
            o
        }
    };
    rows.retain(|(k, id, _, _)| {
        if let Some(key) = &key {
            if views::collate(k, key) != std::cmp::Ordering::Equal {
                return false;
            }
        }
        if let Some(s) = &start {
            match before(k, s) {
                std::cmp::Ordering::Less => return false,
                std::cmp::Ordering::Equal => {
                    if let Some(sid) = &start_id {
                        if id < sid {
                            return false;
                        }
                    }
                }
                std::cmp::Ordering::Greater => {}
            }
        }
        if let Some(e) = &end {
            match before(k, e) {
                std::cmp::Ordering::Greater => return false,
                std::cmp::Ordering::Equal if !inclusive_end => return false,
                _ => {}
            }
        }
        true
    });
    if let Some(keys) = &keys {
        let mut ordered = Vec::new();
        for k in keys {
            ordered.extend(
                rows.iter()
                    .filter(|(rk, ..)| views::collate(rk, k) == std::cmp::Ordering::Equal)
                    .cloned(),
            );
        }
        rows = ordered;
    }
    let reduce = r.param("reduce") != Some("false");
    let skip: usize = r.param("skip").and_then(|s| s.parse().ok()).unwrap_or(0);
    let limit: usize = r
        .param("limit")
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX);
    if reduce {
        let level: Option<usize> = if flag(r, "group") {
            None
        } else {
            r.param("group_level").and_then(|l| l.parse().ok())
        };
        let grouped = flag(r, "group") || level.is_some();
        let reducer = views::reducer(ddoc, view);
        let out: Vec<Value> = if grouped {
            let mut groups: Vec<(Value, Vec<&Value>)> = Vec::new();
            for (k, _, v, _) in &rows {
                let g = views::group_key(k, level);
                match groups.last_mut() {
                    Some((gk, vs)) if views::collate(gk, &g) == std::cmp::Ordering::Equal => {
                        vs.push(v)
                    }
                    _ => groups.push((g, vec![v])),
                }
            }
            groups
                .into_iter()
                .skip(skip)
                .take(limit)
                .map(|(k, vs)| json!({"key": k, "value": views::reduce(reducer, &vs)}))
                .collect()
        } else if rows.is_empty() {
            Vec::new()
        } else {
            let vs: Vec<&Value> = rows.iter().map(|(_, _, v, _)| v).collect();
            vec![json!({"key": null, "value": views::reduce(reducer, &vs)})]
        };
        return reply(200, json!({"rows": out}));
    }
    let out: Vec<Value> = rows
        .into_iter()
        .skip(skip)
        .take(limit)
        .map(|(k, id, v, doc)| {
            let mut row = json!({"id": id, "key": k, "value": v});
            if let Some(doc) = doc {
                row["doc"] = doc;
            }
            row
        })
        .collect();
    reply(
        200,
        json!({"total_rows": total, "offset": skip, "rows": out}),
    )
}

/// A `since` the simulation hands out: per shard, the node read and its sequence there.
fn parse_since(since: Option<&str>) -> BTreeMap<u64, (usize, u64)> {
    let mut out = BTreeMap::new();
    let Some(s) = since else { return out };
    let Some(rest) = s.strip_prefix("sim:") else {
        return out;
    };
    for part in rest.split(',') {
        let mut it = part.split('.');
        if let (Some(shard), Some(node), Some(seq)) = (it.next(), it.next(), it.next()) {
            if let (Ok(shard), Ok(node), Ok(seq)) = (shard.parse(), node.parse(), seq.parse()) {
                out.insert(shard, (node, seq));
            }
        }
    }
    out
}

async fn changes(
    cluster: &Arc<Cluster>,
    db: &str,
    r: &WireRequest,
    body: Option<Value>,
) -> WireReply {
    let longpoll = r.param("feed") == Some("longpoll");
    let timeout = r
        .param("timeout")
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(60), Duration::from_millis);
    let deadline = tokio::time::Instant::now() + timeout;
    let include = flag(r, "include_docs");
    let conflicts = flag(r, "conflicts");
    let limit: usize = r
        .param("limit")
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX);
    let view = r
        .param("view")
        .and_then(|v| v.split_once('/'))
        .map(|(d, v)| (d.to_owned(), v.to_owned()));
    let doc_ids: Option<Vec<String>> = body
        .as_ref()
        .and_then(|b| b.get("doc_ids"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        });
    let shards = cluster.shard_copies(db);
    let now_seqs = || -> BTreeMap<u64, (usize, u64)> {
        let s = cluster.lock();
        shards
            .iter()
            .map(|(shard, node)| {
                let seq = s.dbs.get(db).map_or(0, |d| d.copies[*node].seq);
                (*shard, (*node, seq))
            })
            .collect()
    };
    let since = match r.param("since") {
        Some("now") => now_seqs(),
        other => parse_since(other),
    };
    loop {
        let notified = cluster.changed.notified();
        let mut rows: Vec<(u64, u64, String, DocEntry)> = Vec::new();
        cluster.scan(db, &shards, |id, e, shard| {
            let node = shards.iter().find(|s| s.0 == shard).map_or(0, |s| s.1);
            // Since a sequence of another copy: from the start of this one (CouchDB may replay).
            let from = match since.get(&shard) {
                Some((n, seq)) if *n == node => *seq,
                _ => 0,
            };
            if e.seq > from {
                rows.push((shard, e.seq, id.to_owned(), e.clone()));
            }
        });
        rows.sort_by_key(|a| (a.1, a.0));
        let mut last: BTreeMap<u64, (usize, u64)> = since.clone();
        for (shard, node) in &shards {
            last.entry(*shard).or_insert((*node, 0));
            if let Some(e) = last.get_mut(shard) {
                if e.0 != *node {
                    *e = (*node, 0);
                }
            }
        }
        let mut results = Vec::new();
        for (shard, seq, id, e) in rows {
            if results.len() >= limit {
                break;
            }
            let node = shards.iter().find(|s| s.0 == shard).map_or(0, |s| s.1);
            last.insert(shard, (node, seq));
            let Some(w) = e.tree.winner() else { continue };
            let deleted = e.tree.is_deleted(&w);
            let doc = doc_json(&id, &e.tree, &w, true);
            if let Some(ids) = &doc_ids {
                if !ids.contains(&id) {
                    continue;
                }
            }
            if let Some((d, v)) = &view {
                if deleted || views::map(d, v, &doc).is_none_or(|rows| rows.is_empty()) {
                    continue;
                }
            }
            let mut row =
                json!({"seq": seq_string(&last), "id": id, "changes": [{"rev": w.to_string()}]});
            if deleted {
                row["deleted"] = json!(true);
            }
            if include {
                let mut doc = doc;
                if !conflicts {
                    if let Some(o) = doc.as_object_mut() {
                        o.remove("_conflicts");
                    }
                }
                row["doc"] = doc;
            }
            results.push(row);
        }
        if !results.is_empty() || !longpoll || tokio::time::Instant::now() >= deadline {
            let mut m = Map::new();
            m.insert("results".into(), Value::Array(results));
            m.insert("last_seq".into(), json!(seq_string(&last)));
            m.insert("pending".into(), json!(0));
            return reply(200, Value::Object(m));
        }
        tokio::select! {
            biased;
            () = notified => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

fn seq_string(last: &BTreeMap<u64, (usize, u64)>) -> String {
    let parts: Vec<String> = last
        .iter()
        .map(|(shard, (node, seq))| format!("{shard}.{node}.{seq}"))
        .collect();
    format!("sim:{}", parts.join(","))
}
