//! Webhooks (`serve --webhook-url URL --webhook-secret-file F`): every event of the ledger
//! POSTed to one URL, in order, at least once, each body signed (docs/EVENTS.md, "Webhooks").
//!
//! One task per service: it reads the events after its cursor, delivers each until the
//! endpoint answers 2xx (retrying with a doubling wait up to `--webhook-retry-max`, never
//! skipping one), and keeps its cursor in `_local/` of the ledger's database after each page
//! of events, each second within a page, and at a stop, so a restart goes on where the last one
//! stopped: after a crash at most the last second's or page's events come again (the same
//! `id`s), after a stop only the one in flight. One write per delivery would tie delivery to
//! the database's write latency under load (about 40 events a second with the server busy).
//! It shares nothing with the requests but the server's connection pool: an endpoint that is
//! down slows no transfer.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use couch_ledger::{EventCursor, EventQuery, Ledger, LedgerEvent};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::events::EventBody;
use crate::cli::UsageError;

/// The header that carries the signature: `t={unix seconds},v1={hex HMAC-SHA256}`.
pub(crate) const SIGNATURE_HEADER: &str = "couch-ledger-signature";
/// The header that carries the event's id (the same on a redelivery).
pub(crate) const EVENT_ID_HEADER: &str = "couch-ledger-event-id";
/// How long one delivery may take before it counts as failed.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait after a failed delivery; it doubles up to the retry maximum.
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// How long one read of the feed waits for a new event.
const FEED_WAIT: Duration = Duration::from_secs(25);
/// Events read at once.
const PAGE: usize = 100;
/// How often the cursor is kept while a page is being delivered.
const CURSOR_KEEP_EVERY: Duration = Duration::from_secs(1);

/// The webhook's settings.
pub(crate) struct Webhook {
    url: url::Url,
    secret: SecretSlice<u8>,
    retry_max: Duration,
}

impl Webhook {
    /// From the flags; the secret is the file's content without its trailing newline.
    pub(crate) fn from_args(
        url: &str,
        secret_file: Option<&std::path::Path>,
        retry_max: Duration,
    ) -> Result<Webhook, UsageError> {
        let parsed = url::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| {
                UsageError::new(format!(
                    "--webhook-url {url:?} is not an http(s) URL, e.g. https://shop.example/hooks/ledger"
                ))
            })?;
        let Some(file) = secret_file else {
            return Err(UsageError::new(
                "--webhook-url needs --webhook-secret-file: a file holding the secret the bodies are signed with",
            ));
        };
        let text = std::fs::read_to_string(file).map_err(|e| {
            UsageError::new(format!("--webhook-secret-file {}: {e}", file.display()))
        })?;
        let secret = text.trim_end_matches(['\r', '\n']).as_bytes().to_vec();
        if secret.len() < 16 {
            return Err(UsageError::new(format!(
                "--webhook-secret-file {}: the secret must be at least 16 bytes",
                file.display()
            )));
        }
        if retry_max < FIRST_RETRY {
            return Err(UsageError::new(format!(
                "--webhook-retry-max must be at least {} ms",
                FIRST_RETRY.as_millis()
            )));
        }
        Ok(Webhook {
            url: parsed,
            secret: secret.into(),
            retry_max,
        })
    }

    /// Where the cursor is kept: one `_local` document per endpoint.
    fn cursor_doc(&self) -> String {
        let digest = Sha256::digest(self.url.as_str().as_bytes());
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("couch-ledger-webhook-{hex}")
    }
}

