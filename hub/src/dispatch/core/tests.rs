use super::*;
use serde_json::json;
use trainhub_apiserver::selector::LabelSelector;

fn key(name: &str) -> JobKey {
    JobKey {
        namespace: "default".into(),
        name: name.into(),
    }
}

fn job(name: &str, cpu: i64, nodes: u32) -> JobInfo {
    JobInfo {
        key: key(name),
        uid: format!("uid-{name}"),
        priority: 0,
        created: 0,
        selector: None,
        pod_sets: vec![PodSetDemand {
            name: "node".into(),
            count: nodes,
            requests_milli: [("cpu".to_string(), cpu)].into(),
        }]
        .into(),
        want: Want::Run,
        queue: None,
    }
}

fn cpu(alloc: i64, free: i64) -> Vec<(String, i64, i64)> {
    vec![("cpu".into(), alloc, free)]
}

fn offers(actions: &[Action]) -> Vec<(String, String, i64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Offer {
                spoke,
                job,
                generation,
                ..
            } => Some((spoke.clone(), job.name.clone(), *generation)),
            _ => None,
        })
        .collect()
}

fn events(actions: &[Action]) -> Vec<&'static str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

fn released(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Release { job, .. } => Some(job.name.clone()),
            _ => None,
        })
        .collect()
}

fn withdrawals(actions: &[Action]) -> Vec<(String, String, i64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Withdraw {
                spoke,
                run_id,
                generation,
            } => Some((spoke.clone(), run_id.clone(), *generation)),
            _ => None,
        })
        .collect()
}

fn deleting(name: &str) -> JobInfo {
    let mut j = job(name, 1000, 1);
    j.want = Want::Delete;
    j
}

fn dispatcher(mode: Mode) -> Dispatcher {
    Dispatcher::new(Config {
        mode,
        worker_lost_timeout_ms: 1000,
        retry_ms: 500,
        fanout: 0,
        offer_timeout_ms: 2000,
        deletion_timeout_ms: 3000,
    })
}

fn connect(d: &mut Dispatcher, name: &str, labels: Value, free: i64) -> Vec<Action> {
    d.spoke_connected(name, labels, cpu(8000, free), &[], 0)
}

fn place(d: &mut Dispatcher, name: &str, spoke: &str) -> Vec<Action> {
    let uid = format!("uid-{name}");
    let generation = d.jobs[&key(name)].generation;
    let actions = d.admit_answer(spoke, &uid, generation, true, 0);
    let placement = Placement {
        spoke: Some(spoke.into()),
        generation,
    };
    assert!(actions.contains(&Action::Commit {
        job: key(name),
        placement: placement.clone()
    }));
    let mut all = actions;
    all.extend(d.committed(&key(name), &placement, true, 0));
    all
}

#[test]
fn after_a_hub_restart_a_placement_on_a_spoke_that_never_returns_is_requeued() {
    let mut d = dispatcher(Mode::AllAtOnce);
    let placed = Placement {
        spoke: Some("gone".into()),
        generation: 2,
    };
    // Loaded at 100: the timer runs from the load.
    assert!(
        d.upsert_job(job("j", 1000, 1), Some(placed), 100)
            .is_empty()
    );
    connect(&mut d, "b", json!({}), 8000);
    assert_eq!(d.connected_spokes(), 1, "the absent spoke is not counted");
    assert!(d.tick(1000).is_empty(), "not lost yet");
    assert_eq!(d.placement(&key("j")), Some(("gone", 2)));
    let actions = d.tick(1100);
    assert!(actions.contains(&Action::Commit {
        job: key("j"),
        placement: Placement {
            spoke: None,
            generation: 3
        }
    }));
    assert_eq!(events(&actions), vec![reason::SPOKE_LOST]);
    assert_eq!(offers(&actions), vec![("b".into(), "j".into(), 3)]);
}

#[test]
fn after_a_hub_restart_a_spoke_that_returns_in_time_keeps_its_placement() {
    let mut d = dispatcher(Mode::AllAtOnce);
    let placed = Placement {
        spoke: Some("a".into()),
        generation: 1,
    };
    d.upsert_job(job("j", 1000, 1), Some(placed), 0);
    assert!(
        d.spoke_connected("a", json!({}), cpu(8000, 7000), &[("uid-j".into(), 1)], 500)
            .is_empty()
    );
    assert!(d.tick(5000).is_empty(), "connected: never lost");
    assert_eq!(d.placement(&key("j")), Some(("a", 1)));
}

