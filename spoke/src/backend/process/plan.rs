//! A JobSet (and the ConfigMaps and Secrets built with it) read into a plan of
//! pods, and each pod resolved into processes: command, args and env with
//! fieldRefs, key refs and `$(VAR)` references resolved and endpoints
//! rewritten. No I/O.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::cgroup::Limits;
use super::quantity::parse_quantity_milli;
use super::rewrite::{Endpoints, LOCAL_IP};
use crate::backend::PodSetRequest;

/// `apiVersion` of the JobSet the backend runs.
pub const JOBSET_API_VERSION: &str = "jobset.x-k8s.io/v1alpha2";

/// Label and annotation keys the JobSet and Job controllers put on pods.
pub mod keys {
    pub const JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
    pub const REPLICATED_JOB_NAME: &str = "jobset.sigs.k8s.io/replicatedjob-name";
    pub const REPLICATED_JOB_REPLICAS: &str = "jobset.sigs.k8s.io/replicatedjob-replicas";
    pub const JOB_INDEX: &str = "jobset.sigs.k8s.io/job-index";
    pub const JOB_GLOBAL_INDEX: &str = "jobset.sigs.k8s.io/job-global-index";
    pub const RESTART_ATTEMPT: &str = "jobset.sigs.k8s.io/restart-attempt";
    pub const JOB_COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
    pub const BATCH_JOB_NAME: &str = "batch.kubernetes.io/job-name";
    pub const JOB_NAME: &str = "job-name";
    /// The env var the Job controller gives every container of an Indexed Job's pods.
    pub const JOB_COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
}

/// Most pods one run may have.
pub const MAX_PODS: u64 = 4096;

/// A run: the JobSet's replicated jobs and policies, and the data of the
/// ConfigMaps and Secrets built with it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub namespace: String,
    /// The JobSet's name.
    pub name: String,
    /// Subdomain of the pods' host names.
    pub subdomain: String,
    pub replicated_jobs: Vec<ReplicatedJobPlan>,
    pub success: SuccessRule,
    /// None: the JobSet has no failure policy (any failed Job fails it).
    pub failure: Option<FailureRules>,
    /// Every `containerPort` any container declares.
    pub ports: BTreeSet<i32>,
    pub config_maps: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    pub secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
}

/// One replicated job: `replicas` Jobs of `completions` indexed pods each.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicatedJobPlan {
    pub name: String,
    pub replicas: u32,
    pub completions: u32,
    /// Most pods of one Job running at once.
    pub parallelism: u32,
    /// Failed pods a Job tolerates before it fails (Kubernetes default 6).
    pub backoff_limit: u32,
    pub indexed: bool,
    /// Replicated jobs (by position) and the status each must reach first.
    pub depends_on: Vec<(usize, DependsOnStatus)>,
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
    /// The pod template's spec, as given.
    pub pod_spec: Value,
    pub service_account: String,
    pub init_containers: Vec<Container>,
    pub containers: Vec<Container>,
    pub volumes: Vec<Volume>,
    /// Per-pod requests (Kubernetes' effective pod request), milli-units.
    pub requests_milli: BTreeMap<String, i64>,
}

/// Status a dependency must reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DependsOnStatus {
    Ready,
    Complete,
}

/// `successPolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuccessRule {
    /// Operator `Any` (else `All`).
    pub any: bool,
    /// Target replicated jobs by position; all when the policy names none.
    pub targets: Vec<usize>,
}

/// `failurePolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRules {
    pub max_restarts: i32,
    pub rules: Vec<FailureRule>,
}

/// One `failurePolicy.rules[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRule {
    pub action: FailureAction,
    /// Job failure reasons that match; empty matches all.
    pub on_job_failure_reasons: Vec<String>,
    /// Replicated job names; empty matches all.
    pub target_replicated_jobs: Vec<String>,
}

/// What a failed Job does to the JobSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureAction {
    FailJobSet,
    /// Also stands for `RestartJob`: the process backend restarts the whole set.
    RestartJobSet,
    /// Also stands for `RestartJobAndIgnoreMaxRestarts`.
    RestartJobSetAndIgnoreMaxRestarts,
}

