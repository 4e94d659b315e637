use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::support;
use couch_ledger::{Currency, Ledger, Purchase};

const BIN: &str = env!("CARGO_BIN_EXE_couch-ledger");
const CLOUDANT_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/cloudant-purchase.json"
);
const CLOUDANT: &str = include_str!("../examples/cloudant-purchase.json");
const ORDER: &str = "320afa89017426b994162ab004ce3383";

/// Environment variables for one run.
type EnvVars<'a> = Vec<(&'a str, &'a str)>;

/// A finished run of the program.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Stdout as the one JSON object `--json` promises.
    fn json(&self) -> Value {
        assert_eq!(
            self.stdout.trim_end().lines().count(),
            1,
            "--json prints one line: {:?}",
            self.stdout
        );
        let v: Value = serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!("stdout is not JSON ({e}): {:?}", self.stdout);
        });
        assert!(v.is_object(), "{v}");
        v
    }

    /// A failure reported as exactly one `error:` line.
    fn assert_one_error_line(&self, mentions: &str) {
        let lines: Vec<&str> = self.stderr.trim_end().lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {:?}", self.stderr);
        assert!(lines[0].starts_with("error: "), "{:?}", lines[0]);
        assert!(
            lines[0].contains(mentions),
            "stderr should mention {mentions:?}: {:?}",
            lines[0]
        );
    }

    fn describe(&self) -> String {
        format!(
            "exit {}\nstdout: {}\nstderr: {}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs the program with `args` exactly (none of the test server's settings added), with the
/// environment cleared of the settings it reads, and `stdin` as standard input.
async fn run_raw(args: &[String], stdin: Option<&str>, env: &[(&str, &str)]) -> Run {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("COUCHDB_URL")
        .env_remove("COUCHDB_USER")
        .env_remove("COUCHDB_PASSWORD")
        .env_remove("LEDGER_DB")
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("run couch-ledger");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).await.unwrap();
        drop(pipe);
    }
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

/// `--url`, `--db` and the credentials of the test server.
fn server_args(db: &str) -> Vec<String> {
    let s = support::server();
    let mut a = vec!["--url".into(), s.url.clone(), "--db".into(), db.to_owned()];
    if let Some(user) = &s.user {
        a.extend(["--user".into(), user.clone()]);
        a.extend(["--password".into(), s.password.clone().unwrap_or_default()]);
    }
    a
}

/// Runs the program on the test server's database `db`.
async fn cli(db: &str, args: &[&str]) -> Run {
    cli_stdin(db, args, None).await
}

async fn cli_stdin(db: &str, args: &[&str], stdin: Option<&str>) -> Run {
    let mut all = server_args(db);
    all.extend(args.iter().map(|s| s.to_string()));
    run_raw(&all, stdin, &[]).await
}

/// `(update_seq, doc_count)` of a database.
async fn db_state(l: &Ledger) -> (Value, u64) {
    let info = l.client().database_info().await.unwrap();
    (
        info["update_seq"].clone(),
        info["doc_count"].as_u64().unwrap(),
    )
}

/// A ledger with the Cloudant purchase recorded, and its database's name.
async fn ledger_with_cloudant(test: &str) -> (Ledger, String) {
    let l = support::ledger(test).await;
    let gbp = Currency::from_code("GBP").unwrap();
    l.record_purchase(&Purchase::from_json(CLOUDANT, Some(gbp)).unwrap())
        .await
        .unwrap();
    let db = l.client().database().to_owned();
    (l, db)
}

#[tokio::test]
async fn the_cloudant_example_through_the_command_line() {
    let db = support::db_name("cli_cloudant");

    let r = cli(&db, &["init", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["database"], db.as_str());
    assert_eq!(v["created"], true);
    let docs = v["design_docs"].as_array().unwrap();
    assert_eq!(docs.len(), couch_ledger::design::design_docs().len());
    assert!(docs.iter().all(|d| d["status"] == "created"), "{v}");
    let r = cli(&db, &["--json", "init"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["created"], false);
    let docs = v["design_docs"].as_array().unwrap();
    assert_eq!(docs.len(), couch_ledger::design::design_docs().len());
    assert!(
        docs.iter().all(|d| d["status"] == "unchanged"),
        "a second init changes nothing: {v}"
    );

    let r = cli(
        &db,
        &[
            "purchase",
            "--file",
            CLOUDANT_FILE,
            "--currency",
            "GBP",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["id"], format!("purchase:{ORDER}"));
    assert_eq!(v["status"], "created");

    let pay_card = [
        "pay",
        "--order",
        ORDER,
        "--ref",
        "AB9977G244FF2F667",
        "--amount",
        "6.46",
        "--currency",
        "GBP",
        "--method",
        "credit card",
        "--json",
    ];
    let r = cli(&db, &pay_card).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["status"], "created");
    let r = cli(
        &db,
        &[
            "pay",
            "--order",
            ORDER,
            "--ref",
            "Q88775662377224",
            "--amount",
            "20.00",
            "--currency",
            "GBP",
            "--method",
            "voucher",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["id"], format!("payment:{ORDER}:Q88775662377224"));

    let r = cli(&db, &["order", "show", ORDER, "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["order_id"], ORDER);
    assert_eq!(v["currency"], "GBP");
    assert_eq!(v["balance"], 0);
    assert_eq!(v["total"], 2646);
    assert_eq!(v["paid"], 2646);
    assert_eq!(v["adjusted"], 0);
    assert_eq!(v["refunded"], 0);
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0]["type"], "purchase");
    assert_eq!(entries[0]["amount"], 2646);
    let sum: i64 = entries.iter().map(|e| e["amount"].as_i64().unwrap()).sum();
    assert_eq!(sum, 0);

    // Human output: decimals with the currency.
    let r = cli(&db, &["order", "show", ORDER]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.contains("26.46 GBP"), "{}", r.stdout);
    assert!(r.stdout.contains("-6.46 GBP"), "{}", r.stdout);
    assert!(r.stdout.contains("settled"), "{}", r.stdout);

    // A re-sent payment exists and writes nothing; the same ref with another amount is refused.
    let l = Ledger::new(
        support::builder("unused")
            .database(db.clone())
            .build()
            .unwrap(),
    );
    let before = db_state(&l).await;
    let r = cli(&db, &pay_card).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["status"], "exists");
    let mut other = pay_card;
    other[6] = "7.00";
    let r = cli(&db, &other).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    assert!(r.stdout.is_empty(), "{}", r.describe());
    r.assert_one_error_line("different value");
    assert_eq!(db_state(&l).await, before);
}

#[tokio::test]
async fn bad_input_is_one_error_line_exit_2_and_writes_nothing() {
    let (l, db) = ledger_with_cloudant("cli_bad_input").await;
    let before = db_state(&l).await;
    let pay = |order: &'static str, amount: &'static str, currency: &'static str| {
        vec![
            "pay",
            "--order",
            order,
            "--ref",
            "r1",
            "--amount",
            amount,
            "--currency",
            currency,
        ]
    };
    let mut cases: Vec<(Vec<&str>, Option<&str>, &str)> = vec![
        (pay(ORDER, "0", "GBP"), None, "greater than zero"),
        (pay(ORDER, "-1", "GBP"), None, "greater than zero"),
        (pay(ORDER, "6.465", "GBP"), None, "2 decimal places"),
        (pay(ORDER, "abc", "GBP"), None, "not a decimal number"),
        (pay(ORDER, "1e3", "GBP"), None, "not a decimal number"),
        (pay(ORDER, "6.46", "XXX"), None, "\"XXX\""),
        (pay(ORDER, "6.46", "EUR"), None, "is in GBP, not EUR"),
        (pay("no-such-order", "6.46", "GBP"), None, "unknown order"),
        (pay("_x", "6.46", "GBP"), None, "begins with '_'"),
        (pay("a\u{7}b", "6.46", "GBP"), None, "control character"),
        (pay("a:b", "6.46", "GBP"), None, "':'"),
    ];
    let adjust_zero = vec![
        "adjust",
        "--order",
        ORDER,
        "--ref",
        "a1",
        "--amount",
        "-0.00",
        "--currency",
        "GBP",
    ];
    cases.push((adjust_zero, None, "zero"));
    let bad_total = CLOUDANT.replace("\"total\": 26.46", "\"total\": 26.47");
    let other_order = CLOUDANT.replace(ORDER, "another-order");
    let bad_total = bad_total.replace(ORDER, "another-order");
    let purchase_gbp = vec!["purchase", "--file", "-", "--currency", "GBP"];
    cases.push((
        purchase_gbp.clone(),
        Some(bad_total.as_str()),
        "invalid total",
    ));
    cases.push((
        purchase_gbp.clone(),
        Some("{\"order_id\": \"x\", "),
        "purchase JSON",
    ));
    cases.push((
        vec!["purchase", "--file", "-"],
        Some(other_order.as_str()),
        "currency",
    ));
    let with_gbp = other_order.replacen('{', "{\"currency\": \"GBP\",", 1);
    cases.push((
        vec!["purchase", "--file", "-", "--currency", "EUR"],
        Some(with_gbp.as_str()),
        "but EUR was given",
    ));
    cases.push((
        vec!["purchase", "--file", "/nonexistent/purchase.json"],
        None,
        "cannot read",
    ));
    for (args, stdin, mentions) in &cases {
        for json in [false, true] {
            let mut args = args.clone();
            if json {
                args.push("--json");
            }
            let r = cli_stdin(&db, &args, *stdin).await;
            assert_eq!(r.code, 2, "{args:?}: {}", r.describe());
            assert!(r.stdout.is_empty(), "{args:?}: {}", r.describe());
            r.assert_one_error_line(mentions);
        }
    }
    assert_eq!(db_state(&l).await, before, "bad input wrote something");
    // The same arguments, corrected, work (the cases were wrong for the reason given).
    let r = cli(&db, &pay(ORDER, "6.46", "GBP")).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.contains("created"), "{}", r.describe());
}

#[tokio::test]
async fn an_unreachable_server_is_exit_1_quickly() {
    let started = Instant::now();
    for args in [
        vec!["init"],
        vec!["order", "show", ORDER, "--json"],
        vec!["orders", "outstanding"],
    ] {
        let mut all: Vec<String> = ["--url", "http://127.0.0.1:1", "--db", "ledger"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        let r = run_raw(&all, None, &[]).await;
        assert_eq!(r.code, 1, "{args:?}: {}", r.describe());
        assert!(r.stdout.is_empty(), "{}", r.describe());
        r.assert_one_error_line("could not reach the server");
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn wrong_credentials_are_exit_1_and_passwords_are_never_printed() {
    const SECRET: &str = "S3cr3t-never-shown";
    let s = support::server();
    let (_l, db) = ledger_with_cloudant("cli_secret").await;
    // Wrong credentials are an operational error naming the cause. (CouchDB and pouchdb-server
    // both answer 401 to unknown basic-auth credentials, even with no admin configured.)
    let args: Vec<String> = [
        "--url",
        &s.url,
        "--db",
        &db,
        "--user",
        "nobody",
        "--password",
        SECRET,
        "order",
        "show",
        ORDER,
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let r = run_raw(&args, None, &[]).await;
    assert_eq!(r.code, 1, "{}", r.describe());
    r.assert_one_error_line("401 unauthorized");
    assert!(!r.stderr.contains(SECRET) && !r.stdout.contains(SECRET));
    let with_creds_in_url = s.url.replacen("://", &format!("://nobody:{SECRET}@"), 1);
    let runs: Vec<(Vec<String>, EnvVars)> = vec![
        // On the command line, against the test server, with debug logs.
        (
            [
                "--url",
                &s.url,
                "--db",
                &db,
                "--user",
                "nobody",
                "--password",
                SECRET,
                "order",
                "show",
                ORDER,
            ]
            .iter()
            .map(|a| a.to_string())
            .collect(),
            vec![("RUST_LOG", "debug")],
        ),
        // In the URL, to an unreachable server, with debug logs.
        (
            [
                "--url",
                &format!("http://nobody:{SECRET}@127.0.0.1:1"),
                "--db",
                "ledger",
                "init",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect(),
            vec![("RUST_LOG", "debug")],
        ),
        // In the URL and the environment, with an error of ours.
        (
            [
                "--url",
                &with_creds_in_url,
                "--db",
                &db,
                "pay",
                "--order",
                ORDER,
                "--ref",
                "r",
                "--amount",
                "abc",
                "--currency",
                "GBP",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect(),
            vec![("COUCHDB_USER", "nobody"), ("COUCHDB_PASSWORD", SECRET)],
        ),
        // The help shows where the password comes from, never its value.
        (
            vec!["init".to_string(), "--help".to_string()],
            vec![
                ("COUCHDB_PASSWORD", SECRET),
                ("COUCHDB_URL", &with_creds_in_url),
            ],
        ),
        // The demo says which server it uses.
        (
            [
                "--url",
                &format!("http://nobody:{SECRET}@127.0.0.1:1"),
                "demo",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect(),
            vec![],
        ),
    ];
    for (args, env) in &runs {
        let r = run_raw(args, None, env).await;
        assert!(
            !r.stdout.contains(SECRET) && !r.stderr.contains(SECRET),
            "{args:?} printed the password: {}",
            r.describe()
        );
    }
}

#[tokio::test]
async fn outstanding_orders_and_statements_on_the_command_line() {
    let (_l, db) = ledger_with_cloudant("cli_outstanding").await;
    let r = cli(
        &db,
        &[
            "pay",
            "--order",
            ORDER,
            "--ref",
            "p1",
            "--amount",
            "6.46",
            "--currency",
            "GBP",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let r = cli(
        &db,
        &[
            "adjust",
            "--order",
            ORDER,
            "--ref",
            "d1",
            "--amount",
            "-1.50",
            "--currency",
            "GBP",
            "--reason",
            "loyalty discount",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["id"], format!("adjustment:{ORDER}:d1"));
    for args in [
        vec![
            "ship",
            "--order",
            ORDER,
            "--ref",
            "t1",
            "--carrier",
            "Royal Mail",
        ],
        vec!["deliver", "--order", ORDER, "--ref", "t1"],
        vec![
            "refund",
            "--order",
            ORDER,
            "--ref",
            "r1",
            "--amount",
            "0.50",
            "--currency",
            "GBP",
        ],
    ] {
        let r = cli(&db, &args).await;
        assert_eq!(r.code, 0, "{args:?}: {}", r.describe());
    }

    let r = cli(&db, &["orders", "outstanding", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    let orders = v["orders"].as_array().unwrap();
    assert_eq!(orders.len(), 1, "{v}");
    assert_eq!(orders[0]["order_id"], ORDER);
    assert_eq!(orders[0]["balance"], 2646 - 646 - 150 + 50);
    assert_eq!(v["next"], Value::Null);
    let r = cli(&db, &["orders", "outstanding"]).await;
    assert!(r.stdout.contains("19.00 GBP"), "{}", r.describe());

    let r = cli(&db, &["statement", "985522332", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["orders"][0]["balance"], 1900);
    assert_eq!(v["totals"][0]["currency"], "GBP");
    assert_eq!(v["totals"][0]["balance"], 1900);

    let r = cli(&db, &["orders", "outstanding", "--limit", "0"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_one_error_line("--limit");
}

#[tokio::test]
async fn the_demo_runs_end_to_end() {
    let db = support::db_name("cli_demo");
    let r = cli(&db, &["demo", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["ok"], true);
    assert_eq!(v["database"], db.as_str());
    let steps: Vec<&str> = v["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["steps"].as_array().unwrap())
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    for expected in [
        "init",
        "init_again",
        "purchase",
        "pay_card",
        "pay_voucher",
        "pay_again",
        "pay_conflict",
        "refund",
    ] {
        assert!(steps.contains(&expected), "{expected} in {steps:?}");
    }
    // Run again on the same, now used, database: refused as a usage error.
    let r = cli(&db, &["demo"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_one_error_line("fresh database");
}

#[tokio::test]
async fn usage_errors_exit_2_and_help_exits_0() {
    let r = run_raw(&["pay".into(), "--order".into(), "o".into()], None, &[]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    assert!(r.stderr.contains("--ref"), "{}", r.describe());
    let r = run_raw(
        &["--timeout".into(), "soon".into(), "init".into()],
        None,
        &[],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_one_error_line("--timeout");
    for cmd in [
        "pay", "adjust", "purchase", "demo", "order", "orders", "init",
    ] {
        let r = run_raw(&[cmd.into(), "--help".into()], None, &[]).await;
        assert_eq!(r.code, 0, "{cmd}: {}", r.describe());
        assert!(r.stdout.len() > 100, "{cmd}: {}", r.stdout);
    }
}
