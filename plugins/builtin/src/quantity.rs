//! Kubernetes resource quantities (`500m`, `32Gi`, `1e3`): parsing, exact
//! sums and products, and the canonical form an API server prints.

use std::fmt;

/// The notation a quantity was written in; sums keep the first operand's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `Ki`, `Mi`, `Gi`, ...
    BinarySi,
    /// `m`, `k`, `M`, ... or no suffix.
    DecimalSi,
    /// `1e3`, `5E-3`.
    DecimalExponent,
}

/// Digits after the point a quantity keeps, as Kubernetes keeps nano units.
const SCALE: u32 = 9;

/// An exact quantity: `nanos` × 10⁻⁹.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    nanos: i128,
    /// `None` for [`Quantity::zero`], which takes the format of the first
    /// quantity added to it, as Go's zero `resource.Quantity` does.
    format: Option<Format>,
}

/// A quantity that is not valid Kubernetes notation, or overflows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityError(pub String);

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Quantity {
    /// Zero, adopting the format of whatever is added to it first.
    pub fn zero() -> Self {
        Quantity {
            nanos: 0,
            format: None,
        }
    }

    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let invalid = || QuantityError(format!("quantity {text:?} is not valid"));
        let text = text.trim();
        let number_end = text
            .char_indices()
            .find(|(i, c)| {
                !(c.is_ascii_digit() || *c == '.' || (*i == 0 && (*c == '+' || *c == '-')))
            })
            .map_or(text.len(), |(i, _)| i);
        let (number, suffix) = text.split_at(number_end);
        let (negative, digits) = match number.as_bytes().first() {
            Some(b'-') => (true, &number[1..]),
            Some(b'+') => (false, &number[1..]),
            _ => (false, number),
        };
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
        if (whole.is_empty() && fraction.is_empty())
            || !whole.bytes().all(|b| b.is_ascii_digit())
            || !fraction.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(invalid());
        }
        // mantissa × 10^exp10 × 1024^exp1024
        let mut mantissa: i128 = 0;
        for b in whole.bytes().chain(fraction.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(b - b'0')))
                .ok_or_else(invalid)?;
        }
        let fraction_digits = i32::try_from(fraction.len()).map_err(|_| invalid())?;
        let (mut exp10, exp1024, format) = match suffix {
            "" => (0, 0, Format::DecimalSi),
            "n" => (-9, 0, Format::DecimalSi),
            "u" => (-6, 0, Format::DecimalSi),
            "m" => (-3, 0, Format::DecimalSi),
            "k" => (3, 0, Format::DecimalSi),
            "M" => (6, 0, Format::DecimalSi),
            "G" => (9, 0, Format::DecimalSi),
            "T" => (12, 0, Format::DecimalSi),
            "P" => (15, 0, Format::DecimalSi),
            "E" => (18, 0, Format::DecimalSi),
            "Ki" => (0, 1, Format::BinarySi),
            "Mi" => (0, 2, Format::BinarySi),
            "Gi" => (0, 3, Format::BinarySi),
            "Ti" => (0, 4, Format::BinarySi),
            "Pi" => (0, 5, Format::BinarySi),
            "Ei" => (0, 6, Format::BinarySi),
            s if s.starts_with(['e', 'E']) => {
                let exp: i32 = s[1..].parse().map_err(|_| invalid())?;
                (exp, 0, Format::DecimalExponent)
            }
            _ => return Err(invalid()),
        };
        exp10 -= fraction_digits;
        for _ in 0..exp1024 {
            mantissa = mantissa.checked_mul(1024).ok_or_else(invalid)?;
        }
        // To nanos; digits below a nano round up, as Kubernetes rounds.
        exp10 += SCALE as i32;
        let mut nanos = mantissa;
        if exp10 >= 0 {
            for _ in 0..exp10 {
                nanos = nanos.checked_mul(10).ok_or_else(invalid)?;
            }
        } else {
            let divisor = 10i128
                .checked_pow(exp10.unsigned_abs())
                .ok_or_else(invalid)?;
            nanos = (mantissa + divisor - 1) / divisor;
        }
        if negative {
            nanos = -nanos;
        }
        Ok(Quantity {
            nanos,
            format: Some(format),
        })
    }

    /// The smallest integer not below the quantity, as `Quantity.Value()`.
    pub fn ceil(&self) -> i128 {
        let unit = 10i128.pow(SCALE);
        self.nanos.div_euclid(unit) + i128::from(self.nanos.rem_euclid(unit) != 0)
    }

    /// The value in units of 10⁻⁹.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn checked_add(self, other: Quantity) -> Option<Quantity> {
        let format = self.format.or(other.format);
        Some(Quantity {
            nanos: self.nanos.checked_add(other.nanos)?,
            format,
        })
    }

    pub fn checked_mul(self, factor: i128) -> Option<Quantity> {
        Some(Quantity {
            nanos: self.nanos.checked_mul(factor)?,
            format: self.format,
        })
    }
}

