//! The auditor: SPEC §7 invariants 1–6, checked from what the database holds.
//!
//! Everything is read in bounded pages (views, the `_changes` feed), and every sum is computed
//! here in `i128` from the documents themselves rather than trusted from a `_sum` (JavaScript
//! doubles). It reads a moving database without a snapshot, so the exact checks (2 and 5) are
//! only meaningful at rest; [`VerifyOptions::at_rest`] asks for them strictly.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::accounts::{AccountDoc, AccountView};
use crate::couch::{ChangesQuery, ViewQuery};
use crate::engine::now_ms;
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::limits::{OPEN_AGE_MAX_MS, PAGES_MAX, PAGE_ROWS_MAX};
use crate::sweeper::{oldest_open, state_counts};

/// Id prefixes of the write-once documents (invariant 6).
const IMMUTABLE_PREFIXES: [&str; 6] = [
    "purchase:",
    "payment:",
    "refund:",
    "adjustment:",
    "shipment:",
    "delivery:",
];

/// How strict [`Ledger::verify_with`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Expect the ledger at rest: no open transfer at all and no pending marker, and check
    /// exactly-once strictly. Otherwise open transfers and markers younger than
    /// `open_age_max` are allowed, and exactly-once is checked only when no marker is pending.
    pub at_rest: bool,
    /// An open transfer or a pending marker older than this breaks "termination".
    pub open_age_max: Duration,
}

impl Default for VerifyOptions {
    fn default() -> VerifyOptions {
        VerifyOptions {
            at_rest: false,
            open_age_max: Duration::from_millis(OPEN_AGE_MAX_MS),
        }
    }
}

impl VerifyOptions {
    /// Strict: the ledger must be at rest.
    pub fn at_rest() -> VerifyOptions {
        VerifyOptions {
            at_rest: true,
            ..VerifyOptions::default()
        }
    }
}

/// One invariant's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `conservation`, `exactly_once`, `no_overdraft`, `termination`, `no_pending_markers`,
    /// `immutable_documents`, `account_documents`.
    pub name: String,
    /// It holds.
    pub ok: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

/// What [`Ledger::verify`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Every check holds.
    pub ok: bool,
    /// Each check.
    pub checks: Vec<Check>,
}

