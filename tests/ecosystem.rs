//! Issue 14, "ecosystem fit", through the program as a user runs it: every ISO-4217 currency
//! (`iso_currency`), durations in `humantime`'s syntax, and shell completions (`clap_complete`).

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::support;

const BIN: &str = env!("CARGO_BIN_EXE_couch-ledger");

/// A finished run of the program.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn describe(&self) -> String {
        format!(
            "exit {}\nstdout: {}\nstderr: {}",
            self.code, self.stdout, self.stderr
        )
    }

    /// Stdout as the one JSON object `--json` promises.
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.describe()))
    }

    /// Exit 2 and exactly one `error:` line on stderr, mentioning `mentions`.
    fn assert_invalid(&self, mentions: &str) {
        assert_eq!(self.code, 2, "{}", self.describe());
        let lines: Vec<&str> = self.stderr.trim_end().lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {}", self.describe());
        assert!(lines[0].starts_with("error: "), "{}", self.describe());
        assert!(
            lines[0].contains(mentions),
            "stderr should mention {mentions:?}: {}",
            self.describe()
        );
    }
}

/// Runs the program with `args` exactly, the environment cleared of the settings it reads (as
/// `cli::run_raw` does).
async fn run(args: &[&str]) -> Run {
    let child = tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("COUCHDB_URL")
        .env_remove("COUCHDB_USER")
        .env_remove("COUCHDB_PASSWORD")
        .env_remove("LEDGER_DB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run couch-ledger");
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("couch-ledger finished in time")
        .unwrap();
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Runs the program on the test server's database `db`.
async fn on(db: &str, args: &[&str]) -> Run {
    let s = support::server();
    let mut all = vec!["--url", s.url.as_str(), "--db", db];
    if let Some(user) = &s.user {
        all.extend(["--user", user.as_str()]);
        all.extend(["--password", s.password.as_deref().unwrap_or_default()]);
    }
    all.extend_from_slice(args);
    run(&all).await
}

#[tokio::test]
async fn every_iso_currency_on_the_command_line_and_bad_ones_exit_2() {
    let l = support::ledger("eco_currencies").await;
    let db = l.client().database().to_owned();
    // Accepted: (account, currency, opening as typed, minor units).
    for (account, currency, opening, minor) in [
        ("bdt", "BDT", "1.23", 123),
        ("ghs", "ghs", "10.5", 1050),
        ("bhd", "BHD", "1.234", 1234),
        ("jpy", "JPY", "15", 15),
        ("eur", "EUR", "6.46", 646),
    ] {
        let r = on(
            &db,
            &[
                "account",
                "create",
                account,
                "--currency",
                currency,
                "--opening",
                opening,
                "--json",
            ],
        )
        .await;
        assert_eq!(r.code, 0, "{currency} {opening}: {}", r.describe());
        assert_eq!(r.json()["status"], "created", "{}", r.describe());
        let r = on(&db, &["account", "show", account, "--json"]).await;
        assert_eq!(r.code, 0, "{}", r.describe());
        let v = r.json();
        assert_eq!(v["currency"], currency.to_ascii_uppercase(), "{v}");
        assert_eq!(v["balance"], minor, "{currency} {opening}: {v}");
    }
    // Refused before anything is sent: (currency, opening, what the error line names).
    let before = support::db_snapshot(&db).await;
    for (currency, opening, mentions) in [
        ("BDT", "1.234", "BDT allows 2 decimal places"),
        ("JPY", "1.5", "JPY allows 0 decimal places"),
        ("EUR", "6.465", "EUR allows 2 decimal places"),
        ("ZZZ", "1", "\"ZZZ\" is not an ISO-4217 code"),
        ("XAU", "1", "no minor unit"),
        ("XXX", "1", "no minor unit"),
    ] {
        let r = on(
            &db,
            &[
                "account",
                "create",
                "refused",
                "--currency",
                currency,
                "--opening",
                opening,
            ],
        )
        .await;
        r.assert_invalid(mentions);
    }
    // A transfer in an unknown currency is refused the same way.
    let r = on(
        &db,
        &[
            "transfer",
            "--from",
            "eur",
            "--to",
            "bdt",
            "--amount",
            "1",
            "--currency",
            "ZZZ",
        ],
    )
    .await;
    r.assert_invalid("ZZZ");
    assert_eq!(support::db_snapshot(&db).await, before, "nothing written");
}

#[tokio::test]
async fn durations_take_humantime_forms_and_bad_ones_name_the_flag() {
    let l = support::ledger("eco_durations").await;
    let db = l.client().database().to_owned();
    // Compound forms work for both flags that take a duration.
    let r = on(
        &db,
        &[
            "sweep",
            "--once",
            "--stale-after",
            "1h30m",
            "--timeout",
            "1m30s",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["examined"], 0, "{}", r.describe());
    // Every form the README documents.
    for dur in ["0s", "500ms", "30s", "5m"] {
        let r = on(&db, &["sweep", "--once", "--stale-after", dur, "--json"]).await;
        assert_eq!(r.code, 0, "{dur}: {}", r.describe());
    }
    // `--timeout 250ms` is taken: against a port where nothing listens, the failure is the
    // connection (exit 1), not the flag (exit 2).
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{closed}");
    let r = run(&["--url", &url, "--timeout", "250ms", "status"]).await;
    assert_eq!(r.code, 1, "{}", r.describe());
    assert!(!r.stderr.contains("--timeout"), "{}", r.describe());
    // Bad durations: exit 2, one line naming the flag, nothing sent.
    // (`--flag=VALUE`, so that clap takes `-1s` as a value, not as a flag.)
    for bad in ["soon", "5", "1h30", "-1s", "5 parsecs", ""] {
        let r = run(&["--url", &url, &format!("--timeout={bad}"), "status"]).await;
        r.assert_invalid("--timeout");
        let r = on(&db, &["sweep", "--once", &format!("--stale-after={bad}")]).await;
        r.assert_invalid("--stale-after");
    }
}

#[tokio::test]
async fn shell_completions_are_printed_on_stdout() {
    let r = run(&["completions", "bash"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stderr.is_empty(), "{}", r.describe());
    for word in [
        "couch-ledger",
        "transfer",
        "sweep",
        "--stale-after",
        "--currency",
    ] {
        assert!(r.stdout.contains(word), "bash script lacks {word}");
    }
    for (shell, marker) in [
        ("zsh", "#compdef couch-ledger"),
        ("fish", "complete -c couch-ledger"),
    ] {
        let r = run(&["completions", shell]).await;
        assert_eq!(r.code, 0, "{shell}: {}", r.describe());
        assert!(r.stdout.contains(marker), "{shell}: {}", r.stdout);
        assert!(r.stdout.contains("transfer"), "{shell}");
    }
    // No server is needed, whatever the settings say.
    let r = run(&[
        "--url",
        "not a url",
        "--timeout",
        "soon",
        "completions",
        "fish",
    ])
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    // An unknown shell is a usage error.
    let r = run(&["completions", "tcsh"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    assert!(r.stderr.contains("tcsh"), "{}", r.describe());
    assert!(r.stdout.is_empty(), "{}", r.describe());
    let r = run(&["completions"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
}
