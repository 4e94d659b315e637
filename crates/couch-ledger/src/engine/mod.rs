//! Group commit: the in-process engine that applies account steps and writes transfer documents
//! for every transfer this process drives, batching concurrent ones into few requests.
//!
//! CouchDB makes one document's write atomic and nothing more, and a hot account is one
//! document: one CAS per transfer step on it means a queue of 409s (SERVERS.md: 10 updates/s
//! from 16 clients on pouchdb-server). So callers do not write accounts themselves. They enqueue
//! ops — "apply this delta for txn T on account A", "settle T on A", "undo T on A" — and await
//! their answer. One driver task at a time takes everything queued and, per round:
//!
//! 1. reads the accounts it holds no copy of with one `_all_docs?include_docs` request (it keeps
//!    the last doc + `_rev` it read or wrote: a stale copy only costs a 409 and a re-read);
//! 2. applies all ops in memory, in queue order — the idempotency rules of docs/PROTOCOL.md live in
//!    [`evaluate_with`](rules::evaluate_with);
//! 3. writes every changed account in one `_bulk_docs`, each with its `_rev` (a CAS, so the
//!    request is safe to repeat); a per-document conflict re-reads that account and re-runs its
//!    ops, at most [`ACCOUNT_CAS_ATTEMPTS_MAX`](crate::limits::ACCOUNT_CAS_ATTEMPTS_MAX) times.
//!
//! An op is answered only once its outcome is certain: after the write that carries it landed,
//! or — when it changes nothing (skipped, insufficient funds) — once it was decided on a copy
//! read in this round, never on a cached copy that may be stale.
//!
//! Transfer documents go through the same queue ([`TxnWriter`]): concurrent CAS writes of
//! different transfers share one `_bulk_docs`, with the round's account writes when they can.
//! Below both, a [`BulkWriter`] sends each request: on pouchdb-server a request costs as much as
//! some 30–40 small documents.
//!
//! While a round's requests are in flight, new ops queue up; the next round takes them all.
//! So one caller alone pays no waiting, and 64 concurrent callers share about one request per
//! phase.
//!
//! The parts, each importing only those listed before it:
//!
//! - `queue`: a queue with at most one driver task;
//! - `quorum`: what a cluster asks of a write ([`WriteQuorum`], [`Quorum`], [`Entries`]) and the
//!   conflicts met ([`ConflictTally`]);
//! - `bulk`: the `_bulk_docs` requests ([`BulkWriter`]) and how their replies are read;
//! - `ops`: what callers queue and what they are answered ([`AccountOp`], [`OpResult`],
//!   [`Decide`], [`TxnWrite`]);
//! - `rules`: the protocol's rules on one account in memory
//!   ([`evaluate_with`](rules::evaluate_with), pruning);
//! - `account`: the [`AccountEngine`] itself — its queue, the ops it holds back, the pairs whose
//!   decision it writes, and its driver; in its folder, `round` (one round: read, decide,
//!   write, retry), `read` (its reads of accounts, merging a conflict's leaves) and `txn` (the
//!   transfer documents a round writes, [`TxnWriter`]).

mod account;
mod bulk;
mod ops;
mod queue;
mod quorum;
mod rules;

pub(crate) use crate::clock::now_ms;

pub(crate) use self::account::{AccountEngine, TxnWriter};
pub(crate) use self::bulk::BulkWriter;
pub(crate) use self::ops::{AccountOp, Decide, OpKind, OpResult, TxnWrite};
pub use self::quorum::WriteQuorum;
pub(crate) use self::quorum::{ConflictTally, Entries, Quorum};

#[cfg(test)]
mod fixtures;
