//! What happened, counted as it happened, and the broken promises: what the summary line reports.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use couch_ledger::{Error, FAIL_POINTS};

/// What happened, counted as it happened.
#[derive(Default)]
pub struct Tally {
    /// Fail point → firings observed (as the crash error they return).
    pub crashes: Mutex<BTreeMap<&'static str, u64>>,
    pub kills: AtomicU64,
    pub restarts: AtomicU64,
    pub faults: AtomicU64,
    pub bad_inputs: AtomicU64,
    /// Transfer documents found in each part's database afterwards.
    pub transfers: AtomicU64,
    /// Errors that operations returned, by part and kind (each one typed: "fails clearly").
    pub errors: Mutex<BTreeMap<String, u64>>,
    /// Broken promises, one line each.
    pub violations: Mutex<Vec<String>>,
    /// Trio parts: documents seen holding a conflict on any node during or after the run.
    pub conflicts_met: AtomicU64,
    /// Trio parts: of those, the ones that held none at the end.
    pub conflicts_resolved: AtomicU64,
    /// Parts on several copies: moments an account was seen below its minimum,
    /// `(part, account document id, what was seen)`, held until the part ends at rest.
    pub overdrafts: Mutex<Vec<(String, String, String)>>,
    /// Accounts seen below their minimum for a moment on several copies (two debits checked
    /// against one balance on two branches) and at or above it at rest: taken back by the
    /// ledger, counted, not violations.
    pub overdrafts_from_conflicts: AtomicU64,
    /// `(part, account document id)` of accounts below their minimum at rest: violations.
    pub overdrawn_at_rest: Mutex<BTreeSet<(String, String)>>,
    /// R1 rounds and R2 runs that ran on the split layout (accounts and transfers in a second
    /// database, `LedgerBuilder::hot_database`), checks included.
    pub split_rounds: AtomicU64,
    /// R1 submits answered `committed` by a worker finishing in the background
    /// (`LedgerBuilder::background_finish`): half of every round's workers run that way.
    pub background: AtomicU64,
}

impl Tally {
    pub fn violation(&self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("VIOLATION: {line}");
        self.violations.lock().unwrap().push(line);
    }

    pub fn violations(&self) -> usize {
        self.violations.lock().unwrap().len()
    }

    /// A moment at which `account` (its document id) was seen below its minimum during `part`.
    /// On a database that keeps one copy that is a violation: nothing can be merged there, so
    /// nothing takes it back. Where it keeps several (a cluster, the trio), two debits checked
    /// against one balance on two branches can both land before the merge takes one back
    /// (docs/CLUSTER.md, "What a reader may see"): the sighting is held for
    /// [`Tally::settle_overdrafts`], and an account still below its minimum at rest is a
    /// violation of its own, found by the audit and the independent check.
    pub fn moment_below_minimum(
        &self,
        part: &str,
        account: &str,
        line: String,
        several_copies: bool,
    ) {
        if several_copies {
            eprintln!("OVERDRAFT (held: is it taken back?): {line}");
            self.overdrafts
                .lock()
                .unwrap()
                .push((part.to_owned(), account.to_owned(), line));
        } else {
            self.violation(line);
        }
    }

