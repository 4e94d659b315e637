//! p8 and the figures of its rounds (p8_validated, p10, p8_floor, p8_phases, …): 64
//! concurrent callers through the batched submit path, against raw bulk writes, a validated
//! database and the document floor.

use std::ops::Range;
use std::time::Duration;

use anyhow::{bail, ensure, Result};
use couch_ledger::Ledger;

use crate::bench::{Bench, BulkLimits, Side, TransferPoint};
use crate::floor::{DocumentFloor, FloorShape, FLOOR_TRANSFERS_PER_REQUEST, FLOOR_WRITERS};
use crate::rounds::{interleaved, jobs_for_steady_rate, median, ratios, Interleaved};
use crate::row::{Goal, Row};
use crate::settings::Layout;
use crate::sizes::BULK_BATCH_DOCS;
use crate::transfers::{
    account_id, drop_ledger, finish_summary, fresh_ledger, fresh_ledger_in, load_accounts,
    pool_pair, requests_of, run_transfers, transfer_round, update_seq, verify_and_drop, writes_of,
    Flush, RawBulk, TransferCost, FLUSHES,
};

/// When `p8`'s `submit` calls return (`BENCH_FINISH`): `background` (the default) answers at
/// the commit and finishes in the background, settles folded into later account writes
/// (`LedgerBuilder::background_finish`); `wait` answers at `done`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Background,
    Wait,
}

impl Finish {
    pub fn apply(self, ledger: Ledger) -> Ledger {
        match self {
            Finish::Background => ledger
                .to_builder()
                .background_finish(true)
                .build()
                .expect("the settings of a ledger already built"),
            Finish::Wait => ledger,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Finish::Background => "background finish",
            Finish::Wait => "waiting for done",
        }
    }
}

pub fn p8_finish() -> Finish {
    match std::env::var("BENCH_FINISH").as_deref() {
        Ok("wait") => Finish::Wait,
        _ => Finish::Background,
    }
}

/// Rounds per side of `p8`.
pub const P8_ROUNDS: usize = 8;
/// Concurrent `submit` callers of `p8`.
pub const P8_CONCURRENCY: usize = 64;
/// Timed transfers per round of `p9` (plus `2 × 64 − 1` untimed around them).
pub const TRANSFERS_PER_ROUND_C64: usize = 192;
/// Timed transfers per round of `p8` (from 192 at first): rounds long enough that what a
/// background finish still holds at a round's end (at most `SETTLE_HOLD_MS` of settles) is a
/// small part of it, the same in both modes so that they compare.
pub const P8_TRANSFERS_PER_ROUND: usize = 1_024;
/// `p8`'s callers transfer between random accounts of this pool.
pub const P8_POOL_ACCOUNTS: usize = 512;
/// Raw `_bulk_docs` batches per raw round of `p8` and `p6`.
pub const RAW_BULK_BATCHES: usize = 3;
pub const GOAL_P8: Goal = Goal::AtLeast(0.5);

