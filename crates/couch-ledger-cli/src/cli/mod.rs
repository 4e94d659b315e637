//! The `couch-ledger` command line: one file per group of commands, all thin wrappers around
//! the library. docs/PROTOCOL.md is the contract (flags, `--json` fields, exit codes).
//!
//! A group of commands is one file (`orders.rs`, `transfers.rs`) with a
//! `#[derive(Subcommand)]` enum and an `async fn run(cmd, ctx: &mut Context) ->
//! anyhow::Result<Exit>`, flattened into [`args::Command`] with one arm in [`dispatch`]. A demo
//! scenario goes in `demo.rs` (see there).

use std::fmt;

use anyhow::Context as _;
use couch_ledger::design::{InstallStatus, Scope};
use couch_ledger::{InitReport, ViewQuery};
use serde_json::{json, Value};

pub(crate) mod args;
pub(crate) mod demo;
pub(crate) mod dev;
pub(crate) mod events;
pub(crate) mod failure;
pub(crate) mod history;
pub(crate) mod lookup;
pub(crate) mod meta;
pub(crate) mod orders;
pub(crate) mod output;
pub(crate) mod parse;
pub(crate) mod progress;
#[cfg(feature = "serve")]
pub(crate) mod serve;
pub(crate) mod transfers;

use args::{Command, HiArgs, LowArgs};
pub(crate) use output::{Exit, Out};

/// A mistake in how the program was called (exit code 2), found by us rather than by clap.
#[derive(Debug)]
pub(crate) struct UsageError(String);

