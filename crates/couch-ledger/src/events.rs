//! Events: what happened in the ledger, read from its databases' `_changes` feeds, in order,
//! resumable from a cursor (docs/EVENTS.md).
//!
//! An event is derived from a document once its fact is final: a transfer's document `done` or
//! `cancelled` (never its markers), an order entry written once, an opening record. Nothing is
//! stored for events: reading the feed again from a cursor derives the same events, with the
//! same ids, in the same order.
//!
//! The cursor is the position in each feed (the ledger's database, and the hot one in the split
//! layout) plus how many events of the next change were already given, since one change can
//! make two events (a payment and the order it settles). The ledger's feed is read before the
//! hot one within a page; each feed's own order is kept.
//!
//! `order.settled` / `order.unsettled` compare an order's balance before and after one entry in
//! feed order: the entries of the order that the feed lists after this one are left out of the
//! view's sum, so a feed read again later finds the same transition at the same entry.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use crate::account_doc::account_doc_id;
use crate::clock::now_ms;
use crate::couch::{ChangeRow, ChangesQuery, Client, ViewQuery};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::meta::Metadata;
use crate::money::Amount;
use crate::opening::OPENING_PREFIX;
use crate::orders::{exact_amount, EntryKind};
use crate::state::State;
use crate::transfer::{TransferView, TxnDoc};

/// Events in a page of [`Ledger::events`] when the query does not say.
pub const EVENTS_LIMIT_DEFAULT: usize = 100;
/// The most events one page of [`Ledger::events`] holds.
pub const EVENTS_LIMIT_MAX: usize = 1000;
/// The longest wait [`EventQuery::wait`] may ask for.
pub const EVENTS_WAIT_MAX: Duration = Duration::from_secs(60);

/// Changes read from a feed in one request.
const CHANGES_BATCH: u64 = 200;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// A transfer's document reads `done`: its money moved, for good.
    TransferDone,
    /// A transfer's document reads `cancelled`: nothing moved.
    TransferCancelled,
    /// A reversal is `done`: the transfer it names is given back (its data is the reversal).
    TransferReversed,
    /// A payment was written (once) into an order's ledger.
    PaymentRecorded,
    /// A refund was written.
    RefundRecorded,
    /// An adjustment was written.
    AdjustmentRecorded,
    /// An order's balance reached zero with this entry.
    OrderSettled,
    /// A settled order's balance left zero with this entry.
    OrderUnsettled,
    /// An account was created (its opening record).
    AccountCreated,
    /// An account's document shows it below its minimum (a cluster's transient case,
    /// docs/CLUSTER.md "What a reader may see").
    AccountOverdrawn,
}

impl EventKind {
    /// Every kind, in the order of the list above.
    pub const ALL: [EventKind; 10] = [
        EventKind::TransferDone,
        EventKind::TransferCancelled,
        EventKind::TransferReversed,
        EventKind::PaymentRecorded,
        EventKind::RefundRecorded,
        EventKind::AdjustmentRecorded,
        EventKind::OrderSettled,
        EventKind::OrderUnsettled,
        EventKind::AccountCreated,
        EventKind::AccountOverdrawn,
    ];

    /// The event's `type`: `transfer.done`, `payment.recorded`…
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::TransferDone => "transfer.done",
            EventKind::TransferCancelled => "transfer.cancelled",
            EventKind::TransferReversed => "transfer.reversed",
            EventKind::PaymentRecorded => "payment.recorded",
            EventKind::RefundRecorded => "refund.recorded",
            EventKind::AdjustmentRecorded => "adjustment.recorded",
            EventKind::OrderSettled => "order.settled",
            EventKind::OrderUnsettled => "order.unsettled",
            EventKind::AccountCreated => "account.created",
            EventKind::AccountOverdrawn => "account.overdrawn",
        }
    }

    /// A kind from its `type`.
    ///
    /// # Errors
    ///
    /// Not a kind (invalid input naming `types`, listing the kinds).
    pub fn parse(text: &str) -> Result<EventKind> {
        EventKind::ALL
            .into_iter()
            .find(|k| k.as_str() == text)
            .ok_or_else(|| {
                let all: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
                Error::invalid(
                    "types",
                    format!("{text:?} is not an event type; one of {}", all.join(", ")),
                )
            })
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Where one feed was read to: after the change at `seq` (`None`: from the start). `skip` and
/// `of` (the first `skip` events of the change of the document whose id hashes to `of` were
/// already given) are read from a cursor's text; pages keep a change whole and write none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Position {
    seq: Option<String>,
    skip: u32,
    of: Option<String>,
}

