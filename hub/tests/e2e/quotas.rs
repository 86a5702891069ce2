//! Kueue quotas against `trainhub dev` with two local spokes (4 CPUs each):
//! Kueue's objects applied with kubectl, TrainJobs labelled with their
//! LocalQueue, and what Kueue users read back (Workloads, queue status,
//! conditions).

use std::time::Duration;

use serde_json::Value;

use crate::common::{DevHub, eventually};

/// A default flavor, a ClusterQueue of `cpu` CPUs (memory plenty) with
/// `extra` spec lines, and LocalQueue `user-queue` in `default` for it.
fn queues(cpu: &str, extra: &str) -> String {
    format!(
        "apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: default-flavor
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: cluster-queue
spec:
  namespaceSelector: {{}}
{extra}  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default-flavor
      resources:
      - name: cpu
        nominalQuota: {cpu}
      - name: memory
        nominalQuota: 64Gi
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  namespace: default
  name: user-queue
spec:
  clusterQueue: cluster-queue
"
    )
}

/// A one-node TrainJob (1 CPU, 512Mi: the runtime's requests) in
/// `user-queue`, sleeping `seconds`.
fn trainjob(name: &str, seconds: u32, priority_class: Option<&str>) -> String {
    let class = priority_class
        .map(|c| format!("    kueue.x-k8s.io/priority-class: {c}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {name}
  labels:
    kueue.x-k8s.io/queue-name: user-queue
{class}spec:
  runtimeRef:
    name: python-distributed
  trainer:
    numNodes: 1
    command: [\"sleep\", \"{seconds}\"]
---
"
    )
}

fn apply(hub: &DevHub, yaml: &str) {
    let out = hub.kubectl_stdin(&["apply", "-f", "-"], Some(yaml));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json(hub: &DevHub, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&hub.kubectl_ok(&all)).unwrap()
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn is_true(object: &Value, type_: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == "True")
}

/// The spoke a TrainJob is placed on, if any.
fn spoke_of(job: &Value) -> Option<String> {
    job["metadata"]["annotations"]["trainhub.kubeflow.org/spoke"]
        .as_str()
        .map(String::from)
}

fn trainjobs(hub: &DevHub) -> Vec<Value> {
    json(hub, &["get", "trainjobs"])["items"]
        .as_array()
        .unwrap()
        .clone()
}

fn cluster_queue_counts(hub: &DevHub) -> (i64, i64, i64) {
    let cq = json(hub, &["get", "cq", "cluster-queue"]);
    let n = |f: &str| cq["status"][f].as_i64().unwrap_or(0);
    (
        n("pendingWorkloads"),
        n("reservingWorkloads"),
        n("admittedWorkloads"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_smaller_than_the_spokes_holds_and_frees_as_jobs_finish() {
    let hub = DevHub::start_args(&["--spokes", "2"], |_| {});
    apply(&hub, &queues("2", ""));
    let jobs: String = ["q-1", "q-2", "q-3"]
        .iter()
        .map(|n| trainjob(n, 6, None))
        .collect();
    apply(&hub, &jobs);

    // Two CPUs of quota, eight on the spokes: two run, the third waits and
    // says why, with its place in the queue.
    let waiting = eventually(
        "two TrainJobs placed, one waiting for quota",
        &hub,
        Duration::from_secs(60),
        || {
            let all = trainjobs(&hub);
            let placed = all.iter().filter(|j| spoke_of(j).is_some()).count();
            let waiting: Vec<&Value> = all
                .iter()
                .filter(|j| {
                    condition(j, "QuotaReserved")
                        .is_some_and(|c| c["status"] == "False" && c["reason"] == "Pending")
                })
                .collect();
            (placed == 2 && waiting.len() == 1).then(|| waiting[0].clone())
        },
    )
    .await;
    let message = condition(&waiting, "QuotaReserved").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("position 1 in ClusterQueue cluster-queue") && message.contains("cpu"),
        "{message}"
    );
    assert!(spoke_of(&waiting).is_none());
    let waiting_name = waiting["metadata"]["name"].as_str().unwrap().to_string();

    // The queues count what runs and what waits, as Kueue's columns show.
    eventually(
        "ClusterQueue status: 1 pending, 2 admitted",
        &hub,
        Duration::from_secs(20),
        || (cluster_queue_counts(&hub) == (1, 2, 2)).then_some(()),
    )
    .await;
    let cq = json(&hub, &["get", "cq", "cluster-queue"]);
    let usage = &cq["status"]["flavorsUsage"][0];
    assert_eq!(usage["name"], "default-flavor");
    assert_eq!(usage["resources"][0]["name"], "cpu");
    assert_eq!(usage["resources"][0]["total"], "2", "{cq}");
    assert!(is_true(&cq, "Active"), "{cq}");
    let columns = hub.kubectl_ok(&["get", "cq"]);
    assert!(
        columns.contains("PENDING WORKLOADS") && columns.contains("cluster-queue"),
        "{columns}"
    );
    let lq = json(&hub, &["get", "lq", "user-queue"]);
    assert_eq!(lq["status"]["pendingWorkloads"], 1, "{lq}");
    assert_eq!(lq["status"]["admittedWorkloads"], 2, "{lq}");

    // One Workload per TrainJob: the admitted ones say where, the waiting
    // one why.
    let workloads = json(&hub, &["get", "wl"]);
    let items = workloads["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{workloads}");
    let admitted: Vec<&Value> = items.iter().filter(|w| is_true(w, "Admitted")).collect();
    assert_eq!(admitted.len(), 2, "{workloads}");
    for w in &admitted {
        assert_eq!(w["status"]["admission"]["clusterQueue"], "cluster-queue");
        assert_eq!(
            w["status"]["admission"]["podSetAssignments"][0]["flavors"]["cpu"],
            "default-flavor"
        );
        assert!(w["status"]["clusterName"].as_str().is_some(), "{w}");
    }
    let pending = items
        .iter()
        .find(|w| w["metadata"]["ownerReferences"][0]["name"] == waiting_name.as_str())
        .unwrap();
    assert_eq!(
        condition(pending, "QuotaReserved").unwrap()["reason"],
        "Pending"
    );
    assert_eq!(pending["spec"]["queueName"], "user-queue");

    // Kubectl describes the wait as an Event too.
    let events = hub.kubectl_ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={waiting_name}"),
    ]);
    assert!(events.contains("Pending"), "{events}");

    // As the first two finish, the third gets their quota and runs.
    eventually(
        "every TrainJob complete",
        &hub,
        Duration::from_secs(90),
        || {
            trainjobs(&hub)
                .iter()
                .all(|j| is_true(j, "Complete"))
                .then_some(())
        },
    )
    .await;
    let last = json(&hub, &["get", "trainjob", &waiting_name]);
    assert_eq!(
        condition(&last, "QuotaReserved").unwrap()["status"],
        "True",
        "{last}"
    );
    eventually(
        "ClusterQueue status back to nothing held",
        &hub,
        Duration::from_secs(20),
        || (cluster_queue_counts(&hub) == (0, 0, 0)).then_some(()),
    )
    .await;
    let finished = json(&hub, &["get", "wl"]);
    assert!(
        finished["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| is_true(w, "Finished")),
        "{finished}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_trainjob_preempts_exactly_one_and_the_victim_runs_again() {
    let hub = DevHub::start_args(&["--spokes", "2"], |_| {});
    let preemption = "  preemption:\n    withinClusterQueue: LowerPriority\n";
    apply(&hub, &queues("2", preemption));
    apply(
        &hub,
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: WorkloadPriorityClass\nmetadata:\n  name: high\nvalue: 1000\n---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: WorkloadPriorityClass\nmetadata:\n  name: low\nvalue: 10\n",
    );
    apply(
        &hub,
        &format!(
            "{}{}",
            trainjob("low-1", 20, Some("low")),
            trainjob("low-2", 20, Some("low"))
        ),
    );
    eventually(
        "both low-priority TrainJobs placed",
        &hub,
        Duration::from_secs(60),
        || {
            (trainjobs(&hub)
                .iter()
                .filter(|j| spoke_of(j).is_some())
                .count()
                == 2)
                .then_some(())
        },
    )
    .await;

    apply(&hub, &trainjob("urgent", 3, Some("high")));
    // Exactly one victim: the quota lacks one CPU.
    let victim = eventually(
        "one low-priority TrainJob preempted",
        &hub,
        Duration::from_secs(60),
        || {
            let all = trainjobs(&hub);
            let evicted: Vec<&Value> = all
                .iter()
                .filter(|j| {
                    condition(j, "Preempted").is_some_and(|c| c["reason"] == "InClusterQueue")
                })
                .collect();
            (evicted.len() == 1).then(|| evicted[0].clone())
        },
    )
    .await;
    let name = victim["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("low-"), "{name}");
    let evicted = condition(&victim, "Evicted").unwrap();
    assert_eq!(evicted["reason"], "Preempted", "{victim}");
    assert!(
        evicted["message"]
            .as_str()
            .unwrap()
            .contains("default/urgent"),
        "{victim}"
    );
    eventually("urgent completes", &hub, Duration::from_secs(60), || {
        is_true(&json(&hub, &["get", "trainjob", "urgent"]), "Complete").then_some(())
    })
    .await;
    // The other low-priority TrainJob was never touched.
    let other = if name == "low-1" { "low-2" } else { "low-1" };
    let untouched = json(&hub, &["get", "trainjob", other]);
    assert!(condition(&untouched, "Preempted").is_none(), "{untouched}");
    // The victim runs again and completes, and its Workload keeps the
    // story.
    eventually(
        "the victim completes after all",
        &hub,
        Duration::from_secs(90),
        || is_true(&json(&hub, &["get", "trainjob", &name]), "Complete").then_some(()),
    )
    .await;
    let again = json(&hub, &["get", "trainjob", &name]);
    let evicted = condition(&again, "Evicted").unwrap();
    assert_eq!(evicted["status"], "False", "{again}");
    assert!(
        evicted["message"]
            .as_str()
            .unwrap()
            .starts_with("Previously: "),
        "{again}"
    );
}
