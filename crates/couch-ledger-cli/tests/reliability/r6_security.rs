//! R6, security: the server's validation refuses every illegal write even from its admin,
//! and credentials — basic, cookie, in the URL, wrong ones — never appear in a Debug text, an
//! error or the library's logs; an anonymous writer is refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use couch_ledger::{Client, ClientBuilder, Error, Ledger, RetryPolicy, State, SweepOptions};

use crate::shared::{
    amount, create_accounts, edge, eur, raw_get, raw_write, req, Acct, LogBuffer, Tally,
};
use crate::support;
use crate::support::devserver::DevServer;

/// The admin password of R6's second pouchdb-server (and of a wiremock client below); R6's
/// clients carry a random one of their own user's (`support::make_user`).
const SECRET: &str = "R6-s3cret-never-print-9c1f";

/// Raw writes into R6's database as the test server's admin, each answered as expected or a
/// violation; the refusals counted.
struct Writes<'a> {
    db: String,
    tally: &'a Tally,
    refused: u64,
}

impl Writes<'_> {
    fn expect(&self, what: String, status: u16, want: u16) {
        if status != want {
            self.tally.violation(format!(
                "r6: {what}: the server answered {status}, not {want}"
            ));
        }
    }

    /// A write the validation accepts (201).
    async fn accepted(&self, what: String, id: &str, doc: Value) {
        let status = raw_write(&self.db, reqwest::Method::PUT, id, Some(doc)).await;
        self.expect(what, status, 201);
    }

    /// A PUT of `doc` (or, without one, a DELETE) that the validation refuses (403).
    async fn refused(&mut self, what: String, id: &str, doc: Option<Value>) {
        let method = if doc.is_some() {
            reqwest::Method::PUT
        } else {
            reqwest::Method::DELETE
        };
        let status = raw_write(&self.db, method, id, doc).await;
        self.expect(what, status, 403);
        self.refused += 1;
    }

    async fn get(&self, id: &str) -> Value {
        raw_get(&self.db, id).await
    }
}

/// Every state change the graph does not allow, and terms that may never change: refused by
/// the server's validation even for the admin writer (raw HTTP as the test server's admin).
/// Returns how many refusals were checked.
async fn r6_validation(tally: &Tally) -> u64 {
    let l = support::ledger("r6").await;
    let mut w = Writes {
        db: l.client().database().to_owned(),
        tally,
        refused: 0,
    };
    immutable_types(&l, &mut w).await;
    fixed_account(&l, &mut w).await;
    transfer_graph(&mut w).await;
    fixed_terms(&mut w).await;
    let refused = w.refused;
    eprintln!(
        "r6: {refused} illegal writes by the admin writer refused by validate_doc_update (403)"
    );
    refused
}

/// Every immutable type: written once through the library, then an update (even with the same
/// content) and a deletion refused.
async fn immutable_types(l: &Ledger, w: &mut Writes<'_>) {
    let purchase = couch_ledger::Purchase::from_json(
        r#"{"order_id": "o6", "account_id": "c6", "currency": "EUR",
            "basket": [{"product_id": "p", "price": 5.00, "tax": 0, "quantity": 1}],
            "delivery": {"option": null, "price": 0, "address": "x"},
            "pretax": 5.00, "tax": 0, "total": 5.00}"#,
        None,
    )
    .unwrap();
    l.record_purchase(&purchase).await.unwrap();
    let eur6 = eur();
    l.record_payment(&couch_ledger::Payment {
        order_id: "o6".into(),
        reference: "p".into(),
        amount: amount(100),
        currency: eur6,
        method: None,
        meta: Default::default(),
    })
    .await
    .unwrap();
    l.record_refund(&couch_ledger::Refund {
        order_id: "o6".into(),
        reference: "r".into(),
        amount: amount(50),
        currency: eur6,
        reason: None,
        meta: Default::default(),
    })
    .await
    .unwrap();
    l.record_adjustment(&couch_ledger::Adjustment {
        order_id: "o6".into(),
        reference: "a".into(),
        amount: amount(-10),
        currency: eur6,
        reason: None,
        meta: Default::default(),
    })
    .await
    .unwrap();
    l.record_shipment(&couch_ledger::Shipment {
        order_id: "o6".into(),
        reference: "s".into(),
        carrier: None,
    })
    .await
    .unwrap();
    l.record_delivery(&couch_ledger::Delivered {
        order_id: "o6".into(),
        reference: "d".into(),
    })
    .await
    .unwrap();
    for id in [
        "purchase:o6",
        "payment:o6:p",
        "refund:o6:r",
        "adjustment:o6:a",
        "shipment:o6:s",
        "delivery:o6:d",
    ] {
        let doc = w.get(id).await;
        w.refused(
            format!("update of {id} with the same content"),
            id,
            Some(doc.clone()),
        )
        .await;
        let mut changed = doc.clone();
        changed["order_id"] = json!("o7");
        if doc.get("value").is_some() {
            changed["value"] = json!(1);
        }
        w.refused(
            format!("update of {id} with other content"),
            id,
            Some(changed),
        )
        .await;
        w.refused(format!("deletion of {id}"), id, None).await;
    }
}

