//! The transfer state graph: every state change of a transfer goes through [`transition`].
//!
//! ```text
//! initial ──► pending ──► committed ──► done
//!    │           │                        ▲
//!    │           └──► canceling ──► cancelled
//!    ├──────────────────────────────► cancelled
//!    └───────────────────────────────────┘  (decide: the one-write path)
//! ```
//!
//! On the one-write path (docs/ONE_WRITE.md) a transfer's document is created directly `done`
//! or `cancelled`, or moved there from `initial` in one write ([`Event::Decide`]), after its
//! accounts were applied.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a transfer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Written, not started: work for the sweeper.
    Initial,
    /// Claimed; account deltas may be applied.
    Pending,
    /// Both deltas applied; settling the markers.
    Committed,
    /// Finished.
    Done,
    /// Rolling back the applied deltas.
    Canceling,
    /// Rolled back (or rejected before any account was touched).
    Cancelled,
}

impl State {
    /// Every state, in protocol order.
    pub const ALL: [State; 6] = [
        State::Initial,
        State::Pending,
        State::Committed,
        State::Done,
        State::Canceling,
        State::Cancelled,
    ];

    /// The name used in documents and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Initial => "initial",
            State::Pending => "pending",
            State::Committed => "committed",
            State::Done => "done",
            State::Canceling => "canceling",
            State::Cancelled => "cancelled",
        }
    }

    /// `done` or `cancelled`.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Done | State::Cancelled)
    }

    /// Parses a document's `state`.
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens to a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Claim it: `initial → pending`.
    Begin,
    /// Refuse it before any account was touched: `initial → cancelled`.
    Reject,
    /// Both deltas are applied: `pending → committed`.
    Commit,
    /// Markers settled: `committed → done`.
    Complete,
    /// Roll back: `pending → canceling` (or `initial → cancelled`, nothing to undo).
    Cancel,
    /// Every delta undone: `canceling → cancelled`.
    FinishCancel,
    /// Both accounts applied, the decision written at once: `initial → done` (the one-write
    /// path; its refusal is [`Event::Reject`], `initial → cancelled`).
    Decide,
}

/// A state change the graph does not allow. Each terminal state has its own error so callers
/// (the CLI, the sweeper) can tell "already finished" from a protocol mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionError {
    /// The transfer is `done`.
    AlreadyDone,
    /// The transfer is `cancelled`.
    AlreadyCancelled,
    /// The transfer is `committed`: it can no longer be cancelled, only reversed.
    AlreadyCommitted,
    /// The transfer is being cancelled; it cannot commit.
    BeingCancelled,
    /// Any other edge that is not in the graph.
    NotAllowed {
        /// Current state.
        from: State,
        /// Attempted event.
        event: Event,
    },
}

impl fmt::Display for TransitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransitionError::AlreadyDone => f.write_str("the transfer is already done"),
            TransitionError::AlreadyCancelled => f.write_str("the transfer is already cancelled"),
            TransitionError::AlreadyCommitted => {
                f.write_str("the transfer is committed: it cannot be cancelled, only reversed")
            }
            TransitionError::BeingCancelled => f.write_str("the transfer is being cancelled"),
            TransitionError::NotAllowed { from, event } => {
                write!(f, "a transfer in state {from} cannot {event:?}")
            }
        }
    }
}

impl std::error::Error for TransitionError {}

/// The one place a transfer's next state is decided. Pure: no I/O, no clock.
///
/// # Errors
///
/// The edge is not in the graph.
pub fn transition(from: State, event: Event) -> Result<State, TransitionError> {
    use Event as E;
    use State as S;
    match (from, event) {
        (S::Initial, E::Begin) => Ok(S::Pending),
        (S::Initial, E::Reject | E::Cancel) => Ok(S::Cancelled),
        (S::Initial, E::Decide) => Ok(S::Done),
        (S::Initial, E::Commit | E::Complete | E::FinishCancel) => {
            Err(TransitionError::NotAllowed { from, event })
        }
        (S::Pending, E::Commit) => Ok(S::Committed),
        (S::Pending, E::Cancel | E::Reject) => Ok(S::Canceling),
        (S::Pending, E::Begin | E::Complete | E::FinishCancel | E::Decide) => {
            Err(TransitionError::NotAllowed { from, event })
        }
        (S::Committed, E::Complete) => Ok(S::Done),
        (S::Committed, E::Cancel | E::Reject) => Err(TransitionError::AlreadyCommitted),
        (S::Committed, E::Begin | E::Commit | E::FinishCancel | E::Decide) => {
            Err(TransitionError::NotAllowed { from, event })
        }
        (S::Canceling, E::FinishCancel) => Ok(S::Cancelled),
        (S::Canceling, E::Commit | E::Complete | E::Decide) => Err(TransitionError::BeingCancelled),
        (S::Canceling, E::Begin | E::Cancel | E::Reject) => {
            Err(TransitionError::NotAllowed { from, event })
        }
        (S::Done, _) => Err(TransitionError::AlreadyDone),
        (S::Cancelled, _) => Err(TransitionError::AlreadyCancelled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_graph_of_the_spec() {
        let edges = [
            (State::Initial, Event::Begin, State::Pending),
            (State::Initial, Event::Reject, State::Cancelled),
            (State::Pending, Event::Commit, State::Committed),
            (State::Committed, Event::Complete, State::Done),
            (State::Pending, Event::Cancel, State::Canceling),
            (State::Canceling, Event::FinishCancel, State::Cancelled),
            (State::Initial, Event::Decide, State::Done),
        ];
        for (from, event, to) in edges {
            assert_eq!(transition(from, event), Ok(to), "{from} {event:?}");
        }
    }

    #[test]
    fn terminal_states_have_their_own_errors() {
        let events = [
            Event::Begin,
            Event::Reject,
            Event::Commit,
            Event::Complete,
            Event::Cancel,
            Event::FinishCancel,
            Event::Decide,
        ];
        for e in events {
            assert_eq!(
                transition(State::Done, e),
                Err(TransitionError::AlreadyDone)
            );
            assert_eq!(
                transition(State::Cancelled, e),
                Err(TransitionError::AlreadyCancelled)
            );
        }
        assert_eq!(
            transition(State::Committed, Event::Cancel),
            Err(TransitionError::AlreadyCommitted)
        );
        assert_eq!(
            transition(State::Canceling, Event::Commit),
            Err(TransitionError::BeingCancelled)
        );
    }

    #[test]
    fn every_reached_state_is_forward_in_the_graph() {
        // Exhaustive: no event ever leads back to initial or out of a terminal state.
        for from in State::ALL {
            for e in [
                Event::Begin,
                Event::Reject,
                Event::Commit,
                Event::Complete,
                Event::Cancel,
                Event::FinishCancel,
                Event::Decide,
            ] {
                if let Ok(to) = transition(from, e) {
                    assert_ne!(to, State::Initial);
                    assert!(!from.is_terminal());
                    assert_ne!(to, from);
                }
            }
        }
    }
}
