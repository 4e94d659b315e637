//! The ledger's views, as the simulated server answers them: each `map.js` under `design_docs/`
//! written again in Rust (`design_functions::the_simulators_maps_agree_with_the_design_documents`
//! runs both over one table of documents), with CouchDB's collation and its built-in reducers.

use std::cmp::Ordering;

use serde_json::{json, Value};

/// A view's rows from one document: `(key, value)`. `None`: the simulator has no such view.
pub fn map(ddoc: &str, view: &str, doc: &Value) -> Option<Vec<(Value, Value)>> {
    let mut rows = Vec::new();
    let obj = match doc.as_object() {
        Some(o) => o,
        None => return Some(rows),
    };
    let s = |k: &str| obj.get(k).and_then(Value::as_str);
    let num = |k: &str| obj.get(k).filter(|v| v.is_number()).cloned();
    let ty = s("type");
    match (ddoc, view) {
        ("transactions", "account_balances") => {
            if ty != Some("account") {
                return Some(rows);
            }
            let currency = s("currency").unwrap_or("?");
            let id = match s("account_id") {
                Some(a) => a.to_owned(),
                None => obj.get("_id").map(js_string).unwrap_or_default(),
            };
            let value = match (num("opening"), num("balance")) {
                (Some(o), Some(b)) => json!([o, b]),
                _ => json!([0, 0]),
            };
            rows.push((json!([currency, id]), value));
        }
        ("transactions", "account_overdrawn") => {
            if ty != Some("account") {
                return Some(rows);
            }
            if let (Some(b), Some(m)) = (num("balance"), num("min_balance")) {
                if b.as_f64() < m.as_f64() {
                    rows.push((
                        json!([obj.get("currency"), obj.get("account_id")]),
                        json!([b, m]),
                    ));
                }
            }
        }
        ("transactions", "account_pending") => {
            if ty != Some("account") {
                return Some(rows);
            }
            let Some(pending) = obj.get("pending").and_then(Value::as_array) else {
                return Some(rows);
            };
            for m in pending {
                let Some(txn) = m.get("txn").and_then(Value::as_str) else {
                    continue;
                };
                let at = m
                    .get("at")
                    .filter(|v| v.is_number())
                    .cloned()
                    .unwrap_or(json!(0));
                let delta = m
                    .get("delta")
                    .filter(|v| v.is_number())
                    .cloned()
                    .unwrap_or(json!(0));
                rows.push((json!([at, txn]), delta));
            }
        }
        ("transactions", "by_account") => {
            if ty != Some("transaction") || !matches!(s("state"), Some("committed" | "done")) {
                return Some(rows);
            }
            if let (Some(src), Some(dst), Some(v)) = (
                s("source"),
                s("destination"),
                obj.get("value").and_then(Value::as_i64),
            ) {
                rows.push((json!(src), json!(-v)));
                rows.push((json!(dst), json!(v)));
            }
        }
        ("transactions", "by_state") => {
            if ty != Some("transaction") {
                return Some(rows);
            }
            if let (Some(state), Some(lm)) = (s("state"), num("last_modified")) {
                rows.push((json!([state, lm]), json!(1)));
            }
        }
        ("transactions", v @ ("committed" | "pending")) => {
            if ty != Some("transaction") || s("state") != Some(v) {
                return Some(rows);
            }
            if let (Some(src), Some(dst), Some(value)) =
                (s("source"), s("destination"), num("value"))
            {
                rows.push((json!([src, dst]), value));
            }
        }
        ("transactions", "in_flight") => {
            if ty != Some("transaction") || s("state") != Some("pending") {
                return Some(rows);
            }
            if let (Some(_), Some(_), Some(c), Some(value)) =
                (s("source"), s("destination"), s("currency"), num("value"))
            {
                rows.push((json!(c), value));
            }
        }
        ("transactions", "conflicts") => {
            let Some(c) = obj.get("_conflicts").and_then(Value::as_array) else {
                return Some(rows);
            };
            let ours = [
                "purchase",
                "payment",
                "refund",
                "adjustment",
                "shipment",
                "delivery",
                "account",
                "transaction",
            ];
            if c.is_empty() || !ty.is_some_and(|t| ours.contains(&t)) {
                return Some(rows);
            }
            rows.push((json!([ty, obj.get("_id")]), json!(c.len())));
        }
        ("orders", v @ ("ledger" | "by_account")) => {
            let Some(order) = s("order_id") else {
                return Some(rows);
            };
            let amount = match ty {
                Some("purchase") => num("total"),
                Some("adjustment" | "refund") => num("value"),
                Some("payment") => obj.get("value").and_then(Value::as_i64).map(|v| json!(-v)),
                _ => return Some(rows),
            };
            let Some(amount) = amount else {
                return Some(rows);
            };
            if v == "ledger" {
                rows.push((json!(order), amount));
            } else if let Some(account) = s("account_id") {
                rows.push((json!([account, order]), amount));
            }
        }
        _ => return None,
    }
    Some(rows)
}

