//! Kubernetes' CEL quantity library: `quantity('1.5Gi')`, `isQuantity(s)`,
//! and the methods of a `kubernetes.Quantity` (`sign`, `isInteger`,
//! `asInteger`, `asApproximateFloat`, `add`, `sub`, `isLessThan`,
//! `isGreaterThan`, `compareTo`, `==`).
//!
//! A quantity is held exactly to the nano (10^-9), within ±1.7e29; a finer
//! value rounds up (away from zero), as Kubernetes rounds quantities, and a
//! larger one is not a quantity here.

use std::any::Any;
use std::cmp::Ordering;

use cel::common::types::{self, CelBool, CelDouble, CelInt, CelString, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::library::owned;

/// The CEL type of quantities, as Kubernetes names it.
pub static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// A quantity, in nano-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity {
    nanos: i128,
}

impl Val for Quantity {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Quantity>() == Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Quantity {}

impl Quantity {
    /// Parses Kubernetes' quantity syntax: a signed decimal number, then a
    /// binary suffix (`Ki` … `Ei`), a decimal one (`n`, `u`, `m`, ``, `k`,
    /// `M` … `E`) or an exponent (`e3`, `E-2`).
    pub fn parse(s: &str) -> Option<Quantity> {
        let (negative, rest) = match s.as_bytes().first()? {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let digits_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(digits_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        let (ten, two) = suffix_scale(suffix)?;
        // value = digits × 10^(ten - fraction digits) × 2^two
        let mut mantissa: i128 = 0;
        for d in whole.bytes().chain(fraction.bytes()) {
            mantissa = mantissa
                .checked_mul(10)?
                .checked_add(i128::from(d - b'0'))?;
        }
        let mantissa = mantissa.checked_mul(1_i128.checked_shl(two)?)?;
        let fraction_digits = i64::try_from(fraction.len()).ok()?;
        let exponent = 9_i64.checked_add(ten)?.checked_sub(fraction_digits)?;
        let nanos = scale(mantissa, exponent)?;
        Some(Quantity {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    fn from_int(i: i64) -> Option<Quantity> {
        i128::from(i)
            .checked_mul(NANOS_PER_UNIT)
            .map(|nanos| Quantity { nanos })
    }

    fn sign(self) -> i64 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    fn as_integer(self) -> Option<i64> {
        if self.nanos % NANOS_PER_UNIT != 0 {
            return None;
        }
        i64::try_from(self.nanos / NANOS_PER_UNIT).ok()
    }

    fn as_float(self) -> f64 {
        self.nanos as f64 / NANOS_PER_UNIT as f64
    }
}

/// The powers of ten and two a suffix multiplies by.
fn suffix_scale(suffix: &str) -> Option<(i64, u32)> {
    Some(match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exponent => {
            let digits = exponent
                .strip_prefix('e')
                .or_else(|| exponent.strip_prefix('E'))?;
            let unsigned = digits
                .strip_prefix('-')
                .or_else(|| digits.strip_prefix('+'))
                .unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (digits.parse().ok()?, 0)
        }
    })
}

/// `mantissa × 10^exponent`, rounded up (away from zero) to an integer.
fn scale(mantissa: i128, exponent: i64) -> Option<i128> {
    if mantissa == 0 {
        return Some(0);
    }
    if exponent >= 0 {
        let factor = 10_i128.checked_pow(u32::try_from(exponent).ok()?)?;
        return mantissa.checked_mul(factor);
    }
    // Dividing by more than 10^38 leaves less than one: it rounds up to one.
    let Some(divisor) = u32::try_from(exponent.unsigned_abs())
        .ok()
        .and_then(|e| 10_i128.checked_pow(e))
    else {
        return Some(1);
    };
    let (q, r) = (mantissa / divisor, mantissa % divisor);
    Some(if r == 0 { q } else { q + 1 })
}

/// Registers `quantity`, `isQuantity` and the methods of quantities.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    use types::{INT_TYPE, STRING_TYPE};
    let q = || QUANTITY_TYPE.to_owned();
    env.add_type(q())?;
    env.add_overload("quantity", "string_to_quantity", vec![STRING_TYPE], parse)?;
    env.add_overload("isQuantity", "is_quantity", vec![STRING_TYPE], is_quantity)?;
    env.add_member_overload("sign", "quantity_sign", q(), vec![], sign)?;
    env.add_member_overload("isInteger", "quantity_is_integer", q(), vec![], is_integer)?;
    env.add_member_overload("asInteger", "quantity_as_integer", q(), vec![], as_integer)?;
    env.add_member_overload(
        "asApproximateFloat",
        "quantity_as_float",
        q(),
        vec![],
        as_float,
    )?;
    env.add_member_overload("add", "quantity_add", q(), vec![q()], add)?;
    env.add_member_overload("add", "quantity_add_int", q(), vec![INT_TYPE], add)?;
    env.add_member_overload("sub", "quantity_sub", q(), vec![q()], sub)?;
    env.add_member_overload("sub", "quantity_sub_int", q(), vec![INT_TYPE], sub)?;
    env.add_member_overload(
        "isLessThan",
        "quantity_less_than",
        q(),
        vec![q()],
        is_less_than,
    )?;
    env.add_member_overload(
        "isGreaterThan",
        "quantity_greater_than",
        q(),
        vec![q()],
        is_greater_than,
    )?;
    env.add_member_overload(
        "compareTo",
        "quantity_compare_to",
        q(),
        vec![q()],
        compare_to,
    )?;
    Ok(())
}

fn string<'a>(function: &str, args: &'a [CowVal<'_, '_>]) -> Result<&'a str, ExecutionError> {
    args.first()
        .and_then(|a| a.downcast_ref::<CelString>())
        .map(CelString::inner)
        .ok_or_else(|| ExecutionError::function_error(function, "expects a string"))
}

/// Argument `i`: a quantity, or (for `add` and `sub`) an int.
fn quantity(function: &str, args: &[CowVal<'_, '_>], i: usize) -> Result<Quantity, ExecutionError> {
    let arg = args
        .get(i)
        .ok_or_else(|| ExecutionError::invalid_argument_count(i + 1, args.len()))?;
    if let Some(q) = arg.downcast_ref::<Quantity>() {
        return Ok(*q);
    }
    arg.downcast_ref::<CelInt>()
        .and_then(|n| Quantity::from_int(*n.inner()))
        .ok_or_else(|| ExecutionError::function_error(function, "expects a quantity"))
}

fn parse<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string("quantity", &args)?;
    Quantity::parse(s).map(owned).ok_or_else(|| {
        ExecutionError::function_error(
            "quantity",
            "quantities must match the regular expression \
             '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        )
    })
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string("isQuantity", &args)?;
    Ok(owned(CelBool::from(Quantity::parse(s).is_some())))
}

fn sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(owned(CelInt::from(quantity("sign", &args, 0)?.sign())))
}

fn is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = quantity("isInteger", &args, 0)?;
    Ok(owned(CelBool::from(q.as_integer().is_some())))
}

