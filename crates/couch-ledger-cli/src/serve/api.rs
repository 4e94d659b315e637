//! What goes over the wire: request bodies and responses, with their OpenAPI schemas. Fields
//! and names are those of the CLI's `--json` output (docs/PROTOCOL.md); every amount is an integer in
//! minor units. The library's types stay free of web concerns: these mirror them and are built
//! from them with `From` (the tests below check that each answers as the library's type
//! serializes). Requests are parsed into the very types their schemas are made from, whose
//! scalars (`schema.rs`) carry the library's limits.
//!
//! A field's default is said in words (`[default: 0]`), not with JSON Schema's `default`:
//! client generators such as openapi-typescript read a `default` as "always present" and would
//! make the field required in requests.
//!
//! Long, and one file on purpose: it is the API's every body, plain types and their `From`,
//! kept beside one another so the whole wire shape is read, and checked against the library,
//! in one place. About 215 lines at the end are its tests.

use couch_ledger::{
    AccountView, EntryKind, LedgerStatus, Metadata, OrderBalance, OrderSummary, OutstandingPage,
    RecordStatus, Recorded, State, Statement, TransferOutcome, TransferView, VerifyReport,
    BASKET_ITEMS_MAX, OUTSTANDING_LIMIT_MAX,
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use super::schema::{
    AnyValue, CurrencyCode, CurrencyCodeAnyCase, Decimal, Id, Meta, MinorUnits, NonZeroMinorUnits,
    OutstandingOnly, PositiveMinorUnits, ProductId, Quantity, Text,
};

// The attributes below must spell these limits as literals.
const _: () = assert!(BASKET_ITEMS_MAX == 1000);
const _: () = assert!(OUTSTANDING_LIMIT_MAX == 1000);

// ---- errors ---------------------------------------------------------------------------------

/// Every 4xx and 5xx answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// A stable code: `invalid_input`, `invalid_json`, `not_found`, `method_not_allowed`,
    /// `mismatch`, `not_cancellable`, `not_reversible`, `invalid_state`, `unauthorized`,
    /// `couchdb_unavailable`, `busy`, `not_ready`, `couchdb_refused`, `bad_gateway`,
    /// `internal`, `too_large`, `unconfirmed`, `undecided`, `uncertain`, `account_full`,
    /// `unavailable`.
    #[schema(example = "invalid_input")]
    pub(crate) error: String,
    /// What went wrong, for people.
    pub(crate) message: String,
    /// The field at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub(crate) field: Option<String>,
    /// For transfers: the transfer's id, even when the call failed after its document may
    /// have been written (send the same id again to find out where it stands).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub(crate) id: Option<String>,
}

// ---- records --------------------------------------------------------------------------------

/// A write-once document written (201) or found with the same content (200).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RecordedBody {
    /// The document's id (`payment:o1:r1`).
    #[schema(example = "payment:320afa89017426b994162ab004ce3383:AB9977G244FF2F667")]
    pub(crate) id: String,
    pub(crate) status: RecordStatusBody,
    /// For accounts: the account id.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub(crate) account: Option<String>,
}

/// `created`: this call wrote it; `exists`: it was there with the same content; `uncertain`:
/// written to some copies of a cluster's database and not yet every one (send it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RecordStatusBody {
    Created,
    Exists,
    Uncertain,
}

impl From<RecordStatus> for RecordStatusBody {
    fn from(s: RecordStatus) -> RecordStatusBody {
        match s {
            RecordStatus::Created => RecordStatusBody::Created,
            RecordStatus::Exists => RecordStatusBody::Exists,
            RecordStatus::Uncertain => RecordStatusBody::Uncertain,
        }
    }
}

impl From<&Recorded> for RecordedBody {
    fn from(r: &Recorded) -> RecordedBody {
        RecordedBody {
            id: r.id.clone(),
            status: r.status.into(),
            account: None,
        }
    }
}

