//! Steered runs: one interleaving, scripted step by step on the simulated cluster, where the
//! seeded runs do not draw it. Each holds real ledger processes at named protocol steps (the
//! ledger's pause hook, awaited after the lease check and right before a write), stops and
//! starts nodes or cuts one document's copy off from the others, so that copies diverge exactly
//! as the interleaving needs, then heals every fault, lets the sweeper finish and asks the same
//! oracle as every seed.
//!
//! A script that cannot reach its interleaving (a step did not come within its deadline) is a
//! violation too: a change of the protocol that moves the interleaving elsewhere must move the
//! script with it, not leave it passing without testing anything.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_ledger::{
    Amount, Currency, Ledger, PauseHook, State, SweepOptions, TransferOutcome, TransferRequest,
};
use tokio::sync::Notify;

use super::{
    on_sim_runtime, process_ledger, sim_client, Outcome, Plan, ProcessPlan, Run, Slot, Stall, Told,
    LEDGER_DB,
};
use crate::sim::cluster::Config;
use crate::sim::http::{Route, SimTransport};

/// The steered runs by name, each with what it checks.
pub const STEERED: [(&str, &str); 5] = [
    (
        "cancel-while-a-node-is-away",
        "a pending transfer cancelled while one copy of three is away (every transfer write answered 202)",
    ),
    (
        "cancel-beside-untold-done",
        "a one-write done and a stepwise cancel of the same terms forked; resolved while the cancel's undos are on their way",
    ),
    (
        "cancel-beside-stepwise-commit",
        "a stepwise commit and a cancel of one transfer forked; resolved for the commit while the cancel's undos are on their way, which land before the commit's settles",
    ),
    (
        "decision-beside-other-terms",
        "the sweeper's decision of a transfer left initial, over initial answered 201 while other terms of the id stood on a copy; resolved before its settles land",
    ),
    (
        "read-decision-beside-other-terms",
        "a sweeper that lost its decision of a transfer left initial converges to the one it reads while other terms of the id stand on a copy it did not read; resolved before its settles land",
    ),
];

/// At most this many revisions of one transfer while a node is away: CouchDB stems a
/// document's history to its `_revs_limit` (20 by default), and a copy that comes back at a
/// revision older than that cannot join the others' history; it stands as a conflict of its own
/// (docs/CLUSTER.md, F7).
const REVISIONS_WHILE_AWAY_MAX: u64 = 10;

/// The document of the transfer every steered run is about.
const X: &str = "txn:x";

/// How long a script waits for a process to reach a step.
const STEP_DEADLINE: Duration = Duration::from_secs(60);

/// Runs the steered run `name` on a fresh paused runtime of this thread.
pub fn run_steered(name: &str) -> Outcome {
    let (index, &(name, what)) = STEERED
        .iter()
        .enumerate()
        .find(|(_, (n, _))| *n == name)
        .expect("a steered run of that name");
    let seed = index as u64;
    on_sim_runtime(seed, move || async move {
        match name {
            "cancel-while-a-node-is-away" => cancel_while_a_node_is_away(seed, what).await,
            "cancel-beside-untold-done" => cancel_beside_untold_done(seed, what).await,
            "cancel-beside-stepwise-commit" => cancel_beside_stepwise_commit(seed, what).await,
            "decision-beside-other-terms" => decision_beside_other_terms(seed, what).await,
            "read-decision-beside-other-terms" => {
                read_decision_beside_other_terms(seed, what).await
            }
            other => unreachable!("no steered run {other}"),
        }
    })
}

/// Holds of named steps: a process reaching a held step waits there until it is released.
#[derive(Default)]
struct Steer {
    holds: Mutex<HashMap<&'static str, Arc<Hold>>>,
}

#[derive(Default)]
struct Hold {
    reached: Notify,
    released: Notify,
}