fn as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = quantity("asInteger", &args, 0)?;
    q.as_integer()
        .map(|i| owned(CelInt::from(i)))
        .ok_or_else(|| {
            ExecutionError::function_error(
                "asInteger",
                "cannot convert value to integer: it overflows int64 or is not whole",
            )
        })
}

fn as_float<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = quantity("asApproximateFloat", &args, 0)?;
    Ok(owned(CelDouble::from(q.as_float())))
}

fn add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = (quantity("add", &args, 0)?, quantity("add", &args, 1)?);
    a.nanos
        .checked_add(b.nanos)
        .map(|nanos| owned(Quantity { nanos }))
        .ok_or_else(|| ExecutionError::function_error("add", "quantity overflow"))
}

fn sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = (quantity("sub", &args, 0)?, quantity("sub", &args, 1)?);
    a.nanos
        .checked_sub(b.nanos)
        .map(|nanos| owned(Quantity { nanos }))
        .ok_or_else(|| ExecutionError::function_error("sub", "quantity overflow"))
}

fn ordering(function: &str, args: &[CowVal<'_, '_>]) -> Result<Ordering, ExecutionError> {
    Ok(quantity(function, args, 0)?.cmp(&quantity(function, args, 1)?))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let o = ordering("isLessThan", &args)?;
    Ok(owned(CelBool::from(o == Ordering::Less)))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let o = ordering("isGreaterThan", &args)?;
    Ok(owned(CelBool::from(o == Ordering::Greater)))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let o = ordering("compareTo", &args)?;
    Ok(owned(CelInt::from(o as i64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nanos(s: &str) -> Option<i128> {
        Quantity::parse(s).map(|q| q.nanos)
    }

    #[test]
    fn parses_kubernetes_quantities() {
        assert_eq!(nanos("1"), Some(1_000_000_000));
        assert_eq!(nanos("1.5Gi"), Some(3 * (1 << 29) * 1_000_000_000));
        assert_eq!(nanos("100m"), Some(100_000_000));
        assert_eq!(nanos("-2k"), Some(-2_000_000_000_000));
        assert_eq!(nanos("1e3"), Some(1_000_000_000_000));
        assert_eq!(nanos("1E-3"), Some(1_000_000));
        assert_eq!(nanos(".5"), Some(500_000_000));
        assert_eq!(nanos("5."), Some(5_000_000_000));
        assert_eq!(nanos("+7n"), Some(7));
        // Finer than a nano rounds up, away from zero.
        assert_eq!(nanos("0.1n"), Some(1));
        assert_eq!(nanos("-0.1n"), Some(-1));
        assert_eq!(nanos("1e-40"), Some(1));
        for bad in [
            "", "-", ".", "1.2.3", "1Ki2", "1 Gi", "abc", "1e", "1e+", "Gi", "1ki",
        ] {
            assert_eq!(nanos(bad), None, "{bad:?}");
        }
        // Beyond the range held: not a quantity, never a panic.
        assert_eq!(nanos("1e40"), None);
        assert_eq!(nanos("99999999999999999999999999999999999999999999"), None);
        assert_eq!(nanos("1e99999999999999999999"), None);
        assert_eq!(nanos("1e-99999999999999999999"), None);
        assert_eq!(nanos("1.000000000e-9223372036854775808"), Some(1));
    }

    #[test]
    fn integers_and_signs() {
        let q = |s: &str| Quantity::parse(s).unwrap_or(Quantity { nanos: 7 });
        assert_eq!(q("2Ki").as_integer(), Some(2048));
        assert_eq!(q("1500m").as_integer(), None);
        assert_eq!(q("1e19").as_integer(), None, "overflows int64");
        assert_eq!(q("-3").sign(), -1);
        assert_eq!(q("0").sign(), 0);
        assert_eq!(q("1500m").as_float(), 1.5);
    }
}