#[test]
fn an_unanswered_offer_expires_is_withdrawn_and_offered_again() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    d.spoke_connected("b", json!({}), cpu(8000, 8000), &[], 1000);
    // Neither answers.
    assert!(withdrawals(&d.tick(1999)).is_empty());
    let actions = d.tick(2000);
    assert_eq!(withdrawals(&actions), vec![("a".into(), "uid-j".into(), 1)]);
    assert_eq!(events(&actions), vec![reason::OFFER_EXPIRED]);
    // Counted as a refusal: offered to a again after the retry time.
    assert!(offers(&actions).is_empty());
    let actions = d.tick(2500);
    assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 1)]);
    assert!(withdrawals(&actions).is_empty());
    assert_eq!(
        withdrawals(&d.tick(3000)),
        vec![("b".into(), "uid-j".into(), 1)]
    );
    // b admits after its offer expired: it cannot win, it is withdrawn.
    assert_eq!(
        d.admit_answer("b", "uid-j", 1, true, 3050),
        vec![Action::Withdraw {
            spoke: "b".into(),
            run_id: "uid-j".into(),
            generation: 1
        }]
    );
    // A timely answer wins as usual.
    let actions = d.admit_answer("a", "uid-j", 1, true, 3100);
    assert!(actions.iter().any(|a| matches!(a, Action::Commit { .. })));
}

#[test]
fn a_reservation_the_hub_no_longer_offers_is_withdrawn_again() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    connect(&mut d, "b", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "b");
    // a admitted late; its Withdraw was lost: it still lists it.
    let actions = d.spoke_heartbeat(
        "a",
        cpu(8000, 7000),
        &[("uid-j".into(), 1), ("uid-gone".into(), 4)],
        10,
    );
    assert_eq!(
        withdrawals(&actions),
        vec![
            ("a".into(), "uid-j".into(), 1),
            ("a".into(), "uid-gone".into(), 4)
        ]
    );
    // The winner's own reservation (its Start in flight) is left alone.
    assert!(
        d.spoke_heartbeat("b", cpu(8000, 7000), &[("uid-j".into(), 1)], 20)
            .is_empty()
    );
    // An older generation is withdrawn.
    assert_eq!(
        withdrawals(&d.spoke_heartbeat("b", cpu(8000, 7000), &[("uid-j".into(), 0)], 30)),
        vec![("b".into(), "uid-j".into(), 0)]
    );
}

#[test]
fn a_reservation_of_a_pending_offer_is_the_admission_the_hub_never_heard() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    let actions = d.spoke_heartbeat("a", cpu(8000, 7000), &[("uid-j".into(), 1)], 10);
    assert_eq!(
        actions,
        vec![Action::Commit {
            job: key("j"),
            placement: Placement {
                spoke: Some("a".into()),
                generation: 1
            }
        }]
    );
    // The answer arriving after all changes nothing.
    assert!(d.admit_answer("a", "uid-j", 1, true, 11).is_empty());
}

#[test]
fn a_placement_whose_start_was_lost_is_started_again() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    let start = Action::Start {
        spoke: "a".into(),
        job: key("j"),
        run_id: "uid-j".into(),
        generation: 1,
    };
    // Within the retry time the Start may still be on its way.
    assert!(
        d.spoke_heartbeat("a", cpu(8000, 7000), &[("uid-j".into(), 1)], 100)
            .is_empty()
    );
    assert_eq!(
        d.spoke_heartbeat("a", cpu(8000, 7000), &[("uid-j".into(), 1)], 500),
        vec![start.clone()]
    );
    assert!(
        d.spoke_heartbeat("a", cpu(8000, 7000), &[("uid-j".into(), 1)], 600)
            .is_empty(),
        "once per retry time"
    );
}

