//! The `x-kubernetes-validations` rules of a CRD schema, compiled once and
//! evaluated with a CEL interpreter (the `cel` crate) the way
//! kube-apiserver's apiextensions validation evaluates them.
//!
//! # Compiling
//!
//! [`Rule::compile`] parses the rule (and its `messageExpression`) and checks
//! it against what this module provides: every identifier must be `self`,
//! `oldSelf`, a comprehension variable or a type name, every function one of
//! [`library::GLOBAL_FUNCTIONS`] or [`library::MEMBER_FUNCTIONS`], every
//! regular expression a string literal that compiles, every `reason` and
//! `fieldPath` valid. Anything else is a [`CompileError`]: a served CRD with
//! such a rule fails the hub's start, it never silently passes.
//!
//! # Evaluating
//!
//! `self` is the value of the schema node the rule sits on, read through
//! that node (see [`value`]: objects are maps whose unset fields are absent,
//! integers are `int`, int-or-string values are as written, lists, maps).
//! A rule on a null value is not evaluated. A transition rule (one that
//! refers to `oldSelf`) is evaluated only on updates, when the node has a
//! correlated old value; with `optionalOldSelf: true` it is always
//! evaluated, `oldSelf` then being an optional. A failed rule reports its
//! `messageExpression` (falling back to its `message` if that fails), else
//! its `message`, else `failed rule: <rule>`, at the node's path with
//! `fieldPath` appended, as the field error of its `reason`
//! (`FieldValueInvalid` by default). A rule that cannot be evaluated (no
//! such key, no matching overload, overflow) is an Invalid cause saying so,
//! as kube-apiserver words it.
//!
//! # Supported library
//!
//! - operators: `! && || ?: == != < <= > >= + - * / % in [] .?x [?x]`;
//! - macros: `has`, `all`, `exists`, `exists_one`, `map`, `filter`,
//!   `optMap`, `optFlatMap`;
//! - standard functions: `size`, `int`, `uint`, `double`, `string`, `bool`,
//!   `bytes`, `dyn`, `type`, `contains`, `startsWith`, `endsWith`,
//!   `matches`;
//! - optionals: `optional.of`, `optional.none`, `optional.ofNonZeroValue`,
//!   `hasValue`, `value`, `or`, `orValue`;
//! - strings extension: `charAt`, `indexOf`, `lastIndexOf`, `join`,
//!   `lowerAscii`, `upperAscii`, `trim`, `replace`, `split`, `substring`,
//!   `format`, `reverse`, `strings.quote`;
//! - Kubernetes lists: `isSorted`, `sum`, `min`, `max`, `indexOf`,
//!   `lastIndexOf`;
//! - Kubernetes regex: `find`, `findAll`;
//! - Kubernetes quantity ([`quantity`]): `quantity`, `isQuantity`, `sign`,
//!   `isInteger`, `asInteger`, `asApproximateFloat`, `add`, `sub`,
//!   `isLessThan`, `isGreaterThan`, `compareTo`;
//! - Kubernetes format ([`format`]): `format.named`, `format.dns1123Label`,
//!   `format.dns1123Subdomain`, `format.dns1035Label`,
//!   `format.qualifiedName`, `format.labelValue`, `format.uuid`,
//!   `validate`.
//!
//! Not provided: timestamps and durations, the URL, IP/CIDR, semver, sets
//! and authorizer libraries, and two-variable comprehensions. There is no
//! static type checker: a type error kube-apiserver would reject when the
//! CRD is created surfaces here as an evaluation error. One difference in
//! equality remains: a list or map the rule builds compares equal to an
//! object's list or map when it is an operand of `==` or `!=` (the
//! compiler puts the object's value on the left, which the interpreter
//! asks), but not nested in a built list or map on the left (`[[1]] ==
//! [self.l]` is false) nor as an element `in` searches.
//!
//! # Bounds
//!
//! Rules come from the served CRDs only; objects are hostile. What bounds
//! one evaluation is the [`Budget`]: every element a comprehension visits,
//! every pair `==` compares in a list or map, every element `in` searches
//! and every rule evaluation costs a step; a rule may take
//! [`PER_CALL_LIMIT`] steps, the rules of one object [`PER_OBJECT_LIMIT`]
//! together. A rule out of budget stops validation with kube-apiserver's
//! error. kube-apiserver allows ten times as many units, but cel-go runs a
//! unit in tens of nanoseconds where this interpreter takes about half a
//! microsecond per step (release build): these limits hold the most hostile
//! object to well under a second of CPU, and are far above what a valid
//! object of the served CRDs needs (their rules iterate lists of tens or
//! hundreds of items).
//!
//! Everything else a rule does is linear in the size of the values it
//! touches, which the API server bounds (a body of at most 3 MiB, nested at
//! most 100 deep): regexes are compiled from the rule text at start, never
//! from input, and the `regex` crate matches in linear time; values are read
//! in place, never copied; recursion (equality of nested values) is bounded
//! by the nesting. Integer arithmetic is checked by the interpreter (an
//! overflow is an evaluation error) and so is every library function here;
//! nothing on the evaluation path unwraps or indexes unchecked.

