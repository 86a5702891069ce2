//! Kubernetes' CEL format library: `format.dns1123Label()` and the other
//! named formats, `format.named(name)` (an optional format), and
//! `<format>.validate(s)`: `optional.none()` when `s` is valid, else an
//! optional list of what is wrong, in apimachinery's words.
//!
//! Formats served: `dns1123Label`, `dns1123Subdomain`, `dns1035Label`,
//! `qualifiedName`, `labelValue`, `uuid`.

use std::any::Any;
use std::sync::LazyLock;

use cel::common::types::{self, CelList, CelOptional, CelString, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};
use regex::Regex;

use super::library::owned;

/// The CEL type of formats, as Kubernetes names it.
pub static FORMAT_TYPE: Type = Type::new_unspecified_type("kubernetes.NamedFormat");

/// A named format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Dns1123Label,
    Dns1123Subdomain,
    Dns1035Label,
    QualifiedName,
    LabelValue,
    Uuid,
}

impl Val for Format {
    fn get_type(&self) -> &Type {
        &FORMAT_TYPE
    }

    fn cel_type() -> &'static Type {
        &FORMAT_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Format>() == Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Format {}

const LABEL: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1035: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const UUID: &str = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";

/// The whole-string regex of `pattern` (a constant of this module).
fn anchored(pattern: &'static str) -> Option<Regex> {
    Regex::new(&format!("^(?:{pattern})$")).ok()
}

struct Patterns {
    label: Option<Regex>,
    subdomain: Option<Regex>,
    dns1035: Option<Regex>,
    qualified: Option<Regex>,
    label_value: Option<Regex>,
    uuid: Option<Regex>,
}

static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| Patterns {
    label: anchored(LABEL),
    subdomain: anchored("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"),
    dns1035: anchored(DNS1035),
    qualified: anchored(QUALIFIED),
    label_value: anchored(LABEL_VALUE),
    uuid: anchored(UUID),
});

/// Whether `re` (a pattern of this module, which always compiles) matches.
fn is(re: &Option<Regex>, s: &str) -> bool {
    re.as_ref().is_some_and(|re| re.is_match(s))
}

/// apimachinery's message for a value a regex rejects.
fn regex_error(message: &str, pattern: &str, examples: &[&str]) -> String {
    let examples: String = examples
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}'{e}', ", if i > 0 { " or " } else { "" }))
        .collect();
    format!("{message} (e.g. {examples}regex used for validation is '{pattern}')")
}

fn too_long(max: usize) -> String {
    format!("must be no more than {max} characters")
}

const LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
     characters or '-', and must start and end with an alphanumeric character";
const SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
     alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if s.len() > 253 {
        errors.push(too_long(253));
    }
    if !is(&PATTERNS.subdomain, s) {
        errors.push(regex_error(
            SUBDOMAIN_MESSAGE,
            "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
            &["example.com"],
        ));
    }
    errors
}

impl Format {
    fn named(name: &str) -> Option<Format> {
        Some(match name {
            "dns1123Label" => Format::Dns1123Label,
            "dns1123Subdomain" => Format::Dns1123Subdomain,
            "dns1035Label" => Format::Dns1035Label,
            "qualifiedName" => Format::QualifiedName,
            "labelValue" => Format::LabelValue,
            "uuid" => Format::Uuid,
            _ => return None,
        })
    }

    /// What is wrong with `s` in this format; empty when it is valid.
    pub fn validate(self, s: &str) -> Vec<String> {
        let mut errors = Vec::new();
        match self {
            Format::Dns1123Label => {
                if s.len() > 63 {
                    errors.push(too_long(63));
                }
                if !is(&PATTERNS.label, s) {
                    errors.push(regex_error(LABEL_MESSAGE, LABEL, &["my-name", "123-abc"]));
                }
            }
            Format::Dns1123Subdomain => errors = dns1123_subdomain(s),
            Format::Dns1035Label => {
                if s.len() > 63 {
                    errors.push(too_long(63));
                }
                if !is(&PATTERNS.dns1035, s) {
                    errors.push(regex_error(
                        "a DNS-1035 label must consist of lower case alphanumeric characters or \
                         '-', start with an alphabetic character, and end with an alphanumeric \
                         character",
                        DNS1035,
                        &["my-name", "abc-123"],
                    ));
                }
            }
            Format::QualifiedName => errors = qualified_name(s),
            Format::LabelValue => {
                if s.len() > 63 {
                    errors.push(too_long(63));
                }
                if !is(&PATTERNS.label_value, s) {
                    errors.push(regex_error(
                        "a valid label must be an empty string or consist of alphanumeric \
                         characters, '-', '_' or '.', and must start and end with an \
                         alphanumeric character",
                        LABEL_VALUE,
                        &["MyValue", "my_value", "12345"],
                    ));
                }
            }
            Format::Uuid => {
                if !is(&PATTERNS.uuid, s) {
                    errors.push("does not match the UUID format".to_string());
                }
            }
        }
        errors
    }
}

