//! Named limits of the transfer protocol, the account-op engine and the sweeper.
//!
//! Units come last in each name (`_ms`, `_max` for counts). The relationships the protocol's
//! safety argument rests on are checked at compile time below: a settled marker must outlive
//! any lease by far, so that a worker that was paused while holding a claim still finds the
//! marker of the step it is about to repeat and skips it (SPEC §5, "why it cannot
//! double-apply").

/// How long a claim on a transfer lasts, and the longest lease a ledger may be configured with
/// (`Ledger::with_lease` refuses more).
pub const LEASE_MS: u64 = 30_000;

/// A worker stops acting `lease / LEASE_MARGIN_DIVISOR` before its claim expires (5 s of a
/// 30 s lease), measured on its own monotonic clock: time for a request already on the wire
/// to land, and for the wall clocks of two machines to disagree a little.
pub const LEASE_MARGIN_DIVISOR: u32 = 6;

/// A settled (or undone) transfer's id stays in the account's `settled` set at least this
/// long, so a late or repeated step on that account finds it and skips.
pub const SETTLED_RETENTION_MS: u64 = 3_600_000;

/// The most `settled` entries an account keeps once they are older than
/// [`SETTLED_RETENTION_MIN_MS`]. A hot account may hold more: entries younger than that are
/// never pruned, whatever the count (safety before document size).
pub const SETTLED_MAX: usize = 1_000;

/// The cap [`SETTLED_MAX`] never prunes an entry younger than this.
pub const SETTLED_RETENTION_MIN_MS: u64 = 300_000;

/// Every transfer id (an idempotency key) and account id is at most this many characters.
pub const ID_CHARS_MAX: usize = 200;

/// Attempts at reversing one transfer: a reversal cancelled by a business rule (the money was
/// spent) may be tried again under the next id, `rev-{id}`, `rev2-{id}`, … `rev{N}-{id}`.
pub const REVERSAL_ATTEMPTS_MAX: u32 = 100;

/// How often one account-op batch may meet a stale `_rev` on the same account before its ops
/// fail with a conflict error (each attempt re-reads the account).
pub const ACCOUNT_CAS_ATTEMPTS_MAX: u32 = 10;

/// The most account ops one engine round takes from the queue (one `_all_docs` read and one
/// `_bulk_docs` write, plus re-reads on conflict).
pub const ACCOUNT_BATCH_OPS_MAX: usize = 1_024;

/// The most transfer documents one `_bulk_docs` write of the engine carries.
pub const TXN_BATCH_DOCS_MAX: usize = 256;

/// Account documents the engine remembers (doc + `_rev`) to skip the read before a write. A
/// stale entry only costs a 409 and a re-read.
pub const ACCOUNT_CACHE_MAX: usize = 1_024;

/// Rounds one engine driver task runs before handing over to a fresh task (a bound on the
/// loop; a queue that never empties still makes progress).
pub const ENGINE_ROUNDS_MAX: u32 = 10_000;

/// Protocol phases (a CAS of the transfer, or one batch of account steps) one drive of one
/// transfer may take. The longest clean path is 8 (begin, apply, commit, settle, done — plus a
/// re-read or two); the bound stops a livelock between workers, never a normal drive.
pub const DRIVE_PHASES_MAX: u32 = 32;

/// Default age after which the sweeper takes over a transfer whose claim has expired.
pub const STALE_AFTER_DEFAULT_MS: u64 = 30_000;

/// Transfers one sweeper process drives at once (so the account-op engine can group their
/// account writes into few requests). Each phase of the drives in flight shares one
/// `_bulk_docs`, so this is the sweeper's group size: 256 instead of 64 finished a backlog of
/// 2,000 about 15 % faster on pouchdb-server, where every document written costs a
/// `validate_doc_update` run (BENCHMARKS.md, `p6`). The relationships below bound it.
pub const SWEEP_CONCURRENCY_MAX: usize = 256;

/// The largest `limit` of one sweep pass.
pub const SWEEP_LIMIT_MAX: usize = 100_000;

/// Keys per `_all_docs` request when the sweeper or the auditor re-reads documents.
pub const READ_BATCH_KEYS_MAX: usize = 500;

/// Rows per page when the auditor or the sweeper reads a view or the changes feed.
pub const PAGE_ROWS_MAX: u64 = 1_000;

/// Pages one scan reads at most (a bound: 10 million rows at [`PAGE_ROWS_MAX`]).
pub const PAGES_MAX: u64 = 10_000;

/// `sweep_watch` waits for a change at most this long before scanning anyway.
pub const WATCH_WAIT_MAX_MS: u64 = 30_000;

/// ... and at least this long between two passes (a busy database wakes it constantly).
pub const WATCH_WAIT_MIN_MS: u64 = 100;

/// Longest back-off of `sweep_watch` after a failed pass.
pub const WATCH_BACKOFF_MAX_MS: u64 = 10_000;

/// Problem lines one sweep outcome keeps (the counts stay exact beyond it).
pub const PROBLEMS_MAX: usize = 1_000;

/// `verify()` reports a transfer still open after this long (invariant 4, "termination").
pub const OPEN_AGE_MAX_MS: u64 = 300_000;

// ---- relationships the protocol depends on -------------------------------------------------

// A marker outlives any lease by far: a paused worker resumes into a skip, not a repeat.
const _: () = assert!(SETTLED_RETENTION_MIN_MS >= 10 * LEASE_MS);
const _: () = assert!(SETTLED_RETENTION_MS >= SETTLED_RETENTION_MIN_MS);
const _: () = assert!(SETTLED_RETENTION_MS >= 100 * LEASE_MS);
const _: () = assert!(SETTLED_MAX > 0);
// The margin is a fraction of the lease, never all of it.
const _: () = assert!(LEASE_MARGIN_DIVISOR >= 2);
// The sweeper's default waits at least one lease before judging a transfer stuck.
const _: () = assert!(STALE_AFTER_DEFAULT_MS >= LEASE_MS);
// A stuck transfer is reported long after the sweeper would have taken it over.
const _: () = assert!(OPEN_AGE_MAX_MS >= 2 * STALE_AFTER_DEFAULT_MS);
// One sweep's concurrent drives fit in one engine round (two accounts each, three op kinds).
const _: () = assert!(ACCOUNT_BATCH_OPS_MAX >= 2 * SWEEP_CONCURRENCY_MAX);
const _: () = assert!(TXN_BATCH_DOCS_MAX >= SWEEP_CONCURRENCY_MAX);
const _: () = assert!(ACCOUNT_CACHE_MAX >= 2 * SWEEP_CONCURRENCY_MAX);
const _: () = assert!(WATCH_WAIT_MIN_MS < WATCH_WAIT_MAX_MS);
const _: () = assert!(ACCOUNT_CAS_ATTEMPTS_MAX >= 2);
const _: () = assert!(READ_BATCH_KEYS_MAX as u64 <= PAGE_ROWS_MAX);
