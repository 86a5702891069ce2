//! `scheduling.volcano.sh/v1beta1` [`PodGroup`] of the Volcano scheduler. Pods join a group with
//! the `scheduling.k8s.io/group-name` annotation.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resource::plain_integer;

/// API group of [`PodGroup`].
pub const GROUP: &str = <PodGroup as k8s_openapi::Resource>::GROUP;

/// API version of [`PodGroup`].
pub const VERSION: &str = <PodGroup as k8s_openapi::Resource>::VERSION;

resource! {
    /// A gang of Pods Volcano schedules all at once or not at all, in a queue.
    pub struct PodGroup {
        group: "scheduling.volcano.sh",
        version: "v1beta1",
        kind: "PodGroup",
        plural: "podgroups",
        scope: k8s_openapi::NamespaceResourceScope,
        spec: PodGroupSpec,
        status: PodGroupStatus,
    }
}

/// The desired state of a Volcano [`PodGroup`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// Fewest Pods that must be schedulable together before any of them is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_member: Option<i32>,

    /// Fewest Pods per task (keyed by task name) that must be schedulable together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_task_member: Option<BTreeMap<String, i32>>,

    /// Volcano queue the group is scheduled from; the `default` queue when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,

    /// PriorityClass of the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,

    /// Resources the whole gang needs; the group waits until they are free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resources: Option<BTreeMap<String, Quantity>>,

    /// Network topology constraint on where the gang may be placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_topology: Option<NetworkTopologySpec>,
}

/// A network topology constraint (Volcano HyperNode tiers).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkTopologySpec {
    /// Whether the constraint is strict. Defaults to `hard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "hard"))]
    pub mode: Option<NetworkTopologyMode>,

    /// Highest network tier the gang may span. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "plain_integer", extend("default" = 1))]
    pub highest_tier_allowed: Option<i64>,
}

impl NetworkTopologySpec {
    /// Fills `mode` (`hard`) and `highestTierAllowed` (1) when unset. Idempotent.
    pub fn default_fields(&mut self) {
        self.mode.get_or_insert(NetworkTopologyMode::Hard);
        self.highest_tier_allowed.get_or_insert(1);
    }
}

/// Strictness of a [`NetworkTopologySpec`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkTopologyMode {
    /// The gang must stay within the allowed tiers.
    #[default]
    Hard,
    /// The scheduler may cross tiers when it must.
    Soft,
}

/// The observed state of a Volcano [`PodGroup`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// Phase: `Pending`, `Running`, `Unknown`, `Inqueue` or `Completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,

    /// Conditions, e.g. `Scheduled` or `Unschedulable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<PodGroupCondition>>,

    /// Pods running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i32>,

    /// Pods that succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<i32>,

    /// Pods that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<i32>,
}

/// A condition of a Volcano [`PodGroup`]; not a `metav1.Condition`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupCondition {
    /// Type of the condition, e.g. `Scheduled` or `Unschedulable`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,

    /// `True`, `False` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,

    /// Identifier of the transition.
    #[serde(
        rename = "transitionID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub transition_id: Option<String>,

    /// When the condition last changed status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,

    /// One-word CamelCase reason of the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,

    /// Human-readable details of the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_topology_defaults_and_spelling() {
        let mut topology = NetworkTopologySpec::default();
        topology.default_fields();
        assert_eq!(
            serde_json::to_value(&topology).unwrap(),
            serde_json::json!({"mode": "hard", "highestTierAllowed": 1})
        );
    }

    #[test]
    fn condition_uses_upstream_field_names() {
        let condition: PodGroupCondition = serde_json::from_value(serde_json::json!({
            "type": "Scheduled", "status": "True", "transitionID": "abc",
        }))
        .unwrap();
        assert_eq!(condition.transition_id.as_deref(), Some("abc"));
        assert_eq!(
            serde_json::to_value(&condition).unwrap(),
            serde_json::json!({"type": "Scheduled", "status": "True", "transitionID": "abc"})
        );
    }
}
