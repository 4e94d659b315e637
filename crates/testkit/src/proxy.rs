//! A TCP fault proxy between the client and the real server, on loopback.
//!
//! It forwards bytes both ways and, per connection and at random (seeded, so a failing run can
//! be replayed), injects faults a real server will not produce on demand:
//! - `refuse`: the connection is reset before anything is forwarded;
//! - `reset_after_send`: the request reaches the server, then the connection is reset before
//!   the reply reaches the client — the client cannot know whether its write landed;
//! - `delay`: the reply is held back for `delay_ms`.
//!
//! Probabilities are in per-mille. Every fault injected is counted.
//!
//! [`FaultProxy::start_http`] decides per HTTP request instead of per connection (a pooled
//! keep-alive connection carries many requests, so per-connection faults would hit only the
//! first), and adds the faults that need to see a request's boundaries: a `503` or `429`
//! answered in the server's place, a garbage body after the server processed the request, and
//! a reply swallowed so the client waits until its own timeout.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// Fault probabilities (per mille) and the delay.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub refuse_permille: u32,
    pub reset_after_send_permille: u32,
    pub delay_permille: u32,
    pub delay_ms: u64,
}

/// Per-request fault probabilities (per mille) for [`FaultProxy::start_http`].
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpFaults {
    /// The connection is reset after the request was read, before it is forwarded.
    pub refuse_permille: u32,
    /// `503 Service Unavailable` (with `Retry-After: 0`) answered in the server's place.
    pub unavailable_permille: u32,
    /// `429 Too Many Requests` (with `Retry-After: 1`) answered in the server's place.
    pub too_many_permille: u32,
    /// Forwarded; the connection is reset as the reply starts (the request landed).
    pub reset_after_send_permille: u32,
    /// Forwarded; the reply is replaced with a `200` whose body is not JSON (it landed).
    pub garbage_after_send_permille: u32,
    /// Forwarded; the reply is swallowed and the connection held open, unanswered, until the
    /// client gives up (its request timeout).
    pub drop_after_send_permille: u32,
    /// The reply is held back for `delay_ms`.
    pub delay_permille: u32,
    pub delay_ms: u64,
}

/// Faults injected so far.
#[derive(Debug, Default)]
pub struct Counters {
    pub connections: AtomicU64,
    /// Requests seen ([`FaultProxy::start_http`] only).
    pub requests: AtomicU64,
    pub refused: AtomicU64,
    pub reset_after_send: AtomicU64,
    pub delayed: AtomicU64,
    pub unavailable: AtomicU64,
    pub too_many: AtomicU64,
    pub garbage_after_send: AtomicU64,
    pub dropped_after_send: AtomicU64,
}

impl Counters {
    pub fn total_faults(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
            + self.reset_after_send.load(Ordering::Relaxed)
            + self.delayed.load(Ordering::Relaxed)
            + self.unavailable.load(Ordering::Relaxed)
            + self.too_many.load(Ordering::Relaxed)
            + self.garbage_after_send.load(Ordering::Relaxed)
            + self.dropped_after_send.load(Ordering::Relaxed)
    }

    /// `name=count` for every fault kind, for a test's report.
    pub fn summary(&self) -> String {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "requests={} connections={} refused={} unavailable_503={} too_many_429={} reset_after_send={} garbage_after_send={} dropped_after_send={} delayed={}",
            l(&self.requests),
            l(&self.connections),
            l(&self.refused),
            l(&self.unavailable),
            l(&self.too_many),
            l(&self.reset_after_send),
            l(&self.garbage_after_send),
            l(&self.dropped_after_send),
            l(&self.delayed),
        )
    }
}

