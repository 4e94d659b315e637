//! The service's contract as other programs read it. `GET /openapi.json` is validated with
//! openapi-spec-validator; schemathesis runs against the service with every check on; a
//! TypeScript client generated from the document is type-checked and runs the example flow;
//! and the answers the document promises for every path (JSON errors, 404, 405) are checked
//! here directly. The tools are pinned and installed by the harness (`support::tools`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

use super::*;
use crate::support::{self, tools, TempDir};

/// The schemathesis run: a fixed seed, so that a run repeats; examples per operation, sized
/// for about a minute on two cores. A longer run by hand: tests/contract/schemathesis.toml.
const SCHEMATHESIS_SEED: u64 = 20_250_101;
const SCHEMATHESIS_EXAMPLES: u32 = 25;
/// A tool still running after this long is stopped, and its test fails.
const TOOL_TIMEOUT: Duration = Duration::from_secs(300);

const API_KEY: &str = "contract-key-0123456789abcdef";

fn contract_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/contract"))
}

/// Runs a tool to its end (at most [`TOOL_TIMEOUT`]) and asserts it succeeded, its output in
/// the failure.
async fn run_tool(what: &str, cmd: &mut tokio::process::Command) -> Output {
    let out = tokio::time::timeout(
        TOOL_TIMEOUT,
        cmd.stdin(Stdio::null()).kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} did not finish in {TOOL_TIMEOUT:?}"))
    .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The service on a fresh ledger, with an API key required on `/v1`.
async fn keyed_service(test: &str) -> Service {
    keyed_service_on(test).await.0
}

/// [`keyed_service`], and its database's name.
async fn keyed_service_on(test: &str) -> (Service, String) {
    let (_l, db) = ledger(test).await;
    let keys = std::env::temp_dir().join(format!("couch-ledger-keys-{}", fastrand::u64(..)));
    std::fs::write(&keys, format!("{API_KEY}\n")).unwrap();
    let svc = Service::start(&db, &["--api-keys-file", keys.to_str().unwrap()]).await;
    std::fs::remove_file(&keys).unwrap();
    (svc.with_key(API_KEY), db)
}

#[tokio::test]
async fn serve_contract_the_document_validates_with_openapi_spec_validator() {
    let venv = tools::python_tools();
    let svc = keyed_service("serve_contract_validator").await;
    let dir = TempDir::new("couch-ledger-openapi");
    let doc = dir.path().join("openapi.json");
    let text = reqwest::get(format!("{}/openapi.json", svc.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    std::fs::write(&doc, text).unwrap();
    let out = run_tool(
        "openapi-spec-validator",
        tokio::process::Command::new(venv.join("bin/openapi-spec-validator")).arg(&doc),
    )
    .await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.trim_end().ends_with("OK"), "{said}");
}

#[tokio::test]
async fn serve_contract_schemathesis_with_every_check_finds_nothing() {
    let venv = tools::python_tools();
    let (svc, db) = keyed_service_on("serve_contract_schemathesis").await;
    // On a database of several copies a transfer's decision can be answered 503 `unconfirmed`
    // (docs/CLUSTER.md): the hooks accept that answer there, and only there.
    let copies = support::copies(&db).await;
    let reports = TempDir::new("couch-ledger-schemathesis");
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        TOOL_TIMEOUT,
        tokio::process::Command::new(venv.join("bin/st"))
            .arg("--config-file")
            .arg(contract_dir().join("schemathesis.toml"))
            .arg("run")
            .arg(format!("{}/openapi.json", svc.base))
            // One worker: two threads of Hypothesis describing filters parse large modules at once,
            // which can trip CPython 3.11's parser (AST constructor recursion depth mismatch), an
            // error of the run, not of the service.
            .args(["--checks", "all", "--workers", "1", "--no-color"])
            .args(["--seed", &SCHEMATHESIS_SEED.to_string()])
            .args(["--max-examples", &SCHEMATHESIS_EXAMPLES.to_string()])
            .args(["--header", &format!("Authorization: Bearer {API_KEY}")])
            .env("SCHEMATHESIS_HOOKS", contract_dir().join("hooks.py"))
            .env("COUCH_LEDGER_COPIES", copies.to_string())
            .current_dir(reports.path())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("schemathesis did not finish in {TOOL_TIMEOUT:?}"))
    .expect("run schemathesis");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems ({}):\n{said}\n{}\nthe service's log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        svc.log()
    );
    // Every operation was tested, in every phase, and nothing was skipped for an error.
    for line in [
        "Selected: 24/24",
        "Tested: 24",
        "✅ Examples",
        "✅ Coverage",
    ] {
        assert!(said.contains(line), "{line:?} not in\n{said}");
    }
    for line in ["✅ Fuzzing", "✅ Stateful"] {
        assert!(said.contains(line), "{line:?} not in\n{said}");
    }
    let summary = said
        .lines()
        .find(|l| l.contains("generated"))
        .unwrap_or_default();
    println!(
        "schemathesis: seed {SCHEMATHESIS_SEED}, {SCHEMATHESIS_EXAMPLES} examples per operation, \
         {} in {:.0?}",
        summary.trim(),
        started.elapsed()
    );
}