mod format;
mod library;
mod quantity;
mod value;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};
use cel::common::types::{CelBool, CelOptional, CelString};
use cel::common::value::Val;
use cel::{Context, ExecutionError};
use serde_json::Value;
use trainhub_apiserver::field::{self, ErrorType, FieldError};

pub use value::Budget;
use value::{Node, to_val};

use super::schema::Schema;
pub(super) use value::{ListOrder, NumberKind};

/// The steps one rule evaluation may take (a tenth of kube-apiserver's
/// per-call limit; see the module doc).
pub const PER_CALL_LIMIT: u64 = 100_000;
/// The steps the rules of one object may take together (a tenth of
/// kube-apiserver's per-request budget).
pub const PER_OBJECT_LIMIT: u64 = 1_000_000;
/// The longest message a `messageExpression` may produce.
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

/// Why a rule could not be compiled.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompileError {
    #[error("an x-kubernetes-validations entry has no rule")]
    NoRule,
    #[error("{what} {text:?} does not parse: {message}")]
    Parse {
        what: &'static str,
        text: String,
        message: String,
    },
    #[error("{what} {text:?} calls {function}, which is not provided")]
    UnknownFunction {
        what: &'static str,
        text: String,
        function: String,
    },
    #[error("{what} {text:?} refers to {name}, which is not a variable")]
    UnknownVariable {
        what: &'static str,
        text: String,
        name: String,
    },
    #[error("{what} {text:?} uses {construct}, which is not supported")]
    Unsupported {
        what: &'static str,
        text: String,
        construct: &'static str,
    },
    #[error("{what} {text:?}: the pattern of {function} must be a string literal")]
    PatternNotLiteral {
        what: &'static str,
        text: String,
        function: String,
    },
    #[error("{what} {text:?}: regular expression {pattern:?}: {message}")]
    Regex {
        what: &'static str,
        text: String,
        pattern: String,
        message: String,
    },
    #[error(
        "rule {rule:?}: reason {reason:?} is not one of FieldValueInvalid, FieldValueForbidden, FieldValueRequired, FieldValueDuplicate"
    )]
    Reason { rule: String, reason: String },
    #[error("rule {rule:?}: fieldPath {path:?}: {message}")]
    FieldPath {
        rule: String,
        path: String,
        message: String,
    },
    #[error("the CEL environment could not be built: {0}")]
    Environment(String),
}

/// One rule of a schema node.
#[derive(Debug)]
pub struct Rule {
    /// The rule as written, trimmed.
    pub text: String,
    program: IdedExpr,
    /// `message`, trimmed; none when empty.
    message: Option<String>,
    message_expression: Option<IdedExpr>,
    reason: ErrorType,
    /// `fieldPath`, normalised (`spec.x`, `m[key]`); none when unset.
    field_path: Option<String>,
    uses_old_self: bool,
    optional_old_self: bool,
}

/// What evaluating a rule came to.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Pass,
    /// Not evaluated: a null value, or a transition rule without an old
    /// value.
    Skipped,
    /// The rule failed or could not be evaluated.
    Error(FieldError),
    /// The budget is spent: this error, and no further rules.
    Stop(FieldError),
}