/// Hex digits of a document id's hash that a partial [`Position`] keeps.
const ID_HASH_HEX: usize = 8;

fn id_hash(id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_bytes());
    digest
        .iter()
        .take(ID_HASH_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Position {
    fn parse(text: &str) -> Option<Position> {
        let mut parts = text.split('.');
        let seq = parts.next()?;
        let (skip, of) = match (parts.next(), parts.next(), parts.next()) {
            (None, _, _) => (0, None),
            (Some(skip), Some(of), None) => {
                let hex = of.len() == ID_HASH_HEX
                    && of.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                (
                    skip.parse().ok().filter(|&k| k > 0 && hex)?,
                    Some(of.to_owned()),
                )
            }
            _ => return None,
        };
        let seq_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if seq.is_empty() || !seq.chars().all(seq_char) {
            return None;
        }
        Some(Position {
            seq: (seq != "0").then(|| seq.to_owned()),
            skip,
            of,
        })
    }

    /// How many events of the change of document `id` right after this position were given.
    fn given_of(&self, id: &str) -> usize {
        match &self.of {
            Some(of) if *of == id_hash(id) => self.skip as usize,
            _ => 0,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.seq.as_deref().unwrap_or("0"))?;
        if let (true, Some(of)) = (self.skip > 0, &self.of) {
            write!(f, ".{}.{of}", self.skip)?;
        }
        Ok(())
    }
}

/// Where a reader of [`Ledger::events`] is: every event before it was given. Its text form
/// (`Display`, [`EventCursor::parse`]) travels through a command line, a URL or an SSE
/// `Last-Event-ID`; callers keep it as it is and never build one. Sequences are CouchDB's own
/// (docs/EVENTS.md says what they mean across the nodes of a cluster).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventCursor {
    ledger: Position,
    /// The hot database's feed, in the split layout.
    hot: Position,
}

/// The longest text form of an [`EventCursor`] accepted.
pub const EVENT_CURSOR_CHARS_MAX: usize = 4096;

impl EventCursor {
    /// The start of the ledger: every event.
    pub fn start() -> EventCursor {
        EventCursor::default()
    }

    /// A cursor from its text form, as `Display` wrote it.
    ///
    /// # Errors
    ///
    /// Not a cursor this library wrote (invalid input naming `after`).
    pub fn parse(text: &str) -> Result<EventCursor> {
        let bad = || {
            Error::invalid(
                "after",
                format!(
                    "{:?} is not an event cursor (pass an event's `cursor` as it is)",
                    text.chars().take(80).collect::<String>()
                ),
            )
        };
        if text.len() > EVENT_CURSOR_CHARS_MAX {
            return Err(bad());
        }
        let (ledger, hot) = text.split_once('~').ok_or_else(bad)?;
        Ok(EventCursor {
            ledger: Position::parse(ledger).ok_or_else(bad)?,
            hot: Position::parse(hot).ok_or_else(bad)?,
        })
    }

    fn position(&mut self, feed: Feed) -> &mut Position {
        match feed {
            Feed::Ledger => &mut self.ledger,
            Feed::Hot => &mut self.hot,
        }
    }
}

