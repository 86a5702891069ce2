//! What both gang schedulers' PodGroups hold: every pod of the TrainJob, and
//! the resources they request together.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container as K8sContainer, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use trainhub_plugin_sdk::api::jobset::JobSetSpec;
use trainhub_plugin_sdk::prelude::*;

use crate::common::amount;
use crate::quantity::Quantity as Amount;

/// Requests by resource name.
type Resources = BTreeMap<String, Amount>;

/// A sidecar: an init container that keeps running beside the containers.
const RESTART_ALWAYS: &str = "Always";

/// `minMember`: the pods of every pod set (initializers included).
pub(crate) fn min_member(info: &RuntimeInfo) -> Result<i32, Failure> {
    i32::try_from(info.total_pods()).map_err(|_| {
        Failure::new(format!(
            "{} pods is too many for a PodGroup",
            info.total_pods()
        ))
    })
}

/// `minResources`: per resource, the sum over pod sets of one pod's requests
/// ([`pod_requests`]) times the set's count, as upstream's coscheduling and
/// Volcano plugins sum each pod set's `SinglePodRequests`.
pub(crate) fn min_resources(info: &RuntimeInfo) -> Result<BTreeMap<String, K8sQuantity>, Failure> {
    let template: JobSetSpec = info.template_as()?;
    let mut total = Resources::new();
    for set in &info.pod_sets {
        let pod = template
            .replicated_job(&set.name)
            .and_then(|j| j.template.spec.as_ref())
            .and_then(|s| s.template.spec.as_ref());
        let Some(pod) = pod else { continue };
        for (name, request) in pod_requests(set, pod)? {
            let scaled = request
                .checked_mul(i128::from(set.count))
                .ok_or_else(overflow)?;
            add(&mut total, &name, scaled)?;
        }
    }
    Ok(total
        .into_iter()
        .map(|(name, q)| (name, K8sQuantity(q.to_string())))
        .collect())
}

/// One pod's requests as Kubernetes' `resourcehelpers.PodRequests` computes
/// them (k8s.io/component-helpers/resource, the function upstream's runtime
/// info uses): the containers and sidecars together, or, when more, the
/// largest of each ordinary init container plus the sidecars declared before
/// it; pod-level requests (cpu, memory, hugepages) replace the sum; then the
/// pod's `overhead` is added.
///
/// The pod's shape (which containers, which are sidecars, overhead) is the
/// template's; a container's requests are its pod-set record's, which carry
/// the TrainJob's `resourcesPerNode`. Containers a plugin added are not
/// counted, as upstream computes the requests before any plugin runs.
fn pod_requests(set: &PodSet, pod: &PodSpec) -> Result<Resources, Failure> {
    let mut requests = Resources::new();
    for container in &pod.containers {
        add_all(
            &mut requests,
            &container_requests(&set.containers, container)?,
        )?;
    }
    let mut sidecars = Resources::new();
    let mut init_peak = Resources::new();
    for container in pod.init_containers.iter().flatten() {
        let own = container_requests(&set.init_containers, container)?;
        let in_use = if container.restart_policy.as_deref() == Some(RESTART_ALWAYS) {
            add_all(&mut requests, &own)?;
            add_all(&mut sidecars, &own)?;
            sidecars.clone()
        } else {
            let mut in_use = own;
            add_all(&mut in_use, &sidecars)?;
            in_use
        };
        max_all(&mut init_peak, &in_use);
    }
    max_all(&mut requests, &init_peak);
    let pod_level = pod.resources.as_ref().and_then(|r| r.requests.as_ref());
    for (name, q) in pod_level.into_iter().flatten() {
        if is_pod_level_resource(name) {
            requests.insert(name.clone(), parse(name, q)?);
        }
    }
    add_all(&mut requests, &quantities(pod.overhead.as_ref())?)?;
    Ok(requests)
}

/// The requests of `container`: its record's, else the template's.
fn container_requests(
    records: &[Container],
    container: &K8sContainer,
) -> Result<Resources, Failure> {
    match records.iter().find(|r| r.name == container.name) {
        Some(record) => record
            .requests
            .iter()
            .map(|q| Ok((q.name.clone(), amount(q)?)))
            .collect(),
        None => quantities(
            container
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref()),
        ),
    }
}

/// Resources a pod may request at pod level.
fn is_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

fn quantities(map: Option<&BTreeMap<String, K8sQuantity>>) -> Result<Resources, Failure> {
    map.into_iter()
        .flatten()
        .map(|(name, q)| Ok((name.clone(), parse(name, q)?)))
        .collect()
}

fn parse(name: &str, q: &K8sQuantity) -> Result<Amount, Failure> {
    Amount::parse(&q.0).map_err(|e| Failure::new(format!("resource {name}: {e}")))
}

fn add(total: &mut Resources, name: &str, value: Amount) -> Result<(), Failure> {
    let sum = match total.get(name) {
        Some(current) => current.checked_add(value).ok_or_else(overflow)?,
        None => value,
    };
    total.insert(name.to_string(), sum);
    Ok(())
}

fn add_all(total: &mut Resources, more: &Resources) -> Result<(), Failure> {
    more.iter().try_for_each(|(name, q)| add(total, name, *q))
}

/// Each resource of `other` raised to at least its value there.
fn max_all(total: &mut Resources, other: &Resources) {
    for (name, q) in other {
        if total
            .get(name)
            .is_none_or(|current| q.nanos() > current.nanos())
        {
            total.insert(name.clone(), *q);
        }
    }
}

fn overflow() -> Failure {
    Failure::new("the PodGroup's minResources overflow")
}
