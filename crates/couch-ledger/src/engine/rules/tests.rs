//! The rules' tests: each op on an account document in memory, no I/O.

use super::*;
use crate::engine::fixtures::{apply, once, op, settle};
use serde_json::json;

fn account(balance: i64, min: Option<i64>) -> AccountDoc {
    AccountDoc::from_value(json!({
        "_id": "account:a", "_rev": "1-x", "type": "account", "account_id": "a",
        "currency": "EUR", "opening": balance, "balance": balance, "min_balance": min,
        "pending": [], "settled": []
    }))
    .unwrap()
}

fn settle_named(txn: &str, a: u64, delta: i64) -> AccountOp {
    op(
        txn,
        OpKind::Settle {
            named: Some(Attempt::from_bits(a)),
            delta: Amount::new(delta).unwrap(),
        },
    )
}

#[test]
fn a_one_write_apply_adopts_the_marker_of_another_attempt_with_the_same_terms() {
    let none = HashSet::new();
    let mut doc = account(1_000, Some(0));
    assert_eq!(
        evaluate(Some(&mut doc), &once("t", -300, 1, "b"), 1, &none).unwrap(),
        OpResult::Applied
    );
    let m = &doc.pending[0];
    assert_eq!(
        (m.attempt, m.peer.as_deref()),
        (Some(Attempt::from_bits(1)), Some("b"))
    );
    // A second attempt: the first's marker counts as its own, nothing changes.
    assert_eq!(
        evaluate(Some(&mut doc), &once("t", -300, 2, "b"), 2, &none).unwrap(),
        OpResult::Adopted(Attempt::from_bits(1))
    );
    assert_eq!((doc.balance.minor(), doc.pending.len()), (700, 1));
    assert!(doc.settled.is_empty());
}

/// One id sent at once with other terms, through either path: each terms' entries have a key
/// of their own (`transfer::entry_key`), so both markers sit side by side, each counted once,
/// and each is settled or undone by its own key alone.
#[test]
fn markers_of_other_terms_under_one_id_sit_side_by_side() {
    use crate::transfer::entry_key;
    let none = HashSet::new();
    let k300 = entry_key("t", "a", "b", Amount::new(300).unwrap(), "EUR", None);
    let k301 = entry_key("t", "a", "b", Amount::new(301).unwrap(), "EUR", None);
    let to_c = entry_key("t", "a", "c", Amount::new(300).unwrap(), "EUR", None);
    assert!(k300 != k301 && k300 != to_c);
    let mut doc = account(1_000, Some(0));
    evaluate(Some(&mut doc), &once(&k300, -300, 1, "b"), 1, &none).unwrap();
    assert_eq!(
        evaluate(Some(&mut doc), &apply(&k301, -301, true, None), 2, &none).unwrap(),
        OpResult::Applied
    );
    assert_eq!(
        evaluate(Some(&mut doc), &once(&to_c, -300, 2, "c"), 3, &none).unwrap(),
        OpResult::Applied
    );
    assert_eq!((doc.balance.minor(), doc.pending.len()), (99, 3));
    // The funds check counts every one of them: a fourth terms does not fit.
    let k400 = entry_key("t", "a", "b", Amount::new(400).unwrap(), "EUR", None);
    assert_eq!(
        evaluate(Some(&mut doc), &apply(&k400, -400, true, None), 4, &none).unwrap(),
        OpResult::Insufficient
    );
    // The decision of the terms that stand settles theirs; the others are undone by their
    // own keys, and nothing of one touches another.
    assert_eq!(
        evaluate(Some(&mut doc), &settle_named(&k300, 1, -300), 5, &none).unwrap(),
        OpResult::Applied
    );
    for k in [&k301, &to_c] {
        assert_eq!(
            evaluate(
                Some(&mut doc),
                &op(k, OpKind::Undo { decided: true }),
                6,
                &none
            )
            .unwrap(),
            OpResult::Applied
        );
    }
    assert_eq!((doc.balance.minor(), doc.pending.len()), (700, 0));
    let undone: Vec<bool> = doc.settled.iter().map(|e| e.undone).collect();
    assert_eq!(undone.iter().filter(|u| **u).count(), 2);
}

