//! [`Simulator`]: moves JobSets and their pods through their states as the
//! JobSet controller, the Job controller, the scheduler and the kubelet
//! would. It is a client of an API server like they are, so it runs against
//! the stand-in and against kmock alike.
//!
//! Each pass lists Nodes, JobSets, Jobs and Pods in every namespace and
//! makes one round of changes (level-triggered, like a controller's
//! reconcile); passes repeat every [`SimConfig::tick`].
//!
//! What a container "does" is read from its env (or the pod's annotations):
//!
//! | env | meaning | default |
//! |---|---|---|
//! | `STANDIN_RUN_MS` | how long the container runs | [`SimConfig::run_ms`] |
//! | `STANDIN_EXIT_CODE` (or annotation `standin.trainhub.dev/exit-code`) | exit code | 0 |
//! | `STANDIN_FAIL_ATTEMPTS=n` | only the first n attempts exit with the code (1 if unset), later ones succeed | every attempt |
//! | `STANDIN_LOG` | the container's log | a few lines naming the pod |
//!
//! An attempt counts the pod's JobSet restarts plus the failed pods of its
//! Job (for the same completion index).
//!
//! Not simulated: gang scheduling (PodGroups are served but ignored), the
//! `InOrder` startup policy, failure-policy rules, pod failure policies,
//! `backoffLimitPerIndex`, preemption.

mod job;
mod jobset;
mod kubelet;
mod quantity;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use trainhub_api::jobset::JobSet;

/// Env of a container: how long it runs.
pub const ENV_RUN_MS: &str = "STANDIN_RUN_MS";
/// Env of a container: its exit code.
pub const ENV_EXIT_CODE: &str = "STANDIN_EXIT_CODE";
/// Env of a container: how many attempts fail before one succeeds.
pub const ENV_FAIL_ATTEMPTS: &str = "STANDIN_FAIL_ATTEMPTS";
/// Env of a container: its log.
pub const ENV_LOG: &str = "STANDIN_LOG";
/// Pod annotation: the exit code of its containers.
pub const ANNOTATION_EXIT_CODE: &str = "standin.trainhub.dev/exit-code";
/// The field manager of the simulator's writes.
pub const FIELD_MANAGER: &str = "kube-standin-simulator";

/// How the simulated cluster behaves.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Pause between passes.
    pub tick: Duration,
    /// How long a container runs unless its env says otherwise.
    pub run_ms: u64,
    /// Delete Jobs and Pods whose owner is gone, as the garbage collector
    /// does (for servers without one, like kmock; harmless with one).
    pub collect_orphans: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            tick: Duration::from_millis(40),
            run_ms: 300,
            collect_orphans: true,
        }
    }
}

/// The running simulator; dropping it (or [`Simulator::stop`]) ends it.
pub struct Simulator {
    task: Option<JoinHandle<()>>,
    stop: Arc<Notify>,
}

