//! An account's history on the command line, `account history A`, and the times it and
//! `account show A --at T` take. Each validates its input completely before it sends anything.

use clap::Args;
use couch_ledger::{
    format_time_ms, parse_time_ms, HistoryCursor, HistoryEntry, HistoryPage, HistoryQuery,
    HISTORY_LIMIT_DEFAULT, HISTORY_LIMIT_MAX, TIME_FORMS,
};
use serde_json::{json, Value};

use super::lookup::{money_in, or_missing};
use super::{Context, Exit, UsageError};

#[derive(Args)]
pub(crate) struct HistoryArgs {
    /// The account id.
    account: String,
    /// Only transfers that took effect at or after this time: RFC 3339
    /// (2025-11-22T08:00:00Z, with an offset or fractions of a second) or milliseconds since the
    /// Unix epoch.
    #[arg(long, value_name = "T")]
    from: Option<String>,
    /// Only transfers that took effect at or before this time (the same forms as --from).
    #[arg(long, value_name = "T")]
    to: Option<String>,
    /// At most N transfers, 1 to 1000.
    #[arg(long, value_name = "N", default_value_t = HISTORY_LIMIT_DEFAULT)]
    limit: usize,
    /// Go on after the last transfer of a previous page: the cursor it printed (`next`).
    #[arg(long, value_name = "CURSOR")]
    after: Option<String>,
}

/// A time typed after `flag`, or a usage error saying the forms it may take.
pub(crate) fn time_arg(flag: &str, text: &str) -> anyhow::Result<i64> {
    parse_time_ms(flag, text).map_err(|_| {
        UsageError::new(format!(
            "--{flag} {text:?} is not a time; write {TIME_FORMS}"
        ))
        .into()
    })
}

impl HistoryArgs {
    /// The library's query, or a usage error naming the flag.
    fn query(&self) -> anyhow::Result<HistoryQuery> {
        if self.limit == 0 || self.limit > HISTORY_LIMIT_MAX {
            return Err(UsageError::new(format!(
                "--limit must be between 1 and {HISTORY_LIMIT_MAX}, not {}",
                self.limit
            ))
            .into());
        }
        let after = match &self.after {
            Some(text) => Some(HistoryCursor::parse(text).map_err(|_| {
                UsageError::new(format!(
                    "--after {text:?} is not a history cursor: pass the one a page printed, as it is"
                ))
            })?),
            None => None,
        };
        Ok(HistoryQuery {
            from: self
                .from
                .as_deref()
                .map(|t| time_arg("from", t))
                .transpose()?,
            to: self.to.as_deref().map(|t| time_arg("to", t)).transpose()?,
            limit: self.limit,
            after,
        })
    }
}

/// `account history A`.
pub(crate) async fn history(a: HistoryArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let query = a.query()?;
    let page = ctx
        .ledger()?
        .account_history(&a.account, query)
        .await
        .map_err(|e| {
            or_missing(
                e,
                format!(
                    "no account {:?} in database {}",
                    a.account,
                    ctx.settings.accounts_db()
                ),
                format!("could not read the history of account {}", a.account),
            )
        })?;
    ctx.out.print(&page_json(&page), &page_words(&page))?;
    Ok(Exit::Success)
}

/// A page as `--json` prints it: amounts in minor units, times in ms since the epoch.
fn page_json(page: &HistoryPage) -> Value {
    let entries: Vec<Value> = page.entries.iter().map(entry_json).collect();
    json!({
        "account": page.account,
        "currency": page.currency,
        "opening": page.opening,
        "entries": entries,
        "next": page.next.as_ref().map(ToString::to_string),
    })
}

fn entry_json(e: &HistoryEntry) -> Value {
    json!({
        "txn": e.txn,
        "decided_at": e.decided_at,
        "delta": e.delta,
        "balance_after": e.balance_after,
        "counterparty": e.counterparty,
        "state": e.state.as_str(),
        "reverses": e.reverses,
    })
}

/// A page in words: one line a transfer, newest first, then where to go on.
fn page_words(page: &HistoryPage) -> String {
    let m = money_in(&page.currency);
    let mut text = format!(
        "account {} ({}), opening {}, newest first\n",
        page.account,
        page.currency,
        m(page.opening)
    );
    if page.entries.is_empty() {
        text.push_str("  no transfers here\n");
    }
    for e in &page.entries {
        let dir = if e.delta.is_positive() { "from" } else { "to" };
        text.push_str(&format!(
            "  {}  {:>18}  balance {:>18}  {} {dir} {}{}\n",
            format_time_ms(e.decided_at),
            m(e.delta),
            m(e.balance_after),
            e.txn,
            e.counterparty,
            e.reverses
                .as_ref()
                .map(|r| format!(" (reversal of {r})"))
                .unwrap_or_default()
        ));
    }
    if let Some(next) = &page.next {
        text.push_str(&format!("more: --after '{next}'\n"));
    }
    text
}
