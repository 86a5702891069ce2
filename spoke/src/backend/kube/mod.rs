//! The Kubernetes backend (`trainspoke --backend kube`): each run becomes
//! the objects Kubeflow Trainer would have made in the cluster — a JobSet,
//! and with it a PodGroup, the MPI hostfile ConfigMap and SSH Secret — and
//! the cluster's JobSet controller, scheduler and kubelets run it. The
//! cluster needs JobSet (and the gang scheduler a runtime names), not
//! Kubeflow Trainer.
//!
//! # Start
//!
//! Every object is applied with server-side apply (forced, under one field
//! manager, `--field-manager`, default `trainspoke`) in the TrainJob's
//! namespace, which must exist, or is created with `--create-namespaces`.
//! Each carries the labels `trainhub.dev/run-id`, `trainhub.dev/generation`
//! and `trainhub.dev/trainjob-uid`. The JobSet goes first, with the
//! annotation `trainhub.dev/spec-hash` (SHA-256 of the JobSet as applied,
//! keys sorted) and without owner references: its TrainJob lives at the
//! hub. The other objects are owned by the JobSet (`controller` and
//! `blockOwnerDeletion` true), where upstream's controller makes the
//! TrainJob their owner, so the cluster's garbage collector removes them
//! with it. An immutable Secret (the MPI SSH key, the Flux CURVE key: random
//! per build) is created once and kept.
//!
//! The run's extra environment (`TRACEPARENT`) is not written into the
//! pod templates: the JobSet stays exactly as the hub built it (what
//! `trainctl render` prints), plus the labels and annotation above.
//!
//! A start of a run whose JobSet is already there, of the same generation
//! and spec hash, applies nothing (a restarted spoke, a resent start). A
//! JobSet of an earlier generation of the same run is deleted first; one of
//! another run, or of no run, is an error naming it.
//!
//! # Reports
//!
//! kube-runtime watchers (relisting after a 410, retrying with the default
//! backoff) follow the JobSets labelled `trainhub.dev/run-id`, every Pod and
//! every Node of the cluster. Each change of a run's JobSet or of a pod
//! labelled `jobset.sigs.k8s.io/jobset-name` with its name makes a report —
//! the JobSet's `.status`, the run's pods, Events derived from the pods
//! (see [`events`](crate::backend::events)), finished once a `Completed` or
//! `Failed` condition is True — sent when it differs from the last one. A
//! JobSet deleted by someone else while it ran ends the run Failed
//! (`JobSetDeleted`).
//!
//! When the backend starts it lists the labelled JobSets and holds their
//! runs again (generation from the label), so the hub's resync after a
//! spoke restart finds them, and applies nothing that is unchanged.
//!
//! # Capacity and admission
//!
//! See [`capacity`]: per schedulable node, allocatable less the requests of
//! the non-terminal pods bound to it. A gang is admitted when every one of
//! its pods fits on some node by first-fit packing (largest first) against
//! that, less the room reserved for the pods of admitted gangs not yet
//! bound; otherwise `DoesNotFit` names the pod set and the resource. Taints
//! are not matched against tolerations: a tainted node does not count, even
//! for pods that would tolerate the taint. The GPU product label
//! (`nvidia.com/gpu.product`) of the schedulable nodes with the most GPUs is
//! added to the spoke's labels at startup ([`KubeBackend::gpu_product`]).
//!
//! # Kueue (`--kueue-queue`)
//!
//! MultiKueue-worker style: the JobSet is applied with `spec.suspend: true`
//! and the label `kueue.x-k8s.io/queue-name`, and Kueue decides admission:
//!
//! | hub | cluster |
//! | --- | --- |
//! | offer → admit | accepted at once, nothing reserved locally |
//! | start | JobSet applied suspended, queued |
//! | (no report yet) | Kueue has not admitted it: `spec.suspend` true |
//! | first report: running | Kueue unsuspended it (admission) |
//! | stop | JobSet deleted (foreground), which Kueue sees as finished |
//!
//! # Stop
//!
//! The JobSets of the run up to the generation (found by label in every
//! namespace) are deleted with foreground propagation, and the run's other
//! objects by label; the run and its reservation are released.
//!
//! # Permissions
//!
//! [`rbac::USED`] lists every call; `manifests/rbac/trainspoke-clusterrole.yaml`
//! grants exactly those.

