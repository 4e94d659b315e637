//! Ecosystem fit, through the program as a user runs it: every ISO-4217 currency
//! (`iso_currency`), durations in `humantime`'s syntax, shell completions (`clap_complete`),
//! the configuration file (`--config`), Cloudant IAM against a stand-in token endpoint
//! (wiremock), and the demo run from another directory.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use couch_ledger::{Client, RetryPolicy};
use serde_json::{json, Value};
use wiremock::matchers::{body_string_contains, header, method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

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
    run_with(args, &[], None).await
}

/// Runs the program with `args`, the settings' environment cleared then `env` set, in `dir`
/// (the test's working directory when `None`).
async fn run_with(args: &[&str], env: &[(&str, &str)], dir: Option<&Path>) -> Run {
    let mut command = tokio::process::Command::new(BIN);
    command.args(args);
    for var in [
        "RUST_LOG",
        "COUCHDB_URL",
        "COUCHDB_USER",
        "COUCHDB_PASSWORD",
        "LEDGER_DB",
        "COUCH_LEDGER_CONFIG",
        "COUCH_LEDGER_IAM_API_KEY",
        "COUCH_LEDGER_IAM_TOKEN_URL",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let child = command
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
    // Every form docs/CLI.md documents.
    for dur in ["0s", "500ms", "30s", "5m"] {
        let r = on(&db, &["sweep", "--once", "--stale-after", dur, "--json"]).await;
        assert_eq!(r.code, 0, "{dur}: {}", r.describe());
    }
    // `--timeout 250ms` is taken: against a server that accepts the connection and never
    // answers, the failure is that wait running out (exit 1), not the flag (exit 2). (A port
    // closed for the test could be taken meanwhile by another test's server.)
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let r = run(&["--url", &url, "--timeout", "250ms", "status"]).await;
    assert_eq!(r.code, 1, "{}", r.describe());
    assert!(
        r.stderr.contains("did not answer within"),
        "{}",
        r.describe()
    );
    // Bad durations: exit 2, one line naming the flag, nothing sent.
    // (`--flag=VALUE`, so that clap takes `-1s` as a value, not as a flag.)
    for bad in ["soon", "5", "1h30", "-1s", "5 parsecs", ""] {
        let r = run(&["--url", &url, &format!("--timeout={bad}"), "status"]).await;
        r.assert_invalid("--timeout");
        let r = on(&db, &["sweep", "--once", &format!("--stale-after={bad}")]).await;
        r.assert_invalid("--stale-after");
    }
    drop(silent);
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

// ---- the configuration file ----------------------------------------------------------------

/// Whether database `db` exists on the test server.
async fn database_exists(db: &str) -> bool {
    let reply = support::auth(support::raw().get(support::raw_url(db)))
        .send()
        .await
        .unwrap();
    reply.status().is_success()
}

#[tokio::test]
async fn the_config_file_alone_reaches_the_database_and_options_and_environment_override_it() {
    let s = support::server();
    let tmp = support::TempDir::new("cl-eco-config");
    let dir = tmp.path();
    let (in_file, in_env, on_line) = (
        support::db_name("eco_cfg_file"),
        support::db_name("eco_cfg_env"),
        support::db_name("eco_cfg_flag"),
    );
    let mut toml = format!(
        "# written by the test\nurl = {:?}\ndb = {in_file:?}\ntimeout = \"1m30s\"\n",
        s.url
    );
    if let Some(user) = &s.user {
        std::fs::write(dir.join("password"), s.password.clone().unwrap_or_default()).unwrap();
        toml.push_str(&format!("user = {user:?}\npassword_file = \"password\"\n"));
    }
    let config = dir.join("ledger.toml");
    std::fs::write(&config, toml).unwrap();
    let config = config.to_str().unwrap();

    // --config alone: the file's server and database.
    let r = run(&["--config", config, "--json", "init"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["database"], in_file.as_str(), "{}", r.describe());
    assert!(database_exists(&in_file).await);
    // COUCH_LEDGER_CONFIG names it as well.
    let r = run_with(
        &["--json", "status"],
        &[("COUCH_LEDGER_CONFIG", config)],
        None,
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    // The environment overrides the file…
    let r = run_with(
        &["--config", config, "--json", "init"],
        &[("LEDGER_DB", in_env.as_str())],
        None,
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["database"], in_env.as_str());
    // …and an option overrides the environment.
    let r = run_with(
        &["--config", config, "--db", &on_line, "--json", "init"],
        &[("LEDGER_DB", in_env.as_str())],
        None,
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["database"], on_line.as_str());
    assert!(database_exists(&in_env).await && database_exists(&on_line).await);
    // The file's url is overridden too: --url to a closed port fails, exit 1.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = run(&[
        "--config",
        config,
        "--url",
        &format!("http://127.0.0.1:{closed}"),
        "--timeout",
        "2s",
        "status",
    ])
    .await;
    assert_eq!(r.code, 1, "{}", r.describe());
    // A missing file and an unknown key are usage errors naming the file.
    let r = run(&["--config", "/nonexistent/ledger.toml", "status"]).await;
    r.assert_invalid("/nonexistent/ledger.toml");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "databse = \"x\"\n").unwrap();
    let r = run(&["--config", bad.to_str().unwrap(), "status"]).await;
    r.assert_invalid("databse");
}

// ---- Cloudant IAM ----------------------------------------------------------------------------

const IAM_KEY: &str = "iam-key-Qx81-never-shown";

/// The stand-in's token endpoint path.
const TOKEN_PATH: &str = "/identity/token";

/// An IAM token reply.
fn token(access_token: &str, expires_in: u64) -> ResponseTemplate {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    ResponseTemplate::new(200).set_body_json(json!({
        "access_token": access_token,
        "refresh_token": "not-used",
        "token_type": "Bearer",
        "expires_in": expires_in,
        "expiration": now + expires_in,
        "scope": "ibm openid"
    }))
}

/// Token replies in order, repeating the last one.
struct Tokens {
    replies: Vec<ResponseTemplate>,
    next: AtomicUsize,
}

impl Respond for Tokens {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let i = self.next.fetch_add(1, Ordering::SeqCst);
        self.replies[i.min(self.replies.len() - 1)].clone()
    }
}

