//! The machinery shared by every top-level kind: the `resource!` macro and schema helpers.

use schemars::{Schema, SchemaGenerator, json_schema};

/// Whether `value` equals its type's default; used to omit zero-valued struct fields the way
/// Go's `omitzero` does.
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The `x-kubernetes-validations` rule that makes a field immutable once set.
pub(crate) const IMMUTABLE: &str = "self == oldSelf";

/// Schema of a Go `int` field: an integer without a `format`, as controller-gen emits it.
pub(crate) fn plain_integer(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "integer" })
}

/// Declares a top-level Kubernetes kind: a struct with `metadata`, `spec` and optionally
/// `status`, serialized with `apiVersion` and `kind`, and implementing the k8s-openapi
/// `Resource`, `ListableResource` and `Metadata` traits and `JsonSchema`.
///
/// Deserialization accepts objects without `apiVersion` or `kind` (as embedded in patches) but
/// rejects objects whose `apiVersion` or `kind` name another type.
macro_rules! resource {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            group: $group:literal,
            version: $version:literal,
            kind: $kind:literal,
            plural: $plural:literal,
            scope: $scope:ty,
            spec: $spec:ty,
            $(status: $status:ty,)?
            $(validations: $validations:tt,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct $name {
            /// Standard object metadata.
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            /// The desired state.
            pub spec: $spec,
            $(
                /// The observed state; `None` until a controller reports it.
                pub status: Option<$status>,
            )?
        }

        impl k8s_openapi::Resource for $name {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::ListableResource for $name {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }

        impl k8s_openapi::Metadata for $name {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeStruct as _;
                let fields = 4 $( + usize::from(resource!(@some self.status, $status)))?;
                let mut out = serializer.serialize_struct($kind, fields)?;
                out.serialize_field(
                    "apiVersion",
                    <Self as k8s_openapi::Resource>::API_VERSION,
                )?;
                out.serialize_field("kind", <Self as k8s_openapi::Resource>::KIND)?;
                out.serialize_field("metadata", &self.metadata)?;
                out.serialize_field("spec", &self.spec)?;
                $(
                    match &self.status {
                        Some(status) => out.serialize_field::<$status>("status", status)?,
                        None => out.skip_field("status")?,
                    }
                )?
                out.end()
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                #[derive(serde::Deserialize)]
                #[serde(rename_all = "camelCase")]
                struct Wire {
                    api_version: Option<String>,
                    kind: Option<String>,
                    #[serde(default)]
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                    #[serde(default)]
                    spec: $spec,
                    $(
                        #[serde(default)]
                        status: Option<$status>,
                    )?
                }

                let wire = Wire::deserialize(deserializer)?;
                $crate::resource::check_type_meta::<Self, D::Error>(
                    wire.api_version.as_deref(),
                    wire.kind.as_deref(),
                )?;
                Ok(Self {
                    metadata: wire.metadata,
                    spec: wire.spec,
                    $(status: resource!(@take wire.status, $status),)?
                })
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let mut properties = serde_json::Map::new();
                properties.insert("apiVersion".into(), serde_json::json!({
                    "description": "The versioned schema of this object; the server rejects unknown values.",
                    "type": "string",
                }));
                properties.insert("kind".into(), serde_json::json!({
                    "description": "The REST resource this object represents, in CamelCase.",
                    "type": "string",
                }));
                properties.insert("metadata".into(), serde_json::json!({ "type": "object" }));
                properties.insert("spec".into(), generator.subschema_for::<$spec>().to_value());
                $(
                    properties.insert(
                        "status".into(),
                        generator.subschema_for::<$status>().to_value(),
                    );
                )?
                #[allow(unused_mut)]
                let mut schema = schemars::json_schema!({
                    "type": "object",
                    "properties": properties,
                });
                $(
                    schema.insert(
                        "x-kubernetes-validations".into(),
                        serde_json::json!($validations),
                    );
                )?
                schema
            }
        }
    };
    (@some $value:expr, $ty:ty) => {
        $value.is_some()
    };
    (@take $value:expr, $ty:ty) => {
        $value
    };
}

