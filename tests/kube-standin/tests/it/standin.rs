//! The stand-in's Kubernetes semantics, through kube-rs and kubectl.

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, ResourceExt};
use serde_json::json;
use trainhub_kube_standin::{Standin, StandinConfig};

fn cm(name: &str, data: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

#[tokio::test]
async fn server_side_apply_creates_updates_conflicts_and_forces() {
    let standin = Standin::start(StandinConfig::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(standin.client().await.unwrap(), "default");
    let spoke = PatchParams::apply("spoke");
    let created = api
        .patch("c", &spoke, &Patch::Apply(cm("c", json!({"a": "1"}))))
        .await
        .unwrap();
    assert!(created.resource_version().is_some());
    let managers: Vec<String> = created
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["spoke"]);

    let updated = api
        .patch("c", &spoke, &Patch::Apply(cm("c", json!({"a": "2"}))))
        .await
        .unwrap();
    assert_eq!(updated.data.unwrap()["a"], "2");
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );

    // Another manager changing a field the spoke owns: 409 naming the field.
    let other = PatchParams::apply("other");
    let err = api
        .patch("c", &other, &Patch::Apply(cm("c", json!({"a": "3"}))))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409, "{s:?}");
            assert!(
                s.message.contains("spoke") && s.message.contains("data.a"),
                "{}",
                s.message
            );
        }
        e => panic!("expected a conflict, got {e}"),
    }
    let forced = api
        .patch(
            "c",
            &other.force(),
            &Patch::Apply(cm("c", json!({"a": "3"}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["a"], "3");

    // Create-exists and a stale resourceVersion are 409 too.
    let mut plain: ConfigMap = serde_json::from_value(cm("c", json!({}))).unwrap();
    let e = api
        .create(&PostParams::default(), &plain)
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{e}"
    );
    plain.metadata.resource_version = created.metadata.resource_version.clone();
    let e = api
        .replace("c", &PostParams::default(), &plain)
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{e}"
    );

    // A missing namespace is 404, as the NamespaceLifecycle plugin answers.
    let nowhere: Api<ConfigMap> = Api::namespaced(standin.client().await.unwrap(), "nowhere");
    let e = nowhere
        .patch("c", &spoke, &Patch::Apply(cm("c", json!({}))))
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 404 && s.message.contains("namespaces \"nowhere\" not found")),
        "{e}"
    );
    let namespaces: Api<Namespace> = Api::all(standin.client().await.unwrap());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "nowhere"}})).unwrap(),
        )
        .await
        .unwrap();
    nowhere
        .patch("c", &spoke, &Patch::Apply(cm("c", json!({}))))
        .await
        .unwrap();
    standin.shutdown().await;
}

/// The next event of a watch other than a bookmark, with a deadline.
async fn next<S>(stream: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures_util::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("no watch event within 10 s")
            .expect("the watch ended")
            .expect("a watch error");
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return event;
        }
    }
}

#[tokio::test]
async fn watches_resume_end_on_close_and_expire_after_compaction() {
    let standin = Standin::start(StandinConfig::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(standin.client().await.unwrap(), "default");
    let first = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(cm("one", json!({}))).unwrap(),
        )
        .await
        .unwrap();
    let rv = first.resource_version().unwrap();
    api.create(
        &PostParams::default(),
        &serde_json::from_value(cm("two", json!({}))).unwrap(),
    )
    .await
    .unwrap();

    // Resuming from the first object's version replays what came after it.
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut stream).await {
        WatchEvent::Added(o) => assert_eq!(o.name_any(), "two"),
        e => panic!("expected two ADDED, got {e:?}"),
    }
    // Closing every watch ends the stream; the client resumes from its last version.
    standin.close_watches();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next()).await;
    assert!(
        matches!(ended, Ok(None)),
        "the watch did not end: {ended:?}"
    );
    let list = api.list(&ListParams::default()).await.unwrap();
    let list_rv = list.metadata.resource_version.clone().unwrap();
    assert_eq!(list.items.len(), 2);
    let mut resumed = api
        .watch(&WatchParams::default(), &list_rv)
        .await
        .unwrap()
        .boxed();
    api.delete("one", &DeleteParams::default()).await.unwrap();
    match next(&mut resumed).await {
        WatchEvent::Deleted(o) => {
            assert_eq!(o.name_any(), "one");
            assert!(
                o.resource_version().unwrap().parse::<u64>().unwrap()
                    > list_rv.parse::<u64>().unwrap()
            );
        }
        e => panic!("expected one DELETED, got {e:?}"),
    }

    // After compaction, the old version is gone: 410.
    standin.compact();
    let mut expired = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut expired).await {
        WatchEvent::Error(e) => assert_eq!(e.code, 410, "{e:?}"),
        e => panic!("expected 410 Gone, got {e:?}"),
    }
    standin.shutdown().await;
}

#[tokio::test]
async fn kubectl_lists_pods_with_the_kubeconfig() {
    let standin = Standin::start(StandinConfig::default()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(standin.client().await.unwrap(), "default");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"},
                     "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(standin.kubeconfig())
        .args(["get", "pods"])
        .output()
        .await
        .expect("kubectl is installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("hello") && stdout.contains("Pending"),
        "{stdout}"
    );
    standin.shutdown().await;
}