/// An account: its currency, opening and id are fixed; it is never deleted.
async fn fixed_account(l: &Ledger, w: &mut Writes<'_>) {
    create_accounts(
        l,
        &[Acct {
            id: "K".into(),
            currency: eur(),
            opening: 1_000,
            min: Some(0),
        }],
    )
    .await;
    let k = w.get("account:K").await;
    for (field, value) in [
        ("currency", json!("USD")),
        ("opening", json!(5)),
        ("account_id", json!("K2")),
        ("type", json!("other")),
    ] {
        let mut changed = k.clone();
        changed[field] = value;
        w.refused(
            format!("account {field} changed"),
            "account:K",
            Some(changed),
        )
        .await;
    }
    w.refused("deletion of an account".into(), "account:K", None)
        .await;
}

/// Transfers in every state, reached along the graph by raw writes the validation accepts;
/// from each, every state change the graph does not allow, and the deletion, refused.
async fn transfer_graph(w: &mut Writes<'_>) {
    let paths: [(&str, &[&str]); 6] = [
        ("initial", &["initial"]),
        ("pending", &["pending"]),
        ("committed", &["pending", "committed"]),
        ("done", &["pending", "committed", "done"]),
        ("canceling", &["pending", "canceling"]),
        ("cancelled", &["initial", "cancelled"]),
    ];
    for (state, path) in paths {
        let id = format!("txn:s-{state}");
        let mut doc = json!({"type": "transaction", "txn_id": format!("s-{state}"), "source": "K",
            "destination": "J", "value": 5, "currency": "EUR", "state": path[0], "reason": null,
            "reverses": null, "claim": null, "created_at": 1, "last_modified": 1});
        for (i, step) in path.iter().enumerate() {
            if i > 0 {
                doc = w.get(&id).await;
                doc["state"] = json!(step);
            }
            w.accepted(format!("{id}: legal write to {step}"), &id, doc.clone())
                .await;
        }
        let current = w.get(&id).await;
        for to in State::ALL {
            let from = State::parse(state).unwrap();
            if to == from || edge(from, to) {
                continue;
            }
            let mut changed = current.clone();
            changed["state"] = json!(to.as_str());
            w.refused(format!("{id}: {from} → {to}"), &id, Some(changed))
                .await;
        }
        w.refused(format!("deletion of {id}"), &id, None).await;
    }
}

/// A transfer's terms never change, and no transfer is created past `initial`.
async fn fixed_terms(w: &mut Writes<'_>) {
    let pending = w.get("txn:s-pending").await;
    for (field, value) in [
        ("value", json!(6)),
        ("source", json!("Z")),
        ("destination", json!("Z")),
        ("currency", json!("USD")),
        ("reverses", json!("x")),
        ("created_at", json!(2)),
        ("txn_id", json!("other")),
    ] {
        let mut changed = pending.clone();
        changed[field] = value;
        w.refused(
            format!("transfer term {field} changed"),
            "txn:s-pending",
            Some(changed),
        )
        .await;
    }

    let new_committed = json!({"type": "transaction", "txn_id": "s-new", "source": "K", "destination": "J", "value": 5, "currency": "EUR", "state": "committed", "created_at": 1, "last_modified": 1});
    w.refused(
        "a new transfer created committed".into(),
        "txn:s-new",
        Some(new_committed),
    )
    .await;
}

