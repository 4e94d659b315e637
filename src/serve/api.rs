//! What goes over the wire: request bodies and responses, with their OpenAPI schemas. Fields
//! and names are those of the CLI's `--json` output (SPEC §8.1); every amount is an integer in
//! minor units. The library's types stay free of web concerns: these mirror them and are built
//! from them with `From`.

use couch_ledger::{
    AccountView, LedgerStatus, OrderBalance, OrderSummary, OutstandingPage, Recorded, Statement,
    TransferOutcome, TransferView, VerifyReport,
};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::{IntoParams, ToSchema};

// ---- errors ---------------------------------------------------------------------------------

/// Every 4xx and 5xx answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// A stable code: `invalid_input`, `invalid_json`, `not_found`, `mismatch`,
    /// `not_cancellable`, `not_reversible`, `invalid_state`, `unauthorized`,
    /// `couchdb_unavailable`, `busy`, `not_ready`, `couchdb_refused`, `bad_gateway`,
    /// `internal`, `too_large`.
    #[schema(example = "invalid_input")]
    pub(crate) error: String,
    /// What went wrong, for people.
    pub(crate) message: String,
    /// The field at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) field: Option<String>,
    /// For transfers: the transfer's id, even when the call failed after its document may
    /// have been written (send the same id again to find out where it stands).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
}

// ---- records --------------------------------------------------------------------------------

/// A write-once document written (201) or found with the same content (200).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RecordedBody {
    /// The document's id (`payment:o1:r1`).
    #[schema(example = "payment:320afa89017426b994162ab004ce3383:AB9977G244FF2F667")]
    pub(crate) id: String,
    /// `created` or `exists`.
    #[schema(example = "created")]
    pub(crate) status: String,
    /// For accounts: the account id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) account: Option<String>,
}

impl From<&Recorded> for RecordedBody {
    fn from(r: &Recorded) -> RecordedBody {
        RecordedBody {
            id: r.id.clone(),
            status: r.status.as_str().to_owned(),
            account: None,
        }
    }
}

// ---- accounts -------------------------------------------------------------------------------

/// `POST /v1/accounts`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateAccount {
    /// The account id (no `:`, not beginning with `_`).
    #[schema(example = "alice")]
    pub(crate) account_id: String,
    /// ISO-4217 code; never changes.
    #[schema(example = "GBP")]
    pub(crate) currency: String,
    /// Opening balance, minor units [default: 0].
    #[serde(default)]
    #[schema(example = 100000)]
    pub(crate) opening: i64,
    /// The lowest balance a debit may leave, minor units; `null` = unlimited (an issuer or
    /// external account) [default when absent: 0].
    #[serde(default = "zero_min", deserialize_with = "nullable")]
    #[schema(example = 0, nullable)]
    pub(crate) min_balance: Option<i64>,
}

fn zero_min() -> Option<i64> {
    Some(0)
}

/// `null` is `None`; a missing field takes the `default` instead (so that forgetting
/// `min_balance` never means an unlimited overdraft).
fn nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Option::<i64>::deserialize(d)
}

/// A transfer applied to an account and not yet settled.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PendingBody {
    /// Transfer id.
    pub(crate) txn: String,
    /// The signed change it made to `balance`, minor units.
    pub(crate) delta: i64,
}

/// An account and its balances (as `account show --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AccountBody {
    /// Account id.
    pub(crate) account: String,
    /// ISO-4217 code.
    pub(crate) currency: String,
    /// Opening balance.
    pub(crate) opening: i64,
    /// What the document stores: every applied delta, settled or not.
    pub(crate) balance: i64,
    /// `balance` minus credits not yet settled: what may be spent.
    pub(crate) available: i64,
    /// `balance` minus every pending delta: settled transfers only.
    pub(crate) posted: i64,
    /// `null` = unlimited.
    pub(crate) min_balance: Option<i64>,
    /// Transfers applied and not yet settled.
    pub(crate) pending: Vec<PendingBody>,
}

impl From<&AccountView> for AccountBody {
    fn from(v: &AccountView) -> AccountBody {
        AccountBody {
            account: v.account.clone(),
            currency: v.currency.clone(),
            opening: v.opening.minor(),
            balance: v.balance.minor(),
            available: v.available.minor(),
            posted: v.posted.minor(),
            min_balance: v.min_balance.map(|m| m.minor()),
            pending: v
                .pending
                .iter()
                .map(|p| PendingBody {
                    txn: p.txn.clone(),
                    delta: p.delta.minor(),
                })
                .collect(),
        }
    }
}

/// Every account (as `account list --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AccountList {
    pub(crate) accounts: Vec<AccountBody>,
}

// ---- transfers ------------------------------------------------------------------------------

