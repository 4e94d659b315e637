//! `GET /metrics`: Prometheus (OpenMetrics) text, every name prefixed `couch_ledger_`.
//!
//! Counted here: transfers by outcome, the sweeper's passes and failures, the service's own
//! HTTP requests, and — through the client's [`Observer`] hook — every CouchDB request, retry
//! and conflict with a latency histogram. Transfers per state, the oldest open age, money in
//! flight and pending markers are read from the views ([`Ledger::status`]) when scraped.

use std::time::Duration;

use couch_ledger::{LedgerStatus, Observer, RequestEvent, State, SweepOutcome};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Latency buckets: 1 ms doubling to about 16 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    /// The transfer's state when the call returned, or `rejected` (4xx) / `error` (5xx).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CouchLabels {
    method: String,
    /// The reply's status code, or `none` when no reply came.
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConflictLabel {
    /// `status`: a 409 reply; `bulk_document`: one document of a `_bulk_docs` reply.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    /// The route's pattern (`/v1/transfers/{id}`), never the id itself.
    route: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric of the service.
pub(crate) struct Metrics {
    registry: Registry,
    transfers: Family<OutcomeLabel, Counter>,
    transfers_by_state: Family<StateLabel, Gauge>,
    oldest_open_age_s: Gauge,
    in_flight_minor: Gauge,
    pending_markers: Gauge,
    status_up: Gauge,
    sweeper_passes: Counter,
    sweeper_pass_failures: Counter,
    sweeper_transfers: Family<ResultLabel, Counter>,
    couch_requests: Family<CouchLabels, Counter>,
    couch_retries: Counter,
    couch_conflicts: Family<ConflictLabel, Counter>,
    couch_latency: Histogram,
    http_requests: Family<HttpLabels, Counter>,
    http_latency: HistogramFamily<RouteLabel>,
    http_in_flight: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Every metric, registered with its name and help text. Long on purpose: a flat list of
    /// registrations, each a name and the sentence that says it, read top to bottom.
    pub(crate) fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("couch_ledger"),
            transfers: Family::default(),
            transfers_by_state: Family::default(),
            oldest_open_age_s: Gauge::default(),
            in_flight_minor: Gauge::default(),
            pending_markers: Gauge::default(),
            status_up: Gauge::default(),
            sweeper_passes: Counter::default(),
            sweeper_pass_failures: Counter::default(),
            sweeper_transfers: Family::default(),
            couch_requests: Family::default(),
            couch_retries: Counter::default(),
            couch_conflicts: Family::default(),
            couch_latency: latency_histogram(),
            http_requests: Family::default(),
            http_latency: Family::new_with_constructor(latency_histogram),
            http_in_flight: Gauge::default(),
        };
        let r = &mut m.registry;
        r.register(
            "transfers",
            "Transfers submitted through the service (POST /v1/transfers, reversals), by the \
             state they were in when the call returned, or rejected (4xx) / error (5xx)",
            m.transfers.clone(),
        );
        r.register(
            "transfers_by_state",
            "Transfers in the database per state (transactions/by_state), read when scraped",
            m.transfers_by_state.clone(),
        );
        r.register(
            "oldest_open_transfer_age_seconds",
            "Seconds since the oldest open transfer was last written; 0 when none is open",
            m.oldest_open_age_s.clone(),
        );
        r.register(
            "money_in_flight_minor_units",
            "Money in pending transfers, minor units over all currencies",
            m.in_flight_minor.clone(),
        );
        r.register(
            "pending_markers",
            "Pending markers held by accounts",
            m.pending_markers.clone(),
        );
        r.register(
            "status_up",
            "1 when this scrape could read the ledger's status from CouchDB, else 0 (and the \
             per-state figures are those of the last scrape that could)",
            m.status_up.clone(),
        );
        r.register(
            "sweeper_passes",
            "Sweeper passes completed",
            m.sweeper_passes.clone(),
        );
        r.register(
            "sweeper_pass_failures",
            "Sweeper passes that failed (CouchDB unreachable…); retried after a back-off",
            m.sweeper_pass_failures.clone(),
        );
        r.register(
            "sweeper_transfers",
            "Transfers the sweeper handled, by result: advanced (to done), cancelled, failed, \
             repaired_marker",
            m.sweeper_transfers.clone(),
        );
        r.register(
            "couchdb_requests",
            "HTTP requests to CouchDB (every attempt), by method and status",
            m.couch_requests.clone(),
        );
        r.register(
            "couchdb_retries",
            "Requests to CouchDB that were retries of an earlier attempt",
            m.couch_retries.clone(),
        );
        r.register(
            "couchdb_conflicts",
            "Writes CouchDB refused with a conflict: a 409 reply, or one document of a \
             _bulk_docs reply",
            m.couch_conflicts.clone(),
        );
        r.register(
            "couchdb_request_duration_seconds",
            "Latency of one attempt of a request to CouchDB, body read included",
            m.couch_latency.clone(),
        );
        r.register(
            "http_requests",
            "Requests this service answered, by method, route and status",
            m.http_requests.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "Time this service took to answer, by route",
            m.http_latency.clone(),
        );
        r.register(
            "http_requests_in_flight",
            "Requests being answered right now",
            m.http_in_flight.clone(),
        );
        m
    }

    /// A transfer call came to `outcome` (a state name, `rejected` or `error`).
    pub(crate) fn transfer(&self, outcome: &str) {
        self.transfers
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// A sweeper pass ended.
    pub(crate) fn sweep_pass(&self, pass: Result<&SweepOutcome, &couch_ledger::Error>) {
        match pass {
            Ok(o) => {
                self.sweeper_passes.inc();
                for (result, n) in [
                    ("advanced", o.advanced),
                    ("cancelled", o.cancelled),
                    ("failed", o.failed),
                    ("repaired_marker", o.repaired_markers),
                ] {
                    if n > 0 {
                        self.sweeper_transfers
                            .get_or_create(&ResultLabel {
                                result: result.to_owned(),
                            })
                            .inc_by(n);
                    }
                }
            }
            Err(_) => {
                self.sweeper_pass_failures.inc();
            }
        }
    }

    /// The ledger's status as read for this scrape; `None` when it could not be read.
    pub(crate) fn set_status(&self, status: Option<&LedgerStatus>) {
        let Some(s) = status else {
            self.status_up.set(0);
            return;
        };
        self.status_up.set(1);
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for state in State::ALL {
            self.transfers_by_state
                .get_or_create(&StateLabel {
                    state: state.as_str().to_owned(),
                })
                .set(clamp(s.states.get(state)));
        }
        self.oldest_open_age_s
            .set(clamp(s.oldest_open_age_s.unwrap_or(0)));
        self.in_flight_minor.set(s.in_flight.minor());
        self.pending_markers.set(clamp(s.pending_markers));
    }

    /// A request to this service started; the guard counts it out when dropped.
    pub(crate) fn http_started(&self) -> InFlight {
        self.http_in_flight.inc();
        InFlight(self.http_in_flight.clone())
    }

    /// A request to this service was answered.
    pub(crate) fn http_answered(&self, method: &str, route: &str, status: u16, took: Duration) {
        self.http_requests
            .get_or_create(&HttpLabels {
                method: method.to_owned(),
                route: route.to_owned(),
                status: status.to_string(),
            })
            .inc();
        self.http_latency
            .get_or_create(&RouteLabel {
                route: route.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// The text Prometheus scrapes.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Counts a request in flight until dropped (also when the client goes away mid-request).
pub(crate) struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Observer for Metrics {
    fn request(&self, event: &RequestEvent<'_>) {
        let status = event
            .status
            .map_or_else(|| "none".to_owned(), |s| s.to_string());
        self.couch_requests
            .get_or_create(&CouchLabels {
                method: event.method.to_owned(),
                status,
            })
            .inc();
        if event.attempt > 0 {
            self.couch_retries.inc();
        }
        if event.status == Some(409) {
            self.couch_conflicts
                .get_or_create(&ConflictLabel {
                    kind: "status".to_owned(),
                })
                .inc();
        }
        self.couch_latency.observe(event.elapsed.as_secs_f64());
    }

    fn bulk_conflicts(&self, count: u64) {
        self.couch_conflicts
            .get_or_create(&ConflictLabel {
                kind: "bulk_document".to_owned(),
            })
            .inc_by(count);
    }
}
