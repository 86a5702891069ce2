//! Admission of the trainer.kubeflow.org kinds: what kube-apiserver and
//! Kubeflow Trainer's webhooks do to a TrainJob, TrainingRuntime or
//! ClusterTrainingRuntime before it is stored, in the same order:
//!
//! 1. defaulting from the CRD schema (`runtimeRef.apiGroup` and `kind`,
//!    `suspend`, `managedBy`, the runtimes' JobSet and policy defaults), then
//!    the TrainJob defaulter (`runtimePatches[].time`);
//! 2. the CRD schema: types, required fields, enums, bounds, list types and
//!    the `x-kubernetes-validations` rules, transition rules such as
//!    `self == oldSelf` ("field is immutable") included, with validation
//!    ratcheting on updates;
//! 3. only if the schema holds, the validating webhooks: for runtimes, the
//!    TrainJob steps of the JobSet template; for TrainJobs, the referenced
//!    runtime must exist, the PreExecution plugins validate the TrainJob
//!    against it, and runtime patches change only around suspension.
//!
//! Failures are 422 Invalid with one cause per field, as kube-apiserver
//! answers. A plugin that fails (rather than rejects) answers 500, as a
//! webhook with `failurePolicy: Fail` does; a plugin call the host could
//! not run now (overloaded) answers 429 with Retry-After. Writes through the `status`
//! subresource are checked against the status schema only.

#![allow(
    clippy::result_large_err,
    reason = "ApiError and FieldError are the apiserver's types; a refusal ends the request"
)]

mod cel;
mod runtime;
mod schema;
mod trainjob;

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use serde_json::Value;
use trainhub_api::constants;
use trainhub_api::trainer::TrainJob;
use trainhub_apiserver::admission::{Admission, Operation, Outcome, Request};
use trainhub_apiserver::field::FieldError;
use trainhub_apiserver::limits::encoded_weight;
use trainhub_apiserver::recent::Recent;
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{Key, Object, Op, Rv, Store};
use trainhub_plugin_sdk as sdk;

use crate::plugins::{Pipeline, PipelineError, PluginId, Registry, Snapshot};

pub use cel::CompileError;
pub use schema::{Schema, SchemaError};

/// Where runtime snapshots are kept: one object per TrainJob, keyed by its
/// namespace and uid, `{uid, trainjob, runtimeVersion,
/// runtimeResourceVersion, plugins: [{name, digest}]}`: the runtime
/// (defaulted, in [`RUNTIME_VERSIONS`]) and the plugins a TrainJob was
/// admitted with, which Build and PostExecution use for its whole life.
/// Written in the same transaction as the TrainJob's create; removed with
/// the TrainJob. Not served by the API. (Snapshots written before runtime
/// versions existed carry the runtime inline, as `runtime`; they are still
/// read.)
pub const RUNTIME_SNAPSHOTS: &str = "trainhub.kubeflow.org/runtimesnapshots";

/// Where the runtimes of snapshots are kept, once per content: named by
/// the sha256 of the defaulted runtime's JSON (32 hex digits), value
/// `{runtime}`. Every TrainJob admitted against one version of a runtime
/// refers to one object, written by the first of them. The leader removes
/// the versions no snapshot refers to (see `Dispatch`'s sweep).
pub const RUNTIME_VERSIONS: &str = "trainhub.kubeflow.org/runtimeversions";

/// The key of the runtime version `name`.
pub fn runtime_version_key(name: &str) -> Key {
    Key::new(RUNTIME_VERSIONS, None, name)
}

/// The name of a defaulted runtime's version: its JSON's sha256, 32 hex
/// digits.
///
/// # Errors
///
/// The runtime cannot be serialised.
pub fn runtime_version_name(runtime: &sdk::Runtime) -> Result<(String, Value), String> {
    use sha2::Digest as _;
    let value = serde_json::to_value(runtime).map_err(|e| format!("the runtime: {e}"))?;
    let bytes = serde_json::to_vec(&value).map_err(|e| format!("the runtime: {e}"))?;
    let mut name = hex::encode(sha2::Sha256::digest(&bytes));
    name.truncate(32);
    Ok((name, value))
}

