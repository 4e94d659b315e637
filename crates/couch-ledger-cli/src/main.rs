//! `couch-ledger`: parses the command line, sets up logging, runs the command (`cli`), and
//! turns an error into one line on stderr and an exit code (docs/PROTOCOL.md): 0 success, 1
//! operational error, 2 usage or invalid input, 3 a transfer cancelled by a business rule.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

mod cli;
#[cfg(feature = "serve")]
mod serve;

fn main() -> ExitCode {
    // clap prints usage errors itself and exits with 2 (0 for --help / --version).
    let (low, matches) = cli::args::parse();
    init_logging(&low);
    let json = low.global.json;
    match run(low, &matches) {
        Ok(exit) => ExitCode::from(exit.code()),
        Err(err) => ExitCode::from(report(&err, json).code()),
    }
}

/// `serve` goes to the service (src/serve/), `completions` needs no settings, every other
/// command goes to the command line.
fn run(low: cli::args::LowArgs, matches: &clap::ArgMatches) -> anyhow::Result<cli::Exit> {
    if let cli::args::Command::Completions(args) = &low.command {
        return cli::completions(args);
    }
    #[cfg(feature = "serve")]
    if let cli::args::Command::Serve(args) = &low.command {
        let settings = cli::args::HiArgs::from_low(&low, matches)?;
        return serve::run(settings, args.clone());
    }
    cli::run(low, matches)
}

/// Logs go to stderr (stdout is the command's output), filtered by `RUST_LOG`: `warn` by
/// default, `info` for `serve` (one line per request), as JSON lines with `serve
/// --log-format json`.
fn init_logging(low: &cli::args::LowArgs) {
    let (default, json) = logging_defaults(low);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    #[cfg(feature = "serve")]
    if json {
        subscriber.json().flatten_event(true).init();
        return;
    }
    let _ = json;
    subscriber.with_ansi(std::io::stderr().is_terminal()).init();
}

/// The default level and whether lines are JSON: `warn` and text, but `info` for `serve`, and
/// JSON with `serve --log-format json`.
fn logging_defaults(low: &cli::args::LowArgs) -> (&'static str, bool) {
    #[cfg(feature = "serve")]
    if let cli::args::Command::Serve(args) = &low.command {
        return ("info", args.log_format == cli::serve::LogFormat::Json);
    }
    let _ = low;
    ("warn", false)
}

/// Prints `error: <what failed>: <cause>` on one line — and with `--json` one object on stdout,
/// unless the command printed its own — and says which exit code it means.
fn report(err: &anyhow::Error, json: bool) -> cli::Exit {
    // `couch-ledger … | head` closing the pipe is not a failure.
    if err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    }) {
        return cli::Exit::Success;
    }
    // Secrets are `SecretString`s and URLs in errors carry no credentials: nothing to blank.
    let failure = cli::failure::describe(err);
    if json && !cli::output::printed() {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{}", failure.json()).and_then(|()| stdout.flush());
    }
    let _ = writeln!(std::io::stderr(), "error: {}", failure.message);
    failure.exit
}
