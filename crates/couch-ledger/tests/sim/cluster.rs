//! A simulated CouchDB 3.4 cluster: `n` nodes, each holding a copy of every document with a
//! revision tree of its own (`tree.rs`), written and read through a coordinator with write and
//! read quorums, copies caught up by internal replication after seeded delays, views and
//! `_changes` answered from one copy of each shard range, and nodes that stop and come back.
//!
//! Where what CouchDB does is not pinned down (the order copies apply two coordinators' writes,
//! which copy a view reads, how long replication takes, whose conflicts a quorum read shows) the
//! model picks with the seed, and leans toward what makes a client's life harder: a read shows
//! the conflicts of one copy only, a view may read a copy that lags, a write answered `202` may
//! still have reached every copy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use couch_ledger::testing::WireRequest;

use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::sim::tree::{Rev, Tree};

/// The knobs of one simulated cluster (chosen by the seed).
#[derive(Debug, Clone)]
pub struct Config {
    pub nodes: usize,
    /// Shard ranges of a database (views and `_changes` read one copy of each).
    pub q: u64,
    pub default_w: usize,
    pub default_r: usize,
    /// Internal replication of a write to another copy: a delay in this range (ms).
    pub repl_ms: (u64, u64),
    /// One write in this many reaches a copy late (10–60 ms) instead of within 3 ms.
    pub slow_copy_one_in: u32,
    /// One write in this many (0: none) reaches a copy only after the coordinator stopped
    /// waiting for it ([`PATIENCE_MS`]): answered 202 though no rival wrote, the copy taking it
    /// (or refusing it for a rival's that came first) a moment later — a cluster under load.
    pub late_copy_one_in: u32,
    /// How late such a copy takes the write, at most (ms past the coordinator's patience).
    pub late_copy_ms: u64,
    /// Whether a process may die after one of its account writes (off once the run heals).
    pub process_crashes: bool,
    /// Per mille of requests answered 503 before anything is done.
    pub transient_permille: u32,
    /// Per mille of requests whose answer is lost after the server acted on them (the client
    /// times out).
    pub lost_reply_permille: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nodes: 3,
            q: 2,
            default_w: 2,
            default_r: 2,
            repl_ms: (5, 400),
            slow_copy_one_in: 10,
            late_copy_one_in: 0,
            late_copy_ms: 1500,
            process_crashes: true,
            transient_permille: 0,
            lost_reply_permille: 0,
        }
    }
}

/// How long a coordinator waits for the copies of a write before it answers with those that
/// took it (202 below `w`).
pub const PATIENCE_MS: u64 = 100;

/// What happened, for the summary line and for a seed's report.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub requests: u64,
    pub writes_accepted: u64,
    pub node_restarts: u64,
    /// Leaves planted as new roots by replication: a copy that missed more than `_revs_limit`
    /// writes coming back (a conflict nobody wrote).
    pub stemmed_branches: u64,
    pub lost_replies: u64,
    pub transient_errors: u64,
    /// A digest of every request and answer: the same seed gives the same digest.
    pub trace: u64,
}

