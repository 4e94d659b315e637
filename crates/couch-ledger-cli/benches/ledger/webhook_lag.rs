//! `BENCH_WEBHOOK=1`: `p9`'s service is given `--webhook-url` pointing at a receiver in the
//! bench process, as a shop's endpoint would be. The receiver answers 200 at once, checks each
//! delivery's signature (docs/EVENTS.md, "Webhooks"), and measures the lag from each
//! `transfer.done`'s decision (its `time`) to its arrival. After the rounds it waits until every
//! transfer of the HTTP side has come: a bad signature or a missing event fails the bench.
//! `p9` of the same run is the service's throughput with deliveries on.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context as _, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use tokio::sync::watch;

use crate::rounds::quantile;

/// The header with the signature: `t={unix seconds},v1={hex HMAC-SHA256 of "{seconds}.{body}"}`.
const SIGNATURE_HEADER: &str = "couch-ledger-signature";
/// A signature whose `t` is further than this from the receiver's clock counts as bad (a replay
/// window of a few minutes, as docs/EVENTS.md asks of a receiver).
const REPLAY_WINDOW_S: i64 = 300;
/// The wait for the last events gives up after this long without a new `transfer.done`: the
/// service delivers one event at a time, so the catch-up after the rounds grows with the scale,
/// but a stalled delivery never comes back by itself.
const STALL_S: u64 = 60;
/// `serve` refuses a shorter secret.
const SECRET_MIN_BYTES: usize = 16;