#[test]
fn an_admission_the_spoke_no_longer_holds_is_forgotten_and_the_job_nominated_again() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    d.admit_answer("a", "uid-j", 1, true, 10);
    // The placement is being written; the spoke lists no reservation,
    // twice in a row.
    assert!(d.spoke_heartbeat("a", cpu(8000, 8000), &[], 15).is_empty());
    let actions = d.spoke_heartbeat("a", cpu(8000, 8000), &[], 20);
    assert!(actions.contains(&Action::Commit {
        job: key("j"),
        placement: Placement {
            spoke: None,
            generation: 2
        }
    }));
    assert_eq!(events(&actions), vec![reason::ADMISSION_LOST]);
    assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 2)]);
    // The write of the old placement lands: nothing starts.
    let old = Placement {
        spoke: Some("a".into()),
        generation: 1,
    };
    assert!(d.committed(&key("j"), &old, true, 30).is_empty());
    assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
}

#[test]
fn a_deleted_trainjob_never_placed_is_released_at_once() {
    let mut d = dispatcher(Mode::AllAtOnce);
    assert!(d.upsert_job(job("idle", 1000, 1), None, 0).is_empty());
    assert_eq!(released(&d.upsert_job(deleting("idle"), None, 1)), ["idle"]);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("q", 1000, 1), None, 0);
    let actions = d.upsert_job(deleting("q"), None, 1);
    assert_eq!(withdrawals(&actions), vec![("a".into(), "uid-q".into(), 1)]);
    assert_eq!(released(&actions), ["q"]);
    assert!(offers(&d.tick(10)).is_empty(), "never offered again");
}

#[test]
fn a_deleted_trainjob_is_released_when_its_spoke_confirms_the_stop() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    let actions = d.upsert_job(deleting("j"), None, 10);
    assert!(actions.contains(&Action::Stop {
        spoke: "a".into(),
        run_id: "uid-j".into(),
        generation: 1,
        reason: "deleted"
    }));
    assert!(released(&actions).is_empty(), "waits for the spoke");
    assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
    assert!(d.run_stopped("b", "uid-j", 1).is_empty(), "another spoke");
    assert!(d.run_stopped("a", "uid-j", 0).is_empty(), "an older run");
    assert_eq!(released(&d.run_stopped("a", "uid-j", 1)), ["j"]);
    assert!(released(&d.tick(100_000)).is_empty(), "released once");
}

#[test]
fn a_deleted_trainjob_is_released_when_its_spoke_returns_without_the_run() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    d.spoke_disconnected("a", 5);
    d.upsert_job(deleting("j"), None, 10);
    // Back still holding it: stopped again, still waiting.
    let actions = d.spoke_connected("a", json!({}), cpu(8000, 7000), &[("uid-j".into(), 1)], 20);
    assert!(released(&actions).is_empty());
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Stop { generation: 1, .. }))
    );
    d.spoke_disconnected("a", 30);
    let actions = d.spoke_connected("a", json!({}), cpu(8000, 8000), &[], 40);
    assert_eq!(released(&actions), ["j"]);
}

#[test]
fn a_finished_trainjob_is_released_and_its_deletion_waits_for_nothing() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    let mut finished = job("j", 1000, 1);
    finished.want = Want::Finished;
    assert_eq!(released(&d.upsert_job(finished.clone(), None, 10)), ["j"]);
    assert!(
        released(&d.upsert_job(finished, None, 11)).is_empty(),
        "once"
    );
    let actions = d.upsert_job(deleting("j"), None, 20);
    assert_eq!(released(&actions), ["j"]);
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Stop {
            reason: "deleted",
            ..
        }
    )));
}

#[test]
fn a_deleted_trainjob_is_released_when_its_spoke_is_lost_or_after_the_bound() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    connect(&mut d, "b", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    d.upsert_job(job("k", 1000, 1), None, 0);
    place(&mut d, "k", "b");
    d.spoke_disconnected("a", 100);
    d.upsert_job(deleting("j"), None, 100);
    d.upsert_job(deleting("k"), None, 100);
    // a is lost at 1100: j is released; k's spoke never answers.
    assert_eq!(released(&d.tick(1100)), ["j"]);
    assert!(released(&d.tick(3099)).is_empty());
    assert_eq!(released(&d.tick(3100)), ["k"]);
}