// ---- accounts -------------------------------------------------------------------------------

/// `POST /v1/accounts`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"account_id": "alice", "currency": "GBP", "opening": 100000, "min_balance": 0}))]
pub(crate) struct CreateAccount {
    /// The account id.
    #[schema(value_type = Id)]
    pub(crate) account_id: String,
    /// Never changes.
    #[schema(value_type = CurrencyCodeAnyCase)]
    pub(crate) currency: String,
    /// Opening balance, minor units; not below `min_balance` (when that is a number)
    /// [default: 0].
    #[serde(default, deserialize_with = "minor_units")]
    #[schema(value_type = MinorUnits)]
    pub(crate) opening: i64,
    /// The lowest balance a debit may leave, minor units, at most `opening`; `null` =
    /// unlimited (an issuer or external account); absent = 0 (so that forgetting it never
    /// means an unlimited overdraft).
    #[serde(default = "zero_min", deserialize_with = "nullable")]
    #[schema(value_type = Option<MinorUnits>)]
    pub(crate) min_balance: Option<i64>,
    /// Written once with the document and returned with it [default: none; `null` is none].
    #[serde(default)]
    #[schema(value_type = Option<Meta>)]
    pub(crate) meta: Option<Metadata>,
}

fn zero_min() -> Option<i64> {
    Some(0)
}

/// `null` is `None`; a missing field takes the `default` instead (so that forgetting
/// `min_balance` never means an unlimited overdraft).
fn nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Option::<Box<RawValue>>::deserialize(d)?
        .map(|raw| whole_minor_units(raw.get()))
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// Minor units from a JSON number read by its value, as JSON Schema's `integer` is: `646`,
/// `646.0` and `6.46e2` are all 646; `6.46` is refused. The range is the handler's to check.
fn minor_units<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let raw = Box::<RawValue>::deserialize(d)?;
    whole_minor_units(raw.get()).map_err(serde::de::Error::custom)
}

fn whole_minor_units(text: &str) -> Result<i64, String> {
    let plain = couch_ledger::plain_decimal(text)
        .ok_or_else(|| format!("{text} is not a number of minor units"))?;
    if plain.contains('.') {
        return Err(format!("{text} is not a whole number of minor units"));
    }
    plain
        .parse()
        .map_err(|_| format!("{text} is beyond ±(2^53 − 1) minor units"))
}

/// A transfer applied to an account and not yet settled.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PendingBody {
    /// Transfer id.
    pub(crate) txn: String,
    /// The signed change it made to `balance`, minor units.
    #[schema(value_type = MinorUnits)]
    pub(crate) delta: i64,
}

/// An account and its balances (as `account show --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AccountBody {
    /// Account id.
    pub(crate) account: String,
    /// ISO-4217 code, as the account's document holds it.
    pub(crate) currency: String,
    /// Opening balance.
    #[schema(value_type = MinorUnits)]
    pub(crate) opening: i64,
    /// What the document stores: every applied delta, settled or not.
    #[schema(value_type = MinorUnits)]
    pub(crate) balance: i64,
    /// `balance` minus credits not yet settled: what may be spent.
    #[schema(value_type = MinorUnits)]
    pub(crate) available: i64,
    /// `balance` minus every pending delta: settled transfers only.
    #[schema(value_type = MinorUnits)]
    pub(crate) posted: i64,
    /// `null` = unlimited.
    #[schema(value_type = Option<MinorUnits>, required = true)]
    pub(crate) min_balance: Option<i64>,
    /// Transfers applied and not yet settled.
    pub(crate) pending: Vec<PendingBody>,
    /// What its creator attached (`{}` when nothing).
    #[schema(value_type = Meta)]
    pub(crate) meta: Metadata,
    /// Only when `at` was asked: the balance as of that time (the other fields are now's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) as_of: Option<AsOfBody>,
}