/// Whether the receiver runs (`BENCH_WEBHOOK=1`).
pub fn wanted() -> bool {
    std::env::var("BENCH_WEBHOOK").is_ok_and(|v| v == "1")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// What the receiver has seen.
#[derive(Default)]
struct Tally {
    deliveries: usize,
    signatures_ok: usize,
    signatures_bad: usize,
    /// The transfers whose `transfer.done` came; a redelivery (the same event again, at least
    /// once) counts once.
    done: HashSet<String>,
    /// For each transfer's first `transfer.done`: its arrival − its `time`, in ms.
    lags_ms: Vec<f64>,
}

impl Tally {
    /// One delivery; only a correctly signed body's event is taken in.
    fn record(&mut self, signed: bool, event: Option<&Value>, arrived_ms: i64) {
        self.deliveries += 1;
        if !signed {
            self.signatures_bad += 1;
            return;
        }
        self.signatures_ok += 1;
        let Some(event) = event.filter(|e| e["type"] == "transfer.done") else {
            return;
        };
        // Without an id or a time it never counts, so it shows as a missing transfer.
        if let (Some(id), Some(time)) = (event["data"]["id"].as_str(), event["time"].as_i64()) {
            if self.done.insert(id.to_owned()) {
                self.lags_ms.push((arrived_ms - time) as f64);
            }
        }
    }
}

/// What the receiver's handler shares with the bench.
struct Receiver {
    secret: Vec<u8>,
    tally: Mutex<Tally>,
    /// How many transfers' `transfer.done` have come: what the wait after the rounds watches.
    transfers_done: watch::Sender<usize>,
}

/// The receiver, listening; its server stopped and its secret file removed when dropped.
pub struct WebhookLag {
    receiver: Arc<Receiver>,
    url: String,
    secret_file: PathBuf,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl WebhookLag {
    /// The receiver on a free loopback port with a fresh secret, when `BENCH_WEBHOOK=1`.
    pub async fn start_if_wanted() -> Result<Option<WebhookLag>> {
        if !wanted() {
            return Ok(None);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("listen for the webhook")?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let secret = uuid::Uuid::new_v4().simple().to_string().into_bytes();
        assert!(secret.len() >= SECRET_MIN_BYTES);
        let secret_file = std::env::temp_dir().join(format!(
            "couch-ledger-bench-webhook-{:016x}.secret",
            fastrand::u64(..)
        ));
        write_secret(&secret_file, &secret)?;
        let receiver = Arc::new(Receiver {
            secret,
            tally: Mutex::default(),
            transfers_done: watch::channel(0).0,
        });
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(receiver.clone());
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Some(WebhookLag {
            receiver,
            url,
            secret_file,
            server,
        }))
    }

    /// The flags that make `serve` deliver here.
    pub fn serve_args(&self) -> Vec<OsString> {
        vec![
            "--webhook-url".into(),
            self.url.clone().into(),
            "--webhook-secret-file".into(),
            self.secret_file.clone().into(),
        ]
    }

    /// Waits until each of `expected` (transfer ids) has its `transfer.done`, prints the
    /// deliveries and the lag, and fails on a bad signature or a transfer whose event never came.
    pub async fn finish(self, expected: &[String]) -> Result<()> {
        self.wait_for(expected.len()).await;
        let tally = self.receiver.tally.lock().expect("lock");
        let missing = expected
            .iter()
            .filter(|id| !tally.done.contains(*id))
            .count();
        eprintln!(
            "  p9 webhook: {} deliveries ({} transfer.done of {} transfers), signatures {} ok / \
             {} bad, lag from the decision {}",
            tally.deliveries,
            expected.len() - missing,
            expected.len(),
            tally.signatures_ok,
            tally.signatures_bad,
            lag_summary(&tally.lags_ms)
        );
        ensure!(
            tally.signatures_bad == 0,
            "p9 webhook: {} deliveries with a bad signature",
            tally.signatures_bad
        );
        ensure!(
            missing == 0,
            "p9 webhook: no transfer.done for {missing} of {} transfers ({STALL_S} s after the \
             last one came)",
            expected.len()
        );
        Ok(())
    }

    /// Until `count` transfers' `transfer.done` have come, or none came for `STALL_S`.
    async fn wait_for(&self, count: usize) {
        let mut done = self.receiver.transfers_done.subscribe();
        while *done.borrow_and_update() < count {
            let next = tokio::time::timeout(Duration::from_secs(STALL_S), done.changed()).await;
            if !matches!(next, Ok(Ok(()))) {
                return;
            }
        }
    }
}

impl Drop for WebhookLag {
    fn drop(&mut self) {
        self.server.abort();
        if let Err(e) = std::fs::remove_file(&self.secret_file) {
            eprintln!("  p9 webhook: removing {}: {e}", self.secret_file.display());
        }
    }
}

/// The secret in a new file only this user can read, as `--webhook-secret-file` takes it.
fn write_secret(path: &Path, secret: &[u8]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(secret)
        .with_context(|| format!("write {}", path.display()))
}

/// One delivery: its signature checked, then counted. The answer is 200 even to a bad
/// signature, so that the service goes on with the next event instead of retrying this one
/// for ever: the bench counts it and fails at the end.
async fn receive(
    State(receiver): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let arrived_ms = now_ms();
    let signed = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|s| signature_ok(&receiver.secret, s, &body, arrived_ms / 1000));
    let event = serde_json::from_slice::<Value>(&body).ok();
    let mut tally = receiver.tally.lock().expect("lock");
    tally.record(signed, event.as_ref(), arrived_ms);
    // Under the lock, so that two deliveries at once never set the count back.
    receiver.transfers_done.send_replace(tally.done.len());
    StatusCode::OK
}

/// Whether `header` (`t=SECONDS,v1=HEX`) signs `body` with `secret`: HEX is the HMAC-SHA256
/// of `SECONDS.BODY` (compared in constant time), and SECONDS is within the replay window of
/// `now_s`.
fn signature_ok(secret: &[u8], header: &str, body: &[u8], now_s: i64) -> bool {
    let Some((t, v1)) = header.split_once(',') else {
        return false;
    };
    let (Some(seconds), Some(hex)) = (t.strip_prefix("t="), v1.strip_prefix("v1=")) else {
        return false;
    };
    let (Ok(sent_s), Some(sent_mac)) = (seconds.parse::<i64>(), decode_hex(hex)) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(seconds.as_bytes());
    mac.update(b".");
    mac.update(body);
    (sent_s - now_s).abs() <= REPLAY_WINDOW_S && mac.verify_slice(&sent_mac).is_ok()
}

/// Lowercase or uppercase hex digits, two a byte.
fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

/// `p50 X ms, p99 Y ms, max Z ms` of the lags.
fn lag_summary(lags_ms: &[f64]) -> String {
    if lags_ms.is_empty() {
        return "not measured (no transfer.done came)".to_owned();
    }
    let max = lags_ms.iter().copied().fold(f64::MIN, f64::max);
    format!(
        "p50 {:.0} ms, p99 {:.0} ms, max {max:.0} ms",
        quantile(lags_ms, 0.50),
        quantile(lags_ms, 0.99)
    )
}
