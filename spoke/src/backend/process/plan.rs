//! What a run of the process backend executes, worked out from the built
//! JobSet without any I/O: the pods of each replicated job, the argv and
//! environment of each container (fieldRefs resolved, endpoints rewritten
//! to this machine), the JobSet policies, and the JobSet status that pod
//! phases amount to.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// The annotation (and label) with a pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// A Kubernetes quantity (`2`, `500m`, `4Gi`, `1e3`, `1.5k`) in milli-units,
/// rounded up.
pub fn parse_quantity_milli(text: &str) -> Result<i64, String> {
    let invalid = || format!("quantity {text:?} is not valid");
    let t = text.trim();
    let split = t
        .char_indices()
        .find(|(i, c)| !(c.is_ascii_digit() || *c == '.' || (*i == 0 && (*c == '+' || *c == '-'))))
        .map_or(t.len(), |(i, _)| i);
    let (number, suffix) = t.split_at(split);
    let (negative, digits) = match number.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty()
        || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
    {
        return Err(invalid());
    }
    // value = mantissa × 10^-scale
    let mantissa: i128 = format!("{int}{frac}").parse().map_err(|_| invalid())?;
    let scale = i32::try_from(frac.len()).map_err(|_| invalid())?;
    let (mult, exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        s if s.starts_with(['e', 'E']) => (1, s[1..].parse::<i32>().map_err(|_| invalid())?),
        _ => return Err(invalid()),
    };
    // milli = mantissa × mult × 10^(exp10 + 3 - scale), rounded up.
    let power = exp10 + 3 - scale;
    let base = mantissa.checked_mul(mult).ok_or_else(invalid)?;
    let milli = if power >= 0 {
        10i128
            .checked_pow(power.unsigned_abs())
            .and_then(|p| base.checked_mul(p))
            .ok_or_else(invalid)?
    } else {
        let div = 10i128
            .checked_pow(power.unsigned_abs())
            .ok_or_else(invalid)?;
        base / div + i128::from(base % div != 0)
    };
    let milli = if negative { -milli } else { milli };
    i64::try_from(milli).map_err(|_| format!("quantity {text:?} is too large"))
}

/// One container to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerPlan {
    pub name: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// One pod: a completion index of one Job of one replicated job.
#[derive(Debug, Clone, PartialEq)]
pub struct PodPlan {
    /// `<jobset>-<rjob>-<jobIndex>-<index>`; the pod name adds a suffix.
    pub base_name: String,
    pub replicated_job: String,
    pub job_index: i64,
    pub index: i64,
    pub init_containers: Vec<ContainerPlan>,
    pub containers: Vec<ContainerPlan>,
    pub labels: Map<String, Value>,
    pub annotations: Map<String, Value>,
    /// The pod template's spec with hostname and subdomain set.
    pub spec: Value,
    /// Why the pod cannot run, if it cannot (it then fails at once).
    pub error: Option<String>,
}

/// A replicated job and its pods.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicatedJobPlan {
    pub name: String,
    /// (replicated job, `Ready` | `Complete`) that must hold first.
    pub depends_on: Vec<(String, String)>,
    pub pods: Vec<PodPlan>,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub replicated_jobs: Vec<ReplicatedJobPlan>,
    /// successPolicy: `All` (default) or `Any`, over these replicated jobs.
    pub success_any: bool,
    pub success_targets: Vec<String>,
    /// failurePolicy.maxRestarts.
    pub max_restarts: i64,
    /// Requests of the whole gang, milli-units.
    pub demand: BTreeMap<String, i64>,
}

/// Every containerPort the JobSet declares.
pub fn declared_ports(jobset: &Value) -> BTreeSet<i64> {
    let mut ports = BTreeSet::new();
    for rjob in jobset["spec"]["replicatedJobs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let spec = &rjob["template"]["spec"]["template"]["spec"];
        for c in ["containers", "initContainers"]
            .iter()
            .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        {
            for p in c["ports"].as_array().into_iter().flatten() {
                if let Some(port) = p["containerPort"].as_i64() {
                    ports.insert(port);
                }
            }
        }
    }
    ports
}

