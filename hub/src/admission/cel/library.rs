//! The CEL environment rules are compiled and evaluated in: the standard
//! library, the strings extension, and the Kubernetes libraries served CRDs
//! may use (lists, regex, quantity, format), with the list of every function
//! a rule may call.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use cel::common::types::{self, CelBool, CelDouble, CelInt, CelList, CelString, CelUInt, Kind};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};
use regex::Regex;

use super::{format, quantity};

/// The functions and operators a rule may call without a receiver, by the
/// name the parser gives them. Anything else fails the rule's compilation.
pub const GLOBAL_FUNCTIONS: &[&str] = &[
    // Operators, and what the macros (`has`, `all`, `exists`,
    // `exists_one`, `map`, `filter`) expand to.
    "_&&_",
    "_||_",
    "!_",
    "_?_:_",
    "_==_",
    "_!=_",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "_+_",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "-_",
    "_[_]",
    "_[?_]",
    "_?._",
    "@in",
    "@not_strictly_false",
    // Standard functions.
    "size",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "dyn",
    "type",
    "matches",
    "optional.of",
    "optional.none",
    "optional.ofNonZeroValue",
    // Extensions.
    "strings.quote",
    "quantity",
    "isQuantity",
    "format.named",
    "format.dns1123Label",
    "format.dns1123Subdomain",
    "format.dns1035Label",
    "format.qualifiedName",
    "format.labelValue",
    "format.uuid",
];

/// The functions a rule may call on a receiver (`x.f()`).
pub const MEMBER_FUNCTIONS: &[&str] = &[
    // Standard.
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    // Optionals.
    "hasValue",
    "value",
    "or",
    "orValue",
    // Strings extension.
    "charAt",
    "indexOf",
    "lastIndexOf",
    "join",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "split",
    "substring",
    "format",
    "reverse",
    // Kubernetes lists.
    "isSorted",
    "sum",
    "min",
    "max",
    // Kubernetes regex.
    "find",
    "findAll",
    // Kubernetes quantity.
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "sign",
    "add",
    "sub",
    "isLessThan",
    "isGreaterThan",
    "compareTo",
    // Kubernetes format.
    "validate",
];

/// The types a rule may name (`type(self) == int`).
pub const TYPE_NAMES: &[&str] = &[
    "bool",
    "bytes",
    "double",
    "int",
    "list",
    "map",
    "null_type",
    "optional_type",
    "string",
    "type",
    "uint",
    "kubernetes.Quantity",
    "kubernetes.NamedFormat",
];

/// The functions whose argument is a regular expression: it must be a
/// string literal of the rule, compiled with the rule (see [`regex`]).
pub const REGEX_FUNCTIONS: &[&str] = &["matches", "find", "findAll"];

/// The environment every rule runs in, built once.
pub fn env() -> Result<Arc<Env>, DeclarationError> {
    static ENV: LazyLock<Result<Arc<Env>, DeclarationError>> = LazyLock::new(|| {
        let mut env = Env::stdlib();
        env.add_extension(cel::extensions::strings)?;
        env.add_extension(kubernetes)?;
        env.add_extension(quantity::library)?;
        env.add_extension(format::library)?;
        Ok(Arc::new(env))
    });
    ENV.clone()
}

/// The Kubernetes regex and lists libraries, and `matches` with cached
/// regexes.
fn kubernetes(env: &mut Env) -> Result<(), DeclarationError> {
    use types::{DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE};
    env.add_overload(
        "matches",
        "matches",
        vec![STRING_TYPE, STRING_TYPE],
        matches,
    )?;
    env.add_member_overload(
        "matches",
        "string_matches",
        STRING_TYPE,
        vec![STRING_TYPE],
        matches,
    )?;
    env.add_member_overload("find", "string_find", STRING_TYPE, vec![STRING_TYPE], find)?;
    env.add_member_overload(
        "findAll",
        "string_find_all",
        STRING_TYPE,
        vec![STRING_TYPE],
        find_all,
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_n",
        STRING_TYPE,
        vec![STRING_TYPE, INT_TYPE],
        find_all,
    )?;
    env.add_member_overload("isSorted", "list_is_sorted", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        last_index_of,
    )?;
    Ok(())
}

