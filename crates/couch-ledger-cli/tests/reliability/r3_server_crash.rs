//! R3, server crash: the harness's own server SIGKILLed and started again (its data kept)
//! while workers submit transfers and record payments; the clients carry on by themselves
//! afterwards, and nothing acknowledged is lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinSet;

use couch_ledger::Ledger;

use crate::shared::{
    amount, audit, create_accounts, eur, eur_accounts, fresh_ledger, independent_check,
    spawn_sweeper, sweep_to_rest, Book, Dbs, Size, Tally, Terms,
};
use crate::support;

/// Kills the harness's own server with SIGKILL (data kept) or starts it again, off the runtime.
async fn server_kill_or_restart(restart: bool) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        let dev = support::server().dev.as_ref().expect("own server");
        let mut dev = dev.lock().unwrap_or_else(|e| e.into_inner());
        if restart {
            dev.restart().map_err(|e| e.to_string())
        } else {
            match dev.pid() {
                Some(_) => {
                    dev.kill();
                    Ok(())
                }
                None => Err("the server was not running".to_owned()),
            }
        }
    })
    .await
    .unwrap()
}

/// What R3's workers share with the part: the book and its counters.
#[derive(Clone, Default)]
struct Load {
    book: Arc<Book>,
    stop: Arc<AtomicBool>,
    /// Successes seen after the last restart: the clients carried on by themselves.
    after_last: Arc<AtomicU64>,
    last_restart_done: Arc<AtomicBool>,
    failed_during: Arc<AtomicU64>,
}

pub async fn r3(size: Size, seed: u64, tally: Arc<Tally>) {
    if support::server().dev.is_none() {
        eprintln!("r3: SKIPPED — COUCHDB_URL is set, so there is no own server to kill (server_restarts counts 0)");
        return;
    }
    let started = Instant::now();
    let lease = Duration::from_secs(2);
    let base = r3_ledger().await;
    let client = base.client().clone();
    let load = Load::default();
    let mut workers = JoinSet::new();
    for w in 0..4u64 {
        let worker = R3Worker {
            w,
            l: fresh_ledger(&client, lease),
            rng: fastrand::Rng::with_seed(seed ^ (0x3300 + w)),
            tally: tally.clone(),
            book: load.book.clone(),
        };
        workers.spawn(worker.run(load.clone()));
    }
    let sweeper = spawn_sweeper(
        "r3",
        fresh_ledger(&client, lease),
        Duration::from_millis(500),
        tally.clone(),
        load.stop.clone(),
        seed ^ 0x33,
    );
    kill_and_restart(size, seed, &tally, &load.book).await;
    load.last_restart_done.store(true, Ordering::Relaxed);
    if !carried_on(&load.after_last).await {
        tally.violation(format!(
            "r3: the clients did not carry on after the last restart ({} successes in 30 s)",
            load.after_last.load(Ordering::Relaxed)
        ));
    }
    load.stop.store(true, Ordering::Relaxed);
    while workers.join_next().await.is_some() {}
    sweeper.await.unwrap();

    let rest = fresh_ledger(&client, lease);
    sweep_to_rest("r3", &rest, &tally, 0, Duration::from_secs(120)).await;
    audit("r3", &rest, &tally).await;
    let n = independent_check("r3", &Dbs::of(&base), &load.book, &tally, &[]).await;
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    eprintln!(
        "r3: {} restarts; {} calls failed (typed) while the server was down; {} acknowledged order entries; {} successes after the last restart; {:?}",
        tally.restarts.load(Ordering::Relaxed),
        load.failed_during.load(Ordering::Relaxed),
        load.book.entries.lock().unwrap().len(),
        load.after_last.load(Ordering::Relaxed),
        started.elapsed()
    );
}

