//! `BENCH_EVENTS=1`: an events reader following `p8`'s ledger through its rounds, as a
//! consumer of `couch-ledger events --follow` would (its own client, so `p8`'s request counts
//! stay the ledger's), and the lag from each transfer's decision to the moment the reader has
//! its `transfer.done`: p50 and p99. `p8` of the same run is the throughput with it attached.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use couch_ledger::{EventCursor, EventKind, EventQuery, Ledger};

use crate::bench::Bench;

/// Whether the reader runs (`BENCH_EVENTS=1`).
pub fn wanted() -> bool {
    std::env::var("BENCH_EVENTS").is_ok_and(|v| v == "1")
}

/// The reader, running.
pub struct EventsLag {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<Vec<i64>>>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

impl EventsLag {
    /// Starts following `ledger`'s events from the start.
    pub fn start(bench: &Bench, ledger: &Ledger) -> Result<EventsLag> {
        let client = bench.ours.with_database(ledger.client().database())?;
        let reader = match ledger.hot_database() {
            Some(hot) => Ledger::builder(client).hot_database(hot).build()?,
            None => Ledger::new(client),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            let mut query = EventQuery {
                after: EventCursor::start(),
                limit: couch_ledger::EVENTS_LIMIT_MAX,
                kinds: Some(vec![EventKind::TransferDone]),
                wait: Some(Duration::from_millis(500)),
            };
            let mut lags = Vec::new();
            loop {
                let page = reader.events(&query).await?;
                let read_at = now_ms();
                lags.extend(page.events.iter().map(|e| read_at - e.time));
                let empty = page.events.is_empty();
                query.after = page.cursor;
                if empty && stopping.load(Ordering::Relaxed) {
                    return Ok(lags);
                }
            }
        });
        Ok(EventsLag { stop, task })
    }

    /// Stops once the reader has caught up, and prints the lag.
    pub async fn finish(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut lags = self.task.await??;
        lags.sort_unstable();
        let at = |q: f64| {
            let i = ((lags.len() as f64 - 1.0) * q).round() as usize;
            lags.get(i).copied().unwrap_or_default()
        };
        eprintln!(
            "  p8 events: {} transfer.done read by a follower; lag from the decision p50 {} ms, \
             p99 {} ms, max {} ms",
            lags.len(),
            at(0.5),
            at(0.99),
            lags.last().copied().unwrap_or_default()
        );
        Ok(())
    }
}
