//! Schema markers of embedded Kubernetes types that k8s-openapi's JSON schemas leave out.
//!
//! The Kubernetes Go types carry markers (`+listType`, `+listMapKey`, `+structType`, `+default`,
//! optional `name` references, condition bounds) that controller-gen writes into a CRD and the
//! API server acts on: list types decide how server-side apply merges lists, map types make
//! selectors atomic, defaults fill fields, and references may omit `name`. k8s-openapi generates
//! its schemas from the OpenAPI documents without them, so they are restored here, per type and
//! property, as the Kubernetes API defines them.

use serde_json::{Map, Value as Json};

/// One marker. `property` empty means the marker is on the type itself.
#[derive(Clone, Copy, Debug)]
pub(super) enum Marker {
    /// `x-kubernetes-list-type: atomic`: the list is replaced as a whole.
    ListAtomic,
    /// `x-kubernetes-list-type: set`: the list merges as a set of scalars.
    ListSet,
    /// `x-kubernetes-list-type: map` keyed by these fields.
    ListMap(&'static [&'static str]),
    /// `x-kubernetes-map-type: atomic`: the object is replaced as a whole.
    MapAtomic,
    /// `x-kubernetes-map-type: granular`: the map merges key by key.
    MapGranular,
    /// The required fields, replacing the schema's list (empty: none required).
    Required(&'static [&'static str]),
    /// The value the API server fills in when the field is absent.
    Default(Value),
    /// `minLength`.
    MinLength(i64),
    /// `maxLength`.
    MaxLength(i64),
    /// `minimum`.
    Minimum(i64),
    /// `pattern`.
    Pattern(&'static str),
    /// `enum` of strings.
    Enum(&'static [&'static str]),
}

