//! Durations written by people in config files and on the command line: a number (decimals
//! allowed) and a unit, `ms`, `s`, `m` or `h` (e.g. `250ms`, `1.5s`, `10m`, `1h`).

use std::time::Duration;

/// Parses a duration; a missing or unknown unit is an error that says how to write one.
pub fn parse(text: &str) -> Result<Duration, String> {
    let hint = "write a number and a unit: ms, s, m or h (e.g. 250ms, 1.5s, 10m, 1h)";
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let Ok(number) = digits.parse::<f64>() else {
        return Err(format!("`{text}` is not a duration: {hint}"));
    };
    let seconds_per_unit = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "" => return Err(format!("duration `{text}` has no unit: {hint}")),
        _ => return Err(format!("`{text}` has an unknown unit `{unit}`: {hint}")),
    };
    Duration::try_from_secs_f64(number * seconds_per_unit)
        .map_err(|_| format!("duration `{text}` is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_decimals_and_errors() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse(" 1.5s "), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        for bad in ["10", "s", "2 s", "5d", "-1s", "1e400h"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