async fn start_dev_server() -> Option<support::devserver::DevServer> {
    tokio::task::spawn_blocking(support::devserver::DevServer::start)
        .await
        .unwrap()
        .map_err(|e| eprintln!("r6: no second server: {e}"))
        .ok()
}

/// Whether `text` holds the secret (or its base64, as in a Basic header).
fn leaks(text: &str, secret: &str) -> bool {
    text.contains(secret)
}

/// A server with an admin for the credential checks: a second pouchdb-server (kept running
/// until dropped) when the harness runs its own, else `COUCHDB_URL`'s with its credentials.
/// `None` when there is none (said why).
struct AdminServer {
    /// Kept for its lifetime: dropping it stops the second server.
    _dev: Option<DevServer>,
    own: bool,
    url: String,
    admin: String,
    admin_password: String,
}

impl AdminServer {
    async fn start(tally: &Tally) -> Option<AdminServer> {
        if support::server().dev.is_some() {
            let Some(dev) = start_dev_server().await else {
                tally.violation("r6: could not start a second server for the credential checks");
                return None;
            };
            let url = dev.url();
            let status = support::raw()
                .put(format!("{url}/_config/admins/admin"))
                .body(json!(SECRET).to_string())
                .send()
                .await
                .unwrap()
                .status();
            assert!(status.is_success(), "create the admin: {status}");
            return Some(AdminServer {
                _dev: Some(dev),
                own: true,
                url,
                admin: "admin".to_owned(),
                admin_password: SECRET.to_owned(),
            });
        }
        let s = support::server();
        match (&s.user, &s.password) {
            (Some(u), Some(p)) if !p.is_empty() => Some(AdminServer {
                _dev: None,
                own: false,
                url: s.url.clone(),
                admin: u.clone(),
                admin_password: p.clone(),
            }),
            _ => {
                eprintln!("r6: SKIPPED credential checks — COUCHDB_URL is set without COUCHDB_USER / COUCHDB_PASSWORD");
                None
            }
        }
    }

    /// A client of the admin's on `db`.
    fn admin_client(&self, db: &str) -> Client {
        Client::builder()
            .url(&self.url)
            .database(db)
            .basic_auth(&self.admin, &self.admin_password)
            .build()
            .unwrap()
    }
}

/// R6's own user on the admin server and its database.
struct Creds {
    url: String,
    user: String,
    /// The user's password.
    secret: String,
    db: String,
}

impl Creds {
    /// Client builders for R6's user with `password`: basic auth, cookie auth, credentials in
    /// the URL.
    fn builders(&self, password: &str) -> Vec<(&'static str, ClientBuilder)> {
        let mut in_url = url::Url::parse(&self.url).unwrap();
        in_url.set_username(&self.user).unwrap();
        in_url.set_password(Some(password)).unwrap();
        let b = |u: &str| {
            Client::builder()
                .url(u)
                .database(&self.db)
                .request_timeout(Duration::from_secs(10))
                .retry(RetryPolicy {
                    retries_max: 1,
                    delay_base: Duration::from_millis(10),
                    delay_max: Duration::from_millis(50),
                    retry_after_max: Duration::from_millis(50),
                })
        };
        vec![
            ("basic auth", b(&self.url).basic_auth(&self.user, password)),
            (
                "cookie auth",
                b(&self.url).cookie_auth(&self.user, password),
            ),
            ("credentials in the URL", b(in_url.as_str())),
        ]
    }
}