/// Rewrites endpoint names of the run to 127.0.0.1 and declared ports to
/// the run's local ports.
struct Rewriter {
    /// (name, replacement), longest names first.
    names: Vec<String>,
    ports: BTreeMap<i64, u16>,
}

impl Rewriter {
    fn rewrite(&self, value: &str) -> String {
        let mut out = value.to_string();
        for name in &self.names {
            if out.contains(name.as_str()) {
                out = out.replace(name.as_str(), "127.0.0.1");
            }
        }
        if let Ok(port) = out.trim().parse::<i64>()
            && let Some(local) = self.ports.get(&port)
        {
            return local.to_string();
        }
        for (port, local) in &self.ports {
            out = out.replace(&format!("127.0.0.1:{port}"), &format!("127.0.0.1:{local}"));
        }
        out
    }
}

fn field_ref(
    path: &str,
    pod_name: &str,
    namespace: &str,
    labels: &Map<String, Value>,
    annotations: &Map<String, Value>,
) -> Option<String> {
    let bracket = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(String::from)
    };
    match path {
        "metadata.name" => Some(pod_name.to_string()),
        "metadata.namespace" => Some(namespace.to_string()),
        "status.podIP" | "status.hostIP" => Some("127.0.0.1".into()),
        "spec.nodeName" => Some("localhost".into()),
        "spec.serviceAccountName" => Some("default".into()),
        _ => {
            if let Some(k) = bracket("metadata.labels['") {
                return labels.get(&k).and_then(Value::as_str).map(String::from);
            }
            if let Some(k) = bracket("metadata.annotations['") {
                return annotations
                    .get(&k)
                    .and_then(Value::as_str)
                    .map(String::from);
            }
            None
        }
    }
}

/// The data of the run's ConfigMaps and Secrets by name, for env refs.
fn config_data(objects: &[Value]) -> BTreeMap<(String, String), BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for o in objects {
        let kind = o["kind"].as_str().unwrap_or_default();
        if kind != "ConfigMap" && kind != "Secret" {
            continue;
        }
        let name = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut data = BTreeMap::new();
        for (k, v) in o["data"].as_object().into_iter().flatten() {
            if let Some(v) = v.as_str() {
                let v = if kind == "Secret" {
                    base64_decode(v).unwrap_or_else(|| v.to_string())
                } else {
                    v.to_string()
                };
                data.insert(k.clone(), v);
            }
        }
        for (k, v) in o["stringData"].as_object().into_iter().flatten() {
            if let Some(v) = v.as_str() {
                data.insert(k.clone(), v.to_string());
            }
        }
        out.insert((kind.to_string(), name), data);
    }
    out
}

