//! The auditor: the invariants of docs/PROTOCOL.md (1–7), checked from what the database holds.
//!
//! The expected state is rebuilt from the documents themselves — the transfers, the
//! order-ledger entries and the accounts' opening records, read once from the `_changes` feed —
//! and compared with the account documents and with the views (`transactions/by_account`,
//! `orders/ledger`). Everything is read in bounded pages, and every sum is computed here in
//! `i128` rather than trusted from a `_sum` (JavaScript doubles). Every violation names the documents involved (in its `detail`, and as
//! ids in [`Check::documents`]).
//!
//! It reads a moving database without a snapshot, so the exact checks (2 and 5) are only
//! meaningful at rest; [`VerifyOptions::at_rest`] asks for them strictly.
//!
//! Long, and one file on purpose: every check reads the one scan of the database built at the
//! bottom (`Scan`), and each check is a short function of it; split, a check would sit apart
//! from the facts it counts. About 170 lines at the end are its tests.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::account_doc::{account_doc_id, AccountDoc, AccountView};
use crate::couch::{take_conflicts, winner_of, ChangeRow, ChangesQuery, Client, ViewQuery};
use crate::engine::now_ms;
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::limits::{
    OPEN_AGE_MAX_MS, PAGES_MAX, PAGE_ROWS_MAX, READ_BATCH_KEYS_MAX, SETTLED_RETENTION_MIN_MS,
};
use crate::money::Amount;
use crate::opening::{account_term, opening_doc_id, OpeningRecord, OPENING_PREFIX};
use crate::state::State;
use crate::sweeper::StateCounts;
use crate::transfer::{digest_of, key_doc_id, transfer_of, TxnDoc};

/// Id prefixes of the write-once documents (invariant 6): the order ledger's entries and the
/// accounts' opening records.
const IMMUTABLE_PREFIXES: [&str; 7] = [
    "purchase:",
    "payment:",
    "refund:",
    "adjustment:",
    "shipment:",
    "delivery:",
    OPENING_PREFIX,
];

/// Id prefixes of every ledger document (invariant 8: none holds a conflict).
const LEDGER_PREFIXES: [&str; 9] = [
    "purchase:",
    "payment:",
    "refund:",
    "adjustment:",
    "shipment:",
    "delivery:",
    OPENING_PREFIX,
    "account:",
    "txn:",
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
    /// `immutable_documents`, `order_balances`, `account_documents`, `opening_records`,
    /// `transfer_documents`, `conflicts`, `design_documents`.
    pub name: String,
    /// It holds.
    pub ok: bool,
    /// The figures behind the verdict; for a violation, what is wrong with which documents.
    pub detail: String,
    /// For a violation, the ids of the documents involved (accounts, transfers, order
    /// entries), at most 1,000; empty when the check holds.
    pub documents: Vec<String>,
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
    check_with(name, ok, detail, Vec::new())
}

fn check_with(name: &str, ok: bool, detail: String, mut documents: Vec<String>) -> Check {
    let mut seen = std::collections::HashSet::new();
    documents.retain(|d| seen.insert(d.clone()));
    documents.truncate(DOCUMENTS_MAX);
    if ok {
        documents.clear();
    }
    Check {
        name: name.to_owned(),
        ok,
        detail,
        documents,
    }
}

/// At most this many offenders are named in one detail line.
const NAMED_MAX: usize = 10;

/// At most this many document ids are listed in one [`Check::documents`].
const DOCUMENTS_MAX: usize = 1_000;

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

/// A check that holds when nothing was `found` (`(document id, what is wrong)` pairs): then its
/// detail is `fine`'s, else it names what was found, and the documents.
fn check_found(name: &str, found: &[(String, String)], fine: impl FnOnce() -> String) -> Check {
    check_with(
        name,
        found.is_empty(),
        if found.is_empty() {
            fine()
        } else {
            named(&found.iter().map(|(_, m)| m.clone()).collect::<Vec<_>>())
        },
        found.iter().map(|(id, _)| id.clone()).collect(),
    )
}

impl Ledger {
    /// Every account, read in pages from the `transactions/account_balances` view.
    ///
    /// # Errors
    ///
    /// A document that is not a valid account; the server failed.
    pub async fn all_accounts(&self) -> Result<Vec<AccountView>> {
        let (docs, bad) = self.account_docs().await?;
        if let Some((_, first)) = bad.first() {
            return Err(Error::decode(first.clone()));
        }
        docs.iter().map(AccountDoc::view).collect()
    }

    /// Account documents and, separately, `(id, what is wrong)` for the ones that are not
    /// valid accounts.
    async fn account_docs(&self) -> Result<(Vec<AccountDoc>, Vec<(String, String)>)> {
        let mut docs = Vec::new();
        let mut bad = Vec::new();
        let q = ViewQuery {
            reduce: Some(false),
            include_docs: Some(true),
            ..ViewQuery::default()
        };
        self.inner
            .hot
            .view_in_pages("transactions", "account_balances", q, |row| {
                let id = row.id.clone().unwrap_or_else(|| row.key.to_string());
                match row.doc {
                    Some(doc) => match AccountDoc::from_value(doc) {
                        Ok(d) => docs.push(d),
                        Err(e) => bad.push((id, e.to_string())),
                    },
                    None => bad.push((id.clone(), format!("{id}: no document"))),
                }
                Ok(())
            })
            .await?;
        if let Some(copies) = self.inner.hot.stated_copies().await?.filter(|n| *n > 1) {
            // A view's documents come from a quorum read, which a copy lacking a leaf can
            // answer for: the winner every copy's leaves give is the account as it stands.
            let ids: Vec<String> = docs.iter().map(|d| d.id.clone()).collect();
            let mut read = Vec::with_capacity(ids.len());
            for chunk in ids.chunks(READ_BATCH_KEYS_MAX) {
                for winner in winners(&self.inner.hot, copies, chunk).await? {
                    read.push(winner);
                }
            }
            let mut again = Vec::with_capacity(docs.len());
            // One deleted since the view was read is no account any more.
            for (old, winner) in docs.into_iter().zip(read) {
                if let Some(mut doc) = winner {
                    take_conflicts(&mut doc);
                    match AccountDoc::from_value(doc) {
                        Ok(d) => again.push(d),
                        Err(e) => bad.push((old.id, e.to_string())),
                    }
                }
            }
            docs = again;
        }
        Ok((docs, bad))
    }

    /// `account → Σ in − Σ out` over committed and done transfers (`transactions/by_account`).
    async fn transfer_sums(&self) -> Result<HashMap<String, i128>> {
        let mut sums = HashMap::new();
        let q = ViewQuery {
            group: Some(true),
            ..ViewQuery::default()
        };
        self.inner
            .hot
            .view_in_pages("transactions", "by_account", q, |row| {
                let account = row.key.as_str().unwrap_or_default().to_owned();
                let sum = row.value.as_i64().ok_or_else(|| {
                    Error::decode(format!(
                        "transactions/by_account sum for {account} is {}, not an integer",
                        row.value
                    ))
                })?;
                sums.insert(account, i128::from(sum));
                Ok(())
            })
            .await?;
        Ok(sums)
    }