impl fmt::Display for EventCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}~{}", self.ledger, self.hot)
    }
}

impl Serialize for EventCursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A transfer's facts in an event: [`TransferView`]'s fields, its `decided_at` always set (a
/// document from before that field existed gives its `last_modified`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TransferFacts {
    /// The transfer as [`Ledger::transfer`] reads it.
    #[serde(flatten)]
    pub transfer: TransferView,
}

/// An order entry's facts in an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntryFacts {
    /// The document's `_id`.
    pub id: String,
    /// What it is.
    #[serde(rename = "type")]
    pub kind: EntryKind,
    /// The order.
    pub order_id: String,
    /// The entry's reference (its idempotency key).
    pub reference: String,
    /// As written: a payment or refund positive, an adjustment signed.
    pub amount: Amount,
    /// ISO-4217 code.
    pub currency: String,
    /// A payment's method, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// A refund's or adjustment's reason, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What its writer attached.
    pub meta: Metadata,
}

/// An order's balance around the entry that settled or unsettled it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderFacts {
    /// The order.
    pub order_id: String,
    /// The entry that moved the balance.
    pub entry: String,
    /// The balance before that entry.
    pub balance_before: Amount,
    /// The balance after it (zero for `order.settled`).
    pub balance: Amount,
}

/// An account's facts in an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccountFacts {
    /// Account id.
    pub account: String,
    /// ISO-4217 code.
    pub currency: String,
    /// Its opening balance.
    pub opening: Amount,
    /// `None` = unlimited.
    pub min_balance: Option<Amount>,
    /// Its balance in the document the event was read from (`account.overdrawn` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<Amount>,
    /// What its creator attached, from the account's document (empty where that document was
    /// not there when the event was read: docs/EVENTS.md).
    pub meta: Metadata,
}

/// What an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum EventData {
    /// `transfer.*`.
    Transfer(TransferFacts),
    /// `payment.recorded`, `refund.recorded`, `adjustment.recorded`.
    Entry(EntryFacts),
    /// `order.settled`, `order.unsettled`.
    Order(OrderFacts),
    /// `account.*`.
    Account(AccountFacts),
}

/// One event. Its `id` is stable: the same fact read again (a resumed reader, a redelivered
/// webhook) carries the same id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerEvent {
    /// Stable id: `{type}:{what it is about}`.
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// Resume after this event.
    pub cursor: EventCursor,
    /// When it happened, ms since the epoch: a transfer's decision; for a document that keeps
    /// no time (order entries, opening records, accounts), when the feed read it.
    pub time: i64,
    /// The document's facts.
    pub data: EventData,
}

/// Which events [`Ledger::events`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    /// Start after this cursor; [`EventCursor::start`] for every event.
    pub after: EventCursor,
    /// At most this many events, 1 to [`EVENTS_LIMIT_MAX`].
    pub limit: usize,
    /// Only these kinds (`None`: all). The cursor still moves past the others.
    pub kinds: Option<Vec<EventKind>>,
    /// When no event is there yet, wait up to this long for one (at most
    /// [`EVENTS_WAIT_MAX`]); `None` answers at once.
    pub wait: Option<Duration>,
}

impl Default for EventQuery {
    fn default() -> EventQuery {
        EventQuery {
            after: EventCursor::start(),
            limit: EVENTS_LIMIT_DEFAULT,
            kinds: None,
            wait: None,
        }
    }
}

/// A page of events, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventPage {
    /// The events.
    pub events: Vec<LedgerEvent>,
    /// Where the next page starts: after the last event, or further when the feed held only
    /// changes that make no event of the kinds asked for.
    pub cursor: EventCursor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Feed {
    Ledger,
    Hot,
}

/// An event before its cursor is known.
struct Fact {
    id: String,
    kind: EventKind,
    time: i64,
    data: EventData,
}

