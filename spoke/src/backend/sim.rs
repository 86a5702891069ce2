//! A simulated backend: admits what fits in its declared capacity, and
//! completes every started run after a set time without running anything.
//! The load benchmark's spokes and the hub's fault tests use it; real
//! agents speak to the hub through it exactly as with a real backend.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{
    Backend, BackendError, BoxFuture, Capacity, HeldRun, LogStream, PodSetRequest, RunKey,
    RunReport, RunSpec,
};

/// A run the simulated backend holds.
struct Run {
    report: RunReport,
    /// Pod names, for logs.
    pods: Vec<String>,
}

#[derive(Default)]
struct State {
    reserved: HashMap<RunKey, BTreeMap<String, i64>>,
    /// The sum of `reserved`, per resource.
    used: BTreeMap<String, i64>,
    runs: HashMap<RunKey, Run>,
}

impl State {
    fn reserve(&mut self, key: RunKey, demand: BTreeMap<String, i64>) {
        self.unreserve(&key);
        for (r, m) in &demand {
            *self.used.entry(r.clone()).or_default() += m;
        }
        self.reserved.insert(key, demand);
    }

    fn unreserve(&mut self, key: &RunKey) {
        if let Some(demand) = self.reserved.remove(key) {
            for (r, m) in demand {
                if let Some(used) = self.used.get_mut(&r) {
                    *used -= m;
                }
            }
        }
    }
}

/// See the module documentation.
pub struct SimBackend {
    capacity: BTreeMap<String, i64>,
    run_time: Duration,
    reports: mpsc::UnboundedSender<RunReport>,
    /// Told `(namespace/name, when)` as each run starts.
    started: Option<mpsc::UnboundedSender<(String, Instant)>>,
    state: Mutex<State>,
    me: std::sync::Weak<SimBackend>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

impl SimBackend {
    /// `capacity` in milli-units per resource; runs complete `run_time`
    /// after they start.
    pub fn new(
        capacity: BTreeMap<String, i64>,
        run_time: Duration,
        reports: mpsc::UnboundedSender<RunReport>,
        started: Option<mpsc::UnboundedSender<(String, Instant)>>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| SimBackend {
            capacity,
            run_time,
            reports,
            started,
            state: Mutex::new(State::default()),
            me: me.clone(),
        })
    }

    fn free(&self, state: &State) -> BTreeMap<String, i64> {
        let mut free = self.capacity.clone();
        for (r, m) in &state.used {
            if let Some(f) = free.get_mut(r) {
                *f -= m;
            }
        }
        free
    }

    fn emit(&self, key: &RunKey, report: RunReport) {
        if let Some(run) = lock(&self.state).runs.get_mut(key) {
            run.report = report.clone();
        } else {
            return;
        }
        let _ = self.reports.send(report);
    }
}

/// Pods of a JobSet: `(replicated job, job index, completion index)`.
fn pod_plan(jobset: &Value) -> Vec<(String, i64, i64)> {
    let mut pods = Vec::new();
    for rjob in jobset["spec"]["replicatedJobs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = rjob["name"].as_str().unwrap_or("job").to_string();
        let replicas = rjob["replicas"].as_i64().unwrap_or(1).clamp(0, 1000);
        let parallelism = rjob["template"]["spec"]["parallelism"]
            .as_i64()
            .unwrap_or(1)
            .clamp(0, 10_000);
        for job in 0..replicas {
            for index in 0..parallelism {
                pods.push((name.clone(), job, index));
            }
        }
    }
    pods
}

fn pods_json(spec: &RunSpec, plan: &[(String, i64, i64)], phase: &str) -> Vec<Value> {
    plan.iter()
        .map(|(rjob, job, index)| {
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": format!("{}-{rjob}-{job}-{index}-sim{}", spec.name, spec.key.generation),
                    "namespace": spec.namespace,
                    "labels": {
                        "jobset.sigs.k8s.io/jobset-name": spec.name,
                        "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                        "jobset.sigs.k8s.io/job-index": job.to_string(),
                        "batch.kubernetes.io/job-completion-index": index.to_string(),
                    },
                },
                "spec": {"containers": [{"name": rjob, "image": "simulated"}]},
                "status": {"phase": phase},
            })
        })
        .collect()
}

