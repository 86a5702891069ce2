//! The phase driver: which plugins apply to a TrainJob, and in what order
//! they are called.
//!
//! Selection (per TrainJob, from its runtime):
//! - general plugins (no frameworks, no pod-group policies, e.g. `jobset`)
//!   apply to every TrainJob;
//! - exactly one ML plugin: the plugin whose frameworks name the runtime's
//!   `trainer.kubeflow.org/framework` label, else the one whose frameworks
//!   name the runtime's `mlPolicy` source (`torch`, `mpi`, `jax`, `xgboost`,
//!   `flux`), else the one named `plainml`;
//! - at most one pod-group plugin: the one whose pod-group policies name the
//!   runtime's `podGroupPolicy` source (`coscheduling`, `volcano`).
//!
//! Order, as Kubeflow Trainer's framework runs it:
//! - PreExecution: `validate` of every applicable plugin (general, ML, pod
//!   group); errors and warnings are concatenated;
//! - Build: the ML plugin's `enforce-ml-policy`, then the pod-group plugin's
//!   `enforce-pod-group-policy`, then `build` of the general plugins, the ML
//!   plugin and the pod-group plugin, in that order;
//! - PostExecution: `status` of the general plugins; the last one that
//!   returns a status wins.

use std::sync::Arc;

use trainhub_api::jobset::JobSetStatus;
use trainhub_api::trainer::{MlFramework, MlPolicy, PodGroupPolicy, TrainJob, TrainJobStatus};
use trainhub_plugin_sdk::{self as sdk, Capabilities, Runtime, RuntimeInfo, Target, Validation};

use super::registry::Snapshot;
use super::{LoadedPlugin, Phase, PluginError, PluginId};

/// A plugin as the pipeline calls it: a wasm component, or (for benchmarks
/// and tests) the same plugin logic linked natively.
pub trait PhasePlugin: Send + Sync {
    fn id(&self) -> &PluginId;
    fn descriptor(&self) -> &sdk::Descriptor;
    fn validate(&self, trainjob: &str, runtime: &str) -> Result<Validation, PluginError>;
    fn enforce_ml_policy(
        &self,
        info: RuntimeInfo,
        trainjob: &str,
    ) -> Result<RuntimeInfo, PluginError>;
    fn enforce_pod_group_policy(
        &self,
        info: RuntimeInfo,
        trainjob: &str,
    ) -> Result<RuntimeInfo, PluginError>;
    fn build(
        &self,
        info: &RuntimeInfo,
        trainjob: &str,
        target: &Target,
    ) -> Result<Vec<String>, PluginError>;
    fn status(&self, trainjob: &str, observed: &str) -> Result<Option<String>, PluginError>;
}

impl PhasePlugin for LoadedPlugin {
    fn id(&self) -> &PluginId {
        LoadedPlugin::id(self)
    }
    fn descriptor(&self) -> &sdk::Descriptor {
        LoadedPlugin::descriptor(self)
    }
    fn validate(&self, trainjob: &str, runtime: &str) -> Result<Validation, PluginError> {
        LoadedPlugin::validate(self, trainjob, runtime)
    }
    fn enforce_ml_policy(
        &self,
        info: RuntimeInfo,
        trainjob: &str,
    ) -> Result<RuntimeInfo, PluginError> {
        LoadedPlugin::enforce_ml_policy(self, info, trainjob)
    }
    fn enforce_pod_group_policy(
        &self,
        info: RuntimeInfo,
        trainjob: &str,
    ) -> Result<RuntimeInfo, PluginError> {
        LoadedPlugin::enforce_pod_group_policy(self, info, trainjob)
    }
    fn build(
        &self,
        info: &RuntimeInfo,
        trainjob: &str,
        target: &Target,
    ) -> Result<Vec<String>, PluginError> {
        LoadedPlugin::build(self, info, trainjob, target)
    }
    fn status(&self, trainjob: &str, observed: &str) -> Result<Option<String>, PluginError> {
        LoadedPlugin::status(self, trainjob, observed)
    }
}

