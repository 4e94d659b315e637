//! R4, network faults: workers and sweepers reach the server through a fault proxy that
//! refuses, resets, delays and garbles; then wiremock gives the replies a real server will not
//! give on demand. Every call is answered or fails with a typed error, and nothing is lost.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinSet;
use wiremock::matchers::{method, path, PathExactMatcher};
use wiremock::{Mock, MockServer, ResponseTemplate};

use couch_ledger::{Client, Ledger, RetryPolicy};

use crate::shared::{
    audit, create_accounts, eur_accounts, fresh_ledger, independent_check, raw_transfers,
    spawn_sweeper, sweep_to_rest, urlencode, Book, Dbs, Size, Tally, Terms,
};
use crate::support;
use crate::support::proxy::{FaultProxy, HttpFaults};

/// The faults the proxy injects, per mille of requests.
const FAULTS: HttpFaults = HttpFaults {
    refuse_permille: 20,
    unavailable_permille: 20,
    too_many_permille: 10,
    reset_after_send_permille: 25,
    garbage_after_send_permille: 10,
    drop_after_send_permille: 3,
    delay_permille: 30,
    delay_ms: 300,
};

/// Calls the workers made: answered, and failed with a typed error.
#[derive(Clone, Default)]
struct Calls {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

pub async fn r4(size: Size, seed: u64, tally: Arc<Tally>) {
    let started = Instant::now();
    let Some(upstream) = loopback_upstream() else {
        eprintln!("r4: SKIPPED — the test server is not on loopback, and the fault proxy only targets loopback");
        return;
    };
    let lease = Duration::from_secs(2);
    let base = support::ledger("r4").await;
    let direct = base.client().clone();
    let db = direct.database().to_owned();
    create_accounts(&base, &eur_accounts("n", 8, 50_000)).await;

    let proxy = FaultProxy::start_http(upstream, FAULTS, seed ^ 0x44).await;
    let through_proxy = || client_through(&proxy, &db);
    let book = Arc::new(Book::default());
    let stop = Arc::new(AtomicBool::new(false));
    let sweepers: Vec<_> = (0..2)
        .map(|i| {
            spawn_sweeper(
                "r4",
                fresh_ledger(&through_proxy(), lease),
                Duration::from_millis(500),
                tally.clone(),
                stop.clone(),
                seed ^ (0x4400 + i),
            )
        })
        .collect();
    let calls = Calls::default();
    let mut workers = JoinSet::new();
    for w in 0..4u64 {
        let l = fresh_ledger(&through_proxy(), lease);
        let per_worker = size.r4_transfers.div_ceil(4);
        let rng = fastrand::Rng::with_seed(seed ^ (0x4410 + w));
        let (book, tally, calls) = (book.clone(), tally.clone(), calls.clone());
        workers.spawn(r4_worker(w, l, per_worker, rng, book, tally, calls));
    }
    while let Some(r) = workers.join_next().await {
        if let Err(e) = r {
            tally.violation(format!("r4: a worker panicked: {e}"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in sweepers {
        s.await.unwrap();
    }
    // Faults off; what is left is finished directly.
    proxy.set_http_faults(HttpFaults::default());
    let injected = proxy.counters.total_faults();
    tally.faults.fetch_add(injected, Ordering::Relaxed);
    eprintln!("r4: fault proxy: {}", proxy.counters.summary());
    let rest = fresh_ledger(&direct, lease);
    sweep_to_rest("r4", &rest, &tally, 0, Duration::from_secs(120)).await;
    audit("r4", &rest, &tally).await;
    let n = independent_check("r4", &Dbs::of(&base), &book, &tally, &[]).await;
    tally.transfers.fetch_add(n, Ordering::Relaxed);
    if injected == 0 {
        tally.violation("r4: the fault proxy injected no fault");
    }
    let mocked = match first_transfer(&db).await {
        Some(transfer) => r4_wiremock(&rest, "n0", &transfer, &tally).await,
        None => {
            tally.violation("r4: no transfer document");
            0
        }
    };
    eprintln!(
        "r4: {n} transfers; {} calls answered, {} failed with a typed error; {injected} faults by the proxy, {mocked} by wiremock; {:?}",
        calls.ok.load(Ordering::Relaxed),
        calls.failed.load(Ordering::Relaxed),
        started.elapsed()
    );
}

/// The test server's loopback address that answers: `localhost` may resolve to ::1 first
/// while the server (docker-compose publishes on 127.0.0.1) listens on IPv4 only. `None` when
/// the server is not on loopback.
fn loopback_upstream() -> Option<SocketAddr> {
    let u = url::Url::parse(&support::server().url).ok()?;
    let host = u.host_str()?.to_owned();
    let port = u.port_or_known_default()?;
    std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
        .ok()?
        .filter(|a| a.ip().is_loopback())
        .find(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(2)).is_ok())
}

/// A client on `db` through the fault proxy, with the test server's credentials and retries.
fn client_through(proxy: &FaultProxy, db: &str) -> Client {
    let server = support::server();
    let mut b = Client::builder()
        .url(proxy.url())
        .database(db)
        .request_timeout(Duration::from_secs(2))
        .retry(RetryPolicy {
            retries_max: 6,
            delay_base: Duration::from_millis(20),
            delay_max: Duration::from_millis(500),
            retry_after_max: Duration::from_secs(2),
        });
    if let Some(user) = &server.user {
        b = b.basic_auth(user, server.password.clone().unwrap_or_default());
    }
    b.build().unwrap()
}

/// R4's worker `w`: `per_worker` new transfers, with retries, cancels and reversals of its own
/// transfers between them.
async fn r4_worker(
    w: u64,
    l: Ledger,
    per_worker: u64,
    mut rng: fastrand::Rng,
    book: Arc<Book>,
    tally: Arc<Tally>,
    calls: Calls,
) {
    let mut mine: Vec<(String, Terms)> = Vec::new();
    let mut n = 0u64;
    while n < per_worker {
        let r = rng.u32(0..100);
        let result = if r < 10 && !mine.is_empty() {
            let (id, terms) = mine[rng.usize(..mine.len())].clone();
            l.submit(terms.request(&id), rng.bool()).await
        } else if r < 15 && !mine.is_empty() {
            let (id, _) = mine[rng.usize(..mine.len())].clone();
            book.cancels.lock().unwrap().insert(id.clone());
            l.cancel(&id).await
        } else if r < 20 && !mine.is_empty() {
            let (id, t) = mine[rng.usize(..mine.len())].clone();
            book.ask(&format!("rev-{id}"), t.reversal(&id));
            l.reverse(&id).await
        } else {
            n += 1;
            let terms = Terms::random_eur(&mut rng, "n", 8, |rng| rng.i64(1..=8_000));
            let id = format!("r4-w{w}-{n}");
            book.ask(&id, terms.clone());
            mine.push((id.clone(), terms.clone()));
            l.submit(terms.request(&id), rng.u32(0..10) < 8).await
        };
        match result {
            Ok(o) => {
                book.ack(&o);
                calls.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tally.error("r4", &e);
                calls.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The id of the first transfer document in `db`.
async fn first_transfer(db: &str) -> Option<String> {
    raw_transfers(db).await.first().and_then(|t| {
        t["_id"]
            .as_str()
            .and_then(|id| id.strip_prefix("txn:"))
            .map(str::to_owned)
    })
}

/// The real server's reply to `GET /{db}/{id}`, byte for byte.
async fn raw_reply(db: &str, id: &str) -> Vec<u8> {
    let url = support::raw_url(&format!("{db}/{}", urlencode(id)));
    let r = support::auth(support::raw().get(url)).send().await.unwrap();
    assert!(r.status().is_success(), "GET {id}: {}", r.status());
    r.bytes().await.unwrap().to_vec()
}

/// Attempts of a read before it gives up, less one.
const MOCK_RETRIES_MAX: u32 = 4;

/// A wiremock server standing in for the real server's database `db`, and a ledger on it.
struct Mocked {
    mock: MockServer,
    db: String,
    ledger: Ledger,
}

impl Mocked {
    async fn start(db: &str) -> Mocked {
        let mock = MockServer::start().await;
        let ledger = Ledger::new(
            Client::builder()
                .url(mock.uri())
                .database(db)
                .request_timeout(Duration::from_secs(2))
                .retry(RetryPolicy {
                    retries_max: MOCK_RETRIES_MAX,
                    delay_base: Duration::from_millis(10),
                    delay_max: Duration::from_millis(100),
                    retry_after_max: Duration::from_secs(2),
                })
                .build()
                .unwrap(),
        );
        Mocked {
            mock,
            db: db.to_owned(),
            ledger,
        }
    }

    fn at(&self, id: &str) -> PathExactMatcher {
        path(format!("/{}/{}", self.db, urlencode(id)))
    }

    /// `reply` to the next GET of `id`, once.
    async fn once(&self, id: &str, reply: ResponseTemplate) {
        Mock::given(method("GET"))
            .and(self.at(id))
            .respond_with(reply)
            .up_to_n_times(1)
            .mount(&self.mock)
            .await;
    }

    /// `reply` to every GET of `id` not answered otherwise.
    async fn always(&self, id: &str, reply: ResponseTemplate) {
        Mock::given(method("GET"))
            .and(self.at(id))
            .respond_with(reply)
            .mount(&self.mock)
            .await;
    }

    /// The real server's reply to a GET of `id`, byte for byte.
    async fn real_reply(&self, id: &str) -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_raw(raw_reply(&self.db, id).await, "application/json")
    }

    /// Requests that reached wiremock so far.
    async fn arrived(&self) -> usize {
        self.mock
            .received_requests()
            .await
            .unwrap_or_default()
            .len()
    }
}

fn unavailable() -> ResponseTemplate {
    ResponseTemplate::new(503).set_body_json(json!({"error": "unavailable", "reason": "injected"}))
}

/// R4's wiremock part: the replies a real server will not give on demand — a 429 with
/// `Retry-After`, a 503, a reply slower than the client's timeout, a garbage body, a server that
/// never recovers — in front of byte-for-byte copies of the real server's replies to the
/// ledger's reads. Each read is retried to the real answer, or fails with a typed error (and the
/// next call gets the answer). Returns the fault replies wiremock sent.
async fn r4_wiremock(real: &Ledger, account: &str, transfer: &str, tally: &Tally) -> u64 {
    let mocked = Mocked::start(real.client().database()).await;
    let mut faults = account_through_faults(&mocked, real, account, tally).await;
    let seen = mocked.arrived().await;
    faults += transfer_through_garbage(&mocked, real, transfer, tally, seen).await;
    let seen = mocked.arrived().await;
    faults += never_recovers(&mocked, tally, seen).await;
    tally.faults.fetch_add(faults, Ordering::Relaxed);
    eprintln!("r4: wiremock: {faults} fault replies (429, 503, slow, garbage) in front of the real server's replies; every read retried to the real answer or failed typed");
    faults
}

/// An account read through a 429 (Retry-After: 1), a 503 and a reply slower than the timeout:
/// retried to exactly the real server's answer, the 429's wait honoured. Returns the faults.
async fn account_through_faults(
    mocked: &Mocked,
    real: &Ledger,
    account: &str,
    tally: &Tally,
) -> u64 {
    let account_id = format!("account:{account}");
    let too_many = ResponseTemplate::new(429).insert_header("Retry-After", "1");
    mocked.once(&account_id, too_many).await;
    mocked.once(&account_id, unavailable()).await;
    let slow = mocked
        .real_reply(&account_id)
        .await
        .set_delay(Duration::from_secs(6));
    mocked.once(&account_id, slow).await;
    mocked
        .always(&account_id, mocked.real_reply(&account_id).await)
        .await;
    let expected = real.account(account).await.unwrap();
    let started = Instant::now();
    match mocked.ledger.account(account).await {
        Ok(got) if got == expected => {}
        other => tally.violation(format!(
            "r4 wiremock: account read through 429/503/slow gave {other:?}, the server {expected:?}"
        )),
    }
    let n = mocked.arrived().await;
    if n != 4 || started.elapsed() < Duration::from_secs(1) {
        tally.violation(format!(
            "r4 wiremock: the account read took {n} requests (4 expected) in {:?} (Retry-After: 1 not honoured?)",
            started.elapsed()
        ));
    }
    n.saturating_sub(1) as u64 // all but the last, real reply
}

/// A transfer read answered with a garbage 200 after two 503s: a decode error (a reply that
/// cannot be understood is not blindly repeated), then the real answer. Returns the faults.
async fn transfer_through_garbage(
    mocked: &Mocked,
    real: &Ledger,
    transfer: &str,
    tally: &Tally,
    seen: usize,
) -> u64 {
    let transfer_id = format!("txn:{transfer}");
    mocked.once(&transfer_id, unavailable()).await;
    mocked.once(&transfer_id, unavailable()).await;
    let garbage =
        ResponseTemplate::new(200).set_body_raw("<html>proxy error</html>", "application/json");
    mocked.once(&transfer_id, garbage).await;
    mocked
        .always(&transfer_id, mocked.real_reply(&transfer_id).await)
        .await;
    match mocked.ledger.transfer(transfer).await {
        Err(e) if e.is_decode() => tally.error("r4", &e),
        other => tally.violation(format!(
            "r4 wiremock: a garbage body gave {other:?}, not a decode error"
        )),
    }
    let expected = real.transfer(transfer).await.unwrap();
    match mocked.ledger.transfer(transfer).await {
        Ok(got) if got == expected => {}
        other => tally.violation(format!(
            "r4 wiremock: the transfer read after the garbage gave {other:?}, the server {expected:?}"
        )),
    }
    let n = mocked.arrived().await;
    if n - seen != 4 {
        tally.violation(format!(
            "r4 wiremock: the transfer reads took {} requests (4 expected)",
            n - seen
        ));
    }
    (n - seen).saturating_sub(1) as u64
}

/// A server that never recovers: retries_max + 1 attempts, then a transient error. Returns the
/// faults.
async fn never_recovers(mocked: &Mocked, tally: &Tally, seen: usize) -> u64 {
    mocked.always("account:n1", unavailable()).await;
    match mocked.ledger.account("n1").await {
        Err(e) if e.is_transient() && e.status_code() == Some(503) => tally.error("r4", &e),
        other => tally.violation(format!(
            "r4 wiremock: a server that stays unavailable gave {other:?}, not a transient 503"
        )),
    }
    let n = mocked.arrived().await - seen;
    if n != MOCK_RETRIES_MAX as usize + 1 {
        tally.violation(format!(
            "r4 wiremock: {n} attempts at a server that stays unavailable ({} expected)",
            MOCK_RETRIES_MAX + 1
        ));
    }
    n as u64
}
