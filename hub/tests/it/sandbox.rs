//! The sandbox: faults in one plugin fail that call, clearly, and nothing else.

use std::sync::Arc;
use std::time::{Duration, Instant};

use trainhub::plugins::{Limits, LoadedPlugin, PluginError};

use crate::common::{host, torch_job_json, torch_runtime_json, wasm};

fn misbehaving(mode: &str, limits: Limits) -> Arc<LoadedPlugin> {
    host()
        .load(
            "misbehaving.wasm",
            &wasm("trainhub_test_plugin_misbehaving"),
            &serde_json::json!({ "mode": mode }),
            limits,
        )
        .expect("the misbehaving plugin loads; it misbehaves only when called")
}

/// A well-behaved built-in, loaded in the same host, still answers.
fn host_still_serves() {
    let torch = host()
        .load(
            "torch.wasm",
            &wasm("trainhub_plugin_torch"),
            &serde_json::json!({}),
            Limits::default(),
        )
        .expect("torch loads");
    let validation = torch
        .validate(&torch_job_json(), &torch_runtime_json())
        .expect("torch validates");
    assert!(validation.errors.is_empty(), "{:?}", validation.errors);
}

fn assert_names_plugin(err: &PluginError) {
    let text = err.to_string();
    assert!(
        text.contains("misbehaving") && text.contains("sha256:"),
        "error must name the plugin and digest: {text}"
    );
}

#[test]
fn looping_plugin_fails_within_its_deadline() {
    let plugin = misbehaving(
        "loop",
        Limits {
            deadline: Duration::from_millis(200),
            ..Limits::default()
        },
    );
    let started = Instant::now();
    let err = plugin
        .validate(&torch_job_json(), &torch_runtime_json())
        .expect_err("a loop cannot succeed");
    let elapsed = started.elapsed();
    assert!(
        matches!(err, PluginError::Timeout { .. }),
        "expected a timeout, got: {err}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "stopped after {elapsed:?}, deadline 200ms"
    );
    assert_names_plugin(&err);
    host_still_serves();
}

#[test]
fn looping_plugin_does_not_block_other_calls() {
    let plugin = misbehaving(
        "loop",
        Limits {
            deadline: Duration::from_secs(3),
            ..Limits::default()
        },
    );
    let looping =
        std::thread::spawn(move || plugin.validate(&torch_job_json(), &torch_runtime_json()));
    // While the loop burns its budget on another thread, other calls finish.
    let started = Instant::now();
    for _ in 0..5 {
        host_still_serves();
    }
    assert!(!looping.is_finished() || started.elapsed() >= Duration::from_secs(3));
    let err = looping.join().expect("thread").expect_err("loop times out");
    assert!(matches!(err, PluginError::Timeout { .. }), "{err}");
}

#[test]
fn memory_hog_fails_at_its_cap() {
    let plugin = misbehaving(
        "oom",
        Limits {
            memory: 32 << 20,
            ..Limits::default()
        },
    );
    let err = plugin
        .validate(&torch_job_json(), &torch_runtime_json())
        .expect_err("unbounded allocation fails");
    match &err {
        PluginError::OutOfMemory { limit, .. } => assert_eq!(*limit, 32 << 20),
        other => panic!("expected memory exhaustion, got: {other}"),
    }
    assert!(err.to_string().contains("32 MiB"), "{err}");
    assert_names_plugin(&err);
    host_still_serves();
}

#[test]
fn trapping_plugin_fails_cleanly() {
    let plugin = misbehaving("trap", Limits::default());
    let err = plugin
        .validate(&torch_job_json(), &torch_runtime_json())
        .expect_err("a panic is a trap");
    assert!(
        matches!(err, PluginError::Trap { .. }),
        "expected a trap, got: {err}"
    );
    // The panic message reaches the error through the captured stderr.
    assert!(err.to_string().contains("panics on purpose"), "{err}");
    assert_names_plugin(&err);
    host_still_serves();
}

#[test]
fn garbage_output_is_malformed() {
    let snapshot =
        trainhub::plugins::Snapshot::new(vec![misbehaving("garbage", Limits::default())
            as Arc<dyn trainhub::plugins::pipeline::PhasePlugin>]);
    let job: trainhub_api::trainer::TrainJob =
        serde_json::from_str(&torch_job_json()).expect("job");
    let mut runtime: trainhub_plugin_sdk::Runtime =
        serde_json::from_str(&torch_runtime_json()).expect("runtime");
    if let trainhub_plugin_sdk::Runtime::ClusterTrainingRuntime(r) = &mut runtime {
        r.metadata.labels.get_or_insert_default().insert(
            "trainer.kubeflow.org/framework".into(),
            "misbehaving".into(),
        );
    }
    let pipeline = trainhub::plugins::Pipeline::select(&snapshot, &runtime).expect("select");
    let err = pipeline
        .build(
            &job,
            &runtime,
            &trainhub_plugin_sdk::testing::target("spoke-a"),
        )
        .expect_err("garbage is refused");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            trainhub::plugins::PipelineError::Plugin(PluginError::Malformed { .. })
        ),
        "expected malformed output, got: {text}"
    );
    assert!(
        text.contains("misbehaving") && text.contains("apiVersion"),
        "{text}"
    );
    host_still_serves();
}

fn assert_refused(stem: &str, interface: &str) {
    let err = host()
        .load(stem, &wasm(stem), &serde_json::json!({}), Limits::default())
        .expect_err("a component importing ungranted WASI is refused at load");
    match &err {
        PluginError::ForbiddenImport { imports, .. } => assert!(
            imports.iter().any(|i| i.starts_with(interface)),
            "refused for {imports:?}, expected {interface}"
        ),
        other => panic!("expected a refused import, got: {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("does not grant") && text.contains(interface) && text.contains("sha256:"),
        "{text}"
    );
    host_still_serves();
}

#[test]
fn plugin_importing_filesystem_is_refused_at_load() {
    assert_refused("trainhub_test_plugin_uses_fs", "wasi:filesystem/");
}

#[test]
fn plugin_importing_sockets_is_refused_at_load() {
    assert_refused("trainhub_test_plugin_uses_net", "wasi:sockets/");
}

#[test]
fn invalid_settings_are_refused_at_load() {
    let err = host()
        .load(
            "misbehaving.wasm",
            &wasm("trainhub_test_plugin_misbehaving"),
            &serde_json::json!({"mode": "explode"}),
            Limits::default(),
        )
        .expect_err("unknown mode");
    let text = err.to_string();
    assert!(matches!(err, PluginError::Settings { .. }), "{text}");
    assert!(
        text.contains("settings.mode") && text.contains("explode"),
        "{text}"
    );
}

#[test]
fn not_a_component_is_refused_at_load() {
    let err = host()
        .load(
            "junk.wasm",
            b"\0asm but not really",
            &serde_json::json!({}),
            Limits::default(),
        )
        .expect_err("junk");
    assert!(matches!(err, PluginError::Load { .. }), "{err}");
    assert!(err.to_string().contains("junk.wasm"), "{err}");
}

#[test]
fn compiled_components_are_shared_by_digest() {
    let a = misbehaving("ok", Limits::default());
    let b = misbehaving("ok", Limits::default());
    assert_eq!(a.id().digest, b.id().digest);
    assert!(a.id().digest.starts_with("sha256:") && a.id().digest.len() == 7 + 64);
}