/// The balance as of a time (`GET /v1/accounts/{id}?at=`, `account show --at --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AsOfBody {
    /// The time asked about, ms since the epoch.
    pub(crate) at: i64,
    /// The opening plus every committed or done transfer that took effect at or before `at`.
    #[schema(value_type = MinorUnits)]
    pub(crate) balance: i64,
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
            meta: v.meta.clone(),
            as_of: None,
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
#[schema(example = json!({"from": "alice", "to": "shop", "amount": 10000, "currency": "GBP"}))]
pub(crate) struct CreateTransfer {
    /// The idempotency key, the transfer's id (or give it as the `Idempotency-Key` header;
    /// when both are given they must be equal, else 400) [default: a new UUID v7].
    #[schema(value_type = Option<Id>)]
    pub(crate) id: Option<String>,
    /// The account debited.
    #[schema(value_type = Id)]
    pub(crate) from: String,
    /// The account credited; not `from` (else 400).
    #[schema(value_type = Id)]
    pub(crate) to: String,
    /// Minor units, greater than zero.
    #[serde(deserialize_with = "minor_units")]
    #[schema(value_type = PositiveMinorUnits)]
    pub(crate) amount: i64,
    /// Both accounts must hold it (else the transfer ends `cancelled`, `currency_mismatch`).
    #[schema(value_type = CurrencyCodeAnyCase)]
    pub(crate) currency: String,
    /// Drive the transfer to its end before answering [default: true]; `false` writes it
    /// `initial` for the sweeper.
    pub(crate) wait: Option<bool>,
    /// Written once with the document and returned with it [default: none; `null` is none].
    #[serde(default)]
    #[schema(value_type = Option<Meta>)]
    pub(crate) meta: Option<Metadata>,
}

/// Where a transfer call left the transfer (as `transfer --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OutcomeBody {
    /// Transfer id.
    #[schema(example = "order-42")]
    pub(crate) id: String,
    pub(crate) state: StateBody,
    /// Why it was cancelled (`insufficient_funds`, `unknown_account`, `currency_mismatch`,
    /// `cancelled_by_user`, `balance_overflow`, `unreadable_account`, `conflicting_terms`);
    /// `null` unless cancelled.
    #[schema(required = true)]
    pub(crate) reason: Option<String>,
    /// `created` (this call made it) or `exists` (sent before with the same terms).
    pub(crate) status: RecordStatusBody,
    /// For a reversal: the transfer it reverses.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub(crate) reverses: Option<String>,
}

/// Where a transfer is: `initial → pending → committed → done`, or `→ canceling → cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StateBody {
    Initial,
    Pending,
    Committed,
    Done,
    Canceling,
    Cancelled,
}

impl From<State> for StateBody {
    fn from(s: State) -> StateBody {
        match s {
            State::Initial => StateBody::Initial,
            State::Pending => StateBody::Pending,
            State::Committed => StateBody::Committed,
            State::Done => StateBody::Done,
            State::Canceling => StateBody::Canceling,
            State::Cancelled => StateBody::Cancelled,
        }
    }
}