/// The runtime and plugins a stored TrainJob runs with.
#[derive(Debug)]
pub struct Pinned {
    pub runtime: Arc<sdk::Runtime>,
    /// The plugins it was admitted with; `None` when it has no snapshot
    /// (created before snapshots existed, or by server-side apply), in
    /// which case `runtime` is the runtime as it is now and the caller
    /// takes the snapshot ([`snapshot_ops`]).
    pub plugins: Option<Vec<PluginId>>,
}

/// The snapshot key of the TrainJob `uid` in `namespace`.
pub fn snapshot_key(namespace: &str, uid: &str) -> Key {
    Key::new(RUNTIME_SNAPSHOTS, Some(namespace), uid)
}

/// The writes that keep `runtime` and `plugins` as what the TrainJob
/// `namespace/name` (`uid`) runs with: the snapshot, and the runtime
/// version when `store` does not hold it yet. `stored` is the runtime's
/// version name and resourceVersion when it was read from the store (else
/// the version is named from `runtime`). Idempotent (puts).
///
/// # Errors
///
/// The runtime cannot be serialised.
pub fn snapshot_ops(
    store: &dyn Store,
    namespace: &str,
    name: &str,
    uid: &str,
    runtime: &sdk::Runtime,
    stored: Option<(&str, Rv)>,
    plugins: &[PluginId],
) -> Result<Vec<Op>, String> {
    let mut ops = Vec::with_capacity(2);
    let runtime_rv = stored.map(|(_, rv)| rv);
    let version = match stored.map(|(v, _)| v) {
        Some(v) if store.revision_of(&runtime_version_key(v)).is_some() => v.to_string(),
        _ => {
            let (version, value) = runtime_version_name(runtime)?;
            let key = runtime_version_key(&version);
            if store.revision_of(&key).is_none() {
                ops.push(Op::Put {
                    key,
                    value: serde_json::json!({"runtime": value}),
                });
            }
            version
        }
    };
    let plugins: Vec<Value> = plugins
        .iter()
        .map(|p| serde_json::json!({"name": p.name, "digest": p.digest}))
        .collect();
    ops.push(Op::Put {
        key: snapshot_key(namespace, uid),
        value: serde_json::json!({
            "uid": uid,
            "trainjob": name,
            "runtimeVersion": version,
            "runtimeResourceVersion": runtime_rv.map(|rv| rv.to_string()),
            "plugins": plugins,
        }),
    });
    Ok(ops)
}

/// Where admission gets the plugins that validate TrainJobs.
pub trait PluginSource: Send + Sync + 'static {
    /// The plugins active now.
    fn snapshot(&self) -> Arc<Snapshot>;
}

impl PluginSource for Registry {
    fn snapshot(&self) -> Arc<Snapshot> {
        Registry::snapshot(self)
    }
}

/// A fixed set of plugins (tests, benchmarks, offline tools).
pub struct FixedPlugins(pub Arc<Snapshot>);

impl PluginSource for FixedPlugins {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.0.clone()
    }
}

/// The compiled schemas of the three kinds, from the CRDs this hub serves.
pub struct Schemas {
    pub trainjob: Schema,
    pub training_runtime: Schema,
    pub cluster_training_runtime: Schema,
}

/// Why the hub cannot validate the kinds it serves.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SchemasError {
    #[error("the {crd} CRD cannot be read: {message}")]
    Crd { crd: &'static str, message: String },
    #[error("the {crd} CRD: {source}")]
    Rule {
        crd: &'static str,
        #[source]
        source: SchemaError,
    },
}

impl Schemas {
    /// Compiled once per process: the CRDs do not change while it runs.
    ///
    /// # Errors
    ///
    /// A CRD without a schema, or with a rule that does not compile: the
    /// hub must not start serving it.
    pub fn get() -> Result<Arc<Schemas>, SchemasError> {
        static SCHEMAS: OnceLock<Result<Arc<Schemas>, SchemasError>> = OnceLock::new();
        SCHEMAS
            .get_or_init(|| {
                use trainhub_api::crd;
                let schemas = Schemas {
                    trainjob: compile("trainjobs", serde_json::to_value(crd::trainjob_crd()))?,
                    training_runtime: compile(
                        "trainingruntimes",
                        serde_json::to_value(crd::training_runtime_crd()),
                    )?,
                    cluster_training_runtime: compile(
                        "clustertrainingruntimes",
                        serde_json::to_value(crd::cluster_training_runtime_crd()),
                    )?,
                };
                tracing::debug!(
                    trainjobs = schemas.trainjob.rules().len(),
                    trainingruntimes = schemas.training_runtime.rules().len(),
                    clustertrainingruntimes = schemas.cluster_training_runtime.rules().len(),
                    "x-kubernetes-validations rules compiled"
                );
                Ok(Arc::new(schemas))
            })
            .clone()
    }

