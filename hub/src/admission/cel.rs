//! The `x-kubernetes-validations` rules of the trainer.kubeflow.org CRDs.
//!
//! kube-apiserver evaluates these rules with a CEL interpreter. The CRDs use
//! a handful of rule shapes only, so each shape is recognised from its text
//! and evaluated natively with the same semantics. A rule of any other shape
//! is [`Check::Unknown`]: it is skipped, and a test keeps the generated CRDs
//! free of such rules.

use regex::Regex;
use serde_json::Value;

/// One rule of a schema node.
#[derive(Debug)]
pub struct Rule {
    pub text: String,
    check: Check,
    message: String,
}

/// What a rule checks, recognised from its text.
#[derive(Debug)]
pub enum Check {
    /// `self == oldSelf`: a transition rule, evaluated on updates only.
    Immutable,
    /// `self >= N`
    AtLeast(i64),
    /// `self in ['a', 'b']`
    OneOf(Vec<String>),
    /// `self == '' || self.matches('RE')`
    EmptyOrMatches(Regex),
    /// `self.metadata.name.matches('RE')`
    NameMatches(Regex),
    /// `size(self.metadata.name) <= N`
    NameAtMost(usize),
    /// `has(self.field)`
    Has(String),
    /// `[has(self.a), has(self.b), ...].filter(x, x).size() <= 1`
    AtMostOneOf(Vec<String>),
    /// `!self.exists(c, c == 'v')`
    NotContains(String),
    /// JobSet's `!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && self.replicatedJobs.exists(x, has(x.dependsOn)))`
    InOrderWithoutDependsOn,
    /// JobSet's `self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)`
    TemplatesWithoutNamespace,
    /// A rule this module does not understand; never fails.
    Unknown,
}

/// The result of evaluating one rule.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// Not evaluated: a transition rule without an old value, or a value of
    /// a type the rule does not apply to.
    Skipped,
}

impl Rule {
    /// A rule from its `x-kubernetes-validations` entry.
    pub fn compile(entry: &Value) -> Rule {
        let text = entry
            .get("rule")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        // kube-apiserver's message for a rule without one.
        let message = entry
            .get("message")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("failed rule: {text}"));
        Rule {
            check: Check::parse(&text),
            text,
            message,
        }
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn is_known(&self) -> bool {
        !matches!(self.check, Check::Unknown)
    }

    /// Evaluates the rule on `value`, with `old` the correlated old value on
    /// updates, and `equal` the schema's equality (lists of type set and map
    /// compare without regard to order).
    pub fn evaluate(
        &self,
        value: &Value,
        old: Option<&Value>,
        equal: impl Fn(&Value, &Value) -> bool,
    ) -> Verdict {
        let verdict = |ok: bool| if ok { Verdict::Pass } else { Verdict::Fail };
        match &self.check {
            Check::Immutable => match old {
                Some(old) => verdict(equal(value, old)),
                None => Verdict::Skipped,
            },
            Check::AtLeast(min) => match value.as_f64() {
                Some(n) => verdict(n >= *min as f64),
                None => Verdict::Skipped,
            },
            Check::OneOf(allowed) => match value.as_str() {
                Some(s) => verdict(allowed.iter().any(|a| a == s)),
                None => Verdict::Skipped,
            },
            Check::EmptyOrMatches(re) => match value.as_str() {
                Some(s) => verdict(s.is_empty() || re.is_match(s)),
                None => Verdict::Skipped,
            },
            Check::NameMatches(re) => match name(value) {
                Some(s) => verdict(re.is_match(s)),
                None => Verdict::Skipped,
            },
            Check::NameAtMost(max) => match name(value) {
                Some(s) => verdict(s.chars().count() <= *max),
                None => Verdict::Skipped,
            },
            Check::Has(field) => match value.as_object() {
                Some(map) => verdict(map.contains_key(field)),
                None => Verdict::Skipped,
            },
            Check::AtMostOneOf(fields) => match value.as_object() {
                Some(map) => verdict(fields.iter().filter(|f| map.contains_key(*f)).count() <= 1),
                None => Verdict::Skipped,
            },
            Check::NotContains(item) => match value.as_array() {
                Some(items) => verdict(!items.iter().any(|v| v.as_str() == Some(item))),
                None => Verdict::Skipped,
            },
            Check::InOrderWithoutDependsOn => {
                let in_order = value
                    .pointer("/startupPolicy/startupPolicyOrder")
                    .and_then(Value::as_str)
                    == Some("InOrder");
                let depends = value
                    .get("replicatedJobs")
                    .and_then(Value::as_array)
                    .is_some_and(|jobs| jobs.iter().any(|j| j.get("dependsOn").is_some()));
                verdict(!(in_order && depends))
            }
            Check::TemplatesWithoutNamespace => {
                let templates = value
                    .get("templates")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                verdict(templates.iter().all(|t| {
                    t.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                }))
            }
            Check::Unknown => Verdict::Skipped,
        }
    }
}