#[test]
fn a_limited_fanout_offers_the_roomiest_spokes_and_replaces_a_refusal() {
    let mut d = Dispatcher::new(Config {
        fanout: 2,
        ..Config::default()
    });
    connect(&mut d, "a", json!({}), 3000);
    connect(&mut d, "b", json!({}), 8000);
    connect(&mut d, "c", json!({}), 6000);
    connect(&mut d, "d", json!({}), 2000);
    let actions = d.upsert_job(job("j", 1000, 2), None, 0);
    assert_eq!(
        offers(&actions),
        vec![("b".into(), "j".into(), 1), ("c".into(), "j".into(), 1)]
    );
    // b refuses: the next roomiest spoke takes its place.
    let actions = d.admit_answer("b", "uid-j", 1, false, 1);
    assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 1)]);
    // The winner's rivals are withdrawn, the refusal included.
    let actions = d.admit_answer("a", "uid-j", 1, true, 2);
    let withdrawn: BTreeSet<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Withdraw { spoke, .. } => Some(spoke.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(withdrawn, BTreeSet::from(["b", "c"]));
}

#[test]
fn spokes_with_equal_room_take_turns_under_a_limited_fanout() {
    let mut d = Dispatcher::new(Config {
        fanout: 1,
        ..Config::default()
    });
    for s in ["a", "b", "c"] {
        connect(&mut d, s, json!({}), 8000);
    }
    let first: Vec<String> = (0..6)
        .map(|i| {
            let actions = d.upsert_job(job(&format!("j{i}"), 1000, 1), None, 0);
            let offered = offers(&actions);
            assert_eq!(offered.len(), 1, "{offered:?}");
            offered[0].0.clone()
        })
        .collect();
    for s in ["a", "b", "c"] {
        assert_eq!(first.iter().filter(|f| *f == s).count(), 2, "{first:?}");
    }
}

#[test]
fn all_at_once_offers_every_eligible_spoke_and_the_first_admission_wins() {
    let mut d = dispatcher(Mode::AllAtOnce);
    for s in ["a", "b", "c"] {
        connect(&mut d, s, json!({}), 8000);
    }
    connect(&mut d, "small", json!({}), 1000);
    let actions = d.upsert_job(job("j", 2000, 2), None, 0);
    assert_eq!(
        offers(&actions),
        vec![
            ("a".into(), "j".into(), 1),
            ("b".into(), "j".into(), 1),
            ("c".into(), "j".into(), 1)
        ]
    );
    // b admits first: committed before anyone is told, others withdrawn.
    let actions = d.admit_answer("b", "uid-j", 1, true, 1);
    assert_eq!(
        actions,
        vec![
            Action::Withdraw {
                spoke: "a".into(),
                run_id: "uid-j".into(),
                generation: 1
            },
            Action::Withdraw {
                spoke: "c".into(),
                run_id: "uid-j".into(),
                generation: 1
            },
            Action::Commit {
                job: key("j"),
                placement: Placement {
                    spoke: Some("b".into()),
                    generation: 1
                }
            },
        ]
    );
    assert_eq!(d.placement(&key("j")), Some(("b", 1)));
    // a admits too late: withdrawn.
    assert_eq!(
        d.admit_answer("a", "uid-j", 1, true, 2),
        vec![Action::Withdraw {
            spoke: "a".into(),
            run_id: "uid-j".into(),
            generation: 1
        }]
    );
    let placement = Placement {
        spoke: Some("b".into()),
        generation: 1,
    };
    assert_eq!(
        d.committed(&key("j"), &placement, true, 3),
        vec![Action::Start {
            spoke: "b".into(),
            job: key("j"),
            run_id: "uid-j".into(),
            generation: 1
        }]
    );
    assert_eq!(d.queue_depth(), 0);
    // Duplicate commit acknowledgement: nothing more.
    assert!(d.committed(&key("j"), &placement, true, 4).is_empty());
}