/// Transfers/s of 64 concurrent `submit(…, wait = true)` callers between random accounts of a
/// pool ÷ (raw bulk docs/s ÷ documents written per transfer). The library's group-commit engine
/// (crates/couch-ledger/src/engine/) gathers what the callers queue while its previous request
/// is in flight, so each protocol phase of a whole group is about one `_bulk_docs`; every caller
/// still gets its own transfer's outcome. The grouping is checked, not assumed: requests per
/// transfer.
///
/// A third side in the same rounds, raw `_bulk_docs` into a validated ledger database, gives
/// `p8_validated`: the same transfers/s against the limit the ledger's writes really meet.
pub async fn batched_transfers(bench: &Bench) -> Result<Vec<Row>> {
    let cost = bench.transfer_cost()?;
    let rounds = bench.settings.scaled(P8_ROUNDS);
    let c = P8_CONCURRENCY;
    let finish = p8_finish();
    let transfers = jobs_for_steady_rate(P8_TRANSFERS_PER_ROUND, c);
    let p8 = P8Sides::set_up(bench, finish).await?;
    let events = if crate::events_lag::wanted() {
        Some(crate::events_lag::EventsLag::start(bench, &p8.ledger)?)
    } else {
        None
    };
    // Untimed, after the last round's ids: the engine reads the pool, connections open.
    let warm_up = rounds * transfers..rounds * transfers + 2 * c;
    run_transfers(&p8.ledger, "t", warm_up.clone(), c, pool_pair).await?;
    if p8.with_other {
        run_transfers(&p8.other, "t", warm_up, c, pool_pair).await?;
    }
    FLUSHES.lock().expect("not poisoned").clear();
    let before = Counters::read(&p8.ledger).await?;
    let samples = interleaved(&p8.sides(), rounds, |side, round| {
        p8.round(side, round * transfers..(round + 1) * transfers, cost)
    })
    .await?;
    let grouping = before.grouping(&p8.ledger, rounds * transfers).await?;
    if let Some(events) = events {
        events.finish().await?;
    }
    let requests = grouping.requests;
    eprintln!(
        "  p8 grouping: {requests:.3} HTTP requests per transfer ({:.1} transfers per request), \
         {:.1} transfer documents per _bulk_docs",
        1.0 / requests,
        grouping.txn_docs_per_request
    );
    print_server_cpu(
        &samples,
        rounds * transfers,
        rounds * P8_TRANSFERS_PER_ROUND,
    );
    let flushes: Vec<Flush> = std::mem::take(&mut *FLUSHES.lock().expect("not poisoned"))
        .into_iter()
        .filter(|f| f.database == p8.ledger.client().database())
        .collect();
    let finishing = finish_summary(&flushes, p8.ledger.settles_folded());
    if finish == Finish::Background {
        eprintln!("  p8 background finish: {finishing}");
    }
    // A batched path that does not batch would make this figure a lie.
    ensure!(
        requests < 1.0,
        "p8: {requests:.2} requests per transfer: the submits were not grouped"
    );
    let other_layout = p8.other_layout;
    let (with_other, with_one_request) = (p8.with_other, p8.one_request.is_some());
    let verified = p8.drop_all().await?;
    let run = P8Run {
        bench,
        samples: &samples,
        cost,
        c,
        ops: rounds * transfers,
        finish,
        finishing: &finishing,
        grouping: &grouping,
        verified,
    };
    let (p8, p8_validated) = (run.p8_row(), run.p8_validated_row());
    let mut measured = bench.measured.lock().expect("lock");
    measured.transfer_points.push(TransferPoint {
        concurrency: c,
        ours: p8.ours,
    });
    measured.bulk_limits = Some(BulkLimits {
        plain: p8.raw,
        validated: p8_validated.raw,
    });
    let mut rows = vec![p8, p8_validated];
    rows.extend(run.layout_rows());
    rows.extend(run.floor_rows(with_one_request));
    rows.extend(with_other.then(|| run.other_layout_row(other_layout)));
    Ok(rows)
}

/// The sides of `p8`'s rounds, set up: the ledger, the raw and validated bulk writers, the
/// document floor and today's documents batched ideally; opt-in, a protocol answering after
/// one request and the other layout.
struct P8Sides {
    ledger: Ledger,
    raw: RawBulk,
    validated: RawBulk,
    floor: DocumentFloor,
    phases: DocumentFloor,
    one_request: Option<DocumentFloor>,
    other: Ledger,
    other_layout: Layout,
    with_other: bool,
}