impl Steer {
    /// The pause hook of a process steered by `steer`.
    fn hook(steer: &Arc<Steer>) -> PauseHook {
        let steer = Arc::clone(steer);
        PauseHook(Arc::new(move |phase: &'static str| {
            let hold = steer.holds.lock().unwrap().get(phase).cloned();
            Box::pin(async move {
                if let Some(hold) = hold {
                    tracing::info!(target: "sim", phase, "held at a steered step");
                    hold.reached.notify_one();
                    hold.released.notified().await;
                    tracing::info!(target: "sim", phase, "released");
                }
            })
        }))
    }

    /// The next process to reach `phase` waits there.
    fn hold_at(&self, phase: &'static str) {
        self.holds
            .lock()
            .unwrap()
            .insert(phase, Arc::new(Hold::default()));
    }

    /// Waits until a process waits at `phase`; `false` past the deadline.
    async fn reached(&self, phase: &'static str) -> bool {
        let hold = self.holds.lock().unwrap().get(phase).cloned();
        match hold {
            Some(hold) => tokio::time::timeout(STEP_DEADLINE, hold.reached.notified())
                .await
                .is_ok(),
            None => false,
        }
    }

    /// The process waiting at `phase` goes on; later ones pass it.
    fn release(&self, phase: &'static str) {
        if let Some(hold) = self.holds.lock().unwrap().remove(phase) {
            hold.released.notify_one();
        }
    }
}

/// A quiet cluster (no lost answers, no late copies, no process faults but the script's) of
/// three nodes, one shard, and three accounts.
fn quiet_run(seed: u64) -> Run {
    let config = Config {
        q: 1,
        repl_ms: (5, 50),
        // Every copy takes a write within a few milliseconds, before internal replication
        // brings it the same revision (which it would then refuse as a child of no leaf).
        slow_copy_one_in: u32::MAX,
        ..Config::default()
    };
    let plan = Plan {
        accounts: vec![
            ("a".to_owned(), 1_000, Some(0)),
            ("b".to_owned(), 0, Some(0)),
            ("c".to_owned(), 0, Some(0)),
        ],
        transfers: 1,
        sweep_every_s: 1,
        ..Plan::default()
    };
    Run::with(seed, false, fastrand::Rng::with_seed(seed), plan, config)
}

/// A process of the run on `route`, stepwise or not, steered by `steer` when given; in a slot
/// of its own, so that the wrap-up stops what it still runs.
fn process(run: &Run, route: Route, stepwise: bool, steer: Option<&Arc<Steer>>) -> (usize, Ledger) {
    let plan = ProcessPlan {
        route,
        admin: true,
        stepwise,
        background: false,
        server_default: false,
        crash_permille: 0,
        stall: Stall::default(),
    };
    let transport = SimTransport::new(Arc::clone(&run.cluster), route, true);
    let ledger = process_ledger(sim_client(&transport), false, plan, steer.map(Steer::hook));
    let mut slots = run.slots.lock().unwrap();
    slots.push(Slot {
        plan,
        ledger: ledger.clone(),
        transport,
        tasks: Vec::new(),
    });
    (slots.len() - 1, ledger)
}

/// `a` → `b`, 100, under id `x`.
fn request(eur: Currency) -> TransferRequest {
    TransferRequest {
        id: Some("x".to_owned()),
        source: "a".to_owned(),
        destination: "b".to_owned(),
        amount: Amount::new(100).expect("amount"),
        currency: eur,
        meta: Default::default(),
    }
}

/// What `call` about `x` answered within the deadline (`None`: nothing): a state is recorded
/// as told, and either is logged.
async fn answer(
    run: &Run,
    who: &str,
    call: impl Future<Output = couch_ledger::Result<TransferOutcome>>,
) -> Option<couch_ledger::Result<TransferOutcome>> {
    let answer = tokio::time::timeout(STEP_DEADLINE, call).await.ok()?;
    match &answer {
        Ok(o) => {
            tracing::info!(target: "sim", who, state = %o.state, "answered");
            tell(run, o.state);
        }
        Err(e) => tracing::info!(target: "sim", who, "answered: {e}"),
    }
    Some(answer)
}

/// Records what a caller of `x` was told.
fn tell(run: &Run, state: State) {
    run.told.lock().unwrap().push(Told::Transfer {
        id: "x".to_owned(),
        source: "a".to_owned(),
        destination: "b".to_owned(),
        amount: 100,
        state,
        reverses: None,
    });
}