#[derive(Debug, Clone, Default)]
pub struct DocEntry {
    pub tree: Tree,
    /// The copy's sequence number of this document's last change.
    pub seq: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Copy {
    pub docs: BTreeMap<String, DocEntry>,
    pub seq: u64,
    /// Per view (`ddoc/view`), per document: the rows its map emitted for the document as it
    /// was at that sequence (an index, brought up to date at each query).
    pub index: BTreeMap<String, ViewIndex>,
}

/// One view's index on one copy: per document, the sequence it was mapped at and its rows.
pub type ViewIndex = BTreeMap<String, (u64, Vec<(Value, Value)>)>;

/// A view's rows as one query sees them: key, document id, value, and the document when asked.
pub type Row = (Value, String, Value, Option<Value>);

#[derive(Debug, Clone)]
pub struct Db {
    pub copies: Vec<Copy>,
    pub q: u64,
    pub revs_limit: usize,
    pub security: Value,
    pub local: BTreeMap<String, Value>,
}

#[derive(Debug, Clone)]
pub struct NodeState {
    pub up: bool,
    pub changed_at: Instant,
}

pub struct State {
    pub config: Config,
    pub dbs: BTreeMap<String, Db>,
    pub nodes: Vec<NodeState>,
    pub rng: fastrand::Rng,
    pub stats: Stats,
    uuids: u64,
    /// Documents a copy neither takes nor shows nor exchanges with the others, by database,
    /// id and node: a steered run's way to let copies of one document diverge while the rest
    /// of the database stays in step (as late writes and a slow internal replication may).
    cut: BTreeSet<(String, String, usize)>,
}

/// The cluster, shared by every simulated process.
pub struct Cluster {
    state: Mutex<State>,
    /// Woken by every change (longpoll `_changes`).
    pub changed: Notify,
    /// Shown every request a node acted on, before its answer goes back: a run times a fault
    /// with what the processes write through it.
    watcher: Mutex<Option<Watcher>>,
}

/// What a run's [`Cluster::watch`] calls.
pub type Watcher = Arc<dyn Fn(&WireRequest) + Send + Sync>;

/// One document's outcome on one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyWrite {
    Ok(Rev),
    Conflict,
    Forbidden,
    /// The copy is cut off from the document ([`Cluster::cut`]): no answer.
    Silent,
}

/// A document to write, as a request gave it.
#[derive(Debug, Clone)]
pub struct DocWrite {
    pub id: String,
    pub parent: Option<Rev>,
    pub deleted: bool,
    pub body: Value,
}

impl Cluster {
    pub fn new(config: Config, seed: u64) -> Arc<Cluster> {
        let now = Instant::now();
        let nodes = (0..config.nodes)
            .map(|_| NodeState {
                up: true,
                changed_at: now,
            })
            .collect();
        Arc::new(Cluster {
            state: Mutex::new(State {
                config,
                dbs: BTreeMap::new(),
                nodes,
                rng: fastrand::Rng::with_seed(seed),
                stats: Stats::default(),
                uuids: 0,
                cut: BTreeSet::new(),
            }),
            changed: Notify::new(),
            watcher: Mutex::new(None),
        })
    }

    /// Shows every request a node acts on from now on to `watcher` (none: to nobody).
    pub fn watch(&self, watcher: Option<Watcher>) {
        *self.watcher.lock().unwrap_or_else(|e| e.into_inner()) = watcher;
    }

    /// Cuts node `node`'s copy of `id` in `db` off: it takes no write of the document, shows
    /// it to no read, exchanges it with no other copy, until [`Cluster::join`].
    pub fn cut(&self, db: &str, id: &str, node: usize) {
        self.lock().cut.insert((db.to_owned(), id.to_owned(), node));
    }

    /// Ends a [`Cluster::cut`]: the copy and the others exchange the document at once.
    pub fn join(&self, db: &str, id: &str, node: usize) {
        let n = {
            let mut s = self.lock();
            s.cut.remove(&(db.to_owned(), id.to_owned(), node));
            s.config.nodes
        };
        for other in (0..n).filter(|o| *o != node) {
            self.sync_now(db, id, other, node);
            self.sync_now(db, id, node, other);
        }
    }

    /// Ends every [`Cluster::cut`].
    pub fn join_all(&self) {
        let cut: Vec<(String, String, usize)> = self.lock().cut.iter().cloned().collect();
        for (db, id, node) in cut {
            self.join(&db, &id, node);
        }
    }

    /// Whether some copy of `db` lacks document `id` now.
    pub fn some_copy_lacks(&self, db: &str, id: &str) -> bool {
        self.lock()
            .dbs
            .get(db)
            .is_some_and(|d| d.copies.iter().any(|c| !c.docs.contains_key(id)))
    }