/// An entry written before keys held their terms' digest (the bare id) stands for its
/// transfer's terms: an op of the transfer's key acts on it.
#[test]
fn an_entry_of_an_earlier_version_answers_to_its_transfers_key() {
    use crate::transfer::entry_key;
    let none = HashSet::new();
    let key = entry_key("t", "a", "b", Amount::new(300).unwrap(), "EUR", None);
    let mut doc = account(1_000, Some(0));
    evaluate(Some(&mut doc), &apply("t", -300, true, None), 1, &none).unwrap();
    assert_eq!(
        evaluate(Some(&mut doc), &op(&key, settle(-300)), 2, &none).unwrap(),
        OpResult::Applied
    );
    assert_eq!((doc.balance.minor(), doc.pending.len()), (700, 0));
    assert_eq!(doc.settled[0].txn, "t");
    // A late apply of it is skipped by that entry.
    assert_eq!(
        evaluate(Some(&mut doc), &apply(&key, -300, true, None), 3, &none).unwrap(),
        OpResult::Finished
    );
    assert_eq!(doc.balance.minor(), 700);
}

#[test]
fn a_one_write_apply_follows_a_decided_transfer_and_a_stepwise_marker() {
    let none = HashSet::new();
    let mut doc = account(1_000, Some(0));
    evaluate(Some(&mut doc), &apply("s", -100, true, None), 1, &none).unwrap();
    assert_eq!(
        evaluate(Some(&mut doc), &once("s", -100, 1, "b"), 2, &none).unwrap(),
        OpResult::AlreadyPending,
        "a stepwise marker: its document exists, follow it"
    );
    evaluate(Some(&mut doc), &op("s", settle(-100)), 3, &none).unwrap();
    assert_eq!(
        evaluate(Some(&mut doc), &once("s", -100, 1, "b"), 4, &none).unwrap(),
        OpResult::Finished
    );
    assert_eq!(doc.balance.minor(), 900);
}

#[test]
fn a_named_settle_settles_its_marker_and_undoes_another_attempts() {
    let none = HashSet::new();
    // The named attempt: settled, with an entry (several copies) or none (one copy).
    for entries in [true, false] {
        let mut doc = account(1_000, Some(0));
        evaluate(Some(&mut doc), &once("t", 250, 7, "b"), 1, &none).unwrap();
        assert_eq!(
            evaluate_with(
                Some(&mut doc),
                &settle_named("t", 7, 250),
                2,
                &none,
                entries
            )
            .unwrap(),
            OpResult::Applied
        );
        assert_eq!((doc.balance.minor(), doc.pending.len()), (1_250, 0));
        assert_eq!(doc.settled.len(), usize::from(entries));
        // Again: nothing left to do.
        let again = evaluate_with(
            Some(&mut doc),
            &settle_named("t", 7, 250),
            3,
            &none,
            entries,
        );
        let expect = if entries {
            OpResult::Finished
        } else {
            OpResult::Absent
        };
        assert_eq!(again.unwrap(), expect);
    }
    // Another attempt's marker (a late apply after the entry went): undone, never counted.
    let mut doc = account(1_000, Some(0));
    evaluate(Some(&mut doc), &once("t", 250, 8, "b"), 1, &none).unwrap();
    assert_eq!(
        evaluate_with(Some(&mut doc), &settle_named("t", 7, 250), 2, &none, false).unwrap(),
        OpResult::Repaired
    );
    assert_eq!((doc.balance.minor(), doc.pending.len()), (1_000, 0));
    // A marker that carries the named attempt among its merged ones is the decision's
    // marker; one without attempt (a stepwise drive's, beside the decision) is not: undone.
    for (attempt, aliases, delta, settled) in
        [(Some(9), vec![7], 250, true), (None, vec![], 250, false)]
    {
        let mut doc = account(1_000, Some(0));
        doc.balance = Amount::new(1_000 + delta).unwrap();
        doc.pending.push(Marker {
            txn: "t".into(),
            delta: Amount::new(delta).unwrap(),
            at: Some(1),
            attempt: attempt.map(Attempt::from_bits),
            peer: Some("b".into()),
            aliases: aliases.into_iter().map(Attempt::from_bits).collect(),
        });
        let (answer, balance) = if settled {
            (OpResult::Applied, 1_250)
        } else {
            (OpResult::Repaired, 1_000)
        };
        assert_eq!(
            evaluate(Some(&mut doc), &settle_named("t", 7, 250), 2, &none).unwrap(),
            answer
        );
        assert_eq!((doc.balance.minor(), doc.pending.len()), (balance, 0));
    }
}