/// The token endpoint: the right key, as IAM's form, gets `replies` in order; any other key
/// is refused as IAM refuses it (400, BXNIM0415E).
async fn token_endpoint(server: &MockServer, replies: Vec<ResponseTemplate>) {
    Mock::given(method("POST"))
        .and(path(TOKEN_PATH))
        .and(header("accept", "application/json"))
        .and(header("content-type", "application/x-www-form-urlencoded"))
        .and(body_string_contains(
            "grant_type=urn%3Aibm%3Aparams%3Aoauth%3Agrant-type%3Aapikey",
        ))
        .and(body_string_contains(format!("apikey={IAM_KEY}")))
        .respond_with(Tokens {
            replies,
            next: AtomicUsize::new(0),
        })
        .with_priority(1)
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path(TOKEN_PATH))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "errorCode": "BXNIM0415E",
            "errorMessage": "Provided API key could not be found.",
            "context": {"requestId": "r1"}
        })))
        .with_priority(2)
        .mount(server)
        .await;
}

/// A CouchDB stand-in's document `db/doc`, served only with `Bearer {token}`.
async fn doc_for_bearer(server: &MockServer, token: &str, status: u16) {
    let reply = if status == 200 {
        ResponseTemplate::new(200).set_body_json(json!({"_id": "doc", "_rev": "1-a", "n": 1}))
    } else {
        ResponseTemplate::new(status)
            .set_body_json(json!({"error": "unauthorized", "reason": "token expired"}))
    };
    Mock::given(method("GET"))
        .and(path("/db/doc"))
        .and(header("authorization", format!("Bearer {token}").as_str()))
        .respond_with(reply)
        .with_priority(1)
        .mount(server)
        .await;
}