#[test]
fn incremental_widens_by_step_each_round() {
    let mut d = dispatcher(Mode::Incremental {
        step: 2,
        round_ms: 100,
    });
    for s in ["a", "b", "c", "d", "e"] {
        connect(&mut d, s, json!({}), 8000);
    }
    let first = offers(&d.upsert_job(job("j", 1000, 1), None, 0));
    assert_eq!(first.len(), 2);
    assert!(offers(&d.tick(50)).is_empty(), "round not over");
    let second = offers(&d.tick(100));
    assert_eq!(
        second.iter().map(|o| o.0.as_str()).collect::<Vec<_>>(),
        ["c", "d"]
    );
}

#[test]
fn queue_order_is_priority_then_creation_time() {
    let mut d = dispatcher(Mode::AllAtOnce);
    let mut low = job("low", 1000, 1);
    low.created = 1;
    let mut old = job("old", 1000, 1);
    old.created = 2;
    old.priority = 5;
    let mut new = job("new", 1000, 1);
    new.created = 3;
    new.priority = 5;
    for j in [low, new, old] {
        assert!(d.upsert_job(j, None, 0).is_empty(), "no spoke yet");
    }
    let order: Vec<String> = offers(&connect(&mut d, "a", json!({}), 8000))
        .into_iter()
        .map(|o| o.1)
        .collect();
    assert_eq!(order, ["old", "new", "low"]);
}

#[test]
fn selector_and_capacity_decide_eligibility() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "east", json!({"region": "east"}), 8000);
    connect(&mut d, "west", json!({"region": "west"}), 8000);
    connect(&mut d, "west-small", json!({"region": "west"}), 1000);
    let mut j = job("j", 2000, 1);
    j.selector = Some(LabelSelector::parse("region=west").unwrap());
    assert_eq!(
        offers(&d.upsert_job(j, None, 0)),
        vec![("west".into(), "j".into(), 1)]
    );
    // A gang bigger than any spoke is never offered.
    assert!(offers(&d.upsert_job(job("huge", 5000, 2), None, 0)).is_empty());
}

#[test]
fn a_cordoned_spoke_gets_no_offers_until_uncordoned_and_keeps_its_runs() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    connect(&mut d, "b", json!({}), 8000);
    d.upsert_job(job("placed", 1000, 1), None, 0);
    place(&mut d, "placed", "a");
    assert!(d.set_unschedulable("a", true, 0).is_empty());
    assert_eq!(
        offers(&d.upsert_job(job("j", 1000, 1), None, 0)),
        vec![("b".into(), "j".into(), 1)]
    );
    // Nothing changed for the run already there.
    assert_eq!(d.placement(&key("placed")), Some(("a", 1)));
    assert_eq!(d.spoke_views()["a"].running, 1);
    // Still cordoned after a reconnect.
    d.spoke_disconnected("a", 5);
    d.spoke_connected("a", json!({}), cpu(8000, 7000), &[], 6);
    assert!(
        offers(&d.upsert_job(job("k", 1000, 1), None, 7))
            .iter()
            .all(|(s, ..)| s != "a")
    );
    // Uncordoned: the queued jobs are offered to it at once.
    let again = offers(&d.set_unschedulable("a", false, 8));
    assert!(again.iter().any(|(s, ..)| s == "a"), "{again:?}");
}

#[test]
fn a_refusal_is_retried_when_capacity_grows_or_after_retry_time() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    assert!(offers(&d.admit_answer("a", "uid-j", 1, false, 10)).is_empty());
    // Same free capacity: no new offer.
    assert!(offers(&d.spoke_heartbeat("a", cpu(8000, 8000), &[], 20)).is_empty());
    assert!(offers(&d.tick(100)).is_empty());
    // The retry time passed.
    assert_eq!(offers(&d.tick(600)).len(), 1);
    d.admit_answer("a", "uid-j", 1, false, 600);
    // Capacity grew.
    d.spoke_heartbeat("a", cpu(8000, 4000), &[], 610);
    assert_eq!(
        offers(&d.spoke_heartbeat("a", cpu(8000, 6000), &[], 620)).len(),
        1
    );
}

