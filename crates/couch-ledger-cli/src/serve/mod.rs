//! `couch-ledger serve`: the ledger as an HTTP service, a front end beside the
//! command line and as thin: handlers parse, call the library, and map its errors to status
//! codes (`error.rs`). One [`Ledger`] per process, so every caller shares its group-commit
//! engine; the sweeper runs inside unless `--no-sweep`.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | settings, the router and its OpenAPI document, start and graceful stop |
//! | `api.rs` | request and response bodies and their schemas |
//! | `schema.rs` | the document's shared parts: constrained scalars, shared error answers |
//! | `accounts.rs`, `history.rs`, `transfers.rs`, `orders.rs`, `ops.rs` | the handlers (`history.rs` with its own bodies) |
//! | `error.rs`, `extract.rs` | errors as answers; extractors that refuse the same way |
//! | `auth.rs`, `access.rs`, `metrics.rs` | API keys; the request log line; Prometheus metrics |
//!
//! Besides the library it imports only the command line's argument layer, which parses every
//! command's flags: the validated connection settings (`cli::args::HiArgs`), `serve`'s flags
//! (`cli::serve`), `Exit` and `UsageError`. Nothing imports it but `main.rs`.

use std::future::{Future, IntoFuture as _};
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::Router;
use couch_ledger::limits::{STALE_AFTER_DEFAULT_MS, SWEEP_LIMIT_MAX};
use couch_ledger::{Amount, Currency, Ledger, RecordStatus, SweepOptions};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::watch;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::cli::args::HiArgs;
use crate::cli::parse::parse_duration;
use crate::cli::serve::{ServeArgs, API_KEYS_ENV};
use crate::cli::{shutdown_signal, Exit, UsageError};

mod access;
mod accounts;
mod api;
mod auth;
mod error;
mod events;
mod extract;
mod history;
mod metrics;
mod ops;
mod orders;
mod schema;
mod search;
mod transfers;
mod webhook;

use auth::ApiKeys;
use error::ApiError;
use metrics::Metrics;
use schema::{Links, SharedAnswers};

/// What every handler gets.
#[derive(Clone)]
pub(crate) struct AppState {
    ledger: Ledger,
    metrics: Arc<Metrics>,
    /// `/openapi.json`, generated from the router at start.
    openapi: Arc<String>,
    /// Becomes `true` when the service stops: open event streams end.
    stop: watch::Receiver<bool>,
}

/// The transfer an answer is about, for the request's log line (a response extension).
#[derive(Clone, Debug)]
pub(crate) struct TransferId(pub(crate) String);

/// The validated `serve` settings.
struct Settings {
    listen: SocketAddr,
    keys: ApiKeys,
    sweep: Option<SweepOptions>,
    init: bool,
    /// `--answer-at-commit`: the ledger finishes committed transfers in the background.
    answer_at_commit: bool,
    /// `--shutdown-timeout`: the stop, from the signal to the exit, takes no longer.
    shutdown_timeout: Duration,
    /// `--webhook-url`: where every event is POSTed.
    webhook: Option<webhook::Webhook>,
}

impl Settings {
    fn from_args(args: &ServeArgs) -> Result<Settings, UsageError> {
        let listen: SocketAddr = args.listen.parse().map_err(|_| {
            UsageError::new(format!(
                "--listen {:?}: expected IP:PORT, e.g. 127.0.0.1:8080 or 0.0.0.0:8080",
                args.listen
            ))
        })?;
        let env_keys = std::env::var(API_KEYS_ENV).ok();
        let keys = ApiKeys::load(args.api_keys_file.as_deref(), env_keys.as_deref())?;
        let stale_after = match &args.stale_after {
            Some(text) => {
                parse_duration(text).map_err(|e| UsageError::new(format!("--stale-after: {e}")))?
            }
            None => Duration::from_millis(STALE_AFTER_DEFAULT_MS),
        };
        let shutdown_timeout = parse_duration(&args.shutdown_timeout)
            .map_err(|e| UsageError::new(format!("--shutdown-timeout: {e}")))?;
        if args.sweep_batch == 0 || args.sweep_batch > SWEEP_LIMIT_MAX {
            return Err(UsageError::new(format!(
                "--sweep-batch must be between 1 and {SWEEP_LIMIT_MAX}"
            )));
        }
        let webhook = match &args.webhook_url {
            Some(url) => {
                let retry_max = parse_duration(&args.webhook_retry_max)
                    .map_err(|e| UsageError::new(format!("--webhook-retry-max: {e}")))?;
                Some(webhook::Webhook::from_args(
                    url,
                    args.webhook_secret_file.as_deref(),
                    retry_max,
                )?)
            }
            None if args.webhook_secret_file.is_some() => {
                return Err(UsageError::new(
                    "--webhook-secret-file is for --webhook-url: give both, or neither",
                ));
            }
            None => None,
        };
        Ok(Settings {
            listen,
            keys,
            sweep: (!args.no_sweep).then_some(SweepOptions {
                limit: args.sweep_batch,
                stale_after,
            }),
            init: args.init,
            answer_at_commit: args.answer_at_commit,
            shutdown_timeout,
            webhook,
        })
    }
}

