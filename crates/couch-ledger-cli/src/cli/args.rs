//! Arguments in two stages (ripgrep's `LowArgs` → `HiArgs`): clap turns the command line into
//! [`LowArgs`], raw strings as typed; [`HiArgs`] are the validated settings every command
//! uses. Values that need domain knowledge (amounts, currencies) are checked by the command,
//! before it sends anything, so that every bad input is reported as one `error:` line.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use couch_ledger::{redact_url, Client, Ledger, LedgerBuilder, DEFAULT_DATABASE, DEFAULT_URL};
use secrecy::{ExposeSecret, SecretString};

use super::parse::parse_duration;
use super::UsageError;

/// A money ledger on CouchDB: an immutable order ledger (purchases, payments, refunds,
/// adjustments), multi-phase transfers between accounts, and a sweeper that finishes them.
///
/// Amounts on the command line are decimals in the currency's units (6.46); with --json every
/// amount is an integer in minor units (646). Exit codes: 0 success, 1 operational error
/// (server, network, unresolved conflict), 2 usage or invalid input, 3 a transfer cancelled by
/// a business rule, 4 written but not yet on every copy of a cluster's database (send it again).
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

    /// Keep accounts and transfers in this second database, which runs no validation (orders
    /// stay in --db, validated): several times the transfer throughput on CouchDB, with roles
    /// as the guard there (docs/LAYOUT.md). Every program on one ledger must use the same.
    #[arg(long, env = "LEDGER_HOT_DB", global = true, value_name = "NAME")]
    hot_db: Option<String>,

    /// Print exactly one JSON object on stdout (amounts as integers in minor units), errors
    /// included: `error` (a code), `message`, and `id` where there is one.
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// Time allowed to wait for the server on one call, retries included (a server that never
    /// answers fails the command in about this long), e.g. 500ms, 30s, 5m, 1h30m
    /// [default: 60s].
    #[arg(long, global = true, value_name = "DUR")]
    timeout: Option<String>,

    /// A TOML file of settings: url, user, password_file, db, hot_db, timeout (and iam_api_key_file,
    /// iam_token_url). Options and the environment override it.
    #[arg(long, env = "COUCH_LEDGER_CONFIG", global = true, value_name = "PATH")]
    config: Option<PathBuf>,

    /// An IBM Cloud IAM API key (Cloudant): exchanged for bearer tokens, which replace the
    /// user and password (never printed).
    #[arg(
        long,
        env = "COUCH_LEDGER_IAM_API_KEY",
        global = true,
        hide_env_values = true,
        value_name = "KEY"
    )]
    iam_api_key: Option<String>,

    /// Where the IAM API key is exchanged for tokens [default:
    /// https://iam.cloud.ibm.com/identity/token].
    #[arg(
        long,
        env = "COUCH_LEDGER_IAM_TOKEN_URL",
        global = true,
        value_name = "URL"
    )]
    iam_token_url: Option<String>,
}

/// One source of connection settings: the command line with its environment (clap merges the
/// two, options first), or the configuration file. [`Layer::over`] stacks them. `Debug` shows
/// secrets as `[REDACTED]` (`SecretString`).
#[derive(Default, Debug)]
pub(crate) struct Layer {
    pub(crate) url: Option<String>,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<SecretString>,
    pub(crate) db: Option<String>,
    pub(crate) hot_db: Option<String>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) iam_api_key: Option<SecretString>,
    pub(crate) iam_token_url: Option<String>,
}

impl Layer {
    /// Each setting of `self`, else the one of `under`.
    pub(crate) fn over(self, under: Layer) -> Layer {
        Layer {
            url: self.url.or(under.url),
            user: self.user.or(under.user),
            password: self.password.or(under.password),
            db: self.db.or(under.db),
            hot_db: self.hot_db.or(under.hot_db),
            timeout: self.timeout.or(under.timeout),
            iam_api_key: self.iam_api_key.or(under.iam_api_key),
            iam_token_url: self.iam_token_url.or(under.iam_token_url),
        }
    }
}

/// The configuration file's keys (`--config`, `COUCH_LEDGER_CONFIG`). Secrets are not in it
/// but in files of their own, which can be readable by fewer people.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    url: Option<String>,
    user: Option<String>,
    password_file: Option<PathBuf>,
    db: Option<String>,
    hot_db: Option<String>,
    timeout: Option<String>,
    iam_api_key_file: Option<PathBuf>,
    iam_token_url: Option<String>,
}

