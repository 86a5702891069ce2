//! What the server serves: one [`ResourceDef`] per served version of a
//! resource, and the [`Conversion`] between the versions of a resource
//! served at several.

use std::fmt;
use std::sync::Arc;

use serde_json::{Value, json};

/// A column of `kubectl get` output (a CRD's `additionalPrinterColumns`).
#[derive(Debug, Clone, Default)]
pub struct PrinterColumn {
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// A simple JSONPath such as `.status.conditions[-1:].type`.
    pub json_path: String,
    pub description: String,
    pub priority: i32,
    /// The cell made from the whole object instead of `json_path`, for a
    /// built-in kind whose kube-apiserver printer is code (a quota's
    /// `used/hard` per resource).
    pub render: Option<fn(&Value) -> Value>,
}

/// Converts the objects of one resource between the versions it is served
/// at, where a CustomResourceDefinition names a conversion webhook.
///
/// Objects are stored at one version (the storage version); a request at
/// another version is converted to it before it is stored, and what the
/// server answers at that version (objects, lists, watch events, tables)
/// is converted back.
pub trait Conversion: Send + Sync + 'static {
    /// `object`, read at version `from`, as it reads at version `to` (both
    /// versions of the resource's group, such as `v1beta1` and `v1beta2`).
    ///
    /// Metadata passes through unchanged. The server sets `apiVersion` on
    /// the result and then drops what the schema of `to` does not declare,
    /// as kube-apiserver prunes a conversion webhook's answer.
    ///
    /// # Errors
    ///
    /// A message naming the field that cannot be converted; the request
    /// fails with 500 Internal Server Error, as it does when a conversion
    /// webhook fails.
    fn convert(&self, object: Value, from: &str, to: &str) -> Result<Value, String>;
}

/// kube-apiserver's `strategy: None`: the object is the same at every
/// version, only its `apiVersion` changes.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoConversion;

impl Conversion for NoConversion {
    fn convert(&self, object: Value, _: &str, _: &str) -> Result<Value, String> {
        Ok(object)
    }
}

/// Where the objects of a version served besides the storage version live.
#[derive(Clone)]
pub struct StorageVersion {
    /// The version the objects are stored at; the server must serve the
    /// resource at this version too.
    pub version: String,
    /// How objects go between this version and [`Self::version`].
    pub conversion: Arc<dyn Conversion>,
}

impl fmt::Debug for StorageVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageVersion")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// One served resource at one version.
///
/// A resource served at several versions has one `ResourceDef` per version,
/// all with the same group and plural (so the same store key): the one at
/// the storage version has no [`Self::storage`], every other one names it.
#[derive(Debug, Clone, Default)]
pub struct ResourceDef {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    /// Plural, lower case, e.g. `trainjobs`.
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    /// Has a `status` subresource: the main resource ignores status changes,
    /// `/status` ignores everything else.
    pub status_subresource: bool,
    /// Served read-only to clients (pods and events of TrainJobs, written by
    /// the hub from what spokes report).
    pub read_only: bool,
    /// Has a `log` subresource (pods).
    pub log_subresource: bool,
    pub printer_columns: Vec<PrinterColumn>,
    /// The `openAPIV3Schema` of the resource, when known: published under
    /// `/openapi/v3`, used for strict field validation and for the list-map
    /// keys of strategic merge and apply patches.
    pub schema: Option<Value>,
    /// Fields usable in field selectors besides `metadata.name` and
    /// `metadata.namespace` (dotted paths, e.g. `status.phase`).
    pub selectable_fields: Vec<String>,
    /// `None` when objects are stored at this version; otherwise the
    /// version they are stored at and the conversion to and from it.
    pub storage: Option<StorageVersion>,
    /// Sent in a `Warning` header with every answer at this version (a
    /// deprecated CRD version's `deprecationWarning`).
    pub deprecation_warning: Option<String>,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The version objects of this resource are stored at.
    pub fn storage_version(&self) -> &str {
        self.storage
            .as_ref()
            .map_or(self.version.as_str(), |s| s.version.as_str())
    }

    /// Whether objects are stored at this version (no conversion).
    pub fn is_storage_version(&self) -> bool {
        self.storage.is_none()
    }

    /// The store's resource key: `trainer.kubeflow.org/trainjobs`, `pods`.
    /// The same at every version of the resource.
    pub fn store_key(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}/{}", self.group, self.plural)
        }
    }

    /// The verbs advertised in discovery.
    pub fn verbs(&self) -> Vec<&'static str> {
        if crate::review::is_review(self) {
            vec!["create"]
        } else if self.read_only {
            vec!["get", "list", "watch"]
        } else {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }
}

/// The schema of a built-in kind: `apiVersion`, `kind` and `metadata`, then
/// `spec` and `status` objects with the given descriptions and properties.
pub fn kind_schema(description: &str, spec: (&str, Value), status: (&str, Value)) -> Value {
    json!({
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "description": spec.0, "properties": spec.1},
            "status": {"type": "object", "description": status.0, "properties": status.1},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_keys() {
        let mut r = ResourceDef {
            group: "trainer.kubeflow.org".into(),
            version: "v1alpha1".into(),
            kind: "TrainJob".into(),
            list_kind: "TrainJobList".into(),
            plural: "trainjobs".into(),
            singular: "trainjob".into(),
            namespaced: true,
            status_subresource: true,
            ..Default::default()
        };
        assert_eq!(r.store_key(), "trainer.kubeflow.org/trainjobs");
        r.group.clear();
        r.plural = "pods".into();
        assert_eq!(r.store_key(), "pods");
    }
}