impl Rule {
    /// A rule from its `x-kubernetes-validations` entry, on the schema node
    /// `node` (for `fieldPath`).
    ///
    /// # Errors
    ///
    /// Any part of the entry that kube-apiserver would reject, or that this
    /// module does not provide (see the module doc).
    pub fn compile(entry: &Value, node: &Value) -> Result<Rule, CompileError> {
        let env = library::env().map_err(|e| CompileError::Environment(e.to_string()))?;
        let text = entry
            .get("rule")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(CompileError::NoRule)?
            .to_string();
        let program = compile_expression(&env, "rule", &text)?;
        let message_expression = match entry
            .get("messageExpression")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            Some(m) => Some(compile_expression(&env, "messageExpression", m)?),
            None => None,
        };
        let reason = match entry.get("reason").and_then(Value::as_str) {
            None | Some("FieldValueInvalid") => ErrorType::Invalid,
            Some("FieldValueForbidden") => ErrorType::Forbidden,
            Some("FieldValueRequired") => ErrorType::Required,
            Some("FieldValueDuplicate") => ErrorType::Duplicate,
            Some(other) => {
                return Err(CompileError::Reason {
                    rule: text,
                    reason: other.to_string(),
                });
            }
        };
        let field_path = match entry.get("fieldPath").and_then(Value::as_str) {
            Some(path) if !path.is_empty() => {
                Some(normalize_field_path(path, node).map_err(|message| {
                    CompileError::FieldPath {
                        rule: text.clone(),
                        path: path.to_string(),
                        message,
                    }
                })?)
            }
            _ => None,
        };
        let uses_old_self = program.references().has_variable("oldSelf");
        Ok(Rule {
            message: entry
                .get("message")
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_string),
            optional_old_self: entry
                .get("optionalOldSelf")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            text,
            program,
            message_expression,
            reason,
            field_path,
            uses_old_self,
        })
    }

    /// The message of a failed rule: `message`, or `failed rule: <rule>`.
    pub fn message(&self) -> String {
        match &self.message {
            Some(m) => m.clone(),
            None => format!("failed rule: {}", self.text),
        }
    }

    /// How kube-apiserver names the rule in evaluation errors: its message,
    /// else its text.
    fn name(&self) -> &str {
        self.message.as_deref().unwrap_or(&self.text)
    }

    /// Evaluates the rule on `value` (at field path `path`, validated
    /// against `schema`), with `old` the correlated old value on updates.
    /// `type_name` is the node's schema type, the value kube-apiserver
    /// reports. Work is charged to `budget`, the object's.
    pub fn evaluate(
        &self,
        value: &Value,
        old: Option<&Value>,
        schema: &Schema,
        path: &str,
        type_name: &str,
        budget: &Budget,
    ) -> Outcome {
        if value.is_null() || (self.uses_old_self && old.is_none() && !self.optional_old_self) {
            return Outcome::Skipped;
        }
        let at = if path.is_empty() { "<nil>" } else { path };
        let invalid = |detail: String| FieldError::invalid(at, type_name.to_string(), detail);
        if budget.remaining() == 0 {
            return Outcome::Stop(invalid(OUT_OF_BUDGET.to_string()));
        }
        let per_call = budget.remaining() >= PER_CALL_LIMIT;
        let call = Budget::new(budget.remaining().min(PER_CALL_LIMIT));
        let result = self.run(
            &self.program,
            value,
            old,
            schema,
            &call,
            self.optional_old_self,
        );
        budget.charge(call.spent());
        if call.exhausted() {
            return Outcome::Stop(invalid(if per_call {
                format!(
                    "'operation cancelled: actual cost limit exceeded': no further validation \
                     rules will be run due to call cost exceeds limit for rule: {}",
                    self.name()
                )
            } else {
                OUT_OF_BUDGET.to_string()
            }));
        }
        let passed = match result {
            Ok(Some(passed)) => passed,
            Ok(None) => {
                return Outcome::Error(invalid(format!(
                    "rule did not evaluate to a bool evaluating rule: {}",
                    self.name()
                )));
            }
            Err(e) => return Outcome::Error(invalid(evaluation_error(&e, self.name()))),
        };
        if passed {
            return Outcome::Pass;
        }
        let at = match &self.field_path {
            Some(p) => field::child(path, p),
            None => at.to_string(),
        };
        let detail = match self.evaluate_message(value, old, schema, budget) {
            Ok(Some(m)) => m,
            Ok(None) => self.message(),
            Err(stop) => {
                return Outcome::Stop(FieldError::invalid(at, type_name.to_string(), stop));
            }
        };
        Outcome::Error(match self.reason {
            ErrorType::Forbidden => FieldError::forbidden(at, detail),
            ErrorType::Required => FieldError::required(at, detail),
            ErrorType::Duplicate => FieldError::duplicate(at, type_name.to_string()),
            _ => FieldError::invalid(at, type_name.to_string(), detail),
        })
    }

    /// The `messageExpression` of a failed rule: `Ok(None)` when there is
    /// none or it fails (the caller falls back to the message), `Err` with
    /// the error's detail when the budget ran out.
    fn evaluate_message(
        &self,
        value: &Value,
        old: Option<&Value>,
        schema: &Schema,
        budget: &Budget,
    ) -> Result<Option<String>, String> {
        let Some(program) = &self.message_expression else {
            return Ok(None);
        };
        let call = Budget::new(budget.remaining().min(PER_CALL_LIMIT));
        let message = self.run_string(program, value, old, schema, &call);
        budget.charge(call.spent());
        if call.exhausted() {
            return Err(
                "messageExpression evaluation failed due to running out of cost \
                        budget, no further validation rules will be run"
                    .to_string(),
            );
        }
        Ok(message
            .ok()
            .flatten()
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty() && m.len() <= MAX_MESSAGE_BYTES && !m.contains('\n')))
    }

    /// Runs `program` with `self` and `oldSelf` bound; `Some(bool)` for a
    /// boolean result.
    fn run(
        &self,
        program: &IdedExpr,
        value: &Value,
        old: Option<&Value>,
        schema: &Schema,
        budget: &Budget,
        optional_old_self: bool,
    ) -> Result<Option<bool>, ExecutionError> {
        self.execute(
            program,
            value,
            old,
            schema,
            budget,
            optional_old_self,
            |v| v.downcast_ref::<CelBool>().map(|b| *b.inner()),
        )
    }

    fn run_string(
        &self,
        program: &IdedExpr,
        value: &Value,
        old: Option<&Value>,
        schema: &Schema,
        budget: &Budget,
    ) -> Result<Option<String>, ExecutionError> {
        self.execute(program, value, old, schema, budget, false, |v| {
            v.downcast_ref::<CelString>().map(|s| s.inner().to_string())
        })
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the activation of one evaluation, spelled out"
    )]
    fn execute<T>(
        &self,
        program: &IdedExpr,
        value: &Value,
        old: Option<&Value>,
        schema: &Schema,
        budget: &Budget,
        optional_old_self: bool,
        read: impl FnOnce(&dyn Val) -> Option<T>,
    ) -> Result<Option<T>, ExecutionError> {
        let env = library::env()
            .map_err(|e| ExecutionError::function_error("environment", e.to_string()))?;
        if !budget.charge(1) {
            return Ok(None);
        }
        let node = |v| Node {
            value: v,
            schema: Some(schema),
            budget,
        };
        let mut context = Context::with_env(env);
        context.add_variable_as_val("self", to_val(node(value)));
        match (old, optional_old_self) {
            (Some(old), false) => context.add_variable_as_val("oldSelf", to_val(node(old))),
            (Some(old), true) => {
                context.add_variable_as_val("oldSelf", Box::new(CelOptional::of(to_val(node(old)))))
            }
            (None, true) => {
                context.add_variable_as_val("oldSelf", Box::new(CelOptional::none()));
            }
            (None, false) => {}
        }
        let result = cel::Value::resolve_val(program, &context)?;
        Ok(read(result.as_ref()))
    }
}

