//! Decodes, copies, reads three fields of, encodes and drops a stored
//! TrainJob, the work every store write and read repeats, and prints the
//! time per round. `cargo run --release [--features ordered] -- trainjob.json`.

use std::time::Instant;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "trainjob.json".into());
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let rounds = 20_000;
    let start = Instant::now();
    let mut bytes = 0usize;
    for _ in 0..rounds {
        let stored: serde_json::Value = serde_json::from_slice(&text).expect("JSON");
        let copy = stored.clone();
        bytes += copy["metadata"]["name"].as_str().map_or(0, str::len);
        bytes += copy["spec"]["runtimeRef"]["name"]
            .as_str()
            .map_or(0, str::len);
        bytes += copy["status"]["conditions"].as_array().map_or(0, Vec::len);
        bytes += serde_json::to_vec(&copy).expect("encode").len();
    }
    let each = start.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
    let map = if cfg!(feature = "ordered") {
        "ordered (IndexMap)"
    } else {
        "sorted (BTreeMap)"
    };
    println!(
        "{map}: {each:.2} us per round ({} bytes in, {bytes} checked)",
        text.len()
    );
}