impl From<&TransferOutcome> for OutcomeBody {
    fn from(o: &TransferOutcome) -> OutcomeBody {
        OutcomeBody {
            id: o.id.clone(),
            state: o.state.into(),
            reason: o.reason.clone(),
            status: o.status.into(),
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
    #[schema(value_type = MinorUnits)]
    pub(crate) amount: i64,
    /// ISO-4217 code, as the transfer's document holds it.
    pub(crate) currency: String,
    pub(crate) state: StateBody,
    /// Why it was cancelled; `null` unless cancelled.
    #[schema(required = true)]
    pub(crate) reason: Option<String>,
    /// For a reversal, the transfer it reverses.
    #[schema(required = true)]
    pub(crate) reverses: Option<String>,
    /// The worker holding it, while one does.
    #[schema(required = true)]
    pub(crate) claim: Option<ClaimBody>,
    /// ms since the epoch.
    pub(crate) created_at: i64,
    /// ms since the epoch.
    pub(crate) last_modified: i64,
    /// When its outcome was decided (`committed` or `canceling` stepwise, `done` or
    /// `cancelled` in one write), ms since the epoch; `null` before, and for a transfer written
    /// before the field existed.
    #[schema(required = true)]
    pub(crate) decided_at: Option<i64>,
    /// What its creator attached (`{}` when nothing).
    #[schema(value_type = Meta)]
    pub(crate) meta: Metadata,
}

impl From<&TransferView> for TransferBody {
    fn from(t: &TransferView) -> TransferBody {
        TransferBody {
            id: t.id.clone(),
            source: t.source.clone(),
            destination: t.destination.clone(),
            amount: t.amount.minor(),
            currency: t.currency.clone(),
            state: t.state.into(),
            reason: t.reason.clone(),
            reverses: t.reverses.clone(),
            claim: t.claim.as_ref().map(|c| ClaimBody {
                owner: c.owner.clone(),
                expires_at: c.expires_at,
            }),
            created_at: t.created_at,
            last_modified: t.last_modified,
            decided_at: t.decided_at,
            meta: t.meta.clone(),
        }
    }
}

// ---- orders ---------------------------------------------------------------------------------

/// `PUT /v1/orders/{order_id}/purchase`: a purchase in Cloudant's shape, amounts as
/// **decimals** in the currency's units (`8.33` or `"8.33"`), parsed exactly (as `purchase
/// --file`). `order_id` may be left out (the path names the order); when given it must be the
/// path's. The amounts are carried as their JSON text to the library, which reads them; this
/// type decides which fields there are.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "account_id": "985522332",
    "currency": "GBP",
    "basket": [
        {"product_id": "A56", "title": "Adele - 25", "category": "Music", "price": 8.33,
         "tax": 0.0, "quantity": 2},
        {"product_id": "B32", "title": "The Lady in the Van", "category": "Movies",
         "price": 6.81, "tax": 0.0, "quantity": 1}
    ],
    "delivery": {"option": "Next Day", "price": 2.99,
                 "address": {"street": "17 Front Street", "town": "Middlemarch"}},
    "pretax": 23.47,
    "tax": 0.0,
    "total": 26.46
}))]
#[schema(
    description = "A purchase in Cloudant's shape, amounts as decimals in the currency's \
    units, parsed exactly. Rules no schema can state: `total` must equal `pretax + tax + \
    delivery.price`; every amount may have at most as many decimals as the currency's minor \
    unit; a `currency` here and one in the query must be the same; `order_id`, when given, \
    must be the path's; sums must stay within 2^53 − 1 minor units. Each broken one is a 400 \
    naming the field."
)]
pub(crate) struct PurchaseBody {
    /// A CouchDB id the purchase may carry from elsewhere: ignored (the ledger's is
    /// `purchase:{order_id}`).
    #[serde(rename = "_id", default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = AnyValue)]
    pub(crate) _id: Option<Box<RawValue>>,
    /// The document type, `purchase` when given.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<PurchaseKind>,
    /// The order: the path's, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Id>)]
    pub(crate) order_id: Option<String>,
    /// The customer (their statement's key).
    #[schema(value_type = Id)]
    pub(crate) account_id: String,
    /// The currency of every amount, or give `?currency=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<CurrencyCodeAnyCase>)]
    pub(crate) currency: Option<String>,
    /// What was bought.
    #[schema(min_items = 1, max_items = 1000)]
    pub(crate) basket: Vec<BasketItemBody>,
    pub(crate) delivery: DeliveryBody,
    /// The basket's price before tax.
    #[schema(value_type = Decimal)]
    pub(crate) pretax: Box<RawValue>,
    /// The tax on it.
    #[schema(value_type = Decimal)]
    pub(crate) tax: Box<RawValue>,
    /// `pretax + tax + delivery.price`.
    #[schema(value_type = Decimal)]
    pub(crate) total: Box<RawValue>,
}