/// A running proxy; stops accepting when dropped.
pub struct FaultProxy {
    pub addr: SocketAddr,
    faults: Arc<Mutex<Faults>>,
    http_faults: Arc<Mutex<HttpFaults>>,
    pub counters: Arc<Counters>,
    stopped: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 in front of `upstream` (a loopback address).
    pub async fn start(upstream: SocketAddr, faults: Faults, seed: u64) -> FaultProxy {
        let faults = Arc::new(Mutex::new(faults));
        let counters = Arc::new(Counters::default());
        let stopped = Arc::new(AtomicBool::new(false));
        let mut rng = fastrand::Rng::with_seed(seed);
        let on_connection = {
            let (faults, counters) = (faults.clone(), counters.clone());
            move |client: TcpStream| {
                let f = *faults.lock().unwrap();
                let (roll_refuse, roll_reset, roll_delay) =
                    (rng.u32(0..1000), rng.u32(0..1000), rng.u32(0..1000));
                let counters = counters.clone();
                tokio::spawn(async move {
                    if roll_refuse < f.refuse_permille {
                        counters.refused.fetch_add(1, Ordering::Relaxed);
                        reset(client);
                        return;
                    }
                    let reset_after = roll_reset < f.reset_after_send_permille;
                    let delay = (roll_delay < f.delay_permille).then_some(f.delay_ms);
                    let _ = pipe(client, upstream, reset_after, delay, &counters).await;
                });
            }
        };
        let (addr, task) = listen(upstream, &counters, &stopped, on_connection).await;
        FaultProxy {
            addr,
            faults,
            http_faults: Arc::new(Mutex::new(HttpFaults::default())),
            counters,
            stopped,
            task,
        }
    }

    /// Starts a proxy on 127.0.0.1 in front of `upstream` that decides its faults per HTTP
    /// request (see [`HttpFaults`]).
    pub async fn start_http(upstream: SocketAddr, faults: HttpFaults, seed: u64) -> FaultProxy {
        let http_faults = Arc::new(Mutex::new(faults));
        let counters = Arc::new(Counters::default());
        let stopped = Arc::new(AtomicBool::new(false));
        let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
        let on_connection = {
            let (http_faults, counters) = (http_faults.clone(), counters.clone());
            move |client: TcpStream| {
                let (faults, counters, rng) = (http_faults.clone(), counters.clone(), rng.clone());
                tokio::spawn(async move {
                    let _ = serve_http(client, upstream, faults, rng, counters).await;
                });
            }
        };
        let (addr, task) = listen(upstream, &counters, &stopped, on_connection).await;
        FaultProxy {
            addr,
            faults: Arc::new(Mutex::new(Faults::default())),
            http_faults,
            counters,
            stopped,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes the fault mix for new connections.
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().unwrap() = faults;
    }

    /// Changes the per-request fault mix of a [`FaultProxy::start_http`] proxy, from the next
    /// request on.
    pub fn set_http_faults(&self, faults: HttpFaults) {
        *self.http_faults.lock().unwrap() = faults;
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

/// Listens on 127.0.0.1 in front of `upstream` (a loopback address) and, until `stopped`,
/// counts each connection and hands it to `on_connection`; the address and the accept task.
async fn listen(
    upstream: SocketAddr,
    counters: &Arc<Counters>,
    stopped: &Arc<AtomicBool>,
    mut on_connection: impl FnMut(TcpStream) + Send + 'static,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    assert!(
        upstream.ip().is_loopback(),
        "fault tests target loopback only"
    );
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (counters, stopped) = (counters.clone(), stopped.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                break;
            };
            if stopped.load(Ordering::Relaxed) {
                break;
            }
            counters.connections.fetch_add(1, Ordering::Relaxed);
            on_connection(client);
        }
    });
    (addr, task)
}

