//! The merge and resolution rules' tests: leaves in memory, no I/O.

use super::*;
use serde_json::json;

fn account(balance: i64, pending: &[(&str, i64)], settled: &[(&str, bool)]) -> AccountDoc {
    let pending: Vec<_> = pending
        .iter()
        .map(|(t, d)| json!({"txn": t, "delta": d, "at": 1000}))
        .collect();
    let settled: Vec<_> = settled
        .iter()
        .map(|(t, undone)| json!({"txn": t, "at": 2000, "undone": undone}))
        .collect();
    AccountDoc::from_value(json!({
        "_id": "account:a", "_rev": "5-aa", "type": "account", "account_id": "a",
        "currency": "EUR", "opening": 1000, "balance": balance, "min_balance": 0,
        "pending": pending, "settled": settled,
    }))
    .expect("valid")
}

fn facts(list: &[(&str, State, i64)]) -> HashMap<String, TxnFacts> {
    list.iter()
        .map(|(t, state, d)| {
            (
                (*t).to_owned(),
                TxnFacts {
                    state: *state,
                    delta: Amount::new(*d).expect("fits"),
                    named: None,
                },
            )
        })
        .collect()
}

const NOW: i64 = 10_000;

/// A one-write marker of `txn` by attempt `a`.
fn once(doc: &mut AccountDoc, txn: &str, delta: i64, a: u64) {
    doc.pending.push(Marker {
        txn: txn.into(),
        delta: Amount::new(delta).unwrap(),
        at: Some(1000),
        attempt: Some(Attempt::from_bits(a)),
        peer: Some("b".into()),
        aliases: Vec::new(),
    });
    doc.balance = doc
        .balance
        .checked_add(Amount::new(delta).unwrap())
        .unwrap();
}

#[test]
fn two_attempts_of_one_transfer_on_two_branches_count_once_carrying_both() {
    let (mut w, mut l) = (account(1000, &[], &[]), account(1000, &[], &[]));
    once(&mut w, "t", -100, 5);
    once(&mut l, "t", -100, 3);
    // Undecided: one marker, the delta once, both attempts carried.
    let m = merge_account(&w, std::slice::from_ref(&l), &HashMap::new(), NOW).unwrap();
    assert_eq!(m.balance.minor(), 900);
    assert_eq!(m.pending.len(), 1);
    let marker = &m.pending[0];
    assert!(marker.carries(Attempt::from_bits(5)) && marker.carries(Attempt::from_bits(3)));
    assert_eq!(marker.peer.as_deref(), Some("b"));
    // Decided naming one of them: that one first.
    let mut f = facts(&[("t", State::Done, -100)]);
    f.get_mut("t").unwrap().named = Some(Attempt::from_bits(5));
    let m = merge_account(&w, &[l], &f, NOW).unwrap();
    assert_eq!(m.pending[0].attempt, Some(Attempt::from_bits(5)));
    assert_eq!(m.pending[0].aliases, vec![Attempt::from_bits(3)]);
}

/// Facts of a decided `t` with `delta`, naming attempt `named`.
fn decided(state: State, delta: i64, named: Option<u64>) -> HashMap<String, TxnFacts> {
    let mut f = facts(&[("t", state, delta)]);
    f.get_mut("t").unwrap().named = named.map(Attempt::from_bits);
    f
}

