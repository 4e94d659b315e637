//! The transfer writer: transfer-document writes go through the account engine's queue, and a
//! round sends them in the same `_bulk_docs` as its account writes when it can (the transfers'
//! decisions go out with the next transfers' applies).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::{AccountEngine, QueuedTxn, Work};
use crate::account_doc::AccountDoc;
use crate::couch::{BulkResult, RawDoc};
use crate::engine::bulk::{bulk_error, duplicate, results_by_id};
use crate::engine::ops::TxnWrite;
use crate::error::{Error, Result};
use crate::limits::BULK_BYTES_MAX;

type TxnReply = oneshot::Sender<Result<TxnWrite>>;

impl AccountEngine {
    /// Writes one transfer document (a create without `_rev`, a CAS with one) in the engine's
    /// next round, beside that round's account writes.
    pub(crate) async fn write_txn(self: &Arc<Self>, id: String, doc: RawDoc) -> Result<TxnWrite> {
        let (reply, rx) = oneshot::channel();
        if self.queue.push([Work::Txn(QueuedTxn { id, doc, reply })]) {
            tokio::spawn(Arc::clone(self).drive());
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::invariant(
                "the transfer writer stopped before answering",
            ))
        })
    }

    /// Writes a round's transfer documents (each id at most once) and answers each.
    pub(super) async fn write_txns(&self, batch: Vec<QueuedTxn>) {
        self.txn_rounds.fetch_add(1, Ordering::Relaxed);
        let (docs, batch): (Vec<RawDoc>, Vec<(String, TxnReply)>) =
            batch.into_iter().map(|q| (q.doc, (q.id, q.reply))).unzip();
        let options = self.quorum.write_options(&self.client, true).await;
        let results = self.bulk.write(docs, options).await.map(results_by_id);
        answer_txns(batch, results);
    }

    /// A round's account writes and its transfer documents in one `_bulk_docs` (the
    /// transfers' decisions go out with the next transfers' applies), when both ask for the same
    /// `w` and fit in [`BULK_BYTES_MAX`]; else (and after a 413) one after the other. The
    /// accounts' answers as [`AccountEngine::write_accounts`] gives them (`debits` as it takes
    /// it); each transfer document answered to its writer.
    pub(super) async fn write_accounts_with(
        &self,
        writes: &[AccountDoc],
        debits: bool,
        txns: Vec<QueuedTxn>,
    ) -> Vec<Result<BulkResult>> {
        let accounts_w = self.quorum.write_options(&self.client, debits).await;
        let txns_w = self.quorum.write_options(&self.client, true).await;
        let raw: Option<Vec<RawDoc>> = writes
            .iter()
            .map(|doc| RawDoc::new(&doc.id, doc).ok())
            .collect();
        let bytes = raw.as_ref().map_or(usize::MAX, |r| {
            r.iter()
                .chain(txns.iter().map(|q| &q.doc))
                .map(RawDoc::bytes)
                .sum()
        });
        let (Some(raw), true) = (raw, accounts_w == txns_w && bytes <= BULK_BYTES_MAX) else {
            let (results, ()) =
                tokio::join!(self.write_accounts(writes, debits), self.write_txns(txns));
            return results;
        };
        self.txn_rounds.fetch_add(1, Ordering::Relaxed);
        let (txn_docs, batch): (Vec<RawDoc>, Vec<(String, TxnReply)>) =
            txns.into_iter().map(|q| (q.doc, (q.id, q.reply))).unzip();
        let mut docs = raw;
        docs.extend(txn_docs.iter().cloned());
        self.bulk.note_shared();
        match self.bulk.write(docs, accounts_w).await {
            Ok(results) => {
                let mut by_id = results_by_id(results);
                let accounts = writes
                    .iter()
                    .map(|doc| {
                        by_id.remove(&doc.id).ok_or_else(|| {
                            Error::decode(format!("_bulk_docs did not answer for {}", doc.id))
                        })
                    })
                    .collect();
                answer_txns(batch, Ok(by_id));
                accounts
            }
            Err(e) if e.is_too_large() => {
                // Each on its own, where the accounts split further as they need.
                let txns: Vec<QueuedTxn> = batch
                    .into_iter()
                    .zip(txn_docs)
                    .map(|((id, reply), doc)| QueuedTxn { id, doc, reply })
                    .collect();
                let (results, ()) =
                    tokio::join!(self.write_accounts(writes, debits), self.write_txns(txns));
                results
            }
            Err(e) => {
                answer_txns(batch, Err(duplicate(&e)));
                writes.iter().map(|_| Err(duplicate(&e))).collect()
            }
        }
    }

    /// Rounds that wrote transfer documents so far.
    pub(crate) fn txn_rounds(&self) -> u64 {
        self.txn_rounds.load(Ordering::Relaxed)
    }
}