const OUT_OF_BUDGET: &str =
    "validation failed due to running out of cost budget, no further validation rules will be run";

/// An evaluation error as kube-apiserver reports it, in cel-go's words
/// where the two interpreters share the error.
fn evaluation_error(e: &ExecutionError, rule: &str) -> String {
    let error = match e {
        ExecutionError::NoSuchOverload(_) => {
            return format!(
                "'no such overload: {e}': call arguments did not match a supported operator, \
                 function or macro signature for rule: {rule}"
            );
        }
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        ExecutionError::IndexOutOfBounds(i) => match i {
            cel::Value::Int(i) => format!("index out of bounds: {i}"),
            _ => "index out of bounds".to_string(),
        },
        ExecutionError::Overflow(..) => "integer overflow".to_string(),
        ExecutionError::DivisionByZero(_) => "division by zero".to_string(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".to_string(),
        ExecutionError::FunctionError { function, message } => format!("{function}: {message}"),
        other => other.to_string(),
    };
    format!("{error} evaluating rule: {rule}")
}

/// Parses `text` (expanding its macros) and checks it uses only what this
/// module provides.
fn compile_expression(
    env: &cel::Env,
    what: &'static str,
    text: &str,
) -> Result<IdedExpr, CompileError> {
    let mut expr = env.parser().parse(text).map_err(|e| CompileError::Parse {
        what,
        text: text.to_string(),
        message: e.to_string(),
    })?;
    let mut checker = Checker {
        what,
        text,
        scope: Vec::new(),
    };
    checker.check(&expr)?;
    object_values_first(&mut expr);
    Ok(expr)
}

/// Puts a list or map the rule builds (a literal, a `map()` or `filter()`)
/// on the right of `==` and `!=`: the interpreter asks the left operand, and
/// its own lists and maps only compare equal to their own kind, where an
/// object's values compare equal to any list or map.
fn object_values_first(expr: &mut IdedExpr) {
    let built = |e: &IdedExpr| {
        matches!(
            e.expr,
            Expr::List(_) | Expr::Map(_) | Expr::Comprehension(_)
        )
    };
    match &mut expr.expr {
        Expr::Call(call) => {
            if (call.func_name == operators::EQUALS || call.func_name == operators::NOT_EQUALS)
                && let [left, right] = call.args.as_mut_slice()
                && built(left)
                && !built(right)
            {
                std::mem::swap(left, right);
            }
            if let Some(target) = &mut call.target {
                object_values_first(target);
            }
            call.args.iter_mut().for_each(object_values_first);
        }
        Expr::Select(select) => object_values_first(&mut select.operand),
        Expr::List(list) => list.elements.iter_mut().for_each(object_values_first),
        Expr::Map(map) => {
            for entry in &mut map.entries {
                if let EntryExpr::MapEntry(e) = &mut entry.expr {
                    object_values_first(&mut e.key);
                    object_values_first(&mut e.value);
                }
            }
        }
        Expr::Comprehension(c) => {
            for e in [
                &mut c.iter_range,
                &mut c.accu_init,
                &mut c.loop_cond,
                &mut c.loop_step,
                &mut c.result,
            ] {
                object_values_first(e);
            }
        }
        Expr::Literal(_) | Expr::Ident(_) | Expr::Struct(_) | Expr::Unspecified => {}
    }
}

/// Walks a parsed expression: identifiers in scope, functions provided,
/// regexes literal and compiled.
struct Checker<'a> {
    what: &'static str,
    text: &'a str,
    /// The comprehension variables in scope.
    scope: Vec<&'a str>,
}

