//! Kueue objects (`kueue.x-k8s.io/v1beta2`, as JSON) into the plain types
//! of [`super::model`]. Quantities are parsed as pod requests are
//! ([`crate::dispatch::milli`]: milli-units, rounded up). Defaults are
//! Kueue's; the API server has validated the objects against their CRDs,
//! so these functions only refuse what they cannot read.

use std::collections::BTreeMap;

use serde_json::Value;
use trainhub_apiserver::selector::LabelSelector;

use super::model::{
    BorrowWithinCohort, ClusterQueue, Cohort, FairSharing, Flavor, FlavorFungibility, FlavorQuotas,
    Fungibility, LocalQueue, Preemption, QueueingStrategy, Quota, ReclaimWithinCohort,
    ResourceGroup, StopPolicy, Taint, Toleration, WithinClusterQueue, WorkloadPriorityClass,
};

/// A Kueue object that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name:?}: {path}: {message}")]
pub struct QuotaError {
    pub kind: &'static str,
    pub name: String,
    /// The field, as a JSON path (`spec.resourceGroups[0].flavors[1]...`).
    pub path: String,
    pub message: String,
}

struct Reader<'a> {
    kind: &'static str,
    name: &'a str,
}

impl Reader<'_> {
    fn error(&self, path: &str, message: impl Into<String>) -> QuotaError {
        QuotaError {
            kind: self.kind,
            name: self.name.to_string(),
            path: path.to_string(),
            message: message.into(),
        }
    }

    /// A string field: absent or null is None; another type is an error.
    fn string(&self, value: &Value, path: &str) -> Result<Option<String>, QuotaError> {
        match value {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            other => Err(self.error(path, format!("expected a string, got {other}"))),
        }
    }

    fn array<'v>(&self, value: &'v Value, path: &str) -> Result<&'v [Value], QuotaError> {
        match value {
            Value::Null => Ok(&[]),
            Value::Array(items) => Ok(items),
            other => Err(self.error(path, format!("expected a list, got {other}"))),
        }
    }

    /// A quantity (int-or-string) in milli-units; absent is None.
    fn quantity(&self, value: &Value, path: &str) -> Result<Option<i64>, QuotaError> {
        let text = match value {
            Value::Null => return Ok(None),
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => return Err(self.error(path, format!("expected a quantity, got {other}"))),
        };
        let milli = crate::dispatch::milli(&text).map_err(|e| self.error(path, e))?;
        if milli < 0 {
            return Err(self.error(path, format!("quantity {text:?} is negative")));
        }
        Ok(Some(milli))
    }

    fn enumeration<T: Copy>(
        &self,
        value: &Value,
        path: &str,
        default: T,
        values: &[(&str, T)],
    ) -> Result<T, QuotaError> {
        let Some(text) = self.string(value, path)? else {
            return Ok(default);
        };
        values
            .iter()
            .find(|(name, _)| *name == text)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let allowed: Vec<&str> = values.iter().map(|(n, _)| *n).collect();
                self.error(
                    path,
                    format!("{text:?} is not one of {}", allowed.join(", ")),
                )
            })
    }

    fn labels(&self, value: &Value, path: &str) -> Result<BTreeMap<String, String>, QuotaError> {
        match value {
            Value::Null => Ok(BTreeMap::new()),
            Value::Object(m) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    other => Err(self.error(
                        &format!("{path}.{k}"),
                        format!("expected a string, got {other}"),
                    )),
                })
                .collect(),
            other => Err(self.error(path, format!("expected a map, got {other}"))),
        }
    }

    fn taints(&self, value: &Value, path: &str) -> Result<Vec<Taint>, QuotaError> {
        self.array(value, path)?
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let at = format!("{path}[{i}]");
                Ok(Taint {
                    key: self
                        .string(&t["key"], &format!("{at}.key"))?
                        .unwrap_or_default(),
                    value: self
                        .string(&t["value"], &format!("{at}.value"))?
                        .unwrap_or_default(),
                    effect: self
                        .string(&t["effect"], &format!("{at}.effect"))?
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    fn resource_groups(&self, value: &Value, path: &str) -> Result<Vec<ResourceGroup>, QuotaError> {
        let mut groups = Vec::new();
        for (g, group) in self.array(value, path)?.iter().enumerate() {
            let at = format!("{path}[{g}]");
            let covered = self
                .array(
                    &group["coveredResources"],
                    &format!("{at}.coveredResources"),
                )?
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    self.string(r, &format!("{at}.coveredResources[{i}]"))
                        .map(Option::unwrap_or_default)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut flavors = Vec::new();
            for (f, flavor) in self
                .array(&group["flavors"], &format!("{at}.flavors"))?
                .iter()
                .enumerate()
            {
                let fat = format!("{at}.flavors[{f}]");
                let name = self
                    .string(&flavor["name"], &format!("{fat}.name"))?
                    .ok_or_else(|| self.error(&format!("{fat}.name"), "required"))?;
                let mut quotas = BTreeMap::new();
                for (r, resource) in self
                    .array(&flavor["resources"], &format!("{fat}.resources"))?
                    .iter()
                    .enumerate()
                {
                    let rat = format!("{fat}.resources[{r}]");
                    let resource_name = self
                        .string(&resource["name"], &format!("{rat}.name"))?
                        .ok_or_else(|| self.error(&format!("{rat}.name"), "required"))?;
                    let quota = Quota {
                        nominal: self
                            .quantity(&resource["nominalQuota"], &format!("{rat}.nominalQuota"))?
                            .unwrap_or(0),
                        borrowing_limit: self.quantity(
                            &resource["borrowingLimit"],
                            &format!("{rat}.borrowingLimit"),
                        )?,
                        lending_limit: self
                            .quantity(&resource["lendingLimit"], &format!("{rat}.lendingLimit"))?,
                    };
                    quotas.insert(resource_name, quota);
                }
                flavors.push(FlavorQuotas {
                    flavor: name,
                    quotas,
                });
            }
            groups.push(ResourceGroup { covered, flavors });
        }
        Ok(groups)
    }

    fn fair_sharing(&self, value: &Value, path: &str) -> Result<FairSharing, QuotaError> {
        Ok(FairSharing {
            weight_milli: self
                .quantity(&value["weight"], &format!("{path}.weight"))?
                .unwrap_or(1000),
        })
    }
}

fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// A `corev1.Toleration` list (a pod spec's `tolerations`, or a flavor's).
pub fn parse_tolerations(value: &Value) -> Result<Vec<Toleration>, String> {
    let reader = Reader {
        kind: "tolerations",
        name: "",
    };
    tolerations(&reader, value, "tolerations").map_err(|e| format!("{}: {}", e.path, e.message))
}

fn tolerations(
    reader: &Reader<'_>,
    value: &Value,
    path: &str,
) -> Result<Vec<Toleration>, QuotaError> {
    reader
        .array(value, path)?
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("{path}[{i}]");
            let exists = reader.enumeration(
                &t["operator"],
                &format!("{at}.operator"),
                false,
                &[("Equal", false), ("Exists", true)],
            )?;
            Ok(Toleration {
                key: reader
                    .string(&t["key"], &format!("{at}.key"))?
                    .unwrap_or_default(),
                exists,
                value: reader
                    .string(&t["value"], &format!("{at}.value"))?
                    .unwrap_or_default(),
                effect: reader
                    .string(&t["effect"], &format!("{at}.effect"))?
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// A ResourceFlavor.
pub fn parse_flavor(object: &Value) -> Result<Flavor, QuotaError> {
    let name = name_of(object);
    let r = Reader {
        kind: "ResourceFlavor",
        name,
    };
    let spec = &object["spec"];
    Ok(Flavor {
        name: name.to_string(),
        node_labels: r.labels(&spec["nodeLabels"], "spec.nodeLabels")?,
        taints: r.taints(&spec["nodeTaints"], "spec.nodeTaints")?,
        tolerations: tolerations(&r, &spec["tolerations"], "spec.tolerations")?,
    })
}

/// A ClusterQueue.
pub fn parse_cluster_queue(object: &Value) -> Result<ClusterQueue, QuotaError> {
    let name = name_of(object);
    let r = Reader {
        kind: "ClusterQueue",
        name,
    };
    let spec = &object["spec"];
    let preemption = &spec["preemption"];
    let borrow = &preemption["borrowWithinCohort"];
    let fungibility = &spec["flavorFungibility"];
    let fungible = [
        ("MayStopSearch", Fungibility::MayStopSearch),
        ("TryNextFlavor", Fungibility::TryNextFlavor),
    ];
    let namespace_selector = LabelSelector::from_label_selector_json(&spec["namespaceSelector"])
        .map_err(|e| r.error("spec.namespaceSelector", e.message))?;
    let threshold = match &borrow["maxPriorityThreshold"] {
        Value::Null => None,
        v => Some(
            v.as_i64()
                .and_then(|t| i32::try_from(t).ok())
                .ok_or_else(|| {
                    r.error(
                        "spec.preemption.borrowWithinCohort.maxPriorityThreshold",
                        format!("expected a 32-bit integer, got {v}"),
                    )
                })?,
        ),
    };
    Ok(ClusterQueue {
        name: name.to_string(),
        cohort: r
            .string(&spec["cohortName"], "spec.cohortName")?
            .filter(|c| !c.is_empty()),
        resource_groups: r.resource_groups(&spec["resourceGroups"], "spec.resourceGroups")?,
        strategy: r.enumeration(
            &spec["queueingStrategy"],
            "spec.queueingStrategy",
            QueueingStrategy::BestEffortFifo,
            &[
                ("StrictFIFO", QueueingStrategy::StrictFifo),
                ("BestEffortFIFO", QueueingStrategy::BestEffortFifo),
            ],
        )?,
        stop_policy: stop_policy(&r, &spec["stopPolicy"], "spec.stopPolicy")?,
        preemption: Preemption {
            within_cluster_queue: r.enumeration(
                &preemption["withinClusterQueue"],
                "spec.preemption.withinClusterQueue",
                WithinClusterQueue::Never,
                &[
                    ("Never", WithinClusterQueue::Never),
                    ("LowerPriority", WithinClusterQueue::LowerPriority),
                    (
                        "LowerOrNewerEqualPriority",
                        WithinClusterQueue::LowerOrNewerEqualPriority,
                    ),
                ],
            )?,
            reclaim_within_cohort: r.enumeration(
                &preemption["reclaimWithinCohort"],
                "spec.preemption.reclaimWithinCohort",
                ReclaimWithinCohort::Never,
                &[
                    ("Never", ReclaimWithinCohort::Never),
                    ("LowerPriority", ReclaimWithinCohort::LowerPriority),
                    ("Any", ReclaimWithinCohort::Any),
                ],
            )?,
            borrow_within_cohort: BorrowWithinCohort {
                lower_priority: r.enumeration(
                    &borrow["policy"],
                    "spec.preemption.borrowWithinCohort.policy",
                    false,
                    &[("Never", false), ("LowerPriority", true)],
                )?,
                max_priority_threshold: threshold,
            },
        },
        flavor_fungibility: FlavorFungibility {
            when_can_borrow: r.enumeration(
                &fungibility["whenCanBorrow"],
                "spec.flavorFungibility.whenCanBorrow",
                Fungibility::MayStopSearch,
                &fungible,
            )?,
            when_can_preempt: r.enumeration(
                &fungibility["whenCanPreempt"],
                "spec.flavorFungibility.whenCanPreempt",
                Fungibility::TryNextFlavor,
                &fungible,
            )?,
        },
        namespace_selector,
        fair_sharing: r.fair_sharing(&spec["fairSharing"], "spec.fairSharing")?,
    })
}

fn stop_policy(r: &Reader<'_>, value: &Value, path: &str) -> Result<StopPolicy, QuotaError> {
    r.enumeration(
        value,
        path,
        StopPolicy::None,
        &[
            ("None", StopPolicy::None),
            ("Hold", StopPolicy::Hold),
            ("HoldAndDrain", StopPolicy::HoldAndDrain),
        ],
    )
}

/// A Cohort.
pub fn parse_cohort(object: &Value) -> Result<Cohort, QuotaError> {
    let name = name_of(object);
    let r = Reader {
        kind: "Cohort",
        name,
    };
    let spec = &object["spec"];
    Ok(Cohort {
        name: name.to_string(),
        parent: r
            .string(&spec["parentName"], "spec.parentName")?
            .filter(|p| !p.is_empty()),
        resource_groups: r.resource_groups(&spec["resourceGroups"], "spec.resourceGroups")?,
        fair_sharing: r.fair_sharing(&spec["fairSharing"], "spec.fairSharing")?,
    })
}

/// A LocalQueue.
pub fn parse_local_queue(object: &Value) -> Result<LocalQueue, QuotaError> {
    let name = name_of(object);
    let r = Reader {
        kind: "LocalQueue",
        name,
    };
    let spec = &object["spec"];
    Ok(LocalQueue {
        namespace: object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        name: name.to_string(),
        cluster_queue: r
            .string(&spec["clusterQueue"], "spec.clusterQueue")?
            .ok_or_else(|| r.error("spec.clusterQueue", "required"))?,
        stop_policy: stop_policy(&r, &spec["stopPolicy"], "spec.stopPolicy")?,
    })
}

/// A WorkloadPriorityClass.
pub fn parse_priority_class(object: &Value) -> Result<WorkloadPriorityClass, QuotaError> {
    let name = name_of(object);
    let r = Reader {
        kind: "WorkloadPriorityClass",
        name,
    };
    let value = object["value"]
        .as_i64()
        .and_then(|v| i32::try_from(v).ok())
        .ok_or_else(|| {
            r.error(
                "value",
                format!("expected a 32-bit integer, got {}", object["value"]),
            )
        })?;
    Ok(WorkloadPriorityClass {
        name: name.to_string(),
        value,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_upstream_single_clusterqueue_example_reads_with_kueue_defaults() {
        let cq = parse_cluster_queue(&json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "cluster-queue"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [{"name": "default-flavor", "resources": [
                        {"name": "cpu", "nominalQuota": 9},
                        {"name": "memory", "nominalQuota": "36Gi"},
                    ]}],
                }],
            },
        }))
        .unwrap();
        assert_eq!(cq.name, "cluster-queue");
        assert_eq!(cq.cohort, None);
        assert_eq!(cq.strategy, QueueingStrategy::BestEffortFifo);
        assert_eq!(cq.stop_policy, StopPolicy::None);
        assert_eq!(cq.preemption, Preemption::default());
        assert_eq!(cq.flavor_fungibility, FlavorFungibility::default());
        assert!(cq.namespace_selector.matches(Some(&json!({"any": "ns"}))));
        let group = &cq.resource_groups[0];
        assert_eq!(group.covered, ["cpu", "memory"]);
        assert_eq!(group.flavors[0].flavor, "default-flavor");
        assert_eq!(group.flavors[0].quotas["cpu"].nominal, 9000);
        assert_eq!(
            group.flavors[0].quotas["memory"].nominal,
            36 * 1024 * 1024 * 1024 * 1000
        );
        assert_eq!(group.flavors[0].quotas["cpu"].borrowing_limit, None);
    }

    #[test]
    fn every_field_of_a_clusterqueue_is_read() {
        let cq = parse_cluster_queue(&json!({
            "metadata": {"name": "team-a"},
            "spec": {
                "cohortName": "research",
                "queueingStrategy": "StrictFIFO",
                "stopPolicy": "HoldAndDrain",
                "namespaceSelector": {"matchLabels": {"team": "a"}},
                "preemption": {
                    "withinClusterQueue": "LowerOrNewerEqualPriority",
                    "reclaimWithinCohort": "Any",
                    "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
                },
                "flavorFungibility": {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "MayStopSearch"},
                "fairSharing": {"weight": "2"},
                "resourceGroups": [{
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [{"name": "h100", "resources": [
                        {"name": "nvidia.com/gpu", "nominalQuota": 8, "borrowingLimit": 4, "lendingLimit": "2"},
                    ]}],
                }],
            },
        }))
        .unwrap();
        assert_eq!(cq.cohort.as_deref(), Some("research"));
        assert_eq!(cq.strategy, QueueingStrategy::StrictFifo);
        assert_eq!(cq.stop_policy, StopPolicy::HoldAndDrain);
        assert!(cq.namespace_selector.matches(Some(&json!({"team": "a"}))));
        assert!(!cq.namespace_selector.matches(Some(&json!({"team": "b"}))));
        assert_eq!(
            cq.preemption.within_cluster_queue,
            WithinClusterQueue::LowerOrNewerEqualPriority
        );
        assert_eq!(
            cq.preemption.reclaim_within_cohort,
            ReclaimWithinCohort::Any
        );
        assert!(cq.preemption.borrow_within_cohort.lower_priority);
        assert_eq!(
            cq.preemption.borrow_within_cohort.max_priority_threshold,
            Some(100)
        );
        assert_eq!(
            cq.flavor_fungibility.when_can_borrow,
            Fungibility::TryNextFlavor
        );
        assert_eq!(
            cq.flavor_fungibility.when_can_preempt,
            Fungibility::MayStopSearch
        );
        assert_eq!(cq.fair_sharing.weight_milli, 2000);
        let quota = cq.resource_groups[0].flavors[0].quotas["nvidia.com/gpu"];
        assert_eq!(
            quota,
            Quota {
                nominal: 8000,
                borrowing_limit: Some(4000),
                lending_limit: Some(2000)
            }
        );
    }

    #[test]
    fn a_clusterqueue_without_namespace_selector_selects_no_namespace() {
        let cq = parse_cluster_queue(&json!({"metadata": {"name": "q"}, "spec": {}})).unwrap();
        assert!(!cq.namespace_selector.matches(Some(&json!({}))));
    }

    #[test]
    fn unreadable_fields_are_named_in_the_error() {
        let err = parse_cluster_queue(&json!({
            "metadata": {"name": "q"},
            "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                {"name": "f", "resources": [{"name": "cpu", "nominalQuota": "lots"}]},
            ]}]},
        }))
        .unwrap_err();
        assert_eq!(err.kind, "ClusterQueue");
        assert_eq!(
            err.path,
            "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota"
        );
        let err = parse_cluster_queue(&json!({
            "metadata": {"name": "q"},
            "spec": {"queueingStrategy": "Random"},
        }))
        .unwrap_err();
        assert_eq!(err.path, "spec.queueingStrategy");
        assert!(err.message.contains("StrictFIFO"), "{err}");
    }

    #[test]
    fn flavors_with_labels_taints_and_tolerations_read_as_upstream_writes_them() {
        let flavor = parse_flavor(&json!({
            "metadata": {"name": "spot"},
            "spec": {
                "nodeLabels": {"instance-type": "spot"},
                "nodeTaints": [{"effect": "NoSchedule", "key": "spot", "value": "true"}],
                "tolerations": [{"key": "spot-taint", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }))
        .unwrap();
        assert_eq!(flavor.node_labels["instance-type"], "spot");
        assert_eq!(flavor.taints[0].to_string(), "spot=true:NoSchedule");
        assert!(flavor.tolerations[0].exists);
        assert_eq!(
            parse_flavor(&json!({"metadata": {"name": "default-flavor"}}))
                .unwrap()
                .name,
            "default-flavor"
        );
    }

    #[test]
    fn cohorts_local_queues_and_priority_classes_read() {
        let cohort = parse_cohort(&json!({
            "metadata": {"name": "research"},
            "spec": {"parentName": "org", "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                {"name": "f", "resources": [{"name": "cpu", "nominalQuota": "500m", "lendingLimit": 0}]},
            ]}]},
        }))
        .unwrap();
        assert_eq!(cohort.parent.as_deref(), Some("org"));
        assert_eq!(
            cohort.resource_groups[0].flavors[0].quotas["cpu"].nominal,
            500
        );
        let lq = parse_local_queue(&json!({
            "metadata": {"name": "user-queue", "namespace": "default"},
            "spec": {"clusterQueue": "cluster-queue"},
        }))
        .unwrap();
        assert_eq!(
            (lq.namespace.as_str(), lq.cluster_queue.as_str()),
            ("default", "cluster-queue")
        );
        let wpc =
            parse_priority_class(&json!({"metadata": {"name": "high"}, "value": 1000})).unwrap();
        assert_eq!(wpc.value, 1000);
        assert!(
            parse_priority_class(&json!({"metadata": {"name": "x"}, "value": "high"})).is_err()
        );
    }

    #[test]
    fn tolerations_match_taints_by_kubernetes_rules() {
        let taint = Taint {
            key: "spot".into(),
            value: "true".into(),
            effect: "NoSchedule".into(),
        };
        let t = parse_tolerations(&json!([{"key": "spot", "value": "true"}])).unwrap();
        assert!(t[0].tolerates(&taint));
        let t = parse_tolerations(&json!([{"key": "spot", "value": "false"}])).unwrap();
        assert!(!t[0].tolerates(&taint));
        let t = parse_tolerations(
            &json!([{"key": "spot", "operator": "Exists", "effect": "NoExecute"}]),
        )
        .unwrap();
        assert!(!t[0].tolerates(&taint));
        let t = parse_tolerations(&json!([{"operator": "Exists"}])).unwrap();
        assert!(t[0].tolerates(&taint));
        assert!(parse_tolerations(&json!([{"operator": "Sometimes"}])).is_err());
    }
}
