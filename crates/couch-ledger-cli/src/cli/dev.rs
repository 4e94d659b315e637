//! `couch-ledger dev-server`: the local pouchdb-server ([`DevServer`]) in the foreground, for
//! trying the ledger by hand without a CouchDB. Its data is kept between runs.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use couch_ledger_devserver::{self as devserver, DevServer};
use serde_json::json;

use super::{Context, Exit};

/// The port CouchDB listens on, and so the program's default URL.
const DEFAULT_PORT: u16 = 5984;
/// How often the foreground loop checks that the server is still running.
const CHECK_EVERY_MS: u64 = 500;
/// How long the server may take to exit once told to, before it is killed.
const STOP_GRACE_MS: u64 = 5_000;

#[derive(Args)]
pub(crate) struct DevServerArgs {
    /// The port on 127.0.0.1 to listen on (0 picks a free one; the URL line says which).
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_PORT)]
    pub(crate) port: u16,

    /// Where the server keeps its databases, created when missing and kept when it stops
    /// [default: dev-server/ in the cache directory, ~/.cache/couch-ledger].
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
}

/// Starts the server, prints how to use it, and runs until SIGINT or SIGTERM (or until the
/// server ends by itself, which is an error).
///
/// # Errors
///
/// The server could not be installed or started, or it stopped on its own.
pub(crate) async fn run(args: DevServerArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    // Installed before the server starts, so a signal at any moment stops it cleanly.
    let mut stop = stop_signal().context("cannot install the signal handlers")?;
    let dir = args
        .dir
        .unwrap_or_else(|| devserver::cache_root().join("dev-server"));
    let port = args.port;
    let mut server = tokio::task::spawn_blocking(move || DevServer::start_kept(port, &dir))
        .await
        .context("the local server's start-up task failed")?
        // Not the user's input at fault: an operational error (exit 1).
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("could not start the local pouchdb-server")?;
    let url = server.url();
    let data_dir = server.data_dir().display().to_string();
    let text = format!(
        "pouchdb-server (a CouchDB-protocol server for development) is listening on {url}\n\
         data: {data_dir} (kept when it stops)\n\
         \n\
         In another shell:\n\
         \x20 export COUCHDB_URL={url}\n\
         \x20 couch-ledger init\n\
         \n\
         Ctrl-C (SIGINT) or SIGTERM stops it.\n"
    );
    ctx.out
        .print(&json!({"url": url, "data_dir": data_dir}), &text)?;
    let mut check = tokio::time::interval(Duration::from_millis(CHECK_EVERY_MS));
    let ended = loop {
        tokio::select! {
            () = &mut stop => break None,
            _ = check.tick() => {
                if let Some(why) = server.exited() {
                    break Some(why);
                }
            }
        }
    };
    if let Some(why) = ended {
        anyhow::bail!("the local server stopped on its own: {why}");
    }
    let _ = writeln!(std::io::stderr(), "stopping pouchdb-server");
    tokio::task::spawn_blocking(move || server.shutdown(Duration::from_millis(STOP_GRACE_MS)))
        .await
        .context("the local server's stop task failed")?;
    let _ = writeln!(std::io::stderr(), "stopped");
    Ok(Exit::Success)
}

/// Resolves on the first SIGINT or SIGTERM.
fn stop_signal() -> std::io::Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(Box::pin(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }))
}
