//! kube-rs, a real client: watches across a hub restart, a crash under
//! load, and authentication and authorization.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::common::DevHub;

fn trainjobs() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("trainer.kubeflow.org", "v1alpha1", "TrainJob"),
        "trainjobs",
    )
}

fn cluster_runtimes() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime"),
        "clustertrainingruntimes",
    )
}

fn trainjob(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": "python-distributed"},
            "trainer": {"image": "python:3.11-slim", "command": ["python3", "-c", "print('hi')"]},
        },
    }))
    .expect("a TrainJob")
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Waits until the watcher reports `name`.
async fn wait_for(seen: &mut tokio::sync::mpsc::UnboundedReceiver<String>, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut others = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, seen.recv()).await {
            Ok(Some(n)) if n == name => return,
            Ok(Some(n)) => others.push(n),
            _ => panic!("the watcher did not see {name} (saw {others:?})"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_watcher_follows_trainjobs_across_a_hub_restart() {
    let mut hub = DevHub::start();
    let client = hub.client().await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &trainjobs());
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let watch_api = api.clone();
    let watching = tokio::spawn(async move {
        let mut stream = watcher(watch_api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(item) = stream.next().await {
            if let Ok(object) = item {
                let _ = seen_tx.send(object.metadata.name.unwrap_or_default());
            }
        }
    });
    api.create(&PostParams::default(), &trainjob("before-restart"))
        .await
        .expect("create before the restart");
    wait_for(&mut seen_rx, "before-restart").await;

    hub.restart();

    let client = hub.client().await;
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &trainjobs());
    api.create(&PostParams::default(), &trainjob("after-restart"))
        .await
        .expect("create after the restart");
    wait_for(&mut seen_rx, "after-restart").await;
    watching.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_acknowledged_before_a_sigkill_survive_it() {
    const JOBS: usize = 1000;
    const CONCURRENCY: usize = 16;
    let mut hub = DevHub::start();
    let api: Api<DynamicObject> = Api::namespaced_with(hub.client().await, "default", &trainjobs());
    let killed = Arc::new(AtomicBool::new(false));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let (api, next, done_tx, killed) =
            (api.clone(), next.clone(), done_tx.clone(), killed.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= JOBS {
                    return;
                }
                let name = format!("crash-{i:04}");
                // Retry through the outage; a create whose answer was lost
                // is found on retry (409 AlreadyExists), never duplicated.
                loop {
                    let after_kill = killed.load(Ordering::SeqCst);
                    match api.create(&PostParams::default(), &trainjob(&name)).await {
                        Ok(created) => {
                            let rv: u64 = created
                                .metadata
                                .resource_version
                                .unwrap_or_default()
                                .parse()
                                .unwrap_or(0);
                            let uid = created.metadata.uid.unwrap_or_default();
                            let _ = done_tx.send((name.clone(), Some((rv, uid, after_kill))));
                            break;
                        }
                        Err(e) if api_code(&e) == Some(409) => {
                            let _ = done_tx.send((name.clone(), None));
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            }
        }));
    }
    drop(done_tx);
    // Kill at a random moment while creates are in flight.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let kill_after = Duration::from_millis(200 + u64::from(nanos % 1500));
    tokio::time::sleep(kill_after).await;
    hub.kill();
    killed.store(true, Ordering::SeqCst);
    let acked_before_kill = next.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    hub.start_again();
    for w in workers {
        w.await.expect("worker");
    }
    let mut created = BTreeMap::new();
    let mut found_on_retry = 0;
    while let Some((name, outcome)) = done_rx.recv().await {
        match outcome {
            Some(o) => {
                created.insert(name, o);
            }
            None => found_on_retry += 1,
        }
    }
    assert!(
        acked_before_kill > 0,
        "the kill came before any create was sent"
    );
    assert_eq!(created.len() + found_on_retry, JOBS);

    let api: Api<DynamicObject> = Api::namespaced_with(hub.client().await, "default", &trainjobs());
    let list = api
        .list(&ListParams::default())
        .await
        .expect("list after restart");
    let stored: BTreeMap<String, (u64, String)> = list
        .items
        .iter()
        .map(|o| {
            let rv = o
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default()
                .parse()
                .unwrap_or(0);
            (
                o.metadata.name.clone().unwrap_or_default(),
                (rv, o.metadata.uid.clone().unwrap_or_default()),
            )
        })
        .collect();
    // Every acknowledged create is there, unchanged; nothing is duplicated.
    assert_eq!(list.items.len(), JOBS, "one object per name");
    let uids: HashSet<&String> = stored.values().map(|(_, uid)| uid).collect();
    assert_eq!(uids.len(), JOBS, "uids are unique");
    for (name, (rv, uid, _)) in &created {
        let (stored_rv, stored_uid) = stored
            .get(name)
            .unwrap_or_else(|| panic!("{name} was acknowledged but lost"));
        assert_eq!((stored_rv, stored_uid), (rv, uid), "{name} changed");
    }
    // resourceVersions never go backwards: everything acknowledged after the
    // restart is newer than everything acknowledged before the kill.
    let before = created
        .values()
        .filter(|(_, _, after)| !after)
        .map(|(rv, _, _)| *rv)
        .max();
    let after = created
        .values()
        .filter(|(_, _, after)| *after)
        .map(|(rv, _, _)| *rv)
        .min();
    if let (Some(before), Some(after)) = (before, after) {
        assert!(
            after > before,
            "resourceVersion went back from {before} to {after}"
        );
    }
    let list_rv: u64 = list
        .metadata
        .resource_version
        .unwrap_or_default()
        .parse()
        .unwrap_or(0);
    assert!(created.values().all(|(rv, _, _)| *rv <= list_rv));
    eprintln!(
        "crash test: killed after {kill_after:?}; {} acknowledged with 201, {found_on_retry} found on retry",
        created.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_and_unauthorized_requests_are_refused() {
    let hub = DevHub::start_with(|dir| {
        // The first line is the dev admin; alice works in team-a only.
        std::fs::write(
            dir.join("tokens.csv"),
            "admin-token-0123456789,admin,admin,\"system:masters\"\nalice-token-0123456789,alice,alice-uid,\"team-a\"\n",
        )
        .expect("tokens");
        std::fs::write(
            dir.join("policy.yaml"),
            "namespaces:\n  - namespace: team-a\n    groups: [team-a]\n",
        )
        .expect("policy");
    });
    let as_user = |token: Option<&str>| {
        let kubeconfig = hub.kubeconfig();
        let token = token.map(str::to_string);
        async move {
            let raw = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
            let mut config = kube::Config::from_custom_kubeconfig(raw, &Default::default())
                .await
                .expect("config");
            config.auth_info.token = token.map(|t| t.into());
            kube::Client::try_from(config).expect("client")
        }
    };
    // The admin creates alice's namespace, as on any cluster.
    hub.kubectl_ok(&["create", "namespace", "team-a"]);
    let anonymous = as_user(None).await;
    let e = Api::<DynamicObject>::namespaced_with(anonymous, "default", &trainjobs())
        .list(&ListParams::default())
        .await
        .expect_err("no token");
    assert_eq!(api_code(&e), Some(401), "{e}");

    let alice = as_user(Some("alice-token-0123456789")).await;
    let own = Api::<DynamicObject>::namespaced_with(alice.clone(), "team-a", &trainjobs());
    own.create(&PostParams::default(), &trainjob("alices-job"))
        .await
        .expect("alice creates in team-a");
    let other = Api::<DynamicObject>::namespaced_with(alice.clone(), "default", &trainjobs());
    let e = other
        .create(&PostParams::default(), &trainjob("not-hers"))
        .await
        .expect_err("another namespace");
    assert_eq!(api_code(&e), Some(403), "{e}");
    assert!(
        e.to_string()
            .contains("User \"alice\" cannot create resource \"trainjobs\""),
        "{e}"
    );

    let runtimes = Api::<DynamicObject>::all_with(alice, &cluster_runtimes());
    let listed = runtimes
        .list(&ListParams::default())
        .await
        .expect("alice lists cluster runtimes");
    assert!(
        listed
            .items
            .iter()
            .any(|r| r.metadata.name.as_deref() == Some("torch-distributed"))
    );
    let mut runtime = listed.items[0].clone();
    runtime.metadata = kube::core::ObjectMeta {
        name: Some("alices-runtime".into()),
        ..Default::default()
    };
    let e = runtimes
        .create(&PostParams::default(), &runtime)
        .await
        .expect_err("non-admin cluster runtime");
    assert_eq!(api_code(&e), Some(403), "{e}");
}