/// A purchase document's `type`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PurchaseKind {
    Purchase,
}

/// One line of the basket.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BasketItemBody {
    #[schema(value_type = ProductId)]
    pub(crate) product_id: String,
    #[serde(default)]
    #[schema(value_type = Option<Text>)]
    pub(crate) title: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Text>)]
    pub(crate) category: Option<String>,
    /// The price of one.
    #[schema(value_type = Decimal)]
    pub(crate) price: Box<RawValue>,
    /// The tax on one.
    #[schema(value_type = Decimal)]
    pub(crate) tax: Box<RawValue>,
    #[schema(value_type = Quantity)]
    pub(crate) quantity: Box<RawValue>,
}

/// How the order is delivered.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliveryBody {
    #[serde(default)]
    #[schema(value_type = Option<Text>)]
    pub(crate) option: Option<String>,
    /// What delivery costs.
    #[schema(value_type = Decimal)]
    pub(crate) price: Box<RawValue>,
    /// Where to: any JSON value, kept as given (an object in Cloudant's example).
    #[schema(value_type = AnyValue)]
    pub(crate) address: serde_json::Value,
}

/// `PUT /v1/orders/{order_id}/purchase?currency=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PurchaseQuery {
    /// The currency of the amounts when the body has no `currency` (if both are given they
    /// must be the same).
    #[param(value_type = Option<CurrencyCodeAnyCase>)]
    pub(crate) currency: Option<String>,
}

/// `POST /v1/orders/{order_id}/payments`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ref": "AB9977G244FF2F667", "amount": 646, "currency": "GBP", "method": "credit card"}))]
pub(crate) struct PaymentRequest {
    /// The payment's reference (the provider's id): a re-sent payment is recognised by it.
    #[serde(rename = "ref")]
    #[schema(value_type = Id)]
    pub(crate) reference: String,
    /// Minor units, greater than zero.
    #[serde(deserialize_with = "minor_units")]
    #[schema(value_type = PositiveMinorUnits)]
    pub(crate) amount: i64,
    /// The order's currency (another is a 400).
    #[schema(value_type = CurrencyCodeAnyCase)]
    pub(crate) currency: String,
    /// How it was paid.
    #[serde(default)]
    #[schema(value_type = Option<Text>)]
    pub(crate) method: Option<String>,
    /// Written once with the entry and returned with it [default: none; `null` is none].
    #[serde(default)]
    #[schema(value_type = Option<Meta>)]
    pub(crate) meta: Option<Metadata>,
}

/// `POST /v1/orders/{order_id}/refunds`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ref": "rf1", "amount": 150, "currency": "GBP", "reason": "damaged"}))]
pub(crate) struct RefundRequest {
    /// The refund's reference.
    #[serde(rename = "ref")]
    #[schema(value_type = Id)]
    pub(crate) reference: String,
    /// Minor units, greater than zero.
    #[serde(deserialize_with = "minor_units")]
    #[schema(value_type = PositiveMinorUnits)]
    pub(crate) amount: i64,
    /// The order's currency (another is a 400).
    #[schema(value_type = CurrencyCodeAnyCase)]
    pub(crate) currency: String,
    #[serde(default)]
    #[schema(value_type = Option<Text>)]
    pub(crate) reason: Option<String>,
    /// Written once with the entry and returned with it [default: none; `null` is none].
    #[serde(default)]
    #[schema(value_type = Option<Meta>)]
    pub(crate) meta: Option<Metadata>,
}

