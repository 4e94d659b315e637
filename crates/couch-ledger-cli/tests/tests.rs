//! Integration tests: one binary, against a real CouchDB-protocol server (see `support`, the
//! testkit crate).

use couch_ledger_testkit as support;

// The HTTP layer against the real server: documents, views, changes, errors.
mod client;
// The order ledger: idempotent immutable entries, balances, statements, bad input.
mod orders;
// The HTTP layer against wiremock: retries, Retry-After, conflicts, garbage, secrets.
mod http_faults;
// Accounts and multi-phase transfers: the tutorial, idempotency, cancel, reverse, hot accounts.
mod transfers;
// The sweeper: stuck transfers finished, concurrent sweepers, poison documents.
mod sweeper;
// The command-line program as a user runs it: flags, --json contract, exit codes.
mod cli;
// The design functions as CouchDB's sandbox runs them (and the server), against one table.
mod design_functions;
// The account engine's bounds: pruning after the transfer ended, per-attempt lease, size cap, 413.
mod engine_bounds;
// A cluster-like trio of replicating servers behind a round-robin proxy: conflicts, the ledger.
mod cluster;
// Conflicts planted on every ledger document type at every protocol step, resolved by the sweeper.
mod conflicts;
// The HTTP service (`couch-ledger serve`) as a caller sees it: endpoints, auth, metrics, stop.
#[cfg(feature = "serve")]
mod serve;
// Ecosystem fit: every ISO-4217 currency, humantime durations, shell completions.
mod ecosystem;
// The split layout: accounts and transfers in a database of their own, unvalidated.
mod layout;
// Background finish: submit answers at the commit, settles folded, flush, the sweeper after a stall.
mod background;
// The one-write path: one create decides, markers adopted, converged, abandoned.
mod one_write;
// An account's history and balance at a time: the library and the command line.
mod history;
// Events from the change feeds: each fact once, in order, resumable from any cursor.
mod events;
// Metadata on transfers, accounts and order entries: written once, returned, searched.
mod meta;
