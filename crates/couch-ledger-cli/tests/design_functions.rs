//! The design functions (`design_docs/`) as CouchDB runs them, against one table of cases.
//!
//! CouchDB 3.4 runs `map` and `validate_doc_update` in a JS realm of their own and parses the
//! documents outside it, so `doc.x instanceof Array` is false there; pouchdb-server runs them
//! in one realm, where it is true. A test suite that only writes to pouchdb-server cannot see
//! the difference (the first version shipped a validation that refused every account on CouchDB).
//!
//! `tests/design/harness.js` runs every function of the design documents the library installs
//! ([`couch_ledger::design::design_docs`]) the way couchjs does: a fresh `vm` context per
//! function with only CouchDB's sandbox globals, documents `JSON.parse`d outside it. The table,
//! `tests/design/cases.json` (its `about` says how to read it), lists documents of every type,
//! updates, deletions, transfer transitions and replicated (`new_edits=false`) writes, each with
//! the expected acceptance or refusal and the rows every view emits. The same table is run
//! through the harness and through the test server (HTTP writes, views read with
//! `reduce=false`); both must agree with it. And the harness run on the design functions of
//! the first version (`tests/design/head/`) must fail, which shows it catches the realm bug.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use couch_ledger::{design, Amount, Currency, Event, Payment, Purchase, State, ViewQuery};
use serde_json::{json, Map, Value};

use crate::support;

const TABLE: &str = include_str!("design/cases.json");
/// `design_docs/validation/validate_doc_update.js` and `design_docs/accounts/views/pending/map.js`
/// of the first version (saved with `git show 41decf1:design_docs/…`), which used `instanceof Array`.
const HEAD_VALIDATE: &str = include_str!("design/head/validate_doc_update.js");
const HEAD_PENDING_MAP: &str = include_str!("design/head/accounts_pending_map.js");

/// Revision hashes the harness uses: the stored (old) revision `1-PARENT`, a replicated new
/// root `1-ROOT`, a replicated child `2-CHILD` of the old revision.
const PARENT: &str = "4f7c1e9a0b2d3c5e6f708192a3b4c5d6";
const ROOT: &str = "ffffffffffffffffffffffffffffffff";
const CHILD: &str = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

fn harness_js() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/design/harness.js")
}

// ---- the table ------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// An interactive create: no `_rev`.
    Create,
    /// `old` is stored; `new` is written with its `_rev`.
    Update,
    /// `old` is stored; then `DELETE ?rev=`.
    Delete,
    /// `new_edits=false` with a new root revision `1-ROOT` (`old` may be stored).
    ReplicateRoot,
    /// `new_edits=false` with `2-CHILD`, a child of the stored `old`.
    ReplicateChild,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Accept,
    /// 403 with a message containing this.
    Forbidden(String),
}

#[derive(Debug, Clone)]
struct Case {
    name: String,
    key: String,
    write: WriteKind,
    /// `member` or `admin`: a key of the table's `users`.
    user: String,
    /// The stored document (no `_rev`).
    old: Option<Value>,
    /// The written document (no `_rev`); a tombstone `{_id, _deleted: true}` for a deletion.
    new: Value,
    expect: Expect,
    /// View (`ddoc/view`) → the `[key, value]` rows its map emits for `new`.
    rows: BTreeMap<String, Vec<Value>>,
    /// Why the test server cannot show this case.
    harness_only: Option<String>,
}

struct Table {
    users: Map<String, Value>,
    sec_obj: Value,
    cases: Vec<Case>,
}

impl Case {
    fn id(&self) -> &str {
        self.new["_id"].as_str().expect("every document has an _id")
    }

    fn accepted(&self) -> bool {
        self.expect == Expect::Accept
    }

    fn is_design(&self) -> bool {
        self.id().starts_with("_design/")
    }

    /// `(newDoc, oldDoc)` as CouchDB hands them to `validate_doc_update` (SERVERS.md, "What
    /// `validate_doc_update` sees"): a create has no `_rev`; an update or deletion names its
    /// parent; a `new_edits=false` write carries the new revision, with `oldDoc` null for a new
    /// root and the parent for a child.
    fn as_couchdb_sees_it(&self) -> (Value, Value) {
        let old = || with_rev(self.old.as_ref().expect("an old document"), 1, &[PARENT]);
        match self.write {
            WriteKind::Create => (self.new.clone(), Value::Null),
            WriteKind::Update | WriteKind::Delete => (with_rev(&self.new, 1, &[PARENT]), old()),
            WriteKind::ReplicateRoot => (with_rev(&self.new, 1, &[ROOT]), Value::Null),
            WriteKind::ReplicateChild => (with_rev(&self.new, 2, &[CHILD, PARENT]), old()),
        }
    }
}