    /// Every document of the database, once, from the `_changes` feed with their bodies: the
    /// write-once documents (their revisions), the order ledger's money entries and the
    /// transfers, each parsed leniently so one bad document is reported, never fatal.
    async fn scan_documents(&self) -> Result<Scan> {
        let mut rows = Latest::default();
        let mut read: u64 = 0;
        for client in self.databases() {
            // Opening records count only from the ledger's database, where the validation
            // keeps them write-once; one in the hot database is anybody's write.
            let records_here = client.database() == self.inner.client.database();
            self.scan_database(client, records_here, &mut rows, &mut read)
                .await?;
        }
        Ok(rows.scan())
    }

    /// One database's part of [`Ledger::scan_documents`].
    async fn scan_database(
        &self,
        client: &Client,
        records_here: bool,
        rows: &mut Latest,
        read: &mut u64,
    ) -> Result<()> {
        let mut since: Option<Value> = None;
        let copies = client.stated_copies().await?.filter(|n| *n > 1);
        for _ in 0..PAGES_MAX {
            let q = ChangesQuery {
                since: since.clone(),
                limit: Some(PAGE_ROWS_MAX),
                include_docs: true,
                conflicts: true,
                ..ChangesQuery::default()
            };
            let mut page = client.changes(&q).await?;
            let n = page.results.len() as u64;
            if let Some(copies) = copies {
                read_every_copy(client, copies, &mut page.results).await?;
            }
            for row in page.results {
                if !records_here && row.id.starts_with(OPENING_PREFIX) {
                    if !row.deleted {
                        rows.misplaced_records
                            .push(format!("{}/{}", client.database(), row.id));
                    }
                    continue;
                }
                rows.keep(row);
            }
            *read += n;
            self.report_progress("verify", *read, None);
            since = Some(page.last_seq);
            if n < PAGE_ROWS_MAX {
                return Ok(());
            }
        }
        Err(Error::invariant("_changes: too many documents to read"))
    }

    /// `order_id → Σ` from the `orders/ledger` view, grouped, read in pages.
    async fn order_view_sums(&self) -> Result<BTreeMap<String, Signed>> {
        let mut sums = BTreeMap::new();
        let q = ViewQuery {
            group: Some(true),
            ..ViewQuery::default()
        };
        self.inner
            .client
            .view_in_pages("orders", "ledger", q, |row| {
                let order = match row.key.as_str() {
                    Some(k) => k.to_owned(),
                    None => row.key.to_string(),
                };
                let sum = row
                    .value
                    .as_i64()
                    .map(i128::from)
                    .ok_or_else(|| format!("{} is not an integer", row.value));
                sums.insert(order, sum);
                Ok(())
            })
            .await?;
        Ok(sums)
    }

    /// The invariants 1–7 (docs/PROTOCOL.md) with the default (not at rest) options: see
    /// [`Ledger::verify_with`].
    ///
    /// # Errors
    ///
    /// The server failed. A broken invariant is not an error: it is a check with `ok: false`.
    pub async fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(VerifyOptions::default()).await
    }

    /// Checks the invariants 1–7 (docs/PROTOCOL.md), rebuilding the expected state from the documents
    /// themselves (the transfers and the order-ledger entries, read from `_changes`) rather
    /// than from the views:
    ///
    /// 1. `conservation`: per currency, Σ balance = Σ opening.
    /// 2. `exactly_once`: every account's balance = opening + Σ in − Σ out over the committed
    ///    and done transfer documents, and the `transactions/by_account` view agrees with
    ///    those documents — at rest (no pending marker) only.
    /// 3. `no_overdraft`: balance ≥ min_balance for every limited account.
    /// 4. `termination`: no open transfer (at rest), or none older than `open_age_max`.
    /// 5. `no_pending_markers`: none (at rest), or none older than `open_age_max`.
    /// 6. `immutable_documents`: every order-ledger document at revision 1, none deleted.
    /// 7. `order_balances`: every order's balance in the `orders/ledger` view equals the sum
    ///    computed from its documents.
    ///
    /// plus `account_documents` and `transfer_documents`: every account and transfer document
    /// is one this program can read; `opening_records`: every account has its opening record
    /// in the ledger's database and agrees with it; and `design_documents`: the views and the
    /// validation of this version are installed and unchanged (without `_design/validation`
    /// the server no longer keeps history write-once).
    ///
    /// An account's currency, opening and minimum are taken from its opening record (written
    /// once, validated, in the ledger's database), not from the account document: in the split
    /// layout the account lives where nothing validates it, and an opening raised there
    /// together with the balance would leave every sum of the document's own figures intact.
    /// Only an account without a record is counted with its document's figures (and named in
    /// `opening_records`).
    ///
    /// Every violation names the documents involved, in its `detail` and in `documents`: the
    /// accounts, the transfers that explain (or fail to explain) a balance, the order's entries.
    ///
    /// # Errors
    ///
    /// The server failed.
    pub async fn verify_with(&self, options: VerifyOptions) -> Result<VerifyReport> {
        let now = now_ms();
        let age_max = i64::try_from(options.open_age_max.as_millis()).unwrap_or(i64::MAX);
        let (accounts, malformed) = self.account_docs().await?;
        let scan = self.scan_documents().await?;
        let moves = scan.moves();
        let terms: Vec<Terms<'_>> = accounts.iter().map(|a| scan.terms_of(a)).collect();
        let audit = Audit {
            accounts: &accounts,
            terms: &terms,
            scan: &scan,
            moves: &moves,
            now,
            age_max,
            at_rest: options.at_rest,
        };
        // 1–6: the invariants, each a method of `Audit`.
        let mut checks = vec![
            audit.conservation(),
            audit.exactly_once(self).await?,
            audit.no_overdraft(),
            audit.termination(),
            audit.no_pending_markers(),
            audit.immutable_documents(),
        ];

        // 7. Order balances: the view against the documents.
        let view = self.order_view_sums().await?;
        let (detail, ok, docs) = scan.compare_orders(&view);
        checks.push(check_with("order_balances", ok, detail, docs));

        checks.push(check_found("account_documents", &malformed, || {
            format!("{} valid account documents", accounts.len())
        }));
        checks.push(self.check_opening_records(&accounts, &malformed, &scan));
        checks.push(audit.transfer_documents());
        checks.push(audit.conflicts());
        checks.push(self.check_design_documents().await?);
        Ok(VerifyReport {
            ok: checks.iter().all(|c| c.ok),
            checks,
        })
    }

    /// The `design_documents` check, the server-side guarantees themselves: the views and the
    /// validation this version installs are there and unchanged.
    async fn check_design_documents(&self) -> Result<Check> {
        let drift = self.design_drift().await?;
        let expected = crate::design::design_docs().len();
        Ok(check_found("design_documents", &drift, || {
            match self.hot_database() {
                None => format!(
                    "{expected} design documents installed and unchanged, validation included"
                ),
                Some(hot) => format!(
                    "{expected} design documents installed and unchanged, validation \
                     included; in {hot} (accounts and transfers, no validation) {}",
                    crate::design::Scope::Hot.design_docs().len()
                ),
            }
        }))
    }
}

