//! Quota in the dispatcher: admission by quota before offers, flavors
//! restricting spokes, strategies and stop policies, preemption as
//! actions, and the invariants under random event sequences.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::dispatch::quota::{
    BorrowWithinCohort, ClusterQueue, Flavor, FlavorQuotas, LocalQueueStatus, QueueingStrategy,
    Quota, QuotaConfig, ReclaimWithinCohort, ResourceGroup, StopPolicy, WithinClusterQueue,
    reason as kueue,
};
use trainhub_apiserver::selector::LabelSelector;

fn key(name: &str) -> JobKey {
    JobKey {
        namespace: "team".into(),
        name: name.into(),
    }
}

fn flavor(name: &str, pool: Option<&str>) -> Flavor {
    Flavor {
        name: name.into(),
        node_labels: pool
            .map(|p| [("pool".to_string(), p.to_string())].into())
            .unwrap_or_default(),
        ..Flavor::default()
    }
}

/// A ClusterQueue over `cpu` with the given flavors' nominal quotas, in
/// order.
fn cq(name: &str, cohort: Option<&str>, flavors: &[(&str, i64)]) -> ClusterQueue {
    ClusterQueue {
        name: name.into(),
        cohort: cohort.map(str::to_string),
        resource_groups: vec![ResourceGroup {
            covered: vec!["cpu".into()],
            flavors: flavors
                .iter()
                .map(|(f, nominal)| FlavorQuotas {
                    flavor: f.to_string(),
                    quotas: [(
                        "cpu".to_string(),
                        Quota {
                            nominal: *nominal,
                            ..Quota::default()
                        },
                    )]
                    .into(),
                })
                .collect(),
        }],
        namespace_selector: LabelSelector::everything(),
        ..ClusterQueue::default()
    }
}

fn config(flavors: Vec<Flavor>, queues: Vec<ClusterQueue>) -> QuotaConfig {
    QuotaConfig {
        flavors: flavors.into_iter().map(|f| (f.name.clone(), f)).collect(),
        cluster_queues: queues.into_iter().map(|q| (q.name.clone(), q)).collect(),
        cohorts: BTreeMap::new(),
    }
}

fn managed(name: &str, cluster_queue: &str, cpu: i64, priority: i32, created: i64) -> JobInfo {
    JobInfo {
        key: key(name),
        uid: format!("uid-{name}"),
        priority,
        created,
        selector: None,
        pod_sets: vec![PodSetDemand {
            name: "node".into(),
            count: 1,
            requests_milli: [("cpu".to_string(), cpu)].into(),
        }]
        .into(),
        want: Want::Run,
        queue: Some(QueueRef {
            local_queue: "lq".into(),
            cluster_queue: Some(cluster_queue.into()),
            namespace_labels: json!({"team": "a"}),
            tolerations: Vec::new(),
            priority_class: None,
            hold: None,
            drain: false,
        }),
    }
}

fn dispatcher() -> Dispatcher {
    Dispatcher::new(Config {
        mode: Mode::AllAtOnce,
        worker_lost_timeout_ms: 1000,
        retry_ms: 500,
        fanout: 0,
        offer_timeout_ms: 2000,
        deletion_timeout_ms: 3000,
    })
}

fn connect(d: &mut Dispatcher, name: &str, pool: &str, free: i64) -> Vec<Action> {
    d.spoke_connected(
        name,
        json!({"pool": pool}),
        vec![("cpu".into(), 16_000, free)],
        &[],
        0,
    )
}

fn offered(actions: &[Action]) -> BTreeSet<(String, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Offer { spoke, job, .. } => Some((job.name.clone(), spoke.clone())),
            _ => None,
        })
        .collect()
}

fn offered_jobs(actions: &[Action]) -> BTreeSet<String> {
    offered(actions).into_iter().map(|(j, _)| j).collect()
}

/// The job's spoke admits its current offer and the placement commits.
fn place(d: &mut Dispatcher, name: &str, spoke: &str, now: Millis) -> Vec<Action> {
    let generation = d.jobs[&key(name)].generation;
    let mut actions = d.admit_answer(spoke, &format!("uid-{name}"), generation, true, now);
    let placement = Placement {
        spoke: Some(spoke.into()),
        generation,
    };
    assert!(
        actions.contains(&Action::Commit {
            job: key(name),
            placement: placement.clone()
        }),
        "{name} was not admitted on {spoke}: {actions:?}"
    );
    actions.extend(d.committed(&key(name), &placement, true, now));
    actions
}

fn finish(d: &mut Dispatcher, name: &str, now: Millis) -> Vec<Action> {
    let mut info = d.jobs[&key(name)].info.clone();
    info.want = Want::Finished;
    d.upsert_job(info, None, now)
}

fn waiting_message(d: &Dispatcher, name: &str) -> String {
    d.waiting(&key(name)).map(|w| w.message).unwrap_or_default()
}

#[test]
fn a_job_without_a_queue_is_dispatched_as_before_whatever_the_quotas() {
    let mut d = dispatcher();
    d.set_quota_config(
        config(vec![flavor("f", None)], vec![cq("cq", None, &[("f", 0)])]),
        0,
    );
    connect(&mut d, "s1", "a", 8000);
    let mut info = managed("free", "cq", 2000, 0, 0);
    info.queue = None;
    let actions = d.upsert_job(info, None, 0);
    assert_eq!(offered_jobs(&actions), BTreeSet::from(["free".to_string()]));
    assert!(d.quotas().reservations().next().is_none());
    assert_eq!(d.waiting(&key("free")), None);
}

