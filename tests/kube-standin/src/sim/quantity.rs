//! Kubernetes resource quantities (`500m`, `64Gi`, `2`, `1e3`) as numbers,
//! precise enough for the scheduler's fit check.

/// The value of `quantity` in base units (cores, bytes, counts), or `None`
/// when it is not a quantity.
pub fn parse(quantity: &str) -> Option<f64> {
    let q = quantity.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * factor)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn quantities() {
        assert_eq!(parse("500m"), Some(0.5));
        assert_eq!(parse("2"), Some(2.0));
        assert_eq!(parse("1Gi"), Some(1073741824.0));
        assert_eq!(parse("1e3"), Some(1000.0));
        assert_eq!(parse("1.5k"), Some(1500.0));
        assert_eq!(parse("lots"), None);
    }
}
