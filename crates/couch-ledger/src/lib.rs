//! couch-ledger: a money ledger on CouchDB.
//!
//! CouchDB makes one document's write atomic (`_rev` compare-and-swap) and nothing more. On
//! that, this crate builds an immutable order ledger, two-phase transfers between accounts that
//! survive a crash at any step, and a sweeper that finishes transfers left half-way.
//!
//! ```no_run
//! # async fn demo() -> couch_ledger::Result<()> {
//! use couch_ledger::{Client, Ledger};
//!
//! let client = Client::builder()
//!     .url("http://127.0.0.1:5984")
//!     .database("ledger")
//!     .build()?;
//! let ledger = Ledger::new(client);
//! ledger.init().await?;
//! let balance = ledger.order_balance("320afa89").await?;
//! println!("still owed: {} minor units", balance.minor());
//! # Ok(()) }
//! ```
//!
//! On IBM Cloudant with an IAM API key, a transfer between two accounts, and a sweeper pass
//! that finishes whatever a crash left half-way:
//!
//! ```no_run
//! # async fn cloudant() -> couch_ledger::Result<()> {
//! use std::time::Duration;
//! use couch_ledger::{Client, Ledger, SweepOptions, TransferRequest};
//!
//! let client = Client::builder()
//!     .url("https://example.cloudant.com")
//!     .database("shop_ledger")
//!     .iam_api_key(std::env::var("CLOUDANT_APIKEY").unwrap_or_default())
//!     .request_timeout(Duration::from_secs(30))
//!     .build()?;
//! let ledger = Ledger::new(client);
//! let gbp = couch_ledger::Currency::from_code("GBP")?;
//! let outcome = ledger
//!     .submit(
//!         TransferRequest {
//!             id: Some("order-42".into()),
//!             source: "alice".into(),
//!             destination: "shop".into(),
//!             amount: gbp.parse("100.00")?,
//!             currency: gbp,
//!             meta: Default::default(),
//!         },
//!         true,
//!     )
//!     .await?;
//! println!("transfer {} is {:?}", outcome.id, outcome.state);
//! let swept = ledger.sweep_once(SweepOptions::default()).await?;
//! println!("{} stuck transfers finished", swept.advanced + swept.cancelled);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

/// A protocol fail point: the `fail` crate's `fail_point!` with the `failpoints` feature, and
/// nothing without it, so that a build without the feature does not depend on `fail` at all.
/// Defined before the modules, which see it by textual scope.
#[cfg(feature = "failpoints")]
macro_rules! fail_point {
    ($($arg:tt)*) => {
        fail::fail_point!($($arg)*)
    };
}
#[cfg(not(feature = "failpoints"))]
macro_rules! fail_point {
    ($($arg:tt)*) => {{}};
}

mod account_doc;
mod accounts;
mod audit;
mod by_meta;
mod clock;
mod config;
mod conflict;
mod couch;
pub mod design;
mod engine;
mod error;
mod events;
mod history;
mod iam;
mod ledger;
mod meta;
// Every named limit, the crate's own; the public few are in `limits` below.
#[path = "limits.rs"]
mod all_limits;
mod money;
mod observe;
mod one_write;
mod opening;
mod orders;
mod state;
mod sweeper;
mod timestamp;
mod transfer;
mod wire;