#[test]
fn quota_admits_what_fits_and_the_rest_waits_with_kueues_reason() {
    let mut d = dispatcher();
    d.set_quota_config(
        config(
            vec![flavor("default-flavor", None)],
            vec![cq("cq", None, &[("default-flavor", 4000)])],
        ),
        0,
    );
    connect(&mut d, "s1", "a", 16_000);
    let mut offers = BTreeSet::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        offers.extend(offered_jobs(&d.upsert_job(
            managed(name, "cq", 2000, 0, i as i64),
            None,
            0,
        )));
    }
    assert_eq!(offers, BTreeSet::from(["a".to_string(), "b".to_string()]));
    let w = d.waiting(&key("c")).unwrap();
    assert_eq!(w.reason, kueue::PENDING);
    assert_eq!(
        w.message,
        "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default-flavor, 2 more needed"
    );
    assert_eq!(w.position_in_cluster_queue, 0);
    let status = d.cluster_queue_status("cq").unwrap();
    assert_eq!(
        (
            status.pending_workloads,
            status.reserving_workloads,
            status.admitted_workloads
        ),
        (1, 2, 0)
    );
    assert_eq!(status.flavors_reservation[0].resources[0].total, 4000);
    place(&mut d, "a", "s1", 1);
    let status = d.cluster_queue_status("cq").unwrap();
    assert_eq!(status.admitted_workloads, 1);
    assert_eq!(status.flavors_usage[0].resources[0].total, 2000);
    let lq = d.local_queue_status("team", "lq");
    assert_eq!(
        (
            lq.pending_workloads,
            lq.reserving_workloads,
            lq.admitted_workloads
        ),
        (1, 2, 1)
    );
    // a finishes: its quota goes to c at once.
    let actions = finish(&mut d, "a", 2);
    assert_eq!(offered_jobs(&actions), BTreeSet::from(["c".to_string()]));
    assert_eq!(d.waiting(&key("c")), None);
}

#[test]
fn the_assigned_flavor_decides_which_spokes_are_offered_the_job() {
    let mut d = dispatcher();
    d.set_quota_config(
        config(
            vec![
                flavor("on-demand", Some("od")),
                flavor("spot", Some("spot")),
            ],
            vec![cq("cq", None, &[("on-demand", 2000), ("spot", 8000)])],
        ),
        0,
    );
    connect(&mut d, "od-1", "od", 16_000);
    connect(&mut d, "spot-1", "spot", 16_000);
    connect(&mut d, "spot-2", "spot", 16_000);
    let actions = d.upsert_job(managed("small", "cq", 2000, 0, 0), None, 0);
    assert_eq!(
        offered(&actions),
        BTreeSet::from([("small".to_string(), "od-1".to_string())])
    );
    let actions = d.upsert_job(managed("next", "cq", 2000, 0, 1), None, 0);
    assert_eq!(
        offered(&actions),
        BTreeSet::from([
            ("next".to_string(), "spot-1".to_string()),
            ("next".to_string(), "spot-2".to_string())
        ])
    );
    let r = d.quotas().reservation(&key("next")).unwrap();
    assert_eq!(r.assignment.flavors["cpu"], "spot");
}

#[test]
fn without_a_spoke_of_its_flavor_a_job_waits_and_holds_no_quota() {
    let mut d = dispatcher();
    d.set_quota_config(
        config(
            vec![flavor("h100", Some("h100"))],
            vec![cq("cq", None, &[("h100", 8000)])],
        ),
        0,
    );
    connect(&mut d, "a100-1", "a100", 16_000);
    let actions = d.upsert_job(managed("j", "cq", 2000, 0, 0), None, 0);
    assert!(offered(&actions).is_empty());
    assert!(!d.quotas().is_reserved(&key("j")));
    assert!(
        waiting_message(&d, "j").contains("no spoke with flavor h100"),
        "{}",
        waiting_message(&d, "j")
    );
    // A spoke of the flavor joins: the job goes there.
    let actions = connect(&mut d, "h100-1", "h100", 16_000);
    assert_eq!(
        offered(&actions),
        BTreeSet::from([("j".to_string(), "h100-1".to_string())])
    );
}

#[test]
fn a_job_refused_by_every_spoke_gives_its_quota_back_until_offered_again() {
    let mut d = dispatcher();
    d.set_quota_config(
        config(
            vec![flavor("f", None)],
            vec![cq("cq", None, &[("f", 4000)])],
        ),
        0,
    );
    connect(&mut d, "s1", "a", 16_000);
    d.upsert_job(managed("j", "cq", 4000, 0, 0), None, 0);
    assert!(d.quotas().is_reserved(&key("j")));
    let generation = d.jobs[&key("j")].generation;
    d.admit_answer("s1", "uid-j", generation, false, 10);
    assert!(!d.quotas().is_reserved(&key("j")));
    assert!(waiting_message(&d, "j").contains("admitted it yet"));
    // Another job may use the quota meanwhile.
    let actions = d.upsert_job(managed("k", "cq", 4000, 0, 1), None, 20);
    assert_eq!(offered_jobs(&actions), BTreeSet::from(["k".to_string()]));
    assert_eq!(d.quotas().available("cq", "f", "cpu"), Some(0));
}

