//! The document floor (`p8_floor`) and today's documents batched ideally (`p8_phases`,
//! `p8_one_request`): the most transfers/s this server takes from any protocol writing those
//! documents.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Result};
use couch_ledger::{BulkResult, Client, Ledger};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::bench::Bench;
use crate::p8_batched::{P8_CONCURRENCY, P8_POOL_ACCOUNTS};
use crate::settings::Layout;
use crate::transfers::{
    account_docs, account_id, fresh_ledger_in, transfer_amount, unix_ms, TRANSFER_CURRENCY,
};

/// `p8_floor`'s writers, each with its own share of the account pool (their writes never meet).
/// One: with `p8`'s 64 transfers in flight, one request of 64 at a time measured highest on
/// CouchDB 3.4.3 here (3,529 transfers/s, against 2,412 for two writers of 32 and
/// 2,394 for four of 16), and the floor is the best the server does.
pub const FLOOR_WRITERS: usize = 1;
/// Transfers per `_bulk_docs` of one floor writer: with [`FLOOR_WRITERS`], `p8`'s 64 transfers
/// in flight.
pub const FLOOR_TRANSFERS_PER_REQUEST: usize = P8_CONCURRENCY / FLOOR_WRITERS;

/// What no protocol can write less of: for each transfer, its transfer document
/// created once, already in its final state, and one update of each of its two accounts (the
/// balance only, no markers). Written into the hot database of a fresh split ledger (the same
/// `_revs_limit` and design documents as `p8`'s), [`FLOOR_TRANSFERS_PER_REQUEST`] transfers per
/// `_bulk_docs` by [`FLOOR_WRITERS`] writers at once, the accounts at random as `p8` picks them
/// (consecutive ones were used before, which CouchDB takes much faster:
/// `BENCH_FLOOR_ORDERED=1`), never a read, never a conflict: the rate at which this server
/// takes the documents a ledger of docs/DOCUMENTS.md's shape must write. A protocol that keeps one
/// document per transfer and changes both accounts by compare-and-swap cannot go faster on this
/// server, whatever it does between the writes.
///
/// [`FloorShape::Phases`] writes today's documents the same ideal way (`p8_phases`).
pub struct DocumentFloor {
    pub shape: FloorShape,
    pub ledger: Ledger,
    /// Each writer's documents, as last written.
    pub writers: std::sync::Mutex<Vec<FloorWriter>>,
    pub next_transfer: AtomicUsize,
}

/// One [`DocumentFloor`] writer's documents between its requests.
pub struct FloorWriter {
    /// Its accounts, as last written (with `_rev`).
    pub accounts: Vec<Value>,
    /// [`FloorShape::OneRequest`]: the transfer documents its last request created `initial`,
    /// with the markers their decision names, decided in its next request.
    pub undecided: Vec<(Value, Value)>,
}

/// What a [`DocumentFloor`] writes for each transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorShape {
    /// The transfer document once, in its final state; each account once, balance only: one
    /// request per [`FLOOR_TRANSFERS_PER_REQUEST`] transfers.
    Floor,
    /// The documents the ledger writes today (the one-write path, docs/ONE_WRITE.md), batched
    /// as well as they can be: per [`FLOOR_TRANSFERS_PER_REQUEST`] transfers, two requests one
    /// after another — both accounts of each transfer updated with its pending marker (attempt
    /// and peer; the previous marker settled, folded in as the ledger folds it, its entry kept
    /// among at most 32, as pruning keeps them few on a server with several copies), then the
    /// transfer documents created `done`, naming the markers. Three documents a transfer.
    /// (The stepwise protocol's documents were five a transfer in four requests.)
    Phases,
    /// A protocol answering after one request (`BENCH_ONE_REQUEST=1`):
    /// per [`FLOOR_TRANSFERS_PER_REQUEST`] transfers one request holding both accounts of each
    /// with its marker (as [`FloorShape::Phases`]), its transfer document created `initial`,
    /// and the previous request's transfer documents moved to `done` naming their markers
    /// (the decision follows the answer in the next request). Four documents a transfer.
    OneRequest,
}

/// Settled entries a [`FloorShape::Phases`] account keeps.
pub const PHASES_SETTLED_KEPT: usize = 32;

impl DocumentFloor {
    pub async fn new(bench: &Bench, shape: FloorShape) -> Result<DocumentFloor> {
        let purpose = match shape {
            FloorShape::Floor => "p8_floor",
            FloorShape::Phases => "p8_phases",
            FloorShape::OneRequest => "p8_one_request",
        };
        let ledger = fresh_ledger_in(bench, purpose, Layout::Split).await?;
        let ids: Vec<String> = (0..P8_POOL_ACCOUNTS).map(|i| account_id("f", i)).collect();
        let mut docs = account_docs(&ids);
        let results = ledger.hot_client().bulk_docs(&docs).await?;
        ensure!(
            results.len() == docs.len(),
            "p8_floor: short _bulk_docs answer"
        );
        for (doc, result) in docs.iter_mut().zip(results) {
            let rev = result
                .rev
                .ok_or_else(|| anyhow!("p8_floor: loading accounts: {:?}", result.error))?;
            doc["_rev"] = json!(rev);
        }
        let writers: Vec<FloorWriter> = docs
            .chunks(P8_POOL_ACCOUNTS / FLOOR_WRITERS)
            .map(|accounts| FloorWriter {
                accounts: accounts.to_vec(),
                undecided: Vec::new(),
            })
            .collect();
        let floor = DocumentFloor {
            shape,
            ledger,
            writers: std::sync::Mutex::new(writers),
            next_transfer: AtomicUsize::new(0),
        };
        floor
            .round(FLOOR_WRITERS * FLOOR_TRANSFERS_PER_REQUEST)
            .await?; // connections; untimed
        Ok(floor)
    }