fn with_rev(doc: &Value, start: u64, ids: &[&str]) -> Value {
    let mut d = doc.clone();
    d["_rev"] = json!(format!("{start}-{}", ids[0]));
    d["_revisions"] = json!({"start": start, "ids": ids});
    d
}

fn table() -> Table {
    let raw: Value = serde_json::from_str(TABLE).expect("tests/design/cases.json is JSON");
    let bases = raw["bases"].as_object().expect("bases").clone();
    let cases = raw["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| parse_case(c, &bases))
        .collect();
    Table {
        users: raw["users"].as_object().expect("users").clone(),
        sec_obj: raw["sec_obj"].clone(),
        cases,
    }
}

fn parse_case(c: &Value, bases: &Map<String, Value>) -> Case {
    let name = c["name"].as_str().expect("a case has a name").to_owned();
    let key = c["key"]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: no key"))
        .to_owned();
    let write = match c.get("write").and_then(Value::as_str).unwrap_or("create") {
        "create" => WriteKind::Create,
        "update" => WriteKind::Update,
        "delete" => WriteKind::Delete,
        "replicate_root" => WriteKind::ReplicateRoot,
        "replicate_child" => WriteKind::ReplicateChild,
        other => panic!("{name}: unknown write {other:?}"),
    };
    let old = c.get("old").map(|s| build(s, bases, None, &name));
    match write {
        WriteKind::Create => assert!(old.is_none(), "{name}: a create has no old document"),
        WriteKind::Update | WriteKind::Delete | WriteKind::ReplicateChild => {
            assert!(old.is_some(), "{name}: needs an old document")
        }
        WriteKind::ReplicateRoot => {}
    }
    let new = if write == WriteKind::Delete {
        assert!(
            c.get("new").is_none(),
            "{name}: a deletion has no new document"
        );
        json!({"_id": old.as_ref().unwrap()["_id"], "_deleted": true})
    } else {
        build(&c["new"], bases, old.as_ref(), &name)
    };
    let expect = match &c["expect"] {
        Value::String(s) if s == "accept" => Expect::Accept,
        Value::Object(m) => Expect::Forbidden(
            m.get("forbidden")
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("{name}: expect {{forbidden: message}}"))
                .replace("{k}", &key),
        ),
        other => panic!("{name}: bad expect {other}"),
    };
    let rows = c
        .get("rows")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(view, rows)| {
                    let rows = rows.as_array().unwrap_or_else(|| panic!("{name}: {view}"));
                    (view.clone(), rows.iter().map(|r| fill(r, &key)).collect())
                })
                .collect()
        })
        .unwrap_or_default();
    Case {
        user: c
            .get("user")
            .and_then(Value::as_str)
            .unwrap_or("member")
            .to_owned(),
        harness_only: c
            .get("harness_only")
            .and_then(Value::as_str)
            .map(str::to_owned),
        old: old.map(|o| fill(&o, &key)),
        new: fill(&new, &key),
        name,
        key,
        write,
        expect,
        rows,
    }
}

/// A document from its spec: `{doc}` literally, or `{base, set, unset}`.
fn build(spec: &Value, bases: &Map<String, Value>, old: Option<&Value>, name: &str) -> Value {
    if let Some(doc) = spec.get("doc") {
        return doc.clone();
    }
    let base = spec["base"]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: a document needs a base or a doc"));
    let mut doc = if base == "@old" {
        old.unwrap_or_else(|| panic!("{name}: @old without an old document"))
            .clone()
    } else {
        bases
            .get(base)
            .unwrap_or_else(|| panic!("{name}: no base {base}"))
            .clone()
    };
    if let Some(set) = spec.get("set").and_then(Value::as_object) {
        for (path, value) in set {
            *slot(&mut doc, path, name) = value.clone();
        }
    }
    for path in spec
        .get("unset")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let path = path.as_str().expect("unset paths are strings");
        let (parent, last) = path.rsplit_once('.').unwrap_or(("", path));
        let holder = if parent.is_empty() {
            &mut doc
        } else {
            slot(&mut doc, parent, name)
        };
        let removed = holder.as_object_mut().and_then(|m| m.remove(last));
        assert!(removed.is_some(), "{name}: nothing to unset at {path}");
    }
    doc
}

/// The value at a dotted path (numbers index arrays); a missing last object field is created.
fn slot<'a>(doc: &'a mut Value, path: &str, name: &str) -> &'a mut Value {
    let mut at = doc;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        at = match at {
            Value::Array(items) => {
                let n: usize = part
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: {path}: {part} is not an index"));
                items
                    .get_mut(n)
                    .unwrap_or_else(|| panic!("{name}: {path}: no item {n}"))
            }
            Value::Object(m) => {
                if last {
                    m.entry(part.to_string()).or_insert(Value::Null)
                } else {
                    m.get_mut(*part)
                        .unwrap_or_else(|| panic!("{name}: {path}: no field {part}"))
                }
            }
            _ => panic!("{name}: {path}: {part} is inside a scalar"),
        };
    }
    at
}