#[test]
fn strict_fifo_holds_back_those_behind_a_head_that_does_not_fit() {
    for (strategy, later_admitted) in [
        (QueueingStrategy::StrictFifo, false),
        (QueueingStrategy::BestEffortFifo, true),
    ] {
        let mut d = dispatcher();
        let mut q = cq("cq", None, &[("f", 4000)]);
        q.strategy = strategy;
        d.set_quota_config(config(vec![flavor("f", None)], vec![q]), 0);
        connect(&mut d, "s1", "a", 16_000);
        d.upsert_job(managed("running", "cq", 3000, 0, 0), None, 0);
        place(&mut d, "running", "s1", 0);
        d.upsert_job(managed("big", "cq", 2000, 0, 1), None, 0);
        let actions = d.upsert_job(managed("small", "cq", 1000, 0, 2), None, 0);
        assert_eq!(
            !offered(&actions).is_empty(),
            later_admitted,
            "{strategy:?}"
        );
        let w = d.waiting(&key("big")).unwrap();
        assert_eq!(w.position_in_cluster_queue, 0);
        if !later_admitted {
            assert_eq!(
                d.waiting(&key("small")).unwrap().position_in_cluster_queue,
                1
            );
            assert!(waiting_message(&d, "small").contains("head of StrictFIFO"));
        }
    }
}

#[test]
fn namespaces_queues_and_resources_that_cannot_be_admitted_say_why() {
    let mut d = dispatcher();
    let mut q = cq("cq", None, &[("f", 4000)]);
    q.namespace_selector =
        LabelSelector::from_label_selector_json(&json!({"matchLabels": {"team": "b"}})).unwrap();
    d.set_quota_config(
        config(
            vec![flavor("f", None)],
            vec![q, cq("open", None, &[("f", 4000)])],
        ),
        0,
    );
    connect(&mut d, "s1", "a", 16_000);
    d.upsert_job(managed("wrong-ns", "cq", 1000, 0, 0), None, 0);
    let w = d.waiting(&key("wrong-ns")).unwrap();
    assert_eq!(w.reason, kueue::INADMISSIBLE);
    assert_eq!(
        w.message,
        "namespace team doesn't match the namespaceSelector of ClusterQueue cq"
    );
    d.upsert_job(managed("no-cq", "missing", 1000, 0, 0), None, 0);
    assert_eq!(
        waiting_message(&d, "no-cq"),
        "ClusterQueue missing doesn't exist"
    );
    let mut info = managed("no-lq", "open", 1000, 0, 0);
    if let Some(q) = info.queue.as_mut() {
        q.cluster_queue = None;
    }
    d.upsert_job(info, None, 0);
    assert_eq!(waiting_message(&d, "no-lq"), "LocalQueue lq doesn't exist");
    let mut info = managed("gpu", "open", 1000, 0, 0);
    let mut pod_sets = info.pod_sets.to_vec();
    pod_sets[0]
        .requests_milli
        .insert("nvidia.com/gpu".into(), 1000);
    info.pod_sets = pod_sets.into();
    d.upsert_job(info, None, 0);
    let w = d.waiting(&key("gpu")).unwrap();
    assert_eq!(w.reason, kueue::INADMISSIBLE);
    assert!(
        w.message
            .ends_with("resource nvidia.com/gpu unavailable in ClusterQueue"),
        "{}",
        w.message
    );
}

#[test]
fn hold_admits_nothing_new_and_hold_and_drain_evicts_the_placed() {
    let mut d = dispatcher();
    let mut flavors = vec![flavor("f", None)];
    d.set_quota_config(
        config(flavors.clone(), vec![cq("cq", None, &[("f", 8000)])]),
        0,
    );
    connect(&mut d, "s1", "a", 16_000);
    d.upsert_job(managed("placed", "cq", 2000, 0, 0), None, 0);
    place(&mut d, "placed", "s1", 0);
    d.upsert_job(managed("offered", "cq", 2000, 0, 1), None, 0);
    let mut held = cq("cq", None, &[("f", 8000)]);
    held.stop_policy = StopPolicy::Hold;
    let actions = d.set_quota_config(config(flavors.clone(), vec![held.clone()]), 1);
    // The reservation not yet placed is cancelled; the placed job runs on.
    assert!(actions.contains(&Action::Withdraw {
        spoke: "s1".into(),
        run_id: "uid-offered".into(),
        generation: 1
    }));
    assert!(!d.quotas().is_reserved(&key("offered")));
    assert!(d.quotas().is_reserved(&key("placed")));
    let actions = d.upsert_job(managed("new", "cq", 1000, 0, 2), None, 2);
    assert!(offered(&actions).is_empty());
    assert_eq!(
        waiting_message(&d, "new"),
        "ClusterQueue cq is stopped (stopPolicy Hold)"
    );
    held.stop_policy = StopPolicy::HoldAndDrain;
    flavors.push(flavor("g", None));
    let actions = d.set_quota_config(config(flavors, vec![held]), 3);
    assert!(actions.contains(&Action::Stop {
        spoke: "s1".into(),
        run_id: "uid-placed".into(),
        generation: 1,
        reason: "ClusterQueue stopped"
    }));
    assert!(actions.iter().any(|a| matches!(a,
        Action::Evicted { job, reason, preemption: None, .. }
            if job.name == "placed" && *reason == kueue::CLUSTER_QUEUE_STOPPED)));
    assert!(actions.contains(&Action::Commit {
        job: key("placed"),
        placement: Placement {
            spoke: None,
            generation: 2
        }
    }));
    assert!(!d.quotas().is_reserved(&key("placed")));
    assert_eq!(d.cluster_queue_status("cq").unwrap().pending_workloads, 3);
}

