//! p2: docs/s through `_bulk_docs`, ours against a raw POST of the same documents.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{ensure, Result};
use couch_ledger::Client;
use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use serde::Serialize;

use crate::bench::{delete_databases, Bench, RawHttp, Side};
use crate::p1_writes::BenchDoc;
use crate::rounds::{interleaved, jobs_for_steady_rate, steady_rate};
use crate::row::Row;
use crate::sizes::{BULK_BATCH_DOCS, BULK_ROUNDS, GOAL_P2};

/// One client's way to write a batch of new documents in one `_bulk_docs` request.
#[derive(Clone)]
pub enum BulkWriter {
    /// `Client::bulk_docs`.
    Ours(Client),
    /// A POST of `{"docs": […]}`, checking the status, reading the body.
    Raw { http: RawHttp, url: String },
}

impl BulkWriter {
    pub fn new(bench: &Bench, side: Side, db: &Client) -> BulkWriter {
        match side {
            Side::Ours => BulkWriter::Ours(db.clone()),
            Side::Raw => BulkWriter::Raw {
                http: bench.raw.clone(),
                url: format!("{}_bulk_docs", bench.raw_prefix(db.database())),
            },
            Side::CouchRs
            | Side::Hot
            | Side::Validated
            | Side::Serve
            | Side::OtherLayout
            | Side::DefaultRevsLimit
            | Side::Floor
            | Side::Phases
            | Side::OneRequest => {
                unreachable!("bulk writes are ours or raw")
            }
        }
    }

    pub async fn write<T: Serialize>(&self, docs: &[T]) -> Result<()> {
        #[derive(Serialize)]
        struct Body<'a, T> {
            docs: &'a [T],
        }
        match self {
            BulkWriter::Ours(client) => {
                let results = client.bulk_docs(docs).await?;
                ensure!(results.iter().all(|r| r.is_ok()), "a bulk write failed");
            }
            BulkWriter::Raw { http, url } => {
                let response = http
                    .request(Method::POST, url.clone())
                    .header(CONTENT_TYPE, "application/json")
                    .body(serde_json::to_vec(&Body { docs })?)
                    .send()
                    .await?;
                let status = response.status();
                ensure!(status.is_success(), "_bulk_docs: {status}");
                response.bytes().await?;
            }
        }
        Ok(())
    }
}

/// Docs/s through `_bulk_docs` in batches of [`BULK_BATCH_DOCS`], one request after another:
/// ours (`Client::bulk_docs`) and a raw POST of the same documents, each in its own database.
pub async fn bulk_ingest(bench: &Bench) -> Result<Vec<Row>> {
    let rounds = bench.settings.scaled(BULK_ROUNDS);
    let per_round = jobs_for_steady_rate(1, 1);
    // Every round's batches, then one batch to open each side's connection.
    let docs: Vec<BenchDoc> = (0..(rounds * per_round + 1) * BULK_BATCH_DOCS)
        .map(BenchDoc::new)
        .collect();
    let batch = |b: usize| &docs[b * BULK_BATCH_DOCS..(b + 1) * BULK_BATCH_DOCS];
    let sides = [Side::Ours, Side::Raw];
    let databases = bench.fresh_databases("bulk", &sides).await?;
    let mut writers = BTreeMap::new();
    for side in sides {
        let writer = BulkWriter::new(bench, side, &databases[&side]);
        writer.write(batch(rounds * per_round)).await?;
        writers.insert(side, writer);
    }
    let samples = interleaved(&sides, rounds, |side, round| {
        let writer = &writers[&side];
        async move {
            let mut finished = Vec::with_capacity(per_round);
            for b in round * per_round..(round + 1) * per_round {
                writer.write(batch(b)).await?;
                finished.push(Instant::now());
            }
            Ok(steady_rate(&finished, 1) * BULK_BATCH_DOCS as f64)
        }
    })
    .await?;
    for (side, db) in &databases {
        let info = db.database_info().await?;
        let expected = docs.len() as u64;
        ensure!(
            info["doc_count"].as_u64() == Some(expected),
            "{}: doc_count {} ≠ {expected}",
            side.name(),
            info["doc_count"]
        );
    }
    delete_databases(databases).await?;
    let row = Row::new(
        "p2",
        format!("bulk ingest docs/s, batches of {BULK_BATCH_DOCS}"),
        "docs/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Raw],
    )
    .goal(Some(GOAL_P2))
    .cpu(&samples, [Side::Ours, Side::Raw], rounds * per_round);
    Ok(vec![row])
}