    fn of(&self, kind: &str) -> Option<&Schema> {
        match kind {
            "TrainJob" => Some(&self.trainjob),
            constants::TRAINING_RUNTIME_KIND => Some(&self.training_runtime),
            constants::CLUSTER_TRAINING_RUNTIME_KIND => Some(&self.cluster_training_runtime),
            _ => None,
        }
    }
}

/// The schema of a CRD's first version, with its rules compiled.
fn compile(
    crd: &'static str,
    value: Result<Value, serde_json::Error>,
) -> Result<Schema, SchemasError> {
    let value = value.map_err(|e| SchemasError::Crd {
        crd,
        message: e.to_string(),
    })?;
    let schema = value
        .pointer("/spec/versions/0/schema/openAPIV3Schema")
        .ok_or(SchemasError::Crd {
            crd,
            message: "its first version has no openAPIV3Schema".into(),
        })?;
    Schema::compile(schema).map_err(|source| SchemasError::Rule { crd, source })
}

/// What each cache of parsed runtimes may weigh (their size as JSON):
/// TrainingRuntimes are a tenant's to write, as large as an object may be,
/// so a count alone does not bound these caches.
const RUNTIMES_BYTES: usize = 32 << 20;

/// The weight of a snapshot read in [`TrainerAdmission::snapshots`]: its
/// plugins' names and digests. Its runtime is shared with every snapshot of
/// that version (and weighed in `snapshot_runtimes` or `runtimes`), and
/// weighing it here would serialise it once per TrainJob.
fn pinned_weight(pinned: &Arc<Pinned>) -> usize {
    64 + pinned
        .plugins
        .iter()
        .flatten()
        .map(|p| 48 + p.name.len() + p.digest.len())
        .sum::<usize>()
}

/// Admission for trainjobs, trainingruntimes and clustertrainingruntimes.
/// Other resources pass unchanged.
pub struct TrainerAdmission {
    store: Arc<dyn Store>,
    plugins: Arc<dyn PluginSource>,
    schemas: Arc<Schemas>,
    clock: Box<dyn Fn() -> SystemTime + Send + Sync>,
    /// Runtimes read (defaulted and typed), by key and resourceVersion:
    /// every TrainJob create, offer, build and status mapping reads one.
    runtimes: Recent<(Key, Rv), Arc<sdk::Runtime>>,
    /// Runtime snapshots read, by key and resourceVersion.
    snapshots: Recent<(Key, Rv), Arc<Pinned>>,
    /// The runtimes of snapshots, by version name (or, for snapshots with
    /// the runtime inline, the runtime's kind, namespace, name and
    /// resourceVersion): every TrainJob admitted against one version of a
    /// runtime shares one parsed copy, instead of one per TrainJob.
    snapshot_runtimes: Recent<String, Arc<sdk::Runtime>>,
    /// The version name of a stored runtime, by key and resourceVersion:
    /// a create names it without serialising the runtime again.
    version_names: Recent<(Key, Rv), String>,
    /// Who may set a TrainJob's priority annotation: the policy's admin
    /// groups.
    admin_groups: Vec<String>,
}

impl TrainerAdmission {
    /// Admission that looks runtimes up in `store` and validates TrainJobs
    /// with the plugins of `plugins` (an `Arc<Registry>` will do).
    ///
    /// # Errors
    ///
    /// The served CRDs' schemas do not compile (see [`Schemas::get`]).
    pub fn new(
        store: Arc<dyn Store>,
        plugins: Arc<dyn PluginSource>,
    ) -> Result<Self, SchemasError> {
        Ok(TrainerAdmission {
            store,
            plugins,
            schemas: Schemas::get()?,
            clock: Box::new(SystemTime::now),
            runtimes: Recent::with_budget(1024, RUNTIMES_BYTES, encoded_weight),
            snapshots: Recent::with_budget(1024, RUNTIMES_BYTES, pinned_weight),
            snapshot_runtimes: Recent::with_budget(256, RUNTIMES_BYTES, encoded_weight),
            version_names: Recent::new(256),
            admin_groups: trainhub_apiserver::auth::DEFAULT_ADMIN_GROUPS
                .iter()
                .map(|g| g.to_string())
                .collect(),
        })
    }

