//! The spoke protocol's message handling, as a property: whatever a spoke
//! sends (hellos, heartbeats, reports with arbitrary pods and events,
//! log chunks with arbitrary ids, answers to offers it never had), the
//! hub does not panic, the spoke touches nothing of another spoke's runs,
//! and what the hub keeps in memory stays bounded.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use trainhub::admission::TrainerAdmission;
use trainhub::api::{EVENTS, PODS, TRAINJOBS};
use trainhub::dispatch::{Dispatch, DispatchConfig, Footprint, MAX_EVENTS_PER_TRAINJOB};
use trainhub::plugins::registry::Registry;
use trainhub_apiserver::server::Server;
use trainhub_apiserver::store::{Key, RedbStore, Store};
use trainhub_proto as pb;
use trainhub_proto::spoke_message::Message;

use crate::common;

/// A hub's dispatch with two spokes, `a` and `b`, each running one
/// TrainJob (`ja` on `a`, `jb` on `b`); `b`'s pod and event are shown.
struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    dispatch: Arc<Dispatch>,
    a: Session,
    b: Session,
    ja: String,
    jb: String,
    /// `b`'s objects as the store held them before `a` spoke.
    before: Vec<(Key, Option<Value>)>,
}

struct Session {
    id: u64,
    rx: UnboundedReceiver<pb::HubMessage>,
    _close: tokio::sync::watch::Receiver<Option<String>>,
}

fn hello(name: &str, runs: Vec<pb::RunRef>) -> pb::Hello {
    pb::Hello {
        labels: [("name".to_string(), name.to_string())].into(),
        backend: "test".into(),
        capacity: ["cpu", "memory"]
            .iter()
            .map(|r| pb::Capacity {
                resource: r.to_string(),
                allocatable_milli: 1 << 40,
                free_milli: 1 << 40,
            })
            .collect(),
        runs,
        version: "test".into(),
        fence_after_ms: 60_000,
    }
}

fn connect(dispatch: &Dispatch, name: &str, runs: Vec<pb::RunRef>) -> Session {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (close, close_rx) = tokio::sync::watch::channel(None);
    let id = dispatch.connect(name, hello(name, runs), tx, close);
    Session {
        id,
        rx,
        _close: close_rx,
    }
}

async fn next<T>(
    session: &mut Session,
    mut pick: impl FnMut(pb::hub_message::Message) -> Option<T>,
) -> T {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let m = session.rx.recv().await.expect("the session is open");
            if let Some(found) = m.message.and_then(&mut pick) {
                return found;
            }
        }
    })
    .await
    .expect("the expected message within 60s")
}

/// Admits the next offer and waits for its start: the run id.
async fn take_run(dispatch: &Dispatch, spoke: &str, session: &mut Session) -> String {
    let offer = next(session, |m| match m {
        pb::hub_message::Message::Offer(o) => Some(o),
        _ => None,
    })
    .await;
    dispatch.on_message(
        spoke,
        session.id,
        Message::Admit(pb::AdmitAnswer {
            run_id: offer.run_id.clone(),
            generation: offer.generation,
            admitted: true,
            reason: String::new(),
        }),
    );
    let run = offer.run_id.clone();
    next(session, |m| match m {
        pb::hub_message::Message::Start(s) if s.run_id == run => Some(()),
        _ => None,
    })
    .await;
    offer.run_id
}

fn trainjob(name: &str, spoke: &str) -> Value {
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default",
            "annotations": {"trainhub.kubeflow.org/spoke-selector": format!("name={spoke}")}},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1}},
    })
}

fn report(run_id: &str, seq: u64, pods: Vec<Value>, events: Vec<Value>, status: &str) -> Message {
    Message::Report(pb::RunReport {
        run_id: run_id.to_string(),
        generation: 1,
        seq,
        jobset_status_json: status.to_string(),
        pods_json: pods.iter().map(Value::to_string).collect(),
        finished: false,
        events_json: events.iter().map(Value::to_string).collect(),
    })
}