/// `t={seconds},v1={hex}`: HMAC-SHA256 over `{seconds}.{body}` with the secret.
pub(crate) fn signature(secret: &[u8], seconds: u64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(format!("{seconds}.{body}").as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t={seconds},v1={hex}")
}

/// The `_local` document holding where delivery is.
#[derive(Debug, Serialize, Deserialize)]
struct Delivered {
    #[serde(rename = "_rev", default, skip_serializing_if = "Option::is_none")]
    rev: Option<String>,
    url: String,
    cursor: String,
}

/// Delivers events until `stop`.
pub(crate) async fn run(ledger: Ledger, hook: Webhook, mut stop: watch::Receiver<bool>) {
    let http = match reqwest::Client::builder()
        .timeout(DELIVERY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("webhook: cannot make an HTTP client: {e}");
            return;
        }
    };
    let mut saved = loop {
        match load(&ledger, &hook).await {
            Ok(saved) => break saved,
            Err(e) => {
                tracing::warn!("webhook: reading where delivery stopped: {e:#}");
                if pause(&mut stop, hook.retry_max).await {
                    return;
                }
            }
        }
    };
    let mut after = EventCursor::parse(&saved.cursor).unwrap_or_else(|_| EventCursor::start());
    tracing::info!(url = %hook.url, after = %after, "webhook: delivering events");
    while !*stop.borrow() {
        let query = EventQuery {
            after: after.clone(),
            limit: PAGE,
            kinds: None,
            wait: Some(FEED_WAIT),
        };
        let page = tokio::select! {
            page = ledger.events(&query) => Some(page),
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(page) = page else {
            // Stopped while waiting: a keep that failed at the page's end is tried once more.
            if saved.cursor != after.to_string() {
                save(&ledger, &hook, &mut saved, &after).await;
            }
            return;
        };
        let page = match page {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("webhook: reading the events failed: {e}");
                if pause(&mut stop, hook.retry_max).await {
                    return;
                }
                continue;
            }
        };
        let mut kept_at = std::time::Instant::now();
        for event in &page.events {
            if !deliver(&http, &hook, event, &mut stop).await {
                // Stopped: what was delivered is kept, only the event in flight comes again.
                if saved.cursor != after.to_string() {
                    save(&ledger, &hook, &mut saved, &after).await;
                }
                return;
            }
            after = event.cursor.clone();
            if *stop.borrow() {
                // Stopped between two deliveries: keep where it is and end.
                save(&ledger, &hook, &mut saved, &after).await;
                return;
            }
            if kept_at.elapsed() >= CURSOR_KEEP_EVERY {
                save(&ledger, &hook, &mut saved, &after).await;
                kept_at = std::time::Instant::now();
            }
        }
        if page.events.is_empty() && page.cursor != after {
            after = page.cursor;
        }
        if saved.cursor != after.to_string() {
            save(&ledger, &hook, &mut saved, &after).await;
        }
    }
}

/// Waits `d` or until the stop; `true` when stopped.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    let stopped = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    stopped || *stop.borrow()
}

/// POSTs one event until a 2xx; `false` when the service stopped first.
async fn deliver(
    http: &reqwest::Client,
    hook: &Webhook,
    event: &LedgerEvent,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let body = serde_json::to_string(&EventBody::from(event)).unwrap_or_default();
    let mut wait = FIRST_RETRY;
    for attempt in 1u64.. {
        let seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let sent = http
            .post(hook.url.clone())
            .header("content-type", "application/json")
            .header(EVENT_ID_HEADER, &event.id)
            .header(
                SIGNATURE_HEADER,
                signature(hook.secret.expose_secret(), seconds, &body),
            )
            .body(body.clone())
            .send()
            .await;
        let failure = match sent {
            Ok(r) if r.status().is_success() => return true,
            Ok(r) => format!("answered {}", r.status()),
            Err(e) => format!("failed: {e}"),
        };
        tracing::warn!(
            id = %event.id,
            attempt,
            "webhook: delivery {failure}; again in {} ms",
            wait.as_millis()
        );
        if pause(stop, wait).await {
            return false;
        }
        wait = (wait * 2).min(hook.retry_max);
    }
    false
}

async fn load(ledger: &Ledger, hook: &Webhook) -> anyhow::Result<Delivered> {
    let found: Option<Delivered> = ledger
        .client()
        .get_local(&hook.cursor_doc())
        .await
        .context("the webhook's cursor")?;
    Ok(found.unwrap_or(Delivered {
        rev: None,
        url: hook.url.to_string(),
        cursor: EventCursor::start().to_string(),
    }))
}

/// Keeps the cursor; a failed write is logged and tried again with the next event (at worst
/// a restart delivers again what came after the last cursor kept).
async fn save(ledger: &Ledger, hook: &Webhook, saved: &mut Delivered, after: &EventCursor) {
    saved.cursor = after.to_string();
    match ledger.client().put_local(&hook.cursor_doc(), &*saved).await {
        Ok(written) => saved.rev = Some(written.rev),
        Err(e) if e.is_conflict() => {
            // Another process wrote it (two services on one endpoint): take its revision.
            if let Ok(other) = load(ledger, hook).await {
                saved.rev = other.rev;
            }
        }
        Err(e) => tracing::warn!("webhook: keeping the cursor failed: {e}"),
    }
}
