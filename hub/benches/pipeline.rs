//! The plugin pipeline for one TrainJob (PreExecution validate, then Build:
//! enforce ML policy, enforce pod-group policy, build), through the wasm
//! components versus the same plugin logic linked natively.
//!
//! Run: `cargo bench -p trainhub --bench pipeline` (add `-- --iterations N`).
//! The two variants alternate within one run, so machine noise hits both alike.
//!
//! `-- --wasm-dir DIR` loads the built-in components from `DIR`
//! (`trainhub_plugin_<name>.wasm`) instead of those embedded in the hub, to
//! compare plugin builds (profiles) without rebuilding the hub.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use trainhub::plugins::pipeline::PhasePlugin;
use trainhub::plugins::{HostConfig, Limits, Pipeline, Snapshot};
use trainhub_api::trainer::TrainJob;
use trainhub_plugin_sdk::Runtime;

// The allocator the `trainhub` binary uses, as it uses it.
trainhub::jemalloc!();

fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn main() {
    let iterations = arg("--iterations")
        .and_then(|n| n.parse().ok())
        .unwrap_or(5_000usize);

    let runtime: Runtime = serde_saphyr::from_str(include_str!(
        "../../manifests/runtimes/torch-distributed.yaml"
    ))
    .expect("runtime");
    let job: TrainJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "bench", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000001"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "numNodes": 4,
                "command": ["torchrun", "train.py"],
                "env": [{"name": "EPOCHS", "value": "3"}],
                "resourcesPerNode": {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}}
            }
        }
    }))
    .expect("job");
    let target = trainhub_plugin_sdk::testing::target("spoke-a");

    // Compiled components are cached on disk, so a rerun starts in seconds.
    let cache_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    let host = trainhub::plugins::Host::new(&HostConfig {
        cache_dir: Some(cache_dir),
        ..HostConfig::default()
    })
    .expect("host");
    let wasm = Snapshot::new(match arg("--wasm-dir") {
        None => trainhub::builtin::load(&host).expect("built-ins"),
        Some(dir) => trainhub::builtin::BUILTIN_COMPONENTS
            .iter()
            .map(|(name, _, _)| {
                let path = PathBuf::from(&dir).join(format!("trainhub_plugin_{name}.wasm"));
                let bytes = std::fs::read(&path).expect("component file");
                host.load(name, &bytes, &serde_json::json!({}), Limits::default())
                    .map(|p| p as Arc<dyn PhasePlugin>)
                    .expect("component loads")
            })
            .collect(),
    });
    let native = Snapshot::new(trainhub::builtin::native());

    // (whole pipeline, PreExecution validate, Build)
    let run = |snapshot: &Snapshot| {
        let started = Instant::now();
        let pipeline = Pipeline::select(snapshot, &runtime).expect("select");
        let validation = pipeline.validate(&job, &runtime).expect("validate");
        assert!(validation.errors.is_empty(), "{:?}", validation.errors);
        let validated = Instant::now();
        let rendered = pipeline.build(&job, &runtime, &target).expect("build");
        assert_eq!(rendered.objects.len(), 1);
        let built = Instant::now();
        [built - started, validated - started, built - validated]
    };
    // Warm up: compile, fill caches, touch the pooling allocator.
    for _ in 0..200 {
        run(&wasm);
        run(&native);
    }
    let mut wasm_times = [const { Vec::new() }; 3];
    let mut native_times = [const { Vec::new() }; 3];
    for _ in 0..iterations {
        for (times, t) in native_times.iter_mut().zip(run(&native)) {
            times.push(t);
        }
        for (times, t) in wasm_times.iter_mut().zip(run(&wasm)) {
            times.push(t);
        }
    }
    let [w, w_validate, w_build] = wasm_times.map(|mut t| Stats::of(&mut t));
    let [n, n_validate, n_build] = native_times.map(|mut t| Stats::of(&mut t));
    println!(
        "pipeline for one TrainJob (torch runtime, 4 nodes): validate + enforce + build, {iterations} iterations each, interleaved; instance pool: {}",
        if host.pooled() {
            "yes"
        } else {
            "no (on demand)"
        }
    );
    println!("| variant | p50 | p90 | p99 | mean | p50 validate | p50 build |");
    println!("|---|---|---|---|---|---|---|");
    for (name, s, v, b) in [
        ("wasm components", &w, &w_validate, &w_build),
        ("native (same logic)", &n, &n_validate, &n_build),
    ] {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            us(s.p50),
            us(s.p90),
            us(s.p99),
            us(s.mean),
            us(v.p50),
            us(b.p50)
        );
    }
    println!(
        "wasm/native: p50 {:.2}x, mean {:.2}x",
        w.p50.as_secs_f64() / n.p50.as_secs_f64(),
        w.mean.as_secs_f64() / n.mean.as_secs_f64()
    );

    // The fixed cost of one plugin call: torch's `validate` of two empty
    // objects, which the plugin refuses after parsing almost nothing.
    let empty_call = |snapshot: &Snapshot| {
        let torch = snapshot.get("torch").expect("torch plugin");
        let started = Instant::now();
        let validation = torch.validate("{}", "{}").expect("validate");
        assert!(!validation.errors.is_empty());
        started.elapsed()
    };
    let (mut wasm_calls, mut native_calls) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        native_calls.push(empty_call(&native));
        wasm_calls.push(empty_call(&wasm));
    }
    let (w, n) = (Stats::of(&mut wasm_calls), Stats::of(&mut native_calls));
    println!(
        "one near-empty plugin call (torch validate of empty objects): p50 wasm {}, native {}",
        us(w.p50),
        us(n.p50)
    );
}

struct Stats {
    p50: Duration,
    p90: Duration,
    p99: Duration,
    mean: Duration,
}

impl Stats {
    fn of(times: &mut [Duration]) -> Stats {
        times.sort();
        let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
        let total: Duration = times.iter().sum();
        Stats {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            mean: total / times.len() as u32,
        }
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}
