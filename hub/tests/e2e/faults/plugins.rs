//! Plugins never fail a TrainJob for the machine's load: CPU budgets rather
//! than wall-clock deadlines, plugin calls off the API's threads, and calls
//! the host could not run deferred with backoff rather than failed.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::{DevHub, tail, wait_for};

/// A plugins directory holding the misbehaving test plugin with `sidecar`.
fn misbehaving_plugin(sidecar: &str) -> tempfile::TempDir {
    let plugins = tempfile::tempdir().unwrap();
    let wasm = Path::new(trainhub::builtin::WASM_DIR).join("trainhub_test_plugin_misbehaving.wasm");
    std::fs::copy(&wasm, plugins.path().join("misbehaving.wasm")).unwrap();
    std::fs::write(plugins.path().join("misbehaving.yaml"), sidecar).unwrap();
    plugins
}

/// A ClusterTrainingRuntime whose ML plugin is the misbehaving one, and a
/// TrainJob of it that runs `true` on one node.
fn runtime_and_job(job: &str) -> String {
    format!(
        r#"apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: misbehaving
  labels:
    trainer.kubeflow.org/framework: misbehaving
spec:
  mlPolicy:
    numNodes: 1
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: busybox
                      resources:
                        requests:
                          cpu: "1"
---
{}"#,
        trainjob(job)
    )
}

fn trainjob(name: &str) -> String {
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\nspec:\n  runtimeRef:\n    name: misbehaving\n  trainer:\n    numNodes: 1\n    command: [\"true\"]\n"
    )
}

/// A dev hub with one spoke and the plugins directory `plugins`.
fn start(plugins: &tempfile::TempDir) -> DevHub {
    let dir = plugins.path().to_string_lossy().into_owned();
    DevHub::start_args(&["--spokes", "1", "--plugins-dir", &dir], |_| {})
}

/// `jsonpath` of a TrainJob, or "" if it does not exist.
fn get(hub: &DevHub, name: &str, jsonpath: &str) -> String {
    let out = hub.kubectl(&[
        "get",
        "trainjob",
        name,
        "-o",
        &format!("jsonpath={jsonpath}"),
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Busy threads on every core (several each) for as long as it lives.
struct CpuHog {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuHog {
    fn start(per_core: usize) -> CpuHog {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..cores * per_core)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
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
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A Build-phase call the host cannot run (still running at its wall-clock
/// bound, the host's last resort) does not fail the TrainJob: it gets the
/// `PluginsDeferred` condition and is retried with backoff; once the call
/// succeeds the condition goes and the TrainJob runs to completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_build_is_retried_and_its_condition_cleared() {
    let plugins = misbehaving_plugin(
        "settings: {mode: busy, iterations: 100000000000, phases: [enforce-ml-policy]}\n\
         cpuMillis: 600000\nwallClockMillis: 2000\n",
    );
    let hub = start(&plugins);
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&runtime_and_job("deferred")));
    let log = || tail(&hub.log(), 60);
    let message = wait_for(
        "the PluginsDeferred condition",
        Duration::from_secs(60),
        log,
        || {
            let reason = get(
                &hub,
                "deferred",
                r#"{.status.conditions[?(@.type=="PluginsDeferred")].reason}"#,
            );
            (reason == "PluginCallDeferred").then(|| {
                get(
                    &hub,
                    "deferred",
                    r#"{.status.conditions[?(@.type=="PluginsDeferred")].message}"#,
                )
            })
        },
    )
    .await;
    assert!(
        message.contains("misbehaving") && message.contains("retrying in"),
        "{message}"
    );
    // Deferred, not failed, however often it is retried meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        get(
            &hub,
            "deferred",
            r#"{.status.conditions[?(@.type=="Failed")].status}"#
        ),
        "",
        "a deferred call must not fail the TrainJob\n{}",
        log()
    );
    // The host recovers (here: the plugin's sidecar lifts the bound).
    std::fs::write(
        plugins.path().join("misbehaving.yaml"),
        "settings: {mode: ok}\n",
    )
    .unwrap();
    wait_for(
        "the TrainJob to complete",
        Duration::from_secs(90),
        log,
        || {
            (get(
                &hub,
                "deferred",
                r#"{.status.conditions[?(@.type=="Complete")].status}"#,
            ) == "True")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        get(
            &hub,
            "deferred",
            r#"{.status.conditions[?(@.type=="PluginsDeferred")].status}"#
        ),
        "",
        "the condition is cleared once the call succeeds:\n{}\n{}",
        hub.kubectl_ok(&["get", "trainjob", "deferred", "-o", "yaml"]),
        log()
    );
    let events = hub.kubectl_ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=PluginCallDeferred",
        "-o",
        "name",
    ]);
    assert!(!events.trim().is_empty(), "a Warning event says why");
}

/// A machine busy with other work slows plugin calls down but does not fail
/// them: the validation of a TrainJob taking about 130 ms of CPU admits it
/// under a CPU hog that stretches it past its 500 ms budget of CPU time
/// (the wall-clock deadline this replaced failed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_under_a_cpu_hog_still_admits() {
    let plugins = misbehaving_plugin(
        "settings: {mode: busy, iterations: 128000000, phases: [validate]}\ncpuMillis: 500\n",
    );
    let hub = start(&plugins);
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&runtime_and_job("warmup")));
    let hog = CpuHog::start(8);
    let started = Instant::now();
    let out = hub.kubectl_stdin(&["create", "-f", "-"], Some(&trainjob("under-load")));
    let took = started.elapsed();
    drop(hog);
    assert!(
        out.status.success(),
        "admission under load failed after {took:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&hub.log(), 40)
    );
    eprintln!("admitted under the CPU hog in {took:?}");
}

/// Plugin calls burning their whole CPU budget at once do not hold up the
/// API: `/readyz` answers promptly throughout (the calls run on the plugin
/// threads, not on the threads serving requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_burning_their_budget_do_not_delay_the_api() {
    let plugins =
        misbehaving_plugin("settings: {mode: loop, phases: [validate]}\ncpuMillis: 3000\n");
    let hub = Arc::new(start(&plugins));
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&runtime_and_job("first")));
    let client = hub.client().await;
    let burning: Vec<_> = (0..6)
        .map(|i| {
            let hub = hub.clone();
            std::thread::spawn(move || {
                hub.kubectl_stdin(
                    &["create", "-f", "-"],
                    Some(&trainjob(&format!("burn-{i}"))),
                )
            })
        })
        .collect();
    // Let the creates reach admission, then probe while they burn.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut slowest = Duration::ZERO;
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let started = Instant::now();
        let request = http::Request::get("/readyz").body(Vec::new()).unwrap();
        let answer = client.request_text(request).await.expect("/readyz answers");
        assert_eq!(answer.trim(), "ok");
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut refused = 0;
    for b in burning {
        let out = b.join().unwrap();
        if !out.status.success() {
            refused += 1;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("CPU budget"), "{stderr}");
        }
    }
    assert_eq!(
        refused, 6,
        "every looping validation is stopped by its CPU budget"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "/readyz took {slowest:?} while plugins burned their budget"
    );
}
