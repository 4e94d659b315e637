//! Conflicts on every ledger document type at every protocol step: sibling revisions
//! are planted as a cluster's concurrent writers or a replication would leave them (a
//! `_bulk_docs` with `"new_edits": false`, `support::plant_sibling`), then the sweeper runs and
//! the ledger must be whole again:
//!
//! - `verify` at rest is ok (conservation, exactly-once, no marker, no conflict left);
//! - every account's balance is its opening plus what the transfers' final states say (each
//!   committed or done transfer counted exactly once, a cancelled one not at all);
//! - the losing revisions are gone: `?conflicts=true` shows no `_conflicts`, and
//!   `?open_revs=all` one live leaf.
//!
//! Write-once order entries are the exception: an identical body cannot conflict (the same
//! revision id), and a different body under one id is reported (by `verify`, by the sweeper,
//! by the call that meets it), never resolved by picking one.
//!
//! CouchDB picks the winner among leaves by the highest generation, then the greatest revision
//! hash: a sibling planted as `N-ffff…` wins over the ledger's own revision, `N-0000…` loses.
//! Account merges are tried both ways.
//!
//! Every ledger here keeps the settled entries a cluster keeps (`LedgerBuilder::settled_entries`),
//! also on a single node, which keeps none and reports an account conflict instead of merging
//! it (docs/ONE_WRITE.md, "Conflicts on one copy"; `tests/one_write.rs`).
//!
//! The transfers are stepped (`Ledger::step`) by a worker with a short lease, so that the
//! sweeper may take them over once it ran out; the tests wait for that (a condition with a
//! deadline), then sweep.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::support;
use couch_ledger::testing::{entry_key, transfer_of};
use couch_ledger::{
    AccountSpec, Amount, Currency, Ledger, Payment, Purchase, RecordStatus, State, SweepOptions,
    SweepOutcome, TransferRequest, VerifyOptions,
};

/// The stepping worker's lease: short, so the sweeper may take its transfers over soon, and
/// long enough (its drive stops 1/6 of it before the end) for one step on a busy machine.
const STEP_LEASE: Duration = Duration::from_millis(3_000);

/// Which way CouchDB's deterministic pick goes for a planted sibling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Planted {
    /// `N-ffff…`: greater than any revision hash the server makes.
    Wins,
    /// `N-0000…`: smaller than any.
    Loses,
}

impl Planted {
    fn hash(self) -> String {
        match self {
            Planted::Wins => "f".repeat(32),
            Planted::Loses => "0".repeat(32),
        }
    }
}