pub use accounts::{AccountSpec, AccountView, PendingEntry};
pub use audit::{Check, VerifyOptions, VerifyReport};
pub use by_meta::{
    MetaCursor, MetaPage, MetaQuery, META_CURSOR_CHARS_MAX, META_SEARCH_LIMIT_DEFAULT,
    META_SEARCH_LIMIT_MAX,
};
pub use config::{
    redact_url, ClientBuilder, RetryPolicy, DEFAULT_DATABASE, DEFAULT_IAM_TOKEN_URL, DEFAULT_URL,
};
pub use couch::{
    take_conflicts, AllDocsRow, BulkResult, ChangeRow, ChangesQuery, ChangesResponse,
    ChangesStream, Client, Leaves, ViewQuery, ViewResponse, ViewRow, WriteOptions, Written,
};
pub use engine::WriteQuorum;
pub use error::{plain_seconds, Condition, Error, Result};
pub use events::{
    AccountFacts, EntryFacts, EventCursor, EventData, EventKind, EventPage, EventQuery,
    LedgerEvent, OrderFacts, TransferFacts, EVENTS_LIMIT_DEFAULT, EVENTS_LIMIT_MAX,
    EVENTS_WAIT_MAX, EVENT_CURSOR_CHARS_MAX,
};
pub use history::{
    BalanceAt, HistoryCursor, HistoryEntry, HistoryPage, HistoryQuery, HISTORY_CURSOR_CHARS_MAX,
    HISTORY_LIMIT_DEFAULT, HISTORY_LIMIT_MAX,
};
pub use ledger::{
    ConflictCounts, HotReport, InitReport, Ledger, LedgerBuilder, Progress, ProgressFn,
    ProgressHook,
};
/// Test hooks (feature `testing`): a pause before a protocol write, and the fail points' names.
#[cfg(feature = "testing")]
pub use ledger::{PauseFn, PauseHook};
pub use meta::{
    split_pair as split_meta_pair, Metadata, META_KEYS_MAX, META_KEY_CHARS_MAX,
    META_VALUE_CHARS_MAX,
};
pub use money::{plain_decimal, Amount, Currency, AMOUNT_ABS_MAX};
pub use observe::{Observer, RequestEvent, RetryEvent};
pub use orders::{
    Adjustment, BasketItem, CurrencyBalance, Delivered, Delivery, Entry, EntryKind, OrderBalance,
    OrderSummary, OutstandingPage, Payment, Purchase, RecordStatus, Recorded, Refund, Shipment,
    Statement, BASKET_ITEMS_MAX, ID_PART_LEN_MAX, OUTSTANDING_LIMIT_MAX, TEXT_LEN_MAX,
};
pub use state::{transition, Event, State, TransitionError};
pub use sweeper::{LedgerStatus, StateCounts, SweepOptions, SweepOutcome};
pub use timestamp::{format_time_ms, parse_time_ms, TIME_FORMS, TIME_MS_DIGITS_MAX, TIME_MS_MAX};
#[cfg(feature = "testing")]
pub use transfer::FAIL_POINTS;
pub use transfer::{Claim, Reason, TransferOutcome, TransferRequest, TransferView};
/// The limits a user tunes against or must know: the longest lease a ledger takes and its
/// default, a sweep pass's default age and largest batch ([`SweepOptions`]), the longest id,
/// and how long a background finish holds a settle. The engine's own limits stay inside the
/// crate (src/limits.rs, with the relationships between them checked at compile time).
pub mod limits {
    pub use crate::all_limits::{
        ID_CHARS_MAX, LEASE_MS, SETTLE_HOLD_MS, STALE_AFTER_DEFAULT_MS, SWEEP_LIMIT_MAX,
    };
    // The crate reaches every limit by the same path.
    pub(crate) use crate::all_limits::*;
}

/// What a deterministic simulation of the server needs (feature `testing`): a transport to
/// answer requests, and a wall clock that follows a paused runtime's.
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::clock::testing::simulate_wall_clock;
    pub use crate::transfer::{entry_key, transfer_of};
    pub use crate::wire::{Exchange, Transport, WireFailure, WireReply, WireRequest};

    /// The engine's limits that tests check against (feature `testing`; src/limits.rs says
    /// what each one is).
    pub mod limits {
        pub use crate::all_limits::{
            MARKERS_BYTES_MAX, MARKER_OVERHEAD_BYTES, PRUNE_CONFIRMED_MS, REVS_LIMIT,
            REVS_LIMIT_ONE_COPY, SETTLED_AGE_MIN_MS, SWEEP_CONCURRENCY_MAX,
        };
    }
}

/// The Rust snippets of the README and of docs/LIBRARY.md, compiled as doctests so that they
/// keep building against the API they show.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
#[doc = include_str!("../../../docs/LIBRARY.md")]
pub struct ReadmeDoctests;