pub mod capacity;
pub mod objects;
pub mod rbac;
pub mod report;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{AsyncReadExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

use self::objects::{Kind, Marks};
use self::state::{Change, Inner, RunEntry, Source};
use super::{
    Backend, BackendError, BoxFuture, Capacity, HeldRun, LogStream, PodSetRequest, RunKey,
    RunReport, RunSpec,
};

/// How the kube backend is set up.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// Create a run's namespace when it is missing.
    pub create_namespaces: bool,
    /// Delegate admission to Kueue through this LocalQueue.
    pub kueue_queue: Option<String>,
    /// The server-side apply field manager.
    pub field_manager: String,
    /// How long a start waits for an earlier JobSet of the same name to be
    /// deleted.
    pub delete_wait: Duration,
    /// How long startup waits for the watchers' first lists.
    pub sync_timeout: Duration,
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            create_namespaces: false,
            kueue_queue: None,
            field_manager: "trainspoke".into(),
            delete_wait: Duration::from_secs(120),
            sync_timeout: Duration::from_secs(60),
        }
    }
}

/// Runs TrainJobs as JobSets in a Kubernetes cluster. See the [module
/// documentation](self).
pub struct KubeBackend {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

struct Shared {
    client: Client,
    config: KubeConfig,
    reports: UnboundedSender<RunReport>,
    inner: Mutex<Inner>,
    /// Which watchers have listed.
    synced: tokio::sync::watch::Sender<BTreeSet<Source>>,
}

/// A Kubernetes API error as a message: its code, reason and message.
fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            format!("{} {}: {}", status.code, status.reason, status.message)
        }
        other => {
            let mut text = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(s) = source {
                text.push_str(": ");
                text.push_str(&s.to_string());
                source = s.source();
            }
            text
        }
    }
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn now() -> String {
    super::process::state::time(jiff::Timestamp::now())
}

impl KubeBackend {
    /// Connects to the cluster `client` reaches: lists the JobSets of runs
    /// made before (to hold them again), starts the watchers and waits for
    /// their first lists. Reports go to `reports`.
    ///
    /// # Errors
    ///
    /// The JobSet API is not served, a list is refused (permissions), or the
    /// watchers have not listed within `config.sync_timeout`.
    pub async fn connect(
        client: Client,
        config: KubeConfig,
        reports: UnboundedSender<RunReport>,
    ) -> Result<Arc<Self>, String> {
        let (synced, mut synced_rx) = tokio::sync::watch::channel(BTreeSet::new());
        let shared = Arc::new(Shared {
            client: client.clone(),
            config,
            reports,
            inner: Mutex::new(Inner::default()),
            synced,
        });
        let jobsets: Api<DynamicObject> =
            Api::all_with(client.clone(), &Kind::JobSet.api_resource());
        let listed = jobsets
            .list(&ListParams::default().labels(objects::LABEL_RUN_ID))
            .await
            .map_err(|e| match status_code(&e) {
                Some(404) => format!(
                    "the cluster does not serve {} (install JobSet): {}",
                    Kind::JobSet.describe(),
                    api_error(&e)
                ),
                _ => format!("listing the runs' JobSets: {}", api_error(&e)),
            })?;
        {
            let kueue = shared.config.kueue_queue.is_some();
            let mut inner = shared.lock();
            for js in &listed.items {
                if let Ok(value) = serde_json::to_value(js) {
                    inner.adopt(&value, kueue);
                }
            }
            tracing::info!(runs = inner.runs.len(), "runs found in the cluster");
        }
        let pods = Api::<DynamicObject>::all_with(
            client.clone(),
            &kube::core::ApiResource::erase::<Pod>(&()),
        );
        let nodes = Api::<DynamicObject>::all_with(
            client.clone(),
            &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::Node>(&()),
        );
        let tasks = vec![
            tokio::spawn(watch(
                Arc::clone(&shared),
                Source::JobSets,
                jobsets,
                watcher::Config::default().labels(objects::LABEL_RUN_ID),
            )),
            tokio::spawn(watch(
                Arc::clone(&shared),
                Source::Pods,
                pods,
                watcher::Config::default(),
            )),
            tokio::spawn(watch(
                Arc::clone(&shared),
                Source::Nodes,
                nodes,
                watcher::Config::default(),
            )),
        ];
        let backend = Arc::new(KubeBackend {
            shared: Arc::clone(&shared),
            tasks,
        });
        let all = [Source::JobSets, Source::Pods, Source::Nodes];
        let waited = tokio::time::timeout(
            shared.config.sync_timeout,
            synced_rx.wait_for(|s| all.iter().all(|w| s.contains(w))),
        )
        .await
        .map(|r| r.is_ok());
        if waited != Ok(true) {
            let done = synced_rx.borrow().clone();
            let missing: Vec<String> = all
                .iter()
                .filter(|w| !done.contains(w))
                .map(|w| format!("{w:?}"))
                .collect();
            return Err(format!(
                "the watchers of {} have not listed within {:?} (see the warnings above: permissions, or the API not served)",
                missing.join(", "),
                shared.config.sync_timeout
            ));
        }
        Ok(backend)
    }

