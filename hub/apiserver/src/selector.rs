//! Label and field selectors of list and watch requests (`labelSelector=`,
//! `fieldSelector=`), parsed and matched as apimachinery's `pkg/labels` and
//! `pkg/fields` do, with their error messages (answered as 400 BadRequest).

// `ApiError` is the crate-wide error (a `metav1.Status`); boxing it is the
// status module's call.

use serde_json::Value;

use crate::status::ApiError;

/// A label selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One requirement: `key op values`.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    /// Sorted and without duplicates.
    pub values: Vec<String>,
}

impl Requirement {
    fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        let value = labels.and_then(|l| l.get(&self.key)).map(label_text);
        let has = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                value.is_some_and(|v| has(&v))
            }
            Operator::NotEquals | Operator::NotIn => value.is_none_or(|v| !has(&v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(v), Some(bound)) = (value, self.values.first()) else {
                    return false;
                };
                let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

fn label_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A label selector: all requirements must hold. The empty selector matches
/// everything; [`LabelSelector::nothing`] matches nothing (a null
/// `metav1.LabelSelector`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    pub fn everything() -> Self {
        LabelSelector::default()
    }

    pub fn nothing() -> Self {
        LabelSelector {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    pub fn is_empty(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    /// Parses the `labelSelector` query syntax: `a=b`, `a==b`, `a!=b`,
    /// `a in (x,y)`, `a notin (x)`, `a`, `!a`, `a>1`, `a<1`, comma-separated.
    pub fn parse(selector: &str) -> Result<Self, ApiError> {
        let tokens = lex(selector);
        let mut p = Parser { tokens, pos: 0 };
        let mut requirements = p.parse().map_err(ApiError::bad_request)?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// A `metav1.LabelSelector` (`matchLabels`, `matchExpressions`); `null`
    /// selects nothing, `{}` everything.
    pub fn from_label_selector_json(selector: &Value) -> Result<Self, ApiError> {
        let Value::Object(m) = selector else {
            return Ok(if selector.is_null() {
                LabelSelector::nothing()
            } else {
                LabelSelector::everything()
            });
        };
        let mut requirements = Vec::new();
        if let Some(Value::Object(labels)) = m.get("matchLabels") {
            for (k, v) in labels {
                let v = label_text(v);
                requirements.push(new_requirement(k, Operator::Equals, vec![v])?);
            }
        }
        if let Some(Value::Array(exprs)) = m.get("matchExpressions") {
            for e in exprs {
                let key = e.get("key").and_then(Value::as_str).unwrap_or("");
                let op = e.get("operator").and_then(Value::as_str).unwrap_or("");
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|vs| vs.iter().map(label_text).collect())
                    .unwrap_or_default();
                let operator = match op {
                    "In" => Operator::In,
                    "NotIn" => Operator::NotIn,
                    "Exists" => Operator::Exists,
                    "DoesNotExist" => Operator::DoesNotExist,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "{other:?} is not a valid label selector operator"
                        )));
                    }
                };
                requirements.push(new_requirement(key, operator, values)?);
            }
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// Whether labels (`metadata.labels`, absent for none) match.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        if self.nothing {
            return false;
        }
        let labels = labels.and_then(Value::as_object);
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether an object's `metadata.labels` match.
    pub fn matches_object(&self, object: &Value) -> bool {
        self.matches(object.pointer("/metadata/labels"))
    }
}

fn new_requirement(
    key: &str,
    operator: Operator,
    values: Vec<String>,
) -> Result<Requirement, ApiError> {
    let mut errs: Vec<String> = Vec::new();
    if let Some(e) = label_key_error(key, "key") {
        errs.push(e);
    }
    let mut values = values;
    values.sort();
    values.dedup();
    let rendered = serde_json::to_string(&values).unwrap_or_default();
    match operator {
        Operator::In | Operator::NotIn if values.is_empty() => errs.push(format!(
            "values: Invalid value: {rendered}: for 'in', 'notin' operators, values set can't be empty"
        )),
        Operator::Equals | Operator::DoubleEquals | Operator::NotEquals if values.len() != 1 => {
            errs.push(format!(
                "values: Invalid value: {rendered}: exact-match compatibility requires one single value"
            ))
        }
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => errs.push(format!(
            "values: Invalid value: {rendered}: values set must be empty for exists and does not exist"
        )),
        Operator::GreaterThan | Operator::LessThan => {
            if values.len() != 1 {
                errs.push(format!(
                    "values: Invalid value: {rendered}: for 'Gt', 'Lt' operators, exactly one value is required"
                ));
            }
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(format!(
                        "values[{i}]: Invalid value: {v:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                    ));
                }
            }
        }
        _ => {}
    }
    for (i, v) in values.iter().enumerate() {
        if let Some(msg) = label_value_error(v) {
            errs.push(format!("values[{i}][{key}]: Invalid value: {v:?}: {msg}"));
        }
    }
    errs.dedup();
    match errs.len() {
        0 => Ok(Requirement {
            key: key.to_string(),
            operator,
            values,
        }),
        1 => Err(ApiError::bad_request(errs.remove(0))),
        _ => Err(ApiError::bad_request(format!("[{}]", errs.join(", ")))),
    }
}

