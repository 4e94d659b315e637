//! Pinned tools some tests run, installed by the harness itself into the per-user cache
//! directory where the test server lives (`devserver::cache_root`), each in a directory named
//! after a hash of its pinned files, so that another pin installs beside it and every checkout
//! and worktree of the same pin shares one install:
//!
//! - `python_tools()`: schemathesis and openapi-spec-validator in a venv, from
//!   `crates/couch-ledger-cli/tests/contract/requirements.txt` (every package pinned with its
//!   hashes, installed with `pip install --require-hashes --no-deps`);
//! - `ts_client_tools()`: openapi-typescript, openapi-fetch and TypeScript from
//!   `crates/couch-ledger-cli/tests/ts-client/package-lock.json` (`npm ci`).
//!
//! A missing `python3` or `npm`, or an install that fails, panics with what to do: a test that
//! needs a tool never passes without running it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use super::devserver::cache_root;

/// How long one install may take on a slow registry.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(900);

const REQUIREMENTS: &str = include_str!("../../couch-ledger-cli/tests/contract/requirements.txt");
const TS_PACKAGE_JSON: &str = include_str!("../../couch-ledger-cli/tests/ts-client/package.json");
const TS_PACKAGE_LOCK: &str =
    include_str!("../../couch-ledger-cli/tests/ts-client/package-lock.json");

/// The Python tools' venv: `bin/st` and `bin/openapi-spec-validator` are in it.
pub fn python_tools() -> PathBuf {
    let dir = pinned_dir("contract-python", &[("requirements.txt", REQUIREMENTS)]);
    install_once(
        &dir,
        "schemathesis and openapi-spec-validator (pip)",
        |dir| {
            let venv = dir.join("venv");
            run(
                Command::new("python3").arg("-m").arg("venv").arg(&venv),
                "python3 -m venv (install Python 3 with its venv module)",
            )?;
            run(
                Command::new(venv.join("bin/pip"))
                    .args(["install", "--require-hashes", "--no-deps", "--quiet"])
                    .args(["--disable-pip-version-check", "--no-input", "-r"])
                    .arg(dir.join("requirements.txt")),
                "pip install -r crates/couch-ledger-cli/tests/contract/requirements.txt",
            )
        },
    );
    dir.join("venv")
}

/// The TypeScript client's packages: `node_modules` is in it.
pub fn ts_client_tools() -> PathBuf {
    let dir = pinned_dir(
        "ts-client",
        &[
            ("package.json", TS_PACKAGE_JSON),
            ("package-lock.json", TS_PACKAGE_LOCK),
        ],
    );
    install_once(&dir, "the TypeScript client's packages (npm ci)", |dir| {
        run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(dir),
            "npm ci in crates/couch-ledger-cli/tests/ts-client (install Node.js and npm)",
        )
    });
    dir
}

/// `<cache>/<name>-<first 16 hex digits of the files' SHA-256>`, holding `files`.
fn pinned_dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let mut h = Sha256::new();
    for (file, text) in files {
        for part in [file.as_bytes(), text.as_bytes()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    let hash: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = cache_root().join(format!("{name}-{hash}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for (file, text) in files {
        let path = dir.join(file);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(*text) {
            // Write then rename, so that a concurrent reader never sees half a file.
            let partial = dir.join(format!(".{file}.{}", std::process::id()));
            std::fs::write(&partial, text)
                .and_then(|()| std::fs::rename(&partial, &path))
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        }
    }
    dir
}

/// Runs `install` in `dir` unless an earlier run finished it (`.installed`), under a file lock
/// that serialises the tests and test binaries wanting the same install.
fn install_once(dir: &Path, what: &str, install: impl FnOnce(&Path) -> Result<(), String>) {
    let done = dir.join(".installed");
    if done.exists() {
        return;
    }
    let lock = File::create(dir.join(".install.lock")).expect("the install lock file");
    lock.lock().expect("the install lock");
    if done.exists() {
        return;
    }
    eprintln!(
        "couch-ledger tests: installing {what} into {}, once…",
        dir.display()
    );
    if let Err(e) = install(dir) {
        panic!(
            "could not install {what} into {}: {e}. These tests need it; fix the cause (the \
             pinned versions are in the repository) and run them again",
            dir.display()
        );
    }
    File::create(&done).expect("the install marker");
}

/// Runs `cmd` to its end within [`INSTALL_TIMEOUT`], its output on our stderr.
fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("{what} failed ({status})"))
            };
        }
        if started.elapsed() > INSTALL_TIMEOUT {
            let _ = child.kill();
            return Err(format!("{what} did not finish in {INSTALL_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
