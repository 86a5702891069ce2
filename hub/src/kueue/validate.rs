//! Kueue's validating webhooks (v0.19): the checks of ClusterQueues,
//! Cohorts and ResourceFlavors that their CRDs do not carry, with Kueue's
//! field paths and messages. Pure functions over v1beta2 objects (the
//! version Kueue's webhooks are registered for), already defaulted and
//! valid against the CRD schema.
//!
//! LocalQueues and WorkloadPriorityClasses have no webhook in v0.19: their
//! rules (`spec.clusterQueue` is immutable) are in their CRDs.
//!
//! The hub adds one check Kueue leaves to its controller: a Cohort may not
//! be its own ancestor ([`cohort_cycle`]). Kueue accepts such a cycle and
//! marks the cohorts in it inactive; the hub refuses the write that would
//! close it, so that quota decisions never meet one.

use std::collections::BTreeSet;

use serde_json::Value;
use trainhub_apiserver::field::{self, ErrorType, FieldError};
use trainhub_apiserver::selector::{label_value_errors, qualified_name_errors};
use trainhub_builtin_plugins::quantity::Quantity;

/// apimachinery's `IsNegativeErrorMsg`.
const NEGATIVE: &str = "must be greater than or equal to 0";
/// More flavors (or covered resources) than this across a queue's groups
/// are refused.
const MAX_TOTAL: usize = 256;
/// More flavor × resource quotas than this in one resource group are
/// refused.
const MAX_FLAVOR_RESOURCES: usize = 512;

/// What a queue's (or cohort's) quotas are checked with.
struct QuotaRules {
    /// A ClusterQueue's cohort, or a Cohort's parent, is set: limits are
    /// allowed.
    has_parent: bool,
    /// ClusterQueues: `lendingLimit` at most `nominalQuota`.
    lending_within_nominal: bool,
    /// What the missing parent is called in messages: `cohort` or `parent`.
    parent: &'static str,
}

/// Kueue's ClusterQueue webhook, on create (`old` None) or update.
pub fn cluster_queue(cq: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let spec = &cq["spec"];
    let groups = list(&spec["resourceGroups"]);
    let rules = QuotaRules {
        has_parent: !text(&spec["cohortName"]).is_empty(),
        lending_within_nominal: true,
        parent: "cohort",
    };
    let mut errors = resource_groups(groups, &rules, "spec.resourceGroups");
    if let Some(selector) = spec.get("namespaceSelector") {
        errors.extend(label_selector(selector, "spec.namespaceSelector"));
    }
    if let Some(preemption) = spec.get("preemption") {
        let borrow_policy = &preemption["borrowWithinCohort"]["policy"];
        if text(&preemption["reclaimWithinCohort"]) == "Never"
            && preemption.get("borrowWithinCohort").is_some()
            && text(borrow_policy) != "Never"
        {
            errors.push(FieldError::invalid(
                "spec.preemption",
                preemption.clone(),
                "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never",
            ));
        }
    }
    let fungibility = &spec["flavorFungibility"];
    if let Some(preference) = fungibility.get("preference").filter(|p| !p.is_null())
        && (text(&fungibility["whenCanBorrow"]) != "TryNextFlavor"
            || text(&fungibility["whenCanPreempt"]) != "TryNextFlavor")
    {
        errors.push(FieldError::invalid(
            "spec.flavorFungibility.preference",
            preference.clone(),
            format!(
                "preference {:?} requires both whenCanBorrow and whenCanPreempt to be TryNextFlavor",
                text(preference)
            ),
        ));
    }
    errors.extend(fair_sharing(&spec["fairSharing"], "spec.fairSharing"));
    errors.extend(totals(groups, "spec.resourceGroups"));
    errors.extend(admission_check_flavors(cq, old));
    if let Some(old) = old {
        let (new_policy, old_policy) = (
            &spec["concurrentAdmissionPolicy"],
            &old["spec"]["concurrentAdmissionPolicy"],
        );
        if new_policy != old_policy {
            errors.push(FieldError::invalid(
                "spec.concurrentAdmissionPolicy",
                new_policy.clone(),
                "field is immutable",
            ));
        }
    }
    errors
}