/// One id sent at once with other terms, each terms' markers on a branch of their own: two
/// keys, joined side by side, each counted once whichever leaf wins. A key whose terms are not
/// its document's (facts `cancelled`) is joined pending like any marker the winner lacks: the
/// convergence to the document that stands takes it back, once that document stands alone on
/// every copy.
#[test]
fn markers_of_two_terms_under_one_id_merge_side_by_side() {
    let (a, b) = ("t~00000000000000aa", "t~00000000000000bb");
    let (mut w, mut l) = (account(1000, &[], &[]), account(1000, &[], &[]));
    once(&mut w, a, -100, 3);
    once(&mut l, b, -70, 5);
    let mut f = decided(State::Done, -100, Some(3));
    let f_a = f.remove("t").expect("one");
    let facts: HashMap<String, TxnFacts> = [
        (a.to_owned(), f_a),
        (
            b.to_owned(),
            TxnFacts {
                state: State::Cancelled,
                delta: Amount::ZERO,
                named: None,
            },
        ),
    ]
    .into_iter()
    .collect();
    for (winner, loser) in [(&w, &l), (&l, &w)] {
        let m = merge_account(winner, std::slice::from_ref(loser), &facts, NOW).unwrap();
        assert_eq!((m.balance.minor(), m.pending.len()), (830, 2), "{m:?}");
        assert!(m.settled.is_empty(), "{:?}", m.settled);
    }
}

#[test]
fn a_settled_entry_counts_its_documents_delta_not_another_terms_marker() {
    // One branch settled `t` (−70); the other holds a marker of `t` with other terms.
    let mut w = account(1000, &[], &[]);
    once(&mut w, "t", -100, 3);
    let l = account(930, &[], &[("t", false)]);
    let f = decided(State::Done, -70, Some(5));
    for (winner, loser) in [(&w, &l), (&l, &w)] {
        let m = merge_account(winner, std::slice::from_ref(loser), &f, NOW).unwrap();
        assert_eq!(m.balance.minor(), 930);
        assert!(m.pending.is_empty(), "{m:?}");
    }
}

#[test]
fn the_named_marker_outlives_an_undo_of_another_attempt_on_a_branch() {
    // One branch holds the marker a done transfer names; another undid a different attempt
    // of it (a settle that read a copy without the named marker).
    let mut w = account(1000, &[], &[]);
    once(&mut w, "t", -100, 5);
    let l = account(1000, &[], &[("t", true)]);
    let mut f = facts(&[("t", State::Done, -100)]);
    f.get_mut("t").unwrap().named = Some(Attempt::from_bits(5));
    let m = merge_account(&w, std::slice::from_ref(&l), &f, NOW).unwrap();
    assert_eq!(m.balance.minor(), 900, "the debit counts");
    assert_eq!(m.pending.len(), 1);
    // Not named (a cancelled transfer, or another attempt named): the undo stands.
    let f = facts(&[("t", State::Cancelled, -100)]);
    let m = merge_account(&w, &[l], &f, NOW).unwrap();
    assert_eq!((m.balance.minor(), m.pending.len()), (1000, 0));
}

#[test]
fn an_undo_of_one_attempt_leaves_another_attempts_marker_pending_whichever_leaf_is_read() {
    // Two `done` leaves name attempts 5 and 7. The settle of the one naming 5 met attempt
    // 7's marker on the winner's branch and undid it; the marker of 5 is on the other
    // branch. The merge reads the leaf naming 7: which leaf stays is not known yet.
    let mut undone = account(1000, &[], &[]);
    once(&mut undone, "t", 100, 7);
    let marker = undone.pending.remove(0);
    undone.balance = Amount::new(1000).unwrap();
    undone.settled.push(Settled::undone_of(&marker, 2000));
    let mut held = account(1000, &[], &[]);
    once(&mut held, "t", 100, 5);
    for named in [7, 5] {
        let f = decided(State::Done, 100, Some(named));
        let m = merge_account(&undone, std::slice::from_ref(&held), &f, NOW).unwrap();
        assert_eq!(
            m.balance.minor(),
            1100,
            "named {named}: the credit stays, once"
        );
        assert_eq!(m.pending.len(), 1, "named {named}: {m:?}");
        assert!(m.pending[0].carries(Attempt::from_bits(5)));
        assert!(m.settled.is_empty(), "{m:?}");
    }
    // The undo of that very marker (its attempt on the entry) ends it, as before.
    let mut same = held.clone();
    let gone = same.pending.remove(0);
    same.balance = Amount::new(1000).unwrap();
    same.settled.push(Settled::undone_of(&gone, 2000));
    let m = merge_account(
        &same,
        std::slice::from_ref(&held),
        &decided(State::Done, 100, Some(7)),
        NOW,
    )
    .unwrap();
    assert_eq!((m.balance.minor(), m.pending.len()), (1000, 0));
    assert_eq!(m.settled[0].attempts, vec![Attempt::from_bits(5)]);
    // An undone entry naming no attempt (a stepwise marker's, an earlier version's) ends
    // the transfer here whatever the attempt, as before.
    let old = account(1000, &[], &[("t", true)]);
    let m = merge_account(&old, &[held], &decided(State::Done, 100, Some(7)), NOW).unwrap();
    assert_eq!((m.balance.minor(), m.pending.len()), (1000, 0));
}

