//! What a run leaves: the table on stdout, with a line on how it was measured, and
//! `results.json` with every figure, every round, the machine, its load and the server.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::bench::Bench;
use crate::figures::PENDING_FIGURES;
use crate::p4_p5_concurrent::TRANSFER_ROUNDS;
use crate::p6_sweeper::{P6_RAW_ROUNDS_EACH_SIDE, P6_TRANSFERS};
use crate::p8_batched::P8_ROUNDS;
use crate::p9_serve::P9_ROUNDS;
use crate::row::Row;
use crate::sizes::{
    BALANCE_QUERIES_PER_ROUND, BULK_ROUNDS, LATENCY_ROUNDS, WRITE_ROUNDS, WRITE_ROUNDS_C1,
};

pub fn thousands(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

pub fn print_table(rows: &[Row]) {
    println!(
        "\n{:<13} {:<46} {:>10} {:>10} {:>9} {:>7} {:>6} {:>8} {:>5}",
        "figure", "what", "ours", "raw", "unit", "ratio", "±95%", "goal", "met?"
    );
    println!("{}", "-".repeat(122));
    for row in rows {
        let goal = row.goal.map_or("-".to_owned(), |g| g.to_string());
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        let raw = if row.count {
            "-".to_owned()
        } else {
            format!("{:.1}", row.raw)
        };
        println!(
            "{:<13} {:<46} {:>10.1} {:>10} {:>9} {:>7.3} {:>6.3} {:>8} {:>5}",
            row.key, row.title, row.ours, raw, row.unit, row.ratio, row.ratio_ci95, goal, met
        );
    }
    println!(
        "\nclient CPU per operation, µs (this process, the harness's share included and alike \
         for every side; the server is another process):"
    );
    for row in rows.iter().filter(|r| !r.client_cpu_us_per_op.is_empty()) {
        let cpu = &row.client_cpu_us_per_op;
        let shown = |column: &str| {
            cpu.get(column)
                .map_or("?".to_owned(), |us| format!("{us:.0}"))
        };
        println!(
            "  {:<13} {:>6} vs raw {:>6}",
            row.key,
            shown("ours"),
            shown("raw")
        );
    }
    for row in rows.iter().filter(|r| r.note.is_some()) {
        println!("  {}: {}", row.key, row.note.as_deref().unwrap_or_default());
    }
}

/// How the ratios were measured, and the run's time and load.
pub fn print_summary(bench: &Bench, elapsed: Duration, load_start: Option<&str>) {
    println!(
        "ratio = median over rounds of ours ÷ raw measured back to back (rounds per side: c1 {}, \
         c4-c64 {}, p2 {}, latency {LATENCY_ROUNDS} x {} queries, p4/p5 {}, p8 {}; p6: one \
         sweeper pass of {}, bracketed by {} raw rounds)\nmeasured in {:.0} s, load average {} → {}",
        bench.settings.scaled(WRITE_ROUNDS_C1),
        bench.settings.scaled(WRITE_ROUNDS),
        bench.settings.scaled(BULK_ROUNDS),
        bench.settings.scaled(BALANCE_QUERIES_PER_ROUND),
        bench.settings.scaled(TRANSFER_ROUNDS),
        bench.settings.scaled(P8_ROUNDS),
        bench.settings.scaled(P6_TRANSFERS),
        2 * P6_RAW_ROUNDS_EACH_SIDE,
        elapsed.as_secs_f64(),
        load_start.unwrap_or("?"),
        load_average().as_deref().unwrap_or("?")
    );
}

/// What the run knows about the machine: its load at the start and at the end tells a reader
/// how much else was running.
pub struct MachineLoad {
    pub start: Option<String>,
    pub end: Option<String>,
}

pub fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// `pouchdb-server 4.2.0`, `Apache CouchDB 3.4.3`, … from the server's welcome document.
pub fn server_name(welcome: &Value) -> String {
    let version = welcome
        .get("version")
        .and_then(Value::as_str)
        .unwrap_or("?");
    let product = if welcome.get("express-pouchdb").is_some() {
        "pouchdb-server"
    } else if welcome.get("couchdb").is_some() {
        welcome
            .pointer("/vendor/name")
            .and_then(Value::as_str)
            .unwrap_or("CouchDB")
    } else {
        "a CouchDB-protocol server"
    };
    format!("{product} {version}")
}

pub fn results_json(
    bench: &Bench,
    rows: &[Row],
    server_info: &Value,
    load: &MachineLoad,
    elapsed: Duration,
) -> Value {
    let mut top = serde_json::Map::new();
    for row in rows.iter().filter(|r| r.goal.is_some()) {
        top.insert(row.key.clone(), json!(row.ratio));
    }
    let figures: serde_json::Map<String, Value> = rows
        .iter()
        .map(|r| {
            (
                r.key.clone(),
                serde_json::to_value(r).expect("a row serializes"),
            )
        })
        .collect();
    let measured = bench.measured.lock().expect("lock");
    top.insert(
        "details".to_owned(),
        json!({
            "date": utc_now(),
            "duration_s": elapsed.as_secs_f64(),
            "rounds_per_side": {
                "writes_c1": bench.settings.scaled(WRITE_ROUNDS_C1),
                "writes": bench.settings.scaled(WRITE_ROUNDS),
                "bulk": bench.settings.scaled(BULK_ROUNDS),
                "latency": LATENCY_ROUNDS,
                "p4_p5": bench.settings.scaled(TRANSFER_ROUNDS),
                "p8": bench.settings.scaled(P8_ROUNDS),
                "p9": bench.settings.scaled(P9_ROUNDS),
                "p6_raw": 2 * P6_RAW_ROUNDS_EACH_SIDE,
            },
            "p6_stuck_transfers": bench.settings.scaled(P6_TRANSFERS),
            "method": "ours and raw alternate in short rounds in one run; ratio = median of the rounds' ours/raw ratios; ours/raw = each side's median",
            "scale": bench.settings.scale,
            "server": {
                "name": server_name(server_info),
                "url": bench.server.url,
                "started_by_bench": bench.server.dev.is_some(),
                "welcome": server_info,
            },
            "machine": {
                "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
                "cpu": cpu_model(),
                "os": std::env::consts::OS,
                "arch": std::env::consts::ARCH,
                "load_average_1_5_15m": {"start": load.start, "end": load.end},
                "nice": nice(),
            },
            "figures": figures,
            "single_writes_by_concurrency": measured.write_points,
            "transfer_cost": measured.transfer_cost,
            "transfers_by_concurrency": measured.transfer_points,
            "transfer_bulk_limits": measured.bulk_limits,
            "not_yet_measured": PENDING_FIGURES
                .iter()
                .filter(|key| rows.iter().all(|r| r.key != **key))
                .collect::<Vec<_>>(),
        }),
    );
    Value::Object(top)
}

/// This process's nice value (the server, its child, inherits it): a run at a higher priority
/// than the other work on the machine is steadier, and should say so.
pub fn nice() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split_whitespace().nth(16)?.parse().ok()
}

pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

/// `YYYY-MM-DDTHH:MM:SSZ` now (the library's RFC 3339 writer, whole seconds).
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    couch_ledger::format_time_ms(secs * 1000).replace(".000Z", "Z")
}

pub fn output_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("bench")
}