fn eur() -> Currency {
    Currency::from_code("EUR").unwrap()
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn enc(id: &str) -> String {
    id.replace(':', "%3A")
}

/// The key of transfer `id`'s markers and entries on its accounts (`id~digest` of its terms:
/// `value` EUR from `from` to `to`), as the ledger stores them.
fn key(id: &str, from: &str, to: &str, value: i64) -> String {
    entry_key(id, from, to, Amount::new(value).unwrap(), "EUR", None)
}

/// One test's ledger: a database of its own, accounts with their openings, the transfers.
struct World {
    /// The stepping worker (short lease).
    l: Ledger,
    db: String,
    openings: BTreeMap<String, i64>,
    transfers: Vec<String>,
}

impl World {
    async fn new(test: &str, accounts: &[(&str, i64)]) -> World {
        // A cluster's conflicts, planted: the entries a cluster keeps, on any server.
        let l = support::ledger_with(test, |b| b.settled_entries().lease(STEP_LEASE)).await;
        let db = l.client().database().to_owned();
        let mut openings = BTreeMap::new();
        for (id, opening) in accounts {
            l.create_account(AccountSpec {
                account_id: (*id).into(),
                currency: eur(),
                opening: Amount::new(*opening).unwrap(),
                min_balance: Some(Amount::ZERO),
                meta: Default::default(),
            })
            .await
            .unwrap();
            openings.insert((*id).to_owned(), *opening);
        }
        World {
            l,
            db,
            openings,
            transfers: Vec::new(),
        }
    }

    /// Submits `id` (left in `initial`) and steps it `steps` times: 1 begin, 2 apply both
    /// accounts, 3 commit, 4 settle both, 5 done.
    async fn transfer(&mut self, id: &str, from: &str, to: &str, value: i64, steps: usize) {
        let t = self
            .l
            .submit(
                TransferRequest {
                    id: Some(id.into()),
                    source: from.into(),
                    destination: to.into(),
                    amount: Amount::new(value).unwrap(),
                    currency: eur(),
                    meta: Default::default(),
                },
                false,
            )
            .await
            .unwrap();
        assert_eq!(t.state, State::Initial);
        self.transfers.push(id.to_owned());
        let mut state = State::Initial;
        for _ in 0..steps {
            state = self.l.step(id).await.unwrap().state;
        }
        let expected = [
            State::Initial,
            State::Pending,
            State::Pending,
            State::Committed,
            State::Committed,
            State::Done,
        ][steps];
        assert_eq!(state, expected, "{id} after {steps} steps");
    }

    async fn step(&self, id: &str) -> State {
        self.l.step(id).await.unwrap().state
    }

    /// The raw document `id` (winner), without `_conflicts`.
    async fn doc(&self, id: &str) -> Value {
        raw_get(&self.db, id, "").await
    }

    /// Plants a sibling of `id`'s current revision whose body `edit` makes from the current
    /// one; returns its revision.
    async fn plant(&self, id: &str, planted: Planted, edit: impl FnOnce(&mut Value)) -> String {
        support::plant_sibling(&self.db, id, &planted.hash(), edit).await
    }

    /// Plants a sibling of `id`'s current revision with `body` (a snapshot of an earlier
    /// state, possibly edited): a writer that wrote `body` on the same parent elsewhere.
    async fn plant_body(&self, id: &str, planted: Planted, body: Value) -> String {
        self.plant(id, planted, move |doc| {
            let id = doc["_id"].clone();
            *doc = body;
            doc["_id"] = id;
            let o = doc.as_object_mut().unwrap();
            o.remove("_conflicts");
            o.remove("_revisions");
        })
        .await
    }

    /// Waits until every leaf of every transfer holds no live claim (the stepping worker's
    /// lease ran out), then runs the sweeper (`stale_after` 0) until `verify` at rest is ok
    /// and no document holds a conflict, at most `SWEEPS` passes. Returns the passes.
    async fn sweep(&self) -> Vec<SweepOutcome> {
        self.claims_run_out().await;
        const SWEEPS: usize = 4;
        let db = &self.db;
        let sweeper = self.l.another_worker();
        let mut passes = Vec::new();
        for _ in 0..SWEEPS {
            let o = sweeper
                .sweep_once(SweepOptions {
                    limit: 100,
                    stale_after: Duration::ZERO,
                })
                .await
                .unwrap();
            passes.push(o);
            let report = self.l.verify_with(VerifyOptions::at_rest()).await.unwrap();
            if report.ok && conflicted(db).await.is_empty() {
                break;
            }
        }
        passes
    }

    /// Waits until every leaf of every transfer holds no live claim (the stepping worker's
    /// lease ran out).
    async fn claims_run_out(&self) {
        let (db, ids) = (&self.db, &self.transfers);
        support::wait_for(
            "the stepping worker's claims to run out",
            Duration::from_secs(30),
            || async move {
                for id in ids {
                    for leaf in support::live_leaves(db, &format!("txn:{id}")).await {
                        let expires = leaf["claim"]["expires_at"].as_i64().unwrap_or(0);
                        if expires >= now_ms() {
                            return None;
                        }
                    }
                }
                Some(())
            },
        )
        .await;
    }

    /// The checks after the sweep: verify at rest ok; balances as the transfers' final
    /// states say; one live leaf and no `_conflicts` on every document. Returns the final
    /// state of each transfer.
    async fn assert_whole(&self, passes: &[SweepOutcome]) -> BTreeMap<String, State> {
        let report = self.l.verify_with(VerifyOptions::at_rest()).await.unwrap();
        assert!(
            report.ok,
            "verify at rest after the sweep: {report:#?}\nsweep passes: {passes:#?}"
        );
        let left = conflicted(&self.db).await;
        assert!(
            left.is_empty(),
            "losing revisions still there after the sweep: {left:?}\nsweep passes: {passes:#?}"
        );
        let mut expected = self.openings.clone();
        let mut states = BTreeMap::new();
        for id in &self.transfers {
            let t = self.l.transfer(id).await.unwrap();
            match t.state {
                State::Committed | State::Done => {
                    *expected.get_mut(&t.source).unwrap() -= t.amount.minor();
                    *expected.get_mut(&t.destination).unwrap() += t.amount.minor();
                }
                State::Cancelled => {}
                other => panic!("{id} is still {other} after the sweep: {passes:#?}"),
            }
            states.insert(id.clone(), t.state);
        }
        for (account, want) in &expected {
            let a = self.l.account(account).await.unwrap();
            assert_eq!(
                a.balance.minor(),
                *want,
                "account {account}: balance ≠ opening + what the transfers' final states say \
                 ({states:?}); sweep passes: {passes:#?}"
            );
            assert!(a.pending.is_empty(), "account {account}: {a:?}");
        }
        states
    }
}

/// GET `db/id` raw, with `query` (e.g. `?conflicts=true`).
async fn raw_get(db: &str, id: &str, query: &str) -> Value {
    let url = support::raw_url(&format!("{db}/{}{query}", enc(id)));
    let reply = support::auth(support::raw().get(url)).send().await.unwrap();
    assert!(reply.status().is_success(), "GET {id}: {}", reply.status());
    reply.json().await.unwrap()
}

/// Every non-design document of `db` that holds `_conflicts` or more than one live leaf, with
/// its leaves' revisions.
async fn conflicted(db: &str) -> BTreeMap<String, Vec<String>> {
    let all: Value = {
        let url = support::raw_url(&format!("{db}/_all_docs"));
        support::auth(support::raw().get(url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    };
    let mut out = BTreeMap::new();
    for row in all["rows"].as_array().unwrap() {
        let id = row["id"].as_str().unwrap();
        if id.starts_with("_design/") {
            continue;
        }
        let doc = raw_get(db, id, "?conflicts=true").await;
        let leaves = support::live_leaves(db, id).await;
        let conflicts = doc["_conflicts"].as_array().map_or(0, Vec::len);
        if conflicts > 0 || leaves.len() != 1 {
            out.insert(
                id.to_owned(),
                leaves
                    .iter()
                    .map(|l| l["_rev"].as_str().unwrap_or("?").to_owned())
                    .collect(),
            );
        }
    }
    out
}

/// Which revision of `id` CouchDB now shows as the winner.
async fn winner(db: &str, id: &str) -> String {
    raw_get(db, id, "").await["_rev"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Asserts that the planted sibling is the winner (or not), as the test meant it.
async fn assert_pick(w: &World, id: &str, rev: &str, planted: Planted) {
    let now = winner(&w.db, id).await;
    assert_eq!(
        now == rev,
        planted == Planted::Wins,
        "{id}: planted {rev} ({planted:?}), winner {now}"
    );
}

// ---- accounts --------------------------------------------------------------------------------

/// Two writers applied two different transfers on the same revision of A through two nodes:
/// one branch holds t1's marker, the other t2's. Both transfers then finish: each counted once.
async fn two_transfers_on_two_branches(test: &str, planted: Planted) {
    let mut w = World::new(test, &[("A", 1_000), ("B", 0), ("C", 0)]).await;
    w.transfer("t1", "A", "B", 100, 1).await;
    w.transfer("t2", "A", "C", 200, 1).await;
    let before = w.doc("account:A").await;
    assert_eq!(w.step("t1").await, State::Pending, "t1 applied");
    let mut other = before.clone();
    other["balance"] = json!(800);
    other["pending"] = json!([{"txn": key("t2", "A", "C", 200), "delta": -200, "at": now_ms()}]);
    let rev = w.plant_body("account:A", planted, other).await;
    assert_pick(&w, "account:A", &rev, planted).await;

    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(
        (states["t1"], states["t2"]),
        (State::Done, State::Done),
        "{passes:#?}"
    );
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 700);
}

#[tokio::test]
async fn account_branches_with_two_transfers_planted_wins() {
    two_transfers_on_two_branches("cf_two_txn_win", Planted::Wins).await;
}

#[tokio::test]
async fn account_branches_with_two_transfers_planted_loses() {
    two_transfers_on_two_branches("cf_two_txn_lose", Planted::Loses).await;
}

/// The same transfer applied on two branches of A and of B (two workers on one transfer
/// through two nodes: the same marker, written at other moments): counted once.
async fn one_transfer_on_two_branches(test: &str, planted: Planted) {
    let mut w = World::new(test, &[("A", 1_000), ("B", 0)]).await;
    w.transfer("t1", "A", "B", 100, 2).await;
    for id in ["account:A", "account:B"] {
        let rev = w
            .plant(id, planted, |doc| {
                let at = doc["pending"][0]["at"].as_i64().unwrap();
                doc["pending"][0]["at"] = json!(at + 7);
            })
            .await;
        assert_pick(&w, id, &rev, planted).await;
    }
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["t1"], State::Done);
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 900);
    assert_eq!(w.l.account("B").await.unwrap().balance.minor(), 100);
}

#[tokio::test]
async fn account_branches_with_the_same_marker_planted_wins() {
    one_transfer_on_two_branches("cf_same_marker_win", Planted::Wins).await;
}

#[tokio::test]
async fn account_branches_with_the_same_marker_planted_loses() {
    one_transfer_on_two_branches("cf_same_marker_lose", Planted::Loses).await;
}

/// One branch of A (and of B) settled t1, the other still holds it pending: settled counts,
/// once.
async fn settled_and_pending(test: &str, planted: Planted) {
    let mut w = World::new(test, &[("A", 1_000), ("B", 0)]).await;
    w.transfer("t1", "A", "B", 100, 3).await;
    let pending_a = w.doc("account:A").await;
    let pending_b = w.doc("account:B").await;
    assert_eq!(
        pending_a["pending"][0]["txn"],
        key("t1", "A", "B", 100),
        "{pending_a}"
    );
    assert_eq!(w.step("t1").await, State::Committed, "t1 settled");
    assert_eq!(w.doc("account:A").await["pending"], json!([]));
    for (id, body) in [("account:A", pending_a), ("account:B", pending_b)] {
        let rev = w.plant_body(id, planted, body).await;
        assert_pick(&w, id, &rev, planted).await;
    }
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["t1"], State::Done);
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 900);
    assert_eq!(w.l.account("B").await.unwrap().balance.minor(), 100);
}