#[tokio::test]
async fn serve_contract_a_generated_typescript_client_runs_the_example_flow() {
    let packages = tools::ts_client_tools();
    let svc = Service::start(&ledger("serve_contract_ts").await.1, &["--no-sweep"]).await;
    let source = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ts-client"));
    let work = TempDir::new("couch-ledger-ts-client");
    for file in ["package.json", "tsconfig.json", "client.ts"] {
        std::fs::copy(source.join(file), work.path().join(file)).unwrap();
    }
    std::os::unix::fs::symlink(
        packages.join("node_modules"),
        work.path().join("node_modules"),
    )
    .unwrap();
    let bin = work.path().join("node_modules/.bin");
    run_tool(
        "openapi-typescript",
        tokio::process::Command::new(bin.join("openapi-typescript"))
            .arg(format!("{}/openapi.json", svc.base))
            .args(["--output", "schema.d.ts"])
            .current_dir(work.path()),
    )
    .await;
    run_tool(
        "tsc",
        tokio::process::Command::new(bin.join("tsc"))
            .args(["--project", "."])
            .current_dir(work.path()),
    )
    .await;
    let out = run_tool(
        "the TypeScript client",
        tokio::process::Command::new("node")
            .arg("dist/client.js")
            .env("LEDGER_URL", &svc.base)
            .env("RUN_ID", "ts1")
            .env(
                "PURCHASE_FILE",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../examples/cloudant-purchase.json"
                ),
            )
            .env_remove("LEDGER_API_KEY")
            .current_dir(work.path()),
    )
    .await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(said.lines().last(), Some("ok"), "{said}");
    let r = svc.get("/v1/orders/order-ts1").await;
    assert_eq!(r.body["balance"], 0);
    let r = svc.get("/v1/accounts/shop-ts1").await;
    assert_eq!(r.body["balance"], 2646);
}

/// The document names every operation once, and every answer that is not a success is an
/// `ErrorBody`; the service answers an unknown path, a wrong method and an oversized body
/// that way too.
#[tokio::test]
async fn serve_contract_every_answer_is_documented_json() {
    let svc = keyed_service("serve_contract_answers").await;
    let doc = svc.get("/openapi.json").await.body;

    let mut ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default().to_owned();
            assert!(
                ids.insert(id.clone()),
                "{method} {path}: operationId {id:?} twice"
            );
            for (status, answer) in op["responses"].as_object().unwrap() {
                if status.starts_with('2') {
                    continue;
                }
                let answer = match answer["$ref"].as_str() {
                    Some(r) => &doc["components"]["responses"][r.rsplit('/').next().unwrap()],
                    None => answer,
                };
                assert_eq!(
                    answer["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{method} {path} {status}"
                );
            }
            if path.starts_with("/v1/") {
                for status in ["401", "500", "502", "503"] {
                    assert!(
                        op["responses"][status].is_object(),
                        "{method} {path} {status}"
                    );
                }
            }
        }
    }
    let expected = [
        "createAccount",
        "listAccounts",
        "getAccount",
        "getAccountHistory",
        "createTransfer",
        "getTransfer",
        "cancelTransfer",
        "reverseTransfer",
        "putPurchase",
        "recordPayment",
        "recordRefund",
        "recordAdjustment",
        "recordShipment",
        "recordDelivery",
        "getOrder",
        "listOutstandingOrders",
        "listTransfers",
        "getCustomerStatement",
        "listEvents",
        "getStatus",
        "verifyLedger",
        "getHealth",
        "getReadiness",
        "getMetrics",
        "getOpenApi",
    ];
    assert_eq!(ids, expected.iter().map(|s| s.to_string()).collect());
    // Links name operations by `operationId` (camel case, as OpenAPI spells it).
    let link = &doc["paths"]["/v1/accounts"]["post"]["responses"]["201"]["links"]["account"];
    assert_eq!(link["operationId"], "getAccount", "{link}");

    let r = svc.get("/v1/nothing/here").await;
    r.assert_error(404, "not_found");
    let r = svc
        .send(svc.http.delete(format!("{}/v1/accounts", svc.base)))
        .await;
    r.assert_error(405, "method_not_allowed");
    let allow = r.headers["allow"].to_str().unwrap();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    let r = svc
        .send(svc.http.put(format!("{}/healthz", svc.base)))
        .await;
    r.assert_error(405, "method_not_allowed");
    let big = format!("{{\"account_id\": \"{}\"}}", "x".repeat(2 << 20));
    svc.post_text("/v1/accounts", &big)
        .await
        .assert_error(413, "too_large");
}

