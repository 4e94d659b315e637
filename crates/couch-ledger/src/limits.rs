//! Named limits of the transfer protocol, the account-op engine and the sweeper.
//!
//! Units come last in each name (`_ms`, `_max` for counts). The relationships the protocol's
//! safety argument rests on are checked at compile time below: a settled marker must outlive
//! any lease by far, so that a worker that was paused while holding a claim still finds the
//! marker of the step it is about to repeat and skips it (docs/PROTOCOL.md, "why
//! nothing is applied twice").
//!
//! They are the crate's own: the few a user tunes against or must know are public through
//! `couch_ledger::limits` (src/lib.rs), and those tests check against through
//! `couch_ledger::testing::limits`.

/// How long a claim on a transfer lasts, and the longest lease a ledger may be configured with
/// (`LedgerBuilder::lease` refuses more).
pub const LEASE_MS: u64 = 30_000;

/// A worker stops acting `lease / LEASE_MARGIN_DIVISOR` before its claim expires (5 s of a
/// 30 s lease), measured on its own monotonic clock: time for a request already on the wire
/// to land, and for the wall clocks of two machines to disagree a little.
pub const LEASE_MARGIN_DIVISOR: u32 = 6;

/// Settled entries older than [`SETTLED_AGE_MIN_MS`] are pruned (once their transfer reads
/// `done` or `cancelled`) when at least this many of them have gathered, so that one read of
/// their transfers serves many entries. (The size bound is [`MARKERS_BYTES_MAX`].) Waiting
/// for an hour's retention or 256 KiB of markers instead left a busy account carrying thousands
/// of entries, rewritten by every write (docs/bench/HISTORY.md).
pub const SETTLED_PRUNE_BATCH_MIN: usize = 32;

/// Transfers whose end (`done` or `cancelled`) a ledger remembers having written, so that their
/// settled entries are pruned without a read (about 2 minutes of transfers at 1,000/s; ~60 bytes
/// each).
pub const ENDED_KNOWN_MAX: usize = 131_072;

/// The age below which the auditor does not judge a settled entry (it may be younger than the
/// transfer's last write it sees).
pub const SETTLED_RETENTION_MIN_MS: u64 = 300_000;

/// The most two hosts' wall clocks may disagree (NTP keeps them within milliseconds; this is
/// the assumption the pruning rule below is sized against).
pub const CLOCK_SKEW_MAX_MS: u64 = 30_000;

/// The youngest settled entry that may be pruned, and only once its transfer reads `done` or
/// `cancelled`. Why this is enough: an apply of transfer T can only land through a decision the
/// engine took before its worker's monotonic deadline (checked at every attempt, after the
/// read), i.e. within [`LEASE_MS`] of that worker's claim write; T's settle (which wrote the
/// entry's `at`) came after that claim. An entry older than the lease (plus the clock skew
/// between the settling and the pruning host) can therefore no longer meet an apply that
/// would need it.
pub const SETTLED_AGE_MIN_MS: u64 = LEASE_MS + CLOCK_SKEW_MAX_MS;

/// A settled entry is pruned only once every copy of its account is known to hold it: it was
/// in an account revision this process wrote and every copy took (201 with `w` = n), at least
/// this long ago, with no write of that account answered 202 and no conflict of it seen since
/// (docs/CLUSTER.md, "Pruning"). While a copy is down every such write answers 202, so nothing
/// is pruned then; the wait gives a leaf that one copy took alone (a rival's 202) the time
/// internal replication needs to bring it to the others, where the merge finds it next to the
/// entry instead of next to nothing.
pub const PRUNE_CONFIRMED_MS: u64 = 30_000;

/// Settled entries are dated rounded up to a multiple of this (so never earlier than they
/// happened, which keeps pruning by age safe): the entries of five seconds share one stored
/// group and one date (`settled_groups` in src/account_doc.rs). Pruning waits up to this much
/// longer.
pub const SETTLED_AT_STEP_MS: i64 = 5_000;