/// `POST /v1/orders/{order_id}/adjustments`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ref": "goodwill", "amount": -250, "currency": "GBP", "reason": "late"}))]
pub(crate) struct AdjustmentRequest {
    /// The adjustment's reference.
    #[serde(rename = "ref")]
    #[schema(value_type = Id)]
    pub(crate) reference: String,
    /// Signed minor units, not zero: positive adds to what the customer owes, negative takes
    /// away.
    #[serde(deserialize_with = "minor_units")]
    #[schema(value_type = NonZeroMinorUnits)]
    pub(crate) amount: i64,
    /// The order's currency (another is a 400).
    #[schema(value_type = CurrencyCodeAnyCase)]
    pub(crate) currency: String,
    #[serde(default)]
    #[schema(value_type = Option<Text>)]
    pub(crate) reason: Option<String>,
    /// Written once with the entry and returned with it [default: none; `null` is none].
    #[serde(default)]
    #[schema(value_type = Option<Meta>)]
    pub(crate) meta: Option<Metadata>,
}

/// `POST /v1/orders/{order_id}/shipments`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ref": "trk-1", "carrier": "Royal Mail"}))]
pub(crate) struct ShipmentRequest {
    /// The shipment's reference (a tracking number).
    #[serde(rename = "ref")]
    #[schema(value_type = Id)]
    pub(crate) reference: String,
    #[serde(default)]
    #[schema(value_type = Option<Text>)]
    pub(crate) carrier: Option<String>,
}

/// `POST /v1/orders/{order_id}/deliveries`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ref": "trk-1"}))]
pub(crate) struct DeliveryRequest {
    /// The delivery's reference.
    #[serde(rename = "ref")]
    #[schema(value_type = Id)]
    pub(crate) reference: String,
}

/// One money entry of an order.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EntryBody {
    /// The document's id.
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: EntryKindBody,
    /// What it adds to the balance (a payment is negative), minor units.
    #[schema(value_type = MinorUnits)]
    pub(crate) amount: i64,
    /// What its writer attached (`{}` when nothing).
    #[schema(value_type = Meta)]
    pub(crate) meta: Metadata,
}

/// What a money entry of an order is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EntryKindBody {
    Purchase,
    Payment,
    Refund,
    Adjustment,
}

impl From<EntryKind> for EntryKindBody {
    fn from(k: EntryKind) -> EntryKindBody {
        match k {
            EntryKind::Purchase => EntryKindBody::Purchase,
            EntryKind::Payment => EntryKindBody::Payment,
            EntryKind::Refund => EntryKindBody::Refund,
            EntryKind::Adjustment => EntryKindBody::Adjustment,
        }
    }
}

/// An order's money (as `order show --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OrderBody {
    pub(crate) order_id: String,
    #[schema(value_type = CurrencyCode)]
    pub(crate) currency: String,
    /// The purchase total.
    #[schema(value_type = MinorUnits)]
    pub(crate) total: i64,
    /// Sum of the adjustments (signed).
    #[schema(value_type = MinorUnits)]
    pub(crate) adjusted: i64,
    /// Sum of the payments.
    #[schema(value_type = MinorUnits)]
    pub(crate) paid: i64,
    /// Sum of the refunds.
    #[schema(value_type = MinorUnits)]
    pub(crate) refunded: i64,
    /// `total + adjusted − paid + refunded`: positive, the customer owes; negative, the
    /// merchant owes.
    #[schema(value_type = MinorUnits)]
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
                    kind: e.kind.into(),
                    amount: e.amount.minor(),
                    meta: e.meta.clone(),
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
    #[schema(value_type = Option<CurrencyCode>, required = true)]
    pub(crate) currency: Option<String>,
    #[schema(value_type = MinorUnits)]
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
    #[param(required = true, value_type = OutstandingOnly)]
    pub(crate) outstanding: Option<bool>,
    /// At most this many orders [default: 100].
    #[param(minimum = 1, maximum = 1000, value_type = Option<u64>)]
    pub(crate) limit: Option<usize>,
    /// Start after this order id (the `next` of the previous page).
    #[param(value_type = Option<Id>)]
    pub(crate) after: Option<String>,
}

