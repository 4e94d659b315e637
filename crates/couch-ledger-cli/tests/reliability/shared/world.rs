//! The world of a part: currencies, accounts, transfer terms, what was asked and acknowledged,
//! the transfer graph, and the ledgers, sweepers and monitors a part runs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use couch_ledger::{
    AccountSpec, Amount, Client, Currency, Ledger, LedgerBuilder, State, SweepOptions,
    TransferOutcome, TransferRequest, WriteQuorum,
};

use super::{is_trio_part, raw_accounts, Tally, TRIO_DBS};
use crate::support;
use crate::support::trio::Trio;

pub fn eur() -> Currency {
    Currency::from_code("EUR").unwrap()
}

pub fn usd() -> Currency {
    Currency::from_code("USD").unwrap()
}

pub fn amount(minor: i64) -> Amount {
    Amount::new(minor).unwrap()
}

/// An account of a part's world.
#[derive(Debug, Clone)]
pub struct Acct {
    pub id: String,
    pub currency: Currency,
    pub opening: i64,
    pub min: Option<i64>,
}

/// EUR accounts `{prefix}0` … `{prefix}{n - 1}`, each opened with `opening` and a minimum of 0.
pub fn eur_accounts(prefix: &str, n: usize, opening: i64) -> Vec<Acct> {
    (0..n)
        .map(|i| Acct {
            id: format!("{prefix}{i}"),
            currency: eur(),
            opening,
            min: Some(0),
        })
        .collect()
}

pub async fn create_accounts(l: &Ledger, accounts: &[Acct]) {
    for a in accounts {
        l.create_account(AccountSpec {
            account_id: a.id.clone(),
            currency: a.currency,
            opening: amount(a.opening),
            min_balance: a.min.map(amount),
            meta: Default::default(),
        })
        .await
        .unwrap();
    }
}

/// The terms a transfer id was asked with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terms {
    pub source: String,
    pub destination: String,
    pub value: i64,
    pub currency: String,
    pub reverses: Option<String>,
}

impl Terms {
    pub fn request(&self, id: &str) -> TransferRequest {
        TransferRequest {
            id: Some(id.to_owned()),
            source: self.source.clone(),
            destination: self.destination.clone(),
            amount: amount(self.value),
            currency: Currency::from_code(&self.currency).unwrap(),
            meta: Default::default(),
        }
    }

    /// A EUR transfer from `source` to `destination`.
    pub fn eur(source: impl Into<String>, destination: impl Into<String>, value: i64) -> Terms {
        Terms {
            source: source.into(),
            destination: destination.into(),
            value,
            currency: "EUR".into(),
            reverses: None,
        }
    }

    /// A EUR transfer between two different accounts of `{prefix}0` … `{prefix}{n - 1}`,
    /// drawn from `rng`, then its value.
    pub fn random_eur(
        rng: &mut fastrand::Rng,
        prefix: &str,
        n: usize,
        value: impl FnOnce(&mut fastrand::Rng) -> i64,
    ) -> Terms {
        let from = rng.usize(..n);
        let to = (from + 1 + rng.usize(..n - 1)) % n;
        Terms::eur(
            format!("{prefix}{from}"),
            format!("{prefix}{to}"),
            value(rng),
        )
    }

    /// The terms of the reversal of transfer `id`, asked with these terms.
    pub fn reversal(&self, id: &str) -> Terms {
        Terms {
            source: self.destination.clone(),
            destination: self.source.clone(),
            value: self.value,
            currency: self.currency.clone(),
            reverses: Some(id.to_owned()),
        }
    }
}

/// What a part asked for and what the ledger acknowledged, for the checks afterwards.
#[derive(Default)]
pub struct Book {
    /// Every transfer id asked for, with its terms.
    pub asked: Mutex<HashMap<String, Terms>>,
    /// Every state an `Ok` answer reported for an id.
    pub acked: Mutex<HashMap<String, Vec<State>>>,
    /// Ids a cancel was asked for.
    pub cancels: Mutex<HashSet<String>>,
    /// Order-ledger documents acknowledged: id → the fields that must be there afterwards.
    pub entries: Mutex<HashMap<String, Value>>,
}

impl Book {
    pub fn ask(&self, id: &str, terms: Terms) {
        self.asked.lock().unwrap().insert(id.to_owned(), terms);
    }

    pub fn ack(&self, o: &TransferOutcome) {
        self.acked
            .lock()
            .unwrap()
            .entry(o.id.clone())
            .or_default()
            .push(o.state);
    }

    pub fn terms(&self, id: &str) -> Option<Terms> {
        self.asked.lock().unwrap().get(id).cloned()
    }
}

/// One step of the transfer graph (docs/PROTOCOL.md), written out here rather than taken from the
/// library.
pub fn edge(from: State, to: State) -> bool {
    use State::*;
    matches!(
        (from, to),
        (Initial, Pending)
            | (Initial, Cancelled)
            | (Pending, Committed)
            | (Pending, Canceling)
            | (Committed, Done)
            | (Canceling, Cancelled)
    )
}

/// `to` is `from` or further along the transfer graph.
pub fn reachable(from: State, to: State) -> bool {
    use State::*;
    from == to
        || match from {
            Initial => true,
            Pending => matches!(to, Committed | Done | Canceling | Cancelled),
            Committed => to == Done,
            Canceling => to == Cancelled,
            Done | Cancelled => false,
        }
}

