//! The hub on redb and on a 3-member etcd, side by side in one run: creates
//! per second and their p99 with C clients (and the resident set's growth
//! per 10,000 TrainJobs), then dispatch saturation with S simulated spokes
//! and T TrainJobs (the dispatch bench's method).
//!
//! `cargo bench -p trainhub --bench ha -- [--jobs N] [--concurrency C]
//! [--spokes S] [--dispatch-jobs T] [--stores redb,etcd]` (defaults: 10000
//! creates, 32 clients, 50 spokes, 10000 TrainJobs dispatched, both
//! stores). Each measurement runs in a child process of its own (this
//! binary again), so that one's memory does not count in the next; the etcd
//! cluster (`etcd` on PATH or `$TRAINHUB_ETCD`) is started once by the
//! parent, each child writing under its own key prefix. Without etcd, the
//! etcd side is skipped (said so).

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::PostParams;
use trainhub::dispatch::Dispatch;
use trainhub::hub::{Hub, Replication, Storage};
use trainhub_apiserver::store::EtcdConfig;
use trainhub_apiserver::store::etcd::LocalEtcd;

// The allocator the `trainhub` binary uses, as it uses it.
trainhub::jemalloc!();

#[path = "support/mod.rs"]
mod support;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let phase = args.get(i + 1).cloned().unwrap_or_default();
        let endpoints = args.get(i + 2).cloned().unwrap_or_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(child(&phase, &endpoints));
        return;
    }
    parent();
}

/// The string value after `name` on the command line.
fn text_arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

fn parent() {
    let stores = text_arg("--stores", "redb,etcd");
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = if stores.contains("etcd") {
        match LocalEtcd::start_or_skip(3, dir.path()) {
            Ok(etcd) => etcd,
            Err(e) => panic!("starting a 3-member etcd: {e}"),
        }
    } else {
        None
    };
    let passthrough: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut rows: Vec<(String, String, Vec<String>)> = Vec::new();
    for store in ["redb", "etcd"] {
        if !stores.contains(store) {
            continue;
        }
        let endpoints = match (store, &etcd) {
            ("redb", _) => "-".to_string(),
            (_, Some(etcd)) => etcd.endpoints().join(","),
            (_, None) => {
                println!("etcd: skipped (not installed)");
                continue;
            }
        };
        for phase in ["creates", "dispatch"] {
            let exe = std::env::current_exe().expect("this benchmark's path");
            let output = Command::new(exe)
                .args(&passthrough)
                .args(["--child", &format!("{store}-{phase}"), &endpoints])
                .output()
                .expect("running a measurement");
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                output.status.success(),
                "{store} {phase} failed: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            print!("{stdout}");
            let results = stdout
                .lines()
                .filter_map(|l| l.strip_prefix("result: "))
                .map(String::from)
                .collect();
            rows.push((store.to_string(), phase.to_string(), results));
        }
    }
    println!();
    println!("| store | measurement | result |");
    println!("|---|---|---|");
    for (store, phase, results) in rows {
        println!("| {store} | {phase} | {} |", results.join("; "));
    }
}

