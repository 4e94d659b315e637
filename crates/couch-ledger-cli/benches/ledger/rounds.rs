//! Running work: jobs at a concurrency, steady rates, interleaved rounds of the sides, CPU
//! time, and the statistics of the rounds.

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::task::JoinSet;

use crate::bench::Side;

/// Runs job `(w, i)` for every `i` in `jobs`, at most `concurrency` at a time: worker `w` of
/// `concurrency` takes the next index from a shared counter. Returns when each job finished,
/// in order. The first error ends the run.
pub async fn run_concurrently<F, Fut>(
    jobs: Range<usize>,
    concurrency: usize,
    job: F,
) -> Result<Vec<Instant>>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    assert!(concurrency > 0);
    let next = Arc::new(AtomicUsize::new(jobs.start));
    let end = jobs.end;
    let mut workers = JoinSet::new();
    for w in 0..concurrency.min(jobs.len()) {
        let (next, job) = (next.clone(), job.clone());
        workers.spawn(async move {
            let mut finished = Vec::new();
            // Bounded: every turn takes a fresh index, and indices stop at `end`.
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, anyhow::Error>(finished);
                }
                job(w, i).await?;
                finished.push(Instant::now());
            }
        });
    }
    let mut finished = Vec::with_capacity(jobs.len());
    while let Some(worker) = workers.join_next().await {
        finished.extend(worker??); // on an error, dropping `workers` aborts the others
    }
    finished.sort();
    Ok(finished)
}

/// Jobs needed for a steady-state measurement of `timed` jobs at `concurrency`.
pub fn jobs_for_steady_rate(timed: usize, concurrency: usize) -> usize {
    timed + 2 * concurrency - 1
}

/// Jobs per second while all `concurrency` workers were busy: from the `concurrency`-th
/// completion to the `concurrency`-th from last, so that neither the ramp-up (connections
/// starting together) nor the ramp-down (the last requests running with fewer beside them)
/// counts. Measured this way a short round gives the rate of a long one.
pub fn steady_rate(finished: &[Instant], concurrency: usize) -> f64 {
    assert!(
        finished.len() >= 2 * concurrency,
        "too few jobs for a steady rate"
    );
    let (first, last) = (concurrency - 1, finished.len() - concurrency);
    (last - first) as f64 / (finished[last] - finished[first]).as_secs_f64()
}

/// Each side's figure per round, and the CPU time this process (and, with
/// `BENCH_SERVER_PID`, the server's process) spent on each side.
pub struct Interleaved {
    pub figures: BTreeMap<Side, Vec<f64>>,
    pub cpu: BTreeMap<Side, Duration>,
    pub server_cpu: BTreeMap<Side, Duration>,
}

impl Interleaved {
    /// `side`'s client CPU time per operation in µs, when the platform tells CPU time.
    pub fn cpu_us_per_op(&self, side: Side, ops: usize) -> Option<f64> {
        let cpu = self.cpu.get(&side)?;
        Some(cpu.as_secs_f64() * 1e6 / ops as f64)
    }

    /// `side`'s server CPU time per operation in µs, when `BENCH_SERVER_PID` names the
    /// server's process on this machine.
    pub fn server_cpu_us_per_op(&self, side: Side, ops: usize) -> Option<f64> {
        let cpu = self.server_cpu.get(&side)?;
        Some(cpu.as_secs_f64() * 1e6 / ops as f64)
    }
}

/// CPU time (user + system) the server's process has used so far, when `BENCH_SERVER_PID`
/// names it (a server on this machine: CouchDB's `beam.smp`, or pouchdb-server's node), from
/// `/proc/<pid>/stat` (clock ticks of 10 ms: enough over a round of a second or more).
pub fn server_cpu() -> Option<Duration> {
    let pid = std::env::var("BENCH_SERVER_PID").ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok()?;
    // The fields after the command, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Measures every side once per round, rotating which side goes first, so that drift of the
/// machine or the server hits all sides alike.
pub async fn interleaved<F, Fut>(
    sides: &[Side],
    rounds: usize,
    mut measure: F,
) -> Result<Interleaved>
where
    F: FnMut(Side, usize) -> Fut,
    Fut: Future<Output = Result<f64>>,
{
    let mut figures: BTreeMap<Side, Vec<f64>> = BTreeMap::new();
    let mut cpu: Option<BTreeMap<Side, Duration>> = Some(BTreeMap::new());
    let mut server: BTreeMap<Side, Duration> = BTreeMap::new();
    for round in 0..rounds {
        for k in 0..sides.len() {
            let side = sides[(round + k) % sides.len()];
            let cpu_before = process_cpu();
            let server_before = server_cpu();
            let value = measure(side, round)
                .await
                .with_context(|| format!("{} round {round}", side.name()))?;
            figures.entry(side).or_default().push(value);
            // Only this process's client work: the server is another process.
            let used = cpu_before
                .zip(process_cpu())
                .and_then(|(before, after)| after.checked_sub(before));
            cpu = cpu.zip(used).map(|(mut cpu, used)| {
                *cpu.entry(side).or_default() += used;
                cpu
            });
            if let Some(used) = server_before
                .zip(server_cpu())
                .and_then(|(before, after)| after.checked_sub(before))
            {
                *server.entry(side).or_default() += used;
            }
        }
    }
    Ok(Interleaved {
        figures,
        cpu: cpu.unwrap_or_default(),
        server_cpu: server,
    })
}

/// CPU time this process has used so far, all threads, from the scheduler's per-thread
/// accounting (nanoseconds, unlike the 10 ms ticks of `/proc/self/stat`); `None` off Linux.
pub fn process_cpu() -> Option<Duration> {
    let mut total_ms = 0.0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let sched = std::fs::read_to_string(task.ok()?.path().join("sched")).ok()?;
        let line = sched
            .lines()
            .find(|l| l.starts_with("se.sum_exec_runtime"))?;
        total_ms += line.split(':').nth(1)?.trim().parse::<f64>().ok()?;
    }
    Some(Duration::from_secs_f64(total_ms / 1e3))
}

/// Half-width of an approximate 95 % confidence interval of the median of `values`: the
/// median's standard error is about 1.25 σ / √n, with σ estimated robustly as IQR / 1.35.
pub fn median_ci95(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let iqr = sorted[3 * n / 4] - sorted[n / 4];
    1.96 * 1.2533 * (iqr / 1.349) / (n as f64).sqrt()
}

pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty());
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

pub fn mean(values: &[f64]) -> f64 {
    assert!(!values.is_empty());
    values.iter().sum::<f64>() / values.len() as f64
}

/// Each round's `a ÷ b`.
pub fn ratios(samples: &Interleaved, a: Side, b: Side) -> Vec<f64> {
    samples.figures[&a]
        .iter()
        .zip(&samples.figures[&b])
        .map(|(a, b)| a / b)
        .collect()
}

/// The `q`-quantile of `values` (nearest rank).
pub fn quantile(values: &[f64], q: f64) -> f64 {
    assert!(!values.is_empty());
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
