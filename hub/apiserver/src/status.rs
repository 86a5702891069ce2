//! API errors as `metav1.Status`: the code, reason and details that
//! Kubernetes clients (kubectl, client-go, the Python client) act on.

use serde_json::{Value, json};

use crate::field::FieldError;
use crate::store::StoreError;

/// A cause in `status.details.causes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

/// The kind an error is about, for `status.details`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Subject {
    pub group: String,
    /// The resource (plural) for NotFound/AlreadyExists/Conflict, the Kind
    /// for Invalid, as upstream fills `details.kind`.
    pub kind: String,
    pub name: String,
}

/// An error answered as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    /// `StatusReason`, e.g. `NotFound`, `Invalid`; empty for 500s without one.
    pub reason: &'static str,
    pub message: String,
    pub subject: Option<Box<Subject>>,
    pub causes: Vec<Cause>,
    /// For 410 Expired and 429 TooManyRequests.
    pub retry_after_seconds: Option<u32>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            subject: None,
            causes: Vec::new(),
            retry_after_seconds: None,
        }
    }

    fn about(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.subject = Some(Box::new(Subject {
            group: group.into(),
            kind: kind.into(),
            name: name.into(),
        }));
        self
    }

    /// `trainjobs.trainer.kubeflow.org "x" not found`
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource, group)),
        )
        .about(group, resource, name)
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(resource, group)),
        )
        .about(group, resource, name)
    }

    pub fn conflict(group: &str, resource: &str, name: &str, detail: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {detail}",
                qualified(resource, group)
            ),
        )
        .about(group, resource, name)
    }

    /// 422 with one cause per field error, as upstream's validation and
    /// admission webhooks answer: `TrainJob.trainer.kubeflow.org "x" is invalid: [...]`.
    pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let list = match rendered.len() {
            1 => rendered[0].clone(),
            _ => format!("[{}]", rendered.join(", ")),
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {list}", qualified(kind, group)),
        )
        .about(group, kind, name);
        e.causes = errors
            .iter()
            .map(|f| Cause {
                reason: f.kind.reason().into(),
                message: f.message(),
                field: f.field.clone(),
            })
            .collect();
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// `trainjobs.trainer.kubeflow.org is forbidden: User "u" cannot create resource "trainjobs" in API group "trainer.kubeflow.org" in the namespace "ns"`
    pub fn forbidden(
        user: &str,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Self {
        let subject = if name.is_empty() {
            qualified(resource, group)
        } else {
            format!("{} \"{name}\"", qualified(resource, group))
        };
        let scope = match namespace {
            Some(ns) if !ns.is_empty() => format!(" in the namespace \"{ns}\""),
            _ => " at the cluster scope".to_string(),
        };
        Self::new(
            403,
            "Forbidden",
            format!(
                "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\"{scope}"
            ),
        )
        .about(group, resource, name)
    }

    /// 403 for a reason other than authorization, as upstream's
    /// `NewForbidden`: `trainjobs.trainer.kubeflow.org "j" is forbidden: <reason>`.
    pub fn forbidden_because(group: &str, resource: &str, name: &str, reason: &str) -> Self {
        let subject = if name.is_empty() {
            qualified(resource, group)
        } else {
            format!("{} \"{name}\"", qualified(resource, group))
        };
        Self::new(
            403,
            "Forbidden",
            format!("{subject} is forbidden: {reason}"),
        )
        .about(group, resource, name)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/merge-patch+json, application/json-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml; got {content_type:?}"
            ),
        )
    }

    /// 410 for a watch or list from a compacted resourceVersion.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    pub fn with_cause(mut self, reason: &str, message: &str, field: &str) -> Self {
        self.causes.push(Cause {
            reason: reason.into(),
            message: message.into(),
            field: field.into(),
        });
        self
    }

    /// Maps a store error about `(group, resource, name)`.
    pub fn from_store(e: StoreError, group: &str, resource: &str) -> Self {
        match e {
            StoreError::NotFound(k) => Self::not_found(group, resource, &k.name),
            StoreError::AlreadyExists(k) => Self::already_exists(group, resource, &k.name),
            StoreError::Conflict { key, .. } => Self::conflict(
                group,
                resource,
                &key.name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ),
            StoreError::Gone { requested, oldest } => {
                Self::expired(format!("too old resource version: {requested} ({oldest})"))
            }
            StoreError::InvalidKey(k) => Self::bad_request(format!(
                "{}: the name {:?} or namespace {:?} cannot be stored: names and namespaces must not contain '|' or '/'",
                qualified(resource, group),
                k.name,
                k.namespace
            )),
            StoreError::Storage(m) => Self::internal(m),
            StoreError::TooLarge(m) => Self::too_large(m),
            e @ StoreError::Fenced(_) => Self::unavailable(e.to_string()),
        }
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some(s) = &self.subject {
            if !s.name.is_empty() {
                details.insert("name".into(), s.name.clone().into());
            }
            if !s.group.is_empty() {
                details.insert("group".into(), s.group.clone().into());
            }
            if !s.kind.is_empty() {
                details.insert("kind".into(), s.kind.clone().into());
            }
        }
        if !self.causes.is_empty() {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), causes.into());
        }
        if let Some(s) = self.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), s.into());
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        if self.reason.is_empty()
            && let Some(obj) = status.as_object_mut()
        {
            obj.remove("reason");
        }
        status
    }
}

/// `trainjobs.trainer.kubeflow.org`, or `pods` for the core group.
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// The `Status` of a successful delete without an object to return.
pub fn success(group: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": group, "kind": kind, "uid": uid},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_lists_every_field() {
        let errs = vec![
            FieldError::invalid(
                "spec.trainer.numNodes",
                0,
                "must be greater than or equal to 1",
            ),
            FieldError::required("spec.runtimeRef.name", ""),
        ];
        let e = ApiError::invalid("trainer.kubeflow.org", "TrainJob", "j", &errs);
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "TrainJob.trainer.kubeflow.org \"j\" is invalid: [spec.trainer.numNodes: Invalid value: 0: must be greater than or equal to 1, spec.runtimeRef.name: Required value]"
        );
        let s = e.to_status();
        assert_eq!(s["details"]["causes"][1]["field"], "spec.runtimeRef.name");
        assert_eq!(s["details"]["causes"][1]["reason"], "FieldValueRequired");
        assert_eq!(s["reason"], "Invalid");
    }

    #[test]
    fn forbidden_reads_like_kube_apiserver() {
        let e = ApiError::forbidden(
            "bob",
            "create",
            "trainer.kubeflow.org",
            "clustertrainingruntimes",
            None,
            "",
        );
        assert_eq!(
            e.message,
            "clustertrainingruntimes.trainer.kubeflow.org is forbidden: User \"bob\" cannot create resource \"clustertrainingruntimes\" in API group \"trainer.kubeflow.org\" at the cluster scope"
        );
    }
}
