//! The order ledger (Cloudant's "grouping related documents"): a purchase, and then payments,
//! refunds, adjustments, shipments and deliveries, each its own immutable document that is
//! written once and never changed. The `orders/ledger` `_sum` view adds an order's signed
//! amounts up, so its balance is one request.
//!
//! Every id is deterministic (`payment:{order_id}:{reference}`…), so a retried write finds its
//! own document: the same content is [`RecordStatus::Exists`], other content is an error that
//! names the first field that differs.
//!
//! The parts: `model` (the inputs and outputs, and the checks of an input), `record` (the
//! write-once recording of each entry, methods of [`Ledger`](crate::Ledger)) and `reports` (an
//! order's balance and summary, statements, the orders not settled: methods of `Ledger` too).

mod model;
mod record;
mod reports;

pub(crate) use self::model::check_id_part;
pub use self::model::{
    Adjustment, BasketItem, CurrencyBalance, Delivered, Delivery, Entry, EntryKind, OrderBalance,
    OrderSummary, OutstandingPage, Payment, Purchase, RecordStatus, Recorded, Refund, Shipment,
    Statement, BASKET_ITEMS_MAX, ID_PART_LEN_MAX, TEXT_LEN_MAX,
};
pub(crate) use self::reports::exact_amount;
pub use self::reports::OUTSTANDING_LIMIT_MAX;
