//! An account's history and its balance at a time, read from the `transactions/account_history`
//! view: `[account, decided time, txn id] → delta`, `_sum`, over the transfers that are
//! `committed` or `done` (the rule `verify`'s exactly-once check counts by), so a history adds
//! up to what `verify` checks the balance against.
//!
//! A transfer's time is when its outcome was decided (the document's `decided_at`; its
//! `last_modified` for a document written before that field existed). The balance right after
//! an entry is the account's opening plus the view's sum up to and including the entry's key:
//! one reduce request for a page's first (newest) entry, then each older one is the newer one
//! less its delta.
//!
//! A view is read from one copy and may lag behind the documents (docs/CLUSTER.md): a transfer
//! decided a moment ago may be missing from an answer, never counted twice or wrongly.

use std::fmt;

use serde::Serialize;
use serde_json::{json, Value};

use crate::accounts::{validate_id, AccountView};
use crate::couch::{ViewQuery, ViewRow};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::limits::ID_CHARS_MAX;
use crate::money::Amount;
use crate::orders::exact_amount;
use crate::state::State;
use crate::timestamp::{TIME_MS_DIGITS_MAX, TIME_MS_MAX};
use crate::transfer::TxnDoc;

/// Entries in a page of [`Ledger::account_history`] when the query does not say.
pub const HISTORY_LIMIT_DEFAULT: usize = 50;
/// The most entries one page of [`Ledger::account_history`] holds.
pub const HISTORY_LIMIT_MAX: usize = 1000;

/// The longest text form of a [`HistoryCursor`]: a time in ms, a dot, a transfer id.
pub const HISTORY_CURSOR_CHARS_MAX: usize = TIME_MS_DIGITS_MAX + 1 + ID_CHARS_MAX;

const _: () = assert!(HISTORY_LIMIT_DEFAULT >= 1 && HISTORY_LIMIT_DEFAULT <= HISTORY_LIMIT_MAX);

/// The design document and view the history is read from.
const DDOC: &str = "transactions";
const VIEW: &str = "account_history";

/// Where the next page of a history starts: the `next` of a [`HistoryPage`], passed back as
/// [`HistoryQuery::after`]. Its text form (`Display`, [`HistoryCursor::parse`]) is for
/// carrying it through a command line or a URL; callers keep it as it is and never build one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryCursor {
    at: i64,
    txn: String,
}

impl HistoryCursor {
    /// A cursor from its text form, as `Display` wrote it.
    ///
    /// # Errors
    ///
    /// Not a cursor this library wrote (invalid input naming `after`).
    pub fn parse(text: &str) -> Result<HistoryCursor> {
        let bad = || {
            Error::invalid(
                "after",
                format!("{text:?} is not a history cursor (pass the `next` of a page as it is)"),
            )
        };
        let (at, txn) = text.split_once('.').ok_or_else(bad)?;
        let digits = at.bytes().all(|b| b.is_ascii_digit());
        if !digits || !(1..=TIME_MS_DIGITS_MAX).contains(&at.len()) {
            return Err(bad());
        }
        let at: i64 = at.parse().map_err(|_| bad())?;
        if txn.is_empty() || txn.chars().any(char::is_control) {
            return Err(bad());
        }
        if text.chars().count() > HISTORY_CURSOR_CHARS_MAX {
            return Err(bad());
        }
        Ok(HistoryCursor {
            at,
            txn: txn.to_owned(),
        })
    }

    fn of(entry: &HistoryEntry) -> HistoryCursor {
        HistoryCursor {
            at: entry.decided_at,
            txn: entry.txn.clone(),
        }
    }
}

impl fmt::Display for HistoryCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.at, self.txn)
    }
}

impl Serialize for HistoryCursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Which part of an account's history [`Ledger::account_history`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Only transfers that took effect at or after this time (ms since the epoch).
    pub from: Option<i64>,
    /// Only transfers that took effect at or before this time (ms since the epoch).
    pub to: Option<i64>,
    /// At most this many entries, 1 to [`HISTORY_LIMIT_MAX`].
    pub limit: usize,
    /// Go on after this entry: the `next` of the previous page.
    pub after: Option<HistoryCursor>,
}

impl Default for HistoryQuery {
    /// The whole history, newest first, [`HISTORY_LIMIT_DEFAULT`] entries a page.
    fn default() -> HistoryQuery {
        HistoryQuery {
            from: None,
            to: None,
            limit: HISTORY_LIMIT_DEFAULT,
            after: None,
        }
    }
}