#[tokio::test]
async fn account_branches_settled_and_pending_planted_wins() {
    settled_and_pending("cf_settled_pending_win", Planted::Wins).await;
}

#[tokio::test]
async fn account_branches_settled_and_pending_planted_loses() {
    settled_and_pending("cf_settled_pending_lose", Planted::Loses).await;
}

impl World {
    /// `x` (A→B 70) on the one-write path, answered `done` (and settled); returns its request.
    async fn x_done(&mut self) -> TransferRequest {
        let request = TransferRequest {
            id: Some("x".into()),
            source: "A".into(),
            destination: "B".into(),
            amount: Amount::new(70).unwrap(),
            currency: eur(),
            meta: Default::default(),
        };
        let done = self.l.submit(request.clone(), true).await.unwrap();
        assert_eq!(done.state, State::Done);
        self.transfers.push("x".to_owned());
        request
    }
}

/// An account body without its settled entries of `x`, whatever their terms (a branch that
/// never settled it).
fn drop_entries_of_x(account: &mut Value) {
    support::retain_settled(account, |txn| transfer_of(txn) != "x");
}

/// One id sent twice with other terms (A→B 70 and A→B 100), each caller applying on its own
/// branch of A and of B — a cluster's two coordinators both took a write on one revision. The
/// 70 was decided `done`; the other caller's markers (another attempt, −100 on A, +100 on B)
/// sit on the planted branches. The two terms hold two entry keys, so each account's merge
/// joins both markers side by side; the sweeper then undoes the 100's (its terms are not those
/// of the document that stands): the 70 moves once, the 100 never, and each account keeps the
/// 70 settled and the 100 undone. `marker_pending`: the decided marker still pending on A's
/// winning branch (its settle not written yet); else settled. (Before entry keys, such an
/// account could not be merged at all: "two leaves hold different deltas", for good; found on
/// a real 3-node CouchDB cluster.)
async fn other_terms_on_two_branches(test: &str, planted: Planted, marker_pending: bool) {
    let mut w = World::new(test, &[("A", 1_000), ("B", 0)]).await;
    w.x_done().await;
    let named = w.doc("txn:x").await["markers"]["source"].clone();
    assert!(named.is_string(), "a one-write done names its markers");
    let (decided, other) = (key("x", "A", "B", 70), key("x", "A", "B", 100));
    assert_ne!(decided, other, "other terms, another key");
    let db = w.db.clone();
    if marker_pending {
        // The decided marker back on A, its settle not written yet: the same balance.
        let mut a = w.doc("account:A").await;
        a["pending"] = json!([{
            "txn": decided, "delta": -70, "at": now_ms(), "attempt": named, "peer": "B",
        }]);
        drop_entries_of_x(&mut a);
        let url = support::raw_url(&format!("{db}/{}", enc("account:A")));
        let put = support::auth(support::raw().put(url).json(&a))
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    }
    // The other caller's branches: x applied with its own terms on the parent revisions (which
    // hold nothing of the 70).
    for (account, sign, peer) in [("account:A", -1, "B"), ("account:B", 1, "A")] {
        let marker = json!([{
            "txn": other, "delta": sign * 100, "at": now_ms(), "attempt": "00000000beef",
            "peer": peer,
        }]);
        let rev = w
            .plant(account, planted, |doc| {
                // The current balance counts x's 70 (its marker, or settled): without it, the
                // 100 instead.
                let without_x = doc["balance"].as_i64().unwrap() - sign * 70;
                doc["balance"] = json!(without_x + sign * 100);
                doc["pending"] = marker;
                drop_entries_of_x(doc);
            })
            .await;
        assert_pick(&w, account, &rev, planted).await;
    }
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["x"], State::Done);
    assert_eq!(w.l.transfer("x").await.unwrap().amount.minor(), 70);
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 930);
    assert_eq!(w.l.account("B").await.unwrap().balance.minor(), 70);
    // Both terms were on each merged account: the decided one settled, the other undone.
    for account in ["account:A", "account:B"] {
        let doc = w.doc(account).await;
        let entries = support::settled_entries(&doc);
        for want in [(decided.clone(), false), (other.clone(), true)] {
            assert!(
                entries.contains(&want),
                "{account} lacks {want:?}: {doc}\nsweep passes: {passes:#?}"
            );
        }
    }
}