/// `POST /v1/transfers`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateTransfer {
    /// The idempotency key, the transfer's id (or give it as the `Idempotency-Key` header;
    /// if both are given they must agree) [default: a new UUID v7].
    #[schema(example = "order-42")]
    pub(crate) id: Option<String>,
    /// The account debited.
    #[schema(example = "alice")]
    pub(crate) from: String,
    /// The account credited; not `from`.
    #[schema(example = "shop")]
    pub(crate) to: String,
    /// Minor units, greater than zero.
    #[schema(example = 10000)]
    pub(crate) amount: i64,
    /// ISO-4217 code; both accounts must hold it (else the transfer ends `cancelled`,
    /// `currency_mismatch`).
    #[schema(example = "GBP")]
    pub(crate) currency: String,
    /// Drive the transfer to its end before answering [default: true]; `false` writes it
    /// `initial` for the sweeper.
    pub(crate) wait: Option<bool>,
}

/// Where a transfer call left the transfer (as `transfer --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OutcomeBody {
    /// Transfer id.
    #[schema(example = "order-42")]
    pub(crate) id: String,
    /// `initial`, `pending`, `committed`, `done`, `canceling` or `cancelled`.
    #[schema(example = "done")]
    pub(crate) state: String,
    /// Why it was cancelled (`insufficient_funds`, `unknown_account`, `currency_mismatch`,
    /// `cancelled_by_user`); `null` unless cancelled.
    pub(crate) reason: Option<String>,
    /// `created` (this call made it) or `exists` (sent before with the same terms).
    #[schema(example = "created")]
    pub(crate) status: String,
    /// For a reversal: the transfer it reverses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reverses: Option<String>,
}

impl From<&TransferOutcome> for OutcomeBody {
    fn from(o: &TransferOutcome) -> OutcomeBody {
        OutcomeBody {
            id: o.id.clone(),
            state: o.state.as_str().to_owned(),
            reason: o.reason.clone(),
            status: o.status.as_str().to_owned(),
            reverses: None,
        }
    }
}

/// Who is working on a transfer, until when.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ClaimBody {
    /// The worker id of the claiming process.
    pub(crate) owner: String,
    /// Wall-clock expiry, ms since the epoch.
    pub(crate) expires_at: i64,
}

/// One transfer (as `transfer show --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TransferBody {
    pub(crate) id: String,
    /// Account debited.
    pub(crate) source: String,
    /// Account credited.
    pub(crate) destination: String,
    /// Minor units.
    pub(crate) amount: i64,
    pub(crate) currency: String,
    /// `initial`, `pending`, `committed`, `done`, `canceling` or `cancelled`.
    pub(crate) state: String,
    pub(crate) reason: Option<String>,
    /// For a reversal, the transfer it reverses.
    pub(crate) reverses: Option<String>,
    pub(crate) claim: Option<ClaimBody>,
    /// ms since the epoch.
    pub(crate) created_at: i64,
    /// ms since the epoch.
    pub(crate) last_modified: i64,
}

impl From<&TransferView> for TransferBody {
    fn from(t: &TransferView) -> TransferBody {
        TransferBody {
            id: t.id.clone(),
            source: t.source.clone(),
            destination: t.destination.clone(),
            amount: t.amount.minor(),
            currency: t.currency.clone(),
            state: t.state.as_str().to_owned(),
            reason: t.reason.clone(),
            reverses: t.reverses.clone(),
            claim: t.claim.as_ref().map(|c| ClaimBody {
                owner: c.owner.clone(),
                expires_at: c.expires_at,
            }),
            created_at: t.created_at,
            last_modified: t.last_modified,
        }
    }
}

// ---- orders ---------------------------------------------------------------------------------

/// A purchase in Cloudant's shape, amounts as **decimals** in the currency's units (`8.33` or
/// `"8.33"`), parsed exactly (as `purchase --file`). `order_id` may be left out (the path names
/// the order); when given it must be the path's.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // documentation only: the library parses the body (Purchase::from_json)
pub(crate) struct PurchaseBody {
    #[schema(example = "320afa89017426b994162ab004ce3383")]
    order_id: Option<String>,
    /// The customer.
    #[schema(example = "985522332")]
    account_id: String,
    /// ISO-4217 code, or give `?currency=`.
    #[schema(example = "GBP")]
    currency: Option<String>,
    basket: Vec<BasketItemBody>,
    delivery: DeliveryBody,
    /// Decimal.
    #[schema(value_type = f64, example = 23.47)]
    pretax: String,
    /// Decimal.
    #[schema(value_type = f64, example = 0.0)]
    tax: String,
    /// Decimal; must equal pretax + tax + delivery.price.
    #[schema(value_type = f64, example = 26.46)]
    total: String,
}

