//! What both gang schedulers' PodGroups hold: every pod of the TrainJob, and
//! the resources they request together.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use trainhub_plugin_sdk::prelude::*;

use crate::common::amount;
use crate::quantity::Quantity as Amount;

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
/// times the set's count. One pod requests the sum of its containers'
/// requests, or the largest init container's when that is more.
pub(crate) fn min_resources(info: &RuntimeInfo) -> Result<BTreeMap<String, K8sQuantity>, Failure> {
    let overflow = || Failure::new("the PodGroup's minResources overflow");
    let mut total: BTreeMap<String, Amount> = BTreeMap::new();
    for set in &info.pod_sets {
        let mut pod: BTreeMap<String, Amount> = BTreeMap::new();
        for container in &set.containers {
            for q in &container.requests {
                let sum = pod
                    .get(&q.name)
                    .copied()
                    .unwrap_or_else(Amount::zero)
                    .checked_add(amount(q)?)
                    .ok_or_else(overflow)?;
                pod.insert(q.name.clone(), sum);
            }
        }
        for container in &set.init_containers {
            for q in &container.requests {
                let request = amount(q)?;
                match pod.get(&q.name) {
                    Some(current) if current.nanos() >= request.nanos() => {}
                    _ => {
                        pod.insert(q.name.clone(), request);
                    }
                }
            }
        }
        for (name, request) in pod {
            let scaled = request
                .checked_mul(i128::from(set.count))
                .ok_or_else(overflow)?;
            let sum = total
                .get(&name)
                .copied()
                .unwrap_or_else(Amount::zero)
                .checked_add(scaled)
                .ok_or_else(overflow)?;
            total.insert(name, sum);
        }
    }
    Ok(total
        .into_iter()
        .map(|(name, q)| (name, K8sQuantity(q.to_string())))
        .collect())
}