#[test]
fn a_stepwise_settle_settles_an_adopted_one_write_marker() {
    let none = HashSet::new();
    let mut doc = account(1_000, Some(0));
    evaluate(Some(&mut doc), &once("t", -300, 1, "b"), 1, &none).unwrap();
    assert_eq!(
        evaluate(Some(&mut doc), &op("t", settle(-300)), 2, &none).unwrap(),
        OpResult::Applied
    );
    assert_eq!((doc.balance.minor(), doc.pending.len()), (700, 0));
}

#[test]
fn an_adopted_debit_on_an_account_a_merge_overdrew_is_refused_not_taken_back() {
    let none = HashSet::new();
    let mut doc = account(500, Some(0));
    evaluate(Some(&mut doc), &once("t1", -300, 1, "b"), 1, &none).unwrap();
    // A rival branch's debit merged in: below the minimum.
    doc.balance = Amount::new(-100).unwrap();
    assert_eq!(
        evaluate(Some(&mut doc), &once("t1", -300, 2, "b"), 2, &none).unwrap(),
        OpResult::Overdrawn
    );
    assert_eq!(
        doc.pending.len(),
        1,
        "undone only after its transfer is decided"
    );
    assert_eq!(doc.balance.minor(), -100);
}

/// A stepwise drive that adopted a one-write attempt's marker (the same key) on an account a
/// merge left overdrawn: a `done` may name that marker, so nothing is taken back; the drive is
/// told to cancel first (`Overdrawn`), as the one-write path is.
#[test]
fn a_stepwise_apply_leaves_a_one_write_debit_on_an_overdrawn_account_to_the_decision() {
    let none = HashSet::new();
    let mut doc = account(500, Some(0));
    evaluate(Some(&mut doc), &once("t1", -300, 1, "b"), 1, &none).unwrap();
    doc.balance = Amount::new(-100).unwrap();
    assert_eq!(
        evaluate(Some(&mut doc), &apply("t1", -300, true, None), 2, &none).unwrap(),
        OpResult::Overdrawn
    );
    assert_eq!((doc.balance.minor(), doc.pending.len()), (-100, 1));
    assert!(doc.settled.is_empty());
}

#[test]
fn a_debit_found_on_an_account_a_merge_overdrew_is_taken_back() {
    let none = HashSet::new();
    // Two debits of 300 on a balance of 500, each checked on its own copy, merged.
    let mut doc = account(500, Some(0));
    evaluate(Some(&mut doc), &apply("t1", -300, true, None), 1, &none).unwrap();
    doc.balance = Amount::new(-100).unwrap();
    doc.pending.push(Marker {
        txn: "t2".into(),
        delta: Amount::new(-300).unwrap(),
        at: Some(1),
        attempt: None,
        peer: None,
        aliases: Vec::new(),
    });
    assert_eq!(
        evaluate(Some(&mut doc), &apply("t2", -300, true, None), 2, &none).unwrap(),
        OpResult::Withdrawn
    );
    assert_eq!(doc.balance.minor(), 200);
    assert_eq!(doc.pending.len(), 1);
    assert!(doc.settled.iter().any(|s| s.txn == "t2" && s.undone));
    // Back above the minimum: the other debit's repeat is a plain skip.
    assert_eq!(
        evaluate(Some(&mut doc), &apply("t1", -300, true, None), 3, &none).unwrap(),
        OpResult::AlreadyPending
    );
    assert_eq!(doc.balance.minor(), 200);
}

