//! The JobSet, Job and kubelet logic of one run as a state machine over pod
//! events: which pods to start, when a Job succeeds or fails, restarts, the
//! JobSet's terminal state, and the status and Pod objects reported. No I/O:
//! time and fresh names come in as arguments.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::devices::DEVICES_ANNOTATION;
use super::plan::{DependsOnStatus, FailureAction, RunPlan};
use super::rewrite::LOCAL_IP;

/// JobSet condition types, reasons and messages, as upstream spells them.
pub mod conditions {
    pub const COMPLETED: &str = "Completed";
    pub const FAILED: &str = "Failed";
    pub const ALL_JOBS_COMPLETED_REASON: &str = "AllJobsCompleted";
    pub const ALL_JOBS_COMPLETED_MESSAGE: &str = "jobset completed successfully";
    pub const FAILED_JOBS_REASON: &str = "FailedJobs";
    pub const FAILED_JOBS_MESSAGE: &str = "jobset failed due to one or more job failures";
    pub const REACHED_MAX_RESTARTS_REASON: &str = "ReachedMaxRestarts";
    pub const REACHED_MAX_RESTARTS_MESSAGE: &str =
        "jobset failed due to reaching max number of restarts";
    pub const FAIL_JOBSET_ACTION_REASON: &str = "FailJobSetFailurePolicyAction";
    pub const FAIL_JOBSET_ACTION_MESSAGE: &str = "applying FailJobSet failure policy action";
    /// The Job controller's reason for a Job with too many failed pods.
    pub const BACKOFF_LIMIT_EXCEEDED_REASON: &str = "BackoffLimitExceeded";
    pub const BACKOFF_LIMIT_EXCEEDED_MESSAGE: &str = "Job has reached the specified backoff limit";
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
    fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }

    fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// A container's state, as in `containerStatuses[].state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated {
        exit_code: i32,
        signal: Option<i32>,
        reason: String,
        message: Option<String>,
        started_at: Option<Timestamp>,
        finished_at: Timestamp,
    },
}

impl ContainerState {
    fn is_terminated(&self) -> bool {
        matches!(self, ContainerState::Terminated { .. })
    }

    fn started_at(&self) -> Option<Timestamp> {
        match self {
            ContainerState::Running { started_at } => Some(*started_at),
            ContainerState::Terminated { started_at, .. } => *started_at,
            ContainerState::Waiting { .. } => None,
        }
    }

    fn to_json(&self) -> Value {
        match self {
            ContainerState::Waiting { reason, message } => {
                let mut w = json!({"reason": reason});
                if let Some(m) = message {
                    w["message"] = json!(m);
                }
                json!({"waiting": w})
            }
            ContainerState::Running { started_at } => {
                json!({"running": {"startedAt": time(*started_at)}})
            }
            ContainerState::Terminated {
                exit_code,
                signal,
                reason,
                message,
                started_at,
                finished_at,
            } => {
                let mut t = json!({
                    "exitCode": exit_code,
                    "reason": reason,
                    "finishedAt": time(*finished_at),
                });
                if let Some(s) = signal {
                    t["signal"] = json!(s);
                }
                if let Some(m) = message {
                    t["message"] = json!(m);
                }
                if let Some(s) = started_at {
                    t["startedAt"] = json!(time(*s));
                }
                json!({"terminated": t})
            }
        }
    }
}

/// RFC 3339 at second precision, as Kubernetes writes times.
pub fn time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Which container of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerRef {
    Init(usize),
    Main(usize),
}

/// What a pod's processes did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodEvent {
    Started {
        uid: String,
        container: ContainerRef,
        at: Timestamp,
    },
    /// A container ended (or could not start: `reason` `StartError`).
    Exited {
        uid: String,
        container: ContainerRef,
        exit_code: i32,
        signal: Option<i32>,
        reason: Option<String>,
        message: Option<String>,
        at: Timestamp,
    },
    /// The pod cannot run at all (its env or volumes cannot be resolved).
    CannotRun {
        uid: String,
        message: String,
        at: Timestamp,
    },
}

