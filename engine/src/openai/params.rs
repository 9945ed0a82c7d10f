//! Sampling-parameter ranges of the OpenAI API, enforced by the engine and by the gateway in front
//! of it: a request is refused with the same message by either.

/// `temperature` must be in [0, 2]; the message names the value.
pub fn check_temperature(t: f64) -> Result<(), String> {
    if (0.0..=2.0).contains(&t) {
        Ok(())
    } else {
        Err(format!("`temperature` must be in [0, 2], got {t}"))
    }
}

/// `top_p` must be in (0, 1]; the message names the value.
pub fn check_top_p(p: f64) -> Result<(), String> {
    if p > 0.0 && p <= 1.0 {
        Ok(())
    } else {
        Err(format!("`top_p` must be in (0, 1], got {p}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranges_include_their_closed_ends_only() {
        assert!(check_temperature(0.0).is_ok() && check_temperature(2.0).is_ok());
        assert!(check_temperature(-0.1).is_err() && check_temperature(2.01).is_err());
        assert!(check_temperature(f64::NAN).is_err());
        assert!(check_top_p(1.0).is_ok() && check_top_p(0.01).is_ok());
        assert!(check_top_p(0.0).is_err() && check_top_p(1.5).is_err());
        assert!(check_top_p(f64::NAN).is_err());
        assert_eq!(
            check_temperature(3.0).unwrap_err(),
            "`temperature` must be in [0, 2], got 3"
        );
    }
}
