//! p3: HTTP requests (and documents written) per uncontended transfer, cold and warm.

use std::time::Instant;

use anyhow::Result;
use couch_ledger::{AccountSpec, Amount, Currency};

use crate::bench::{Bench, TransferPoint};
use crate::rounds::{mean, median};
use crate::row::{Goal, Row};
use crate::transfers::{
    fresh_ledger, fresh_pair, requests_of, transfer_done, transfer_request, verify_and_drop,
    writes_of, TransferCost, ACCOUNT_MIN_BALANCE_MINOR, ACCOUNT_OPENING_MINOR, TRANSFER_CURRENCY,
};

/// Transfers `p3` makes one after another, each between two accounts of its own.
pub const P3_TRANSFERS: usize = 50;
pub const GOAL_P3: Goal = Goal::AtMost(6.0);

/// HTTP requests per uncontended transfer, counted by the client at the HTTP layer: transfers
/// one at a time, each between a fresh pair of accounts made with `create_account` (cold: the
/// engine has to read both accounts), then one more on each pair (warm: it holds both).
pub async fn requests_per_transfer(bench: &Bench) -> Result<Vec<Row>> {
    let ledger = fresh_ledger(bench, "p3").await?;
    let currency = Currency::from_code(TRANSFER_CURRENCY)?;
    for i in 0..P3_TRANSFERS {
        let (source, destination) = fresh_pair(i);
        for account in [source, destination] {
            ledger
                .create_account(AccountSpec {
                    account_id: account,
                    currency,
                    opening: Amount::new(ACCOUNT_OPENING_MINOR)?,
                    min_balance: Some(Amount::new(ACCOUNT_MIN_BALANCE_MINOR)?),
                    meta: Default::default(),
                })
                .await?;
        }
    }
    let measure = |pass: &'static str| {
        let ledger = ledger.clone();
        async move {
            let seq_before = writes_of(&ledger).await?;
            let (mut requests, mut seconds) = (Vec::new(), Vec::new());
            for i in 0..P3_TRANSFERS {
                let (source, destination) = fresh_pair(i);
                let request = transfer_request(format!("{pass}{i:04}"), source, destination, i)?;
                let (sent, started) = (requests_of(&ledger), Instant::now());
                transfer_done(&ledger, request).await?;
                seconds.push(started.elapsed().as_secs_f64());
                requests.push((requests_of(&ledger) - sent) as f64);
            }
            let written = writes_of(&ledger).await? - seq_before;
            Ok::<_, anyhow::Error>((requests, seconds, written as f64 / P3_TRANSFERS as f64))
        }
    };
    let (cold, cold_s, docs_cold) = measure("cold").await?;
    let (warm, warm_s, docs_warm) = measure("warm").await?;
    let cost = TransferCost {
        requests_cold: mean(&cold),
        requests_warm: mean(&warm),
        docs_written: docs_cold,
    };
    {
        let mut measured = bench.measured.lock().expect("lock");
        measured.transfer_cost = Some(cost);
        measured.transfer_points.push(TransferPoint {
            concurrency: 1,
            ours: 1.0 / median(&cold_s),
        });
    }
    let verified = verify_and_drop(&ledger).await?;
    let p3 = Row::count(
        "p3",
        "HTTP requests per uncontended transfer, cold".to_owned(),
        "requests",
        &cold,
    )
    .goal(Some(GOAL_P3))
    .note(format!(
        "{P3_TRANSFERS} sequential transfers, each between two accounts the engine has not read \
         yet: {:.2} requests, {:.1} documents written, {:.1} ms each (median); audited in {:.1} s",
        cost.requests_cold,
        docs_cold,
        median(&cold_s) * 1e3,
        verified.as_secs_f64()
    ));
    let p3_warm = Row::count(
        "p3_warm",
        "HTTP requests per uncontended transfer, warm".to_owned(),
        "requests",
        &warm,
    )
    .note(format!(
        "the same pairs again, both accounts cached by the engine (no read before the apply): \
         {:.2} requests, {:.1} documents written, {:.1} ms each (median)",
        cost.requests_warm,
        docs_warm,
        median(&warm_s) * 1e3
    ));
    Ok(vec![p3, p3_warm])
}
