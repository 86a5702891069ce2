//! Custom plugins come, change and go while the host runs.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use trainhub::plugins::{Registry, Snapshot};
use trainhub::render::{Inputs, RenderError, render};

use crate::common::{documents, host, repo_dir, wasm};

fn acme_inputs(with_project: bool) -> Inputs {
    let mut inputs = Inputs::default();
    let mut job = documents(&repo_dir().join("examples/acme/trainjob.yaml"));
    if !with_project {
        job[0]["spec"]["trainer"]["env"] = Value::Array(Vec::new());
    }
    inputs.add("trainjob.yaml", job).expect("job");
    inputs
        .add(
            "runtime.yaml",
            documents(&repo_dir().join("examples/acme/runtime.yaml")),
        )
        .expect("runtime");
    inputs
}

/// The node container's env of the rendered JobSet, as `NAME=value` lines.
fn node_env(snapshot: &Snapshot) -> String {
    let (objects, _) = render(
        &acme_inputs(true),
        snapshot,
        &trainhub_plugin_sdk::testing::target("spoke-a"),
    )
    .expect("render");
    let containers = &objects[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        ["containers"];
    let mut out = String::new();
    for c in containers.as_array().expect("containers") {
        out.push_str(&format!(
            "container {}\n",
            c["name"].as_str().unwrap_or_default()
        ));
        for e in c["env"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "{}={}\n",
                e["name"].as_str().unwrap_or_default(),
                e.get("value").and_then(Value::as_str).unwrap_or("<from>")
            ));
        }
    }
    out
}

fn install(dir: &Path, cluster: &str, extra_section: Option<&str>) {
    let mut bytes = wasm("acme_plugin");
    if let Some(note) = extra_section {
        // A custom section: the same plugin, a different file and digest.
        let name = b"note";
        let payload_len = 1 + name.len() + note.len();
        bytes.push(0);
        bytes.push(u8::try_from(payload_len).expect("short note"));
        bytes.push(name.len() as u8);
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(note.as_bytes());
    }
    std::fs::write(
        dir.join("acme.yaml"),
        format!("settings:\n  cluster: {cluster}\n"),
    )
    .expect("sidecar");
    std::fs::write(dir.join("acme.wasm"), bytes).expect("component");
}

#[test]
fn custom_plugin_is_added_replaced_and_removed_without_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host();
    let builtins = trainhub::builtin::load(&host).expect("built-ins");
    let registry = Registry::new(host, builtins, Some(dir.path().to_path_buf()));

    // Without the plugin the runtime falls back to plainml: no ACME env.
    let before = registry.rescan();
    assert!(before.get("acme").is_none());
    assert!(!node_env(&before).contains("ACME_CLUSTER"));

    install(dir.path(), "acme-gpu-east", None);
    let first = registry.rescan();
    let first_digest = first.get("acme").expect("acme loaded").id().digest.clone();
    let env = node_env(&first);
    assert!(env.contains("ACME_CLUSTER=acme-gpu-east"), "{env}");
    assert!(env.contains("ACME_NUM_NODES=2"), "{env}");
    assert!(env.contains("container acme-agent"), "{env}");
    // Its PreExecution validation now applies too.
    match render(
        &acme_inputs(false),
        &first,
        &trainhub_plugin_sdk::testing::target("spoke-a"),
    ) {
        Err(RenderError::Invalid { errors, .. }) => {
            assert_eq!(errors[0].field, "spec.trainer.env");
            assert!(errors[0].detail.contains("ACME_PROJECT"));
        }
        other => panic!("expected the acme validation error, got {other:?}"),
    }

    // Replace the component (new digest) and its settings.
    install(dir.path(), "acme-gpu-west", Some("v2"));
    let second = registry.rescan();
    let second_digest = second
        .get("acme")
        .expect("acme still loaded")
        .id()
        .digest
        .clone();
    assert_ne!(first_digest, second_digest);
    assert!(node_env(&second).contains("ACME_CLUSTER=acme-gpu-west"));
    // A pipeline run that started on the first version finishes on it.
    assert!(node_env(&first).contains("ACME_CLUSTER=acme-gpu-east"));
    assert_eq!(first.get("acme").expect("held").id().digest, first_digest);

    std::fs::remove_file(dir.path().join("acme.wasm")).expect("remove");
    std::fs::remove_file(dir.path().join("acme.yaml")).expect("remove");
    let third = registry.rescan();
    assert!(third.get("acme").is_none());
    assert!(!node_env(&third).contains("ACME_CLUSTER"));
}

#[test]
fn a_broken_file_is_reported_and_the_previous_version_stays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::new(host(), Vec::new(), Some(dir.path().to_path_buf()));
    install(dir.path(), "acme-gpu-east", None);
    let good = registry.rescan();
    let digest = good.get("acme").expect("loaded").id().digest.clone();

    std::fs::write(dir.path().join("acme.yaml"), "settings: {}\n")
        .expect("sidecar without cluster");
    let after = registry.rescan();
    assert_eq!(
        after
            .get("acme")
            .expect("previous version kept")
            .id()
            .digest,
        digest
    );
    let (file, problem) = after.problems().first().expect("the problem is reported");
    assert!(file.ends_with("acme.wasm"));
    assert!(problem.contains("settings.cluster"), "{problem}");
}

#[test]
fn the_watcher_picks_up_a_new_plugin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Arc::new(Registry::new(
        host(),
        Vec::new(),
        Some(dir.path().to_path_buf()),
    ));
    registry.watch(Duration::from_millis(50)).expect("watch");
    install(dir.path(), "acme-gpu-east", None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while registry.snapshot().get("acme").is_none() {
        assert!(
            Instant::now() < deadline,
            "the watcher did not load acme.wasm within 30s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While a `TrainerPlugin` loads for the first time, a TrainJob that would
/// otherwise fall back to `plainml` is held (a transient error naming the
/// plugin), unless the object names frameworks that are not the runtime's.
#[test]
fn a_trainjob_waits_for_a_plugin_loading_for_the_first_time_instead_of_falling_back() {
    use trainhub::plugins::Loading;
    let host = host();
    let registry = Registry::new(
        host.clone(),
        trainhub::builtin::load(&host).expect("built-ins"),
        None,
    );
    let render_now = || {
        render(
            &acme_inputs(true),
            &registry.snapshot(),
            &trainhub_plugin_sdk::testing::target("spoke-a"),
        )
    };
    assert!(render_now().is_ok(), "falls back to plainml");

    for frameworks in [vec![], vec!["acme".to_string()]] {
        registry.set_loading(vec![Loading {
            name: "acme".into(),
            frameworks,
        }]);
        let e = render_now().expect_err("held while acme loads");
        let text = e.to_string();
        assert!(text.contains("TrainerPlugin \"acme\" is loading"), "{text}");
    }
    // An object for other frameworks holds nothing.
    registry.set_loading(vec![Loading {
        name: "jaxish".into(),
        frameworks: vec!["jaxish".into()],
    }]);
    assert!(render_now().is_ok());
    registry.set_loading(Vec::new());
    assert!(render_now().is_ok());
}
