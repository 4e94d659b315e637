//! A local CouchDB-protocol server for the demo, the tests and the benchmarks.
//!
//! Starts `pouchdb-server` (pinned in `testserver/package.json` with its lock file, installed
//! with `npm ci` the first time) on a free loopback port with a temporary data directory. The
//! server runs in a Node process that exits when its standard input closes, so it never
//! outlives the program that started it, even one killed with SIGKILL.
//!
//! This is a development tool, not a production server: point the library at Apache CouchDB
//! (or Cloudant) with a URL for real money.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a fresh server may take to answer its first request.
const START_TIMEOUT_MS: u64 = 60_000;
/// How long `npm ci` may take on a slow registry.
const INSTALL_TIMEOUT_MS: u64 = 600_000;

/// A running pouchdb-server on 127.0.0.1. Stopped (and its data removed) on drop.
pub struct DevServer {
    port: u16,
    data_dir: PathBuf,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    keep_data: bool,
}

impl std::fmt::Debug for DevServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevServer")
            .field("url", &self.url())
            .field("pid", &self.pid())
            .finish()
    }
}

/// The directory holding `testserver/package.json`: `COUCH_LEDGER_TESTSERVER_DIR`, else the
/// source tree this crate was built from.
pub fn testserver_dir() -> PathBuf {
    std::env::var_os("COUCH_LEDGER_TESTSERVER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("testserver"))
}

/// Installs the pinned pouchdb-server with `npm ci` unless it is installed. Safe to call from
/// several processes at once (a file lock serialises the install).
///
/// # Errors
///
/// npm is missing or the install failed.
pub fn ensure_installed() -> Result<PathBuf> {
    let dir = testserver_dir();
    let entry = dir.join("node_modules/pouchdb-server/lib/index.js");
    if entry.exists() {
        return Ok(dir);
    }
    let lock_path = dir.join(".install.lock");
    let lock = std::fs::File::create(&lock_path)
        .map_err(|e| Error::config(format!("cannot write {}: {e}", lock_path.display())))?;
    lock.lock()
        .map_err(|e| Error::config(format!("cannot lock {}: {e}", lock_path.display())))?;
    if entry.exists() {
        return Ok(dir);
    }
    eprintln!(
        "couch-ledger: installing the local test server (npm ci in {}), once…",
        dir.display()
    );
    let mut child = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            Error::config(format!(
                "cannot run npm ({e}): install Node.js and npm, or set COUCHDB_URL to a CouchDB"
            ))
        })?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| Error::config(e.to_string()))? {
            if !status.success() {
                return Err(Error::config(format!("npm ci failed ({status})")));
            }
            break;
        }
        if started.elapsed() > Duration::from_millis(INSTALL_TIMEOUT_MS) {
            let _ = child.kill();
            return Err(Error::config("npm ci did not finish in time"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !entry.exists() {
        return Err(Error::config(
            "npm ci finished but pouchdb-server is missing",
        ));
    }
    Ok(dir)
}

impl DevServer {
    /// Installs (if needed) and starts a server on a free loopback port with an empty data
    /// directory, and waits until it answers.
    ///
    /// # Errors
    ///
    /// Node.js/npm missing, the install failed, or the server did not come up in time.
    pub fn start() -> Result<DevServer> {
        let dir = ensure_installed()?;
        remove_stale_data_dirs();
        let data_dir = std::env::temp_dir().join(format!(
            "couch-ledger-server-{}-{:016x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&data_dir)
            .map_err(|e| Error::config(format!("{}: {e}", data_dir.display())))?;
        let mut last_error = None;
        // A port found free may be taken before the server binds it: try a few.
        for _ in 0..3 {
            let port = free_port()?;
            let mut server = DevServer {
                port,
                data_dir: data_dir.clone(),
                child: None,
                stdin: None,
                keep_data: false,
            };
            match server.spawn(&dir) {
                Ok(()) => return Ok(server),
                Err(e) => {
                    server.keep_data = true; // the next try reuses the directory
                    last_error = Some(e);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&data_dir);
        Err(last_error.expect("at least one try"))
    }

    fn spawn(&mut self, dir: &Path) -> Result<()> {
        let config = self.data_dir.join("config.json");
        let log = self.data_dir.join("couchdb.log");
        let settings = serde_json::json!({"log": {"level": "error", "file": log}});
        std::fs::write(&config, settings.to_string())
            .map_err(|e| Error::config(format!("{}: {e}", config.display())))?;
        let output = std::fs::File::create(self.data_dir.join("server.out"))
            .map_err(|e| Error::config(e.to_string()))?;
        let mut child = Command::new("node")
            .arg(dir.join("serve.js"))
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(&self.data_dir)
            .arg("--config")
            .arg(&config)
            .arg("--no-stdout-logs")
            .current_dir(&self.data_dir)
            .stdin(Stdio::piped())
            .stdout(
                output
                    .try_clone()
                    .map_err(|e| Error::config(e.to_string()))?,
            )
            .stderr(output)
            .spawn()
            .map_err(|e| {
                Error::config(format!(
                    "cannot run node ({e}): install Node.js, or set COUCHDB_URL to a CouchDB"
                ))
            })?;
        self.stdin = child.stdin.take();
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let out = std::fs::read_to_string(self.data_dir.join("server.out"))
                        .unwrap_or_default();
                    let tail: String = out.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                    self.child = None;
                    return Err(Error::config(format!(
                        "pouchdb-server exited at start ({status}): {tail}"
                    )));
                }
            }
            if answers(addr) {
                return Ok(());
            }
            if started.elapsed() > Duration::from_millis(START_TIMEOUT_MS) {
                self.stop();
                return Err(Error::config("pouchdb-server did not answer in time"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL, as a crash would, keeping its data directory.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.stdin = None;
    }

    /// Starts the server again on the same port and data directory (after [`DevServer::kill`]).
    ///
    /// # Errors
    ///
    /// It did not come up in time.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let dir = testserver_dir();
        // The old process's port may linger briefly; spawn retries until it binds.
        let started = Instant::now();
        loop {
            match self.spawn(&dir) {
                Ok(()) => return Ok(()),
                Err(e) if started.elapsed() < Duration::from_secs(20) => {
                    tracing::debug!("restart: {e}; trying again");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn stop(&mut self) {
        self.kill();
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.stop();
        if !self.keep_data {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

/// Data directories of servers whose starting process is gone (a process that exits without
/// dropping its `DevServer`, like a test binary holding one in a static).
fn remove_stale_data_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix("couch-ledger-server-"))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next() else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| Error::config(format!("no free loopback port: {e}")))?;
    Ok(listener
        .local_addr()
        .map_err(|e| Error::config(e.to_string()))?
        .port())
}

/// Whether a CouchDB-protocol server answers `GET /` at `addr` with a 200 and a JSON body.
fn answers(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut reply = Vec::new();
    let _ = stream.take(4096).read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200")
}

/// Whether something answers like CouchDB at `url` (plain http on a host:port), within about a
/// second. Used by the demo to decide whether to start its own server.
pub fn url_answers(url: &str) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return false;
    };
    if parsed.scheme() != "http" {
        return true; // https: let the real client find out
    }
    let Some(host) = parsed.host_str() else {
        return false;
    };
    let port = parsed.port_or_known_default().unwrap_or(5984);
    let Ok(addrs) = std::net::ToSocketAddrs::to_socket_addrs(&(host, port)) else {
        return false;
    };
    addrs
        .into_iter()
        .any(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok())
}