impl Ledger {
    /// Events after `q.after`, oldest first (docs/EVENTS.md): derived from the `_changes` feed
    /// of the ledger's database (and the hot one when split), each with a stable id and the
    /// cursor to resume after it.
    ///
    /// # Errors
    ///
    /// A limit or wait out of range (invalid input); the server failed.
    pub async fn events(&self, q: &EventQuery) -> Result<EventPage> {
        if !(1..=EVENTS_LIMIT_MAX).contains(&q.limit) {
            return Err(Error::invalid(
                "limit",
                format!(
                    "{} is out of range: 1 to {EVENTS_LIMIT_MAX} events a page",
                    q.limit
                ),
            ));
        }
        let wait = q.wait.unwrap_or_default();
        if wait > EVENTS_WAIT_MAX {
            return Err(Error::invalid(
                "wait",
                format!(
                    "{} s is too long: at most {} s",
                    wait.as_secs(),
                    EVENTS_WAIT_MAX.as_secs()
                ),
            ));
        }
        let deadline = crate::clock::Instant::now() + wait;
        let mut page = EventPage {
            events: Vec::new(),
            cursor: q.after.clone(),
        };
        if !self.is_split() {
            // One database: a hot position means nothing here.
            page.cursor.hot = Position::default();
        }
        loop {
            for feed in self.feeds() {
                self.read_feed(feed, q, &mut page).await?;
                if page.events.len() >= q.limit {
                    return Ok(page);
                }
            }
            let left = deadline.saturating_duration_since(crate::clock::Instant::now());
            if !page.events.is_empty() || left.is_zero() {
                return Ok(page);
            }
            self.wait_for_change(&page.cursor, left).await?;
        }
    }

    fn feeds(&self) -> Vec<Feed> {
        if self.is_split() {
            vec![Feed::Ledger, Feed::Hot]
        } else {
            vec![Feed::Ledger]
        }
    }

    fn feed_client(&self, feed: Feed) -> &Client {
        match feed {
            Feed::Ledger => self.client(),
            Feed::Hot => self.hot_client(),
        }
    }

    /// Reads `feed` from the page's cursor until it is at its end or the page is full.
    async fn read_feed(&self, feed: Feed, q: &EventQuery, page: &mut EventPage) -> Result<()> {
        let client = self.feed_client(feed);
        loop {
            let at = page.cursor.position(feed).clone();
            let changes = client
                .changes(&ChangesQuery {
                    since: at.seq.clone().map(Value::String),
                    limit: Some(CHANGES_BATCH),
                    include_docs: true,
                    ..ChangesQuery::default()
                })
                .await
                .map_err(|e| match e.status_code() {
                    // The server refused the sequence: a cursor of another database.
                    Some(400) => Error::invalid(
                        "after",
                        format!(
                            "{} is not a cursor of this ledger's databases (the server said: {e})",
                            q.after
                        ),
                    ),
                    _ => e,
                })?;
            let read = changes.results.len();
            // The change whose first events were given: after `at` in its shard, so anywhere in
            // a feed that merges several shards' (not always first).
            let mut partial = (at.skip > 0).then_some(&at);
            for row in &changes.results {
                let facts = self.facts_of(client, row).await?;
                let skip = match partial.map(|p| p.given_of(&row.id)) {
                    Some(given) if given > 0 => {
                        partial = None;
                        given
                    }
                    _ => 0,
                };
                let wanted: Vec<&Fact> = facts
                    .iter()
                    .skip(skip)
                    .filter(|f| q.kinds.as_ref().is_none_or(|ks| ks.contains(&f.kind)))
                    .collect();
                // A page never splits a change: one that would not fit waits for the next page,
                // unless it is the page's first (then the page holds one event more).
                if !page.events.is_empty() && page.events.len() + wanted.len() > q.limit {
                    return Ok(());
                }
                let before = page.cursor.position(feed).clone();
                let after = Position {
                    seq: Some(seq_text(&row.seq)),
                    ..Position::default()
                };
                for (k, fact) in wanted.iter().enumerate() {
                    // Every event of the change but its last resumes before the change: a
                    // consumer that stops between them gets the change's events again (the
                    // same ids), never misses the rest.
                    *page.cursor.position(feed) = if k + 1 == wanted.len() {
                        after.clone()
                    } else {
                        before.clone()
                    };
                    page.events.push(LedgerEvent {
                        id: fact.id.clone(),
                        kind: fact.kind,
                        cursor: page.cursor.clone(),
                        time: fact.time,
                        data: fact.data.clone(),
                    });
                }
                *page.cursor.position(feed) = after;
                if page.events.len() >= q.limit {
                    return Ok(());
                }
            }
            if read < CHANGES_BATCH as usize {
                return Ok(());
            }
        }
    }

