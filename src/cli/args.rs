//! Arguments in two stages (ripgrep's `LowArgs` → `HiArgs`): clap turns the command line into
//! [`LowArgs`], raw strings as typed; [`HiArgs`] are the validated settings every command
//! uses. Values that need domain knowledge (amounts, currencies) are checked by the command,
//! before it sends anything, so that every bad input is reported as one `error:` line.

use std::fmt;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use couch_ledger::{Amount, Client, Currency, Ledger, DEFAULT_DATABASE, DEFAULT_URL};

use super::UsageError;

/// A money ledger on CouchDB: an immutable order ledger (purchases, payments, refunds,
/// adjustments), multi-phase transfers between accounts, and a sweeper that finishes them.
///
/// Amounts on the command line are decimals in the currency's units (6.46); with --json every
/// amount is an integer in minor units (646). Exit codes: 0 success, 1 operational error
/// (server, network, unresolved conflict), 2 usage or invalid input, 3 a transfer cancelled by
/// a business rule.
#[derive(Parser)]
#[command(name = "couch-ledger", version, max_term_width = 100)]
pub(crate) struct LowArgs {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command takes, before or after the command's name.
#[derive(Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct GlobalArgs {
    /// The CouchDB server [default: http://127.0.0.1:5984]. Credentials in the URL
    /// (http://user:password@host:5984) are accepted and never printed.
    #[arg(
        long,
        env = "COUCHDB_URL",
        global = true,
        hide_env_values = true,
        value_name = "URL"
    )]
    url: Option<String>,

    /// User name for HTTP basic authentication.
    #[arg(long, env = "COUCHDB_USER", global = true, value_name = "USER")]
    user: Option<String>,

    /// Password for HTTP basic authentication (never printed).
    #[arg(
        long,
        env = "COUCHDB_PASSWORD",
        global = true,
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    password: Option<String>,

    /// The ledger's database [default: ledger].
    #[arg(long, env = "LEDGER_DB", global = true, value_name = "NAME")]
    db: Option<String>,

    /// Print exactly one JSON object on stdout (amounts as integers in minor units).
    #[arg(long, global = true)]
    json: bool,

    /// Time allowed for one request to the server, e.g. 500ms, 30s, 5m, 1h30m [default: 60s].
    #[arg(long, global = true, value_name = "DUR")]
    timeout: Option<String>,
}

/// `init`'s options.
#[derive(clap::Args)]
pub(crate) struct InitArgs {
    /// Also set the database's _security so that only users with this role (and admins) can
    /// read and write it. Run the CLI and services as such a member, not as an admin: the
    /// validation then guards every write, and only admins can delete the design documents,
    /// purge or change _security (docs/SECURITY.md).
    #[arg(long, value_name = "ROLE")]
    pub(crate) member_role: Option<String>,
}

/// `completions`' argument.
#[derive(clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    pub(crate) shell: clap_complete::Shell,
}

/// The commands. Each group of commands lives in its own file and is flattened in here.
#[derive(Subcommand)]
pub(crate) enum Command {
    /// Create the database if needed and install the design documents (views and validation),
    /// writing only those that changed. Safe to run any number of times. Needs an admin.
    Init(InitArgs),

    #[command(flatten)]
    Orders(super::orders::OrderCommand),

    #[command(flatten)]
    Transfers(super::transfers::TransferCommand),

    /// Run the seed scenarios end to end on a fresh database and say what each step shows.
    /// Uses COUCHDB_URL or --url when given; otherwise the server at the default URL, or, when
    /// nothing answers there, a local pouchdb-server it starts and stops itself.
    Demo(super::demo::DemoArgs),

    /// The ledger as an HTTP service: JSON in and out (amounts in minor units, the fields of
    /// --json), one ledger per process so every caller shares its group commit, and the
    /// sweeper running inside (unless --no-sweep). GET /openapi.json describes every endpoint;
    /// /healthz, /readyz and /metrics (Prometheus) are for operators. SIGINT or SIGTERM stops
    /// accepting, finishes the requests in flight and exits 0.
    #[cfg(feature = "serve")]
    Serve(super::serve::ServeArgs),

    /// Print a shell completion script on stdout, e.g.
    /// `couch-ledger completions bash > ~/.local/share/bash-completion/completions/couch-ledger`,
    /// `couch-ledger completions zsh > "${fpath[1]}/_couch-ledger"`,
    /// `couch-ledger completions fish > ~/.config/fish/completions/couch-ledger.fish`.
    /// Needs no server.
    Completions(CompletionsArgs),
}

/// Parses the command line; on a usage error (or --help / --version) clap prints and exits.
pub(crate) fn parse() -> (LowArgs, ArgMatches) {
    let matches = LowArgs::command().get_matches();
    let low = LowArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    (low, matches)
}

/// The validated settings.
pub(crate) struct HiArgs {
    /// Server URL, possibly with credentials (never print it as is: see [`HiArgs::shown_url`]).
    pub(crate) url: String,
    /// The URL came from `--url` or `COUCHDB_URL`, not the default.
    pub(crate) url_explicit: bool,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: String,
    /// `--db` was on the command line (not the environment or the default).
    pub(crate) db_on_command_line: bool,
    pub(crate) json: bool,
    pub(crate) timeout: Option<Duration>,
}