#[tokio::test]
async fn account_branches_one_id_other_terms_pending_planted_wins() {
    other_terms_on_two_branches("cf_terms_pending_win", Planted::Wins, true).await;
}

#[tokio::test]
async fn account_branches_one_id_other_terms_pending_planted_loses() {
    other_terms_on_two_branches("cf_terms_pending_lose", Planted::Loses, true).await;
}

#[tokio::test]
async fn account_branches_one_id_other_terms_settled_planted_wins() {
    other_terms_on_two_branches("cf_terms_settled_win", Planted::Wins, false).await;
}

#[tokio::test]
async fn account_branches_one_id_other_terms_settled_planted_loses() {
    other_terms_on_two_branches("cf_terms_settled_lose", Planted::Loses, false).await;
}

/// A retry of `x` meets an account whose merge needs `x`'s document, and that document is itself
/// in conflict (both creates landed, e.g. through two nodes): the retry resolves the transfer and
/// answers it, where it used to answer 409 and leave it to the sweeper (found on a real
/// CouchDB cluster, `concurrent_submits_of_one_id_apply_it_once`).
#[tokio::test]
async fn a_retry_blocked_by_its_own_transfers_conflict_resolves_it_and_answers() {
    let mut w = World::new("cf_retry_unblocks", &[("A", 1_000), ("B", 0)]).await;
    let request = w.x_done().await;
    // A's other branch: another attempt of x still pending there (the same terms).
    w.plant("account:A", Planted::Wins, |doc| {
        doc["pending"] = json!([{
            "txn": key("x", "A", "B", 70), "delta": -70, "at": now_ms(),
            "attempt": "00000000beef", "peer": "B",
        }]);
        drop_entries_of_x(doc);
    })
    .await;
    // x's document: a second leaf with the same body.
    let body = w.doc("txn:x").await;
    w.plant_body("txn:x", Planted::Wins, body).await;
    assert_eq!(conflicted(&w.db).await.len(), 2, "both conflicts planted");

    // A retry by another process (its own engine: nothing cached, nothing remembered).
    let retry = w.l.another_worker().submit(request, true).await;
    let retry = retry.unwrap_or_else(|e| panic!("the retry was not answered: {e}"));
    assert_eq!(retry.state, State::Done);
    assert!(
        !conflicted(&w.db).await.contains_key("txn:x"),
        "the retry resolved the transfer"
    );
    let passes = w.sweep().await;
    w.assert_whole(&passes).await;
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 930);
    assert_eq!(w.l.account("B").await.unwrap().balance.minor(), 70);
}

/// t1 was cancelled: one branch of A undid its marker, the other still holds it pending.
/// Undone counts: the money is back, once.
async fn undone_and_pending(test: &str, planted: Planted) {
    let mut w = World::new(test, &[("A", 1_000), ("B", 0)]).await;
    w.transfer("t1", "A", "B", 100, 2).await;
    let pending_a = w.doc("account:A").await;
    let pending_b = w.doc("account:B").await;
    assert_eq!(pending_a["balance"], 900);
    let c = w.l.cancel("t1").await.unwrap();
    assert_eq!(c.state, State::Cancelled);
    assert_eq!(w.doc("account:A").await["balance"], 1_000);
    for (id, body) in [("account:A", pending_a), ("account:B", pending_b)] {
        let rev = w.plant_body(id, planted, body).await;
        assert_pick(&w, id, &rev, planted).await;
    }
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["t1"], State::Cancelled);
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 1_000);
    assert_eq!(w.l.account("B").await.unwrap().balance.minor(), 0);
}