/// The `_revs_limit` `init` gives the database of accounts and transfers when it keeps several
/// copies of each document (a cluster's `n` > 1, or a server that does not say; CouchDB's
/// default is 1,000). CouchDB stores a document's revision path beside it and rewrites it with
/// every update, so an account written a thousand times costs about 20 times what a new one
/// costs to update (measured on CouchDB 3.4.3: `p8` 192 transfers/s on accounts at 1,000
/// revisions, 668 at 50, ~770 on new accounts; docs/bench/HISTORY.md). Nothing in the ledger
/// reads old revisions; conflicts are found from the leaves, which stemming keeps. On a cluster
/// a copy that missed more than this many writes of an account (it was down: those writes were
/// answered 202) meets the rest as a conflict instead of catching up, and the account merge
/// (docs/CLUSTER.md) resolves it: the stale leaf is an ancestor, and no prune can have passed
/// it (a prune needs every copy, `w` = n).
pub const REVS_LIMIT: u32 = 20;

/// The `_revs_limit` `init` gives the database of accounts and transfers when the server says it
/// keeps one copy of each document (`cluster.n` = 1: CouchDB's single node). No copy can fall
/// behind there, so a long path buys nothing, and a short one is cheaper still: 69 updates in
/// one `_bulk_docs` took 11.2 ms at a limit of 3, 14.6 at 5, 21.5 at 20, 29.3 at 50 (CouchDB
/// 3.4.3, docs/bench/HISTORY.md). A database whose copies are raised later is brought to
/// [`REVS_LIMIT`] by the next `init`.
pub const REVS_LIMIT_ONE_COPY: u32 = 3;

/// Shards (CouchDB's `q`) `init` gives the database of accounts and transfers when it creates
/// it (an existing database keeps its own; the server's default is 2). A transfer updates two
/// accounts picked by its callers, i.e. at random across the database: each shard's updater
/// rewrites the b-tree nodes its batch touches, and more shards share that work. Measured on
/// CouchDB 3.4.3, one node, 2 cores: batches of 128 random account updates and 64 creates into
/// 512 accounts took 39.7 ms at q = 2, 29 at 3, 24–26 at 4, 24–26 at 6 (docs/bench/HISTORY.md); consecutive accounts took 21 ms at either.
pub const HOT_DB_SHARDS: u32 = 4;

/// How often a ledger reads the number of copies its database keeps (`cluster.n`) again. The
/// write quorum follows it, and whether one-write transfers leave settled entries (none where
/// the database keeps one copy, docs/ONE_WRITE.md): a database given more copies while the
/// ledger runs is written as a cluster's within this much of the change (docs/ONE_WRITE.md,
/// "Conflicts on one copy", says how to add copies safely).
pub const COPIES_RECHECK_MS: u64 = 30_000;

/// Serialized bytes of one `pending` or `settled` entry besides its transfer id: the field
/// names, quotes, a delta or `undone: true`, a 20-digit `at`, the comma.
pub const MARKER_OVERHEAD_BYTES: usize = 72;

/// The most serialized bytes an account's markers (pending + settled) may take: an apply that
/// would pass it is refused with a transient error (`account_full`) until pruning made room.
/// With UUID ids (~110 bytes an entry) that is ~4,700 markers: at a settled age of
/// [`SETTLED_AGE_MIN_MS`], about 75 transfers/s on one account before applies wait.
pub const MARKERS_BYTES_MAX: usize = 512 * 1024;

/// An undo that finds no marker still records an undone entry (so a late apply skips): it may
/// pass [`MARKERS_BYTES_MAX`] by this much, no more (beyond it, the undo fails transiently).
pub const MARKERS_UNDO_SLACK_BYTES: usize = 64 * 1024;

/// An account document without its markers: ids (4 bytes per character at worst), currency,
/// amounts, timestamps, and room for fields another version added.
pub const ACCOUNT_FIXED_BYTES_MAX: usize = 16 * 1024;

/// Cloudant's document size limit (CouchDB's default is larger).
pub const DOC_BYTES_LIMIT: usize = 1_000_000;

/// The most bytes one `_bulk_docs` request of the engine carries (Cloudant refuses more than
/// 10 MB with 413).
pub const BULK_BYTES_MAX: usize = 4 * 1024 * 1024;

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
pub const TXN_BATCH_DOCS_MAX: usize = 512;

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

/// Writes of a decision's sealing child (`Ledger::seal_decision`) one call makes before it
/// answers `unconfirmed`: another call sealing the same decision at once makes the first
/// answer a 409, and the child it wrote is sealed again on top.
pub const SEAL_ATTEMPTS: u32 = 3;

