//! UTC calendar arithmetic on Unix milliseconds: days, months, their starts and ISO dates.
//! Budgets reset and the ledger rolls up on UTC boundaries; no time-zone database is needed.

/// Milliseconds in a day.
pub const DAY_MS: i64 = 86_400_000;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date (year, month 1–12, day 1–31) of a day number.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Start of the UTC day holding `ms`.
pub fn day_start(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS) * DAY_MS
}

/// Start of the UTC month holding `ms`.
pub fn month_start(ms: i64) -> i64 {
    let (y, m, _) = civil_from_days(ms.div_euclid(DAY_MS));
    days_from_civil(y, m, 1) * DAY_MS
}

/// Start of the UTC month after the one holding `ms`.
pub fn next_month_start(ms: i64) -> i64 {
    let (y, m, _) = civil_from_days(ms.div_euclid(DAY_MS));
    let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    days_from_civil(y, m, 1) * DAY_MS
}

/// `YYYY-MM-DD` of the UTC day holding `ms`.
pub fn iso_date(ms: i64) -> String {
    let (y, m, d) = civil_from_days(ms.div_euclid(DAY_MS));
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYY-MM-DDTHH:MM:SSZ` of `ms`.
pub fn iso_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000).rem_euclid(86_400);
    format!(
        "{}T{:02}:{:02}:{:02}Z",
        iso_date(ms),
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Parses `YYYY-MM-DD` (start of that UTC day) or `YYYY-MM-DDTHH:MM[:SS]Z`, or Unix
/// milliseconds, into Unix milliseconds.
pub fn parse_time(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Some(ms);
    }
    let (date, time) = match text.split_once('T') {
        Some((d, t)) => (d, Some(t.strip_suffix('Z').unwrap_or(t))),
        None => (text, None),
    };
    let mut parts = date.split('-');
    let year: i64 = parts.next()?.parse().ok()?;
    let month: u32 = parts.next()?.parse().ok()?;
    let day: u32 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    // 2026-02-31 is not a date (it would silently become March 3rd).
    if civil_from_days(days) != (year, month, day) {
        return None;
    }
    let mut ms = days * DAY_MS;
    if let Some(t) = time {
        let mut hms = t.split(':');
        let h: i64 = hms.next()?.parse().ok()?;
        let m: i64 = hms.next()?.parse().ok()?;
        let s: i64 = hms.next().map_or(Some(0), |s| s.parse().ok())?;
        if h > 23 || m > 59 || s > 60 {
            return None;
        }
        ms += ((h * 60 + m) * 60 + s) * 1000;
    }
    Some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn periods_start_and_end_on_utc_boundaries() {
        let t = parse_time("2026-12-31T23:59:59Z").unwrap_or_default();
        assert_eq!(iso_time(t), "2026-12-31T23:59:59Z");
        assert_eq!(iso_date(day_start(t)), "2026-12-31");
        assert_eq!(iso_time(month_start(t)), "2026-12-01T00:00:00Z");
        assert_eq!(iso_time(next_month_start(t)), "2027-01-01T00:00:00Z");
        let feb = parse_time("2028-02-10").unwrap_or_default();
        assert_eq!(iso_date(next_month_start(feb)), "2028-03-01");
        assert_eq!(parse_time("2026-13-01"), None);
        assert_eq!(parse_time("2026-02-31"), None);
        assert!(parse_time("2028-02-29").is_some());
        assert_eq!(parse_time("1700000000000"), Some(1_700_000_000_000));
        assert_eq!(
            parse_time("2026-12-01T10:30Z"),
            parse_time("2026-12-01T10:30:00Z")
        );
    }
}
