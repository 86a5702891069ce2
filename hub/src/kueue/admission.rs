//! Admission of Kueue's kinds, in kube-apiserver's order: the CRD schema
//! of the version the request is at (defaults, types, enums, required
//! fields, the `x-kubernetes-validations` rules the hub evaluates), then
//! Kueue's validating webhooks on the object at v1beta2 (the version they
//! are registered for), then the hub's cross-object check of cohorts.
//!
//! Failures are 422 Invalid with one cause per field; the schema's paths
//! are those of the request's version, the webhooks' those of v1beta2 (as
//! with Kueue, whose webhook sees a v1beta1 request converted).

#![allow(
    clippy::result_large_err,
    reason = "ApiError is the apiserver's type; a refusal ends the request"
)]

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use trainhub_apiserver::admission::{Admission, Operation, Outcome, Request};
use trainhub_apiserver::field::FieldError;
use trainhub_apiserver::resource::ResourceDef;
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{Key, Store};

use super::{CLUSTER_QUEUE, COHORT, COHORTS, GROUP, RESOURCE_FLAVOR, STORAGE_VERSION, conversion};
use crate::admission::Schema;

/// Admission for `kueue.x-k8s.io`; every other group goes to `inner`.
pub struct KueueAdmission {
    inner: Arc<dyn Admission>,
    store: Arc<dyn Store>,
    /// The compiled schemas of the writable kinds, by (kind, version).
    schemas: HashMap<(String, String), Schema>,
}

impl KueueAdmission {
    /// Kueue's admission over `store` (where other cohorts are looked up),
    /// in front of `inner`.
    ///
    /// # Errors
    /// Kueue's CRDs unreadable, or a rule of theirs that does not compile:
    /// the hub does not start rather than serve unvalidated objects.
    pub fn new(store: Arc<dyn Store>, inner: Arc<dyn Admission>) -> anyhow::Result<Self> {
        let mut schemas = HashMap::new();
        for def in super::api::resources()? {
            if def.read_only {
                continue;
            }
            if let Some(schema) = def.schema.as_ref() {
                let compiled = Schema::compile(schema).map_err(|e| {
                    anyhow::anyhow!("compiling the schema of {} {}: {e}", def.kind, def.version)
                })?;
                schemas.insert((def.kind, def.version), compiled);
            }
        }
        Ok(KueueAdmission {
            inner,
            store,
            schemas,
        })
    }

    /// The stored object an update replaces, at v1beta2 with its defaults.
    fn stored(&self, def: &ResourceDef, request: &Request<'_>) -> Option<Value> {
        let key = Key::new(&def.store_key(), request.namespace, request.name);
        let mut old = self.store.get(&key)?.value.as_ref().clone();
        if let Some(schema) = self
            .schemas
            .get(&(def.kind.clone(), STORAGE_VERSION.to_string()))
        {
            schema.apply_defaults(&mut old);
        }
        Some(old)
    }

    /// The hub's cohort check: `spec.parentName` may not lead back to the
    /// Cohort itself.
    fn check_cycle(&self, name: &str, cohort: &Value) -> Option<FieldError> {
        let parent = cohort["spec"]["parentName"].as_str().unwrap_or_default();
        super::validate::cohort_cycle(name, parent, |other| {
            let stored = self.store.get(&Key::new(COHORTS, None, other))?;
            stored.value["spec"]["parentName"]
                .as_str()
                .map(str::to_string)
        })
    }
}

impl Admission for KueueAdmission {
    fn admit(&self, request: &Request<'_>, object: &mut Value) -> Result<Outcome, ApiError> {
        let def = request.resource;
        if def.group != GROUP {
            return self.inner.admit(request, object);
        }
        if request.operation == Operation::Delete {
            return Ok(Outcome::default());
        }
        let kind = def.kind.as_str();
        let Some(schema) = self.schemas.get(&(def.kind.clone(), def.version.clone())) else {
            return Ok(Outcome::default());
        };
        let invalid = |errors: &[FieldError]| ApiError::invalid(GROUP, kind, request.name, errors);
        let old = request.old.map(|o| {
            let mut o = o.clone();
            schema.apply_defaults(&mut o);
            o
        });
        match request.subresource {
            None => {}
            Some("status") => {
                let (Some(status_schema), Some(status)) =
                    (schema.property("status"), object.get_mut("status"))
                else {
                    return Ok(Outcome::default());
                };
                status_schema.apply_defaults(status);
                let before = old.as_ref().and_then(|o| o.get("status"));
                let errors = status_schema.validate(status, before, "status");
                return if errors.is_empty() {
                    Ok(Outcome::default())
                } else {
                    Err(invalid(&errors))
                };
            }
            Some(_) => return Ok(Outcome::default()),
        }
        schema.apply_defaults(object);
        // The status belongs to the status subresource: not judged here.
        let status = def
            .status_subresource
            .then(|| object.as_object_mut().and_then(|m| m.remove("status")))
            .flatten();
        let errors = schema.validate(object, old.as_ref(), "");
        if let (Some(status), Some(map)) = (status, object.as_object_mut()) {
            map.insert("status".into(), status);
        }
        if !errors.is_empty() {
            return Err(invalid(&errors));
        }
        // Kueue's webhooks judge the object at v1beta2, and the old object
        // as stored (with what v1beta1 cannot show, such as a v1beta2-only
        // field an update at v1beta1 would drop).
        let new = conversion::convert(kind, object.clone(), &def.version, STORAGE_VERSION)
            .map_err(|e| ApiError::internal(format!("converting {kind} to v1beta2: {e}")))?;
        let old = match request.operation {
            Operation::Update => self.stored(def, request),
            _ => None,
        };
        let mut errors = match kind {
            CLUSTER_QUEUE => super::validate::cluster_queue(&new, old.as_ref()),
            COHORT => super::validate::cohort(&new),
            RESOURCE_FLAVOR => super::validate::resource_flavor(&new),
            _ => Vec::new(),
        };
        if kind == COHORT {
            errors.extend(self.check_cycle(request.name, &new));
        }
        if errors.is_empty() {
            Ok(Outcome::default())
        } else {
            Err(invalid(&errors))
        }
    }
}
