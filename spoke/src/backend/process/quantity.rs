//! Kubernetes resource quantities (`2`, `500m`, `4Gi`, `1e3`) as milli-units.

/// Parses a Kubernetes quantity into milli-units (`"2"` → 2000, `"500m"` → 500,
/// `"1Ki"` → 1 024 000).
///
/// The grammar is Kubernetes': an optionally signed decimal number, then a
/// binary suffix (`Ki Mi Gi Ti Pi Ei`), a decimal suffix (`n u m k M G T P E`)
/// or a decimal exponent (`e3`, `E-2`). A value finer than a milli-unit is
/// rounded away from zero, as Kubernetes' `MilliValue` does for requests.
///
/// # Errors
///
/// A message naming the value and what is wrong with it: empty, no digits, an
/// unknown suffix, or a value beyond 64 bits of milli-units.
pub fn parse_quantity_milli(s: &str) -> Result<i64, String> {
    let bad = |why: &str| format!("quantity {s:?}: {why}");
    let text = s.trim();
    if text.is_empty() {
        return Err(bad("empty"));
    }
    let (negative, rest) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(bad("expected a number, such as 2, 0.5, 500m or 4Gi"));
    }
    if frac.contains('.') {
        return Err(bad("more than one decimal point"));
    }

    // value = mantissa × 2^binary × 10^decimal / 10^frac_digits
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = &exp[1..];
            let value: i32 = digits
                .parse()
                .ok()
                .filter(|_| !digits.is_empty() && !digits.starts_with('+'))
                .ok_or_else(|| bad(&format!("invalid exponent {exp:?}")))?;
            if !(-40..=40).contains(&value) {
                return Err(bad("exponent out of range"));
            }
            (0, value)
        }
        other => {
            return Err(bad(&format!(
                "unknown suffix {other:?} (use one of Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent such as e3)"
            )));
        }
    };

    let digits: String = format!("{whole}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(bad("too many digits"));
    }
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad("invalid digits"))?
    };
    let too_large = || bad("too large (beyond 64 bits of milli-units)");
    let frac_digits = i32::try_from(frac.len()).map_err(|_| bad("too many digits"))?;
    // milli-units: one more factor 10^3.
    let scale = decimal + 3 - frac_digits;
    let mut numerator = mantissa
        .checked_mul(1_i128 << binary)
        .ok_or_else(too_large)?;
    let mut denominator: i128 = 1;
    if scale >= 0 {
        numerator = numerator
            .checked_mul(pow10(scale.unsigned_abs()).ok_or_else(too_large)?)
            .ok_or_else(too_large)?;
    } else {
        // Far below a milli-unit (no i128 power of ten): rounds up to one if nonzero.
        denominator = pow10(scale.unsigned_abs()).unwrap_or(i128::MAX);
    }
    let milli = if numerator == 0 {
        0
    } else {
        (numerator - 1) / denominator + 1
    };
    let milli = i64::try_from(milli).map_err(|_| too_large())?;
    Ok(if negative { -milli } else { milli })
}

fn pow10(exp: u32) -> Option<i128> {
    10_i128.checked_pow(exp)
}

/// Writes milli-units as a quantity: `2`, `500m`.
pub fn format_milli(milli: i64) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kubernetes_forms() {
        let cases = [
            ("2", 2000),
            ("0", 0),
            ("500m", 500),
            ("0.5", 500),
            (".5", 500),
            ("1.", 1000),
            ("+3", 3000),
            ("-1", -1000),
            ("1k", 1_000_000),
            ("1e3", 1_000_000),
            ("1E3", 1_000_000),
            ("2e-3", 2),
            ("1Ki", 1_024_000),
            ("512Mi", 512 * 1024 * 1024 * 1000),
            ("4Gi", 4 * 1024 * 1024 * 1024 * 1000),
            ("1M", 1_000_000_000),
            ("1P", 1_000_000_000_000_000_000),
            ("100u", 1),
            ("1n", 1),
            ("0.0001", 1),
            ("1.5Gi", 1536 * 1024 * 1024 * 1000),
        ];
        for (text, want) in cases {
            assert_eq!(parse_quantity_milli(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_with_a_reason() {
        for (text, why) in [
            ("", "empty"),
            ("abc", "expected a number"),
            ("1x", "unknown suffix \"x\""),
            ("1Gb", "unknown suffix"),
            ("1.2.3", "more than one decimal point"),
            ("1e", "invalid exponent"),
            ("8Ei", "too large"),
            ("1E", "too large"),
            ("1e40", "too large"),
            ("1e99", "exponent out of range"),
        ] {
            let err = parse_quantity_milli(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
            assert!(err.contains(&format!("{text:?}")), "{err}");
        }
    }

    #[test]
    fn formats_whole_and_milli_values() {
        assert_eq!(format_milli(4000), "4");
        assert_eq!(format_milli(500), "500m");
    }
}
