//! Integration tests: one binary, against a real CouchDB-protocol server (see `support`).

mod support;

// The HTTP layer against the real server: documents, views, changes, errors.
mod client;