// ---------------------------------------------------------------- input docs

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Meta {
    name: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct JobSetDoc {
    api_version: String,
    kind: String,
    metadata: Meta,
    spec: JobSetSpecDoc,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct JobSetSpecDoc {
    replicated_jobs: Vec<ReplicatedJobDoc>,
    network: Option<NetworkDoc>,
    success_policy: Option<SuccessPolicyDoc>,
    failure_policy: Option<FailurePolicyDoc>,
    startup_policy: Option<StartupPolicyDoc>,
    suspend: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct NetworkDoc {
    subdomain: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct SuccessPolicyDoc {
    operator: Option<String>,
    target_replicated_jobs: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct FailurePolicyDoc {
    max_restarts: Option<i32>,
    rules: Vec<FailureRuleDoc>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct FailureRuleDoc {
    action: String,
    on_job_failure_reasons: Vec<String>,
    target_replicated_jobs: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct StartupPolicyDoc {
    startup_policy_order: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ReplicatedJobDoc {
    name: String,
    replicas: Option<i64>,
    depends_on: Vec<DependsOnDoc>,
    template: JobTemplateDoc,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct DependsOnDoc {
    name: String,
    status: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct JobTemplateDoc {
    spec: JobSpecDoc,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct JobSpecDoc {
    parallelism: Option<i64>,
    completions: Option<i64>,
    backoff_limit: Option<i64>,
    completion_mode: Option<String>,
    template: PodTemplateDoc,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodTemplateDoc {
    metadata: Meta,
    spec: Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodSpecDoc {
    init_containers: Vec<Container>,
    containers: Vec<Container>,
    volumes: Vec<Volume>,
    service_account_name: Option<String>,
}

/// A container of the pod template (the fields the process backend uses).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    pub name: String,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub env_from: Vec<EnvFrom>,
    pub ports: Vec<ContainerPort>,
    pub resources: Resources,
    pub restart_policy: Option<String>,
    pub volume_mounts: Vec<VolumeMount>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    pub sub_path: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPort {
    pub container_port: i32,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Resources {
    pub requests: BTreeMap<String, Value>,
    pub limits: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EnvVar {
    pub name: String,
    pub value: Option<String>,
    pub value_from: Option<EnvVarSource>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EnvVarSource {
    pub field_ref: Option<FieldRef>,
    pub config_map_key_ref: Option<KeyRef>,
    pub secret_key_ref: Option<KeyRef>,
    pub resource_field_ref: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FieldRef {
    pub field_path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KeyRef {
    pub name: String,
    pub key: String,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EnvFrom {
    pub prefix: Option<String>,
    pub config_map_ref: Option<NameRef>,
    pub secret_ref: Option<NameRef>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NameRef {
    pub name: String,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Volume {
    pub name: String,
    pub config_map: Option<ConfigMapVolume>,
    pub secret: Option<SecretVolume>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConfigMapVolume {
    pub name: String,
    pub items: Vec<KeyToPath>,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SecretVolume {
    pub secret_name: String,
    pub items: Vec<KeyToPath>,
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KeyToPath {
    pub key: String,
    pub path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct DataObjectDoc {
    kind: String,
    metadata: Meta,
    data: BTreeMap<String, String>,
    binary_data: BTreeMap<String, String>,
    string_data: BTreeMap<String, String>,
}

// ------------------------------------------------------------------ planning

/// Reads the objects of a run (JobSet first) into a plan.
///
/// # Errors
///
/// A message naming the field and the rule when the objects are not a JobSet
/// v1alpha2 this backend can run.
pub fn plan_run(
    namespace: &str,
    fallback_name: &str,
    objects: &[Value],
) -> Result<RunPlan, String> {
    let first = objects
        .first()
        .ok_or("objects: empty; the first object must be a JobSet")?;
    let doc: JobSetDoc = serde_json::from_value(first.clone())
        .map_err(|e| format!("objects[0]: not a readable JobSet: {e}"))?;
    if doc.api_version != JOBSET_API_VERSION || doc.kind != "JobSet" {
        return Err(format!(
            "objects[0]: apiVersion {:?} kind {:?}; must be {JOBSET_API_VERSION} JobSet",
            doc.api_version, doc.kind
        ));
    }
    if doc.spec.suspend == Some(true) {
        return Err("objects[0].spec.suspend: true; the process backend runs JobSets that are not suspended".into());
    }
    let name = doc
        .metadata
        .name
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| fallback_name.to_owned());
    let subdomain = doc
        .spec
        .network
        .and_then(|n| n.subdomain)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| name.clone());
    if doc.spec.replicated_jobs.is_empty() {
        return Err("objects[0].spec.replicatedJobs: empty; a JobSet needs at least one".into());
    }
    let in_order = doc
        .spec
        .startup_policy
        .and_then(|p| p.startup_policy_order)
        .is_some_and(|o| o == "InOrder");

    let mut replicated_jobs = Vec::new();
    let mut ports = BTreeSet::new();
    let mut total_pods: u64 = 0;
    for (i, rjob) in doc.spec.replicated_jobs.into_iter().enumerate() {
        let field = format!("objects[0].spec.replicatedJobs[{i}]");
        let plan = plan_replicated_job(&field, rjob, &replicated_jobs, in_order)?;
        for c in plan.containers.iter().chain(&plan.init_containers) {
            ports.extend(c.ports.iter().map(|p| p.container_port).filter(|p| *p > 0));
        }
        total_pods += u64::from(plan.replicas) * u64::from(plan.completions);
        if total_pods > MAX_PODS {
            return Err(format!(
                "objects[0].spec.replicatedJobs: more than {MAX_PODS} pods in one run"
            ));
        }
        replicated_jobs.push(plan);
    }

    let position = |field: &str, name: &str| {
        replicated_jobs
            .iter()
            .position(|r| r.name == name)
            .ok_or_else(|| format!("{field}: no replicated job named {name:?}"))
    };
    let success = match doc.spec.success_policy {
        None => SuccessRule {
            any: false,
            targets: (0..replicated_jobs.len()).collect(),
        },
        Some(policy) => {
            let any = match policy.operator.as_deref() {
                None | Some("All") => false,
                Some("Any") => true,
                Some(other) => {
                    return Err(format!(
                        "objects[0].spec.successPolicy.operator: {other:?}; must be All or Any"
                    ));
                }
            };
            let targets = if policy.target_replicated_jobs.is_empty() {
                (0..replicated_jobs.len()).collect()
            } else {
                policy
                    .target_replicated_jobs
                    .iter()
                    .map(|t| position("objects[0].spec.successPolicy.targetReplicatedJobs", t))
                    .collect::<Result<_, _>>()?
            };
            SuccessRule { any, targets }
        }
    };
    let failure = doc
        .spec
        .failure_policy
        .map(|policy| {
            let rules = policy
                .rules
                .into_iter()
                .enumerate()
                .map(|(i, rule)| {
                    let action = match rule.action.as_str() {
                        "FailJobSet" => FailureAction::FailJobSet,
                        "RestartJobSet" | "RestartJob" => FailureAction::RestartJobSet,
                        "RestartJobSetAndIgnoreMaxRestarts" | "RestartJobAndIgnoreMaxRestarts" => {
                            FailureAction::RestartJobSetAndIgnoreMaxRestarts
                        }
                        other => {
                            return Err(format!(
                                "objects[0].spec.failurePolicy.rules[{i}].action: unknown action {other:?}"
                            ));
                        }
                    };
                    Ok(FailureRule {
                        action,
                        on_job_failure_reasons: rule.on_job_failure_reasons,
                        target_replicated_jobs: rule.target_replicated_jobs,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok::<_, String>(FailureRules {
                max_restarts: policy.max_restarts.unwrap_or(0).max(0),
                rules,
            })
        })
        .transpose()?;

    let mut config_maps = BTreeMap::new();
    let mut secrets = BTreeMap::new();
    for (i, object) in objects.iter().enumerate().skip(1) {
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind != "ConfigMap" && kind != "Secret" {
            continue;
        }
        let doc: DataObjectDoc = serde_json::from_value(object.clone())
            .map_err(|e| format!("objects[{i}]: not a readable {kind}: {e}"))?;
        let object_name = doc
            .metadata
            .name
            .ok_or_else(|| format!("objects[{i}].metadata.name: required"))?;
        let decode = |key: &str, text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| format!("objects[{i}]: key {key:?} is not base64: {e}"))
        };
        let mut data = BTreeMap::new();
        if doc.kind == "ConfigMap" {
            for (k, v) in doc.data {
                data.insert(k, v.into_bytes());
            }
            for (k, v) in doc.binary_data {
                let bytes = decode(&k, &v)?;
                data.insert(k, bytes);
            }
            config_maps.insert(object_name, data);
        } else {
            for (k, v) in doc.data {
                let bytes = decode(&k, &v)?;
                data.insert(k, bytes);
            }
            for (k, v) in doc.string_data {
                data.insert(k, v.into_bytes());
            }
            secrets.insert(object_name, data);
        }
    }

    Ok(RunPlan {
        namespace: namespace.to_owned(),
        name,
        subdomain,
        replicated_jobs,
        success,
        failure,
        ports,
        config_maps,
        secrets,
    })
}

fn count(field: &str, value: Option<i64>, default: u32) -> Result<u32, String> {
    match value {
        None => Ok(default),
        Some(v) => u32::try_from(v).map_err(|_| format!("{field}: {v}; must be 0 or more")),
    }
}

fn plan_replicated_job(
    field: &str,
    rjob: ReplicatedJobDoc,
    earlier: &[ReplicatedJobPlan],
    in_order: bool,
) -> Result<ReplicatedJobPlan, String> {
    if rjob.name.is_empty() {
        return Err(format!("{field}.name: required"));
    }
    if earlier.iter().any(|r| r.name == rjob.name) {
        return Err(format!("{field}.name: {:?} is listed twice", rjob.name));
    }
    let job = rjob.template.spec;
    let replicas = count(&format!("{field}.replicas"), rjob.replicas, 1)?;
    let parallelism = count(
        &format!("{field}.template.spec.parallelism"),
        job.parallelism,
        1,
    )?;
    let completions = count(
        &format!("{field}.template.spec.completions"),
        job.completions,
        parallelism,
    )?;
    let backoff_limit = count(
        &format!("{field}.template.spec.backoffLimit"),
        job.backoff_limit,
        6,
    )?;
    // The JobSet webhook defaults completionMode to Indexed.
    let indexed = match job.completion_mode.as_deref() {
        None | Some("Indexed") => true,
        Some("NonIndexed") => false,
        Some(other) => {
            return Err(format!(
                "{field}.template.spec.completionMode: {other:?}; must be Indexed or NonIndexed"
            ));
        }
    };
    let mut depends_on = Vec::new();
    for (d, dep) in rjob.depends_on.iter().enumerate() {
        let position = earlier.iter().position(|r| r.name == dep.name).ok_or_else(|| {
            format!(
                "{field}.dependsOn[{d}].name: {:?} is not a replicated job listed before this one",
                dep.name
            )
        })?;
        let status = match dep.status.as_str() {
            "Ready" => DependsOnStatus::Ready,
            "Complete" => DependsOnStatus::Complete,
            other => {
                return Err(format!(
                    "{field}.dependsOn[{d}].status: {other:?}; must be Ready or Complete"
                ));
            }
        };
        depends_on.push((position, status));
    }
    if in_order && depends_on.is_empty() && !earlier.is_empty() {
        depends_on.push((earlier.len() - 1, DependsOnStatus::Ready));
    }

    let pod_spec = match job.template.spec {
        Value::Null => Value::Object(Default::default()),
        spec => spec,
    };
    let spec: PodSpecDoc = serde_json::from_value(pod_spec.clone()).map_err(|e| {
        format!("{field}.template.spec.template.spec: not a readable pod spec: {e}")
    })?;
    if spec.containers.is_empty() {
        return Err(format!(
            "{field}.template.spec.template.spec.containers: empty; a pod needs a container"
        ));
    }
    let mut names = BTreeSet::new();
    for (kind, list) in [
        ("initContainers", &spec.init_containers),
        ("containers", &spec.containers),
    ] {
        for (c, container) in list.iter().enumerate() {
            if container.name.is_empty() || !names.insert(container.name.clone()) {
                return Err(format!(
                    "{field}.template.spec.template.spec.{kind}[{c}].name: must be set and unique in the pod"
                ));
            }
        }
    }
    let requests_milli = pod_requests(field, &spec.init_containers, &spec.containers)?;
    Ok(ReplicatedJobPlan {
        name: rjob.name,
        replicas,
        completions,
        parallelism: parallelism.min(completions),
        backoff_limit,
        indexed,
        depends_on,
        pod_labels: job.template.metadata.labels,
        pod_annotations: job.template.metadata.annotations,
        pod_spec,
        service_account: spec
            .service_account_name
            .unwrap_or_else(|| "default".to_owned()),
        init_containers: spec.init_containers,
        containers: spec.containers,
        volumes: spec.volumes,
        requests_milli,
    })
}

/// Kubernetes' effective pod request: the larger of the sum over containers
/// and the largest init container, per resource; a limit stands in for a
/// missing request.
fn pod_requests(
    field: &str,
    init: &[Container],
    main: &[Container],
) -> Result<BTreeMap<String, i64>, String> {
    let container_requests = |c: &Container| -> Result<BTreeMap<String, i64>, String> {
        let mut out = BTreeMap::new();
        for (source, map) in [
            ("limits", &c.resources.limits),
            ("requests", &c.resources.requests),
        ] {
            for (resource, value) in map {
                let text = match value {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    other => other.to_string(),
                };
                let milli = parse_quantity_milli(&text).map_err(|e| {
                    format!(
                        "{field}: container {:?} resources.{source}.{resource}: {e}",
                        c.name
                    )
                })?;
                out.insert(resource.clone(), milli);
            }
        }
        Ok(out)
    };
    let mut total: BTreeMap<String, i64> = BTreeMap::new();
    for c in main {
        for (r, m) in container_requests(c)? {
            let slot = total.entry(r).or_default();
            *slot = slot.saturating_add(m);
        }
    }
    for c in init {
        for (r, m) in container_requests(c)? {
            let slot = total.entry(r).or_default();
            *slot = (*slot).max(m);
        }
    }
    Ok(total)
}

/// A container's `resources.limits` of memory and cpu. Requests are not
/// limits (as in Kubernetes, they only place the pod); quantities were
/// checked when the run was planned.
fn container_limits(c: &Container) -> Limits {
    let milli = |resource: &str| {
        let text = match c.resources.limits.get(resource)? {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        parse_quantity_milli(&text).ok()
    };
    Limits::from_milli(milli("memory"), milli("cpu"))
}

/// Who a pod is: what its env fieldRefs read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub name: String,
    pub uid: String,
    /// The JobSet restart this pod belongs to.
    pub restarts: i32,
}

/// What a pod needs besides its identity.
#[derive(Debug, Clone, Default)]
pub struct ResolveContext<'a> {
    pub endpoints: Endpoints,
    pub node_name: &'a str,
    /// Env given to every container that does not set the name itself.
    pub extra_env: &'a [(String, String)],
    /// The spoke's capacity (milli-units): what a `resourceFieldRef` to an
    /// unset limit reads, as kubelet reads the node's allocatable.
    pub allocatable: Option<&'a BTreeMap<String, i64>>,
    /// The pod's directory, where its ConfigMap and Secret volumes are
    /// written (`volumes/<volume>/`): env values and arguments naming a
    /// path under such a volume's `mountPath` are given this copy's path.
    pub pod_dir: Option<&'a std::path::Path>,
}

/// A container ready to run as a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub name: String,
    pub program: String,
    pub args: Vec<String>,
    /// In order; a later entry wins.
    pub env: Vec<(String, String)>,
    /// Its `resources.limits`, enforced where the machine has cgroups.
    pub limits: Limits,
}

/// A pod ready to run: init containers one after another, then containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPod {
    pub init: Vec<Process>,
    pub main: Vec<Process>,
    /// Files of the pod's ConfigMap and Secret volumes, relative to the pod
    /// directory (`volumes/<volume>/<path>`).
    pub files: Vec<(String, Vec<u8>)>,
}

impl RunPlan {
    /// `<jobset>-<rjob>-<jobIndex>`.
    pub fn job_name(&self, rjob: usize, job_index: u32) -> String {
        let rjob = self
            .replicated_jobs
            .get(rjob)
            .map_or("", |r| r.name.as_str());
        format!("{}-{rjob}-{job_index}", self.name)
    }

    /// `<jobset>-<rjob>-<jobIndex>-<podIndex>`: the pod's host name.
    pub fn hostname(&self, rjob: usize, job_index: u32, pod_index: u32) -> String {
        format!("{}-{pod_index}", self.job_name(rjob, job_index))
    }

    /// Every pod host name of the run.
    pub fn hostnames(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (r, rjob) in self.replicated_jobs.iter().enumerate() {
            for j in 0..rjob.replicas {
                for p in 0..rjob.completions {
                    out.push(self.hostname(r, j, p));
                }
            }
        }
        out
    }

    /// The endpoint rewriting of one attempt, given its port map.
    pub fn endpoints(&self, ports: &BTreeMap<i32, u16>) -> Endpoints {
        let hosts = self.hostnames();
        Endpoints::new(
            hosts.iter().map(String::as_str),
            &self.subdomain,
            &self.namespace,
            ports,
        )
    }

    /// The gang: one pod set per replicated job, `replicas × parallelism` pods.
    pub fn pod_sets(&self) -> Vec<PodSetRequest> {
        self.replicated_jobs
            .iter()
            .map(|r| PodSetRequest {
                name: r.name.clone(),
                count: r.replicas.saturating_mul(r.parallelism),
                requests_milli: r.requests_milli.clone(),
            })
            .collect()
    }

    /// Labels and annotations the JobSet and Job controllers give a pod, over
    /// the template's.
    pub fn pod_meta(
        &self,
        rjob: usize,
        job_index: u32,
        pod_index: u32,
        restarts: i32,
    ) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let Some(r) = self.replicated_jobs.get(rjob) else {
            return Default::default();
        };
        let global_index: u32 = self.replicated_jobs[..rjob]
            .iter()
            .map(|r| r.replicas)
            .sum::<u32>()
            + job_index;
        let job_name = self.job_name(rjob, job_index);
        let mut shared = vec![
            (keys::JOBSET_NAME, self.name.clone()),
            (keys::REPLICATED_JOB_NAME, r.name.clone()),
            (keys::REPLICATED_JOB_REPLICAS, r.replicas.to_string()),
            (keys::JOB_INDEX, job_index.to_string()),
            (keys::JOB_GLOBAL_INDEX, global_index.to_string()),
            (keys::RESTART_ATTEMPT, restarts.to_string()),
        ];
        if r.indexed {
            shared.push((keys::JOB_COMPLETION_INDEX, pod_index.to_string()));
        }
        let mut labels = r.pod_labels.clone();
        let mut annotations = r.pod_annotations.clone();
        for (k, v) in &shared {
            labels.insert((*k).to_owned(), v.clone());
            annotations.insert((*k).to_owned(), v.clone());
        }
        labels.insert(keys::BATCH_JOB_NAME.to_owned(), job_name.clone());
        labels.insert(keys::JOB_NAME.to_owned(), job_name);
        (labels, annotations)
    }

    /// The pod's spec as reported: the template's, with host name,
    /// subdomain and node set.
    pub fn pod_spec(&self, rjob: usize, job_index: u32, pod_index: u32, node: &str) -> Value {
        let Some(r) = self.replicated_jobs.get(rjob) else {
            return Value::Null;
        };
        let mut spec = r.pod_spec.clone();
        if let Value::Object(map) = &mut spec {
            map.insert(
                "hostname".into(),
                json!(self.hostname(rjob, job_index, pod_index)),
            );
            map.insert("subdomain".into(), json!(self.subdomain));
            map.insert("nodeName".into(), json!(node));
        }
        spec
    }

    /// Resolves one pod into processes and volume files.
    ///
    /// # Errors
    ///
    /// Why the pod cannot run (it then fails): a container without a
    /// command, an env var whose source is missing or unsupported, a volume
    /// item path that leaves the volume.
    pub fn resolve_pod(
        &self,
        rjob: usize,
        job_index: u32,
        pod_index: u32,
        id: &PodIdentity,
        ctx: &ResolveContext<'_>,
    ) -> Result<ResolvedPod, String> {
        let r = self
            .replicated_jobs
            .get(rjob)
            .ok_or_else(|| format!("replicated job #{rjob} is not in the plan"))?;
        let (labels, annotations) = self.pod_meta(rjob, job_index, pod_index, id.restarts);
        let pod = PodFields {
            id,
            namespace: &self.namespace,
            labels: &labels,
            annotations: &annotations,
            node: ctx.node_name,
            service_account: &r.service_account,
        };
        let index = r.indexed.then(|| pod_index.to_string());
        let resolve = |c: &Container| {
            let mounts = ctx
                .pod_dir
                .map(|dir| mounted_copies(c, &r.volumes, dir))
                .unwrap_or_default();
            self.resolve_container(c, &pod, index.as_deref(), ctx, &mounts)
        };
        let init = r
            .init_containers
            .iter()
            .map(resolve)
            .collect::<Result<_, _>>()?;
        let main = r.containers.iter().map(resolve).collect::<Result<_, _>>()?;
        let files = self.volume_files(r, &ctx.endpoints)?;
        Ok(ResolvedPod { init, main, files })
    }

    fn resolve_container(
        &self,
        c: &Container,
        pod: &PodFields<'_>,
        completion_index: Option<&str>,
        ctx: &ResolveContext<'_>,
        mounts: &[(String, String)],
    ) -> Result<Process, String> {
        let what = format!("container {:?}", c.name);
        if c.restart_policy.as_deref() == Some("Always") {
            return Err(format!(
                "{what}: sidecar init containers (restartPolicy: Always) are not supported by the process backend"
            ));
        }
        let mut env: Vec<(String, String)> = Vec::new();
        for (i, from) in c.env_from.iter().enumerate() {
            let prefix = from.prefix.as_deref().unwrap_or("");
            let (kind, source, store) = match (&from.config_map_ref, &from.secret_ref) {
                (Some(r), _) => ("ConfigMap", r, &self.config_maps),
                (None, Some(r)) => ("Secret", r, &self.secrets),
                (None, None) => continue,
            };
            match store.get(&source.name) {
                Some(data) => {
                    for (k, v) in data {
                        env.push((
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(v).into_owned(),
                        ));
                    }
                }
                None if source.optional == Some(true) => {}
                None => {
                    return Err(format!(
                        "{what}: envFrom[{i}] names {kind} {:?}, which is not among the run's objects",
                        source.name
                    ));
                }
            }
        }
        for var in &c.env {
            let value = match (&var.value, &var.value_from) {
                (_, Some(source)) => match self.env_source(source, pod, c, ctx) {
                    Ok(Some(v)) => v,
                    Ok(None) => continue,
                    Err(why) => return Err(format!("{what}: env {:?}: {why}", var.name)),
                },
                (Some(v), None) => expand(v, &env),
                (None, None) => String::new(),
            };
            upsert(&mut env, &var.name, value);
        }
        if let Some(index) = completion_index
            && !env.iter().any(|(k, _)| k == keys::JOB_COMPLETION_INDEX_ENV)
        {
            env.push((keys::JOB_COMPLETION_INDEX_ENV.to_owned(), index.to_owned()));
        }
        let mut argv: Vec<String> = c
            .command
            .iter()
            .chain(&c.args)
            .map(|a| expand(a, &env))
            .collect();
        if c.command.is_empty() {
            return Err(format!(
                "{what} has no command; the process backend runs command and args as a local process and ignores images, so it cannot run the image's entrypoint"
            ));
        }
        let program = argv.remove(0);
        let args = argv
            .iter()
            .map(|a| remap_mounted(&ctx.endpoints.rewrite_value(a), mounts))
            .collect();
        let mut full: Vec<(String, String)> = ctx
            .extra_env
            .iter()
            .filter(|(k, _)| !env.iter().any(|(n, _)| n == k))
            .cloned()
            .collect();
        full.extend(env.into_iter().map(|(k, v)| {
            let v = remap_mounted(&ctx.endpoints.rewrite_value(&v), mounts);
            (k, v)
        }));
        Ok(Process {
            name: c.name.clone(),
            program,
            args,
            env: full,
            limits: container_limits(c),
        })
    }

    /// The value of a `valueFrom`; None when an optional source is missing.
    fn env_source(
        &self,
        source: &EnvVarSource,
        pod: &PodFields<'_>,
        c: &Container,
        ctx: &ResolveContext<'_>,
    ) -> Result<Option<String>, String> {
        if let Some(field) = &source.field_ref {
            return pod.field(&field.field_path).map(Some);
        }
        for (kind, key_ref, store) in [
            ("ConfigMap", &source.config_map_key_ref, &self.config_maps),
            ("Secret", &source.secret_key_ref, &self.secrets),
        ] {
            let Some(key_ref) = key_ref else { continue };
            let value = store.get(&key_ref.name).and_then(|d| d.get(&key_ref.key));
            return match value {
                Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
                None if key_ref.optional == Some(true) => Ok(None),
                None => Err(format!(
                    "key {:?} of {kind} {:?} is not among the run's objects",
                    key_ref.key, key_ref.name
                )),
            };
        }
        if let Some(selector) = &source.resource_field_ref {
            return resource_field(selector, c, ctx.allocatable).map(Some);
        }
        Err("valueFrom has no source the process backend supports (fieldRef, configMapKeyRef, secretKeyRef)".into())
    }

    fn volume_files(
        &self,
        r: &ReplicatedJobPlan,
        endpoints: &Endpoints,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        let mut files = Vec::new();
        for volume in &r.volumes {
            let (kind, name, items, optional, store) = match (&volume.config_map, &volume.secret) {
                (Some(cm), _) => (
                    "ConfigMap",
                    &cm.name,
                    &cm.items,
                    cm.optional,
                    &self.config_maps,
                ),
                (None, Some(s)) => (
                    "Secret",
                    &s.secret_name,
                    &s.items,
                    s.optional,
                    &self.secrets,
                ),
                (None, None) => continue,
            };
            let what = format!("volume {:?}", volume.name);
            if !safe_relative(&volume.name) {
                return Err(format!("{what}: the name is not a plain file name"));
            }
            let Some(data) = store.get(name) else {
                if optional == Some(true) {
                    continue;
                }
                return Err(format!(
                    "{what}: {kind} {name:?} is not among the run's objects"
                ));
            };
            let chosen: Vec<(&str, &str)> = if items.is_empty() {
                data.keys().map(|k| (k.as_str(), k.as_str())).collect()
            } else {
                items
                    .iter()
                    .map(|i| (i.key.as_str(), i.path.as_str()))
                    .collect()
            };
            for (key, path) in chosen {
                if !safe_relative(path) {
                    return Err(format!(
                        "{what}: path {path:?} must be relative and stay inside the volume"
                    ));
                }
                let bytes = data
                    .get(key)
                    .ok_or_else(|| format!("{what}: {kind} {name:?} has no key {key:?}"))?;
                let bytes = match (kind, std::str::from_utf8(bytes)) {
                    ("ConfigMap", Ok(text)) => endpoints.rewrite_text(text).into_bytes(),
                    _ => bytes.clone(),
                };
                files.push((format!("volumes/{}/{path}", volume.name), bytes));
            }
        }
        Ok(files)
    }
}

/// A `resourceFieldRef` (`limits.cpu`, `requests.memory`, …) of container
/// `c` as kubelet resolves it: the quantity divided by `divisor` (default
/// 1), rounded up; an unset limit reads the spoke's capacity, an unset
/// request the limit, else 0.
fn resource_field(
    selector: &Value,
    c: &Container,
    allocatable: Option<&BTreeMap<String, i64>>,
) -> Result<String, String> {
    let what = "valueFrom.resourceFieldRef";
    if let Some(other) = selector["containerName"].as_str().filter(|n| *n != c.name) {
        return Err(format!(
            "{what}.containerName {other:?}: the process backend reads only the container's own resources"
        ));
    }
    let resource = selector["resource"].as_str().unwrap_or_default();
    let Some((kind, name)) = resource.split_once('.') else {
        return Err(format!(
            "{what}.resource {resource:?} is not limits.<name> or requests.<name>"
        ));
    };
    let quantity = |map: &BTreeMap<String, Value>| -> Result<Option<i64>, String> {
        map.get(name)
            .map(|v| match v {
                Value::String(s) => parse_quantity_milli(s),
                other => parse_quantity_milli(&other.to_string()),
            })
            .transpose()
            .map_err(|e| format!("{what}: resources.{kind}.{name}: {e}"))
    };
    let limit = quantity(&c.resources.limits)?;
    let milli = match kind {
        "limits" => limit.or_else(|| allocatable.and_then(|a| a.get(name).copied())),
        "requests" => Some(quantity(&c.resources.requests)?.or(limit).unwrap_or(0)),
        _ => None,
    }
    .ok_or_else(|| format!("{what}.resource {resource:?}: no limit and no capacity of {name}"))?;
    let divisor = match &selector["divisor"] {
        Value::Null => 1000,
        Value::String(s) => parse_quantity_milli(s).map_err(|e| format!("{what}.divisor: {e}"))?,
        other => {
            parse_quantity_milli(&other.to_string()).map_err(|e| format!("{what}.divisor: {e}"))?
        }
    };
    let Some(divisor) = u64::try_from(divisor).ok().filter(|d| *d > 0) else {
        return Err(format!("{what}.divisor must be positive"));
    };
    let milli = u64::try_from(milli).unwrap_or(0);
    Ok(milli.div_ceil(divisor).to_string())
}

fn safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

fn upsert(env: &mut Vec<(String, String)>, name: &str, value: String) {
    match env.iter_mut().find(|(k, _)| k == name) {
        Some(slot) => slot.1 = value,
        None => env.push((name.to_owned(), value)),
    }
}

/// Kubernetes' `$(VAR)` expansion: a defined var is replaced, `$$` is a `$`,
/// anything else is kept as written.
pub fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The fields of one pod the downward API reads.
struct PodFields<'a> {
    id: &'a PodIdentity,
    namespace: &'a str,
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    node: &'a str,
    service_account: &'a str,
}

impl PodFields<'_> {
    fn field(&self, path: &str) -> Result<String, String> {
        let keyed = |prefix: &str| {
            path.strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix("['"))
                .and_then(|rest| rest.strip_suffix("']"))
        };
        Ok(match path {
            "metadata.name" => self.id.name.clone(),
            "metadata.namespace" => self.namespace.to_owned(),
            "metadata.uid" => self.id.uid.clone(),
            "spec.nodeName" => self.node.to_owned(),
            "spec.serviceAccountName" => self.service_account.to_owned(),
            "status.podIP" | "status.podIPs" | "status.hostIP" | "status.hostIPs" => {
                LOCAL_IP.to_owned()
            }
            _ => {
                if let Some(key) = keyed("metadata.labels") {
                    self.labels.get(key).cloned().unwrap_or_default()
                } else if let Some(key) = keyed("metadata.annotations") {
                    self.annotations.get(key).cloned().unwrap_or_default()
                } else {
                    return Err(format!(
                        "fieldRef {path:?} is not supported by the process backend"
                    ));
                }
            }
        })
    }
}

/// Where each ConfigMap or Secret volume that `c` mounts is on this
/// machine: (`mountPath`, the pod's copy `DIR/volumes/<volume>[/<subPath>]`),
/// longest mount path first. Other volumes (emptyDir, host paths) have no
/// copy and are left out.
fn mounted_copies(
    c: &Container,
    volumes: &[Volume],
    dir: &std::path::Path,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = c
        .volume_mounts
        .iter()
        .filter(|m| m.mount_path.starts_with('/') && m.mount_path.len() > 1)
        .filter(|m| {
            volumes
                .iter()
                .any(|v| v.name == m.name && (v.config_map.is_some() || v.secret.is_some()))
        })
        .filter(|m| safe_relative(&m.name))
        .filter_map(|m| {
            let mut local = dir.join("volumes").join(&m.name);
            if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                if !safe_relative(sub) {
                    return None;
                }
                local = local.join(sub);
            }
            let mount = m.mount_path.trim_end_matches('/').to_string();
            Some((mount, local.to_string_lossy().into_owned()))
        })
        .collect();
    out.sort_by_key(|(mount, _)| std::cmp::Reverse(mount.len()));
    out
}

/// `value` with a leading mount path (the whole value, or followed by `/`)
/// replaced by the volume's copy, as the process would find the file
/// there in a container.
fn remap_mounted(value: &str, mounts: &[(String, String)]) -> String {
    for (mount, local) in mounts {
        if let Some(rest) = value.strip_prefix(mount.as_str())
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{local}{rest}");
        }
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What trainhub's python plugin builds: MASTER_ADDR/PORT, RANK from the
    /// completion index, port 29500.
    fn python_jobset() -> Value {
        let env = json!([
            {"name": "MASTER_ADDR", "value": "j-node-0-0.j"},
            {"name": "MASTER_PORT", "value": "29500"},
            {"name": "WORLD_SIZE", "value": "2"},
            {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "RJOB", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
            {"name": "DESC", "value": "rank of $(WORLD_SIZE) at $(MASTER_ADDR) $$HOME $(NOPE)"},
            {"name": "OTEL_SERVICE_NAME", "value": "mine"}
        ]);
        let container = json!({
            "name": "node",
            "image": "python",
            "command": ["python3", "-c", "print($(WORLD_SIZE))"],
            "args": ["--addr=j-node-0-0.j:29500", "29500"],
            "ports": [{"containerPort": 29500}],
            "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": 1, "memory": "1Gi"}},
            "env": env,
        });
        let node = json!({
            "name": "node", "replicas": 1,
            "dependsOn": [{"name": "initializer", "status": "Complete"}],
            "template": {"spec": {
                "parallelism": 2, "completions": 2, "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": {"app": "train"}},
                    "spec": {
                        "containers": [container],
                        "volumes": [{"name": "hosts", "configMap": {"name": "cm"}}]
                    }
                }
            }}
        });
        let initializer = json!({"name": "initializer", "template": {"spec": {"template": {"spec": {
            "containers": [{"name": "init", "image": "busybox", "command": ["true"]}]
        }}}}});
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "j"},
            "spec": {
                "replicatedJobs": [initializer, node],
                "failurePolicy": {"maxRestarts": 1}
            }
        })
    }

    fn objects() -> Vec<Value> {
        vec![
            python_jobset(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"},
                   "data": {"hostfile": "j-node-0-0.j slots=1\nj-node-0-1.j slots=1\n"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                   "data": {"token": "c2VjcmV0"}}),
            json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "j"}}),
        ]
    }

    #[test]
    fn plans_replicated_jobs_policies_and_requests() {
        let plan = plan_run("team", "fallback", &objects()).unwrap();
        assert_eq!(plan.name, "j");
        assert_eq!(plan.subdomain, "j");
        assert_eq!(plan.ports, [29500].into());
        let node = &plan.replicated_jobs[1];
        assert_eq!(
            (
                node.replicas,
                node.completions,
                node.parallelism,
                node.backoff_limit
            ),
            (1, 2, 2, 0)
        );
        assert_eq!(node.depends_on, vec![(0, DependsOnStatus::Complete)]);
        // requests win over limits; a limit without a request stands in for it
        assert_eq!(
            node.requests_milli,
            [
                ("cpu".to_string(), 500),
                ("memory".into(), 1024 * 1024 * 1024 * 1000)
            ]
            .into()
        );
        assert_eq!(plan.replicated_jobs[0].backoff_limit, 6);
        assert_eq!(
            plan.failure,
            Some(FailureRules {
                max_restarts: 1,
                rules: vec![]
            })
        );
        assert_eq!(
            plan.success,
            SuccessRule {
                any: false,
                targets: vec![0, 1]
            }
        );
        assert_eq!(plan.pod_sets()[1].count, 2);
        assert_eq!(plan.secrets["s"]["token"], b"secret");
        assert_eq!(
            plan.hostnames(),
            vec!["j-initializer-0-0", "j-node-0-0", "j-node-0-1"]
        );
    }

    #[test]
    fn paths_under_a_mounted_volume_name_the_pods_copy() {
        let c: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "token", "mountPath": "/var/run/secrets/kubeflow/trainer", "readOnly": true},
            {"name": "cfg", "mountPath": "/etc/app/", "subPath": "conf.d"},
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "token", "mountPath": "relative"}]}))
        .unwrap();
        let volumes: Vec<Volume> = serde_json::from_value(json!([
            {"name": "token", "secret": {"secretName": "j-trainer-status"}},
            {"name": "cfg", "configMap": {"name": "cm"}},
            {"name": "scratch", "emptyDir": {}}]))
        .unwrap();
        let dir = std::path::Path::new("/work/ns/j-1/pod");
        let mounts = mounted_copies(&c, &volumes, dir);
        let remap = |v: &str| remap_mounted(v, &mounts);
        assert_eq!(
            remap("/var/run/secrets/kubeflow/trainer/token"),
            "/work/ns/j-1/pod/volumes/token/token"
        );
        assert_eq!(
            remap("/var/run/secrets/kubeflow/trainer"),
            "/work/ns/j-1/pod/volumes/token"
        );
        assert_eq!(
            remap("/etc/app/x.yaml"),
            "/work/ns/j-1/pod/volumes/cfg/conf.d/x.yaml"
        );
        // Not under a mount path as a whole component; no copy of an emptyDir.
        for unchanged in [
            "/var/run/secrets/kubeflow/trainerX",
            "x/var/run/secrets/kubeflow/trainer",
            "/scratch/data",
            "relative/token",
            "",
        ] {
            assert_eq!(remap(unchanged), unchanged);
        }
    }

    #[test]
    fn resource_field_refs_read_as_kubelet_reads_them() {
        let c: Container = serde_json::from_value(json!({"name": "c", "resources": {
            "limits": {"cpu": "1500m", "memory": "1Gi"},
            "requests": {"cpu": "500m"}}}))
        .unwrap();
        let capacity = BTreeMap::from([("cpu".to_owned(), 8000), ("ephemeral-storage".into(), 0)]);
        let read = |selector: Value| resource_field(&selector, &c, Some(&capacity));
        let ok = |resource: &str, divisor: Value| {
            read(json!({"resource": resource, "divisor": divisor})).unwrap()
        };
        assert_eq!(ok("limits.cpu", Value::Null), "2", "rounded up");
        assert_eq!(ok("limits.cpu", json!("1m")), "1500");
        assert_eq!(ok("limits.memory", json!("1Mi")), "1024");
        assert_eq!(ok("requests.cpu", json!("1m")), "500");
        assert_eq!(
            ok("requests.memory", Value::Null),
            "1073741824",
            "the limit"
        );
        assert_eq!(ok("requests.ephemeral-storage", Value::Null), "0");
        assert_eq!(ok("limits.ephemeral-storage", Value::Null), "0");
        let bare = Container::default();
        let cpu = resource_field(&json!({"resource": "limits.cpu"}), &bare, Some(&capacity));
        assert_eq!(cpu.unwrap(), "8", "an unset limit reads the capacity");
        for (selector, why) in [
            (
                json!({"resource": "limits.hugepages-2Mi"}),
                "no limit and no capacity",
            ),
            (json!({"resource": "cpu"}), "is not limits.<name>"),
            (json!({"resource": "spec.cpu"}), "no limit and no capacity"),
            (
                json!({"resource": "limits.cpu", "divisor": "0"}),
                "must be positive",
            ),
            (json!({"resource": "limits.cpu", "divisor": "x"}), "divisor"),
            (
                json!({"resource": "limits.cpu", "containerName": "d"}),
                "own resources",
            ),
            (json!({}), "is not limits"),
        ] {
            let err = read(selector.clone()).unwrap_err();
            assert!(err.contains(why), "{selector}: {err}");
        }
    }

    #[test]
    fn resolves_env_rewrites_endpoints_and_writes_volumes() {
        let plan = plan_run("team", "j", &objects()).unwrap();
        let ports = [(29500, 41000u16)].into();
        let extra = vec![
            ("TRACEPARENT".to_string(), "00-abc".to_string()),
            ("OTEL_SERVICE_NAME".to_string(), "hub".to_string()),
        ];
        let ctx = ResolveContext {
            endpoints: plan.endpoints(&ports),
            node_name: "box",
            extra_env: &extra,
            allocatable: None,
            pod_dir: None,
        };
        let id = PodIdentity {
            name: "j-node-0-1-abcde".into(),
            uid: "u-1".into(),
            restarts: 0,
        };
        let pod = plan.resolve_pod(1, 0, 1, &id, &ctx).unwrap();
        let p = &pod.main[0];
        assert_eq!(p.program, "python3");
        assert_eq!(
            p.args,
            vec!["-c", "print(2)", "--addr=127.0.0.1:41000", "41000"]
        );
        let env: BTreeMap<_, _> = p.env.iter().cloned().collect();
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(env["MASTER_PORT"], "41000");
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["RANK"], "1");
        assert_eq!(env["JOB_COMPLETION_INDEX"], "1");
        assert_eq!(env["POD"], "j-node-0-1-abcde");
        assert_eq!(env["RJOB"], "node");
        assert_eq!(env["TOKEN"], "secret");
        assert_eq!(env["DESC"], "rank of 2 at 127.0.0.1 $HOME $(NOPE)");
        assert_eq!(env["TRACEPARENT"], "00-abc");
        assert_eq!(
            env["OTEL_SERVICE_NAME"], "mine",
            "the container's own value wins"
        );
        assert_eq!(
            pod.files,
            vec![(
                "volumes/hosts/hostfile".to_string(),
                b"127.0.0.1 slots=1\n127.0.0.1 slots=1\n".to_vec()
            )]
        );
    }

    #[test]
    fn pod_meta_carries_the_controllers_labels_and_annotations() {
        let plan = plan_run("team", "j", &objects()).unwrap();
        let (labels, annotations) = plan.pod_meta(1, 0, 1, 2);
        assert_eq!(labels["app"], "train");
        assert_eq!(labels[keys::JOBSET_NAME], "j");
        assert_eq!(labels[keys::REPLICATED_JOB_NAME], "node");
        assert_eq!(labels[keys::JOB_INDEX], "0");
        assert_eq!(labels[keys::JOB_GLOBAL_INDEX], "1");
        assert_eq!(labels[keys::JOB_COMPLETION_INDEX], "1");
        assert_eq!(labels[keys::RESTART_ATTEMPT], "2");
        assert_eq!(labels[keys::JOB_NAME], "j-node-0");
        assert_eq!(annotations[keys::JOB_COMPLETION_INDEX], "1");
        let spec = plan.pod_spec(1, 0, 1, "box");
        assert_eq!(spec["hostname"], "j-node-0-1");
        assert_eq!(spec["subdomain"], "j");
        assert_eq!(spec["nodeName"], "box");
    }

    #[test]
    fn pods_that_cannot_run_say_why() {
        let mut js = python_jobset();
        let env = &mut js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"]
            [0]["env"];
        env.as_array_mut().unwrap().push(
            json!({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}),
        );
        let plan = plan_run("team", "j", &[js.clone()]).unwrap();
        let ctx = ResolveContext::default();
        let id = PodIdentity {
            name: "p".into(),
            uid: "u".into(),
            restarts: 0,
        };
        let err = plan.resolve_pod(1, 0, 0, &id, &ctx).unwrap_err();
        assert!(
            err.contains("env \"TOKEN\"") && err.contains("Secret \"s\""),
            "{err}"
        );

        let mut js = python_jobset();
        js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("command");
        let plan = plan_run("team", "j", &objects_with(js)).unwrap();
        let err = plan.resolve_pod(0, 0, 0, &id, &ctx).unwrap_err();
        assert!(err.contains("container \"init\" has no command"), "{err}");
    }

    fn objects_with(js: Value) -> Vec<Value> {
        let mut o = objects();
        o[0] = js;
        o
    }

    #[test]
    fn invalid_jobsets_name_the_field() {
        let cases: Vec<(Value, &str)> = vec![
            (
                json!({"apiVersion": "batch/v1", "kind": "Job"}),
                "objects[0]: apiVersion \"batch/v1\"",
            ),
            (
                json!({"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "spec": {}}),
                "replicatedJobs: empty",
            ),
            (
                json!({"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "spec": {"replicatedJobs": [
                    {"name": "a", "dependsOn": [{"name": "b", "status": "Ready"}],
                     "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "command": ["x"]}]}}}}}]}}),
                "replicatedJobs[0].dependsOn[0].name",
            ),
            (
                json!({"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "spec": {"replicatedJobs": [
                    {"name": "a", "template": {"spec": {"template": {"spec": {"containers": []}}}}}]}}),
                "containers: empty",
            ),
            (
                json!({"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "spec": {"replicatedJobs": [
                    {"name": "a", "replicas": 5000,
                     "template": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}}]}}),
                "more than 4096 pods",
            ),
            (
                json!({"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "spec": {"replicatedJobs": [
                    {"name": "a", "template": {"spec": {"template": {"spec": {"containers": [
                        {"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}}}}}]}}),
                "resources.requests.cpu: quantity \"lots\"",
            ),
        ];
        for (js, want) in cases {
            let err = plan_run("ns", "n", &[js]).unwrap_err();
            assert!(err.contains(want), "{err} should contain {want}");
        }
    }

    #[test]
    fn in_order_startup_chains_replicated_jobs() {
        let js = json!({"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "spec": {
        "startupPolicy": {"startupPolicyOrder": "InOrder"},
        "replicatedJobs": [
            {"name": "a", "template": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}},
            {"name": "b", "template": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}}
        ]}});
        let plan = plan_run("ns", "n", &[js]).unwrap();
        assert_eq!(plan.name, "n");
        assert_eq!(
            plan.replicated_jobs[1].depends_on,
            vec![(0, DependsOnStatus::Ready)]
        );
    }
}