    /// Waits until a feed has a change after the cursor, or `left` has passed (bounded here
    /// too: a server may hold a longpoll past the `timeout` it was given).
    async fn wait_for_change(&self, cursor: &EventCursor, left: Duration) -> Result<()> {
        match tokio::time::timeout(left, self.longpoll_any(cursor, left)).await {
            Ok(answered) => answered,
            Err(_elapsed) => Ok(()),
        }
    }

    async fn longpoll_any(&self, cursor: &EventCursor, left: Duration) -> Result<()> {
        let longpoll = |feed: Feed| {
            let since = match feed {
                Feed::Ledger => cursor.ledger.seq.clone(),
                Feed::Hot => cursor.hot.seq.clone(),
            };
            let client = self.feed_client(feed).clone();
            async move {
                client
                    .changes(&ChangesQuery {
                        since: Some(since.map_or(Value::from(0), Value::String)),
                        longpoll: true,
                        timeout: Some(left),
                        limit: Some(1),
                        ..ChangesQuery::default()
                    })
                    .await
            }
        };
        if self.is_split() {
            tokio::select! {
                r = longpoll(Feed::Ledger) => r.map(|_| ()),
                r = longpoll(Feed::Hot) => r.map(|_| ()),
            }
        } else {
            longpoll(Feed::Ledger).await.map(|_| ())
        }
    }

    /// The events one change makes, in the order they are given.
    async fn facts_of(&self, client: &Client, row: &ChangeRow) -> Result<Vec<Fact>> {
        let Some(doc) = row.doc.as_ref().filter(|_| !row.deleted) else {
            return Ok(Vec::new());
        };
        let doc_type = doc.get("type").and_then(Value::as_str).unwrap_or_default();
        Ok(match doc_type {
            "transaction" => transfer_facts(doc)?,
            "opening" if row.id.starts_with(OPENING_PREFIX) => {
                let mut facts = opening_facts(doc);
                for fact in &mut facts {
                    if let EventData::Account(account) = &mut fact.data {
                        account.meta = self.account_meta(&account.account).await?;
                    }
                }
                facts
            }
            "account" => overdrawn_facts(doc),
            "payment" | "refund" | "adjustment" | "purchase" => {
                let mut facts = entry_facts(doc)?;
                facts.extend(self.order_facts(client, row, doc).await?);
                facts
            }
            _ => Vec::new(),
        })
    }

    /// The metadata of account `account`, from its document; none where it is not there (a
    /// create stopped between the opening record and the account, or a copy of a cluster's
    /// database that does not hold the account yet).
    async fn account_meta(&self, account: &str) -> Result<Metadata> {
        let doc: Option<Value> = self.hot_client().get_opt(&account_doc_id(account)).await?;
        Ok(doc
            .as_ref()
            .and_then(Value::as_object)
            .map(Metadata::stored)
            .unwrap_or_default())
    }

