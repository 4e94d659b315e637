//! Parsers the subcommands share for values typed on the command line: durations, currency
//! codes and amounts. Each turns text into a checked value or an error the user can act on.

use std::time::Duration;

use couch_ledger::{Amount, Currency};

/// A duration in `humantime`'s syntax: numbers with units, run together or spaced (`0s`,
/// `500ms`, `30s`, `5m`, `1h30m`, `2h 15m`; units from `ns` to `y`).
///
/// # Errors
///
/// Anything else: no unit (`5`), a negative or unknown one, a value too large.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 500ms, 30s, 1h30m"))
}

/// A currency code from the command line, in either case (`gbp` is `GBP`).
///
/// # Errors
///
/// An unknown code (invalid input).
pub(crate) fn currency(code: &str) -> couch_ledger::Result<Currency> {
    Currency::from_code(&code.to_ascii_uppercase())
}

/// A decimal amount from the command line, exactly (`6.46` → 646 in GBP).
///
/// # Errors
///
/// Not an exact decimal in the currency (invalid input).
pub(crate) fn amount(currency: Currency, text: &str) -> couch_ledger::Result<Amount> {
    currency.parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        // Every form docs/CLI.md documents, and humantime's compound forms.
        for (text, want) in [
            ("0s", Duration::ZERO),
            ("500ms", Duration::from_millis(500)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("1h30m", Duration::from_secs(5400)),
            ("1h 30m", Duration::from_secs(5400)),
            ("250ms", Duration::from_millis(250)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
        for bad in [
            "",
            "5",
            "s",
            "-1s",
            "5x",
            "1h30",
            "ms5",
            "99999999999999999999999s",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("is not a duration"), "{bad:?}: {e}");
        }
    }
}