/// Kueue's Cohort webhook (the same on create and update).
pub fn cohort(cohort: &Value) -> Vec<FieldError> {
    let spec = &cohort["spec"];
    let rules = QuotaRules {
        has_parent: !text(&spec["parentName"]).is_empty(),
        lending_within_nominal: false,
        parent: "parent",
    };
    let mut errors = fair_sharing(&spec["fairSharing"], "spec.fairSharing");
    errors.extend(resource_groups(
        list(&spec["resourceGroups"]),
        &rules,
        "spec.resourceGroups",
    ));
    errors
}

/// Kueue's ResourceFlavor webhook (the same on create and update).
pub fn resource_flavor(flavor: &Value) -> Vec<FieldError> {
    let spec = &flavor["spec"];
    let mut errors = labels(&spec["nodeLabels"], "spec.nodeLabels");
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for (i, taint) in list(&spec["nodeTaints"]).iter().enumerate() {
        let path = field::index("spec.nodeTaints", i);
        let key = text(&taint["key"]);
        errors.extend(label_name(key, &field::child(&path, "key")));
        let value = text(&taint["value"]);
        let problems = label_value_errors(value);
        if !problems.is_empty() {
            errors.push(FieldError::invalid(
                field::child(&path, "value"),
                value,
                problems.join(";"),
            ));
        }
        if !seen.insert((text(&taint["effect"]).to_string(), key.to_string())) {
            errors.push(FieldError::new(
                ErrorType::Duplicate,
                path,
                Some(taint.clone()),
                "taints must be unique by key and effect pair",
            ));
        }
    }
    for (i, toleration) in list(&spec["tolerations"]).iter().enumerate() {
        let key = text(&toleration["key"]);
        if !key.is_empty() {
            let path = field::child(&field::index("spec.tolerations", i), "key");
            errors.extend(label_name(key, &path));
        }
    }
    errors
}