#[test]
fn a_lost_spoke_is_given_up_and_its_stale_run_stopped_when_it_returns() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    connect(&mut d, "b", json!({}), 8000);
    assert!(d.spoke_disconnected("a", 100).is_empty());
    // Not yet lost: the run stays placed on a.
    assert!(d.tick(500).is_empty());
    assert_eq!(d.placement(&key("j")), Some(("a", 1)));
    // Lost: requeued under generation 2 and offered to b.
    let actions = d.tick(1100);
    assert!(actions.contains(&Action::Commit {
        job: key("j"),
        placement: Placement {
            spoke: None,
            generation: 2
        }
    }));
    assert_eq!(offers(&actions), vec![("b".into(), "j".into(), 2)]);
    place(&mut d, "j", "b");
    // a returns still holding generation 1: stopped, and its reports refused.
    let actions = d.spoke_connected(
        "a",
        json!({}),
        cpu(8000, 7000),
        &[("uid-j".into(), 1)],
        1200,
    );
    assert_eq!(
        actions,
        vec![Action::Stop {
            spoke: "a".into(),
            run_id: "uid-j".into(),
            generation: 1,
            reason: "not placed on this spoke"
        }]
    );
    assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
    assert_eq!(d.check_run("b", "uid-j", 2), Verdict::Accept(key("j")));
    assert_eq!(d.check_run("a", "uid-j", 2), Verdict::Foreign);
}

#[test]
fn a_run_the_spoke_lost_is_requeued_at_once_and_an_older_one_changes_nothing() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    connect(&mut d, "b", json!({}), 8000);
    // Another spoke, or a generation that is not the placement's: nothing.
    assert!(d.run_lost("b", "uid-j", 1, LOST_FENCED, 10).is_empty());
    assert!(d.run_lost("a", "uid-j", 0, LOST_FENCED, 10).is_empty());
    assert!(d.run_lost("a", "uid-other", 1, LOST_FENCED, 10).is_empty());
    assert_eq!(d.placement(&key("j")), Some(("a", 1)));
    // The placement's run: requeued under generation 2 with the reason,
    // and offered again (a, which restarted, too), without waiting for
    // the worker-lost timeout.
    d.spoke_disconnected("a", 20);
    connect(&mut d, "a", json!({}), 8000);
    let actions = d.run_lost("a", "uid-j", 1, LOST_SPOKE_RESTARTED, 30);
    assert_eq!(
        actions[..2],
        [
            Action::Commit {
                job: key("j"),
                placement: Placement {
                    spoke: None,
                    generation: 2
                }
            },
            Action::Event {
                job: key("j"),
                uid: "uid-j".into(),
                warning: true,
                reason: reason::SPOKE_RESTARTED,
                message: "Requeued: spoke a restarted and killed the run's processes".into(),
            }
        ]
    );
    let mut offered = offers(&actions);
    offered.sort();
    assert_eq!(
        offered,
        vec![("a".into(), "j".into(), 2), ("b".into(), "j".into(), 2)]
    );
    // Said again (a second hello): the run is now stale, nothing more.
    assert!(
        d.run_lost("a", "uid-j", 1, LOST_SPOKE_RESTARTED, 40)
            .is_empty()
    );
    assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
    place(&mut d, "j", "b");
    assert!(d.run_lost("a", "uid-j", 1, LOST_FENCED, 50).is_empty());
    assert_eq!(d.placement(&key("j")), Some(("b", 2)));
}

#[test]
fn reconnect_within_the_timeout_keeps_the_run_and_restarts_a_lost_start() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    d.spoke_disconnected("a", 10);
    // Back in time, holding the run: nothing to do.
    assert!(
        d.spoke_connected("a", json!({}), cpu(8000, 7000), &[("uid-j".into(), 1)], 20)
            .is_empty()
    );
    // Back without it (the start was lost): started again.
    d.spoke_disconnected("a", 30);
    assert_eq!(
        d.spoke_connected("a", json!({}), cpu(8000, 8000), &[], 40),
        vec![Action::Start {
            spoke: "a".into(),
            job: key("j"),
            run_id: "uid-j".into(),
            generation: 1
        }]
    );
    assert!(d.tick(5000).is_empty(), "reconnected: never lost");
}