/// The run's set-up done and its clock started: the run, its outcome so far, and EUR; `Err`
/// with the outcome when the set-up failed.
async fn started(seed: u64, what: &str) -> Result<(Run, Outcome, Currency), Outcome> {
    let mut run = quiet_run(seed);
    let mut out = Outcome {
        seed,
        scenario: format!("steered: {what}"),
        ..Outcome::default()
    };
    let Some(eur) = run.set_up(&mut out).await else {
        return Err(out);
    };
    run.started = tokio::time::Instant::now();
    Ok((run, out, eur))
}

/// Starts a stepwise submit of `x` through `ledger` and waits until it holds before its commit
/// (both accounts applied); `false` if it never came there.
async fn submitted_held_before_commit(
    run: &Run,
    slot: usize,
    ledger: &Ledger,
    steer: &Steer,
    eur: Currency,
) -> bool {
    steer.hold_at("commit");
    let ledger = ledger.clone();
    let submitting = tokio::spawn(async move {
        let _ = ledger.submit(request(eur), true).await;
    });
    run.slots.lock().unwrap()[slot].tasks.push(submitting);
    steer.reached("commit").await
}

/// A `cancel` of `x` through `ledger`, held before its undos (its `canceling` written); `None`
/// if it never came there.
async fn cancel_held_before_undos(
    steer: &Steer,
    ledger: &Ledger,
) -> Option<tokio::task::JoinHandle<couch_ledger::Result<TransferOutcome>>> {
    steer.hold_at("undo");
    let ledger = ledger.clone();
    let cancelling = tokio::spawn(async move { ledger.cancel("x").await });
    steer.reached("undo").await.then_some(cancelling)
}

/// The revisions of `txn:x` on the first copy that holds it: its winner's position.
fn revisions_of_x(run: &Run) -> u64 {
    let s = run.cluster.lock();
    s.dbs
        .get(LEDGER_DB)
        .and_then(|d| d.copies.iter().find_map(|c| c.docs.get(X)))
        .and_then(|e| e.tree.winner())
        .map_or(0, |w| w.pos)
}