/// A plugin type linked into the hub, called through the same JSON boundary
/// as its wasm build (the SDK's `guest` functions).
pub struct NativePlugin<P: sdk::Plugin> {
    id: PluginId,
    descriptor: sdk::Descriptor,
    context: sdk::Context,
    plugin: std::marker::PhantomData<fn() -> P>,
}

impl<P: sdk::Plugin> NativePlugin<P> {
    pub fn new(settings: &serde_json::Value) -> Self {
        let descriptor = sdk::guest::describe::<P>();
        NativePlugin {
            id: PluginId {
                name: descriptor.name.clone(),
                digest: "native".into(),
            },
            descriptor,
            context: sdk::Context {
                settings: settings.to_string(),
            },
            plugin: std::marker::PhantomData,
        }
    }

    fn failed(&self, phase: Phase, failure: sdk::Failure) -> PluginError {
        PluginError::Failed {
            plugin: self.id.clone(),
            phase,
            message: failure.message,
        }
    }
}

impl<P: sdk::Plugin> PhasePlugin for NativePlugin<P> {
    fn id(&self) -> &PluginId {
        &self.id
    }
    fn descriptor(&self) -> &sdk::Descriptor {
        &self.descriptor
    }
    fn validate(&self, trainjob: &str, runtime: &str) -> Result<Validation, PluginError> {
        Ok(sdk::guest::validate::<P>(&self.context, trainjob, runtime))
    }
    fn enforce_ml_policy(
        &self,
        info: RuntimeInfo,
        trainjob: &str,
    ) -> Result<RuntimeInfo, PluginError> {
        sdk::guest::enforce_ml_policy::<P>(&self.context, info, trainjob)
            .map_err(|f| self.failed(Phase::EnforceMlPolicy, f))
    }
    fn enforce_pod_group_policy(
        &self,
        info: RuntimeInfo,
        trainjob: &str,
    ) -> Result<RuntimeInfo, PluginError> {
        sdk::guest::enforce_pod_group_policy::<P>(&self.context, info, trainjob)
            .map_err(|f| self.failed(Phase::EnforcePodGroupPolicy, f))
    }
    fn build(
        &self,
        info: &RuntimeInfo,
        trainjob: &str,
        target: &Target,
    ) -> Result<Vec<String>, PluginError> {
        sdk::guest::build::<P>(&self.context, info, trainjob, target)
            .map_err(|f| self.failed(Phase::Build, f))
    }
    fn status(&self, trainjob: &str, observed: &str) -> Result<Option<String>, PluginError> {
        sdk::guest::status::<P>(&self.context, trainjob, observed)
            .map_err(|f| self.failed(Phase::Status, f))
    }
}

/// Why the pipeline could not produce its result.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The TrainJob is invalid for its runtime (422 at the API).
    #[error("{}", super::format_field_errors(.0))]
    Invalid(Vec<sdk::FieldError>),
    /// No plugin handles what the runtime asks for.
    #[error("{0}")]
    NoPlugin(String),
    /// A `TrainerPlugin` that may handle the runtime is loading for the
    /// first time: try again shortly rather than fall back to `plainml`.
    #[error("TrainerPlugin {0:?} is loading and may serve this runtime; try again shortly")]
    Loading(String),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("cannot serialise {what}: {reason}")]
    Serialize { what: &'static str, reason: String },
}

impl PipelineError {
    /// Whether a plugin call could not run now (the host is overloaded):
    /// the caller retries later instead of failing the TrainJob.
    pub fn is_transient(&self) -> bool {
        match self {
            PipelineError::Plugin(e) => e.is_transient(),
            PipelineError::Loading(_) => true,
            _ => false,
        }
    }
}

/// What the Build phase produced for one target.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The runtime info after the enforce phases: pod sets with their final
    /// counts and per-pod requests, which dispatch offers to spokes.
    pub info: RuntimeInfo,
    /// The objects, JobSet first.
    pub objects: Vec<serde_json::Value>,
}