fn jobs_status(plan: &[(String, i64, i64)], done: bool) -> Value {
    let mut per: BTreeMap<&str, i64> = BTreeMap::new();
    for (rjob, _, _) in plan {
        *per.entry(rjob).or_default() += 1;
    }
    Value::Array(
        per.into_iter()
            .map(|(name, n)| {
                json!({
                    "name": name,
                    "ready": if done { 0 } else { n },
                    "succeeded": if done { n } else { 0 },
                    "failed": 0,
                    "active": if done { 0 } else { n },
                    "suspended": 0,
                })
            })
            .collect(),
    )
}

impl Backend for SimBackend {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn capacity(&self) -> Vec<Capacity> {
        let state = lock(&self.state);
        let free = self.free(&state);
        self.capacity
            .iter()
            .map(|(r, a)| Capacity {
                resource: r.clone(),
                allocatable_milli: *a,
                free_milli: free.get(r).copied().unwrap_or(0),
            })
            .collect()
    }

    fn admit(&self, key: &RunKey, pod_sets: &[PodSetRequest]) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        if state.reserved.contains_key(key) || state.runs.contains_key(key) {
            return Ok(());
        }
        let mut demand: BTreeMap<String, i64> = BTreeMap::new();
        for set in pod_sets {
            for (r, m) in &set.requests_milli {
                *demand.entry(r.clone()).or_default() += m.saturating_mul(i64::from(set.count));
            }
        }
        let free = self.free(&state);
        for (r, m) in &demand {
            if *m > free.get(r).copied().unwrap_or(0) {
                return Err(BackendError::DoesNotFit(format!(
                    "{r}: {m}m requested, {}m free",
                    free.get(r).copied().unwrap_or(0)
                )));
            }
        }
        state.reserve(key.clone(), demand);
        Ok(())
    }

    fn withdraw(&self, key: &RunKey) {
        let mut state = lock(&self.state);
        if !state.runs.contains_key(key) {
            state.unreserve(key);
        }
    }

    fn start(&self, spec: RunSpec) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let key = spec.key.clone();
            let Some(jobset) = spec.objects.first() else {
                return Err(BackendError::Invalid("no objects to run".into()));
            };
            let plan = pod_plan(jobset);
            let running = RunReport {
                key: key.clone(),
                jobset_status: json!({"replicatedJobsStatus": jobs_status(&plan, false)}),
                pods: pods_json(&spec, &plan, "Running"),
                finished: false,
                events: Vec::new(),
            };
            {
                let mut state = lock(&self.state);
                if state.runs.contains_key(&key) {
                    return Ok(());
                }
                if !state.reserved.contains_key(&key) {
                    state.reserve(key.clone(), BTreeMap::new());
                }
                state.runs.insert(
                    key.clone(),
                    Run {
                        report: running.clone(),
                        pods: running
                            .pods
                            .iter()
                            .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
                            .collect(),
                    },
                );
            }
            if let Some(started) = &self.started {
                let _ = started.send((format!("{}/{}", spec.namespace, spec.name), Instant::now()));
            }
            self.emit(&key, running);
            let Some(me) = self.me.upgrade() else {
                return Ok(());
            };
            let run_time = self.run_time;
            tokio::spawn(async move {
                tokio::time::sleep(run_time).await;
                let done = RunReport {
                    key: key.clone(),
                    jobset_status: json!({
                        "conditions": [{
                            "type": "Completed",
                            "status": "True",
                            "reason": "AllJobsCompleted",
                            "message": "jobset completed successfully",
                            "lastTransitionTime": now(),
                        }],
                        "replicatedJobsStatus": jobs_status(&plan, true),
                        "terminalState": "Completed",
                    }),
                    pods: pods_json(&spec, &plan, "Succeeded"),
                    finished: true,
                    events: Vec::new(),
                };
                lock(&me.state).unreserve(&key);
                me.emit(&key, done);
            });
            Ok(())
        })
    }

    fn stop(&self, run_id: &str, generation: i64) -> BoxFuture<'_, ()> {
        let run_id = run_id.to_string();
        Box::pin(async move {
            let mut state = lock(&self.state);
            state
                .runs
                .retain(|k, _| !(k.run_id == run_id && k.generation <= generation));
            let gone: Vec<RunKey> = state
                .reserved
                .keys()
                .filter(|k| k.run_id == run_id && k.generation <= generation)
                .cloned()
                .collect();
            for key in &gone {
                state.unreserve(key);
            }
        })
    }

    fn runs(&self) -> Vec<HeldRun> {
        let state = lock(&self.state);
        let mut held: Vec<HeldRun> = state
            .runs
            .iter()
            .map(|(k, r)| HeldRun {
                key: k.clone(),
                finished: r.report.finished,
                lost: None,
            })
            .collect();
        held.extend(
            state
                .reserved
                .keys()
                .filter(|k| !state.runs.contains_key(*k))
                .map(|k| HeldRun {
                    key: k.clone(),
                    finished: false,
                    lost: None,
                }),
        );
        held
    }

    fn reservations(&self) -> Vec<RunKey> {
        let state = lock(&self.state);
        state
            .reserved
            .keys()
            .filter(|k| !state.runs.contains_key(*k))
            .cloned()
            .collect()
    }

    fn report(&self, key: &RunKey) -> Option<RunReport> {
        lock(&self.state).runs.get(key).map(|r| r.report.clone())
    }

    fn logs(
        &self,
        run_id: &str,
        pod: &str,
        _container: Option<&str>,
        _follow: bool,
        _tail_lines: Option<i64>,
    ) -> BoxFuture<'_, Result<LogStream, BackendError>> {
        let found = lock(&self.state)
            .runs
            .iter()
            .any(|(k, r)| k.run_id == run_id && r.pods.iter().any(|p| p == pod));
        let line = format!("simulated pod {pod}\n");
        let missing = format!("pod {pod}");
        Box::pin(async move {
            if !found {
                return Err(BackendError::NotFound(missing));
            }
            let stream = futures_util::stream::iter([Ok(bytes::Bytes::from(line))]);
            Ok(Box::pin(stream) as LogStream)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(run: &str, generation: i64) -> RunKey {
        RunKey {
            run_id: run.into(),
            generation,
        }
    }

    fn cpu(milli: i64, count: u32) -> Vec<PodSetRequest> {
        vec![PodSetRequest {
            name: "node".into(),
            count,
            requests_milli: BTreeMap::from([("cpu".to_string(), milli)]),
        }]
    }

    fn free_cpu(sim: &SimBackend) -> i64 {
        sim.capacity()
            .iter()
            .find(|c| c.resource == "cpu")
            .map_or(-1, |c| c.free_milli)
    }

    /// What is reserved is taken from what is free, and given back by a
    /// withdrawal or a stop, whichever order they come in.
    #[tokio::test]
    async fn reservations_take_capacity_and_withdrawals_and_stops_give_it_back() {
        let (reports, _rx) = mpsc::unbounded_channel();
        let sim = SimBackend::new(
            BTreeMap::from([("cpu".to_string(), 4000)]),
            Duration::from_secs(60),
            reports,
            None,
        );
        sim.admit(&key("a", 1), &cpu(1000, 2)).expect("a fits");
        sim.admit(&key("b", 1), &cpu(1500, 1)).expect("b fits");
        assert_eq!(free_cpu(&sim), 500);
        assert!(matches!(
            sim.admit(&key("c", 1), &cpu(1000, 1)),
            Err(BackendError::DoesNotFit(_))
        ));
        // Admitting a held reservation again changes nothing.
        sim.admit(&key("a", 1), &cpu(1000, 2)).expect("again");
        assert_eq!(free_cpu(&sim), 500);
        sim.withdraw(&key("a", 1));
        assert_eq!(free_cpu(&sim), 2500);
        sim.withdraw(&key("a", 1));
        assert_eq!(
            free_cpu(&sim),
            2500,
            "a second withdrawal gives nothing back"
        );
        sim.stop("b", 1).await;
        assert_eq!(free_cpu(&sim), 4000);
        sim.admit(&key("c", 1), &cpu(1000, 4)).expect("c fits now");
        assert_eq!(free_cpu(&sim), 0);
    }
}
