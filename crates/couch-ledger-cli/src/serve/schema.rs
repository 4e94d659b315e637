//! The parts of the OpenAPI document that many operations share: constrained scalars (ids, free
//! text, currency codes, amounts), each built from the library's own limits so that the schema
//! and the checks behind it cannot drift apart, and the error answers every operation shares
//! ([`SharedAnswers`]).
//!
//! None of them carries an example: a tool that builds requests from examples (schemathesis's
//! examples phase) would combine one scalar's example across fields that must differ (`from`
//! and `to`); the request bodies carry whole examples instead.
//!
//! A pattern here is read by two regex engines: ECMA-262 (JSON Schema's, what generated clients
//! and validators use) and Python's `re` (what schemathesis draws values with). Each is written to
//! mean the same in both: character classes and alternations only, no look-around.

use std::borrow::Cow;

use couch_ledger::limits::ID_CHARS_MAX;
use couch_ledger::{
    Currency, AMOUNT_ABS_MAX, EVENT_CURSOR_CHARS_MAX, HISTORY_CURSOR_CHARS_MAX,
    META_CURSOR_CHARS_MAX, META_KEYS_MAX, META_KEY_CHARS_MAX, META_VALUE_CHARS_MAX, TEXT_LEN_MAX,
    TIME_FORMS, TIME_MS_DIGITS_MAX,
};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{
    AnyOfBuilder, KnownFormat, ObjectBuilder, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder, Schema};
use utoipa::{Modify, PartialSchema, ToSchema};

/// The characters `char::is_control` refuses (Unicode's Cc), inside a character class.
const CONTROL: &str = r"\x00-\x1f\x7f-\x9f";
/// White space as `str::trim` sees it (Unicode's White_Space), inside a character class.
const WHITE_SPACE: &str = r"\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";

/// The pattern of [`Id`]: the library's `check_id_part` (no control character, no `:`, no `_`
/// first, no white space at either end); the length is the schema's `maxLength`.
pub(crate) fn id_pattern() -> String {
    format!("^[^_:{CONTROL}{WHITE_SPACE}](?:[^:{CONTROL}]*[^:{CONTROL}{WHITE_SPACE}])?$")
}

/// The pattern of [`IdempotencyKey`]: an [`Id`] that an HTTP header can carry, which is visible
/// ASCII and the space (`HeaderValue::to_str`).
const IDEMPOTENCY_KEY_PATTERN: &str = "^[!-9;-^`-~](?:[ -9;-~]*[!-9;-~])?$";

/// A decimal in the purchase's string form, as `Currency::parse` reads it: digits, a `.` and
/// decimals optionally, a `+` optionally; `-` only before a zero (a negative amount is refused).
const DECIMAL_PATTERN: &str = r"^(?:\+?[0-9]+(?:\.[0-9]+)?|-0+(?:\.0+)?)$";

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

fn integer(minimum: i64, maximum: i64) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(minimum as f64))
        .maximum(Some(maximum as f64))
}

fn reference<T: ToSchema>() -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(T::name()))
}