/// The plugins that apply to one TrainJob, in phase order.
pub struct Pipeline {
    general: Vec<Arc<dyn PhasePlugin>>,
    ml: Arc<dyn PhasePlugin>,
    pod_group: Option<Arc<dyn PhasePlugin>>,
}

impl Pipeline {
    /// Selects the plugins of `snapshot` that apply to TrainJobs of `runtime`.
    pub fn select(snapshot: &Snapshot, runtime: &Runtime) -> Result<Self, PipelineError> {
        let plugins = snapshot.plugins();
        let handles = |p: &&Arc<dyn PhasePlugin>, name: &str| {
            p.descriptor().frameworks.iter().any(|f| f == name)
        };
        let general = plugins
            .iter()
            .filter(|p| {
                p.descriptor().frameworks.is_empty() && p.descriptor().pod_group_policies.is_empty()
            })
            .cloned()
            .collect();

        let spec = runtime.spec();
        let source = spec.ml_policy.as_ref().and_then(ml_policy_source);
        let by_label = runtime
            .framework()
            .and_then(|label| plugins.iter().find(|p| handles(p, label)));
        let by_source = source.and_then(|s| plugins.iter().find(|p| handles(p, s)));
        if by_label.is_none()
            && by_source.is_none()
            && let Some(loading) = snapshot.loading().iter().find(|l| {
                l.frameworks.is_empty()
                    || l.frameworks.iter().any(|f| {
                        Some(f.as_str()) == runtime.framework() || Some(f.as_str()) == source
                    })
            })
        {
            return Err(PipelineError::Loading(loading.name.clone()));
        }
        let ml = by_label
            .or(by_source)
            .or_else(|| plugins.iter().find(|p| handles(p, "plainml")))
            .cloned()
            .ok_or_else(|| {
                PipelineError::NoPlugin(format!(
                    "no plugin handles the {} {:?} (framework label {:?}, mlPolicy source {:?})",
                    runtime.kind(),
                    runtime.name(),
                    runtime.framework(),
                    source,
                ))
            })?;

        let pod_group = match spec.pod_group_policy.as_ref().and_then(pod_group_source) {
            None => None,
            Some(source) => Some(
                plugins
                    .iter()
                    .find(|p| {
                        p.descriptor()
                            .pod_group_policies
                            .iter()
                            .any(|s| s == source)
                    })
                    .cloned()
                    .ok_or_else(|| {
                        PipelineError::NoPlugin(format!(
                            "no plugin handles podGroupPolicy {source} of the {} {:?}",
                            runtime.kind(),
                            runtime.name()
                        ))
                    })?,
            ),
        };
        Ok(Pipeline {
            general,
            ml,
            pod_group,
        })
    }

    /// Every applicable plugin once: general, ML, pod group.
    fn applicable(&self) -> impl Iterator<Item = &Arc<dyn PhasePlugin>> {
        self.general
            .iter()
            .chain(std::iter::once(&self.ml))
            .chain(self.pod_group.iter())
    }

    /// The plugins that apply (names and digests), in phase order.
    pub fn plugin_ids(&self) -> Vec<PluginId> {
        self.applicable().map(|p| p.id().clone()).collect()
    }

    /// Names of the plugins that apply, in phase order.
    pub fn plugin_names(&self) -> Vec<String> {
        self.applicable().map(|p| p.id().name.clone()).collect()
    }

