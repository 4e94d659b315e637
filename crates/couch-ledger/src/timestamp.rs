//! Instants as people and programs write them: RFC 3339 (`2025-11-22T08:00:00Z`, with an offset
//! or fractions of a second) or milliseconds since the Unix epoch (`1763798400000`), read into
//! the epoch milliseconds every ledger document stores, and written back as RFC 3339 in UTC.
//!
//! Hand-written rather than a date crate: the ledger needs these two forms and nothing of time
//! zones or calendars beyond the proleptic Gregorian day count.

use crate::error::{Error, Result};
use crate::money::AMOUNT_ABS_MAX;

/// The furthest instant from 1970 a time may be, either way, in epoch milliseconds: 2^53 − 1,
/// the largest integer a JavaScript view function (and every JSON reader that uses doubles)
/// holds exactly. Every time [`parse_time_ms`] reads is well within it.
pub const TIME_MS_MAX: i64 = AMOUNT_ABS_MAX;

/// The most digits of a time written as epoch milliseconds: 15 reach the year 33658.
pub const TIME_MS_DIGITS_MAX: usize = 15;

const _: () = assert!(10_i64.pow(TIME_MS_DIGITS_MAX as u32) - 1 <= TIME_MS_MAX);

const MS_PER_DAY: i64 = 86_400_000;

/// What a time may be written as, for error messages and help texts.
pub const TIME_FORMS: &str = "an RFC 3339 time (2025-11-22T08:00:00Z, \
    2025-11-22T09:00:00.250+01:00) or milliseconds since the Unix epoch (1763798400000, at \
    most 15 digits)";

/// Reads `text` as an instant, in milliseconds since the Unix epoch: RFC 3339 (`T`, `t` or a
/// space between date and time; `Z`, `z` or `±HH:MM` after it; digits after the seconds are
/// cut to the millisecond toward the past; a year from 0000 to 9999; seconds up to 59) or a
/// number of milliseconds of at most [`TIME_MS_DIGITS_MAX`] digits.
///
/// # Errors
///
/// Neither form, or a date that does not exist (2025-02-30): invalid input naming `field`,
/// with the forms accepted.
pub fn parse_time_ms(field: &str, text: &str) -> Result<i64> {
    let digits = text.bytes().all(|b| b.is_ascii_digit());
    let parsed = if digits && (1..=TIME_MS_DIGITS_MAX).contains(&text.len()) {
        text.parse::<i64>().ok()
    } else {
        parse_rfc3339(text)
    };
    match parsed {
        Some(ms) => Ok(ms),
        None => Err(Error::invalid(
            field,
            format!("{text:?} is not a time; write {TIME_FORMS}"),
        )),
    }
}

/// `ms` (epoch milliseconds) as RFC 3339 in UTC with milliseconds: `2025-11-22T08:00:00.000Z`.
pub fn format_time_ms(ms: i64) -> String {
    let days = ms.div_euclid(MS_PER_DAY);
    let in_day = ms.rem_euclid(MS_PER_DAY);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

/// `YYYY-MM-DD[Tt ]HH:MM:SS[.fff…](Z|z|±HH:MM)`, or `None`.
fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || !b.is_ascii() {
        return None;
    }
    let num = |at: usize, len: usize| -> Option<i64> {
        let part = &text[at..at + len];
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let seps = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if seps.iter().any(|&(i, c)| b[i] != c) || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let (millis, rest) = fraction(&text[19..])?;
    let offset_ms = offset(rest)?;
    let in_day = ((hour * 60 + minute) * 60 + second) * 1000 + millis;
    Some(days_from_civil(year, month, day) * MS_PER_DAY + in_day - offset_ms)
}

/// `.fff…` at the start of `rest` (optional): its milliseconds (digits past the third cut) and
/// what follows it.
fn fraction(rest: &str) -> Option<(i64, &str)> {
    let Some(digits) = rest.strip_prefix('.') else {
        return Some((0, rest));
    };
    let len = digits.bytes().take_while(u8::is_ascii_digit).count();
    if len == 0 {
        return None;
    }
    let millis = digits[..len]
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0, |acc, c| acc * 10 + i64::from(c - b'0'));
    Some((millis, &digits[len..]))
}

