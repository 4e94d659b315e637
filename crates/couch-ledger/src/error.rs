//! The library's one error type.
//!
//! Opaque on purpose (reqwest, rust-postgres): callers ask questions (`is_conflict()`,
//! `status()`…) instead of matching on a kind that would freeze the API. Nothing in here ever
//! holds a credential: URLs are stored with their user-info stripped.

use std::fmt;

/// A `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in couch-ledger: a server reply, the network, bad input, or a
/// broken promise of the protocol.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: Kind,
    /// `METHOD path` of the request, without credentials or host.
    request: Option<String>,
    /// The server's URL without credentials, on an error of the network (the first thing to
    /// check when nothing answers).
    server: Option<String>,
    /// How long the call waited for an answer, on a timeout.
    waited: Option<std::time::Duration>,
    /// The transfer this error happened to after its document may have been written.
    transfer: Option<String>,
    /// A transfer whose own conflict kept an account from being merged (a cluster): resolving
    /// that transfer lets the same op go through.
    blocked_by: Option<String>,
    source: Option<BoxError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The server answered with a non-success status.
    Status {
        status: u16,
        error: Option<String>,
        reason: Option<String>,
    },
    /// 403 from CouchDB's login lockout (`[chttpd_auth_lockout]`, on by default in 3.4): too
    /// many failed logins for this user from this address. Every request as that user, with
    /// the right password too, is refused until the lock expires.
    Locked { user: Option<String> },
    /// The request did not get an answer (refused, reset, timed out).
    Transport { timeout: bool },
    /// The server's body was not what CouchDB's API documents.
    Decode(String),
    /// The caller's input is invalid; nothing was written.
    Invalid {
        field: Option<String>,
        message: String,
    },
    /// A document with this id exists with other content (an idempotency key re-used).
    Mismatch { id: String, field: String },
    /// Configuration error, reported by `build()`.
    Config(String),
    /// A state change the transfer protocol does not allow.
    Transition(crate::state::TransitionError),
    /// An invariant of the ledger does not hold (found by a check, never assumed).
    Invariant(String),
    /// A condition of the ledger itself, said by this program and not by the server.
    Ledger {
        condition: Condition,
        message: String,
    },
}

/// A condition of the ledger itself (not a server's answer): [`Error::condition`]. Each has a
/// code (the `error` of the CLI's `--json` and of the service) and the HTTP status the service
/// answers it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Condition {
    /// An account holds as many pending markers as its document may: the transfer waits until
    /// earlier ones are settled and pruned (transient).
    AccountFull,
    /// A transfer could not be decided within its worker's lease; the sweeper finishes it.
    Undecided,
    /// A transfer's decision reached some copies of a cluster's database but not every one:
    /// not final; the same id sent again later answers how it ended.
    Unconfirmed,
    /// A write a cluster accepted (202) that a read back did not find yet: send it again.
    Uncertain,
    /// A conflict (of an account or a transfer) that cannot be merged or resolved now; a later
    /// try, or the sweeper, can.
    Conflicted,
    /// The database's copies could not be read to decide how to resolve a conflict (transient).
    Unavailable,
    /// A transfer the ledger was asked about does not exist.
    NotFound,
}

impl Condition {
    /// The code callers see (`unconfirmed`, `account_full`…).
    pub fn code(self) -> &'static str {
        match self {
            Condition::AccountFull => "account_full",
            Condition::Undecided => "undecided",
            Condition::Unconfirmed => "unconfirmed",
            Condition::Uncertain => "uncertain",
            Condition::Conflicted => "conflict",
            Condition::Unavailable => "unavailable",
            Condition::NotFound => "not_found",
        }
    }

    /// The HTTP status the service answers it with (the ledger's choice, not a server's).
    pub fn http_status(self) -> u16 {
        match self {
            Condition::AccountFull => 429,
            Condition::Undecided
            | Condition::Unconfirmed
            | Condition::Uncertain
            | Condition::Unavailable => 503,
            Condition::Conflicted => 409,
            Condition::NotFound => 404,
        }
    }
}

impl Error {
    pub(crate) fn new(kind: Kind) -> Error {
        Error {
            inner: Box::new(Inner {
                kind,
                request: None,
                server: None,
                waited: None,
                transfer: None,
                blocked_by: None,
                source: None,
            }),
        }
    }

    pub(crate) fn with_request(mut self, method: &str, path: &str) -> Error {
        self.inner.request = Some(format!("{method} {path}"));
        self
    }

    /// The server the request went to (a URL without credentials), said by a network error.
    pub(crate) fn with_server(mut self, url: &str) -> Error {
        self.inner.server = Some(url.to_owned());
        self
    }

    /// How long the call waited before it gave up, said by a timeout.
    pub(crate) fn with_waited(mut self, waited: std::time::Duration) -> Error {
        self.inner.waited = Some(waited);
        self
    }