    /// The watcher, if a run set one.
    pub fn watcher(&self) -> Option<Watcher> {
        self.watcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    /// Folds `bytes` into the trace digest.
    pub fn trace(&self, bytes: &[u8]) {
        let mut s = self.lock();
        let mut h = s.stats.trace ^ 0x9e37_79b9_7f4a_7c15;
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        s.stats.trace = h;
    }

    // ---- nodes ----------------------------------------------------------------------------

    pub fn node_up(&self, node: usize) -> bool {
        self.lock().nodes[node].up
    }

    pub fn stop_node(&self, node: usize) {
        let mut s = self.lock();
        if s.nodes[node].up {
            s.nodes[node] = NodeState {
                up: false,
                changed_at: Instant::now(),
            };
        }
    }

    /// Starts a node again; its copies catch up from the others (and they from it) over the
    /// next seconds, document by document.
    pub fn start_node(self: &Arc<Self>, node: usize) {
        let pairs: Vec<(String, String, usize, usize, u64)> = {
            let mut s = self.lock();
            if s.nodes[node].up {
                return;
            }
            s.nodes[node] = NodeState {
                up: true,
                changed_at: Instant::now(),
            };
            s.stats.node_restarts += 1;
            let n = s.config.nodes;
            let mut pairs = Vec::new();
            let docs: Vec<(String, String)> = s
                .dbs
                .iter()
                .flat_map(|(db, d)| {
                    let mut ids: Vec<String> = Vec::new();
                    for c in &d.copies {
                        ids.extend(c.docs.keys().cloned());
                    }
                    ids.sort();
                    ids.dedup();
                    ids.into_iter().map(move |id| (db.clone(), id))
                })
                .collect();
            for (db, id) in docs {
                for other in (0..n).filter(|o| *o != node) {
                    let d1 = s.rng.u64(200..15_000);
                    let d2 = s.rng.u64(200..15_000);
                    pairs.push((db.clone(), id.clone(), other, node, d1));
                    pairs.push((db.clone(), id.clone(), node, other, d2));
                }
            }
            pairs
        };
        for (db, id, from, to, delay) in pairs {
            self.sync_later(db, id, from, to, delay);
        }
    }

    /// Whether a round-robin balancer sends requests to `node`: a stopped node stays in the
    /// rotation until its health check fails (a few seconds), a started one joins after its
    /// first good check.
    pub fn in_rotation(&self, node: usize) -> bool {
        let s = self.lock();
        let n = &s.nodes[node];
        let since = n.changed_at.elapsed();
        if n.up {
            since >= Duration::from_secs(2) || s.nodes.iter().all(|m| m.up)
        } else {
            since < Duration::from_secs(5)
        }
    }

    // ---- databases ------------------------------------------------------------------------

    pub fn create_db(&self, name: &str, q: Option<u64>) -> bool {
        let mut s = self.lock();
        if s.dbs.contains_key(name) {
            return false;
        }
        let n = s.config.nodes;
        let q = q.unwrap_or(s.config.q).max(1);
        s.dbs.insert(
            name.to_owned(),
            Db {
                copies: vec![Copy::default(); n],
                q,
                revs_limit: 1000,
                security: json!({}),
                local: BTreeMap::new(),
            },
        );
        true
    }

    pub fn next_uuid(&self) -> String {
        let mut s = self.lock();
        s.uuids += 1;
        let r = s.rng.u64(..);
        format!("{:016x}{:016x}", s.uuids, r)
    }

    /// Which shard range a document belongs to.
    pub fn shard_of(id: &str, q: u64) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.as_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        h % q.max(1)
    }

    // ---- writes ---------------------------------------------------------------------------