/// What the checks of one `verify` read: the accounts with their terms, the documents scanned
/// and the transfers' moves per account, at `now`.
struct Audit<'a> {
    accounts: &'a [AccountDoc],
    terms: &'a [Terms<'a>],
    scan: &'a Scan,
    moves: &'a HashMap<String, i128>,
    now: i64,
    /// How old an open transfer or a pending marker may be, ms.
    age_max: i64,
    at_rest: bool,
}

impl Audit<'_> {
    /// 1. Conservation, per currency. A violation names the accounts whose balance is not
    ///    explained by their opening, their committed/done transfers and their pending
    ///    markers — or, when every account is explained that way, the markers in flight.
    fn conservation(&self) -> Check {
        let (accounts, terms, scan, moves) = (self.accounts, self.terms, self.scan, self.moves);
        let mut totals: BTreeMap<&str, (i128, i128)> = BTreeMap::new();
        for (a, t) in accounts.iter().zip(terms) {
            let total = totals.entry(t.currency).or_default();
            total.0 += i128::from(t.opening.minor());
            total.1 += i128::from(a.balance.minor());
        }
        let mut unbalanced = Vec::new();
        let mut conservation_docs = Vec::new();
        for (currency, (opening, balance)) in &totals {
            if opening == balance {
                continue;
            }
            let mut named_here = Vec::new();
            let in_currency = || {
                accounts
                    .iter()
                    .zip(terms)
                    .filter(|(_, t)| t.currency == *currency)
            };
            for (a, t) in in_currency() {
                let in_flight: i128 = a
                    .pending
                    .iter()
                    .filter(|m| !scan.is_committed(&m.txn))
                    .map(|m| i128::from(m.delta.minor()))
                    .sum();
                let moved = moves.get(&a.account_id).copied().unwrap_or(0);
                let drift = i128::from(a.balance.minor())
                    - i128::from(t.opening.minor())
                    - moved
                    - in_flight;
                if drift != 0 {
                    named_here.push(format!("{} ({drift:+} unexplained)", a.id));
                    conservation_docs.push(a.id.clone());
                }
            }
            if named_here.is_empty() {
                for (a, _) in in_currency() {
                    for m in &a.pending {
                        named_here.push(format!(
                            "{} holds {} ({:+})",
                            a.id,
                            key_doc_id(&m.txn),
                            m.delta.minor()
                        ));
                        conservation_docs.push(a.id.clone());
                        conservation_docs.push(key_doc_id(&m.txn));
                    }
                }
            }
            unbalanced.push(format!(
                "{currency}: Σ balance {balance} ≠ Σ opening {opening} (off by {:+}): {}",
                balance - opening,
                named(&named_here)
            ));
        }
        let figures = totals
            .iter()
            .map(|(c, (o, b))| format!("{c}: Σ balance {b}, Σ opening {o}"))
            .collect::<Vec<_>>()
            .join("; ");
        check_with(
            "conservation",
            unbalanced.is_empty(),
            if unbalanced.is_empty() {
                format!("{} accounts; {figures}", accounts.len())
            } else {
                unbalanced.join(" | ")
            },
            conservation_docs,
        )
    }

    /// Pending markers held by the accounts.
    fn markers(&self) -> usize {
        self.accounts.iter().map(|a| a.pending.len()).sum()
    }

    /// 2. Exactly-once: every account's balance is its opening plus its committed or done
    ///    transfers, and `transactions/by_account` agrees (read only when the check runs).
    async fn exactly_once(&self, ledger: &Ledger) -> Result<Check> {
        let markers = self.markers();
        if markers > 0 && !self.at_rest {
            return Ok(check(
                "exactly_once",
                true,
                format!(
                    "not checked: {markers} pending markers (transfers in flight); run at rest"
                ),
            ));
        }
        let (accounts, scan) = (self.accounts, self.scan);
        let mut view_sums = ledger.transfer_sums().await?;
        let mut wrong = Vec::new();
        let mut docs = Vec::new();
        let mut doc_moves = self.moves.clone();
        for (a, t) in accounts.iter().zip(self.terms) {
            let moved = doc_moves.remove(&a.account_id).unwrap_or(0);
            let viewed = view_sums.remove(&a.account_id).unwrap_or(0);
            let expected = i128::from(t.opening.minor()) + moved;
            if i128::from(a.balance.minor()) != expected {
                let (why, involved) = scan.suspects(a, self.now);
                wrong.push(format!(
                    "{}: balance {} ≠ opening {} + transfers {moved}; {why}",
                    a.id,
                    a.balance.minor(),
                    t.opening.minor()
                ));
                docs.push(a.id.clone());
                docs.extend(involved);
            }
            if viewed != moved {
                wrong.push(format!(
                    "{}: transactions/by_account says {viewed}, the transfer documents {moved} ({})",
                    a.id,
                    scan.touching(&a.account_id, NAMED_MAX).join(", ")
                ));
                docs.push(a.id.clone());
            }
        }
        let mut strays: BTreeMap<String, i128> = doc_moves.into_iter().collect();
        for (account, sum) in view_sums {
            strays.entry(account).or_insert(sum);
        }
        for (account, moved) in strays {
            if moved != 0 {
                let involved = scan.touching(&account, NAMED_MAX);
                wrong.push(format!(
                    "transfers move {moved} on {}, which does not exist ({})",
                    account_doc_id(&account),
                    involved.join(", ")
                ));
                docs.extend(involved);
            }
        }
        Ok(check_with(
            "exactly_once",
            wrong.is_empty(),
            if wrong.is_empty() {
                format!(
                    "{} accounts match opening + {} committed or done transfer documents, and transactions/by_account agrees",
                    accounts.len(),
                    scan.committed_count()
                )
            } else {
                named(&wrong)
            },
            docs,
        ))
    }

    /// 3. No overdraft.
    fn no_overdraft(&self) -> Check {
        let overdrawn: Vec<(&AccountDoc, Amount)> = self
            .accounts
            .iter()
            .zip(self.terms)
            .filter_map(|(a, t)| t.min_balance.filter(|min| a.balance < *min).map(|m| (a, m)))
            .collect();
        let limited = self
            .terms
            .iter()
            .filter(|t| t.min_balance.is_some())
            .count();
        check_with(
            "no_overdraft",
            overdrawn.is_empty(),
            if overdrawn.is_empty() {
                format!("{limited} limited accounts at or above their minimum")
            } else {
                named(
                    &overdrawn
                        .iter()
                        .map(|(a, min)| {
                            format!(
                                "{}: balance {} < min {} (pending: {})",
                                a.id,
                                a.balance.minor(),
                                min.minor(),
                                markers_of(a)
                            )
                        })
                        .collect::<Vec<_>>(),
                )
            },
            overdrawn.iter().map(|(a, _)| a.id.clone()).collect(),
        )
    }

    /// 4. Termination, from the transfer documents (oldest open first).
    fn termination(&self) -> Check {
        let now = self.now;
        let counts = self.scan.state_counts();
        let mut open: Vec<&TxnFacts> = self
            .scan
            .transfers
            .iter()
            .filter(|t| t.state.is_some_and(|s| !s.is_terminal()))
            .collect();
        open.sort_by_key(|t| t.last_modified);
        let stuck: Vec<&TxnFacts> = open
            .iter()
            .copied()
            .filter(|t| self.at_rest || now.saturating_sub(t.last_modified) > self.age_max)
            .collect();
        let oldest_age = open.first().map(|t| now.saturating_sub(t.last_modified));
        let mut detail = format!(
            "{} open (initial {}, pending {}, committed {}, canceling {}); done {}, cancelled {}; oldest open {}",
            open.len(),
            counts.initial,
            counts.pending,
            counts.committed,
            counts.canceling,
            counts.done,
            counts.cancelled,
            oldest_age.map_or("none".to_owned(), |a| format!("{a} ms old")),
        );
        if !stuck.is_empty() {
            let lines: Vec<String> = stuck
                .iter()
                .map(|t| {
                    format!(
                        "{} {} for {} ms",
                        t.doc_id,
                        t.state_name,
                        now.saturating_sub(t.last_modified)
                    )
                })
                .collect();
            detail.push_str(&format!("; not finished: {}", named(&lines)));
        }
        check_with(
            "termination",
            stuck.is_empty(),
            detail,
            stuck.iter().map(|t| t.doc_id.clone()).collect(),
        )
    }

    /// 5. Pending markers.
    fn no_pending_markers(&self) -> Check {
        let mut old_markers = Vec::new();
        let mut marker_docs = Vec::new();
        for a in self.accounts {
            for m in &a.pending {
                let age = m.at.map_or(i64::MAX, |at| self.now.saturating_sub(at));
                if self.at_rest || age > self.age_max {
                    old_markers.push(format!(
                        "{} holds {} ({:+}, transfer {})",
                        a.id,
                        key_doc_id(&m.txn),
                        m.delta.minor(),
                        self.scan.state_of(&m.txn)
                    ));
                    marker_docs.push(a.id.clone());
                    marker_docs.push(key_doc_id(&m.txn));
                }
            }
        }
        check_with(
            "no_pending_markers",
            old_markers.is_empty(),
            if old_markers.is_empty() {
                format!("{} pending markers, none too old", self.markers())
            } else {
                named(&old_markers)
            },
            marker_docs,
        )
    }

    /// 6. Immutable documents.
    fn immutable_documents(&self) -> Check {
        let scan = self.scan;
        check_found("immutable_documents", &scan.rewritten, || {
            format!(
                "{} write-once documents (order entries, opening records), all at revision 1",
                scan.immutable_seen
            )
        })
    }

    /// Every transfer document is one this program can read.
    fn transfer_documents(&self) -> Check {
        let scan = self.scan;
        check_found("transfer_documents", &scan.bad_transfers, || {
            format!("{} valid transfer documents", scan.transfers.len())
        })
    }

    /// 8. No unresolved conflict: on a cluster (or after replication into the database) two
    ///    writers of one revision can both succeed; the losing revision is kept beside the
    ///    winner until someone resolves it, and until then the winner may not hold every
    ///    effect (docs/CLUSTER.md).
    fn conflicts(&self) -> Check {
        let scan = self.scan;
        check_with(
            "conflicts",
            scan.conflicts.is_empty(),
            if scan.conflicts.is_empty() {
                "no ledger document holds a conflict".to_owned()
            } else {
                named(
                    &scan
                        .conflicts
                        .iter()
                        .map(|(id, revs)| {
                            format!(
                                "{id} holds {} conflicting revisions ({})",
                                revs.len(),
                                revs.join(", ")
                            )
                        })
                        .collect::<Vec<_>>(),
                )
            },
            scan.conflicts.iter().map(|(id, _)| id.clone()).collect(),
        )
    }
}