    /// The groups whose members may set `trainhub.kubeflow.org/priority`
    /// (the policy's admin groups; default `system:masters` and
    /// `trainhub:admins`).
    pub fn with_admin_groups(mut self, groups: Vec<String>) -> Self {
        self.admin_groups = groups;
        self
    }

    /// Until priorities come from admin-defined priority classes, a
    /// TrainJob's priority annotation is the admins' to set or change: a
    /// tenant may keep the value an admin gave, or drop it, never set its
    /// own.
    ///
    /// 403 Forbidden rather than 422 Invalid: the value is not malformed,
    /// the caller lacks the authority, and kube-apiserver answers the same
    /// case (a pod naming a priority class its namespace may not use, in
    /// the `Priority` and `ResourceQuota` admission plugins) with 403.
    fn check_priority(&self, request: &Request<'_>, object: &Value) -> Result<(), ApiError> {
        let set = &object["metadata"]["annotations"][crate::dispatch::ANNOTATION_PRIORITY];
        let before = request.old.map_or(&Value::Null, |o| {
            &o["metadata"]["annotations"][crate::dispatch::ANNOTATION_PRIORITY]
        });
        if set.is_null()
            || set == before
            || self.admin_groups.iter().any(|g| request.user.in_group(g))
        {
            return Ok(());
        }
        let annotation = crate::dispatch::ANNOTATION_PRIORITY;
        Err(ApiError::forbidden_because(
            constants::TRAINER_GROUP,
            "trainjobs",
            request.name,
            &format!(
                "only members of the admin groups ({}) may set the annotation {annotation}",
                self.admin_groups.join(", ")
            ),
        )
        .with_cause(
            "FieldValueForbidden",
            &format!("only admins may set {annotation}"),
            &format!("metadata.annotations[{annotation}]"),
        ))
    }