#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub(crate) struct BasketItemBody {
    product_id: String,
    title: Option<String>,
    category: Option<String>,
    /// Decimal.
    #[schema(value_type = f64, example = 8.33)]
    price: String,
    /// Decimal.
    #[schema(value_type = f64, example = 0.0)]
    tax: String,
    quantity: u32,
}

#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub(crate) struct DeliveryBody {
    option: Option<String>,
    /// Decimal.
    #[schema(value_type = f64, example = 2.99)]
    price: String,
    /// Free form.
    #[schema(value_type = Object)]
    address: String,
}

/// `PUT /v1/orders/{order_id}/purchase?currency=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PurchaseQuery {
    /// The currency of the amounts when the body has no `currency` (if both are given they
    /// must agree).
    pub(crate) currency: Option<String>,
}

/// `POST /v1/orders/{order_id}/payments`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PaymentRequest {
    /// The payment's reference (the provider's id): a re-sent payment is recognised by it.
    #[serde(rename = "ref")]
    #[schema(example = "AB9977G244FF2F667")]
    pub(crate) reference: String,
    /// Minor units, greater than zero.
    #[schema(example = 646)]
    pub(crate) amount: i64,
    /// The order's currency.
    #[schema(example = "GBP")]
    pub(crate) currency: String,
    /// How it was paid.
    #[schema(example = "credit card")]
    pub(crate) method: Option<String>,
}

/// `POST /v1/orders/{order_id}/refunds`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefundRequest {
    /// The refund's reference.
    #[serde(rename = "ref")]
    pub(crate) reference: String,
    /// Minor units, greater than zero.
    pub(crate) amount: i64,
    pub(crate) currency: String,
    pub(crate) reason: Option<String>,
}

/// `POST /v1/orders/{order_id}/adjustments`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdjustmentRequest {
    /// The adjustment's reference.
    #[serde(rename = "ref")]
    pub(crate) reference: String,
    /// Signed minor units, not zero: positive adds to what the customer owes, negative takes
    /// away.
    #[schema(example = -250)]
    pub(crate) amount: i64,
    pub(crate) currency: String,
    pub(crate) reason: Option<String>,
}

/// `POST /v1/orders/{order_id}/shipments`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShipmentRequest {
    /// The shipment's reference (a tracking number).
    #[serde(rename = "ref")]
    pub(crate) reference: String,
    pub(crate) carrier: Option<String>,
}

/// `POST /v1/orders/{order_id}/deliveries`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliveryRequest {
    /// The delivery's reference.
    #[serde(rename = "ref")]
    pub(crate) reference: String,
}

/// One money entry of an order.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EntryBody {
    /// The document's id.
    pub(crate) id: String,
    /// `purchase`, `payment`, `refund` or `adjustment`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// What it adds to the balance (a payment is negative), minor units.
    pub(crate) amount: i64,
}

/// An order's money (as `order show --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OrderBody {
    pub(crate) order_id: String,
    pub(crate) currency: String,
    /// The purchase total.
    pub(crate) total: i64,
    /// Sum of the adjustments (signed).
    pub(crate) adjusted: i64,
    /// Sum of the payments.
    pub(crate) paid: i64,
    /// Sum of the refunds.
    pub(crate) refunded: i64,
    /// `total + adjusted − paid + refunded`: positive, the customer owes; negative, the
    /// merchant owes.
    pub(crate) balance: i64,
    pub(crate) entries: Vec<EntryBody>,
}

impl From<&OrderSummary> for OrderBody {
    fn from(s: &OrderSummary) -> OrderBody {
        OrderBody {
            order_id: s.order_id.clone(),
            currency: s.currency.code().to_owned(),
            total: s.total.minor(),
            adjusted: s.adjusted.minor(),
            paid: s.paid.minor(),
            refunded: s.refunded.minor(),
            balance: s.balance.minor(),
            entries: s
                .entries
                .iter()
                .map(|e| EntryBody {
                    id: e.id.clone(),
                    kind: e.kind.as_str().to_owned(),
                    amount: e.amount.minor(),
                })
                .collect(),
        }
    }
}

/// An order and its balance.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OrderBalanceBody {
    pub(crate) order_id: String,
    /// `null` only for entries without a purchase (documents written around the ledger).
    pub(crate) currency: Option<String>,
    pub(crate) balance: i64,
}

fn balances(orders: &[OrderBalance]) -> Vec<OrderBalanceBody> {
    orders
        .iter()
        .map(|o| OrderBalanceBody {
            order_id: o.order_id.clone(),
            currency: o.currency.map(|c| c.code().to_owned()),
            balance: o.balance.minor(),
        })
        .collect()
}