const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_KEY_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        let (Some(first), Some(last)) = (b.first(), b.last()) else {
            return false;
        };
        let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        ok(first) && ok(last) && b.iter().all(|c| ok(c) || *c == b'-')
    })
}

/// Upstream's `IsQualifiedName` messages, joined by `; `.
fn label_key_messages(key: &str) -> Vec<String> {
    let parts: Vec<&str> = key.split('/').collect();
    let mut errs = Vec::new();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                if prefix.len() > 253 {
                    errs.push("prefix part must be no more than 253 bytes".to_string());
                }
                if !is_dns1123_subdomain(prefix) {
                    errs.push(format!(
                        "prefix part {}",
                        regex_error(DNS_SUBDOMAIN_MSG, DNS_SUBDOMAIN_FMT, &["example.com"])
                    ));
                }
            }
            *name
        }
        _ => {
            return vec![format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    LABEL_KEY_MSG,
                    LABEL_KEY_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 bytes".into());
    }
    if !is_label_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                LABEL_KEY_MSG,
                LABEL_KEY_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

fn label_key_error(key: &str, field: &str) -> Option<String> {
    let errs = label_key_messages(key);
    (!errs.is_empty()).then(|| format!("{field}: Invalid value: {key:?}: {}", errs.join("; ")))
}

/// Upstream's `IsQualifiedName`: why `key` is not a valid label key (or
/// annotation key, or resource name), none when it is.
pub fn qualified_name_errors(key: &str) -> Vec<String> {
    label_key_messages(key)
}

/// Upstream's `IsValidLabelValue`: why `value` is not a valid label value,
/// none when it is.
pub fn label_value_errors(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push("must be no more than 63 bytes".to_string());
    }
    if !v.is_empty() && !is_label_name(v) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

fn label_value_error(v: &str) -> Option<String> {
    let errs = label_value_errors(v);
    (!errs.is_empty()).then(|| errs.join("; "))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    Bang,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
    End,
    Error(String),
}

impl Tok {
    fn literal(&self) -> String {
        match self {
            Tok::Ident(s) | Tok::Error(s) => s.clone(),
            Tok::In => "in".into(),
            Tok::NotIn => "notin".into(),
            Tok::Equals => "=".into(),
            Tok::DoubleEquals => "==".into(),
            Tok::NotEquals => "!=".into(),
            Tok::Bang => "!".into(),
            Tok::Gt => ">".into(),
            Tok::Lt => "<".into(),
            Tok::Open => "(".into(),
            Tok::Close => ")".into(),
            Tok::Comma => ",".into(),
            Tok::End => String::new(),
        }
    }

    /// In value position `in` and `notin` are plain identifiers.
    fn into_value(self) -> Tok {
        match self {
            Tok::In => Tok::Ident("in".into()),
            Tok::NotIn => Tok::Ident("notin".into()),
            other => other,
        }
    }
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

fn symbol(s: &[u8]) -> Option<Tok> {
    Some(match s {
        b")" => Tok::Close,
        b"," => Tok::Comma,
        b"!" => Tok::Bang,
        b"==" => Tok::DoubleEquals,
        b"=" => Tok::Equals,
        b">" => Tok::Gt,
        b"<" => Tok::Lt,
        b"!=" => Tok::NotEquals,
        b"(" => Tok::Open,
        _ => return None,
    })
}

fn lex(s: &str) -> Vec<Tok> {
    let b = s.as_bytes();
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        while pos < b.len() && is_space(b[pos]) {
            pos += 1;
        }
        if pos >= b.len() {
            out.push(Tok::End);
            return out;
        }
        if is_special(b[pos]) {
            // The longest run of symbols that still forms an operator.
            let start = pos;
            let mut last: Option<(Tok, usize)> = None;
            while pos < b.len() && is_special(b[pos]) {
                pos += 1;
                if let Some(t) = symbol(&b[start..pos]) {
                    last = Some((t, pos));
                } else if last.is_some() {
                    pos -= 1;
                    break;
                }
            }
            match last {
                Some((t, end)) => {
                    pos = end;
                    out.push(t);
                }
                None => out.push(Tok::Error(format!(
                    "error expected: keyword found '{}'",
                    String::from_utf8_lossy(&b[start..pos])
                ))),
            }
        } else {
            let start = pos;
            while pos < b.len() && !is_special(b[pos]) && !is_space(b[pos]) {
                pos += 1;
            }
            let word = String::from_utf8_lossy(&b[start..pos]).into_owned();
            out.push(match word.as_str() {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Ident(word),
            });
        }
    }
}

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Tok {
        self.tokens.get(self.pos).cloned().unwrap_or(Tok::End)
    }

    fn next(&mut self) -> Tok {
        let t = self.peek();
        self.pos += 1;
        t
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut reqs = Vec::new();
        loop {
            match self.peek().into_value() {
                Tok::Ident(_) | Tok::Bang => {
                    let r = self
                        .requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    reqs.push(r);
                    match self.next().into_value() {
                        Tok::End => return Ok(reqs),
                        Tok::Comma => {
                            let t = self.peek().into_value();
                            if !matches!(t, Tok::Ident(_) | Tok::Bang) {
                                return Err(format!(
                                    "found '{}', expected: identifier after ','",
                                    t.literal()
                                ));
                            }
                        }
                        t => {
                            return Err(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            ));
                        }
                    }
                }
                Tok::End => return Ok(reqs),
                t => {
                    return Err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    ));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let mut negated = false;
        let mut t = self.next().into_value();
        if t == Tok::Bang {
            negated = true;
            t = self.next().into_value();
        }
        let Tok::Ident(key) = t else {
            return Err(format!("found '{}', expected: identifier", t.literal()));
        };
        if let Some(e) = label_key_error(&key, "<nil>") {
            return Err(e);
        }
        let unary = matches!(self.peek().into_value(), Tok::End | Tok::Comma);
        if negated || unary {
            let op = if negated {
                Operator::DoesNotExist
            } else {
                Operator::Exists
            };
            return new_requirement(&key, op, Vec::new()).map_err(|e| e.message);
        }
        let op = match self.next() {
            Tok::In => Operator::In,
            Tok::Equals => Operator::Equals,
            Tok::DoubleEquals => Operator::DoubleEquals,
            Tok::Gt => Operator::GreaterThan,
            Tok::Lt => Operator::LessThan,
            Tok::NotIn => Operator::NotIn,
            Tok::NotEquals => Operator::NotEquals,
            t => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    t.literal()
                ));
            }
        };
        let values = match op {
            Operator::In | Operator::NotIn => self.set_values()?,
            _ => self.exact_value()?,
        };
        new_requirement(&key, op, values).map_err(|e| e.message)
    }

    fn set_values(&mut self) -> Result<Vec<String>, String> {
        let t = self.next().into_value();
        if t != Tok::Open {
            return Err(format!("found '{}' expected: '('", t.literal()));
        }
        match self.peek().into_value() {
            Tok::Ident(_) | Tok::Comma => {
                let values = self.identifiers()?;
                let t = self.next().into_value();
                if t != Tok::Close {
                    return Err(format!("found '{}', expected: ')'", t.literal()));
                }
                Ok(values)
            }
            Tok::Close => {
                self.next();
                Ok(vec![String::new()])
            }
            t => Err(format!(
                "found '{}', expected: ',', ')' or identifier",
                t.literal()
            )),
        }
    }

    fn identifiers(&mut self) -> Result<Vec<String>, String> {
        let mut values: Vec<String> = Vec::new();
        loop {
            match self.next().into_value() {
                Tok::Ident(v) => {
                    values.push(v);
                    match self.peek().into_value() {
                        Tok::Comma => continue,
                        Tok::Close => return Ok(values),
                        t => {
                            return Err(format!("found '{}', expected: ',' or ')'", t.literal()));
                        }
                    }
                }
                Tok::Comma => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    match self.peek().into_value() {
                        Tok::Close | Tok::Comma => values.push(String::new()),
                        _ => {}
                    }
                    if self.peek().into_value() == Tok::Close {
                        return Ok(values);
                    }
                }
                t => {
                    return Err(format!(
                        "found '{}', expected: ',', or identifier",
                        t.literal()
                    ));
                }
            }
        }
    }

    fn exact_value(&mut self) -> Result<Vec<String>, String> {
        if matches!(self.peek().into_value(), Tok::End | Tok::Comma) {
            return Ok(vec![String::new()]);
        }
        match self.next().into_value() {
            Tok::Ident(v) => Ok(vec![v]),
            t => Err(format!("found '{}', expected: identifier", t.literal())),
        }
    }
}