pub fn req(id: &str, from: &str, to: &str, value: i64) -> TransferRequest {
    TransferRequest {
        id: Some(id.to_owned()),
        source: from.to_owned(),
        destination: to.to_owned(),
        amount: Amount::new(value).unwrap_or(Amount::ZERO),
        currency: eur(),
        meta: Default::default(),
    }
}

/// While set (during `r1_trio`), the ledgers made here write accounts with the server's default
/// quorum (`WriteQuorum::ServerDefault`): account conflicts then happen on the trio and are
/// merged, while transfer documents keep their exclusive writes. `r2_trio` runs the program's
/// default, `WriteQuorum::All`. (R1's workers are made with [`another`] from the part's ledger,
/// which `part_ledger` makes with this quorum; `to_builder` keeps it.)
pub static ACCOUNTS_AT_DEFAULT_QUORUM: AtomicBool = AtomicBool::new(false);

/// A new worker on a client's database, on the single layout: for R3, R4 and R5, which run
/// only that layout (R4's workers reach the server through its fault proxy). R1 and R2 use
/// [`another`], which keeps their layout.
pub fn fresh_ledger(client: &Client, lease: Duration) -> Ledger {
    part_quorum(Ledger::builder(client.clone()).lease(lease))
        .build()
        .unwrap()
}

/// `b` writing accounts with the server's default quorum while [`ACCOUNTS_AT_DEFAULT_QUORUM`]
/// is set.
fn part_quorum(b: LedgerBuilder) -> LedgerBuilder {
    if ACCOUNTS_AT_DEFAULT_QUORUM.load(Ordering::Relaxed) {
        b.write_quorum(WriteQuorum::ServerDefault)
    } else {
        b
    }
}

/// A new worker (as if another process opened the ledger) on `like`'s databases — on the
/// split layout too — with `lease`.
pub fn another(like: &Ledger, lease: Duration) -> Ledger {
    another_with(like, lease, |b| b)
}

/// [`another`], configured further by `configure`.
pub fn another_with(
    like: &Ledger,
    lease: Duration,
    configure: impl FnOnce(LedgerBuilder) -> LedgerBuilder,
) -> Ledger {
    let l = configure(like.to_builder().lease(lease)).build().unwrap();
    assert_eq!(l.hot_database(), like.hot_database());
    l
}

/// A sweeper task: passes until `stop`, crashes and problems booked.
pub fn spawn_sweeper(
    part: &'static str,
    l: Ledger,
    stale_after: Duration,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> tokio::task::JoinHandle<(u64, u64, u64)> {
    tokio::spawn(async move {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (mut passes, mut finished, mut repaired) = (0u64, 0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let options = SweepOptions {
                limit: 100,
                stale_after,
            };
            match l.sweep_once(options).await {
                Ok(o) => {
                    tally.problems(part, &o.problems);
                    finished += o.advanced + o.cancelled;
                    repaired += o.repaired_markers;
                }
                Err(e) => tally.error(part, &e),
            }
            passes += 1;
            tokio::time::sleep(Duration::from_millis(rng.u64(20..120))).await;
        }
        (passes, finished, repaired)
    })
}

/// Reads every account raw every `period` until `stop`, checking that no limited account is
/// ever below its minimum, in balance or in available (invariant 3 of docs/PROTOCOL.md, "at every moment"). `db` is
/// the database holding the accounts (the hot one on the split layout).
pub fn spawn_overdraft_monitor(
    part: &'static str,
    db: String,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let several_copies = is_trio_part(part) || support::copies(&db).await > 1;
        let mut samples = 0;
        while !stop.load(Ordering::Relaxed) {
            for a in raw_accounts(&db).await {
                let Some(min) = a["min_balance"].as_i64() else {
                    continue;
                };
                let balance = a["balance"].as_i64().unwrap_or(0);
                let credits: i64 = a["pending"]
                    .as_array()
                    .map(|p| {
                        p.iter()
                            .filter_map(|m| m["delta"].as_i64())
                            .filter(|d| *d > 0)
                            .sum()
                    })
                    .unwrap_or(0);
                if balance < min || balance - credits < min {
                    let id = a["_id"].as_str().unwrap_or("?");
                    tally.moment_below_minimum(
                        part,
                        id,
                        format!(
                            "{part}: {db}/{id} overdrawn at a moment: balance {balance}, available {}, min {min}",
                            balance - credits
                        ),
                        several_copies,
                    );
                }
            }
            samples += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        samples
    })
}

/// A ledger on a fresh database: on the harness's server (with `split`, on the split layout:
/// accounts and transfers in a second database, `<db>_hot`), or created on the trio's three
/// nodes (replicating) and used through its proxy (single layout only).
pub async fn part_ledger(trio: Option<&Trio>, name: &str, split: bool) -> Ledger {
    let Some(trio) = trio else {
        return if split {
            support::split_ledger(name).await
        } else {
            support::ledger(name).await
        };
    };
    assert!(
        !split,
        "{name}: the trio parts run the single layout (their convergence and conflict checks \
         watch one database)"
    );
    let db = support::db_name(name);
    trio.database(&db).await;
    TRIO_DBS
        .lock()
        .unwrap()
        .insert(db.clone(), (trio.node(0), trio.url()));
    let l = Ledger::new(
        Client::builder()
            .url(trio.url())
            .database(&db)
            .request_timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    l.init().await.expect("init through the trio's proxy");
    part_quorum(l.to_builder()).build().unwrap()
}