/// A page of outstanding orders (as `orders outstanding --json`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OutstandingBody {
    pub(crate) orders: Vec<OrderBalanceBody>,
    /// Pass as `after` for the next page; `null` at the end.
    #[schema(required = true)]
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
    #[schema(value_type = CurrencyCode)]
    pub(crate) currency: String,
    #[schema(value_type = MinorUnits)]
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
    #[schema(required = true)]
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

/// The invariants of docs/PROTOCOL.md (as `verify --json`). Answered 200 whether or not they hold:
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

#[cfg(test)]
mod tests {
    //! The mirrors answer as the library's types serialize (the CLI's `--json`), field for
    //! field; the purchase's fields are the library's own.

    use std::collections::BTreeSet;

    use couch_ledger::{
        Amount, Check, Claim, Currency, CurrencyBalance, Entry, PendingEntry, Purchase, StateCounts,
    };
    use serde_json::json;
    use utoipa::PartialSchema as _;

    use super::*;

    fn same<L: Serialize, B: Serialize>(library: &L, body: &B) {
        let (l, b) = (
            serde_json::to_value(library).unwrap(),
            serde_json::to_value(body).unwrap(),
        );
        assert_eq!(b, l, "the service's body differs from the library's JSON");
    }

    fn minor(n: i64) -> Amount {
        Amount::new(n).unwrap()
    }

    fn gbp() -> Currency {
        Currency::from_code("GBP").unwrap()
    }

    /// An account's body.
    #[test]
    fn account_body_answers_as_the_library_serializes() {
        let account = AccountView {
            account: "alice".into(),
            currency: "GBP".into(),
            opening: minor(100),
            balance: minor(90),
            available: minor(80),
            posted: minor(70),
            min_balance: None,
            pending: vec![PendingEntry {
                txn: "t1".into(),
                delta: minor(-10),
            }],
            meta: Default::default(),
        };
        same(&account, &AccountBody::from(&account));
    }

    /// A transfer's body, and its outcome's when done and when cancelled.
    #[test]
    fn transfer_bodies_answer_as_the_library_serializes() {
        let transfer = TransferView {
            id: "t1".into(),
            source: "alice".into(),
            destination: "shop".into(),
            amount: minor(10),
            currency: "GBP".into(),
            state: State::Pending,
            reason: None,
            reverses: Some("t0".into()),
            claim: Some(Claim {
                owner: "w1".into(),
                expires_at: 1_700_000_000_000,
            }),
            created_at: 1_700_000_000_000,
            last_modified: 1_700_000_000_001,
            meta: Default::default(),
            decided_at: Default::default(),
        };
        same(&transfer, &TransferBody::from(&transfer));
        for state in [State::Done, State::Cancelled] {
            let outcome = TransferOutcome {
                id: "t1".into(),
                state,
                reason: (state == State::Cancelled).then(|| "insufficient_funds".into()),
                status: RecordStatus::Created,
            };
            same(&outcome, &OutcomeBody::from(&outcome));
        }
    }

    /// A recorded entry, an order's summary, a page of outstanding orders and a customer's
    /// statement.
    #[test]
    fn order_bodies_answer_as_the_library_serializes() {
        let recorded = Recorded {
            id: "payment:o1:r1".into(),
            status: RecordStatus::Exists,
        };
        same(&recorded, &RecordedBody::from(&recorded));
        let order = OrderSummary {
            order_id: "o1".into(),
            currency: gbp(),
            total: minor(2646),
            adjusted: minor(-150),
            paid: minor(2646),
            refunded: minor(150),
            balance: minor(0),
            entries: [
                (EntryKind::Purchase, 2646),
                (EntryKind::Payment, -2646),
                (EntryKind::Refund, 150),
                (EntryKind::Adjustment, -150),
            ]
            .into_iter()
            .map(|(kind, n)| Entry {
                id: format!("{}:o1:r", kind.as_str()),
                kind,
                amount: minor(n),
                meta: Default::default(),
            })
            .collect(),
        };
        same(&order, &OrderBody::from(&order));
        let orders = vec![
            OrderBalance {
                order_id: "o1".into(),
                currency: Some(gbp()),
                balance: minor(5),
            },
            OrderBalance {
                order_id: "o2".into(),
                currency: None,
                balance: minor(-5),
            },
        ];
        let page = OutstandingPage {
            orders: orders.clone(),
            next: Some("o2".into()),
        };
        same(&page, &OutstandingBody::from(&page));
        let statement = Statement {
            account_id: "c1".into(),
            orders,
            totals: vec![CurrencyBalance {
                currency: gbp(),
                balance: minor(5),
            }],
        };
        same(&statement, &StatementBody::from(&statement));
    }

