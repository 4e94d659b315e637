//! `Ledger`: the domain entry point. Orders, accounts, transfers and the sweeper are methods
//! on it (in their own files); it knows money and nothing about HTTP.

use std::sync::Arc;

use serde::Serialize;

use crate::couch::Client;
use crate::design::{self, Installed};
use crate::error::Result;

/// The ledger in one database. Cheap to clone; create one and reuse it.
#[derive(Clone, Debug)]
pub struct Ledger {
    pub(crate) inner: Arc<LedgerInner>,
}

#[derive(Debug)]
pub(crate) struct LedgerInner {
    pub(crate) client: Client,
    /// Names this process in transfer claims.
    pub(crate) worker_id: String,
}

/// What [`Ledger::init`] did.
#[derive(Debug, Clone, Serialize)]
pub struct InitReport {
    /// The database's name.
    pub database: String,
    /// This call created the database.
    pub created: bool,
    /// Each design document's install outcome.
    pub design_docs: Vec<Installed>,
}

impl Ledger {
    /// A ledger on the client's database.
    pub fn new(client: Client) -> Ledger {
        Ledger {
            inner: Arc::new(LedgerInner {
                client,
                worker_id: uuid::Uuid::now_v7().to_string(),
            }),
        }
    }

    /// The CouchDB client underneath.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// This process's worker id (written into the claims of transfers it drives).
    pub fn worker_id(&self) -> &str {
        &self.inner.worker_id
    }

    /// Creates the database if needed and installs the design documents, writing only those
    /// that changed. Safe to run any number of times, from several processes at once.
    ///
    /// # Errors
    ///
    /// The server refused (both steps need admin rights on CouchDB) or failed.
    pub async fn init(&self) -> Result<InitReport> {
        let created = self.inner.client.ensure_database().await?;
        let design_docs = design::install(&self.inner.client).await?;
        Ok(InitReport {
            database: self.inner.client.database().to_owned(),
            created,
            design_docs,
        })
    }
}