impl<'a> Checker<'a> {
    fn check(&mut self, expr: &'a IdedExpr) -> Result<(), CompileError> {
        match &expr.expr {
            Expr::Literal(_) => Ok(()),
            Expr::Ident(name) => {
                if name == "self"
                    || name == "oldSelf"
                    || self.scope.contains(&name.as_str())
                    || library::TYPE_NAMES.contains(&name.as_str())
                {
                    Ok(())
                } else {
                    Err(CompileError::UnknownVariable {
                        what: self.what,
                        text: self.text.to_string(),
                        name: name.clone(),
                    })
                }
            }
            Expr::Select(select) => {
                let type_name = qualified_name(&expr.expr)
                    .is_some_and(|q| library::TYPE_NAMES.contains(&q.as_str()));
                if type_name {
                    Ok(())
                } else {
                    self.check(&select.operand)
                }
            }
            Expr::Call(call) => {
                let namespaced = call
                    .target
                    .as_deref()
                    .and_then(|t| qualified_name(&t.expr))
                    .map(|q| format!("{q}.{}", call.func_name))
                    .filter(|name| library::GLOBAL_FUNCTIONS.contains(&name.as_str()));
                let known = match (&call.target, &namespaced) {
                    (_, Some(_)) => true,
                    (None, None) => library::GLOBAL_FUNCTIONS.contains(&call.func_name.as_str()),
                    (Some(_), None) => library::MEMBER_FUNCTIONS.contains(&call.func_name.as_str()),
                };
                if !known {
                    return Err(CompileError::UnknownFunction {
                        what: self.what,
                        text: self.text.to_string(),
                        function: namespaced.unwrap_or_else(|| call.func_name.clone()),
                    });
                }
                if library::REGEX_FUNCTIONS.contains(&call.func_name.as_str()) {
                    // `s.matches(re)`, or `matches(s, re)`.
                    let pattern = if call.target.is_some() {
                        call.args.first()
                    } else {
                        call.args.get(1)
                    };
                    self.regex(&call.func_name, pattern)?;
                }
                if namespaced.is_none()
                    && let Some(target) = &call.target
                {
                    self.check(target)?;
                }
                call.args.iter().try_for_each(|a| self.check(a))
            }
            Expr::List(list) => list.elements.iter().try_for_each(|e| self.check(e)),
            Expr::Map(map) => map.entries.iter().try_for_each(|entry| match &entry.expr {
                EntryExpr::MapEntry(e) => {
                    self.check(&e.key)?;
                    self.check(&e.value)
                }
                EntryExpr::StructField(_) => Err(self.unsupported("struct fields")),
            }),
            Expr::Comprehension(c) => {
                self.check(&c.iter_range)?;
                self.check(&c.accu_init)?;
                let depth = self.scope.len();
                self.scope.push(&c.iter_var);
                if let Some(v) = &c.iter_var2 {
                    self.scope.push(v);
                }
                self.scope.push(&c.accu_var);
                let body = [&c.loop_cond, &c.loop_step, &c.result]
                    .into_iter()
                    .try_for_each(|e| self.check(e));
                self.scope.truncate(depth);
                body
            }
            Expr::Struct(_) => Err(self.unsupported("struct literals")),
            Expr::Unspecified => Err(self.unsupported("an empty expression")),
        }
    }