    /// PreExecution: all applicable plugins' validation against `runtime`
    /// (the one the pipeline was selected for), plus the host's own check
    /// that `spec.trainer.env` sets no name a plugin reserves.
    pub fn validate(&self, job: &TrainJob, runtime: &Runtime) -> Result<Validation, PipelineError> {
        let job_json = to_json("TrainJob", job)?;
        let runtime_json = to_json("runtime", runtime)?;
        let mut result = Validation::default();
        for plugin in self.applicable() {
            if plugin
                .descriptor()
                .capabilities
                .contains(Capabilities::VALIDATE)
            {
                result.merge(plugin.validate(&job_json, &runtime_json)?);
            }
        }
        let env = job
            .spec
            .trainer
            .as_ref()
            .and_then(|t| t.env.as_ref())
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (i, var) in env.iter().enumerate() {
            for plugin in self.applicable() {
                if plugin.descriptor().reserved_env.contains(&var.name) {
                    let field = format!("spec.trainer.env[{i}].name");
                    if !result.errors.iter().any(|e| e.field == field) {
                        result.error(sdk::FieldError::invalid(
                            field,
                            Some(var.name.clone()),
                            format!(
                                "must not be set: {} is reserved by the {} plugin",
                                var.name,
                                plugin.id().name
                            ),
                        ));
                    }
                }
            }
        }
        Ok(result)
    }

    /// Build: enforce the ML policy, then the pod-group policy, then build
    /// every applicable plugin's objects for `target`.
    pub fn build(
        &self,
        job: &TrainJob,
        runtime: &Runtime,
        target: &Target,
    ) -> Result<Rendered, PipelineError> {
        let job_json = to_json("TrainJob", job)?;
        let info = self.enforce_with(job, &job_json, runtime)?;
        self.build_objects(info, &job_json, target)
    }

    /// Build with runtime info that [`Pipeline::enforce`] already gave for
    /// this TrainJob (the policies do not depend on the target).
    pub fn build_enforced(
        &self,
        job: &TrainJob,
        info: RuntimeInfo,
        target: &Target,
    ) -> Result<Rendered, PipelineError> {
        self.build_objects(info, &to_json("TrainJob", job)?, target)
    }

    fn build_objects(
        &self,
        info: RuntimeInfo,
        job_json: &str,
        target: &Target,
    ) -> Result<Rendered, PipelineError> {
        let mut objects = Vec::new();
        for plugin in self.applicable() {
            if !plugin
                .descriptor()
                .capabilities
                .contains(Capabilities::BUILD)
            {
                continue;
            }
            for raw in plugin.build(&info, job_json, target)? {
                objects.push(check_object(plugin.id(), &raw)?);
            }
        }
        Ok(Rendered { info, objects })
    }

    /// The runtime info after the ML and pod-group policies: pod sets with
    /// their final counts and per-pod requests (what dispatch offers).
    pub fn enforce(&self, job: &TrainJob, runtime: &Runtime) -> Result<RuntimeInfo, PipelineError> {
        self.enforce_with(job, &to_json("TrainJob", job)?, runtime)
    }

    fn enforce_with(
        &self,
        job: &TrainJob,
        job_json: &str,
        runtime: &Runtime,
    ) -> Result<RuntimeInfo, PipelineError> {
        let mut info = sdk::info::new_runtime_info(job, runtime).map_err(PipelineError::Invalid)?;
        if self
            .ml
            .descriptor()
            .capabilities
            .contains(Capabilities::ENFORCE_ML_POLICY)
        {
            info = self.ml.enforce_ml_policy(info, job_json)?;
        }
        if let Some(pg) = &self.pod_group
            && pg
                .descriptor()
                .capabilities
                .contains(Capabilities::ENFORCE_POD_GROUP_POLICY)
        {
            info = pg.enforce_pod_group_policy(info, job_json)?;
        }
        Ok(info)
    }

    /// PostExecution: the TrainJob status for an observed JobSet status.
    pub fn status(
        &self,
        job: &TrainJob,
        observed: &JobSetStatus,
    ) -> Result<Option<TrainJobStatus>, PipelineError> {
        let job_json = to_json("TrainJob", job)?;
        let observed_json = to_json("JobSet status", observed)?;
        let mut status = None;
        for plugin in &self.general {
            if !plugin
                .descriptor()
                .capabilities
                .contains(Capabilities::STATUS)
            {
                continue;
            }
            if let Some(raw) = plugin.status(&job_json, &observed_json)? {
                let parsed: TrainJobStatus =
                    serde_json::from_str(&raw).map_err(|e| PluginError::Malformed {
                        plugin: plugin.id().clone(),
                        phase: Phase::Status,
                        detail: format!("not a TrainJob status: {e}"),
                    })?;
                status = Some(parsed);
            }
        }
        Ok(status)
    }
}

