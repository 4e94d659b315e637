//! The sizes and goals the figures share.
//!
//! A round measures each side once, back to back, so the rounds are short: other processes'
//! use of this machine's two cores changes from one tenth of a second to the next, and a round's
//! ratio only holds if both of its measurements saw the same machine. Rounds are scaled by
//! `BENCH_SCALE`.

use crate::row::Goal;

/// Rounds per side of the single-write figure at one connection, each one timed write: the
/// figure is the typical write's rate, ours and raw alternating write by write.
pub const WRITE_ROUNDS_C1: usize = 300;
/// Rounds per side of the single-write figures from 4 connections up.
pub const WRITE_ROUNDS: usize = 60;
/// Timed single-document writes per round from 4 connections up (≈ 0.15 s at 680/s), and at
/// least this many per connection. A round also runs `2 × concurrency - 1` untimed writes
/// around them: see [`crate::rounds::steady_rate`].
pub const WRITES_PER_ROUND: usize = 96;
pub const WRITES_PER_ROUND_PER_CONNECTION_MIN: usize = 2;
/// Rounds per side of `p2`, each one timed `_bulk_docs` request (≈ 70 ms at 7k docs/s).
pub const BULK_ROUNDS: usize = 45;
/// Rounds per side of a latency figure, whose sides alternate query by query within a round.
pub const LATENCY_ROUNDS: usize = 9;
/// Concurrency levels of the single-write plot; `p1` is read at 1 and 16.
pub const PLOT_CONCURRENCY: [usize; 4] = [1, 4, 16, 64];
/// Bytes of filler in a benchmark document, so a body is about 250 bytes like a ledger entry.
pub const PAYLOAD_BYTES: usize = 160;
/// Documents per `_bulk_docs` request in `p2`.
pub const BULK_BATCH_DOCS: usize = 500;
/// Documents per `_bulk_docs` request when loading a database for a query figure.
pub const LOAD_BATCH_DOCS: usize = 1_000;
/// Each order is a purchase and this many payments.
pub const PAYMENTS_PER_ORDER: usize = 3;
pub const DOCS_PER_ORDER: usize = 1 + PAYMENTS_PER_ORDER;
/// Orders in `p7`'s database.
pub const P7_ORDERS: usize = 1_000;
/// Balance queries per side per round, one at a time, ours and raw alternating query by query.
pub const BALANCE_QUERIES_PER_ROUND: usize = 60;
/// Long enough for a view index build over 1M documents on pouchdb-server.
pub const REQUEST_TIMEOUT_S: u64 = 3_600;

pub const GOAL_P1: Goal = Goal::AtLeast(0.95);
pub const GOAL_P2: Goal = Goal::AtLeast(0.90);
pub const GOAL_P7: Goal = Goal::AtMost(1.10);