const RUNNING: &str = r#"{"replicatedJobsStatus":[{"name":"node","ready":1,"succeeded":0,"failed":0,"active":1,"suspended":0}]}"#;
const FAILED: &str = r#"{"conditions":[{"type":"Failed","status":"True","reason":"FailedJobs","message":"forged","lastTransitionTime":"2026-01-01T00:00:00Z"}]}"#;

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> =
            Arc::new(RedbStore::open(&dir.path().join("store.redb"), 10_000).expect("store"));
        let host = common::host();
        let builtins = trainhub::builtin::load(&host).expect("built-in plugins");
        let plugins = Arc::new(Registry::new(host, builtins, None));
        let admission =
            Arc::new(TrainerAdmission::new(store.clone(), plugins.clone()).expect("schemas"));
        let dispatch = Dispatch::new(
            store.clone(),
            admission.clone(),
            plugins.clone(),
            DispatchConfig::default(),
        );
        let mut builder = Server::builder(store.clone()).admission(admission);
        for def in trainhub::api::resources().expect("resources") {
            builder = builder.resource(def);
        }
        let server = builder.build();
        for object in trainhub::hub::default_objects().expect("runtimes") {
            server.create_object(object).await.expect("install");
        }
        tokio::spawn(dispatch.clone().run(std::future::pending()));
        let mut a = connect(&dispatch, "a", Vec::new());
        let mut b = connect(&dispatch, "b", Vec::new());
        server
            .create_object(trainjob("ja", "a"))
            .await
            .expect("ja created");
        let ja = take_run(&dispatch, "a", &mut a).await;
        server
            .create_object(trainjob("jb", "b"))
            .await
            .expect("jb created");
        let jb = take_run(&dispatch, "b", &mut b).await;
        let pod = json!({"metadata": {"name": "jb-node-0-0",
            "labels": {"jobset.sigs.k8s.io/jobset-name": "jb"}}, "status": {"phase": "Running"}});
        let event = json!({"metadata": {"name": "jb-node-0-0.1"},
            "involvedObject": {"kind": "Pod", "name": "jb-node-0-0"}, "message": "b's"});
        dispatch.on_message("b", b.id, report(&jb, 1, vec![pod], vec![event], RUNNING));
        dispatch.settled().await;
        let keys = [
            Key::new(PODS, Some("default"), "jb-node-0-0"),
            Key::new(EVENTS, Some("default"), "jb-node-0-0.1"),
            Key::new(TRAINJOBS, Some("default"), "jb"),
        ];
        let before: Vec<(Key, Option<Value>)> = keys
            .into_iter()
            .map(|k| {
                let v = store.get(&k).map(|o| o.value.as_ref().clone());
                (k, v)
            })
            .collect();
        assert!(before[0].1.is_some(), "b's pod is shown");
        assert!(before[1].1.is_some(), "b's event is written");
        Fixture {
            _dir: dir,
            store,
            dispatch,
            a,
            b,
            ja,
            jb,
            before,
        }
    }
}