    /// At the end of a part on several copies, after the audit at rest: each account seen
    /// below its minimum for a moment and not overdrawn at rest (`overdrawn_at_rest`) was
    /// taken back by the ledger, an overdraft from conflicting writes (counted once per
    /// account). One still overdrawn at rest is already a violation (a `done` transfer
    /// overdrawing), reported by the audit; its sightings are printed with it.
    pub fn settle_overdrafts(&self, part: &str) {
        let overdrawn_at_rest: BTreeSet<String> = self
            .overdrawn_at_rest
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == part)
            .map(|(_, account)| account.clone())
            .collect();
        let held: Vec<(String, String, String)> = {
            let mut all = self.overdrafts.lock().unwrap();
            let (mine, rest) = all.drain(..).partition(|(p, _, _)| p == part);
            *all = rest;
            mine
        };
        let mut by_account: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (_, account, line) in held {
            by_account.entry(account).or_default().push(line);
        }
        for (account, lines) in by_account {
            if overdrawn_at_rest.contains(&account) {
                eprintln!(
                    "{part}: {account} still overdrawn at rest (a violation of its own): {} sightings, first: {}",
                    lines.len(),
                    lines[0]
                );
            } else {
                self.overdrafts_from_conflicts
                    .fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "{part}: {account} overdrawn for a moment, taken back by the ledger: {} sightings, first: {}",
                    lines.len(),
                    lines[0]
                );
            }
        }
    }

    /// An account below its minimum at rest: whatever the copies, a violation (the transfers
    /// that ended `done` overdraw it).
    pub fn overdrawn_at_rest(&self, part: &str, account: &str, line: String) {
        self.overdrawn_at_rest
            .lock()
            .unwrap()
            .insert((part.to_owned(), account.to_owned()));
        self.violation(line);
    }

    /// Counts `text` if it is a simulated crash; `true` when it was one.
    pub fn crash_in(&self, text: &str) -> bool {
        match crash_point(text) {
            Some(point) => {
                *self.crashes.lock().unwrap().entry(point).or_default() += 1;
                true
            }
            None => false,
        }
    }

    pub fn crash_count(&self, point: &str) -> u64 {
        self.crashes
            .lock()
            .unwrap()
            .get(point)
            .copied()
            .unwrap_or(0)
    }

    /// Books an operation's error: a crash, or a typed error of some kind.
    pub fn error(&self, part: &str, e: &Error) {
        if self.crash_in(&e.to_string()) {
            return;
        }
        let kind = error_kind(e);
        if std::env::var("RELIABILITY_ERRORS").is_ok() {
            eprintln!("ERROR {part}:{kind}: {e}");
        }
        *self
            .errors
            .lock()
            .unwrap()
            .entry(format!("{part}:{kind}"))
            .or_default() += 1;
    }

    /// Books a sweep pass's problem lines: crashes, and what else it could not do.
    pub fn problems(&self, part: &str, problems: &[String]) {
        for p in problems {
            if self.crash_in(p) {
                continue;
            }
            let kind = if p.contains("lease ran out") {
                "sweep-lease-ran-out"
            } else if p.contains("stopped in state") {
                "sweep-stopped-midway"
            } else if p.contains("could not reach") || p.contains("timed out") {
                "sweep-transport"
            } else if p.contains("server answered 409") {
                "sweep-conflict"
            } else {
                "sweep-other"
            };
            *self
                .errors
                .lock()
                .unwrap()
                .entry(format!("{part}:{kind}"))
                .or_default() += 1;
        }
    }
}

/// The fail point a "simulated crash" error text names.
pub fn crash_point(text: &str) -> Option<&'static str> {
    let at = text.find("simulated crash at fail point ")?;
    let rest = &text[at + "simulated crash at fail point ".len()..];
    FAIL_POINTS
        .iter()
        .copied()
        .filter(|p| rest.starts_with(p))
        .max_by_key(|p| p.len())
}

/// What kind of typed error this is (every library error answers one of these questions).
pub fn error_kind(e: &Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_transient() {
        "transient"
    } else if e.is_conflict() {
        "conflict"
    } else if e.is_not_found() {
        "not-found"
    } else if e.is_forbidden() {
        "forbidden"
    } else if e.is_unauthorized() {
        "unauthorized"
    } else if e.transition().is_some() {
        "transition"
    } else if e.is_mismatch() {
        "mismatch"
    } else if e.is_invalid_input() {
        "invalid-input"
    } else if e.is_decode() {
        "decode"
    } else if e.is_invariant() {
        "invariant"
    } else {
        "other"
    }
}
