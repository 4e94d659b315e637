//! `GET /v1/events`: the ledger's events (docs/EVENTS.md). A caller that asks for
//! `text/event-stream` gets Server-Sent Events, one `event:` a ledger event with its cursor as
//! the SSE `id`, resumed with `Last-Event-ID` (or `?after=`), the stream held open and new
//! events sent as they come until the caller leaves or the service stops. Any other caller gets
//! one page as JSON, to be asked again with its `cursor`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::{HeaderMap, ACCEPT};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use couch_ledger::{EventCursor, EventKind, EventPage, EventQuery, Ledger, LedgerEvent};
use futures_util::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;
use utoipa::{IntoParams, ToSchema};

use super::api::ErrorBody;
use super::error::ApiError;
use super::extract::QueryParams;
use super::schema::{AnyValue, EventCursorText};
use super::{page_limit, AppState};

// The attributes below must spell these limits as literals.
const _: () = assert!(couch_ledger::EVENTS_LIMIT_MAX == 1000);
const _: () = assert!(couch_ledger::EVENTS_LIMIT_DEFAULT == 100);

/// How long the stream waits for a new event before it asks the feed again.
const STREAM_WAIT: Duration = Duration::from_secs(25);
/// A comment line this often keeps proxies from closing a quiet stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /v1/events?after=&types=&limit=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsParams {
    /// Start after this event: its `cursor` (an SSE client's `Last-Event-ID` wins over it).
    /// Without it, from the ledger's first event.
    #[param(value_type = Option<EventCursorText>)]
    pub(crate) after: Option<String>,
    /// Only these types, comma-separated (`transfer.done,order.settled`).
    #[param(
        pattern = "^(transfer\\.(done|cancelled|reversed)|(payment|refund|adjustment)\\.recorded|order\\.(settled|unsettled)|account\\.(created|overdrawn))(,(transfer\\.(done|cancelled|reversed)|(payment|refund|adjustment)\\.recorded|order\\.(settled|unsettled)|account\\.(created|overdrawn)))*$"
    )]
    pub(crate) types: Option<String>,
    /// At most this many events in a JSON page [default: 100]; an SSE stream ignores it.
    #[param(minimum = 1, maximum = 1000, value_type = Option<u64>)]
    pub(crate) limit: Option<usize>,
}

/// One event (as `couch-ledger events` prints it).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventBody {
    /// Stable: the same fact delivered twice carries the same id.
    pub(crate) id: String,
    /// `transfer.done`, `transfer.cancelled`, `transfer.reversed`, `payment.recorded`,
    /// `refund.recorded`, `adjustment.recorded`, `order.settled`, `order.unsettled`,
    /// `account.created` or `account.overdrawn`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// Resume after this event: pass it as `after` (or `Last-Event-ID`).
    #[schema(value_type = EventCursorText)]
    pub(crate) cursor: String,
    /// When it happened, ms since the epoch (docs/EVENTS.md says which time each type has).
    pub(crate) time: i64,
    /// The document's facts: a transfer as `GET /v1/transfers/{id}` with `decided_at`; an
    /// entry; an order's balance before and after the entry; an account.
    #[schema(value_type = AnyValue)]
    pub(crate) data: Value,
}

impl From<&LedgerEvent> for EventBody {
    fn from(e: &LedgerEvent) -> EventBody {
        EventBody {
            id: e.id.clone(),
            kind: e.kind.as_str().to_owned(),
            cursor: e.cursor.to_string(),
            time: e.time,
            data: serde_json::to_value(&e.data).unwrap_or(Value::Null),
        }
    }
}

/// A page of events, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventPageBody {
    /// The events.
    pub(crate) events: Vec<EventBody>,
    /// Pass as `after` for the next page (it moves past changes that made no event asked for).
    #[schema(value_type = EventCursorText)]
    pub(crate) cursor: String,
}

impl From<&EventPage> for EventPageBody {
    fn from(p: &EventPage) -> EventPageBody {
        EventPageBody {
            events: p.events.iter().map(EventBody::from).collect(),
            cursor: p.cursor.to_string(),
        }
    }
}

