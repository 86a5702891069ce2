//! `scheduling.x-k8s.io/v1alpha1` [`PodGroup`] of the scheduler-plugins coscheduling plugin.
//! Pods join a group with the `scheduling.x-k8s.io/pod-group` label.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of [`PodGroup`].
pub const GROUP: &str = <PodGroup as k8s_openapi::Resource>::GROUP;

/// API version of [`PodGroup`].
pub const VERSION: &str = <PodGroup as k8s_openapi::Resource>::VERSION;

resource! {
    /// A gang of Pods the coscheduling plugin schedules all at once or not at all.
    pub struct PodGroup {
        group: "scheduling.x-k8s.io",
        version: "v1alpha1",
        kind: "PodGroup",
        plural: "podgroups",
        scope: k8s_openapi::NamespaceResourceScope,
        spec: PodGroupSpec,
        status: PodGroupStatus,
    }
}

/// The desired state of a coscheduling [`PodGroup`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// Fewest Pods that must be schedulable together before any of them is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_member: Option<i32>,

    /// Resources the whole gang needs; the group waits until they are free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resources: Option<BTreeMap<String, Quantity>>,

    /// Seconds the plugin waits for the gang to assemble before rejecting the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_timeout_seconds: Option<i32>,
}

/// The observed state of a coscheduling [`PodGroup`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// Phase: `Pending`, `PreScheduling`, `Scheduling`, `Scheduled`, `Running`, `Finished`,
    /// `Failed` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,

    /// UID of the workload occupying the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupied_by: Option<String>,

    /// Pods running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i32>,

    /// Pods that succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<i32>,

    /// Pods that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<i32>,

    /// When the plugin started scheduling the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_start_time: Option<Time>,
}
