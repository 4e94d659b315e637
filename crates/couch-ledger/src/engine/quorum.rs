//! What a cluster asks of a write: how many copies an account write waits for, whether
//! settled entries are kept, and the conflicts met so far.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Instant;
use crate::couch::{Client, WriteOptions};
use crate::error::Result;
use crate::limits::COPIES_RECHECK_MS;

/// How many copies an **account** write must reach before the server may answer 201
/// (docs/CLUSTER.md). Transfer documents are always written with `w` = every copy: their fork
/// decisions (commit or cancel) must be exclusive whatever this says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WriteQuorum {
    /// `w` = every copy (`cluster.n` of the database; nothing is sent on a single node): a 201
    /// is then exclusive, so no rival revision of the same parent can exist or appear, and two
    /// debits cannot both pass their funds check on one balance. With a copy down every write
    /// answers 202 and is re-read before the protocol moves on.
    #[default]
    All,
    /// The server's default (`w` = 2 of 3 on CouchDB and Cloudant) for account writes that
    /// cannot overdraw: credits, settles, undos, merges, and debits of an account without a
    /// minimum. Faster with a slow copy; a rival write through another node may then land too,
    /// and the conflict is merged (each transfer counted once). A write that takes a new debit
    /// on an account with a minimum still goes with `w` = every copy: its funds check must be
    /// exclusive, or two debits could each pass on a branch of its own, both be decided before
    /// a merge met them, and leave the account below its minimum at rest (docs/CLUSTER.md,
    /// "Write quorum and read quorum").
    ///
    /// Exercised in every CI run by `r1_trio` (three replicating servers, conflicts merged),
    /// where it once showed two defects, both fixed and tested (docs/CLUSTER.md, "What the
    /// tests show") and by the simulator. Prefer [`WriteQuorum::All`] unless a
    /// slow copy makes it too slow.
    ServerDefault,
}

/// Where a one-write transfer's settles and undos leave a settled entry on its accounts
/// (docs/ONE_WRITE.md, "Settled entries").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))] // two ways are tests' settings
pub(crate) enum Entries {
    /// Where the database keeps several copies of each document, or does not say; none where it
    /// states one copy (`cluster.n` = 1, CouchDB's single node).
    #[default]
    ByCopies,
    /// Everywhere, and the rest as on several copies too (`LedgerBuilder::settled_entries`: tests
    /// that plant a cluster's conflicts on a single node).
    Always,
    /// Nowhere, whatever the server says (`LedgerBuilder::one_copy`: tests on a server that does
    /// not say).
    Never,
}

/// The write options of every ledger write, and whether settled entries are kept, learned once
/// from the database.
#[derive(Debug)]
pub(crate) struct Quorum {
    mode: WriteQuorum,
    /// `cluster.n` as the server states it (`None`: it does not say), and when it was read.
    stated: Mutex<Option<(Instant, Option<u32>)>>,
    entries: Entries,
}

impl Quorum {
    pub(crate) fn new(mode: WriteQuorum, entries: Entries) -> Quorum {
        Quorum {
            mode,
            stated: Mutex::new(None),
            entries,
        }
    }