/// Closes with RST rather than FIN, as a crashed peer or a broken network would.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn pipe(
    client: TcpStream,
    upstream: SocketAddr,
    reset_after_send: bool,
    delay_ms: Option<u64>,
    counters: &Counters,
) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let upload = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = cr.read(&mut buf).await?;
            if n == 0 {
                let _ = sw.shutdown().await;
                return Ok::<_, std::io::Error>(());
            }
            sw.write_all(&buf[..n]).await?;
        }
    };
    let download = async {
        let mut buf = vec![0u8; 16 * 1024];
        let mut first = true;
        loop {
            let n = sr.read(&mut buf).await?;
            if n == 0 {
                let _ = cw.shutdown().await;
                return Ok::<_, std::io::Error>(None);
            }
            if first {
                first = false;
                if reset_after_send {
                    // The server has processed the request and is answering: cut the client off
                    // now, so it cannot tell whether its request landed.
                    counters.reset_after_send.fetch_add(1, Ordering::Relaxed);
                    return Ok(Some(()));
                }
                if let Some(ms) = delay_ms {
                    counters.delayed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
            cw.write_all(&buf[..n]).await?;
        }
    };
    let cut = tokio::select! {
        r = upload => { r?; false }
        r = download => r?.is_some(),
    };
    if cut {
        let client = cr
            .reunite(cw)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        reset(client);
    }
    Ok(())
}

// ---- per-request faults ---------------------------------------------------------------------

/// The most bytes of one request or reply head.
const HEAD_BYTES_MAX: usize = 64 * 1024;

/// Reads an HTTP head (up to and including the blank line); `None` at a clean end of stream.
async fn read_head<R: AsyncBufReadExt + Unpin>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let n = r.read_until(b'\n', &mut head).await?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        if head.ends_with(b"\r\n\r\n") || head == b"\r\n" {
            return Ok(Some(head));
        }
        if head.len() > HEAD_BYTES_MAX {
            return Err(std::io::Error::other("HTTP head too long"));
        }
    }
}

/// A header's value (case-insensitive name), from a head.
fn header(head: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    text.lines().skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

fn content_length(head: &[u8]) -> Option<usize> {
    header(head, "content-length").and_then(|v| v.parse().ok())
}

/// Reads one reply body (framed by Content-Length, chunked, or to the end of the stream),
/// writing its bytes to `out` as they come (or dropping them); `true` when the stream ended
/// with it.
async fn copy_body<R, W>(
    r: &mut R,
    head: &[u8],
    bodiless: bool,
    mut out: Option<&mut W>,
) -> std::io::Result<bool>
where
    R: AsyncBufReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    if bodiless {
        return Ok(false);
    }
    let chunked = header(head, "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let mut line = Vec::new();
            r.read_until(b'\n', &mut line).await?;
            if line.is_empty() {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if let Some(w) = out.as_mut() {
                w.write_all(&line).await?;
            }
            let size_text = String::from_utf8_lossy(&line);
            let size = usize::from_str_radix(size_text.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other("bad chunk size"))?;
            if size == 0 {
                // Trailers, then the blank line.
                loop {
                    let mut t = Vec::new();
                    r.read_until(b'\n', &mut t).await?;
                    if let Some(w) = out.as_mut() {
                        w.write_all(&t).await?;
                    }
                    if t == b"\r\n" || t.is_empty() {
                        return Ok(false);
                    }
                }
            }
            let mut chunk = vec![0u8; size + 2];
            r.read_exact(&mut chunk).await?;
            if let Some(w) = out.as_mut() {
                w.write_all(&chunk).await?;
            }
        }
    }
    let mut buf = vec![0u8; 16 * 1024];
    if let Some(len) = content_length(head) {
        let mut left = len;
        while left > 0 {
            let n = r.read(&mut buf[..left.min(16 * 1024)]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if let Some(w) = out.as_mut() {
                w.write_all(&buf[..n]).await?;
            }
            left -= n;
        }
        return Ok(false);
    }
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(true);
        }
        if let Some(w) = out.as_mut() {
            w.write_all(&buf[..n]).await?;
        }
    }
}

