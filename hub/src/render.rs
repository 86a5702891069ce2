//! `trainctl render`: the whole plugin pipeline, offline.
//!
//! Reads TrainJobs and runtimes from YAML or JSON documents, validates each
//! TrainJob as admission would, builds its objects for a target spoke and
//! returns them, JobSet first.

use serde_json::Value;
use trainhub_api::trainer::{ClusterTrainingRuntime, TrainJob, TrainingRuntime};
use trainhub_plugin_sdk::{FieldError, Runtime, Target};

use crate::plugins::{Pipeline, PipelineError, Snapshot, format_field_errors};

/// The runtimes trainhub installs: upstream Kubeflow Trainer's, with the same
/// names and fields.
pub const BUILTIN_RUNTIMES: &[(&str, &str)] = &[
    (
        "python-distributed.yaml",
        include_str!("../../manifests/runtimes/python-distributed.yaml"),
    ),
    (
        "torch-distributed.yaml",
        include_str!("../../manifests/runtimes/torch-distributed.yaml"),
    ),
    (
        "deepspeed-distributed.yaml",
        include_str!("../../manifests/runtimes/deepspeed-distributed.yaml"),
    ),
    (
        "jax-distributed.yaml",
        include_str!("../../manifests/runtimes/jax-distributed.yaml"),
    ),
    (
        "xgboost-distributed.yaml",
        include_str!("../../manifests/runtimes/xgboost-distributed.yaml"),
    ),
    (
        "llama3-2-1B.yaml",
        include_str!("../../manifests/runtimes/llama3-2-1B.yaml"),
    ),
    (
        "flux-distributed.yaml",
        include_str!("../../manifests/runtimes/flux-distributed.yaml"),
    ),
];

/// Why rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{source_name}: {reason}")]
    Parse { source_name: String, reason: String },
    #[error("no TrainJob in the input")]
    NoTrainJob,
    #[error("trainjob/{job}: {kind} {name:?} not found in the input{hint}")]
    RuntimeNotFound {
        job: String,
        kind: String,
        name: String,
        hint: String,
    },
    #[error("trainjob/{job} is invalid: {}", format_field_errors(.errors))]
    Invalid {
        job: String,
        errors: Vec<FieldError>,
    },
    #[error("trainjob/{job}: {source}")]
    Pipeline {
        job: String,
        #[source]
        source: PipelineError,
    },
}

