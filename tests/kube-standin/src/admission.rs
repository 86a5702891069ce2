//! What kube-apiserver's built-in admission and defaulting do for the kinds
//! served: objects in a missing namespace are refused (404, as the
//! `NamespaceLifecycle` plugin answers), new pods start `Pending` and new
//! namespaces `Active`, Jobs get their defaults.

use std::sync::Arc;

use serde_json::{Value, json};
use trainhub_apiserver::admission::{Admission, Operation, Outcome, Request};
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{Key, Store};

use crate::resources::NAMESPACES;

pub struct StandinAdmission {
    pub store: Arc<dyn Store>,
}

impl Admission for StandinAdmission {
    fn admit(&self, request: &Request<'_>, object: &mut Value) -> Result<Outcome, ApiError> {
        if request.operation != Operation::Create {
            return Ok(Outcome::default());
        }
        if let Some(namespace) = request.namespace {
            let key = Key::new(NAMESPACES, None, namespace);
            match self.store.get(&key) {
                None => return Err(ApiError::not_found("", NAMESPACES, namespace)),
                Some(ns) if ns.value["metadata"].get("deletionTimestamp").is_some() => {
                    return Err(ApiError::new(
                        403,
                        "Forbidden",
                        format!(
                            "unable to create new content in namespace {namespace} because it is being terminated"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let group = request.resource.group.as_str();
        match (group, request.resource.plural.as_str()) {
            ("", "pods") => {
                object["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
            ("", "namespaces") => {
                object["status"] = json!({"phase": "Active"});
            }
            ("batch", "jobs") => default_job(object),
            _ => {}
        }
        Ok(Outcome::default())
    }
}

/// The defaults of `batch/v1` Job that the Job controller relies on.
fn default_job(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if !spec.contains_key("parallelism") && !spec.contains_key("completions") {
        spec.insert("completions".into(), 1.into());
    }
    spec.entry("parallelism").or_insert(1.into());
    spec.entry("backoffLimit").or_insert(6.into());
    spec.entry("completionMode").or_insert("NonIndexed".into());
    spec.entry("suspend").or_insert(false.into());
}