/// Reads the configuration file at `path` as a [`Layer`]. Relative secret files are relative
/// to the configuration file's directory.
///
/// # Errors
///
/// The file or a secret file cannot be read, is not TOML, has an unknown key or a bad
/// duration. Messages never quote the file's lines (a secret may be in one by mistake).
pub(crate) fn read_config(path: &Path) -> Result<Layer, UsageError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| UsageError::new(format!("cannot read the config file {shown}: {e}")))?;
    let file: ConfigFile = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
        let at = line.map_or(String::new(), |l| format!(" (line {l})"));
        UsageError::new(format!("config file {shown}{at}: {}", e.message().trim()))
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let secret = |file: &Option<PathBuf>, what: &str| -> Result<Option<SecretString>, UsageError> {
        let Some(file) = file else { return Ok(None) };
        let file = dir.join(file);
        let text = std::fs::read_to_string(&file).map_err(|e| {
            UsageError::new(format!(
                "config file {shown}: cannot read {what} {}: {e}",
                file.display()
            ))
        })?;
        Ok(Some(SecretString::from(
            text.trim_end_matches(['\n', '\r']),
        )))
    };
    let timeout = match &file.timeout {
        Some(t) => Some(
            parse_duration(t)
                .map_err(|e| UsageError::new(format!("config file {shown}: timeout: {e}")))?,
        ),
        None => None,
    };
    Ok(Layer {
        url: file.url.filter(|s| !s.is_empty()),
        user: file.user.filter(|s| !s.is_empty()),
        password: secret(&file.password_file, "password_file")?,
        db: file.db.filter(|s| !s.is_empty()),
        hot_db: file.hot_db.filter(|s| !s.is_empty()),
        timeout,
        iam_api_key: secret(&file.iam_api_key_file, "iam_api_key_file")?,
        iam_token_url: file.iam_token_url.filter(|s| !s.is_empty()),
    })
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

    /// The ledger's events as JSON lines, oldest first: transfer.done, transfer.cancelled,
    /// transfer.reversed, payment.recorded, refund.recorded, adjustment.recorded,
    /// order.settled, order.unsettled, account.created, account.overdrawn. Each has a stable
    /// `id` (a fact read twice has the same id) and a `cursor`: pass the last one you handled to
    /// --after to go on from there. Read from the databases' change feeds (docs/EVENTS.md).
    Events(super::events::EventsArgs),

    /// Run the seed scenarios end to end on a fresh database and say what each step shows.
    /// Uses COUCHDB_URL or --url when given; otherwise the server at the default URL, or, when
    /// nothing answers there, a local pouchdb-server it starts and stops itself.
    Demo(super::demo::DemoArgs),

    /// Run a local CouchDB-protocol server (pouchdb-server), to try the ledger by hand.
    ///
    /// It runs in the foreground, without installing CouchDB: on 127.0.0.1:5984, the program's
    /// default URL, so the other commands find it as they are. The first run installs the pinned
    /// server with npm into the cache directory (~/.cache/couch-ledger; a minute or two, once).
    /// Its databases are kept between runs (--dir says where). It prints its URL and how to
    /// use it; Ctrl-C (SIGINT) or SIGTERM stops it. For development only: use Apache CouchDB
    /// (or Cloudant) for real money.
    DevServer(super::dev::DevServerArgs),

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

/// Parses the command line; on a usage error (or --help / --version) clap prints and exits —
/// with `--json` on the line, after one error object on stdout.
pub(crate) fn parse() -> (LowArgs, ArgMatches) {
    let parsed = LowArgs::command()
        .try_get_matches()
        .and_then(|m| LowArgs::from_arg_matches(&m).map(|low| (low, m)));
    match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            if e.use_stderr() && std::env::args_os().any(|a| a == "--json") {
                let text = e.to_string();
                let message = text
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim_start_matches("error: ");
                let value = serde_json::json!({"error": "usage", "message": message});
                println!("{value}");
            }
            e.exit()
        }
    }
}

