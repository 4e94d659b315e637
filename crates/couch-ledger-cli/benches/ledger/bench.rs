//! What every figure works with: the server, one client of each kind, and what earlier figures
//! measured.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, ensure, Result};
use couch_ledger::Client;
use reqwest::Method;
use serde::Serialize;

use crate::settings::{Server, Settings};
use crate::sizes::REQUEST_TIMEOUT_S;
use crate::transfers::TransferCost;

/// The minimal client a user would write: reqwest with its defaults and a timeout, plus the
/// server's credentials.
#[derive(Clone)]
pub struct RawHttp {
    pub client: reqwest::Client,
    pub credentials: Option<(String, String)>,
}

impl RawHttp {
    pub fn request(&self, method: Method, url: String) -> reqwest::RequestBuilder {
        let request = self.client.request(method, url);
        match &self.credentials {
            Some((user, password)) => request.basic_auth(user, Some(password)),
            None => request,
        }
    }
}

/// Which client a round measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    Ours,
    Raw,
    CouchRs,
    /// `p5`: our transfers, all paying into one account.
    Hot,
    /// `p6`, `p8`: raw `_bulk_docs` of transfer documents into a ledger database, where
    /// `validate_doc_update` runs for every document.
    Validated,
    /// `p9`: transfers sent over HTTP to `couch-ledger serve`.
    Serve,
    /// `p10_other`: our transfers on the other layout (`BENCH_OTHER_LAYOUT=1`).
    OtherLayout,
    /// `p8_aged`: our transfers in a database left at CouchDB's default `_revs_limit`.
    DefaultRevsLimit,
    /// `p8_floor`: only the documents a transfer cannot do without ([`DocumentFloor`]).
    Floor,
    /// `p8_phases`: today's documents, batched ideally ([`FloorShape::Phases`]).
    Phases,
    /// `p8_one_request`: a transfer in one request, batched ideally ([`FloorShape::OneRequest`],
    /// `BENCH_ONE_REQUEST=1`).
    OneRequest,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::Raw => "raw",
            Side::CouchRs => "couch_rs",
            Side::Hot => "hot",
            Side::Validated => "validated",
            Side::Serve => "serve",
            Side::OtherLayout => "other_layout",
            Side::DefaultRevsLimit => "default_revs_limit",
            Side::Floor => "floor",
            Side::Phases => "phases",
            Side::OneRequest => "one_request",
        }
    }
}

/// Single-document writes/s of the three clients at one concurrency: a point of the plot.
///
/// Raw is the median of its rounds; ours and couch_rs are raw times their median paired ratio.
/// Their own medians come from other rounds than raw's, so on a busy machine they can stray
/// from raw's by more than the client makes a difference; the paired estimate cannot.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WritePoint {
    pub concurrency: usize,
    pub raw: f64,
    pub ours: f64,
    pub couch_rs: f64,
}

/// What every figure works with: the server, one client of each kind (connection pools reused
/// across rounds), and what earlier figures measured.
pub struct Bench {
    pub settings: Settings,
    pub server: Server,
    /// Ours, on no particular database: a figure takes `with_database`.
    pub ours: Client,
    pub raw: RawHttp,
    pub couch_rs: couch_rs::Client,
    pub databases_made: AtomicUsize,
    /// Filled by the figures as they run.
    pub measured: Mutex<Measured>,
}

#[derive(Default)]
pub struct Measured {
    pub write_points: Vec<WritePoint>,
    /// What `p3` found a transfer costs, for the transfer figures after it.
    pub transfer_cost: Option<TransferCost>,
    /// Transfers/s against concurrency (`p3`, `p4_c16`, `p8`), for the plot.
    pub transfer_points: Vec<TransferPoint>,
    /// `p8`'s limits, transfers/s: raw bulk docs/s ÷ documents written per transfer, into a
    /// plain database and into a validated one.
    pub bulk_limits: Option<BulkLimits>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct BulkLimits {
    pub plain: f64,
    pub validated: f64,
}

/// Transfers/s at one concurrency, beside the limit that figure divides by.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TransferPoint {
    pub concurrency: usize,
    /// Transfers/s.
    pub ours: f64,
}

impl Bench {
    pub fn new(settings: Settings, server: Server) -> Result<Bench> {
        let timeout = Duration::from_secs(REQUEST_TIMEOUT_S);
        let mut builder = Client::builder()
            .url(&server.url)
            .database("bench")
            .request_timeout(timeout);
        if let Some((user, password)) = &server.credentials {
            builder = builder.basic_auth(user, password);
        }
        let ours = builder.build()?;
        let raw = RawHttp {
            client: reqwest::Client::builder().timeout(timeout).build()?,
            credentials: server.credentials.clone(),
        };
        let (user, password) = match &server.credentials {
            Some((u, p)) => (Some(u.as_str()), Some(p.as_str())),
            None => (None, None),
        };
        let couch_rs = couch_rs::Client::new_with_timeout(
            &server.url,
            user,
            password,
            Some(REQUEST_TIMEOUT_S),
        )
        .map_err(|e| anyhow!("couch_rs client: {e}"))?;
        Ok(Bench {
            settings,
            server,
            ours,
            raw,
            couch_rs,
            databases_made: AtomicUsize::new(0),
            measured: Mutex::new(Measured::default()),
        })
    }

    /// Creates a fresh, empty database and returns our client on it (its own request counter,
    /// the shared connection pool).
    pub async fn fresh_database(&self, purpose: &str) -> Result<Client> {
        let n = self.databases_made.fetch_add(1, Ordering::Relaxed);
        let name = format!("bench_{purpose}_{n:03}_{:08x}", fastrand::u32(..));
        let client = self.ours.with_database(&name)?;
        ensure!(
            client.ensure_database().await?,
            "database {name} existed already"
        );
        Ok(client)
    }

    /// A fresh database per side.
    pub async fn fresh_databases(
        &self,
        purpose: &str,
        sides: &[Side],
    ) -> Result<BTreeMap<Side, Client>> {
        let mut databases = BTreeMap::new();
        for &side in sides {
            let client = self
                .fresh_database(&format!("{purpose}_{}", side.name()))
                .await?;
            databases.insert(side, client);
        }
        Ok(databases)
    }

    /// `base/db/` for raw requests.
    pub fn raw_prefix(&self, db: &str) -> String {
        format!("{}/{db}/", self.server.url)
    }
}

pub async fn delete_databases(databases: BTreeMap<Side, Client>) -> Result<()> {
    for client in databases.into_values() {
        client.delete_database().await?;
    }
    Ok(())
}