/// One pod of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub uid: String,
    pub name: String,
    pub rjob: usize,
    /// Position of its Job in the run's job list.
    pub job: usize,
    pub job_index: u32,
    pub index: u32,
    pub restarts: i32,
    pub created: Timestamp,
    /// Its processes were asked to start.
    pub launched: bool,
    /// Deleted (by a Job failure, a restart or the end of the JobSet): not
    /// reported, its events ignored.
    pub deleted: bool,
    pub phase: Phase,
    pub start_time: Option<Timestamp>,
    pub init: Vec<ContainerState>,
    pub main: Vec<ContainerState>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// The GPUs (UUIDs) it holds, shown as [`DEVICES_ANNOTATION`].
    pub devices: Vec<String>,
    /// Its failure was counted towards the Job's backoff limit.
    counted: bool,
}

impl Pod {
    /// Pending or Running, launched and not deleted: holds processes.
    pub fn is_active(&self) -> bool {
        self.launched && !self.deleted && !self.phase.is_terminal()
    }

    fn is_ready(&self) -> bool {
        self.phase == Phase::Running
            && self
                .main
                .iter()
                .all(|c| matches!(c, ContainerState::Running { .. }))
    }

    /// Whether a container (by name) has ended or never will.
    pub fn container_ended(&self, c: ContainerRef) -> bool {
        if self.deleted || self.phase.is_terminal() {
            return true;
        }
        match c {
            ContainerRef::Init(i) => self.init.get(i),
            ContainerRef::Main(i) => self.main.get(i),
        }
        .is_none_or(ContainerState::is_terminated)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum JobOutcome {
    Succeeded,
    Failed { at: Timestamp },
}

#[derive(Debug, Clone, PartialEq)]
struct Job {
    rjob: usize,
    index: u32,
    /// Its dependencies were met once: the Job exists.
    created: bool,
    failed_pods: u32,
    outcome: Option<JobOutcome>,
}

/// Counts of one replicated job, as in `replicatedJobsStatus`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub ready: i32,
    pub succeeded: i32,
    pub failed: i32,
    pub active: i32,
}

/// Gives a pod a fresh name suffix and uid.
pub type Fresh<'a> = &'a mut dyn FnMut() -> (String, String);

/// One run's JobSet as the controllers would see it.
#[derive(Debug, Clone)]
pub struct RunState {
    plan: Arc<RunPlan>,
    pods: Vec<Pod>,
    jobs: Vec<Job>,
    restarts: i32,
    restarts_towards_max: i32,
    conditions: Vec<Value>,
    terminal: Option<&'static str>,
}

impl RunState {
    /// The run at its start: every Job and pod created, none launched.
    pub fn new(plan: Arc<RunPlan>, now: Timestamp, fresh: Fresh<'_>) -> Self {
        let mut state = Self {
            plan,
            pods: Vec::new(),
            jobs: Vec::new(),
            restarts: 0,
            restarts_towards_max: 0,
            conditions: Vec::new(),
            terminal: None,
        };
        state.create_jobs(now, fresh);
        state
    }

    fn create_jobs(&mut self, now: Timestamp, fresh: Fresh<'_>) {
        self.jobs.clear();
        self.pods.clear();
        let plan = Arc::clone(&self.plan);
        for (r, rjob) in plan.replicated_jobs.iter().enumerate() {
            for j in 0..rjob.replicas {
                self.jobs.push(Job {
                    rjob: r,
                    index: j,
                    created: false,
                    failed_pods: 0,
                    outcome: None,
                });
                for p in 0..rjob.completions {
                    self.add_pod(r, self.jobs.len() - 1, j, p, now, fresh);
                }
            }
        }
    }

    fn add_pod(
        &mut self,
        rjob: usize,
        job: usize,
        job_index: u32,
        index: u32,
        now: Timestamp,
        fresh: Fresh<'_>,
    ) {
        let (suffix, uid) = fresh();
        let r = &self.plan.replicated_jobs[rjob];
        let waiting = |reason: &str| ContainerState::Waiting {
            reason: reason.to_owned(),
            message: None,
        };
        let main_reason = if r.init_containers.is_empty() {
            "ContainerCreating"
        } else {
            "PodInitializing"
        };
        self.pods.push(Pod {
            uid,
            name: format!("{}-{suffix}", self.plan.hostname(rjob, job_index, index)),
            rjob,
            job,
            job_index,
            index,
            restarts: self.restarts,
            created: now,
            launched: false,
            deleted: false,
            phase: Phase::Pending,
            start_time: None,
            init: r
                .init_containers
                .iter()
                .map(|_| waiting("PodInitializing"))
                .collect(),
            main: r.containers.iter().map(|_| waiting(main_reason)).collect(),
            reason: None,
            message: None,
            devices: Vec::new(),
            counted: false,
        });
    }

