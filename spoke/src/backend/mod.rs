//! What a spoke runs TrainJobs on: the interface between the agent (which
//! talks to the hub) and a backend (local processes, or a Kubernetes
//! cluster).
//!
//! The agent calls a backend with the hub's requests; the backend sends a
//! [`RunReport`] on its report channel whenever what it observes of a run
//! changes. Every call is idempotent by `(run_id, generation)`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use serde_json::Value;

/// A boxed future, as the backend trait returns them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A log stream: chunks of bytes, or the error that ended it.
pub type LogStream = BoxStream<'static, Result<Bytes, String>>;

/// One run: a placement of one TrainJob on this spoke.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKey {
    /// The TrainJob's uid.
    pub run_id: String,
    /// Which placement of it (increases on every requeue or resume).
    pub generation: i64,
}

/// One pod set of an offer: `count` pods, each requesting `requests_milli`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSetRequest {
    pub name: String,
    pub count: u32,
    /// Resource name → milli-units per pod.
    pub requests_milli: BTreeMap<String, i64>,
}

/// Declared or observed capacity of one resource, in milli-units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub resource: String,
    pub allocatable_milli: i64,
    pub free_milli: i64,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub key: RunKey,
    /// The TrainJob's namespace and name (the JobSet has the same name).
    pub namespace: String,
    pub name: String,
    pub trainjob_uid: String,
    /// The objects the Build phase made, JobSet first.
    pub objects: Vec<Value>,
    /// Environment given to every container in addition to its own
    /// (`TRACEPARENT`, `OTEL_*`).
    pub extra_env: Vec<(String, String)>,
}

/// What the backend observes of a run, sent whenever it changes.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    pub key: RunKey,
    /// The JobSet's `.status` (conditions, replicatedJobsStatus, restarts,
    /// terminalState), as the JobSet controller would write it.
    pub jobset_status: Value,
    /// Every pod of the run, as Kubernetes Pod objects (metadata with the
    /// JobSet labels, spec, status).
    pub pods: Vec<Value>,
    /// The run has ended (Completed or Failed) and will not change again.
    pub finished: bool,
    /// Kubernetes Events recorded since the previous report (on the run's
    /// pods); see [`events`].
    pub events: Vec<Value>,
}

impl RunReport {
    /// Whether two reports observe the same (their events aside).
    pub fn same_state(&self, other: &RunReport) -> bool {
        self.key == other.key
            && self.finished == other.finished
            && self.jobset_status == other.jobset_status
            && self.pods == other.pods
    }
}

/// A run a backend holds, as listed after a (re)connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRun {
    pub key: RunKey,
    pub finished: bool,
    /// The backend stopped the run without being asked, and why
    /// ([`LOST_SPOKE_RESTARTED`], [`LOST_FENCED`]): it is over, not
    /// finished, and never restarted here; the hub places it again.
    pub lost: Option<&'static str>,
}

/// A run the spoke killed on its own restart: its agent died while it ran,
/// and processes of an earlier agent cannot be waited on, so they were
/// killed.
pub const LOST_SPOKE_RESTARTED: &str = "SpokeRestarted";
/// A run the spoke stopped because it heard nothing from the hub for its
/// fence-after time.
pub const LOST_FENCED: &str = "Fenced";

/// Why a backend could not do what it was asked.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum BackendError {
    /// The gang does not fit in what is free now.
    #[error("does not fit: {0}")]
    DoesNotFit(String),
    /// No such run, pod or container.
    #[error("{0} not found")]
    NotFound(String),
    /// The request itself is wrong (an object the backend cannot run).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Internal(String),
}

