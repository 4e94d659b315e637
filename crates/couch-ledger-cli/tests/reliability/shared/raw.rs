//! Raw reads and writes on the test server (not through the library), wherever a part's
//! database lives, and where a part's documents live ([`Dbs`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::{json, Value};

use couch_ledger::Ledger;

use crate::support;

/// Every document of `db` with an id in `[start, end]`, read raw with `_all_docs` in pages.
pub async fn raw_docs(db: &str, start: &str, end: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = start.to_owned();
    let mut skip = 0;
    loop {
        let path = format!(
            "_all_docs?include_docs=true&limit=1000&skip={skip}&startkey={}&endkey={}",
            urlencode(&json!(from).to_string()),
            urlencode(&json!(end).to_string())
        );
        let body: Value = raw_db_get(db, &path)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let rows = body["rows"].as_array().cloned().unwrap_or_default();
        let n = rows.len();
        for r in rows {
            from = r["id"].as_str().unwrap_or_default().to_owned();
            if r["doc"].is_object() {
                out.push(r["doc"].clone());
            }
        }
        skip = 1;
        if n < 1000 {
            return out;
        }
    }
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Databases that live on a trio (R1 and R2 on the replicating setup): name → (the node raw
/// reads go to — after the trio converged, all three hold the same —, the proxy's URL, which
/// the program is run against).
pub static TRIO_DBS: Mutex<BTreeMap<String, (String, String)>> = Mutex::new(BTreeMap::new());

/// A trio part's name ends with `_trio`.
pub fn is_trio_part(part: &str) -> bool {
    part.ends_with("_trio")
}

pub fn trio_db(db: &str) -> Option<(String, String)> {
    TRIO_DBS.lock().unwrap().get(db).cloned()
}

/// A raw GET of `path` (what follows the database's name) in `db`, wherever `db` lives.
pub fn raw_db_get(db: &str, path: &str) -> reqwest::RequestBuilder {
    match trio_db(db) {
        Some((node, _)) => support::raw().get(format!("{node}/{db}/{path}")),
        None => support::auth(support::raw().get(support::raw_url(&format!("{db}/{path}")))),
    }
}

pub async fn raw_accounts(db: &str) -> Vec<Value> {
    raw_docs(db, "account:", "account:\u{fff0}").await
}

pub async fn raw_transfers(db: &str) -> Vec<Value> {
    raw_docs(db, "txn:", "txn:\u{fff0}").await
}

/// Where a part's documents live: orders in `db` (the ledger's database, validated), accounts
/// and transfers in `hot` — `db` itself on the single layout, a second database without
/// validation on the split layout (`LedgerBuilder::hot_database`). Raw reads of accounts and
/// transfers go to `hot`, of orders to `db`.
#[derive(Debug, Clone)]
pub struct Dbs {
    pub db: String,
    pub hot: String,
}

impl Dbs {
    /// The databases of `l`.
    pub fn of(l: &Ledger) -> Dbs {
        let dbs = Dbs {
            db: l.client().database().to_owned(),
            hot: l.hot_client().database().to_owned(),
        };
        assert_eq!(
            l.hot_database(),
            dbs.split().then_some(dbs.hot.as_str()),
            "the ledger's hot_database() and hot_client() disagree"
        );
        dbs
    }

    pub fn split(&self) -> bool {
        self.hot != self.db
    }

    pub fn layout(&self) -> &'static str {
        if self.split() {
            "split"
        } else {
            "single"
        }
    }

    /// The program's options for this layout, after `--db`: `--hot-db <hot>` when split.
    pub fn cli_args(&self) -> Vec<String> {
        if self.split() {
            vec!["--hot-db".to_owned(), self.hot.clone()]
        } else {
            Vec::new()
        }
    }
}

impl std::fmt::Display for Dbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.split() {
            write!(f, "{} (accounts and transfers in {})", self.db, self.hot)
        } else {
            write!(f, "{}", self.db)
        }
    }
}

/// Document `id` of `db` on the test server, read raw (as its admin, when it has one): the
/// body as the server answered it, an error body included.
pub async fn raw_get(db: &str, id: &str) -> Value {
    let url = support::raw_url(&format!("{db}/{}", urlencode(id)));
    support::auth(support::raw().get(url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Raw PUT or DELETE on the test server (as its admin, when it has one): the status.
pub async fn raw_write(db: &str, method: reqwest::Method, id: &str, doc: Option<Value>) -> u16 {
    let mut url = support::raw_url(&format!("{db}/{}", urlencode(id)));
    if method == reqwest::Method::DELETE {
        let current = raw_get(db, id).await;
        url.push_str(&format!("?rev={}", current["_rev"].as_str().unwrap_or("")));
    }
    let mut req = support::auth(support::raw().request(method, url));
    if let Some(doc) = doc {
        req = req
            .header("Content-Type", "application/json")
            .body(doc.to_string());
    }
    req.send().await.unwrap().status().as_u16()
}