#[test]
fn apply_settle_undo_are_idempotent() {
    let none = HashSet::new();
    let mut doc = account(1000, Some(0));
    assert_eq!(
        evaluate(Some(&mut doc), &apply("t", -300, true, None), 1, &none).unwrap(),
        OpResult::Applied
    );
    assert_eq!(doc.balance.minor(), 700);
    assert_eq!(
        evaluate(Some(&mut doc), &apply("t", -300, true, None), 2, &none).unwrap(),
        OpResult::AlreadyPending
    );
    assert_eq!(doc.balance.minor(), 700);
    assert_eq!(
        evaluate(Some(&mut doc), &op("t", settle(-300)), 3, &none).unwrap(),
        OpResult::Applied
    );
    assert!(doc.pending.is_empty());
    // A late apply after the settle finds the settled entry and skips.
    assert_eq!(
        evaluate(Some(&mut doc), &apply("t", -300, true, None), 4, &none).unwrap(),
        OpResult::Finished
    );
    assert_eq!(
        evaluate(
            Some(&mut doc),
            &op("t", OpKind::Undo { decided: false }),
            5,
            &none
        )
        .unwrap(),
        OpResult::Finished
    );
    assert_eq!(doc.balance.minor(), 700);
    // An undo that finds nothing leaves an undone entry, so a late apply of that transfer
    // skips instead of landing
    assert_eq!(
        evaluate(
            Some(&mut doc),
            &op("u", OpKind::Undo { decided: false }),
            5,
            &none
        )
        .unwrap(),
        OpResult::Applied
    );
    assert_eq!(doc.balance.minor(), 700);
    assert!(doc.settled.iter().any(|s| s.txn == "u" && s.undone));
    // (answered as a failure, so its drive cancels: the transfer is being cancelled)
    assert_eq!(
        evaluate(Some(&mut doc), &apply("u", -100, true, None), 6, &none).unwrap(),
        OpResult::Withdrawn
    );
    assert_eq!(doc.balance.minor(), 700);
    assert_eq!(
        evaluate(Some(&mut doc), &op("v", settle(-100)), 7, &none).unwrap(),
        OpResult::Absent
    );
}

#[test]
fn undo_reverses_and_blocks_a_late_apply() {
    let none = HashSet::new();
    let mut doc = account(1000, Some(0));
    evaluate(Some(&mut doc), &apply("t", 250, false, None), 1, &none).unwrap();
    assert_eq!(doc.balance.minor(), 1250);
    assert_eq!(
        doc.available().unwrap().minor(),
        1000,
        "a pending credit is not spendable"
    );
    assert_eq!(
        evaluate(
            Some(&mut doc),
            &op("t", OpKind::Undo { decided: false }),
            2,
            &none
        )
        .unwrap(),
        OpResult::Applied
    );
    assert_eq!(doc.balance.minor(), 1000);
    assert!(doc.settled[0].undone);
    // A late apply of an undone transfer is refused as a failure: its drive cancels, never
    // commits the other account's delta alone.
    let late = evaluate(Some(&mut doc), &apply("t", 250, false, None), 3, &none).unwrap();
    assert_eq!(late, OpResult::Withdrawn);
    assert_eq!(doc.balance.minor(), 1000);
    assert_eq!(doc.settled.len(), 1);
}

#[test]
fn funds_are_checked_against_available_and_links_stop_the_pair() {
    let mut links = HashSet::new();
    let mut doc = account(100, Some(0));
    evaluate(Some(&mut doc), &apply("c", 500, false, None), 1, &links).unwrap();
    // 600 on the books, but only 100 available.
    assert_eq!(
        evaluate(Some(&mut doc), &apply("d", -101, true, Some(7)), 2, &links).unwrap(),
        OpResult::Insufficient
    );
    assert_eq!(
        evaluate(Some(&mut doc), &apply("d", -100, true, None), 2, &links).unwrap(),
        OpResult::Applied
    );
    links.insert(9);
    assert_eq!(
        evaluate(Some(&mut doc), &apply("e", 5, false, Some(9)), 3, &links).unwrap(),
        OpResult::NotApplied
    );
    // Unlimited accounts go negative; other currencies and missing accounts are refused.
    let mut issuer = account(0, None);
    assert_eq!(
        evaluate(Some(&mut issuer), &apply("f", -5, true, None), 1, &links).unwrap(),
        OpResult::Applied
    );
    let mut usd = apply("g", 5, false, None);
    if let OpKind::Apply { currency, .. } = &mut usd.kind {
        *currency = "USD".into();
    }
    assert_eq!(
        evaluate(Some(&mut issuer), &usd, 1, &links).unwrap(),
        OpResult::CurrencyMismatch
    );
    assert_eq!(
        evaluate(None, &usd, 1, &links).unwrap(),
        OpResult::UnknownAccount
    );
}

