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
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Fault probabilities (per mille) and the delay.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub refuse_permille: u32,
    pub reset_after_send_permille: u32,
    pub delay_permille: u32,
    pub delay_ms: u64,
}

/// Faults injected so far.
#[derive(Debug, Default)]
pub struct Counters {
    pub connections: AtomicU64,
    pub refused: AtomicU64,
    pub reset_after_send: AtomicU64,
    pub delayed: AtomicU64,
}

impl Counters {
    pub fn total_faults(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
            + self.reset_after_send.load(Ordering::Relaxed)
            + self.delayed.load(Ordering::Relaxed)
    }
}

/// A running proxy; stops accepting when dropped.
pub struct FaultProxy {
    pub addr: SocketAddr,
    faults: Arc<Mutex<Faults>>,
    pub counters: Arc<Counters>,
    stopped: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 in front of `upstream` (a loopback address).
    pub async fn start(upstream: SocketAddr, faults: Faults, seed: u64) -> FaultProxy {
        assert!(
            upstream.ip().is_loopback(),
            "fault tests target loopback only"
        );
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let faults = Arc::new(Mutex::new(faults));
        let counters = Arc::new(Counters::default());
        let stopped = Arc::new(AtomicBool::new(false));
        let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
        let task = {
            let faults = faults.clone();
            let counters = counters.clone();
            let stopped = stopped.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        break;
                    };
                    if stopped.load(Ordering::Relaxed) {
                        break;
                    }
                    counters.connections.fetch_add(1, Ordering::Relaxed);
                    let f = *faults.lock().unwrap();
                    let (roll_refuse, roll_reset, roll_delay) = {
                        let mut r = rng.lock().unwrap();
                        (r.u32(0..1000), r.u32(0..1000), r.u32(0..1000))
                    };
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
            })
        };
        FaultProxy {
            addr,
            faults,
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
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.task.abort();
    }
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
