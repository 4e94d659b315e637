//! Progress bars (indicatif) for long work: a sweep pass over a backlog, `verify` on a big
//! database, `init` waiting for its views to build. Drawn on stderr, and only when both stdout
//! and stderr are terminals and `--json` is off: output for a script or a file never changes.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::Duration;

use couch_ledger::{Progress, ProgressHook};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar, or nothing when bars are off.
pub(crate) struct Bar(Option<ProgressBar>);

impl Bar {
    /// A bar saying `message`, of `total` units when known (a counter otherwise).
    pub(crate) fn new(json: bool, message: &'static str, total: Option<u64>) -> Bar {
        if json || !std::io::stdout().is_terminal() || !std::io::stderr().is_terminal() {
            return Bar(None);
        }
        let bar = match total {
            Some(total) => {
                ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(10))
                    .with_style(
                        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({eta} left)")
                            .expect("a valid template")
                            .progress_chars("=> "),
                    )
            }
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10))
                .with_style(
                    ProgressStyle::with_template("{spinner} {msg} {pos}")
                        .expect("a valid template"),
                ),
        };
        bar.set_message(message);
        bar.enable_steady_tick(Duration::from_millis(200));
        Bar(Some(bar))
    }

    /// Whether a bar is drawn.
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// The hook a ledger tells its progress to (`None` when bars are off).
    pub(crate) fn hook(&self) -> Option<ProgressHook> {
        let bar = self.0.clone()?;
        Some(ProgressHook(Arc::new(move |p: Progress| {
            if let Some(total) = p.total {
                bar.set_length(total);
            }
            bar.set_position(p.done);
        })))
    }

    /// Sets how many units are done.
    pub(crate) fn set(&self, done: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(done);
        }
    }

    /// Removes the bar, so the command's output follows as without one.
    pub(crate) fn finish(self) {
        if let Some(bar) = self.0 {
            bar.finish_and_clear();
        }
    }
}