    fn regex(&self, function: &str, pattern: Option<&IdedExpr>) -> Result<(), CompileError> {
        let Some(Expr::Literal(LiteralValue::String(pattern))) = pattern.map(|p| &p.expr) else {
            return Err(CompileError::PatternNotLiteral {
                what: self.what,
                text: self.text.to_string(),
                function: function.to_string(),
            });
        };
        library::regex(pattern.inner()).map_err(|message| CompileError::Regex {
            what: self.what,
            text: self.text.to_string(),
            pattern: pattern.inner().to_string(),
            message,
        })
    }

    fn unsupported(&self, construct: &'static str) -> CompileError {
        CompileError::Unsupported {
            what: self.what,
            text: self.text.to_string(),
            construct,
        }
    }
}

/// `a.b.c` spelled by identifiers and selections.
fn qualified_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(s) if !s.test => {
            qualified_name(&s.operand.expr).map(|q| format!("{q}.{}", s.field))
        }
        _ => None,
    }
}

/// A rule's `fieldPath` (`.spec.x`, `.m['key.with.dots']`) as a field path
/// relative to the rule's node (`spec.x`, `m[key.with.dots]`), checked
/// against the schema `node` as kube-apiserver checks it: each step names a
/// property, or a key of a map.
fn normalize_field_path(path: &str, node: &Value) -> Result<String, String> {
    let mut out = String::new();
    let mut schema = node;
    let mut rest = path;
    while !rest.is_empty() {
        let name: String;
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return Err("expected a field name after '.'".to_string());
            }
            name = r[..end].to_string();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("['") {
            let mut unescaped = String::new();
            let mut chars = r.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, '\'')) => unescaped.push('\''),
                        Some((_, '\\')) => unescaped.push('\\'),
                        _ => return Err("invalid escape in a quoted field name".to_string()),
                    },
                    '\'' => {
                        end = Some(i);
                        break;
                    }
                    c => unescaped.push(c),
                }
            }
            let end = end.ok_or("unterminated quoted field name")?;
            rest = r[end + 1..]
                .strip_prefix(']')
                .ok_or("expected ] after a quoted field name")?;
            name = unescaped;
        } else {
            return Err(format!("expected [ or . at {rest:?}"));
        }
        if let Some(child) = schema.get("properties").and_then(|p| p.get(&name)) {
            out = field::child(&out, &name);
            schema = child;
        } else if let Some(child) = schema.get("additionalProperties").filter(|a| a.is_object()) {
            out = field::key(&out, &name);
            schema = child;
        } else {
            return Err("does not refer to a valid field".to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