/// The regular expressions of the compiled rules, by pattern. Patterns are
/// string literals of rules, so the set is fixed by the CRDs served: nothing
/// an object holds is ever compiled.
static REGEXES: LazyLock<RwLock<HashMap<String, Arc<Regex>>>> = LazyLock::new(Default::default);

/// Compiles `pattern` (RE2 syntax, as CEL's `matches` reads it) for the
/// functions of [`REGEX_FUNCTIONS`]. Idempotent.
pub fn regex(pattern: &str) -> Result<(), String> {
    if cached(pattern).is_some() {
        return Ok(());
    }
    let re = Regex::new(pattern).map_err(|e| e.to_string())?;
    let mut cache = REGEXES
        .write()
        .map_err(|_| "the regex cache is unusable".to_string())?;
    cache.insert(pattern.to_string(), Arc::new(re));
    Ok(())
}

fn cached(pattern: &str) -> Option<Arc<Regex>> {
    REGEXES.read().ok()?.get(pattern).cloned()
}

/// The regex of a rule's literal `pattern`.
fn compiled(function: &str, pattern: &str) -> Result<Arc<Regex>, ExecutionError> {
    cached(pattern).ok_or_else(|| {
        ExecutionError::function_error(
            function,
            format!("regular expression {pattern:?} is not a string literal of the rule"),
        )
    })
}

/// Argument `i` of a call.
fn arg<'a, 'b, 'v>(
    args: &'a [CowVal<'b, 'v>],
    i: usize,
) -> Result<&'a (dyn Val + 'v), ExecutionError> {
    args.get(i)
        .map(|a| a.as_ref())
        .ok_or_else(|| ExecutionError::invalid_argument_count(i + 1, args.len()))
}

/// Argument `i` of a call, a string.
fn string_arg<'a, 'b, 'v>(
    function: &str,
    args: &'a [CowVal<'b, 'v>],
    i: usize,
) -> Result<&'a str, ExecutionError> {
    let a = arg(args, i)?;
    a.downcast_ref::<CelString>()
        .map(CelString::inner)
        .ok_or_else(|| ExecutionError::no_such_overload(function, type_names(args)))
}

fn type_names(args: &[CowVal<'_, '_>]) -> Vec<String> {
    args.iter()
        .map(|a| a.get_type().name().to_owned())
        .collect()
}

pub(super) fn owned<'b, 'v>(val: impl Val + 'v) -> CowVal<'b, 'v> {
    CowVal::owned(val)
}

fn matches<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg("matches", &args, 0)?;
    let re = compiled("matches", string_arg("matches", &args, 1)?)?;
    Ok(owned(CelBool::from(re.is_match(s))))
}

/// `s.find(re)`: the first match, or `''`.
fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg("find", &args, 0)?;
    let re = compiled("find", string_arg("find", &args, 1)?)?;
    let found = re
        .find(s)
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    Ok(owned(CelString::from(found)))
}

/// `s.findAll(re)` and `s.findAll(re, n)`: every match, or the first `n`
/// (all of them when `n` is negative).
fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg("findAll", &args, 0)?;
    let re = compiled("findAll", string_arg("findAll", &args, 1)?)?;
    let limit = match args.get(2) {
        Some(n) => {
            let n = n
                .downcast_ref::<CelInt>()
                .map(|n| *n.inner())
                .ok_or_else(|| ExecutionError::no_such_overload("findAll", type_names(&args)))?;
            usize::try_from(n).unwrap_or(usize::MAX)
        }
        None => usize::MAX,
    };
    let found: Vec<Box<dyn Val + 'v>> = re
        .find_iter(s)
        .take(limit)
        .map(|m| Box::new(CelString::from(m.as_str().to_owned())) as Box<dyn Val + 'v>)
        .collect();
    Ok(owned(CelList::from(found)))
}