    pub fn plan(&self) -> &Arc<RunPlan> {
        &self.plan
    }

    /// Every pod, deleted ones included.
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    pub fn restarts(&self) -> i32 {
        self.restarts
    }

    /// Completed or Failed.
    pub fn terminal_state(&self) -> Option<&'static str> {
        self.terminal
    }

    /// Pods to start now (marked launched): their Job exists (dependencies
    /// met) and has fewer than `parallelism` active pods.
    pub fn to_launch(&mut self) -> Vec<usize> {
        if self.terminal.is_some() {
            return Vec::new();
        }
        let counts = self.counts();
        for j in 0..self.jobs.len() {
            if !self.jobs[j].created && self.dependencies_met(self.jobs[j].rjob, &counts) {
                self.jobs[j].created = true;
            }
        }
        let mut active: BTreeMap<usize, u32> = BTreeMap::new();
        for pod in self.pods.iter().filter(|p| p.is_active()) {
            *active.entry(pod.job).or_default() += 1;
        }
        let mut out = Vec::new();
        for (i, pod) in self.pods.iter_mut().enumerate() {
            let job = &self.jobs[pod.job];
            if pod.launched || pod.deleted || !job.created || job.outcome.is_some() {
                continue;
            }
            let running = active.entry(pod.job).or_default();
            if *running >= self.plan.replicated_jobs[pod.rjob].parallelism {
                continue;
            }
            *running += 1;
            pod.launched = true;
            out.push(i);
        }
        out
    }

    /// Pod `i`, handed out by [`Self::to_launch`], waits (for its GPUs):
    /// the next call hands it out again.
    pub fn hold_back(&mut self, i: usize) {
        if let Some(pod) = self.pods.get_mut(i) {
            pod.launched = false;
        }
    }

    /// Pod `i` holds `devices`.
    pub fn set_devices(&mut self, i: usize, devices: Vec<String>) {
        if let Some(pod) = self.pods.get_mut(i) {
            pod.devices = devices;
        }
    }

    fn dependencies_met(&self, rjob: usize, counts: &[Counts]) -> bool {
        let plan = &self.plan.replicated_jobs[rjob];
        plan.depends_on.iter().all(|(dep, status)| {
            let replicas = self.plan.replicated_jobs[*dep].replicas as i32;
            let c = counts[*dep];
            match status {
                DependsOnStatus::Complete => c.succeeded == replicas,
                DependsOnStatus::Ready => c.ready + c.succeeded + c.failed == replicas,
            }
        })
    }

    /// Applies what a pod's processes did; false if it changed nothing (an
    /// event of a deleted or unknown pod).
    pub fn apply(&mut self, event: PodEvent) -> bool {
        let uid = match &event {
            PodEvent::Started { uid, .. }
            | PodEvent::Exited { uid, .. }
            | PodEvent::CannotRun { uid, .. } => uid,
        };
        let Some(pod) = self.pods.iter_mut().find(|p| &p.uid == uid && !p.deleted) else {
            return false;
        };
        if pod.phase.is_terminal() {
            return false;
        }
        match event {
            PodEvent::Started { container, at, .. } => {
                pod.start_time.get_or_insert(at);
                let slot = match container {
                    ContainerRef::Init(i) => pod.init.get_mut(i),
                    ContainerRef::Main(i) => {
                        pod.phase = Phase::Running;
                        pod.main.get_mut(i)
                    }
                };
                if let Some(slot) = slot {
                    *slot = ContainerState::Running { started_at: at };
                }
            }
            PodEvent::Exited {
                container,
                exit_code,
                signal,
                reason,
                message,
                at,
                ..
            } => {
                pod.start_time.get_or_insert(at);
                let slot = match container {
                    ContainerRef::Init(i) => pod.init.get_mut(i),
                    ContainerRef::Main(i) => pod.main.get_mut(i),
                };
                if let Some(slot) = slot {
                    let started_at = slot.started_at();
                    *slot = ContainerState::Terminated {
                        exit_code,
                        signal,
                        reason: reason.unwrap_or_else(|| {
                            if exit_code == 0 { "Completed" } else { "Error" }.to_owned()
                        }),
                        message,
                        started_at,
                        finished_at: at,
                    };
                }
                match container {
                    ContainerRef::Init(_) if exit_code != 0 => pod.phase = Phase::Failed,
                    ContainerRef::Init(_) => {}
                    ContainerRef::Main(_) => {
                        if pod.main.iter().all(ContainerState::is_terminated) {
                            let ok = pod.main.iter().all(|c| {
                                matches!(c, ContainerState::Terminated { exit_code: 0, .. })
                            });
                            pod.phase = if ok { Phase::Succeeded } else { Phase::Failed };
                        }
                    }
                }
            }
            PodEvent::CannotRun { message, at, .. } => {
                pod.start_time.get_or_insert(at);
                pod.phase = Phase::Failed;
                for c in pod.init.iter_mut().chain(pod.main.iter_mut()) {
                    if !c.is_terminated() {
                        *c = ContainerState::Waiting {
                            reason: "CreateContainerConfigError".into(),
                            message: Some(message.clone()),
                        };
                    }
                }
                pod.reason = Some("CreateContainerConfigError".into());
                pod.message = Some(message);
            }
        }
        true
    }