fn base64_decode(s: &str) -> Option<String> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.bytes().filter(|c| *c != b'=' && !c.is_ascii_whitespace()) {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Plans the run of `jobset` in `namespace` with the run's local `ports`.
pub fn plan(
    namespace: &str,
    jobset: &Value,
    objects: &[Value],
    extra_env: &[(String, String)],
    ports: &BTreeMap<i64, u16>,
) -> Result<RunPlan, String> {
    let name = jobset["metadata"]["name"]
        .as_str()
        .ok_or("the JobSet has no metadata.name")?;
    let spec = &jobset["spec"];
    let subdomain = spec["network"]["subdomain"].as_str().unwrap_or(name);
    let rjobs = spec["replicatedJobs"]
        .as_array()
        .ok_or("the JobSet has no spec.replicatedJobs")?;
    let data = config_data(objects);

    // Every endpoint name of the run, in its short and long forms.
    let mut names = Vec::new();
    for rjob in rjobs {
        let rname = rjob["name"].as_str().unwrap_or_default();
        let replicas = rjob["replicas"].as_i64().unwrap_or(1);
        let parallelism = rjob["template"]["spec"]["parallelism"]
            .as_i64()
            .unwrap_or(1);
        for j in 0..replicas.clamp(0, 1000) {
            for p in 0..parallelism.clamp(0, 10_000) {
                let host = format!("{name}-{rname}-{j}-{p}");
                for suffix in [".svc.cluster.local", ".svc", ""] {
                    names.push(format!("{host}.{subdomain}.{namespace}{suffix}"));
                }
                names.push(format!("{host}.{subdomain}"));
            }
        }
    }
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let rewriter = Rewriter {
        names,
        ports: ports.clone(),
    };

    let mut demand: BTreeMap<String, i64> = BTreeMap::new();
    let mut planned = Vec::new();
    for rjob in rjobs {
        let rname = rjob["name"].as_str().unwrap_or_default().to_string();
        let replicas = rjob["replicas"].as_i64().unwrap_or(1).clamp(0, 1000);
        let job_spec = &rjob["template"]["spec"];
        let parallelism = job_spec["parallelism"]
            .as_i64()
            .unwrap_or(1)
            .clamp(0, 10_000);
        let template = &job_spec["template"];
        let pod_spec = &template["spec"];
        let depends_on = rjob["dependsOn"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| {
                Some((
                    d["name"].as_str()?.to_string(),
                    d["status"].as_str().unwrap_or("Complete").to_string(),
                ))
            })
            .collect();
        let mut pods = Vec::new();
        for j in 0..replicas {
            for index in 0..parallelism {
                let base_name = format!("{name}-{rname}-{j}-{index}");
                let mut labels = template["metadata"]["labels"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                for (k, v) in [
                    ("jobset.sigs.k8s.io/jobset-name", name.to_string()),
                    ("jobset.sigs.k8s.io/replicatedjob-name", rname.clone()),
                    ("jobset.sigs.k8s.io/job-index", j.to_string()),
                    (
                        "jobset.sigs.k8s.io/replicatedjob-replicas",
                        replicas.to_string(),
                    ),
                    (COMPLETION_INDEX, index.to_string()),
                    ("job-name", format!("{name}-{rname}-{j}")),
                ] {
                    labels.insert(k.to_string(), v.into());
                }
                let mut annotations = template["metadata"]["annotations"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                annotations.insert(COMPLETION_INDEX.to_string(), index.to_string().into());
                let mut error = None;
                let mut container = |c: &Value| -> ContainerPlan {
                    let cname = c["name"].as_str().unwrap_or("main").to_string();
                    let mut argv: Vec<String> = c["command"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .chain(c["args"].as_array().into_iter().flatten())
                        .filter_map(|a| a.as_str().map(|a| rewriter.rewrite(a)))
                        .collect();
                    if c["command"].as_array().is_none_or(Vec::is_empty) {
                        error.get_or_insert(format!(
                            "container {cname} has no command: the process backend runs commands, not images"
                        ));
                        argv.clear();
                    }
                    let mut env = vec![
                        ("JOB_COMPLETION_INDEX".to_string(), index.to_string()),
                        ("HOSTNAME".to_string(), base_name.clone()),
                    ];
                    for var in c["env"].as_array().into_iter().flatten() {
                        let Some(var_name) = var["name"].as_str() else {
                            continue;
                        };
                        let value = if let Some(v) = var["value"].as_str() {
                            Some(v.to_string())
                        } else if let Some(path) =
                            var["valueFrom"]["fieldRef"]["fieldPath"].as_str()
                        {
                            field_ref(path, &base_name, namespace, &labels, &annotations)
                        } else if let Some(r) = var["valueFrom"]["configMapKeyRef"].as_object() {
                            lookup(&data, "ConfigMap", r)
                        } else if let Some(r) = var["valueFrom"]["secretKeyRef"].as_object() {
                            lookup(&data, "Secret", r)
                        } else if var["valueFrom"].is_null() {
                            Some(String::new())
                        } else {
                            None
                        };
                        match value {
                            Some(v) => env.push((var_name.to_string(), rewriter.rewrite(&v))),
                            None => {
                                error.get_or_insert(format!(
                                    "container {cname}: env {var_name}: its valueFrom cannot be resolved on this spoke"
                                ));
                            }
                        }
                    }
                    env.extend(extra_env.iter().cloned());
                    ContainerPlan {
                        name: cname,
                        argv,
                        env,
                    }
                };
                let containers: Vec<ContainerPlan> = pod_spec["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(&mut container)
                    .collect();
                let init_containers: Vec<ContainerPlan> = pod_spec["initContainers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(&mut container)
                    .collect();
                if containers.is_empty() {
                    error.get_or_insert("the pod has no containers".into());
                }
                let mut spec = pod_spec.clone();
                if spec.is_object() {
                    spec["hostname"] = base_name.clone().into();
                    spec["subdomain"] = subdomain.into();
                }
                pods.push(PodPlan {
                    base_name,
                    replicated_job: rname.clone(),
                    job_index: j,
                    index,
                    init_containers,
                    containers,
                    labels,
                    annotations,
                    spec,
                    error,
                });
                for c in pod_spec["containers"].as_array().into_iter().flatten() {
                    for (r, q) in c["resources"]["requests"].as_object().into_iter().flatten() {
                        if let Some(q) = q
                            .as_str()
                            .map(String::from)
                            .or_else(|| q.as_i64().map(|n| n.to_string()))
                        {
                            *demand.entry(r.clone()).or_default() += parse_quantity_milli(&q)
                                .map_err(|e| format!("{rname}: container requests {r}: {e}"))?;
                        }
                    }
                }
            }
        }
        planned.push(ReplicatedJobPlan {
            name: rname,
            depends_on,
            pods,
        });
    }
    let policy = &spec["successPolicy"];
    let success_targets = policy["targetReplicatedJobs"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| planned.iter().map(|r| r.name.clone()).collect());
    Ok(RunPlan {
        replicated_jobs: planned,
        success_any: policy["operator"].as_str() == Some("Any"),
        success_targets,
        max_restarts: spec["failurePolicy"]["maxRestarts"].as_i64().unwrap_or(0),
        demand,
    })
}

fn lookup(
    data: &BTreeMap<(String, String), BTreeMap<String, String>>,
    kind: &str,
    reference: &Map<String, Value>,
) -> Option<String> {
    let name = reference.get("name")?.as_str()?.to_string();
    let key = reference.get("key")?.as_str()?;
    data.get(&(kind.to_string(), name))?.get(key).cloned()
}

/// A pod's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

/// Where a run stands, from the phases of its pods (per replicated job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Running,
    Completed,
    /// A Job failed: the replicated job's name.
    JobFailed(String),
}

/// Whether a replicated job reached `status` (`Ready` or `Complete`).
pub fn reached(phases: &[Phase], status: &str) -> bool {
    match status {
        "Ready" => phases
            .iter()
            .all(|p| matches!(p, Phase::Running | Phase::Succeeded)),
        _ => phases.iter().all(|p| *p == Phase::Succeeded),
    }
}

/// The run's outcome from pod phases by replicated job.
pub fn outcome(plan: &RunPlan, phases: &BTreeMap<String, Vec<Phase>>) -> Outcome {
    if let Some((name, _)) = phases.iter().find(|(_, p)| p.contains(&Phase::Failed)) {
        return Outcome::JobFailed(name.clone());
    }
    let done = |t: &String| phases.get(t).is_some_and(|p| reached(p, "Complete"));
    let complete = if plan.success_any {
        plan.success_targets.iter().any(done)
    } else {
        plan.success_targets.iter().all(done)
    };
    if complete {
        Outcome::Completed
    } else {
        Outcome::Running
    }
}

/// The JobSet's status: replicatedJobsStatus (counted in Jobs, as the
/// JobSet controller counts), restarts and, once it ended, the terminal
/// condition. `pods` holds (job index, phase) per replicated job.
pub fn jobset_status(
    pods: &BTreeMap<String, Vec<(i64, Phase)>>,
    restarts: i64,
    terminal: Option<(&Outcome, &str)>,
) -> Value {
    let rjobs: Vec<Value> = pods
        .iter()
        .map(|(name, pods)| {
            let mut jobs: BTreeMap<i64, Vec<Phase>> = BTreeMap::new();
            for (j, phase) in pods {
                jobs.entry(*j).or_default().push(*phase);
            }
            let count = |f: &dyn Fn(&[Phase]) -> bool| jobs.values().filter(|p| f(p)).count();
            let failed = |p: &[Phase]| p.contains(&Phase::Failed);
            let succeeded = |p: &[Phase]| p.iter().all(|x| *x == Phase::Succeeded);
            json!({
                "name": name,
                "ready": count(&|p| !failed(p) && !succeeded(p) && reached(p, "Ready")),
                "succeeded": count(&succeeded),
                "failed": count(&failed),
                "active": count(&|p| !failed(p) && !succeeded(p)),
                "suspended": 0,
            })
        })
        .collect();
    let mut status = json!({
        "restarts": restarts,
        "replicatedJobsStatus": rjobs,
    });
    if let Some((outcome, now)) = terminal {
        let (type_, reason, message, state) = match outcome {
            Outcome::Completed => (
                "Completed",
                "AllJobsCompleted",
                "jobset completed successfully".to_string(),
                "Completed",
            ),
            Outcome::JobFailed(job) => (
                "Failed",
                "FailedJobs",
                format!(
                    "jobset failed due to one or more job failures: replicated job {job} failed"
                ),
                "Failed",
            ),
            Outcome::Running => return status,
        };
        status["conditions"] = json!([{
            "type": type_,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
        }]);
        status["terminalState"] = state.into();
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_milli_units() {
        assert_eq!(parse_quantity_milli("2").unwrap(), 2000);
        assert_eq!(parse_quantity_milli("500m").unwrap(), 500);
        assert_eq!(parse_quantity_milli("1.5").unwrap(), 1500);
        assert_eq!(
            parse_quantity_milli("4Gi").unwrap(),
            4 * 1_073_741_824 * 1000
        );
        assert_eq!(parse_quantity_milli("1k").unwrap(), 1_000_000);
        assert_eq!(parse_quantity_milli("1e3").unwrap(), 1_000_000);
        assert_eq!(parse_quantity_milli("1n").unwrap(), 1);
        for bad in ["", "x", "1.2.3", "5Q", "--1"] {
            assert!(parse_quantity_milli(bad).is_err(), "{bad}");
        }
    }

    fn jobset() -> Value {
        json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "lr"},
            "spec": {
                "failurePolicy": {"maxRestarts": 2},
                "replicatedJobs": [
                    {"name": "init", "replicas": 1, "template": {"spec": {"parallelism": 1, "template": {"spec": {
                        "containers": [{"name": "init", "command": ["true"]}]}}}}},
                    {"name": "node", "replicas": 1, "dependsOn": [{"name": "init", "status": "Complete"}],
                     "template": {"spec": {"parallelism": 2, "template": {
                        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                        "spec": {"containers": [{
                            "name": "node",
                            "command": ["python3", "-c", "x"],
                            "args": ["--master", "lr-node-0-0.lr:29500"],
                            "ports": [{"containerPort": 29500}],
                            "resources": {"requests": {"cpu": "1", "memory": "512Mi"}},
                            "env": [
                                {"name": "MASTER_ADDR", "value": "lr-node-0-0.lr"},
                                {"name": "MASTER_PORT", "value": "29500"},
                                {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                            ]}]}}}}}
                ]
            }
        })
    }

    #[test]
    fn plans_pods_with_resolved_env_and_local_endpoints() {
        let ports = [(29500, 41234u16)].into();
        let plan = plan(
            "default",
            &jobset(),
            &[],
            &[("TRACEPARENT".into(), "00-x".into())],
            &ports,
        )
        .unwrap();
        assert_eq!(plan.replicated_jobs.len(), 2);
        let node = &plan.replicated_jobs[1];
        assert_eq!(
            node.depends_on,
            vec![("init".to_string(), "Complete".to_string())]
        );
        assert_eq!(node.pods.len(), 2);
        let pod = &node.pods[1];
        assert_eq!(pod.base_name, "lr-node-0-1");
        assert_eq!(pod.labels["jobset.sigs.k8s.io/jobset-name"], "lr");
        assert_eq!(pod.labels[COMPLETION_INDEX], "1");
        assert_eq!(
            pod.labels["trainer.kubeflow.org/trainjob-ancestor-step"],
            "trainer"
        );
        let env: BTreeMap<_, _> = pod.containers[0].env.iter().cloned().collect();
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(env["MASTER_PORT"], "41234");
        assert_eq!(env["RANK"], "1");
        assert_eq!(env["JOB_COMPLETION_INDEX"], "1");
        assert_eq!(env["POD"], "lr-node-0-1");
        assert_eq!(env["TRACEPARENT"], "00-x");
        assert_eq!(
            pod.containers[0].argv,
            ["python3", "-c", "x", "--master", "127.0.0.1:41234"]
        );
        assert_eq!(plan.demand["cpu"], 2000);
        assert_eq!(plan.max_restarts, 2);
        assert!(!plan.success_any);
        assert_eq!(declared_ports(&jobset()), [29500].into());
    }

    #[test]
    fn a_container_without_command_cannot_run() {
        let mut js = jobset();
        js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("command");
        let plan = plan("default", &js, &[], &[], &BTreeMap::new()).unwrap();
        let error = plan.replicated_jobs[0].pods[0].error.clone().unwrap();
        assert!(error.contains("no command"), "{error}");
    }

    #[test]
    fn outcome_follows_success_and_failure() {
        let plan = plan("default", &jobset(), &[], &[], &BTreeMap::new()).unwrap();
        let mut phases = BTreeMap::from([
            ("init".to_string(), vec![Phase::Succeeded]),
            ("node".to_string(), vec![Phase::Succeeded, Phase::Running]),
        ]);
        assert_eq!(outcome(&plan, &phases), Outcome::Running);
        phases.insert("node".into(), vec![Phase::Succeeded, Phase::Succeeded]);
        assert_eq!(outcome(&plan, &phases), Outcome::Completed);
        phases.insert("node".into(), vec![Phase::Succeeded, Phase::Failed]);
        assert_eq!(outcome(&plan, &phases), Outcome::JobFailed("node".into()));
        let pods = BTreeMap::from([(
            "node".to_string(),
            vec![(0, Phase::Succeeded), (0, Phase::Failed)],
        )]);
        let status = jobset_status(&pods, 1, Some((&Outcome::JobFailed("node".into()), "t")));
        assert_eq!(status["replicatedJobsStatus"][0]["failed"], 1);
        assert_eq!(status["replicatedJobsStatus"][0]["succeeded"], 0);
        assert_eq!(status["conditions"][0]["type"], "Failed");
        assert_eq!(status["terminalState"], "Failed");
        assert_eq!(status["restarts"], 1);
        assert!(reached(&[Phase::Running, Phase::Succeeded], "Ready"));
        assert!(!reached(&[Phase::Running, Phase::Succeeded], "Complete"));
    }
}