/// One transfer in an account's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryEntry {
    /// Transfer id.
    pub txn: String,
    /// When it took effect (its decision was written), ms since the epoch.
    pub decided_at: i64,
    /// What it did to this account: −value where the account was the source, +value where it
    /// was the destination.
    pub delta: Amount,
    /// The account's balance right after it: the opening plus every transfer up to this one.
    pub balance_after: Amount,
    /// The transfer's other account.
    pub counterparty: String,
    /// `committed` or `done`: either has moved the money for good.
    pub state: State,
    /// For a reversal, the transfer it reverses.
    pub reverses: Option<String>,
}

/// A page of an account's history, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryPage {
    /// Account id.
    pub account: String,
    /// ISO-4217 code, as the account's document holds it.
    pub currency: String,
    /// The account's opening balance (where its history starts).
    pub opening: Amount,
    /// The transfers, newest first.
    pub entries: Vec<HistoryEntry>,
    /// Pass as [`HistoryQuery::after`] for the next (older) page; `None` at the end.
    pub next: Option<HistoryCursor>,
}

/// An account's balance as of a time, beside the account as it is now: [`Ledger::balance_at`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BalanceAt {
    /// The account as it is now: its current balances, currency and opening.
    pub account: AccountView,
    /// The time asked about, ms since the epoch.
    pub at: i64,
    /// The opening plus every committed or done transfer that took effect at or before `at`.
    pub balance: Amount,
}

/// A row of the view: the key's time and transfer id, the delta, and the document.
struct Row {
    at: i64,
    txn: String,
    delta: Amount,
    doc: Option<Value>,
}

impl Row {
    fn from_view(row: ViewRow, account: &str) -> Result<Row> {
        let what = format!("{DDOC}/{VIEW} row of account {account:?}");
        let (at, txn) = match row.key.as_array().map(Vec::as_slice) {
            Some([_, at, Value::String(txn)]) => (at.as_i64(), txn.clone()),
            _ => (None, String::new()),
        };
        let at = at.ok_or_else(|| Error::decode(format!("{what}: key {}", row.key)))?;
        let delta = exact_amount(&row.value, &what)?;
        Ok(Row {
            at,
            txn,
            delta,
            doc: row.doc,
        })
    }

    /// The entry, with the transfer's other account, state and what it reverses from its
    /// document (the time and delta are the view's: what the sums count).
    fn entry(self, account: &str, balance_after: Amount) -> Result<HistoryEntry> {
        let doc = self.doc.ok_or_else(|| {
            Error::decode(format!(
                "transfer {:?} is in the history of {account:?} but has no document",
                self.txn
            ))
        })?;
        let doc = TxnDoc::from_value(doc)?;
        let counterparty = if doc.source == account {
            doc.destination
        } else {
            doc.source
        };
        Ok(HistoryEntry {
            txn: self.txn,
            decided_at: self.at,
            delta: self.delta,
            balance_after,
            counterparty,
            state: doc.state,
            reverses: doc.reverses,
        })
    }
}

impl HistoryQuery {
    /// What must hold before anything is read.
    fn check(&self) -> Result<()> {
        if self.limit == 0 || self.limit > HISTORY_LIMIT_MAX {
            return Err(Error::invalid(
                "limit",
                format!(
                    "must be between 1 and {HISTORY_LIMIT_MAX}, not {}",
                    self.limit
                ),
            ));
        }
        for (field, time) in [("from", self.from), ("to", self.to)] {
            if time.is_some_and(|t| !(-TIME_MS_MAX..=TIME_MS_MAX).contains(&t)) {
                return Err(Error::invalid(
                    field,
                    format!("must be within ±{TIME_MS_MAX} ms of the epoch"),
                ));
            }
        }
        Ok(())
    }

    /// The view request for this page's rows of `account`, newest first: from the cursor (or
    /// `to`, whichever is earlier) down to `from`, one row more than the page (the cursor's
    /// own row, skipped) and one more again (to know there is a next page).
    fn rows_request(&self, account: &str) -> ViewQuery {
        let to_key = match self.to {
            Some(to) => json!([account, to, {}]),
            None => json!([account, {}]),
        };
        let start_key = match &self.after {
            Some(c) if self.to.is_none_or(|to| c.at <= to) => json!([account, c.at, c.txn]),
            _ => to_key,
        };
        let end_key = match self.from {
            Some(from) => json!([account, from]),
            None => json!([account]),
        };
        ViewQuery {
            start_key: Some(start_key),
            end_key: Some(end_key),
            descending: Some(true),
            reduce: Some(false),
            include_docs: Some(true),
            limit: Some(self.limit as u64 + 2),
            ..ViewQuery::default()
        }
    }