/// R3's ledger: eight accounts and an order whose payments the load records too (write-once
/// documents).
async fn r3_ledger() -> Ledger {
    let base = support::ledger("r3").await;
    create_accounts(&base, &eur_accounts("s", 8, 100_000)).await;
    let purchase = couch_ledger::Purchase::from_json(
        r#"{"order_id": "r3-order", "account_id": "c1", "currency": "EUR",
            "basket": [{"product_id": "p1", "price": 1000000, "tax": 0, "quantity": 1}],
            "delivery": {"option": null, "price": 0, "address": "here"},
            "pretax": 1000000, "tax": 0, "total": 1000000}"#,
        None,
    )
    .unwrap();
    base.record_purchase(&purchase).await.unwrap();
    base
}

/// R3's worker `w`: every fifth call a payment, else a transfer, until `stop`; a failed call is
/// retried by its next iteration, not hammered.
struct R3Worker {
    w: u64,
    l: Ledger,
    rng: fastrand::Rng,
    tally: Arc<Tally>,
    book: Arc<Book>,
}

impl R3Worker {
    async fn run(mut self, load: Load) {
        let mut n = 0u64;
        while !load.stop.load(Ordering::Relaxed) {
            n += 1;
            let ok = if n.is_multiple_of(5) {
                self.record_payment(n).await
            } else {
                self.submit_transfer(n).await
            };
            if ok && load.last_restart_done.load(Ordering::Relaxed) {
                load.after_last.fetch_add(1, Ordering::Relaxed);
            }
            if !ok {
                load.failed_during.fetch_add(1, Ordering::Relaxed);
                // A failed call is retried by the caller's next iteration, not hammered.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// A payment of R3's order; an acknowledged one is booked. `true` when it was acknowledged.
    async fn record_payment(&mut self, n: u64) -> bool {
        let payment = couch_ledger::Payment {
            order_id: "r3-order".into(),
            reference: format!("w{}-{n}", self.w),
            amount: amount(self.rng.i64(1..=100)),
            currency: eur(),
            method: None,
            meta: Default::default(),
        };
        match self.l.record_payment(&payment).await {
            Ok(r) => {
                self.book.entries.lock().unwrap().insert(
                    r.id,
                    json!({"type": "payment", "value": payment.amount.minor()}),
                );
                true
            }
            Err(e) => {
                self.tally.error("r3", &e);
                false
            }
        }
    }

    /// A transfer between two of R3's accounts, waited for eight times in ten. `true` when it
    /// was acknowledged.
    async fn submit_transfer(&mut self, n: u64) -> bool {
        let terms = Terms::random_eur(&mut self.rng, "s", 8, |rng| rng.i64(1..=5_000));
        let id = format!("r3-w{}-{n}", self.w);
        self.book.ask(&id, terms.clone());
        let wait = self.rng.u32(0..10) < 8;
        match self.l.submit(terms.request(&id), wait).await {
            Ok(o) => {
                self.book.ack(&o);
                true
            }
            Err(e) => {
                self.tally.error("r3", &e);
                false
            }
        }
    }
}

/// Kills the server and starts it again `size.r3_restarts` times at random moments.
async fn kill_and_restart(size: Size, seed: u64, tally: &Tally, book: &Book) {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x3333);
    for i in 0..size.r3_restarts {
        tokio::time::sleep(Duration::from_millis(rng.u64(1_000..3_000))).await;
        let acked_before = book.acked.lock().unwrap().len();
        match server_kill_or_restart(false).await {
            Ok(()) => {}
            Err(e) => {
                tally.violation(format!("r3: kill {i}: {e}"));
                continue;
            }
        }
        // The server is down for a moment; calls in flight fail or wait in their retries.
        tokio::time::sleep(Duration::from_millis(rng.u64(100..1_500))).await;
        if let Err(e) = server_kill_or_restart(true).await {
            tally.violation(format!("r3: restart {i}: {e}"));
            break;
        }
        tally.restarts.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "r3: server killed and restarted ({} of {}), {acked_before} transfers acknowledged before",
            i + 1,
            size.r3_restarts
        );
    }
}

/// The clients must carry on by themselves after the last restart: 20 successes within 30 s.
async fn carried_on(after_last: &AtomicU64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if after_last.load(Ordering::Relaxed) >= 20 {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
