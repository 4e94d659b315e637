//! A failure as a person (or a script) reads it: one `error:` line on stderr saying what to do,
//! and with `--json` one object on stdout (`error`, `message`, `id` where there is one), as
//! the command line's contract (docs/PROTOCOL.md) asks of every exit.
//!
//! [`explain`] rewrites what the library says in the command line's terms (its flags, the
//! server's URL); [`describe`] turns any error into what `main` prints.

use std::fmt;

use serde_json::json;

use super::args::HiArgs;
use super::output::Exit;
use super::transfers::{unfinished_words, Unfinished};
use super::UsageError;

/// A failure already said in the command line's words: it replaces the library's message.
#[derive(Debug)]
pub(crate) struct Explained {
    code: &'static str,
    message: String,
    id: Option<String>,
    exit: Exit,
}

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Explained {}

/// What `main` prints for an error.
pub(crate) struct Described {
    /// A short code, as the service's `error` field: `unreachable`, `no_database`…
    pub(crate) code: &'static str,
    /// The whole story on one line, each cause once.
    pub(crate) message: String,
    /// The transfer (or document) the failure is about, when there is one.
    pub(crate) id: Option<String>,
    pub(crate) exit: Exit,
}

impl Described {
    /// The `--json` object.
    pub(crate) fn json(&self) -> serde_json::Value {
        let mut v = json!({"error": self.code, "message": self.message});
        if let Some(id) = &self.id {
            v["id"] = json!(id);
        }
        v
    }
}

/// The library's error in `err`'s chain, if any.
fn ledger_error(err: &anyhow::Error) -> Option<&couch_ledger::Error> {
    err.chain().find_map(|c| {
        c.downcast_ref::<couch_ledger::Error>()
            .or_else(|| c.downcast_ref::<Unfinished>().map(|u| &u.0))
    })
}

/// `err` in the command line's terms: a missing database says to run `init`; a network error
/// names the server and where its URL comes from; a 404 with a path in the URL says that the
/// database goes in `--db`.
pub(crate) fn explain(err: anyhow::Error, settings: &HiArgs) -> anyhow::Error {
    let Some(e) = ledger_error(&err) else {
        return err;
    };
    let url = settings.shown_url();
    let id = e.transfer_id().map(str::to_owned);
    if e.is_missing_database() {
        let db = e.database().unwrap_or_else(|| settings.db.clone());
        let mut message = format!("no database {db} at {url}: run `couch-ledger init`");
        message.push_str(&match url_path(settings) {
            Some(path) => format!(
                " (the URL ends in {path}: if that names the database, give the server's URL \
                 alone with --url and the database with --db)"
            ),
            None => " (or give the right name with --db or LEDGER_DB)".to_owned(),
        });
        if let Some(id) = &id {
            message.push_str(&format!("; transfer {id} was not written"));
        }
        return Explained {
            code: "no_database",
            message,
            id,
            exit: Exit::Operational,
        }
        .into();
    }
    let hint = if e.is_mismatch() {
        e.field().and_then(flag_of).map(|flag| {
            format!(
                "; `{}` is what {flag} gives: send the same terms to confirm the record, or a new \
                 --ref (--id for a transfer) for a new one",
                e.field().unwrap_or_default()
            )
        })
    } else if e.is_timeout() {
        Some(
            "; it accepted the connection but did not answer: is it CouchDB, and up? (its URL: \
             --url or COUCHDB_URL; the wait: --timeout)"
                .to_owned(),
        )
    } else if e.is_connection() {
        Some(format!(
            "; is CouchDB running at {url}? (its URL: --url or COUCHDB_URL)"
        ))
    } else if e.is_not_found() {
        url_path(settings).map(|path| {
            format!(
                "; the URL ends in {path}: if that names the database, give the server's URL \
                 alone with --url and the database with --db"
            )
        })
    } else {
        None
    };
    let Some(hint) = hint else {
        return err;
    };
    let d = describe(&err);
    // The hint goes with the cause, before what the user can do about the transfer.
    let mut message = d.message;
    let unfinished = id
        .as_deref()
        .map(unfinished_words)
        .filter(|words| message.ends_with(words.as_str()));
    if let Some(words) = &unfinished {
        message.truncate(message.len() - words.len());
    }
    message.push_str(&hint);
    message.push_str(unfinished.as_deref().unwrap_or(""));
    Explained {
        code: d.code,
        message,
        id: d.id,
        exit: d.exit,
    }
    .into()
}

