//! Reading one named account or transfer on the command line: one that is not there is the
//! caller's mistake (exit 2), not the server's; and an account's amounts in its currency.

use couch_ledger::{Amount, Currency};

use super::output::money_opt;
use super::UsageError;

/// A 404 for the document itself (not for the database: "no_db_file", "Database does not
/// exist.").
fn is_missing_doc(e: &couch_ledger::Error) -> bool {
    e.condition() == Some(couch_ledger::Condition::NotFound)
        || (e.is_not_found() && matches!(e.reason(), Some("missing" | "deleted")))
}

/// `err`, or a usage error saying `missing` when the document does not exist: naming a
/// transfer or account that is not there is the caller's mistake (exit 2), not the server's.
pub(crate) fn or_missing(
    err: couch_ledger::Error,
    missing: String,
    doing: String,
) -> anyhow::Error {
    if is_missing_doc(&err) {
        // The 404 stays in the chain (unsaid): a database name put in --url by mistake also
        // answers `missing`, and `failure::explain` says so.
        anyhow::Error::new(err).context(UsageError::new(missing))
    } else {
        anyhow::Error::new(err).context(doing)
    }
}

/// Amounts in the currency `code` (an account's), or in minor units when the code is not one
/// we know.
pub(crate) fn money_in(code: &str) -> impl Fn(Amount) -> String {
    let c = Currency::from_code(code).ok();
    move |a| money_opt(c, a)
}