#[test]
fn a_held_local_queue_admits_nothing_and_hold_and_drain_evicts_what_runs() {
    let mut d = dispatcher();
    d.set_quota_config(
        config(
            vec![flavor("f", None)],
            vec![cq("cq", None, &[("f", 8000)])],
        ),
        0,
    );
    connect(&mut d, "s1", "a", 16_000);
    d.upsert_job(managed("placed", "cq", 2000, 0, 0), None, 0);
    place(&mut d, "placed", "s1", 0);
    let held = |name: &str, drain: bool, created: i64| {
        let mut info = managed(name, "cq", 1000, 0, created);
        if let Some(q) = info.queue.as_mut() {
            q.hold = Some("LocalQueue lq is stopped (stopPolicy Hold)".into());
            q.drain = drain;
        }
        info
    };
    // Hold: a new TrainJob waits, inadmissible, with the runner's reason;
    // what runs keeps running.
    let actions = d.upsert_job(held("new", false, 1), None, 1);
    assert!(offered(&actions).is_empty());
    assert_eq!(
        waiting_message(&d, "new"),
        "LocalQueue lq is stopped (stopPolicy Hold)"
    );
    let actions = d.upsert_job(held("placed", false, 0), None, 2);
    assert!(!actions.iter().any(|a| matches!(a, Action::Stop { .. })));
    assert!(d.quotas().is_reserved(&key("placed")));
    // HoldAndDrain: its run is stopped and it waits again.
    let actions = d.upsert_job(held("placed", true, 0), None, 3);
    assert!(actions.contains(&Action::Stop {
        spoke: "s1".into(),
        run_id: "uid-placed".into(),
        generation: 1,
        reason: "LocalQueue stopped"
    }));
    assert!(actions.iter().any(|a| matches!(a,
        Action::Evicted { job, reason, .. }
            if job.name == "placed" && *reason == kueue::LOCAL_QUEUE_STOPPED)));
    assert!(!d.quotas().is_reserved(&key("placed")));
    assert_eq!(d.cluster_queue_status("cq").unwrap().pending_workloads, 2);
}

/// A ClusterQueue with room for one of four 2-cpu jobs "a" to "d" (in
/// that order; "c" in `c_local_queue`), "a" placed on s1.
fn one_placed_three_waiting(c_local_queue: &str) -> Dispatcher {
    let mut d = dispatcher();
    d.set_quota_config(
        config(
            vec![flavor("f", None)],
            vec![cq("cq", None, &[("f", 2000)])],
        ),
        0,
    );
    connect(&mut d, "s1", "a", 16_000);
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        let mut info = managed(name, "cq", 2000, 0, i as i64);
        if *name == "c" {
            info.queue.as_mut().unwrap().local_queue = c_local_queue.into();
        }
        d.upsert_job(info, None, 0);
    }
    place(&mut d, "a", "s1", 0);
    d
}

