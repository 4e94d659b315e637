//! What a run is asked for (`BENCH_*`) and the server it runs against.

use anyhow::{anyhow, bail, ensure, Context as _, Result};

use crate::devserver::DevServer;
use crate::figures::FIGURES;

pub struct Settings {
    /// Multiplies rounds and queries (`BENCH_SCALE`).
    pub scale: f64,
    pub big: bool,
    pub huge: bool,
    /// Only these figures (`BENCH_ONLY`, comma-separated keys), for working on one figure;
    /// `None`: all of them. The plot needs every single-write figure.
    pub only: Option<Vec<String>>,
    /// The layout of every ledger the transfer figures use (`BENCH_LAYOUT`, `split` by
    /// default): `split` keeps accounts and transfers in a second database without validation
    /// (`LedgerBuilder::hot_database`, docs/LAYOUT.md), `single` keeps everything in the one
    /// validated database.
    pub layout: Layout,
}

/// Where a bench ledger keeps its accounts and transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Single,
    Split,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Single => "single",
            Layout::Split => "split",
        }
    }
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        let scale = match std::env::var("BENCH_SCALE") {
            Ok(s) if !s.is_empty() => s
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| anyhow!("BENCH_SCALE={s:?}: expected a positive number"))?,
            _ => 1.0,
        };
        let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1" || v == "true");
        let only = std::env::var("BENCH_ONLY")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| {
                let mut keys: Vec<String> = s.split(',').map(|k| k.trim().to_owned()).collect();
                // The transfer figures divide by what p3 measured.
                // p9 is shown beside p8, measured in the same run.
                if keys.iter().any(|k| k == "p9") && !keys.iter().any(|k| k == "p8") {
                    keys.push("p8".to_owned());
                }
                let transfers = ["p4_p5", "p6", "p8"];
                if keys.iter().any(|k| transfers.contains(&k.as_str())) {
                    keys.push("p3".to_owned());
                }
                keys
            });
        if let Some(keys) = &only {
            for key in keys {
                ensure!(
                    FIGURES.iter().any(|f| f.key == key),
                    "BENCH_ONLY: no figure {key:?}"
                );
            }
        }
        let layout = match std::env::var("BENCH_LAYOUT").as_deref() {
            Ok("single") => Layout::Single,
            Ok("split") | Ok("") | Err(_) => Layout::Split,
            Ok(other) => bail!("BENCH_LAYOUT={other:?}: expected split or single"),
        };
        Ok(Settings {
            scale,
            big: flag("BENCH_BIG"),
            huge: flag("BENCH_HUGE"),
            only,
            layout,
        })
    }

    /// `count` scaled, at least 1.
    pub fn scaled(&self, count: usize) -> usize {
        ((count as f64 * self.scale).round() as usize).max(1)
    }
}

/// The server under test.
pub struct Server {
    /// Without credentials and without a trailing slash.
    pub url: String,
    pub credentials: Option<(String, String)>,
    /// Kept for its lifetime: dropping it stops the server.
    pub dev: Option<DevServer>,
}

impl Server {
    pub fn from_env() -> Result<Server> {
        let url = match std::env::var("COUCHDB_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => {
                let dev = DevServer::start().context("start pouchdb-server")?;
                return Ok(Server {
                    url: dev.url(),
                    credentials: None,
                    dev: Some(dev),
                });
            }
        };
        let mut parsed = url::Url::parse(&url).context("COUCHDB_URL")?;
        let mut credentials = std::env::var("COUCHDB_USER")
            .ok()
            .filter(|u| !u.is_empty())
            .map(|u| (u, std::env::var("COUCHDB_PASSWORD").unwrap_or_default()));
        if !parsed.username().is_empty() {
            // Credentials in the URL, as the library accepts them; never printed.
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            credentials.get_or_insert_with(|| {
                let password = decode(parsed.password().unwrap_or(""));
                (decode(parsed.username()), password)
            });
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
        }
        Ok(Server {
            url: parsed.as_str().trim_end_matches('/').to_owned(),
            credentials,
            dev: None,
        })
    }
}
