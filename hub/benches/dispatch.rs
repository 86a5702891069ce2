//! Dispatch throughput and latency: the hub and S simulated spokes (real
//! agents over real gRPC with mutual TLS, on a backend that admits what
//! fits and completes runs at once) in this process; T TrainJobs submitted
//! through the REST API by C concurrent clients.
//!
//! `cargo bench -p trainhub --bench dispatch -- [--spokes S] [--jobs T]
//! [--concurrency C] [--rate R] [--incremental] [--fanout F]` (defaults: 50
//! spokes, 10000 jobs, 32 clients, as fast as they go, AllAtOnce to every
//! spoke; `--fanout F` offers each TrainJob to at most F spokes at once). With `--rate`,
//! creates are paced at R per second (open loop, as long as C clients keep
//! up), to measure latency at a given load rather than at saturation.
//! Latency is from the start of a TrainJob's create request to the moment
//! its winning spoke receives the start (placement committed, objects
//! built); throughput is TrainJobs started per second from the first create
//! to the last start; CPU is the process's user + system time over the
//! same span, per TrainJob (hub, spokes and clients together).
//!
//! `--quotas` runs with Kueue's quotas on: two ResourceFlavors (`pool: x`
//! and `pool: y`, each half of the spokes), 10 ClusterQueues in 2 cohorts
//! with nominal quota in both flavors for all the TrainJobs (each job is
//! admitted by quota, none waits for it: what is measured is the cost of
//! admission), a LocalQueue per ClusterQueue, and every TrainJob labelled
//! with one of them in turn.
//!
//! `--count-writes` also prints the store's changes per TrainJob, by
//! resource, from the first create to 3 s after the last start (a
//! diagnostic: following every change costs this process CPU, so its
//! rates are not the bench's).
//!
//! `--otlp` measures the tracing overhead: the process exports its traces
//! (hub and spokes) to an OTLP sink it serves itself at
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (which must be set, e.g.
//! `http://127.0.0.1:4317`), which counts the spans and drops them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::PostParams;
use trainhub::dispatch::{DispatchConfig, core};
use trainhub::hub::{Config, Hub};

// The allocator the `trainhub` binary uses, as it uses it.
trainhub::jemalloc!();

#[path = "support/mod.rs"]
mod support;

fn main() {
    let flag = |name: &str| std::env::args().any(|a| a == name);
    let options = Options {
        spokes: support::arg("--spokes", 50),
        jobs: support::arg("--jobs", 10_000),
        concurrency: support::arg("--concurrency", 32),
        rate: support::arg("--rate", 0),
        incremental: flag("--incremental"),
        fanout: support::arg("--fanout", 0),
        quotas: flag("--quotas"),
        count_writes: flag("--count-writes"),
    };
    let otlp = flag("--otlp");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let sink = otlp.then(|| runtime.block_on(sink::start()));
    let telemetry = otlp.then(|| {
        trainhub_telemetry::Telemetry::init(trainhub_telemetry::Options {
            service_name: "trainhub",
            log_format: trainhub_telemetry::LogFormat::Text,
            resource: Vec::new(),
        })
        .expect("telemetry")
    });
    assert!(
        !otlp || trainhub_telemetry::tracing_enabled(),
        "--otlp: the exporter is not installed"
    );
    runtime.block_on(run(options));
    if let (Some(mut telemetry), Some(sink)) = (telemetry, sink) {
        telemetry.shutdown();
        println!(
            "otlp: {} spans exported to the sink",
            sink.load(Ordering::Relaxed)
        );
    }
}

/// An OTLP/gRPC trace receiver that counts spans.
mod sink {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };

    struct Sink(Arc<AtomicUsize>);

    #[tonic::async_trait]
    impl TraceService for Sink {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let spans: usize = request
                .get_ref()
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            self.0.fetch_add(spans, Ordering::Relaxed);
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// Serves at the host and port of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub async fn start() -> Arc<AtomicUsize> {
        let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .expect("--otlp needs OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://127.0.0.1:4317");
        let addr = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .unwrap_or_else(|e| panic!("--otlp: listening on {addr}: {e}"));
        let count = Arc::new(AtomicUsize::new(0));
        let service = TraceServiceServer::new(Sink(count.clone()));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        count
    }
}

/// User + system CPU time of this process so far (Linux `/proc`).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime and
    // stime are the 12th and 13th, in clock ticks (100 per second).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The command line's choices (see the module doc).
struct Options {
    spokes: usize,
    jobs: usize,
    concurrency: usize,
    rate: usize,
    incremental: bool,
    fanout: usize,
    quotas: bool,
    count_writes: bool,
}