    /// Marks the error as happening to transfer `id` after its document was (or may have been)
    /// written: the transfer exists, and sending the same id again finds it.
    pub(crate) fn with_transfer(mut self, id: &str) -> Error {
        self.inner.transfer = Some(id.to_owned());
        self
    }

    pub(crate) fn with_source(mut self, source: impl Into<BoxError>) -> Error {
        self.inner.source = Some(source.into());
        self
    }

    /// A condition of the ledger itself, explained by `message`.
    pub(crate) fn ledger(condition: Condition, message: impl Into<String>) -> Error {
        Error::new(Kind::Ledger {
            condition,
            message: message.into(),
        })
    }

    pub(crate) fn status(status: u16, error: Option<String>, reason: Option<String>) -> Error {
        Error::new(Kind::Status {
            status,
            error,
            reason,
        })
    }

    /// `account` holds a conflict its merge cannot settle while transfer `txn`, whose document
    /// it needs, is itself in conflict (docs/CLUSTER.md).
    pub(crate) fn blocked_by_transfer(account: &str, txn: &str) -> Error {
        let mut e = Error::ledger(
            Condition::Conflicted,
            format!(
                "{account} holds a conflict that depends on transfer {txn}, itself in conflict; \
                 resolving the transfer comes first (the sweeper does it)"
            ),
        );
        e.inner.blocked_by = Some(txn.to_owned());
        e
    }

    /// A copy for each of several waiters (the error is not `Clone`): the same kind, transfer
    /// and blocking transfer, so every question still gets the same answer, with the
    /// original's text as its source.
    pub(crate) fn duplicate(&self) -> Error {
        let mut copy = Error::new(self.inner.kind.clone()).with_source(self.to_string());
        copy.inner.transfer.clone_from(&self.inner.transfer);
        copy.inner.server.clone_from(&self.inner.server);
        copy.inner.blocked_by.clone_from(&self.inner.blocked_by);
        copy
    }

    /// The transfer whose conflict blocked this op ([`Error::blocked_by_transfer`]).
    pub(crate) fn blocking_transfer(&self) -> Option<&str> {
        self.inner.blocked_by.as_deref()
    }

    pub(crate) fn locked(user: Option<String>) -> Error {
        Error::new(Kind::Locked { user })
    }

    pub(crate) fn transport(timeout: bool) -> Error {
        Error::new(Kind::Transport { timeout })
    }

    pub(crate) fn decode(message: impl Into<String>) -> Error {
        Error::new(Kind::Decode(message.into()))
    }

    /// Invalid input for a named field.
    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Error {
        Error::new(Kind::Invalid {
            field: Some(field.to_owned()),
            message: message.into(),
        })
    }

    /// Invalid input not tied to one field.
    pub(crate) fn invalid_input(message: impl Into<String>) -> Error {
        Error::new(Kind::Invalid {
            field: None,
            message: message.into(),
        })
    }

    pub(crate) fn mismatch(id: &str, field: &str) -> Error {
        Error::new(Kind::Mismatch {
            id: id.to_owned(),
            field: field.to_owned(),
        })
    }

    pub(crate) fn config(message: impl Into<String>) -> Error {
        Error::new(Kind::Config(message.into()))
    }

    pub(crate) fn invariant(message: impl Into<String>) -> Error {
        Error::new(Kind::Invariant(message.into()))
    }

    /// The id of the transfer this error happened to, once its document was or may have been
    /// written. The transfer then exists (or may): the sweeper finishes it, and submitting the
    /// same id again finds it instead of making a second one. `None` when the error came before
    /// anything was written.
    pub fn transfer_id(&self) -> Option<&str> {
        self.inner.transfer.as_deref()
    }

    /// The HTTP status of the server's reply, when there was one.
    pub fn status_code(&self) -> Option<u16> {
        match self.inner.kind {
            Kind::Status { status, .. } => Some(status),
            Kind::Locked { .. } => Some(403),
            _ => None,
        }
    }

    /// The ledger's own condition, when that is what this error is (not a server's answer).
    pub fn condition(&self) -> Option<Condition> {
        match self.inner.kind {
            Kind::Ledger { condition, .. } => Some(condition),
            _ => None,
        }
    }

    /// The status that says what kind of failure this is: the server's, or the one the ledger
    /// gives its own condition ([`Condition::http_status`]).
    fn kind_status(&self) -> Option<u16> {
        self.status_code()
            .or_else(|| self.condition().map(Condition::http_status))
    }

    /// CouchDB's `error` field of the reply (`conflict`, `not_found`, `forbidden`…).
    pub fn couch_error(&self) -> Option<&str> {
        match &self.inner.kind {
            Kind::Status { error, .. } => error.as_deref(),
            _ => None,
        }
    }