    /// Whether no entry can be in the page: it would start (at `to`, or the cursor) before
    /// `from`. CouchDB refuses such a key range (400 `query_parse_error`) instead of answering
    /// no rows.
    fn is_empty_range(&self) -> bool {
        let Some(from) = self.from else {
            return false;
        };
        let cursor = self
            .after
            .as_ref()
            .filter(|c| self.to.is_none_or(|to| c.at <= to))
            .map(|c| c.at);
        cursor.or(self.to).is_some_and(|start| start < from)
    }

    /// Whether `row` is the cursor's own entry (the last of the previous page).
    fn is_cursor(&self, row: &Row) -> bool {
        self.after
            .as_ref()
            .is_some_and(|c| c.at == row.at && c.txn == row.txn)
    }
}

impl Ledger {
    /// A page of `account`'s history, newest first: every transfer that is `committed` or
    /// `done` and touched the account (reversals too, with [`HistoryEntry::reverses`]), each
    /// with when it took effect, its delta on this account and the balance right after it.
    /// Cancelled transfers never moved money and are not in it. Two view requests a page (its
    /// rows, and one sum for its newest entry's balance), after a read of the account.
    ///
    /// A time is a transfer's `decided_at`, or for a document from before that field existed,
    /// its `last_modified`. The view is read from one copy and may lag (docs/CLUSTER.md).
    ///
    /// # Errors
    ///
    /// A bad account id; `limit` not in 1 to [`HISTORY_LIMIT_MAX`], `from` or `to` further than
    /// [`TIME_MS_MAX`](crate::TIME_MS_MAX) from the epoch (invalid input naming the field); no such account
    /// (404, [`Error::is_not_found`]); a view row or transfer document this version cannot
    /// read; the server failed.
    pub async fn account_history(&self, account: &str, query: HistoryQuery) -> Result<HistoryPage> {
        validate_id("account", account)?;
        query.check()?;
        let view = self.account(account).await?;
        let found = if query.is_empty_range() {
            Vec::new()
        } else {
            self.inner
                .hot
                .view(DDOC, VIEW, &query.rows_request(account))
                .await?
                .rows
        };
        let mut rows = Vec::with_capacity(found.len());
        for row in found {
            let row = Row::from_view(row, account)?;
            if !query.is_cursor(&row) {
                rows.push(row);
            }
        }
        let more = rows.len() > query.limit;
        rows.truncate(query.limit);
        let mut entries = Vec::with_capacity(rows.len());
        if let Some(newest) = rows.first() {
            let through = json!([account, newest.at, newest.txn]);
            let mut balance = view
                .opening
                .checked_add(self.history_sum(account, through).await?)?;
            for row in rows {
                let delta = row.delta;
                entries.push(row.entry(account, balance)?);
                balance = balance.checked_sub(delta)?;
            }
        }
        let next = more
            .then(|| entries.last().map(HistoryCursor::of))
            .flatten();
        Ok(HistoryPage {
            account: view.account,
            currency: view.currency,
            opening: view.opening,
            entries,
            next,
        })
    }

    /// `account`'s balance as of `at` (ms since the epoch): its opening plus every `committed`
    /// or `done` transfer that took effect at or before `at` (by the times
    /// [`Ledger::account_history`] shows), with the account as it is now. One read of the
    /// account and one view request. An `at` before the account existed gives its opening.
    ///
    /// # Errors
    ///
    /// A bad account id; `at` further than [`TIME_MS_MAX`](crate::TIME_MS_MAX) from the epoch
    /// (invalid input naming `at`); no such account (404, [`Error::is_not_found`]); a sum that is not an exact
    /// amount; the server failed.
    pub async fn balance_at(&self, account: &str, at: i64) -> Result<BalanceAt> {
        validate_id("account", account)?;
        if !(-TIME_MS_MAX..=TIME_MS_MAX).contains(&at) {
            return Err(Error::invalid(
                "at",
                format!("must be within ±{TIME_MS_MAX} ms of the epoch"),
            ));
        }
        let view = self.account(account).await?;
        let sum = self.history_sum(account, json!([account, at, {}])).await?;
        Ok(BalanceAt {
            balance: view.opening.checked_add(sum)?,
            account: view,
            at,
        })
    }