/// Runs the service until SIGINT or SIGTERM.
///
/// # Errors
///
/// Bad settings (exit 2); the address cannot be bound, `--init` failed (exit 1).
pub(crate) fn run(global: HiArgs, args: ServeArgs) -> anyhow::Result<Exit> {
    let settings = Settings::from_args(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let exit = runtime.block_on(serve(global, settings));
    // Whatever is still running after a stop that ran out of time (a request to a CouchDB that
    // does not answer) is dropped, not waited for.
    runtime.shutdown_timeout(Duration::from_millis(500));
    exit
}

async fn serve(global: HiArgs, settings: Settings) -> anyhow::Result<Exit> {
    // Installed first, so a signal at any moment stops us cleanly.
    let signals = shutdown_signal().context("cannot install the signal handlers")?;
    let metrics = Arc::new(Metrics::new());
    let client = global
        .client_builder(&global.url, &global.db, true)
        .observer(metrics.clone())
        .build()
        .context("invalid server settings")?;
    let mut ledger = Ledger::builder(client).background_finish(settings.answer_at_commit);
    if let Some(hot) = &global.hot_db {
        ledger = ledger.hot_database(hot);
    }
    let ledger = ledger.build().context("invalid --hot-db")?;
    if settings.init {
        let report = ledger
            .init()
            .await
            .with_context(|| format!("could not initialise database {:?}", global.db))?;
        tracing::info!(database = %report.database, created = report.created, "initialised");
    }
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let local = listener.local_addr().context("the listening address")?;
    let auth = settings.keys.required();
    let shutdown_timeout = settings.shutdown_timeout;
    let (stop_rx, deadline_rx) = stop_on(signals, shutdown_timeout);
    let app = router(
        ledger.clone(),
        metrics.clone(),
        Arc::new(settings.keys),
        stop_rx.clone(),
    );
    let webhook = settings
        .webhook
        .map(|hook| tokio::spawn(webhook::run(ledger.clone(), hook, stop_rx.clone())));
    let sweeper = settings.sweep.map(|options| {
        let (ledger, metrics, stop) = (ledger.clone(), metrics.clone(), stopped(stop_rx.clone()));
        tokio::spawn(async move {
            ledger
                .sweep_watch_each(options, stop, |pass| metrics.sweep_pass(pass))
                .await
        })
    });

    let url = format!("http://{local}");
    tracing::info!(%url, database = %global.db, sweeper = sweeper.is_some(), auth, "serving");
    announce(&global, &url)?;

    let server = axum::serve(listener, app)
        .with_graceful_shutdown(stopped(stop_rx.clone()))
        .into_future();
    let stopping = Stopping {
        ledger: &ledger,
        sweeper,
        webhook,
    };
    serve_until_stopped(server, stopping, &deadline_rx, shutdown_timeout).await
}

/// What the service finishes after the stop signal, besides the requests in flight.
struct Stopping<'a> {
    ledger: &'a Ledger,
    sweeper: Option<tokio::task::JoinHandle<couch_ledger::Result<couch_ledger::SweepOutcome>>>,
    /// The webhook's task: it keeps its cursor before it ends.
    webhook: Option<tokio::task::JoinHandle<()>>,
}

/// The stop to come: a task that waits for `signals`, then sets the moment by which the
/// process has stopped (`shutdown_timeout` later) and gives the stop signal. The receivers of
/// the stop signal and of that moment.
fn stop_on(
    signals: impl Future<Output = ()> + Send + 'static,
    shutdown_timeout: Duration,
) -> (
    watch::Receiver<bool>,
    watch::Receiver<Option<tokio::time::Instant>>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    // Set when the signal comes: the moment by which the process has stopped.
    let (deadline_tx, deadline_rx) = watch::channel(None::<tokio::time::Instant>);
    tokio::spawn(async move {
        signals.await;
        let _ = deadline_tx.send(Some(tokio::time::Instant::now() + shutdown_timeout));
        tracing::info!(
            "stopping: no new connections; finishing the requests in flight (at most {})",
            couch_ledger::plain_seconds(shutdown_timeout)
        );
        let _ = stop_tx.send(true);
    });
    (stop_rx, deadline_rx)
}

