//! The README's first command, as a newcomer types it: relative paths for
//! the data directory and the example, run from the directory that holds
//! them (here a copy of the examples in a fresh directory, so that nothing
//! of the checkout's own `.trainhub` is reused).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::tail;

const EXAMPLE: &str = "examples/trainjobs/logistic-regression.yaml";

#[test]
fn readme_dev_command_with_a_relative_data_dir_runs_the_example_to_complete() {
    let work = tempfile::tempdir().expect("temp dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(EXAMPLE);
    std::fs::create_dir_all(work.path().join("examples/trainjobs")).expect("examples dir");
    std::fs::copy(&example, work.path().join(EXAMPLE)).expect("copying the example");
    let stderr_path = work.path().join("stderr.log");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    // As in the README but on free ports; no plugin cache override, since
    // the cache under the relative data directory is part of what is tested.
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainhub"))
        .current_dir(work.path())
        .args(["dev", "--data-dir", ".trainhub", "--apply", EXAMPLE])
        .args(["--api-port", "0"])
        .env_remove("TRAINHUB_PLUGIN_CACHE_DIR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("starting trainhub dev");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut printed = Vec::new();
    let mut complete = false;
    let mut final_loss = 0;
    while final_loss < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                complete |= line.starts_with("trainjob/logistic-regression: Complete");
                if complete && line.contains("done: final loss") {
                    final_loss += 1;
                }
                printed.push(line);
            }
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(
        complete && final_loss == 2,
        "the example did not complete with both ranks' final loss:\nstdout:\n{}\nstderr:\n{}",
        printed.join("\n"),
        tail(&log, 40)
    );
    let data_dir = work.path().join(".trainhub");
    assert!(
        data_dir.join("kubeconfig").exists(),
        "no kubeconfig in {}",
        data_dir.display()
    );
    assert!(
        data_dir.join("plugin-cache").is_dir(),
        "the plugin cache is not under the relative data directory"
    );
    assert!(
        !log.contains('\u{1b}'),
        "logs written to a file carry ANSI escape codes:\n{}",
        tail(&log, 10)
    );
}