/// What a spoke might send, as a recipe (run ids and names are picked
/// from those that matter, or arbitrary).
#[derive(Debug, Clone)]
enum Step {
    Hello,
    Reconnect {
        runs: Vec<u8>,
    },
    Heartbeat {
        resources: Vec<String>,
    },
    Admit {
        run: u8,
        generation: i64,
        admitted: bool,
    },
    Report {
        run: u8,
        generation: i64,
        pods: Vec<(u8, u8, u8)>,
        events: Vec<(u8, u8)>,
        failed: bool,
    },
    Log {
        id: String,
        data: Vec<u8>,
        eof: bool,
    },
    /// Pods, events and status as arbitrary text (JSON or not).
    Raw {
        run: u8,
        pods: Vec<String>,
        events: Vec<String>,
        status: String,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Hello),
        proptest::collection::vec(any::<u8>(), 0..4).prop_map(|runs| Step::Reconnect { runs }),
        proptest::collection::vec("[a-z./]{0,12}", 0..4)
            .prop_map(|resources| Step::Heartbeat { resources }),
        (any::<u8>(), -1i64..3, any::<bool>()).prop_map(|(run, generation, admitted)| {
            Step::Admit {
                run,
                generation,
                admitted,
            }
        }),
        (
            any::<u8>(),
            0i64..3,
            proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 0..6),
            proptest::collection::vec((any::<u8>(), any::<u8>()), 0..6),
            any::<bool>(),
        )
            .prop_map(|(run, generation, pods, events, failed)| Step::Report {
                run,
                generation,
                pods,
                events,
                failed,
            }),
        (
            prop_oneof![Just("log-1".to_string()), "[0-9a-f]{0,32}", ".{0,40}"],
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<bool>()
        )
            .prop_map(|(id, data, eof)| Step::Log { id, data, eof }),
        (
            any::<u8>(),
            proptest::collection::vec(json_ish(), 0..4),
            proptest::collection::vec(json_ish(), 0..4),
            json_ish(),
        )
            .prop_map(|(run, pods, events, status)| Step::Raw {
                run,
                pods,
                events,
                status,
            }),
    ]
}

/// Text that is often JSON and sometimes almost.
fn json_ish() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        r#"\{"metadata":\{"name":"[a-z.-]{0,20}"(,"namespace":"[a-z]{0,8}")?\}\}"#,
        r#"\{"conditions":\[\{"type":"(Complete|Failed)","status":"True"\}\]\}"#,
        Just("[]".to_string()),
        Just("null".to_string()),
    ]
}

const NAMES: [&str; 8] = [
    "jb-node-0-0",
    "ja-node-0-0",
    "ja-node-0-1",
    "jb",
    "ja",
    "ja-jb-node-0-0",
    "jb-node-0-0.1",
    "Not a Name/..",
];

