//! Kueue's objects between v1beta1 and v1beta2, field for field as Kueue's
//! conversion webhook (v0.19) converts them. Everything not named here is
//! the same at both versions and passes through.
//!
//! | kind | v1beta1 | v1beta2 |
//! |---|---|---|
//! | ClusterQueue | `spec.cohort` | `spec.cohortName` |
//! | | `spec.admissionChecks: [name]` | `spec.admissionChecksStrategy.admissionChecks: [{name}]` |
//! | | `flavorFungibility.whenCanPreempt: Preempt`, `whenCanBorrow: Borrow` | `MayStopSearch` (both) |
//! | | `status.pendingWorkloadsStatus`, `status.fairSharing.admissionFairSharingStatus` | (dropped) |
//! | | (dropped) | `spec.concurrentAdmissionPolicy` |
//! | LocalQueue | `status.flavorUsage` | `status.flavorsUsage` |
//! | | `status.flavors` | (dropped) |
//! | Cohort | `status.fairSharing.admissionFairSharingStatus` | (dropped) |
//! | Workload | `spec.priorityClassSource` + `spec.priorityClassName` | `spec.priorityClassRef {group, kind, name}` |
//! | | `status.accumulatedPastExexcutionTimeSeconds` (sic) | `status.accumulatedPastExecutionTimeSeconds` |
//! | | `topologyAssignment.domains: [{values, count}]` | `topologyAssignment.slices` |
//! | | (dropped) | `spec.preemptionGates`, `status.preemptionGates`, `topologyRequest.podsetSliceRequiredTopologyConstraints` |
//!
//! ResourceFlavor and WorkloadPriorityClass are the same at both versions.
//! Cohorts are the same too but for status (`spec.parentName` at both:
//! v1alpha1's `parent` is not served). What one version cannot hold is
//! lost on the way to it, as with Kueue's webhook; a v1beta1 object in the
//! v1beta1 spelling (no deprecated values) survives v1beta1 → v1beta2 →
//! v1beta1 unchanged.

use serde_json::{Map, Value, json};

use super::{
    CLUSTER_QUEUE, COHORT, GROUP, LOCAL_QUEUE, RESOURCE_FLAVOR, STORAGE_VERSION, V1BETA1, WORKLOAD,
    WORKLOAD_PRIORITY_CLASS,
};

/// v1beta1's `priorityClassSource` for a WorkloadPriorityClass.
const WORKLOAD_PRIORITY_CLASS_SOURCE: &str = "kueue.x-k8s.io/workloadpriorityclass";
/// v1beta1's `priorityClassSource` for a pod PriorityClass.
const POD_PRIORITY_CLASS_SOURCE: &str = "scheduling.k8s.io/priorityclass";
/// The group and kind of a pod PriorityClass.
const POD_PRIORITY_CLASS_GROUP: &str = "scheduling.k8s.io";
const POD_PRIORITY_CLASS_KIND: &str = "PriorityClass";

/// `object`, a `kind` at version `from`, at version `to` (`v1beta1` or
/// `v1beta2`); `apiVersion` is left to the caller.
///
/// # Errors
///
/// An unknown kind or version, or a topology assignment whose counts do
/// not add up.
pub fn convert(kind: &str, object: Value, from: &str, to: &str) -> Result<Value, String> {
    match (from, to) {
        _ if from == to => Ok(object),
        (V1BETA1, STORAGE_VERSION) => to_v1beta2(kind, object),
        (STORAGE_VERSION, V1BETA1) => to_v1beta1(kind, object),
        _ => Err(format!("no conversion of {kind} from {from} to {to}")),
    }
}

/// A v1beta1 object of `kind` at v1beta2.
///
/// # Errors
///
/// See [`convert`].
pub fn to_v1beta2(kind: &str, mut object: Value) -> Result<Value, String> {
    match kind {
        CLUSTER_QUEUE => cluster_queue_to_v1beta2(&mut object),
        LOCAL_QUEUE => local_queue_to_v1beta2(&mut object),
        COHORT => drop_admission_fair_sharing_status(&mut object),
        WORKLOAD => workload_to_v1beta2(&mut object)?,
        RESOURCE_FLAVOR | WORKLOAD_PRIORITY_CLASS => {}
        other => return Err(format!("{other} is not a {GROUP} kind")),
    }
    Ok(object)
}