/// The most times a batching queue yields to the runtime before taking its batch, so the tasks
/// its last answers woke can queue their next steps into it (src/engine/queue.rs, `gather`). Halved
/// the requests per transfer under `p8`'s load (0.24 → 0.12, BENCHMARKS.md).
pub const GATHER_YIELDS_MAX: u32 = 16;

/// Default age after which the sweeper takes over a transfer whose claim has expired.
pub const STALE_AFTER_DEFAULT_MS: u64 = 30_000;
/// The longest a background finish ([`crate::LedgerBuilder::background_finish`]) holds a settle
/// back so it can go out with its account's next write: far inside a lease, so a held settle
/// never outlives its worker's claim. At 250 ms, on the one-write path an
/// account's next write comes later than that often enough to matter (under `p8`'s load, 512
/// accounts written ~8 times a second each, about one settle in seven went out alone at 250 ms):
/// 1 s took `p8` from 3.29 to 3.20 documents a transfer on CouchDB 3.4.3 (BENCHMARKS.md).
pub const SETTLE_HOLD_MS: u64 = 1000;
/// ... and at most this fraction of the ledger's lease, however short it was made
/// (`LedgerBuilder::lease`).
pub const SETTLE_HOLD_LEASE_DIVISOR: u32 = 20;

/// Transfers one sweeper process drives at once (so the account-op engine can group their
/// account writes into few requests). Each phase of the drives in flight shares one
/// `_bulk_docs`, so this is the sweeper's group size: 256 instead of 64 finished a backlog of
/// 2,000 about 15 % faster on pouchdb-server, where every document written costs a
/// `validate_doc_update` run; 512 instead of 256 drove it in 0.55–0.65 s instead of ~0.9 on
/// CouchDB 3.4.3 (1,024: no faster; `p6` in docs/bench/HISTORY.md). The relationships below
/// bound it.
pub const SWEEP_CONCURRENCY_MAX: usize = 512;

/// The largest `limit` of one sweep pass.
pub const SWEEP_LIMIT_MAX: usize = 100_000;

/// Keys per `_all_docs` request when the sweeper or the auditor re-reads documents.
pub const READ_BATCH_KEYS_MAX: usize = 500;

/// `_all_docs` requests of [`READ_BATCH_KEYS_MAX`] keys a sweeper pass has in flight at once
/// when it re-reads its candidates.
pub const READS_IN_FLIGHT_MAX: usize = 4;

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
const _: () = assert!(SETTLED_PRUNE_BATCH_MIN > 0);
const _: () = assert!(SETTLE_HOLD_MS * SETTLE_HOLD_LEASE_DIVISOR as u64 <= LEASE_MS);
// A settled entry outlives the lease and the clock skew (see SETTLED_AGE_MIN_MS).
const _: () = assert!(SETTLED_AGE_MIN_MS >= LEASE_MS + CLOCK_SKEW_MAX_MS);
// An account stays well under Cloudant's 1 MB whatever the traffic: fixed part, markers up to
// the cap, the undo slack, and one more marker with a 200-character id of 4-byte characters.
const _: () = assert!(
    ACCOUNT_FIXED_BYTES_MAX
        + MARKERS_BYTES_MAX
        + MARKERS_UNDO_SLACK_BYTES
        + 4 * ID_CHARS_MAX
        + MARKER_OVERHEAD_BYTES
        <= DOC_BYTES_LIMIT * 2 / 3
);
// A `_bulk_docs` of the engine holds several full accounts and stays under Cloudant's 10 MB.
const _: () = assert!(BULK_BYTES_MAX >= 4 * DOC_BYTES_LIMIT);
const _: () = assert!(BULK_BYTES_MAX <= 10_000_000 / 2);
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

// ---- what public docs state in numbers (these limits are not public) -----------------------

// `SweepOutcome::problems`.
const _: () = assert!(PROBLEMS_MAX == 1_000);
// `Ledger::sweep_watch`.
const _: () = assert!(WATCH_WAIT_MIN_MS == 100);
const _: () = assert!(WATCH_WAIT_MAX_MS == 30_000);
const _: () = assert!(WATCH_BACKOFF_MAX_MS == 10_000);
// `Ledger::reverse`.
const _: () = assert!(REVERSAL_ATTEMPTS_MAX == 100);
// `InitReport::revs_limit`.
const _: () = assert!(REVS_LIMIT == 20);
const _: () = assert!(REVS_LIMIT_ONE_COPY == 3);