impl Simulator {
    /// Spawns the simulator's loop on the current runtime.
    pub fn start(client: Client, config: SimConfig) -> Simulator {
        let stop = Arc::new(Notify::new());
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut cluster = Cluster {
                client,
                config,
                started: BTreeMap::new(),
            };
            loop {
                if let Err(e) = cluster.pass().await {
                    tracing::debug!(error = %e, "simulator pass failed; retrying");
                }
                tokio::select! {
                    _ = stopped.notified() => return,
                    _ = tokio::time::sleep(cluster.config.tick) => {}
                }
            }
        });
        Simulator {
            task: Some(task),
            stop,
        }
    }

    /// Ends the simulator after its current pass.
    pub async fn stop(mut self) {
        self.stop.notify_one();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The cluster as one pass sees it.
pub(crate) struct Snapshot {
    pub nodes: Vec<Node>,
    pub jobsets: Vec<JobSet>,
    pub jobs: Vec<Job>,
    pub pods: Vec<Pod>,
}

pub(crate) struct Cluster {
    client: Client,
    config: SimConfig,
    /// When each running pod (by uid) started, as this simulator saw it.
    started: BTreeMap<String, tokio::time::Instant>,
}

impl Cluster {
    async fn pass(&mut self) -> anyhow::Result<()> {
        let snapshot = Snapshot {
            nodes: list(&self.client).await?,
            jobsets: list(&self.client).await?,
            jobs: list(&self.client).await?,
            pods: list(&self.client).await?,
        };
        jobset::reconcile(self, &snapshot).await;
        job::reconcile(self, &snapshot).await;
        kubelet::reconcile(self, &snapshot).await;
        Ok(())
    }

    fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Creates `object`; an object that exists already is fine (a previous
    /// pass made it).
    async fn create<K>(&self, namespace: &str, object: &K)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api(namespace);
        match api.create(&PostParams::default(), object).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                tracing::debug!(error = %e, name = ?object.meta().name, "simulator create failed")
            }
        }
    }

    /// Merges `patch` into the status of `object`.
    async fn patch_status<K>(&self, object: &K, patch: Value)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api(&object.namespace().unwrap_or_default());
        let params = PatchParams::default();
        if let Err(e) = api
            .patch_status(
                &object.name_any(),
                &params,
                &Patch::Merge(&serde_json::json!({ "status": patch })),
            )
            .await
        {
            tracing::debug!(error = %e, name = %object.name_any(), "simulator status write failed");
        }
    }

    /// Merges `patch` into `object` (spec or metadata).
    async fn patch<K>(&self, object: &K, patch: Value)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api(&object.namespace().unwrap_or_default());
        if let Err(e) = api
            .patch(
                &object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::debug!(error = %e, name = %object.name_any(), "simulator write failed");
        }
    }

    /// Deletes `object` with background propagation; gone already is fine.
    async fn delete<K>(&self, object: &K)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        if object.meta().deletion_timestamp.is_some() {
            return;
        }
        let api: Api<K> = self.api(&object.namespace().unwrap_or_default());
        if let Err(e) = api
            .delete(&object.name_any(), &DeleteParams::background())
            .await
        {
            tracing::debug!(error = %e, name = %object.name_any(), "simulator delete failed");
        }
    }
}

async fn list<K>(client: &Client) -> anyhow::Result<Vec<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    <K as Resource>::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    Ok(api.list(&ListParams::default()).await?.items)
}

/// Whether `object` has an owner reference to `owner` (by uid).
pub(crate) fn owned_by(object: &impl Resource, owner: &impl Resource) -> bool {
    let Some(uid) = owner.meta().uid.as_deref() else {
        return false;
    };
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == uid)
}

/// The controller owner reference to `owner`.
pub(crate) fn controller_ref<K>(
    owner: &K,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference
where
    K: Resource<DynamicType = ()>,
{
    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Now, as a metav1.Time.
pub(crate) fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now())
}

/// The container a log request names, or the pod's first.
pub fn container_name(pod: &Value, requested: Option<&str>) -> Option<String> {
    let containers = pod["spec"]["containers"].as_array()?;
    match requested {
        Some(name) => containers
            .iter()
            .find(|c| c["name"] == name)
            .map(|_| name.to_string()),
        None => containers
            .first()
            .and_then(|c| c["name"].as_str())
            .map(str::to_string),
    }
}

/// The value of env `name` of the container named `container` (or the first).
pub fn container_env(pod: &Value, container: Option<&str>, name: &str) -> Option<String> {
    let containers = pod["spec"]["containers"].as_array()?;
    let c = match container {
        Some(n) => containers.iter().find(|c| c["name"] == n)?,
        None => containers.first()?,
    };
    c["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map(str::to_string)
}

/// The simulated log of a container: its `STANDIN_LOG`, else a few lines
/// naming the pod and its node.
pub fn pod_log(pod: &Value, container: Option<&str>) -> String {
    if let Some(log) = container_env(pod, container, ENV_LOG) {
        return if log.ends_with('\n') {
            log
        } else {
            format!("{log}\n")
        };
    }
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
    let index = pod["metadata"]["annotations"][trainhub_api::constants::JOB_COMPLETION_INDEX]
        .as_str()
        .unwrap_or("0");
    format!(
        "pod {name} started on node {node}\npod {name}: completion index {index}\npod {name}: done\n"
    )
}