/// The line that says where the service listens, on stdout (one JSON object with `--json`).
fn announce(global: &HiArgs, url: &str) -> std::io::Result<()> {
    let line = if global.json {
        json!({"listening": url, "database": global.db}).to_string()
    } else {
        format!("listening on {url} (database {})", global.db)
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").and_then(|()| stdout.flush())
}

/// Serves until the stop signal, then stops in what is left of `shutdown_timeout` after it:
/// the requests in flight, the transfers still finishing, the sweeper's step, the webhook's
/// cursor, in that order. Out of time at any of them: stops without it (exit 1).
async fn serve_until_stopped(
    server: impl Future<Output = std::io::Result<()>>,
    stopping: Stopping<'_>,
    deadline_rx: &watch::Receiver<Option<tokio::time::Instant>>,
    shutdown_timeout: Duration,
) -> anyhow::Result<Exit> {
    let Stopping {
        ledger,
        sweeper,
        webhook,
    } = stopping;
    let out_of_time = || out_of_time(deadline_rx.clone());
    let limit = couch_ledger::plain_seconds(shutdown_timeout);
    tokio::select! {
        served = server => served.context("serving")?,
        () = out_of_time() => {
            tracing::error!(
                "requests still running {limit} after the stop signal (--shutdown-timeout): \
                 stopping without them; a sweeper finishes their transfers"
            );
            return Ok(Exit::Operational);
        }
    }
    // Transfers answered at their decision and still settling (--answer-at-commit): let them end
    // here rather than leave them to a sweeper, in what is left of the time.
    tokio::select! {
        () = ledger.flush() => {}
        () = out_of_time() => {
            tracing::error!(
                finishing = ledger.finishing(),
                "transfers still finishing {limit} after the stop signal (--shutdown-timeout); \
                 a sweeper will"
            );
            return Ok(Exit::Operational);
        }
    }
    if let Some(sweeper) = sweeper {
        // It finishes the step it is on, in what is left of the time.
        tokio::select! {
            joined = sweeper => match joined {
                Ok(Ok(totals)) => tracing::info!(
                    "sweeper stopped: {}",
                    crate::cli::output::sweep_words(&totals)
                ),
                Ok(Err(e)) => tracing::error!("the sweeper stopped with an error: {e}"),
                Err(e) => tracing::error!("the sweeper task failed: {e}"),
            },
            () = out_of_time() => {
                tracing::error!(
                    "the sweeper was still on a step {limit} after the stop signal \
                     (--shutdown-timeout); stopping without it"
                );
                return Ok(Exit::Operational);
            }
        }
    }
    if let Some(webhook) = webhook {
        // It ends the delivery in flight and keeps where it is.
        tokio::select! {
            joined = webhook => if let Err(e) = joined {
                tracing::error!("the webhook task failed: {e}");
            },
            () = out_of_time() => {
                tracing::error!(
                    "the webhook was still delivering {limit} after the stop signal \
                     (--shutdown-timeout); stopping without keeping its cursor: a restart \
                     delivers again what came since it was last kept"
                );
                return Ok(Exit::Operational);
            }
        }
    }
    tracing::info!("stopped");
    Ok(Exit::Success)
}

/// Resolves at the moment by which the process has stopped, once the signal has set it; never
/// when the signal task is gone without a signal.
async fn out_of_time(mut rx: watch::Receiver<Option<tokio::time::Instant>>) {
    let deadline = match rx.wait_for(Option::is_some).await {
        Ok(d) => d.unwrap_or_else(tokio::time::Instant::now),
        // The signal task is gone without a signal: never.
        Err(_) => return std::future::pending().await,
    };
    tokio::time::sleep_until(deadline).await;
}

/// Resolves once the stop signal was given.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

// ---- the router and its document ------------------------------------------------------------

#[derive(OpenApi)]
#[openapi(
    info(
        title = "couch-ledger",
        description = "A money ledger on CouchDB as an HTTP service: accounts and multi-phase \
            transfers, the order ledger, and the operator's endpoints. JSON in and out; every \
            amount is an integer in minor units (646 = 6.46 GBP), except in a purchase, which \
            keeps Cloudant's decimal shape. Every answer that is not a success is a 4xx/5xx \
            status with an `ErrorBody`, `{\"error\": code, \"message\": text}` (and `field`, \
            `id` when they apply): an unknown path too (404 `not_found`), and a method a path \
            does not take (405 `method_not_allowed`, with `Allow`). With API keys configured, \
            every /v1 request needs `Authorization: Bearer <key>`."
    ),
    modifiers(&BearerAuth, &Scalars),
    tags(
        (name = "accounts", description = "Accounts that transfers move money between"),
        (name = "transfers", description = "Two-phase transfers: idempotent by id"),
        (name = "orders", description = "The immutable order ledger"),
        (name = "events", description = "What happened, in order, resumable: a page or Server-Sent Events"),
        (name = "operations", description = "Health, readiness, metrics, status, invariants"),
    )
)]
struct ApiDoc;