impl P8Sides {
    async fn set_up(bench: &Bench, finish: Finish) -> Result<P8Sides> {
        let ledger = finish.apply(fresh_ledger(bench, "p8").await?);
        let accounts: Vec<String> = (0..P8_POOL_ACCOUNTS).map(|i| account_id("p", i)).collect();
        load_accounts(&ledger, &accounts).await?;
        let raw = RawBulk::new(bench, "p8", false).await?;
        let validated = RawBulk::new(bench, "p8", true).await?;
        let floor = DocumentFloor::new(bench, FloorShape::Floor).await?;
        let phases = DocumentFloor::new(bench, FloorShape::Phases).await?;
        // A protocol answering after one request, weighed before building it (docs/ONE_WRITE.md,
        // "Why two requests"): opt-in, its documents batched ideally beside the floor and
        // today's.
        let one_request = if std::env::var("BENCH_ONE_REQUEST").is_ok_and(|v| v == "1") {
            Some(DocumentFloor::new(bench, FloorShape::OneRequest).await?)
        } else {
            None
        };
        // The other layout, for comparison in the same rounds (what the split buys).
        // Opt-in (`BENCH_OTHER_LAYOUT=1`): a fourth side in the same rounds lowers `p8` itself
        // on this two-core machine (measured: 0.183 with one, 0.222 without).
        let with_other = std::env::var("BENCH_OTHER_LAYOUT").is_ok_and(|v| v == "1");
        let other_layout = match bench.settings.layout {
            Layout::Split => Layout::Single,
            Layout::Single => Layout::Split,
        };
        let other = finish.apply(fresh_ledger_in(bench, "p8o", other_layout).await?);
        if with_other {
            load_accounts(&other, &accounts).await?;
        }
        Ok(P8Sides {
            ledger,
            raw,
            validated,
            floor,
            phases,
            one_request,
            other,
            other_layout,
            with_other,
        })
    }

    fn sides(&self) -> Vec<Side> {
        let mut sides = vec![
            Side::Ours,
            Side::Raw,
            Side::Validated,
            Side::Floor,
            Side::Phases,
        ];
        if self.with_other {
            sides.push(Side::OtherLayout);
        }
        if self.one_request.is_some() {
            sides.push(Side::OneRequest);
        }
        sides
    }

    /// One round of `side`: transfers `jobs` through a ledger, or as many transfers' documents
    /// written raw; transfers/s.
    async fn round(&self, side: Side, jobs: Range<usize>, cost: TransferCost) -> Result<f64> {
        let c = P8_CONCURRENCY;
        match side {
            Side::Ours => transfer_round(&self.ledger, "t", jobs, c, pool_pair).await,
            Side::OtherLayout => transfer_round(&self.other, "t", jobs, c, pool_pair).await,
            Side::Raw => Ok(self.raw.round(RAW_BULK_BATCHES).await? / cost.docs_written),
            Side::Floor => self.floor.round(P8_TRANSFERS_PER_ROUND).await,
            Side::Phases => self.phases.round(P8_TRANSFERS_PER_ROUND).await,
            Side::OneRequest => match &self.one_request {
                Some(shape) => shape.round(P8_TRANSFERS_PER_ROUND).await,
                None => bail!("p8: the one-request side was not set up"),
            },
            _ => Ok(self.validated.round(RAW_BULK_BATCHES).await? / cost.docs_written),
        }
    }

    /// Drops every side's databases, the ledgers' after their audit (the other layout's only
    /// when it ran). Returns how long `p8`'s audit took.
    async fn drop_all(self) -> Result<Duration> {
        self.raw.drop_database().await?;
        self.validated.drop_database().await?;
        self.floor.drop_databases().await?;
        self.phases.drop_databases().await?;
        if let Some(shape) = self.one_request {
            shape.drop_databases().await?;
        }
        let verified = verify_and_drop(&self.ledger).await?;
        if self.with_other {
            verify_and_drop(&self.other).await?;
        } else {
            drop_ledger(&self.other).await?;
        }
        Ok(verified)
    }
}

/// The ledger's counters before the rounds.
struct Counters {
    requests: u64,
    writes: u64,
    validated: u64,
    account_rounds: u64,
    txn_rounds: u64,
}

