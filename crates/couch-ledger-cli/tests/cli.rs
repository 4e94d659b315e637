use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::support;
use couch_ledger::{Currency, Ledger, Purchase};

const BIN: &str = env!("CARGO_BIN_EXE_couch-ledger");
const CLOUDANT_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/cloudant-purchase.json"
);
const CLOUDANT: &str = include_str!("../../../examples/cloudant-purchase.json");
const ORDER: &str = "320afa89017426b994162ab004ce3383";

/// Environment variables for one run.
type EnvVars<'a> = Vec<(&'a str, &'a str)>;

/// A finished run of the program.
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// Stdout as the one JSON object `--json` promises.
    pub(crate) fn json(&self) -> Value {
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

    /// A failure's stdout: with `--json` exactly one object, `error` (this code) and `message`
    /// (the stderr line's text); without, nothing.
    fn assert_error_output(&self, json: bool, code: &str) {
        if !json {
            assert!(self.stdout.is_empty(), "{}", self.describe());
            return;
        }
        let v = self.json();
        assert_eq!(v["error"], code, "{}", self.describe());
        let message = v["message"].as_str().expect("a message");
        assert!(
            !message.is_empty() && self.stderr.contains(message),
            "the message is the error line: {}",
            self.describe()
        );
    }

    pub(crate) fn describe(&self) -> String {
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
        .env_remove("LEDGER_HOT_DB")
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
pub(crate) async fn cli(db: &str, args: &[&str]) -> Run {
    cli_stdin(db, args, None).await
}

async fn cli_stdin(db: &str, args: &[&str], stdin: Option<&str>) -> Run {
    let mut all = server_args(db);
    all.extend(args.iter().map(|s| s.to_string()));
    run_raw(&all, stdin, &[]).await
}

/// What the database holds: compared before and after to see that nothing was written.
async fn db_state(l: &Ledger) -> support::DbSnapshot {
    support::db_snapshot(l.client().database()).await
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
    r.assert_error_output(true, "mismatch");
    r.assert_one_error_line("different value");
    // The differing field is named with the option that sets it.
    r.assert_one_error_line("--amount");
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
            r.assert_error_output(json, "invalid_input");
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
        vec!["status", "--json"],
        vec!["account", "show", "A"],
        vec![
            "transfer",
            "--from",
            "A",
            "--to",
            "B",
            "--amount",
            "1",
            "--currency",
            "EUR",
        ],
    ] {
        let mut all: Vec<String> = ["--url", "http://127.0.0.1:1", "--db", "ledger"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        let r = run_raw(&all, None, &[]).await;
        assert_eq!(r.code, 1, "{args:?}: {}", r.describe());
        r.assert_error_output(args.contains(&"--json"), "unreachable");
        r.assert_one_error_line("could not reach the server at http://127.0.0.1:1/");
        // Where the URL comes from, so the user knows what to change.
        r.assert_one_error_line("--url or COUCHDB_URL");
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
    // Wrong credentials are an operational error naming the cause (both servers answer 401).
    // They are tried as a user of this test's own: CouchDB 3.4 locks a user out after a few
    // failed logins, and the suite's user must keep working for every other test.
    let (user, _right) = support::test_user("cli_secret").await;
    let user = user.as_str();
    let args: Vec<String> = [
        "--url",
        &s.url,
        "--db",
        &db,
        "--user",
        user,
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
    let with_creds_in_url = s.url.replacen("://", &format!("://{user}:{SECRET}@"), 1);
    let runs: Vec<(Vec<String>, EnvVars)> = vec![
        // On the command line, against the test server, with debug logs.
        (
            [
                "--url",
                &s.url,
                "--db",
                &db,
                "--user",
                user,
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
            vec![("COUCHDB_USER", user), ("COUCHDB_PASSWORD", SECRET)],
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

/// CouchDB 3.4's login lockout (SERVERS.md) answers 403 to every request of a user that failed
/// to log in too often, the right password too. The program says so plainly, exit 1, and does
/// not call it a wrong password or a refused write. No real server locks on demand here, so a
/// stand-in answers exactly what CouchDB 3.4.3 answers.
#[tokio::test]
async fn a_locked_user_is_said_plainly_exit_1() {
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let couch = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(403).set_body_json(serde_json::json!({
            "error": "forbidden",
            "reason": "Account is temporarily locked due to multiple authentication failures"
        })))
        .mount(&couch)
        .await;
    for (args, env) in [
        (
            vec![
                "--user",
                "shop",
                "--password",
                "right-one",
                "account",
                "show",
                "A",
            ],
            vec![],
        ),
        (
            vec!["--json", "order", "show", "o1"],
            vec![("COUCHDB_USER", "shop"), ("COUCHDB_PASSWORD", "right-one")],
        ),
    ] {
        let mut all: Vec<String> =
            vec!["--url".into(), couch.uri(), "--db".into(), "ledger".into()];
        all.extend(args.iter().map(|a| a.to_string()));
        let r = run_raw(&all, None, &env).await;
        assert_eq!(r.code, 1, "{}", r.describe());
        r.assert_one_error_line(
            "the server has locked user shop after failed logins; wait or ask an admin",
        );
        assert!(!r.stderr.contains("right-one"), "{}", r.describe());
        assert!(!r.stderr.contains("unauthorized"), "{}", r.describe());
    }
}

/// The program makes the transfer's id before it writes, and when the call
/// fails it shows that id (text and `--json`), so a script retries with it instead of making a
/// second transfer.
#[tokio::test]
async fn a_failed_transfer_shows_its_id() {
    for (extra, want) in [(vec![], None), (vec!["--id", "order-42"], Some("order-42"))] {
        let mut all: Vec<String> = ["--url", "http://127.0.0.1:1", "--db", "ledger", "--json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend(
            [
                "transfer",
                "--from",
                "A",
                "--to",
                "B",
                "--amount",
                "1",
                "--currency",
                "EUR",
            ]
            .iter()
            .chain(extra.iter())
            .map(|s| s.to_string()),
        );
        let r = run_raw(&all, None, &[]).await;
        assert_eq!(r.code, 1, "{}", r.describe());
        let v = r.json();
        let id = v["id"].as_str().expect("the id in --json").to_owned();
        match want {
            Some(w) => assert_eq!(id, w),
            // A UUID v7 made by the program.
            None => assert_eq!(uuid_version(&id), Some(7), "{id}"),
        }
        r.assert_error_output(true, "unreachable");
        assert!(
            v["message"]
                .as_str()
                .is_some_and(|e| e.contains("could not reach")),
            "{v}"
        );
        r.assert_one_error_line(&format!("--id {id}"));
        // Each cause once: the transfer is named once, the server once.
        let line = r.stderr.trim_end();
        assert_eq!(line.matches(&format!("transfer {id}")).count(), 1, "{line}");
        assert_eq!(line.matches("could not reach").count(), 1, "{line}");
    }
}

/// `transfer` of 1 EUR from A to B, as the error tests send it.
const ONE_EUR_A_TO_B: [&str; 9] = [
    "transfer",
    "--from",
    "A",
    "--to",
    "B",
    "--amount",
    "1",
    "--currency",
    "EUR",
];

/// A server that accepts connections and never answers: `--timeout` bounds the whole wait,
/// retries included (not one timeout per try), and each retry is said on stderr meanwhile.
#[tokio::test]
async fn a_silent_server_fails_within_the_timeout_saying_it_retries() {
    const TIMEOUT_S: u64 = 5;
    // Every connection is accepted and held open without a byte written back.
    let url = support::silent_server();
    for args in [vec!["account", "show", "A"], ONE_EUR_A_TO_B.to_vec()] {
        let mut all: Vec<String> = ["--url", &url, "--db", "ledger", "--timeout", "5s", "--json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        let started = Instant::now();
        let r = run_raw(&all, None, &[]).await;
        let took = started.elapsed();
        assert_eq!(r.code, 1, "{args:?}: {}", r.describe());
        assert!(
            took < Duration::from_secs(TIMEOUT_S + 3),
            "{args:?}: took {took:?}: {}",
            r.describe()
        );
        // It did wait for the server, rather than give up at once.
        assert!(
            took >= Duration::from_secs(TIMEOUT_S - 1),
            "{args:?}: took {took:?}"
        );
        r.assert_error_output(true, "timeout");
        let lines: Vec<&str> = r.stderr.trim_end().lines().collect();
        let (last, before) = lines.split_last().expect("stderr");
        assert!(
            before
                .iter()
                .any(|l| l.contains(&format!("CouchDB at {url}/ did not answer"))
                    && l.contains("retrying (try 2 of")),
            "a line while it retries: {}",
            r.describe()
        );
        assert!(
            before.iter().all(|l| l.contains("retrying")),
            "{}",
            r.describe()
        );
        assert!(last.starts_with("error: "), "{last}");
        assert!(last.contains("did not answer within"), "{last}");
        assert!(last.contains("--url or COUCHDB_URL"), "{last}");
        assert!(last.contains("--timeout"), "{last}");
    }
}

/// No database (no `init`, a wrong `--db`): every command says which database is missing where
/// and to run `init`; a transfer does not claim it may exist, since nothing could be written.
/// A database name put in the URL is pointed out.
#[tokio::test]
async fn a_missing_database_says_to_run_init() {
    let db = support::db_name("cli_no_database");
    let shown = couch_ledger::redact_url(&support::server().url);
    let transfer: Vec<&str> = ONE_EUR_A_TO_B.iter().copied().chain(["--json"]).collect();
    for args in [
        vec!["account", "show", "A"],
        vec!["status", "--json"],
        vec!["order", "show", ORDER],
        transfer.to_vec(),
    ] {
        let r = cli(&db, &args).await;
        assert_eq!(r.code, 1, "{args:?}: {}", r.describe());
        r.assert_error_output(args.contains(&"--json"), "no_database");
        r.assert_one_error_line(&format!(
            "no database {db} at {shown}: run `couch-ledger init`"
        ));
        assert!(!r.stderr.contains("no_db_file"), "{}", r.describe());
        assert!(!r.stderr.contains("may exist"), "{}", r.describe());
    }
    // The database put at the end of the URL, as many clients take it.
    let (_l, db) = fresh("cli_db_in_url").await;
    let mut args = server_args(&db);
    args[1] = format!("{}/{db}", support::server().url.trim_end_matches('/'));
    args.extend(["account", "show", "A"].map(String::from));
    let r = run_raw(&args, None, &[]).await;
    assert_ne!(r.code, 0, "{}", r.describe());
    r.assert_one_error_line("give the server's URL alone with --url and the database with --db");
}

/// `--json` is one object on stdout on every exit: a usage error found by clap too.
#[tokio::test]
async fn json_errors_are_one_object_even_for_usage_errors() {
    let args: Vec<String> = ["--json", "transfer", "--from", "A", "--bogus"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let r = run_raw(&args, None, &[]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["error"], "usage", "{v}");
    assert!(
        v["message"].as_str().is_some_and(|m| m.contains("--bogus")),
        "{v}"
    );
    // Without --json, clap's message alone.
    let r = run_raw(&args[1..], None, &[]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    assert!(r.stdout.is_empty(), "{}", r.describe());
}

/// The version digit of a UUID in its text form.
fn uuid_version(text: &str) -> Option<u32> {
    let parts: Vec<&str> = text.split('-').collect();
    (parts.len() == 5).then(|| parts[2].chars().next()?.to_digit(16))?
}

/// `init --member-role` sets `_security` so that only admins and that role may
/// use the database, keeping what was there, and says so.
#[tokio::test]
async fn init_can_restrict_the_database_to_a_role() {
    let (l, db) = fresh("cli_member_role").await;
    let r = cli(&db, &["--json", "init", "--member-role", "ledger"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(
        v["security"]["members"]["roles"],
        serde_json::json!(["ledger"]),
        "{v}"
    );
    // A cluster's nodes take the new security object one after another: read until it shows.
    let stored = support::wait_for(
        "the database's security object with the role",
        Duration::from_secs(30),
        || async {
            let stored = l.client().security().await.unwrap();
            (stored["members"]["roles"] == serde_json::json!(["ledger"])).then_some(stored)
        },
    )
    .await;
    assert_eq!(
        stored["members"]["roles"],
        serde_json::json!(["ledger"]),
        "{stored}"
    );
    // Again: the same, nothing else changed.
    let r = cli(&db, &["init", "--member-role", "ledger"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.contains("role \"ledger\""), "{}", r.describe());
    assert_eq!(l.client().security().await.unwrap(), stored);
    for bad in ["", "_admin", "two words"] {
        let r = cli(&db, &["init", "--member-role", bad]).await;
        assert_eq!(r.code, 2, "{bad:?}: {}", r.describe());
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
    let scenario = |name: &str| -> Vec<Value> {
        v["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("scenario {name} in {v}"))["steps"]
            .as_array()
            .unwrap()
            .clone()
    };
    let step = |steps: &[Value], name: &str| -> Value {
        let s = steps
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("step {name} in {steps:?}"));
        assert!(
            s["says"].as_str().is_some_and(|t| t.len() > 20),
            "every step says what it shows: {s}"
        );
        s["outcome"].clone()
    };
    let setup = scenario("setup");
    for name in ["init", "init_again"] {
        step(&setup, name);
    }
    let cloudant = scenario("cloudant_order");
    for name in [
        "purchase",
        "pay_card",
        "pay_voucher",
        "pay_again",
        "pay_conflict",
        "refund",
    ] {
        step(&cloudant, name);
    }

    // MongoDB: every state in turn, with the views at the right moments.
    let mongo = scenario("mongodb_two_phase");
    assert_eq!(step(&mongo, "initial")["state"], "initial");
    let pending = step(&mongo, "pending");
    assert_eq!(pending["state"], "pending");
    assert_eq!(
        pending["pending_view"],
        serde_json::json!([{"key": ["A", "B"], "value": 10_000}])
    );
    let applied = step(&mongo, "applied");
    assert_eq!(applied["accounts"][0]["balance"], 90_000, "{applied}");
    assert_eq!(applied["accounts"][0]["pending"][0]["delta"], -10_000);
    assert_eq!(applied["accounts"][1]["available"], 100_000, "{applied}");
    let committed = step(&mongo, "committed");
    assert_eq!(committed["pending_view"], serde_json::json!([]));
    assert_eq!(
        committed["committed_view"],
        serde_json::json!([{"key": ["A", "B"], "value": 10_000}])
    );
    assert_eq!(step(&mongo, "settled")["state"], "committed");
    let done = step(&mongo, "done");
    assert_eq!(done["state"], "done");
    assert_eq!(done["accounts"][0]["balance"], 90_000);
    assert_eq!(done["accounts"][1]["balance"], 110_000);
    assert_eq!(step(&mongo, "crash")["state"], "pending");
    let swept = step(&mongo, "sweep");
    assert_eq!(swept["sweep"]["advanced"], 1, "{swept}");
    assert_eq!(swept["state"], "done");
    assert_eq!(step(&mongo, "cancel")["state"], "cancelled");
    assert_eq!(step(&mongo, "cancel_done")["refused"], true);
    assert_eq!(step(&mongo, "reverse")["status"], "created");
    assert_eq!(step(&mongo, "reverse_again")["status"], "exists");
    assert_eq!(
        step(&mongo, "insufficient_funds")["reason"],
        "insufficient_funds"
    );
    assert_eq!(step(&mongo, "verify")["ok"], true);

    // Couchbase: the pending and committed views, and the money in flight.
    let couchbase = scenario("couchbase_multiphase");
    assert_eq!(step(&couchbase, "waiting")["states"]["initial"], 1);
    let pending = step(&couchbase, "pending");
    assert_eq!(pending["in_flight"], 13_000, "{pending}");
    assert_eq!(pending["pending_view"].as_array().unwrap().len(), 2);
    let committed = step(&couchbase, "committed");
    assert_eq!(committed["in_flight"], 3_000, "{committed}");
    assert_eq!(
        committed["committed_view"],
        serde_json::json!([{"key": ["Alice", "James"], "value": 10_000}])
    );
    let done = step(&couchbase, "done");
    assert_eq!(done["in_flight"], 0);
    assert_eq!(done["accounts"][0]["balance"], 13_000);
    assert_eq!(done["accounts"][1]["balance"], 17_000);
    assert_eq!(step(&couchbase, "verify")["ok"], true);

    // Run again on the same, now used, database: refused as a usage error.
    let r = cli(&db, &["demo"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_one_error_line("fresh database");

    // In words, on another fresh database: each scenario's heading and key figures.
    let db = support::db_name("cli_demo_words");
    let r = cli(&db, &["demo"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    for line in [
        "== MongoDB's two-phase commit",
        "== Couchbase's multi-phase transactions",
        "A has 900.00 EUR, B has 1100.00 EUR",
        "the committed view shows [A, B] → 100.00 EUR",
        "crashes before committing",
        "advanced 1",
        "insufficient_funds",
        "money in flight 13000 minor units",
        "Alice 130.00 USD, James 170.00 USD",
        "done: every step behaved as described",
    ] {
        assert!(r.stdout.contains(line), "{line:?} in:\n{}", r.stdout);
    }
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
        "pay", "adjust", "purchase", "demo", "order", "orders", "init", "account", "transfer",
        "cancel", "reverse", "sweep", "status", "verify",
    ] {
        let r = run_raw(&[cmd.into(), "--help".into()], None, &[]).await;
        assert_eq!(r.code, 0, "{cmd}: {}", r.describe());
        assert!(r.stdout.len() > 100, "{cmd}: {}", r.stdout);
    }
    // The transfer's help says what its exit codes mean.
    let r = run_raw(&["transfer".into(), "--help".into()], None, &[]).await;
    for code in ["0 done", "3 cancelled", "2 invalid input", "1 operational"] {
        assert!(r.stdout.contains(code), "{code}: {}", r.stdout);
    }
}

// ---- accounts, transfers, the sweeper --------------------------------------------------------

/// A ledger on a fresh database (design documents installed) and the database's name.
async fn fresh(test: &str) -> (Ledger, String) {
    let l = support::ledger(test).await;
    let db = l.client().database().to_owned();
    (l, db)
}

/// `account create ID --currency EUR --opening OPENING` through the program.
async fn open_eur(db: &str, id: &str, opening: &str) {
    let r = cli(
        db,
        &[
            "account",
            "create",
            id,
            "--currency",
            "EUR",
            "--opening",
            opening,
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["id"], format!("account:{id}"));
    assert_eq!(v["status"], "created");
}

/// An account's balance in minor units, as `account show --json` reports it.
async fn balance_of(db: &str, id: &str) -> i64 {
    let r = cli(db, &["account", "show", id, "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    r.json()["balance"].as_i64().expect("an integer balance")
}

/// `transfer --from FROM --to TO --amount AMOUNT --currency EUR` plus `extra`, with --json.
async fn transfer_eur(db: &str, from: &str, to: &str, amount: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "transfer",
        "--from",
        from,
        "--to",
        to,
        "--amount",
        amount,
        "--currency",
        "EUR",
        "--json",
    ];
    args.extend_from_slice(extra);
    cli(db, &args).await
}

/// `status --json`.
async fn status_json(db: &str) -> Value {
    let r = cli(db, &["status", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    r.json()
}

#[tokio::test]
async fn the_transfer_tutorial_through_the_command_line() {
    let db = support::db_name("cli_tutorial");
    let r = cli(&db, &["init"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    open_eur(&db, "A", "1000.00").await;
    open_eur(&db, "B", "1000.00").await;

    let r = transfer_eur(&db, "A", "B", "100", &[]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["state"], "done", "{v}");
    assert_eq!(v["reason"], Value::Null);
    assert_eq!(v["status"], "created");
    assert!(!v["id"].as_str().unwrap().is_empty());

    let r = cli(&db, &["account", "show", "A", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let a = r.json();
    assert_eq!(a["account"], "A");
    assert_eq!(a["currency"], "EUR");
    assert_eq!(a["balance"], 90_000);
    assert_eq!(a["available"], 90_000);
    assert_eq!(a["posted"], 90_000);
    assert_eq!(a["min_balance"], 0);
    assert_eq!(a["pending"], serde_json::json!([]));
    assert_eq!(balance_of(&db, "B").await, 110_000);
    // People read decimals with the currency.
    let r = cli(&db, &["account", "show", "B"]).await;
    assert!(r.stdout.contains("1100.00 EUR"), "{}", r.describe());

    let r = cli(&db, &["verify", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["ok"], true, "{v}");
    let checks = v["checks"].as_array().unwrap();
    for name in [
        "conservation",
        "exactly_once",
        "no_overdraft",
        "termination",
    ] {
        let c = checks.iter().find(|c| c["name"] == name).expect(name);
        assert_eq!(c["ok"], true, "{c}");
        assert!(c["detail"].as_str().is_some_and(|d| !d.is_empty()), "{c}");
    }
    let r = cli(&db, &["verify", "--at-rest"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.contains("conservation"), "{}", r.describe());

    // Accounts: created once; the same terms exist; other terms are refused.
    let r = cli(
        &db,
        &[
            "account",
            "create",
            "A",
            "--currency",
            "EUR",
            "--opening",
            "1000.00",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["status"], "exists");
    let r = cli(
        &db,
        &[
            "account",
            "create",
            "A",
            "--currency",
            "EUR",
            "--opening",
            "999.00",
        ],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_one_error_line("different opening");
    let r = cli(
        &db,
        &[
            "account",
            "create",
            "issuer",
            "--currency",
            "EUR",
            "--unlimited",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    // The list is a view: on a cluster the copy that answers it may not hold the account
    // created a moment ago through another node yet. Wait for it, at most 30 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let v = loop {
        let r = cli(&db, &["account", "list", "--json"]).await;
        assert_eq!(r.code, 0, "{}", r.describe());
        let v = r.json();
        if v["accounts"].as_array().unwrap().len() == 3 {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "three accounts listed within 30 s: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let accounts = v["accounts"].as_array().unwrap();
    let issuer = accounts.iter().find(|a| a["account"] == "issuer").unwrap();
    assert_eq!(issuer["min_balance"], Value::Null, "unlimited: {issuer}");
    let r = cli(&db, &["account", "show", "nobody"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_one_error_line("no account \"nobody\"");
}

#[tokio::test]
async fn business_refusals_exit_3_and_move_nothing() {
    let (_l, db) = fresh("cli_refusals").await;
    open_eur(&db, "A", "1000.00").await;
    open_eur(&db, "B", "1000.00").await;
    let r = cli(
        &db,
        &[
            "account",
            "create",
            "U",
            "--currency",
            "USD",
            "--opening",
            "10",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());

    for (from, to, amount, reason) in [
        ("A", "B", "1000.01", "insufficient_funds"),
        ("A", "nobody", "1", "unknown_account"),
        ("nobody", "B", "1", "unknown_account"),
        ("A", "U", "1", "currency_mismatch"),
    ] {
        let r = transfer_eur(&db, from, to, amount, &[]).await;
        assert_eq!(r.code, 3, "{from}→{to} {amount}: {}", r.describe());
        let v = r.json();
        assert_eq!(v["state"], "cancelled", "{v}");
        assert_eq!(v["reason"], reason, "{v}");
        assert_eq!(balance_of(&db, "A").await, 100_000);
        assert_eq!(balance_of(&db, "B").await, 100_000);
    }
    // In words too, with the same exit code.
    let r = cli(
        &db,
        &[
            "transfer",
            "--from",
            "A",
            "--to",
            "B",
            "--amount",
            "5000",
            "--currency",
            "EUR",
        ],
    )
    .await;
    assert_eq!(r.code, 3, "{}", r.describe());
    assert!(r.stdout.contains("insufficient_funds"), "{}", r.describe());
    // The whole balance may go; not a cent more (above).
    let r = transfer_eur(&db, "A", "B", "1000.00", &[]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(balance_of(&db, "A").await, 0);
}

/// `(from, to, amount, currency, extra flags, what the error line mentions)`.
type BadTransfer<'a> = (&'a str, &'a str, &'a str, &'a str, &'a [&'a str], &'a str);

#[tokio::test]
async fn bad_transfers_are_exit_2_and_write_nothing() {
    let (l, db) = fresh("cli_bad_transfers").await;
    open_eur(&db, "A", "1000.00").await;
    open_eur(&db, "B", "1000.00").await;
    let before = db_state(&l).await;
    let cases: [BadTransfer; 9] = [
        ("A", "A", "1", "EUR", &[], "two accounts"),
        ("A", "B", "0", "EUR", &[], "greater than zero"),
        ("A", "B", "-5", "EUR", &[], "greater than zero"),
        ("A", "B", "1.234", "EUR", &[], "2 decimal places"),
        ("A", "B", "abc", "EUR", &[], "not a decimal number"),
        ("A", "B", "1", "XXX", &[], "\"XXX\""),
        ("A", "B", "1", "EUR", &["--id", "_x"], "begins with '_'"),
        ("A", "B", "1", "EUR", &["--id", "a:b"], "':'"),
        ("_A", "B", "1", "EUR", &[], "begins with '_'"),
    ];
    for (from, to, amount, currency, extra, mentions) in cases {
        for json in [false, true] {
            let mut args = vec![
                "transfer",
                "--from",
                from,
                "--to",
                to,
                "--amount",
                amount,
                "--currency",
                currency,
            ];
            args.extend_from_slice(extra);
            if json {
                args.push("--json");
            }
            let r = cli(&db, &args).await;
            assert_eq!(r.code, 2, "{args:?}: {}", r.describe());
            r.assert_error_output(json, "invalid_input");
            r.assert_one_error_line(mentions);
        }
    }
    // An opening below the minimum is said in the currency's units, as it was typed.
    let r = cli(
        &db,
        &[
            "account",
            "create",
            "eve",
            "--currency",
            "EUR",
            "--opening",
            "-5",
        ],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_one_error_line("-5.00 EUR is below the account's minimum balance 0.00 EUR");
    assert_eq!(db_state(&l).await, before, "bad input wrote something");

    // An idempotency key: the same terms again are "exists"; other terms are refused.
    let r = transfer_eur(&db, "A", "B", "100", &["--id", "k1"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["status"], "created");
    let before = db_state(&l).await;
    let r = transfer_eur(&db, "A", "B", "200", &["--id", "k1"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_error_output(true, "mismatch");
    r.assert_one_error_line("different value");
    r.assert_one_error_line("--amount");
    let r = transfer_eur(&db, "A", "B", "100", &["--id", "k1"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(
        (v["id"].as_str(), v["status"].as_str(), v["state"].as_str()),
        (Some("k1"), Some("exists"), Some("done")),
        "{v}"
    );
    assert_eq!(
        db_state(&l).await,
        before,
        "a re-sent transfer wrote something"
    );
    assert_eq!(balance_of(&db, "A").await, 90_000, "moved once");
    assert_eq!(balance_of(&db, "B").await, 110_000);
}

#[tokio::test]
async fn a_transfer_left_for_the_sweeper_is_finished_by_sweep_once() {
    let (_l, db) = fresh("cli_sweep_once").await;
    open_eur(&db, "A", "1000.00").await;
    open_eur(&db, "B", "1000.00").await;
    let r = transfer_eur(&db, "A", "B", "100", &["--id", "later", "--no-wait"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(
        (v["id"].as_str(), v["state"].as_str(), v["reason"].is_null()),
        (Some("later"), Some("initial"), true),
        "{v}"
    );
    let s = status_json(&db).await;
    assert_eq!(s["states"]["initial"], 1, "{s}");
    assert_eq!(s["states"]["done"], 0, "{s}");
    assert!(s["oldest_open_age_s"].is_u64(), "{s}");
    assert_eq!(s["in_flight"], 0, "initial is not in flight yet: {s}");
    assert_eq!(balance_of(&db, "A").await, 100_000, "nothing moved yet");

    // The default stale-after (30 s) leaves a fresh transfer alone, and says so.
    let r = cli(&db, &["sweep", "--once", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["advanced"], 0, "{v}");
    assert_eq!(v["remaining"], 1, "{v}");
    let r = cli(&db, &["sweep", "--once"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(
        r.stdout
            .contains("taken over once untouched for --stale-after (30s)"),
        "{}",
        r.describe()
    );

    let r = cli(&db, &["sweep", "--once", "--stale-after", "0s", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    for field in [
        "examined",
        "advanced",
        "cancelled",
        "skipped",
        "failed",
        "remaining",
        "repaired_markers",
    ] {
        assert!(v[field].is_u64(), "{field}: {v}");
    }
    assert!(v["advanced"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["remaining"], 0, "{v}");
    assert_eq!(v["failed"], 0, "{v}");

    let s = status_json(&db).await;
    assert_eq!(s["states"]["done"], 1, "{s}");
    assert_eq!(s["states"]["initial"], 0, "{s}");
    assert_eq!(s["oldest_open_age_s"], Value::Null, "{s}");
    let r = cli(&db, &["transfer", "show", "later", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["state"], "done", "{v}");
    assert_eq!(v["amount"], 10_000, "{v}");
    assert_eq!(balance_of(&db, "A").await, 90_000);
    assert_eq!(balance_of(&db, "B").await, 110_000);

    // Nothing left: a second pass does nothing, and the money moved once.
    let r = cli(&db, &["sweep", "--once", "--stale-after", "0s"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.contains("advanced 0"), "{}", r.describe());
    assert_eq!(balance_of(&db, "A").await, 90_000);

    // Bad sweep options are usage errors.
    for args in [
        vec!["sweep"],
        vec!["sweep", "--once", "--watch"],
        vec!["sweep", "--once", "--stale-after", "soon"],
        vec!["sweep", "--once", "--batch", "0"],
    ] {
        let r = cli(&db, &args).await;
        assert_eq!(r.code, 2, "{args:?}: {}", r.describe());
        assert!(r.stdout.is_empty(), "{args:?}: {}", r.describe());
    }
}

#[tokio::test]
async fn cancel_and_reverse_on_the_command_line() {
    let (l, db) = fresh("cli_cancel_reverse").await;
    open_eur(&db, "A", "1000.00").await;
    open_eur(&db, "B", "1000.00").await;

    // Cancelled before it started.
    let r = transfer_eur(&db, "A", "B", "10", &["--id", "early", "--no-wait"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let r = cli(&db, &["cancel", "early", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(
        (v["id"].as_str(), v["state"].as_str(), v["reason"].as_str()),
        (Some("early"), Some("cancelled"), Some("cancelled_by_user")),
        "{v}"
    );
    // Cancelled again: reported as it is.
    let r = cli(&db, &["cancel", "early", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["state"], "cancelled");

    // Cancelled half-way: begun and applied to both accounts (by the library), then cancelled
    // on the command line: every applied delta is undone.
    let r = transfer_eur(&db, "A", "B", "20", &["--id", "halfway", "--no-wait"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(
        l.step("halfway").await.unwrap().state,
        couch_ledger::State::Pending
    );
    l.step("halfway").await.unwrap();
    assert_eq!(balance_of(&db, "A").await, 98_000, "applied");
    let r = cli(&db, &["cancel", "halfway", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["state"], "cancelled");
    assert_eq!(balance_of(&db, "A").await, 100_000, "undone");
    assert_eq!(balance_of(&db, "B").await, 100_000, "undone");

    // A done transfer cannot be cancelled; it is reversed, once.
    let r = transfer_eur(&db, "A", "B", "100", &["--id", "t1"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let r = cli(&db, &["cancel", "t1", "--json"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    r.assert_error_output(true, "invalid_input");
    r.assert_one_error_line("reverse it instead");
    let r = cli(&db, &["reverse", "t1", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(
        (v["id"].as_str(), v["state"].as_str(), v["status"].as_str()),
        (Some("rev-t1"), Some("done"), Some("created")),
        "{v}"
    );
    assert_eq!(v["reverses"], "t1");
    let r = cli(&db, &["reverse", "t1", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(
        (v["id"].as_str(), v["status"].as_str()),
        (Some("rev-t1"), Some("exists")),
        "{v}"
    );
    assert_eq!(balance_of(&db, "A").await, 100_000, "back to the start");
    assert_eq!(balance_of(&db, "B").await, 100_000, "back to the start");

    // Refused requests: exit 2, one line.
    for (args, mentions) in [
        (vec!["cancel", "nope"], "no transfer \"nope\""),
        (vec!["reverse", "nope"], "no transfer \"nope\""),
        (vec!["transfer", "show", "nope"], "no transfer \"nope\""),
        (vec!["reverse", "early"], "only a done transfer"),
        (vec!["cancel", "_bad"], "begins with '_'"),
    ] {
        let r = cli(&db, &args).await;
        assert_eq!(r.code, 2, "{args:?}: {}", r.describe());
        r.assert_one_error_line(mentions);
    }
    let r = cli(&db, &["verify", "--at-rest", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["ok"], true);
}

#[tokio::test]
async fn sweep_watch_runs_until_sigterm_and_prints_its_totals() {
    let (l, db) = fresh("cli_sweep_watch").await;
    open_eur(&db, "A", "1000.00").await;
    open_eur(&db, "B", "1000.00").await;
    let mut args = server_args(&db);
    args.extend(
        ["sweep", "--watch", "--stale-after", "0s", "--json"]
            .iter()
            .map(|s| s.to_string()),
    );
    let child = tokio::process::Command::new(BIN)
        .args(&args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run couch-ledger sweep --watch");
    let pid = child.id().expect("a running child").to_string();

    let r = transfer_eur(&db, "A", "B", "100", &["--id", "w1", "--no-wait"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["state"], "initial");
    support::wait_for(
        "the watching sweeper to finish w1",
        Duration::from_secs(60),
        || {
            let l = l.clone();
            async move {
                let s = l.status().await.ok()?;
                (s.states.done == 1 && s.states.open() == 0).then_some(())
            }
        },
    )
    .await;

    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(kill.success());
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("sweep --watch stops on SIGTERM")
        .unwrap();
    let run = Run {
        code: out.status.code().expect("exited, not killed by the signal"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    };
    assert_eq!(run.code, 0, "{}", run.describe());
    let v = run.json();
    assert!(v["advanced"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["remaining"], 0, "{v}");
    assert_eq!(v["failed"], 0, "{v}");
    assert!(run.stderr.contains("sweep pass"), "{}", run.describe());
    assert_eq!(balance_of(&db, "A").await, 90_000);
    assert_eq!(balance_of(&db, "B").await, 110_000);
}

#[tokio::test]
async fn verify_exits_1_and_names_the_broken_invariant() {
    let (_l, db) = fresh("cli_verify_broken").await;
    open_eur(&db, "A", "1000.00").await;
    open_eur(&db, "B", "1000.00").await;
    let r = transfer_eur(&db, "A", "B", "100", &[]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let r = cli(&db, &["verify", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());

    // Money from nowhere, written around the library (validation allows a balance change).
    let url = support::raw_url(&format!("{db}/account%3AA"));
    let mut doc: Value = support::auth(support::raw().get(&url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    doc["balance"] = serde_json::json!(doc["balance"].as_i64().unwrap() + 1);
    let put = support::auth(support::raw().put(&url))
        .json(&doc)
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());

    // On several copies `verify` reads through views and `_changes` of one copy of each shard
    // range, which may not hold the forged write yet.
    let r =
        support::again_on_several_copies(&db, || cli(&db, &["verify", "--json"]), |r| r.code != 0)
            .await;
    assert_eq!(r.code, 1, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["ok"], false, "{v}");
    let conservation = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "conservation")
        .expect("a conservation check");
    assert_eq!(conservation["ok"], false, "{conservation}");
    r.assert_one_error_line("conservation");
    let r = cli(&db, &["verify"]).await;
    assert_eq!(r.code, 1, "{}", r.describe());
    assert!(r.stdout.contains("FAIL"), "{}", r.describe());
}

#[tokio::test]
async fn a_split_ledger_through_the_command_line() {
    let db = support::db_name("cli_split");
    let hot = format!("{db}_hot");
    let r = cli(&db, &["--hot-db", &hot, "init", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    assert_eq!(v["database"], db.as_str());
    assert_eq!(v["hot"]["database"], hot.as_str());
    assert_eq!(v["hot"]["created"], true);
    let hot_docs: Vec<&str> = v["hot"]["design_docs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(hot_docs, ["_design/transactions"], "{v}");

    // The environment variable does the same as the option.
    let env_run = |args: &'static [&'static str]| {
        let mut all = server_args(&db);
        all.extend(args.iter().map(|s| s.to_string()));
        let hot = hot.clone();
        async move { run_raw(&all, None, &[("LEDGER_HOT_DB", hot.as_str())]).await }
    };
    for args in [
        &[
            "account",
            "create",
            "a",
            "--currency",
            "EUR",
            "--opening",
            "10",
            "--json",
        ][..],
        &["account", "create", "b", "--currency", "EUR", "--json"][..],
        &[
            "transfer",
            "--from",
            "a",
            "--to",
            "b",
            "--amount",
            "2.50",
            "--currency",
            "EUR",
            "--json",
        ][..],
    ] {
        let r = env_run(args).await;
        assert_eq!(r.code, 0, "{}", r.describe());
    }
    let r = env_run(&["account", "show", "b", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["balance"], 250);
    let r = env_run(&["verify", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["ok"], true);
    let r = env_run(&["status", "--json"]).await;
    assert_eq!(r.json()["states"]["done"], 1, "{}", r.describe());
    // What is missing is said missing from the database that would hold it.
    let r = env_run(&["transfer", "show", "nope", "--json"]).await;
    assert_eq!(r.code, 2, "{}", r.describe());
    let said = r.json()["message"].as_str().unwrap_or_default().to_owned();
    assert!(said.ends_with(&format!("in database {hot}")), "{said}");
    let r = env_run(&["account", "history", "nope", "--json"]).await;
    let said = r.json()["message"].as_str().unwrap_or_default().to_owned();
    assert!(said.ends_with(&format!("in database {hot}")), "{said}");

    // The accounts are in the hot database, not in the ledger's.
    let main: Vec<String> = support::db_snapshot(&db)
        .await
        .revs
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(
        main.iter().all(|id| !id.starts_with("account:")),
        "{main:?}"
    );
    let in_hot: Vec<String> = support::db_snapshot(&hot)
        .await
        .revs
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(in_hot.contains(&"account:b".to_owned()), "{in_hot:?}");
    // Without --hot-db the same database has no such account: exit 1, said plainly.
    let r = cli(&db, &["account", "show", "b"]).await;
    assert_ne!(r.code, 0, "{}", r.describe());
}

// ---- dev-server and the README's by-hand path -------------------------------------------------

/// The README, whose by-hand commands the test below runs as written.
const README: &str = include_str!("../../../README.md");

/// The lines of the README's first `sh` block under "## By hand".
fn readme_by_hand() -> Vec<&'static str> {
    let (_, section) = README
        .split_once("\n## By hand")
        .expect("the README has a \"## By hand\" section");
    let (_, block) = section
        .split_once("```sh\n")
        .expect("the by-hand section has a sh block");
    let (block, _) = block.split_once("```").expect("the sh block ends");
    block.lines().collect()
}

/// A free loopback port (free when asked; the server binds it right after).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    listener.local_addr().unwrap().port()
}

/// `couch-ledger dev-server` running in the foreground, as a person starts it.
struct DevServerRun {
    child: tokio::process::Child,
    url: String,
    stdout: String,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl DevServerRun {
    /// Starts it on `port` with its data in `dir`, and waits for the line with its URL (the
    /// first run of a new pinned version installs the server: minutes, not seconds).
    async fn start(port: u16, dir: &std::path::Path) -> DevServerRun {
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
        let mut child = tokio::process::Command::new(BIN)
            .args(["dev-server", "--port", &port.to_string(), "--dir"])
            .arg(dir)
            .env_remove("RUST_LOG")
            .env_remove("COUCH_LEDGER_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run couch-ledger dev-server");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = format!("http://127.0.0.1:{port}");
        let mut stdout = String::new();
        let found = tokio::time::timeout(Duration::from_secs(300), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                stdout.push_str(&line);
                stdout.push('\n');
                if line.contains("listening on") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(
            found,
            Ok(true),
            "dev-server printed its URL line in time; stdout: {stdout}; stderr: {}",
            stderr.lock().unwrap()
        );
        assert!(stdout.contains(&url), "{stdout}");
        // The rest of what it prints at start (how to use it), then nothing until it stops.
        let rest = tokio::time::timeout(Duration::from_secs(10), async {
            let mut rest = String::new();
            while let Some(line) = lines.next_line().await.unwrap() {
                rest.push_str(&line);
                rest.push('\n');
                if line.contains("stops it") {
                    break;
                }
            }
            rest
        })
        .await
        .expect("dev-server says how to use and stop it");
        stdout.push_str(&rest);
        DevServerRun {
            child,
            url,
            stdout,
            stderr,
        }
    }

    /// Sends SIGTERM, asserts it exits 0 in time and that nothing listens on its port after.
    async fn stop_with_sigterm(mut self) {
        let pid = self.child.id().expect("running").to_string();
        let kill = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(kill.success());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("dev-server stops on SIGTERM")
            .unwrap();
        let stderr = self.stderr.lock().unwrap().clone();
        assert_eq!(status.code(), Some(0), "{stderr}");
        // The server's own process is gone with it: its port closes.
        let addr: std::net::SocketAddr = self.url.trim_start_matches("http://").parse().unwrap();
        support::wait_for(
            "the dev server's port to close",
            Duration::from_secs(10),
            || async move {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                    .is_err()
                    .then_some(())
            },
        )
        .await;
    }
}

/// An account's balance on the server at `url` (the default database), through the program.
async fn balance_at(url: &str, account: &str) -> i64 {
    let args = ["--url", url, "--json", "account", "show", account].map(String::from);
    let r = run_raw(&args, None, &[]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    r.json()["balance"].as_i64().unwrap()
}

#[tokio::test]
async fn dev_server_runs_the_readme_by_hand_and_stops_on_sigterm() {
    let data = support::TempDir::new("couch-ledger-dev-server");
    let port = free_port();
    let dev = DevServerRun::start(port, data.path()).await;
    assert!(
        dev.stdout
            .contains(&format!("export COUCHDB_URL={}", dev.url)),
        "{}",
        dev.stdout
    );
    assert!(dev.stdout.contains("couch-ledger init"), "{}", dev.stdout);

    // The README's block as a shell script, as written: its first line is the dev-server
    // (running above); the rest runs in a shell where `couch-ledger` is this build and the
    // README's 127.0.0.1:5984 is our port.
    let lines = readme_by_hand();
    assert!(
        lines[0].starts_with("couch-ledger dev-server"),
        "the by-hand path starts with the dev-server: {lines:?}"
    );
    let script = format!("set -e\n{}\n", lines[1..].join("\n"))
        .replace("127.0.0.1:5984", &format!("127.0.0.1:{port}"));
    assert!(script.contains("export COUCHDB_URL="), "{script}");
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("sh")
            .args(["-c", &script])
            .env("PATH", path)
            .env_remove("RUST_LOG")
            .env_remove("COUCHDB_URL")
            .env_remove("COUCHDB_USER")
            .env_remove("COUCHDB_PASSWORD")
            .env_remove("LEDGER_DB")
            .env_remove("LEDGER_HOT_DB")
            .env_remove("COUCH_LEDGER_CONFIG")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the README's commands finish in time")
    .unwrap();
    let said = format!(
        "{script}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");

    // What the README's comments say the commands leave.
    assert_eq!(balance_at(&dev.url, "alice").await, 90_000, "{said}");
    assert_eq!(balance_at(&dev.url, "shop").await, 10_000, "{said}");
    dev.stop_with_sigterm().await;

    // The data is kept: a second run on the same directory has the accounts.
    let dev = DevServerRun::start(port, data.path()).await;
    assert_eq!(balance_at(&dev.url, "alice").await, 90_000);
    dev.stop_with_sigterm().await;
}
