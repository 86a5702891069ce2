//! What the server serves: one [`ResourceDef`] per resource.

use serde_json::Value;

/// A column of `kubectl get` output (a CRD's `additionalPrinterColumns`).
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// A simple JSONPath such as `.status.conditions[-1:].type`.
    pub json_path: String,
    pub description: String,
    pub priority: i32,
}

/// One served resource.
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
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The store's resource key: `trainer.kubeflow.org/trainjobs`, `pods`.
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