#[test]
fn pruning_needs_a_terminal_transfer_and_an_old_entry() {
    let now = 10_000_000_000i64;
    let old = now - i64::try_from(SETTLED_AGE_MIN_MS).unwrap() - 1;
    let young = now - 1;
    let mut doc = account(0, None);
    for i in 0..SETTLED_PRUNE_BATCH_MIN {
        doc.settled.push(Settled {
            txn: format!("old{i}"),
            at: old,
            undone: false,
            attempts: Vec::new(),
        });
    }
    for txn in ["open", "young"] {
        doc.settled.push(Settled {
            txn: txn.into(),
            at: if txn == "young" { young } else { old },
            undone: false,
            attempts: Vec::new(),
        });
    }
    let every = |_: &str| true;
    let candidates = prune_candidates(&doc, now, every);
    assert_eq!(candidates.len(), SETTLED_PRUNE_BATCH_MIN + 1);
    // Entries not known to be on every copy are not candidates.
    assert!(prune_candidates(&doc, now, |t| t == "open").is_empty());
    assert!(!candidates.contains(&"young".to_owned()));
    // The transfer read says: every `old*` ended, `open` did not; `young` ended too.
    let mut terminal: HashSet<String> = (0..SETTLED_PRUNE_BATCH_MIN)
        .map(|i| format!("old{i}"))
        .collect();
    terminal.insert("young".into());
    // Nothing the copies rule forbids goes, whatever its transfer.
    assert!(!prune_settled(&mut doc, now, |_| false));
    assert!(prune_settled(&mut doc, now, |t| terminal.contains(t)));
    let left: Vec<&str> = doc.settled.iter().map(|s| s.txn.as_str()).collect();
    assert_eq!(left, ["open", "young"]);
    // Too few old entries on a small account: nothing to read.
    assert!(prune_candidates(&doc, now, every).is_empty());
    // A marker dated far ahead of this host: a clock is off, no pruning at all.
    let mut skewed = account(0, None);
    for i in 0..SETTLED_PRUNE_BATCH_MIN {
        skewed.settled.push(Settled {
            txn: format!("old{i}"),
            at: old,
            undone: false,
            attempts: Vec::new(),
        });
    }
    skewed.settled.push(Settled {
        txn: "future".into(),
        at: now + i64::try_from(CLOCK_SKEW_MAX_MS).unwrap() + 1,
        undone: false,
        attempts: Vec::new(),
    });
    assert!(prune_candidates(&skewed, now, every).is_empty());
}

/// A merge after two branches of an account each lived past the pruning age, nothing
/// pruned on either (accounts at the server's default quorum never prune): the debits and
/// credits settled only on the loser count, whichever leaf wins. With "old and absent on the
/// winner" taken as pruned there, a slow run of `r1_trio` created money this way.
#[test]
fn a_merge_after_a_long_lived_branch_keeps_the_losers_old_settles() {
    use crate::conflict::{merge_account, TxnFacts};
    use crate::state::State;
    use std::collections::HashMap;
    let none = HashSet::new();
    let t0 = 1_000_000_000i64;
    // e2 at its opening, written by everyone alike.
    let base = account(10_000, Some(0));
    // Branch L (process B's cached `_rev`): t1 debits 5,000 and t2 credits 1,000, each
    // applied and settled by its stepwise drive, then `done`.
    let mut l = base.clone();
    l.rev = Some("3-l".into());
    for (txn, delta) in [("t1", -5_000), ("t2", 1_000)] {
        let applied =
            evaluate(Some(&mut l), &apply(txn, delta, delta < 0, None), t0, &none).unwrap();
        assert_eq!(applied, OpResult::Applied);
        let settled = evaluate(Some(&mut l), &op(txn, settle(delta)), t0 + 1, &none).unwrap();
        assert_eq!(settled, OpResult::Applied);
    }
    // Branch W (process A's cached `_rev`, the longer path: CouchDB's winner): t3 debits 200.
    let mut w = base.clone();
    w.rev = Some("4-w".into());
    evaluate(Some(&mut w), &apply("t3", -200, true, None), t0 + 2, &none).unwrap();
    evaluate(Some(&mut w), &op("t3", settle(-200)), t0 + 3, &none).unwrap();
    assert_eq!((l.balance.minor(), w.balance.minor()), (6_000, 9_800));
    let facts: HashMap<String, TxnFacts> = [("t1", -5_000), ("t2", 1_000), ("t3", -200)]
        .into_iter()
        .map(|(t, d)| {
            let f = TxnFacts {
                state: State::Done,
                delta: Amount::new(d).unwrap(),
                named: None,
            };
            (t.to_owned(), f)
        })
        .collect();
    // Every transfer done, each counted once: 10,000 − 5,000 + 1,000 − 200.
    let exact = 5_800;
    // Merged soon after: exact, whichever leaf wins.
    let soon = t0 + 10_000;
    let m = merge_account(&w, std::slice::from_ref(&l), &facts, soon).unwrap();
    assert_eq!(m.balance.minor(), exact, "merged soon, W winning");
    let m = merge_account(&l, std::slice::from_ref(&w), &facts, soon).unwrap();
    assert_eq!(m.balance.minor(), exact, "merged soon, L winning");
    // The same two leaves merged once the branch lived past SETTLED_AGE_MIN_MS (a slow
    // run; the sweeper's conflict pass at rest). Nothing was pruned on either branch.
    let late = t0 + i64::try_from(SETTLED_AGE_MIN_MS).unwrap() + 2 * 5_000;
    let m = merge_account(&w, std::slice::from_ref(&l), &facts, late).unwrap();
    assert_eq!(
        m.balance.minor(),
        exact,
        "W winning: t1's debit and t2's credit, settled only on L, were dropped as if W had \
         pruned them ({} = {:+} minor units on e2; conservation broken by as much)",
        m.balance.minor(),
        m.balance.minor() - exact
    );
    let m = merge_account(&l, std::slice::from_ref(&w), &facts, late).unwrap();
    assert_eq!(m.balance.minor(), exact, "L winning: t3's debit dropped");
}