impl VerifyReport {
    /// The check of this name.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

fn check(name: &str, ok: bool, detail: String) -> Check {
    Check {
        name: name.to_owned(),
        ok,
        detail,
    }
}

/// At most this many offenders are named in one detail line.
const NAMED_MAX: usize = 10;

fn named(list: &[String]) -> String {
    let mut s = list
        .iter()
        .take(NAMED_MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if list.len() > NAMED_MAX {
        s.push_str(&format!("; … and {} more", list.len() - NAMED_MAX));
    }
    s
}

impl Ledger {
    /// Every account, read in pages from the `accounts/balances` view.
    ///
    /// # Errors
    ///
    /// A document that is not a valid account; the server failed.
    pub async fn all_accounts(&self) -> Result<Vec<AccountView>> {
        let (docs, bad) = self.account_docs().await?;
        if let Some(first) = bad.first() {
            return Err(Error::decode(first.clone()));
        }
        docs.iter().map(AccountDoc::view).collect()
    }

    /// Account documents and, separately, the ones that are not valid accounts.
    async fn account_docs(&self) -> Result<(Vec<AccountDoc>, Vec<String>)> {
        let client = &self.inner.client;
        let mut docs = Vec::new();
        let mut bad = Vec::new();
        let mut after: Option<Value> = None;
        for _ in 0..PAGES_MAX {
            let q = ViewQuery {
                start_key: after.clone(),
                skip: after.as_ref().map(|_| 1),
                reduce: Some(false),
                include_docs: Some(true),
                limit: Some(PAGE_ROWS_MAX),
                ..ViewQuery::default()
            };
            let rows = client.view("accounts", "balances", &q).await?.rows;
            let n = rows.len() as u64;
            for row in rows {
                after = Some(row.key.clone());
                match row.doc {
                    Some(doc) => match AccountDoc::from_value(doc) {
                        Ok(d) => docs.push(d),
                        Err(e) => bad.push(e.to_string()),
                    },
                    None => bad.push(format!("{:?}: no document", row.id)),
                }
            }
            if n < PAGE_ROWS_MAX {
                return Ok((docs, bad));
            }
        }
        Err(Error::invariant(format!(
            "more than {} accounts: not read to the end",
            PAGES_MAX * PAGE_ROWS_MAX
        )))
    }

    /// `account → Σ in − Σ out` over committed and done transfers (`transactions/by_account`).
    async fn transfer_sums(&self) -> Result<HashMap<String, i128>> {
        let client = &self.inner.client;
        let mut sums = HashMap::new();
        let mut after: Option<Value> = None;
        for _ in 0..PAGES_MAX {
            let q = ViewQuery {
                start_key: after.clone(),
                skip: after.as_ref().map(|_| 1),
                group: Some(true),
                limit: Some(PAGE_ROWS_MAX),
                ..ViewQuery::default()
            };
            let rows = client.view("transactions", "by_account", &q).await?.rows;
            let n = rows.len() as u64;
            for row in rows {
                after = Some(row.key.clone());
                let account = row.key.as_str().unwrap_or_default().to_owned();
                let sum = row.value.as_i64().ok_or_else(|| {
                    Error::decode(format!(
                        "transactions/by_account sum for {account} is {}, not an integer",
                        row.value
                    ))
                })?;
                sums.insert(account, i128::from(sum));
            }
            if n < PAGE_ROWS_MAX {
                return Ok(sums);
            }
        }
        Err(Error::invariant(
            "transactions/by_account: too many accounts to read",
        ))
    }

    /// Write-once documents not at revision 1 (or deleted), from the `_changes` feed.
    async fn rewritten_documents(&self) -> Result<(u64, Vec<String>)> {
        let client = &self.inner.client;
        let mut seen = 0u64;
        let mut bad = Vec::new();
        let mut since: Option<Value> = None;
        for _ in 0..PAGES_MAX {
            let q = ChangesQuery {
                since: since.clone(),
                limit: Some(PAGE_ROWS_MAX),
                ..ChangesQuery::default()
            };
            let page = client.changes(&q).await?;
            let n = page.results.len() as u64;
            for row in page.results {
                if !IMMUTABLE_PREFIXES.iter().any(|p| row.id.starts_with(p)) {
                    continue;
                }
                seen += 1;
                let rev = row
                    .changes
                    .first()
                    .and_then(|c| c.get("rev"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if row.deleted {
                    bad.push(format!("{} was deleted", row.id));
                } else if !rev.starts_with("1-") {
                    bad.push(format!("{} is at revision {rev}", row.id));
                }
            }
            since = Some(page.last_seq);
            if n < PAGE_ROWS_MAX {
                return Ok((seen, bad));
            }
        }
        Err(Error::invariant("_changes: too many documents to read"))
    }

    /// SPEC §7 invariants 1–6 with the default (not at rest) options: see
    /// [`Ledger::verify_with`].
    ///
    /// # Errors
    ///
    /// The server failed. A broken invariant is not an error: it is a check with `ok: false`.
    pub async fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(VerifyOptions::default()).await
    }

    /// Checks SPEC §7 invariants 1–6:
    ///
    /// 1. `conservation`: per currency, Σ balance = Σ opening.
    /// 2. `exactly_once`: every account's balance = opening + Σ in − Σ out over committed and
    ///    done transfers — at rest (no pending marker) only.
    /// 3. `no_overdraft`: balance ≥ min_balance for every limited account.
    /// 4. `termination`: no open transfer (at rest), or none older than `open_age_max`.
    /// 5. `no_pending_markers`: none (at rest), or none older than `open_age_max`.
    /// 6. `immutable_documents`: every order-ledger document at revision 1, none deleted.
    ///
    /// plus `account_documents`: every account document is a valid account.
    ///
    /// # Errors
    ///
    /// The server failed.
    pub async fn verify_with(&self, options: VerifyOptions) -> Result<VerifyReport> {
        let now = now_ms();
        let age_max = i64::try_from(options.open_age_max.as_millis()).unwrap_or(i64::MAX);
        let (accounts, malformed) = self.account_docs().await?;
        let mut checks = Vec::new();

        // 1. Conservation, per currency.
        let mut totals: BTreeMap<&str, (i128, i128)> = BTreeMap::new();
        for a in &accounts {
            let t = totals.entry(a.currency.as_str()).or_default();
            t.0 += i128::from(a.opening.minor());
            t.1 += i128::from(a.balance.minor());
        }
        let unbalanced: Vec<String> = totals
            .iter()
            .filter(|(_, (o, b))| o != b)
            .map(|(c, (o, b))| format!("{c}: Σ balance {b} ≠ Σ opening {o}"))
            .collect();
        let figures = totals
            .iter()
            .map(|(c, (o, b))| format!("{c}: Σ balance {b}, Σ opening {o}"))
            .collect::<Vec<_>>()
            .join("; ");
        checks.push(check(
            "conservation",
            unbalanced.is_empty(),
            if unbalanced.is_empty() {
                format!("{} accounts; {figures}", accounts.len())
            } else {
                named(&unbalanced)
            },
        ));

        // 2. Exactly-once.
        let markers: usize = accounts.iter().map(|a| a.pending.len()).sum();
        if markers > 0 && !options.at_rest {
            checks.push(check(
                "exactly_once",
                true,
                format!(
                    "not checked: {markers} pending markers (transfers in flight); run at rest"
                ),
            ));
        } else {
            let mut sums = self.transfer_sums().await?;
            let mut wrong = Vec::new();
            for a in &accounts {
                let moved = sums.remove(&a.account_id).unwrap_or(0);
                let expected = i128::from(a.opening.minor()) + moved;
                if i128::from(a.balance.minor()) != expected {
                    wrong.push(format!(
                        "{}: balance {} ≠ opening {} + transfers {moved}",
                        a.account_id,
                        a.balance.minor(),
                        a.opening.minor()
                    ));
                }
            }
            for (account, moved) in sums {
                if moved != 0 {
                    wrong.push(format!(
                        "transfers move {moved} on {account}, which does not exist"
                    ));
                }
            }
            checks.push(check(
                "exactly_once",
                wrong.is_empty(),
                if wrong.is_empty() {
                    format!(
                        "{} accounts match opening + committed transfers",
                        accounts.len()
                    )
                } else {
                    named(&wrong)
                },
            ));
        }

        // 3. No overdraft.
        let overdrawn: Vec<String> = accounts
            .iter()
            .filter_map(|a| {
                let min = a.min_balance?;
                (a.balance < min).then(|| {
                    format!(
                        "{}: balance {} < min {}",
                        a.account_id,
                        a.balance.minor(),
                        min.minor()
                    )
                })
            })
            .collect();
        let limited = accounts.iter().filter(|a| a.min_balance.is_some()).count();
        checks.push(check(
            "no_overdraft",
            overdrawn.is_empty(),
            if overdrawn.is_empty() {
                format!("{limited} limited accounts at or above their minimum")
            } else {
                named(&overdrawn)
            },
        ));

        // 4. Termination.
        let states = state_counts(self).await?;
        let open = states.open();
        let oldest = oldest_open(self).await?;
        let oldest_age = oldest.map(|t| now.saturating_sub(t));
        let terminated = if options.at_rest {
            open == 0
        } else {
            oldest_age.is_none_or(|age| age <= age_max)
        };
        checks.push(check(
            "termination",
            terminated,
            format!(
                "{open} open (initial {}, pending {}, committed {}, canceling {}); done {}, cancelled {}; oldest open {}",
                states.initial,
                states.pending,
                states.committed,
                states.canceling,
                states.done,
                states.cancelled,
                oldest_age.map_or("none".to_owned(), |a| format!("{} ms old", a)),
            ),
        ));

        // 5. Pending markers.
        let mut old_markers = Vec::new();
        for a in &accounts {
            for m in &a.pending {
                let age = m.at.map_or(i64::MAX, |at| now.saturating_sub(at));
                if options.at_rest || age > age_max {
                    old_markers.push(format!(
                        "{} holds {} ({})",
                        a.account_id,
                        m.txn,
                        m.delta.minor()
                    ));
                }
            }
        }
        checks.push(check(
            "no_pending_markers",
            old_markers.is_empty(),
            if old_markers.is_empty() {
                format!("{markers} pending markers, none too old")
            } else {
                named(&old_markers)
            },
        ));

        // 6. Immutable documents.
        let (seen, rewritten) = self.rewritten_documents().await?;
        checks.push(check(
            "immutable_documents",
            rewritten.is_empty(),
            if rewritten.is_empty() {
                format!("{seen} order-ledger documents, all at revision 1")
            } else {
                named(&rewritten)
            },
        ));

        checks.push(check(
            "account_documents",
            malformed.is_empty(),
            if malformed.is_empty() {
                format!("{} valid account documents", accounts.len())
            } else {
                named(&malformed)
            },
        ));

        Ok(VerifyReport {
            ok: checks.iter().all(|c| c.ok),
            checks,
        })
    }
}
