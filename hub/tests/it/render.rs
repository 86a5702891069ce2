//! `trainctl render` end to end, and the wasm pipeline against the same
//! logic linked natively.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use trainhub::plugins::Snapshot;
use trainhub::render::{Inputs, render};

use crate::common::{documents, host, repo_dir, upstream_dir};

const RUNTIMES: [(&str, &str); 5] = [
    ("torch_distributed.yaml", "torch-distributed"),
    ("deepspeed_distributed.yaml", "deepspeed-distributed"),
    ("jax_distributed.yaml", "jax-distributed"),
    ("xgboost_distributed.yaml", "xgboost-distributed"),
    ("llama3_2_1B.yaml", "torchtune-llama3.2-1b"),
];

/// `01-multi-node.yaml` with its runtimeRef pointed at `runtime`.
fn multi_node_job(runtime: &str) -> Value {
    let mut job = documents(&upstream_dir().join("01-multi-node.yaml")).remove(0);
    job["spec"]["runtimeRef"]["name"] = Value::String(runtime.to_string());
    job
}

fn trainctl(args: &[&str]) -> (i32, String, String) {
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_trainctl"))
        .args(args)
        .env("TRAINHUB_CACHE_DIR", cache)
        .output()
        .expect("run trainctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write_json(dir: &Path, name: &str, value: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(value).expect("json")).expect("write");
    path.display().to_string()
}

fn items(stdout: &str) -> Vec<Value> {
    let list: Value =
        serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert_eq!(list["kind"], "List");
    list["items"].as_array().expect("items").clone()
}

fn replicated_job<'a>(jobset: &'a Value, name: &str) -> &'a Value {
    jobset["spec"]["replicatedJobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["name"] == name))
        .unwrap_or_else(|| panic!("no replicatedJob {name} in {jobset}"))
}

#[test]
fn renders_every_upstream_runtime_with_the_multi_node_example() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (file, runtime) in RUNTIMES {
        let job = write_json(dir.path(), "job.json", &multi_node_job(runtime));
        let runtime_file = upstream_dir().join(file).display().to_string();
        let (code, stdout, stderr) =
            trainctl(&["render", "-f", &job, "-f", &runtime_file, "-o", "json"]);
        assert_eq!(code, 0, "{runtime}: {stderr}");
        let objects = items(&stdout);
        let jobset = &objects[0];
        assert_eq!(jobset["kind"], "JobSet", "{runtime}: JobSet comes first");
        assert_eq!(jobset["apiVersion"], "jobset.x-k8s.io/v1alpha2");
        assert_eq!(jobset["metadata"]["name"], "multi-node-example");
        assert_eq!(jobset["metadata"]["ownerReferences"][0]["kind"], "TrainJob");
        let node = replicated_job(jobset, "node");
        let expected_nodes = if runtime == "deepspeed-distributed" {
            2
        } else {
            3
        };
        assert_eq!(
            node["template"]["spec"]["parallelism"], expected_nodes,
            "{runtime}"
        );
        assert_eq!(
            node["template"]["spec"]["completions"], expected_nodes,
            "{runtime}"
        );
        let mut kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        if runtime == "deepspeed-distributed" {
            kinds.sort();
            assert_eq!(kinds, ["ConfigMap", "JobSet", "Secret"], "{runtime}");
            let of_kind = |kind: &str| objects.iter().find(|o| o["kind"] == kind).expect("object");
            let hostfile = of_kind("ConfigMap")["data"]["hostfile"]
                .as_str()
                .expect("hostfile");
            assert_eq!(
                hostfile.lines().count(),
                3,
                "launcher runs as a node: {hostfile}"
            );
            assert_eq!(of_kind("Secret")["type"], "kubernetes.io/ssh-auth");
        } else {
            assert_eq!(kinds, ["JobSet"], "{runtime}");
        }
    }
}

#[test]
fn torch_env_reaches_the_node_container() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = write_json(dir.path(), "job.json", &multi_node_job("torch-distributed"));
    // No runtime given: the built-in runtimes are used.
    let (code, stdout, stderr) = trainctl(&["render", "-f", &job, "-o", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let objects = items(&stdout);
    let node = replicated_job(&objects[0], "node");
    let container = &node["template"]["spec"]["template"]["spec"]["containers"][0];
    let env: Vec<(String, Value)> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                e.get("value").cloned().unwrap_or(Value::Null),
            )
        })
        .collect();
    let value = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(value("PET_NNODES"), Some(Value::from("3")));
    assert_eq!(
        value("PET_MASTER_ADDR"),
        Some(Value::from(
            "multi-node-example-node-0-0.multi-node-example"
        ))
    );
    assert_eq!(value("PET_MASTER_PORT"), Some(Value::from("29500")));
    assert!(
        value("PET_NODE_RANK").is_some(),
        "PET_NODE_RANK from the completion index"
    );
    assert_eq!(container["ports"][0]["containerPort"], 29500);
}