/// What the schema says is accepted, is: the longest id, a currency in lower case, a whole
/// number written `100.0` or `1e2` (JSON Schema's `integer`), a purchase's quantity `2.0`; and
/// what it says is refused, is, with a 400.
#[tokio::test]
async fn serve_contract_the_schemas_limits_are_the_handlers() {
    let (l, db) = ledger("serve_contract_limits").await;
    let svc = Service::start(&db, &["--no-sweep"]).await;
    let longest = "a".repeat(couch_ledger::limits::ID_CHARS_MAX);
    for (body, status) in [
        (
            json!({"account_id": longest, "currency": "eur", "opening": 1e4}),
            201,
        ),
        (
            json!({"account_id": "b", "currency": "Eur", "opening": 100.0}),
            201,
        ),
        (
            json!({"account_id": "c", "currency": "EUR", "min_balance": null}),
            201,
        ),
        (
            json!({"account_id": format!("{longest}a"), "currency": "EUR"}),
            400,
        ),
        (json!({"account_id": " b", "currency": "EUR"}), 400),
        (json!({"account_id": "b ", "currency": "EUR"}), 400),
        (
            json!({"account_id": "d", "currency": "EUR", "opening": 100.5}),
            400,
        ),
        (json!({"account_id": "d", "currency": "XAU"}), 400),
    ] {
        let r = svc.post("/v1/accounts", body.clone()).await;
        assert_eq!(r.status.as_u16(), status, "{body} → {}", r.body);
    }
    let r = svc
        .post(
            "/v1/transfers",
            json!({"id": longest, "from": "b", "to": "c", "amount": 1e2, "currency": "eur"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["state"], "done", "{}", r.body);
    assert_eq!(l.account("c").await.unwrap().balance.minor(), 100);
    // Its reversal's id would pass the longest: the transfer cannot be reversed (409).
    svc.post(&format!("/v1/transfers/{longest}/reverse"), json!({}))
        .await
        .assert_error(409, "not_reversible");

    let mut purchase: Value = serde_json::from_str(CLOUDANT).unwrap();
    purchase["currency"] = json!("gbp");
    purchase["basket"][0]["quantity"] = json!(2.0);
    let text = purchase
        .to_string()
        .replace("\"total\":26.46", "\"total\":2646e-2");
    assert!(text.contains("2646e-2") && text.contains("2.0"), "{text}");
    let r = svc
        .put_text(&format!("/v1/orders/{ORDER}/purchase"), &text)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(
        l.order_balance(ORDER).await.unwrap().minor(),
        2646,
        "read exactly"
    );
    // An entry that would take the order's sums past 2^53 − 1 minor units is refused.
    let max = couch_ledger::AMOUNT_ABS_MAX;
    let payments = format!("/v1/orders/{ORDER}/adjustments");
    let r = svc
        .post(
            &payments,
            json!({"ref": "a1", "amount": max - 2646, "currency": "GBP"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    svc.post(
        &payments,
        json!({"ref": "a2", "amount": 1, "currency": "GBP"}),
    )
    .await
    .assert_error(400, "invalid_input");
    // The same entry again is still recognised (200), at the bound as anywhere.
    let r = svc
        .post(
            &payments,
            json!({"ref": "a1", "amount": max - 2646, "currency": "GBP"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = svc.get(&format!("/v1/orders/{ORDER}")).await;
    assert_eq!(r.body["balance"], json!(max), "{}", r.body);
}