/// How `p8`'s transfers were grouped, per transfer made in the rounds.
struct Grouping {
    /// HTTP requests.
    requests: f64,
    /// Documents written.
    docs: f64,
    /// Documents written into the ledger's database, where validate_doc_update runs for each.
    validated_docs: f64,
    /// Transfer documents per `_bulk_docs` (one a transfer on the one-write path: created
    /// once, decided).
    txn_docs_per_request: f64,
    transfers_per_account_round: f64,
}

impl Counters {
    async fn read(ledger: &Ledger) -> Result<Counters> {
        let requests = requests_of(ledger);
        let (writes, validated) = (writes_of(ledger).await?, update_seq(ledger.client()).await?);
        let (account_rounds, txn_rounds) = ledger.engine_rounds();
        Ok(Counters {
            requests,
            writes,
            validated,
            account_rounds,
            txn_rounds,
        })
    }

    /// What changed since, per transfer of `made`.
    async fn grouping(&self, ledger: &Ledger, made: usize) -> Result<Grouping> {
        let made = made as f64;
        let (account_rounds, txn_rounds) = ledger.engine_rounds();
        Ok(Grouping {
            requests: (requests_of(ledger) - self.requests) as f64 / made,
            docs: (writes_of(ledger).await? - self.writes) as f64 / made,
            validated_docs: (update_seq(ledger.client()).await? - self.validated) as f64 / made,
            txn_docs_per_request: made / (txn_rounds - self.txn_rounds) as f64,
            transfers_per_account_round: made / (account_rounds - self.account_rounds) as f64,
        })
    }
}

/// The server's CPU per transfer of `p8`, the phases and the floor, when `BENCH_SERVER_PID`
/// names the server's process.
fn print_server_cpu(samples: &Interleaved, ours_transfers: usize, floor_transfers: usize) {
    let server_us = [
        (
            "p8",
            samples.server_cpu_us_per_op(Side::Ours, ours_transfers),
        ),
        (
            "phases",
            samples.server_cpu_us_per_op(Side::Phases, floor_transfers),
        ),
        (
            "floor",
            samples.server_cpu_us_per_op(Side::Floor, floor_transfers),
        ),
    ];
    if server_us.iter().all(|(_, us)| us.is_some()) {
        let line: Vec<String> = server_us
            .iter()
            .map(|(side, us)| format!("{side} {:.0}", us.unwrap_or_default()))
            .collect();
        eprintln!(
            "  p8 server CPU per transfer (BENCH_SERVER_PID), µs: {}",
            line.join(", ")
        );
    }
}

/// What `p8`'s rows are made of.
struct P8Run<'a> {
    bench: &'a Bench,
    samples: &'a Interleaved,
    cost: TransferCost,
    c: usize,
    /// Transfers made in the rounds.
    ops: usize,
    finish: Finish,
    finishing: &'a str,
    grouping: &'a Grouping,
    /// How long `p8`'s audit took.
    verified: Duration,
}

