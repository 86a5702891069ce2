//! Throughput and latency of TrainJob creates through the REST API (TLS,
//! bearer token, admission with the wasm plugins, durable store writes), and
//! the memory the hub holds per 10,000 stored TrainJobs.
//!
//! `cargo bench -p trainhub --bench api -- [--jobs N] [--concurrency C] [--settle S]`
//! (defaults: 10000 jobs, 32 concurrent clients, 15 s for memory to settle). The hub runs in this
//! process; memory is the growth of this process's resident set from before
//! the first create to after the last, with the client's buffers released.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::api::PostParams;
use trainhub::hub::Hub;

// The allocator the `trainhub` binary uses, as it uses it.
trainhub::jemalloc!();

#[path = "support/mod.rs"]
mod support;

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A jemalloc value of type `T` by name (a statistic or an option).
#[allow(unsafe_code)]
fn mallctl_read<T: Copy + Default>(name: &std::ffi::CStr) -> Option<T> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>();
    // SAFETY: every name read here is NUL-terminated and of type `T`;
    // `value` and `len` are valid for the write of one.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&raw mut value).cast(),
            &raw mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then_some(value)
}

/// jemalloc's own counters, in bytes: live allocations, the pages that
/// hold them, and the pages resident (theirs, freed-but-kept, metadata).
#[allow(unsafe_code)]
fn heap() -> (u64, u64, u64) {
    let read = |name| mallctl_read::<usize>(name).unwrap_or(0) as u64;
    let mut epoch: u64 = 1;
    // SAFETY: writing `epoch` refreshes the statistics; it takes a u64.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"epoch".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut epoch).cast(),
            std::mem::size_of::<u64>(),
        );
    }
    (
        read(c"stats.allocated"),
        read(c"stats.active"),
        read(c"stats.resident"),
    )
}

fn main() {
    let jobs = support::arg("--jobs", 10_000);
    let concurrency = support::arg("--concurrency", 32);
    let settle = Duration::from_secs(support::arg("--settle", 15) as u64);
    // The options in effect, as the hub's binary sets them
    // (`trainhub::memory::JEMALLOC_CONF`) or the environment overrides them.
    println!(
        "jemalloc: {} arenas, dirty_decay_ms {}",
        mallctl_read::<u32>(c"arenas.narenas").unwrap_or(0),
        mallctl_read::<isize>(c"opt.dirty_decay_ms").unwrap_or(-1),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(jobs, concurrency, settle));
}