    /// Runs the Job and JobSet controllers over the current pods: replaces
    /// failed pods within a Job's backoff limit, fails or completes Jobs,
    /// then restarts, fails or completes the JobSet. Returns the uids of the
    /// pods whose processes must be killed.
    pub fn evaluate(&mut self, now: Timestamp, fresh: Fresh<'_>) -> Vec<String> {
        let mut kill = Vec::new();
        if self.terminal.is_some() {
            return kill;
        }
        // The Job controller.
        for j in 0..self.jobs.len() {
            if self.jobs[j].outcome.is_some() {
                continue;
            }
            let rjob = self.jobs[j].rjob;
            let limit = self.plan.replicated_jobs[rjob].backoff_limit;
            let mut replace = Vec::new();
            for pod in self.pods.iter_mut().filter(|p| p.job == j && !p.deleted) {
                if pod.phase == Phase::Failed && !pod.counted {
                    pod.counted = true;
                    self.jobs[j].failed_pods += 1;
                    replace.push(pod.index);
                }
            }
            if self.jobs[j].failed_pods > limit {
                self.jobs[j].outcome = Some(JobOutcome::Failed { at: now });
                for pod in self.pods.iter_mut().filter(|p| p.job == j && !p.deleted) {
                    if pod.is_active() {
                        kill.push(pod.uid.clone());
                    }
                    if !pod.phase.is_terminal() {
                        pod.deleted = true;
                    }
                }
                continue;
            }
            let job_index = self.jobs[j].index;
            for index in replace {
                self.add_pod(rjob, j, job_index, index, now, fresh);
            }
            let completions = self.plan.replicated_jobs[rjob].completions;
            let all_done = (0..completions).all(|index| {
                self.pods.iter().any(|p| {
                    p.job == j && p.index == index && !p.deleted && p.phase == Phase::Succeeded
                })
            });
            if all_done {
                self.jobs[j].outcome = Some(JobOutcome::Succeeded);
            }
        }

        // The JobSet controller: failures first, then the success policy.
        let first_failed = self
            .jobs
            .iter()
            .filter_map(|job| match job.outcome {
                Some(JobOutcome::Failed { at }) => Some((at, job)),
                _ => None,
            })
            .min_by_key(|(at, _)| *at)
            .map(|(_, job)| (job.rjob, self.plan.job_name(job.rjob, job.index)));
        if let Some((failed_rjob, failed_job)) = first_failed {
            use conditions as c;
            let with_job = |message: &str| format!("{message} (first failed job: {failed_job})");
            match &self.plan.failure {
                None => self.finish(
                    c::FAILED,
                    c::FAILED_JOBS_REASON,
                    with_job(c::FAILED_JOBS_MESSAGE),
                    now,
                ),
                Some(policy) => {
                    let rjob_name = &self.plan.replicated_jobs[failed_rjob].name;
                    let action = policy
                        .rules
                        .iter()
                        .find(|rule| {
                            (rule.on_job_failure_reasons.is_empty()
                                || rule
                                    .on_job_failure_reasons
                                    .iter()
                                    .any(|r| r == c::BACKOFF_LIMIT_EXCEEDED_REASON))
                                && (rule.target_replicated_jobs.is_empty()
                                    || rule.target_replicated_jobs.contains(rjob_name))
                        })
                        .map_or(FailureAction::RestartJobSet, |rule| rule.action);
                    match action {
                        FailureAction::FailJobSet => self.finish(
                            c::FAILED,
                            c::FAIL_JOBSET_ACTION_REASON,
                            with_job(c::FAIL_JOBSET_ACTION_MESSAGE),
                            now,
                        ),
                        FailureAction::RestartJobSet
                            if self.restarts_towards_max >= policy.max_restarts =>
                        {
                            self.finish(
                                c::FAILED,
                                c::REACHED_MAX_RESTARTS_REASON,
                                with_job(c::REACHED_MAX_RESTARTS_MESSAGE),
                                now,
                            )
                        }
                        FailureAction::RestartJobSet
                        | FailureAction::RestartJobSetAndIgnoreMaxRestarts => {
                            kill.extend(
                                self.pods
                                    .iter()
                                    .filter(|p| p.is_active())
                                    .map(|p| p.uid.clone()),
                            );
                            self.restarts += 1;
                            if action == FailureAction::RestartJobSet {
                                self.restarts_towards_max += 1;
                            }
                            self.create_jobs(now, fresh);
                            return kill;
                        }
                    }
                }
            }
        } else {
            let succeeded = |rjob: usize| {
                self.jobs
                    .iter()
                    .filter(|j| j.rjob == rjob && j.outcome == Some(JobOutcome::Succeeded))
                    .count()
            };
            let success = &self.plan.success;
            let done = if success.any {
                success.targets.iter().any(|r| succeeded(*r) > 0)
            } else {
                success
                    .targets
                    .iter()
                    .all(|r| succeeded(*r) == self.plan.replicated_jobs[*r].replicas as usize)
            };
            if done {
                self.finish(
                    conditions::COMPLETED,
                    conditions::ALL_JOBS_COMPLETED_REASON,
                    conditions::ALL_JOBS_COMPLETED_MESSAGE.to_owned(),
                    now,
                );
            }
        }
        if self.terminal.is_some() {
            // The JobSet controller deletes the Jobs still active.
            for pod in self
                .pods
                .iter_mut()
                .filter(|p| !p.deleted && !p.phase.is_terminal())
            {
                if pod.is_active() {
                    kill.push(pod.uid.clone());
                }
                pod.deleted = true;
            }
        }
        kill
    }