/// Declares a named schema (a component) built by `$schema`.
macro_rules! component {
    ($(#[$doc:meta])* $name:ident, $schema:expr) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                $schema
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

component!(
    /// An account, transfer or order id, or an entry's reference.
    Id,
    string()
        .min_length(Some(1))
        .max_length(Some(ID_CHARS_MAX))
        .pattern(Some(id_pattern()))
        .description(Some(format!(
            "An id: 1 to {ID_CHARS_MAX} characters, no control character, no `:` (it separates \
             the parts of a ledger document's id), not beginning with `_` (CouchDB reserves it), \
             no white space at either end."
        )))
        .into()
);

component!(
    /// A transfer's id as the `Idempotency-Key` header carries it.
    IdempotencyKey,
    string()
        .min_length(Some(1))
        .max_length(Some(ID_CHARS_MAX))
        .pattern(Some(IDEMPOTENCY_KEY_PATTERN))
        .description(Some(
            "A transfer id (see `Id`) in a header: visible ASCII and inner spaces, no `:`, not \
             beginning with `_`.",
        ))
        .into()
);

component!(
    /// Free text: a method, reason, carrier, title…
    Text,
    string()
        .max_length(Some(TEXT_LEN_MAX))
        .pattern(Some(format!("^[^{CONTROL}]*$")))
        .description(Some(format!(
            "Free text: at most {TEXT_LEN_MAX} characters, no control character."
        )))
        .into()
);

component!(
    /// A basket item's product id: free text, not empty.
    ProductId,
    string()
        .min_length(Some(1))
        .max_length(Some(TEXT_LEN_MAX))
        .pattern(Some(format!("^[^{CONTROL}]*$")))
        .description(Some(format!(
            "1 to {TEXT_LEN_MAX} characters, no control character."
        )))
        .into()
);

/// Every code `Currency::from_code` takes: ISO 4217's, less those without a minor unit.
fn currency_codes() -> Vec<&'static str> {
    let letters = b'A'..=b'Z';
    let mut codes = Vec::new();
    for a in letters.clone() {
        for b in letters.clone() {
            for c in letters.clone() {
                let code = [a, b, c];
                let text = std::str::from_utf8(&code).expect("ASCII letters");
                if let Ok(currency) = Currency::from_code(text) {
                    codes.push(currency.code());
                }
            }
        }
    }
    codes
}

component!(
    /// A currency as the service writes it.
    CurrencyCode,
    string()
        .enum_values(Some(currency_codes()))
        .description(Some(
            "An ISO-4217 code, upper case, of a currency with a minor unit.",
        ))
        .into()
);

component!(
    /// A currency as the service reads it: a [`CurrencyCode`] in any case.
    CurrencyCodeAnyCase,
    AnyOfBuilder::new()
        .item(reference::<CurrencyCode>())
        .item(
            string().pattern(Some(format!(
                "^(?:{})$",
                currency_codes()
                    .iter()
                    .map(|code| code
                        .chars()
                        .map(|c| format!("[{c}{}]", c.to_ascii_lowercase()))
                        .collect::<String>())
                    .collect::<Vec<_>>()
                    .join("|")
            )))
        )
        .description(Some("A `CurrencyCode` in any case (`GBP`, `gbp`)."))
        .into()
);

component!(
    /// An amount in minor units.
    MinorUnits,
    integer(-AMOUNT_ABS_MAX, AMOUNT_ABS_MAX)
        .description(Some(
            "An amount in minor units (646 = 6.46 GBP), |x| ≤ 2^53 − 1.",
        ))
        .into()
);

component!(
    /// An amount in minor units, greater than zero.
    PositiveMinorUnits,
    integer(1, AMOUNT_ABS_MAX)
        .description(Some(
            "An amount in minor units, 1 to 2^53 − 1.",
        ))
        .into()
);

component!(
    /// A signed amount in minor units, not zero.
    NonZeroMinorUnits,
    AnyOfBuilder::new()
        .item(integer(1, AMOUNT_ABS_MAX))
        .item(integer(-AMOUNT_ABS_MAX, -1))
        .description(Some(
            "A signed amount in minor units, not zero, |x| ≤ 2^53 − 1.",
        ))
        .into()
);

component!(
    /// A purchase's amount: a decimal in the currency's units.
    Decimal,
    AnyOfBuilder::new()
        .item(string().pattern(Some(DECIMAL_PATTERN)))
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .minimum(Some(0.0)),
        )
        .description(Some(
            "A decimal in the currency's units, not negative, as a JSON number written without \
             an exponent (`8.33`) or as a string (`\"8.33\"`); parsed exactly, never through \
             floating point. It may have at most as many decimals as the currency's minor unit \
             (2 for GBP, 0 for JPY) and be at most 2^53 − 1 minor units.",
        ))
        .into()
);

component!(
    /// A basket item's quantity.
    Quantity,
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(1.0))
        .maximum(Some(f64::from(u32::MAX)))
        .description(Some("A whole number, 1 to 2^32 − 1."))
        .into()
);

component!(
    /// Any JSON value.
    AnyValue,
    ObjectBuilder::new()
        .schema_type(SchemaType::AnyValue)
        .description(Some("Any JSON value, kept as given."))
        .into()
);

component!(
    /// `outstanding=true`, the one listing of orders there is.
    OutstandingOnly,
    ObjectBuilder::new()
        .schema_type(Type::Boolean)
        .enum_values(Some([true]))
        .description(Some("`true`: the orders whose balance is not zero."))
        .into()
);

/// The pattern of [`Time`]: `parse_time_ms`'s two forms, each date one that exists.
pub(crate) fn time_pattern() -> String {
    let year = "[0-9]{4}";
    let leap = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)";
    let month_day = "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])\
        |(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
    let clock = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?";
    let zone = "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    format!(
        "^(?:[0-9]{{1,{TIME_MS_DIGITS_MAX}}}|(?:{year}-{month_day}|{leap}-02-29)[Tt ]{clock}{zone})$"
    )
}