/// The elements of the list receiver, in order.
fn elements<'a, 'v>(
    function: &str,
    args: &'a [CowVal<'_, 'v>],
) -> Result<Vec<&'a (dyn Val + 'v)>, ExecutionError> {
    let list = arg(args, 0)?;
    let items = list
        .as_iterable()
        .ok_or_else(|| ExecutionError::no_such_overload(function, type_names(args)))?;
    let mut iter = items.iter();
    let mut out = Vec::new();
    while let Some(v) = iter.next() {
        out.push(v);
    }
    Ok(out)
}

fn compare(function: &str, a: &dyn Val, b: &dyn Val) -> Result<std::cmp::Ordering, ExecutionError> {
    a.as_comparer()
        .ok_or_else(|| {
            ExecutionError::no_such_overload(
                function,
                vec![
                    a.get_type().name().to_owned(),
                    b.get_type().name().to_owned(),
                ],
            )
        })?
        .compare(b)
}

/// `list.isSorted()`: each element is at least the one before it.
fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let items = elements("isSorted", &args)?;
    for pair in items.windows(2) {
        if compare("isSorted", pair[0], pair[1])? == std::cmp::Ordering::Greater {
            return Ok(owned(CelBool::from(false)));
        }
    }
    Ok(owned(CelBool::from(true)))
}

/// `list.sum()`: of ints, uints or doubles (0 for an empty list); an error
/// on overflow.
fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let items = elements("sum", &args)?;
    let Some(first) = items.first() else {
        return Ok(owned(CelInt::from(0)));
    };
    let mixed = || ExecutionError::function_error("sum", "the list mixes types");
    match first.get_type().kind() {
        Kind::Int => {
            let mut total: i64 = 0;
            for v in &items {
                let x = v.downcast_ref::<CelInt>().ok_or_else(mixed)?;
                total = total
                    .checked_add(*x.inner())
                    .ok_or_else(|| ExecutionError::function_error("sum", "integer overflow"))?;
            }
            Ok(owned(CelInt::from(total)))
        }
        Kind::UInt => {
            let mut total: u64 = 0;
            for v in &items {
                let x = v.downcast_ref::<CelUInt>().ok_or_else(mixed)?;
                total = total.checked_add(*x.inner()).ok_or_else(|| {
                    ExecutionError::function_error("sum", "unsigned integer overflow")
                })?;
            }
            Ok(owned(CelUInt::from(total)))
        }
        Kind::Double => {
            let mut total = 0.0;
            for v in &items {
                total += *v.downcast_ref::<CelDouble>().ok_or_else(mixed)?.inner();
            }
            Ok(owned(CelDouble::from(total)))
        }
        _ => Err(ExecutionError::no_such_overload("sum", type_names(&args))),
    }
}

/// The least (`want` Less) or greatest (`want` Greater) element.
fn extreme<'b, 'v>(
    function: &str,
    args: Vec<CowVal<'b, 'v>>,
    want: std::cmp::Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let items = elements(function, &args)?;
    let mut best: Option<&(dyn Val + 'v)> = None;
    for v in items {
        best = match best {
            Some(b) if compare(function, v, b)? != want => Some(b),
            _ => Some(v),
        };
    }
    match best {
        Some(b) => Ok(CowVal::Owned(b.clone_as_boxed())),
        None => Err(ExecutionError::function_error(
            function,
            format!("{function} called on empty list"),
        )),
    }
}

fn min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme("min", args, std::cmp::Ordering::Less)
}

fn max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme("max", args, std::cmp::Ordering::Greater)
}

/// `list.indexOf(x)`: the index of the first element equal to `x`, or -1.
fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let needle = arg(&args, 1)?;
    let items = elements("indexOf", &args)?;
    let at = items.iter().position(|v| v.equals(needle));
    Ok(owned(CelInt::from(at.map_or(-1, |i| i as i64))))
}

/// `list.lastIndexOf(x)`: the index of the last element equal to `x`, or -1.
fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let needle = arg(&args, 1)?;
    let items = elements("lastIndexOf", &args)?;
    let at = items.iter().rposition(|v| v.equals(needle));
    Ok(owned(CelInt::from(at.map_or(-1, |i| i as i64))))
}