/// The scalars of `schema.rs`, some named only by parameters or by each other.
struct Scalars;

impl Modify for Scalars {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.schemas.extend(schema::components());
    }
}

/// The `api_key` security scheme the `/v1` paths name.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every route, and the OpenAPI document made from the same list (so the two cannot drift).
/// `/v1` answers only with one of `keys` when any is configured.
fn routes(keys: Arc<ApiKeys>) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let v1 = OpenApiRouter::new()
        .routes(routes!(accounts::create, accounts::list))
        .routes(routes!(accounts::get))
        .routes(routes!(history::history))
        .routes(routes!(transfers::create, search::list))
        .routes(routes!(transfers::get))
        .routes(routes!(transfers::cancel))
        .routes(routes!(transfers::reverse))
        .routes(routes!(orders::list))
        .routes(routes!(orders::get))
        .routes(routes!(orders::purchase))
        .routes(routes!(orders::payment))
        .routes(routes!(orders::refund))
        .routes(routes!(orders::adjustment))
        .routes(routes!(orders::shipment))
        .routes(routes!(orders::delivery))
        .routes(routes!(orders::statement))
        .routes(routes!(events::list))
        .routes(routes!(ops::status))
        .routes(routes!(ops::verify))
        .route_layer(from_fn_with_state(keys, auth::require_key));
    let (router, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(v1)
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
        .split_for_parts();
    // After the routes are in: these add to their operations.
    SharedAnswers.modify(&mut doc);
    Links.modify(&mut doc);
    (router, doc)
}

/// The service: the routes, API keys in front of `/v1`, the request log and metrics around
/// everything, JSON 404s.
fn router(
    ledger: Ledger,
    metrics: Arc<Metrics>,
    keys: Arc<ApiKeys>,
    stop: watch::Receiver<bool>,
) -> Router {
    let (routes, doc) = routes(keys);
    let openapi = schema::document_json(&doc);
    let state = AppState {
        ledger,
        metrics,
        openapi: Arc::new(openapi),
        stop,
    };
    routes
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(extract::BODY_BYTES_MAX))
        .layer(from_fn_with_state(state.clone(), access::observe))
        .with_state(state)
}

async fn not_found() -> impl IntoResponse {
    ApiError::not_found("no such endpoint (GET /openapi.json lists them)")
}

/// A path this service has, with a method it does not take; axum adds `Allow`.
async fn method_not_allowed(method: axum::http::Method) -> impl IntoResponse {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("this path does not take {method} (`Allow` lists what it takes)"),
    )
}

// ---- shared by the handlers -----------------------------------------------------------------

/// A currency code, in either case.
fn currency(code: &str) -> Result<Currency, ApiError> {
    Currency::from_code(&code.to_ascii_uppercase())
        .map_err(|e| ApiError::from_ledger(&e, String::new))
}

/// Minor units from JSON (an integer: serde already refused `6.46` and `1e3`), in range.
fn amount(field: &str, minor: i64) -> Result<Amount, ApiError> {
    Amount::new(minor).map_err(|_| {
        ApiError::invalid(
            Some(field),
            format!("{minor} is beyond ±(2^53 − 1) minor units"),
        )
    })
}

/// 201 for a document this call wrote, 200 for one found with the same content, 202 for one
/// written to some copies of a cluster's database and not yet every one (send it again).
fn record_status(status: RecordStatus) -> StatusCode {
    match status {
        RecordStatus::Created => StatusCode::CREATED,
        RecordStatus::Exists => StatusCode::OK,
        RecordStatus::Uncertain => StatusCode::ACCEPTED,
    }
}

/// A page's `limit` query parameter: `default` when absent, else between 1 and `max`.
fn page_limit(given: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    let limit = given.unwrap_or(default);
    if limit == 0 || limit > max {
        return Err(ApiError::invalid(
            Some("limit"),
            format!("must be between 1 and {max}"),
        ));
    }
    Ok(limit)
}

/// A JSON body parsed inside a handler (for one that must answer with an id even then).
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the request body is not what this endpoint takes: {e}"),
        )
    })
}
