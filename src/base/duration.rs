//! Durations as the command line and the environment write them (`90s`, `2m`, `500ms`,
//! `1m30s`; a bare number is seconds), and as messages show them.

use std::time::Duration;

/// `500ms`, `5s`, `2m`, `1h`, `1m30s`, or a number of seconds. Zero is refused: a limit of
/// nothing would fail every request.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("`{text}` is not a duration: write e.g. 30s, 2m, 1m30s or 500ms");
    let text = text.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return nonzero(Duration::from_secs(seconds), text);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.saturating_mul(60)),
            "h" => Duration::from_secs(number.saturating_mul(3600)),
            _ => return Err(bad()),
        };
        total = total.saturating_add(part);
        rest = &rest[unit..];
    }
    nonzero(total, text)
}

fn nonzero(duration: Duration, text: &str) -> Result<Duration, String> {
    match duration.is_zero() {
        true => Err(format!("`{text}`: a duration must be more than zero")),
        false => Ok(duration),
    }
}

/// `5s`, `1m30s`, `250ms`: how messages name a limit.
pub fn show(duration: Duration) -> String {
    let millis = duration.as_millis();
    if !millis.is_multiple_of(1000) {
        return format!("{millis}ms");
    }
    let seconds = duration.as_secs();
    match (seconds / 60, seconds % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written_and_show_back() {
        let cases = [
            ("90", 90_000),
            ("5s", 5_000),
            ("500ms", 500),
            ("2m", 120_000),
            ("1m30s", 90_000),
            ("1h", 3_600_000),
        ];
        for (text, millis) in cases {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(millis)),
                "{text}"
            );
        }
        for text in ["", "s", "5x", "1.5s", "-1s", "0", "0s", "m5"] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
        assert_eq!(show(Duration::from_secs(5)), "5s");
        assert_eq!(show(Duration::from_secs(90)), "1m30s");
        assert_eq!(show(Duration::from_secs(120)), "2m");
        assert_eq!(show(Duration::from_millis(1500)), "1500ms");
    }
}