/// Everything else is refused as CouchDB refuses a request without valid credentials.
async fn refuse_the_rest(server: &MockServer) {
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(401).set_body_json(
            json!({"error": "unauthorized", "reason": "You are not authorized to access this db."}),
        ))
        .with_priority(10)
        .mount(server)
        .await;
}

fn iam_client(server: &MockServer, key: &str) -> Client {
    Client::builder()
        .url(server.uri())
        .database("db")
        .iam_api_key(key)
        .iam_token_url(format!("{}{TOKEN_PATH}", server.uri()))
        .request_timeout(Duration::from_secs(10))
        .retry(RetryPolicy {
            retries_max: 3,
            delay_base: Duration::from_millis(1),
            delay_max: Duration::from_millis(10),
            retry_after_max: Duration::from_millis(10),
        })
        .build()
        .expect("client")
}

/// How many requests the server received for `path`, and the `Authorization` headers of those.
async fn requests_to(server: &MockServer, path: &str) -> Vec<Option<String>> {
    server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.path() == path)
        .map(|r| {
            r.headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test]
async fn an_iam_key_is_exchanged_and_its_bearer_token_reaches_the_server() {
    let server = MockServer::start().await;
    token_endpoint(&server, vec![token("tok-1", 3600)]).await;
    doc_for_bearer(&server, "tok-1", 200).await;
    refuse_the_rest(&server).await;
    let c = iam_client(&server, IAM_KEY);
    let debug = format!("{c:?}");
    assert!(!debug.contains(IAM_KEY), "{debug}");
    for _ in 0..3 {
        let doc: Value = c.get("doc").await.expect("the bearer token is accepted");
        assert_eq!(doc["n"], 1);
    }
    // One exchange, reused while the token is fresh; every request carried it.
    assert_eq!(requests_to(&server, TOKEN_PATH).await.len(), 1);
    let sent = requests_to(&server, "/db/doc").await;
    assert_eq!(sent.len(), 3);
    assert!(
        sent.iter().all(|h| h.as_deref() == Some("Bearer tok-1")),
        "{sent:?}"
    );
    // A client for another database shares the token.
    Mock::given(method("GET"))
        .and(path("/other"))
        .and(header("authorization", "Bearer tok-1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"db_name": "other"})))
        .with_priority(1)
        .mount(&server)
        .await;
    let other = c.with_database("other").unwrap();
    let info = other
        .database_info()
        .await
        .expect("the shared token is accepted");
    assert_eq!(info["db_name"], "other");
    assert_eq!(requests_to(&server, TOKEN_PATH).await.len(), 1);
    assert_eq!(
        requests_to(&server, "/other").await,
        vec![Some("Bearer tok-1".to_owned())]
    );
}

#[tokio::test]
async fn a_short_lived_token_is_refreshed_before_it_expires() {
    let server = MockServer::start().await;
    // The first token lives 4 s: reused for its first half, replaced after.
    token_endpoint(&server, vec![token("tok-1", 4), token("tok-2", 3600)]).await;
    doc_for_bearer(&server, "tok-1", 200).await;
    doc_for_bearer(&server, "tok-2", 200).await;
    refuse_the_rest(&server).await;
    let c = iam_client(&server, IAM_KEY);
    let first = Instant::now();
    let _: Value = c.get("doc").await.unwrap();
    let _: Value = c.get("doc").await.unwrap();
    assert_eq!(requests_to(&server, TOKEN_PATH).await.len(), 1, "reused");
    support::wait_for("the refreshed token", Duration::from_secs(15), || {
        let c = c.clone();
        let server = &server;
        async move {
            let _: Value = c.get("doc").await.unwrap();
            let sent = requests_to(server, "/db/doc").await;
            (sent.last().unwrap().as_deref() == Some("Bearer tok-2")).then_some(())
        }
    })
    .await;
    let refreshed_after = first.elapsed();
    assert!(
        refreshed_after >= Duration::from_millis(1900),
        "refreshed after {refreshed_after:?}, before half of its life"
    );
    assert_eq!(requests_to(&server, TOKEN_PATH).await.len(), 2);
    // Never a request with an expired token: tok-1 only in its first 4 s.
    assert!(
        refreshed_after < Duration::from_secs(4),
        "{refreshed_after:?}"
    );
}

#[tokio::test]
async fn a_401_is_retried_once_with_a_new_token() {
    let server = MockServer::start().await;
    token_endpoint(&server, vec![token("tok-1", 3600), token("tok-2", 3600)]).await;
    // The server no longer takes tok-1 (revoked), takes tok-2.
    doc_for_bearer(&server, "tok-1", 401).await;
    doc_for_bearer(&server, "tok-2", 200).await;
    refuse_the_rest(&server).await;
    let c = iam_client(&server, IAM_KEY);
    let doc: Value = c.get("doc").await.expect("retried with a new token");
    assert_eq!(doc["n"], 1);
    assert_eq!(requests_to(&server, TOKEN_PATH).await.len(), 2);
    assert_eq!(
        requests_to(&server, "/db/doc").await,
        vec![Some("Bearer tok-1".into()), Some("Bearer tok-2".into())]
    );

    // A server that refuses every token: one retry, then its 401.
    let server = MockServer::start().await;
    token_endpoint(&server, vec![token("tok-1", 3600), token("tok-2", 3600)]).await;
    doc_for_bearer(&server, "tok-1", 401).await;
    doc_for_bearer(&server, "tok-2", 401).await;
    refuse_the_rest(&server).await;
    let c = iam_client(&server, IAM_KEY);
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_unauthorized(), "{e}");
    assert_eq!(requests_to(&server, "/db/doc").await.len(), 2);
    assert_eq!(requests_to(&server, TOKEN_PATH).await.len(), 2);
}

#[tokio::test]
async fn a_refused_key_is_a_clear_error_never_retried_never_shown() {
    let server = MockServer::start().await;
    token_endpoint(&server, vec![token("tok-1", 3600)]).await;
    refuse_the_rest(&server).await;
    let wrong = "wrong-key-Zq93-never-shown";
    let c = iam_client(&server, wrong);
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert_eq!(e.status_code(), Some(400), "{e}");
    assert!(!e.is_transient() && !e.is_invalid_input(), "{e}");
    let text = e.to_string();
    assert!(text.contains("refused the API key"), "{text}");
    assert!(text.contains("could not be found"), "{text}");
    for shown in [text, format!("{e:?}"), format!("{c:?}")] {
        assert!(!shown.contains(wrong), "{shown}");
    }
    // Asked once, and nothing reached the database.
    assert_eq!(requests_to(&server, TOKEN_PATH).await.len(), 1);
    assert!(requests_to(&server, "/db/doc").await.is_empty());

    // A failing endpoint (503) is transient: retried, then reported as such.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(TOKEN_PATH))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let c = iam_client(&server, IAM_KEY);
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_transient() && e.status_code() == Some(503), "{e}");
    assert_eq!(
        requests_to(&server, TOKEN_PATH).await.len(),
        4,
        "retries_max + 1"
    );
}

/// A transfer document as the stand-in serves it for `transfer show t1`.
fn transfer_doc() -> Value {
    json!({
        "_id": "txn:t1", "_rev": "3-c", "type": "transaction", "txn_id": "t1",
        "source": "alice", "destination": "shop", "value": 500, "currency": "EUR",
        "state": "done", "reason": null, "reverses": null, "claim": null,
        "created_at": 1, "last_modified": 2
    })
}

#[tokio::test]
async fn the_program_uses_an_iam_key_and_a_wrong_key_is_exit_1_unshown() {
    let server = MockServer::start().await;
    token_endpoint(&server, vec![token("tok-cli", 3600)]).await;
    Mock::given(method("GET"))
        .and(path_regex("^/ledger/txn"))
        .and(header("authorization", "Bearer tok-cli"))
        .respond_with(ResponseTemplate::new(200).set_body_json(transfer_doc()))
        .with_priority(1)
        .mount(&server)
        .await;
    refuse_the_rest(&server).await;
    let url = server.uri();
    let token_url = format!("{url}{TOKEN_PATH}");
    let base = ["--url", url.as_str(), "--iam-token-url", token_url.as_str()];
    let show = ["--json", "transfer", "show", "t1"];

    // The key on the command line, and in the environment.
    let args: Vec<&str> = base
        .iter()
        .chain(&["--iam-api-key", IAM_KEY])
        .chain(&show)
        .copied()
        .collect();
    let r = run(&args).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.json()["id"], "t1", "{}", r.describe());
    assert_eq!(r.json()["state"], "done");
    let args: Vec<&str> = base.iter().chain(&show).copied().collect();
    let r = run_with(&args, &[("COUCH_LEDGER_IAM_API_KEY", IAM_KEY)], None).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    // Without a key the stand-in refuses: 401, exit 1.
    let r = run(&args).await;
    assert_eq!(r.code, 1, "{}", r.describe());

    // A wrong key: exit 1, one error line saying so, the key nowhere (debug logs included).
    let wrong = "wrong-cli-key-Pw55-never-shown";
    for (extra, env) in [
        (vec!["--iam-api-key", wrong], vec![("RUST_LOG", "debug")]),
        (vec![], vec![("COUCH_LEDGER_IAM_API_KEY", wrong)]),
    ] {
        let args: Vec<&str> = base.iter().chain(&extra).chain(&show).copied().collect();
        let r = run_with(&args, &env, None).await;
        assert_eq!(r.code, 1, "{}", r.describe());
        assert!(r.stderr.contains("refused the API key"), "{}", r.describe());
        assert!(
            !r.stderr.contains(wrong) && !r.stdout.contains(wrong),
            "the key leaked: {}",
            r.describe()
        );
    }
    // The help says where the key comes from, never its value.
    let r = run_with(
        &["transfer", "--help"],
        &[("COUCH_LEDGER_IAM_API_KEY", wrong)],
        None,
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.contains("COUCH_LEDGER_IAM_API_KEY") && !r.stdout.contains(wrong));
}