async fn run(options: Options) {
    let Options {
        spokes,
        jobs,
        concurrency,
        rate,
        incremental,
        fanout,
        quotas,
        count_writes,
    } = options;
    let dir = tempfile::tempdir().expect("temp dir");
    let (pki, ca) = support::pki_and_token(dir.path());
    let mode = if incremental {
        core::Mode::Incremental {
            step: 3,
            round_ms: 300_000,
        }
    } else {
        core::Mode::AllAtOnce
    };
    let hub = Hub::open(Config {
        dispatch: DispatchConfig {
            core: core::Config {
                mode,
                fanout,
                ..core::Config::default()
            },
            ..DispatchConfig::default()
        },
        ..support::hub_config(dir.path(), &pki, true)
    })
    .expect("hub");
    let dispatch = hub.dispatch.clone();
    let hub_store = hub.store.clone();
    hub.install(trainhub::hub::default_objects().expect("runtimes"))
        .await
        .expect("install");
    if quotas {
        hub.install(quota_objects(jobs))
            .await
            .expect("quota objects");
    }
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(hub.serve(
        move |addrs| {
            let _ = addr_tx.send(addrs);
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let addrs = addr_rx.await.expect("hub address");
    let grpc = addrs.grpc.expect("grpc address");

    // The spokes (labelled with their flavor's pool when quotas are on).
    let mut started_rx = support::start_sim_spokes_labelled(grpc, &ca, spokes, |i| {
        if quotas {
            [(
                "pool".to_string(),
                if i % 2 == 0 { "x" } else { "y" }.to_string(),
            )]
            .into()
        } else {
            Default::default()
        }
    });
    while dispatch.stats().0 < spokes {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let api = support::trainjobs(dir.path(), addrs.api, &ca).await;

    // Warm up connections, plugins and the whole path once.
    let warmup = concurrency.min(jobs).max(1);
    for i in 0..warmup {
        api.create(
            &PostParams::default(),
            &support::python_job(&format!("warmup-{i}")),
        )
        .await
        .expect("warm-up create");
    }
    for _ in 0..warmup {
        started_rx.recv().await.expect("warm-up start");
    }

    let writes = count_writes.then(|| count_store_changes(&hub_store));
    let submitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let begin = Instant::now();
    let cpu_begin = cpu_time();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (api, next, submitted) = (api.clone(), next.clone(), submitted.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return;
                }
                if rate > 0 {
                    let due = begin + Duration::from_secs_f64(i as f64 / rate as f64);
                    tokio::time::sleep_until(due.into()).await;
                }
                let name = format!("bench-{i:06}");
                submitted
                    .lock()
                    .expect("lock")
                    .insert(format!("default/{name}"), Instant::now());
                let mut job = support::python_job(&name);
                if quotas {
                    job.metadata.labels =
                        Some([(QUEUE_LABEL.to_string(), format!("lq-{}", i % QUEUES))].into());
                }
                api.create(&PostParams::default(), &job)
                    .await
                    .expect("create");
            }
        }));
    }
    let mut latencies = Vec::with_capacity(jobs);
    let mut timeline = Vec::with_capacity(jobs);
    let mut last = begin;
    while latencies.len() < jobs {
        let Ok(Some((name, at))) =
            tokio::time::timeout(Duration::from_secs(60), started_rx.recv()).await
        else {
            panic!(
                "only {} of {jobs} TrainJobs started within a minute of the last",
                latencies.len()
            );
        };
        let Some(t0) = submitted.lock().expect("lock").get(&name).copied() else {
            continue;
        };
        latencies.push(at.duration_since(t0));
        timeline.push((t0.saturating_duration_since(begin), at.duration_since(t0)));
        last = last.max(at);
    }
    let cpu = cpu_time().saturating_sub(cpu_begin);
    for w in workers {
        w.await.expect("worker");
    }
    let elapsed = last.duration_since(begin);
    // `TRAINHUB_BENCH_TIMELINE=FILE`: each TrainJob's submit time (from the
    // first submit) and its latency, in ms, one per line, to see when slow
    // starts happen.
    if let Some(path) = std::env::var_os("TRAINHUB_BENCH_TIMELINE") {
        let lines: String = timeline
            .iter()
            .map(|(at, latency)| format!("{:.3} {:.3}\n", ms(*at), ms(*latency)))
            .collect();
        std::fs::write(&path, lines).expect("timeline file");
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let offered = if rate > 0 {
        format!("offered {rate}/s")
    } else {
        "as fast as they go".to_string()
    };
    println!(
        "dispatch: {jobs} TrainJobs (2 pods each), {spokes} simulated spokes over gRPC + mTLS, {concurrency} concurrent REST clients ({offered}), {}{}",
        match (incremental, fanout) {
            (true, _) => "Incremental".to_string(),
            (false, 0) => "AllAtOnce to every spoke".to_string(),
            (false, f) => format!("AllAtOnce, fan-out {f}"),
        },
        if quotas {
            format!(", quotas on ({QUEUES} ClusterQueues in 2 cohorts, 2 flavors)")
        } else {
            String::new()
        }
    );
    println!(
        "throughput: {:.0} TrainJobs started/s ({:.2} s)",
        jobs as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    println!(
        "cpu: {:.2} ms per TrainJob (user + system, whole process, {:.1} s)",
        cpu.as_secs_f64() * 1000.0 / jobs as f64,
        cpu.as_secs_f64()
    );
    println!(
        "submit-to-started latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(pct(0.50)),
        ms(pct(0.90)),
        ms(pct(0.99)),
        ms(pct(1.0))
    );
    if let Some(writes) = writes {
        // The runs started last finish and are released meanwhile.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let counts = std::mem::take(&mut *writes.lock().expect("lock"));
        let total: u64 = counts.values().sum();
        let by_resource: Vec<String> = counts
            .iter()
            .map(|(r, n)| format!("{r} {:.2}", *n as f64 / jobs as f64))
            .collect();
        println!(
            "store changes: {:.2} per TrainJob ({})",
            total as f64 / jobs as f64,
            by_resource.join(", ")
        );
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), serving).await;
}