impl Ledger {
    /// The `opening_records` check: every readable account has its opening record in the
    /// ledger's database, with the same currency, opening and minimum; every record is
    /// readable; none lies in the hot database; no account that has a record was deleted. A
    /// record without an account is a create that stopped between its two writes (the record
    /// comes first): named in the detail, not a violation — the same create completes it.
    fn check_opening_records(
        &self,
        accounts: &[AccountDoc],
        malformed: &[(String, String)],
        scan: &Scan,
    ) -> Check {
        let db = self.inner.client.database();
        let mut wrong = Vec::new();
        let mut docs = Vec::new();
        accounts_against_records(accounts, scan, db, &mut wrong, &mut docs);
        for (id, why) in &scan.bad_records {
            wrong.push(why.clone());
            docs.push(id.clone());
        }
        for id in &scan.misplaced_records {
            wrong.push(format!(
                "{id}: an opening record outside {db}, where nothing validates it (not counted)"
            ));
            docs.push(id.clone());
        }
        let mut unfinished =
            records_without_account(accounts, malformed, scan, &mut wrong, &mut docs);
        unfinished.sort();
        let mut detail = if wrong.is_empty() {
            format!(
                "{} accounts match their opening records in {db}",
                accounts.len()
            )
        } else {
            named(&wrong)
        };
        if !unfinished.is_empty() {
            detail.push_str(&format!(
                "; {} records without an account, a create that stopped half-way (the same \
                 `account create` completes it): {}",
                unfinished.len(),
                named(&unfinished)
            ));
        }
        check_with("opening_records", wrong.is_empty(), detail, docs)
    }
}

/// For `check_opening_records`: each account without its opening record, or whose terms
/// differ from it, said in `wrong` and named in `docs` (with the record).
fn accounts_against_records(
    accounts: &[AccountDoc],
    scan: &Scan,
    db: &str,
    wrong: &mut Vec<String>,
    docs: &mut Vec<String>,
) {
    for a in accounts {
        let Some(record) = scan.records.get(&a.account_id) else {
            wrong.push(format!(
                "{} has no opening record ({} in {db}); run `couch-ledger init`, which writes \
                 the records of accounts created before records existed",
                a.id,
                opening_doc_id(&a.account_id)
            ));
            docs.push(a.id.clone());
            continue;
        };
        if let Some(field) = record.differing_term(a) {
            wrong.push(format!(
                "{}: {field} {} differs from its opening record's {} ({}): the account \
                 document was changed",
                a.id,
                account_term(a, field),
                record.term(field),
                record.id
            ));
            docs.push(a.id.clone());
            docs.push(record.id.clone());
        }
    }
}