impl fmt::Display for Quantity {
    /// The canonical form, as the API server prints a quantity.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = 10i128.pow(SCALE);
        let mut format = self.format.unwrap_or(Format::DecimalSi);
        if format == Format::BinarySi && (self.nanos.abs() < 1024 * unit || self.nanos % unit != 0)
        {
            format = Format::DecimalSi;
        }
        if self.nanos == 0 {
            return f.write_str("0");
        }
        if format == Format::BinarySi {
            let mut value = self.nanos / unit;
            let mut exponent = 0;
            while exponent < 6 && value % 1024 == 0 {
                value /= 1024;
                exponent += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exponent];
            return write!(f, "{value}{suffix}");
        }
        // mantissa × 10^exponent, trailing zeros folded into the exponent,
        // the exponent a multiple of three.
        let mut mantissa = self.nanos;
        let mut exponent = -(SCALE as i32);
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        while exponent.rem_euclid(3) != 0 {
            mantissa *= 10;
            exponent -= 1;
        }
        if format == Format::DecimalExponent {
            return if exponent == 0 {
                write!(f, "{mantissa}")
            } else {
                write!(f, "{mantissa}e{exponent}")
            };
        }
        let suffix = match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => return write!(f, "{mantissa}e{exponent}"),
        };
        write!(f, "{mantissa}{suffix}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap()
    }

    #[test]
    fn parses_every_notation() {
        assert_eq!(q("1").nanos(), 1_000_000_000);
        assert_eq!(q("1500m").nanos(), 1_500_000_000);
        assert_eq!(q("1.5").nanos(), 1_500_000_000);
        assert_eq!(q("2Ki").nanos(), 2048 * 1_000_000_000);
        assert_eq!(q("1e3").nanos(), 1000 * 1_000_000_000);
        assert_eq!(q("-2").nanos(), -2_000_000_000);
        for bad in ["", "m", "1x", "1.2.3", "Gi", "--1"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn ceil_rounds_up_as_quantity_value_does() {
        assert_eq!(q("1500m").ceil(), 2);
        assert_eq!(q("2").ceil(), 2);
        assert_eq!(q("1m").ceil(), 1);
        assert_eq!(q("0").ceil(), 0);
    }

    #[test]
    fn prints_the_canonical_form() {
        let times = |text: &str, n: i128| q(text).checked_mul(n).unwrap().to_string();
        assert_eq!(times("1", 32), "32");
        assert_eq!(times("500m", 3), "1500m");
        assert_eq!(times("500m", 2), "1");
        assert_eq!(times("32Gi", 2), "64Gi");
        assert_eq!(times("1Gi", 1024), "1Ti");
        assert_eq!(times("1k", 2), "2k");
        assert_eq!(times("1e3", 2), "2e3");
        assert_eq!(q("512Mi").to_string(), "512Mi");
        assert_eq!(q("100").to_string(), "100");
        assert_eq!(q("1000").to_string(), "1k");
    }

    #[test]
    fn a_sum_takes_the_format_of_its_first_term() {
        let sum = Quantity::zero()
            .checked_add(q("1Gi"))
            .unwrap()
            .checked_add(q("1Gi"))
            .unwrap();
        assert_eq!(sum.to_string(), "2Gi");
    }
}