    /// CouchDB's `reason` field of the reply (for a validation failure, the message thrown by
    /// `validate_doc_update`).
    pub fn reason(&self) -> Option<&str> {
        match &self.inner.kind {
            Kind::Status { reason, .. } => reason.as_deref(),
            _ => None,
        }
    }

    /// 409: the document changed under us (a stale `_rev`, or it already exists), or a conflict
    /// of a cluster that cannot be merged now ([`Condition::Conflicted`]).
    pub fn is_conflict(&self) -> bool {
        self.kind_status() == Some(409)
    }

    /// 413: the request (a `_bulk_docs`, a document) is larger than the server accepts. Never
    /// retried as is: only a smaller request can succeed.
    pub fn is_too_large(&self) -> bool {
        self.status_code() == Some(413)
    }

    /// 404: no such document or database (the server's), or no such transfer
    /// ([`Condition::NotFound`]).
    pub fn is_not_found(&self) -> bool {
        self.kind_status() == Some(404)
    }

    /// 403: refused by `validate_doc_update` or by the server's security.
    pub fn is_forbidden(&self) -> bool {
        self.status_code() == Some(403)
    }

    /// 403 because the server locked the user out after failed logins (CouchDB 3.4's login
    /// lockout): the password may be right, but nothing is accepted until the lock expires.
    pub fn is_locked(&self) -> bool {
        matches!(self.inner.kind, Kind::Locked { .. })
    }

    /// 401: missing or wrong credentials.
    pub fn is_unauthorized(&self) -> bool {
        self.status_code() == Some(401)
    }

    /// A failure that may go away by itself: 429, 500, 502, 503, 504, a network error, or a
    /// condition of the ledger that a later try can pass (account full, undecided,
    /// unconfirmed, uncertain, copies unreadable).
    pub fn is_transient(&self) -> bool {
        match self.inner.kind {
            Kind::Status { status, .. } => is_transient_status(status),
            Kind::Transport { .. } => true,
            Kind::Ledger { condition, .. } => is_transient_status(condition.http_status()),
            _ => false,
        }
    }