/// `--timeout` when none is given.
pub(crate) const TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// The validated settings.
pub(crate) struct HiArgs {
    /// Server URL, possibly with credentials (never print it as is: see [`HiArgs::shown_url`]).
    pub(crate) url: String,
    /// The URL came from `--url`, `COUCHDB_URL` or the config file, not the default.
    pub(crate) url_explicit: bool,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<SecretString>,
    pub(crate) iam_api_key: Option<SecretString>,
    pub(crate) iam_token_url: Option<String>,
    pub(crate) db: String,
    /// `--hot-db`: accounts and transfers in a database of their own.
    pub(crate) hot_db: Option<String>,
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
            .field("iam_api_key", &self.iam_api_key.as_ref().map(|_| "_"))
            .field("iam_token_url", &self.iam_token_url)
            .field("db", &self.db)
            .field("hot_db", &self.hot_db)
            .field("json", &self.json)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl HiArgs {
    /// Validates the global options and stacks them: options, then the environment, then
    /// the configuration file, then the defaults.
    ///
    /// # Errors
    ///
    /// A bad duration, a password without a user, an unreadable or invalid config file.
    pub(crate) fn from_low(low: &LowArgs, matches: &ArgMatches) -> Result<HiArgs, UsageError> {
        let g = &low.global;
        // An empty environment variable means "not set".
        let non_empty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let timeout = match &g.timeout {
            Some(t) => {
                Some(parse_duration(t).map_err(|e| UsageError::new(format!("--timeout: {e}")))?)
            }
            None => None,
        };
        let given = Layer {
            url: non_empty(&g.url),
            user: non_empty(&g.user),
            password: g.password.clone().map(SecretString::from),
            db: non_empty(&g.db),
            hot_db: non_empty(&g.hot_db),
            timeout,
            iam_api_key: non_empty(&g.iam_api_key).map(SecretString::from),
            iam_token_url: non_empty(&g.iam_token_url),
        };
        let file = match g.config.as_deref().filter(|p| !p.as_os_str().is_empty()) {
            Some(path) => read_config(path)?,
            None => Layer::default(),
        };
        let password_given = given.password.is_some();
        let settings = given.over(file);
        if settings.password.is_some() && settings.user.is_none() {
            return Err(UsageError::new(if password_given {
                "--password (COUCHDB_PASSWORD) needs --user (COUCHDB_USER)"
            } else {
                "the config file's password_file needs a user (user, --user or COUCHDB_USER)"
            }));
        }
        Ok(HiArgs {
            url_explicit: settings.url.is_some(),
            url: settings.url.unwrap_or_else(|| DEFAULT_URL.to_owned()),
            user: settings.user,
            password: settings.password,
            iam_api_key: settings.iam_api_key,
            iam_token_url: settings.iam_token_url,
            db: settings.db.unwrap_or_else(|| DEFAULT_DATABASE.to_owned()),
            hot_db: settings.hot_db,
            db_on_command_line: matches.value_source("db") == Some(ValueSource::CommandLine),
            json: g.json,
            timeout: settings.timeout,
        })
    }

    /// The database that holds accounts and transfers: `--hot-db` when given, else `--db`.
    pub(crate) fn accounts_db(&self) -> &str {
        self.hot_db.as_deref().unwrap_or(&self.db)
    }

    /// The URL without its password, for messages.
    pub(crate) fn shown_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Whether a login is set: a user, an IAM key, or credentials in the URL.
    pub(crate) fn has_login(&self) -> bool {
        self.user.is_some()
            || self.iam_api_key.is_some()
            || url::Url::parse(&self.url).is_ok_and(|u| !u.username().is_empty())
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
                let password = self.password.as_ref().map(ExposeSecret::expose_secret);
                b = b.basic_auth(user, password.unwrap_or_default());
            }
            if let Some(key) = &self.iam_api_key {
                b = b.iam_api_key(key.expose_secret());
            }
            if let Some(token_url) = &self.iam_token_url {
                b = b.iam_token_url(token_url);
            }
        }
        // --timeout bounds the whole wait for the server, retries included: a server that
        // accepts connections and never answers fails the command in about that long. Tries
        // get a third each, so one that is lost (a stale connection, a stuck node behind a
        // balancer) is tried again within it, and each retry is said on stderr.
        let t = self.timeout.unwrap_or(TIMEOUT_DEFAULT);
        let each_try = (t / 3).max(t.min(Duration::from_secs(1)));
        b.call_timeout(t)
            .request_timeout(each_try)
            .connect_timeout(each_try.min(Duration::from_secs(5)))
            .observer(std::sync::Arc::new(super::output::RetryNotices))
    }

    /// The ledger on the configured server and database (and hot database), configured
    /// further by `configure` (a command's own settings).
    ///
    /// # Errors
    ///
    /// As [`HiArgs::client`]; an invalid hot database.
    pub(crate) fn ledger_with(
        &self,
        configure: impl FnOnce(LedgerBuilder) -> LedgerBuilder,
    ) -> couch_ledger::Result<Ledger> {
        let mut builder = Ledger::builder(self.client(&self.url, &self.db, true)?);
        if let Some(hot) = &self.hot_db {
            builder = builder.hot_database(hot);
        }
        configure(builder).build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        LowArgs::command().debug_assert();
    }

    #[test]
    fn options_and_environment_override_the_file_which_overrides_defaults() {
        let dir = std::env::temp_dir().join(format!("cl-config-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pw"), "from-file\n").unwrap();
        let path = dir.join("ledger.toml");
        std::fs::write(
            &path,
            "url = \"http://file:1\"\nuser = \"fileuser\"\npassword_file = \"pw\"\n\
             db = \"filedb\"\ntimeout = \"1h30m\"\n",
        )
        .unwrap();
        let file = read_config(&path).unwrap();
        assert_eq!(file.password.as_ref().unwrap().expose_secret(), "from-file");
        let given = Layer {
            db: Some("given".into()),
            ..Layer::default()
        };
        let merged = given.over(file);
        assert_eq!(merged.db.as_deref(), Some("given"));
        assert_eq!(merged.url.as_deref(), Some("http://file:1"));
        assert_eq!(merged.user.as_deref(), Some("fileuser"));
        assert_eq!(merged.timeout, Some(Duration::from_secs(5400)));
        // Nothing anywhere: the defaults apply (in from_low), nothing is invented here.
        let none = Layer::default().over(Layer::default());
        assert!(none.url.is_none() && none.db.is_none() && none.timeout.is_none());
        // A typo is refused, and the message does not quote the line (a secret may be in it).
        std::fs::write(&path, "password = \"hunter2-xyz\"\n").unwrap();
        let e = read_config(&path).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("password"), "{e}");
        assert!(!e.contains("hunter2-xyz"), "{e}");
        std::fs::write(&path, "timeout = \"soon\"\n").unwrap();
        let e = read_config(&path).unwrap_err().to_string();
        assert!(e.contains("timeout"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