    /// The sum of `account`'s deltas in the view up to and including the key `through`.
    async fn history_sum(&self, account: &str, through: Value) -> Result<Amount> {
        let q = ViewQuery {
            start_key: Some(json!([account])),
            end_key: Some(through),
            reduce: Some(true),
            ..ViewQuery::default()
        };
        let reply = self.inner.hot.view(DDOC, VIEW, &q).await?;
        match reply.rows.as_slice() {
            [] => Ok(Amount::ZERO),
            [row] => exact_amount(&row.value, &format!("{DDOC}/{VIEW} sum of {account:?}")),
            rows => Err(Error::decode(format!(
                "{DDOC}/{VIEW}: {} rows for one sum",
                rows.len()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_wrote() {
        let c = HistoryCursor {
            at: 1_763_798_400_250,
            txn: "order-42.b 7".to_owned(),
        };
        assert_eq!(c.to_string(), "1763798400250.order-42.b 7");
        assert_eq!(HistoryCursor::parse(&c.to_string()).unwrap(), c);
        for bad in [
            "",
            "x",
            "1763798400250",
            "1763798400250.",
            ".t1",
            "-1.t1",
            "+1.t1",
            "1234567890123456.t1",
            "17637984002a0.t1",
            "1.a\nb",
        ] {
            let e = HistoryCursor::parse(bad).unwrap_err();
            assert_eq!(e.field(), Some("after"), "{bad:?}");
        }
    }

    #[test]
    fn limits_and_times_are_checked_before_anything_is_read() {
        assert!(HistoryQuery::default().check().is_ok());
        for (q, field) in [
            (
                HistoryQuery {
                    limit: 0,
                    ..HistoryQuery::default()
                },
                "limit",
            ),
            (
                HistoryQuery {
                    limit: HISTORY_LIMIT_MAX + 1,
                    ..HistoryQuery::default()
                },
                "limit",
            ),
            (
                HistoryQuery {
                    from: Some(-TIME_MS_MAX - 1),
                    ..HistoryQuery::default()
                },
                "from",
            ),
            (
                HistoryQuery {
                    to: Some(TIME_MS_MAX + 1),
                    ..HistoryQuery::default()
                },
                "to",
            ),
        ] {
            assert_eq!(q.check().unwrap_err().field(), Some(field), "{q:?}");
        }
        let most = HistoryQuery {
            limit: HISTORY_LIMIT_MAX,
            ..HistoryQuery::default()
        };
        assert!(most.check().is_ok());
    }

    #[test]
    fn a_page_that_would_start_before_from_is_empty_without_a_request() {
        let cursor = |at| {
            Some(HistoryCursor {
                at,
                txn: "t".to_owned(),
            })
        };
        let q = |from, to, after| HistoryQuery {
            from,
            to,
            after,
            ..HistoryQuery::default()
        };
        assert!(q(Some(200), Some(100), None).is_empty_range());
        assert!(q(Some(200), None, cursor(150)).is_empty_range());
        assert!(q(Some(200), Some(100), cursor(300)).is_empty_range());
        assert!(!q(Some(100), Some(100), None).is_empty_range());
        assert!(!q(Some(100), None, cursor(100)).is_empty_range());
        assert!(!q(None, Some(100), cursor(50)).is_empty_range());
        assert!(!q(Some(100), Some(300), cursor(500)).is_empty_range());
    }

    #[test]
    fn a_page_starts_at_the_cursor_or_at_to_whichever_is_earlier() {
        let after = Some(HistoryCursor {
            at: 500,
            txn: "t5".to_owned(),
        });
        let keys = |q: HistoryQuery| {
            let r = q.rows_request("a");
            (r.start_key.unwrap(), r.end_key.unwrap(), r.limit.unwrap())
        };
        let q = HistoryQuery::default();
        assert_eq!(keys(q), (json!(["a", {}]), json!(["a"]), 52));
        let q = HistoryQuery {
            after: after.clone(),
            from: Some(100),
            ..HistoryQuery::default()
        };
        assert_eq!(keys(q), (json!(["a", 500, "t5"]), json!(["a", 100]), 52));
        let q = HistoryQuery {
            after: after.clone(),
            to: Some(400),
            limit: 3,
            ..HistoryQuery::default()
        };
        assert_eq!(keys(q), (json!(["a", 400, {}]), json!(["a"]), 5));
        let q = HistoryQuery {
            after,
            to: Some(500),
            ..HistoryQuery::default()
        };
        assert_eq!(keys(q).0, json!(["a", 500, "t5"]));
    }
}