/// A field selector: `field=value`, `field==value`, `field!=value`,
/// comma-separated, all of which must hold.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldSelector {
    /// `(field, equals, value)`.
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn everything() -> Self {
        FieldSelector::default()
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The value a term requires of `field` with `=`/`==`, e.g. the name a
    /// `metadata.name=x` selector pins.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|(f, eq, _)| *eq && f == field)
            .map(|(_, _, v)| v.as_str())
    }

    /// Parses `selector`; fields outside `supported` are refused as
    /// upstream refuses them (`field label not supported: X`).
    pub fn parse(selector: &str, supported: &[&str]) -> Result<Self, ApiError> {
        let mut parts = split_terms(selector);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts.iter().filter(|p| !p.is_empty()) {
            let Some((lhs, op, rhs)) = split_term(part) else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                )));
            };
            let value = unescape(rhs).map_err(ApiError::bad_request)?;
            terms.push((lhs.to_string(), op != "!=", value));
        }
        for (field, _, _) in &terms {
            if !supported.contains(&field.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
        }
        Ok(FieldSelector { terms })
    }

    /// Whether `object` matches: each field is read at its dotted path
    /// (`metadata.name`, `involvedObject.name`, `status.phase`); a missing
    /// field reads as the empty string.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|(field, equals, want)| {
            let got = field_text(object, field);
            (got == *want) == *equals
        })
    }
}

