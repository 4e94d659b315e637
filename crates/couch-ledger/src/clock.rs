//! Where the ledger reads time and chance: wall-clock milliseconds (for `last_modified`, claims
//! and markers), a monotonic [`Instant`] (for leases and deadlines), and random tokens and ids.
//!
//! Monotonic time is tokio's `Instant`: the same clock as `std`'s in a running program, and one
//! a test runtime can pause and advance. Random numbers come from `fastrand`'s per-thread
//! generator, seeded unpredictably in a program. With the `testing` feature, a thread can read
//! its wall clock from that monotonic clock instead ([`testing::simulate_wall_clock`]), so a
//! simulation whose runtime is paused and whose generator is seeded replays exactly.

pub(crate) use tokio::time::Instant;

/// Wall-clock milliseconds since the Unix epoch (for `last_modified`, claims and markers; never
/// for a decision that must be monotonic — leases use [`Instant`]).
pub(crate) fn now_ms() -> i64 {
    #[cfg(feature = "testing")]
    if let Some(ms) = testing::simulated_ms() {
        return ms;
    }
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// 64 random bits.
pub(crate) fn random_u64() -> u64 {
    fastrand::u64(..)
}

/// A UUID v7 (time-ordered: the wall clock's milliseconds, then random bits), as text.
pub(crate) fn uuid_v7() -> String {
    let ms = u64::try_from(now_ms()).unwrap_or(0);
    let mut bytes = [0u8; 10];
    bytes.iter_mut().for_each(|b| *b = fastrand::u8(..));
    uuid::Builder::from_unix_timestamp_millis(ms, &bytes)
        .into_uuid()
        .to_string()
}

/// A simulated wall clock for deterministic tests (feature `testing`).
#[cfg(feature = "testing")]
pub mod testing {
    use std::cell::Cell;

    thread_local! {
        /// Epoch milliseconds and the monotonic instant they were read at.
        static SIMULATED: Cell<Option<(i64, tokio::time::Instant)>> = const { Cell::new(None) };
    }

    /// From now on, on this thread, the ledger's wall clock reads `epoch_ms` plus the time
    /// tokio's clock advanced since this call (a paused runtime's clock, in a simulation), and
    /// random numbers come from a generator seeded with `seed`. `None` goes back to the system
    /// clock (the generator stays seeded).
    pub fn simulate_wall_clock(epoch_ms: Option<i64>, seed: u64) {
        fastrand::seed(seed);
        SIMULATED.with(|s| s.set(epoch_ms.map(|ms| (ms, tokio::time::Instant::now()))));
    }

    pub(super) fn simulated_ms() -> Option<i64> {
        SIMULATED.with(|s| {
            s.get().map(|(ms, at)| {
                let passed = i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX);
                ms.saturating_add(passed)
            })
        })
    }
}
