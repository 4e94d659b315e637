//! Transfers found by their metadata: the `transactions/by_meta` view, `[key, value,
//! created_at, txn id] → null`, read newest first and paged on the last key.

use std::fmt;

use serde::Serialize;
use serde_json::{json, Value};

use crate::couch::{ViewQuery, ViewRow};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::limits::ID_CHARS_MAX;
use crate::meta::{check_key, check_value};
use crate::timestamp::TIME_MS_DIGITS_MAX;
use crate::transfer::{TransferView, TxnDoc};

/// Transfers in a page of [`Ledger::transfers_by_meta`] when the query does not say.
pub const META_SEARCH_LIMIT_DEFAULT: usize = 50;
/// The most transfers one page of [`Ledger::transfers_by_meta`] holds.
pub const META_SEARCH_LIMIT_MAX: usize = 1000;
/// The longest text form of a [`MetaCursor`]: a time in ms, a dot, a transfer id.
pub const META_CURSOR_CHARS_MAX: usize = TIME_MS_DIGITS_MAX + 1 + ID_CHARS_MAX;

const DDOC: &str = "transactions";
const VIEW: &str = "by_meta";

/// Where the next page of a search starts: the `next` of a [`MetaPage`], passed back as
/// [`MetaQuery::after`]. Its text form (`Display`, [`MetaCursor::parse`]) is for carrying it
/// through a command line or a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaCursor {
    at: i64,
    txn: String,
}

impl MetaCursor {
    /// A cursor from its text form, as `Display` wrote it.
    ///
    /// # Errors
    ///
    /// Not a cursor this library wrote (invalid input naming `after`).
    pub fn parse(text: &str) -> Result<MetaCursor> {
        let bad = || {
            Error::invalid(
                "after",
                format!("{text:?} is not a search cursor (pass the `next` of a page as it is)"),
            )
        };
        let (at, txn) = text.split_once('.').ok_or_else(bad)?;
        let digits = !at.is_empty() && at.bytes().all(|b| b.is_ascii_digit());
        if !digits || at.len() > TIME_MS_DIGITS_MAX || text.chars().count() > META_CURSOR_CHARS_MAX
        {
            return Err(bad());
        }
        if txn.is_empty() || txn.chars().any(char::is_control) {
            return Err(bad());
        }
        Ok(MetaCursor {
            at: at.parse().map_err(|_| bad())?,
            txn: txn.to_owned(),
        })
    }
}

impl fmt::Display for MetaCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.at, self.txn)
    }
}

impl Serialize for MetaCursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Which transfers [`Ledger::transfers_by_meta`] returns: those whose metadata holds `key` =
/// `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaQuery {
    /// The key.
    pub key: String,
    /// Its value, exactly.
    pub value: String,
    /// At most this many transfers, 1 to [`META_SEARCH_LIMIT_MAX`].
    pub limit: usize,
    /// Go on after this transfer: the `next` of the previous page.
    pub after: Option<MetaCursor>,
}

impl MetaQuery {
    /// The first page of transfers with `key` = `value`, [`META_SEARCH_LIMIT_DEFAULT`] of them.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> MetaQuery {
        MetaQuery {
            key: key.into(),
            value: value.into(),
            limit: META_SEARCH_LIMIT_DEFAULT,
            after: None,
        }
    }

    fn check(&self) -> Result<()> {
        check_key(&self.key)?;
        check_value(&self.key, &self.value)?;
        if self.limit == 0 || self.limit > META_SEARCH_LIMIT_MAX {
            return Err(Error::invalid(
                "limit",
                format!(
                    "must be between 1 and {META_SEARCH_LIMIT_MAX}, not {}",
                    self.limit
                ),
            ));
        }
        Ok(())
    }

    /// Newest first from the cursor (its own row, skipped, is read again) or from the newest,
    /// one row more than the page to know whether there is a next one.
    fn rows_request(&self) -> ViewQuery {
        let (k, v) = (&self.key, &self.value);
        let start_key = match &self.after {
            Some(c) => json!([k, v, c.at, c.txn]),
            None => json!([k, v, {}]),
        };
        ViewQuery {
            start_key: Some(start_key),
            end_key: Some(json!([k, v])),
            descending: Some(true),
            reduce: Some(false),
            include_docs: Some(true),
            limit: Some(self.limit as u64 + 2),
            ..ViewQuery::default()
        }
    }
}

/// A page of transfers found by their metadata, newest first (by creation time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetaPage {
    /// The transfers, as [`Ledger::transfer`] reads them.
    pub transfers: Vec<TransferView>,
    /// Pass as [`MetaQuery::after`] for the next (older) page; `None` at the end.
    pub next: Option<MetaCursor>,
}

/// A view row's creation time and transfer id, with its document.
fn row_parts(row: ViewRow) -> Result<(i64, String, TxnDoc)> {
    let what = || format!("{DDOC}/{VIEW} row {}", row.key);
    let (at, txn) = match row.key.as_array().map(Vec::as_slice) {
        Some([_, _, at, Value::String(txn)]) => (at.as_i64(), txn.clone()),
        _ => (None, String::new()),
    };
    let at = at.ok_or_else(|| Error::decode(what()))?;
    let doc = row
        .doc
        .ok_or_else(|| Error::decode(format!("{}: no document", what())))?;
    Ok((at, txn, TxnDoc::from_value(doc)?))
}

impl Ledger {
    /// A page of the transfers whose metadata holds `query.key` = `query.value`, newest first
    /// by creation time, each as [`Ledger::transfer`] reads it. One view request a page. The
    /// view is read from one copy and may lag behind a transfer just written
    /// (docs/CLUSTER.md).
    ///
    /// # Errors
    ///
    /// A key or value that metadata cannot hold, `limit` not in 1 to
    /// [`META_SEARCH_LIMIT_MAX`] (invalid input naming the field); a view row or transfer
    /// document this version cannot read; the server failed.
    pub async fn transfers_by_meta(&self, query: &MetaQuery) -> Result<MetaPage> {
        query.check()?;
        let rows = self
            .inner
            .hot
            .view(DDOC, VIEW, &query.rows_request())
            .await?
            .rows;
        let mut transfers = Vec::with_capacity(rows.len());
        for row in rows {
            let (at, txn, doc) = row_parts(row)?;
            let is_cursor = query
                .after
                .as_ref()
                .is_some_and(|c| c.at == at && c.txn == txn);
            if is_cursor || transfers.len() == query.limit + 1 {
                continue;
            }
            transfers.push(doc.view());
        }
        let more = transfers.len() > query.limit;
        transfers.truncate(query.limit);
        let next = if more {
            transfers.last().map(|t| MetaCursor {
                at: t.created_at,
                txn: t.id.clone(),
            })
        } else {
            None
        };
        Ok(MetaPage { transfers, next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_wrote() {
        let c = MetaCursor {
            at: 1_763_798_400_250,
            txn: "order-42.b".to_owned(),
        };
        assert_eq!(MetaCursor::parse(&c.to_string()).unwrap(), c);
        for bad in ["", "x.t", "12", ".t", "12.", "12.a\u{1}"] {
            assert!(MetaCursor::parse(bad).is_err(), "{bad:?}");
        }
    }
}