fn synthetic(status: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A kept-alive connection to the server: its buffered reading half and its writing half.
type Upstream = (BufReader<OwnedReadHalf>, OwnedWriteHalf);

/// The faults rolled for one request.
#[derive(Debug, Clone, Copy)]
struct Rolled {
    refuse: bool,
    unavailable: bool,
    too_many: bool,
    reset_after_send: bool,
    garbage_after_send: bool,
    drop_after_send: bool,
    /// The delay to hold the reply back by, when one was rolled.
    delay_ms: Option<u64>,
}

/// One client connection, request by request.
async fn serve_http(
    client: TcpStream,
    upstream: SocketAddr,
    faults: Arc<Mutex<HttpFaults>>,
    rng: Arc<Mutex<fastrand::Rng>>,
    counters: Arc<Counters>,
) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let (cr, mut cw) = client.into_split();
    let mut cr = BufReader::new(cr);
    let mut server: Option<Upstream> = None;
    loop {
        let Some((head, request)) = read_request(&mut cr).await? else {
            return Ok(());
        };
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let rolled = roll_faults(&faults, &rng);
        if rolled.refuse {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            return reset_client(cr, cw);
        }
        if let Some(reply) = synthetic_fault(rolled, &counters) {
            cw.write_all(&reply).await?;
            continue;
        }
        let Some(reply_head) = forward(&mut server, upstream, &request).await? else {
            return Ok(());
        };
        if rolled.reset_after_send {
            // The server processed the request and is answering: cut the client off now, so
            // it cannot tell whether its request landed.
            counters.reset_after_send.fetch_add(1, Ordering::Relaxed);
            return reset_client(cr, cw);
        }
        let bodiless = bodiless(&head, &reply_head);
        let go_on = if rolled.garbage_after_send || rolled.drop_after_send {
            spoil_reply(
                &mut server,
                &mut cr,
                &mut cw,
                &reply_head,
                bodiless,
                rolled.drop_after_send,
                &counters,
            )
            .await?
        } else {
            let (sr, _) = server.as_mut().expect("connected");
            relay_reply(
                sr,
                &mut cw,
                &head,
                &reply_head,
                bodiless,
                rolled.delay_ms,
                &counters,
            )
            .await?
        };
        if !go_on {
            return Ok(());
        }
    }
}

/// Reads one request from the client: its head, and the head with its body (the bytes to
/// forward); `None` at a clean end of stream.
async fn read_request(
    cr: &mut BufReader<OwnedReadHalf>,
) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let Some(head) = read_head(cr).await? else {
        return Ok(None);
    };
    let mut request = head.clone();
    if let Some(len) = content_length(&head) {
        let mut body = vec![0u8; len];
        cr.read_exact(&mut body).await?;
        request.extend_from_slice(&body);
    }
    Ok(Some((head, request)))
}

/// Rolls every fault of the current mix for one request, always in the same order, so a seed
/// replays the same run.
fn roll_faults(faults: &Mutex<HttpFaults>, rng: &Mutex<fastrand::Rng>) -> Rolled {
    let f = *faults.lock().unwrap();
    let mut r = rng.lock().unwrap();
    let mut roll = |permille: u32| r.u32(0..1000) < permille;
    Rolled {
        refuse: roll(f.refuse_permille),
        unavailable: roll(f.unavailable_permille),
        too_many: roll(f.too_many_permille),
        reset_after_send: roll(f.reset_after_send_permille),
        garbage_after_send: roll(f.garbage_after_send_permille),
        drop_after_send: roll(f.drop_after_send_permille),
        delay_ms: roll(f.delay_permille).then_some(f.delay_ms),
    }
}

/// Resets the client's connection (see [`reset`]).
fn reset_client(cr: BufReader<OwnedReadHalf>, cw: OwnedWriteHalf) -> std::io::Result<()> {
    let client = cr
        .into_inner()
        .reunite(cw)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    reset(client);
    Ok(())
}