async fn child(phase: &str, endpoints: &str) {
    let (store, phase) = phase.split_once('-').unwrap_or((phase, ""));
    let jobs = support::arg("--jobs", 10_000);
    let concurrency = support::arg("--concurrency", 32);
    let spokes = support::arg("--spokes", 50);
    let dispatch_jobs = support::arg("--dispatch-jobs", 10_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let (pki, ca) = support::pki_and_token(dir.path());
    let replication = match store {
        "etcd" => Replication {
            storage: Storage::Etcd(EtcdConfig {
                endpoints: endpoints.split(',').map(String::from).collect(),
                prefix: format!("/bench-{}-{phase}", std::process::id()),
                ..EtcdConfig::default()
            }),
            ..Replication::default()
        },
        _ => Replication::default(),
    };
    let with_spokes = phase == "dispatch";
    let hub = Hub::open_replicated(
        support::hub_config(dir.path(), &pki, with_spokes),
        replication,
    )
    .await
    .expect("hub");
    let mut leading = hub.leading();
    hub.install(trainhub::hub::default_objects().expect("runtimes"))
        .await
        .expect("install");
    let store_handle = hub.store.clone();
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
    // This replica leads (the only one): dispatch runs, as on redb.
    let dispatch: Arc<Dispatch> = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(d) = leading.borrow_and_update().clone() {
                return d;
            }
            if leading.changed().await.is_err() {
                panic!("the hub stopped before leading");
            }
        }
    })
    .await
    .expect("the hub leads within 60 s");
    match phase {
        "creates" => creates(store, dir.path(), addrs.api, &ca, jobs, concurrency).await,
        _ => {
            let grpc = addrs.grpc.expect("grpc address");
            saturate(
                store,
                dir.path(),
                (addrs.api, grpc),
                &ca,
                &dispatch,
                spokes,
                dispatch_jobs,
                concurrency,
            )
            .await
        }
    }
    drop(store_handle);
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), serving).await;
}

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// The api bench's method: creates as fast as `concurrency` clients go.
async fn creates(
    store: &str,
    dir: &std::path::Path,
    api: std::net::SocketAddr,
    ca: &trainhub_apiserver::pki::Ca,
    jobs: usize,
    concurrency: usize,
) {
    let client = support::trainjobs(dir, api, ca).await;
    for i in 0..concurrency.min(jobs) {
        client
            .create(
                &PostParams::default(),
                &support::torch_job(&format!("warmup-{i}")),
            )
            .await
            .expect("warm-up create");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, next) = (client.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return latencies;
                }
                let t = Instant::now();
                client
                    .create(
                        &PostParams::default(),
                        &support::torch_job(&format!("bench-{i:06}")),
                    )
                    .await
                    .expect("create");
                latencies.push(t.elapsed());
            }
        }));
    }
    let mut latencies = Vec::with_capacity(jobs);
    for w in workers {
        latencies.extend(w.await.expect("worker"));
    }
    let elapsed = started.elapsed();
    drop(client);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss().saturating_sub(before) as f64;
    latencies.sort();
    println!(
        "{store}: {jobs} creates, {concurrency} clients: {:.0}/s, p50 {:.2} ms, p99 {:.2} ms; resident set grew {:.1} MiB",
        jobs as f64 / elapsed.as_secs_f64(),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        grown / 1048576.0
    );
    println!(
        "result: {:.0} creates/s, p99 {:.1} ms",
        jobs as f64 / elapsed.as_secs_f64(),
        ms(percentile(&latencies, 0.99))
    );
    println!(
        "result: RSS {:.1} MiB per 10,000 TrainJobs",
        grown / jobs as f64 * 10_000.0 / 1048576.0
    );
}

/// The dispatch bench's method: S simulated spokes, T TrainJobs created as
/// fast as `concurrency` clients go, started/s from the first create to the
/// last start.
#[allow(clippy::too_many_arguments)]
async fn saturate(
    store: &str,
    dir: &std::path::Path,
    (api, grpc): (std::net::SocketAddr, std::net::SocketAddr),
    ca: &trainhub_apiserver::pki::Ca,
    dispatch: &Dispatch,
    spokes: usize,
    jobs: usize,
    concurrency: usize,
) {
    let mut started_rx = support::start_sim_spokes(grpc, ca, spokes);
    let deadline = Instant::now() + Duration::from_secs(120);
    while dispatch.stats().0 < spokes {
        assert!(Instant::now() < deadline, "spokes not connected in 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = support::trainjobs(dir, api, ca).await;
    let warmup = concurrency.min(jobs).max(1);
    for i in 0..warmup {
        client
            .create(
                &PostParams::default(),
                &support::python_job(&format!("warmup-{i}")),
            )
            .await
            .expect("warm-up create");
    }
    for _ in 0..warmup {
        started_rx.recv().await.expect("warm-up start");
    }
    let submitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let begin = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, next, submitted) = (client.clone(), next.clone(), submitted.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return;
                }
                let name = format!("bench-{i:06}");
                submitted
                    .lock()
                    .expect("lock")
                    .insert(format!("default/{name}"), Instant::now());
                client
                    .create(&PostParams::default(), &support::python_job(&name))
                    .await
                    .expect("create");
            }
        }));
    }
    let mut latencies = Vec::with_capacity(jobs);
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
        last = last.max(at);
    }
    for w in workers {
        w.await.expect("worker");
    }
    latencies.sort();
    let elapsed = last.duration_since(begin);
    println!(
        "{store}: dispatch, {spokes} simulated spokes, {jobs} TrainJobs, {concurrency} clients: {:.0} started/s, p50 {:.2} ms, p99 {:.2} ms",
        jobs as f64 / elapsed.as_secs_f64(),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
    );
    println!(
        "result: {:.0} started/s, submit-to-started p99 {:.1} ms",
        jobs as f64 / elapsed.as_secs_f64(),
        ms(percentile(&latencies, 0.99))
    );
}