component!(
    /// A time: RFC 3339 or epoch milliseconds.
    Time,
    string()
        .pattern(Some(time_pattern()))
        .description(Some(format!(
            "A time: {TIME_FORMS}. Digits after the seconds are cut to the millisecond."
        )))
        .into()
);

component!(
    /// Where a reader of the ledger's events is.
    EventCursorText,
    string()
        .min_length(Some(3))
        .max_length(Some(EVENT_CURSOR_CHARS_MAX))
        .pattern(Some(
            "^[0-9A-Za-z_-]+(\\.[0-9]+\\.[0-9a-f]{8})?~[0-9A-Za-z_-]+(\\.[0-9]+\\.[0-9a-f]{8})?$",
        ))
        .description(Some(
            "An event's `cursor` (or a page's), passed back as it is; never built or read by a \
             caller (its form may change).",
        ))
        .into()
);

component!(
    /// Where a page of an account's history goes on.
    HistoryCursorText,
    string()
        .min_length(Some(3))
        .max_length(Some(HISTORY_CURSOR_CHARS_MAX))
        .pattern(Some(format!(
            "^[0-9]{{1,{TIME_MS_DIGITS_MAX}}}\\.[^{CONTROL}]+$"
        )))
        .description(Some(
            "The `next` of a page of an account's history, passed back as it is; never built \
             or read by a caller (its form may change).",
        ))
        .into()
);

/// Metadata's keys and values, `min_keys` to `max_keys` of them.
fn meta_object(min_keys: usize, max_keys: usize) -> ObjectBuilder {
    let key = string()
        .min_length(Some(1))
        .max_length(Some(META_KEY_CHARS_MAX))
        .pattern(Some(format!("^[A-Za-z0-9_-]{{1,{META_KEY_CHARS_MAX}}}$")));
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(key))
        .additional_properties(Some(reference::<MetaValue>()))
        .min_properties(Some(min_keys))
        .max_properties(Some(max_keys))
}

component!(
    /// One value of metadata.
    MetaValue,
    string()
        .min_length(Some(1))
        .max_length(Some(META_VALUE_CHARS_MAX))
        .pattern(Some(format!("^[^{CONTROL}]+$")))
        .description(Some(format!(
            "1 to {META_VALUE_CHARS_MAX} characters, none of them a control character."
        )))
        .into()
);

component!(
    /// Metadata: string keys to string values.
    Meta,
    meta_object(0, META_KEYS_MAX)
        .description(Some(format!(
            "What the creator attached: at most {META_KEYS_MAX} keys of 1 to \
             {META_KEY_CHARS_MAX} characters of `A-Z a-z 0-9 _ -`, each to a string. Written \
             once with the document and returned with it; not a term, so the same id sent \
             again with other metadata keeps the first's."
        )))
        .into()
);

component!(
    /// One key and value to find transfers by.
    MetaFilter,
    meta_object(1, 1)
        .description(Some(
            "Exactly one key and its value: `?meta[KEY]=VALUE`, or as well `?meta.KEY=VALUE`.",
        ))
        .into()
);

component!(
    /// Where a page of transfers found by their metadata goes on.
    MetaCursorText,
    string()
        .min_length(Some(3))
        .max_length(Some(META_CURSOR_CHARS_MAX))
        .pattern(Some(format!(
            "^[0-9]{{1,{TIME_MS_DIGITS_MAX}}}\\.[^{CONTROL}]+$"
        )))
        .description(Some(
            "The `next` of a page of transfers, passed back as it is; never built or read by \
             a caller (its form may change).",
        ))
        .into()
);

/// Every component above. Derived `ToSchema` collects those a body names itself, not those
/// only a parameter or another component names.
pub(crate) fn components() -> Vec<(String, RefOr<Schema>)> {
    fn named<T: ToSchema>() -> (String, RefOr<Schema>) {
        (T::name().into_owned(), T::schema())
    }
    vec![
        named::<Id>(),
        named::<IdempotencyKey>(),
        named::<Text>(),
        named::<ProductId>(),
        named::<CurrencyCode>(),
        named::<CurrencyCodeAnyCase>(),
        named::<MinorUnits>(),
        named::<PositiveMinorUnits>(),
        named::<NonZeroMinorUnits>(),
        named::<Decimal>(),
        named::<Quantity>(),
        named::<AnyValue>(),
        named::<OutstandingOnly>(),
        named::<Time>(),
        named::<HistoryCursorText>(),
        named::<EventCursorText>(),
        named::<MetaValue>(),
        named::<Meta>(),
        named::<MetaFilter>(),
        named::<MetaCursorText>(),
    ]
}