fn field_text(object: &Value, field: &str) -> String {
    let mut node = object;
    for part in field.split('.') {
        match node.get(part) {
            Some(n) => node = n,
            None => return String::new(),
        }
    }
    match node {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn split_terms(s: &str) -> Vec<String> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            escaped = false;
            current.push(c);
        } else if c == '\\' {
            escaped = true;
            current.push(c);
        } else if c == ',' {
            terms.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    terms.push(current);
    terms
}

fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        for op in ["!=", "==", "="] {
            if term[i..].starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{c}"
                    ));
                }
            }
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                ));
            }
            _ => out.push(c),
        }
    }
    if escaped {
        return Err("invalid field selector: invalid escape sequence: \\".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "pytorch-dist-node-0-0-abcde", "namespace": "team-a", "labels": labels},
               "status": {"phase": "Running"}})
    }

    fn sdk_labels() -> Value {
        json!({"jobset.sigs.k8s.io/jobset-name": "pytorch-dist",
               "jobset.sigs.k8s.io/replicatedjob-name": "node",
               "batch.kubernetes.io/job-completion-index": "0"})
    }

    #[test]
    fn equality_and_set_based_selectors() {
        let p = pod(sdk_labels());
        let cases = [
            ("jobset.sigs.k8s.io/jobset-name=pytorch-dist", true),
            ("jobset.sigs.k8s.io/jobset-name==pytorch-dist", true),
            ("jobset.sigs.k8s.io/jobset-name!=pytorch-dist", false),
            (
                "jobset.sigs.k8s.io/replicatedjob-name in (node, launcher)",
                true,
            ),
            ("jobset.sigs.k8s.io/replicatedjob-name notin (node)", false),
            ("jobset.sigs.k8s.io/replicatedjob-name,!missing", true),
            ("missing", false),
            ("!jobset.sigs.k8s.io/jobset-name", false),
            ("missing!=x", true),
            ("missing notin (x)", true),
            ("batch.kubernetes.io/job-completion-index>0", false),
            ("batch.kubernetes.io/job-completion-index<1", true),
            (
                "jobset.sigs.k8s.io/jobset-name=pytorch-dist,jobset.sigs.k8s.io/replicatedjob-name=node",
                true,
            ),
            (
                "jobset.sigs.k8s.io/jobset-name=pytorch-dist,jobset.sigs.k8s.io/replicatedjob-name=x",
                false,
            ),
            ("", true),
        ];
        for (s, want) in cases {
            let sel = LabelSelector::parse(s).unwrap();
            assert_eq!(sel.matches_object(&p), want, "{s}");
        }
        let none = pod(Value::Null);
        assert!(LabelSelector::parse("a!=b").unwrap().matches_object(&none));
        assert!(!LabelSelector::parse("a").unwrap().matches_object(&none));
        // `in` as a value.
        let sel = LabelSelector::parse("x in (in,notin)").unwrap();
        assert_eq!(sel.requirements()[0].values, ["in", "notin"]);
    }

    #[test]
    fn parse_errors_read_like_upstream() {
        let cases = [
            ("x=a b", "found 'b', expected: ',' or 'end of string'"),
            (
                "x in a",
                "unable to parse requirement: found 'a' expected: '('",
            ),
            (
                "x in (a",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                ",x",
                "found ',', expected: !, identifier, or 'end of string'",
            ),
            ("x,", "found '', expected: identifier after ','"),
            (
                "x=!",
                "unable to parse requirement: found '!', expected: identifier",
            ),
        ];
        for (s, want) in cases {
            let e = LabelSelector::parse(s).unwrap_err();
            assert_eq!((e.code, e.reason), (400, "BadRequest"));
            assert_eq!(e.message, want, "{s}");
        }
        let e = LabelSelector::parse("-bad=x").unwrap_err();
        assert_eq!(
            e.message,
            "unable to parse requirement: <nil>: Invalid value: \"-bad\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        );
        let e = LabelSelector::parse("app=-x").unwrap_err();
        assert_eq!(
            e.message,
            "unable to parse requirement: values[0][app]: Invalid value: \"-x\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        );
        let e = LabelSelector::parse("a>x").unwrap_err();
        assert_eq!(
            e.message,
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
    }

    #[test]
    fn metav1_label_selector() {
        let sel = LabelSelector::from_label_selector_json(&json!({
            "matchLabels": {"jobset.sigs.k8s.io/jobset-name": "pytorch-dist"},
            "matchExpressions": [
                {"key": "jobset.sigs.k8s.io/replicatedjob-name", "operator": "In", "values": ["node"]},
                {"key": "gone", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        assert!(sel.matches_object(&pod(sdk_labels())));
        assert!(!sel.matches_object(&pod(json!({"jobset.sigs.k8s.io/jobset-name": "other"}))));
        assert!(
            !LabelSelector::from_label_selector_json(&Value::Null)
                .unwrap()
                .matches_object(&pod(sdk_labels()))
        );
        assert!(
            LabelSelector::from_label_selector_json(&json!({}))
                .unwrap()
                .matches_object(&pod(sdk_labels()))
        );
        let e = LabelSelector::from_label_selector_json(
            &json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
        );
        let e = LabelSelector::from_label_selector_json(
            &json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]}),
        )
        .unwrap_err();
        assert_eq!(e.message, "\"Gt\" is not a valid label selector operator");
    }

    #[test]
    fn field_selectors() {
        let supported = ["metadata.name", "metadata.namespace", "status.phase"];
        let p = pod(sdk_labels());
        let sel = FieldSelector::parse(
            "metadata.name=pytorch-dist-node-0-0-abcde,status.phase!=Failed",
            &supported,
        )
        .unwrap();
        assert!(sel.matches(&p));
        assert_eq!(
            sel.requires_exact_match("metadata.name"),
            Some("pytorch-dist-node-0-0-abcde")
        );
        let sel = FieldSelector::parse("status.phase==Succeeded", &supported).unwrap();
        assert!(!sel.matches(&p));
        // A missing field reads as "".
        let sel = FieldSelector::parse("metadata.namespace!=", &supported).unwrap();
        assert!(sel.matches(&p));
        let e = FieldSelector::parse("spec.nodeName=x", &supported).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "field label not supported: spec.nodeName")
        );
        let e = FieldSelector::parse("metadata.name", &supported).unwrap_err();
        assert_eq!(
            e.message,
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
        let e = FieldSelector::parse("metadata.name=a=b", &supported).unwrap_err();
        assert_eq!(
            e.message,
            "invalid field selector: unescaped character in value: 61"
        );
        let sel = FieldSelector::parse("metadata.name=a\\=b\\,c", &supported).unwrap();
        assert_eq!(sel.requires_exact_match("metadata.name"), Some("a=b,c"));
        let event = json!({"involvedObject": {"name": "pytorch-dist", "kind": "TrainJob"}});
        let sel = FieldSelector::parse(
            "involvedObject.name=pytorch-dist,involvedObject.kind=TrainJob",
            &["involvedObject.name", "involvedObject.kind"],
        )
        .unwrap();
        assert!(sel.matches(&event));
    }
}
