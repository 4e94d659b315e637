//! The `serve` command's flags. The service itself is `src/serve/` (a front end beside this
//! one); `main.rs` hands it these arguments with the validated global settings.

use clap::{Args, ValueEnum};

/// The environment variable holding API keys, comma-separated.
pub(crate) const API_KEYS_ENV: &str = "COUCH_LEDGER_API_KEYS";

#[derive(Args, Clone, Debug)]
pub(crate) struct ServeArgs {
    /// Address to listen on, IP:PORT; port 0 picks a free one (the line printed on stdout
    /// at start says which).
    #[arg(
        long,
        env = "COUCH_LEDGER_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub(crate) listen: String,

    /// A file of API keys, one a line (blank lines and lines beginning with # are skipped).
    /// With it, or with COUCH_LEDGER_API_KEYS (keys separated by commas), every /v1 request
    /// needs `Authorization: Bearer <key>`; without either, /v1 is open. Keys from both are
    /// accepted; each is at least 16 characters. Keys are never logged. /healthz, /readyz,
    /// /metrics and /openapi.json need no key.
    #[arg(long, value_name = "FILE")]
    pub(crate) api_keys_file: Option<std::path::PathBuf>,

    /// Do not run the sweeper inside the service (run `couch-ledger sweep --watch` elsewhere).
    #[arg(long)]
    pub(crate) no_sweep: bool,

    /// The sweeper takes over transfers untouched for this long: 0s, 500ms, 30s, 5m
    /// [default: 30s].
    #[arg(long, value_name = "DUR")]
    pub(crate) stale_after: Option<String>,

    /// At most N transfers (and N pending markers) per sweeper pass, 1 to 100000.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub(crate) sweep_batch: usize,

    /// Answer a transfer as soon as it is decided (`done`: the money has moved; the settles of
    /// its accounts' markers follow inside the service, each going out with its account's next
    /// write): more transfers a second under load. What is still settling at a stop is finished
    /// before the process exits, or by a sweeper if it is killed
    /// (`LedgerBuilder::background_finish`).
    #[arg(long)]
    pub(crate) answer_at_commit: bool,

    /// After SIGINT or SIGTERM: how long the requests in flight, the transfers still settling,
    /// the sweeper and the webhook's cursor get to finish, whatever CouchDB does (it may not
    /// answer at all). Past it the process exits 1, and what was left unfinished is a sweeper's
    /// to finish (a webhook redelivers since its last kept cursor): 500ms, 10s, 1m.
    #[arg(long, value_name = "DUR", default_value = "10s")]
    pub(crate) shutdown_timeout: String,

    /// Create the database and install the design documents (as `init`) before serving.
    #[arg(long)]
    pub(crate) init: bool,

    /// POST every event of the ledger (docs/EVENTS.md) to this URL, in order, at least once:
    /// a JSON body signed with --webhook-secret-file (header Couch-Ledger-Signature:
    /// t=SECONDS,v1=HEX, HMAC-SHA256 of "SECONDS.BODY"), retried until the endpoint answers
    /// 2xx. Where delivery is, is kept in the database, so a restart goes on from there.
    #[arg(long, value_name = "URL", env = "COUCH_LEDGER_WEBHOOK_URL")]
    pub(crate) webhook_url: Option<String>,

    /// The file holding the webhook's signing secret (at least 16 bytes; a trailing newline is
    /// not part of it).
    #[arg(long, value_name = "FILE")]
    pub(crate) webhook_secret_file: Option<std::path::PathBuf>,

    /// The longest wait between two tries of a delivery that failed (the wait doubles from
    /// 250ms up to this): 5s, 1m.
    #[arg(long, value_name = "DUR", default_value = "1m")]
    pub(crate) webhook_retry_max: String,

    /// Log lines on stderr: text for people, or one JSON object a line for a log collector.
    /// The level comes from RUST_LOG (default info: one line per request).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}