    /// The request timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self.inner.kind, Kind::Transport { timeout: true })
    }

    /// No answer came from the server (refused, reset, timed out): a network error, not a reply.
    pub fn is_connection(&self) -> bool {
        matches!(self.inner.kind, Kind::Transport { .. })
    }

    /// 404 because the database itself does not exist (not a document in it): not created
    /// yet (`init`), or a wrong name.
    pub fn is_missing_database(&self) -> bool {
        self.is_not_found()
            && self
                .reason()
                .is_some_and(|r| r.contains("Database does not exist") || r.contains("no_db_file"))
    }

    /// The database the failed request was about: the first segment of its path; `None` for the
    /// server's own endpoints (`/_session`, `/_uuids`…) or when the error came from no request.
    pub fn database(&self) -> Option<String> {
        let request = self.inner.request.as_deref()?;
        let path = request.split_once(' ').map_or("", |(_, p)| p);
        let first = path
            .split('/')
            .next()
            .filter(|s| !s.is_empty() && !s.starts_with('_'))?;
        Some(
            percent_encoding::percent_decode_str(first)
                .decode_utf8_lossy()
                .into_owned(),
        )
    }

    /// The URL (without credentials) of the server a network error happened with.
    pub fn server_url(&self) -> Option<&str> {
        self.inner.server.as_deref()
    }

    /// The caller's input was refused before anything was written (including an idempotency key
    /// re-used with other content, see [`Error::is_mismatch`]).
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self.inner.kind,
            Kind::Invalid { .. } | Kind::Mismatch { .. } | Kind::Config(_)
        )
    }

    /// A document with this id already exists with other content; [`Error::field`] names the
    /// first field that differs.
    pub fn is_mismatch(&self) -> bool {
        matches!(self.inner.kind, Kind::Mismatch { .. })
    }

    /// A transfer's decision reached some copies of a cluster's database but not yet every one:
    /// not final; the same id sent again later answers how it ended.
    pub fn is_unconfirmed(&self) -> bool {
        self.condition() == Some(Condition::Unconfirmed)
    }

    /// The field an input error or a mismatch is about.
    pub fn field(&self) -> Option<&str> {
        match &self.inner.kind {
            Kind::Invalid { field, .. } => field.as_deref(),
            Kind::Mismatch { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The transfer state change that was refused, if that is what this error is.
    pub fn transition(&self) -> Option<crate::state::TransitionError> {
        match &self.inner.kind {
            Kind::Transition(t) => Some(*t),
            _ => None,
        }
    }

    /// The server's answer could not be understood.
    pub fn is_decode(&self) -> bool {
        matches!(self.inner.kind, Kind::Decode(_))
    }

    /// An invariant of the ledger was found broken.
    pub fn is_invariant(&self) -> bool {
        matches!(self.inner.kind, Kind::Invariant(_))
    }
}

pub(crate) fn is_transient_status(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

impl From<crate::state::TransitionError> for Error {
    fn from(t: crate::state::TransitionError) -> Error {
        Error::new(Kind::Transition(t))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(id) = &self.inner.transfer {
            write!(f, "transfer {id}: ")?;
        }
        match &self.inner.kind {
            Kind::Status {
                status,
                error,
                reason,
            } => {
                write!(f, "server answered {status}")?;
                if let Some(e) = error {
                    write!(f, " {e}")?;
                }
                if let Some(r) = reason {
                    write!(f, ": {r}")?;
                }
            }
            Kind::Locked { user } => write!(
                f,
                "the server has locked user {} after failed logins; wait or ask an admin",
                user.as_deref().unwrap_or("(anonymous)")
            )?,
            Kind::Transport { timeout } => {
                let at = self.inner.server.as_deref().map(|u| format!(" at {u}"));
                let at = at.as_deref().unwrap_or("");
                match (timeout, self.inner.waited) {
                    (true, Some(w)) => write!(
                        f,
                        "request timed out: the server{at} did not answer within {}",
                        plain_seconds(w)
                    )?,
                    (true, None) => write!(f, "request timed out: the server{at} did not answer")?,
                    (false, _) => write!(f, "could not reach the server{at}")?,
                }
            }
            Kind::Decode(m) => write!(f, "unexpected reply from the server: {m}")?,
            Kind::Invalid {
                field: Some(field),
                message,
            } => write!(f, "invalid {field}: {message}")?,
            Kind::Invalid {
                field: None,
                message,
            } => write!(f, "invalid input: {message}")?,
            Kind::Mismatch { id, field } => write!(
                f,
                "{id} already exists with a different {field} (an id is written once; use a new reference)"
            )?,
            Kind::Config(m) => write!(f, "invalid configuration: {m}")?,
            Kind::Transition(t) => write!(f, "{t}")?,
            Kind::Invariant(m) => write!(f, "invariant violated: {m}")?,
            Kind::Ledger { condition, message } => write!(f, "{}: {message}", condition.code())?,
        }
        if let Some(request) = &self.inner.request {
            write!(f, " ({request})")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind);
        if let Some(r) = &self.inner.request {
            d.field("request", r);
        }
        if let Some(t) = &self.inner.transfer {
            d.field("transfer", t);
        }
        if let Some(u) = &self.inner.server {
            d.field("server", u);
        }
        if let Some(s) = &self.inner.source {
            d.field("source", &s.to_string());
        }
        d.finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_ref()
            .map(|e| &**e as &(dyn std::error::Error + 'static))
    }
}

/// `1.5s`, `60s`: a wait as people write it (the library's messages and the program's).
pub fn plain_seconds(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) || ms >= 10_000 {
        format!("{}s", (ms + 500) / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Strip everything but the URL's scheme-relative path so an error never carries a host's
/// credentials; reqwest's `without_url` does the same for its own errors.
pub(crate) fn scrub(e: reqwest::Error) -> reqwest::Error {
    e.without_url()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_follow_the_status() {
        let e = Error::status(
            409,
            Some("conflict".into()),
            Some("Document update conflict.".into()),
        );
        assert!(e.is_conflict());
        assert!(!e.is_transient());
        assert!(!e.is_not_found());
        let e = Error::status(503, None, None);
        assert!(e.is_transient());
        assert!(Error::transport(true).is_timeout());
        assert!(Error::transport(false).is_transient());
        let e = Error::transport(true)
            .with_server("http://127.0.0.1:5984/")
            .with_waited(std::time::Duration::from_millis(5000))
            .with_request("GET", "ledger");
        assert_eq!(
            e.to_string(),
            "request timed out: the server at http://127.0.0.1:5984/ did not answer within 5s \
             (GET ledger)"
        );
        assert_eq!(e.server_url(), Some("http://127.0.0.1:5984/"));
        let e = Error::transport(false).with_server("http://h:1/");
        assert_eq!(e.to_string(), "could not reach the server at http://h:1/");
        assert!(Error::mismatch("payment:o:r", "value").is_invalid_input());
        let e = Error::locked(Some("shop".into()));
        assert!(e.is_locked() && e.is_forbidden() && !e.is_unauthorized() && !e.is_transient());
        assert_eq!(
            e.to_string(),
            "the server has locked user shop after failed logins; wait or ask an admin"
        );
    }

    #[test]
    fn display_names_the_field() {
        let e = Error::mismatch("payment:o:r", "value");
        assert!(e.to_string().contains("different value"), "{e}");
        let e = Error::invalid("amount", "must be positive");
        assert_eq!(e.to_string(), "invalid amount: must be positive");
    }
}