/// For `check_opening_records`: the opening records whose account is not among `accounts`
/// (nor the `malformed` ones). An account deleted is said in `wrong` and named in `docs` (with
/// its record); the ids of the others, records of creates that stopped half-way, are returned.
fn records_without_account(
    accounts: &[AccountDoc],
    malformed: &[(String, String)],
    scan: &Scan,
    wrong: &mut Vec<String>,
    docs: &mut Vec<String>,
) -> Vec<String> {
    let existing: std::collections::HashSet<&str> = accounts
        .iter()
        .map(|a| a.id.as_str())
        .chain(malformed.iter().map(|(id, _)| id.as_str()))
        .collect();
    let mut unfinished = Vec::new();
    for (account, record) in &scan.records {
        let id = account_doc_id(account);
        if existing.contains(id.as_str()) {
            continue;
        }
        if scan.deleted_accounts.contains(&id) {
            wrong.push(format!(
                "{id} was deleted; its opening record {} says it opened with {} {}",
                record.id,
                record.opening.minor(),
                record.currency
            ));
            docs.push(id);
            docs.push(record.id.clone());
        } else {
            unfinished.push(record.id.clone());
        }
    }
    unfinished
}

/// `{txn} {delta}` for each pending marker of an account.
fn markers_of(a: &AccountDoc) -> String {
    if a.pending.is_empty() {
        return "none".to_owned();
    }
    a.pending
        .iter()
        .map(|m| format!("{} {:+}", key_doc_id(&m.txn), m.delta.minor()))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---- the documents, as the auditor reads them ------------------------------------------------

/// A signed amount, or what is wrong with the document it should come from.
type Signed = std::result::Result<i128, String>;

/// An account's fixed fields as the auditor counts them: from its opening record, or from the
/// account document where it has none.
#[derive(Debug, Clone, Copy)]
struct Terms<'a> {
    currency: &'a str,
    opening: Amount,
    min_balance: Option<Amount>,
}

/// What the auditor needs of one transfer document.
#[derive(Debug, Clone)]
struct TxnFacts {
    doc_id: String,
    txn_id: String,
    /// The key of its entries on its accounts (`transfer::entry_key`).
    key: String,
    source: String,
    destination: String,
    value: i128,
    /// `None`: a state this program does not know (reported in `transfer_documents`).
    state: Option<State>,
    state_name: String,
    last_modified: i64,
    /// Decided on the one-write path (its document names the markers it counts): where the
    /// database keeps one copy its accounts keep no settled entry of it (docs/ONE_WRITE.md).
    one_write: bool,
}

/// One scan of the database.
#[derive(Debug, Default)]
struct Scan {
    /// Write-once documents seen.
    immutable_seen: u64,
    /// `(id, what is wrong)` for write-once documents rewritten or deleted.
    rewritten: Vec<(String, String)>,
    /// Money entries by order: `(doc id, signed amount or what is wrong with it)`.
    orders: BTreeMap<String, Vec<(String, Signed)>>,
    /// Money entries without a usable `order_id`: `(id, what is wrong)`.
    orphan_entries: Vec<(String, String)>,
    /// Readable transfers.
    transfers: Vec<TxnFacts>,
    /// `txn_id → index` into `transfers`.
    by_txn: HashMap<String, usize>,
    /// `account_id → indexes` of the transfers naming it.
    by_account: HashMap<String, Vec<usize>>,
    /// `(id, what is wrong)` for transfer documents this program cannot read.
    bad_transfers: Vec<(String, String)>,
    /// `(id, losing revisions)` for ledger documents that hold an unresolved conflict.
    conflicts: Vec<(String, Vec<String>)>,
    /// Readable opening records of the ledger's database, by account id.
    records: HashMap<String, OpeningRecord>,
    /// `(id, what is wrong)` for opening records this program cannot read.
    bad_records: Vec<(String, String)>,
    /// `{database}/{id}` of opening records found in the hot database (never counted).
    misplaced_records: Vec<String>,
    /// `account:…` ids the feed shows deleted.
    deleted_accounts: std::collections::HashSet<String>,
}

/// The feed's rows, one per document. `_changes` may name a document more than once: it moved
/// while the feed was read (a later row, newer), or a cluster's copies each reported it. Every
/// document must count once, as it is now.
#[derive(Default)]
struct Latest {
    rows: BTreeMap<String, crate::couch::ChangeRow>,
    /// `{database}/{id}` of opening records where they do not belong (the hot database): not
    /// kept as rows, so they never count as records.
    misplaced_records: Vec<String>,
}

impl Latest {
    fn keep(&mut self, row: crate::couch::ChangeRow) {
        self.rows.insert(row.id.clone(), row);
    }

    fn scan(self) -> Scan {
        let mut scan = Scan::default();
        for row in self.rows.into_values() {
            scan.add(row);
        }
        scan.misplaced_records = self.misplaced_records;
        scan.misplaced_records.sort();
        scan.misplaced_records.dedup();
        scan
    }
}

/// Replaces the bodies of a `_changes` page with what every copy holds, on a database of
/// several copies: `_changes` reads one copy of each shard range, which may lag (a document's
/// older revision) or lack a leaf another copy holds, so a conflict or a balance may not show.
/// Each live document is read again with all its leaves (`_bulk_get`, `r` = `copies`, which
/// merges the copies' revision trees) and carries CouchDB's winner among them, its
/// `_conflicts` the others. Deleted rows and design documents are left as they are.
async fn read_every_copy(client: &Client, copies: u32, rows: &mut [ChangeRow]) -> Result<()> {
    let at: Vec<usize> = (0..rows.len())
        .filter(|i| !rows[*i].deleted && !rows[*i].id.starts_with("_design/"))
        .collect();
    for chunk in at.chunks(READ_BATCH_KEYS_MAX) {
        let ids: Vec<String> = chunk.iter().map(|i| rows[*i].id.clone()).collect();
        let read = winners(client, copies, &ids).await?;
        for (i, winner) in chunk.iter().zip(read) {
            let row = &mut rows[*i];
            match winner {
                Some(doc) => {
                    row.changes = vec![serde_json::json!({ "rev": doc.get("_rev").cloned() })];
                    row.doc = Some(doc);
                }
                // Deleted since the feed was read (or on every copy but the one it read).
                None => {
                    row.deleted = true;
                    row.doc = None;
                }
            }
        }
    }
    Ok(())
}

/// Each document of `ids` as every copy's leaves give it (`_bulk_get`, `r` = `copies`):
/// CouchDB's winner among its live leaves, its `_conflicts` the others; `None` where none is
/// live.
async fn winners(client: &Client, copies: u32, ids: &[String]) -> Result<Vec<Option<Value>>> {
    Ok(client
        .leaves_of(ids, Some(copies))
        .await?
        .into_iter()
        .map(|leaves| {
            let live: Vec<Value> = leaves
                .into_iter()
                .filter(|l| l.get("_deleted").and_then(Value::as_bool) != Some(true))
                .collect();
            winner_of(&live)
        })
        .collect())
}