#[tokio::test]
async fn account_branches_undone_and_pending_planted_wins() {
    undone_and_pending("cf_undone_pending_win", Planted::Wins).await;
}

#[tokio::test]
async fn account_branches_undone_and_pending_planted_loses() {
    undone_and_pending("cf_undone_pending_lose", Planted::Loses).await;
}

/// One branch of A is the state before t1 (no marker: the apply landed on the other branch
/// only), the other holds t1's marker: t1 counts once.
async fn absent_and_marker(test: &str, planted: Planted) {
    let mut w = World::new(test, &[("A", 1_000), ("B", 0)]).await;
    w.transfer("t1", "A", "B", 100, 1).await;
    let before_a = w.doc("account:A").await;
    let before_b = w.doc("account:B").await;
    assert_eq!(w.step("t1").await, State::Pending, "t1 applied");
    assert_eq!(w.doc("account:A").await["balance"], 900);
    for (id, body) in [("account:A", before_a), ("account:B", before_b)] {
        let rev = w.plant_body(id, planted, body).await;
        assert_pick(&w, id, &rev, planted).await;
    }
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["t1"], State::Done);
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 900);
    assert_eq!(w.l.account("B").await.unwrap().balance.minor(), 100);
}

#[tokio::test]
async fn account_branches_absent_and_marker_planted_wins() {
    absent_and_marker("cf_absent_marker_win", Planted::Wins).await;
}

#[tokio::test]
async fn account_branches_absent_and_marker_planted_loses() {
    absent_and_marker("cf_absent_marker_lose", Planted::Loses).await;
}

/// A done transfer: one branch of A settled it, a planted (winning) branch says it was undone.
/// Settled and undone are incomparable; the transfer document (done) decides: the debit
/// stays, once.
#[tokio::test]
async fn account_branches_settled_and_undone_follow_the_transfer() {
    let mut w = World::new("cf_settled_undone", &[("A", 1_000), ("B", 0)]).await;
    w.transfer("t1", "A", "B", 100, 5).await;
    assert_eq!(w.l.transfer("t1").await.unwrap().state, State::Done);
    let settled = w.doc("account:A").await;
    let t1 = key("t1", "A", "B", 100);
    assert_eq!(
        support::settled_entries(&settled),
        [(t1.clone(), false)],
        "{settled}"
    );
    let rev = w
        .plant("account:A", Planted::Wins, |doc| {
            let at = doc["settled"][0]["at"].clone();
            doc["settled"] = json!([{"at": at, "undone": [t1]}]);
            doc["balance"] = json!(1_000);
        })
        .await;
    assert_pick(&w, "account:A", &rev, Planted::Wins).await;
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 1_000);
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["t1"], State::Done);
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 900);
}

/// A committed transfer whose apply on B reached one copy only, settled by a worker that reads
/// B from another copy (accounts at the server's default write quorum): B shows no marker of it
/// there. The settle must not finish the transfer on that read: `done` would leave the marker
/// to arrive afterwards, pending on a done transfer, where the sweeper's orphan repair undoes it
/// (B's credit lost, A's debit kept — the r1_trio failure). On one node, the copy without the
/// apply is B's state before it planted as a sibling with the apply's revision deleted; the
/// apply then arrives as a sibling again, as the copies synchronise.
#[tokio::test]
async fn a_settle_reading_a_copy_without_the_apply_leaves_the_transfer_committed() {
    let mut w = World::new("cf_settle_absent", &[("A", 1_000), ("B", 0)]).await;
    w.transfer("t1", "A", "B", 100, 1).await;
    let before_b = w.doc("account:B").await;
    assert_eq!(w.step("t1").await, State::Pending, "t1 applied");
    let applied_b = w.doc("account:B").await;
    assert_eq!(
        applied_b["pending"][0]["txn"],
        key("t1", "A", "B", 100),
        "{applied_b}"
    );
    assert_eq!(w.step("t1").await, State::Committed);

    // The copy the settle reads: B as it was before the apply, the apply not there.
    let lagging = w.plant_body("account:B", Planted::Loses, before_b).await;
    let stub = json!({
        "_id": "account:B",
        "_rev": applied_b["_rev"],
        "_deleted": true,
        "merged_into": lagging,
    });
    let url = support::raw_url(&format!("{}/_bulk_docs", w.db));
    let reply: Value = support::auth(support::raw().post(url))
        .json(&json!({ "docs": [stub] }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(reply[0]["ok"] == true, "deleting the apply's leaf: {reply}");
    let leaves = support::live_leaves(&w.db, "account:B").await;
    assert_eq!(leaves.len(), 1, "{leaves:?}");
    assert!(leaves[0]["pending"].as_array().unwrap().is_empty());

    // Settling on that read: A settles, B shows nothing of t1. It stays committed.
    for _ in 0..3 {
        let _ = w.l.step("t1").await;
    }
    assert_eq!(
        w.l.transfer("t1").await.unwrap().state,
        State::Committed,
        "a settle that found no marker on B finished the transfer"
    );

    // The apply arrives; the sweeper settles it, once.
    w.plant_body("account:B", Planted::Wins, applied_b).await;
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["t1"], State::Done);
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 900);
    assert_eq!(w.l.account("B").await.unwrap().balance.minor(), 100);
}