fn name(value: &Value) -> Option<&str> {
    value.pointer("/metadata/name").and_then(Value::as_str)
}

impl Check {
    fn parse(text: &str) -> Check {
        const IN_ORDER: &str = "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && self.replicatedJobs.exists(x, has(x.dependsOn)))";
        const NO_NAMESPACE: &str =
            "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)";
        match text {
            "self == oldSelf" => return Check::Immutable,
            IN_ORDER => return Check::InOrderWithoutDependsOn,
            NO_NAMESPACE => return Check::TemplatesWithoutNamespace,
            _ => {}
        }
        if let Some(n) = text.strip_prefix("self >= ")
            && let Ok(n) = n.parse()
        {
            return Check::AtLeast(n);
        }
        if let Some(list) = text
            .strip_prefix("self in [")
            .and_then(|r| r.strip_suffix(']'))
            && let Some(items) = string_list(list)
        {
            return Check::OneOf(items);
        }
        if let Some(re) = text
            .strip_prefix("self == '' || self.matches('")
            .and_then(|r| r.strip_suffix("')"))
            .and_then(compile)
        {
            return Check::EmptyOrMatches(re);
        }
        if let Some(re) = text
            .strip_prefix("self.metadata.name.matches('")
            .and_then(|r| r.strip_suffix("')"))
            .and_then(compile)
        {
            return Check::NameMatches(re);
        }
        if let Some(n) = text.strip_prefix("size(self.metadata.name) <= ")
            && let Ok(n) = n.parse()
        {
            return Check::NameAtMost(n);
        }
        if let Some(field) = text
            .strip_prefix("has(self.")
            .and_then(|r| r.strip_suffix(')'))
            .filter(|f| is_identifier(f))
        {
            return Check::Has(field.to_string());
        }
        if let Some(list) = text
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix("].filter(x, x).size() <= 1"))
        {
            let fields: Option<Vec<String>> = list
                .split(',')
                .map(|item| {
                    item.trim()
                        .strip_prefix("has(self.")
                        .and_then(|r| r.strip_suffix(')'))
                        .filter(|f| is_identifier(f))
                        .map(str::to_string)
                })
                .collect();
            if let Some(fields) = fields {
                return Check::AtMostOneOf(fields);
            }
        }
        if let Some(item) = text
            .strip_prefix("!self.exists(c, c == '")
            .and_then(|r| r.strip_suffix("')"))
            .filter(|s| !s.contains('\''))
        {
            return Check::NotContains(item.to_string());
        }
        Check::Unknown
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `'a', 'b'` as a list of strings.
fn string_list(list: &str) -> Option<Vec<String>> {
    list.split(',')
        .map(|item| {
            item.trim()
                .strip_prefix('\'')
                .and_then(|r| r.strip_suffix('\''))
                .filter(|s| !s.contains('\''))
                .map(str::to_string)
        })
        .collect()
}

/// A CEL string literal's regular expression (RE2 syntax, as `regex` reads it).
fn compile(pattern: &str) -> Option<Regex> {
    if pattern.contains('\'') {
        return None;
    }
    // Inside a CEL single-quoted string, `\\` is one backslash.
    Regex::new(&pattern.replace("\\\\", "\\")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(text: &str) -> Rule {
        Rule::compile(&json!({"rule": text, "message": "m"}))
    }

    fn eval(text: &str, value: Value) -> Verdict {
        rule(text).evaluate(&value, None, |a, b| a == b)
    }

    #[test]
    fn every_shape_is_recognised() {
        for text in [
            "self == oldSelf",
            "self >= 1",
            "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']",
            "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')",
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "size(self.metadata.name) <= 63",
            "has(self.lastUpdatedTime)",
            "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)].filter(x, x).size() <= 1",
            "!self.exists(c, c == 'node')",
            "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder'\n  && self.replicatedJobs.exists(x, has(x.dependsOn)))",
            "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)",
        ] {
            assert!(rule(text).is_known(), "{text}");
        }
        assert!(!rule("self.size() > 2").is_known());
    }

    #[test]
    fn rules_evaluate_as_cel_does() {
        assert_eq!(eval("self >= 1", json!(0)), Verdict::Fail);
        assert_eq!(eval("self >= 1", json!(1)), Verdict::Pass);
        let managed = "self in ['a/b', 'c/d']";
        assert_eq!(eval(managed, json!("c/d")), Verdict::Pass);
        assert_eq!(eval(managed, json!("x")), Verdict::Fail);
        let uri = "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')";
        assert_eq!(eval(uri, json!("")), Verdict::Pass);
        assert_eq!(eval(uri, json!("hf://org/model")), Verdict::Pass);
        assert_eq!(eval(uri, json!("org/model")), Verdict::Fail);
        let label = "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')";
        assert_eq!(
            eval(label, json!({"metadata": {"name": "a-1"}})),
            Verdict::Pass
        );
        assert_eq!(
            eval(label, json!({"metadata": {"name": "1a"}})),
            Verdict::Fail
        );
        assert_eq!(
            eval(label, json!({"metadata": {"name": "a.b"}})),
            Verdict::Fail
        );
        let size = "size(self.metadata.name) <= 3";
        assert_eq!(
            eval(size, json!({"metadata": {"name": "abcd"}})),
            Verdict::Fail
        );
        let one = "[has(self.torch), has(self.mpi)].filter(x, x).size() <= 1";
        assert_eq!(eval(one, json!({"torch": {}, "mpi": {}})), Verdict::Fail);
        assert_eq!(eval(one, json!({"torch": {}})), Verdict::Pass);
        let node = "!self.exists(c, c == 'node')";
        assert_eq!(eval(node, json!(["a", "node"])), Verdict::Fail);
        assert_eq!(
            eval(
                "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && self.replicatedJobs.exists(x, has(x.dependsOn)))",
                json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [{"dependsOn": []}]})
            ),
            Verdict::Fail
        );
    }

    #[test]
    fn transition_rules_need_an_old_value() {
        let r = rule("self == oldSelf");
        let eq = |a: &Value, b: &Value| a == b;
        assert_eq!(r.evaluate(&json!(1), None, eq), Verdict::Skipped);
        assert_eq!(r.evaluate(&json!(1), Some(&json!(2)), eq), Verdict::Fail);
        assert_eq!(r.evaluate(&json!(1), Some(&json!(1)), eq), Verdict::Pass);
    }

    #[test]
    fn missing_message_reads_failed_rule() {
        let r = Rule::compile(&json!({"rule": "self >= 1"}));
        assert_eq!(r.message(), "failed rule: self >= 1");
    }
}
