//! p4_c16 and p5, from the same rounds: concurrent transfers between accounts of their own,
//! and all into one merchant account, against raw single-document writes.

use std::time::Duration;

use anyhow::Result;
use couch_ledger::Ledger;
use serde_json::Value;

use crate::bench::{Bench, Side, TransferPoint};
use crate::p1_writes::Writer;
use crate::rounds::{interleaved, jobs_for_steady_rate, median, ratios, steady_rate, Interleaved};
use crate::row::{Goal, Row};
use crate::sizes::WRITES_PER_ROUND;
use crate::transfers::{
    account_id, fresh_ledger, load_accounts, own_pair, requests_of, run_transfers, transfer_round,
    verify_and_drop, TransferCost,
};

/// Rounds per side of `p4_c16` and `p5`.
pub const TRANSFER_ROUNDS: usize = 10;
/// Timed transfers per round at 16 workers (plus `2 × 16 − 1` untimed around them).
pub const TRANSFERS_PER_ROUND_C16: usize = 96;
pub const TRANSFER_CONCURRENCY: usize = 16;
pub const GOAL_P4: Goal = Goal::AtLeast(0.90);
pub const GOAL_P5: Goal = Goal::AtLeast(0.5);
/// The account every transfer of `p5`'s hot side pays into.
pub const P5_MERCHANT: &str = "merchant";

/// `p4_c16` and `p5`, from the same rounds of three sides, each a ledger or database of its
/// own, in rotating order:
///
/// - uncontended: 16 workers, each transferring between two accounts of its own;
/// - hot: 16 workers, each transferring from an account of its own into one merchant account;
/// - raw: single-document creates at 16 connections (`p1_c16`'s raw loop).
///
/// `p4_c16` = uncontended transfers/s ÷ (raw writes/s ÷ `p3`): against a client that made
/// `p3` requests per transfer, one after another, each at the raw write rate. `p5` = hot ÷
/// uncontended.
pub async fn concurrent_transfers(bench: &Bench) -> Result<Vec<Row>> {
    let cost = bench.transfer_cost()?;
    let rounds = bench.settings.scaled(TRANSFER_ROUNDS);
    let c = TRANSFER_CONCURRENCY;
    let transfers = jobs_for_steady_rate(TRANSFERS_PER_ROUND_C16, c);
    let writes = jobs_for_steady_rate(WRITES_PER_ROUND, c);
    let (spread, hot) = spread_and_hot(bench, c).await?;
    let raw_db = bench.fresh_database("p4_raw").await?;
    let raw = Writer::new(bench, Side::Raw, &raw_db).await?;
    // Untimed, after the last round's ids: connections open, the engines read the accounts.
    let warm_up = rounds * transfers..rounds * transfers + 2 * c;
    raw.create_all(rounds * writes..rounds * writes + c, c)
        .await?;
    run_transfers(&spread, "t", warm_up.clone(), c, own_pair).await?;
    run_transfers(&hot, "t", warm_up, c, into_merchant).await?;
    let requests_before = [requests_of(&spread), requests_of(&hot)];
    let sides = [Side::Ours, Side::Hot, Side::Raw];
    let samples = interleaved(&sides, rounds, |side, round| {
        let (spread, hot, raw) = (&spread, &hot, &raw);
        async move {
            let jobs = round * transfers..(round + 1) * transfers;
            match side {
                Side::Ours => transfer_round(spread, "t", jobs, c, own_pair).await,
                Side::Hot => transfer_round(hot, "t", jobs, c, into_merchant).await,
                _ => {
                    let first = round * writes;
                    let finished = raw.create_all(first..first + writes, c).await?;
                    // The transfers/s of a client making p3 requests per transfer.
                    Ok(steady_rate(&finished, c) / cost.requests_cold)
                }
            }
        }
    })
    .await?;
    let made = (rounds * transfers) as f64;
    let requests = [
        (requests_of(&spread) - requests_before[0]) as f64 / made,
        (requests_of(&hot) - requests_before[1]) as f64 / made,
    ];
    let merchant: Value = hot.hot_client().get("account:merchant").await?;
    let merchant_kib = serde_json::to_vec(&merchant)?.len() as f64 / 1024.0;
    raw_db.delete_database().await?;
    let verified = verify_and_drop(&spread).await? + verify_and_drop(&hot).await?;
    let (p4, p5) = p4_p5_rows(
        &samples,
        cost,
        rounds * transfers,
        requests,
        merchant_kib,
        verified,
    );
    bench
        .measured
        .lock()
        .expect("lock")
        .transfer_points
        .push(TransferPoint {
            concurrency: c,
            ours: p4.ours,
        });
    Ok(vec![p4, p5])
}

/// `p4_c16` and `p5` from their rounds: requests per transfer of each side, the merchant
/// account's size at the end, how long the audit took.
fn p4_p5_rows(
    samples: &Interleaved,
    cost: TransferCost,
    ops: usize,
    requests: [f64; 2],
    merchant_kib: f64,
    verified: Duration,
) -> (Row, Row) {
    let c = TRANSFER_CONCURRENCY;
    let p4 = Row::new(
        "p4_c16",
        format!("transfers/s, c{c}, uncontended"),
        "xfers/s",
        &samples.figures[&Side::Ours],
        &samples.figures[&Side::Raw],
    )
    .goal(Some(GOAL_P4))
    .cpu(samples, [Side::Ours, Side::Raw], ops)
    .note(format!(
        "raw = raw c{c} single-doc writes/s ÷ p3 ({:.2}) in the same rounds (÷ p3_warm, {:.2}, \
         the ratio would be {:.3}); {:.2} requests per transfer here (group commit); audited \
         with p5 in {:.1} s",
        cost.requests_cold,
        cost.requests_warm,
        median(&ratios(samples, Side::Ours, Side::Raw)) * cost.requests_warm / cost.requests_cold,
        requests[0],
        verified.as_secs_f64()
    ));
    let p5 = Row::new(
        "p5",
        format!("transfers/s, c{c}, all into one account"),
        "xfers/s",
        &samples.figures[&Side::Hot],
        &samples.figures[&Side::Ours],
    )
    .goal(Some(GOAL_P5))
    .cpu(samples, [Side::Hot, Side::Ours], ops)
    .note(format!(
        "ours = 16 workers paying into one merchant account, raw = p4_c16's uncontended \
         transfers in the same rounds; {:.2} requests per transfer; the merchant account ended \
         at {merchant_kib:.0} KiB (its settled markers are kept ≥ 5 min)",
        requests[1]
    ));
    (p4, p5)
}

/// Each worker from an account of its own into the one merchant account.
pub fn into_merchant(w: usize, _: usize) -> (String, String) {
    (account_id("s", w), P5_MERCHANT.to_owned())
}

/// `p4_c16`'s ledger, an account pair for each of `c` workers, and `p5`'s, an account for each
/// worker and the merchant's.
async fn spread_and_hot(bench: &Bench, c: usize) -> Result<(Ledger, Ledger)> {
    let spread = fresh_ledger(bench, "p4").await?;
    let accounts: Vec<String> = (0..c)
        .flat_map(|w| {
            let (s, d) = own_pair(w, 0);
            [s, d]
        })
        .collect();
    load_accounts(&spread, &accounts).await?;
    let hot = fresh_ledger(bench, "p5_hot").await?;
    let mut accounts: Vec<String> = (0..c).map(|w| into_merchant(w, 0).0).collect();
    accounts.push(P5_MERCHANT.to_owned());
    load_accounts(&hot, &accounts).await?;
    Ok((spread, hot))
}
