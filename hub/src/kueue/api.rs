//! Kueue's resources as the hub serves them: read from Kueue's own CRDs
//! (verbatim copies of v0.19.2's in `manifests/crds/`, beside their
//! license), each at v1beta2 (stored) and v1beta1 (converted by
//! [`super::conversion`]).
//!
//! Two things differ from the CRDs, on purpose:
//! - Workloads are read-only (the hub writes them from its queue, as
//!   Kueue's job controllers do; users never do);
//! - Workloads also answer to the short name `wl`, beside upstream's `kwl`,
//!   `kueueworkload` and `kueueworkloads` (upstream gave `wl` up; nothing
//!   else the hub serves claims it).

use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use serde_json::Value;
use trainhub_apiserver::resource::{Conversion, ResourceDef};

use super::{GROUP, conversion};

const CRDS: &[(&str, &str)] = &[
    (
        "kueue.x-k8s.io_resourceflavors.yaml",
        include_str!("../../../manifests/crds/kueue.x-k8s.io_resourceflavors.yaml"),
    ),
    (
        "kueue.x-k8s.io_clusterqueues.yaml",
        include_str!("../../../manifests/crds/kueue.x-k8s.io_clusterqueues.yaml"),
    ),
    (
        "kueue.x-k8s.io_localqueues.yaml",
        include_str!("../../../manifests/crds/kueue.x-k8s.io_localqueues.yaml"),
    ),
    (
        "kueue.x-k8s.io_cohorts.yaml",
        include_str!("../../../manifests/crds/kueue.x-k8s.io_cohorts.yaml"),
    ),
    (
        "kueue.x-k8s.io_workloadpriorityclasses.yaml",
        include_str!("../../../manifests/crds/kueue.x-k8s.io_workloadpriorityclasses.yaml"),
    ),
    (
        "kueue.x-k8s.io_workloads.yaml",
        include_str!("../../../manifests/crds/kueue.x-k8s.io_workloads.yaml"),
    ),
];

/// The short name the hub adds to Workloads.
const WORKLOAD_SHORT_NAME: &str = "wl";

/// Converts one Kueue kind between v1beta1 and v1beta2.
#[derive(Debug, Clone)]
pub struct KueueConversion {
    kind: String,
}

impl Conversion for KueueConversion {
    fn convert(&self, object: Value, from: &str, to: &str) -> Result<Value, String> {
        conversion::convert(&self.kind, object, from, to)
    }
}

/// Every Kueue resource at every served version, read from the CRDs
/// compiled in (tens of milliseconds; not cached: the server keeps the only
/// copy of the schemas it serves).
///
/// # Errors
///
/// A CRD that does not parse or lacks what a resource needs (a build
/// defect: they are compiled in).
pub fn resources() -> Result<Vec<ResourceDef>> {
    let mut defs = Vec::new();
    for (file, text) in CRDS {
        let crd: Value = serde_saphyr::from_str(text).with_context(|| format!("parsing {file}"))?;
        if crd["spec"]["group"] != GROUP {
            return Err(anyhow!("{file}: not a {GROUP} CRD"));
        }
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let conversion: Arc<dyn Conversion> = Arc::new(KueueConversion { kind: kind.clone() });
        let mut versions = crate::api::from_crd(&crd, Some(conversion))
            .with_context(|| format!("reading {file}"))?;
        if kind == super::WORKLOAD {
            for def in &mut versions {
                def.read_only = true;
                def.short_names.push(WORKLOAD_SHORT_NAME.into());
            }
        }
        defs.extend(versions);
    }
    Ok(defs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_served_at_both_versions_as_its_crd_says() {
        let defs = resources().unwrap();
        let find = |plural: &str, version: &str| {
            defs.iter()
                .find(|d| d.plural == plural && d.version == version)
                .unwrap_or_else(|| panic!("{plural} {version} not served"))
        };
        let expected: [(&str, &str, bool, &[&str]); 6] = [
            (
                "resourceflavors",
                "ResourceFlavor",
                false,
                &["flavor", "flavors", "rf"],
            ),
            ("clusterqueues", "ClusterQueue", false, &["cq"]),
            (
                "localqueues",
                "LocalQueue",
                true,
                &["queue", "queues", "lq"],
            ),
            ("cohorts", "Cohort", false, &["co"]),
            (
                "workloadpriorityclasses",
                "WorkloadPriorityClass",
                false,
                &["wpc"],
            ),
            (
                "workloads",
                "Workload",
                true,
                &["kwl", "kueueworkload", "kueueworkloads", "wl"],
            ),
        ];
        for (plural, kind, namespaced, short_names) in expected {
            let stored = find(plural, "v1beta2");
            let old = find(plural, "v1beta1");
            for def in [stored, old] {
                assert_eq!(def.kind, kind);
                assert_eq!(def.group, GROUP);
                assert_eq!(def.namespaced, namespaced, "{plural}");
                assert_eq!(def.short_names, short_names, "{plural}");
                assert_eq!(def.read_only, plural == "workloads", "{plural}");
                assert!(def.schema.is_some());
            }
            assert!(stored.is_storage_version() && stored.deprecation_warning.is_none());
            assert_eq!(old.storage_version(), "v1beta2");
            assert!(old.deprecation_warning.is_some(), "{plural}");
        }
        let cq = find("clusterqueues", "v1beta2");
        let columns: Vec<(&str, &str, i32)> = cq
            .printer_columns
            .iter()
            .map(|c| (c.name.as_str(), c.json_path.as_str(), c.priority))
            .collect();
        assert_eq!(
            columns,
            [
                ("Cohort", ".spec.cohortName", 0),
                ("Strategy", ".spec.queueingStrategy", 1),
                ("Pending Workloads", ".status.pendingWorkloads", 0),
                ("Admitted Workloads", ".status.admittedWorkloads", 1),
            ]
        );
        assert_eq!(
            find("clusterqueues", "v1beta1").printer_columns[0].json_path,
            ".spec.cohort"
        );
        assert_eq!(
            find("clusterqueues", "v1beta1")
                .deprecation_warning
                .as_deref(),
            Some("This version is deprecated. Use v1beta2 instead.")
        );
        assert!(find("clusterqueues", "v1beta2").status_subresource);
        assert!(!find("resourceflavors", "v1beta2").status_subresource);
    }

    #[test]
    fn the_checked_in_crds_are_upstream_copies() {
        let shared = std::env::var_os("TRAINHUB_SHARED_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared")
            })
            .join("upstream/kueue/crds");
        for (file, text) in CRDS {
            let upstream = std::fs::read_to_string(shared.join(file))
                .unwrap_or_else(|e| panic!("{}: {e}", shared.join(file).display()));
            assert!(
                upstream == *text,
                "manifests/crds/{file} differs from upstream's"
            );
        }
    }
}
