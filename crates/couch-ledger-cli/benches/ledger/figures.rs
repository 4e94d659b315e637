//! The table of figures: each one's key, when it runs and the function measuring it.

use std::future::Future;
use std::pin::Pin;

use anyhow::Result;

use crate::bench::Bench;
use crate::p1_writes::single_writes;
use crate::p2_bulk::bulk_ingest;
use crate::p3_requests::requests_per_transfer;
use crate::p4_p5_concurrent::concurrent_transfers;
use crate::p6_sweeper::sweeper;
use crate::p7_orders::order_balance;
use crate::p8_batched::batched_transfers;
use crate::p8_long_aged::{aged_transfers, long_seconds, long_transfers};
use crate::p9_serve::served_transfers;
use crate::row::Row;
use crate::settings::Settings;
use crate::sizes::{DOCS_PER_ORDER, GOAL_P1, GOAL_P7, P7_ORDERS};

/// One entry of the table of figures: a function measuring it, run when `enabled`.
pub struct Figure {
    pub key: &'static str,
    pub enabled: fn(&Settings) -> bool,
    pub measure: for<'a> fn(&'a Bench) -> Measuring<'a>,
}

pub type Measuring<'a> = Pin<Box<dyn Future<Output = Result<Vec<Row>>> + 'a>>;

/// Every figure, in the order they run. A figure may return more than one row (the single-write
/// figures also report couch_rs at the same concurrency).
pub const FIGURES: &[Figure] = &[
    // The transfer figures first, the batched one (`p8`) right after `p3`, which the others
    // divide by, and the figures of many small concurrent writes last (`p4_p5`, then the
    // single-write and order figures below): CouchDB 3.4.3 here writes ~30 % slower for the rest
    // of its uptime once it has served thousands of concurrent single-document writes (measured
    // with raw HTTP alone, no ledger: a bulk workload at 2,517–2,721 transfers/s before, 1,771–
    // 1,933 after, still after a minute, fast again after a restart; BENCHMARKS.md),
    // so a figure measured after them measures that server instead. Every figure still divides
    // by its raw side measured in the same rounds.
    Figure {
        key: "p3",
        enabled: always,
        measure: |b| Box::pin(requests_per_transfer(b)),
    },
    Figure {
        key: "p8",
        enabled: always,
        measure: |b| Box::pin(batched_transfers(b)),
    },
    // p8's workload on accounts with a long revision history, with and without init's
    // `_revs_limit`.
    Figure {
        key: "p8_aged",
        enabled: always,
        measure: |b| Box::pin(aged_transfers(b)),
    },
    // p8's workload without pause for minutes (opt-in: BENCH_LONG_S).
    Figure {
        key: "p8_long",
        enabled: |_| long_seconds().is_some(),
        measure: |b| Box::pin(long_transfers(b)),
    },
    // The same transfers through the HTTP service, against the library path (p8's workload).
    Figure {
        key: "p9",
        enabled: |_| cfg!(feature = "serve"),
        measure: |b| Box::pin(served_transfers(b)),
    },
    // p6 and sweeper_rss come from the same run of the sweeper.
    Figure {
        key: "p6",
        enabled: always,
        measure: |b| Box::pin(sweeper(b)),
    },
    // p4_c16 and p5 come from the same rounds.
    Figure {
        key: "p4_p5",
        enabled: always,
        measure: |b| Box::pin(concurrent_transfers(b)),
    },
    Figure {
        key: "p1_c1",
        enabled: always,
        measure: |b| Box::pin(single_writes(b, 1, "p1_c1", Some(GOAL_P1))),
    },
    Figure {
        key: "p1_c16",
        enabled: always,
        measure: |b| Box::pin(single_writes(b, 16, "p1_c16", Some(GOAL_P1))),
    },
    Figure {
        key: "writes_c4",
        enabled: always,
        measure: |b| Box::pin(single_writes(b, 4, "writes_c4", None)),
    },
    Figure {
        key: "writes_c64",
        enabled: always,
        measure: |b| Box::pin(single_writes(b, 64, "writes_c64", None)),
    },
    Figure {
        key: "p2",
        enabled: always,
        measure: |b| Box::pin(bulk_ingest(b)),
    },
    Figure {
        key: "p7",
        enabled: always,
        measure: |b| Box::pin(order_balance(b, P7_ORDERS, "p7", Some(GOAL_P7))),
    },
    Figure {
        key: "balance_10k",
        enabled: always,
        measure: |b| {
            Box::pin(order_balance(
                b,
                10_000 / DOCS_PER_ORDER,
                "balance_10k",
                None,
            ))
        },
    },
    Figure {
        key: "balance_100k",
        enabled: |s| s.big || s.huge,
        measure: |b| {
            Box::pin(order_balance(
                b,
                100_000 / DOCS_PER_ORDER,
                "balance_100k",
                None,
            ))
        },
    },
    Figure {
        key: "balance_1m",
        enabled: |s| s.huge,
        measure: |b| {
            Box::pin(order_balance(
                b,
                1_000_000 / DOCS_PER_ORDER,
                "balance_1m",
                None,
            ))
        },
    },
];

/// Figures besides `p1`, `p2` and `p7`; `results.json` names those a run did not
/// measure (`details.not_yet_measured`, empty unless `BENCH_ONLY` left some out).
pub const PENDING_FIGURES: &[&str] = &["p3", "p4_c16", "p5", "p6", "p8", "p9", "sweeper_rss"];

pub fn always(_: &Settings) -> bool {
    true
}