impl P8Run<'_> {
    fn p8_row(&self) -> Row {
        let P8Run {
            bench,
            samples,
            cost,
            c,
            ops,
            finish,
            finishing,
            grouping,
            verified,
        } = *self;
        let Grouping {
            requests,
            docs,
            txn_docs_per_request,
            transfers_per_account_round,
            ..
        } = *grouping;
        let layout = bench.settings.layout.name();
        Row::new(
            "p8",
            format!(
                "transfers/s, c{c}, batched submit ({layout} layout, {})",
                finish.name()
            ),
            "xfers/s",
            &samples.figures[&Side::Ours],
            &samples.figures[&Side::Raw],
        )
        .goal(Some(GOAL_P8))
        .cpu(samples, [Side::Ours, Side::Raw], ops)
        .note(format!(
            "{layout} layout (BENCH_LAYOUT), {} (BENCH_FINISH){}; {c} callers, \
         {P8_POOL_ACCOUNTS} accounts; raw = raw _bulk_docs docs/s (batches of \
         {BULK_BATCH_DOCS}) ÷ {:.1} documents written per transfer (p3); grouping: {requests:.3} \
         requests per transfer, {txn_docs_per_request:.1} transfer documents per _bulk_docs, \
         {transfers_per_account_round:.1} transfers per account-engine round, {docs:.2} \
         documents written per transfer (accounts shared within a group); audited in {:.1} s",
            finish.name(),
            if finish == Finish::Background {
                format!(": {finishing}")
            } else {
                String::new()
            },
            cost.docs_written,
            verified.as_secs_f64()
        ))
    }

    fn p8_validated_row(&self) -> Row {
        let (samples, cost, c, ops) = (self.samples, self.cost, self.c, self.ops);
        Row::new(
            "p8_validated",
            format!("transfers/s, c{c}, ÷ validated bulk limit"),
            "xfers/s",
            &samples.figures[&Side::Ours],
            &samples.figures[&Side::Validated],
        )
        .cpu(samples, [Side::Ours, Side::Validated], ops)
        .note(format!(
            "p8's transfers against raw _bulk_docs of transfer documents into a ledger database \
         (validate_doc_update runs per document) ÷ {:.1}, same rounds; validated ÷ plain bulk \
         docs/s: {:.3}",
            cost.docs_written,
            median(&ratios(samples, Side::Validated, Side::Raw))
        ))
    }

    /// `p8_docs`, `p8_validated_docs` and `p10`.
    fn layout_rows(&self) -> Vec<Row> {
        let (bench, samples, c) = (self.bench, self.samples, self.c);
        let cost = self.cost;
        let (docs, validated_docs) = (self.grouping.docs, self.grouping.validated_docs);
        let layout = bench.settings.layout.name();
        // The layout figures, from the same rounds. A document written into the ledger's database
        // is validated (its validate_doc_update runs for each); a split ledger writes accounts and
        // transfers into its hot database, which has none. `p10` divides by plain `_bulk_docs`
        // docs/s (not per transfer), so it is comparable across protocols and layouts that write
        // different numbers of documents.
        let p8_docs = Row::count(
            "p8_docs",
            "documents written per transfer under p8's load".to_owned(),
            "docs",
            &[docs],
        );
        let p8_validated_docs = Row::count(
            "p8_validated_docs",
            "validated documents written per transfer under p8's load".to_owned(),
            "docs",
            &[validated_docs],
        )
        .note(match bench.settings.layout {
            Layout::Single => {
                "the single layout: every document goes to the one validated database".to_owned()
            }
            Layout::Split => "the split layout: the documents written into the ledger's validated \
                          database (accounts and transfers go to the hot one, unvalidated)"
                .to_owned(),
        });
        let raw_docs_per_s = raw_docs_per_s(samples, cost);
        let p10 = Row::new(
            "p10",
            format!("transfers/s, c{c}, batched ({layout}), ÷ plain _bulk_docs docs/s"),
            "xfers/s",
            &samples.figures[&Side::Ours],
            &raw_docs_per_s,
        )
        .note(
            "p8's transfers/s over raw _bulk_docs docs/s into a database without validation, same \
         rounds (2,000 transfers/s on CouchDB 3.4 here is about 0.085)"
                .to_owned(),
        );
        vec![p8_docs, p8_validated_docs, p10]
    }

    /// What the document model allows: the floor's transfers/s, and the best `p10` any
    /// protocol writing those documents could show.
    fn floor_rows(&self, with_one_request: bool) -> Vec<Row> {
        let (samples, cost, c) = (self.samples, self.cost, self.c);
        let raw_docs_per_s = raw_docs_per_s(samples, cost);
        let p8_floor = Row::new(
            "p8_floor",
            format!("transfers/s, c{c}, ÷ the document floor"),
            "xfers/s",
            &samples.figures[&Side::Ours],
            &samples.figures[&Side::Floor],
        )
        .note(format!(
        "p8's transfers/s over the floor's (DocumentFloor): per transfer only what the ledger's \
         documents make necessary, its transfer document created once in its final state and \
         one update of each account (balance only), {FLOOR_TRANSFERS_PER_REQUEST} transfers \
         per _bulk_docs from {FLOOR_WRITERS} writer(s) at once ({c} in flight, as p8), no read, \
         no conflict, same rounds; the floor is the most transfers/s this server takes from \
         any protocol with one document per transfer and a write of each account"
    ));
        let p8_phases = Row::new(
            "p8_phases",
            format!("transfers/s, c{c}, ÷ today's documents batched ideally"),
            "xfers/s",
            &samples.figures[&Side::Ours],
            &samples.figures[&Side::Phases],
        )
        .note(format!(
            "p8's transfers/s over the same floor writer's writing the documents today's protocol \
         writes (FloorShape::Phases, the one-write path: both accounts with their marker and \
         the previous settle folded in, then the transfer documents created done; 3 a \
         transfer) in two requests per {FLOOR_TRANSFERS_PER_REQUEST} transfers, same rounds: \
         how much of p8's \
         distance to the floor is its engine's batching (this ratio) and how much the \
         protocol's documents and phases (the phases' own rate ÷ the floor's: {:.3})",
            median(&ratios(samples, Side::Phases, Side::Floor))
        ));
        let p10_floor = Row::new(
            "p10_floor",
            "the document floor's transfers/s ÷ plain _bulk_docs docs/s".to_owned(),
            "xfers/s",
            &samples.figures[&Side::Floor],
            &raw_docs_per_s,
        )
        .note(
            "the highest p10 a protocol writing one transfer document and both accounts per \
         transfer could reach on this server (same rounds as p10)"
                .to_owned(),
        );
        let p8_one_request = with_one_request.then(|| {
            Row::new(
                "p8_one_request",
                "one request a transfer (4 documents) ÷ the document floor".to_owned(),
                "xfers/s",
                &samples.figures[&Side::OneRequest],
                &samples.figures[&Side::Floor],
            )
            .note(format!(
                "FloorShape::OneRequest's transfers/s over the floor's, same rounds \
             (BENCH_ONE_REQUEST=1): each transfer's accounts with their markers and its \
             document created initial in one request, the document decided in the next; \
             beside it today's two requests (FloorShape::Phases) ÷ the floor: {:.3}",
                median(&ratios(samples, Side::Phases, Side::Floor))
            ))
        });
        let mut rows = vec![p8_floor, p8_phases, p10_floor];
        rows.extend(p8_one_request);
        rows
    }

    /// `p10_other`: `p8`'s workload on the other layout, same rounds.
    fn other_layout_row(&self, other_layout: Layout) -> Row {
        let (samples, cost, c) = (self.samples, self.cost, self.c);
        let raw_docs_per_s = raw_docs_per_s(samples, cost);
        let other_name = other_layout.name();
        Row::new(
            "p10_other",
            format!("transfers/s, c{c}, batched ({other_name}), ÷ plain _bulk_docs docs/s"),
            "xfers/s",
            &samples.figures[&Side::OtherLayout],
            &raw_docs_per_s,
        )
        .note(format!(
            "p8's workload on the {other_name} layout, same rounds, audited after \
             (BENCH_OTHER_LAYOUT=1): what the layout choice buys"
        ))
    }
}

/// Each round's raw `_bulk_docs` docs/s (the raw side is per transfer).
fn raw_docs_per_s(samples: &Interleaved, cost: TransferCost) -> Vec<f64> {
    samples.figures[&Side::Raw]
        .iter()
        .map(|per_transfer| per_transfer * cost.docs_written)
        .collect()
}