impl Scan {
    /// Counts one document of the feed (the latest row of its id) where it belongs.
    fn add(&mut self, row: crate::couch::ChangeRow) {
        let id = row.id.clone();
        if id.starts_with("_design/") {
            return;
        }
        if IMMUTABLE_PREFIXES.iter().any(|p| id.starts_with(p)) {
            self.add_write_once(&id, &row);
        }
        if row.deleted {
            if id.starts_with("txn:") {
                self.bad_transfers
                    .push((id.clone(), format!("{id} was deleted")));
            }
            if id.starts_with("account:") {
                self.deleted_accounts.insert(id);
            }
            return;
        }
        let Some(doc) = row.doc else { return };
        self.add_conflicts(&id, &doc);
        match doc.get("type").and_then(Value::as_str) {
            Some(t @ ("purchase" | "payment" | "refund" | "adjustment")) => {
                self.add_money_entry(id, t, &doc)
            }
            Some("transaction") => match TxnDoc::from_value(doc.clone()) {
                Ok(t) => self.add_transfer(t),
                Err(e) => self.bad_transfers.push((id, e.to_string())),
            },
            _ if id.starts_with("txn:") => self
                .bad_transfers
                .push((id.clone(), format!("{id} is not of type transaction"))),
            Some("opening") => match OpeningRecord::from_value(doc.clone()) {
                Ok(r) => {
                    self.records.insert(r.account_id.clone(), r);
                }
                Err(e) => self.bad_records.push((id, e.to_string())),
            },
            _ if id.starts_with(OPENING_PREFIX) => self
                .bad_records
                .push((id.clone(), format!("{id} is not of type opening"))),
            _ => {}
        }
    }

