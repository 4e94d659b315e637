//! Standard output: human text, or with `--json` exactly one JSON object. Write errors are
//! returned, not panicked on, so `main` can treat a closed pipe (`| head`) as success.

use std::io::{self, Write};

use couch_ledger::design::InstallStatus;
use couch_ledger::{plain_seconds, Amount, Currency, Recorded};
use serde_json::{json, Value};

/// The exit codes of the command line's contract (docs/PROTOCOL.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// 0.
    Success,
    /// 1: server, network, a conflict that could not be resolved, an invariant violated.
    Operational,
    /// 2: usage or invalid input.
    Invalid,
    /// 3: a transfer ended `cancelled` by a business rule (insufficient funds…).
    Cancelled,
    /// 4: written, but not yet on every copy of a cluster's database; send it again to confirm.
    Uncertain,
}

impl Exit {
    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Operational => 1,
            Exit::Invalid => 2,
            Exit::Cancelled => 3,
            Exit::Uncertain => 4,
        }
    }
}

/// A `--json` object went to stdout: an error after it must not print a second one.
static PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a command printed its `--json` object.
pub(crate) fn printed() -> bool {
    PRINTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Standard output in the mode the user asked for.
pub(crate) struct Out {
    json: bool,
}

impl Out {
    pub(crate) fn new(json: bool) -> Out {
        Out { json }
    }

    /// `--json` was given.
    pub(crate) fn is_json(&self) -> bool {
        self.json
    }

    /// A command's result: `value` on one line with `--json`, else `text` as is.
    pub(crate) fn print(&mut self, value: &Value, text: &str) -> io::Result<()> {
        let mut stdout = io::stdout().lock();
        if self.json {
            debug_assert!(value.is_object(), "--json prints one object");
            PRINTED.store(true, std::sync::atomic::Ordering::Relaxed);
            serde_json::to_writer(&mut stdout, value)?;
            stdout.write_all(b"\n")?;
        } else {
            stdout.write_all(text.as_bytes())?;
            if !text.is_empty() && !text.ends_with('\n') {
                stdout.write_all(b"\n")?;
            }
        }
        stdout.flush()
    }

    /// A line of narration, shown as it happens (human mode only; `--json` prints one object
    /// at the end instead).
    pub(crate) fn say(&mut self, text: &str) -> io::Result<()> {
        if self.json {
            return Ok(());
        }
        let mut stdout = io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.write_all(b"\n")?;
        stdout.flush()
    }

    /// The result of a write-once command, and its exit code.
    pub(crate) fn recorded(&mut self, what: &str, r: &Recorded) -> io::Result<Exit> {
        let text = match r.status {
            couch_ledger::RecordStatus::Created => format!("{what} {} created", r.id),
            couch_ledger::RecordStatus::Exists => format!(
                "{what} {} exists (already recorded with the same content; nothing written)",
                r.id
            ),
            couch_ledger::RecordStatus::Uncertain => format!(
                "{what} {} written to some copies of the database but not yet every one (a copy \
                 is down or behind): run the same command again later to confirm it",
                r.id
            ),
        };
        self.print(&json!({"id": r.id, "status": r.status.as_str()}), &text)?;
        Ok(match r.status {
            couch_ledger::RecordStatus::Uncertain => Exit::Uncertain,
            _ => Exit::Success,
        })
    }
}

/// What a sweep did, in words: `examined 3, advanced 2 to done, …; 1 transfers still open`.
pub(crate) fn sweep_words(s: &couch_ledger::SweepOutcome) -> String {
    let mut words = format!(
        "examined {}, advanced {} to done, cancelled {}, skipped {}, failed {}, repaired {} \
         markers; {} transfers still open",
        s.examined, s.advanced, s.cancelled, s.skipped, s.failed, s.repaired_markers, s.remaining
    );
    if s.conflicts_resolved + s.conflicts_unresolved > 0 {
        words.push_str(&format!(
            "; conflicts resolved {}, left {}",
            s.conflicts_resolved, s.conflicts_unresolved
        ));
    }
    words
}

/// `26.46 GBP`.
pub(crate) fn money(currency: Currency, amount: Amount) -> String {
    format!("{} {currency}", currency.format(amount))
}

/// An amount whose currency may be unknown (an order without a purchase): minor units then.
pub(crate) fn money_opt(currency: Option<Currency>, amount: Amount) -> String {
    match currency {
        Some(c) => money(c, amount),
        None => format!("{} minor units", amount.minor()),
    }
}

/// Who owes whom, in words.
pub(crate) fn balance_words(balance: Amount) -> &'static str {
    match balance.minor() {
        0 => "settled",
        b if b > 0 => "the customer owes",
        _ => "the merchant owes the customer",
    }
}

pub(crate) fn install_status(s: InstallStatus) -> &'static str {
    match s {
        InstallStatus::Created => "created",
        InstallStatus::Unchanged => "unchanged",
        InstallStatus::Updated => "updated",
        InstallStatus::Removed => "removed",
    }
}

/// Says on stderr why a command is waiting: a try the server did not answer in time, or a
/// wait of a second or more the server asked for (`Retry-After`). Retries after a refused
/// connection or a quick 503 are not said: they pass, or end in the command's one `error:`
/// line.
pub(crate) struct RetryNotices;

/// A wait shorter than this, after an answer, is not worth a line.
const NOTICE_DELAY_MIN: std::time::Duration = std::time::Duration::from_secs(1);

impl couch_ledger::Observer for RetryNotices {
    fn retrying(&self, e: &couch_ledger::RetryEvent<'_>) {
        let bound = e.left.map_or(String::new(), |left| {
            format!("; {} left of --timeout", plain_seconds(left))
        });
        let what = if e.timed_out {
            format!(
                "did not answer {} {} within {}",
                e.method,
                e.path,
                plain_seconds(e.elapsed)
            )
        } else if let Some(status) = e.status.filter(|_| e.delay >= NOTICE_DELAY_MIN) {
            format!(
                "answered {status} to {} {}; waiting {} as it asks",
                e.method,
                e.path,
                plain_seconds(e.delay)
            )
        } else {
            return;
        };
        let _ = writeln!(
            io::stderr(),
            "couch-ledger: CouchDB at {} {what}; retrying (try {} of {}{bound})…",
            e.server,
            e.next_try,
            e.tries_max
        );
    }
}