/// `GET /v1/orders?outstanding=true&limit=&after=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct OrdersQuery {
    /// Must be `true`: the orders whose balance is not zero (the only listing there is).
    pub(crate) outstanding: Option<bool>,
    /// At most this many orders, 1 to 1000 [default: 100].
    pub(crate) limit: Option<usize>,
    /// Start after this order id (the `next` of the previous page).
    pub(crate) after: Option<String>,
}

/// A page of outstanding orders (as `orders outstanding --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OutstandingBody {
    pub(crate) orders: Vec<OrderBalanceBody>,
    /// Pass as `after` for the next page; `null` at the end.
    pub(crate) next: Option<String>,
}

impl From<&OutstandingPage> for OutstandingBody {
    fn from(p: &OutstandingPage) -> OutstandingBody {
        OutstandingBody {
            orders: balances(&p.orders),
            next: p.next.clone(),
        }
    }
}

/// A total in one currency.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CurrencyTotal {
    pub(crate) currency: String,
    pub(crate) balance: i64,
}

/// A customer's orders and totals (as `statement --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatementBody {
    pub(crate) account_id: String,
    pub(crate) orders: Vec<OrderBalanceBody>,
    pub(crate) totals: Vec<CurrencyTotal>,
}

impl From<&Statement> for StatementBody {
    fn from(s: &Statement) -> StatementBody {
        StatementBody {
            account_id: s.account_id.clone(),
            orders: balances(&s.orders),
            totals: s
                .totals
                .iter()
                .map(|t| CurrencyTotal {
                    currency: t.currency.code().to_owned(),
                    balance: t.balance.minor(),
                })
                .collect(),
        }
    }
}

// ---- operations -----------------------------------------------------------------------------

/// Transfers per state.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatesBody {
    pub(crate) initial: u64,
    pub(crate) pending: u64,
    pub(crate) committed: u64,
    pub(crate) done: u64,
    pub(crate) canceling: u64,
    pub(crate) cancelled: u64,
}

/// The ledger's status (as `status --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatusBody {
    pub(crate) states: StatesBody,
    /// Seconds since the oldest open transfer was last written; `null` when none is open.
    pub(crate) oldest_open_age_s: Option<u64>,
    /// Money in pending transfers, minor units (over all currencies).
    pub(crate) in_flight: i64,
    /// Money in pending transfers per currency, minor units.
    pub(crate) in_flight_by_currency: std::collections::BTreeMap<String, i64>,
    /// Pending markers held by accounts.
    pub(crate) pending_markers: u64,
    /// Ledger documents holding a conflict (0 on one node; see docs/CLUSTER.md).
    pub(crate) conflicts: u64,
    /// Accounts below their minimum balance (0 unless merged cluster conflicts overdrew one).
    pub(crate) overdrawn: u64,
}

impl From<&LedgerStatus> for StatusBody {
    fn from(s: &LedgerStatus) -> StatusBody {
        StatusBody {
            states: StatesBody {
                initial: s.states.initial,
                pending: s.states.pending,
                committed: s.states.committed,
                done: s.states.done,
                canceling: s.states.canceling,
                cancelled: s.states.cancelled,
            },
            oldest_open_age_s: s.oldest_open_age_s,
            in_flight: s.in_flight.minor(),
            in_flight_by_currency: s
                .in_flight_by_currency
                .iter()
                .map(|(code, amount)| (code.clone(), amount.minor()))
                .collect(),
            pending_markers: s.pending_markers,
            conflicts: s.conflicts,
            overdrawn: s.overdrawn,
        }
    }
}

/// One invariant's verdict.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CheckBody {
    pub(crate) name: String,
    pub(crate) ok: bool,
    pub(crate) detail: String,
    /// For a violation, the documents involved.
    pub(crate) documents: Vec<String>,
}

/// The invariants of SPEC §7 (as `verify --json`). Answered 200 whether or not they hold:
/// read `ok`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct VerifyBody {
    pub(crate) ok: bool,
    pub(crate) checks: Vec<CheckBody>,
}

impl From<&VerifyReport> for VerifyBody {
    fn from(r: &VerifyReport) -> VerifyBody {
        VerifyBody {
            ok: r.ok,
            checks: r
                .checks
                .iter()
                .map(|c| CheckBody {
                    name: c.name.clone(),
                    ok: c.ok,
                    detail: c.detail.clone(),
                    documents: c.documents.clone(),
                })
                .collect(),
        }
    }
}

/// `GET /v1/verify?at_rest=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct VerifyQuery {
    /// Expect the ledger at rest: no open transfer, no pending marker, exactly-once checked
    /// strictly [default: false].
    pub(crate) at_rest: Option<bool>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HealthBody {
    #[schema(example = "ok")]
    pub(crate) status: String,
}

/// `GET /readyz` when ready.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ReadyBody {
    pub(crate) ready: bool,
    /// The database.
    pub(crate) database: String,
}
