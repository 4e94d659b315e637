//! Money: integer minor units and ISO-4217 currencies. No floating point anywhere.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The largest magnitude an amount may have: CouchDB and JavaScript read numbers as doubles,
/// which hold integers exactly only up to 2^53 − 1.
pub const AMOUNT_ABS_MAX: i64 = (1 << 53) - 1;

/// The most digits [`plain_decimal`] spells out: an amount needs at most 16, and a few more
/// decimals; a JSON number such as `1e999999` is refused rather than written in full.
const PLAIN_DIGITS_MAX: usize = 64;

/// A JSON number's text (RFC 8259: `-12`, `66.0`, `1e3`, `8.33E-1`) spelled without an exponent
/// and without the zeros that do not change its value (`-12`, `66`, `1000`, `0.833`; zero is
/// `0`). JSON Schema reads a number by its value, so `66.0` is an integer there; callers that
/// read JSON numbers exactly pass them through this first.
///
/// `None` for text that is not a JSON number, or whose plain spelling would need more than
/// `PLAIN_DIGITS_MAX` (64) digits.
///
/// ```
/// use couch_ledger::plain_decimal;
/// assert_eq!(plain_decimal("66.0").as_deref(), Some("66"));
/// assert_eq!(plain_decimal("8.33e1").as_deref(), Some("83.3"));
/// assert_eq!(plain_decimal("-2.50E-2").as_deref(), Some("-0.025"));
/// assert_eq!(plain_decimal("1e999999"), None);
/// assert_eq!(plain_decimal("0x10"), None);
/// ```
pub fn plain_decimal(text: &str) -> Option<String> {
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (rest, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // JSON's grammar: no leading zero but in `0` itself, decimals after a point.
    if !all_digits(whole) || (whole.len() > 1 && whole.starts_with('0')) {
        return None;
    }
    if mantissa.contains('.') && !all_digits(fraction) {
        return None;
    }
    let exponent: i64 = match exponent {
        None => 0,
        Some(e) => {
            let (sign, digits) = match e.as_bytes().first() {
                Some(b'-') => (-1, &e[1..]),
                Some(b'+') => (1, &e[1..]),
                _ => (1, e),
            };
            if !all_digits(digits) {
                return None;
            }
            // Past 18 digits an exponent would overflow; no such number has a short spelling
            // unless it is zero, which is told apart below without it.
            let magnitude: i64 = if digits.len() <= 18 {
                digits.parse().ok()?
            } else {
                i64::MAX / 4
            };
            sign * magnitude
        }
    };
    let mut significant = format!("{whole}{fraction}");
    let leading = significant.bytes().take_while(|&b| b == b'0').count();
    if leading == significant.len() {
        return Some("0".to_owned());
    }
    // The value is 0.<significant> × 10^point: the point sits `point` digits into it.
    let mut point = whole.len() as i64 + exponent;
    significant.drain(..leading);
    point -= leading as i64;
    let trailing = significant.bytes().rev().take_while(|&b| b == b'0').count();
    significant.truncate(significant.len() - trailing);
    let count = significant.len() as i64;
    let spelled = point.max(count) + (-point).max(0);
    if spelled > PLAIN_DIGITS_MAX as i64 {
        return None;
    }
    let zeros = |n: i64| "0".repeat(usize::try_from(n).unwrap_or(0));
    let plain = if point <= 0 {
        format!("0.{}{significant}", zeros(-point))
    } else if point >= count {
        format!("{significant}{}", zeros(point - count))
    } else {
        let (before, after) = significant.split_at(point as usize);
        format!("{before}.{after}")
    };
    Some(if negative { format!("-{plain}") } else { plain })
}

/// An amount in minor units (cents), `|amount| ≤ 2^53 − 1`. Arithmetic is checked: an overflow
/// or a result out of range is an error, never a wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct Amount(i64);

impl Amount {
    /// Zero.
    pub const ZERO: Amount = Amount(0);

    /// An amount of `minor` units.
    ///
    /// # Errors
    ///
    /// `|minor| > 2^53 − 1`.
    pub fn new(minor: i64) -> Result<Amount> {
        if minor.checked_abs().is_none_or(|a| a > AMOUNT_ABS_MAX) {
            return Err(Error::invalid(
                "amount",
                format!("{minor} is beyond ±(2^53 − 1) minor units"),
            ));
        }
        Ok(Amount(minor))
    }

    /// Minor units.
    pub fn minor(self) -> i64 {
        self.0
    }

    /// `self + other`, checked.
    ///
    /// # Errors
    ///
    /// The sum is out of range.
    pub fn checked_add(self, other: Amount) -> Result<Amount> {
        self.0
            .checked_add(other.0)
            .ok_or_else(|| Error::invalid("amount", "sum overflows"))
            .and_then(Amount::new)
    }

    /// `self − other`, checked.
    ///
    /// # Errors
    ///
    /// The difference is out of range.
    pub fn checked_sub(self, other: Amount) -> Result<Amount> {
        self.0
            .checked_sub(other.0)
            .ok_or_else(|| Error::invalid("amount", "difference overflows"))
            .and_then(Amount::new)
    }

    /// `self × n`, checked.
    ///
    /// # Errors
    ///
    /// The product is out of range.
    pub fn checked_mul(self, n: i64) -> Result<Amount> {
        self.0
            .checked_mul(n)
            .ok_or_else(|| Error::invalid("amount", "product overflows"))
            .and_then(Amount::new)
    }

    /// `−self`: always in range, because the bound is symmetric. An inherent method rather
    /// than `std::ops::Neg` so money code reads `amount.neg()` with no trait import.
    #[allow(clippy::should_implement_trait)]
    pub fn neg(self) -> Amount {
        Amount(-self.0)
    }

    /// Greater than zero.
    pub fn is_positive(self) -> bool {
        self.0 > 0
    }

    /// Below zero.
    pub fn is_negative(self) -> bool {
        self.0 < 0
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Amount, D::Error> {
        // A JSON number with a fraction or exponent (2.5, 1e3) is refused here rather than
        // rounded: money read back from the server is asserted to be exact.
        let minor = i64::deserialize(d)?;
        Amount::new(minor).map_err(serde::de::Error::custom)
    }
}

/// An ISO-4217 currency, with its number of minor-unit digits.
///
/// The codes and their minor units are ISO 4217's own list as the `iso_currency` crate keeps
/// it (every active code, and superseded ones a ledger may still hold), not a table of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency {
    code: &'static str,
    exponent: u8,
}

/// The most minor-unit digits a currency may have. ISO 4217's largest is 4 (CLF, UYW); the
/// bound keeps `10^exponent` far from overflowing an `i64` whatever the list says.
const EXPONENT_MAX: u8 = 9;

impl Currency {
    /// Looks up an ISO-4217 code (upper case, as written in documents).
    ///
    /// Codes for which ISO 4217 defines no minor unit — precious metals (XAU, XAG, XPT, XPD),
    /// SDR (XDR), the bond-market units (XBA…XBD), testing (XTS) and "no currency" (XXX) — are
    /// refused rather than given a guessed exponent: a wrong one would misstate every amount by
    /// a power of ten, and none of them is money a shop takes.
    ///
    /// # Errors
    ///
    /// A code that is not in ISO 4217, or one with no minor unit.
    pub fn from_code(code: &str) -> Result<Currency> {
        let iso = iso_currency::Currency::from_code(code).ok_or_else(|| {
            Error::invalid("currency", format!("{code:?} is not an ISO-4217 code"))
        })?;
        let exponent = iso
            .exponent()
            .and_then(|e| u8::try_from(e).ok())
            .filter(|&e| e <= EXPONENT_MAX)
            .ok_or_else(|| {
                Error::invalid(
                    "currency",
                    format!(
                        "{code:?} ({}) has no minor unit in ISO 4217, so amounts in it cannot \
                         be kept exactly",
                        iso.name()
                    ),
                )
            })?;
        Ok(Currency {
            code: iso.code(),
            exponent,
        })
    }

    /// The three-letter code.
    pub fn code(self) -> &'static str {
        self.code
    }

    /// Digits after the decimal point (2 for EUR, 0 for JPY, 3 for KWD).
    pub fn exponent(self) -> u8 {
        self.exponent
    }

    /// Parses a decimal amount in this currency's units (`"6.46"` → 646 for EUR) exactly.
    /// Accepts an optional leading `-` or `+`, digits, and at most `exponent` decimals;
    /// refuses exponents (`1e3`), thousands separators, and extra decimals (`6.465`).
    ///
    /// # Errors
    ///
    /// Anything else, or an amount out of range.
    pub fn parse(self, text: &str) -> Result<Amount> {
        let bad = |why: &str| Error::invalid("amount", format!("{text:?}: {why}"));
        let (negative, digits) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let (whole, fraction) = match digits.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (digits, None),
        };
        let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(whole) {
            return Err(bad(
                "not a decimal number (digits, optionally a '.' and decimals)",
            ));
        }
        let fraction = fraction.unwrap_or("");
        if !fraction.is_empty() && !all_digits(fraction) {
            return Err(bad(
                "not a decimal number (digits, optionally a '.' and decimals)",
            ));
        }
        if digits.ends_with('.') {
            return Err(bad("a '.' must be followed by decimals"));
        }
        if fraction.len() > usize::from(self.exponent) {
            return Err(bad(&format!(
                "{} allows {} decimal places",
                self.code, self.exponent
            )));
        }
        let scale = 10i64.pow(u32::from(self.exponent));
        let mut minor: i64 = 0;
        for b in whole.bytes() {
            minor = minor
                .checked_mul(10)
                .and_then(|m| m.checked_add(i64::from(b - b'0')))
                .ok_or_else(|| bad("too large"))?;
        }
        minor = minor.checked_mul(scale).ok_or_else(|| bad("too large"))?;
        let mut frac_value: i64 = 0;
        for b in fraction.bytes() {
            frac_value = frac_value * 10 + i64::from(b - b'0');
        }
        for _ in fraction.len()..usize::from(self.exponent) {
            frac_value *= 10;
        }
        minor = minor
            .checked_add(frac_value)
            .ok_or_else(|| bad("too large"))?;
        if negative {
            minor = -minor;
        }
        Amount::new(minor).map_err(|_| bad("beyond ±(2^53 − 1) minor units"))
    }

    /// Formats an amount in this currency's units (646 → `"6.46"`).
    pub fn format(self, amount: Amount) -> String {
        let minor = amount.minor();
        if self.exponent == 0 {
            return minor.to_string();
        }
        let scale = 10u64.pow(u32::from(self.exponent));
        let abs = minor.unsigned_abs();
        let sign = if minor < 0 { "-" } else { "" };
        format!(
            "{sign}{}.{:0width$}",
            abs / scale,
            abs % scale,
            width = usize::from(self.exponent)
        )
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code)
    }
}

