//! The `_bulk_docs` requests under the account engine and the transfer writer, and how their
//! replies are read.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::couch::{BulkResult, Client, RawDoc, WriteOptions};
use crate::error::{Error, Result};

/// A copy of an error for each of several waiters ([`Error::duplicate`]).
pub(crate) fn duplicate(e: &Error) -> Error {
    e.duplicate()
}

/// A per-document failure in a `_bulk_docs` reply, as the error a single write would have had.
pub(super) fn bulk_error(id: &str, r: &BulkResult) -> Error {
    let status = match r.error.as_deref() {
        Some("conflict") => Some(409),
        Some("forbidden") => Some(403),
        Some("unauthorized") => Some(401),
        _ => None,
    };
    match status {
        Some(s) => {
            Error::status(s, r.error.clone(), r.reason.clone()).with_request("POST", "_bulk_docs")
        }
        None => Error::decode(format!(
            "_bulk_docs answered {:?} ({:?}) for {id}",
            r.error, r.reason
        )),
    }
}

/// A `_bulk_docs` reply keyed by document id. Never by position: pouchdb-server, with a
/// `validate_doc_update` installed, answers refusals first and the rest in the order their
/// validations finished (pouchdb-bulkdocs-wrapper). Every batch holds each id at most once.
pub(super) fn results_by_id(results: Vec<BulkResult>) -> HashMap<String, BulkResult> {
    results
        .into_iter()
        .filter_map(|r| r.id.clone().map(|id| (id, r)))
        .collect()
}

/// The account engine's `_bulk_docs` sender: one request per call, sent from the caller's own
/// task (the engine's driver: a round's account writes and the transfer documents queued
/// meanwhile go out together, `AccountEngine::write_accounts_with`). A queue of
/// its own, merging the batches of two writers, only added a hand-over between tasks to every
/// request (~1.8 ms between two requests under `p8`'s load).
pub(crate) struct BulkWriter {
    pub(super) client: Client,
    requests: AtomicU64,
    /// Requests that carried account and transfer documents together.
    shared: AtomicU64,
}

impl fmt::Debug for BulkWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkWriter")
            .field("requests", &self.requests.load(Ordering::Relaxed))
            .field("shared", &self.shared.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl BulkWriter {
    pub(crate) fn new(client: Client) -> BulkWriter {
        BulkWriter {
            client,
            requests: AtomicU64::new(0),
            shared: AtomicU64::new(0),
        }
    }

    /// Writes `docs` (each with its `_id`) with `_bulk_docs`: one result per document, in
    /// order, or the error of the request that carried them (unknown whether they landed).
    pub(crate) async fn write(
        &self,
        docs: Vec<RawDoc>,
        options: WriteOptions,
    ) -> Result<Vec<BulkResult>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let docs: Vec<&RawDoc> = docs.iter().collect();
        self.client.bulk_docs_raw(&docs, &options).await
    }

    /// Counts a request that carried both kinds of documents.
    pub(super) fn note_shared(&self) {
        self.shared.fetch_add(1, Ordering::Relaxed);
    }

    /// `_bulk_docs` requests sent, and how many of them carried account and transfer documents
    /// together.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn stats(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.shared.load(Ordering::Relaxed),
        )
    }
}