#[test]
fn queued_jobs_show_reservations_and_each_waiting_position_in_one_pass() {
    // "c" in another LocalQueue of the same ClusterQueue.
    let d = one_placed_three_waiting("other");
    let jobs: BTreeMap<String, QueueState> = d
        .queued_jobs(usize::MAX, |_, _, _| false)
        .into_iter()
        .map(|(j, _)| (j.key.name, j.state))
        .collect();
    assert!(
        matches!(&jobs["a"], QueueState::Reserved { spoke: Some(s), cluster_queue, .. }
        if s == "s1" && cluster_queue == "cq")
    );
    let position = |name: &str| match &jobs[name] {
        QueueState::Waiting(w) => (w.position_in_cluster_queue, w.position_in_local_queue),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(position("b"), (0, 0));
    assert_eq!(position("c"), (1, 0));
    assert_eq!(position("d"), (2, 1));
    // The same numbers as asked one by one.
    let w = d.waiting(&key("d")).unwrap();
    assert_eq!(
        (w.position_in_cluster_queue, w.position_in_local_queue),
        (2, 1)
    );
}

#[test]
fn queued_jobs_copy_out_only_what_changed_and_cap_positions() {
    let mut d = one_placed_three_waiting("lq");
    // Positions at most 1: "c" (1 ahead) and "d" (2 ahead) read the same.
    let first: BTreeMap<String, (QueueState, u64)> = d
        .queued_jobs(1, |_, _, _| false)
        .into_iter()
        .map(|(j, h)| (j.key.name, (j.state, h)))
        .collect();
    let position = |name: &str| match &first[name].0 {
        QueueState::Waiting(w) => w.position_in_cluster_queue,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!((position("b"), position("c"), position("d")), (0, 1, 1));
    // Asked again with the fingerprints of the first pass: every job is
    // still asked about (with its uid), none is copied.
    let mut asked = Vec::new();
    let again = d.queued_jobs(1, |k, uid, h| {
        asked.push((k.name.clone(), uid.to_string()));
        first[&k.name].1 == h
    });
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(asked.len(), 4);
    assert!(
        asked
            .iter()
            .all(|(name, uid)| uid == &format!("uid-{name}")),
        "{asked:?}"
    );
    // "b" gets its quota once "a" finishes: "a", "b" and "c" change
    // (finished, reserved, now the head); "d" stays capped at 1.
    finish(&mut d, "a", 100);
    let changed: BTreeSet<String> = d
        .queued_jobs(1, |k, _, h| first[&k.name].1 == h)
        .into_iter()
        .map(|(j, _)| j.key.name)
        .collect();
    assert_eq!(
        changed,
        BTreeSet::from(["a".into(), "b".into(), "c".into()])
    );
}

/// One ClusterQueue of 8 cpus that preempts lower priorities, two spokes
/// of 8 cpus, each running one 4-cpu job of priority 0.
fn full_queue() -> Dispatcher {
    let mut d = dispatcher();
    let mut q = cq("cq", None, &[("f", 8000)]);
    q.preemption.within_cluster_queue = WithinClusterQueue::LowerPriority;
    d.set_quota_config(config(vec![flavor("f", None)], vec![q]), 0);
    d.spoke_connected("s1", json!({}), vec![("cpu".into(), 8000, 8000)], &[], 0);
    d.spoke_connected("s2", json!({}), vec![("cpu".into(), 8000, 8000)], &[], 0);
    d.upsert_job(managed("low-1", "cq", 4000, 0, 0), None, 0);
    place(&mut d, "low-1", "s1", 10);
    d.upsert_job(managed("low-2", "cq", 4000, 0, 1), None, 0);
    place(&mut d, "low-2", "s2", 20);
    d.spoke_heartbeat("s1", vec![("cpu".into(), 8000, 4000)], &[], 30);
    d.spoke_heartbeat("s2", vec![("cpu".into(), 8000, 4000)], &[], 30);
    d
}

#[test]
fn a_higher_priority_job_preempts_the_fewest_newest_victims_on_one_spoke() {
    let mut d = full_queue();
    let actions = d.upsert_job(managed("high", "cq", 4000, 5, 2), None, 40);
    // One victim frees the quota, and either spoke holds the gang: the
    // newest victim (low-2, on s2) goes.
    assert!(actions.contains(&Action::Stop {
        spoke: "s2".into(),
        run_id: "uid-low-2".into(),
        generation: 1,
        reason: "preempted"
    }));
    assert!(actions.iter().any(|a| matches!(a,
        Action::Evicted { job, reason, preemption: Some(p), message, .. }
            if job.name == "low-2" && *reason == kueue::PREEMPTED
                && p.reason == kueue::IN_CLUSTER_QUEUE && p.preemptor == key("high")
                && message.contains("JobUID: uid-high) due to prioritization in the ClusterQueue")
                && !message.contains("team/high"))));
    assert!(actions.contains(&Action::Commit {
        job: key("low-2"),
        placement: Placement {
            spoke: None,
            generation: 2
        }
    }));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Stop { run_id, .. } if run_id == "uid-low-1"))
    );
    // The preemptor is offered only the spoke its victim frees, at once.
    assert_eq!(
        offered(&actions),
        BTreeSet::from([("high".to_string(), "s2".to_string())])
    );
    assert_eq!(
        d.quotas()
            .reservation(&key("high"))
            .unwrap()
            .pin
            .as_ref()
            .unwrap()
            .0,
        "s2"
    );
    // The victim waits for quota.
    assert!(d.waiting(&key("low-2")).is_some());
    // The spoke refuses while the victim stops: the preemptor keeps its
    // quota and is offered again once the room shows.
    d.admit_answer("s2", "uid-high", 1, false, 50);
    assert!(d.quotas().is_reserved(&key("high")));
    let actions = d.spoke_heartbeat("s2", vec![("cpu".into(), 8000, 8000)], &[], 60);
    assert_eq!(
        offered(&actions),
        BTreeSet::from([("high".to_string(), "s2".to_string())])
    );
    place(&mut d, "high", "s2", 70);
    assert_eq!(d.cluster_queue_status("cq").unwrap().admitted_workloads, 2);
}

#[test]
fn equal_priority_is_not_preempted_and_a_gang_too_big_for_any_spoke_preempts_nothing() {
    let mut d = full_queue();
    let actions = d.upsert_job(managed("peer", "cq", 4000, 0, 5), None, 40);
    assert!(!actions.iter().any(|a| matches!(a, Action::Stop { .. })));
    // 8 cpus of quota need both victims, which run on different spokes:
    // nothing is preempted.
    let actions = d.upsert_job(managed("huge", "cq", 8000, 9, 6), None, 41);
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Stop { .. })),
        "{actions:?}"
    );
}

#[test]
fn a_preemptor_whose_spoke_never_takes_it_gives_up_the_spoke_and_then_its_quota() {
    let mut d = full_queue();
    let actions = d.upsert_job(managed("high", "cq", 4000, 5, 7), None, 40);
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Stop { spoke, .. } if spoke == "s2"))
    );
    // s2 refuses, and reports no room (something else took it).
    d.admit_answer("s2", "uid-high", 1, false, 41);
    d.spoke_heartbeat("s2", vec![("cpu".into(), 8000, 0)], &[], 42);
    d.spoke_heartbeat("s1", vec![("cpu".into(), 8000, 0)], &[], 42);
    // Its refusal expires: it is offered its spoke again (whatever the room
    // reported), and keeps its quota when refused again.
    let actions = d.tick(1000);
    assert_eq!(
        offered(&actions),
        BTreeSet::from([("high".to_string(), "s2".to_string())])
    );
    d.admit_answer("s2", "uid-high", 1, false, 1001);
    assert!(d.quotas().reservation(&key("high")).unwrap().pin.is_some());
    // After the offer timeout the pin goes, and with no spoke to offer it
    // to, the quota too.
    d.tick(40 + 2000);
    assert!(!d.quotas().is_reserved(&key("high")));
    assert!(
        waiting_message(&d, "high").contains("admitted it yet"),
        "{}",
        waiting_message(&d, "high")
    );
}