impl UsageError {
    pub(crate) fn new(message: impl Into<String>) -> UsageError {
        UsageError(message.into())
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// What every command gets: the validated settings and stdout.
pub(crate) struct Context {
    pub(crate) settings: HiArgs,
    pub(crate) out: Out,
}

impl Context {
    /// The ledger on the configured server and database (no request is sent yet).
    pub(crate) fn ledger(&self) -> anyhow::Result<couch_ledger::Ledger> {
        self.ledger_with(|builder| builder)
    }

    /// [`Context::ledger`] configured further by `configure` (a command's own settings).
    pub(crate) fn ledger_with(
        &self,
        configure: impl FnOnce(couch_ledger::LedgerBuilder) -> couch_ledger::LedgerBuilder,
    ) -> anyhow::Result<couch_ledger::Ledger> {
        self.settings
            .ledger_with(configure)
            .context("invalid server settings")
    }
}

/// Validates the settings, then runs the command on a Tokio runtime.
///
/// # Errors
///
/// Whatever the command reports; `main` turns it into one line and an exit code.
pub(crate) fn run(low: LowArgs, matches: &clap::ArgMatches) -> anyhow::Result<Exit> {
    let settings = HiArgs::from_low(&low, matches)?;
    tracing::debug!(?settings, "settings");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut ctx = Context {
        out: Out::new(settings.json),
        settings,
    };
    runtime
        .block_on(dispatch(low.command, &mut ctx))
        .map_err(|e| failure::explain(e, &ctx.settings))
}

async fn dispatch(command: Command, ctx: &mut Context) -> anyhow::Result<Exit> {
    match command {
        Command::Init(args) => init(args, ctx).await,
        Command::Orders(cmd) => orders::run(cmd, ctx).await,
        Command::Transfers(cmd) => transfers::run(cmd, ctx).await,
        Command::Events(args) => events::events(args, ctx).await,
        Command::Demo(args) => demo::run(args, ctx).await,
        Command::DevServer(args) => dev::run(args, ctx).await,
        // main.rs hands `serve` to the service (src/serve/) before it gets here.
        #[cfg(feature = "serve")]
        Command::Serve(_) => unreachable!("main.rs runs serve"),
        Command::Completions(_) => unreachable!("main.rs runs completions"),
    }
}

/// Resolves on the first SIGINT or SIGTERM: the stop of `sweep --watch` and of
/// `serve`. Installed when called, so a signal from then on is not missed.
pub(crate) fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// `completions SHELL`: the completion script on stdout. It needs no settings, no server and
/// no runtime, so `main.rs` runs it before any of them.
///
/// # Errors
///
/// Stdout cannot be written (a closed pipe is not reported: see `main.rs`).
pub(crate) fn completions(args: &args::CompletionsArgs) -> anyhow::Result<Exit> {
    use clap::CommandFactory as _;
    use std::io::Write as _;
    // Into a buffer first: clap_complete panics when its writer fails, and `… | head` closing
    // stdout is not a reason to panic.
    let mut script = Vec::new();
    clap_complete::generate(
        args.shell,
        &mut LowArgs::command(),
        "couch-ledger",
        &mut script,
    );
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .context("cannot write the completion script")?;
    Ok(Exit::Success)
}

async fn init(args: args::InitArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let ledger = ctx.ledger()?;
    let report = ledger
        .init()
        .await
        .with_context(|| format!("could not initialise database {:?}", ctx.settings.db))?;
    let changed = |docs: &[couch_ledger::design::Installed]| {
        docs.iter().any(|d| d.status != InstallStatus::Unchanged)
    };
    if changed(&report.design_docs) {
        build_views(ledger.client(), Scope::Ledger, ctx.settings.json).await;
    }
    if report.hot.as_ref().is_some_and(|h| changed(&h.design_docs)) {
        build_views(ledger.hot_client(), Scope::Hot, ctx.settings.json).await;
    }
    let security = match &args.member_role {
        Some(role) => Some(ledger.restrict_to_role(role).await.with_context(|| {
            format!(
                "could not set the _security of database {:?}",
                ctx.settings.db
            )
        })?),
        None => None,
    };
    let text = init_words(&report, args.member_role.as_deref());
    let value = init_json(&report, security);
    ctx.out.print(&value, &text)?;
    Ok(Exit::Success)
}

/// What `init` did, in words: each database and its design documents, then the settings and
/// records it wrote (`member_role`: the role `--member-role` gave the databases).
fn init_words(report: &InitReport, member_role: Option<&str>) -> String {
    let mut text = String::new();
    let mut describe = |database: &str, created: bool, docs: &[couch_ledger::design::Installed]| {
        text.push_str(&format!(
            "database {database}: {}\n",
            if created { "created" } else { "exists" }
        ));
        for d in docs {
            text.push_str(&format!(
                "  {:<24} {}\n",
                d.id,
                output::install_status(d.status)
            ));
        }
    };
    describe(&report.database, report.created, &report.design_docs);
    if let Some(hot) = &report.hot {
        describe(&hot.database, hot.created, &hot.design_docs);
        text.push_str(
            "  (accounts and transfers: no validation here; guard it with --member-role)\n",
        );
    }
    if let Some(limit) = report.revs_limit {
        text.push_str(&format!(
            "  _revs_limit              {limit} (accounts' revision history kept short)\n"
        ));
    }
    if let Some(role) = member_role {
        text.push_str(&format!(
            "  _security                only admins and role {role:?} may read and write\n"
        ));
    }
    if report.opening_records > 0 {
        text.push_str(&format!(
            "  opening records          {} written, for accounts created before records existed\n",
            report.opening_records
        ));
    }
    text
}

/// What `init` did, as `--json` prints it (`security`: the `_security` it set, if any).
fn init_json(report: &InitReport, security: Option<Value>) -> Value {
    let as_json = |docs: &[couch_ledger::design::Installed]| -> Vec<Value> {
        docs.iter()
            .map(|d| json!({"id": d.id, "status": output::install_status(d.status)}))
            .collect()
    };
    let docs = as_json(&report.design_docs);
    let mut value =
        json!({"database": report.database, "created": report.created, "design_docs": docs});
    if let Some(security) = security {
        value["security"] = security;
    }
    value["revs_limit"] = json!(report.revs_limit);
    value["opening_records"] = json!(report.opening_records);
    if let Some(hot) = &report.hot {
        value["hot"] = json!({
            "database": hot.database,
            "created": hot.created,
            "design_docs": as_json(&hot.design_docs),
        });
    }
    value
}

/// After new or changed design documents: asks one view of each for nothing, which makes the
/// server build the document's views (CouchDB builds them together) — so the first real query
/// does not wait, and a terminal shows a bar meanwhile. A view that takes longer than the
/// request timeout keeps building on the server; that is said, and is not a failure.
async fn build_views(client: &couch_ledger::Client, scope: Scope, json: bool) {
    let docs: Vec<(String, String)> = scope
        .design_docs()
        .into_iter()
        .filter_map(|d| {
            let name = d.id.strip_prefix("_design/")?.to_owned();
            let view = d.body.get("views")?.as_object()?.keys().next()?.clone();
            Some((name, view))
        })
        .collect();
    let bar = progress::Bar::new(json, "building views", Some(docs.len() as u64));
    for (done, (ddoc, view)) in docs.iter().enumerate() {
        let q = ViewQuery {
            limit: Some(0),
            ..ViewQuery::default()
        };
        if let Err(e) = client.view(ddoc, view, &q).await {
            tracing::warn!("views of _design/{ddoc} not built yet (the server goes on): {e}");
        }
        bar.set(done as u64 + 1);
    }
    bar.finish();
}