/// The first protocol step of an account: created twice through two nodes (the same terms,
/// another `created_at`): two roots. Nothing applied on either; a transfer then runs on it.
#[tokio::test]
async fn an_account_created_twice_through_two_nodes() {
    let mut w = World::new("cf_account_twice", &[("A", 1_000), ("B", 0)]).await;
    let rev = w
        .plant("account:A", Planted::Wins, |doc| {
            doc["created_at"] = json!(doc["created_at"].as_i64().unwrap() + 5);
        })
        .await;
    assert!(rev.starts_with("1-"), "{rev}");
    assert_pick(&w, "account:A", &rev, Planted::Wins).await;
    w.transfer("t1", "A", "B", 100, 2).await;
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["t1"], State::Done);
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 900);
}

// ---- transfer documents ----------------------------------------------------------------------

/// A transfer document with two leaves: the ledger's and a planted one that `edit` makes from
/// it. The accounts are as the ledger left them after `steps` steps. The resolution keeps the
/// leaf furthest along, and the transfer ends `end`.
async fn txn_branches(
    test: &str,
    steps: usize,
    planted: Planted,
    edit: impl FnOnce(&mut Value),
    end: State,
) {
    let mut w = World::new(test, &[("A", 1_000), ("B", 0)]).await;
    w.transfer("t1", "A", "B", 100, steps).await;
    let rev = w.plant("txn:t1", planted, edit).await;
    assert_pick(&w, "txn:t1", &rev, planted).await;
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(states["t1"], end, "{passes:#?}");
}

fn to_state(state: &'static str) -> impl FnOnce(&mut Value) {
    move |doc| {
        doc["state"] = json!(state);
        doc["last_modified"] = json!(doc["last_modified"].as_i64().unwrap() + 1);
    }
}

/// `initial` against `initial`: the same transfer submitted through two nodes at once (the
/// same terms, another `created_at`): one transfer, done, counted once.
#[tokio::test]
async fn txn_branches_submitted_twice() {
    txn_branches(
        "cf_txn_twice",
        0,
        Planted::Loses,
        |doc| {
            doc["created_at"] = json!(doc["created_at"].as_i64().unwrap() + 3);
            doc["last_modified"] = doc["created_at"].clone();
        },
        State::Done,
    )
    .await;
}

/// `pending` (both accounts applied) against `committed`: committed is further; done.
#[tokio::test]
async fn txn_branches_pending_and_committed_planted_wins() {
    txn_branches(
        "cf_txn_pend_comm_win",
        2,
        Planted::Wins,
        to_state("committed"),
        State::Done,
    )
    .await;
}

#[tokio::test]
async fn txn_branches_pending_and_committed_planted_loses() {
    txn_branches(
        "cf_txn_pend_comm_lose",
        2,
        Planted::Loses,
        to_state("committed"),
        State::Done,
    )
    .await;
}

/// `committed` (both accounts settled) against `done`: done.
#[tokio::test]
async fn txn_branches_committed_and_done_planted_wins() {
    txn_branches(
        "cf_txn_comm_done_win",
        4,
        Planted::Wins,
        |doc| {
            to_state("done")(doc);
            doc["claim"] = Value::Null;
        },
        State::Done,
    )
    .await;
}

#[tokio::test]
async fn txn_branches_committed_and_done_planted_loses() {
    txn_branches(
        "cf_txn_comm_done_lose",
        4,
        Planted::Loses,
        |doc| {
            to_state("done")(doc);
            doc["claim"] = Value::Null;
        },
        State::Done,
    )
    .await;
}

/// The fork: one writer committed the pending transfer, another began to cancel it, on the
/// same revision through two nodes; neither path touched the accounts yet (both still hold
/// the pending markers). docs/CLUSTER.md: the resolver takes the commit path first — done,
/// the money moved once.
async fn committed_and_canceling(test: &str, planted: Planted) {
    let mut w = World::new(test, &[("A", 1_000), ("B", 0)]).await;
    w.transfer("t1", "A", "B", 100, 3).await;
    assert_eq!(w.l.transfer("t1").await.unwrap().state, State::Committed);
    let a = w.doc("account:A").await;
    assert_eq!(
        a["pending"][0]["txn"],
        key("t1", "A", "B", 100),
        "accounts untouched: {a}"
    );
    // The rival of the commit: a sibling of the committed revision, on the same (pending)
    // parent, that went to canceling instead.
    let rev = w
        .plant("txn:t1", planted, |doc| {
            to_state("canceling")(doc);
            doc["reason"] = json!("cancelled_by_user");
        })
        .await;
    assert_pick(&w, "txn:t1", &rev, planted).await;
    let passes = w.sweep().await;
    let states = w.assert_whole(&passes).await;
    assert_eq!(
        states["t1"],
        State::Done,
        "commit path first (docs/CLUSTER.md): {passes:#?}"
    );
    assert_eq!(w.l.account("A").await.unwrap().balance.minor(), 900);
    assert_eq!(w.l.account("B").await.unwrap().balance.minor(), 100);
}

#[tokio::test]
async fn txn_branches_committed_and_canceling_planted_wins() {
    committed_and_canceling("cf_txn_comm_cancel_win", Planted::Wins).await;
}

#[tokio::test]
async fn txn_branches_committed_and_canceling_planted_loses() {
    committed_and_canceling("cf_txn_comm_cancel_lose", Planted::Loses).await;
}

// ---- write-once order entries ------------------------------------------------------------------

const ORDER: &str = "o1";

fn purchase() -> Purchase {
    let mut p = Purchase::from_json(
        include_str!("../../../examples/cloudant-purchase.json"),
        Some(Currency::from_code("GBP").unwrap()),
    )
    .unwrap();
    p.order_id = ORDER.to_owned();
    p.basket.truncate(1);
    p.pretax = Amount::new(5_000).unwrap();
    p.tax = Amount::ZERO;
    p.delivery.price = Amount::ZERO;
    p.total = Amount::new(5_000).unwrap();
    p
}

