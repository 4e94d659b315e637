//! p1 (and writes_c4, writes_c64): single-document creates/s of ours, raw reqwest and
//! couch_rs at one concurrency, each in a database of its own, alternating round by round.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, ensure, Result};
use couch_ledger::Client;
use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::bench::{delete_databases, Bench, RawHttp, Side, WritePoint};
use crate::rounds::{interleaved, jobs_for_steady_rate, run_concurrently, steady_rate};
use crate::row::{Goal, Row};
use crate::sizes::{
    PAYLOAD_BYTES, WRITES_PER_ROUND, WRITES_PER_ROUND_PER_CONNECTION_MIN, WRITE_ROUNDS,
    WRITE_ROUNDS_C1,
};

/// The document every write figure writes: about 250 bytes of JSON, with a fixed-width id so
/// every side sends bodies of the same size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchDoc {
    #[serde(rename = "_id")]
    pub id: String,
    #[serde(rename = "_rev", skip_serializing_if = "Option::is_none")]
    pub rev: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub seq: u64,
    pub payload: String,
}

impl BenchDoc {
    pub fn new(i: usize) -> BenchDoc {
        BenchDoc {
            id: format!("d{i:08}"),
            rev: None,
            kind: "bench_item".to_owned(),
            seq: i as u64,
            payload: "x".repeat(PAYLOAD_BYTES),
        }
    }
}

impl couch_rs::document::TypedCouchDocument for BenchDoc {
    fn get_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.id)
    }
    fn get_rev(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.rev.as_deref().unwrap_or(""))
    }
    fn set_rev(&mut self, rev: &str) {
        self.rev = Some(rev.to_owned());
    }
    fn set_id(&mut self, id: &str) {
        id.clone_into(&mut self.id);
    }
    fn merge_ids(&mut self, other: &Self) {
        self.set_id(&other.id);
        self.rev.clone_from(&other.rev);
    }
}

/// One client's way to create a new document with a known id.
#[derive(Clone)]
pub enum Writer {
    /// `Client::put`.
    Ours(Client),
    /// A PUT with `Content-Type: application/json`, checking the status, reading the body.
    Raw { http: RawHttp, db_prefix: String },
    /// `Database::save`, couch_rs's PUT of the document's `_id`.
    CouchRs(Arc<couch_rs::database::Database>),
}

impl Writer {
    pub async fn new(bench: &Bench, side: Side, db: &Client) -> Result<Writer> {
        Ok(match side {
            Side::Ours => Writer::Ours(db.clone()),
            Side::Raw => Writer::Raw {
                http: bench.raw.clone(),
                db_prefix: bench.raw_prefix(db.database()),
            },
            Side::CouchRs => {
                let database = bench
                    .couch_rs
                    .db(db.database())
                    .await
                    .map_err(|e| anyhow!("couch_rs db: {e}"))?;
                Writer::CouchRs(Arc::new(database))
            }
            Side::Hot
            | Side::Validated
            | Side::Serve
            | Side::OtherLayout
            | Side::DefaultRevsLimit
            | Side::Floor
            | Side::Phases
            | Side::OneRequest => {
                unreachable!("{side:?} writes transfers")
            }
        })
    }

    pub async fn create(&self, i: usize) -> Result<()> {
        let mut doc = BenchDoc::new(i);
        match self {
            Writer::Ours(client) => {
                client.put(&doc.id, &doc).await?;
            }
            Writer::Raw { http, db_prefix } => {
                let response = http
                    .request(Method::PUT, format!("{db_prefix}{}", doc.id))
                    .header(CONTENT_TYPE, "application/json")
                    .body(serde_json::to_vec(&doc)?)
                    .send()
                    .await?;
                ensure!(response.status().is_success(), "PUT: {}", response.status());
                response.bytes().await?;
            }
            Writer::CouchRs(database) => {
                database
                    .save(&mut doc)
                    .await
                    .map_err(|e| anyhow!("couch_rs save: {e}"))?;
            }
        }
        Ok(())
    }

    /// Runs `create` for every index of `jobs`, `concurrency` at a time; when each finished.
    pub async fn create_all(&self, jobs: Range<usize>, concurrency: usize) -> Result<Vec<Instant>> {
        let writer = self.clone();
        run_concurrently(jobs, concurrency, move |_, i| {
            let writer = writer.clone();
            async move { writer.create(i).await }
        })
        .await
    }
}

/// Single-document creates/s at `concurrency`: ours, raw and couch_rs, each in its own fresh
/// database, alternating round by round.
pub async fn single_writes(
    bench: &Bench,
    concurrency: usize,
    key: &str,
    goal: Option<Goal>,
) -> Result<Vec<Row>> {
    let (rounds, timed) = if concurrency == 1 {
        (WRITE_ROUNDS_C1, 1)
    } else {
        let timed = WRITES_PER_ROUND.max(WRITES_PER_ROUND_PER_CONNECTION_MIN * concurrency);
        (WRITE_ROUNDS, timed)
    };
    let rounds = bench.settings.scaled(rounds);
    let writes = jobs_for_steady_rate(timed, concurrency);
    let sides = [Side::Ours, Side::Raw, Side::CouchRs];
    let databases = bench
        .fresh_databases(&format!("writes_c{concurrency}"), &sides)
        .await?;
    let mut writers = BTreeMap::new();
    for side in sides {
        let writer = Writer::new(bench, side, &databases[&side]).await?;
        // Untimed, after the last round's ids: fills the pool with `concurrency` connections.
        let warm_up = rounds * writes;
        writer
            .create_all(warm_up..warm_up + concurrency, concurrency)
            .await?;
        writers.insert(side, writer);
    }
    let ours_requests_before = databases[&Side::Ours].requests_sent();
    let samples = interleaved(&sides, rounds, |side, round| {
        let writer = writers[&side].clone();
        async move {
            let first = round * writes;
            let finished = writer
                .create_all(first..first + writes, concurrency)
                .await?;
            Ok(steady_rate(&finished, concurrency))
        }
    })
    .await?;
    // One request per write, or retries distorted the figure.
    let ours_requests = databases[&Side::Ours].requests_sent() - ours_requests_before;
    let retried = ours_requests - (rounds * writes) as u64;
    delete_databases(databases).await?;

    let (ours, raw, peer) = (
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Raw],
        &samples.figures[&Side::CouchRs],
    );
    let ops = rounds * writes; // every write of a round takes CPU, timed or not
    let mut ours_row = Row::new(
        key,
        format!("single-doc writes/s, c{concurrency}"),
        "writes/s",
        ours,
        raw,
    )
    .goal(goal)
    .cpu(&samples, [Side::Ours, Side::Raw], ops);
    if retried > 0 {
        ours_row = ours_row.note(format!("{retried} requests of ours were retries"));
    }
    let peer_row = Row::new(
        &format!("couch_rs_c{concurrency}"),
        format!("couch_rs single-doc writes/s, c{concurrency} (peer)"),
        "writes/s",
        peer,
        raw,
    )
    .cpu(&samples, [Side::CouchRs, Side::Raw], ops);
    let point = WritePoint {
        concurrency,
        raw: ours_row.raw,
        ours: ours_row.raw * ours_row.ratio,
        couch_rs: peer_row.raw * peer_row.ratio,
    };
    bench
        .measured
        .lock()
        .expect("lock")
        .write_points
        .push(point);
    Ok(vec![ours_row, peer_row])
}