    /// Transfers/s of `transfers` transfers' documents (rounded up to whole requests).
    /// An error leaves the floor unusable (its accounts' revisions are lost with the writer).
    pub async fn round(&self, transfers: usize) -> Result<f64> {
        let per_writer = transfers.div_ceil(FLOOR_WRITERS);
        let requests = per_writer.div_ceil(FLOOR_TRANSFERS_PER_REQUEST);
        let taken = std::mem::take(&mut *self.writers.lock().expect("not poisoned"));
        ensure!(
            taken.len() == FLOOR_WRITERS,
            "p8_floor: a round failed before"
        );
        let first = self.next_transfer.fetch_add(
            FLOOR_WRITERS * requests * FLOOR_TRANSFERS_PER_REQUEST,
            Ordering::Relaxed,
        );
        let started = Instant::now();
        let mut writers = JoinSet::new();
        for (w, writer) in taken.into_iter().enumerate() {
            let client = self.ledger.hot_client().clone();
            let first = first + w * requests * FLOOR_TRANSFERS_PER_REQUEST;
            writers.spawn(floor_writer(self.shape, client, writer, first, requests));
        }
        let mut back = Vec::with_capacity(FLOOR_WRITERS);
        while let Some(writer) = writers.join_next().await {
            back.push(writer??);
        }
        let span = started.elapsed();
        *self.writers.lock().expect("not poisoned") = back;
        let written = FLOOR_WRITERS * requests * FLOOR_TRANSFERS_PER_REQUEST;
        Ok(written as f64 / span.as_secs_f64())
    }

    pub async fn drop_databases(self) -> Result<()> {
        self.ledger.client().delete_database().await?;
        self.ledger.hot_client().delete_database().await?;
        Ok(())
    }
}

/// One [`DocumentFloor`] writer: `requests` `_bulk_docs` one after another, each creating
/// [`FLOOR_TRANSFERS_PER_REQUEST`] transfer documents and updating the two accounts of each
/// (all distinct within a request). Returns its documents as last written.
pub async fn floor_writer(
    shape: FloorShape,
    client: Client,
    writer: FloorWriter,
    first: usize,
    requests: usize,
) -> Result<FloorWriter> {
    let FloorWriter {
        mut accounts,
        mut undecided,
    } = writer;
    let pairs_per_request = FLOOR_TRANSFERS_PER_REQUEST;
    ensure!(
        accounts.len() >= 2 * pairs_per_request,
        "p8_floor: too few accounts per writer"
    );
    let now = unix_ms();
    for r in 0..requests {
        let mut docs = Vec::with_capacity(3 * pairs_per_request);
        let mut touched = Vec::with_capacity(2 * pairs_per_request);
        let picks = pick_accounts(accounts.len(), first, r);
        for k in 0..pairs_per_request {
            let i = first + r * pairs_per_request + k;
            let (from, to) = (picks[2 * k], picks[2 * k + 1]);
            let amount = transfer_amount(i);
            for (slot, delta) in [(from, -amount), (to, amount)] {
                move_balance(&mut accounts, slot, delta)?;
                if shape != FloorShape::Floor {
                    let peer = accounts[if slot == from { to } else { from }]["account_id"].clone();
                    add_marker(&mut accounts[slot], i, delta, peer, now);
                }
                touched.push(slot);
            }
            docs.push(done_transfer_doc(
                i,
                &accounts[from],
                &accounts[to],
                amount,
                now,
            ));
        }
        docs.extend(touched.iter().map(|&slot| accounts[slot].clone()));
        let results = write_request(shape, &client, &mut docs, &mut undecided).await?;
        ensure!(
            results.len() == docs.len(),
            "p8_floor: short _bulk_docs answer"
        );
        let account_results = &results[pairs_per_request..pairs_per_request + touched.len()];
        for (&slot, result) in touched.iter().zip(account_results) {
            let rev = result
                .rev
                .clone()
                .ok_or_else(|| anyhow!("p8_floor: an account write failed: {:?}", result.error))?;
            accounts[slot]["_rev"] = json!(rev);
        }
        if let Some(bad) = results[..pairs_per_request].iter().find(|r| !r.is_ok()) {
            bail!("p8_floor: a transfer document failed: {bad:?}");
        }
    }
    Ok(FloorWriter {
        accounts,
        undecided,
    })
}