// ---- answers every operation shares ---------------------------------------------------------

/// Adds to every operation the error answers it can give without saying so itself: 401 on
/// `/v1` (API keys), 413 where it reads a body, and the 5xx of a CouchDB that is unreachable,
/// busy, refuses us or answers garbage. Each is a named response in `components.responses`.
pub(crate) struct SharedAnswers;

/// `(status, component name, description)` of the shared answers.
const UNAUTHORIZED: (&str, &str, &str) = (
    "401",
    "Unauthorized",
    "API keys are configured and the request has none of them (`unauthorized`); \
     `WWW-Authenticate: Bearer`",
);
const TOO_LARGE: (&str, &str, &str) = (
    "413",
    "TooLarge",
    "The body is over 1 MiB (`too_large`); nothing written",
);
const INTERNAL: (&str, &str, &str) = (
    "500",
    "Internal",
    "A fault of the service (`internal`); a transfer's answer names its `id`: send it again \
     to learn where it stands",
);
const BAD_GATEWAY: (&str, &str, &str) = (
    "502",
    "BadGateway",
    "CouchDB refused the service's credentials (`couchdb_refused`) or answered what it cannot \
     read (`bad_gateway`)",
);
const UNAVAILABLE: (&str, &str, &str) = (
    "503",
    "Unavailable",
    "CouchDB unreachable (`couchdb_unavailable`), the database missing (`not_ready`), the \
     same documents kept changing under the write (`busy`), a transfer's decision on some \
     copies of a cluster only (`unconfirmed`), or a transfer not decided within its lease \
     (`undecided`, the sweeper finishes it); `Retry-After` says when to try again. Sending the \
     same id or ref again never applies it twice",
);

impl SharedAnswers {
    fn error(description: &str) -> ResponseBuilder {
        ResponseBuilder::new().description(description).content(
            "application/json",
            Content::new(Some(RefOr::Ref(Ref::from_schema_name("ErrorBody")))),
        )
    }

    fn add(operation: &mut Operation, (status, name, _): (&str, &str, &str)) {
        operation
            .responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::Ref(Ref::from_response_name(name)));
    }
}

impl Modify for SharedAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let seconds = || {
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0.0))
                .into()
        };
        let unauthorized = Self::error(UNAUTHORIZED.2).header(
            "WWW-Authenticate",
            HeaderBuilder::new()
                .schema(string())
                .description(Some("`Bearer`"))
                .build(),
        );
        let unavailable = Self::error(UNAVAILABLE.2).header(
            "Retry-After",
            HeaderBuilder::new()
                .schema::<RefOr<Schema>>(seconds())
                .description(Some("Seconds to wait before trying again"))
                .build(),
        );
        for (name, response) in [
            (UNAUTHORIZED.1, unauthorized),
            (TOO_LARGE.1, Self::error(TOO_LARGE.2)),
            (INTERNAL.1, Self::error(INTERNAL.2)),
            (BAD_GATEWAY.1, Self::error(BAD_GATEWAY.2)),
            (UNAVAILABLE.1, unavailable),
        ] {
            components
                .responses
                .insert(name.to_owned(), RefOr::T(response.build()));
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            let v1 = path.starts_with("/v1/");
            // The operator's endpoints that ask CouchDB nothing cannot fail.
            let asks_couchdb = v1 || path == "/readyz";
            for operation in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                if v1 {
                    Self::add(operation, UNAUTHORIZED);
                }
                if operation.request_body.is_some() {
                    Self::add(operation, TOO_LARGE);
                }
                if asks_couchdb {
                    Self::add(operation, INTERNAL);
                    Self::add(operation, BAD_GATEWAY);
                    Self::add(operation, UNAVAILABLE);
                }
            }
        }
    }
}

// ---- links: where an answer's values lead ---------------------------------------------------

/// Adds OpenAPI links to the answers whose values name what other operations take: the account
/// or transfer just written, the order a purchase opened. A generated client or a stateful test
/// follows them instead of guessing from field names.
pub(crate) struct Links;