    /// `order.settled` / `order.unsettled` at the entry `row`: the order's balance over the
    /// entries the feed lists up to it, before and after it.
    async fn order_facts(
        &self,
        client: &Client,
        row: &ChangeRow,
        doc: &Value,
    ) -> Result<Vec<Fact>> {
        let Some(order_id) = doc.get("order_id").and_then(Value::as_str) else {
            return Ok(Vec::new());
        };
        let Some(amount) = signed_amount(doc)? else {
            return Ok(Vec::new());
        };
        let rows = client
            .view(
                "orders",
                "ledger",
                &ViewQuery {
                    key: Some(json!(order_id)),
                    reduce: Some(false),
                    ..ViewQuery::default()
                },
            )
            .await?
            .rows;
        let ids: Vec<String> = rows.iter().filter_map(|r| r.id.clone()).collect();
        let later: HashSet<String> = if ids.is_empty() {
            HashSet::new()
        } else {
            client
                .changes(&ChangesQuery {
                    since: Some(Value::String(seq_text(&row.seq))),
                    doc_ids: Some(ids),
                    ..ChangesQuery::default()
                })
                .await?
                .results
                .into_iter()
                .map(|c| c.id)
                .collect()
        };
        let mut before = Amount::default();
        let mut entries_before = 0usize;
        for r in &rows {
            let Some(id) = r.id.as_deref() else { continue };
            if id == row.id || later.contains(id) {
                continue;
            }
            before = before.checked_add(exact_amount(&r.value, "orders/ledger")?)?;
            entries_before += 1;
        }
        let after = before.checked_add(amount)?;
        let kind = if after.minor() == 0 && before.minor() != 0 {
            EventKind::OrderSettled
        } else if before.minor() == 0 && after.minor() != 0 && entries_before > 0 {
            EventKind::OrderUnsettled
        } else {
            return Ok(Vec::new());
        };
        Ok(vec![Fact {
            id: format!("{kind}:{order_id}:{}", row.id),
            kind,
            time: now_ms(),
            data: EventData::Order(OrderFacts {
                order_id: order_id.to_owned(),
                entry: row.id.clone(),
                balance_before: before,
                balance: after,
            }),
        }])
    }
}