#[test]
fn a_queue_reclaims_what_it_lent_from_a_borrowing_neighbour() {
    let mut d = dispatcher();
    let mut a = cq("a", Some("pool"), &[("f", 4000)]);
    a.preemption.reclaim_within_cohort = ReclaimWithinCohort::Any;
    let b = cq("b", Some("pool"), &[("f", 4000)]);
    d.set_quota_config(config(vec![flavor("f", None)], vec![a, b]), 0);
    d.spoke_connected("s1", json!({}), vec![("cpu".into(), 8000, 8000)], &[], 0);
    d.spoke_connected("s2", json!({}), vec![("cpu".into(), 8000, 8000)], &[], 0);
    // b borrows a's whole quota: 8 cpus in two jobs.
    for (i, spoke) in ["s1", "s2"].iter().enumerate() {
        let name = format!("b-{i}");
        d.upsert_job(managed(&name, "b", 4000, 9, i as i64), None, 0);
        place(&mut d, &name, spoke, i as u64);
    }
    let status = d.cluster_queue_status("b").unwrap();
    assert_eq!(status.flavors_reservation[0].resources[0].borrowed, 4000);
    d.spoke_heartbeat("s1", vec![("cpu".into(), 8000, 4000)], &[], 5);
    d.spoke_heartbeat("s2", vec![("cpu".into(), 8000, 4000)], &[], 5);
    // a wants its quota back (reclaim ignores b's higher priority).
    let actions = d.upsert_job(managed("a-0", "a", 4000, 0, 10), None, 10);
    let evicted: Vec<(&str, &str)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Evicted {
                job,
                preemption: Some(p),
                ..
            } => Some((job.name.as_str(), p.reason)),
            _ => None,
        })
        .collect();
    assert_eq!(evicted, [("b-1", kueue::IN_COHORT_RECLAMATION)]);
    assert_eq!(
        d.cluster_queue_status("b").unwrap().flavors_reservation[0].resources[0].borrowed,
        0
    );
}

#[test]
fn a_placement_loaded_at_start_up_is_charged_to_the_flavor_its_spoke_provides() {
    let mut d = dispatcher();
    d.set_quota_config(
        config(
            vec![flavor("od", Some("od")), flavor("spot", Some("spot"))],
            vec![cq("cq", None, &[("od", 4000), ("spot", 4000)])],
        ),
        0,
    );
    d.spoke_connected(
        "spot-1",
        json!({"pool": "spot"}),
        vec![("cpu".into(), 8000, 4000)],
        &[],
        0,
    );
    let placement = Placement {
        spoke: Some("spot-1".into()),
        generation: 3,
    };
    d.upsert_job(managed("running", "cq", 3000, 0, 0), Some(placement), 0);
    let r = d.quotas().reservation(&key("running")).unwrap();
    assert_eq!(r.assignment.flavors["cpu"], "spot");
    assert_eq!(r.admitted.as_ref().unwrap().0, "spot-1");
    assert_eq!(d.quotas().available("cq", "spot", "cpu"), Some(1000));
    // Deleting it gives the quota back.
    let mut info = managed("running", "cq", 3000, 0, 0);
    info.want = Want::Delete;
    d.upsert_job(info, None, 1);
    assert_eq!(d.quotas().available("cq", "spot", "cpu"), Some(4000));
}

// ---- property tests -------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Submit {
        queue: usize,
        cpu: i64,
        priority: i32,
    },
    /// The `n`-th spoke answers the oldest pending offer made to it.
    Answer {
        spoke: usize,
        admit: bool,
    },
    /// The `n`-th job (in submission order) finishes.
    Finish(usize),
    /// The `n`-th job is deleted.
    Delete(usize),
    /// A spoke reports its capacity (all free: runs come and go).
    Heartbeat(usize),
    Tick(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..3, 1i64..6, 0i32..3).prop_map(|(queue, cpu, priority)| Step::Submit {
            queue,
            cpu: cpu * 1000,
            priority
        }),
        5 => (0usize..3, prop::bool::weighted(0.8)).prop_map(|(spoke, admit)| Step::Answer { spoke, admit }),
        2 => (0usize..40).prop_map(Step::Finish),
        1 => (0usize..40).prop_map(Step::Delete),
        1 => (0usize..3).prop_map(Step::Heartbeat),
        1 => (100u64..3000).prop_map(Step::Tick),
    ]
}

/// Three ClusterQueues: `q0` and `q1` in a cohort (q0 may borrow at most 2,
/// and preempt while borrowing up to priority 2; q1 lends at most 3), `q2`
/// alone; two flavors of 6 cpus each, on spokes labelled by pool; every
/// preemption policy on.
fn random_world() -> Dispatcher {
    let mut d = dispatcher();
    let mut queues = Vec::new();
    for (i, cohort) in [Some("c"), Some("c"), None].into_iter().enumerate() {
        let mut q = cq(&format!("q{i}"), cohort, &[("x", 6000), ("y", 6000)]);
        for f in &mut q.resource_groups[0].flavors {
            let quota = f.quotas.get_mut("cpu").unwrap();
            if i == 0 {
                quota.borrowing_limit = Some(2000);
            }
            if i == 1 {
                quota.lending_limit = Some(3000);
            }
        }
        q.preemption.within_cluster_queue = WithinClusterQueue::LowerOrNewerEqualPriority;
        q.preemption.reclaim_within_cohort = ReclaimWithinCohort::LowerPriority;
        if i == 0 {
            q.preemption.borrow_within_cohort = BorrowWithinCohort {
                lower_priority: true,
                max_priority_threshold: Some(2),
            };
        }
        queues.push(q);
    }
    d.set_quota_config(
        config(vec![flavor("x", Some("x")), flavor("y", Some("y"))], queues),
        0,
    );
    for (i, pool) in ["x", "x", "y"].iter().enumerate() {
        d.spoke_connected(
            &format!("s{i}"),
            json!({"pool": pool}),
            vec![("cpu".into(), 8000, 8000)],
            &[],
            0,
        );
    }
    d
}