fn js_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The built-in reducer of a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Count,
}

pub fn reducer(ddoc: &str, view: &str) -> Reduce {
    match (ddoc, view) {
        ("transactions", "account_overdrawn" | "account_pending" | "by_state" | "conflicts") => {
            Reduce::Count
        }
        _ => Reduce::Sum,
    }
}

/// `_sum` or `_count` of values (numbers, or arrays of numbers summed element-wise).
pub fn reduce(r: Reduce, values: &[&Value]) -> Value {
    match r {
        Reduce::Count => json!(values.len()),
        Reduce::Sum => {
            let mut total: Option<Value> = None;
            for v in values {
                total = Some(match total {
                    None => (*v).clone(),
                    Some(t) => add(&t, v),
                });
            }
            total.unwrap_or(json!(0))
        }
    }
}

fn add(a: &Value, b: &Value) -> Value {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            let n = x.len().max(y.len());
            Value::Array(
                (0..n)
                    .map(|i| match (x.get(i), y.get(i)) {
                        (Some(p), Some(q)) => add(p, q),
                        (Some(p), None) | (None, Some(p)) => p.clone(),
                        (None, None) => json!(0),
                    })
                    .collect(),
            )
        }
        (x, y) => match (x.as_i64(), y.as_i64()) {
            (Some(p), Some(q)) => json!(p + q),
            _ => json!(x.as_f64().unwrap_or(0.0) + y.as_f64().unwrap_or(0.0)),
        },
    }
}

/// CouchDB's collation of keys: null, false, true, numbers, strings, arrays, objects. Strings
/// compare by code point here (CouchDB uses ICU; the simulation's ids are lower-case ASCII,
/// where both agree).
pub fn collate(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Null => 0,
            Value::Bool(false) => 1,
            Value::Bool(true) => 2,
            Value::Number(_) => 3,
            Value::String(_) => 4,
            Value::Array(_) => 5,
            Value::Object(_) => 6,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for (p, q) in x.iter().zip(y.iter()) {
                let o = collate(p, q);
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Object(x), Value::Object(y)) => {
            for ((k1, v1), (k2, v2)) in x.iter().zip(y.iter()) {
                let o = k1.cmp(k2).then_with(|| collate(v1, v2));
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

/// A key cut to `level` elements for `group_level` (a key that is not an array stays whole).
pub fn group_key(key: &Value, level: Option<usize>) -> Value {
    match (key, level) {
        (Value::Array(a), Some(n)) => Value::Array(a.iter().take(n).cloned().collect()),
        (k, _) => k.clone(),
    }
}

/// The model's own checks, run before any seed.
pub mod checks {
    use super::*;

    pub fn keys_collate_as_couchdb_orders_them() {
        let keys = [
            json!(null),
            json!(false),
            json!(true),
            json!(-1),
            json!(2),
            json!("a"),
            json!("b"),
            json!(["a"]),
            json!(["a", 1]),
            json!(["a", {}]),
            json!({}),
        ];
        for w in keys.windows(2) {
            assert_eq!(collate(&w[0], &w[1]), Ordering::Less, "{} < {}", w[0], w[1]);
        }
    }

    pub fn sums_add_arrays_element_wise() {
        let a = json!([1, 2]);
        let b = json!([10, 20]);
        assert_eq!(reduce(Reduce::Sum, &[&a, &b]), json!([11, 22]));
        assert_eq!(reduce(Reduce::Count, &[&a, &b]), json!(2));
    }

    pub fn run() {
        keys_collate_as_couchdb_orders_them();
        sums_add_arrays_element_wise();
    }
}