    fn finish(&mut self, state: &'static str, reason: &str, message: String, now: Timestamp) {
        self.conditions.push(json!({
            "type": state,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": time(now),
        }));
        self.terminal = Some(state);
    }

    /// Counts per replicated job.
    pub fn counts(&self) -> Vec<Counts> {
        let mut counts = vec![Counts::default(); self.plan.replicated_jobs.len()];
        for (j, job) in self.jobs.iter().enumerate() {
            let c = &mut counts[job.rjob];
            match job.outcome {
                Some(JobOutcome::Succeeded) => c.succeeded += 1,
                Some(JobOutcome::Failed { .. }) => c.failed += 1,
                None if job.created => {
                    let pods = || self.pods.iter().filter(move |p| p.job == j && !p.deleted);
                    if pods().any(|p| p.launched && !p.phase.is_terminal()) {
                        c.active += 1;
                    }
                    let ready = pods()
                        .filter(|p| p.is_ready() || p.phase == Phase::Succeeded)
                        .count();
                    if ready as u32 >= self.plan.replicated_jobs[job.rjob].parallelism {
                        c.ready += 1;
                    }
                }
                None => {}
            }
        }
        counts
    }

    /// The JobSet's `.status`.
    pub fn status_json(&self) -> Value {
        let replicated: Vec<Value> = self
            .counts()
            .iter()
            .zip(&self.plan.replicated_jobs)
            .map(|(c, r)| {
                json!({
                    "name": r.name,
                    "ready": c.ready,
                    "succeeded": c.succeeded,
                    "failed": c.failed,
                    "active": c.active,
                    "suspended": 0,
                })
            })
            .collect();
        let mut status = json!({
            "conditions": self.conditions,
            "restarts": self.restarts,
            "restartsCountTowardsMax": self.restarts_towards_max,
            "replicatedJobsStatus": replicated,
        });
        if let Some(t) = self.terminal {
            status["terminalState"] = json!(t);
        }
        status
    }

    /// Every pod not deleted, as a Kubernetes Pod.
    pub fn pods_json(&self, node: &str) -> Vec<Value> {
        self.pods
            .iter()
            .filter(|p| !p.deleted)
            .map(|p| self.pod_json(p, node))
            .collect()
    }