/// `(operation, statuses, link name, target operation, parameters)`.
type LinkSpec = (
    &'static str,
    &'static [&'static str],
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const WRITTEN: &[&str] = &["200", "201"];
const TRANSFER_ID: &[(&str, &str)] = &[("id", "$response.body#/id")];
const ORDER_ID: &[(&str, &str)] = &[("order_id", "$request.path.order_id")];

const LINKS: &[LinkSpec] = &[
    (
        "createAccount",
        WRITTEN,
        "account",
        "getAccount",
        &[("id", "$response.body#/account")],
    ),
    (
        "createTransfer",
        WRITTEN,
        "transfer",
        "getTransfer",
        TRANSFER_ID,
    ),
    (
        "createTransfer",
        WRITTEN,
        "cancel",
        "cancelTransfer",
        TRANSFER_ID,
    ),
    (
        "createTransfer",
        WRITTEN,
        "reverse",
        "reverseTransfer",
        TRANSFER_ID,
    ),
    (
        "cancelTransfer",
        &["200"],
        "transfer",
        "getTransfer",
        TRANSFER_ID,
    ),
    (
        "reverseTransfer",
        WRITTEN,
        "reversal",
        "getTransfer",
        TRANSFER_ID,
    ),
    ("putPurchase", WRITTEN, "order", "getOrder", ORDER_ID),
    ("putPurchase", WRITTEN, "payment", "recordPayment", ORDER_ID),
    ("putPurchase", WRITTEN, "refund", "recordRefund", ORDER_ID),
    (
        "putPurchase",
        WRITTEN,
        "adjustment",
        "recordAdjustment",
        ORDER_ID,
    ),
    (
        "putPurchase",
        WRITTEN,
        "shipment",
        "recordShipment",
        ORDER_ID,
    ),
    (
        "putPurchase",
        WRITTEN,
        "delivery",
        "recordDelivery",
        ORDER_ID,
    ),
    (
        "putPurchase",
        WRITTEN,
        "statement",
        "getCustomerStatement",
        &[("account_id", "$request.body#/account_id")],
    ),
];

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let mut linked = 0;
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.get, &mut item.put, &mut item.post]
                .into_iter()
                .flatten()
            {
                let id = operation.operation_id.clone().unwrap_or_default();
                for (_, statuses, name, target, parameters) in
                    LINKS.iter().filter(|(source, ..)| *source == id)
                {
                    for status in *statuses {
                        let Some(RefOr::T(response)) =
                            operation.responses.responses.get_mut(*status)
                        else {
                            panic!("{id} has no {status} answer of its own to link from");
                        };
                        let link = parameters
                            .iter()
                            .fold(LinkBuilder::new().operation_id(*target), |b, (p, v)| {
                                b.parameter(*p, *v)
                            })
                            .build();
                        response.links.insert((*name).to_owned(), RefOr::T(link));
                        linked += 1;
                    }
                }
            }
        }
        let expected: usize = LINKS.iter().map(|(_, statuses, ..)| statuses.len()).sum();
        assert_eq!(
            linked, expected,
            "a link names an operation that is not there"
        );
    }
}

/// The document as JSON text. utoipa 5.5 writes a link's fields in snake case (`operation_id`),
/// where OpenAPI's are camel case (`operationId`) and tools pass over the others: they are
/// renamed here.
pub(crate) fn document_json(doc: &utoipa::openapi::OpenApi) -> String {
    let mut value = serde_json::to_value(doc).expect("the OpenAPI document serializes");
    let operations = value
        .get_mut("paths")
        .and_then(serde_json::Value::as_object_mut)
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(serde_json::Value::as_object_mut)
        .flat_map(|item| item.values_mut());
    for operation in operations {
        let responses = operation
            .get_mut("responses")
            .and_then(serde_json::Value::as_object_mut)
            .into_iter()
            .flat_map(|responses| responses.values_mut());
        for response in responses {
            let links = response
                .get_mut("links")
                .and_then(serde_json::Value::as_object_mut)
                .into_iter()
                .flat_map(|links| links.values_mut())
                .filter_map(serde_json::Value::as_object_mut);
            for link in links {
                for (snake, camel) in [
                    ("operation_id", "operationId"),
                    ("operation_ref", "operationRef"),
                    ("request_body", "requestBody"),
                ] {
                    if let Some(v) = link.remove(snake) {
                        link.insert(camel.to_owned(), v);
                    }
                }
            }
        }
    }
    serde_json::to_string_pretty(&value).expect("a JSON value serializes")
}