    /// Applies interactive writes to one copy, in order: what that copy answers for each.
    fn apply_on(&self, db: &str, node: usize, docs: &[DocWrite], admin: bool) -> Vec<CopyWrite> {
        let mut out = Vec::with_capacity(docs.len());
        let mut s = self.lock();
        if !s.nodes[node].up {
            return Vec::new();
        }
        let cut: BTreeSet<String> = s
            .cut
            .iter()
            .filter(|(d, _, n)| d == db && *n == node)
            .map(|(_, id, _)| id.clone())
            .collect();
        let Some(d) = s.dbs.get_mut(db) else {
            return Vec::new();
        };
        let limit = d.revs_limit;
        let copy = &mut d.copies[node];
        for w in docs {
            if cut.contains(&w.id) {
                out.push(CopyWrite::Silent);
                continue;
            }
            if w.deleted && !admin {
                // The ledger's validation lets only an admin delete a ledger document.
                out.push(CopyWrite::Forbidden);
                continue;
            }
            let entry = copy.docs.entry(w.id.clone()).or_default();
            match entry
                .tree
                .update(w.parent.as_ref(), w.deleted, w.body.clone(), limit)
            {
                Ok(rev) => {
                    copy.seq += 1;
                    entry.seq = copy.seq;
                    tracing::debug!(target: "sim", node, id = %w.id, leaves = %leaves_text(&entry.tree), "copy wrote");
                    out.push(CopyWrite::Ok(rev));
                }
                Err(_) => {
                    tracing::debug!(target: "sim", node, id = %w.id, parent = ?w.parent.as_ref().map(|r| r.pos), "copy refused");
                    if entry.tree.is_empty() {
                        copy.docs.remove(&w.id);
                    }
                    out.push(CopyWrite::Conflict);
                }
            }
        }
        drop(s);
        self.changed.notify_waiters();
        out
    }

    /// Coordinates interactive writes: every copy gets them after a short seeded delay, in its
    /// own order among other requests; the answer waits for `w` copies per document (or for
    /// every copy that answers), and the copies still on their way apply afterwards. Per
    /// document: `Ok(rev, quorum)` with whether `w` copies took it, or the refusal.
    pub async fn write(
        self: &Arc<Self>,
        db: &str,
        docs: Vec<DocWrite>,
        w: usize,
        admin: bool,
    ) -> Vec<Result<(Rev, bool), CopyWrite>> {
        let (order, repl) = {
            let mut s = self.lock();
            let n = s.config.nodes;
            let slow = s.config.slow_copy_one_in.max(1);
            let late = s.config.late_copy_one_in;
            let late_ms = s.config.late_copy_ms.max(11);
            let mut delays: Vec<(u64, usize)> = (0..n)
                .map(|node| {
                    let ms = if late > 0 && s.rng.u32(..late) == 0 {
                        s.rng.u64(PATIENCE_MS + 10..PATIENCE_MS + late_ms)
                    } else if s.rng.u32(..slow) == 0 {
                        s.rng.u64(10..60)
                    } else {
                        s.rng.u64(0..=3)
                    };
                    (ms, node)
                })
                .collect();
            delays.sort();
            (delays, s.config.repl_ms)
        };
        let docs = Arc::new(docs);
        let mut oks: Vec<Vec<Rev>> = vec![Vec::new(); docs.len()];
        let mut refusals: Vec<Vec<CopyWrite>> = vec![Vec::new(); docs.len()];
        let started = Instant::now();
        let mut answered = 0;
        for (i, (ms, node)) in order.iter().enumerate() {
            if *ms > PATIENCE_MS && i > 0 {
                tokio::time::sleep_until(started + Duration::from_millis(PATIENCE_MS)).await;
                break;
            }
            tokio::time::sleep_until(started + Duration::from_millis(*ms)).await;
            let results = self.apply_on(db, *node, &docs, admin);
            self.replicate_after_write(db, *node, &docs, &results, repl);
            for (k, r) in results.into_iter().enumerate() {
                match r {
                    CopyWrite::Ok(rev) => oks[k].push(rev),
                    CopyWrite::Silent => {}
                    other => refusals[k].push(other),
                }
            }
            answered = i + 1;
            if oks.iter().all(|o| o.len() >= w) {
                break;
            }
        }
        // The copies not waited for take the writes later.
        for (ms, node) in order.iter().skip(answered).cloned() {
            let cluster = Arc::clone(self);
            let db = db.to_owned();
            let docs = Arc::clone(&docs);
            tokio::spawn(async move {
                tokio::time::sleep_until(started + Duration::from_millis(ms)).await;
                let results = cluster.apply_on(&db, node, &docs, admin);
                cluster.replicate_after_write(&db, node, &docs, &results, repl);
            });
        }
        oks.into_iter()
            .zip(refusals)
            .map(|(ok, refused)| match ok.first() {
                Some(rev) => Ok((rev.clone(), ok.len() >= w)),
                None if refused.contains(&CopyWrite::Forbidden) => Err(CopyWrite::Forbidden),
                None => Err(CopyWrite::Conflict),
            })
            .collect()
    }