/// Rejects an `apiVersion` or `kind` that names a type other than `K`; absent values pass.
pub(crate) fn check_type_meta<K, E>(api_version: Option<&str>, kind: Option<&str>) -> Result<(), E>
where
    K: k8s_openapi::Resource,
    E: serde::de::Error,
{
    if let Some(api_version) = api_version
        && api_version != K::API_VERSION
    {
        return Err(E::custom(format_args!(
            "apiVersion {api_version:?} does not match {:?} expected for kind {}",
            K::API_VERSION,
            K::KIND
        )));
    }
    if let Some(kind) = kind
        && kind != K::KIND
    {
        return Err(E::custom(format_args!(
            "kind {kind:?} does not match expected kind {:?}",
            K::KIND
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{ClusterResourceScope, ListableResource, NamespaceResourceScope, Resource};

    use crate::jobset::JobSet;
    use crate::podgroup::{coscheduling, volcano};
    use crate::trainer::{ClusterTrainingRuntime, TrainJob, TrainingRuntime};

    fn identity<K: ListableResource>() -> [&'static str; 5] {
        [
            K::API_VERSION,
            K::GROUP,
            K::KIND,
            K::URL_PATH_SEGMENT,
            K::LIST_KIND,
        ]
    }

    fn namespaced<K: Resource<Scope = NamespaceResourceScope>>() {}

    fn cluster_scoped<K: Resource<Scope = ClusterResourceScope>>() {}

    #[test]
    fn every_kind_has_its_upstream_identity_and_scope() {
        let trainer = "trainer.kubeflow.org";
        assert_eq!(
            identity::<TrainJob>(),
            [
                "trainer.kubeflow.org/v1alpha1",
                trainer,
                "TrainJob",
                "trainjobs",
                "TrainJobList"
            ]
        );
        assert_eq!(
            identity::<TrainingRuntime>(),
            [
                "trainer.kubeflow.org/v1alpha1",
                trainer,
                "TrainingRuntime",
                "trainingruntimes",
                "TrainingRuntimeList"
            ]
        );
        assert_eq!(
            identity::<ClusterTrainingRuntime>(),
            [
                "trainer.kubeflow.org/v1alpha1",
                trainer,
                "ClusterTrainingRuntime",
                "clustertrainingruntimes",
                "ClusterTrainingRuntimeList"
            ]
        );
        assert_eq!(
            identity::<JobSet>(),
            [
                "jobset.x-k8s.io/v1alpha2",
                "jobset.x-k8s.io",
                "JobSet",
                "jobsets",
                "JobSetList"
            ]
        );
        assert_eq!(
            identity::<coscheduling::PodGroup>(),
            [
                "scheduling.x-k8s.io/v1alpha1",
                "scheduling.x-k8s.io",
                "PodGroup",
                "podgroups",
                "PodGroupList"
            ]
        );
        assert_eq!(
            identity::<volcano::PodGroup>(),
            [
                "scheduling.volcano.sh/v1beta1",
                "scheduling.volcano.sh",
                "PodGroup",
                "podgroups",
                "PodGroupList"
            ]
        );
        namespaced::<TrainJob>();
        namespaced::<TrainingRuntime>();
        cluster_scoped::<ClusterTrainingRuntime>();
        namespaced::<JobSet>();
        namespaced::<coscheduling::PodGroup>();
        namespaced::<volcano::PodGroup>();
    }

    #[test]
    fn metadata_accessors_reach_the_object_metadata() {
        use k8s_openapi::Metadata as _;
        let mut job = TrainJob::default();
        job.metadata_mut().name = Some("j".into());
        assert_eq!(job.metadata().name.as_deref(), Some("j"));
    }
}