/// The `503` or `429` to answer in the server's place, when one was rolled (`503` first).
fn synthetic_fault(rolled: Rolled, counters: &Counters) -> Option<Vec<u8>> {
    if rolled.unavailable {
        counters.unavailable.fetch_add(1, Ordering::Relaxed);
        Some(synthetic(
            "503 Service Unavailable",
            "Retry-After: 0\r\n",
            r#"{"error":"service_unavailable","reason":"fault proxy"}"#,
        ))
    } else if rolled.too_many {
        counters.too_many.fetch_add(1, Ordering::Relaxed);
        Some(synthetic(
            "429 Too Many Requests",
            "Retry-After: 1\r\n",
            r#"{"error":"too_many_requests","reason":"fault proxy"}"#,
        ))
    } else {
        None
    }
}

/// Sends the request to the server and reads its reply's head; `None` when the server closed
/// without answering.
async fn forward(
    server: &mut Option<Upstream>,
    upstream: SocketAddr,
    request: &[u8],
) -> std::io::Result<Option<Vec<u8>>> {
    // A kept-alive upstream connection the server closed while idle is not a fault of ours:
    // send the request again on a fresh one (the server never saw it).
    for _ in 0..2 {
        let reused = server.is_some();
        if server.is_none() {
            let s = TcpStream::connect(upstream).await?;
            let _ = s.set_nodelay(true);
            let (sr, sw) = s.into_split();
            *server = Some((BufReader::new(sr), sw));
        }
        let (sr, sw) = server.as_mut().expect("connected");
        let answer = match sw.write_all(request).await {
            Ok(()) => read_head(sr).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(Some(h)) => return Ok(Some(h)),
            Ok(None) | Err(_) if reused => *server = None,
            Ok(None) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Whether the reply to this request has no body: the answer to a `HEAD`, a `204` or a `304`.
fn bodiless(request_head: &[u8], reply_head: &[u8]) -> bool {
    let status_line = String::from_utf8_lossy(reply_head);
    request_head.starts_with(b"HEAD ")
        || status_line.starts_with("HTTP/1.1 204")
        || status_line.starts_with("HTTP/1.1 304")
}

/// Reads and drops the server's reply, then answers garbage in its place or, when `dropped`,
/// holds the client's connection unanswered until the client gives up on it; `false` when the
/// connection is done.
async fn spoil_reply(
    server: &mut Option<Upstream>,
    cr: &mut BufReader<OwnedReadHalf>,
    cw: &mut OwnedWriteHalf,
    reply_head: &[u8],
    bodiless: bool,
    dropped: bool,
    counters: &Counters,
) -> std::io::Result<bool> {
    let (sr, _) = server.as_mut().expect("connected");
    let ended = copy_body::<_, OwnedWriteHalf>(sr, reply_head, bodiless, None).await?;
    if ended {
        *server = None;
    }
    if dropped {
        counters.dropped_after_send.fetch_add(1, Ordering::Relaxed);
        let mut sink = Vec::new();
        let _ = cr.read_to_end(&mut sink).await;
        return Ok(false);
    }
    counters.garbage_after_send.fetch_add(1, Ordering::Relaxed);
    let reply = synthetic("200 OK", "", "<html>proxy garbage</html>");
    cw.write_all(&reply).await?;
    Ok(true)
}

/// Passes the server's reply on to the client, held back by `delay_ms` when given; `false`
/// when the connection is done (the server's stream ended, or either side asked to close it).
async fn relay_reply(
    sr: &mut BufReader<OwnedReadHalf>,
    cw: &mut OwnedWriteHalf,
    request_head: &[u8],
    reply_head: &[u8],
    bodiless: bool,
    delay_ms: Option<u64>,
    counters: &Counters,
) -> std::io::Result<bool> {
    if let Some(ms) = delay_ms {
        counters.delayed.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    cw.write_all(reply_head).await?;
    let ended = copy_body(sr, reply_head, bodiless, Some(&mut *cw)).await?;
    let close = |h: &[u8]| header(h, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    if ended || close(reply_head) || close(request_head) {
        let _ = cw.shutdown().await;
        return Ok(false);
    }
    Ok(true)
}