    fn replicate_after_write(
        self: &Arc<Self>,
        db: &str,
        node: usize,
        docs: &[DocWrite],
        results: &[CopyWrite],
        (lo, hi): (u64, u64),
    ) {
        let n = self.lock().config.nodes;
        for (d, r) in docs.iter().zip(results) {
            if !matches!(r, CopyWrite::Ok(_)) {
                continue;
            }
            for other in (0..n).filter(|o| *o != node) {
                let delay = self.lock().rng.u64(lo..=hi);
                self.sync_later(db.to_owned(), d.id.clone(), node, other, delay);
            }
        }
    }

    /// Internal replication of one document from one copy to another, after `delay_ms`. Lost
    /// when either node is down then (a restart catches up everything).
    pub fn sync_later(
        self: &Arc<Self>,
        db: String,
        id: String,
        from: usize,
        to: usize,
        delay_ms: u64,
    ) {
        let cluster = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            cluster.sync_now(&db, &id, from, to);
        });
    }

    /// Merges every leaf of `id` on `from` into `to` (both up).
    pub fn sync_now(&self, db: &str, id: &str, from: usize, to: usize) -> bool {
        let changed = {
            let mut s = self.lock();
            if !s.nodes[from].up || !s.nodes[to].up {
                return false;
            }
            if [from, to]
                .iter()
                .any(|n| s.cut.contains(&(db.to_owned(), id.to_owned(), *n)))
            {
                return false;
            }
            let Some(d) = s.dbs.get_mut(db) else {
                return false;
            };
            let limit = d.revs_limit;
            let Some(paths) = d.copies[from].docs.get(id).map(|e| e.tree.leaf_paths()) else {
                return false;
            };
            let copy = &mut d.copies[to];
            let entry = copy.docs.entry(id.to_owned()).or_default();
            let before = entry.tree.leaves().len();
            let mut changed = false;
            let mut planted = 0;
            for p in &paths {
                let had_any = p.revs.iter().any(|(r, _)| entry.tree.contains(r));
                if entry.tree.merge(p, limit) {
                    changed = true;
                    if !had_any && before > 0 {
                        planted += 1;
                    }
                }
            }
            if changed {
                copy.seq += 1;
                entry.seq = copy.seq;
                tracing::debug!(target: "sim", from, to, %id, leaves = %leaves_text(&entry.tree), "copy synced");
            }
            s.stats.stemmed_branches += planted;
            changed
        };
        if changed {
            self.changed.notify_waiters();
        }
        changed
    }

    /// Replicates every document between every pair of live copies until they agree (the
    /// end of a run, once every node is up).
    pub fn converge(&self) {
        loop {
            let mut changed = false;
            let work: Vec<(String, String)> = {
                let s = self.lock();
                s.dbs
                    .iter()
                    .flat_map(|(db, d)| {
                        let mut ids: Vec<String> = d
                            .copies
                            .iter()
                            .flat_map(|c| c.docs.keys().cloned())
                            .collect();
                        ids.sort();
                        ids.dedup();
                        ids.into_iter().map(move |id| (db.clone(), id))
                    })
                    .collect()
            };
            let n = self.lock().config.nodes;
            for (db, id) in &work {
                for from in 0..n {
                    for to in 0..n {
                        if from != to && self.sync_now(db, id, from, to) {
                            changed = true;
                        }
                    }
                }
            }
            if !changed {
                return;
            }
        }
    }

    // ---- reads ----------------------------------------------------------------------------

    /// The copies a quorum read of `id` in `db` asks: `r` live ones at random (all live ones
    /// if fewer), none cut off from the document.
    pub fn read_copies(&self, db: &str, id: &str, r: usize) -> Vec<usize> {
        let mut s = self.lock();
        let mut live: Vec<usize> = (0..s.config.nodes)
            .filter(|n| s.nodes[*n].up && !s.cut.contains(&(db.to_owned(), id.to_owned(), *n)))
            .collect();
        s.rng.shuffle(&mut live);
        live.truncate(r.max(1));
        live
    }

    /// A quorum read of one document: the reply whose winner wins, with that copy's own
    /// conflicts; the copies read are repaired toward each other a moment later when they
    /// disagree. `None` when no copy read holds it.
    pub fn read_doc(self: &Arc<Self>, db: &str, id: &str, r: usize) -> Option<(Tree, usize)> {
        let copies = self.read_copies(db, id, r);
        let (best, disagree) = {
            let s = self.lock();
            let d = s.dbs.get(db)?;
            let found: Vec<(usize, &Tree)> = copies
                .iter()
                .filter_map(|c| d.copies[*c].docs.get(id).map(|e| (*c, &e.tree)))
                .collect();
            let best = found
                .iter()
                .filter_map(|(c, t)| t.winner().map(|w| (*c, *t, w)))
                .max_by(|a, b| {
                    let key =
                        |(_, t, w): &(usize, &Tree, Rev)| (!t.is_deleted(w), w.pos, w.hash.clone());
                    key(a).cmp(&key(b))
                })
                .map(|(c, t, _)| (t.clone(), c));
            let disagree = found.len() > 1 && !found.windows(2).all(|p| p[0].1.same_as(p[1].1));
            for (c, t) in &found {
                tracing::debug!(target: "sim", node = c, %id, leaves = %leaves_text(t), "copy read");
            }
            let read: Vec<usize> = found.iter().map(|(c, _)| *c).collect();
            (best, disagree.then_some(read))
        };
        if let Some(read) = disagree {
            for a in &read {
                for b in &read {
                    if a != b {
                        let delay = self.lock().rng.u64(1..50);
                        self.sync_later(db.to_owned(), id.to_owned(), *a, *b, delay);
                    }
                }
            }
        }
        best
    }

    /// For views and `_changes`: one live copy for each shard range.
    pub fn shard_copies(&self, db: &str) -> Vec<(u64, usize)> {
        let mut s = self.lock();
        let q = s.dbs.get(db).map_or(1, |d| d.q);
        let live: Vec<usize> = (0..s.config.nodes).filter(|n| s.nodes[*n].up).collect();
        (0..q)
            .map(|shard| {
                let pick = if live.is_empty() {
                    0
                } else {
                    live[s.rng.usize(..live.len())]
                };
                (shard, pick)
            })
            .collect()
    }

    /// Calls `f` with every document of `db` on the copies `shards` picks (id, entry, shard).
    pub fn scan(&self, db: &str, shards: &[(u64, usize)], mut f: impl FnMut(&str, &DocEntry, u64)) {
        let s = self.lock();
        let Some(d) = s.dbs.get(db) else {
            return;
        };
        for (shard, node) in shards {
            for (id, e) in &d.copies[*node].docs {
                if Cluster::shard_of(id, d.q) == *shard {
                    f(id, e, *shard);
                }
            }
        }
    }

    /// A view's rows over the copies `shards` picks, each copy's index brought up to date
    /// first; `None` when the simulation has no such view. With `docs`, each row carries its
    /// document (with `_conflicts` when `conflicts`).
    pub fn view_rows(
        &self,
        db: &str,
        shards: &[(u64, usize)],
        ddoc: &str,
        view: &str,
        docs: bool,
        conflicts: bool,
    ) -> Option<Vec<Row>> {
        crate::sim::views::map(ddoc, view, &Value::Null)?;
        let name = format!("{ddoc}/{view}");
        let mut s = self.lock();
        let d = s.dbs.get_mut(db)?;
        let q = d.q;
        let mut out = Vec::new();
        for (shard, node) in shards {
            let copy = &mut d.copies[*node];
            let index = copy.index.entry(name.clone()).or_default();
            for (id, e) in &copy.docs {
                if Cluster::shard_of(id, q) != *shard {
                    continue;
                }
                let fresh = index.get(id).is_some_and(|(seq, _)| *seq == e.seq);
                if !fresh {
                    let rows = match e.tree.winner() {
                        Some(w) if !e.tree.is_deleted(&w) => {
                            let doc = doc_json(id, &e.tree, &w, true);
                            crate::sim::views::map(ddoc, view, &doc).unwrap_or_default()
                        }
                        _ => Vec::new(),
                    };
                    index.insert(id.clone(), (e.seq, rows));
                }
                let (_, rows) = &index[id];
                if rows.is_empty() {
                    continue;
                }
                let doc = docs.then(|| {
                    let w = e.tree.winner().expect("a document with rows has a winner");
                    doc_json(id, &e.tree, &w, conflicts)
                });
                for (k, v) in rows {
                    out.push((k.clone(), id.clone(), v.clone(), doc.clone()));
                }
            }
        }
        Some(out)
    }
}