pub async fn r6(seed: u64, tally: Arc<Tally>, logs: &LogBuffer) -> u64 {
    let started = Instant::now();
    let refused = r6_validation(&tally).await;

    // Credentials: a server with an admin (a second pouchdb-server, or COUCHDB_URL's).
    let Some(server) = AdminServer::start(&tally).await else {
        return refused;
    };
    // R6's own user, made for this run with a random password that occurs nowhere else: a match
    // in any text below is a leak, never a coincidence (the suite's own password may be a word
    // that also occurs in names), and the wrong passwords tried below lock out nobody else
    // (CouchDB 3.4's login lockout, SERVERS.md).
    let admin = Some((server.admin.as_str(), server.admin_password.as_str()));
    let (user, secret) = support::make_user(&server.url, admin, "r6").await;
    let creds = Creds {
        url: server.url.clone(),
        user,
        secret,
        db: support::db_name(&format!("r6_creds_{seed:x}")),
    };
    // The database, made by the admin, with R6's user as its only admin and member: so every
    // call below succeeds only if its credentials (the cookie client's session too) were
    // accepted, and an anonymous writer is refused. (pouchdb-server lets anonymous users write
    // a database whose _security names nobody, SERVERS.md; CouchDB 3 is admin-only already.)
    let admin = server.admin_client(&creds.db);
    admin.ensure_database().await.unwrap();
    admin
        .set_security(&json!({"admins": {"names": [&creds.user], "roles": []}, "members": {"names": [&creds.user], "roles": []}}))
        .await
        .unwrap();
    let mut printed: Vec<(String, String)> = Vec::new();
    working_credentials(&creds, &tally, &mut printed).await;
    let wrong = format!("{SECRET}-wrong");
    wrong_passwords(&creds, &wrong, &tally, &mut printed).await;
    unreachable_server(&creds, &tally, &mut printed).await;
    for (what, text) in &printed {
        if leaks(text, &creds.secret) || leaks(text, &wrong) {
            tally.violation(format!("r6: the password appears in {what}: {text}"));
        }
    }
    anonymous_writer(&server, &creds.db, &tally).await;

    // The logs of the whole run: the password nowhere, though the failures were logged.
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
    if leaks(&text, &creds.secret) || leaks(&text, &wrong) {
        tally.violation("r6: the password appears in the captured logs");
    }
    if server.own && leaks(&text, SECRET) {
        tally.violation("r6: the second server's admin password appears in the captured logs");
    }
    if !text.contains("cookie login refused") {
        tally.violation("r6: the refused cookie login was not logged: is the log capture working?");
    }
    drop(server);
    eprintln!(
        "r6: credentials absent from {} Debug/error texts and {} bytes of logs; cookie auth exercised; {:?}",
        printed.len(),
        text.len(),
        started.elapsed()
    );
    refused
}

/// The whole ledger works with each kind of credentials (the cookie client logs in); the
/// builders', clients' and ledgers' Debug texts are kept in `printed`.
async fn working_credentials(creds: &Creds, tally: &Tally, printed: &mut Vec<(String, String)>) {
    let mut first = true;
    for (kind, builder) in creds.builders(&creds.secret) {
        printed.push((
            format!("Debug of the {kind} builder"),
            format!("{builder:?}"),
        ));
        let client = builder.build().unwrap();
        printed.push((format!("Debug of the {kind} client"), format!("{client:?}")));
        let l = Ledger::builder(client.clone())
            .lease(Duration::from_millis(500))
            .build()
            .unwrap();
        printed.push((format!("Debug of the {kind} ledger"), format!("{l:?}")));
        // The whole ledger works with these credentials (the cookie client logs in).
        let work = async {
            l.init().await?;
            if first {
                create_accounts(
                    &l,
                    &[
                        Acct {
                            id: "A".into(),
                            currency: eur(),
                            opening: 1_000,
                            min: Some(0),
                        },
                        Acct {
                            id: "B".into(),
                            currency: eur(),
                            opening: 0,
                            min: Some(0),
                        },
                    ],
                )
                .await;
            }
            let o = l
                .submit(req(&format!("sec-{}", kind.len()), "A", "B", 10), true)
                .await?;
            l.submit(
                req(&format!("sec-nowait-{}", kind.len()), "A", "B", 1),
                false,
            )
            .await?;
            l.sweep_once(SweepOptions {
                limit: 10,
                stale_after: Duration::ZERO,
            })
            .await?;
            let report = l.verify().await?;
            Ok::<_, Error>((o, report.ok))
        };
        match work.await {
            Ok((o, ok)) => {
                if o.state != State::Done || !ok {
                    tally.violation(format!(
                        "r6: with {kind}, a transfer came to {o:?}, audit ok {ok}"
                    ));
                }
            }
            Err(e) => tally.violation(format!("r6: the ledger does not work with {kind}: {e}")),
        }
        first = false;
    }
}