impl fmt::Debug for HiArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HiArgs")
            .field("url", &self.shown_url())
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "_"))
            .field("db", &self.db)
            .field("json", &self.json)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl HiArgs {
    /// Validates the global options.
    ///
    /// # Errors
    ///
    /// A bad duration, a password without a user, an empty value.
    pub(crate) fn from_low(low: &LowArgs, matches: &ArgMatches) -> Result<HiArgs, UsageError> {
        let g = &low.global;
        // An empty environment variable means "not set".
        let non_empty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let url = non_empty(&g.url);
        let user = non_empty(&g.user);
        let password = g.password.clone();
        if password.is_some() && user.is_none() {
            return Err(UsageError::new(
                "--password (COUCHDB_PASSWORD) needs --user (COUCHDB_USER)",
            ));
        }
        if let Some(p) = &password {
            super::remember_secret(p);
        }
        if let Some(u) = &url {
            if let Ok(parsed) = url::Url::parse(u) {
                if let Some(p) = parsed.password() {
                    super::remember_secret(p);
                    if let Ok(decoded) = percent_encoding::percent_decode_str(p).decode_utf8() {
                        super::remember_secret(&decoded);
                    }
                }
            }
        }
        let timeout = match &g.timeout {
            Some(t) => {
                Some(parse_duration(t).map_err(|e| UsageError::new(format!("--timeout: {e}")))?)
            }
            None => None,
        };
        Ok(HiArgs {
            url_explicit: url.is_some(),
            url: url.unwrap_or_else(|| DEFAULT_URL.to_owned()),
            user,
            password,
            db: non_empty(&g.db).unwrap_or_else(|| DEFAULT_DATABASE.to_owned()),
            db_on_command_line: matches.value_source("db") == Some(ValueSource::CommandLine),
            json: g.json,
            timeout,
        })
    }

    /// The URL without its password, for messages.
    pub(crate) fn shown_url(&self) -> String {
        redact_url(&self.url)
    }

    /// A client on `url` and `db` with these settings' credentials and timeout.
    ///
    /// # Errors
    ///
    /// An invalid URL, database name or timeout.
    pub(crate) fn client(
        &self,
        url: &str,
        db: &str,
        credentials: bool,
    ) -> couch_ledger::Result<Client> {
        self.client_builder(url, db, credentials).build()
    }

    /// The builder [`HiArgs::client`] builds, for a caller that adds to it (the service adds
    /// its metrics observer).
    pub(crate) fn client_builder(
        &self,
        url: &str,
        db: &str,
        credentials: bool,
    ) -> couch_ledger::ClientBuilder {
        let mut b = Client::builder().url(url).database(db);
        if credentials {
            if let Some(user) = &self.user {
                b = b.basic_auth(user, self.password.clone().unwrap_or_default());
            }
        }
        if let Some(t) = self.timeout {
            b = b
                .request_timeout(t)
                .connect_timeout(t.min(Duration::from_secs(5)));
        }
        b
    }

    /// The ledger on the configured server and database.
    ///
    /// # Errors
    ///
    /// As [`HiArgs::client`].
    pub(crate) fn ledger(&self) -> couch_ledger::Result<Ledger> {
        Ok(Ledger::new(self.client(&self.url, &self.db, true)?))
    }
}

/// `URL` with any password replaced by `_`.
pub(crate) fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("_"));
            }
            u.to_string()
        }
        Err(_) => "<invalid URL>".to_owned(),
    }
}

/// A duration in `humantime`'s syntax: numbers with units, run together or spaced (`0s`,
/// `500ms`, `30s`, `5m`, `1h30m`, `2h 15m`; units from `ns` to `y`).
///
/// # Errors
///
/// Anything else: no unit (`5`), a negative or unknown one, a value too large.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 500ms, 30s, 1h30m"))
}

/// A currency code from the command line, in either case (`gbp` is `GBP`).
///
/// # Errors
///
/// An unknown code (invalid input).
pub(crate) fn currency(code: &str) -> couch_ledger::Result<Currency> {
    Currency::from_code(&code.to_ascii_uppercase())
}

/// A decimal amount from the command line, exactly (`6.46` → 646 in GBP).
///
/// # Errors
///
/// Not an exact decimal in the currency (invalid input).
pub(crate) fn amount(currency: Currency, text: &str) -> couch_ledger::Result<Amount> {
    currency.parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        // Every form the README documents, and humantime's compound forms.
        for (text, want) in [
            ("0s", Duration::ZERO),
            ("500ms", Duration::from_millis(500)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("1h30m", Duration::from_secs(5400)),
            ("1h 30m", Duration::from_secs(5400)),
            ("250ms", Duration::from_millis(250)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
        for bad in [
            "",
            "5",
            "s",
            "-1s",
            "5x",
            "1h30",
            "ms5",
            "99999999999999999999999s",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("is not a duration"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_command_line_is_well_formed() {
        LowArgs::command().debug_assert();
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redact_url("http://u:secret@h:1/"), "http://u:_@h:1/");
        assert_eq!(redact_url("http://h:1"), "http://h:1/");
    }
}
