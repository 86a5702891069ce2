//! `trainctl`: trainhub's user and admin command line.

use clap::Parser;

fn main() -> std::process::ExitCode {
    trainhub::ctl::run(trainhub::ctl::Args::parse())
}