    /// A write-once document: counted, and noted as rewritten if it was deleted or is past its
    /// first revision.
    fn add_write_once(&mut self, id: &str, row: &crate::couch::ChangeRow) {
        self.immutable_seen += 1;
        let rev = row
            .changes
            .first()
            .and_then(|c| c.get("rev"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if row.deleted {
            self.rewritten
                .push((id.to_owned(), format!("{id} was deleted")));
        } else if !rev.starts_with("1-") {
            self.rewritten
                .push((id.to_owned(), format!("{id} is at revision {rev}")));
        }
    }

    /// The losing revisions of a ledger document `doc` that holds a conflict.
    fn add_conflicts(&mut self, id: &str, doc: &Value) {
        let ours = LEDGER_PREFIXES.iter().any(|p| id.starts_with(p));
        if let Some(losers) = doc.get("_conflicts").and_then(Value::as_array) {
            if ours && !losers.is_empty() {
                let revs = losers
                    .iter()
                    .map(|r| r.as_str().unwrap_or("?").to_owned())
                    .collect();
                self.conflicts.push((id.to_owned(), revs));
            }
        }
    }

    /// A money entry of type `t` under its order, signed as the order's balance counts it (a
    /// payment negative), or what is wrong with its amount; without an order, an orphan.
    fn add_money_entry(&mut self, id: String, t: &str, doc: &Value) {
        let field = if t == "purchase" { "total" } else { "value" };
        let amount = match doc.get(field).and_then(Value::as_i64) {
            Some(v) if v.unsigned_abs() <= crate::money::AMOUNT_ABS_MAX.unsigned_abs() => {
                Ok(if t == "payment" {
                    -i128::from(v)
                } else {
                    i128::from(v)
                })
            }
            _ => Err(format!(
                "{id}: {field} {} is not an integer number of minor units in range",
                doc.get(field).unwrap_or(&Value::Null)
            )),
        };
        match doc.get("order_id").and_then(Value::as_str) {
            Some(order) => self
                .orders
                .entry(order.to_owned())
                .or_default()
                .push((id, amount)),
            None => self
                .orphan_entries
                .push((id.clone(), format!("{id}: a {t} without an order_id"))),
        }
    }

    /// A readable transfer, indexed by its id and by both its accounts.
    fn add_transfer(&mut self, t: TxnDoc) {
        let i = self.transfers.len();
        self.by_txn.insert(t.txn_id.clone(), i);
        self.by_account.entry(t.source.clone()).or_default().push(i);
        self.by_account
            .entry(t.destination.clone())
            .or_default()
            .push(i);
        let key = t.entry_key();
        self.transfers.push(TxnFacts {
            doc_id: t.id,
            key,
            txn_id: t.txn_id,
            source: t.source,
            destination: t.destination,
            value: i128::from(t.value.minor()),
            state: Some(t.state),
            state_name: t.state.as_str().to_owned(),
            last_modified: t.last_modified,
            one_write: t.markers.is_some(),
        });
    }

    /// `a`'s currency, opening and minimum: its opening record's, or where it has none (named
    /// by `opening_records`) its own.
    fn terms_of<'a>(&'a self, a: &'a AccountDoc) -> Terms<'a> {
        match self.records.get(&a.account_id) {
            Some(r) => Terms {
                currency: &r.currency,
                opening: r.opening,
                min_balance: r.min_balance,
            },
            None => Terms {
                currency: &a.currency,
                opening: a.opening,
                min_balance: a.min_balance,
            },
        }
    }

    /// `account → Σ in − Σ out` over the committed and done transfer documents.
    fn moves(&self) -> HashMap<String, i128> {
        let mut moves = HashMap::new();
        for t in &self.transfers {
            if matches!(t.state, Some(State::Committed | State::Done)) {
                *moves.entry(t.source.clone()).or_default() -= t.value;
                *moves.entry(t.destination.clone()).or_default() += t.value;
            }
        }
        moves
    }

    fn committed_count(&self) -> usize {
        self.transfers
            .iter()
            .filter(|t| matches!(t.state, Some(State::Committed | State::Done)))
            .count()
    }

    /// The transfer of an account entry's `key`, where its document was read, and whether the
    /// entry holds that document's terms (a key of other terms under the same id never counts).
    fn of_key(&self, key: &str) -> Option<(&TxnFacts, bool)> {
        let t = &self.transfers[*self.by_txn.get(transfer_of(key))?];
        let own = digest_of(key).is_none() || key == t.key;
        Some((t, own))
    }

    fn is_committed(&self, key: &str) -> bool {
        self.of_key(key)
            .is_some_and(|(t, own)| own && matches!(t.state, Some(State::Committed | State::Done)))
    }

    fn state_of(&self, key: &str) -> String {
        match self.of_key(key) {
            Some((t, true)) => t.state_name.clone(),
            Some((t, false)) => format!("{} with other terms", t.state_name),
            None => "missing".to_owned(),
        }
    }

    fn state_counts(&self) -> StateCounts {
        let mut c = StateCounts::default();
        for t in &self.transfers {
            match t.state {
                Some(State::Initial) => c.initial += 1,
                Some(State::Pending) => c.pending += 1,
                Some(State::Committed) => c.committed += 1,
                Some(State::Done) => c.done += 1,
                Some(State::Canceling) => c.canceling += 1,
                Some(State::Cancelled) => c.cancelled += 1,
                None => {}
            }
        }
        c
    }

    /// Up to `max` transfers naming `account`, latest first: `txn:… (state, ±value)`.
    fn touching(&self, account: &str, max: usize) -> Vec<String> {
        let Some(idx) = self.by_account.get(account) else {
            return Vec::new();
        };
        let mut ts: Vec<&TxnFacts> = idx.iter().map(|&i| &self.transfers[i]).collect();
        ts.sort_by_key(|t| std::cmp::Reverse(t.last_modified));
        ts.into_iter()
            .take(max)
            .map(|t| {
                let sign = if t.source == account {
                    -t.value
                } else {
                    t.value
                };
                format!("{} ({}, {sign:+})", t.doc_id, t.state_name)
            })
            .collect()
    }

    /// Why an account's balance may be off: the transfers whose state disagrees with the
    /// account's markers (settled but cancelled, undone but done, pending but finished,
    /// unknown), else the latest transfers naming it. The text and the document ids.
    fn suspects(&self, a: &AccountDoc, now: i64) -> (String, Vec<String>) {
        let retention = i64::try_from(SETTLED_RETENTION_MIN_MS).unwrap_or(i64::MAX);
        let mut lines = Vec::new();
        let mut docs = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for s in &a.settled {
            seen.insert(s.txn.as_str());
            let state = self.of_key(&s.txn);
            let suspect = match state.and_then(|(t, own)| t.state.map(|st| (st, own))) {
                None => Some("does not exist or is unreadable".to_owned()),
                Some((_, false)) if !s.undone => {
                    Some("holds other terms, but this account settled these".to_owned())
                }
                Some((_, false)) => None,
                Some((State::Committed | State::Done, true)) if s.undone => {
                    Some("is committed/done, but this account undid it".to_owned())
                }
                Some((st, true)) if !s.undone && !matches!(st, State::Committed | State::Done) => {
                    Some(format!("is {st}, but this account settled it"))
                }
                Some((_, true)) => None,
            };
            if let Some(why) = suspect {
                lines.push(format!("{} {why}", key_doc_id(&s.txn)));
                docs.push(key_doc_id(&s.txn));
            }
        }
        for m in &a.pending {
            seen.insert(m.txn.as_str());
            let state = self.state_of(&m.txn);
            if state != "pending" && state != "committed" && state != "canceling" {
                lines.push(format!(
                    "{} is {state}, but this account holds its marker ({:+})",
                    key_doc_id(&m.txn),
                    m.delta.minor()
                ));
                docs.push(key_doc_id(&m.txn));
            }
        }
        if let Some(idx) = self.by_account.get(&a.account_id) {
            for &i in idx {
                let t = &self.transfers[i];
                // A one-write transfer leaves no settled entry where the database keeps one
                // copy: its absence there says nothing.
                if matches!(t.state, Some(State::Committed | State::Done))
                    && !t.one_write
                    && !seen.contains(t.txn_id.as_str())
                    && !seen.contains(t.key.as_str())
                    && now.saturating_sub(t.last_modified) < retention
                {
                    lines.push(format!(
                        "{} is {}, but this account holds no marker of it",
                        t.doc_id, t.state_name
                    ));
                    docs.push(t.doc_id.clone());
                }
            }
        }
        if lines.is_empty() {
            let latest = self.touching(&a.account_id, NAMED_MAX);
            docs.extend(
                latest
                    .iter()
                    .filter_map(|l| l.split(' ').next().map(str::to_owned)),
            );
            let text = if latest.is_empty() {
                "no transfer names it".to_owned()
            } else {
                format!("no transfer stands out; latest: {}", latest.join(", "))
            };
            return (text, docs);
        }
        (format!("suspects: {}", named(&lines)), docs)
    }

    /// Invariant 7: `(detail, ok, documents)`.
    fn compare_orders(&self, view: &BTreeMap<String, Signed>) -> (String, bool, Vec<String>) {
        let mut wrong = Vec::new();
        let mut docs = Vec::new();
        for (id, why) in &self.orphan_entries {
            wrong.push(why.clone());
            docs.push(id.clone());
        }
        let mut orders: std::collections::BTreeSet<&String> = self.orders.keys().collect();
        orders.extend(view.keys());
        for order in &orders {
            let entries = self.orders.get(*order).map(Vec::as_slice).unwrap_or(&[]);
            let ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
            let mut sum: i128 = 0;
            let mut broken = Vec::new();
            for (_, amount) in entries {
                match amount {
                    Ok(v) => sum += v,
                    Err(why) => broken.push(why.clone()),
                }
            }
            let viewed = view.get(*order).cloned().unwrap_or(Ok(0));
            let disagree = match &viewed {
                Ok(v) => *v != sum,
                Err(_) => true,
            };
            if disagree || !broken.is_empty() {
                let viewed = match viewed {
                    Ok(v) => v.to_string(),
                    Err(why) => why,
                };
                let mut line = format!(
                    "order {order:?}: orders/ledger says {viewed}, its documents {sum} ({})",
                    if ids.is_empty() {
                        "none found".to_owned()
                    } else {
                        named(&ids)
                    }
                );
                if !broken.is_empty() {
                    line.push_str(&format!("; {}", broken.join("; ")));
                }
                wrong.push(line);
                docs.extend(ids);
            }
        }
        if wrong.is_empty() {
            (
                format!(
                    "{} orders, each balance in orders/ledger equal to the sum of its documents",
                    self.orders.len()
                ),
                true,
                docs,
            )
        } else {
            (named(&wrong), false, docs)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(doc: Value) -> crate::couch::ChangeRow {
        let id = doc["_id"].as_str().unwrap().to_owned();
        let rev = doc["_rev"].as_str().unwrap_or("1-a").to_owned();
        serde_json::from_value(json!({
            "seq": 1, "id": id, "changes": [{"rev": rev}], "doc": doc
        }))
        .unwrap()
    }

    fn txn(id: &str, from: &str, to: &str, value: i64, state: &str) -> Value {
        json!({
            "_id": format!("txn:{id}"), "type": "transaction", "txn_id": id,
            "source": from, "destination": to, "value": value, "currency": "EUR",
            "state": state, "created_at": 1, "last_modified": 2
        })
    }

    fn account(id: &str, opening: i64, balance: i64, settled: Value) -> AccountDoc {
        AccountDoc::from_value(json!({
            "_id": format!("account:{id}"), "type": "account", "account_id": id,
            "currency": "EUR", "opening": opening, "balance": balance, "min_balance": 0,
            "pending": [], "settled": settled
        }))
        .unwrap()
    }

    #[test]
    fn a_document_the_feed_names_twice_counts_once() {
        let mut rows = Latest::default();
        rows.keep(row(txn("t1", "a", "b", 100, "pending")));
        rows.keep(row(
            json!({"_id": "payment:o1:p", "type": "payment", "order_id": "o1",
                             "value": 400}),
        ));
        // The same transfer again, moved on; the same payment again, unchanged.
        let mut later = txn("t1", "a", "b", 100, "done");
        later["_rev"] = json!("3-c");
        rows.keep(row(later));
        rows.keep(row(
            json!({"_id": "payment:o1:p", "type": "payment", "order_id": "o1",
                             "value": 400}),
        ));
        let scan = rows.scan();
        assert_eq!(scan.transfers.len(), 1);
        assert_eq!(
            scan.transfers[0].state,
            Some(State::Done),
            "the newer row counts"
        );
        assert_eq!(scan.immutable_seen, 1);
        assert_eq!(scan.orders["o1"].len(), 1);
        assert_eq!(scan.by_account["a"].len(), 1);
    }

    #[test]
    fn an_order_whose_view_disagrees_names_its_documents() {
        let mut scan = Scan::default();
        for doc in [
            json!({"_id": "purchase:o1", "type": "purchase", "order_id": "o1", "total": 1000}),
            json!({"_id": "payment:o1:p", "type": "payment", "order_id": "o1", "value": 400}),
            json!({"_id": "refund:o1:r", "type": "refund", "order_id": "o1", "value": 50}),
            json!({"_id": "adjustment:o2:a", "type": "adjustment", "order_id": "o2", "value": "x"}),
            json!({"_id": "payment:o3:p", "_rev": "2-b", "type": "payment", "order_id": "o3", "value": 1}),
        ] {
            scan.add(row(doc));
        }
        assert_eq!(scan.immutable_seen, 5);
        assert_eq!(scan.rewritten.len(), 1, "{:?}", scan.rewritten);
        let mut view = BTreeMap::new();
        view.insert("o1".to_owned(), Ok(650));
        view.insert("o3".to_owned(), Ok(-1));
        let (detail, ok, docs) = scan.compare_orders(&view);
        assert!(!ok);
        // o1 agrees (1000 − 400 + 50); o2's document is unreadable; o3 agrees.
        assert!(!detail.contains("\"o1\""), "{detail}");
        assert!(detail.contains("adjustment:o2:a"), "{detail}");
        assert_eq!(docs, vec!["adjustment:o2:a".to_owned()]);

        view.insert("o1".to_owned(), Ok(600));
        let (detail, _, docs) = scan.compare_orders(&view);
        assert!(
            detail.contains("order \"o1\": orders/ledger says 600, its documents 650"),
            "{detail}"
        );
        assert!(docs.contains(&"payment:o1:p".to_owned()), "{docs:?}");
    }

    #[test]
    fn a_balance_off_its_transfers_names_the_suspect() {
        let mut scan = Scan::default();
        for doc in [
            txn("t1", "A", "B", 100, "done"),
            txn("t2", "A", "B", 30, "cancelled"),
            json!({"_id": "txn:bad", "type": "transaction", "txn_id": "bad", "state": "paused"}),
        ] {
            scan.add(row(doc));
        }
        assert_eq!(scan.bad_transfers.len(), 1);
        assert_eq!(scan.moves()["B"], 100);
        // B settled the cancelled t2: its 30 stayed.
        let b = account(
            "B",
            0,
            130,
            json!([{"txn": "t1", "at": 1}, {"txn": "t2", "at": 1}]),
        );
        let (why, docs) = scan.suspects(&b, 3);
        assert!(
            why.contains("txn:t2 is cancelled, but this account settled it"),
            "{why}"
        );
        assert_eq!(docs, vec!["txn:t2".to_owned()]);
        // Nothing stands out: the latest transfers are named.
        let b = account("B", 0, 130, json!([{"txn": "t1", "at": 1}]));
        let (why, docs) = scan.suspects(&b, 3);
        assert!(why.contains("latest"), "{why}");
        assert!(docs.contains(&"txn:t1".to_owned()), "{docs:?}");
    }

    #[test]
    fn an_accounts_terms_come_from_its_opening_record() {
        let mut scan = Scan::default();
        for doc in [
            json!({"_id": "opening:A", "type": "opening", "account_id": "A", "currency": "EUR",
                   "opening": 100, "min_balance": null}),
            json!({"_id": "opening:X", "type": "opening", "account_id": "Y", "currency": "EUR",
                   "opening": 100, "min_balance": 0}),
            json!({"_id": "opening:Z", "type": "note"}),
        ] {
            scan.add(row(doc));
        }
        assert_eq!(scan.immutable_seen, 3);
        assert_eq!(scan.records.len(), 1);
        let bad: Vec<&str> = scan.bad_records.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(bad, ["opening:X", "opening:Z"]);
        // A's document says 600 and a minimum of 0; its record says otherwise, and counts.
        let a = account("A", 600, 600, json!([]));
        let t = scan.terms_of(&a);
        assert_eq!(
            (t.currency, t.opening.minor(), t.min_balance),
            ("EUR", 100, None)
        );
        // B has no record: its own figures, until `init` writes one.
        let b = account("B", 5, 5, json!([]));
        assert_eq!(scan.terms_of(&b).opening.minor(), 5);
    }

    #[test]
    fn documents_are_listed_only_for_violations() {
        let c = check_with("x", true, String::new(), vec!["a".into()]);
        assert!(c.documents.is_empty());
        let c = check_with(
            "x",
            false,
            String::new(),
            vec!["a".into(), "a".into(), "b".into()],
        );
        assert_eq!(c.documents, vec!["a".to_owned(), "b".to_owned()]);
    }

    /// On several copies, a `_changes` page's documents are replaced by what every copy's leaves
    /// give: the page read one copy, where account `B` was at an older revision with no
    /// conflict, while the copies together hold two leaves of it (the planted `3-fff…` wins)
    /// and transfer `c1` no longer lives. Verify then reports the conflict and the winner's
    /// balance, and the deleted transfer as deleted.
    #[tokio::test]
    async fn a_scan_on_several_copies_judges_every_copys_leaves() {
        use wiremock::matchers::{method, path, query_param};
        let server = wiremock::MockServer::start().await;
        let b = |rev: &str, balance: i64| json!({"_id": "account:B", "_rev": rev, "type": "account", "balance": balance});
        wiremock::Mock::given(method("POST"))
            .and(path("/db/_bulk_get"))
            .and(query_param("r", "3"))
            .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!({
                "results": [
                    {"id": "account:B", "docs": [{"ok": b("3-aaa", 100)}, {"ok": b("3-fff", 5)}]},
                    {"id": "txn:c1", "docs": [{"ok": {"_id": "txn:c1", "_rev": "2-x", "_deleted": true}}]}
                ]
            })))
            .mount(&server)
            .await;
        let client = Client::builder().url(server.uri()).database("db").build();
        let client = client.unwrap();
        let mut rows = vec![
            row(b("2-old", 0)),
            row(txn("c1", "A", "B", 100, "done")),
            row(json!({"_id": "_design/x", "_rev": "1-d"})),
        ];
        read_every_copy(&client, 3, &mut rows).await.unwrap();
        let doc = rows[0].doc.as_ref().unwrap();
        assert_eq!(
            (&doc["_rev"], &doc["balance"]),
            (&json!("3-fff"), &json!(5))
        );
        assert_eq!(doc["_conflicts"], json!(["3-aaa"]));
        assert_eq!(rows[0].changes, vec![json!({"rev": "3-fff"})]);
        assert!(rows[1].deleted && rows[1].doc.is_none(), "{:?}", rows[1]);
        assert_eq!(
            rows[2].changes,
            vec![json!({"rev": "1-d"})],
            "design documents as read"
        );
    }
}