/// The accounts of request `r` (of a writer whose first transfer is `first`) at random, as
/// p8's callers pick them (distinct within one request, as one request cannot update a
/// document twice); `BENCH_FLOOR_ORDERED=1`: consecutive pairs, as before (CouchDB updates
/// neighbouring ids much faster).
fn pick_accounts(n: usize, first: usize, r: usize) -> Vec<usize> {
    let pairs_per_request = FLOOR_TRANSFERS_PER_REQUEST;
    if std::env::var("BENCH_FLOOR_ORDERED").is_ok() {
        (0..2 * pairs_per_request)
            .map(|j| (2 * r * pairs_per_request + j) % n)
            .collect()
    } else {
        fastrand::Rng::with_seed((first + r * pairs_per_request) as u64)
            .choose_multiple(0..n, 2 * pairs_per_request)
    }
}

/// Adds `delta` to the balance of account `slot`.
fn move_balance(accounts: &mut [Value], slot: usize, delta: i64) -> Result<()> {
    let balance = accounts[slot]["balance"]
        .as_i64()
        .and_then(|b| b.checked_add(delta))
        .ok_or_else(|| anyhow!("p8_floor: balance out of range"))?;
    accounts[slot]["balance"] = json!(balance);
    Ok(())
}

/// The marker of transfer `i` on `account` (its attempt and the other account named, as the
/// one-write path writes it), the previous one settled: folded in.
fn add_marker(account: &mut Value, i: usize, delta: i64, peer: Value, now: i64) {
    let mut settled: Vec<Value> = account["settled"]
        .get(0)
        .and_then(|group| group["txns"].as_array().cloned())
        .unwrap_or_default();
    if let Some(marker) = account["pending"].get(0) {
        settled.push(marker["txn"].clone());
    }
    let drop = settled.len().saturating_sub(PHASES_SETTLED_KEPT);
    settled.drain(..drop);
    account["settled"] = if settled.is_empty() {
        json!([])
    } else {
        json!([{ "at": now, "txns": settled }])
    };
    account["pending"] = json!([{
        "txn": format!("floor{i:07}"), "delta": delta, "at": now,
        "attempt": format!("{:012x}", i * 7919), "peer": peer,
    }]);
}

/// Transfer `floor{i}` between two accounts, created `done`.
fn done_transfer_doc(i: usize, from: &Value, to: &Value, amount: i64, now: i64) -> Value {
    let id = format!("floor{i:07}");
    json!({
        "_id": format!("txn:{id}"),
        "type": "transaction",
        "txn_id": id,
        "source": from["account_id"],
        "destination": to["account_id"],
        "value": amount,
        "currency": TRANSFER_CURRENCY,
        "state": "done",
        "reason": null,
        "reverses": null,
        "claim": null,
        "created_at": now,
        "last_modified": now,
    })
}

/// Writes one request's documents (its transfer documents first, then the accounts) in
/// `shape`'s way; the results in the order of `docs`, the accounts' after the transfers'.
async fn write_request(
    shape: FloorShape,
    client: &Client,
    docs: &mut Vec<Value>,
    undecided: &mut Vec<(Value, Value)>,
) -> Result<Vec<BulkResult>> {
    let pairs_per_request = FLOOR_TRANSFERS_PER_REQUEST;
    Ok(match shape {
        FloorShape::Floor => client.bulk_docs(docs).await?,
        FloorShape::OneRequest => {
            // This request's transfer documents `initial`, the last request's decided.
            let created = pairs_per_request;
            for txn in &mut docs[..created] {
                txn["state"] = json!("initial");
            }
            let deciding = std::mem::take(undecided);
            docs.extend(deciding.iter().map(|(txn, markers)| {
                let mut done = txn.clone();
                done["state"] = json!("done");
                done["markers"] = markers.clone();
                done
            }));
            let results = client.bulk_docs(docs).await?;
            if let Some(bad) = results[docs.len() - deciding.len()..]
                .iter()
                .find(|r| !r.is_ok())
            {
                bail!("p8_one_request: a decision failed: {bad:?}");
            }
            for (txn, result) in docs[..created].iter().zip(&results) {
                let mut txn = txn.clone();
                txn["_rev"] = json!(result.rev.clone().unwrap_or_default());
                let attempt = json!(floor_attempt(&txn));
                undecided.push((txn, json!({ "source": attempt, "destination": attempt })));
            }
            results
        }
        FloorShape::Phases => {
            // The accounts first, then the transfer documents created in their final state,
            // naming the markers' attempts.
            let (txns, account_docs) = docs.split_at_mut(pairs_per_request);
            let written = client.bulk_docs(account_docs).await?;
            for txn in txns.iter_mut() {
                let attempt = floor_attempt(txn);
                txn["markers"] = json!({ "source": attempt, "destination": attempt });
            }
            let mut results = client.bulk_docs(txns).await?;
            results.extend(written);
            results
        }
    })
}

/// The attempt a floor writer's markers of transfer document `txn` carry.
pub fn floor_attempt(txn: &Value) -> String {
    let n = txn["txn_id"].as_str().unwrap_or_default()["floor".len()..]
        .parse::<usize>()
        .unwrap_or(0);
    format!("{:012x}", n * 7919)
}