fn payment() -> Payment {
    Payment {
        order_id: ORDER.to_owned(),
        reference: "pay1".to_owned(),
        amount: Amount::new(1_500).unwrap(),
        currency: Currency::from_code("GBP").unwrap(),
        method: Some("card".to_owned()),
        meta: Default::default(),
    }
}

async fn order_ledger(test: &str) -> (Ledger, String) {
    let l = support::ledger(test).await;
    l.record_purchase(&purchase()).await.unwrap();
    let r = l.record_payment(&payment()).await.unwrap();
    assert_eq!(r.status, RecordStatus::Created);
    let db = l.client().database().to_owned();
    (l, db)
}

const PAYMENT_ID: &str = "payment:o1:pay1";

/// A payment written twice with the identical body (a retry through another node, a
/// replication) gets the same revision id: no conflict can arise. Shown on a second database
/// (another writer of the same body), then "replicated" into the first as a sibling would be.
#[tokio::test]
async fn a_payment_with_an_identical_body_cannot_conflict() {
    let (l, db) = order_ledger("cf_pay_same").await;
    let rev = winner(&db, PAYMENT_ID).await;
    let (_other, other_db) = order_ledger("cf_pay_same_other").await;
    let other_rev = winner(&other_db, PAYMENT_ID).await;
    assert_eq!(
        rev, other_rev,
        "the same body on the same (empty) parent makes the same revision"
    );
    let hash = rev.split_once('-').unwrap().1.to_owned();
    let planted = support::plant_sibling(&db, PAYMENT_ID, &hash, |_| {}).await;
    assert_eq!(planted, rev);
    assert_eq!(support::live_leaves(&db, PAYMENT_ID).await.len(), 1);
    assert!(conflicted(&db).await.is_empty());
    let report = l.verify().await.unwrap();
    assert!(report.check("conflicts").unwrap().ok, "{report:#?}");
    assert_eq!(
        l.record_payment(&payment()).await.unwrap().status,
        RecordStatus::Exists
    );
    assert_eq!(winner(&db, PAYMENT_ID).await, rev, "nothing was written");
}

/// A payment id with two different bodies (two callers reusing one reference with other
/// content, through two nodes, each write a 202). The greater revision is CouchDB's winner, the
/// body the order's view counts, and stays so (write-once bodies are never edited nor deleted).
/// Which payment happened is a business question: `verify` reports the conflict and the sweeper
/// leaves it, saying so. A call that meets it is told what its body is: `uncertain` when it is
/// the one counted (another body stands beside it), a mismatch when it is not (it never
/// counts); never `exists`.
async fn payment_with_two_bodies(test: &str, planted: Planted) {
    let (l, db) = order_ledger(test).await;
    let ours = winner(&db, PAYMENT_ID).await;
    let rev = support::plant_sibling(&db, PAYMENT_ID, &planted.hash(), |doc| {
        doc["value"] = json!(1_499);
    })
    .await;
    let w_rev = winner(&db, PAYMENT_ID).await;
    assert_eq!(w_rev == rev, planted == Planted::Wins);
    let counted = if planted == Planted::Wins {
        1_499
    } else {
        1_500
    };
    assert_eq!(l.order(ORDER).await.unwrap().paid.minor(), counted);

    let report = l.verify().await.unwrap();
    let c = report.check("conflicts").unwrap();
    assert!(!c.ok, "{report:#?}");
    assert_eq!(c.documents, vec![PAYMENT_ID.to_owned()], "{c:?}");

    let told = || async {
        match l.record_payment(&payment()).await {
            Ok(r) => Ok(r.status),
            Err(e) => Err((e.is_mismatch(), e.field().map(str::to_owned))),
        }
    };
    let expected = match planted {
        Planted::Wins => Err((true, Some("value".to_owned()))),
        Planted::Loses => Ok(RecordStatus::Uncertain),
    };
    assert_eq!(told().await, expected, "the call that meets it");

    let o = l
        .sweep_once(SweepOptions {
            limit: 100,
            stale_after: Duration::ZERO,
        })
        .await
        .unwrap();
    assert!(
        o.problems.iter().any(|p| p.contains(PAYMENT_ID)),
        "the sweeper must report the write-once conflict it leaves: {o:?}"
    );
    let mut leaves: Vec<String> = support::live_leaves(&db, PAYMENT_ID)
        .await
        .iter()
        .map(|d| d["_rev"].as_str().unwrap().to_owned())
        .collect();
    leaves.sort();
    let mut both = vec![ours, rev];
    both.sort();
    assert_eq!(leaves, both, "the sweeper picked one of two payments");
    assert_eq!(winner(&db, PAYMENT_ID).await, w_rev);
    assert_eq!(l.order(ORDER).await.unwrap().paid.minor(), counted);
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    assert!(!report.check("conflicts").unwrap().ok, "{report:#?}");
    assert_eq!(told().await, expected, "the same call again");
}

#[tokio::test]
async fn a_payment_with_two_bodies_is_reported_never_picked_planted_wins() {
    payment_with_two_bodies("cf_pay_two_win", Planted::Wins).await;
}

#[tokio::test]
async fn a_payment_with_two_bodies_is_reported_never_picked_planted_loses() {
    payment_with_two_bodies("cf_pay_two_lose", Planted::Loses).await;
}