    fn pod_json(&self, pod: &Pod, node: &str) -> Value {
        let plan = &self.plan;
        let r = &plan.replicated_jobs[pod.rjob];
        let (labels, mut annotations) =
            plan.pod_meta(pod.rjob, pod.job_index, pod.index, pod.restarts);
        if !pod.devices.is_empty() {
            annotations.insert(DEVICES_ANNOTATION.to_owned(), pod.devices.join(","));
        }
        let statuses =
            |containers: &[super::plan::Container], states: &[ContainerState]| -> Vec<Value> {
                containers
                    .iter()
                    .zip(states)
                    .map(|(c, s)| {
                        json!({
                            "name": c.name,
                            "image": c.image.clone().unwrap_or_default(),
                            "imageID": "",
                            "ready": matches!(s, ContainerState::Running { .. }),
                            "started": matches!(s, ContainerState::Running { .. }),
                            "restartCount": 0,
                            "state": s.to_json(),
                        })
                    })
                    .collect()
            };
        let initialized = pod
            .init
            .iter()
            .all(|c| matches!(c, ContainerState::Terminated { exit_code: 0, .. }))
            && pod.launched;
        let ready = pod.is_ready();
        let condition =
            |t: &str, ok: bool| json!({"type": t, "status": if ok { "True" } else { "False" }});
        let mut status = json!({
            "phase": pod.phase.as_str(),
            "conditions": [
                condition("PodScheduled", pod.launched),
                condition("Initialized", initialized),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "hostIP": LOCAL_IP,
            "hostIPs": [{"ip": LOCAL_IP}],
            "podIP": LOCAL_IP,
            "podIPs": [{"ip": LOCAL_IP}],
            "containerStatuses": statuses(&r.containers, &pod.main),
        });
        if !r.init_containers.is_empty() {
            status["initContainerStatuses"] = json!(statuses(&r.init_containers, &pod.init));
        }
        if let Some(t) = pod.start_time {
            status["startTime"] = json!(time(t));
        }
        if let Some(reason) = &pod.reason {
            status["reason"] = json!(reason);
        }
        if let Some(message) = &pod.message {
            status["message"] = json!(message);
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": plan.namespace,
                "uid": pod.uid,
                "creationTimestamp": time(pod.created),
                "labels": labels,
                "annotations": annotations,
            },
            "spec": plan.pod_spec(pod.rjob, pod.job_index, pod.index, node),
            "status": status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::process::plan::plan_run;

    fn jobset(extra: Value, rjobs: Value) -> Arc<RunPlan> {
        let mut js = json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "j"}, "spec": {"replicatedJobs": rjobs}
        });
        if let (Value::Object(spec), Value::Object(extra)) = (&mut js["spec"], extra) {
            spec.extend(extra);
        }
        Arc::new(plan_run("ns", "j", &[js]).unwrap())
    }

    fn rjob(name: &str, pods: u32, backoff: u32, depends: Value) -> Value {
        json!({"name": name, "dependsOn": depends, "template": {"spec": {
            "parallelism": pods, "completions": pods, "backoffLimit": backoff,
            "template": {"spec": {"containers": [{"name": "c", "command": ["true"]}]}}}}})
    }

    struct Run {
        state: RunState,
        n: u32,
        t: Timestamp,
    }

    impl Run {
        fn new(plan: Arc<RunPlan>) -> Self {
            let mut n = 0;
            let t = Timestamp::from_second(1_700_000_000).unwrap();
            let state = RunState::new(plan, t, &mut || {
                n += 1;
                (format!("s{n}"), format!("u{n}"))
            });
            Self { state, n, t }
        }
        fn eval(&mut self) -> Vec<String> {
            let n = &mut self.n;
            self.state.evaluate(self.t, &mut || {
                *n += 1;
                (format!("s{n}"), format!("u{n}"))
            })
        }
        fn uid(&self, i: usize) -> String {
            self.state.pods()[i].uid.clone()
        }
        fn run(&mut self, i: usize) {
            let at = self.t;
            assert!(self.state.apply(PodEvent::Started {
                uid: self.uid(i),
                container: ContainerRef::Main(0),
                at
            }));
        }
        fn exit(&mut self, i: usize, code: i32) {
            let at = self.t;
            self.state.apply(PodEvent::Exited {
                uid: self.uid(i),
                container: ContainerRef::Main(0),
                exit_code: code,
                signal: None,
                reason: None,
                message: None,
                at,
            });
        }
        fn status(&self) -> Value {
            self.state.status_json()
        }
    }

    #[test]
    fn a_pod_held_back_for_gpus_is_handed_out_again_and_shows_its_devices() {
        let mut run = Run::new(jobset(json!({}), json!([rjob("node", 2, 0, json!([]))])));
        assert_eq!(run.state.to_launch(), vec![0, 1]);
        run.state.hold_back(1);
        let scheduled = |run: &Run, i: usize| {
            run.state.pods_json("n")[i]["status"]["conditions"][0]["status"].clone()
        };
        assert_eq!(scheduled(&run, 1), "False");
        run.state
            .set_devices(0, vec!["GPU-a".into(), "GPU-b".into()]);
        let pods = run.state.pods_json("n");
        assert_eq!(
            pods[0]["metadata"]["annotations"][DEVICES_ANNOTATION],
            "GPU-a,GPU-b"
        );
        assert!(pods[1]["metadata"]["annotations"][DEVICES_ANNOTATION].is_null());
        assert_eq!(run.state.to_launch(), vec![1]);
        assert_eq!(scheduled(&run, 1), "True");
    }

    #[test]
    fn two_pods_succeed_and_the_jobset_completes() {
        let mut run = Run::new(jobset(json!({}), json!([rjob("node", 2, 0, json!([]))])));
        assert_eq!(run.state.to_launch(), vec![0, 1]);
        assert_eq!(run.state.pods()[0].name, "j-node-0-0-s1");
        run.run(0);
        run.run(1);
        assert!(run.eval().is_empty());
        assert_eq!(run.status()["replicatedJobsStatus"][0]["ready"], 1);
        assert_eq!(run.status()["replicatedJobsStatus"][0]["active"], 1);
        run.exit(0, 0);
        run.eval();
        assert_eq!(run.state.terminal_state(), None);
        run.exit(1, 0);
        run.eval();
        let status = run.status();
        assert_eq!(status["terminalState"], "Completed");
        assert_eq!(status["conditions"][0]["type"], "Completed");
        assert_eq!(status["conditions"][0]["reason"], "AllJobsCompleted");
        assert_eq!(
            status["conditions"][0]["lastTransitionTime"],
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(status["replicatedJobsStatus"][0]["succeeded"], 1);
        let pods = run.state.pods_json("box");
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[1]["status"]["phase"], "Succeeded");
        assert_eq!(
            pods[1]["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
            "Completed"
        );
        assert_eq!(
            pods[1]["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"],
            "1"
        );
    }

    #[test]
    fn a_failed_pod_restarts_the_jobset_then_fails_it() {
        let plan = jobset(
            json!({"failurePolicy": {"maxRestarts": 1}}),
            json!([rjob("node", 2, 0, json!([]))]),
        );
        let mut run = Run::new(plan);
        run.state.to_launch();
        run.run(0);
        run.run(1);
        run.exit(1, 3);
        let kill = run.eval();
        assert_eq!(kill, vec!["u1".to_string()], "the surviving pod is killed");
        assert_eq!(run.status()["restarts"], 1);
        assert_eq!(run.status()["restartsCountTowardsMax"], 1);
        let pods = run.state.pods_json("box");
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0]["metadata"]["name"], "j-node-0-0-s3", "fresh names");
        assert_eq!(
            pods[0]["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"],
            "1"
        );
        // Stale events of the old pods are ignored.
        assert!(!run.state.apply(PodEvent::CannotRun {
            uid: "u1".into(),
            message: "x".into(),
            at: run.t
        }));

        assert_eq!(run.state.to_launch(), vec![0, 1]);
        run.run(0);
        run.exit(0, 1);
        let kill = run.eval();
        assert_eq!(kill, vec!["u4".to_string()]);
        let status = run.status();
        assert_eq!(status["terminalState"], "Failed");
        assert_eq!(status["conditions"][0]["reason"], "ReachedMaxRestarts");
        assert_eq!(
            status["conditions"][0]["message"],
            "jobset failed due to reaching max number of restarts (first failed job: j-node-0)"
        );
        assert_eq!(status["replicatedJobsStatus"][0]["failed"], 1);
        // The failed pod stays, the killed one is deleted.
        let pods = run.state.pods_json("box");
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0]["status"]["phase"], "Failed");
        assert_eq!(
            pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            1
        );
        assert!(run.state.to_launch().is_empty());
    }

    #[test]
    fn without_a_failure_policy_one_failed_job_fails_the_jobset() {
        let mut run = Run::new(jobset(json!({}), json!([rjob("node", 1, 0, json!([]))])));
        run.state.to_launch();
        run.exit(0, 2);
        run.eval();
        let status = run.status();
        assert_eq!(status["conditions"][0]["reason"], "FailedJobs");
        assert_eq!(
            status["conditions"][0]["message"],
            "jobset failed due to one or more job failures (first failed job: j-node-0)"
        );
    }

    #[test]
    fn backoff_limit_replaces_failed_pods() {
        let mut run = Run::new(jobset(json!({}), json!([rjob("node", 1, 1, json!([]))])));
        run.state.to_launch();
        run.exit(0, 1);
        assert!(run.eval().is_empty());
        assert_eq!(run.state.terminal_state(), None);
        assert_eq!(run.state.to_launch(), vec![1], "a replacement for index 0");
        assert_eq!(run.state.pods()[1].index, 0);
        run.exit(1, 0);
        run.eval();
        assert_eq!(run.state.terminal_state(), Some("Completed"));
        assert_eq!(run.state.pods_json("n").len(), 2, "the failed pod is kept");
    }

    #[test]
    fn depends_on_waits_for_the_status() {
        let plan = jobset(
            json!({}),
            json!([
                rjob("initializer", 1, 0, json!([])),
                rjob(
                    "node",
                    2,
                    0,
                    json!([{"name": "initializer", "status": "Complete"}])
                ),
            ]),
        );
        let mut run = Run::new(plan);
        assert_eq!(run.state.to_launch(), vec![0]);
        run.run(0);
        run.eval();
        assert!(
            run.state.to_launch().is_empty(),
            "node waits for the initializer to complete"
        );
        let pods = run.state.pods_json("n");
        assert_eq!(pods[1]["status"]["phase"], "Pending");
        assert_eq!(run.status()["replicatedJobsStatus"][1]["active"], 0);
        run.exit(0, 0);
        run.eval();
        assert_eq!(run.state.to_launch(), vec![1, 2]);

        let plan = jobset(
            json!({}),
            json!([
                rjob("a", 1, 0, json!([])),
                rjob("b", 1, 0, json!([{"name": "a", "status": "Ready"}]))
            ]),
        );
        let mut run = Run::new(plan);
        assert_eq!(run.state.to_launch(), vec![0]);
        run.run(0);
        assert_eq!(run.state.to_launch(), vec![1], "b starts once a is ready");
    }

    #[test]
    fn success_policy_any_completes_early_and_deletes_the_rest() {
        let plan = jobset(
            json!({"successPolicy": {"operator": "Any", "targetReplicatedJobs": ["leader"]}}),
            json!([
                rjob("leader", 1, 0, json!([])),
                rjob("worker", 2, 0, json!([]))
            ]),
        );
        let mut run = Run::new(plan);
        assert_eq!(run.state.to_launch(), vec![0, 1, 2]);
        run.run(1);
        run.exit(0, 0);
        let mut kill = run.eval();
        kill.sort();
        assert_eq!(kill, vec!["u2".to_string(), "u3".to_string()]);
        assert_eq!(run.state.terminal_state(), Some("Completed"));
        assert_eq!(run.state.pods_json("n").len(), 1);
    }

    #[test]
    fn failure_rules_pick_the_action() {
        let plan = jobset(
            json!({"failurePolicy": {"maxRestarts": 5, "rules": [
                {"name": "r", "action": "FailJobSet", "targetReplicatedJobs": ["node"]}]}}),
            json!([rjob("node", 1, 0, json!([]))]),
        );
        let mut run = Run::new(plan);
        run.state.to_launch();
        run.exit(0, 1);
        run.eval();
        assert_eq!(
            run.status()["conditions"][0]["reason"],
            "FailJobSetFailurePolicyAction"
        );
    }

    #[test]
    fn a_pod_that_cannot_run_fails_with_its_message() {
        let mut run = Run::new(jobset(json!({}), json!([rjob("node", 1, 0, json!([]))])));
        run.state.to_launch();
        let at = run.t;
        run.state.apply(PodEvent::CannotRun {
            uid: run.uid(0),
            message: "env \"X\": gone".into(),
            at,
        });
        run.eval();
        let pods = run.state.pods_json("n");
        assert_eq!(pods[0]["status"]["phase"], "Failed");
        assert_eq!(pods[0]["status"]["message"], "env \"X\": gone");
        assert_eq!(run.state.terminal_state(), Some("Failed"));
    }
}