    /// `cluster.n` as the server states it, read again every [`COPIES_RECHECK_MS`] (a database
    /// moved from one node to a cluster: this process keeps settled entries, and `w`, within
    /// that much of the move); `Err` while the database cannot be read.
    async fn stated(&self, client: &Client) -> Result<Option<u32>> {
        let fresh = |at: &Instant| at.elapsed() < Duration::from_millis(COPIES_RECHECK_MS);
        if let Some((at, n)) = *self.stated.lock().unwrap_or_else(|e| e.into_inner()) {
            if fresh(&at) {
                return Ok(n);
            }
        }
        let n = match client.stated_copies().await {
            Ok(n) => n,
            // The copies do not change under a running ledger but by an operator's move: the
            // last answer stands rather than none, or a transfer write would go without
            // `w` = n and its 201 be taken for every copy's.
            Err(e) => match *self.stated.lock().unwrap_or_else(|e| e.into_inner()) {
                Some((_, n)) => {
                    tracing::debug!("could not read the database's copies again: {e}");
                    return Ok(n);
                }
                None => return Err(e),
            },
        };
        *self.stated.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), n));
        Ok(n)
    }

    /// Whether one-write settles and undos leave settled entries, which merging an account's
    /// branches needs: `Some(true)` where the database keeps several copies or does not say
    /// (a cluster, Cloudant, pouchdb-server), `Some(false)` where it states one copy. No branch
    /// of an account can come from the ledger's own writes there (every write is an exclusive
    /// compare-and-swap), so the entries would only cost: ~18 % of `p8` on CouchDB 3.4.3
    /// (docs/bench/HISTORY.md). An account conflict that reaches such a database anyway (an
    /// admin's replication into it, history forged with `new_edits=false`) is reported, never
    /// merged (`AccountEngine::merge`). `None`: the database could not be read now.
    pub(crate) async fn keeps_entries(&self, client: &Client) -> Option<bool> {
        match self.entries {
            Entries::Always => Some(true),
            Entries::Never => Some(false),
            Entries::ByCopies => match self.stated(client).await {
                Ok(n) => Some(n != Some(1)),
                Err(e) => {
                    tracing::debug!("could not read the database's copies: {e}");
                    None
                }
            },
        }
    }

    /// Whether the database states one copy of each document (`cluster.n` = 1, a single node):
    /// a document read by id there, from a view row too (`include_docs`), is the only copy
    /// there is, read then. `None`: the database could not be read now.
    pub(crate) async fn one_copy(&self, client: &Client) -> Option<bool> {
        match self.entries {
            // The test knobs: as on one copy, or as on several, whatever the server says.
            Entries::Never => return Some(true),
            Entries::Always => return Some(false),
            Entries::ByCopies => {}
        }
        match self.stated(client).await {
            Ok(n) => Some(n == Some(1)),
            Err(e) => {
                tracing::debug!("could not read the database's copies: {e}");
                None
            }
        }
    }

    /// Whether a 201 to an account write means every copy took it: the database keeps one copy
    /// (or does not say: one server), or account writes go with `w` = n. `false` while the
    /// database cannot be read.
    pub(crate) async fn acks_every_copy(&self, client: &Client) -> bool {
        match self.stated(client).await {
            Ok(Some(n)) if n > 1 => self.mode == WriteQuorum::All,
            Ok(_) => true,
            Err(_) => false,
        }
    }

    /// `cluster.n` where the database states several copies: the `r` of a read that must see
    /// every copy that answers. `None` on one copy, or where the server does not say (one
    /// server).
    ///
    /// # Errors
    ///
    /// The database's copies could not be read now.
    pub(crate) async fn several_copies(&self, client: &Client) -> Result<Option<u32>> {
        Ok(self.stated(client).await?.filter(|n| *n > 1))
    }

    /// Forgets the copies read, as [`COPIES_RECHECK_MS`] passing does.
    #[cfg(test)]
    fn expire(&self) {
        *self.stated.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `w` = the database's copies when there are several and the write must be exclusive (a
    /// transfer document, a write-once document, or an account write that takes a new debit on
    /// a limited account, always; any account write under [`WriteQuorum::All`]); nothing
    /// otherwise, or while the database cannot be read (the server's default applies).
    pub(crate) async fn write_options(&self, client: &Client, exclusive: bool) -> WriteOptions {
        if !exclusive && self.mode == WriteQuorum::ServerDefault {
            return WriteOptions::default();
        }
        match self.stated(client).await {
            Ok(Some(n)) if n > 1 => WriteOptions { w: Some(n) },
            Ok(_) => WriteOptions::default(),
            Err(e) => {
                tracing::debug!("could not read the database's copies: {e}");
                WriteOptions::default()
            }
        }
    }
}

/// Conflicts this process met and resolved, and writes a cluster only accepted (202).
#[derive(Debug, Default)]
pub(crate) struct ConflictTally {
    pub(crate) met: AtomicU64,
    pub(crate) resolved: AtomicU64,
    pub(crate) uncertain: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fixtures::client_on;
    use serde_json::json;

    /// Settled entries follow the copies the database states, read again once the last read
    /// expired (a database given copies while the ledger runs), and the knobs override them.
    #[tokio::test]
    async fn settled_entries_follow_the_stated_copies_and_the_knobs() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, MockServer, ResponseTemplate};
        let server = MockServer::start().await;
        let info = |n: Option<u32>| {
            let cluster = n.map(|n| json!({"q": 2, "n": n, "w": 1, "r": 1}));
            ResponseTemplate::new(200).set_body_json(json!({"db_name": "db", "cluster": cluster}))
        };
        for n in [Some(1), Some(3), None] {
            Mock::given(method("GET"))
                .and(path("/db"))
                .respond_with(info(n))
                .up_to_n_times(1)
                .expect(1)
                .mount(&server)
                .await;
        }
        let client = client_on(&server.uri());
        let q = Quorum::new(WriteQuorum::default(), Entries::default());
        assert_eq!(q.keeps_entries(&client).await, Some(false), "n = 1");
        assert_eq!(q.keeps_entries(&client).await, Some(false), "read once");
        assert_eq!(q.write_options(&client, true).await.w, None);
        q.expire();
        assert_eq!(q.keeps_entries(&client).await, Some(true), "n = 3 now");
        assert_eq!(q.write_options(&client, true).await.w, Some(3));
        q.expire();
        assert_eq!(q.keeps_entries(&client).await, Some(true), "not stated");
        server.verify().await;
        // The knobs ask nothing.
        for (entries, keeps) in [(Entries::Always, true), (Entries::Never, false)] {
            let q = Quorum::new(WriteQuorum::default(), entries);
            assert_eq!(q.keeps_entries(&client).await, Some(keeps), "{entries:?}");
        }
        // A database that cannot be read: unknown (entries written, merges wait).
        let gone = client_on("http://127.0.0.1:9");
        let q = Quorum::new(WriteQuorum::default(), Entries::default());
        assert_eq!(q.keeps_entries(&gone).await, None);
    }
}