// ---- the demo, from anywhere -----------------------------------------------------------------

#[tokio::test]
async fn the_demo_runs_from_another_directory_on_its_own_server() {
    // Nothing of the source tree is reachable from here: the program carries the pinned
    // server's files and installs them in its cache (shared with the suite's own server).
    let tmp = support::TempDir::new("cl-eco-demo");
    let dir = tmp.path();
    // No --url: the demo tries the default URL (127.0.0.1:5984) and starts its own server when
    // nothing answers there; a developer's CouchDB on that port is used instead.
    let r = run_with(&["--json", "demo"], &[], Some(dir)).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    let v = r.json();
    if r.stderr.contains("starting a local pouchdb-server") {
        assert_eq!(v["server"], "local pouchdb-server", "{}", r.describe());
    } else {
        eprintln!("a server answers on 127.0.0.1:5984: the demo used it");
    }
}

// ---- progress ----------------------------------------------------------------------------------

/// A ledger with two EUR accounts and `n` transfers left `initial` between them (as a crash
/// right after the first write leaves them): a backlog for the sweeper.
async fn backlog(test: &str, n: usize) -> couch_ledger::Ledger {
    use couch_ledger::{AccountSpec, Currency};
    let l = support::ledger(test).await;
    let eur = Currency::from_code("EUR").unwrap();
    for (id, opening) in [("payer", 1_000_000), ("payee", 0)] {
        l.create_account(AccountSpec {
            account_id: id.into(),
            currency: eur,
            opening: eur.parse(&opening.to_string()).unwrap(),
            min_balance: Some(eur.parse("0").unwrap()),
            meta: Default::default(),
        })
        .await
        .unwrap();
    }
    let docs: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "_id": format!("txn:b{i}"), "type": "transaction", "txn_id": format!("b{i}"),
                "source": "payer", "destination": "payee", "value": 100, "currency": "EUR",
                "state": "initial", "reason": null, "reverses": null, "claim": null,
                "created_at": 1, "last_modified": 1
            })
        })
        .collect();
    // On every copy: the sweeper finds them with a view, answered by any one copy.
    let every_copy = support::every_copy(l.client()).await;
    let written = l.client().bulk_docs_with(&docs, &every_copy).await.unwrap();
    assert!(
        written.iter().all(|r| r.is_ok() && !r.accepted),
        "{written:?}"
    );
    l
}

