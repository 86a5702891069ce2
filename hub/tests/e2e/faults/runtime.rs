//! Runtime snapshots: a TrainJob keeps the runtime and plugins it was
//! admitted with, so deleting or editing its runtime neither strands nor
//! changes it.

use std::time::Duration;

use crate::common::{DevHub, tail, wait_for};

/// A copy of the python-distributed runtime named `name`.
fn runtime(name: &str) -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../manifests/runtimes/python-distributed.yaml"),
    )
    .unwrap();
    text.replace("name: python-distributed", &format!("name: {name}"))
}

fn trainjob(name: &str, runtime: &str, command: &str, suspend: bool) -> String {
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\nspec:\n  suspend: {suspend}\n  runtimeRef:\n    name: {runtime}\n  trainer:\n    numNodes: 1\n    command: [\"sh\", \"-c\", {command:?}]\n"
    )
}

fn get(hub: &DevHub, what: &[&str], jsonpath: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let jsonpath = format!("jsonpath={jsonpath}");
    args.extend_from_slice(&["-o", &jsonpath]);
    String::from_utf8_lossy(&hub.kubectl(&args).stdout)
        .trim()
        .to_string()
}

fn condition(hub: &DevHub, job: &str, type_: &str) -> String {
    get(
        hub,
        &["trainjob", job],
        &format!(r#"{{.status.conditions[?(@.type=="{type_}")].status}}"#),
    )
}

/// The env names of the pods of `job`, once it has pods.
async fn pod_env(hub: &DevHub, job: &str) -> String {
    let selector = format!("jobset.sigs.k8s.io/jobset-name={job}");
    wait_for(
        &format!("the pods of {job}"),
        Duration::from_secs(60),
        || tail(&hub.log(), 60),
        || {
            let names = get(hub, &["pods", "-l", &selector], "{.items[*].metadata.name}");
            (!names.is_empty()).then(|| {
                get(
                    hub,
                    &["pods", "-l", &selector],
                    "{.items[*].spec.containers[*].env[*].name}",
                )
            })
        },
    )
    .await
}

/// Deleting a ClusterTrainingRuntime while its TrainJob runs does not
/// strand it: the TrainJob's status is still mapped, and it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainjob_completes_after_its_runtime_is_deleted() {
    let hub = DevHub::start_args(&["--spokes", "1"], |_| {});
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&runtime("doomed")));
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("orphaned", "doomed", "sleep 4", false)),
    );
    pod_env(&hub, "orphaned").await;
    assert_eq!(condition(&hub, "orphaned", "Complete"), "", "still running");
    hub.kubectl_ok(&["delete", "clustertrainingruntime", "doomed"]);
    wait_for(
        "the TrainJob to complete without its runtime",
        Duration::from_secs(60),
        || tail(&hub.log(), 60),
        || (condition(&hub, "orphaned", "Complete") == "True").then_some(()),
    )
    .await;
    assert_eq!(condition(&hub, "orphaned", "Failed"), "");
}

/// A runtime edit changes only TrainJobs created after it: one admitted
/// before the edit (suspended, so built only after it) runs as admitted,
/// one created after runs with the edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_edit_changes_only_trainjobs_created_after_it() {
    let hub = DevHub::start_args(&["--spokes", "1"], |_| {});
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&runtime("edited")));
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("before", "edited", "sleep 30", true)),
    );
    hub.kubectl_ok(&[
        "patch",
        "clustertrainingruntime",
        "edited",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/spec/template/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env","value":[{"name":"RUNTIME_EDITED","value":"yes"}]}]"#,
    ]);
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("after", "edited", "sleep 30", false)),
    );
    hub.kubectl_ok(&[
        "patch",
        "trainjob",
        "before",
        "--type=merge",
        "-p",
        r#"{"spec":{"suspend":false}}"#,
    ]);
    let after = pod_env(&hub, "after").await;
    assert!(
        after.contains("RUNTIME_EDITED"),
        "created after the edit: {after:?}"
    );
    let before = pod_env(&hub, "before").await;
    assert!(
        !before.contains("RUNTIME_EDITED") && before.contains("RANK"),
        "admitted before the edit, the TrainJob runs as admitted: {before:?}"
    );
}