/// Counts the store's changes by resource from now on (`--count-writes`).
fn count_store_changes(
    store: &Arc<dyn trainhub_apiserver::store::Store>,
) -> Arc<Mutex<std::collections::BTreeMap<String, u64>>> {
    use trainhub::api::{EVENTS, PODS, SPOKES, TRAINJOBS};
    use trainhub::kueue::{CLUSTER_QUEUES, LOCAL_QUEUES, WORKLOADS};
    let resources = [
        TRAINJOBS,
        PODS,
        EVENTS,
        SPOKES,
        trainhub::dispatch::PLACEMENTS,
        trainhub::admission::RUNTIME_SNAPSHOTS,
        trainhub::admission::RUNTIME_VERSIONS,
        WORKLOADS,
        CLUSTER_QUEUES,
        LOCAL_QUEUES,
    ];
    let counts = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
    let mut watch = store
        .watch(resources[0], None, None)
        .expect("watch")
        .also(&resources[1..]);
    let counted = counts.clone();
    tokio::spawn(async move {
        while let Ok(event) = watch.live.recv().await {
            let resource = event
                .object
                .key
                .resource
                .rsplit('/')
                .next()
                .unwrap_or_default();
            *counted
                .lock()
                .expect("lock")
                .entry(resource.to_string())
                .or_insert(0) += 1;
        }
    });
    counts
}

const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
const QUEUES: usize = 10;

/// Two flavors, [`QUEUES`] ClusterQueues in two cohorts (each with quota in
/// both flavors for all of its share of `jobs`, so none waits for quota)
/// and a LocalQueue `lq-N` in `default` for each.
fn quota_objects(jobs: usize) -> Vec<serde_json::Value> {
    use serde_json::json;
    // Two one-CPU, 512Mi pods per TrainJob; a ClusterQueue's share in
    // each flavor, with room to spare.
    let per_queue = jobs.div_ceil(QUEUES) + 16;
    let cpu = (per_queue * 2).to_string();
    let memory = format!("{}Mi", per_queue * 1024);
    let mut objects = Vec::new();
    for pool in ["x", "y"] {
        objects.push(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": format!("pool-{pool}")},
            "spec": {"nodeLabels": {"pool": pool}},
        }));
    }
    for q in 0..QUEUES {
        let flavors: Vec<serde_json::Value> = ["x", "y"]
            .iter()
            .map(|pool| {
                json!({"name": format!("pool-{pool}"), "resources": [
                    {"name": "cpu", "nominalQuota": cpu},
                    {"name": "memory", "nominalQuota": memory},
                ]})
            })
            .collect();
        objects.push(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": format!("cq-{q}")},
            "spec": {
                "namespaceSelector": {},
                "cohortName": format!("cohort-{}", q % 2),
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": flavors}],
            },
        }));
        objects.push(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": format!("lq-{q}"), "namespace": "default"},
            "spec": {"clusterQueue": format!("cq-{q}")},
        }));
    }
    objects
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