/// A debit withdrawn after a merged overdraft (`OpResult::Withdrawn`), then the worker stalls
/// before its cancel CAS; the sweeper takes over and finds A holding t1 undone and B holding it
/// pending. Committing then would keep B's credit alone (+800 from nowhere, seen before the
/// fix): the apply that finds its transfer undone is a failure, and t1 ends cancelled.
#[tokio::test]
async fn a_withdrawn_debit_whose_worker_stalls_is_cancelled_by_the_sweeper() {
    use std::sync::Arc;
    let mut w = World::new("cf_withdrawn_stall", &[("A", 1_000), ("B", 0), ("C", 0)]).await;
    w.transfer("t1", "A", "B", 800, 1).await;
    w.transfer("t2", "A", "C", 800, 1).await;
    let mut rival = w.doc("account:A").await;
    assert_eq!(w.step("t1").await, State::Pending, "t1 applied");
    // The other copy: t2's debit checked against the same 1000.
    rival["balance"] = json!(200);
    rival["pending"] = json!([{"txn": key("t2", "A", "C", 800), "delta": -800, "at": now_ms()}]);
    w.plant_body("account:A", Planted::Loses, rival).await;

    let gate = Arc::new(tokio::sync::Notify::new());
    let reached = Arc::new(tokio::sync::Notify::new());
    let (g, r) = (gate.clone(), reached.clone());
    let hook = couch_ledger::PauseHook(Arc::new(move |phase: &'static str| {
        let (g, r) = (g.clone(), r.clone());
        Box::pin(async move {
            if phase == "canceling" {
                r.notify_one();
                g.notified().await;
            }
        })
    }));
    // The stepping worker itself (its worker id: t1's claim is its own), held at its cancel.
    let stalled =
        w.l.to_builder()
            .worker_id(w.l.worker_id())
            .pause_hook(hook)
            .build()
            .unwrap();
    let task = tokio::spawn(async move { stalled.step("t1").await });
    tokio::time::timeout(Duration::from_secs(60), reached.notified())
        .await
        .expect("the stalled step did not reach its cancel in 60 s");
    let a = w.doc("account:A").await;
    assert!(
        support::settled_entries(&a).contains(&(key("t1", "A", "B", 800), true)),
        "t1's debit was taken back: {a}"
    );
    // The stalled worker's claim runs out (a lease is wall time: wait it out); a sweeper takes
    // t1 over.
    tokio::time::sleep(STEP_LEASE + Duration::from_millis(500)).await;
    let sweeper = w.l.another_worker();
    let o = sweeper
        .sweep_once(SweepOptions {
            limit: 100,
            stale_after: Duration::ZERO,
        })
        .await
        .unwrap();
    eprintln!("sweep: {o:?}");
    assert_eq!(
        w.l.transfer("t1").await.unwrap().state,
        State::Cancelled,
        "a transfer with its debit undone is cancelled, never committed"
    );
    gate.notify_one();
    let _ = task.await.unwrap();
    let passes = w.sweep().await;
    w.assert_whole(&passes).await;
}

/// More write-once conflicts than a pass takes (they wait for a person, so they stay) must not
/// hide a conflicted transfer from every pass: the conflicts view sorts by type, and `payment`
/// comes before `transaction`. A pass of two reaches the transfer behind two such payments.
#[tokio::test]
async fn a_conflicted_transfer_is_resolved_behind_more_write_once_conflicts_than_a_pass_takes() {
    let mut w = World::new("cf_behind_write_once", &[("A", 1_000), ("B", 0)]).await;
    w.l.record_purchase(&purchase()).await.unwrap();
    let mut payments = Vec::new();
    for reference in ["pay1", "pay2"] {
        let p = Payment {
            reference: reference.to_owned(),
            ..payment()
        };
        assert_eq!(
            w.l.record_payment(&p).await.unwrap().status,
            RecordStatus::Created
        );
        let id = format!("payment:{ORDER}:{reference}");
        support::plant_sibling(&w.db, &id, &Planted::Wins.hash(), |doc| {
            doc["value"] = json!(1_499);
        })
        .await;
        payments.push(id);
    }
    // Settled on both accounts, `committed`; a leaf `done` beside it wins, so no view of open
    // transfers or pending markers lists t1: only the conflicts view does.
    w.transfer("t1", "A", "B", 100, 4).await;
    w.plant("txn:t1", Planted::Wins, |doc| {
        to_state("done")(doc);
        doc["claim"] = Value::Null;
    })
    .await;
    let before: Vec<String> = conflicted(&w.db).await.into_keys().collect();
    let mut expected = vec!["txn:t1".to_owned()];
    expected.extend(payments.iter().cloned());
    expected.sort();
    assert_eq!(before, expected, "what the test planted");
    w.claims_run_out().await;

    let o =
        w.l.another_worker()
            .sweep_once(SweepOptions {
                limit: 2,
                stale_after: Duration::ZERO,
            })
            .await
            .unwrap();
    let after: Vec<String> = conflicted(&w.db).await.into_keys().collect();
    assert_eq!(
        after, payments,
        "the pass left the transfer's conflict (or picked a payment): {o:#?}"
    );
    assert_eq!(o.conflicts_resolved, 1, "{o:#?}");
    for id in &payments {
        assert!(
            o.problems.iter().any(|p| p.contains(id.as_str())),
            "the pass reports {id}: {o:#?}"
        );
    }
    assert_eq!(w.l.transfer("t1").await.unwrap().state, State::Done);
    for (account, balance) in [("A", 900), ("B", 100)] {
        let a = w.l.account(account).await.unwrap();
        assert_eq!((a.balance.minor(), a.pending.len()), (balance, 0), "{a:?}");
    }
}
