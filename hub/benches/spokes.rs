//! A fleet connecting at once: the hub and N simulated spokes (real agents
//! over real gRPC with mutual TLS, heartbeats every 5 s) in this process,
//! all started together against the spokes' listener with its default
//! caps (`trainhub::grpc::GrpcLimits`). Measures how long until every
//! spoke has a session, checks that all stay connected for the hold, and
//! the CPU the process (hub and agents together) spends while they idle.
//!
//! `cargo bench -p trainhub --bench spokes -- [--spokes N] [--hold S]`
//! (defaults: 1000 spokes, 30 s).

use std::time::{Duration, Instant};

use trainhub::hub::Hub;
use trainhub_spoke::agent::{self, AgentConfig};
use trainhub_spoke::backend::sim::SimBackend;

// The allocator the `trainhub` binary uses, as it uses it.
trainhub::jemalloc!();

// Only the certificates and token of the shared set-up are used here.
#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime, the 12th and 13th fields after the command name, in
    // clock ticks (100 per second).
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn main() {
    let spokes = support::arg("--spokes", 1000);
    let hold = Duration::from_secs(support::arg("--hold", 30) as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(spokes, hold));
}

async fn run(spokes: usize, hold: Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (pki, ca) = support::pki_and_token(dir.path());
    let hub = Hub::open(support::hub_config(dir.path(), &pki, true)).expect("hub");
    let dispatch = hub.dispatch.clone();
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let _serving = tokio::spawn(hub.serve(
        move |addrs| {
            let _ = addr_tx.send(addrs);
        },
        std::future::pending(),
    ));
    let grpc = addr_rx.await.expect("hub address").grpc.expect("grpc");

    // Certificates first, so that the agents start together.
    let configs: Vec<AgentConfig> = (0..spokes)
        .map(|i| {
            let issued = ca
                .issue_client(&format!("sim-{i:04}"), &[trainhub::grpc::SPOKE_GROUP])
                .expect("spoke cert");
            AgentConfig::new(
                format!("https://{grpc}"),
                ca.cert_pem().to_string(),
                issued.cert_pem,
                issued.key_pem,
            )
        })
        .collect();
    let begin = Instant::now();
    for config in configs {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let backend = SimBackend::new(
            [("cpu".to_string(), 64_000), ("memory".to_string(), 1 << 40)].into(),
            Duration::ZERO,
            tx,
            None,
        );
        tokio::spawn(agent::run(config, backend, rx, std::future::pending()));
    }
    let deadline = begin + Duration::from_secs(300);
    while dispatch.stats().0 < spokes {
        assert!(
            Instant::now() < deadline,
            "only {} of {spokes} spokes connected within 300 s",
            dispatch.stats().0
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connected_in = begin.elapsed();
    println!(
        "spokes: {spokes} connected in {:.2} s (mutual TLS, started at once)",
        connected_in.as_secs_f64()
    );

    // Idle: heartbeats only. Every spoke stays connected.
    let cpu_begin = cpu_time();
    let idle_begin = Instant::now();
    let mut fewest = spokes;
    while idle_begin.elapsed() < hold {
        tokio::time::sleep(Duration::from_secs(1)).await;
        fewest = fewest.min(dispatch.stats().0);
    }
    let cpu = cpu_time().saturating_sub(cpu_begin);
    let idle = idle_begin.elapsed();
    println!(
        "spokes: fewest connected during {:.0} s idle: {fewest} of {spokes}",
        idle.as_secs_f64()
    );
    println!(
        "spokes: CPU while idle (hub and {spokes} agents in this process): {:.3} cores",
        cpu.as_secs_f64() / idle.as_secs_f64()
    );
    let rss_kib = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    println!(
        "spokes: resident set of the process (hub and {spokes} agents): {:.1} MiB",
        rss_kib as f64 / 1024.0
    );
    assert_eq!(fewest, spokes, "a spoke lost its session while idle");
}
