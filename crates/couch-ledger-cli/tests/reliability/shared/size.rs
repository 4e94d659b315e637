//! How big a run is: CI size, or long (`RELIABILITY_LONG=1`).

use std::time::Duration;

/// How big a run is.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub long: bool,
    /// New transfers R1 asks for (at least).
    pub r1_transfers: u64,
    /// At the long size, R1 goes on until every fail point fired this often.
    pub r1_hits_per_point: u64,
    /// R1 stops asking for new work after this long whatever the counts.
    pub r1_time_max: Duration,
    /// EUR accounts in R1.
    pub r1_accounts: usize,
    /// R2: how long processes are killed and restarted.
    pub r2_soak: Duration,
    /// R3: server kills.
    pub r3_restarts: u32,
    /// R4: new transfers through the fault proxy.
    pub r4_transfers: u64,
    /// R1 on the trio: new transfers asked for (one round).
    pub trio_r1_transfers: u64,
    /// R1 on the trio stops asking for new work after this long.
    pub trio_r1_time_max: Duration,
    /// R2 on the trio: how long processes are killed and restarted.
    pub trio_r2_soak: Duration,
}

impl Size {
    pub fn from_env() -> Size {
        let long = std::env::var("RELIABILITY_LONG").is_ok_and(|v| !v.is_empty() && v != "0");
        if long {
            Size {
                long,
                r1_transfers: 10_000,
                r1_hits_per_point: 100,
                r1_time_max: Duration::from_secs(45 * 60),
                r1_accounts: 48,
                r2_soak: Duration::from_secs(180),
                r3_restarts: 10,
                r4_transfers: 2_000,
                trio_r1_transfers: 2_000,
                trio_r1_time_max: Duration::from_secs(15 * 60),
                trio_r2_soak: Duration::from_secs(120),
            }
        } else {
            Size {
                long,
                r1_transfers: 1_000,
                r1_hits_per_point: 0,
                // Caps for a stuck run, not a pace: the rounds end at their counts, and a
                // loaded machine takes longer rather than falling short (r1_trio once ended
                // with 298 documents for 300 asked, its 90 s gone before the round that tops
                // up what killed workers left unwritten, beside a build).
                r1_time_max: Duration::from_secs(360),
                r1_accounts: 16,
                r2_soak: Duration::from_secs(40),
                r3_restarts: 3,
                r4_transfers: 300,
                trio_r1_transfers: 300,
                trio_r1_time_max: Duration::from_secs(180),
                trio_r2_soak: Duration::from_secs(20),
            }
        }
    }
}