fn pick<'a>(choices: &'a [&'a str], i: u8) -> &'a str {
    choices[usize::from(i) % choices.len()]
}

impl Fixture {
    fn run_id(&self, i: u8) -> String {
        match i % 4 {
            0 => self.ja.clone(),
            1 => self.jb.clone(),
            2 => format!("unknown-{i}"),
            _ => String::new(),
        }
    }

    fn play(&mut self, step: &Step, seq: &mut u64) {
        let dispatch = self.dispatch.clone();
        let message = match step {
            Step::Hello => Message::Hello(hello("a", Vec::new())),
            Step::Reconnect { runs } => {
                let runs = runs
                    .iter()
                    .map(|r| pb::RunRef {
                        run_id: self.run_id(*r),
                        generation: 1,
                        finished: r % 2 == 0,
                        ..Default::default()
                    })
                    .collect();
                self.a = connect(&dispatch, "a", runs);
                return;
            }
            Step::Heartbeat { resources } => Message::Heartbeat(pb::Heartbeat {
                reservations: Vec::new(),
                capacity: resources
                    .iter()
                    .map(|r| pb::Capacity {
                        resource: r.clone(),
                        allocatable_milli: 1000,
                        free_milli: 1000,
                    })
                    .collect(),
            }),
            Step::Admit {
                run,
                generation,
                admitted,
            } => Message::Admit(pb::AdmitAnswer {
                run_id: self.run_id(*run),
                generation: *generation,
                admitted: *admitted,
                reason: String::new(),
            }),
            Step::Report {
                run,
                generation,
                pods,
                events,
                failed,
            } => {
                *seq += 1;
                let pods = pods
                    .iter()
                    .map(|(name, label, ns)| {
                        json!({"metadata": {
                            "name": pick(&NAMES, *name),
                            "namespace": pick(&["", "default", "other"], *ns),
                            "labels": {"jobset.sigs.k8s.io/jobset-name": pick(&["ja", "jb"], *label)},
                        }})
                    })
                    .collect();
                let events = events
                    .iter()
                    .map(|(name, involved)| {
                        json!({"metadata": {"name": format!("{}.{}", pick(&NAMES, *name), seq)},
                            "involvedObject": {"name": pick(&NAMES, *involved)}})
                    })
                    .collect();
                let mut m = report(
                    &self.run_id(*run),
                    *seq,
                    pods,
                    events,
                    if *failed { FAILED } else { RUNNING },
                );
                if let Message::Report(r) = &mut m {
                    r.generation = *generation;
                }
                m
            }
            Step::Raw {
                run,
                pods,
                events,
                status,
            } => {
                *seq += 1;
                Message::Report(pb::RunReport {
                    run_id: self.run_id(*run),
                    generation: 1,
                    seq: *seq,
                    jobset_status_json: status.clone(),
                    pods_json: pods.clone(),
                    finished: false,
                    events_json: events.clone(),
                })
            }
            Step::Log { id, data, eof } => Message::Log(pb::LogChunk {
                request_id: id.clone(),
                data: data.clone(),
                eof: *eof,
                error: String::new(),
            }),
        };
        dispatch.on_message("a", self.a.id, message);
    }

    /// `b`'s objects are as they were; no pod claims `jb`'s JobSet but its
    /// own; memory holds at most what the two runs account for.
    fn check(&self) -> Result<(), TestCaseError> {
        for (key, before) in &self.before {
            let now = self.store.get(key).map(|o| o.value.as_ref().clone());
            let strip = |v: Option<Value>| {
                v.map(|mut v| {
                    if let Some(m) = v["metadata"].as_object_mut() {
                        m.remove("resourceVersion");
                        m.remove("managedFields");
                    }
                    v
                })
            };
            prop_assert_eq!(strip(now), strip(before.clone()), "{} changed", key);
        }
        let (pods, _) = self.store.list(PODS, None);
        for pod in &pods {
            let meta = &pod.value["metadata"];
            if meta["labels"]["jobset.sigs.k8s.io/jobset-name"] == "jb" {
                prop_assert_eq!(meta["name"].as_str(), Some("jb-node-0-0"));
                prop_assert_eq!(&meta["annotations"]["trainhub.kubeflow.org/spoke"], "b");
            }
        }
        let Footprint {
            sessions,
            log_streams,
            jobs_with_pods,
            pods,
            jobs_with_events,
            events,
            statuses,
        } = self.dispatch.footprint();
        prop_assert!(sessions <= 2, "sessions {sessions}");
        prop_assert_eq!(log_streams, 0);
        prop_assert!(
            jobs_with_pods <= 2 && pods <= NAMES.len() + 1,
            "pods {pods}"
        );
        prop_assert!(
            jobs_with_events <= 2 && events <= 2 * MAX_EVENTS_PER_TRAINJOB,
            "events {events}"
        );
        prop_assert!(statuses <= 2, "statuses {statuses}");
        Ok(())
    }
}

/// One fixture serves every case (a hub per case would cost seconds):
/// state carries over, so the invariants hold after any concatenation of
/// the cases, and a failure's shrunk input may be shorter than the
/// sequence that did the damage (the first failing case's is printed).
#[test]
fn no_message_sequence_lets_a_spoke_touch_another_spokes_runs() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fixture = std::sync::Mutex::new(runtime.block_on(Fixture::new()));
    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in proptest::collection::vec(step(), 1..40))| {
        let mut fixture = fixture.lock().unwrap_or_else(|p| p.into_inner());
        let mut seq = 0;
        runtime.block_on(async {
            for step in &steps {
                fixture.play(step, &mut seq);
            }
            fixture.dispatch.settled().await;
            // Drain what the hub sent `a`: it must not grow without end.
            while fixture.a.rx.try_recv().is_ok() {}
        });
        fixture.check()?;
    });
}

