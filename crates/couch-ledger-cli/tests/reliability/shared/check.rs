//! The end of a part: sweeping to rest, the library's audit and the test's own independent
//! check of the raw documents.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use couch_ledger::{Ledger, State, SweepOptions, VerifyOptions};

use super::{
    raw_accounts, raw_db_get, raw_transfers, reachable, urlencode, Book, Dbs, Tally, Terms,
};

/// Sweeps until nothing is open and no marker is pending (`expect_open` poison transfers
/// aside), within `deadline`. Fail points must be off.
pub async fn sweep_to_rest(
    part: &str,
    l: &Ledger,
    tally: &Tally,
    expect_open: u64,
    deadline: Duration,
) {
    let started = Instant::now();
    let now = SweepOptions {
        limit: 1_000,
        stale_after: Duration::ZERO,
    };
    loop {
        match l.sweep_once(now.clone()).await {
            Ok(o) => {
                tally.problems(part, &o.problems);
                let markers = l.status().await.map(|s| s.pending_markers).unwrap_or(1);
                if o.remaining <= expect_open && markers == 0 {
                    return;
                }
            }
            Err(e) => tally.error(part, &e),
        }
        if started.elapsed() > deadline {
            let status = l.status().await;
            tally.violation(format!(
                "{part}: the ledger on {} did not come to rest within {deadline:?}: {status:?}",
                Dbs::of(l)
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The library's auditor, strict (at rest): every failing check is a violation.
pub async fn audit(part: &str, l: &Ledger, tally: &Tally) {
    let report = l.verify_with(VerifyOptions::at_rest()).await.unwrap();
    let dbs = Dbs::of(l);
    for c in &report.checks {
        if c.ok {
            continue;
        }
        let line = format!("{part}: audit {} on {dbs}: {}", c.name, c.detail);
        if c.name == "no_overdraft" && !c.documents.is_empty() {
            for account in &c.documents {
                tally.overdrawn_at_rest(part, account, line.clone());
            }
        } else {
            tally.violation(line);
        }
    }
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    eprintln!(
        "{part}: audit at rest of {dbs} ok={} ({})",
        report.ok,
        names.join(", ")
    );
}

/// The test's own check, from the raw documents (no view, no library code): per currency
/// Σ balance = Σ opening; every account's balance = opening + Σ in − Σ out over its done (or
/// committed) transfers; nothing open, no marker; no overdraft; every transfer one that was
/// asked for, with its terms; every acknowledged state reached or passed; a reversal only of
/// a committed or done transfer; `cancelled_by_user` only where a cancel was asked.
/// Returns the number of transfer documents.
pub async fn independent_check(
    part: &str,
    dbs: &Dbs,
    book: &Book,
    tally: &Tally,
    poison: &[&str],
) -> u64 {
    // Accounts and transfers are read (and named in every line) in the database that holds
    // them; orders in the ledger's.
    let at = dbs.hot.as_str();
    if dbs.split() {
        // On the split layout the ledger's database holds no account and no transfer.
        let (a, t) = (raw_accounts(&dbs.db).await, raw_transfers(&dbs.db).await);
        if !a.is_empty() || !t.is_empty() {
            tally.violation(format!(
                "{part}: {} holds {} accounts and {} transfers (first {:?}), which belong in {at}",
                dbs.db,
                a.len(),
                t.len(),
                a.iter().chain(&t).next().map(|d| d["_id"].clone())
            ));
        }
    }
    let accounts = raw_accounts(at).await;
    let transfers: Vec<Value> = raw_transfers(at)
        .await
        .into_iter()
        .filter(|t| !poison.contains(&t["_id"].as_str().unwrap_or("")))
        .collect();
    let found = check_transfers(part, at, &transfers, book, tally);
    check_acknowledged(part, at, &found.states, book, tally);
    check_accounts(part, at, &accounts, found.moved, tally);
    check_entries(part, dbs, book, tally).await;
    let done = found.states.values().filter(|s| **s == State::Done).count();
    let cancelled = found
        .states
        .values()
        .filter(|s| **s == State::Cancelled)
        .count();
    eprintln!(
        "{part}: independent check of {} accounts and {} transfers in {at} ({done} done, {cancelled} cancelled), {} acknowledged",
        accounts.len(),
        transfers.len(),
        book.acked.lock().unwrap().len()
    );
    transfers.len() as u64
}

/// What the transfer documents say.
#[derive(Default)]
struct Found {
    /// Each transfer's state, by transfer id.
    states: HashMap<String, State>,
    /// What the done (or committed) transfers move, by account id.
    moved: HashMap<String, i128>,
    /// `(id, previous attempt)` of the reversals tried again.
    later_attempts: Vec<(String, String)>,
}

/// Every transfer: in a known state, at rest, asked for with its terms, cancelled for a reason
/// it may have; a later attempt at a reversal only after the one before it was cancelled; a
/// reversal only of a committed or done transfer.
fn check_transfers(part: &str, at: &str, transfers: &[Value], book: &Book, tally: &Tally) -> Found {
    let asked = book.asked.lock().unwrap().clone();
    let cancels = book.cancels.lock().unwrap().clone();
    let mut found = Found::default();
    for t in transfers {
        check_transfer(part, at, t, &asked, &cancels, tally, &mut found);
    }
    let states = &found.states;
    // A later attempt at a reversal only after the one before it was cancelled.
    for (id, previous) in &found.later_attempts {
        if states.get(previous) != Some(&State::Cancelled) {
            tally.violation(format!(
                "{part}: {at}/txn:{id} exists, but the attempt before it, {previous}, is {:?}",
                states.get(previous)
            ));
        }
    }
    // Reversals only of committed or done transfers.
    for (id, state) in states {
        if let Some(original) = id.strip_prefix("rev-") {
            if !matches!(states.get(original), Some(State::Done | State::Committed)) {
                tally.violation(format!(
                    "{part}: {at}/txn:{id} ({state}) reverses {original}, which is {:?}",
                    states.get(original)
                ));
            }
        }
    }
    found
}

/// One transfer document, its state and what it moves added to `found`.
fn check_transfer(
    part: &str,
    at: &str,
    t: &Value,
    asked: &HashMap<String, Terms>,
    cancels: &HashSet<String>,
    tally: &Tally,
    found: &mut Found,
) {
    let id = t["txn_id"].as_str().unwrap_or_default().to_owned();
    let Some(state) = t["state"].as_str().and_then(State::parse) else {
        tally.violation(format!(
            "{part}: {at}/{} has state {}",
            t["_id"], t["state"]
        ));
        return;
    };
    found.states.insert(id.clone(), state);
    if !state.is_terminal() {
        tally.violation(format!("{part}: {at}/txn:{id} is still {state} at rest"));
    }
    let value = t["value"].as_i64().unwrap_or(0);
    let (src, dst) = (
        t["source"].as_str().unwrap_or("").to_owned(),
        t["destination"].as_str().unwrap_or("").to_owned(),
    );
    if matches!(state, State::Committed | State::Done) {
        *found.moved.entry(src.clone()).or_default() -= i128::from(value);
        *found.moved.entry(dst.clone()).or_default() += i128::from(value);
    }
    // A reversal that was cancelled is tried again under `rev2-X`, `rev3-X`…: each with the
    // terms of the reversal asked for, and only after the one before it was cancelled
    // (checked once every state is known).
    let retried = retried_reversal(&id);
    if let Some((_, previous)) = &retried {
        found.later_attempts.push((id.clone(), previous.clone()));
    }
    let asked_terms = asked.get(&id).or_else(|| {
        retried
            .as_ref()
            .and_then(|(first, _)| asked.get(first.as_str()))
    });
    match asked_terms {
        None => tally.violation(format!(
            "{part}: {at}/txn:{id} exists but was never asked for"
        )),
        Some(terms) => {
            let held = Terms {
                source: src,
                destination: dst,
                value,
                currency: t["currency"].as_str().unwrap_or("").to_owned(),
                reverses: t["reverses"].as_str().map(str::to_owned),
            };
            if *terms != held {
                tally.violation(format!(
                    "{part}: {at}/txn:{id} holds {held:?}, asked {terms:?}"
                ));
            }
        }
    }
    if state == State::Cancelled {
        check_cancel_reason(part, at, &id, t, cancels, tally);
    }
}

/// A cancelled transfer's reason is one the ledger gives, and a user's only where a cancel
/// was asked.
fn check_cancel_reason(
    part: &str,
    at: &str,
    id: &str,
    t: &Value,
    cancels: &HashSet<String>,
    tally: &Tally,
) {
    let reason = t["reason"].as_str().unwrap_or("");
    let known = [
        "insufficient_funds",
        "unknown_account",
        "currency_mismatch",
        "cancelled_by_user",
    ];
    if !known.contains(&reason) {
        tally.violation(format!(
            "{part}: {at}/txn:{id} cancelled with reason {reason:?}"
        ));
    }
    if reason == "cancelled_by_user" && !cancels.contains(id) {
        tally.violation(format!(
            "{part}: {at}/txn:{id} cancelled by a user nobody was"
        ));
    }
}

/// Acknowledged states: reached or passed.
fn check_acknowledged(
    part: &str,
    at: &str,
    states: &HashMap<String, State>,
    book: &Book,
    tally: &Tally,
) {
    for (id, acks) in book.acked.lock().unwrap().iter() {
        match states.get(id) {
            None => tally.violation(format!(
                "{part}: {at}/txn:{id} was acknowledged ({acks:?}) and is gone"
            )),
            Some(&fin) => {
                for &a in acks {
                    if !reachable(a, fin) {
                        tally.violation(format!(
                            "{part}: {at}/txn:{id} was acknowledged {a}, and is {fin} now"
                        ));
                    }
                }
            }
        }
    }
}

/// Accounts: conservation, exactly-once, no marker, no overdraft.
fn check_accounts(
    part: &str,
    at: &str,
    accounts: &[Value],
    mut moved: HashMap<String, i128>,
    tally: &Tally,
) {
    let mut per_currency: BTreeMap<String, (i128, i128)> = BTreeMap::new();
    for a in accounts {
        let id = a["account_id"].as_str().unwrap_or_default();
        let opening = i128::from(a["opening"].as_i64().unwrap_or(0));
        let balance = i128::from(a["balance"].as_i64().unwrap_or(0));
        let c = per_currency
            .entry(a["currency"].as_str().unwrap_or("?").to_owned())
            .or_default();
        c.0 += opening;
        c.1 += balance;
        let expected = opening + moved.remove(id).unwrap_or(0);
        if balance != expected {
            tally.violation(format!(
                "{part}: {at}/account:{id} balance {balance} ≠ opening {opening} + done transfers = {expected}"
            ));
        }
        if a["pending"].as_array().is_some_and(|p| !p.is_empty()) {
            tally.violation(format!(
                "{part}: {at}/account:{id} holds pending markers at rest: {}",
                a["pending"]
            ));
        }
        if let Some(min) = a["min_balance"].as_i64() {
            if balance < i128::from(min) {
                tally.overdrawn_at_rest(
                    part,
                    &format!("account:{id}"),
                    format!("{part}: {at}/account:{id} balance {balance} below its minimum {min}"),
                );
            }
        }
    }
    for (account, m) in moved {
        if m != 0 {
            tally.violation(format!(
                "{part}: done transfers move {m} on {at}/account:{account}, which does not exist"
            ));
        }
    }
    for (currency, (opening, balance)) in &per_currency {
        if opening != balance {
            tally.violation(format!(
                "{part}: {at}: {currency}: Σ balance {balance} ≠ Σ opening {opening}"
            ));
        }
    }
}

/// Acknowledged order-ledger entries are there, as written.
async fn check_entries(part: &str, dbs: &Dbs, book: &Book, tally: &Tally) {
    let entries = book.entries.lock().unwrap().clone();
    for (id, fields) in entries {
        let doc: Value = raw_db_get(&dbs.db, &urlencode(&id))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for (k, v) in fields.as_object().unwrap() {
            if doc[k] != *v {
                tally.violation(format!(
                    "{part}: {}/{id} was acknowledged with {k} = {v}, holds {}",
                    dbs.db, doc[k]
                ));
            }
        }
    }
}

/// For `rev{n}-X` (n ≥ 2, a reversal tried again after the one before it was cancelled): the
/// first attempt's id `rev-X` (whose terms were asked for) and the previous attempt's id.
pub fn retried_reversal(id: &str) -> Option<(String, String)> {
    let (head, original) = id.split_once('-')?;
    let n: u32 = head.strip_prefix("rev")?.parse().ok()?;
    if n < 2 {
        return None;
    }
    let previous = if n == 2 {
        format!("rev-{original}")
    } else {
        format!("rev{}-{original}", n - 1)
    };
    Some((format!("rev-{original}"), previous))
}
