//! Field errors, as upstream's `k8s.io/apimachinery/pkg/util/validation/field`
//! spells them, and their rendering into `metav1.Status` causes.

use std::fmt;

use serde_json::Value;

/// What is wrong with a field (upstream's `field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    NotFound,
    Required,
    Duplicate,
    Invalid,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
    Internal,
    TypeInvalid,
}

impl ErrorType {
    /// The `StatusCause.reason` of this type, e.g. `FieldValueInvalid`.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::Internal => "InternalError",
            ErrorType::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    /// The phrase upstream prints before the detail, e.g. `Invalid value`.
    pub fn phrase(self) -> &'static str {
        match self {
            ErrorType::NotFound => "Not found",
            ErrorType::Required => "Required value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
            ErrorType::Internal => "Internal error",
            ErrorType::TypeInvalid => "Invalid value",
        }
    }

    /// Whether upstream prints the bad value in the message.
    fn shows_value(self) -> bool {
        matches!(
            self,
            ErrorType::NotFound
                | ErrorType::Duplicate
                | ErrorType::Invalid
                | ErrorType::NotSupported
                | ErrorType::TypeInvalid
        )
    }
}

/// One field error: `spec.trainer.numNodes: Invalid value: 0: must be greater than or equal to 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub kind: ErrorType,
    /// The field path, e.g. `spec.trainer.numProcPerNode` or
    /// `spec.template.spec.replicatedJobs[0].replicas`.
    pub field: String,
    pub value: Option<Value>,
    pub detail: String,
}

impl FieldError {
    pub fn new(
        kind: ErrorType,
        field: impl Into<String>,
        value: Option<Value>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            kind,
            field: field.into(),
            value,
            detail: detail.into(),
        }
    }
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self::new(ErrorType::Invalid, field, Some(value.into()), detail)
    }
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Required, field, None, detail)
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Forbidden, field, None, detail)
    }
    pub fn not_supported(
        field: impl Into<String>,
        value: impl Into<Value>,
        supported: &[&str],
    ) -> Self {
        let quoted: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        Self::new(
            ErrorType::NotSupported,
            field,
            Some(value.into()),
            format!("supported values: {}", quoted.join(", ")),
        )
    }
    pub fn duplicate(field: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::new(ErrorType::Duplicate, field, Some(value.into()), "")
    }

    /// The message without the field path, as `StatusCause.message` carries it.
    pub fn message(&self) -> String {
        let mut out = self.kind.phrase().to_string();
        if self.kind.shows_value()
            && let Some(value) = &self.value
        {
            out.push_str(": ");
            out.push_str(&render_value(value));
        }
        if !self.detail.is_empty() {
            out.push_str(": ");
            out.push_str(&self.detail);
        }
        out
    }
}

/// Values as upstream's `%#v`-ish rendering prints them: strings quoted,
/// numbers and booleans bare, objects as JSON.
fn render_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message())
        } else {
            write!(f, "{}: {}", self.field, self.message())
        }
    }
}

/// Several field errors, in the order they were found.
pub type ErrorList = Vec<FieldError>;

/// Joins field paths the way upstream's `field.Path` prints them.
pub fn child(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}.{name}")
    }
}

pub fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

pub fn key(parent: &str, k: &str) -> String {
    format!("{parent}[{k}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_upstream_spelling() {
        let e = FieldError::invalid(
            "spec.trainer.numNodes",
            0,
            "must be greater than or equal to 1",
        );
        assert_eq!(
            e.to_string(),
            "spec.trainer.numNodes: Invalid value: 0: must be greater than or equal to 1"
        );
        let e = FieldError::required("spec.runtimeRef.name", "");
        assert_eq!(e.to_string(), "spec.runtimeRef.name: Required value");
        let e = FieldError::not_supported("spec.managedBy", "x", &["a", "b"]);
        assert_eq!(
            e.to_string(),
            "spec.managedBy: Unsupported value: \"x\": supported values: \"a\", \"b\""
        );
        assert_eq!(e.kind.reason(), "FieldValueNotSupported");
    }
}
