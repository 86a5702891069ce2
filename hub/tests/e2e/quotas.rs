//! Kueue quotas against `trainhub dev` with two local spokes (4 CPUs each):
//! Kueue's objects applied with kubectl, TrainJobs labelled with their
//! LocalQueue, and what Kueue users read back (Workloads, queue status,
//! conditions).

use std::time::Duration;

use serde_json::Value;

use crate::common::{DevHub, eventually};

/// A default flavor, a ClusterQueue `cluster-queue` of `cpu` CPUs (memory
/// plenty) with `extra` spec lines, and LocalQueue `user-queue` in
/// `default` for it.
pub(crate) fn queues(cpu: &str, extra: &str) -> String {
    format!(
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata:\n  name: default-flavor\n---\n{}",
        cluster_queue_as("cluster-queue", "user-queue", cpu, None, extra)
    )
}

/// A one-node TrainJob (1 CPU, 512Mi: the runtime's requests) in
/// `user-queue`, sleeping `seconds`.
pub(crate) fn trainjob(name: &str, seconds: u32, priority_class: Option<&str>) -> String {
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

pub(crate) fn apply(hub: &DevHub, yaml: &str) {
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
    // Held by its queue, it reads as Kueue's suspended TrainJob does: the
    // STATE column prints Suspended.
    let state = eventually(
        "the waiting TrainJob's STATE column",
        &hub,
        Duration::from_secs(20),
        || {
            let line = hub.kubectl_ok(&["get", "trainjob", &waiting_name, "--no-headers"]);
            line.contains("Suspended").then_some(line)
        },
    )
    .await;
    assert!(state.starts_with(&waiting_name), "{state}");

    // As the first two finish, the third gets their quota and runs.
    all_complete(&hub, Duration::from_secs(90)).await;
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
    // Named as Kueue names a preemptor: by its uids (it may be another
    // tenant's), never by its name.
    let urgent_uid = get(&hub, "urgent")["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let message = evicted["message"].as_str().unwrap();
    assert!(
        message.starts_with("Preempted to accommodate a workload (UID: ")
            && message.contains(&format!(
                "JobUID: {urgent_uid}) due to prioritization in the ClusterQueue"
            ))
            && !message.contains("urgent"),
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

/// A ClusterQueue `name` of `cpu` CPUs in `cohort` (if any), with `extra`
/// spec lines, and LocalQueue `name` in `default` for it (the flavor is
/// `default-flavor`, made by [`queues`]).
fn cluster_queue(name: &str, cpu: &str, cohort: Option<&str>, extra: &str) -> String {
    cluster_queue_as(name, name, cpu, cohort, extra)
}

/// As [`cluster_queue`], the LocalQueue named `local_queue`.
fn cluster_queue_as(
    name: &str,
    local_queue: &str,
    cpu: &str,
    cohort: Option<&str>,
    extra: &str,
) -> String {
    let cohort = cohort
        .map(|c| format!("  cohortName: {c}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: {name}
spec:
  namespaceSelector: {{}}
{cohort}{extra}  resourceGroups:
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
  name: {local_queue}
spec:
  clusterQueue: {name}
---
"
    )
}

/// A TrainJob of `nodes` one-CPU nodes in LocalQueue `queue`.
fn trainjob_in(name: &str, queue: &str, nodes: u32, seconds: u32) -> String {
    trainjob(name, seconds, None)
        .replace("queue-name: user-queue", &format!("queue-name: {queue}"))
        .replace("numNodes: 1", &format!("numNodes: {nodes}"))
}

/// Waits until every TrainJob is Complete.
async fn all_complete(hub: &DevHub, timeout: Duration) {
    eventually("every TrainJob complete", hub, timeout, || {
        trainjobs(hub)
            .iter()
            .all(|j| is_true(j, "Complete"))
            .then_some(())
    })
    .await;
}

/// Sets `cluster-queue`'s `spec.stopPolicy`.
fn stop_policy(hub: &DevHub, policy: &str) {
    let patch = format!(r#"{{"spec":{{"stopPolicy":"{policy}"}}}}"#);
    hub.kubectl_ok(&["patch", "cq", "cluster-queue", "--type=merge", "-p", &patch]);
}

fn get(hub: &DevHub, name: &str) -> Value {
    json(hub, &["get", "trainjob", name])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_borrows_idle_quota_from_its_cohort_and_gives_it_back_when_reclaimed() {
    let hub = DevHub::start_args(&["--spokes", "2"], |_| {});
    apply(&hub, &queues("0", ""));
    let reclaim = "  preemption:\n    reclaimWithinCohort: Any\n";
    apply(
        &hub,
        &format!(
            "{}{}",
            cluster_queue("team-a", "1", Some("org"), ""),
            cluster_queue("team-b", "3", Some("org"), reclaim)
        ),
    );
    // team-a's three one-CPU TrainJobs: one on its own quota, two on
    // team-b's idle quota.
    let jobs: String = ["a-1", "a-2", "a-3"]
        .iter()
        .map(|n| trainjob_in(n, "team-a", 1, 120))
        .collect();
    apply(&hub, &jobs);
    eventually(
        "team-a's three TrainJobs placed, two on borrowed quota",
        &hub,
        Duration::from_secs(60),
        || {
            let cq = json(&hub, &["get", "cq", "team-a"]);
            let cpu = &cq["status"]["flavorsReservation"][0]["resources"][0];
            (cq["status"]["admittedWorkloads"] == 3 && cpu["borrowed"] == "2").then_some(())
        },
    )
    .await;

    // team-b wants two CPUs of its own back: one is idle, the other is
    // reclaimed from exactly one of team-a's borrowers.
    apply(
        &hub,
        &format!(
            "{}{}",
            trainjob_in("b-1", "team-b", 1, 120),
            trainjob_in("b-2", "team-b", 1, 120)
        ),
    );
    eventually(
        "both of team-b's TrainJobs placed",
        &hub,
        Duration::from_secs(60),
        || {
            (spoke_of(&get(&hub, "b-1")).is_some() && spoke_of(&get(&hub, "b-2")).is_some())
                .then_some(())
        },
    )
    .await;
    let reclaimed: Vec<String> = ["a-1", "a-2", "a-3"]
        .iter()
        .filter(|n| {
            condition(&get(&hub, n), "Preempted")
                .is_some_and(|c| c["reason"] == "InCohortReclamation")
        })
        .map(|n| n.to_string())
        .collect();
    assert_eq!(reclaimed.len(), 1, "{reclaimed:?}");
    for n in ["a-1", "a-2", "a-3", "b-1", "b-2"] {
        hub.kubectl_ok(&["delete", "trainjob", n, "--wait=false"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_fifo_waits_for_its_head_where_best_effort_fifo_goes_around_it() {
    let hub = DevHub::start_args(&["--spokes", "2"], |_| {});
    apply(&hub, &queues("0", ""));
    apply(
        &hub,
        &format!(
            "{}{}",
            cluster_queue("strict", "3", None, "  queueingStrategy: StrictFIFO\n"),
            cluster_queue("best-effort", "3", None, "")
        ),
    );
    for q in ["strict", "best-effort"] {
        // One CPU taken; a three-CPU gang cannot fit yet; a one-CPU job
        // behind it could.
        apply(&hub, &trainjob_in(&format!("{q}-first"), q, 1, 15));
        eventually(
            "the first TrainJob placed",
            &hub,
            Duration::from_secs(60),
            || spoke_of(&get(&hub, &format!("{q}-first"))).map(|_| ()),
        )
        .await;
        apply(&hub, &trainjob_in(&format!("{q}-gang"), q, 3, 1));
        eventually(
            "the gang waiting for quota",
            &hub,
            Duration::from_secs(20),
            || {
                condition(&get(&hub, &format!("{q}-gang")), "QuotaReserved")
                    .filter(|c| c["status"] == "False")
                    .map(|_| ())
            },
        )
        .await;
        apply(&hub, &trainjob_in(&format!("{q}-small"), q, 1, 1));
    }
    // BestEffortFIFO: the small one goes around the gang.
    eventually(
        "best-effort-small placed while best-effort-gang waits",
        &hub,
        Duration::from_secs(30),
        || {
            let small = get(&hub, "best-effort-small");
            (spoke_of(&small).is_some() || is_true(&small, "Complete")).then_some(())
        },
    )
    .await;
    assert!(spoke_of(&get(&hub, "best-effort-gang")).is_none());
    // StrictFIFO: the small one waits behind the gang, and says so.
    let small = get(&hub, "strict-small");
    assert!(spoke_of(&small).is_none(), "{small}");
    let waiting = condition(&small, "QuotaReserved").unwrap();
    assert!(
        waiting["message"]
            .as_str()
            .unwrap()
            .contains("the head of StrictFIFO ClusterQueue strict"),
        "{small}"
    );
    // Once the first finishes, the gang and then the small one run.
    all_complete(&hub, Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_and_drain_evicts_what_runs_and_resuming_runs_it_again() {
    let hub = DevHub::start_args(&["--spokes", "2"], |_| {});
    apply(&hub, &queues("4", ""));
    apply(
        &hub,
        &format!(
            "{}{}",
            trainjob("drained-1", 8, None),
            trainjob("drained-2", 8, None)
        ),
    );
    eventually(
        "both TrainJobs placed",
        &hub,
        Duration::from_secs(60),
        || {
            (spoke_of(&get(&hub, "drained-1")).is_some()
                && spoke_of(&get(&hub, "drained-2")).is_some())
            .then_some(())
        },
    )
    .await;
    stop_policy(&hub, "HoldAndDrain");
    eventually(
        "both TrainJobs evicted, the ClusterQueue inactive",
        &hub,
        Duration::from_secs(30),
        || {
            let evicted = ["drained-1", "drained-2"].iter().all(|n| {
                let j = get(&hub, n);
                spoke_of(&j).is_none()
                    && condition(&j, "Evicted")
                        .is_some_and(|c| c["reason"] == "ClusterQueueStopped")
            });
            let cq = json(&hub, &["get", "cq", "cluster-queue"]);
            let stopped = condition(&cq, "Active")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "Stopped");
            (evicted && stopped && cq["status"]["admittedWorkloads"] == 0).then_some(())
        },
    )
    .await;
    let held = condition(&get(&hub, "drained-1"), "QuotaReserved")
        .unwrap()
        .clone();
    assert_eq!(held["reason"], "Inadmissible", "{held}");
    stop_policy(&hub, "None");
    eventually(
        "both TrainJobs run again and complete",
        &hub,
        Duration::from_secs(90),
        || {
            (is_true(&get(&hub, "drained-1"), "Complete")
                && is_true(&get(&hub, "drained-2"), "Complete"))
            .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_can_take_its_quota_from_the_spokes_and_spokes_show_what_queues_use() {
    let hub = DevHub::start_args(&["--spokes", "2"], |_| {});
    apply(&hub, &queues("0", ""));
    apply(&hub, &trainjob("from-spokes", 30, None));
    eventually(
        "the TrainJob waiting on a quota of nothing",
        &hub,
        Duration::from_secs(30),
        || {
            condition(&get(&hub, "from-spokes"), "QuotaReserved")
                .filter(|c| c["reason"] == "Pending")
                .map(|_| ())
        },
    )
    .await;
    hub.kubectl_ok(&[
        "annotate",
        "cq",
        "cluster-queue",
        "trainhub.kubeflow.org/quota-from-spokes=true",
    ]);
    let spoke = eventually(
        "the TrainJob placed on the spokes' quota",
        &hub,
        Duration::from_secs(30),
        || spoke_of(&get(&hub, "from-spokes")),
    )
    .await;
    let wide = eventually(
        "the spoke showing its flavor and the queue's usage",
        &hub,
        Duration::from_secs(30),
        || {
            let wide = hub.kubectl_ok(&["get", "spokes", "-o", "wide"]);
            wide.lines()
                .any(|l| {
                    l.starts_with(&spoke)
                        && l.contains("default-flavor")
                        && l.contains(
                            "cluster-queue[default-flavor:cpu=1,default-flavor:memory=512Mi]",
                        )
                })
                .then_some(wide)
        },
    )
    .await;
    assert!(
        wide.contains("FLAVORS") && wide.contains("QUEUES"),
        "{wide}"
    );
    hub.kubectl_ok(&["delete", "trainjob", "from-spokes", "--wait=false"]);
}