#[test]
fn two_branches_with_different_markers_count_both_once() {
    // Fork at 1000; t1 (−100) on one branch, t2 (−50) on the other.
    let w = account(900, &[("t1", -100)], &[]);
    let l = account(950, &[("t2", -50)], &[]);
    let m = merge_account(&w, &[l], &HashMap::new(), NOW).expect("merges");
    assert_eq!(m.balance.minor(), 850);
    assert_eq!(m.pending.len(), 2);
    assert_eq!(m.rev.as_deref(), Some("5-aa"));
}

#[test]
fn the_same_marker_on_both_branches_counts_once() {
    let w = account(900, &[("t1", -100)], &[]);
    let l = account(900, &[("t1", -100)], &[("t0", false)]);
    let f = facts(&[("t0", State::Done, 0)]);
    // t0 settled on the loser only, young, delta 0 for the test: balance unchanged.
    let m = merge_account(&w, &[l], &f, NOW).expect("merges");
    assert_eq!(m.balance.minor(), 900);
    assert_eq!(m.pending.len(), 1);
    assert_eq!(m.settled.len(), 1);
}

#[test]
fn settled_on_one_leaf_pending_on_the_other_is_settled_once() {
    let w = account(900, &[("t1", -100)], &[]);
    let l = account(900, &[], &[("t1", false)]);
    let m = merge_account(&w, std::slice::from_ref(&l), &HashMap::new(), NOW).expect("merges");
    assert_eq!(m.balance.minor(), 900);
    assert!(m.pending.is_empty());
    assert_eq!(m.settled.len(), 1);
    // And the other way round, with the transfer's document to give the delta.
    let f = facts(&[("t1", State::Done, -100)]);
    let m = merge_account(&l, &[w], &f, NOW).expect("merges");
    assert_eq!(m.balance.minor(), 900);
}

#[test]
fn a_branch_without_the_transfer_gains_it_from_the_other() {
    let w = account(1000, &[], &[]);
    let l = account(900, &[], &[("t1", false)]);
    let f = facts(&[("t1", State::Done, -100)]);
    let m = merge_account(&w, &[l], &f, NOW).expect("merges");
    assert_eq!(m.balance.minor(), 900);
    // Without the transfer's document the delta is unknown: blocked, never guessed.
    let w = account(1000, &[], &[]);
    let l = account(900, &[], &[("t1", false)]);
    assert!(merge_account(&w, &[l], &HashMap::new(), NOW).is_err());
}

#[test]
fn undone_beats_pending_and_settled_against_undone_follows_the_transfer() {
    let w = account(900, &[("t1", -100)], &[]);
    let l = account(1000, &[], &[("t1", true)]);
    let m = merge_account(&w, &[l], &HashMap::new(), NOW).expect("merges");
    assert_eq!(m.balance.minor(), 1000);
    assert!(m.settled[0].undone);

    let w = account(900, &[], &[("t1", false)]);
    let l = account(1000, &[], &[("t1", true)]);
    let done = facts(&[("t1", State::Done, -100)]);
    assert_eq!(
        merge_account(&w, std::slice::from_ref(&l), &done, NOW)
            .expect("merges")
            .balance
            .minor(),
        900
    );
    let cancelled = facts(&[("t1", State::Cancelled, -100)]);
    assert_eq!(
        merge_account(&w, std::slice::from_ref(&l), &cancelled, NOW)
            .expect("merges")
            .balance
            .minor(),
        1000
    );
    let pending = facts(&[("t1", State::Pending, -100)]);
    assert!(merge_account(&w, &[l], &pending, NOW).is_err());
}