    /// Uses `clock` for the time stamped on runtime patches.
    pub fn with_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Admits a TrainJob write. A create starts the TrainJob's trace: its
    /// root span covers admission (the PreExecution plugins are its
    /// children) and its context is stored on the TrainJob, so that every
    /// later span, on this hub after any restart and on the spokes, joins
    /// the same trace. An update keeps those annotations.
    fn admit_trainjob(
        &self,
        request: &Request<'_>,
        schema: &Schema,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<Outcome, ApiError> {
        if request.operation != Operation::Create {
            keep_trace_annotations(object, old);
            return self.check_trainjob(request, schema, object, old);
        }
        let span = trainhub_telemetry::span!(
            "admission",
            trainjob = request.name,
            namespace = request.namespace.unwrap_or_default(),
            user = %request.user.name,
            outcome = tracing::field::Empty,
        );
        let result = span.in_scope(|| self.check_trainjob(request, schema, object, old));
        if span.is_disabled() {
            return result;
        }
        match &result {
            Ok(_) => {
                span.record("outcome", "admitted");
                if !request.dry_run
                    && let Some(traceparent) = trainhub_telemetry::propagation::traceparent(&span)
                {
                    set_trace_annotations(object, &traceparent);
                }
            }
            Err(e) => {
                span.record("outcome", e.message.as_str());
            }
        }
        result
    }

    fn check_trainjob(
        &self,
        request: &Request<'_>,
        schema: &Schema,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<Outcome, ApiError> {
        let invalid = |errors: &[FieldError]| {
            ApiError::invalid(constants::TRAINER_GROUP, "TrainJob", request.name, errors)
        };
        trainjob::default_patch_times(object, old, &trainjob::rfc3339((self.clock)()));
        // The status is the status subresource's: a write of the main
        // resource does not set it, so it is not judged here.
        let status = object.as_object_mut().and_then(|m| m.remove("status"));
        let errors = schema.validate(object, old, "");
        if let (Some(status), Some(map)) = (status, object.as_object_mut()) {
            map.insert("status".into(), status);
        }
        if !errors.is_empty() {
            return Err(invalid(&errors));
        }
        // An update that leaves the spec as it was (labels, finalizers,
        // annotations) was validated against the runtime when it was written.
        if let (Some(old), Some(spec)) = (old, schema.property("spec"))
            && let (Some(a), Some(b)) = (old.get("spec"), object.get("spec"))
            && spec.equal(a, b)
        {
            return Ok(Outcome::default());
        }
        let mut outcome = Outcome::default();
        let mut errors = self.validate_against_runtime(request, object, &mut outcome)?;
        if let Some(old) = old {
            errors.extend(trainjob::check_runtime_patches(old, object));
        }
        if errors.is_empty() {
            Ok(outcome)
        } else {
            Err(invalid(&errors))
        }
    }

    /// The TrainJob webhook's checks that need the referenced runtime. A
    /// create that passes them also keeps the runtime and the plugins it
    /// was admitted with (`outcome.also`, committed with the TrainJob).
    fn validate_against_runtime(
        &self,
        request: &Request<'_>,
        object: &Value,
        outcome: &mut Outcome,
    ) -> Result<Vec<FieldError>, ApiError> {
        let warnings = &mut outcome.warnings;
        let job = crate::plugins::plugin_trainjob(object).map_err(|e| {
            ApiError::bad_request(format!(
                "TrainJob {:?} cannot be decoded: {e}",
                request.name
            ))
        })?;
        let runtime_ref = &job.spec.runtime_ref;
        let namespace = request
            .namespace
            .or(job.metadata.namespace.as_deref())
            .unwrap_or_default();
        let key = match trainjob::runtime_key(runtime_ref, namespace) {
            Ok(key) => key,
            Err(e) => return Ok(vec![e]),
        };
        let Some(stored) = self.store.get(&key) else {
            return Ok(vec![trainjob::missing_runtime(runtime_ref)]);
        };
        let runtime = self.read_runtime(&stored)?;
        if matches!(*runtime, sdk::Runtime::ClusterTrainingRuntime(_))
            && runtime::is_deprecated(&stored.value)
        {
            warnings.push(runtime::deprecated_reference_warning(&runtime_ref.name));
        }
        let snapshot = self.plugins.snapshot();
        let plugin_failure = |e: PipelineError| {
            if e.is_transient() {
                return overloaded(request.name, &e);
            }
            ApiError::internal(format!(
                "validating TrainJob {:?} with the runtime's plugins: {e}",
                request.name
            ))
        };
        let pipeline = match Pipeline::select(&snapshot, &runtime) {
            Ok(p) => p,
            Err(PipelineError::NoPlugin(message)) => {
                let value = serde_json::to_value(runtime_ref).unwrap_or(Value::Null);
                return Ok(vec![FieldError::invalid("spec.runtimeRef", value, message)]);
            }
            Err(e) => return Err(plugin_failure(e)),
        };
        match pipeline.validate(&job, &runtime) {
            Ok(validation) => {
                warnings.extend(validation.warnings);
                if request.operation == Operation::Create
                    && validation.errors.is_empty()
                    && let Some(uid) = object["metadata"]["uid"].as_str()
                {
                    let keeping = |e: String| ApiError::internal(format!("keeping {e}"));
                    let version = self
                        .version_names
                        .try_get_with((stored.key.clone(), stored.rv), || {
                            runtime_version_name(&runtime).map(|(name, _)| name)
                        })
                        .map_err(keeping)?;
                    let ops = snapshot_ops(
                        self.store.as_ref(),
                        namespace,
                        request.name,
                        uid,
                        &runtime,
                        Some((&version, stored.rv)),
                        &pipeline.plugin_ids(),
                    )
                    .map_err(keeping)?;
                    outcome.also.extend(ops);
                }
                Ok(validation
                    .errors
                    .into_iter()
                    .map(trainjob::from_plugin)
                    .collect())
            }
            Err(PipelineError::Invalid(errors)) => {
                Ok(errors.into_iter().map(trainjob::from_plugin).collect())
            }
            Err(e) => Err(plugin_failure(e)),
        }
    }

    /// The runtime and plugins a stored TrainJob runs with: its snapshot
    /// if it has one, else the runtime it refers to as it is now (see
    /// [`Pinned::plugins`]).
    ///
    /// Unlike upstream's controller, which reads the runtime again at every
    /// reconcile, a TrainJob keeps what it was admitted with: editing or
    /// deleting a runtime changes only TrainJobs created after, so a
    /// running or requeued TrainJob is neither rebuilt differently nor
    /// stranded.
    pub fn pinned(&self, job: &TrainJob) -> Result<Arc<Pinned>, String> {
        let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
        let uid = job.metadata.uid.as_deref().unwrap_or_default();
        let key = snapshot_key(namespace, uid);
        // What this version of the snapshot was read as, without decoding
        // it again (the snapshot is named by the TrainJob's uid).
        if let Some(rv) = self.store.revision_of(&key)
            && let Some(pinned) = self.snapshots.get(&(key.clone(), rv))
        {
            return Ok(pinned);
        }
        let Some(stored) = self.store.get(&key).filter(|s| s.value["uid"] == uid) else {
            return Ok(Arc::new(Pinned {
                runtime: self.runtime_of(job)?,
                plugins: None,
            }));
        };
        let cache_key = (key, stored.rv);
        let unreadable =
            |e: String| format!("the runtime snapshot of the TrainJob is unreadable: {e}");
        let runtime = match stored.value["runtimeVersion"].as_str() {
            Some(version) => match self.version_runtime(version)? {
                Some(runtime) => runtime,
                // Its version removed under it (it should not be): the
                // runtime as it is now, as for a TrainJob without snapshot.
                None => {
                    tracing::warn!(trainjob = ?job.metadata.name, version, "runtime version of a snapshot missing; using the runtime as it is now");
                    return Ok(Arc::new(Pinned {
                        runtime: self.runtime_of(job)?,
                        plugins: None,
                    }));
                }
            },
            None => self.inline_runtime(&stored.value).map_err(unreadable)?,
        };
        let plugins = stored.value["plugins"]
            .as_array()
            .ok_or_else(|| unreadable("no plugins".into()))?
            .iter()
            .map(|p| {
                Some(PluginId {
                    name: p["name"].as_str()?.to_string(),
                    digest: p["digest"].as_str()?.to_string(),
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| unreadable("a plugin without name or digest".into()))?;
        let pinned = Arc::new(Pinned {
            runtime,
            plugins: Some(plugins),
        });
        self.snapshots.insert(cache_key, pinned.clone());
        Ok(pinned)
    }

    /// The version names of the runtimes stored now (see
    /// [`RUNTIME_VERSIONS`]); a runtime that cannot be read has none.
    pub fn current_runtime_versions(&self) -> std::collections::HashSet<String> {
        let mut names = std::collections::HashSet::new();
        for resource in [
            trainjob::TRAINING_RUNTIMES,
            trainjob::CLUSTER_TRAINING_RUNTIMES,
        ] {
            let (objects, _) = self.store.list(resource, None);
            for stored in objects {
                let Ok(runtime) = self.read_runtime(&stored) else {
                    continue;
                };
                if let Ok(name) = self
                    .version_names
                    .try_get_with((stored.key.clone(), stored.rv), || {
                        runtime_version_name(&runtime).map(|(name, _)| name)
                    })
                {
                    names.insert(name);
                }
            }
        }
        names
    }

    /// The runtime of version `version`, parsed once for every snapshot
    /// that names it; `None` when the store does not hold it.
    fn version_runtime(&self, version: &str) -> Result<Option<Arc<sdk::Runtime>>, String> {
        if let Some(runtime) = self.snapshot_runtimes.get(version) {
            return Ok(Some(runtime));
        }
        let Some(stored) = self.store.get(&runtime_version_key(version)) else {
            return Ok(None);
        };
        let runtime: sdk::Runtime = serde_json::from_value(stored.value["runtime"].clone())
            .map_err(|e| format!("runtime version {version} is unreadable: {e}"))?;
        let runtime = Arc::new(runtime);
        self.snapshot_runtimes
            .insert(version.to_string(), runtime.clone());
        Ok(Some(runtime))
    }

    /// The runtime of a snapshot that carries it inline (written before
    /// runtime versions), shared by the snapshots of one runtime version.
    fn inline_runtime(&self, snapshot: &Value) -> Result<Arc<sdk::Runtime>, String> {
        let snapshotted = &snapshot["runtime"];
        let parse = || {
            serde_json::from_value::<sdk::Runtime>(snapshotted.clone())
                .map(Arc::new)
                .map_err(|e| e.to_string())
        };
        let rv = snapshot["runtimeResourceVersion"]
            .as_str()
            .unwrap_or_default();
        // A resourceVersion names one version of one runtime; a snapshot
        // without one is parsed on its own.
        if rv.is_empty() {
            return parse();
        }
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let version = format!(
            "inline/{}/{}/{}/{rv}",
            text(&snapshotted["kind"]),
            text(&snapshotted["metadata"]["namespace"]),
            text(&snapshotted["metadata"]["name"]),
        );
        self.snapshot_runtimes.try_get_with(version, parse)
    }

    /// The runtime a stored TrainJob refers to, defaulted as admission
    /// reads it (for dispatch and status mapping).
    pub fn runtime_of(&self, job: &TrainJob) -> Result<Arc<sdk::Runtime>, String> {
        let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
        let key = trainjob::runtime_key(&job.spec.runtime_ref, namespace)
            .map_err(|e| format!("{}: {}", e.field, e.detail))?;
        let stored = self
            .store
            .get(&key)
            .ok_or_else(|| format!("{key} not found"))?;
        self.read_runtime(&stored).map_err(|e| e.message)
    }

    /// A stored runtime with the schema's defaults applied, as an informer
    /// would hand it to upstream's controller.
    fn read_runtime(&self, stored: &Object) -> Result<Arc<sdk::Runtime>, ApiError> {
        let cache_key = (stored.key.clone(), stored.rv);
        if let Some(runtime) = self.runtimes.get(&cache_key) {
            return Ok(runtime);
        }
        let key = &stored.key;
        let (kind, schema) = if key.resource == trainjob::TRAINING_RUNTIMES {
            (
                constants::TRAINING_RUNTIME_KIND,
                &self.schemas.training_runtime,
            )
        } else {
            (
                constants::CLUSTER_TRAINING_RUNTIME_KIND,
                &self.schemas.cluster_training_runtime,
            )
        };
        let mut value = stored.value.as_ref().clone();
        // Bookkeeping not the plugins' to read (see
        // `plugins::plugin_trainjob`), which every validate call would
        // carry: for a runtime installed with `kubectl apply`, a second
        // copy of it.
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
            if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                annotations.remove(crate::plugins::LAST_APPLIED);
            }
        }
        if let Some(map) = value.as_object_mut() {
            map.entry("apiVersion")
                .or_insert_with(|| format!("{}/v1alpha1", constants::TRAINER_GROUP).into());
            map.entry("kind").or_insert_with(|| kind.into());
        }
        schema.apply_defaults(&mut value);
        let runtime: sdk::Runtime = serde_json::from_value(value).map_err(|e| {
            ApiError::internal(format!("stored {key} is not a readable {kind}: {e}"))
        })?;
        let runtime = Arc::new(runtime);
        self.runtimes.insert(cache_key, runtime.clone());
        Ok(runtime)
    }

    fn admit_runtime(
        &self,
        request: &Request<'_>,
        kind: &str,
        schema: &Schema,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<Outcome, ApiError> {
        let invalid = |errors: &[FieldError]| {
            ApiError::invalid(constants::TRAINER_GROUP, kind, request.name, errors)
        };
        let errors = schema.validate(object, old, "");
        if !errors.is_empty() {
            return Err(invalid(&errors));
        }
        let errors = runtime::validate_replicated_jobs(object);
        if !errors.is_empty() {
            return Err(invalid(&errors));
        }
        let mut outcome = Outcome::default();
        if kind == constants::CLUSTER_TRAINING_RUNTIME_KIND
            && request.operation == Operation::Create
            && runtime::is_deprecated(object)
        {
            outcome
                .warnings
                .push(runtime::deprecated_runtime_warning(request.name));
        }
        Ok(outcome)
    }
}

/// A PreExecution call the plugin host could not run now: 429 with
/// Retry-After, as kube-apiserver answers when it is overloaded (clients
/// such as client-go and kubectl retry it), not 422 (the TrainJob is not
/// invalid) nor 500 (nothing failed).
fn overloaded(name: &str, e: &PipelineError) -> ApiError {
    let mut error = ApiError::new(
        429,
        "TooManyRequests",
        format!(
            "Too many requests, please try again later: validating TrainJob {name:?} with the \
             runtime's plugins: {e}"
        ),
    );
    error.retry_after_seconds = Some(1);
    error
}

/// On a TrainJob: the W3C `traceparent` of its admission span, the parent
/// of every later span of its trace (set at create when traces are
/// exported).
pub const ANNOTATION_TRACEPARENT: &str = "trainhub.kubeflow.org/traceparent";
/// On a TrainJob: its trace id, to look the trace up.
pub const ANNOTATION_TRACE_ID: &str = "trainhub.kubeflow.org/trace-id";

fn set_trace_annotations(object: &mut Value, traceparent: &str) {
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if !annotations.is_object() {
        *annotations = Value::Object(Default::default());
    }
    if let Some(map) = annotations.as_object_mut() {
        map.insert(ANNOTATION_TRACEPARENT.into(), traceparent.into());
        if let Some(id) = trainhub_telemetry::propagation::trace_id_of(traceparent) {
            map.insert(ANNOTATION_TRACE_ID.into(), id.into());
        }
    }
}

/// An update keeps the trace annotations the TrainJob was created with
/// (a client that replaces the object without them does not end its
/// trace).
fn keep_trace_annotations(object: &mut Value, old: Option<&Value>) {
    let Some(stored) =
        old.and_then(|o| o["metadata"]["annotations"][ANNOTATION_TRACEPARENT].as_str())
    else {
        return;
    };
    if object["metadata"]["annotations"][ANNOTATION_TRACEPARENT].is_null() {
        set_trace_annotations(object, stored);
    }
}

impl Admission for TrainerAdmission {
    fn admit(&self, request: &Request<'_>, object: &mut Value) -> Result<Outcome, ApiError> {
        if request.resource.group != constants::TRAINER_GROUP
            || request.operation == Operation::Delete
        {
            return Ok(Outcome::default());
        }
        let kind = request.resource.kind.as_str();
        let Some(schema) = self.schemas.of(kind) else {
            return Ok(Outcome::default());
        };
        let old = match request.operation {
            Operation::Update => request.old.map(|o| {
                let mut o = o.clone();
                schema.apply_defaults(&mut o);
                o
            }),
            _ => None,
        };
        match request.subresource {
            None => {}
            Some("status") => return admit_status(request, kind, schema, object, old.as_ref()),
            Some(_) => return Ok(Outcome::default()),
        }
        schema.apply_defaults(object);
        if kind == "TrainJob" {
            self.check_priority(request, object)?;
            self.admit_trainjob(request, schema, object, old.as_ref())
        } else {
            self.admit_runtime(request, kind, schema, object, old.as_ref())
        }
    }
}

/// A write through the status subresource: the status schema only.
fn admit_status(
    request: &Request<'_>,
    kind: &str,
    schema: &Schema,
    object: &mut Value,
    old: Option<&Value>,
) -> Result<Outcome, ApiError> {
    let (Some(status_schema), Some(status)) = (schema.property("status"), object.get_mut("status"))
    else {
        return Ok(Outcome::default());
    };
    status_schema.apply_defaults(status);
    let errors = status_schema.validate(status, old.and_then(|o| o.get("status")), "status");
    if errors.is_empty() {
        Ok(Outcome::default())
    } else {
        Err(ApiError::invalid(
            constants::TRAINER_GROUP,
            kind,
            request.name,
            &errors,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The served trainer CRDs compile, rules included, and carry the rules
    /// upstream's CRDs have.
    #[test]
    fn served_schemas_compile_with_their_rules() {
        let schemas = Schemas::get().unwrap();
        for (kind, schema) in [
            ("TrainJob", &schemas.trainjob),
            ("TrainingRuntime", &schemas.training_runtime),
            ("ClusterTrainingRuntime", &schemas.cluster_training_runtime),
        ] {
            let rules = schema.rules().len();
            assert!(rules >= 10, "{kind}: only {rules} rules found");
        }
    }
}