#[test]
fn yaml_output_is_a_document_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = write_json(dir.path(), "job.json", &multi_node_job("torch-distributed"));
    let (code, stdout, stderr) = trainctl(&["render", "-f", &job]);
    assert_eq!(code, 0, "{stderr}");
    let docs = trainhub::render::parse_documents("stdout", &stdout).expect("YAML stream");
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["kind"], "JobSet");
}

#[test]
fn invalid_trainjob_prints_field_errors_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = multi_node_job("torch-distributed");
    job["spec"]["trainer"]["env"] = serde_json::json!([{"name": "PET_NNODES", "value": "9"}]);
    let job = write_json(dir.path(), "job.json", &job);
    let (code, stdout, stderr) = trainctl(&["render", "-f", &job]);
    assert_eq!(code, 1, "stdout: {stdout}");
    assert!(stdout.is_empty(), "nothing is printed on stdout: {stdout}");
    assert!(stderr.contains("spec.trainer.env: "), "{stderr}");
    assert!(stderr.contains("PET_NNODES"), "{stderr}");
}

#[test]
fn unknown_runtime_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = write_json(dir.path(), "job.json", &multi_node_job("no-such-runtime"));
    let (code, _, stderr) = trainctl(&["render", "-f", &job]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("no-such-runtime") && stderr.contains("not found"),
        "{stderr}"
    );
}

#[test]
fn upstream_examples_render_with_their_runtimes() {
    let upstream = upstream_dir();
    let torch = upstream
        .join("torch_distributed.yaml")
        .display()
        .to_string();
    for example in [
        "02-runtime-patches.yaml",
        "03-kueue-integration.yaml",
        "04-volcano-integration.yaml",
    ] {
        let file = upstream.join(example).display().to_string();
        let mut args = vec!["render", "-f", &file, "-o", "json"];
        if example != "04-volcano-integration.yaml" {
            args.extend(["-f", &torch]);
        }
        let (code, stdout, stderr) = trainctl(&args);
        assert_eq!(code, 0, "{example}: {stderr}");
        let objects = items(&stdout);
        match example {
            "02-runtime-patches.yaml" => {
                let pod = &replicated_job(&objects[0], "node")["template"]["spec"]["template"];
                assert_eq!(pod["spec"]["serviceAccountName"], "training-sa");
                assert_eq!(pod["spec"]["nodeSelector"]["node-type"], "training");
                assert_eq!(objects[0]["metadata"]["labels"]["team"], "ml-platform");
            }
            "03-kueue-integration.yaml" => assert_eq!(objects[0]["spec"]["suspend"], true),
            _ => {
                assert_eq!(objects[1]["apiVersion"], "scheduling.volcano.sh/v1beta1");
                assert_eq!(objects[1]["spec"]["minMember"], 4);
            }
        }
    }
}

/// The wasm components and the natively linked plugin logic build the same
/// objects (the MPI SSH key is random, so Secrets' data is left out).
#[test]
fn wasm_pipeline_matches_native_pipeline() {
    let host = host();
    let wasm = Snapshot::new(trainhub::builtin::load(&host).expect("built-ins load"));
    let native = Snapshot::new(trainhub::builtin::native());
    let target = trainhub_plugin_sdk::testing::target("spoke-a");
    for (file, runtime) in RUNTIMES {
        let mut inputs = Inputs::default();
        inputs
            .add("job", vec![multi_node_job(runtime)])
            .expect("job");
        inputs
            .add(file, documents(&upstream_dir().join(file)))
            .expect("runtime");
        let strip = |mut objects: Vec<Value>| {
            for o in &mut objects {
                if o["kind"] == "Secret" {
                    o["data"] = Value::Null;
                }
            }
            objects
        };
        let (from_wasm, _) = render(&inputs, &wasm, &target).expect("wasm render");
        let (from_native, _) = render(&inputs, &native, &target).expect("native render");
        assert_eq!(strip(from_wasm), strip(from_native), "{runtime}");
    }
}

#[test]
fn acme_example_renders_with_its_plugin_from_a_directory() {
    let plugins = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        plugins.path().join("acme.wasm"),
        crate::common::wasm("acme_plugin"),
    )
    .expect("copy");
    std::fs::copy(
        repo_dir().join("examples/acme/acme.yaml"),
        plugins.path().join("acme.yaml"),
    )
    .expect("copy");
    let job = repo_dir()
        .join("examples/acme/trainjob.yaml")
        .display()
        .to_string();
    let runtime = repo_dir()
        .join("examples/acme/runtime.yaml")
        .display()
        .to_string();
    let dir = plugins.path().display().to_string();
    let (code, stdout, stderr) = trainctl(&[
        "render",
        "-f",
        &job,
        "-f",
        &runtime,
        "--plugins-dir",
        &dir,
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let objects = items(&stdout);
    let pod = &replicated_job(&objects[0], "node")["template"]["spec"]["template"]["spec"];
    let names: Vec<&str> = pod["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["node", "acme-agent"]);
    assert!(
        pod["containers"][0]["env"]
            .to_string()
            .contains("acme-gpu-east"),
        "{}",
        pod["containers"][0]
    );
}