/// A v1beta2 object of `kind` at v1beta1.
///
/// # Errors
///
/// See [`convert`].
pub fn to_v1beta1(kind: &str, mut object: Value) -> Result<Value, String> {
    match kind {
        CLUSTER_QUEUE => cluster_queue_to_v1beta1(&mut object),
        LOCAL_QUEUE => local_queue_to_v1beta1(&mut object),
        WORKLOAD => workload_to_v1beta1(&mut object)?,
        COHORT | RESOURCE_FLAVOR | WORKLOAD_PRIORITY_CLASS => {}
        other => return Err(format!("{other} is not a {GROUP} kind")),
    }
    Ok(object)
}

/// The object at `path` under `value`, when there is one.
fn at<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut here = value;
    for key in path {
        here = here.get_mut(*key)?;
    }
    here.as_object_mut()
}

/// Moves `map[from]` to `map[to]` (replacing it), when present.
fn rename(map: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(v) = map.remove(from) {
        map.insert(to.into(), v);
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn cluster_queue_to_v1beta2(cq: &mut Value) {
    if let Some(spec) = at(cq, &["spec"]) {
        // An empty cohort is no cohort at either version.
        match spec.remove("cohort") {
            Some(cohort) if !is_empty(&cohort) => {
                spec.insert("cohortName".into(), cohort);
            }
            _ => {}
        }
        // The plain list of checks becomes the strategy, replacing one
        // given beside it (v1beta1's CRD allows only one of the two).
        if let Some(Value::Array(names)) = spec.remove("admissionChecks")
            && !names.is_empty()
        {
            let rules: Vec<Value> = names.into_iter().map(|n| json!({"name": n})).collect();
            spec.insert(
                "admissionChecksStrategy".into(),
                json!({"admissionChecks": rules}),
            );
        }
        if let Some(fungibility) = spec
            .get_mut("flavorFungibility")
            .and_then(Value::as_object_mut)
        {
            for (field, retired) in [("whenCanPreempt", "Preempt"), ("whenCanBorrow", "Borrow")] {
                if fungibility.get(field).and_then(Value::as_str) == Some(retired) {
                    fungibility.insert(field.into(), "MayStopSearch".into());
                }
            }
        }
    }
    if let Some(status) = at(cq, &["status"]) {
        status.remove("pendingWorkloadsStatus");
    }
    drop_admission_fair_sharing_status(cq);
}

fn cluster_queue_to_v1beta1(cq: &mut Value) {
    if let Some(spec) = at(cq, &["spec"]) {
        rename(spec, "cohortName", "cohort");
        spec.remove("concurrentAdmissionPolicy");
    }
}

/// ClusterQueues and Cohorts: v1beta2 keeps no admission fair sharing
/// status.
fn drop_admission_fair_sharing_status(object: &mut Value) {
    if let Some(fair_sharing) = at(object, &["status", "fairSharing"]) {
        fair_sharing.remove("admissionFairSharingStatus");
    }
}

fn local_queue_to_v1beta2(lq: &mut Value) {
    if let Some(status) = at(lq, &["status"]) {
        rename(status, "flavorUsage", "flavorsUsage");
        status.remove("flavors");
    }
}

fn local_queue_to_v1beta1(lq: &mut Value) {
    if let Some(status) = at(lq, &["status"]) {
        rename(status, "flavorsUsage", "flavorUsage");
    }
}

fn workload_to_v1beta2(wl: &mut Value) -> Result<(), String> {
    if let Some(spec) = at(wl, &["spec"]) {
        let source = spec.remove("priorityClassSource");
        let name = spec.remove("priorityClassName").unwrap_or_default();
        let (group, kind) = match source.as_ref().and_then(Value::as_str) {
            Some(WORKLOAD_PRIORITY_CLASS_SOURCE) => (GROUP, WORKLOAD_PRIORITY_CLASS),
            Some(POD_PRIORITY_CLASS_SOURCE) => (POD_PRIORITY_CLASS_GROUP, POD_PRIORITY_CLASS_KIND),
            _ => ("", ""),
        };
        if !group.is_empty() {
            spec.insert(
                "priorityClassRef".into(),
                json!({"group": group, "kind": kind, "name": name}),
            );
        }
    }
    if let Some(status) = at(wl, &["status"]) {
        rename(
            status,
            "accumulatedPastExexcutionTimeSeconds",
            "accumulatedPastExecutionTimeSeconds",
        );
    }
    for assignment in topology_assignments(wl) {
        domains_to_slices(assignment)?;
    }
    Ok(())
}

fn workload_to_v1beta1(wl: &mut Value) -> Result<(), String> {
    if let Some(spec) = at(wl, &["spec"]) {
        spec.remove("preemptionGates");
        if let Some(reference) = spec.remove("priorityClassRef") {
            let text = |k: &str| reference.get(k).and_then(Value::as_str).unwrap_or_default();
            let source = match (text("group"), text("kind")) {
                (GROUP, WORKLOAD_PRIORITY_CLASS) => Some(WORKLOAD_PRIORITY_CLASS_SOURCE),
                (POD_PRIORITY_CLASS_GROUP, POD_PRIORITY_CLASS_KIND) => {
                    Some(POD_PRIORITY_CLASS_SOURCE)
                }
                _ => None,
            };
            if let Some(source) = source {
                spec.insert("priorityClassSource".into(), source.into());
                spec.insert("priorityClassName".into(), text("name").into());
            }
        }
        if let Some(Value::Array(pod_sets)) = spec.get_mut("podSets") {
            for pod_set in pod_sets {
                if let Some(request) = at(pod_set, &["topologyRequest"]) {
                    request.remove("podsetSliceRequiredTopologyConstraints");
                }
            }
        }
    }
    if let Some(status) = at(wl, &["status"]) {
        status.remove("preemptionGates");
        rename(
            status,
            "accumulatedPastExecutionTimeSeconds",
            "accumulatedPastExexcutionTimeSeconds",
        );
    }
    for assignment in topology_assignments(wl) {
        slices_to_domains(assignment)?;
    }
    Ok(())
}

/// Every `status.admission.podSetAssignments[].topologyAssignment`.
fn topology_assignments(wl: &mut Value) -> Vec<&mut Map<String, Value>> {
    let Some(Value::Array(assignments)) = wl.pointer_mut("/status/admission/podSetAssignments")
    else {
        return Vec::new();
    };
    assignments
        .iter_mut()
        .filter_map(|a| a.get_mut("topologyAssignment"))
        .filter_map(Value::as_object_mut)
        .collect()
}

/// v1beta1's list of domains (`{values: [one per level], count}`) as one
/// v1beta2 slice: a level whose domains all share a value gives it once
/// (`universal`), otherwise one value per domain (`individual.roots`); the
/// pod counts likewise.
fn domains_to_slices(assignment: &mut Map<String, Value>) -> Result<(), String> {
    let Some(domains) = assignment.remove("domains") else {
        return Ok(());
    };
    let domains = domains.as_array().cloned().unwrap_or_default();
    let levels = assignment
        .get("levels")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if domains.is_empty() {
        return Ok(());
    }
    let mut values_per_level = Vec::with_capacity(levels);
    for level in 0..levels {
        let values: Vec<&Value> = domains
            .iter()
            .map(|d| {
                d.pointer(&format!("/values/{level}"))
                    .unwrap_or(&Value::Null)
            })
            .collect();
        if values.iter().any(|v| !v.is_string()) {
            return Err(format!(
                "topologyAssignment.domains: a domain has no value for level {level}"
            ));
        }
        values_per_level.push(universal_or_individual(
            &values,
            |roots| json!({"roots": roots}),
        ));
    }
    let counts: Vec<&Value> = domains
        .iter()
        .map(|d| d.get("count").unwrap_or(&Value::Null))
        .collect();
    let pod_counts = universal_or_individual(&counts, Value::Array);
    let slice = json!({
        "domainCount": domains.len(),
        "valuesPerLevel": values_per_level,
        "podCounts": pod_counts,
    });
    assignment.insert("slices".into(), json!([slice]));
    Ok(())
}

/// `{universal: v}` when every value is `v`, else `{individual: all(values)}`.
fn universal_or_individual(values: &[&Value], all: impl Fn(Vec<Value>) -> Value) -> Value {
    match values.first() {
        Some(first) if values.iter().all(|v| v == first) => json!({"universal": first}),
        _ => json!({"individual": all(values.iter().map(|v| (*v).clone()).collect())}),
    }
}

/// v1beta2's slices expanded to v1beta1's list of domains, in order.
fn slices_to_domains(assignment: &mut Map<String, Value>) -> Result<(), String> {
    let Some(slices) = assignment.remove("slices") else {
        return Ok(());
    };
    let levels = assignment
        .get("levels")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let mut domains = Vec::new();
    for (s, slice) in slices.as_array().into_iter().flatten().enumerate() {
        let here = format!("topologyAssignment.slices[{s}]");
        let count = slice
            .get("domainCount")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("{here}.domainCount: missing"))?;
        let count = usize::try_from(count).map_err(|_| format!("{here}.domainCount: too large"))?;
        let per_level = slice
            .get("valuesPerLevel")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if per_level.len() != levels {
            return Err(format!(
                "{here}.valuesPerLevel: {} entries for {levels} levels",
                per_level.len()
            ));
        }
        for i in 0..count {
            let mut values = Vec::with_capacity(levels);
            for (l, level) in per_level.iter().enumerate() {
                let value = if let Some(universal) = level.get("universal") {
                    universal.as_str().unwrap_or_default().to_string()
                } else {
                    let individual = &level["individual"];
                    let root = individual["roots"][i].as_str().ok_or_else(|| {
                        format!("{here}.valuesPerLevel[{l}].individual.roots: fewer than {count}")
                    })?;
                    let part = |k: &str| individual[k].as_str().unwrap_or_default();
                    format!("{}{root}{}", part("prefix"), part("suffix"))
                };
                values.push(Value::String(value));
            }
            let pods = match slice.pointer("/podCounts/universal") {
                Some(universal) => universal.clone(),
                None => slice
                    .pointer(&format!("/podCounts/individual/{i}"))
                    .cloned()
                    .ok_or_else(|| format!("{here}.podCounts.individual: fewer than {count}"))?,
            };
            domains.push(json!({"values": values, "count": pods}));
        }
    }
    assignment.insert("domains".into(), Value::Array(domains));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(kind: &str, v1beta1: Value) {
        let up = convert(kind, v1beta1.clone(), V1BETA1, STORAGE_VERSION).unwrap();
        let down = convert(kind, up.clone(), STORAGE_VERSION, V1BETA1).unwrap();
        assert_eq!(down, v1beta1, "{kind} round trip, via {up:#}");
    }

    #[test]
    fn cluster_queue_cohort_is_renamed_both_ways() {
        let v1beta1 = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
            "metadata": {"name": "team-a"},
            "spec": {
                "cohort": "research",
                "namespaceSelector": {},
                "queueingStrategy": "BestEffortFIFO",
                "admissionChecksStrategy": {"admissionChecks": [{"name": "prov", "onFlavors": ["gpu"]}]},
                "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
                "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                    {"name": "gpu", "resources": [{"name": "cpu", "nominalQuota": "9", "lendingLimit": "1"}]}
                ]}],
            },
            "status": {"pendingWorkloads": 1, "fairSharing": {"weightedShare": 0}},
        });
        let v1beta2 = to_v1beta2(CLUSTER_QUEUE, v1beta1.clone()).unwrap();
        assert_eq!(v1beta2["spec"]["cohortName"], "research");
        assert!(v1beta2["spec"].get("cohort").is_none());
        round_trip(CLUSTER_QUEUE, v1beta1);
    }

    #[test]
    fn cluster_queue_retired_v1beta1_spellings_take_their_v1beta2_form() {
        let v1beta1 = json!({"spec": {
            "cohort": "",
            "admissionChecks": ["prov", "multikueue"],
            "flavorFungibility": {"whenCanBorrow": "Borrow", "whenCanPreempt": "Preempt"},
        }, "status": {
            "pendingWorkloadsStatus": {"clusterQueuePendingWorkload": [], "lastChangeTime": "2025-01-01T00:00:00Z"},
            "fairSharing": {"weightedShare": 5, "admissionFairSharingStatus": {"consumedResources": {}, "lastUpdate": "2025-01-01T00:00:00Z"}},
        }});
        let v1beta2 = to_v1beta2(CLUSTER_QUEUE, v1beta1).unwrap();
        assert_eq!(
            v1beta2,
            json!({"spec": {
                "admissionChecksStrategy": {"admissionChecks": [{"name": "prov"}, {"name": "multikueue"}]},
                "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "MayStopSearch"},
            }, "status": {"fairSharing": {"weightedShare": 5}}})
        );
    }

    #[test]
    fn cluster_queue_v1beta2_only_fields_are_dropped_at_v1beta1() {
        let v1beta2 = json!({"spec": {
            "cohortName": "research",
            "concurrentAdmissionPolicy": {"migration": {"mode": "TryPreferredFlavors"}},
        }});
        assert_eq!(
            to_v1beta1(CLUSTER_QUEUE, v1beta2.clone()).unwrap(),
            json!({"spec": {"cohort": "research"}})
        );
        // And back: only what v1beta1 could hold.
        assert_eq!(
            convert(
                CLUSTER_QUEUE,
                to_v1beta1(CLUSTER_QUEUE, v1beta2).unwrap(),
                V1BETA1,
                STORAGE_VERSION
            )
            .unwrap(),
            json!({"spec": {"cohortName": "research"}})
        );
    }

    #[test]
    fn local_queue_flavor_usage_is_renamed() {
        let usage =
            json!([{"name": "default-flavor", "resources": [{"name": "cpu", "total": "3"}]}]);
        let v1beta1 = json!({
            "spec": {"clusterQueue": "cluster-queue", "stopPolicy": "None"},
            "status": {"pendingWorkloads": 0, "flavorUsage": usage, "flavorsReservation": usage},
        });
        let v1beta2 = to_v1beta2(LOCAL_QUEUE, v1beta1.clone()).unwrap();
        assert_eq!(v1beta2["status"]["flavorsUsage"], usage);
        assert!(v1beta2["status"].get("flavorUsage").is_none());
        round_trip(LOCAL_QUEUE, v1beta1);
        let with_flavors = json!({"status": {"flavors": [{"name": "x"}]}});
        assert_eq!(
            to_v1beta2(LOCAL_QUEUE, with_flavors).unwrap(),
            json!({"status": {}})
        );
    }

    #[test]
    fn cohort_resource_flavor_and_priority_class_are_the_same() {
        for (kind, object) in [
            (
                COHORT,
                json!({"spec": {"parentName": "root", "resourceGroups": [], "fairSharing": {"weight": "1"}}}),
            ),
            (
                RESOURCE_FLAVOR,
                json!({"spec": {"nodeLabels": {"instance-type": "spot"}, "nodeTaints": [{"key": "spot", "value": "true", "effect": "NoSchedule"}]}}),
            ),
            (
                WORKLOAD_PRIORITY_CLASS,
                json!({"value": 1000, "description": "urgent"}),
            ),
        ] {
            assert_eq!(to_v1beta2(kind, object.clone()).unwrap(), object, "{kind}");
            round_trip(kind, object);
        }
        let cohort = json!({"status": {"fairSharing": {"weightedShare": 1, "admissionFairSharingStatus": {}}}});
        assert_eq!(
            to_v1beta2(COHORT, cohort).unwrap(),
            json!({"status": {"fairSharing": {"weightedShare": 1}}})
        );
    }

    #[test]
    fn workload_priority_class_source_and_name_become_a_reference() {
        for (source, group, kind) in [
            (
                WORKLOAD_PRIORITY_CLASS_SOURCE,
                "kueue.x-k8s.io",
                "WorkloadPriorityClass",
            ),
            (
                POD_PRIORITY_CLASS_SOURCE,
                "scheduling.k8s.io",
                "PriorityClass",
            ),
        ] {
            let v1beta1 = json!({"spec": {
                "queueName": "user-queue", "priority": 100,
                "priorityClassSource": source, "priorityClassName": "high",
                "podSets": [{"name": "node", "count": 2, "template": {"spec": {"containers": []}}}],
            }, "status": {"accumulatedPastExexcutionTimeSeconds": 30}});
            let v1beta2 = to_v1beta2(WORKLOAD, v1beta1.clone()).unwrap();
            assert_eq!(
                v1beta2["spec"]["priorityClassRef"],
                json!({"group": group, "kind": kind, "name": "high"})
            );
            assert!(v1beta2["spec"].get("priorityClassSource").is_none());
            assert_eq!(v1beta2["status"]["accumulatedPastExecutionTimeSeconds"], 30);
            round_trip(WORKLOAD, v1beta1);
        }
        // No source: no reference.
        let v1beta2 = to_v1beta2(
            WORKLOAD,
            json!({"spec": {"priorityClassSource": "", "priority": 0}}),
        )
        .unwrap();
        assert_eq!(v1beta2, json!({"spec": {"priority": 0}}));
    }

    #[test]
    fn workload_v1beta2_only_fields_are_dropped_at_v1beta1() {
        let v1beta2 = json!({"spec": {
            "preemptionGates": [{"name": "g"}],
            "podSets": [{"name": "a", "topologyRequest": {"required": "rack", "podsetSliceRequiredTopologyConstraints": [{"size": 2, "topology": "block"}]}}],
        }, "status": {"preemptionGates": [{"name": "g", "position": 0}]}});
        assert_eq!(
            to_v1beta1(WORKLOAD, v1beta2).unwrap(),
            json!({"spec": {"podSets": [{"name": "a", "topologyRequest": {"required": "rack"}}]}, "status": {}})
        );
    }

    #[test]
    fn workload_topology_domains_and_slices_carry_the_same_assignment() {
        let domains = json!([
            {"values": ["block-a", "node-1"], "count": 2},
            {"values": ["block-a", "node-2"], "count": 2},
            {"values": ["block-a", "node-3"], "count": 1},
        ]);
        let v1beta1 = json!({"status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "node", "topologyAssignment": {"levels": ["block", "hostname"], "domains": domains}}
        ]}}});
        let v1beta2 = to_v1beta2(WORKLOAD, v1beta1.clone()).unwrap();
        assert_eq!(
            v1beta2["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"],
            json!({"levels": ["block", "hostname"], "slices": [{
                "domainCount": 3,
                "valuesPerLevel": [
                    {"universal": "block-a"},
                    {"individual": {"roots": ["node-1", "node-2", "node-3"]}},
                ],
                "podCounts": {"individual": [2, 2, 1]},
            }]})
        );
        round_trip(WORKLOAD, v1beta1);

        // Kueue's own compact form, with prefixes and several slices.
        let v1beta2 = json!({"status": {"admission": {"podSetAssignments": [{"name": "n", "topologyAssignment": {
            "levels": ["hostname"],
            "slices": [
                {"domainCount": 2, "valuesPerLevel": [{"individual": {"prefix": "node-", "roots": ["1", "2"]}}], "podCounts": {"universal": 4}},
                {"domainCount": 1, "valuesPerLevel": [{"universal": "spare"}], "podCounts": {"individual": [1]}},
            ],
        }}]}}});
        assert_eq!(
            to_v1beta1(WORKLOAD, v1beta2).unwrap()["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"],
            json!({"levels": ["hostname"], "domains": [
                {"values": ["node-1"], "count": 4},
                {"values": ["node-2"], "count": 4},
                {"values": ["spare"], "count": 1},
            ]})
        );
        let short = json!({"status": {"admission": {"podSetAssignments": [{"topologyAssignment": {
            "levels": ["hostname"],
            "slices": [{"domainCount": 2, "valuesPerLevel": [{"individual": {"roots": ["a"]}}], "podCounts": {"universal": 1}}],
        }}]}}});
        let e = to_v1beta1(WORKLOAD, short).unwrap_err();
        assert!(e.contains("individual.roots: fewer than 2"), "{e}");
    }

    #[test]
    fn unknown_kinds_and_versions_are_refused() {
        assert!(convert("Pod", json!({}), V1BETA1, STORAGE_VERSION).is_err());
        assert!(convert(CLUSTER_QUEUE, json!({}), "v1alpha1", STORAGE_VERSION).is_err());
        assert_eq!(
            convert(
                CLUSTER_QUEUE,
                json!({"spec": {"cohort": "x"}}),
                V1BETA1,
                V1BETA1
            )
            .unwrap(),
            json!({"spec": {"cohort": "x"}})
        );
    }
}