    /// The GPU product (`nvidia.com/gpu.product`) of the schedulable nodes
    /// with the most GPUs, and every product seen.
    pub fn gpu_product(&self) -> (Option<String>, Vec<String>) {
        let inner = self.shared.lock();
        capacity::gpu_product(&inner.nodes.items_by_name())
    }
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Follows one kind of object for as long as the backend lives.
async fn watch(
    shared: Arc<Shared>,
    source: Source,
    api: Api<DynamicObject>,
    config: watcher::Config,
) {
    loop {
        let mut stream = watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed();
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => shared.take(source, event),
                Err(e) => tracing::warn!(watch = ?source, error = %e, "watch failed; retrying"),
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn kueue(&self) -> bool {
        self.config.kueue_queue.is_some()
    }

    /// Takes in a watch event and sends the reports it changed.
    fn take(&self, source: Source, event: watcher::Event<DynamicObject>) {
        let value = |o: &DynamicObject| serde_json::to_value(o).unwrap_or(Value::Null);
        let change = match &event {
            watcher::Event::Apply(o) => Change::Applied(value(o)),
            watcher::Event::Delete(o) => Change::Deleted(value(o)),
            watcher::Event::Init => Change::RelistStarted,
            watcher::Event::InitApply(o) => Change::Relisted(value(o)),
            watcher::Event::InitDone => Change::RelistDone,
        };
        let done = matches!(change, Change::RelistDone);
        let kueue = self.kueue();
        let reports = {
            let mut inner = self.lock();
            let affected = inner.take(source, change, kueue);
            let now = now();
            affected
                .iter()
                .filter_map(|key| inner.refresh(key, kueue, &now))
                .collect::<Vec<_>>()
        };
        for report in reports {
            let _ = self.reports.send(report);
        }
        if done {
            self.synced.send_modify(|s| {
                s.insert(source);
            });
        }
    }

    /// Sends the report of a run if it changed.
    fn refresh(&self, key: &RunKey) {
        let report = self.lock().refresh(key, self.kueue(), &now());
        if let Some(report) = report {
            let _ = self.reports.send(report);
        }
    }

    fn api(&self, kind: Kind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &kind.api_resource())
    }

    /// Makes sure the namespace exists (creating it if allowed).
    async fn ensure_namespace(&self, namespace: &str) -> Result<(), BackendError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let found = api.get_opt(namespace).await.map_err(|e| {
            BackendError::Internal(format!(
                "reading namespace {namespace:?}: {}",
                api_error(&e)
            ))
        })?;
        if found.is_some() {
            return Ok(());
        }
        if !self.config.create_namespaces {
            return Err(BackendError::Invalid(format!(
                "namespace {namespace:?} does not exist in the spoke's cluster; create it, or run the spoke with --create-namespaces"
            )));
        }
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))
            .map_err(|e| BackendError::Internal(format!("namespace {namespace:?}: {e}")))?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {
                tracing::info!(namespace, "created the namespace");
                Ok(())
            }
            Err(e) if status_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(BackendError::Internal(format!(
                "creating namespace {namespace:?}: {}",
                api_error(&e)
            ))),
        }
    }

    /// Waits until the JobSet is gone.
    async fn wait_gone(&self, api: &Api<DynamicObject>, what: &str) -> Result<(), BackendError> {
        let deadline = tokio::time::Instant::now() + self.config.delete_wait;
        loop {
            match api.get_opt(what).await {
                Ok(None) => return Ok(()),
                Ok(Some(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Some(_)) => {
                    return Err(BackendError::Internal(format!(
                        "JobSet {what:?} is still being deleted after {:?}",
                        self.config.delete_wait
                    )));
                }
                Err(e) => {
                    return Err(BackendError::Internal(format!(
                        "reading JobSet {what:?}: {}",
                        api_error(&e)
                    )));
                }
            }
        }
    }

    /// Applies the objects of a run (see the module documentation).
    async fn apply(&self, spec: &RunSpec, kinds: &[Kind]) -> Result<(), BackendError> {
        let namespace = spec.namespace.as_str();
        let marks = Marks::of(spec, self.config.kueue_queue.as_deref());
        let first = spec.objects.first().ok_or_else(|| {
            BackendError::Invalid("the run has no objects; the first must be a JobSet".into())
        })?;
        let jobset = objects::jobset_to_apply(first, namespace, &marks)?;
        let name = jobset["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let hash = jobset["metadata"]["annotations"][objects::ANNOTATION_SPEC_HASH].clone();
        let what = format!("JobSet {namespace}/{name}");
        self.ensure_namespace(namespace).await?;
        let api = self.api(Kind::JobSet, namespace);
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|e| BackendError::Internal(format!("reading {what}: {}", api_error(&e))))?
            .map(|o| serde_json::to_value(o).unwrap_or(Value::Null));
        if let Some(existing) = existing {
            if !existing["metadata"]["deletionTimestamp"].is_null() {
                self.wait_gone(&api, &name).await?;
            } else {
                match state::key_of(&existing) {
                    Some(key) if key == spec.key => {
                        if existing["metadata"]["annotations"][objects::ANNOTATION_SPEC_HASH]
                            == hash
                        {
                            tracing::info!(run = %key.run_id, generation = key.generation, "{what} is already applied");
                            return Ok(());
                        }
                    }
                    Some(key)
                        if key.run_id == spec.key.run_id
                            && key.generation < spec.key.generation =>
                    {
                        tracing::info!(run = %key.run_id, generation = key.generation, "deleting {what} of an earlier generation");
                        self.delete_jobset(&api, &name).await?;
                        self.wait_gone(&api, &name).await?;
                    }
                    Some(key) if key.run_id == spec.key.run_id => {
                        return Err(BackendError::Invalid(format!(
                            "{what} belongs to a later placement (generation {}) of this run than {}",
                            key.generation, spec.key.generation
                        )));
                    }
                    _ => {
                        let owner = existing["metadata"]["labels"][objects::LABEL_RUN_ID]
                            .as_str()
                            .map_or("no run".to_owned(), |r| format!("run {r:?}"));
                        return Err(BackendError::Invalid(format!(
                            "{what} already exists in the spoke's cluster and belongs to {owner}; delete it or rename the TrainJob"
                        )));
                    }
                }
            }
        }
        let params = PatchParams::apply(&self.config.field_manager).force();
        let applied = api
            .patch(&name, &params, &Patch::Apply(&jobset))
            .await
            .map_err(|e| BackendError::Internal(format!("applying {what}: {}", api_error(&e))))?;
        let uid = applied.metadata.uid.clone().ok_or_else(|| {
            BackendError::Internal(format!("applying {what}: the server returned no uid"))
        })?;
        for (object, kind) in spec.objects.iter().zip(kinds).skip(1) {
            let child = objects::child_to_apply(object, namespace, &marks, &name, &uid)?;
            let child_name = child["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let what = format!("{} {namespace}/{child_name}", kind.describe());
            let api = self.api(*kind, namespace);
            if *kind == Kind::Secret && objects::is_immutable(&child) {
                let object: DynamicObject = serde_json::from_value(child)
                    .map_err(|e| BackendError::Invalid(format!("{what}: {e}")))?;
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => {}
                    Err(e) if status_code(&e) == Some(409) => {}
                    Err(e) => {
                        return Err(BackendError::Internal(format!(
                            "creating {what}: {}",
                            api_error(&e)
                        )));
                    }
                }
                continue;
            }
            api.patch(&child_name, &params, &Patch::Apply(&child))
                .await
                .map_err(|e| {
                    BackendError::Internal(format!("applying {what}: {}", api_error(&e)))
                })?;
        }
        Ok(())
    }

    async fn delete_jobset(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
    ) -> Result<(), BackendError> {
        match api.delete(name, &DeleteParams::foreground()).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(BackendError::Internal(format!(
                "deleting JobSet {name:?}: {}",
                api_error(&e)
            ))),
        }
    }

    /// Deletes the JobSets of `run_id` up to `generation` and the run's
    /// other objects; `known` are `(namespace, generation)` the backend held.
    async fn delete_run(&self, run_id: &str, generation: i64, known: BTreeSet<(String, i64)>) {
        let mut places = known;
        let all: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &Kind::JobSet.api_resource());
        let selector = format!("{}={run_id}", objects::LABEL_RUN_ID);
        match all.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => {
                for js in list.items {
                    let value = serde_json::to_value(&js).unwrap_or(Value::Null);
                    let Some(key) = state::key_of(&value) else {
                        continue;
                    };
                    let Some(namespace) = js.metadata.namespace.clone() else {
                        continue;
                    };
                    if key.generation > generation {
                        continue;
                    }
                    let name = js.metadata.name.clone().unwrap_or_default();
                    if let Err(e) = self
                        .delete_jobset(&self.api(Kind::JobSet, &namespace), &name)
                        .await
                    {
                        tracing::warn!(run = run_id, error = %e, "stop");
                    }
                    places.insert((namespace, key.generation));
                }
            }
            Err(e) => {
                tracing::warn!(run = run_id, error = %api_error(&e), "stop: listing the run's JobSets");
            }
        }
        for (namespace, generation) in places {
            let selector = objects::run_selector(run_id, generation);
            for kind in Kind::ALL.into_iter().skip(1) {
                let api = self.api(kind, &namespace);
                let result = api
                    .delete_collection(
                        &DeleteParams::foreground(),
                        &ListParams::default().labels(&selector),
                    )
                    .await;
                match result {
                    Ok(_) => {}
                    // A PodGroup kind the cluster does not serve holds none.
                    Err(e) if status_code(&e) == Some(404) => {}
                    Err(e) => tracing::warn!(
                        run = run_id,
                        "stop: deleting the run's {} in {namespace}: {}",
                        kind.describe(),
                        api_error(&e)
                    ),
                }
            }
        }
    }
}