/// A leaf's body as a client gets it: `_id`, `_rev`, and `_conflicts` when asked and any.
/// One copy's leaves of a document, for the copy-level log (`SIM_LOG=sim=debug`): each leaf's
/// revision, whether deleted, and the fields that tell a ledger document's state (a transfer's
/// `state` and `markers`, an account's `pending` and its entries of the transfers it holds).
pub fn leaves_text(tree: &Tree) -> String {
    tree.leaves()
        .iter()
        .map(|rev| {
            let body = tree.body(rev).unwrap_or_default();
            let pick = |k: &str| body.get(k).map(|v| format!(" {k}={v}")).unwrap_or_default();
            let txns: Vec<&str> = body
                .get("pending")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("txn").and_then(Value::as_str))
                .collect();
            let entries: Vec<String> = body
                .get("settled")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|e| {
                    e.get("txn").and_then(Value::as_str).is_some_and(|t| {
                        txns.contains(&t) || e.get("undone").is_some_and(|u| u == true)
                    })
                })
                .map(Value::to_string)
                .collect();
            format!(
                "[{}.{}{}{}{}{}{}]",
                rev.pos,
                &rev.hash[..rev.hash.len().min(6)],
                if tree.is_deleted(rev) { " deleted" } else { "" },
                pick("state"),
                pick("markers"),
                pick("pending"),
                if entries.is_empty() {
                    String::new()
                } else {
                    format!(" entries={}", entries.join(","))
                },
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn doc_json(id: &str, tree: &Tree, rev: &Rev, conflicts: bool) -> Value {
    let mut body: Map<String, Value> = tree
        .body(rev)
        .and_then(|b| b.as_object().cloned())
        .unwrap_or_default();
    body.insert("_id".into(), json!(id));
    body.insert("_rev".into(), json!(rev.to_string()));
    if tree.is_deleted(rev) {
        body.insert("_deleted".into(), json!(true));
    }
    if conflicts {
        let c: Vec<String> = tree.conflicts().iter().map(Rev::to_string).collect();
        if !c.is_empty() {
            body.insert("_conflicts".into(), json!(c));
        }
    }
    Value::Object(body)
}