fn seq_text(seq: &Value) -> String {
    match seq {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `transfer.done` (and `transfer.reversed` for a reversal) or `transfer.cancelled`.
fn transfer_facts(doc: &Value) -> Result<Vec<Fact>> {
    let txn = TxnDoc::from_value(doc.clone())?;
    let kinds: &[EventKind] = match (txn.state, txn.reverses.is_some()) {
        (State::Done, false) => &[EventKind::TransferDone],
        (State::Done, true) => &[EventKind::TransferDone, EventKind::TransferReversed],
        (State::Cancelled, _) => &[EventKind::TransferCancelled],
        _ => &[],
    };
    let decided_at = txn.decided_at.unwrap_or(txn.last_modified);
    let mut transfer = txn.view();
    transfer.decided_at = Some(decided_at);
    let facts = TransferFacts { transfer };
    Ok(kinds
        .iter()
        .map(|&kind| Fact {
            id: format!("{kind}:{}", facts.transfer.id),
            kind,
            time: decided_at,
            data: EventData::Transfer(facts.clone()),
        })
        .collect())
}

fn text(doc: &Value, field: &str) -> Option<String> {
    doc.get(field).and_then(Value::as_str).map(str::to_owned)
}

fn amount_field(doc: &Value, field: &str) -> Option<Amount> {
    doc.get(field)
        .and_then(Value::as_i64)
        .and_then(|n| Amount::new(n).ok())
}

/// `account.created` from an opening record.
fn opening_facts(doc: &Value) -> Vec<Fact> {
    let (Some(account), Some(currency), Some(opening)) = (
        text(doc, "account_id"),
        text(doc, "currency"),
        amount_field(doc, "opening"),
    ) else {
        return Vec::new();
    };
    vec![Fact {
        id: format!("{}:{account}", EventKind::AccountCreated),
        kind: EventKind::AccountCreated,
        time: now_ms(),
        data: EventData::Account(AccountFacts {
            account,
            currency,
            opening,
            min_balance: amount_field(doc, "min_balance"),
            balance: None,
            meta: Metadata::new(),
        }),
    }]
}

/// `account.overdrawn` from an account document below its minimum (the rule of the
/// `transactions/account_overdrawn` view), one per revision that shows it.
fn overdrawn_facts(doc: &Value) -> Vec<Fact> {
    let (Some(account), Some(currency), Some(balance), Some(min), Some(rev)) = (
        text(doc, "account_id"),
        text(doc, "currency"),
        amount_field(doc, "balance"),
        amount_field(doc, "min_balance"),
        text(doc, "_rev"),
    ) else {
        return Vec::new();
    };
    if balance >= min {
        return Vec::new();
    }
    vec![Fact {
        id: format!("{}:{account}:{rev}", EventKind::AccountOverdrawn),
        kind: EventKind::AccountOverdrawn,
        time: now_ms(),
        data: EventData::Account(AccountFacts {
            account,
            currency,
            opening: amount_field(doc, "opening").unwrap_or_default(),
            min_balance: Some(min),
            balance: Some(balance),
            meta: doc.as_object().map(Metadata::stored).unwrap_or_default(),
        }),
    }]
}

/// What an order entry adds to its order's balance (the `orders/ledger` view's rule); `None`
/// for a document that view leaves out.
fn signed_amount(doc: &Value) -> Result<Option<Amount>> {
    let field = match doc.get("type").and_then(Value::as_str) {
        Some("purchase") => "total",
        Some("payment" | "refund" | "adjustment") => "value",
        _ => return Ok(None),
    };
    let Some(value) = doc.get(field).filter(|v| v.is_number()) else {
        return Ok(None);
    };
    let amount = exact_amount(value, field)?;
    Ok(Some(if doc["type"] == "payment" {
        amount.neg()
    } else {
        amount
    }))
}

/// `payment.recorded`, `refund.recorded` or `adjustment.recorded` (a purchase makes none).
fn entry_facts(doc: &Value) -> Result<Vec<Fact>> {
    let (kind, entry_kind) = match doc.get("type").and_then(Value::as_str) {
        Some("payment") => (EventKind::PaymentRecorded, EntryKind::Payment),
        Some("refund") => (EventKind::RefundRecorded, EntryKind::Refund),
        Some("adjustment") => (EventKind::AdjustmentRecorded, EntryKind::Adjustment),
        _ => return Ok(Vec::new()),
    };
    let (Some(id), Some(order_id), Some(amount), Some(currency)) = (
        text(doc, "_id"),
        text(doc, "order_id"),
        amount_field(doc, "value"),
        text(doc, "currency"),
    ) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{}:{order_id}:", entry_kind.as_str());
    let reference = id.strip_prefix(&prefix).unwrap_or(&id).to_owned();
    Ok(vec![Fact {
        id: format!("{kind}:{id}"),
        kind,
        time: now_ms(),
        data: EventData::Entry(EntryFacts {
            id,
            kind: entry_kind,
            order_id,
            reference,
            amount,
            currency,
            method: text(doc, "method"),
            reason: text(doc, "reason"),
            meta: doc.as_object().map(Metadata::stored).unwrap_or_default(),
        }),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written() {
        for text in [
            "0~0",
            "17~0",
            "17.2.0a1b2c3d~5",
            "12-g1AAAA_x-y~0",
            "3~44-abc.1.ffffffff",
        ] {
            let cursor = EventCursor::parse(text).unwrap();
            assert_eq!(cursor.to_string(), text);
        }
        assert_eq!(EventCursor::parse("0~0").unwrap(), EventCursor::start());
        for bad in [
            "",
            "0",
            "17",
            "~",
            "a b~0",
            "1.x~0",
            "1~2~3",
            "1~{}",
            "1.2~0",
            "1.0.0a1b2c3d~0",
            "1.2.0A1B2C3D~0",
            &format!("{}~0", "9".repeat(5000)),
        ] {
            let e = EventCursor::parse(bad).unwrap_err();
            assert!(e.to_string().contains("after"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_partial_position_skips_only_the_change_it_names() {
        let at = Position {
            seq: Some("5".to_owned()),
            skip: 1,
            of: Some(id_hash("payment:o:P2")),
        };
        assert_eq!(at.given_of("payment:o:P2"), 1);
        assert_eq!(
            at.given_of("payment:o:P3"),
            0,
            "a rewound feed starts elsewhere"
        );
        assert_eq!(Position::parse(&at.to_string()).unwrap(), at);
    }

    #[test]
    fn every_kind_parses_from_its_type() {
        for kind in EventKind::ALL {
            assert_eq!(EventKind::parse(kind.as_str()).unwrap(), kind);
        }
        let e = EventKind::parse("transfer.pending")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("transfer.done") && e.contains("account.overdrawn"),
            "{e}"
        );
    }

    fn txn(state: &str, reverses: Option<&str>) -> Value {
        json!({
            "_id": "txn:t1", "_rev": "3-a", "type": "transaction", "txn_id": "t1",
            "source": "a", "destination": "b", "value": 250, "currency": "EUR",
            "state": state, "reverses": reverses, "created_at": 10, "last_modified": 30,
            "decided_at": 20,
        })
    }

    #[test]
    fn a_transfer_makes_an_event_only_once_it_ended() {
        for open in ["initial", "pending", "committed", "canceling"] {
            assert!(
                transfer_facts(&txn(open, None)).unwrap().is_empty(),
                "{open}"
            );
        }
        let done = transfer_facts(&txn("done", None)).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].id, "transfer.done:t1");
        assert_eq!(done[0].time, 20);
        let reversal = transfer_facts(&txn("done", Some("t0"))).unwrap();
        let kinds: Vec<EventKind> = reversal.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [EventKind::TransferDone, EventKind::TransferReversed]
        );
        let cancelled = transfer_facts(&txn("cancelled", None)).unwrap();
        assert_eq!(cancelled[0].kind, EventKind::TransferCancelled);
    }

    #[test]
    fn an_account_is_overdrawn_only_below_its_minimum() {
        let account = |balance: i64, min: Option<i64>| {
            json!({"_id": "account:a", "_rev": "9-x", "type": "account", "account_id": "a",
                   "currency": "EUR", "opening": 100, "balance": balance, "min_balance": min})
        };
        assert!(overdrawn_facts(&account(0, Some(0))).is_empty());
        assert!(overdrawn_facts(&account(-5, None)).is_empty());
        let facts = overdrawn_facts(&account(-5, Some(0)));
        assert_eq!(facts.len(), 1);
        assert_eq!(facts[0].id, "account.overdrawn:a:9-x");
    }

    #[test]
    fn an_entry_names_its_reference_and_signs_a_payment() {
        let payment = json!({"_id": "payment:o1:R-1", "type": "payment", "order_id": "o1",
                             "value": 700, "currency": "EUR", "method": "card"});
        let facts = entry_facts(&payment).unwrap();
        let EventData::Entry(entry) = &facts[0].data else {
            panic!("not an entry: {:?}", facts[0].data)
        };
        assert_eq!(entry.reference, "R-1");
        assert_eq!(entry.amount.minor(), 700);
        assert_eq!(signed_amount(&payment).unwrap().unwrap().minor(), -700);
        let purchase = json!({"_id": "purchase:o1", "type": "purchase", "order_id": "o1",
                              "total": 700});
        assert!(entry_facts(&purchase).unwrap().is_empty());
        assert_eq!(signed_amount(&purchase).unwrap().unwrap().minor(), 700);
    }
}