#[test]
fn a_log_reader_that_falls_behind_is_dropped_and_only_the_asked_session_writes() {
    use futures_util::StreamExt;
    use trainhub::dispatch::LOG_BUFFER_CHUNKS;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut f = Fixture::new().await;
        let pod = f.before[0].1.clone().expect("b's pod");
        let mut stream = f
            .dispatch
            .log_source()
            .logs(&pod, None, true, None)
            .await
            .expect("a log stream");
        let request = next(&mut f.b, |m| match m {
            pb::hub_message::Message::LogRequest(r) if !r.cancel => Some(r),
            _ => None,
        })
        .await;
        assert_eq!(request.request_id.len(), 32, "{request:?}");
        assert!(request.request_id.bytes().all(|b| b.is_ascii_hexdigit()));
        let chunk = |data: &str, id: &str| {
            Message::Log(pb::LogChunk {
                request_id: id.to_string(),
                data: data.as_bytes().to_vec(),
                eof: false,
                error: String::new(),
            })
        };
        // Spoke a, even knowing the id, cannot write to b's stream.
        f.dispatch
            .on_message("a", f.a.id, chunk("forged\n", &request.request_id));
        // b writes more than the reader's buffer while nobody reads: no
        // call waits, and the stream is dropped once the buffer is full.
        for i in 0..=LOG_BUFFER_CHUNKS {
            f.dispatch.on_message(
                "b",
                f.b.id,
                chunk(&format!("line {i}\n"), &request.request_id),
            );
        }
        let cancel = next(&mut f.b, |m| match m {
            pb::hub_message::Message::LogRequest(r) if r.cancel => Some(r),
            _ => None,
        })
        .await;
        assert_eq!(cancel.request_id, request.request_id);
        // The reader gets what was buffered, b's lines only, then the error.
        let mut lines = Vec::new();
        let error = loop {
            match tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("the stream goes on")
            {
                Some(Ok(bytes)) => lines.push(String::from_utf8_lossy(&bytes).into_owned()),
                Some(Err(e)) => break e.to_string(),
                None => panic!("the stream ended without an error after {lines:?}"),
            }
        };
        assert_eq!(lines.len(), LOG_BUFFER_CHUNKS);
        assert_eq!(lines[0], "line 0\n");
        assert!(lines.iter().all(|l| l.starts_with("line ")), "{lines:?}");
        assert!(error.contains("the log reader fell behind"), "{error}");
        assert_eq!(f.dispatch.footprint().log_streams, 0);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_are_answered_and_a_run_the_spoke_lost_is_placed_again_at_once() {
    let mut f = Fixture::new().await;
    f.dispatch
        .on_message("a", f.a.id, Message::Heartbeat(pb::Heartbeat::default()));
    let ack = next(&mut f.a, |m| match m {
        pb::hub_message::Message::HeartbeatAck(ack) => Some(ack),
        _ => None,
    })
    .await;
    assert_eq!(ack.worker_lost_timeout_ms, 15 * 60 * 1000);

    // A fence-after that would let the hub requeue before the spoke stops.
    for (fence_after_ms, ok) in [(0, false), (900_000, false), (60_000, true)] {
        let checked = f.dispatch.check_hello(&pb::Hello {
            fence_after_ms,
            ..hello("a", Vec::new())
        });
        assert_eq!(checked.is_ok(), ok, "{fence_after_ms}: {checked:?}");
    }

    // `a` comes back saying it fenced `ja`'s run: requeued under
    // generation 2 (offered again, to `a` by its selector), and the lost
    // run stopped as stale.
    let lost = pb::RunRef {
        run_id: f.ja.clone(),
        generation: 1,
        lost: true,
        reason: "Fenced".into(),
        ..Default::default()
    };
    let mut a = connect(&f.dispatch, "a", vec![lost]);
    let ja = f.ja.clone();
    let (mut stopped, mut offered) = (None, None);
    while stopped.is_none() || offered.is_none() {
        let (stop, offer) = next(&mut a, |m| match m {
            pb::hub_message::Message::Stop(s) if s.run_id == ja => Some((Some(s.generation), None)),
            pb::hub_message::Message::Offer(o) if o.run_id == ja => {
                Some((None, Some(o.generation)))
            }
            _ => None,
        })
        .await;
        stopped = stopped.or(stop);
        offered = offered.or(offer);
    }
    assert_eq!((stopped, offered), (Some(1), Some(2)));
}
