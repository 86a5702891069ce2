//! `trainspoke`: the spoke agent.

use clap::Parser;

fn main() -> std::process::ExitCode {
    trainhub_spoke::cli::main(trainhub_spoke::cli::Args::parse())
}