async fn run(jobs: usize, concurrency: usize, settle: Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (pki, ca) = support::pki_and_token(dir.path());
    let hub = Hub::open(support::hub_config(dir.path(), &pki, false)).expect("hub");
    let store = hub.store.clone();
    let dispatch = hub.dispatch.clone();
    hub.install(trainhub::hub::default_objects().expect("runtimes"))
        .await
        .expect("install");
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(hub.serve(
        move |addrs| {
            let _ = addr_tx.send(addrs.api);
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let addr = addr_rx.await.expect("hub address");
    let api = support::trainjobs(dir.path(), addr, &ca).await;

    // Warm up connections and the plugin instances.
    for i in 0..concurrency.min(jobs) {
        api.create(
            &PostParams::default(),
            &support::torch_job(&format!("warmup-{i}")),
        )
        .await
        .expect("warm-up create");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_before_unsettled = rss();
    // What the hub holds at rest: the allocator returns freed memory to the
    // system within its decay time (10 s), so both ends are also measured
    // after `--settle` seconds.
    tokio::time::sleep(settle).await;
    let rss_before = rss();
    let heap_before = heap();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (api, next) = (api.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return latencies;
                }
                let t = Instant::now();
                api.create(
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
    drop(api);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after_unsettled = rss();
    let heap_unsettled = heap();
    // The dispatcher takes in what was created behind the API (no spokes
    // here: every TrainJob is evaluated and stays queued); the hub is at
    // rest once it has, and its writes are committed. Its peak on the way.
    let queued_at_end = dispatch.stats().1;
    let mut peak = rss_after_unsettled;
    let backlog = Instant::now();
    while dispatch.stats().1 < jobs + concurrency.min(jobs)
        && backlog.elapsed() < Duration::from_secs(600)
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak = peak.max(rss());
    }
    dispatch.settled().await;
    let backlog = backlog.elapsed();
    tokio::time::sleep(settle).await;
    let rss_after = rss();
    let heap_after = heap();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let db = std::fs::metadata(dir.path().join("data/store.redb"))
        .map(|m| m.len())
        .unwrap_or(0);
    let per_10k = (rss_after.saturating_sub(rss_before)) as f64 / jobs as f64 * 10_000.0;
    let unsettled_per_10k =
        (rss_after_unsettled.saturating_sub(rss_before_unsettled)) as f64 / jobs as f64 * 10_000.0;
    println!(
        "creates: {jobs} TrainJobs, {concurrency} concurrent clients, TLS + token, durable writes"
    );
    println!(
        "throughput: {:.0} creates/s ({:.2} s)",
        jobs as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    println!(
        "latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(pct(0.50)),
        ms(pct(0.90)),
        ms(pct(0.99)),
        ms(pct(1.0))
    );
    println!(
        "memory: resident set grew {:.1} MiB for {jobs} TrainJobs = {:.1} MiB per 10,000 ({}s after the dispatcher took every TrainJob in; {:.1} MiB per 10,000 0.5 s after the last create); store file {:.1} MiB",
        (rss_after.saturating_sub(rss_before)) as f64 / 1048576.0,
        per_10k / 1048576.0,
        settle.as_secs(),
        unsettled_per_10k / 1048576.0,
        db as f64 / 1048576.0
    );
    println!(
        "dispatch: {queued_at_end} TrainJobs queued 0.5 s after the last create, all {} {:.1} s later; resident set at its peak meanwhile {:.1} MiB per 10,000",
        dispatch.stats().1,
        backlog.as_secs_f64(),
        (peak.saturating_sub(rss_before)) as f64 / jobs as f64 * 10_000.0 / 1048576.0
    );
    let mib_per_10k =
        |a: u64, b: u64| a.saturating_sub(b) as f64 / jobs as f64 * 10_000.0 / 1048576.0;
    println!(
        "heap (jemalloc, 0.5 s after): allocated {:.1}, active {:.1}, resident {:.1} MiB per 10,000",
        mib_per_10k(heap_unsettled.0, heap_before.0),
        mib_per_10k(heap_unsettled.1, heap_before.1),
        mib_per_10k(heap_unsettled.2, heap_before.2),
    );
    println!(
        "heap (jemalloc, settled): allocated {:.1}, active {:.1}, resident {:.1} MiB per 10,000",
        mib_per_10k(heap_after.0, heap_before.0),
        mib_per_10k(heap_after.1, heap_before.1),
        mib_per_10k(heap_after.2, heap_before.2),
    );
    // What the store holds per TrainJob, by resource: objects and their
    // JSON size (the store's own representation is larger in memory).
    for resource in [
        trainhub::api::TRAINJOBS,
        trainhub::admission::RUNTIME_SNAPSHOTS,
        trainhub::api::EVENTS,
        trainhub::dispatch::PLACEMENTS,
    ] {
        let (objects, _) = store.list(resource, None);
        let bytes: usize = objects
            .iter()
            .map(|o| serde_json::to_vec(&*o.value).map_or(0, |v| v.len()))
            .sum();
        println!(
            "store: {resource}: {} objects, {:.1} MiB of JSON ({:.0} bytes each)",
            objects.len(),
            bytes as f64 / 1048576.0,
            bytes as f64 / objects.len().max(1) as f64
        );
    }
    // A list of every TrainJob, as a client relisting after a 410 or an
    // informer starting does: in one response, and in pages of 500.
    let api = support::trainjobs(dir.path(), addr, &ca).await;
    let t = Instant::now();
    let all = api.list(&Default::default()).await.expect("list");
    let whole = t.elapsed();
    let t = Instant::now();
    let mut paged = 0;
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.expect("list page");
        paged += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    println!(
        "list: {} TrainJobs in one response {:.0} ms; in pages of 500 {:.0} ms ({paged})",
        all.items.len(),
        ms(whole),
        ms(t.elapsed())
    );
    drop((all, api));
    let _ = stop_tx.send(());
    let _ = serving.await;
    drop((store, dispatch));
    // A restart: the store read back (every object decoded into memory).
    // Tasks of the stopped hub may hold the store (and redb's file lock) for
    // a moment after `serve` returns: wait for it, then time the open.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reopened = Hub::open(support::hub_config(dir.path(), &pki, false));
    while reopened.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        reopened = Hub::open(support::hub_config(dir.path(), &pki, false));
    }
    drop(reopened);
    let t = Instant::now();
    let reopened = Hub::open(support::hub_config(dir.path(), &pki, false)).expect("hub reopens");
    println!(
        "restart: Hub::open with {} TrainJobs in the store: {:.2} s",
        reopened.store.list(trainhub::api::TRAINJOBS, None).0.len(),
        t.elapsed().as_secs_f64()
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