/// What a merge knows of stepwise transfers: `(id, state, delta)`.
fn facts(
    list: &[(&str, crate::state::State, i64)],
) -> std::collections::HashMap<String, crate::conflict::TxnFacts> {
    list.iter()
        .map(|(t, state, d)| {
            let f = crate::conflict::TxnFacts {
                state: *state,
                delta: Amount::new(*d).unwrap(),
                named: None,
            };
            ((*t).to_owned(), f)
        })
        .collect()
}

/// A committed stepwise debit is not lost to a take-back on another branch. A drive's
/// re-apply meets its own debit on a merged, overdrawn account and takes it back
/// (`Withdrawn`, an undone entry), then crashes before `canceling`. The next driver (after
/// the lease) applies through a cached branch that holds neither the marker nor the undone
/// entry: `Applied`, and the transfer commits. Whether the merge of the two comes before
/// the settle or not, the debit counts once and the settle applies (a settle answering
/// `Finished` on the undone entry would let `done` be written with the debit gone).
#[test]
fn a_committed_debit_survives_an_old_take_back_on_another_branch() {
    use crate::conflict::merge_account;
    use crate::state::State;
    let none = HashSet::new();
    let base = account(1_000, Some(0));
    // Two debits of 600 on two branches (each passed its own funds check).
    let mut x = base.clone();
    x.rev = Some("2-x".into());
    assert_eq!(
        evaluate(Some(&mut x), &apply("r", -600, true, None), 1, &none).unwrap(),
        OpResult::Applied
    );
    let mut y = base.clone();
    y.rev = Some("2-y".into());
    assert_eq!(
        evaluate(Some(&mut y), &apply("t", -600, true, None), 1, &none).unwrap(),
        OpResult::Applied
    );
    // Merged (t still pending): −200, overdrawn. t's drive applies again (its credit
    // failed transiently): its debit is taken back; then it crashes before `canceling`.
    let pending = facts(&[("t", State::Pending, -600)]);
    let mut m = merge_account(&x, std::slice::from_ref(&y), &pending, 2).unwrap();
    assert_eq!(m.balance.minor(), -200);
    assert_eq!(
        evaluate(Some(&mut m), &apply("t", -600, true, None), 3, &none).unwrap(),
        OpResult::Withdrawn
    );
    assert_eq!(m.balance.minor(), 400);
    // Meanwhile another process, through its cached `_rev` of branch x, settles a credit c
    // of 700 there (pouchdb takes a child of any leaf): branch z, without t at all.
    let mut z = x.clone();
    z.rev = Some("4-z".into());
    evaluate(Some(&mut z), &apply("c", 700, false, None), 4, &none).unwrap();
    evaluate(Some(&mut z), &op("c", settle(700)), 5, &none).unwrap();
    // After the lease, the next driver of t applies through that cached branch: it lands
    // (1,100 available), the credit answers AlreadyPending, the transfer is committed.
    assert_eq!(
        evaluate(Some(&mut z), &apply("t", -600, true, None), 40_000, &none).unwrap(),
        OpResult::Applied
    );
    assert_eq!(z.balance.minor(), 500);
    // The settle's round reads the conflict {m, z} and merges it. t is committed: its
    // debit must count. Exact: 1,000 − 600 (r) + 700 (c) − 600 (t) = 500.
    let committed = facts(&[
        ("t", State::Committed, -600),
        ("c", State::Done, 700),
        ("r", State::Pending, -600),
    ]);
    for (winner, loser) in [(&m, &z), (&z, &m)] {
        let mut merged =
            merge_account(winner, std::slice::from_ref(loser), &committed, 41_000).unwrap();
        let settled = evaluate(Some(&mut merged), &op("t", settle(-600)), 41_000, &none).unwrap();
        assert_eq!(
            (merged.balance.minor(), settled),
            (500, OpResult::Applied),
            "winner {:?}: the merge kept t undone and the settle answered {settled:?}, \
             which lets the drive write `done` (transfer.rs `settle_and_complete`): the \
             debit is gone, {:+} minor units created on this account",
            winner.rev,
            merged.balance.minor() - 500
        );
    }
    // The settle reads the branch with the take-back before any merge: it applies the
    // debit again; the later merge counts it once.
    let mut lone = m.clone();
    assert_eq!(
        evaluate(Some(&mut lone), &op("t", settle(-600)), 41_000, &none).unwrap(),
        OpResult::Applied
    );
    for (winner, loser) in [(&lone, &z), (&z, &lone)] {
        let merged =
            merge_account(winner, std::slice::from_ref(loser), &committed, 42_000).unwrap();
        assert_eq!(merged.balance.minor(), 500, "winner {:?}", winner.rev);
    }
}