/// Every ClusterQueue and flavor within its nominal quota plus what it may
/// borrow, and nothing available below zero.
fn check_quota(d: &Dispatcher) -> Result<(), TestCaseError> {
    for q in ["q0", "q1", "q2"] {
        for f in ["x", "y"] {
            let (usage, limit) = d.quotas().usage_and_limit(q, f, "cpu").unwrap();
            if let Some(limit) = limit {
                prop_assert!(usage <= limit, "{q}/{f}: {usage} > {limit}");
            }
            let available = d.quotas().available(q, f, "cpu").unwrap();
            prop_assert!(available >= 0, "{q}/{f}: {available} available");
        }
    }
    // Quota is held exactly by the jobs that hold a claim on a spoke.
    for (k, job) in &d.jobs {
        let reserved = d.quotas().is_reserved(k);
        let holds = match &job.phase {
            Phase::Queued { offers, .. } => {
                offers
                    .values()
                    .any(|s| matches!(s, OfferState::Pending { .. }))
                    || d.quotas().reservation(k).is_some_and(|r| r.pin.is_some())
            }
            Phase::Committing { .. } => job.info.want == Want::Run,
            Phase::Placed { .. } => job.info.want == Want::Run,
            Phase::Idle | Phase::Deleting { .. } => false,
        };
        prop_assert_eq!(reserved, holds, "{} in {:?}", k, job.phase);
    }
    Ok(())
}

#[test]
fn quota_holds_and_no_job_runs_twice_under_any_sequence_of_events() {
    let cfg = crate::dispatch::quota::proptest_config(64);
    proptest!(cfg, |(steps in prop::collection::vec(step(), 1..60))| {
        let mut d = random_world();
        let mut now: Millis = 0;
        let mut submitted: Vec<JobKey> = Vec::new();
        // run_id → (spoke, generation) started and not stopped.
        let mut running: HashMap<String, (String, i64)> = HashMap::new();
        let mut pending: Vec<(String, String, i64)> = Vec::new();
        let carry = |actions: Vec<Action>,
                         running: &mut HashMap<String, (String, i64)>,
                         pending: &mut Vec<(String, String, i64)>|
         -> Result<(), TestCaseError> {
            for a in actions {
                match a {
                    Action::Offer { spoke, run_id, generation, .. } => {
                        pending.push((spoke, run_id, generation));
                    }
                    Action::Withdraw { spoke, run_id, generation } => {
                        pending.retain(|p| *p != (spoke.clone(), run_id.clone(), generation));
                    }
                    Action::Start { spoke, run_id, generation, .. } => {
                        if let Some((other, g)) = running.get(&run_id) {
                            prop_assert!(
                                *other == spoke && *g == generation,
                                "{run_id} started on {spoke} while running on {other}"
                            );
                        }
                        running.insert(run_id, (spoke, generation));
                    }
                    Action::Stop { spoke, run_id, generation, .. }
                        if running
                            .get(&run_id)
                            .is_some_and(|(s, g)| *s == spoke && *g <= generation) =>
                    {
                        running.remove(&run_id);
                    }
                    _ => {}
                }
            }
            Ok(())
        };
        for step in steps {
            now += 10;
            let actions = match step {
                Step::Submit { queue, cpu, priority } => {
                    let name = format!("j{}", submitted.len());
                    submitted.push(key(&name));
                    d.upsert_job(
                        managed(&name, &format!("q{queue}"), cpu, priority, now as i64),
                        None,
                        now,
                    )
                }
                Step::Answer { spoke, admit } => {
                    let spoke = format!("s{spoke}");
                    match pending.iter().position(|(s, _, _)| *s == spoke) {
                        Some(i) => {
                            let (spoke, run_id, generation) = pending.remove(i);
                            let mut actions = d.admit_answer(&spoke, &run_id, generation, admit, now);
                            let commits: Vec<(JobKey, Placement)> = actions
                                .iter()
                                .filter_map(|a| match a {
                                    Action::Commit { job, placement } if placement.spoke.is_some() => {
                                        Some((job.clone(), placement.clone()))
                                    }
                                    _ => None,
                                })
                                .collect();
                            for (job, placement) in commits {
                                actions.extend(d.committed(&job, &placement, true, now));
                            }
                            actions
                        }
                        None => Vec::new(),
                    }
                }
                Step::Finish(n) | Step::Delete(n) => match submitted.get(n) {
                    Some(k) if d.jobs.contains_key(k) => {
                        let mut info = d.jobs[k].info.clone();
                        info.want = if matches!(step, Step::Finish(_)) { Want::Finished } else { Want::Delete };
                        d.upsert_job(info, None, now)
                    }
                    _ => Vec::new(),
                },
                Step::Heartbeat(n) => {
                    d.spoke_heartbeat(&format!("s{n}"), vec![("cpu".into(), 8000, 8000)], &[], now)
                }
                Step::Tick(dt) => {
                    now += dt;
                    d.tick(now)
                }
            };
            carry(actions, &mut running, &mut pending)?;
            check_quota(&d)?;
        }
        // Everything finishes: every charge is given back.
        for k in &submitted {
            if let Some(job) = d.jobs.get(k) {
                let mut info = job.info.clone();
                info.want = Want::Finished;
                let actions = d.upsert_job(info, None, now);
                carry(actions, &mut running, &mut pending)?;
            }
        }
        prop_assert!(d.quotas().reservations().next().is_none());
        let fresh = random_world();
        for q in ["q0", "q1", "q2"] {
            for f in ["x", "y"] {
                prop_assert_eq!(d.quotas().usage_and_limit(q, f, "cpu").unwrap().0, 0);
                prop_assert_eq!(
                    d.quotas().available(q, f, "cpu"),
                    fresh.quotas().available(q, f, "cpu")
                );
            }
        }
    });
}