/// Wrong passwords: refused, and the refusal never carries the password it was given (the
/// errors' texts are kept in `printed`).
async fn wrong_passwords(
    creds: &Creds,
    wrong: &str,
    tally: &Tally,
    printed: &mut Vec<(String, String)>,
) {
    for (kind, builder) in creds.builders(wrong) {
        let client = builder.build().unwrap();
        let l = Ledger::new(client);
        for r in [
            l.account("A").await.map(drop),
            l.submit(req("sec-wrong", "A", "B", 1), true)
                .await
                .map(drop),
            l.sweep_once(SweepOptions::default()).await.map(drop),
        ] {
            match r {
                // CouchDB 3.4 locks R6's user after a few of these (its login lockout): then
                // the refusal is a 403 that says so, and must not carry the password either.
                Err(e) if e.is_unauthorized() || e.is_locked() => {
                    printed.push((
                        format!("{kind} error"),
                        format!(
                            "{e} | {e:?} | {:?}",
                            std::error::Error::source(&e).map(|s| s.to_string())
                        ),
                    ));
                }
                other => tally.violation(format!(
                    "r6: a wrong password with {kind} came to {other:?}, not 401 (or a lockout)"
                )),
            }
        }
    }
}

/// An unreachable server: a transport error, without the password (its text kept in
/// `printed`).
async fn unreachable_server(creds: &Creds, tally: &Tally, printed: &mut Vec<(String, String)>) {
    let (user, secret) = (&creds.user, &creds.secret);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::builder()
        .url(format!("http://{user}:{secret}@127.0.0.1:{closed}"))
        .database("x")
        .retry(RetryPolicy {
            retries_max: 0,
            ..RetryPolicy::default()
        })
        .build()
        .unwrap();
    match client.server_info().await {
        Err(e) if e.is_transient() => printed.push(("unreachable".into(), format!("{e} | {e:?}"))),
        other => tally.violation(format!("r6: an unreachable server came to {other:?}")),
    }
}

/// An anonymous writer is refused, and nothing it wrote landed.
async fn anonymous_writer(server: &AdminServer, db: &str, tally: &Tally) {
    let url = &server.url;
    let anon_url = format!("{url}/{db}/anonymous-write");
    let status = support::raw()
        .put(&anon_url)
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    if status != 401 && status != 403 {
        tally.violation(format!("r6: an anonymous write answered {status}"));
    }
    // Read as the admin: R6's user may be locked out by now (the wrong passwords above).
    let check = server.admin_client(db);
    if check
        .get_opt::<Value>("anonymous-write")
        .await
        .unwrap()
        .is_some()
    {
        tally.violation("r6: an anonymous write landed");
    }
    eprintln!(
        "r6: anonymous writer refused ({status}) on {}",
        if server.own {
            "pouchdb-server with an admin and _security members (admin party would accept it)"
        } else {
            "COUCHDB_URL's server"
        }
    );
}

/// A cookie login refused for a wrong password must come back as the server's 401, even from a
/// server that lets anonymous users in: the request is never sent anonymously (found by R6 on
/// pouchdb-server, where the database had no `_security` members yet).
#[tokio::test]
async fn a_refused_cookie_login_is_never_an_anonymous_request() {
    use wiremock::matchers::{header_exists, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    let unauthorized = ResponseTemplate::new(401).set_body_json(
        json!({"error": "unauthorized", "reason": "Name or password is incorrect."}),
    );
    Mock::given(method("POST"))
        .and(path("/_session"))
        .respond_with(unauthorized.clone())
        .mount(&server)
        .await;
    Mock::given(path("/db/doc"))
        .and(header_exists("authorization"))
        .respond_with(unauthorized)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(path("/db/doc"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"_id": "doc", "_rev": "1-a"})),
        )
        .with_priority(2)
        .mount(&server)
        .await;
    let c = Client::builder()
        .url(server.uri())
        .database("db")
        .cookie_auth("admin", SECRET)
        .retry(RetryPolicy {
            retries_max: 0,
            ..RetryPolicy::default()
        })
        .build()
        .unwrap();
    let e = c.get::<Value>("doc").await.unwrap_err();
    assert!(e.is_unauthorized(), "{e}");
    assert!(!e.to_string().contains(SECRET) && !format!("{e:?}").contains(SECRET));
}