#[test]
fn applies_stop_at_the_size_cap_and_undos_at_the_slack() {
    let none = HashSet::new();
    let mut doc = account(0, None);
    let id = "x".repeat(100);
    let per = marker_bytes(&id);
    let n = MARKERS_BYTES_MAX / per;
    for i in 0..n {
        doc.settled.push(Settled {
            txn: format!("{i:0>100}"),
            at: 1,
            undone: false,
            attempts: Vec::new(),
        });
    }
    assert!(doc.markers_bytes() <= MARKERS_BYTES_MAX);
    let e = evaluate(
        Some(&mut doc),
        &apply(&"t".repeat(100), 5, false, None),
        2,
        &none,
    )
    .unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("account_full"), "{e}");
    assert_eq!(doc.balance.minor(), 0);
    // An undo that finds nothing still records its entry, within the slack.
    assert_eq!(
        evaluate(
            Some(&mut doc),
            &op("u", OpKind::Undo { decided: false }),
            3,
            &none
        )
        .unwrap(),
        OpResult::Applied
    );
    assert!(doc.markers_bytes() <= MARKERS_BYTES_MAX + MARKERS_UNDO_SLACK_BYTES);
}

#[test]
fn only_a_done_settle_names_the_attempts_of_the_marker_it_undoes() {
    let none = HashSet::new();
    // A `done` decision naming attempt 9 meets attempt 5's marker: undone, its attempt named.
    let mut doc = account(1000, Some(0));
    evaluate(Some(&mut doc), &once("t", 100, 5, "b"), 1, &none).unwrap();
    let settled = evaluate(Some(&mut doc), &settle_named("t", 9, 100), 2, &none).unwrap();
    assert_eq!(settled, OpResult::Repaired);
    assert_eq!(doc.balance.minor(), 1000);
    assert!(doc.settled[0].undone);
    assert_eq!(doc.settled[0].attempts, vec![Attempt::from_bits(5)]);
    // A cancel's undo of the same marker names none: it ends the transfer on the account
    // whatever the attempt, and a merge reads it as the cancel path's evidence.
    let mut doc = account(1000, Some(0));
    evaluate(Some(&mut doc), &once("t", 100, 5, "b"), 1, &none).unwrap();
    let cancel = OpKind::Undo { decided: true };
    let undone = evaluate(Some(&mut doc), &op("t", cancel), 2, &none).unwrap();
    assert_eq!(undone, OpResult::Applied);
    assert!(doc.settled[0].undone && doc.settled[0].attempts.is_empty());
}