/// The hub's cohort cycle check: the Cohort `name` with parent `parent`
/// (its `spec.parentName`), where `parent_of` answers the parent of every
/// other Cohort that exists. A Cohort that would be its own ancestor is
/// refused on `spec.parentName`, naming the cycle.
pub fn cohort_cycle(
    name: &str,
    parent: &str,
    parent_of: impl Fn(&str) -> Option<String>,
) -> Option<FieldError> {
    let mut chain = vec![name.to_string()];
    let mut next = parent.to_string();
    let mut seen = BTreeSet::new();
    while !next.is_empty() {
        chain.push(next.clone());
        if next == name {
            return Some(FieldError::invalid(
                "spec.parentName",
                parent,
                format!(
                    "cohort has a cycle: {}; a Cohort may not be its own ancestor",
                    chain.join(" -> ")
                ),
            ));
        }
        // A cycle among the others (written before this check) is theirs.
        if !seen.insert(next.clone()) {
            return None;
        }
        next = parent_of(&next).unwrap_or_default();
    }
    None
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn list(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A quantity as the CRD allows it: a number or a string.
fn quantity(value: &Value) -> Option<Quantity> {
    match value {
        Value::Number(n) => Quantity::parse(&n.to_string()).ok(),
        Value::String(s) => Quantity::parse(s).ok(),
        _ => None,
    }
}

fn resource_groups(groups: &[Value], rules: &QuotaRules, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut resources = BTreeSet::new();
    let mut flavors = BTreeSet::new();
    for (i, group) in groups.iter().enumerate() {
        let path = field::index(path, i);
        let covered = list(&group["coveredResources"]);
        for (j, name) in covered.iter().enumerate() {
            let path = field::index(&field::child(&path, "coveredResources"), j);
            let name = text(name);
            for problem in qualified_name_errors(name) {
                errors.push(FieldError::invalid(path.clone(), name, problem));
            }
            if !resources.insert(name) {
                errors.push(FieldError::duplicate(path, name));
            }
        }
        for (j, flavor) in list(&group["flavors"]).iter().enumerate() {
            let path = field::index(&field::child(&path, "flavors"), j);
            errors.extend(flavor_quotas(flavor, covered, rules, &path));
            let name = text(&flavor["name"]);
            if !flavors.insert(name) {
                errors.push(FieldError::duplicate(field::child(&path, "name"), name));
            }
        }
    }
    errors
}

fn flavor_quotas(
    flavor: &Value,
    covered: &[Value],
    rules: &QuotaRules,
    path: &str,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (i, quota) in list(&flavor["resources"]).iter().enumerate() {
        let Some(covered_name) = covered.get(i) else {
            break;
        };
        let path = field::index(&field::child(path, "resources"), i);
        let name = text(&quota["name"]);
        if name != text(covered_name) {
            errors.push(FieldError::invalid(
                field::child(&path, "name"),
                name,
                "must match the name in coveredResources",
            ));
        }
        let nominal = quantity(&quota["nominalQuota"]);
        errors.extend(not_negative(nominal, &field::child(&path, "nominalQuota")));
        if let Some(limit) = quantity(&quota["borrowingLimit"]) {
            let path = field::child(&path, "borrowingLimit");
            errors.extend(limit_needs_parent(limit, rules, &path));
            errors.extend(not_negative(Some(limit), &path));
        }
        if let Some(limit) = quantity(&quota["lendingLimit"]) {
            let path = field::child(&path, "lendingLimit");
            errors.extend(not_negative(Some(limit), &path));
            errors.extend(limit_needs_parent(limit, rules, &path));
            if rules.lending_within_nominal
                && nominal.is_some_and(|nominal| limit.nanos() > nominal.nanos())
            {
                errors.push(FieldError::invalid(
                    path,
                    limit.to_string(),
                    "must be less than or equal to the nominalQuota",
                ));
            }
        }
    }
    errors
}

fn not_negative(value: Option<Quantity>, path: &str) -> Option<FieldError> {
    let value = value.filter(|q| q.nanos() < 0)?;
    Some(FieldError::invalid(path, value.to_string(), NEGATIVE))
}

fn limit_needs_parent(limit: Quantity, rules: &QuotaRules, path: &str) -> Option<FieldError> {
    (!rules.has_parent).then(|| {
        FieldError::invalid(
            path,
            limit.to_string(),
            format!("must be nil when {} is empty", rules.parent),
        )
    })
}

/// A fair sharing weight: not negative, and not so small it would round
/// to zero.
fn fair_sharing(fair_sharing: &Value, path: &str) -> Vec<FieldError> {
    let Some(weight) = quantity(&fair_sharing["weight"]) else {
        return Vec::new();
    };
    let mut errors: Vec<FieldError> = not_negative(Some(weight), path).into_iter().collect();
    // 0 < weight ≤ 1n.
    if weight.nanos() > 0 && weight.nanos() <= 1 {
        errors.push(FieldError::invalid(
            path,
            weight.to_string(),
            "When not 0, weight must be > 10e-9",
        ));
    }
    errors
}

fn totals(groups: &[Value], path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let flavors: usize = groups.iter().map(|g| list(&g["flavors"]).len()).sum();
    if flavors > MAX_TOTAL {
        errors.push(FieldError::invalid(
            path,
            flavors,
            format!(
                "total number of flavors across all resourceGroups must be ≤ {MAX_TOTAL}, got {flavors}"
            ),
        ));
    }
    let covered: usize = groups
        .iter()
        .map(|g| list(&g["coveredResources"]).len())
        .sum();
    if covered > MAX_TOTAL {
        errors.push(FieldError::invalid(
            path,
            covered,
            format!(
                "total number of covered resources across all resourceGroups must be ≤ {MAX_TOTAL}, got {covered}"
            ),
        ));
    }
    for (i, group) in groups.iter().enumerate() {
        let combinations: usize = list(&group["flavors"])
            .iter()
            .map(|f| list(&f["resources"]).len())
            .sum();
        if combinations > MAX_FLAVOR_RESOURCES {
            errors.push(FieldError::invalid(
                field::index(path, i),
                combinations,
                format!(
                    "number of flavor-resource combinations in a resourceGroup must be ≤ {MAX_FLAVOR_RESOURCES}, got {combinations}"
                ),
            ));
        }
    }
    errors
}

/// The flavors of a ClusterQueue, in order.
fn flavor_names(cq: &Value) -> Vec<&str> {
    let mut names = Vec::new();
    for group in list(&cq["spec"]["resourceGroups"]) {
        for flavor in list(&group["flavors"]) {
            let name = text(&flavor["name"]);
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// Each admission check's `onFlavors` names flavors of the queue. On an
/// update that keeps the queue's flavors, a check whose `onFlavors` did
/// not change is not judged again (Kueue's behaviour while its
/// `RejectUpdatesToCQWithInvalidOnFlavors` gate is off, the default), so
/// queues stored before the check existed stay editable.
fn admission_check_flavors(cq: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let checks = list(&cq["spec"]["admissionChecksStrategy"]["admissionChecks"]);
    let valid = flavor_names(cq);
    let valid_set: BTreeSet<&str> = valid.iter().copied().collect();
    let unchanged = |name: &str, on: &[Value]| {
        let Some(old) = old else { return false };
        let old_valid: BTreeSet<&str> = flavor_names(old).into_iter().collect();
        if old_valid != valid_set {
            return false;
        }
        list(&old["spec"]["admissionChecksStrategy"]["admissionChecks"])
            .iter()
            .find(|c| text(&c["name"]) == name)
            .is_some_and(|c| {
                let before: BTreeSet<&str> = list(&c["onFlavors"]).iter().map(text).collect();
                let after: BTreeSet<&str> = on.iter().map(text).collect();
                before == after
            })
    };
    let mut errors = Vec::new();
    for (i, check) in checks.iter().enumerate() {
        let on = list(&check["onFlavors"]);
        if unchanged(text(&check["name"]), on) {
            continue;
        }
        let path = field::child(
            &field::index("spec.admissionChecksStrategy.admissionChecks", i),
            "onFlavors",
        );
        for (j, flavor) in on.iter().enumerate() {
            let flavor = text(flavor);
            if !valid_set.contains(flavor) {
                errors.push(FieldError::not_supported(
                    field::index(&path, j),
                    flavor,
                    &valid,
                ));
            }
        }
    }
    errors
}

/// apimachinery's `ValidateLabelName`.
fn label_name(name: &str, path: &str) -> Vec<FieldError> {
    qualified_name_errors(name)
        .into_iter()
        .map(|problem| FieldError::invalid(path, name, problem))
        .collect()
}

/// apimachinery's `ValidateLabels`: keys and values, reported on the map.
fn labels(labels: &Value, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (key, value) in labels.as_object().into_iter().flatten() {
        errors.extend(label_name(key, path));
        let value = text(value);
        for problem in label_value_errors(value) {
            errors.push(FieldError::invalid(path, value, problem));
        }
    }
    errors
}

/// apimachinery's `ValidateLabelSelector` (a `metav1.LabelSelector`).
fn label_selector(selector: &Value, path: &str) -> Vec<FieldError> {
    let mut errors = labels(&selector["matchLabels"], &field::child(path, "matchLabels"));
    for (i, requirement) in list(&selector["matchExpressions"]).iter().enumerate() {
        let path = field::index(&field::child(path, "matchExpressions"), i);
        let values = list(&requirement["values"]);
        let operator = text(&requirement["operator"]);
        match operator {
            "In" | "NotIn" if values.is_empty() => errors.push(FieldError::required(
                field::child(&path, "values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => errors.push(FieldError::forbidden(
                field::child(&path, "values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errors.push(FieldError::invalid(
                field::child(&path, "operator"),
                other,
                "not a valid selector operator",
            )),
        }
        errors.extend(label_name(
            text(&requirement["key"]),
            &field::child(&path, "key"),
        ));
        for (j, value) in values.iter().enumerate() {
            let value = text(value);
            for problem in label_value_errors(value) {
                errors.push(FieldError::invalid(
                    field::index(&field::child(&path, "values"), j),
                    value,
                    problem,
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cq(spec: Value) -> Value {
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "cq"}, "spec": spec})
    }

    fn messages(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    /// The ClusterQueue of Kueue's `single-clusterqueue-setup.yaml`.
    fn single() -> Value {
        cq(json!({
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                {"name": "default-flavor", "resources": [
                    {"name": "cpu", "nominalQuota": 9}, {"name": "memory", "nominalQuota": "36Gi"}
                ]}
            ]}],
        }))
    }

    #[test]
    fn a_valid_cluster_queue_passes() {
        assert_eq!(
            messages(&cluster_queue(&single(), None)),
            Vec::<String>::new()
        );
        let mut with_cohort = single();
        with_cohort["spec"]["cohortName"] = json!("research");
        with_cohort["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] =
            json!("2");
        with_cohort["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] =
            json!(0);
        assert!(cluster_queue(&with_cohort, None).is_empty());
    }

    #[test]
    fn limits_need_a_cohort_and_lending_stays_within_nominal() {
        let mut q = single();
        q["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] = json!("10");
        q["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["borrowingLimit"] =
            json!("1Gi");
        let path = "spec.resourceGroups[0].flavors[0].resources";
        assert_eq!(
            messages(&cluster_queue(&q, None)),
            [
                format!(
                    "{path}[0].lendingLimit: Invalid value: \"10\": must be nil when cohort is empty"
                ),
                format!(
                    "{path}[0].lendingLimit: Invalid value: \"10\": must be less than or equal to the nominalQuota"
                ),
                format!(
                    "{path}[1].borrowingLimit: Invalid value: \"1Gi\": must be nil when cohort is empty"
                ),
            ]
        );
        q["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = json!("-1");
        let errors = messages(&cluster_queue(&q, None));
        assert!(
            errors.contains(&format!(
                "{path}[0].nominalQuota: Invalid value: \"-1\": must be greater than or equal to 0"
            )),
            "{errors:?}"
        );
    }

    #[test]
    fn flavors_and_resources_are_unique_across_groups() {
        let q = cq(json!({"resourceGroups": [
            {"coveredResources": ["cpu"], "flavors": [{"name": "a", "resources": [{"name": "cpu", "nominalQuota": 1}]}]},
            {"coveredResources": ["cpu", "Bad Name"], "flavors": [{"name": "a", "resources": [
                {"name": "cpu", "nominalQuota": 1}, {"name": "gpu", "nominalQuota": 1}
            ]}]},
        ]}));
        let errors = messages(&cluster_queue(&q, None));
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert_eq!(
            errors[0],
            "spec.resourceGroups[1].coveredResources[0]: Duplicate value: \"cpu\""
        );
        assert!(
            errors[1].starts_with("spec.resourceGroups[1].coveredResources[1]: Invalid value: \"Bad Name\": name part must consist of alphanumeric characters"),
            "{errors:?}"
        );
        assert_eq!(
            errors[2],
            "spec.resourceGroups[1].flavors[0].resources[1].name: Invalid value: \"gpu\": must match the name in coveredResources"
        );
        assert_eq!(
            errors[3],
            "spec.resourceGroups[1].flavors[0].name: Duplicate value: \"a\""
        );
    }

    #[test]
    fn preemption_fungibility_selector_and_weight() {
        let mut q = single();
        q["spec"]["preemption"] = json!({"reclaimWithinCohort": "Never", "borrowWithinCohort": {"policy": "LowerPriority"}, "withinClusterQueue": "Never"});
        q["spec"]["flavorFungibility"] = json!({"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor", "preference": "BorrowingOverPreemption"});
        q["spec"]["namespaceSelector"] = json!({"matchExpressions": [
            {"key": "team", "operator": "In"},
            {"key": "env", "operator": "Exists", "values": ["x"]},
            {"key": "tier", "operator": "Near", "values": ["a b"]},
        ]});
        q["spec"]["fairSharing"] = json!({"weight": "-1"});
        let errors = messages(&cluster_queue(&q, None));
        let expected = [
            "spec.namespaceSelector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
            "spec.namespaceSelector.matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            "spec.namespaceSelector.matchExpressions[2].operator: Invalid value: \"Near\": not a valid selector operator",
        ];
        for e in expected {
            assert!(errors.iter().any(|m| m == e), "{e} missing from {errors:?}");
        }
        assert!(errors.iter().any(|m| m.starts_with(
            "spec.namespaceSelector.matchExpressions[2].values[0]: Invalid value: \"a b\": a valid label must be"
        )));
        assert!(
            errors
                .iter()
                .any(|m| m.starts_with("spec.preemption: Invalid value: {")
                    && m.ends_with(
                        "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never"
                    ))
        );
        assert!(errors.contains(&"spec.flavorFungibility.preference: Invalid value: \"BorrowingOverPreemption\": preference \"BorrowingOverPreemption\" requires both whenCanBorrow and whenCanPreempt to be TryNextFlavor".to_string()));
        assert!(
            errors.contains(
                &"spec.fairSharing: Invalid value: \"-1\": must be greater than or equal to 0"
                    .to_string()
            )
        );
        q["spec"]["fairSharing"] = json!({"weight": "1n"});
        assert!(
            messages(&cluster_queue(&q, None)).contains(
                &"spec.fairSharing: Invalid value: \"1n\": When not 0, weight must be > 10e-9"
                    .to_string()
            )
        );
    }

    #[test]
    fn admission_checks_name_flavors_of_the_queue() {
        let mut q = single();
        q["spec"]["admissionChecksStrategy"] =
            json!({"admissionChecks": [{"name": "prov", "onFlavors": ["default-flavor", "gpu"]}]});
        assert_eq!(
            messages(&cluster_queue(&q, None)),
            [
                "spec.admissionChecksStrategy.admissionChecks[0].onFlavors[1]: Unsupported value: \"gpu\": supported values: \"default-flavor\""
            ]
        );
        // An update that keeps flavors and that check's onFlavors is let through.
        let mut relabelled = q.clone();
        relabelled["spec"]["queueingStrategy"] = json!("StrictFIFO");
        assert!(cluster_queue(&relabelled, Some(&q)).is_empty());
        // The policy that cannot change.
        let mut changed = q.clone();
        changed["spec"]["admissionChecksStrategy"]["admissionChecks"][0]["onFlavors"] =
            json!(["default-flavor"]);
        changed["spec"]["concurrentAdmissionPolicy"] =
            json!({"migration": {"mode": "TryPreferredFlavors"}});
        assert_eq!(
            messages(&cluster_queue(&changed, Some(&q))),
            [
                "spec.concurrentAdmissionPolicy: Invalid value: {\"migration\":{\"mode\":\"TryPreferredFlavors\"}}: field is immutable"
            ]
        );
    }

    #[test]
    fn too_many_flavors() {
        let flavors: Vec<Value> = (0..257)
            .map(|i| json!({"name": format!("f{i}"), "resources": [{"name": "cpu", "nominalQuota": 1}]}))
            .collect();
        let q = cq(json!({"resourceGroups": [{"coveredResources": ["cpu"], "flavors": flavors}]}));
        assert_eq!(
            messages(&cluster_queue(&q, None)),
            [
                "spec.resourceGroups: Invalid value: 257: total number of flavors across all resourceGroups must be ≤ 256, got 257"
            ]
        );
    }

    #[test]
    fn cohort_limits_need_a_parent() {
        let c = json!({"spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "a", "resources": [{"name": "cpu", "nominalQuota": 1, "lendingLimit": 5}]}
        ]}]}});
        assert_eq!(
            messages(&cohort(&c)),
            [
                "spec.resourceGroups[0].flavors[0].resources[0].lendingLimit: Invalid value: \"5\": must be nil when parent is empty"
            ]
        );
        let mut child = c.clone();
        child["spec"]["parentName"] = json!("root");
        // A cohort may lend more than it holds itself.
        assert!(cohort(&child).is_empty());
    }

    #[test]
    fn resource_flavor_labels_taints_and_tolerations() {
        let ok = json!({"spec": {"nodeLabels": {"instance-type": "spot"}, "nodeTaints": [
            {"key": "spot", "value": "true", "effect": "NoSchedule"},
            {"key": "spot", "value": "true", "effect": "NoExecute"},
        ], "tolerations": [{"key": "spot-taint", "operator": "Exists", "effect": "NoSchedule"}]}});
        assert!(resource_flavor(&ok).is_empty());
        let bad = json!({"spec": {"nodeLabels": {"bad key": "ok", "k": "bad value"}, "nodeTaints": [
            {"key": "spot", "value": "true", "effect": "NoSchedule"},
            {"key": "spot", "value": "false", "effect": "NoSchedule"},
        ], "tolerations": [{"key": "-x", "operator": "Exists"}]}});
        let errors = messages(&resource_flavor(&bad));
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(errors[0].starts_with("spec.nodeLabels: Invalid value: \"bad key\": name part"));
        assert!(
            errors[1].starts_with(
                "spec.nodeLabels: Invalid value: \"bad value\": a valid label must be"
            )
        );
        assert!(errors[2].starts_with("spec.nodeTaints[1]: Duplicate value: {"));
        assert!(errors[2].ends_with(": taints must be unique by key and effect pair"));
        assert!(errors[3].starts_with("spec.tolerations[0].key: Invalid value: \"-x\""));
    }

    #[test]
    fn cohort_cycles_are_found() {
        let parents = |c: &str| match c {
            "b" => Some("c".to_string()),
            "c" => Some("a".to_string()),
            "x" => Some("y".to_string()),
            "y" => Some("x".to_string()),
            _ => None,
        };
        let e = cohort_cycle("a", "b", parents).unwrap();
        assert_eq!(
            e.to_string(),
            "spec.parentName: Invalid value: \"b\": cohort has a cycle: a -> b -> c -> a; a Cohort may not be its own ancestor"
        );
        assert!(cohort_cycle("a", "a", parents).is_some());
        assert!(cohort_cycle("a", "", parents).is_none());
        assert!(cohort_cycle("d", "b", parents).is_none());
        // An existing cycle elsewhere does not loop forever.
        assert!(cohort_cycle("d", "x", parents).is_none());
    }
}
