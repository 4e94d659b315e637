//! A local CouchDB-protocol server for the demo, the tests and the benchmarks.
//!
//! Starts `pouchdb-server` (pinned by `testserver/package.json` and its lock file, which are
//! embedded in the program) on a free loopback port with a temporary data directory
//! ([`DevServer::start`]), or on a given port with a data directory kept between runs
//! ([`DevServer::start_kept`], the `dev-server` command). The server runs in a Node process
//! that exits when its standard input closes, so it never outlives the program that started
//! it, even one killed with SIGKILL; a temporary server's process then removes its data
//! directory itself (the tests hold their server in a static, which is never dropped).
//!
//! The first start installs the server with `npm ci` into a per-user cache directory
//! (`$XDG_CACHE_HOME/couch-ledger/testserver-<hash of the embedded files>`, else
//! `~/.cache/…`), so a program built by `cargo install` runs the demo from any directory, and
//! every checkout and worktree of the same version shares one install.
//! `COUCH_LEDGER_TESTSERVER_DIR` names another directory holding an installed `testserver/`.
//!
//! This is a development tool, not a production server and not part of the library: it
//! depends on nothing of the ledger. The program (its `demo` and `dev-server` commands), the
//! tests' harness (crates/testkit) and the benchmark depend on it; each uses part of it.

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

/// The pinned server's files, embedded so the program needs no source tree.
const PACKAGE_JSON: &str = include_str!("../testserver/package.json");
const PACKAGE_LOCK: &str = include_str!("../testserver/package-lock.json");
const SERVE_JS: &str = include_str!("../testserver/serve.js");

/// Why the local server could not be installed or started (never the user's input).
#[derive(Debug)]
pub struct DevError(String);

impl fmt::Display for DevError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DevError {}

/// This module's result.
pub type Result<T, E = DevError> = std::result::Result<T, E>;

fn err(message: impl Into<String>) -> DevError {
    DevError(message.into())
}

/// How long a fresh server may take to answer its first request.
const START_TIMEOUT_MS: u64 = 60_000;
/// How long `npm ci` may take on a slow registry.
const INSTALL_TIMEOUT_MS: u64 = 600_000;
/// How often a running install says it is still at work (the first one takes a minute or two
/// and prints nothing of its own).
const INSTALL_PROGRESS_MS: u64 = 15_000;
/// The environment variable naming the data directory that `serve.js` removes when its
/// standard input closes.
const REMOVE_AT_EXIT_ENV: &str = "COUCH_LEDGER_REMOVE_AT_EXIT";

/// A running pouchdb-server on 127.0.0.1. Stopped on drop, and its data removed unless it was
/// started with [`DevServer::start_kept`].
pub struct DevServer {
    port: u16,
    data_dir: PathBuf,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    keep_data: bool,
    /// The server's own process removes the data directory when its standard input closes
    /// (a temporary server whose owner exited without dropping it).
    remove_at_exit: bool,
}

impl std::fmt::Debug for DevServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevServer")
            .field("url", &self.url())
            .field("pid", &self.pid())
            .finish()
    }
}