#[test]
fn an_old_settled_entry_the_winner_lacks_was_pruned_there() {
    let mut w = account(900, &[], &[]);
    let mut l = account(900, &[], &[("t1", false)]);
    l.settled[0].at = NOW - i64::try_from(SETTLED_AGE_MIN_MS).expect("fits") - 1;
    w.pruned_to = Some(l.settled[0].at);
    let f = facts(&[("t1", State::Done, -100)]);
    let m = merge_account(&w, &[l], &f, NOW).expect("merges");
    assert_eq!(m.balance.minor(), 900);
    assert!(m.settled.is_empty());
}

/// A branch that lived past the pruning age (nothing pruned: accounts at the server's
/// default quorum, or a branch no merge reached for a minute) keeps what only the loser
/// settled: each transfer counted once whichever leaf wins.
#[test]
fn an_old_entry_on_a_branch_the_winner_never_pruned_counts() {
    let old = NOW - i64::try_from(SETTLED_AGE_MIN_MS).expect("fits") - 10_000;
    // Both from 10,000: t1 (−5,000) and t2 (+1,000) settled on one branch, t3 (−200) on the other.
    let mut l = account(6_000, &[], &[("t1", false), ("t2", false)]);
    let mut w = account(9_800, &[], &[("t3", false)]);
    for s in l.settled.iter_mut().chain(w.settled.iter_mut()) {
        s.at = old;
    }
    let f = facts(&[
        ("t1", State::Done, -5_000),
        ("t2", State::Done, 1_000),
        ("t3", State::Done, -200),
    ]);
    for (winner, loser) in [(&w, &l), (&l, &w)] {
        let m = merge_account(winner, std::slice::from_ref(loser), &f, NOW).expect("merges");
        assert_eq!(
            m.balance.minor(),
            5_800,
            "winner at {}",
            winner.balance.minor()
        );
        assert_eq!(m.settled.len(), 3);
    }
    // Had the winner pruned up to those entries, they would be taken as its own, pruned.
    w.pruned_to = Some(old);
    let m = merge_account(&w, std::slice::from_ref(&l), &f, NOW).expect("merges");
    assert_eq!(m.balance.minor(), 9_800);
}

#[test]
fn an_entry_settled_on_every_leaf_needs_no_delta() {
    let w = account(900, &[], &[("t1", false)]);
    let l = account(900, &[], &[("t1", false), ("t2", true)]);
    let m = merge_account(&w, &[l], &HashMap::new(), NOW).expect("merges");
    assert_eq!(m.balance.minor(), 900);
    assert_eq!(m.settled.len(), 2);
}

#[test]
fn facts_are_read_only_where_leaves_disagree_on_an_outcome() {
    let w = account(900, &[("t1", -100)], &[("t0", false)]);
    let l = account(
        850,
        &[("t1", -100), ("t2", -50)],
        &[("t0", false), ("t3", false)],
    );
    // t3: settled on one leaf, absent on the other. t2: pending on a losing leaf only,
    // which counts only if its transfer has not ended without it (a stale copy's marker).
    assert_eq!(
        facts_needed(&w, &[l]),
        vec!["t2".to_owned(), "t3".to_owned()]
    );
}