/// `Z`, `z` or `±HH:MM`, exactly: its offset from UTC in milliseconds.
fn offset(rest: &str) -> Option<i64> {
    if rest == "Z" || rest == "z" {
        return Some(0);
    }
    let b = rest.as_bytes();
    if b.len() != 6 || b[3] != b':' {
        return None;
    }
    let sign = match b[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let two = |at: usize| -> Option<i64> {
        let part = &rest[at..at + 2];
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (hours, minutes) = (two(1)?, two(4)?);
    if hours > 23 || minutes > 59 {
        return None;
    }
    Some(sign * (hours * 60 + minutes) * 60_000)
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day counted from 1970-01-01 (the inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_read_to_the_same_instant() {
        for (text, want) in [
            ("0", 0),
            ("1763798400000", 1_763_798_400_000),
            ("1970-01-01T00:00:00Z", 0),
            ("2025-11-22T08:00:00Z", 1_763_798_400_000),
            ("2025-11-22t08:00:00z", 1_763_798_400_000),
            ("2025-11-22 08:00:00Z", 1_763_798_400_000),
            ("2025-11-22T09:00:00.250+01:00", 1_763_798_400_250),
            ("2025-11-22T07:30:00-00:30", 1_763_798_400_000),
            ("2025-11-22T08:00:00.1Z", 1_763_798_400_100),
            // Cut to the millisecond, never rounded up past the instant written.
            ("2025-11-22T08:00:00.9999Z", 1_763_798_400_999),
            ("2024-02-29T00:00:00Z", 1_709_164_800_000),
            ("2000-02-29T23:59:59.999Z", 951_868_799_999),
            ("1969-12-31T23:59:59Z", -1000),
            ("1970-01-01T00:00:00+01:00", -3_600_000),
            ("0000-01-01T00:00:00Z", -62_167_219_200_000),
            ("999999999999999", 999_999_999_999_999),
        ] {
            assert_eq!(parse_time_ms("at", text).unwrap(), want, "{text:?}");
        }
    }

    #[test]
    fn anything_else_is_refused_saying_the_forms() {
        for bad in [
            "",
            "now",
            "-1",
            "1.5",
            "+5",
            "9007199254740992",
            "99999999999999999999",
            "2025-11-22",
            "2025-11-22T08:00:00",
            "2025-11-22T08:00Z",
            "2025-02-29T00:00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-00-10T00:00:00Z",
            "2025-11-31T00:00:00Z",
            "2025-11-22T24:00:00Z",
            "2025-11-22T08:60:00Z",
            "2025-11-22T08:00:60Z",
            "2025-11-22T08:00:00.Z",
            "2025-11-22T08:00:00+0100",
            "2025-11-22T08:00:00+24:00",
            "2025-11-22T08:00:00Z ",
            "1900-02-29T00:00:00Z",
            "2025-11-22T08:00:00.000+01:00x",
            "2025-1a-22T08:00:00Z",
            "2025-11-22T08:00:00+01:0ä",
        ] {
            let e = parse_time_ms("at", bad).unwrap_err();
            assert!(e.is_invalid_input(), "{bad:?}");
            assert_eq!(e.field(), Some("at"));
            let said = e.to_string();
            assert!(
                said.contains("RFC 3339") && said.contains("milliseconds"),
                "{said}"
            );
        }
    }

    #[test]
    fn written_back_as_utc_and_read_again() {
        assert_eq!(format_time_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_time_ms(1_763_798_400_250),
            "2025-11-22T08:00:00.250Z"
        );
        for ms in [
            0,
            1,
            951_868_799_999,
            1_709_164_800_000,
            1_763_798_400_250,
            253_402_300_799_999,
            -62_167_219_200_000,
            -1,
        ] {
            assert_eq!(parse_time_ms("at", &format_time_ms(ms)).unwrap(), ms);
        }
    }
}
