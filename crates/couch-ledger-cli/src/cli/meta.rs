//! Metadata on the command line: the `--meta KEY=VALUE` flags of `account create`, `transfer`
//! and the order entries, how a document's metadata is shown, and `transfer list --meta`, which
//! finds transfers by it.

use clap::Args;
use couch_ledger::{
    format_time_ms, Currency, MetaCursor, MetaPage, MetaQuery, Metadata, META_KEYS_MAX,
    META_KEY_CHARS_MAX, META_SEARCH_LIMIT_DEFAULT, META_SEARCH_LIMIT_MAX, META_VALUE_CHARS_MAX,
};
use serde_json::{json, Value};

use super::output::money_opt;
use super::{Context, Exit, UsageError};

/// The help of every `--meta` flag.
pub(crate) const META_HELP: &str = "Attach KEY=VALUE (repeat the flag for more): written once \
with the document and shown with it; not a term, so sending the same id again with other \
metadata keeps the first's";

/// `--meta` values as metadata, or a usage error that states the limits.
pub(crate) fn meta_arg(pairs: &[String]) -> anyhow::Result<Metadata> {
    Metadata::from_pairs(pairs.iter().map(String::as_str)).map_err(|e| {
        UsageError::new(format!(
            "--meta: {}; write KEY=VALUE, a KEY of 1 to {META_KEY_CHARS_MAX} characters of \
             A-Z a-z 0-9 _ -, a VALUE of 1 to {META_VALUE_CHARS_MAX} characters, at most \
             {META_KEYS_MAX} keys",
            e.to_string().trim_start_matches("invalid meta: ")
        ))
        .into()
    })
}

/// A document's metadata as lines of `show`, nothing when it has none.
pub(crate) fn meta_words(meta: &Metadata) -> String {
    meta.iter()
        .map(|(k, v)| format!("  meta       {k}={v}\n"))
        .collect()
}

#[derive(Args)]
pub(crate) struct TransferListArgs {
    /// The transfers whose metadata holds KEY=VALUE exactly (one pair).
    #[arg(long, value_name = "KEY=VALUE")]
    meta: String,
    /// At most N transfers, 1 to 1000.
    #[arg(long, value_name = "N", default_value_t = META_SEARCH_LIMIT_DEFAULT)]
    limit: usize,
    /// Go on after the last transfer of a previous page: the cursor it printed (`next`).
    #[arg(long, value_name = "CURSOR")]
    after: Option<String>,
}

impl TransferListArgs {
    /// The library's query, or a usage error naming the flag.
    fn query(&self) -> anyhow::Result<MetaQuery> {
        if self.limit == 0 || self.limit > META_SEARCH_LIMIT_MAX {
            return Err(UsageError::new(format!(
                "--limit must be between 1 and {META_SEARCH_LIMIT_MAX}, not {}",
                self.limit
            ))
            .into());
        }
        let pair = meta_arg(std::slice::from_ref(&self.meta))?;
        let (key, value) = pair.iter().next().expect("one pair");
        let after = match &self.after {
            Some(text) => Some(MetaCursor::parse(text).map_err(|_| {
                UsageError::new(format!(
                    "--after {text:?} is not a list cursor: pass the one a page printed, as it is"
                ))
            })?),
            None => None,
        };
        Ok(MetaQuery {
            key: key.to_owned(),
            value: value.to_owned(),
            limit: self.limit,
            after,
        })
    }
}

/// `transfer list --meta KEY=VALUE`.
pub(crate) async fn list(a: TransferListArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let query = a.query()?;
    let page = ctx
        .ledger()?
        .transfers_by_meta(&query)
        .await
        .map_err(|e| anyhow::Error::new(e).context("could not list the transfers"))?;
    ctx.out
        .print(&page_json(&page)?, &page_words(&page, &a.meta))?;
    Ok(Exit::Success)
}

fn page_json(page: &MetaPage) -> anyhow::Result<Value> {
    Ok(json!({
        "transfers": serde_json::to_value(&page.transfers)?,
        "next": page.next.as_ref().map(ToString::to_string),
    }))
}

/// One line a transfer, newest first, then where to go on.
fn page_words(page: &MetaPage, pair: &str) -> String {
    let mut text = format!("transfers with {pair}, newest first\n");
    if page.transfers.is_empty() {
        text.push_str("  none\n");
    }
    for t in &page.transfers {
        let c = Currency::from_code(&t.currency).ok();
        text.push_str(&format!(
            "  {}  {:>18}  {} from {} to {}: {}\n",
            format_time_ms(t.created_at),
            money_opt(c, t.amount),
            t.id,
            t.source,
            t.destination,
            t.state
        ));
    }
    if let Some(next) = &page.next {
        text.push_str(&format!("more: --after '{next}'\n"));
    }
    text
}