/// The directory of the installed server: `COUCH_LEDGER_TESTSERVER_DIR`, else the per-user
/// cache directory for these embedded files (written there when missing).
///
/// # Errors
///
/// The cache directory cannot be written.
pub fn testserver_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("COUCH_LEDGER_TESTSERVER_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let dir = cache_root().join(format!("testserver-{}", embedded_hash()));
    std::fs::create_dir_all(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    for (name, text) in [
        ("package.json", PACKAGE_JSON),
        ("package-lock.json", PACKAGE_LOCK),
        ("serve.js", SERVE_JS),
    ] {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text) {
            continue;
        }
        // Write then rename, so a concurrent reader never sees half a file.
        let partial = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&partial, text)
            .and_then(|()| std::fs::rename(&partial, &path))
            .map_err(|e| err(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(dir)
}

/// `$XDG_CACHE_HOME/couch-ledger`, else `$HOME/.cache/couch-ledger`, else the temporary
/// directory's `couch-ledger-cache`.
pub fn cache_root() -> PathBuf {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(xdg) = var("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return xdg.join("couch-ledger");
    }
    if let Some(home) = var("HOME") {
        return home.join(".cache").join("couch-ledger");
    }
    std::env::temp_dir().join("couch-ledger-cache")
}

/// The first 16 hex digits of the embedded files' SHA-256: another pinned version installs
/// beside this one instead of over it.
fn embedded_hash() -> String {
    let mut h = Sha256::new();
    for text in [PACKAGE_JSON, PACKAGE_LOCK, SERVE_JS] {
        h.update((text.len() as u64).to_le_bytes());
        h.update(text.as_bytes());
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Installs the pinned pouchdb-server with `npm ci` unless it is installed. Safe to call from
/// several processes at once (a file lock serialises the install).
///
/// # Errors
///
/// npm is missing or the install failed.
pub fn ensure_installed() -> Result<PathBuf> {
    let dir = testserver_dir()?;
    let entry = dir.join("node_modules/pouchdb-server/lib/index.js");
    if entry.exists() {
        return Ok(dir);
    }
    let lock_path = dir.join(".install.lock");
    let lock = std::fs::File::create(&lock_path)
        .map_err(|e| err(format!("cannot write {}: {e}", lock_path.display())))?;
    lock.lock()
        .map_err(|e| err(format!("cannot lock {}: {e}", lock_path.display())))?;
    if entry.exists() {
        return Ok(dir);
    }
    eprintln!(
        "couch-ledger: installing pouchdb-server (the local CouchDB-protocol server, pinned) \
         with `npm ci` into {}; only the first time, it takes a minute or two…",
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
            err(format!(
                "cannot run npm ({e}): install Node.js and npm, or set COUCHDB_URL to a CouchDB"
            ))
        })?;
    let started = Instant::now();
    let mut said = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| err(e.to_string()))? {
            if !status.success() {
                return Err(err(format!("npm ci failed ({status})")));
            }
            break;
        }
        if started.elapsed() > Duration::from_millis(INSTALL_TIMEOUT_MS) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err("npm ci did not finish in time"));
        }
        if said.elapsed() >= Duration::from_millis(INSTALL_PROGRESS_MS) {
            said = Instant::now();
            eprintln!(
                "couch-ledger: still installing pouchdb-server ({} s so far)…",
                started.elapsed().as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !entry.exists() {
        return Err(err("npm ci finished but pouchdb-server is missing"));
    }
    eprintln!(
        "couch-ledger: pouchdb-server installed in {} s",
        started.elapsed().as_secs()
    );
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
            .map_err(|e| err(format!("{}: {e}", data_dir.display())))?;
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
                remove_at_exit: true,
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

    /// Installs (if needed) and starts a server on 127.0.0.1:`port` (a free one when 0) with
    /// its data in `data_dir`, created when missing and kept when the server stops, and waits
    /// until it answers.
    ///
    /// # Errors
    ///
    /// The port is taken, the directory cannot be made, Node.js/npm missing, the install
    /// failed, or the server did not come up in time.
    pub fn start_kept(port: u16, data_dir: &Path) -> Result<DevServer> {
        let port = if port == 0 { free_port()? } else { port };
        // Said plainly here, rather than as the server's own start-up failure.
        drop(TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
            err(format!(
                "cannot listen on 127.0.0.1:{port} ({e}): is another server running there? \
                 --port picks another"
            ))
        })?);
        let dir = ensure_installed()?;
        std::fs::create_dir_all(data_dir)
            .map_err(|e| err(format!("{}: {e}", data_dir.display())))?;
        let data_dir = data_dir
            .canonicalize()
            .map_err(|e| err(format!("{}: {e}", data_dir.display())))?;
        let mut server = DevServer {
            port,
            data_dir,
            child: None,
            stdin: None,
            keep_data: true,
            remove_at_exit: false,
        };
        server.spawn(&dir)?;
        Ok(server)
    }

    /// The directory holding the server's data.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// `Some(why)` once the server's process has ended (with the last lines it wrote), `None`
    /// while it runs.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        let status = match child.try_wait() {
            Ok(Some(status)) => status.to_string(),
            Ok(None) => return None,
            Err(e) => e.to_string(),
        };
        self.child = None;
        self.stdin = None;
        let out = std::fs::read_to_string(self.data_dir.join("server.out")).unwrap_or_default();
        let tail: Vec<&str> = out.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Some(format!(
            "pouchdb-server exited ({status}): {}",
            tail.join(" | ")
        ))
    }

    /// Stops the server the gentle way: closes its standard input, on which it exits by
    /// itself, and kills it only if it is still running after `grace`.
    pub fn shutdown(&mut self, grace: Duration) {
        self.stdin = None;
        if let Some(mut child) = self.child.take() {
            let started = Instant::now();
            while matches!(child.try_wait(), Ok(None)) && started.elapsed() < grace {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn spawn(&mut self, dir: &Path) -> Result<()> {
        let config = self.data_dir.join("config.json");
        let log = self.data_dir.join("couchdb.log");
        let settings = serde_json::json!({"log": {"level": "error", "file": log}});
        std::fs::write(&config, settings.to_string())
            .map_err(|e| err(format!("{}: {e}", config.display())))?;
        let output = std::fs::File::create(self.data_dir.join("server.out"))
            .map_err(|e| err(e.to_string()))?;
        let mut command = Command::new("node");
        if self.remove_at_exit {
            command.env(REMOVE_AT_EXIT_ENV, &self.data_dir);
        } else {
            command.env_remove(REMOVE_AT_EXIT_ENV);
        }
        // A process group of its own: a Ctrl-C on the terminal reaches the program that started
        // the server, which stops it, rather than killing both at once.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .arg(dir.join("serve.js"))
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(&self.data_dir)
            .arg("--config")
            .arg(&config)
            .arg("--no-stdout-logs")
            .current_dir(&self.data_dir)
            .stdin(Stdio::piped())
            .stdout(output.try_clone().map_err(|e| err(e.to_string()))?)
            .stderr(output)
            .spawn()
            .map_err(|e| {
                err(format!(
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
            if let Some(why) = self.exited() {
                return Err(err(format!("at start: {why}")));
            }
            if answers(addr) {
                return Ok(());
            }
            if started.elapsed() > Duration::from_millis(START_TIMEOUT_MS) {
                self.stop();
                return Err(err("pouchdb-server did not answer in time"));
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
        let dir = testserver_dir()?;
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
        .map_err(|e| err(format!("no free loopback port: {e}")))?;
    Ok(listener
        .local_addr()
        .map_err(|e| err(e.to_string()))?
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

/// Whether an anonymous client may act as an admin of the server at `url`, as on
/// pouchdb-server or a CouchDB left in "admin party": `GET /_session` names `_admin` among its
/// roles. A stock CouchDB 3 creates databases for admins only, so the demo cannot run there
/// without a login. Anything unclear (https, no answer, another body) counts as yes: the real
/// client then says what the server answers.
pub fn anonymous_is_admin(url: &str) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return true;
    };
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        return true;
    };
    if parsed.scheme() != "http" || !parsed.username().is_empty() {
        return true;
    }
    let Some(addr) = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .ok()
        .and_then(|mut a| a.next())
    else {
        return true;
    };
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return true;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let path = format!("{}/_session", parsed.path().trim_end_matches('/'));
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: application/json\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return true;
    }
    let mut reply = Vec::new();
    let _ = stream.take(65_536).read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    let Some((_, body)) = text.split_once("\r\n\r\n") else {
        return true;
    };
    let Ok(session) = serde_json::from_str::<serde_json::Value>(body) else {
        return true;
    };
    match session["userCtx"]["roles"].as_array() {
        Some(roles) => roles.iter().any(|r| r == "_admin"),
        None => true,
    }
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
