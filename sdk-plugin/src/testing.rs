//! Run a plugin natively, through the same JSON boundary the wasm build
//! crosses, so its logic is unit-tested without a WebAssembly runtime.

use std::marker::PhantomData;

use trainhub_api::jobset::JobSetStatus;
use trainhub_api::trainer::{TrainJob, TrainJobStatus};

use crate::{
    Context, Descriptor, Failure, FieldError, Plugin, Runtime, RuntimeInfo, Target, Validation,
    guest,
};

/// Calls a [`Plugin`]'s phases the way the hub does.
pub struct Harness<P: Plugin> {
    context: Context,
    plugin: PhantomData<P>,
}

impl<P: Plugin> Default for Harness<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Plugin> Harness<P> {
    /// A harness with empty settings (`{}`).
    pub fn new() -> Self {
        Harness {
            context: Context {
                settings: "{}".to_string(),
            },
            plugin: PhantomData,
        }
    }

    /// A harness passing `settings` to every call, as the hub passes the
    /// plugin's configured settings.
    pub fn with_settings(settings: serde_json::Value) -> Self {
        Harness {
            context: Context {
                settings: settings.to_string(),
            },
            plugin: PhantomData,
        }
    }

    pub fn describe(&self) -> Descriptor {
        guest::describe::<P>()
    }

    pub fn validate_settings(&self) -> Vec<FieldError> {
        guest::validate_settings::<P>(&self.context.settings)
    }

    pub fn validate(&self, job: &TrainJob, runtime: &Runtime) -> Validation {
        guest::validate::<P>(&self.context, &json(job), &json(runtime))
    }

    /// The runtime info the host computes before the Build phase.
    pub fn runtime_info(
        &self,
        job: &TrainJob,
        runtime: &Runtime,
    ) -> Result<RuntimeInfo, Vec<FieldError>> {
        crate::info::new_runtime_info(job, runtime)
    }

    pub fn enforce_ml_policy(
        &self,
        info: RuntimeInfo,
        job: &TrainJob,
    ) -> Result<RuntimeInfo, Failure> {
        guest::enforce_ml_policy::<P>(&self.context, info, &json(job))
    }

    pub fn enforce_pod_group_policy(
        &self,
        info: RuntimeInfo,
        job: &TrainJob,
    ) -> Result<RuntimeInfo, Failure> {
        guest::enforce_pod_group_policy::<P>(&self.context, info, &json(job))
    }

    /// The objects built, parsed back from JSON.
    pub fn build(
        &self,
        info: &RuntimeInfo,
        job: &TrainJob,
        target: &Target,
    ) -> Result<Vec<serde_json::Value>, Failure> {
        guest::build::<P>(&self.context, info, &json(job), target)?
            .iter()
            .map(|s| {
                serde_json::from_str(s)
                    .map_err(|e| Failure::new(format!("plugin built invalid JSON: {e}")))
            })
            .collect()
    }

    pub fn status(
        &self,
        job: &TrainJob,
        observed: &JobSetStatus,
    ) -> Result<Option<TrainJobStatus>, Failure> {
        guest::status::<P>(&self.context, &json(job), &json(observed))?
            .map(|s| {
                serde_json::from_str(&s)
                    .map_err(|e| Failure::new(format!("plugin returned invalid status: {e}")))
            })
            .transpose()
    }
}

/// A target spoke for tests: no labels, no declared resources.
pub fn target(name: &str) -> Target {
    Target {
        name: name.to_string(),
        labels: Vec::new(),
        resources: Vec::new(),
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    // Serialising the crate's own API types cannot fail: they have string keys only.
    serde_json::to_string(value).unwrap_or_else(|e| panic!("serialising a test input: {e}"))
}