#[test]
fn after_a_hub_restart_the_committed_placement_is_kept() {
    let mut d = dispatcher(Mode::AllAtOnce);
    let placed = Placement {
        spoke: Some("a".into()),
        generation: 3,
    };
    assert!(d.upsert_job(job("j", 1000, 1), Some(placed), 0).is_empty());
    connect(&mut d, "b", json!({}), 8000);
    // Unplaced at generation 3 (requeued before the crash): offered as 4.
    let unplaced = Placement {
        spoke: None,
        generation: 3,
    };
    assert_eq!(
        offers(&d.upsert_job(job("k", 1000, 1), Some(unplaced), 0)),
        vec![("b".into(), "k".into(), 4)]
    );
    assert_eq!(d.placement(&key("j")), Some(("a", 3)));
}

#[test]
fn suspend_stops_the_run_and_resume_requeues_under_a_new_generation() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    let mut suspended = job("j", 1000, 1);
    suspended.want = Want::Suspend;
    let actions = d.upsert_job(suspended, None, 1);
    assert_eq!(
        actions,
        vec![
            Action::Stop {
                spoke: "a".into(),
                run_id: "uid-j".into(),
                generation: 1,
                reason: "suspended"
            },
            Action::Commit {
                job: key("j"),
                placement: Placement {
                    spoke: None,
                    generation: 1
                }
            },
            Action::Event {
                job: key("j"),
                uid: "uid-j".into(),
                warning: false,
                reason: reason::SUSPENDED,
                message: "Suspended: its run (placement 1) stopped on spoke a".into()
            }
        ]
    );
    let actions = d.upsert_job(job("j", 1000, 1), None, 2);
    assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 2)]);
    assert_eq!(events(&actions), vec![reason::RESUMED]);
}

#[test]
fn delete_cancels_the_run_and_forgets_the_placement() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    connect(&mut d, "b", json!({}), 8000);
    d.upsert_job(job("q", 1000, 1), None, 0);
    assert_eq!(
        d.remove_job(&key("q")),
        vec![
            Action::Withdraw {
                spoke: "a".into(),
                run_id: "uid-q".into(),
                generation: 1
            },
            Action::Withdraw {
                spoke: "b".into(),
                run_id: "uid-q".into(),
                generation: 1
            },
            Action::Forget { job: key("q") }
        ]
    );
    d.upsert_job(job("j", 1000, 1), None, 0);
    place(&mut d, "j", "a");
    assert_eq!(
        d.remove_job(&key("j")),
        vec![
            Action::Stop {
                spoke: "a".into(),
                run_id: "uid-j".into(),
                generation: 1,
                reason: "deleted"
            },
            Action::Forget { job: key("j") }
        ]
    );
    // Its spoke still reports it: stale, not foreign.
    assert_eq!(d.check_run("a", "uid-j", 1), Verdict::Stale);
}

#[test]
fn a_failed_commit_requeues_and_withdraws_the_winner() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    d.upsert_job(job("j", 1000, 1), None, 0);
    d.admit_answer("a", "uid-j", 1, true, 0);
    let placement = Placement {
        spoke: Some("a".into()),
        generation: 1,
    };
    let actions = d.committed(&key("j"), &placement, false, 1);
    assert_eq!(
        actions[0],
        Action::Withdraw {
            spoke: "a".into(),
            run_id: "uid-j".into(),
            generation: 1
        }
    );
    assert_eq!(offers(&actions), vec![("a".into(), "j".into(), 1)]);
}

#[test]
fn answers_for_unknown_or_old_generations_are_withdrawn() {
    let mut d = dispatcher(Mode::AllAtOnce);
    connect(&mut d, "a", json!({}), 8000);
    assert_eq!(
        d.admit_answer("a", "nope", 1, true, 0),
        vec![Action::Withdraw {
            spoke: "a".into(),
            run_id: "nope".into(),
            generation: 1
        }]
    );
    d.upsert_job(job("j", 1000, 1), None, 0);
    assert_eq!(
        d.admit_answer("a", "uid-j", 0, true, 0),
        vec![Action::Withdraw {
            spoke: "a".into(),
            run_id: "uid-j".into(),
            generation: 0
        }]
    );
    // A duplicate refusal changes nothing.
    assert!(d.admit_answer("a", "uid-j", 1, false, 0).is_empty());
    assert!(d.admit_answer("a", "uid-j", 1, false, 0).is_empty());
}