impl Serialize for Currency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.code)
    }
}

impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Currency, D::Error> {
        let code = String::deserialize(d)?;
        Currency::from_code(&code).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_decimal_reads_a_json_number_by_its_value() {
        for (text, plain) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.000e7", "0"),
            ("0e99999999999999999999", "0"),
            ("12", "12"),
            ("-12", "-12"),
            ("66.0", "66"),
            ("66.500", "66.5"),
            ("1e3", "1000"),
            ("1E+3", "1000"),
            ("1.5e1", "15"),
            ("8.33e0", "8.33"),
            ("8.33e-1", "0.833"),
            ("-2.50E-2", "-0.025"),
            ("0.00100", "0.001"),
            ("120e-1", "12"),
            ("9007199254740991", "9007199254740991"),
            ("9.007199254740991e15", "9007199254740991"),
        ] {
            assert_eq!(plain_decimal(text).as_deref(), Some(plain), "{text}");
        }
        for text in [
            "",
            "-",
            "+1",
            "01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "0x10",
            "1_000",
            " 1",
            "1 ",
            "\"1\"",
            "NaN",
            "1e64",
            "1e-65",
            "1e99999999999999999999",
        ] {
            assert_eq!(plain_decimal(text), None, "{text}");
        }
        assert_eq!(plain_decimal("1e63").map(|p| p.len()), Some(64));
        assert_eq!(plain_decimal("1e-64").map(|p| p.len()), Some(66));
    }

    fn gbp() -> Currency {
        Currency::from_code("GBP").unwrap()
    }

    #[test]
    fn parses_decimals_exactly() {
        assert_eq!(gbp().parse("6.46").unwrap().minor(), 646);
        assert_eq!(gbp().parse("20").unwrap().minor(), 2000);
        assert_eq!(gbp().parse("20.0").unwrap().minor(), 2000);
        assert_eq!(gbp().parse("0.2").unwrap().minor(), 20);
        assert_eq!(gbp().parse("-3.5").unwrap().minor(), -350);
        assert_eq!(gbp().parse("+1.01").unwrap().minor(), 101);
        assert_eq!(
            Currency::from_code("JPY")
                .unwrap()
                .parse("1500")
                .unwrap()
                .minor(),
            1500
        );
        assert_eq!(
            Currency::from_code("KWD")
                .unwrap()
                .parse("1.234")
                .unwrap()
                .minor(),
            1234
        );
    }

    #[test]
    fn refuses_what_is_not_exact() {
        for bad in [
            "6.465", "abc", "1e3", "", "-", ".5", "5.", "1,000", " 1", "1 ", "0x10", "--1",
            "1.2.3", "NaN", "inf",
        ] {
            let e = gbp().parse(bad).unwrap_err();
            assert!(e.is_invalid_input(), "{bad}: {e}");
        }
        assert!(Currency::from_code("JPY").unwrap().parse("1.5").is_err());
        assert!(gbp().parse("90071992547409.92").is_err());
        assert!(gbp().parse("99999999999999999999999").is_err());
        assert_eq!(
            gbp().parse("90071992547409.91").unwrap().minor(),
            AMOUNT_ABS_MAX
        );
    }

    #[test]
    fn formats_back() {
        assert_eq!(gbp().format(Amount::new(2646).unwrap()), "26.46");
        assert_eq!(gbp().format(Amount::new(-5).unwrap()), "-0.05");
        assert_eq!(
            Currency::from_code("JPY")
                .unwrap()
                .format(Amount::new(7).unwrap()),
            "7"
        );
    }

    #[test]
    fn arithmetic_is_checked() {
        let max = Amount::new(AMOUNT_ABS_MAX).unwrap();
        assert!(max.checked_add(Amount::new(1).unwrap()).is_err());
        assert!(max.neg().checked_sub(Amount::new(1).unwrap()).is_err());
        assert!(Amount::new(i64::MIN).is_err());
        assert_eq!(max.checked_sub(max).unwrap(), Amount::ZERO);
    }

    #[test]
    fn unknown_currency_is_refused() {
        assert!(Currency::from_code("XXX").is_err());
        assert!(Currency::from_code("gbp").is_err());
    }

    /// Every ISO-4217 code with its minor unit: a code, an amount as typed, and the minor
    /// units it is (`None`: refused as invalid input).
    #[test]
    fn iso_4217_table() {
        let cases: &[(&str, &str, Option<i64>)] = &[
            // Refused by the old hand table; ISO 4217 codes with 2 decimals.
            ("BDT", "1.23", Some(123)),
            ("GHS", "10.5", Some(1050)),
            ("BDT", "1.234", None),
            // Three decimals.
            ("BHD", "1.234", Some(1234)),
            ("BHD", "1.2345", None),
            ("KWD", "0.001", Some(1)),
            // No minor unit.
            ("JPY", "15", Some(15)),
            ("JPY", "1.5", None),
            ("JPY", "15.", None),
            // Four (Chile's Unidad de Fomento).
            ("CLF", "1.2345", Some(12345)),
            // Two.
            ("EUR", "6.46", Some(646)),
            ("EUR", "6.465", None),
        ];
        for &(code, text, want) in cases {
            let currency = Currency::from_code(code).unwrap_or_else(|e| panic!("{code}: {e}"));
            assert_eq!(currency.code(), code);
            match (currency.parse(text), want) {
                (Ok(got), Some(want)) => assert_eq!(got.minor(), want, "{code} {text}"),
                (Err(e), None) => assert!(e.is_invalid_input(), "{code} {text}: {e}"),
                (got, want) => panic!("{code} {text}: got {got:?}, want {want:?}"),
            }
        }
        // Exponents, and formatting back.
        for (code, exponent, minor, shown) in [
            ("BDT", 2, 123, "1.23"),
            ("BHD", 3, 1234, "1.234"),
            ("JPY", 0, 15, "15"),
            ("EUR", 2, 646, "6.46"),
        ] {
            let c = Currency::from_code(code).unwrap();
            assert_eq!(c.exponent(), exponent, "{code}");
            assert_eq!(c.format(Amount::new(minor).unwrap()), shown, "{code}");
        }
        // Not ISO 4217, or not upper case as documents write it.
        for code in ["ZZZ", "", "EU", "EURO", "eur", "Eur", " EUR"] {
            let e = Currency::from_code(code).unwrap_err();
            assert!(e.is_invalid_input(), "{code:?}: {e}");
        }
        // ISO codes with no minor unit (metals, SDR, testing, "no currency") are refused, not
        // given a guessed exponent.
        for code in ["XAU", "XAG", "XPT", "XPD", "XDR", "XTS", "XXX", "XBA"] {
            let e = Currency::from_code(code).unwrap_err();
            assert!(e.is_invalid_input(), "{code}: {e}");
            assert!(e.to_string().contains("no minor unit"), "{code}: {e}");
        }
    }

    /// Every code the ledger accepted before `iso_currency` still has the exponent it had, so
    /// documents already written read back as the same amounts.
    #[test]
    fn codes_known_before_keep_their_exponent() {
        let before: &[(&str, u8)] = &[
            ("AED", 2),
            ("ARS", 2),
            ("AUD", 2),
            ("BGN", 2),
            ("BHD", 3),
            ("BRL", 2),
            ("CAD", 2),
            ("CHF", 2),
            ("CLP", 0),
            ("CNY", 2),
            ("COP", 2),
            ("CZK", 2),
            ("DKK", 2),
            ("EGP", 2),
            ("EUR", 2),
            ("GBP", 2),
            ("HKD", 2),
            ("HUF", 2),
            ("IDR", 2),
            ("ILS", 2),
            ("INR", 2),
            ("ISK", 0),
            ("JOD", 3),
            ("JPY", 0),
            ("KES", 2),
            ("KRW", 0),
            ("KWD", 3),
            ("MAD", 2),
            ("MXN", 2),
            ("MYR", 2),
            ("NGN", 2),
            ("NOK", 2),
            ("NZD", 2),
            ("OMR", 3),
            ("PEN", 2),
            ("PHP", 2),
            ("PKR", 2),
            ("PLN", 2),
            ("QAR", 2),
            ("RON", 2),
            ("RSD", 2),
            ("SAR", 2),
            ("SEK", 2),
            ("SGD", 2),
            ("THB", 2),
            ("TND", 3),
            ("TRY", 2),
            ("TWD", 2),
            ("UAH", 2),
            ("USD", 2),
            ("UYU", 2),
            ("VND", 0),
            ("ZAR", 2),
        ];
        for &(code, exponent) in before {
            assert_eq!(
                Currency::from_code(code).unwrap().exponent(),
                exponent,
                "{code}"
            );
        }
    }

    #[test]
    fn amounts_read_from_json_must_be_integers() {
        assert!(serde_json::from_str::<Amount>("2.5").is_err());
        assert!(serde_json::from_str::<Amount>("1e3").is_err());
        assert_eq!(serde_json::from_str::<Amount>("646").unwrap().minor(), 646);
        assert!(serde_json::from_str::<Amount>("9007199254740992").is_err());
    }
}