/// The option that sets a document's field, for a mismatch naming the field.
fn flag_of(field: &str) -> Option<&'static str> {
    let top = field.split(['.', '[']).next().unwrap_or(field);
    Some(match top {
        "value" | "amount" => "--amount",
        "currency" => "--currency",
        "method" => "--method",
        "reason" => "--reason",
        "carrier" => "--carrier",
        "source" => "--from",
        "destination" => "--to",
        "opening" => "--opening",
        "min_balance" => "--min-balance (or --unlimited)",
        "metadata" => "--meta",
        "order_id" => "--order",
        _ => return None,
    })
}

/// The path of `--url` when it has one (`/ledger`): a database name put in the URL by mistake,
/// or a proxy's prefix.
fn url_path(settings: &HiArgs) -> Option<String> {
    let url = url::Url::parse(&settings.url).ok()?;
    let path = url.path().trim_end_matches('/');
    (!path.is_empty()).then(|| path.to_owned())
}

/// What `main` prints for `err`.
pub(crate) fn describe(err: &anyhow::Error) -> Described {
    if let Some(e) = err.downcast_ref::<Explained>() {
        return Described {
            code: e.code,
            message: e.message.clone(),
            id: e.id.clone(),
            exit: e.exit,
        };
    }
    Described {
        code: code_for(err),
        message: one_line(err),
        id: ledger_error(err).and_then(|e| e.transfer_id().map(str::to_owned)),
        exit: exit_for(err),
    }
}

/// The chain on one line, `what failed: why: why`, each cause once: a cause whose text (without
/// its `(METHOD path)`) is already on the line is not said again.
fn one_line(err: &anyhow::Error) -> String {
    let usage = err.downcast_ref::<UsageError>().map(ToString::to_string);
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string().replace(['\n', '\r'], " ");
        let core = text.rsplit_once(" (").map_or(text.as_str(), |(c, _)| c);
        if !line.is_empty() && (line.contains(&text) || (core.len() >= 12 && line.contains(core))) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
        // A usage error says all the user needs; what led to it (a 404) is not theirs.
        if usage.as_deref() == Some(text.as_str()) {
            break;
        }
    }
    line
}

/// The `error` code of `--json`: what kind of failure, in the service's words where it has them.
fn code_for(err: &anyhow::Error) -> &'static str {
    if err.downcast_ref::<UsageError>().is_some() {
        return "invalid_input";
    }
    let Some(e) = ledger_error(err) else {
        return "failed";
    };
    if e.is_mismatch() {
        "mismatch"
    } else if let Some(c) = e.condition() {
        // The ledger's own condition, in its own words (`unconfirmed`, `undecided`…).
        c.code()
    } else if e.is_invalid_input() {
        "invalid_input"
    } else if e.is_missing_database() {
        "no_database"
    } else if e.is_timeout() {
        "timeout"
    } else if e.is_connection() {
        "unreachable"
    } else if e.is_locked() {
        "locked"
    } else if e.is_unauthorized() {
        "unauthorized"
    } else if e.is_forbidden() {
        "forbidden"
    } else if e.is_not_found() {
        "not_found"
    } else if e.transition().is_some() {
        "invalid_state"
    } else if e.is_conflict() {
        "conflict"
    } else if e.is_invariant() {
        "invariant"
    } else if e.is_decode() {
        "bad_reply"
    } else if e.is_transient() {
        "couchdb_unavailable"
    } else {
        "couchdb_error"
    }
}

/// Invalid input (including an idempotency key re-used with other content, and a bad
/// configuration) is 2; a transfer decided on some copies of a cluster only is 4 (as an
/// `uncertain` entry: send it again later); everything else — the server, the network, a broken
/// invariant — is 1.
fn exit_for(err: &anyhow::Error) -> Exit {
    // `downcast_ref` finds a usage error given as context too (a missing document named by
    // the user, with the server's 404 under it).
    if err.downcast_ref::<UsageError>().is_some() {
        return Exit::Invalid;
    }
    match ledger_error(err) {
        Some(e) if e.is_invalid_input() => Exit::Invalid,
        Some(e) if e.is_unconfirmed() => Exit::Uncertain,
        _ => Exit::Operational,
    }
}