const QUALIFIED_MESSAGE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and \
     must start and end with an alphanumeric character";

/// apimachinery's `IsQualifiedName`: `[prefix/]name`, the prefix a DNS
/// subdomain.
fn qualified_name(s: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_string());
            } else {
                errors.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|e| format!("prefix part {e}")),
                );
            }
            *name
        }
        _ => {
            errors.push(format!(
                "{} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    &format!("a qualified name {QUALIFIED_MESSAGE}"),
                    QUALIFIED,
                    &["MyName", "my.name", "123-abc"],
                )
            ));
            return errors;
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errors.push(format!("name part {}", too_long(63)));
    }
    if !is(&PATTERNS.qualified, name) {
        errors.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_MESSAGE,
                QUALIFIED,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errors
}

/// Registers `format.named`, the named format functions and `validate`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    let f = || FORMAT_TYPE.to_owned();
    env.add_type(f())?;
    env.add_overload(
        "format.named",
        "format_named",
        vec![types::STRING_TYPE],
        named,
    )?;
    for (name, id, constructor) in CONSTRUCTORS {
        env.add_overload(name, id, vec![], *constructor)?;
    }
    env.add_member_overload(
        "validate",
        "format_validate",
        f(),
        vec![types::STRING_TYPE],
        validate,
    )?;
    Ok(())
}

/// `format.<name>()`: the function, its overload id, its implementation.
const CONSTRUCTORS: &[(&str, &str, cel::common::functions::Function)] = &[
    ("format.dns1123Label", "format_dns1123_label", dns1123_label),
    (
        "format.dns1123Subdomain",
        "format_dns1123_subdomain",
        dns1123_subdomain_format,
    ),
    ("format.dns1035Label", "format_dns1035_label", dns1035_label),
    (
        "format.qualifiedName",
        "format_qualified_name",
        qualified_name_format,
    ),
    ("format.labelValue", "format_label_value", label_value),
    ("format.uuid", "format_uuid", uuid),
];

macro_rules! constructor {
    ($name:ident, $format:expr) => {
        fn $name<'b, 'v>(_: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            Ok(owned($format))
        }
    };
}

constructor!(dns1123_label, Format::Dns1123Label);
constructor!(dns1123_subdomain_format, Format::Dns1123Subdomain);
constructor!(dns1035_label, Format::Dns1035Label);
constructor!(qualified_name_format, Format::QualifiedName);
constructor!(label_value, Format::LabelValue);
constructor!(uuid, Format::Uuid);

fn named<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let name = args
        .first()
        .and_then(|a| a.downcast_ref::<CelString>())
        .map(CelString::inner)
        .ok_or_else(|| ExecutionError::function_error("format.named", "expects a string"))?;
    Ok(owned(match Format::named(name) {
        Some(format) => CelOptional::of(Box::new(format)),
        None => CelOptional::none(),
    }))
}

fn validate<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (Some(format), Some(s)) = (
        args.first().and_then(|a| a.downcast_ref::<Format>()),
        args.get(1).and_then(|a| a.downcast_ref::<CelString>()),
    ) else {
        return Err(ExecutionError::function_error(
            "validate",
            "expects a format and a string",
        ));
    };
    let errors = format.validate(s.inner());
    if errors.is_empty() {
        return Ok(owned(CelOptional::none()));
    }
    let list: Vec<Box<dyn Val + 'v>> = errors
        .into_iter()
        .map(|e| Box::new(CelString::from(e)) as Box<dyn Val + 'v>)
        .collect();
    Ok(owned(CelOptional::of(Box::new(CelList::from(list)))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_validate_as_apimachinery_does() {
        assert!(Format::Dns1123Label.validate("my-name").is_empty());
        assert_eq!(
            Format::Dns1123Label.validate("My_Name"),
            [
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters \
                 or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  \
                 or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        assert_eq!(
            Format::Dns1123Label.validate(&"a".repeat(64)),
            ["must be no more than 63 characters"]
        );
        assert!(Format::Dns1123Subdomain.validate("example.com").is_empty());
        assert_eq!(Format::Dns1123Subdomain.validate("-x.com").len(), 1);
        assert!(Format::Dns1035Label.validate("abc-1").is_empty());
        assert_eq!(Format::Dns1035Label.validate("1abc").len(), 1);
        assert!(Format::LabelValue.validate("").is_empty());
        assert!(Format::LabelValue.validate("My_value.1").is_empty());
        assert_eq!(Format::LabelValue.validate("-x").len(), 1);
        assert!(
            Format::QualifiedName
                .validate("example.com/MyName")
                .is_empty()
        );
        assert_eq!(
            Format::QualifiedName.validate("/x"),
            ["prefix part must be non-empty"]
        );
        assert_eq!(Format::QualifiedName.validate("a/b/c").len(), 1);
        assert!(
            Format::Uuid
                .validate("123e4567-e89b-12d3-a456-426614174000")
                .is_empty()
        );
        assert_eq!(Format::Uuid.validate("nope").len(), 1);
    }
}