/// The documents of a YAML stream or a JSON file, as JSON values. Empty
/// documents are skipped; a JSON `List` contributes its items.
pub fn parse_documents(source_name: &str, text: &str) -> Result<Vec<Value>, RenderError> {
    let parse_error = |reason: String| RenderError::Parse {
        source_name: source_name.to_string(),
        reason,
    };
    let docs: Vec<Value> = if text.trim_start().starts_with('{') {
        vec![serde_json::from_str(text).map_err(|e| parse_error(e.to_string()))?]
    } else {
        serde_saphyr::from_multiple(text).map_err(|e| parse_error(e.to_string()))?
    };
    let mut out = Vec::new();
    for doc in docs {
        match doc {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                if let Some(Value::Array(items)) = map.get("items") {
                    out.extend(items.iter().cloned());
                }
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// TrainJobs and runtimes sorted out of a set of documents.
#[derive(Debug, Default)]
pub struct Inputs {
    pub jobs: Vec<TrainJob>,
    pub runtimes: Vec<Runtime>,
}

impl Inputs {
    /// Sorts `docs` by kind; other kinds are an error naming the document.
    pub fn add(&mut self, source_name: &str, docs: Vec<Value>) -> Result<(), RenderError> {
        for (i, doc) in docs.into_iter().enumerate() {
            let kind = doc
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let parse_error = |reason: String| RenderError::Parse {
                source_name: format!("{source_name} (document {})", i + 1),
                reason,
            };
            match kind.as_str() {
                "TrainJob" => self.jobs.push(
                    serde_json::from_value(doc)
                        .map_err(|e| parse_error(format!("TrainJob: {e}")))?,
                ),
                "TrainingRuntime" => self.runtimes.push(Runtime::TrainingRuntime(Box::new(
                    serde_json::from_value::<TrainingRuntime>(doc)
                        .map_err(|e| parse_error(format!("TrainingRuntime: {e}")))?,
                ))),
                "ClusterTrainingRuntime" => {
                    self.runtimes.push(Runtime::ClusterTrainingRuntime(Box::new(
                        serde_json::from_value::<ClusterTrainingRuntime>(doc)
                            .map_err(|e| parse_error(format!("ClusterTrainingRuntime: {e}")))?,
                    )))
                }
                "" => return Err(parse_error("document has no kind".into())),
                other => {
                    return Err(parse_error(format!(
                        "kind {other} is not rendered: expected TrainJob, TrainingRuntime or ClusterTrainingRuntime"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Adds trainhub's built-in runtimes.
    pub fn add_builtin_runtimes(&mut self) -> Result<(), RenderError> {
        for (name, text) in BUILTIN_RUNTIMES {
            self.add(name, parse_documents(name, text)?)?;
        }
        Ok(())
    }

    /// The runtime a TrainJob refers to, after defaulting its `runtimeRef`.
    fn runtime_for(&self, job: &TrainJob) -> Result<&Runtime, RenderError> {
        let job_name = job.metadata.name.clone().unwrap_or_default();
        let reference = &job.spec.runtime_ref;
        let kind = reference
            .kind
            .clone()
            .unwrap_or_else(|| "ClusterTrainingRuntime".to_string());
        let namespace = job.metadata.namespace.as_deref().unwrap_or("default");
        self.runtimes
            .iter()
            .find(|r| {
                r.kind() == kind
                    && r.name() == reference.name
                    && (kind == "ClusterTrainingRuntime"
                        || r.metadata().namespace.as_deref().unwrap_or("default") == namespace)
            })
            .ok_or_else(|| RenderError::RuntimeNotFound {
                job: job_name,
                kind,
                name: reference.name.clone(),
                hint: if self.runtimes.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (runtimes given: {})",
                        self.runtimes
                            .iter()
                            .map(|r| format!("{}/{}", r.kind(), r.name()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
            })
    }
}

/// Validates and builds every TrainJob in `inputs` with the plugins of
/// `snapshot`, for `target`. Warnings are returned beside the objects.
pub fn render(
    inputs: &Inputs,
    snapshot: &Snapshot,
    target: &Target,
) -> Result<(Vec<Value>, Vec<String>), RenderError> {
    if inputs.jobs.is_empty() {
        return Err(RenderError::NoTrainJob);
    }
    let mut objects = Vec::new();
    let mut warnings = Vec::new();
    for job in &inputs.jobs {
        let mut job = job.clone();
        job.default_fields();
        if job.metadata.namespace.is_none() {
            job.metadata.namespace = Some("default".into());
        }
        let name = job.metadata.name.clone().unwrap_or_default();
        let runtime = inputs.runtime_for(&job)?;
        let pipeline_error = |source| RenderError::Pipeline {
            job: name.clone(),
            source,
        };
        let pipeline = Pipeline::select(snapshot, runtime).map_err(pipeline_error)?;
        let validation = pipeline.validate(&job, runtime).map_err(pipeline_error)?;
        warnings.extend(
            validation
                .warnings
                .iter()
                .map(|w| format!("trainjob/{name}: {w}")),
        );
        if !validation.errors.is_empty() {
            return Err(RenderError::Invalid {
                job: name,
                errors: validation.errors,
            });
        }
        let rendered = pipeline.build(&job, runtime, target).map_err(|e| match e {
            PipelineError::Invalid(errors) => RenderError::Invalid {
                job: name.clone(),
                errors,
            },
            other => pipeline_error(other),
        })?;
        objects.extend(rendered.objects);
    }
    Ok((objects, warnings))
}