/// A default value.
#[derive(Clone, Copy, Debug)]
pub(super) enum Value {
    Str(&'static str),
    Bool(bool),
}

use Marker::*;

/// `(type, property, marker)`; types abbreviated `core/` (`io.k8s.api.core.v1.`), `batch/`
/// (`io.k8s.api.batch.v1.`) and `meta/` (`io.k8s.apimachinery.pkg.apis.meta.v1.`).
const MARKERS: &[(&str, &str, Marker)] = &[
    ("batch/PodFailurePolicy", "rules", ListAtomic),
    (
        "batch/PodFailurePolicyOnExitCodesRequirement",
        "values",
        ListSet,
    ),
    ("batch/PodFailurePolicyRule", "onPodConditions", ListAtomic),
    ("batch/SuccessPolicy", "rules", ListAtomic),
    (
        "core/AzureDiskVolumeSource",
        "fsType",
        Default(Value::Str("ext4")),
    ),
    (
        "core/AzureDiskVolumeSource",
        "readOnly",
        Default(Value::Bool(false)),
    ),
    ("core/Capabilities", "add", ListAtomic),
    ("core/Capabilities", "drop", ListAtomic),
    ("core/CephFSVolumeSource", "monitors", ListAtomic),
    ("core/ConfigMapEnvSource", "", MapAtomic),
    ("core/ConfigMapEnvSource", "", Required(&[])),
    ("core/ConfigMapEnvSource", "name", Default(Value::Str(""))),
    ("core/ConfigMapKeySelector", "", MapAtomic),
    ("core/ConfigMapKeySelector", "", Required(&["key"])),
    ("core/ConfigMapKeySelector", "name", Default(Value::Str(""))),
    ("core/ConfigMapProjection", "", MapAtomic),
    ("core/ConfigMapProjection", "", Required(&[])),
    ("core/ConfigMapProjection", "items", ListAtomic),
    ("core/ConfigMapProjection", "name", Default(Value::Str(""))),
    ("core/ConfigMapVolumeSource", "", MapAtomic),
    ("core/ConfigMapVolumeSource", "", Required(&[])),
    ("core/ConfigMapVolumeSource", "items", ListAtomic),
    (
        "core/ConfigMapVolumeSource",
        "name",
        Default(Value::Str("")),
    ),
    ("core/Container", "args", ListAtomic),
    ("core/Container", "command", ListAtomic),
    ("core/Container", "env", ListMap(&["name"])),
    ("core/Container", "envFrom", ListAtomic),
    (
        "core/Container",
        "ports",
        ListMap(&["containerPort", "protocol"]),
    ),
    ("core/Container", "resizePolicy", ListAtomic),
    ("core/Container", "restartPolicyRules", ListAtomic),
    ("core/Container", "volumeDevices", ListMap(&["devicePath"])),
    ("core/Container", "volumeMounts", ListMap(&["mountPath"])),
    ("core/ContainerPort", "protocol", Default(Value::Str("TCP"))),
    ("core/ContainerRestartRuleOnExitCodes", "values", ListSet),
    ("core/DownwardAPIProjection", "items", ListAtomic),
    ("core/DownwardAPIVolumeSource", "items", ListAtomic),
    ("core/EphemeralContainer", "args", ListAtomic),
    ("core/EphemeralContainer", "command", ListAtomic),
    ("core/EphemeralContainer", "env", ListMap(&["name"])),
    ("core/EphemeralContainer", "envFrom", ListAtomic),
    (
        "core/EphemeralContainer",
        "ports",
        ListMap(&["containerPort", "protocol"]),
    ),
    ("core/EphemeralContainer", "resizePolicy", ListAtomic),
    ("core/EphemeralContainer", "restartPolicyRules", ListAtomic),
    (
        "core/EphemeralContainer",
        "volumeDevices",
        ListMap(&["devicePath"]),
    ),
    (
        "core/EphemeralContainer",
        "volumeMounts",
        ListMap(&["mountPath"]),
    ),
    ("core/ExecAction", "command", ListAtomic),
    ("core/FCVolumeSource", "targetWWNs", ListAtomic),
    ("core/FCVolumeSource", "wwids", ListAtomic),
    ("core/FileKeySelector", "", MapAtomic),
    (
        "core/FileKeySelector",
        "optional",
        Default(Value::Bool(false)),
    ),
    ("core/GRPCAction", "service", Default(Value::Str(""))),
    ("core/HTTPGetAction", "httpHeaders", ListAtomic),
    ("core/HostAlias", "hostnames", ListAtomic),
    (
        "core/ISCSIVolumeSource",
        "iscsiInterface",
        Default(Value::Str("default")),
    ),
    ("core/ISCSIVolumeSource", "portals", ListAtomic),
    ("core/LocalObjectReference", "", MapAtomic),
    ("core/LocalObjectReference", "", Required(&[])),
    ("core/LocalObjectReference", "name", Default(Value::Str(""))),
    (
        "core/NodeAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
        ListAtomic,
    ),
    ("core/NodeSelector", "", MapAtomic),
    ("core/NodeSelector", "nodeSelectorTerms", ListAtomic),
    ("core/NodeSelectorRequirement", "values", ListAtomic),
    ("core/NodeSelectorTerm", "", MapAtomic),
    ("core/NodeSelectorTerm", "matchExpressions", ListAtomic),
    ("core/NodeSelectorTerm", "matchFields", ListAtomic),
    ("core/ObjectFieldSelector", "", MapAtomic),
    ("core/PersistentVolumeClaimSpec", "accessModes", ListAtomic),
    (
        "core/PersistentVolumeClaimStatus",
        "accessModes",
        ListAtomic,
    ),
    (
        "core/PersistentVolumeClaimStatus",
        "allocatedResourceStatuses",
        MapGranular,
    ),
    (
        "core/PersistentVolumeClaimStatus",
        "conditions",
        ListMap(&["type"]),
    ),
    (
        "core/PodAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
        ListAtomic,
    ),
    (
        "core/PodAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        ListAtomic,
    ),
    ("core/PodAffinityTerm", "matchLabelKeys", ListAtomic),
    ("core/PodAffinityTerm", "mismatchLabelKeys", ListAtomic),
    ("core/PodAffinityTerm", "namespaces", ListAtomic),
    (
        "core/PodAntiAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
        ListAtomic,
    ),
    (
        "core/PodAntiAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        ListAtomic,
    ),
    ("core/PodDNSConfig", "nameservers", ListAtomic),
    ("core/PodDNSConfig", "options", ListAtomic),
    ("core/PodDNSConfig", "searches", ListAtomic),
    ("core/PodSecurityContext", "supplementalGroups", ListAtomic),
    ("core/PodSecurityContext", "sysctls", ListAtomic),
    ("core/PodSpec", "containers", ListMap(&["name"])),
    ("core/PodSpec", "ephemeralContainers", ListMap(&["name"])),
    ("core/PodSpec", "hostAliases", ListMap(&["ip"])),
    ("core/PodSpec", "imagePullSecrets", ListMap(&["name"])),
    ("core/PodSpec", "initContainers", ListMap(&["name"])),
    ("core/PodSpec", "nodeSelector", MapAtomic),
    ("core/PodSpec", "readinessGates", ListAtomic),
    ("core/PodSpec", "resourceClaims", ListMap(&["name"])),
    ("core/PodSpec", "schedulingGates", ListMap(&["name"])),
    ("core/PodSpec", "tolerations", ListAtomic),
    (
        "core/PodSpec",
        "topologySpreadConstraints",
        ListMap(&["topologyKey", "whenUnsatisfiable"]),
    ),
    ("core/PodSpec", "volumes", ListMap(&["name"])),
    ("core/ProjectedVolumeSource", "sources", ListAtomic),
    (
        "core/RBDVolumeSource",
        "keyring",
        Default(Value::Str("/etc/ceph/keyring")),
    ),
    ("core/RBDVolumeSource", "monitors", ListAtomic),
    ("core/RBDVolumeSource", "pool", Default(Value::Str("rbd"))),
    ("core/RBDVolumeSource", "user", Default(Value::Str("admin"))),
    ("core/ResourceFieldSelector", "", MapAtomic),
    ("core/ResourceRequirements", "claims", ListMap(&["name"])),
    (
        "core/ScaleIOVolumeSource",
        "fsType",
        Default(Value::Str("xfs")),
    ),
    (
        "core/ScaleIOVolumeSource",
        "storageMode",
        Default(Value::Str("ThinProvisioned")),
    ),
    ("core/SecretEnvSource", "", MapAtomic),
    ("core/SecretEnvSource", "", Required(&[])),
    ("core/SecretEnvSource", "name", Default(Value::Str(""))),
    ("core/SecretKeySelector", "", MapAtomic),
    ("core/SecretKeySelector", "", Required(&["key"])),
    ("core/SecretKeySelector", "name", Default(Value::Str(""))),
    ("core/SecretProjection", "", MapAtomic),
    ("core/SecretProjection", "", Required(&[])),
    ("core/SecretProjection", "items", ListAtomic),
    ("core/SecretProjection", "name", Default(Value::Str(""))),
    ("core/SecretVolumeSource", "items", ListAtomic),
    (
        "core/TopologySpreadConstraint",
        "matchLabelKeys",
        ListAtomic,
    ),
    ("core/TypedLocalObjectReference", "", MapAtomic),
    ("meta/Condition", "message", MaxLength(32768)),
    ("meta/Condition", "observedGeneration", Minimum(0)),
    ("meta/Condition", "reason", MinLength(1)),
    ("meta/Condition", "reason", MaxLength(1024)),
    (
        "meta/Condition",
        "reason",
        Pattern(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ),
    (
        "meta/Condition",
        "status",
        Enum(&["True", "False", "Unknown"]),
    ),
    ("meta/Condition", "type", MaxLength(316)),
    (
        "meta/Condition",
        "type",
        Pattern(
            r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        ),
    ),
    ("meta/LabelSelector", "", MapAtomic),
    ("meta/LabelSelector", "matchExpressions", ListAtomic),
    ("meta/LabelSelectorRequirement", "values", ListAtomic),
];

const PREFIXES: [(&str, &str); 3] = [
    ("core/", "io.k8s.api.core.v1."),
    ("batch/", "io.k8s.api.batch.v1."),
    ("meta/", "io.k8s.apimachinery.pkg.apis.meta.v1."),
];

fn expand(short: &str) -> Option<String> {
    PREFIXES.iter().find_map(|(prefix, full)| {
        short
            .strip_prefix(prefix)
            .map(|name| format!("{full}{name}"))
    })
}

/// Adds the markers of `definition` to its flattened schema `node`.
pub(super) fn apply(definition: &str, node: &mut Map<String, Json>) {
    for (short, property, marker) in MARKERS {
        if expand(short).as_deref() != Some(definition) {
            continue;
        }
        if property.is_empty() {
            mark(node, *marker);
        } else if let Some(Json::Object(target)) = node
            .get_mut("properties")
            .and_then(|properties| properties.get_mut(*property))
        {
            mark(target, *marker);
        }
    }
}

fn mark(node: &mut Map<String, Json>, marker: Marker) {
    let strings = |values: &[&str]| Json::from(values.to_vec());
    let (keyword, value) = match marker {
        ListAtomic => ("x-kubernetes-list-type", Json::from("atomic")),
        ListSet => ("x-kubernetes-list-type", Json::from("set")),
        ListMap(keys) => {
            node.insert("x-kubernetes-list-map-keys".into(), strings(keys));
            ("x-kubernetes-list-type", Json::from("map"))
        }
        MapAtomic => ("x-kubernetes-map-type", Json::from("atomic")),
        MapGranular => ("x-kubernetes-map-type", Json::from("granular")),
        Required([]) => {
            node.remove("required");
            return;
        }
        Required(fields) => ("required", strings(fields)),
        Default(Value::Str(value)) => ("default", Json::from(value)),
        Default(Value::Bool(value)) => ("default", Json::from(value)),
        MinLength(value) => ("minLength", Json::from(value)),
        MaxLength(value) => ("maxLength", Json::from(value)),
        Minimum(value) => ("minimum", Json::from(value)),
        Pattern(value) => ("pattern", Json::from(value)),
        Enum(values) => ("enum", strings(values)),
    };
    node.insert(keyword.into(), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_marked_type_name_expands() {
        for (short, _, _) in MARKERS {
            assert!(expand(short).is_some(), "{short}");
        }
    }

    #[test]
    fn marks_the_type_and_its_properties() {
        let mut node = serde_json::json!({
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
        });
        let Json::Object(node_map) = &mut node else {
            unreachable!()
        };
        apply("io.k8s.api.core.v1.LocalObjectReference", node_map);
        assert_eq!(
            node,
            serde_json::json!({
                "type": "object",
                "x-kubernetes-map-type": "atomic",
                "properties": {"name": {"type": "string", "default": ""}},
            })
        );
    }
}
