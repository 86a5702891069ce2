//! The plugin pipeline for one TrainJob (PreExecution validate, then Build:
//! enforce ML policy, enforce pod-group policy, build), through the wasm
//! components versus the same plugin logic linked natively.
//!
//! Run: `cargo bench -p trainhub --bench pipeline` (add `-- --iterations N`).
//! The two variants alternate within one run, so machine noise hits both alike.

use std::time::{Duration, Instant};

use trainhub::plugins::{HostConfig, Pipeline, Snapshot};
use trainhub_api::trainer::TrainJob;
use trainhub_plugin_sdk::Runtime;

fn main() {
    let iterations = std::env::args()
        .skip_while(|a| a != "--iterations")
        .nth(1)
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

    let host = trainhub::plugins::Host::new(&HostConfig::default()).expect("host");
    let wasm = Snapshot::new(trainhub::builtin::load(&host).expect("built-ins"));
    let native = Snapshot::new(trainhub::builtin::native());

    let run = |snapshot: &Snapshot| {
        let started = Instant::now();
        let pipeline = Pipeline::select(snapshot, &runtime).expect("select");
        let validation = pipeline.validate(&job).expect("validate");
        assert!(validation.errors.is_empty(), "{:?}", validation.errors);
        let rendered = pipeline.build(&job, &runtime, &target).expect("build");
        assert_eq!(rendered.objects.len(), 1);
        started.elapsed()
    };
    // Warm up: compile, fill caches, touch the pooling allocator.
    for _ in 0..200 {
        run(&wasm);
        run(&native);
    }
    let mut wasm_times = Vec::with_capacity(iterations);
    let mut native_times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        native_times.push(run(&native));
        wasm_times.push(run(&wasm));
    }
    let w = Stats::of(&mut wasm_times);
    let n = Stats::of(&mut native_times);
    println!(
        "pipeline for one TrainJob (torch runtime, 4 nodes): validate + enforce + build, {iterations} iterations each, interleaved"
    );
    println!("| variant | p50 | p90 | p99 | mean |");
    println!("|---|---|---|---|---|");
    println!(
        "| wasm components | {} | {} | {} | {} |",
        us(w.p50),
        us(w.p90),
        us(w.p99),
        us(w.mean)
    );
    println!(
        "| native (same logic) | {} | {} | {} | {} |",
        us(n.p50),
        us(n.p90),
        us(n.p99),
        us(n.mean)
    );
    println!(
        "wasm/native: p50 {:.2}x, mean {:.2}x",
        w.p50.as_secs_f64() / n.p50.as_secs_f64(),
        w.mean.as_secs_f64() / n.mean.as_secs_f64()
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