/// A place where runs run. Implementations: [`process::ProcessBackend`],
/// [`kube::KubeBackend`].
pub trait Backend: Send + Sync + 'static {
    /// `process` or `kube`.
    fn kind(&self) -> &'static str;

    /// Capacity now, per resource.
    fn capacity(&self) -> Vec<Capacity>;

    /// Reserves room for the whole gang, or nothing (`DoesNotFit`).
    /// Admitting a run already admitted or started is Ok.
    fn admit(&self, key: &RunKey, pod_sets: &[PodSetRequest]) -> Result<(), BackendError>;

    /// Releases a reservation that was not followed by a start. Unknown
    /// keys are ignored.
    fn withdraw(&self, key: &RunKey);

    /// Starts an admitted run (admitting it first if it was not). Starting a
    /// run already started changes nothing.
    fn start(&self, spec: RunSpec) -> BoxFuture<'_, Result<(), BackendError>>;

    /// Stops every run of `run_id` with generation <= `generation`, deletes
    /// what it made and releases its capacity. Unknown runs are ignored.
    fn stop(&self, run_id: &str, generation: i64) -> BoxFuture<'_, ()>;

    /// The runs this backend holds.
    fn runs(&self) -> Vec<HeldRun>;

    /// Stops every run that has not finished, because the hub has not been
    /// heard from for the fence-after time, and keeps each as lost
    /// ([`LOST_FENCED`]) where it can. Returns the runs it stopped.
    ///
    /// The default stops them with [`Backend::stop`] (the backend forgets
    /// them; the agent remembers them as lost).
    fn fence(&self) -> BoxFuture<'_, Vec<RunKey>> {
        Box::pin(async move {
            let keys: Vec<RunKey> = self
                .runs()
                .into_iter()
                .filter(|r| !r.finished && r.lost.is_none())
                .map(|r| r.key)
                .collect();
            for key in &keys {
                self.stop(&key.run_id, key.generation).await;
            }
            keys
        })
    }

    /// Admitted offers neither started nor withdrawn.
    fn reservations(&self) -> Vec<RunKey> {
        Vec::new()
    }

    /// The last report of a run, to resend after a reconnect.
    fn report(&self, key: &RunKey) -> Option<RunReport>;

    /// The log of one container of one pod of a run (`container` None: the
    /// pod's first container). `follow` keeps the stream open until the
    /// container ends; `tail_lines` keeps only the last lines.
    fn logs(
        &self,
        run_id: &str,
        pod: &str,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> BoxFuture<'_, Result<LogStream, BackendError>>;
}

/// A log request's `tail_lines`: none, or 0 or more.
pub(crate) fn tail_lines(n: Option<i64>) -> Result<Option<u64>, BackendError> {
    n.map(|n| {
        u64::try_from(n)
            .map_err(|_| BackendError::Invalid(format!("tail_lines: {n}; must be 0 or more")))
    })
    .transpose()
}

/// The latest run of `run_id` (by generation) in which `find` finds the pod
/// a log request names.
pub(crate) fn run_with_pod<'a, V, P>(
    runs: &'a BTreeMap<RunKey, V>,
    run_id: &str,
    pod: &str,
    find: impl Fn(&'a V) -> Option<P>,
) -> Result<(&'a RunKey, P), BackendError> {
    let mut held = runs.iter().filter(|(k, _)| k.run_id == run_id).peekable();
    if held.peek().is_none() {
        return Err(BackendError::NotFound(format!("run {run_id:?}")));
    }
    held.filter_map(|(k, v)| Some((k, find(v)?)))
        .next_back()
        .ok_or_else(|| BackendError::NotFound(format!("pod {pod:?} of run {run_id:?}")))
}

/// The container a log request names, which the pod must have, or the
/// pod's first (`names`: its containers, then its init containers).
pub(crate) fn pick_container<S: AsRef<str>>(
    names: &[S],
    container: Option<&str>,
    pod: &str,
) -> Result<String, BackendError> {
    match container {
        Some(c) if names.iter().any(|n| n.as_ref() == c) => Ok(c.to_owned()),
        Some(c) => Err(BackendError::NotFound(format!(
            "container {c:?} of pod {pod:?}"
        ))),
        None => names
            .first()
            .map(|n| n.as_ref().to_owned())
            .ok_or_else(|| BackendError::NotFound(format!("a container of pod {pod:?}"))),
    }
}

pub mod events;
pub mod kube;
pub mod process;
pub mod sim;