/// Answers each transfer-document write from the `_bulk_docs` results of its request (by id), or
/// with the error of the request.
fn answer_txns(batch: Vec<(String, TxnReply)>, results: Result<HashMap<String, BulkResult>>) {
    let mut by_id = match results {
        Ok(by_id) => by_id,
        Err(e) => {
            for (_, reply) in batch {
                let _ = reply.send(Err(duplicate(&e)));
            }
            return;
        }
    };
    for (id, reply) in batch {
        let Some(r) = by_id.remove(&id) else {
            let e = Error::decode(format!("_bulk_docs did not answer for {id}"));
            let _ = reply.send(Err(e));
            continue;
        };
        let answer = if r.is_ok() && r.accepted {
            Ok(TxnWrite::Uncertain(r.rev.clone().unwrap_or_default()))
        } else if r.is_ok() {
            Ok(TxnWrite::Written(r.rev.clone().unwrap_or_default()))
        } else if r.is_conflict() {
            Ok(TxnWrite::Conflict)
        } else {
            Err(bulk_error(&id, &r))
        };
        let _ = reply.send(answer);
    }
}

/// Transfer-document writes, batched by the account engine with its account writes.
pub(crate) struct TxnWriter {
    engine: Arc<AccountEngine>,
}

impl fmt::Debug for TxnWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxnWriter")
            .field("rounds", &self.engine.txn_rounds())
            .finish_non_exhaustive()
    }
}

impl TxnWriter {
    pub(crate) fn new(engine: Arc<AccountEngine>) -> TxnWriter {
        TxnWriter { engine }
    }

    /// Writes one document (a create without `_rev`, a CAS with one).
    pub(crate) async fn write(&self, id: String, doc: RawDoc) -> Result<TxnWrite> {
        self.engine.write_txn(id, doc).await
    }

    /// Rounds that wrote transfer documents so far.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn rounds(&self) -> u64 {
        self.engine.txn_rounds()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::account::{QueuedOp, Reply};
    use crate::engine::fixtures::{apply, bulk_ids, one_request_server};
    use crate::engine::ops::OpResult;
    use serde_json::json;

    #[tokio::test]
    async fn a_round_writes_its_accounts_and_the_transfer_documents_queued_in_one_request() {
        let (server, engine) = one_request_server().await;
        // An apply and a transfer document, queued before the driver takes its batch.
        let (op_reply, op_rx) = oneshot::channel();
        let (txn_reply, txn_rx) = oneshot::channel();
        assert!(engine.queue.push([
            Work::Op(QueuedOp {
                op: apply("t", -100, true, None),
                reply: Reply::One(op_reply),
            }),
            Work::Txn(QueuedTxn {
                id: "txn:u".into(),
                doc: RawDoc::new("txn:u", &json!({"_id": "txn:u", "state": "done"})).unwrap(),
                reply: txn_reply,
            }),
        ]));
        tokio::spawn(Arc::clone(&engine).drive());
        assert_eq!(op_rx.await.unwrap().unwrap(), OpResult::Applied);
        assert_eq!(
            txn_rx.await.unwrap().unwrap(),
            TxnWrite::Written("2-y".into())
        );
        assert_eq!(
            bulk_ids(&server).await,
            [vec!["account:a", "txn:u"]],
            "one _bulk_docs for both"
        );
        assert_eq!(engine.bulk.stats(), (1, 1));
    }
}