/// `{k}` in every string and object key replaced by the case's key.
fn fill(v: &Value, key: &str) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace("{k}", key)),
        Value::Array(items) => Value::Array(items.iter().map(|x| fill(x, key)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.replace("{k}", key), fill(x, key)))
                .collect(),
        ),
        other => other.clone(),
    }
}

// ---- the harness ----------------------------------------------------------------------------

/// The design documents exactly as the library installs them, each with its `_id`.
fn installed_design_docs() -> Vec<Value> {
    design::design_docs()
        .into_iter()
        .map(|d| {
            let mut body = d.body;
            body["_id"] = json!(d.id);
            body
        })
        .collect()
}

/// Every view of the installed design documents, as `ddoc/view`.
fn view_names() -> Vec<String> {
    installed_design_docs()
        .iter()
        .flat_map(|d| {
            let ddoc = d["_id"]
                .as_str()
                .unwrap()
                .trim_start_matches("_design/")
                .to_owned();
            d["views"]
                .as_object()
                .into_iter()
                .flatten()
                .map(move |(v, _)| format!("{ddoc}/{v}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The installed design documents with the first version's `validate_doc_update` and account `pending`
/// map (trimmed, as `design.rs` embeds files).
fn head_design_docs() -> Vec<Value> {
    let mut docs = installed_design_docs();
    for d in &mut docs {
        match d["_id"].as_str() {
            Some("_design/validation") => {
                d["validate_doc_update"] = json!(HEAD_VALIDATE.trim());
            }
            Some("_design/transactions") => {
                d["views"]["account_pending"]["map"] = json!(HEAD_PENDING_MAP.trim())
            }
            _ => {}
        }
    }
    docs
}

/// Every `Array.isArray(x)` of the installed design functions written back as
/// `(x instanceof Array)`: what a realm-blind edit would do.
fn instanceof_design_docs() -> Vec<Value> {
    fn mutate(src: &str) -> String {
        let mut out = String::new();
        let mut rest = src;
        while let Some(at) = rest.find("Array.isArray(") {
            out.push_str(&rest[..at]);
            let arg_start = at + "Array.isArray(".len();
            let close = arg_start + rest[arg_start..].find(')').expect("a closing parenthesis");
            out.push_str(&format!("({} instanceof Array)", &rest[arg_start..close]));
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        out
    }
    fn walk(v: &mut Value) -> usize {
        match v {
            Value::String(s) if s.contains("Array.isArray(") => {
                *s = mutate(s);
                1
            }
            Value::Object(m) => m.values_mut().map(walk).sum(),
            _ => 0,
        }
    }
    let mut docs = installed_design_docs();
    let mutated: usize = docs.iter_mut().map(walk).sum();
    assert!(mutated >= 2, "the design functions use Array.isArray");
    docs
}

/// What the harness reports for one case.
#[derive(Debug)]
struct Outcome {
    /// 201 accepted, 403 forbidden, 401 unauthorized, 500 an error.
    status: u16,
    message: Option<String>,
    rows: BTreeMap<String, Vec<Value>>,
    map_errors: Vec<String>,
}

struct HarnessRun {
    views: Vec<String>,
    outcomes: Vec<Outcome>,
}

/// Runs every case through `harness.js` with `node` from PATH (as the devserver crate starts
/// the test server). `same_realm`: documents parsed inside each function's realm (pouchdb-server's
/// way), for the control run only.
fn run_harness(ddocs: &[Value], t: &Table, same_realm: bool) -> HarnessRun {
    let cases: Vec<Value> = t
        .cases
        .iter()
        .map(|c| {
            let (new, old) = c.as_couchdb_sees_it();
            let user_ctx = t
                .users
                .get(&c.user)
                .unwrap_or_else(|| panic!("{}: no user {}", c.name, c.user));
            json!({"new": new, "old": old, "user_ctx": user_ctx, "sec_obj": t.sec_obj})
        })
        .collect();
    let input = json!({"design_docs": ddocs, "cases": cases}).to_string();
    let mut cmd = Command::new("node");
    cmd.arg(harness_js());
    if same_realm {
        cmd.arg("--same-realm");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node (Node.js on PATH, as for the test server)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .expect("write the harness's input");
    let out = child.wait_with_output().expect("the harness ran");
    assert!(
        out.status.success(),
        "harness.js failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: Value = serde_json::from_slice(&out.stdout).expect("the harness answers JSON");
    let views = reply["views"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let outcomes: Vec<Outcome> = reply["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Outcome {
            status: r["validation"]["status"].as_u64().unwrap() as u16,
            message: r["validation"]["message"].as_str().map(str::to_owned),
            rows: serde_json::from_value(r["rows"].clone()).unwrap(),
            map_errors: serde_json::from_value(r["map_errors"].clone()).unwrap(),
        })
        .collect();
    assert_eq!(outcomes.len(), t.cases.len());
    let mut sorted_views: Vec<String> = views;
    sorted_views.sort();
    let mut expected = view_names();
    expected.sort();
    assert_eq!(sorted_views, expected, "the harness ran every view");
    HarnessRun {
        views: sorted_views,
        outcomes,
    }
}

/// How a result differs from the table's validation expectation.
fn judge_validation(case: &Case, status: u16, message: Option<&str>) -> Option<String> {
    let ok = match &case.expect {
        Expect::Accept => status == 201,
        Expect::Forbidden(m) => {
            status == 403 && message.is_some_and(|got| got.contains(m.as_str()))
        }
    };
    (!ok).then(|| {
        format!(
            "{}: expected {:?}, got {status} {:?}",
            case.name, case.expect, message
        )
    })
}

fn sorted(rows: &[Value]) -> Vec<Value> {
    let mut rows = rows.to_vec();
    rows.sort_by_key(|r| r.to_string());
    rows
}

/// How the rows of each view differ from the table's (a view not listed: no rows).
fn judge_rows(
    case: &Case,
    views: &[String],
    got: &BTreeMap<String, Vec<Value>>,
    where_: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for view in views {
        let want = sorted(case.rows.get(view).map_or(&[][..], Vec::as_slice));
        let have = sorted(got.get(view).map_or(&[][..], Vec::as_slice));
        if want != have {
            out.push(format!(
                "{}: {where_} {view} emitted {}, the table says {}",
                case.name,
                Value::Array(have),
                Value::Array(want)
            ));
        }
    }
    out
}

/// Every disagreement between a harness run and the table.
fn harness_failures(t: &Table, run: &HarnessRun) -> Vec<String> {
    let mut failures = Vec::new();
    for (case, o) in t.cases.iter().zip(&run.outcomes) {
        failures.extend(judge_validation(case, o.status, o.message.as_deref()));
        failures.extend(judge_rows(case, &run.views, &o.rows, "harness:"));
        for e in &o.map_errors {
            failures.push(format!("{}: a map threw: {e}", case.name));
        }
    }
    failures
}

fn outcome<'a>(t: &Table, run: &'a HarnessRun, name: &str) -> &'a Outcome {
    let i = t
        .cases
        .iter()
        .position(|c| c.name == name)
        .unwrap_or_else(|| panic!("the table has no case {name:?}"));
    &run.outcomes[i]
}

// ---- the tests: table and harness -------------------------------------------------------------

#[test]
fn design_table_is_well_formed_and_covers_every_type_and_transition() {
    let t = table();
    let views: BTreeSet<String> = view_names().into_iter().collect();
    let mut names = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for c in &t.cases {
        assert!(names.insert(c.name.clone()), "two cases named {:?}", c.name);
        assert!(keys.insert(c.key.clone()), "two cases keyed {:?}", c.key);
        // One document per case, so all of them fit in one database.
        assert!(
            ids.insert(c.id().to_owned()),
            "{}: id {} used twice",
            c.name,
            c.id()
        );
        if let Some(old) = &c.old {
            assert_eq!(
                old["_id"].as_str(),
                Some(c.id()),
                "{}: old and new ids",
                c.name
            );
        }
        for v in c.rows.keys() {
            assert!(views.contains(v), "{}: no view {v}", c.name);
        }
        if let Some(why) = &c.harness_only {
            assert!(why.len() > 20, "{}: say why it is harness-only", c.name);
        }
    }
    // Every ledger type (and other applications' documents) accepted and refused somewhere.
    let kind = |c: &Case| -> String {
        let doc = if c.write == WriteKind::Delete {
            c.old.as_ref().unwrap()
        } else {
            &c.new
        };
        match doc["type"].as_str() {
            Some(
                t @ ("purchase" | "payment" | "refund" | "adjustment" | "shipment" | "delivery"
                | "opening" | "account" | "transaction"),
            ) => t.to_owned(),
            _ => "other".to_owned(),
        }
    };
    for ty in [
        "purchase",
        "payment",
        "refund",
        "adjustment",
        "shipment",
        "delivery",
        "opening",
        "account",
        "transaction",
        "other",
    ] {
        for accepted in [true, false] {
            assert!(
                t.cases
                    .iter()
                    .any(|c| kind(c) == ty && c.accepted() == accepted),
                "no {} case of {ty}",
                if accepted { "accepted" } else { "refused" }
            );
        }
        if ty != "other" {
            assert!(
                t.cases
                    .iter()
                    .any(|c| kind(c) == ty && c.write == WriteKind::Delete),
                "no deletion of {ty}"
            );
        }
    }
    // Every pair of transfer states, judged as the library's own state machine does.
    let events = [
        Event::Begin,
        Event::Reject,
        Event::Commit,
        Event::Complete,
        Event::Cancel,
        Event::FinishCancel,
    ];
    for from in State::ALL {
        for to in State::ALL {
            let key = format!("tr-{from}-{to}");
            let c = t
                .cases
                .iter()
                .find(|c| c.key == key)
                .unwrap_or_else(|| panic!("no case for the transition {from} -> {to}"));
            let allowed = from == to
                || events
                    .iter()
                    .any(|&e| couch_ledger::transition(from, e) == Ok(to));
            assert_eq!(
                c.accepted(),
                allowed,
                "{}: the library's state machine disagrees",
                c.name
            );
            assert_eq!(c.old.as_ref().unwrap()["state"], json!(from.as_str()));
            assert_eq!(c.new["state"], json!(to.as_str()));
        }
    }
    // Replicated writes by members and by admins, roots and children.
    for write in [WriteKind::ReplicateRoot, WriteKind::ReplicateChild] {
        for user in ["member", "admin"] {
            assert!(
                t.cases.iter().any(|c| c.write == write && c.user == user),
                "no {write:?} write by a {user}"
            );
        }
    }
    for user in t.cases.iter().map(|c| &c.user) {
        assert!(t.users.contains_key(user), "no user {user}");
    }
}

#[test]
fn design_functions_agree_with_the_table_in_couchdbs_sandbox() {
    let t = table();
    let run = run_harness(&installed_design_docs(), &t, false);
    let failures = harness_failures(&t, &run);
    assert!(
        failures.is_empty(),
        "{} disagreements with tests/design/cases.json:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The harness fails on the first version's design functions (`instanceof Array`), as CouchDB did, where
/// the same documents parsed in the functions' own realm (pouchdb-server's way) pass: it is
/// the realm that catches the bug. An `Array.isArray` written back as `instanceof` is caught too.
#[test]
fn the_harness_catches_instanceof_in_design_functions() {
    let t = table();
    let created = "account: created, limited (min_balance 0)";
    let debit = "account update: a debit applied with its pending marker";
    let purchase = "purchase: valid, a basket of two items";

    let head = run_harness(&head_design_docs(), &t, false);
    let failures = harness_failures(&t, &head);
    eprintln!(
        "the first version's design functions in CouchDB's sandbox: {} disagreements, e.g.\n{}",
        failures.len(),
        failures
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let o = outcome(&t, &head, created);
    assert_eq!(o.status, 403, "{o:?}");
    assert_eq!(
        o.message.as_deref(),
        Some("account: field 'pending' must be an array")
    );
    let o = outcome(&t, &head, debit);
    assert_eq!(o.status, 403, "{o:?}");
    assert_eq!(
        o.rows["transactions/account_pending"],
        Vec::<Value>::new(),
        "the pending view is empty"
    );
    // Every purchase was refused too: its basket is an array.
    let o = outcome(&t, &head, purchase);
    assert_eq!(o.status, 403, "{o:?}");
    assert_eq!(
        o.message.as_deref(),
        Some("purchase: field 'basket' must be an array")
    );
    assert!(
        failures.len() > 40,
        "every account and purchase write disagrees: {}",
        failures.len()
    );

    // Control: one realm, as pouchdb-server runs them — the first version looks right there.
    let same = run_harness(&head_design_docs(), &t, true);
    let o = outcome(&t, &same, created);
    assert_eq!(o.status, 201, "{o:?}");
    let o = outcome(&t, &same, debit);
    assert_eq!(o.status, 201, "{o:?}");
    assert_eq!(outcome(&t, &same, purchase).status, 201);
    assert_eq!(o.rows["transactions/account_pending"].len(), 1, "{o:?}");

    // Today's functions with every Array.isArray turned into instanceof: caught again.
    let mutated = run_harness(&instanceof_design_docs(), &t, false);
    let o = outcome(&t, &mutated, created);
    assert_eq!(o.status, 403, "{o:?}");
    assert_eq!(
        outcome(&t, &mutated, debit).rows["transactions/account_pending"],
        Vec::<Value>::new()
    );
    assert!(!harness_failures(&t, &mutated).is_empty());
}

// ---- the tests: the same table on the test server ---------------------------------------------

/// Who writes on the server: a `_users` member (basic auth) or the harness's admin.
struct Writers {
    member: (String, String),
}

impl Writers {
    fn apply(&self, user: &str, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match user {
            "member" => r.basic_auth(&self.member.0, Some(&self.member.1)),
            "admin" => support::auth(r),
            other => panic!("no user {other}"),
        }
    }
}

/// A user of the server's `_users` database with no admin role (pouchdb-server has one, and
/// in admin party its validation sees `{name, roles}` of a basic-auth user, without `_admin`).
async fn create_member(roles: &[&str]) -> (String, String) {
    let name = format!("dd-writer-{:08x}", fastrand::u32(..));
    let password = format!("pw-{:016x}", fastrand::u64(..));
    let id = format!("org.couchdb.user:{name}");
    let s = support::server();
    let admin = s
        .user
        .as_deref()
        .map(|u| (u, s.password.as_deref().unwrap_or("")));
    support::ensure_users_db(&s.url, admin).await;
    let r = support::auth(support::raw().put(support::raw_url(&format!("_users/{id}"))))
        .json(
            &json!({"_id": id, "name": name, "password": password, "roles": roles, "type": "user"}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "create {id}: {}", r.status());
    (name, password)
}

fn doc_url(db: &str, id: &str) -> reqwest::Url {
    let mut u = reqwest::Url::parse(&support::server().url).unwrap();
    {
        let mut segs = u.path_segments_mut().unwrap();
        segs.pop_if_empty().push(db);
        match id.strip_prefix("_design/") {
            Some(name) => segs.push("_design").push(name),
            None => segs.push(id),
        };
    }
    u
}

/// The status and refusal message of a write (2xx → 201, as in the table).
async fn answer(r: reqwest::Response) -> (u16, Option<String>) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        // `_bulk_docs` with new_edits=false: `[]` on success, a per-document error otherwise.
        if let Some(e) = body
            .as_array()
            .and_then(|a| a.iter().find(|d| d.get("error").is_some()))
        {
            let code = match e["error"].as_str() {
                Some("forbidden") => 403,
                Some("unauthorized") => 401,
                Some("conflict") => 409,
                _ => 500,
            };
            return (code, e["reason"].as_str().map(str::to_owned));
        }
        return (201, None);
    }
    (status, body["reason"].as_str().map(str::to_owned))
}

/// Writes a case's new document as the table says, over HTTP. `old_rev`: the stored revision.
async fn write_case(
    db: &str,
    w: &Writers,
    c: &Case,
    old_rev: Option<&str>,
) -> (u16, Option<String>) {
    let http = support::raw();
    let url = doc_url(db, c.id());
    let bulk = |doc: Value| {
        let url = support::raw_url(&format!("{db}/_bulk_docs"));
        w.apply(&c.user, http.post(url))
            .json(&json!({"new_edits": false, "docs": [doc]}))
    };
    let req = match c.write {
        WriteKind::Create => w.apply(&c.user, http.put(url)).json(&c.new),
        WriteKind::Update => {
            let mut doc = c.new.clone();
            doc["_rev"] = json!(old_rev.expect("a stored revision"));
            w.apply(&c.user, http.put(url)).json(&doc)
        }
        WriteKind::Delete => {
            let mut url = url;
            url.query_pairs_mut()
                .append_pair("rev", old_rev.expect("a stored revision"));
            w.apply(&c.user, http.delete(url))
        }
        WriteKind::ReplicateRoot => bulk(with_rev(&c.new, 1, &[ROOT])),
        WriteKind::ReplicateChild => {
            let parent = old_rev.expect("a stored revision");
            let hash = parent.split_once('-').unwrap().1;
            bulk(with_rev(&c.new, 2, &[CHILD, hash]))
        }
    };
    answer(req.send().await.unwrap()).await
}

/// Every view's map rows (`reduce=false`), by document id.
async fn rows_by_doc(
    client: &couch_ledger::Client,
    views: &[String],
) -> BTreeMap<String, BTreeMap<String, Vec<Value>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<Value>>> = BTreeMap::new();
    for view in views {
        let (ddoc, name) = view.split_once('/').unwrap();
        let q = ViewQuery {
            reduce: Some(false),
            ..ViewQuery::default()
        };
        for row in client.view(ddoc, name, &q).await.unwrap().rows {
            let id = row.id.expect("map rows have an id");
            out.entry(id)
                .or_default()
                .entry(view.clone())
                .or_default()
                .push(json!([row.key, row.value]));
        }
    }
    out
}

fn without_rev(doc: &Value) -> Value {
    let mut d = doc.clone();
    if let Some(m) = d.as_object_mut() {
        m.remove("_rev");
        m.remove("_revisions");
    }
    d
}

/// The table through the test server: a database with the design documents the library installs
/// (every old document stored first, before the validation exists, as a ledger's history would
/// be), then each new document written as the table says, by a `_users` member or the admin;
/// the answer, what is stored and every view's rows compared with the table. The rows of every
/// new document, accepted or not, are compared in a second database that has the views but no
/// validation. Rows marked harness-only are skipped on pouchdb-server (run with COUCHDB_URL).
#[tokio::test]
async fn design_functions_agree_with_the_table_on_the_server() {
    let t = table();
    let on_pouchdb = support::server().dev.is_some();
    let cases: Vec<&Case> = t
        .cases
        .iter()
        .filter(|c| !(on_pouchdb && c.harness_only.is_some()))
        .collect();
    let skipped = t.cases.len() - cases.len();
    let views = view_names();

    let member = create_member(&["ledger-writer"]).await;
    let client = support::client("design_table").await;
    let db = client.database().to_owned();
    client
        .set_security(&json!({"admins": {"names": [], "roles": []}, "members": {"names": [&member.0], "roles": []}}))
        .await
        .unwrap();
    let mut stored_rev: BTreeMap<String, String> = BTreeMap::new();
    for c in &cases {
        if let Some(old) = &c.old {
            let w = client.put(c.id(), old).await.unwrap();
            stored_rev.insert(c.key.clone(), w.rev);
        }
    }
    let ledger = couch_ledger::Ledger::new(client.clone());
    ledger.init().await.unwrap();
    let writers = Writers { member };

    let mut failures = Vec::new();
    for c in &cases {
        let (status, message) =
            write_case(&db, &writers, c, stored_rev.get(&c.key).map(String::as_str)).await;
        failures.extend(
            judge_validation(c, status, message.as_deref()).map(|f| format!("server: {f}")),
        );
    }
    // What is stored: the new document if accepted, else the old one untouched. No conflict,
    // except beside an accepted new root (harness-only on pouchdb-server): the new root
    // `1-fff…` wins over the old revision, which CouchDB keeps as a conflict.
    for c in &cases {
        let mut url = doc_url(&db, c.id());
        url.query_pairs_mut().append_pair("conflicts", "true");
        let r = support::auth(support::raw().get(url)).send().await.unwrap();
        let status = r.status().as_u16();
        let mut doc: Value = r.json().await.unwrap_or(Value::Null);
        let conflicts = doc.as_object_mut().and_then(|m| m.remove("_conflicts"));
        let new_root_beside_old =
            c.accepted() && c.write == WriteKind::ReplicateRoot && c.old.is_some();
        let ok = match (c.accepted(), c.write, stored_rev.get(&c.key)) {
            (true, WriteKind::Delete, _) => status == 404,
            // An update that deletes (a tombstone with fields, e.g. `merged_into`).
            (true, _, _) if c.new["_deleted"] == json!(true) => status == 404,
            (true, _, _) => status == 200 && without_rev(&doc) == without_rev(&c.new),
            (false, _, Some(rev)) => status == 200 && doc["_rev"] == json!(rev),
            (false, _, None) => status == 404,
        };
        if !ok || conflicts.is_some() != new_root_beside_old {
            failures.push(format!(
                "{}: server: stored {status} {doc}, conflicts {conflicts:?}",
                c.name
            ));
        }
    }
    // The views of the validated database, for the accepted writes.
    let rows = rows_by_doc(&client, &views).await;
    let none = BTreeMap::new();
    for c in cases.iter().filter(|c| c.accepted() && !c.is_design()) {
        let mut got = rows.get(c.id()).unwrap_or(&none).clone();
        if c.write == WriteKind::ReplicateRoot && c.old.is_some() {
            // CouchDB keeps the old revision beside the new root as a conflict and hands the
            // map `_conflicts`: the conflicts view lists the document, as the sweeper needs.
            // (Harness-only on pouchdb-server, which drops such a write.)
            let emitted = got.remove("transactions/conflicts");
            let listed = json!([[c.new["type"], c.id()], 1]);
            if emitted != Some(vec![listed.clone()]) {
                failures.push(format!(
                    "{}: server: transactions/conflicts emitted {emitted:?}, expected [{listed}]",
                    c.name
                ));
            }
        }
        failures.extend(judge_rows(c, &views, &got, "server:"));
    }
    // Every new document mapped, without validation. Written on every copy (`w` = the copies,
    // each answered without `accepted`): on a cluster the views are answered by one copy of
    // each shard range, which must hold what the table compares.
    let plain = support::client("design_table_views").await;
    for d in design::design_docs()
        .into_iter()
        .filter(|d| d.id != "_design/validation")
    {
        support::put_on_every_copy(&plain, &d.id, &d.body).await;
    }
    let docs: Vec<Value> = cases
        .iter()
        .filter(|c| c.write != WriteKind::Delete && !c.is_design())
        .map(|c| c.new.clone())
        .collect();
    let every_copy = support::every_copy(&plain).await;
    for r in plain.bulk_docs_with(&docs, &every_copy).await.unwrap() {
        assert!(r.is_ok() && !r.accepted, "{r:?}");
    }
    let rows = rows_by_doc(&plain, &views).await;
    for c in cases
        .iter()
        .filter(|c| c.write != WriteKind::Delete && !c.is_design())
    {
        failures.extend(judge_rows(
            c,
            &views,
            rows.get(c.id()).unwrap_or(&none),
            "server (no validation):",
        ));
    }
    eprintln!(
        "design table on {}: {} cases run, {skipped} harness-only skipped",
        if on_pouchdb {
            "pouchdb-server"
        } else {
            "COUCHDB_URL's server"
        },
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} disagreements with tests/design/cases.json:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// On a real server: a member's `_bulk_docs` with `new_edits: false` that adds a
/// root revision `1-fff…` beside an existing payment is refused (403, per document), while the
/// same member's interactive writes are accepted; the payment keeps its one revision.
/// pouchdb-server shows it: its `_users` members authenticate with basic auth and its
/// validation then sees `{name, roles}` without `_admin` (admin party gives `_admin` only to
/// requests without credentials).
#[tokio::test]
async fn a_members_new_edits_false_root_revision_of_a_payment_is_refused() {
    let l = support::ledger("dd_forged_root").await;
    let client = l.client().clone();
    let db = client.database().to_owned();
    let gbp = Currency::from_code("GBP").unwrap();
    let purchase = Purchase::from_json(
        include_str!("../../../examples/cloudant-purchase.json"),
        Some(gbp),
    )
    .unwrap();
    l.record_purchase(&purchase).await.unwrap();
    let order = purchase.order_id.clone();
    let paid = l
        .record_payment(&Payment {
            order_id: order.clone(),
            reference: "AB9977G244FF2F667".into(),
            amount: Amount::new(646).unwrap(),
            currency: gbp,
            method: Some("credit card".into()),
            meta: Default::default(),
        })
        .await
        .unwrap();
    let before: Value = client.get(&paid.id).await.unwrap();
    // The order's balance with the first payment in it: on a cluster the view is answered by
    // one copy of each shard range, which may not have indexed the payment yet.
    let balance = purchase.total.minor() - 646;
    order_balance_reaches(&l, &order, balance).await;

    let member = create_member(&[]).await;
    client
        .set_security(&json!({"admins": {"names": [], "roles": []}, "members": {"names": [&member.0], "roles": []}}))
        .await
        .unwrap();
    let as_member = |r: reqwest::RequestBuilder| r.basic_auth(&member.0, Some(&member.1));

    // The member writes interactively: a second payment is accepted.
    let second = json!({"type": "payment", "order_id": order, "account_id": before["account_id"],
        "currency": "GBP", "value": 100, "method": null, "payment_reference": "Q1"});
    let id2 = format!("payment:{order}:Q1");
    let (status, message) = answer(
        as_member(support::raw().put(doc_url(&db, &id2)))
            .json(&second)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, message), (201, None));

    // The same member's new_edits=false root revision of the first payment: refused.
    let mut forged = without_rev(&before);
    forged["value"] = json!(1);
    forged["_rev"] = json!(format!("1-{ROOT}"));
    let r = as_member(support::raw().post(support::raw_url(&format!("{db}/_bulk_docs"))))
        .json(&json!({"new_edits": false, "docs": [forged]}))
        .send()
        .await
        .unwrap();
    let (status, message) = answer(r).await;
    assert_eq!(status, 403, "{message:?}");
    let message = message.unwrap();
    assert!(
        message.starts_with("payment: a write with new_edits=false (revision '1-ffff")
            && message.contains("only a server admin ('_admin' in userCtx.roles)"),
        "{message}"
    );

    // The payment keeps its one revision, and the order its balance (less the second payment).
    let mut url = doc_url(&db, &paid.id);
    url.query_pairs_mut().append_pair("conflicts", "true");
    let after: Value = support::auth(support::raw().get(url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(after["_rev"], before["_rev"]);
    assert_eq!(after["value"], json!(646));
    assert!(after.get("_conflicts").is_none(), "{after}");
    order_balance_reaches(&l, &order, balance - 100).await;
}

/// Waits until the `orders/ledger` view gives `order` the balance `minor` (a view on a cluster
/// may lag the writes for a moment); fails with the last balance seen after 30 s.
async fn order_balance_reaches(l: &couch_ledger::Ledger, order: &str, minor: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let seen = l.order_balance(order).await.map(|b| b.minor());
        if matches!(seen, Ok(b) if b == minor) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "order {order}: balance {seen:?} after 30 s, expected {minor}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