/// The pure dispatcher's share of the dispatch bench with quotas on: 10
/// ClusterQueues in 2 cohorts, 50 spokes in 2 flavors, 10,000 TrainJobs;
/// every spoke admits its first offer and every run completes at once.
/// `cargo test -p trainhub --release --lib saturation -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a check"]
fn saturation_with_quotas_on() {
    let mut d = dispatcher();
    let flavors = vec![flavor("x", Some("x")), flavor("y", Some("y"))];
    let queues: Vec<ClusterQueue> = (0..10)
        .map(|i| {
            let mut q = cq(
                &format!("q{i}"),
                Some(if i < 5 { "c0" } else { "c1" }),
                &[("x", 40_000), ("y", 40_000)],
            );
            q.preemption.within_cluster_queue = WithinClusterQueue::LowerPriority;
            q
        })
        .collect();
    d.set_quota_config(config(flavors, queues), 0);
    for s in 0..50 {
        let pool = if s % 2 == 0 { "x" } else { "y" };
        d.spoke_connected(
            &format!("s{s}"),
            json!({"pool": pool}),
            vec![("cpu".into(), 64_000, 64_000)],
            &[],
            0,
        );
    }
    let jobs: i32 = 10_000;
    let started = std::time::Instant::now();
    let mut pending: Vec<Action> = Vec::new();
    for j in 0..jobs {
        let name = format!("j{j}");
        let info = managed(&name, &format!("q{}", j % 10), 2000, j % 3, i64::from(j));
        pending.extend(d.upsert_job(info, None, 1));
    }
    let mut done = 0;
    let mut admitted: BTreeSet<String> = BTreeSet::new();
    while let Some(action) = pending.pop() {
        match action {
            Action::Offer {
                spoke,
                job,
                run_id,
                generation,
                ..
            } if admitted.insert(run_id.clone()) => {
                let actions = d.admit_answer(&spoke, &run_id, generation, true, 2);
                for a in &actions {
                    if let Action::Commit { placement, .. } = a
                        && placement.spoke.is_some()
                    {
                        pending.extend(d.committed(&job, placement, true, 2));
                    }
                }
                pending.extend(actions);
            }
            Action::Start { job, .. } => {
                done += 1;
                let mut info = d.jobs[&job].info.clone();
                info.want = Want::Finished;
                pending.extend(d.upsert_job(info, None, 3));
            }
            _ => {}
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{done} of {jobs} TrainJobs admitted by quota, placed and finished in {elapsed:?}: {:.0}/s",
        f64::from(done) / elapsed.as_secs_f64()
    );
    assert_eq!(done, jobs);
}

/// The publisher asks for every queue's status at once: one pass gives
/// each LocalQueue (told apart by namespace and name) and each
/// ClusterQueue, an empty one included, what asking for it alone gives.
#[test]
fn every_queues_status_at_once_matches_each_asked_alone() {
    let mut d = dispatcher();
    d.set_quota_config(
        config(
            vec![flavor("f", None)],
            vec![
                cq("cq", None, &[("f", 4000)]),
                cq("idle", None, &[("f", 1000)]),
            ],
        ),
        0,
    );
    connect(&mut d, "s1", "a", 16_000);
    // lq in team: a and b reserve, c waits; lq in other: d waits behind them.
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        d.upsert_job(managed(name, "cq", 2000, 0, i as i64), None, 0);
    }
    let mut other = managed("d", "cq", 1000, 0, 3);
    other.key.namespace = "other".into();
    other.uid = "uid-other-d".into();
    d.upsert_job(other, None, 0);
    place(&mut d, "a", "s1", 1);

    let all = d.local_queue_statuses();
    assert_eq!(all.len(), 2, "{all:?}");
    for (namespace, counts) in [("team", (1, 2, 1)), ("other", (1, 0, 0))] {
        let alone = d.local_queue_status(namespace, "lq");
        assert_eq!(all[&(namespace.to_string(), "lq".to_string())], alone);
        assert_eq!(
            (
                alone.pending_workloads,
                alone.reserving_workloads,
                alone.admitted_workloads
            ),
            counts,
            "{namespace}"
        );
    }
    assert_eq!(
        d.local_queue_status("team", "nobody"),
        LocalQueueStatus::default()
    );

    let cqs = d.cluster_queue_statuses();
    assert_eq!(
        cqs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["cq", "idle"]
    );
    for (name, status) in &cqs {
        assert_eq!(d.cluster_queue_status(name).as_ref(), Some(status));
    }
    let busy = &cqs[0].1;
    assert_eq!(
        (
            busy.pending_workloads,
            busy.reserving_workloads,
            busy.admitted_workloads
        ),
        (2, 2, 1)
    );
    assert_eq!(
        (
            cqs[1].1.pending_workloads,
            cqs[1].1.reserving_workloads,
            cqs[1].1.admitted_workloads
        ),
        (0, 0, 0)
    );
    assert_eq!(d.cluster_queue_status("missing"), None);
}