/// The `mlPolicy` source set, by its field name.
fn ml_policy_source(policy: &MlPolicy) -> Option<&'static str> {
    policy.frameworks().first().map(|f| match f {
        MlFramework::Torch => "torch",
        MlFramework::Mpi => "mpi",
        MlFramework::Jax => "jax",
        MlFramework::Xgboost => "xgboost",
        MlFramework::Flux => "flux",
    })
}

/// The `podGroupPolicy` source set, by its field name.
fn pod_group_source(policy: &PodGroupPolicy) -> Option<&'static str> {
    if policy.coscheduling.is_some() {
        Some("coscheduling")
    } else if policy.volcano.is_some() {
        Some("volcano")
    } else {
        None
    }
}

/// The stored TrainJob `object` as the plugins are given it: typed, and
/// without the clients' and the API server's bookkeeping, which no phase
/// reads and each plugin call would serialise and the plugin parse again:
/// `metadata.managedFields` (who set which field, a quarter of a typical
/// TrainJob's JSON) and kubectl's `last-applied-configuration` annotation
/// (a copy of the whole manifest, for those who `kubectl apply`).
///
/// # Errors
///
/// The object is not a TrainJob.
pub fn plugin_trainjob(object: &serde_json::Value) -> Result<TrainJob, serde_json::Error> {
    use serde::Deserialize as _;
    let mut job = TrainJob::deserialize(object)?;
    job.metadata.managed_fields = None;
    if let Some(annotations) = job.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    Ok(job)
}

/// The annotation `kubectl apply` keeps its last manifest in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn to_json<T: serde::Serialize>(what: &'static str, value: &T) -> Result<String, PipelineError> {
    serde_json::to_string(value).map_err(|e| PipelineError::Serialize {
        what,
        reason: e.to_string(),
    })
}

/// A built object must be a JSON object naming its apiVersion, kind and name.
fn check_object(plugin: &PluginId, raw: &str) -> Result<serde_json::Value, PluginError> {
    let malformed = |detail: String| PluginError::Malformed {
        plugin: plugin.clone(),
        phase: Phase::Build,
        detail,
    };
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| malformed(format!("object is not JSON: {e}")))?;
    for (pointer, what) in [
        ("/apiVersion", "apiVersion"),
        ("/kind", "kind"),
        ("/metadata/name", "metadata.name"),
    ] {
        if value
            .pointer(pointer)
            .and_then(serde_json::Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(malformed(format!("object has no {what}")));
        }
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn plugins_are_given_a_trainjob_without_its_managed_fields_or_last_applied_manifest() {
        let object = json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {
                "name": "j", "namespace": "ns", "uid": "u1",
                "labels": {"team": "a"},
                "annotations": {
                    "note": "kept",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"kind\":\"TrainJob\"}",
                },
                "managedFields": [{
                    "manager": "kubectl", "operation": "Update",
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:runtimeRef": {}}},
                }],
            },
            "spec": {"runtimeRef": {"name": "torch-distributed"}},
        });
        let job = super::plugin_trainjob(&object).expect("a TrainJob");
        assert_eq!(job.metadata.managed_fields, None);
        assert_eq!(job.metadata.uid.as_deref(), Some("u1"));
        let seen = serde_json::to_value(&job).expect("serialises");
        assert!(seen["metadata"].get("managedFields").is_none());
        assert_eq!(seen["metadata"]["labels"], object["metadata"]["labels"]);
        assert_eq!(seen["metadata"]["annotations"], json!({"note": "kept"}));
        assert_eq!(seen["spec"]["runtimeRef"]["name"], "torch-distributed");
        assert!(super::plugin_trainjob(&json!({"spec": 1})).is_err());
    }
}