#[test]
fn the_transfer_leaf_kept_is_the_furthest_and_a_fork_follows_the_accounts() {
    use State::*;
    let none = Evidence::default();
    assert_eq!(
        choose_transfer_leaf(&[(Pending, "1-a"), (Committed, "1-b")], none),
        Some(1)
    );
    assert_eq!(
        choose_transfer_leaf(&[(Done, "1-a"), (Committed, "1-b")], none),
        Some(0)
    );
    assert_eq!(
        choose_transfer_leaf(&[(Initial, "1-a"), (Cancelled, "1-b")], none),
        Some(1)
    );
    assert_eq!(
        choose_transfer_leaf(&[(Canceling, "1-a"), (Committed, "1-b")], none),
        Some(1)
    );
    // The accounts show nothing, and the commit path is a one-write `done` only: never told
    // nor settled beside another leaf, so the cancel path, whose undos may be on their way.
    let untold = Evidence {
        commit_untold: true,
        ..none
    };
    assert_eq!(
        choose_transfer_leaf(&[(Done, "2-a"), (Canceling, "2-b")], untold),
        Some(1)
    );
    assert_eq!(
        choose_transfer_leaf(&[(Done, "2-a"), (Canceling, "2-b")], none),
        Some(0),
        "a committed path that may have been told is kept"
    );
    let settled_untold = Evidence {
        settled: true,
        commit_untold: true,
        ..none
    };
    assert_eq!(
        choose_transfer_leaf(&[(Done, "2-a"), (Canceling, "2-b")], settled_untold),
        Some(0)
    );
    let undone = Evidence {
        settled: false,
        undone: true,
        commit_untold: false,
    };
    assert_eq!(
        choose_transfer_leaf(&[(Canceling, "1-a"), (Committed, "1-b")], undone),
        Some(0)
    );
    assert_eq!(
        choose_transfer_leaf(&[(Done, "1-a"), (Cancelled, "1-b")], undone),
        Some(1)
    );
    let both = Evidence {
        settled: true,
        undone: true,
        commit_untold: false,
    };
    assert_eq!(
        choose_transfer_leaf(&[(Done, "1-a"), (Cancelled, "1-b")], both),
        None
    );
    assert_eq!(
        choose_transfer_leaf(&[(Done, "1-a"), (Committed, "1-b")], both),
        Some(0)
    );
}

#[test]
fn between_leaves_equally_far_the_one_kept_is_the_winner_whatever_the_read_order() {
    use State::*;
    let none = Evidence::default();
    // Two transfer creates at once, `1-3066…` and `1-a51f…`, and `2-978b…` extending the
    // first on some copies only. One resolver reads a copy holding `2-978b…`, another a copy
    // that still holds `1-3066…` as a leaf.
    let first = [(Pending, "2-978b"), (Pending, "1-a51f")];
    let second = [(Pending, "1-a51f"), (Pending, "1-3066")];
    assert_eq!(choose_transfer_leaf(&first, none), Some(0));
    assert_eq!(choose_transfer_leaf(&second, none), Some(0));
    // The read order does not matter.
    let reversed = [(Pending, "1-a51f"), (Pending, "2-978b")];
    assert_eq!(choose_transfer_leaf(&reversed, none), Some(1));
    // What each deletes: the first `1-a51f…`, the second `1-3066…` (which, where it is not a
    // leaf any more, refuses the delete). `2-978b…`, the greatest, stays live.
    let deleted: Vec<&str> = [&first[..], &second[..]]
        .iter()
        .flat_map(|view| {
            let keep = choose_transfer_leaf(view, none).expect("kept");
            view.iter()
                .enumerate()
                .filter(move |(i, _)| *i != keep)
                .map(|(_, (_, rev))| *rev)
        })
        .collect();
    assert!(!deleted.contains(&"2-978b"), "deleted {deleted:?}");
    // Further along still wins over a longer path.
    assert_eq!(
        choose_transfer_leaf(&[(Pending, "3-ff"), (Committed, "2-00")], none),
        Some(1)
    );
}

