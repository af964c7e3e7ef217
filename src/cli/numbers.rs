//! Parsers of the command line's numeric options, each with its valid range: a value
//! outside it (a negative number included: every numeric option also takes values that
//! start with `-`, so they reach these parsers) is one line saying the range.

/// A whole number ≥ 0 (counts: `--repeats`, `--warmup`).
pub fn count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("must be a whole number ≥ 0 (got {s})"))
}

/// Whole seconds ≥ 1 (`--trial-timeout`).
pub fn seconds(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("must be a whole number of seconds ≥ 1 (got {s})")),
    }
}

fn finite(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|x| x.is_finite())
}

/// A finite ratio ≥ 1 (`--max-peak-over-floor`: a compiled peak is never below its floor).
pub fn ratio_at_least_one(s: &str) -> Result<f64, String> {
    finite(s)
        .filter(|&x| x >= 1.0)
        .ok_or_else(|| format!("must be a number ≥ 1 (got {s})"))
}

/// A finite number > 0 (`--max-roofline-over-baseline`).
pub fn positive(s: &str) -> Result<f64, String> {
    finite(s)
        .filter(|&x| x > 0.0)
        .ok_or_else(|| format!("must be a number > 0 (got {s})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(count("0"), Ok(0));
        assert!(count("-1").unwrap_err().contains("≥ 0"));
        assert_eq!(seconds("30"), Ok(30));
        assert!(seconds("0").unwrap_err().contains("≥ 1"));
        assert_eq!(ratio_at_least_one("1.05"), Ok(1.05));
        assert!(ratio_at_least_one("NaN").is_err() && ratio_at_least_one("0.9").is_err());
        assert!(positive("0").is_err() && positive("inf").is_err() && positive("0.5").is_ok());
    }
}