    /// The ledger's status and a verification's report.
    #[test]
    fn operations_bodies_answer_as_the_library_serializes() {
        let status = LedgerStatus {
            states: StateCounts {
                initial: 1,
                pending: 2,
                committed: 3,
                done: 4,
                canceling: 5,
                cancelled: 6,
            },
            oldest_open_age_s: Some(7),
            in_flight: minor(8),
            in_flight_by_currency: [("GBP".to_owned(), minor(8))].into(),
            pending_markers: 9,
            conflicts: 0,
            overdrawn: 0,
        };
        same(&status, &StatusBody::from(&status));
        let report = VerifyReport {
            ok: false,
            checks: vec![Check {
                name: "conservation".into(),
                ok: false,
                detail: "off by 1".into(),
                documents: vec!["account:a".into()],
            }],
        };
        same(&report, &VerifyBody::from(&report));
    }

    /// The fields serde expects where `text` has an unknown one (its "expected one of …").
    fn expected_fields(error: &str) -> BTreeSet<String> {
        let list = error
            .split_once("expected one of ")
            .unwrap_or_else(|| panic!("no field list in {error:?}"))
            .1;
        list.split(", ")
            .map(|f| f.trim_matches(|c: char| c == '`' || !c.is_ascii_graphic()))
            .map(|f| f.split('`').next().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_purchase_body_has_the_librarys_fields() {
        let full = json!({
            "_id": "purchase:o1", "type": "purchase", "order_id": "o1", "account_id": "c1",
            "currency": "GBP",
            "basket": [{"product_id": "A56", "title": "Adele - 25", "category": "Audio CD",
                        "price": "8.33", "tax": 0.2, "quantity": 2}],
            "delivery": {"option": "Next Day", "price": 2.99, "address": {"town": "Middlemarch"}},
            "pretax": 16.66, "tax": 0.4, "total": 20.05
        });
        // Each of the three objects, with a field neither knows: both list the same fields.
        for at in ["/", "/basket/0", "/delivery"] {
            let mut text = full.clone();
            let object = if at == "/" {
                &mut text
            } else {
                text.pointer_mut(at).unwrap()
            };
            object["zzz"] = json!(1);
            let library = Purchase::from_json(&text.to_string(), None).unwrap_err();
            let ours = serde_json::from_str::<PurchaseBody>(&text.to_string()).unwrap_err();
            assert_eq!(
                expected_fields(&ours.to_string()),
                expected_fields(&library.to_string()),
                "{at}"
            );
        }
        // A purchase with every field goes through ours to the library unchanged.
        let body: PurchaseBody = serde_json::from_str(&full.to_string()).unwrap();
        let through = serde_json::to_string(&body).unwrap();
        assert_eq!(
            Purchase::from_json(&through, None).unwrap(),
            Purchase::from_json(&full.to_string(), None).unwrap()
        );
        // The document describes the same fields.
        let schema = serde_json::to_value(PurchaseBody::schema()).unwrap();
        let described: BTreeSet<String> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let mut text = full;
        text["zzz"] = json!(1);
        let ours = serde_json::from_str::<PurchaseBody>(&text.to_string()).unwrap_err();
        assert_eq!(described, expected_fields(&ours.to_string()));
    }
}