#[tokio::test]
async fn a_sweep_pass_and_verify_tell_their_progress() {
    use couch_ledger::{Progress, ProgressHook, SweepOptions};
    use std::sync::{Arc, Mutex};
    let l = backlog("eco_progress", 12).await;
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let hook = {
        let seen = seen.clone();
        ProgressHook(Arc::new(move |p| seen.lock().unwrap().push(p)))
    };
    let watched = l.to_builder().progress(hook).build().unwrap();
    let swept = watched
        .sweep_once(SweepOptions {
            limit: 100,
            stale_after: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(swept.advanced, 12, "{swept:?}");
    let sweep: Vec<Progress> = seen.lock().unwrap().drain(..).collect();
    assert_eq!(sweep.len(), 12, "one report per drive: {sweep:?}");
    assert!(sweep
        .iter()
        .all(|p| p.task == "sweep" && p.total == Some(12)));
    let done: Vec<u64> = sweep.iter().map(|p| p.done).collect();
    assert_eq!(done, (1..=12).collect::<Vec<_>>());
    // verify reads every document: its count reaches at least the transfers and accounts.
    let report = watched.verify().await.unwrap();
    assert!(report.ok, "{report:?}");
    let verify: Vec<Progress> = seen.lock().unwrap().drain(..).collect();
    assert!(!verify.is_empty() && verify.iter().all(|p| p.task == "verify"));
    assert!(verify.last().unwrap().done >= 14, "{verify:?}");
    // The ledger without the hook tells nobody.
    l.verify().await.unwrap();
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn progress_bars_only_on_a_terminal_never_in_json_or_a_pipe() {
    let l = backlog("eco_progress_cli", 30).await;
    let db = l.client().database().to_owned();
    // Piped (the test's own stdout and stderr): the output is the command's, nothing else.
    let r = on(&db, &["sweep", "--once", "--stale-after", "0s"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.starts_with("swept once:"), "{}", r.describe());
    assert!(r.stderr.is_empty(), "{}", r.describe());
    let r = on(&db, &["verify"]).await;
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stderr.is_empty(), "{}", r.describe());

    // On a terminal (a pseudo-terminal from script(1), where there is one): a bar on stderr
    // for a human, none with --json.
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("no script(1): the terminal half is skipped");
        return;
    }
    let s = support::server();
    let mut base = format!("{BIN} --url {} --db {db}", s.url);
    if let Some(user) = &s.user {
        base.push_str(&format!(
            " --user {user} --password {}",
            s.password.clone().unwrap_or_default()
        ));
    }
    let on_tty = |command: String| async move {
        let out = tokio::process::Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .env("TERM", "xterm")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, screen) = on_tty(format!("{base} verify")).await;
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains("every invariant holds"), "{screen}");
    assert!(screen.contains("reading documents"), "the bar: {screen:?}");
    let (code, screen) = on_tty(format!("{base} --json verify")).await;
    assert_eq!(code, Some(0), "{screen}");
    assert!(!screen.contains("reading documents"), "{screen}");
    let v: Value = serde_json::from_str(screen.trim()).expect("one JSON object, nothing else");
    assert_eq!(v["ok"], true);
}
