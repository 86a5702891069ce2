//! `trainspoke`: the spoke agent.

use clap::Parser;

/// jemalloc rather than the system allocator: the process allocates and
/// frees many small objects (JSON values, protobuf messages) across threads,
/// where glibc's malloc cost a sixth of the CPU (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    trainhub_spoke::cli::main(trainhub_spoke::cli::Args::parse())
}
