//! `couch-ledger events`: the ledger's events as JSON lines, oldest first, from the start or
//! after a cursor; with `--follow`, waiting for new ones until interrupted (docs/EVENTS.md).

use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use couch_ledger::{EventCursor, EventKind, EventQuery, EVENTS_LIMIT_MAX};

use super::{Context, Exit, UsageError};

/// How long one wait of `--follow` lasts before it asks again.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);

#[derive(Args)]
pub(crate) struct EventsArgs {
    /// Keep going: wait for new events and print each as it comes, until interrupted
    /// (Ctrl-C). Without it, print the events there are and stop.
    #[arg(long)]
    follow: bool,
    /// Start after this event: the `cursor` of the last event you handled, as printed. Without
    /// it, from the ledger's first event.
    #[arg(long, value_name = "CURSOR")]
    after: Option<String>,
    /// Only these types, comma-separated: transfer.done, transfer.cancelled,
    /// transfer.reversed, payment.recorded, refund.recorded, adjustment.recorded,
    /// order.settled, order.unsettled, account.created, account.overdrawn.
    #[arg(long, value_name = "TYPES", value_delimiter = ',')]
    types: Vec<String>,
    /// Stop after N events (without --follow: after N or at the end, whichever is first).
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
}

impl EventsArgs {
    fn query(&self) -> anyhow::Result<EventQuery> {
        let after = match &self.after {
            Some(text) => EventCursor::parse(text).map_err(|_| {
                UsageError::new(format!(
                    "--after {text:?} is not an event cursor: pass an event's `cursor` as it was printed"
                ))
            })?,
            None => EventCursor::start(),
        };
        let kinds = if self.types.is_empty() {
            None
        } else {
            let kinds: Result<Vec<EventKind>, _> = self
                .types
                .iter()
                .map(|t| EventKind::parse(t.trim()))
                .collect();
            Some(kinds.map_err(|e| UsageError::new(format!("--types: {e}")))?)
        };
        if self.limit == Some(0) {
            return Err(UsageError::new("--limit must be at least 1").into());
        }
        Ok(EventQuery {
            after,
            limit: EVENTS_LIMIT_MAX,
            kinds,
            wait: self.follow.then_some(FOLLOW_WAIT),
        })
    }
}

/// `events`: one JSON object a line on stdout; where to resume on stderr at the end.
pub(crate) async fn events(a: EventsArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let mut query = a.query()?;
    let ledger = ctx.ledger()?;
    let mut left = a.limit;
    let mut stdout = std::io::stdout().lock();
    loop {
        if let Some(n) = left {
            query.limit = query.limit.min(usize::try_from(n).unwrap_or(usize::MAX));
        }
        let page = ledger
            .events(&query)
            .await
            .context("could not read the ledger's events")?;
        // A page keeps a change whole, so it may hold one event more than asked for.
        let room = left.map_or(page.events.len(), |n| {
            usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(page.events.len())
        });
        for event in &page.events[..room] {
            let line = serde_json::to_string(event).context("an event as JSON")?;
            writeln!(stdout, "{line}").context("writing to stdout")?;
        }
        stdout.flush().context("writing to stdout")?;
        query.after = match page.events.get(room.wrapping_sub(1)) {
            // Stopped inside the page: resume after the last event printed.
            Some(last) if room < page.events.len() => last.cursor.clone(),
            _ => page.cursor,
        };
        if let Some(n) = left.as_mut() {
            *n = n.saturating_sub(room as u64);
            if *n == 0 {
                break;
            }
        }
        if page.events.is_empty() && !a.follow {
            break;
        }
    }
    eprintln!("resume after this with --after {}", query.after);
    Ok(Exit::Success)
}
