//! The `couch-ledger` program, run on a part's database as a user runs it.

use std::ffi::OsString;
use std::process::{Output, Stdio};
use std::time::Duration;

use super::{trio_db, Dbs};
use crate::support;

pub const BIN: &str = env!("CARGO_BIN_EXE_couch-ledger");

/// The program on `db` of the test server (or through the trio's proxy, for a database on the
/// trio), with nothing of the environment that would point it elsewhere; stdin closed, killed
/// if dropped. The caller adds its arguments.
fn program_on(db: &str) -> tokio::process::Command {
    let s = support::server();
    let on_trio = trio_db(db).map(|(_, proxy)| proxy);
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.env_remove("RUST_LOG")
        .env_remove("COUCHDB_URL")
        .env_remove("COUCHDB_USER")
        .env_remove("COUCHDB_PASSWORD")
        .env_remove("LEDGER_DB")
        .env_remove("LEDGER_HOT_DB")
        .args(["--url", on_trio.as_deref().unwrap_or(&s.url), "--db", db]);
    if let (Some(user), None) = (&s.user, &on_trio) {
        cmd.args(["--user", user]);
        cmd.env("COUCHDB_PASSWORD", s.password.clone().unwrap_or_default());
    }
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    cmd
}

/// Runs the program on `db` of the test server, with `args` after the server's settings.
pub async fn run_cli(db: &str, args: Vec<OsString>) -> Output {
    let mut cmd = program_on(db);
    cmd.args(args);
    tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the program finished in time")
        .unwrap()
}

/// The program on the test server's ledger in `dbs` (`--hot-db` too when split) as a child
/// process (stdout piped, stderr dropped).
pub fn spawn_cli(dbs: &Dbs, args: &[String]) -> tokio::process::Child {
    let mut cmd = program_on(&dbs.db);
    cmd.args(dbs.cli_args())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd.spawn().expect("run couch-ledger")
}

/// SIGKILLs a child if it still runs; `true` when it did (a kill that really happened).
pub fn kill_if_running(child: &mut tokio::process::Child) -> bool {
    if matches!(child.try_wait(), Ok(None)) && child.start_kill().is_ok() {
        return true;
    }
    false
}

pub fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(|a| a.into()).collect()
}

/// Whether the program has the transfer commands (written in parallel with this suite).
pub async fn cli_has_transfers() -> bool {
    let out = tokio::process::Command::new(BIN)
        .args(["transfer", "--help"])
        .output()
        .await
        .unwrap();
    out.status.success()
}
