//! The simulator against the stand-in: JobSets run to completion or
//! failure, and foreground deletion takes their Jobs and pods along.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use trainhub_api::jobset::JobSet;
use trainhub_kube_standin::{ApiServer, SimConfig, Simulator, Standin, StandinConfig};

use crate::wait_for;

/// A JobSet with an initializer and a 2-replica trainer that depends on it.
pub fn two_replica_jobset(name: &str, trainer_env: Value, failure_policy: Option<Value>) -> JobSet {
    let job = |env: Value| {
        json!({"spec": {"completionMode": "Indexed", "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "node", "image": "busybox",
                "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}},
                "env": env}]}}}})
    };
    let mut spec = json!({
        "replicatedJobs": [
            {"name": "initializer", "replicas": 1, "template": job(json!([]))},
            {"name": "node", "replicas": 2, "template": job(trainer_env),
             "dependsOn": [{"name": "initializer", "status": "Complete"}]},
        ],
    });
    if let Some(policy) = failure_policy {
        spec["failurePolicy"] = policy;
    }
    serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }))
    .unwrap()
}

fn finished(js: Option<&JobSet>) -> bool {
    js.and_then(|j| j.status.as_ref())
        .is_some_and(|s| s.terminal_state.is_some())
}

/// Applies a JobSet whose trainer runs cleanly and waits for it to complete,
/// checking what the JobSet controller and kubelet would have produced.
pub async fn completes_two_replica_jobset(server: &ApiServer) {
    let client: Client = server.client().await.unwrap();
    let sim = Simulator::start(client.clone(), SimConfig::default());
    let jobsets: Api<JobSet> = Api::namespaced(client.clone(), "default");
    let js = two_replica_jobset(
        "ok",
        json!([{"name": "STANDIN_RUN_MS", "value": "100"}]),
        None,
    );
    jobsets
        .patch("ok", &PatchParams::apply("test"), &Patch::Apply(&js))
        .await
        .unwrap();
    let done = wait_for(&jobsets, "ok", finished).await;
    let status = done.status.unwrap();
    assert_eq!(
        status.terminal_state.as_deref(),
        Some("Completed"),
        "{}: {status:?}",
        server.name()
    );
    let completed = status
        .condition("Completed")
        .expect("a Completed condition");
    assert_eq!(
        (completed.status.as_str(), completed.reason.as_str()),
        ("True", "AllJobsCompleted")
    );
    let rjobs = status.replicated_jobs_status.unwrap();
    let counts: Vec<(&str, i32, i32, i32)> = rjobs
        .iter()
        .map(|r| (r.name.as_str(), r.succeeded, r.failed, r.active))
        .collect();
    assert_eq!(
        counts,
        [("initializer", 1, 0, 0), ("node", 2, 0, 0)],
        "{}",
        server.name()
    );

    // The trainer started only after the initializer completed.
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let init = jobs.get("ok-initializer-0").await.unwrap();
    let node = jobs.get("ok-node-1").await.unwrap();
    let init_done = init.status.unwrap().completion_time.unwrap().0;
    let node_created = node.metadata.creation_timestamp.clone().unwrap().0;
    assert!(
        node_created
            >= init_done.round(jiff::Unit::Second).unwrap() - jiff::SignedDuration::from_secs(1)
    );
    assert_eq!(
        node.metadata.labels.unwrap()["jobset.sigs.k8s.io/job-index"],
        "1"
    );

    // Pods: named after their Job and index, with the labels the SDK reads.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let list =
        pods.list(&ListParams::default().labels(
            "jobset.sigs.k8s.io/jobset-name=ok,jobset.sigs.k8s.io/replicatedjob-name=node",
        ))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 2, "{}", server.name());
    for pod in &list.items {
        let name = pod.metadata.name.clone().unwrap();
        assert!(
            name.starts_with("ok-node-0-0-") || name.starts_with("ok-node-1-0-"),
            "{name}"
        );
        assert_eq!(
            pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Succeeded")
        );
        assert!(pod.spec.as_ref().unwrap().node_name.is_some());
        let env = pod.spec.as_ref().unwrap().containers[0]
            .env
            .clone()
            .unwrap();
        assert!(env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX"));
    }
    let log = pods
        .logs(
            &list.items[0].metadata.name.clone().unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
    assert!(
        log.contains(list.items[0].metadata.name.as_deref().unwrap()),
        "{log}"
    );
    sim.stop().await;
}

#[tokio::test]
async fn simulator_completes_a_jobset_with_an_initializer() {
    let server = ApiServer::Standin(Standin::start(StandinConfig::default()).await.unwrap());
    completes_two_replica_jobset(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn failing_pods_restart_the_jobset_then_fail_it() {
    let standin = Standin::start(StandinConfig::default()).await.unwrap();
    let client = standin.client().await.unwrap();
    let sim = Simulator::start(client.clone(), SimConfig::default());
    let jobsets: Api<JobSet> = Api::namespaced(client.clone(), "default");
    let js = two_replica_jobset(
        "bad",
        json!([{"name": "STANDIN_RUN_MS", "value": "50"}, {"name": "STANDIN_EXIT_CODE", "value": "3"}]),
        Some(json!({"maxRestarts": 1})),
    );
    jobsets
        .patch("bad", &PatchParams::apply("test"), &Patch::Apply(&js))
        .await
        .unwrap();
    let done = wait_for(&jobsets, "bad", finished).await;
    let status = done.status.unwrap();
    assert_eq!(status.terminal_state.as_deref(), Some("Failed"));
    assert_eq!(status.restarts, Some(1));
    let failed = status.condition("Failed").expect("a Failed condition");
    assert_eq!(failed.reason, "ReachedMaxRestarts");
    // The Jobs of the second attempt carry its number.
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job = jobs.get("bad-node-0").await.unwrap();
    assert_eq!(
        job.metadata.labels.unwrap()["jobset.sigs.k8s.io/restart-attempt"],
        "1"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let failed_pods = pods
        .list(&ListParams::default().fields("status.phase=Failed"))
        .await
        .unwrap();
    let code = failed_pods.items[0]
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
        .exit_code;
    assert_eq!(code, 3);
    sim.stop().await;
    standin.shutdown().await;
}

#[tokio::test]
async fn foreground_deletion_removes_jobs_and_pods_first() {
    let standin = Standin::start(StandinConfig::default()).await.unwrap();
    let client = standin.client().await.unwrap();
    let sim = Simulator::start(client.clone(), SimConfig::default());
    let jobsets: Api<JobSet> = Api::namespaced(client.clone(), "default");
    let js = two_replica_jobset(
        "gone",
        json!([{"name": "STANDIN_RUN_MS", "value": "600000"}]),
        None,
    );
    jobsets
        .patch("gone", &PatchParams::apply("test"), &Patch::Apply(&js))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let running = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Running")
    };
    // The initializer's pod runs; find it by label and wait for it.
    let pod_name = loop {
        let list = pods
            .list(&ListParams::default().labels("jobset.sigs.k8s.io/jobset-name=gone"))
            .await
            .unwrap();
        if let Some(p) = list.items.first() {
            break p.metadata.name.clone().unwrap();
        }
        tokio::task::yield_now().await;
    };
    wait_for(&pods, &pod_name, running).await;
    sim.stop().await;

    let deleted = jobsets
        .delete("gone", &DeleteParams::foreground())
        .await
        .unwrap();
    // Foreground: the JobSet is still there, marked, until its dependents are gone.
    if let Some(js) = deleted.left() {
        assert!(js.metadata.deletion_timestamp.is_some());
        assert!(
            js.metadata
                .finalizers
                .unwrap()
                .contains(&"foregroundDeletion".to_string())
        );
    }
    crate::wait_deleted(&jobsets, "gone").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    assert!(
        jobs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    standin.shutdown().await;
}
