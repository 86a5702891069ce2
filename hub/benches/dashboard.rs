//! The dashboard's TrainJobs page with 10,000 TrainJobs in the store: the
//! time from request to the whole page, through the hub's own router
//! (authentication, authorization, filter, sort, page, render), in this
//! process and without TLS.
//!
//! `cargo bench -p trainhub --bench dashboard -- [--jobs N] [--requests R]`
//! (defaults: 10000 TrainJobs, 200 requests per page). Prints p50 and p99
//! per page, and fails when a p99 is over 100 ms.

use std::time::{Duration, Instant};

use axum::body::Body;
use serde_json::json;
use tower::ServiceExt as _;
use trainhub::hub::Hub;
use trainhub_apiserver::store::{Key, Op};

// The allocator the `trainhub` binary uses, as it uses it.
trainhub::jemalloc!();

#[path = "support/mod.rs"]
mod support;

const BUDGET: Duration = Duration::from_millis(100);

fn main() {
    let jobs = support::arg("--jobs", 10_000);
    let requests = support::arg("--requests", 200);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let over = runtime.block_on(run(jobs, requests));
    if over {
        eprintln!("FAIL: a page's p99 is over {BUDGET:?}");
        std::process::exit(1);
    }
}

/// A TrainJob as the hub stores one after a while: placed or not,
/// finished or not, with labels and progress.
fn trainjob(i: usize) -> serde_json::Value {
    let namespace = format!("team-{}", i % 10);
    let mut job = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": format!("job-{i:05}"),
            "namespace": namespace,
            "uid": format!("00000000-0000-0000-0000-{i:012}"),
            "creationTimestamp": format!("2026-01-01T{:02}:{:02}:{:02}Z", (i / 3600) % 24, (i / 60) % 60, i % 60),
            "generation": 1,
            "labels": {"kueue.x-k8s.io/queue-name": format!("queue-{}", i % 4), "tier": if i.is_multiple_of(3) { "gold" } else { "silver" }},
            "annotations": {"trainhub.kubeflow.org/trace-id": format!("{i:032x}")},
        },
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"},
            "suspend": false,
            "trainer": {"numNodes": 2, "command": ["torchrun", "train.py"], "resourcesPerNode": {"requests": {"cpu": "4", "memory": "16Gi"}}},
        },
        "status": {"conditions": []},
    });
    if i.is_multiple_of(2) {
        job["metadata"]["annotations"]["trainhub.kubeflow.org/spoke"] =
            json!(format!("spoke-{}", i % 8));
        job["status"]["trainerStatus"] =
            json!({"progressPercentage": i % 100, "estimatedRemainingSeconds": 600});
    }
    if i.is_multiple_of(5) {
        job["status"]["conditions"] = json!([{"type": "Complete", "status": "True", "reason": "AllJobsCompleted",
            "message": "jobset completed successfully", "lastTransitionTime": "2026-01-01T12:00:00Z"}]);
    }
    job
}

async fn run(jobs: usize, requests: usize) -> bool {
    let dir = tempfile::tempdir().expect("temp dir");
    let (pki, _ca) = support::pki_and_token(dir.path());
    let hub = Hub::open(support::hub_config(dir.path(), &pki, false)).expect("hub");
    let started = Instant::now();
    let all: Vec<usize> = (0..jobs).collect();
    for chunk in all.chunks(trainhub_apiserver::store::MAX_COMMIT_OPS) {
        let ops = chunk
            .iter()
            .map(|&i| {
                let value = trainjob(i);
                let key = Key::new(
                    trainhub::api::TRAINJOBS,
                    value["metadata"]["namespace"].as_str(),
                    value["metadata"]["name"].as_str().unwrap_or_default(),
                );
                Op::Create { key, value }
            })
            .collect();
        hub.store.commit(ops).await.expect("storing TrainJobs");
    }
    println!("stored {jobs} TrainJobs in {:?}", started.elapsed());
    let router = hub.server.router();
    let get = |path: String| {
        let router = router.clone();
        async move {
            let request = axum::http::Request::builder()
                .uri(&path)
                .header("authorization", format!("Bearer {}", support::TOKEN))
                .body(Body::empty())
                .expect("request");
            let started = Instant::now();
            let response = router.oneshot(request).await.expect("response");
            assert_eq!(response.status(), 200, "{path}");
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            let elapsed = started.elapsed();
            assert!(body.len() > 1000, "{path}: a page");
            elapsed
        }
    };
    let cold = get("/dashboard/trainjobs".into()).await;
    println!("first page (every TrainJob decoded once): {cold:?}");
    let pages = [
        "/dashboard/trainjobs",
        "/dashboard/trainjobs?state=Running&queue=queue-2&label=tier%3Dgold",
        "/dashboard/trainjobs?sort=name&order=asc&page=100&size=50",
        "/dashboard/trainjobs?prefix=job-0999&size=500",
        "/dashboard/",
    ];
    let mut over = false;
    println!("| page | p50 | p99 |\n|---|---|---|");
    for page in pages {
        let mut times = Vec::with_capacity(requests);
        for _ in 0..requests {
            times.push(get(page.to_string()).await);
        }
        times.sort();
        let p = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize];
        let (p50, p99) = (p(0.50), p(0.99));
        over |= p99 > BUDGET;
        println!(
            "| `{page}` | {:.1} ms | {:.1} ms |",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    over
}