/// Reads a log stream into chunks.
fn chunks(reader: impl futures_util::AsyncBufRead + Send + Unpin + 'static) -> LogStream {
    let stream = futures_util::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut buf = vec![0u8; 16 * 1024];
        match reader.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(reader)))
            }
            Err(e) => Some((Err(format!("reading the log: {e}")), None)),
        }
    });
    Box::pin(stream)
}

impl Backend for KubeBackend {
    fn kind(&self) -> &'static str {
        "kube"
    }

    fn capacity(&self) -> Vec<Capacity> {
        let inner = self.shared.lock();
        capacity::totals(&inner.nodes.items_by_name(), &inner.free())
    }

    fn admit(&self, key: &RunKey, pod_sets: &[PodSetRequest]) -> Result<(), BackendError> {
        if self.shared.kueue() {
            return Ok(());
        }
        let mut inner = self.shared.lock();
        if inner.runs.contains_key(key) || inner.reserved.contains_key(key) {
            return Ok(());
        }
        for set in pod_sets {
            if let Some((r, m)) = set.requests_milli.iter().find(|(_, m)| **m < 0) {
                return Err(BackendError::Invalid(format!(
                    "pod set {:?}: request for {r} is negative ({m}m)",
                    set.name
                )));
            }
        }
        let mut free = inner.free();
        capacity::first_fit(&mut free, &capacity::pods_of(pod_sets, &BTreeMap::new()))
            .map_err(BackendError::DoesNotFit)?;
        inner.reserved.insert(key.clone(), pod_sets.to_vec());
        Ok(())
    }

    fn withdraw(&self, key: &RunKey) {
        let mut inner = self.shared.lock();
        if !inner.runs.contains_key(key) {
            inner.reserved.remove(key);
        }
    }

    fn start(&self, spec: RunSpec) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            if self.shared.lock().runs.contains_key(&spec.key) {
                return Ok(());
            }
            if spec.namespace.is_empty() {
                return Err(BackendError::Invalid("the run has no namespace".into()));
            }
            let kinds = spec
                .objects
                .iter()
                .map(Kind::of)
                .collect::<Result<Vec<Kind>, _>>()?;
            let Some((Kind::JobSet, jobset)) = kinds.first().zip(spec.objects.first()) else {
                return Err(BackendError::Invalid(
                    "the first object of a run must be a jobset.x-k8s.io/v1alpha2 JobSet".into(),
                ));
            };
            if kinds.iter().skip(1).any(|k| *k == Kind::JobSet) {
                return Err(BackendError::Invalid(
                    "a run holds one JobSet, the first of its objects".into(),
                ));
            }
            let name = jobset["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            // Started without an offer before it: admitted now (a no-op when
            // it was, or in Kueue mode).
            self.admit(&spec.key, &objects::jobset_pod_sets(jobset))?;
            {
                let mut inner = self.shared.lock();
                if inner.runs.contains_key(&spec.key) {
                    return Ok(());
                }
                inner.runs.insert(
                    spec.key.clone(),
                    RunEntry {
                        namespace: spec.namespace.clone(),
                        name: name.clone(),
                        report: None,
                        finished: false,
                        seen: false,
                    },
                );
            }
            if let Err(e) = self.shared.apply(&spec, &kinds).await {
                let mut inner = self.shared.lock();
                inner.runs.remove(&spec.key);
                inner.reserved.remove(&spec.key);
                return Err(e);
            }
            let stopped = !self.shared.lock().runs.contains_key(&spec.key);
            if stopped {
                // Stopped while it was being applied: undo.
                let known = BTreeSet::from([(spec.namespace.clone(), spec.key.generation)]);
                self.shared
                    .delete_run(&spec.key.run_id, spec.key.generation, known)
                    .await;
                return Ok(());
            }
            self.shared.refresh(&spec.key);
            Ok(())
        })
    }

    fn stop(&self, run_id: &str, generation: i64) -> BoxFuture<'_, ()> {
        let run_id = run_id.to_owned();
        Box::pin(async move {
            let known: BTreeSet<(String, i64)> = {
                let mut inner = self.shared.lock();
                let stopped = inner.stopped.entry(run_id.clone()).or_insert(generation);
                *stopped = (*stopped).max(generation);
                let matches = |k: &RunKey| k.run_id == run_id && k.generation <= generation;
                inner.reserved.retain(|k, _| !matches(k));
                let keys: Vec<RunKey> = inner.runs.keys().filter(|k| matches(k)).cloned().collect();
                keys.iter()
                    .filter_map(|k| inner.runs.remove(k).map(|e| (e.namespace, k.generation)))
                    .collect()
            };
            self.shared.delete_run(&run_id, generation, known).await;
        })
    }

    fn runs(&self) -> Vec<HeldRun> {
        self.shared
            .lock()
            .runs
            .iter()
            .map(|(key, entry)| HeldRun {
                key: key.clone(),
                finished: entry.finished,
                lost: None,
            })
            .collect()
    }

    fn reservations(&self) -> Vec<RunKey> {
        let inner = self.shared.lock();
        inner
            .reserved
            .keys()
            .filter(|k| !inner.runs.contains_key(*k))
            .cloned()
            .collect()
    }

    fn report(&self, key: &RunKey) -> Option<RunReport> {
        self.shared.lock().runs.get(key)?.report.clone()
    }

    fn logs(
        &self,
        run_id: &str,
        pod: &str,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> BoxFuture<'_, Result<LogStream, BackendError>> {
        let lookup = || -> Result<(String, LogParams), BackendError> {
            super::tail_lines(tail_lines)?;
            let inner = self.shared.lock();
            let (_, (namespace, object)) = super::run_with_pod(&inner.runs, run_id, pod, |e| {
                let found = e
                    .report
                    .as_ref()?
                    .pods
                    .iter()
                    .find(|p| p["metadata"]["name"] == pod)?;
                Some((e.namespace.clone(), found))
            })?;
            let names: Vec<&str> = ["containers", "initContainers"]
                .iter()
                .flat_map(|list| object["spec"][*list].as_array().into_iter().flatten())
                .filter_map(|c| c["name"].as_str())
                .collect();
            let container = super::pick_container(&names, container, pod)?;
            let mut params = LogParams {
                container: Some(container),
                follow,
                tail_lines,
                ..LogParams::default()
            };
            params.pretty = false;
            Ok((namespace, params))
        };
        let request = lookup();
        let pod = pod.to_owned();
        Box::pin(async move {
            let (namespace, params) = request?;
            let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &namespace);
            let reader = api.log_stream(&pod, &params).await.map_err(|e| {
                let message = format!("log of pod {namespace}/{pod}: {}", api_error(&e));
                match status_code(&e) {
                    Some(404) => BackendError::NotFound(message),
                    Some(400) => BackendError::Invalid(message),
                    _ => BackendError::Internal(message),
                }
            })?;
            Ok(chunks(Box::pin(reader)))
        })
    }
}
