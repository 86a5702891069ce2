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
fn looping_plugin_fails_at_its_cpu_budget() {
    let plugin = misbehaving(
        "loop",
        Limits {
            cpu: Duration::from_millis(200),
            ..Limits::default()
        },
    );
    let started = Instant::now();
    let err = plugin
        .validate(&torch_job_json(), &torch_runtime_json())
        .expect_err("a loop cannot succeed");
    let elapsed = started.elapsed();
    match &err {
        PluginError::CpuExhausted { budget, used, .. } => {
            assert_eq!(*budget, Duration::from_millis(200));
            assert!(*used >= *budget, "stopped after {used:?} of CPU");
        }
        other => panic!("expected the CPU budget exhausted, got: {other}"),
    }
    assert!(!err.is_transient(), "a runaway plugin is its own fault");
    assert!(err.to_string().contains("CPU budget"), "{err}");
    assert!(
        elapsed < Duration::from_secs(5),
        "stopped after {elapsed:?}, CPU budget 200ms"
    );
    assert_names_plugin(&err);
    host_still_serves();
}

#[test]
fn looping_plugin_does_not_block_other_calls() {
    let plugin = misbehaving(
        "loop",
        Limits {
            cpu: Duration::from_secs(3),
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
    let err = looping
        .join()
        .expect("thread")
        .expect_err("loop is stopped");
    assert!(matches!(err, PluginError::CpuExhausted { .. }), "{err}");
}

/// Busy threads on every core (several each) for as long as it lives.
struct CpuHog {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuHog {
    fn start(per_core: usize) -> CpuHog {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..cores * per_core)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        n = std::hint::black_box(n.wrapping_add(1));
                    }
                })
            })
            .collect();
        CpuHog { stop, threads }
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A loaded machine slows calls down but does not use up their budget: a
/// call whose CPU time fits its budget succeeds even when the hog stretches
/// its wall-clock time far past that budget (what a wall-clock deadline
/// failed).
#[test]
fn a_busy_machine_does_not_fail_a_plugin() {
    let busy = |iterations: u64, cpu: Duration| {
        host()
            .load(
                "misbehaving.wasm",
                &wasm("trainhub_test_plugin_misbehaving"),
                &serde_json::json!({ "mode": "busy", "iterations": iterations }),
                Limits {
                    cpu,
                    ..Limits::default()
                },
            )
            .expect("the busy plugin loads")
    };
    // Calibrate: about 50 ms of CPU time (the call runs on this thread, and
    // its CPU time does not depend on what else the machine is doing, as its
    // wall-clock time would).
    let thread_cpu = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(t.tv_sec.unsigned_abs(), t.tv_nsec.unsigned_abs() as u32)
    };
    let mut iterations = 1_000_000u64;
    let unloaded = loop {
        let plugin = busy(iterations, Duration::from_secs(10));
        let started = thread_cpu();
        plugin
            .validate(&torch_job_json(), &torch_runtime_json())
            .expect("calibration run");
        let took = thread_cpu().saturating_sub(started);
        if took >= Duration::from_millis(50) || iterations >= 1 << 36 {
            break took;
        }
        iterations *= 2;
    };
    let budget = unloaded * 4;
    let plugin = busy(iterations, budget);
    // Many more busy threads than cores: the call gets a small share of a CPU
    // even when the calibration itself ran on a loaded machine.
    let hog = CpuHog::start(32);
    let started = Instant::now();
    let result = plugin.validate(&torch_job_json(), &torch_runtime_json());
    let took = started.elapsed();
    drop(hog);
    eprintln!(
        "{iterations} iterations: {unloaded:?} of CPU, {took:?} under the hog, budget {budget:?}"
    );
    let validation = result.unwrap_or_else(|e| panic!("under load, the call must not fail: {e}"));
    assert!(validation.errors.is_empty(), "{:?}", validation.errors);
    assert!(
        took > budget,
        "the hog did not slow the call past its budget ({took:?} <= {budget:?}): the test proves nothing"
    );
}

/// The wall-clock bound is the host's last resort: hitting it is not the
/// plugin's fault, and the error says the call may be retried.
#[test]
fn the_wall_clock_bound_defers_rather_than_fails() {
    let plugin = misbehaving(
        "loop",
        Limits {
            cpu: Duration::from_secs(60),
            wall: Duration::from_millis(300),
            ..Limits::default()
        },
    );
    let started = Instant::now();
    let err = plugin
        .validate(&torch_job_json(), &torch_runtime_json())
        .expect_err("the loop is stopped at the wall-clock bound");
    assert!(
        matches!(err, PluginError::Deferred { .. }) && err.is_transient(),
        "expected a deferred call, got: {err}"
    );
    assert!(err.to_string().contains("overloaded"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_names_plugin(&err);
}

/// An async runtime's worker that calls a plugin keeps its other tasks
/// moving: a call still running at the next epoch tick hands them to
/// another thread.
#[test]
fn a_call_spares_the_async_workers() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .expect("runtime");
    let plugin = misbehaving(
        "loop",
        Limits {
            cpu: Duration::from_millis(1500),
            ..Limits::default()
        },
    );
    runtime.block_on(async move {
        // A timer task ticks on the runtime's only worker ...
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let ticks = tokio::spawn(async move {
            let _ = started_tx.send(());
            let mut late = Duration::ZERO;
            for _ in 0..20 {
                let before = Instant::now();
                tokio::time::sleep(Duration::from_millis(50)).await;
                late = late.max(before.elapsed().saturating_sub(Duration::from_millis(50)));
            }
            late
        });
        started.await.expect("the timer task started");
        // ... which then calls the looping plugin between two ticks.
        let call =
            tokio::spawn(async move { plugin.validate(&torch_job_json(), &torch_runtime_json()) });
        let late = ticks.await.expect("the timer task");
        let result = call.await.expect("the calling task");
        assert!(matches!(result, Err(PluginError::CpuExhausted { .. })));
        assert!(
            late < Duration::from_millis(500),
            "the runtime stalled {late:?} while a plugin ran"
        );
    });
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
