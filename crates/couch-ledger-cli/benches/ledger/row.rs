//! A measured figure, ours against raw, with its goal.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::bench::Side;
use crate::rounds::{mean, median, median_ci95, Interleaved};

/// A measured figure: ours against raw, and their ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub key: String,
    pub title: String,
    pub unit: &'static str,
    /// The median of ours (of couch_rs in the couch_rs rows).
    pub ours: f64,
    /// The median of raw.
    pub raw: f64,
    /// The median of the rounds' ratios `ours ÷ raw`.
    pub ratio: f64,
    /// Half the width of an approximate 95 % confidence interval of `ratio`, from the spread
    /// of the rounds' ratios: a goal missed by less than this is not a clear miss.
    pub ratio_ci95: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<Goal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
    /// Each round's figure per side, and each round's ratio, in the order measured.
    pub rounds: BTreeMap<&'static str, Vec<f64>>,
    /// This process's CPU time per operation (µs) on each side: the client's own cost, which on
    /// a machine shared with the server is taken from the server.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub client_cpu_us_per_op: BTreeMap<&'static str, f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A figure that is a count, not a ratio (`raw` = 1, `ratio` = `ours`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub count: bool,
}

impl Row {
    /// A figure that is a count or a size, not a ratio to raw: `ours` (and `ratio`) is the mean
    /// of `values`, `raw` is 1.
    pub fn count(key: &str, title: String, unit: &'static str, values: &[f64]) -> Row {
        let n = values.len() as f64;
        let mean = mean(values);
        let spread = if values.len() > 1 {
            let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
            1.96 * variance.sqrt() / n.sqrt()
        } else {
            0.0
        };
        Row {
            key: key.to_owned(),
            title,
            unit,
            ours: mean,
            raw: 1.0,
            ratio: mean,
            ratio_ci95: spread,
            goal: None,
            met: None,
            rounds: BTreeMap::from([("ours", values.to_vec())]),
            client_cpu_us_per_op: BTreeMap::new(),
            note: None,
            count: true,
        }
    }

    /// `ours[r]` and `raw[r]` were measured in the same round.
    pub fn new(key: &str, title: String, unit: &'static str, ours: &[f64], raw: &[f64]) -> Row {
        assert_eq!(
            ours.len(),
            raw.len(),
            "{key}: one figure per side per round"
        );
        assert!(
            raw.iter().all(|r| *r > 0.0),
            "{key}: raw figures must be positive"
        );
        let ratios: Vec<f64> = ours.iter().zip(raw).map(|(o, r)| o / r).collect();
        Row {
            key: key.to_owned(),
            title,
            unit,
            ours: median(ours),
            raw: median(raw),
            ratio: median(&ratios),
            ratio_ci95: median_ci95(&ratios),
            goal: None,
            met: None,
            rounds: BTreeMap::from([
                ("ours", ours.to_vec()),
                ("raw", raw.to_vec()),
                ("ratio", ratios),
            ]),
            note: None,
            client_cpu_us_per_op: BTreeMap::new(),
            count: false,
        }
    }

    /// Records the client CPU per operation of the row's two sides.
    pub fn cpu(mut self, samples: &Interleaved, sides: [Side; 2], ops: usize) -> Row {
        for (column, side) in ["ours", "raw"].into_iter().zip(sides) {
            if let Some(us) = samples.cpu_us_per_op(side, ops) {
                self.client_cpu_us_per_op.insert(column, us);
            }
        }
        self
    }

    pub fn goal(mut self, goal: Option<Goal>) -> Row {
        self.met = goal.map(|g| g.met(self.ratio));
        self.goal = goal;
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Row {
        self.note = Some(note.into());
        self
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    AtLeast(f64),
    AtMost(f64),
}

impl Goal {
    pub fn met(self, ratio: f64) -> bool {
        match self {
            Goal::AtLeast(min) => ratio >= min,
            Goal::AtMost(max) => ratio <= max,
        }
    }
}

impl std::fmt::Display for Goal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Goal::AtLeast(min) => write!(f, ">= {min:.2}"),
            Goal::AtMost(max) => write!(f, "<= {max:.2}"),
        }
    }
}