/// Sweep passes of `resolver` (none of them old enough to take anything over) until every copy
/// holds `txn:x` as one live leaf; `false` if that never came within the deadline.
async fn resolved(run: &Run, resolver: &Ledger) -> bool {
    let until = tokio::time::Instant::now() + STEP_DEADLINE;
    while tokio::time::Instant::now() < until {
        let _ = resolver
            .sweep_once(SweepOptions {
                limit: 200,
                stale_after: Duration::from_secs(3_600),
            })
            .await;
        let live_leaves = {
            let s = run.cluster.lock();
            s.dbs.get(LEDGER_DB).map_or(0, |d| {
                d.copies
                    .iter()
                    .filter_map(|c| c.docs.get(X))
                    .map(|e| {
                        let leaves = e.tree.leaves();
                        leaves.iter().filter(|r| !e.tree.is_deleted(r)).count()
                    })
                    .max()
                    .unwrap_or(0)
            })
        };
        if live_leaves == 1 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// A `cancel` of a `pending` transfer while one node of three is away: every transfer write
/// (`w` = n) is answered 202, so no take-over of the document is ever sure of every copy. The
/// cancel answers within its deadline, `cancelled` or `unconfirmed` (the sweeper finishes
/// once the node is back), and writes the document a few times only, not once per try: past
/// the copies' `_revs_limit` the copy that comes back cannot join the history.
async fn cancel_while_a_node_is_away(seed: u64, what: &str) -> Outcome {
    let (mut run, mut out, eur) = match started(seed, what).await {
        Ok(s) => s,
        Err(out) => return out,
    };
    let cluster = Arc::clone(&run.cluster);
    let steer = Arc::new(Steer::default());
    let (slot, stepwise) = process(&run, Route::RoundRobin, true, Some(&steer));
    cluster.stop_node(2);
    // Out of the balancer's rotation.
    tokio::time::sleep(Duration::from_secs(6)).await;
    if !submitted_held_before_commit(&run, slot, &stepwise, &steer, eur).await {
        run.violation(
            &mut out,
            "script: the stepwise submit never came to its commit",
        );
        return run.wrap_up(out, eur).await;
    }
    let before = revisions_of_x(&run);
    match answer(&run, "the cancel", stepwise.cancel("x")).await {
        Some(Ok(_)) => {}
        Some(Err(e)) if e.is_unconfirmed() => {}
        Some(Err(e)) => run.violation(&mut out, format!("cancel answered an error: {e}")),
        None => run.violation(&mut out, "cancel did not answer within a minute"),
    }
    let written = revisions_of_x(&run).saturating_sub(before);
    if written > REVISIONS_WHILE_AWAY_MAX {
        run.violation(
            &mut out,
            format!("cancel wrote {written} revisions of x while a node was away"),
        );
    }
    steer.release("commit");
    run.wrap_up(out, eur).await
}

/// A one-write `done` beside a stepwise `canceling` of the same terms, resolved while the
/// cancel's undos are on their way (docs/CLUSTER.md, "A drive settles only a commit that
/// stands alone on every copy"). The accounts' copies stay in step throughout; only the
/// transfer document's copies diverge:
///
/// 1. A one-write process applies `x` with an attempt of its own and is held before its
///    decision.
/// 2. Copies 0 and 1 cut off from `txn:x`: a stepwise process creates it on copy 2 (202s, which
///    it follows), adopts the markers on the accounts, and is held before its commit; a
///    `cancel` of `x` through it writes `canceling` and is held before its undos.
/// 3. Copy 2 cut off instead: the one-write decision creates `x` `done` on copies 0 and 1,
///    answered 202 (not on every copy): untold, unsettled.
/// 4. Every copy back: `x` is a fork of `done` and `canceling`, and the accounts show neither a
///    settle nor an undo of it. A sweep pass resolves the fork; then the cancel's undos land,
///    and the sweeper finishes. Kept over the undos, the `done` would end counted on neither
///    account: nothing settles a one-write marker undone.
async fn cancel_beside_untold_done(seed: u64, what: &str) -> Outcome {
    let (mut run, mut out, eur) = match started(seed, what).await {
        Ok(s) => s,
        Err(out) => return out,
    };
    let cluster = Arc::clone(&run.cluster);
    let steer_stepwise = Arc::new(Steer::default());
    let steer_one_write = Arc::new(Steer::default());
    let (stepwise_slot, stepwise) = process(&run, Route::RoundRobin, true, Some(&steer_stepwise));
    let (_, one_write) = process(&run, Route::RoundRobin, false, Some(&steer_one_write));
    let (_, resolver) = process(&run, Route::RoundRobin, false, None);

    // 1.
    steer_one_write.hold_at("decide");
    let deciding = {
        let ledger = one_write.clone();
        tokio::spawn(async move { ledger.submit(request(eur), true).await })
    };
    if !steer_one_write.reached("decide").await {
        run.violation(
            &mut out,
            "script: the one-write submit never came to its decision",
        );
        return run.wrap_up(out, eur).await;
    }

    // 2.
    cluster.cut(LEDGER_DB, X, 0);
    cluster.cut(LEDGER_DB, X, 1);
    if !submitted_held_before_commit(&run, stepwise_slot, &stepwise, &steer_stepwise, eur).await {
        run.violation(
            &mut out,
            "script: the stepwise submit never came to its commit",
        );
        return run.wrap_up(out, eur).await;
    }
    let Some(cancelling) = cancel_held_before_undos(&steer_stepwise, &stepwise).await else {
        run.violation(&mut out, "script: the cancel never came to its undos");
        return run.wrap_up(out, eur).await;
    };

    // 3.
    cluster.cut(LEDGER_DB, X, 2);
    cluster.join(LEDGER_DB, X, 0);
    cluster.join(LEDGER_DB, X, 1);
    steer_one_write.release("decide");
    let decided = async { deciding.await.expect("the one-write submit") };
    if answer(&run, "the one-write submit", decided)
        .await
        .is_none()
    {
        run.violation(&mut out, "script: the one-write submit did not answer");
        return run.wrap_up(out, eur).await;
    }

    // 4.
    cluster.join(LEDGER_DB, X, 2);
    if !resolved(&run, &resolver).await {
        run.violation(&mut out, "script: the fork of x was never resolved");
    }
    steer_stepwise.release("undo");
    let cancelled = async { cancelling.await.expect("the cancel") };
    if answer(&run, "the cancel", cancelled).await.is_none() {
        run.violation(&mut out, "script: the cancel did not answer");
    }
    steer_stepwise.release("commit");
    run.wrap_up(out, eur).await
}

/// A stepwise `committed` beside a `canceling` of the same transfer, resolved for the commit
/// while the cancel's undos are on their way, the undos landing before the commit's settles:
///
/// 1. A stepwise process submits `x`, applies both markers, and is held before its commit.
/// 2. Copy 2 cut off from `txn:x`: a `cancel` through a second stepwise process writes
///    `canceling` on copies 0 and 1 (202, its own write read back) and is held before its
///    undos.
/// 3. Copies 0 and 1 cut off instead, copy 2 back: the first process commits there (202, read
///    back) and is held before sealing its commit.
/// 4. Every copy back: a sweep pass resolves the fork; the accounts show nothing, and a
///    `committed` leaf may have been told, so the commit path is kept. The commit is sealed
///    and read alone on every copy, and the first process is held before its settles.
/// 5. The cancel's undos land, then its `cancelled` (a child of a leaf the resolution
///    deleted), then the commit's settles. The transfer must end as its accounts say, and no
///    caller be told an outcome that does not stand.
async fn cancel_beside_stepwise_commit(seed: u64, what: &str) -> Outcome {
    let (mut run, mut out, eur) = match started(seed, what).await {
        Ok(s) => s,
        Err(out) => return out,
    };
    let cluster = Arc::clone(&run.cluster);
    let steer_commit = Arc::new(Steer::default());
    let steer_cancel = Arc::new(Steer::default());
    let (commit_slot, committing) = process(&run, Route::RoundRobin, true, Some(&steer_commit));
    let (_, cancelling) = process(&run, Route::RoundRobin, true, Some(&steer_cancel));
    let (_, resolver) = process(&run, Route::RoundRobin, false, None);

    // 1.
    if !submitted_held_before_commit(&run, commit_slot, &committing, &steer_commit, eur).await {
        run.violation(
            &mut out,
            "script: the stepwise submit never came to its commit",
        );
        return run.wrap_up(out, eur).await;
    }

    // 2.
    cluster.cut(LEDGER_DB, X, 2);
    let Some(cancel) = cancel_held_before_undos(&steer_cancel, &cancelling).await else {
        run.violation(&mut out, "script: the cancel never came to its undos");
        return run.wrap_up(out, eur).await;
    };

    // 3.
    cluster.cut(LEDGER_DB, X, 0);
    cluster.cut(LEDGER_DB, X, 1);
    cluster.join(LEDGER_DB, X, 2);
    steer_commit.hold_at("seal");
    steer_commit.release("commit");
    if !steer_commit.reached("seal").await {
        run.violation(&mut out, "script: the commit was never written");
        return run.wrap_up(out, eur).await;
    }

    // 4.
    cluster.join(LEDGER_DB, X, 0);
    cluster.join(LEDGER_DB, X, 1);
    if !resolved(&run, &resolver).await {
        run.violation(&mut out, "script: the fork of x was never resolved");
    }
    steer_commit.hold_at("settle");
    steer_commit.release("seal");
    let sealed = steer_commit.reached("settle").await;
    tracing::info!(target: "sim", sealed, "the commit sealed and held before its settles");

    // 5.
    steer_cancel.release("undo");
    let cancelled = async { cancel.await.expect("the cancel") };
    if answer(&run, "the cancel", cancelled).await.is_none() {
        run.violation(&mut out, "script: the cancel did not answer");
    }
    steer_commit.release("settle");
    run.wrap_up(out, eur).await
}

/// A sweep pass of `ledger` that takes over transfers left five seconds.
async fn pass(ledger: Ledger) {
    let _ = ledger
        .sweep_once(SweepOptions {
            limit: 200,
            stale_after: Duration::from_secs(5),
        })
        .await;
}

/// Steps 1 to 3 of [`decision_beside_other_terms`] and [`read_decision_beside_other_terms`]:
/// `x` `initial` (a → b) on copies 0 and 1, recovered by a pass of `sweeper` from the markers
/// of a process that died before its decision, and stale; other terms of `x` (a → c) `done` on
/// copy 2 with the longer history; copy 2 cut off from `txn:x`. `false` (and a violation) when
/// a step did not come.
async fn recovered_beside_other_terms(
    run: &Run,
    out: &mut Outcome,
    eur: Currency,
    sweeper: &Ledger,
) -> bool {
    let cluster = Arc::clone(&run.cluster);
    let steer_dead = Arc::new(Steer::default());
    let (dead_slot, dead) = process(run, Route::RoundRobin, false, Some(&steer_dead));
    let (_, other) = process(run, Route::RoundRobin, false, None);

    // 1.
    steer_dead.hold_at("decide");
    let dying = tokio::spawn(async move {
        let _ = dead.submit(request(eur), true).await;
    });
    run.slots.lock().unwrap()[dead_slot].tasks.push(dying);
    if !steer_dead.reached("decide").await {
        run.violation(out, "script: the first submit never came to its decision");
        return false;
    }
    tokio::time::sleep(super::LEASE + Duration::from_secs(1)).await;

    // 2.
    cluster.cut(LEDGER_DB, X, 0);
    cluster.cut(LEDGER_DB, X, 1);
    let other_terms = TransferRequest {
        destination: "c".to_owned(),
        ..request(eur)
    };
    for _ in 0..3 {
        match tokio::time::timeout(STEP_DEADLINE, other.submit(other_terms.clone(), true)).await {
            Ok(Ok(o)) => {
                tracing::info!(target: "sim", state = %o.state, "the other terms answered")
            }
            Ok(Err(e)) => tracing::info!(target: "sim", "the other terms answered: {e}"),
            Err(_) => {
                run.violation(out, "script: the other terms' submit did not answer");
                return false;
            }
        }
    }

    // 3.
    cluster.cut(LEDGER_DB, X, 2);
    cluster.join(LEDGER_DB, X, 0);
    cluster.join(LEDGER_DB, X, 1);
    pass(sweeper.clone()).await;
    // Stale for the next pass.
    tokio::time::sleep(Duration::from_secs(6)).await;
    true
}

/// A sweep pass of `sweeper` held before its decision of `x`, a few passes tried: a pass whose
/// view read reaches the copy that holds the other terms' `done` sees nothing open. `None` if
/// none came there.
async fn held_deciding(steer: &Steer, sweeper: &Ledger) -> Option<tokio::task::JoinHandle<()>> {
    steer.hold_at("decide");
    for _ in 0..8 {
        let mut deciding = tokio::spawn(pass(sweeper.clone()));
        let held = tokio::select! {
            reached = steer.reached("decide") => reached,
            _ = &mut deciding => false,
        };
        if held {
            return Some(deciding);
        }
    }
    None
}

/// Whether the decision `deciding` was released to write goes on to settle at once (it is
/// then held at `converge`) rather than ending its pass without settling.
async fn settles_at_once(steer: &Steer, deciding: &mut tokio::task::JoinHandle<()>) -> bool {
    let settling = tokio::select! {
        reached = steer.reached("converge") => reached,
        _ = deciding => false,
    };
    tracing::info!(target: "sim", settling, "the sweeper's decision written");
    settling
}

/// The sweeper's one-write decision of a transfer left `initial`, written over `initial` and
/// answered 201 while other terms of the id stood on a copy that had lacked the document, and
/// a resolution made before its settles land (docs/CLUSTER.md, "Telling a decision on a
/// cluster"):
///
/// 1. A one-write process applies `x` (a → b) and is held before its decision for good: it
///    died there. Its markers age past the lease.
/// 2. Copies 0 and 1 cut off from `txn:x`: another process sends `x` with other terms (a → c),
///    creating it `done` on copy 2 (202), and sends it twice more (each call seals that
///    decision on copy 2 again, 202): the longer history.
/// 3. Copy 2 cut off instead, 0 and 1 back: a sweep pass recovers `x` from the first markers,
///    creating it `initial` there (202, followed); a pass once that is stale decides it, held
///    before its write.
/// 4. Every copy back; the decision (`done`, a → b) over `initial` is taken by every copy
///    (201). If it goes on to settle at once, it is held there while a sweep pass resolves `x`;
///    then the settles land. Settled after the other terms were kept, both terms would count.
async fn decision_beside_other_terms(seed: u64, what: &str) -> Outcome {
    let (mut run, mut out, eur) = match started(seed, what).await {
        Ok(s) => s,
        Err(out) => return out,
    };
    let steer = Arc::new(Steer::default());
    let (_, sweeper) = process(&run, Route::RoundRobin, false, Some(&steer));
    let (_, resolver) = process(&run, Route::RoundRobin, false, None);
    if !recovered_beside_other_terms(&run, &mut out, eur, &sweeper).await {
        return run.wrap_up(out, eur).await;
    }
    let Some(mut deciding) = held_deciding(&steer, &sweeper).await else {
        run.violation(&mut out, "script: the sweeper never came to decide x");
        return run.wrap_up(out, eur).await;
    };

    // 4.
    run.cluster.join(LEDGER_DB, X, 2);
    steer.hold_at("converge");
    steer.release("decide");
    // Today the decision waits until it stands alone on every copy, and the pass ends without
    // settling.
    if settles_at_once(&steer, &mut deciding).await {
        if !resolved(&run, &resolver).await {
            run.violation(&mut out, "script: the fork of x was never resolved");
        }
        steer.release("converge");
        if tokio::time::timeout(STEP_DEADLINE, deciding).await.is_err() {
            run.violation(&mut out, "script: the sweeper's pass did not end");
        }
    }
    run.wrap_up(out, eur).await
}

/// The same, the decision read instead of written: two sweepers decide `x` at once over
/// `initial` on copies 0 and 1 (copy 2 still cut off). The first's write is answered 202; the
/// second loses its write, reads the first's `done` from copies that do not hold the other
/// terms, and converges the accounts to it (`converge_now`): at once, it would settle the
/// markers that a resolution keeping the other terms then leaves counted besides them.
async fn read_decision_beside_other_terms(seed: u64, what: &str) -> Outcome {
    let (mut run, mut out, eur) = match started(seed, what).await {
        Ok(s) => s,
        Err(out) => return out,
    };
    let (steer_first, steer_second) = (Arc::new(Steer::default()), Arc::new(Steer::default()));
    let (_, first) = process(&run, Route::RoundRobin, false, Some(&steer_first));
    let (_, second) = process(&run, Route::RoundRobin, false, Some(&steer_second));
    let (_, resolver) = process(&run, Route::RoundRobin, false, None);
    if !recovered_beside_other_terms(&run, &mut out, eur, &first).await {
        return run.wrap_up(out, eur).await;
    }
    let (Some(deciding_first), Some(mut deciding_second)) = (
        held_deciding(&steer_first, &first).await,
        held_deciding(&steer_second, &second).await,
    ) else {
        run.violation(&mut out, "script: the sweepers never both came to decide x");
        return run.wrap_up(out, eur).await;
    };
    steer_first.release("decide");
    if tokio::time::timeout(STEP_DEADLINE, deciding_first)
        .await
        .is_err()
    {
        run.violation(&mut out, "script: the first sweeper's pass did not end");
        return run.wrap_up(out, eur).await;
    }
    steer_second.hold_at("converge");
    steer_second.release("decide");
    let settling = settles_at_once(&steer_second, &mut deciding_second).await;
    run.cluster.join(LEDGER_DB, X, 2);
    if settling {
        if !resolved(&run, &resolver).await {
            run.violation(&mut out, "script: the fork of x was never resolved");
        }
        steer_second.release("converge");
        if tokio::time::timeout(STEP_DEADLINE, deciding_second)
            .await
            .is_err()
        {
            run.violation(&mut out, "script: the second sweeper's pass did not end");
        }
    }
    run.wrap_up(out, eur).await
}