impl EventsParams {
    fn query(&self, last_event_id: Option<&str>) -> Result<EventQuery, ApiError> {
        let limit = page_limit(
            self.limit,
            couch_ledger::EVENTS_LIMIT_DEFAULT,
            couch_ledger::EVENTS_LIMIT_MAX,
        )?;
        let after = match last_event_id.or(self.after.as_deref()) {
            Some(text) => EventCursor::parse(text)
                .map_err(|e| ApiError::invalid(Some("after"), e.to_string()))?,
            None => EventCursor::start(),
        };
        let kinds = match self.types.as_deref() {
            Some(types) => Some(
                types
                    .split(',')
                    .map(EventKind::parse)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| ApiError::invalid(Some("types"), e.to_string()))?,
            ),
            None => None,
        };
        Ok(EventQuery {
            after,
            limit,
            kinds,
            wait: None,
        })
    }
}

/// The ledger's events: a JSON page, or with `Accept: text/event-stream` a Server-Sent Events
/// stream that stays open (each event's SSE `id` is its cursor; reconnect with
/// `Last-Event-ID`).
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "listEvents",
    tag = "events",
    params(EventsParams),
    responses(
        (status = 200, description = "A page of events, oldest first; or, asked with `Accept: text/event-stream`, the stream of them", content(
            (EventPageBody = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 400, description = "A bad cursor, type or limit (`invalid_input`)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    QueryParams(params): QueryParams<EventsParams>,
) -> Response {
    let wants_stream = headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty());
    let query = match params.query(if wants_stream { last_event_id } else { None }) {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    if wants_stream {
        let events = stream_of(state.ledger.clone(), query, state.stop.clone());
        return Sse::new(events)
            .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
            .into_response();
    }
    match state.ledger.events(&query).await {
        Ok(page) => Json(EventPageBody::from(&page)).into_response(),
        Err(e) => ApiError::from_ledger(&e, || "no events".to_owned()).into_response(),
    }
}

/// Where a stream is: what it read and has not sent yet, and where to read on from.
struct Streaming {
    ledger: Ledger,
    query: EventQuery,
    ready: VecDeque<LedgerEvent>,
    stop: watch::Receiver<bool>,
    ended: bool,
}

/// The events after `query.after`, then each new one as it comes, until `stop` (the service
/// stopping) or a failed read, which ends the stream with an `error` event; the client
/// reconnects with its `Last-Event-ID`.
fn stream_of(
    ledger: Ledger,
    mut query: EventQuery,
    stop: watch::Receiver<bool>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    query.limit = couch_ledger::EVENTS_LIMIT_MAX;
    query.wait = Some(STREAM_WAIT);
    let start = Streaming {
        ledger,
        query,
        ready: VecDeque::new(),
        stop,
        ended: false,
    };
    stream::unfold(start, |mut s| async move {
        loop {
            if s.ended || *s.stop.borrow() {
                return None;
            }
            if let Some(event) = s.ready.pop_front() {
                let body = EventBody::from(&event);
                let data = serde_json::to_string(&body).unwrap_or_default();
                let sse = SseEvent::default()
                    .id(body.cursor)
                    .event(body.kind)
                    .data(data);
                return Some((Ok(sse), s));
            }
            let mut stop = s.stop.clone();
            let read = tokio::select! {
                read = s.ledger.events(&s.query) => read,
                _ = stop.wait_for(|stop| *stop) => return None,
            };
            match read {
                Ok(page) => {
                    s.query.after = page.cursor;
                    s.ready.extend(page.events);
                }
                Err(e) => {
                    s.ended = true;
                    let message = serde_json::json!({
                        "error": "unavailable",
                        "message": format!("reading the events failed ({e}); reconnect with Last-Event-ID"),
                    });
                    let sse = SseEvent::default().event("error").data(message.to_string());
                    return Some((Ok(sse), s));
                }
            }
        }
    })
}