#[test]
fn of_two_done_leaves_the_one_whose_named_markers_are_held_is_kept() {
    let a = Attempt::from_bits;
    let marker = |attempt: u64| Marker {
        txn: "t".into(),
        delta: Amount::new(5).unwrap(),
        at: Some(1),
        attempt: Some(a(attempt)),
        peer: None,
        aliases: Vec::new(),
    };
    let named = [Some((a(1), a(1))), Some((a(2), a(2)))];
    let none = [false, false];
    // The source holds attempt 1's marker, the destination nothing pending (undone): the
    // leaf naming 1 is kept though CouchDB's winner (index 1) names 2.
    assert_eq!(prefer_held_markers(&named, 1, [&[marker(1)], &[]], none), 0);
    // Both held by the winner's attempt, or neither held by either: the winner stays.
    let by_two = [&[marker(2)][..], &[marker(2)][..]];
    assert_eq!(prefer_held_markers(&named, 1, by_two, none), 1);
    assert_eq!(prefer_held_markers(&named, 1, [&[], &[]], none), 1);
    // A merged marker carrying both attempts holds both: a tie.
    let mut both = marker(1);
    both.aliases = vec![a(2)];
    assert_eq!(prefer_held_markers(&named, 1, [&[both], &[]], none), 1);
    // Each holds one side, but the source counts the transfer already (settled): the leaf
    // whose destination marker is still there is kept.
    let crossed = [&[marker(2)][..], &[marker(1)][..]];
    assert_eq!(prefer_held_markers(&named, 1, crossed, none), 1);
    assert_eq!(prefer_held_markers(&named, 1, crossed, [true, false]), 0);
    // The winner is not a one-write done: nothing to prefer.
    let one = [Some((a(1), a(1))), None];
    assert_eq!(prefer_held_markers(&one, 1, [&[marker(1)], &[]], none), 1);
}

#[test]
fn a_one_write_marker_undone_on_a_leaf_stays_pending_while_its_transfer_reads_undecided() {
    let undone = account(1_000, &[], &[("t", true)]);
    let mut held = account(1_000, &[], &[]);
    once(&mut held, "t", -5, 1);
    let undecided = facts(&[("t", State::Pending, -5)]);
    // Counted once, whichever leaf wins, until the document's resolution decides it.
    for (winner, loser) in [(&undone, &held), (&held, &undone)] {
        let m = merge_account(winner, std::slice::from_ref(loser), &undecided, 10).unwrap();
        assert_eq!(m.balance.minor(), 995);
        assert!(m
            .pending
            .iter()
            .any(|p| p.txn == "t" && p.carries(Attempt::from_bits(1))));
        assert!(m.settled.is_empty());
    }
    // A cancel read: the undo stands.
    let cancelled = facts(&[("t", State::Cancelled, -5)]);
    let m = merge_account(&undone, &[held.clone()], &cancelled, 10).unwrap();
    assert_eq!(m.balance.minor(), 1_000);
    assert!(m.pending.is_empty());
}

#[test]
fn a_marker_is_taken_back_only_by_an_undo_of_every_attempt_or_of_its_own_with_nothing_held() {
    let x = Attempt::from_bits(5);
    let y = Attempt::from_bits(3);
    // Undone by a cancel's convergence (no attempt named), nothing held: taken back.
    let undone = account(1000, &[], &[("t", true)]);
    assert!(marker_taken_back(std::slice::from_ref(&undone), "t", x));
    // Undone by a `done` settle that named another attempt's marker: says nothing of x.
    let mut other = undone.clone();
    other.settled[0].attempts = vec![y];
    assert!(!marker_taken_back(std::slice::from_ref(&other), "t", x));
    assert!(marker_taken_back(&[other], "t", y));
    // x's marker still pending on another leaf: held.
    let mut pending = account(1000, &[], &[]);
    once(&mut pending, "t", -100, 5);
    assert!(!marker_taken_back(&[undone.clone(), pending], "t", x));
    // Settled on some leaf: the transfer counts there.
    let settled = account(900, &[], &[("t", false)]);
    assert!(!marker_taken_back(&[undone.clone(), settled], "t", x));
    // Nothing recorded (never applied, or pruned): no evidence.
    assert!(!marker_taken_back(&[account(1000, &[], &[])], "t", x));
    // Another transfer's undo is not this one's.
    assert!(!marker_taken_back(&[undone], "u", x));
}
