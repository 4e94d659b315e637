//! The library's logs of the whole run, captured for R6 and for a person chasing a failure.

use std::sync::{Arc, Mutex, OnceLock};

/// A `tracing` writer into a shared buffer: R6 searches everything the library logged.
#[derive(Clone, Default)]
pub struct LogBuffer(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

static LOGS: OnceLock<LogBuffer> = OnceLock::new();

/// Installs, once and before any callsite is hit, a global subscriber that records the
/// library's logs (debug and up) for the whole run. Global, so that every thread of the
/// multi-threaded runtime logs into it and no callsite's interest is cached as "never"
/// (the caveat in tests/http_faults.rs `credentials_never_appear_in_logs`).
pub fn capture_logs() -> LogBuffer {
    LOGS.get_or_init(|| {
        let logs = LogBuffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "couch_ledger=debug,reqwest=debug,hyper=info,warn",
            ))
            .with_ansi(false)
            .with_writer(logs.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        logs
    })
    .clone()
}
