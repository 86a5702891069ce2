//! Carrying out the core's actions: offers, withdrawals and stops sent to
//! spokes, placements committed to the store (before a winner is told to
//! start), the Build phase and start on the winning spoke, releases, and
//! the store writes they queue.

use jiff::Timestamp;
use serde_json::{Value, json};
use trainhub_apiserver::store::{Key, Op};
use trainhub_plugin_sdk as sdk;
use trainhub_proto as pb;

use super::core::{self, Action, JobKey, Placement};
use super::intake::{Step, StepError};
use super::reports::trainjob_event;
use super::writer::{Edit, Write};
use super::{Dispatch, PLACEMENTS, REASON_BUILD_FAILED, lock, queues};
use crate::api::{EVENTS, PODS, TRAINJOBS};
use crate::controller::lifecycle::format_time;

impl Dispatch {
    pub(super) fn write(&self, ops: Vec<Op>) {
        let _ = self.writer.send(Write {
            ops,
            ..Write::default()
        });
    }

    /// Carries out the dispatcher's actions.
    pub(super) fn execute(&self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Offer {
                    spoke,
                    job,
                    run_id,
                    generation,
                    pod_sets,
                } => self.send(
                    &spoke,
                    pb::hub_message::Message::Offer(pb::Offer {
                        generation,
                        namespace: job.namespace,
                        name: job.name,
                        pod_sets: pod_sets
                            .iter()
                            .map(|p| pb::PodSet {
                                name: p.name.clone(),
                                count: p.count,
                                requests_milli: p
                                    .requests_milli
                                    .iter()
                                    .map(|(k, v)| (k.clone(), *v))
                                    .collect(),
                            })
                            .collect(),
                        trace_context: self.observe.offered(&run_id, &spoke, generation),
                        run_id,
                    }),
                ),
                Action::Withdraw {
                    spoke,
                    run_id,
                    generation,
                } => {
                    self.observe.withdrawn(&run_id, &spoke, generation);
                    self.send(
                        &spoke,
                        pb::hub_message::Message::Withdraw(pb::Withdraw { run_id, generation }),
                    )
                }
                Action::Stop {
                    spoke,
                    run_id,
                    generation,
                    reason,
                } => {
                    lock(&self.statuses).remove(&run_id);
                    self.send(
                        &spoke,
                        pb::hub_message::Message::Stop(pb::Stop {
                            run_id,
                            generation,
                            reason: reason.to_string(),
                        }),
                    )
                }
                Action::Commit { job, placement } => self.commit_placement(job, placement),
                Action::Forget { job } => {
                    let mut ops = vec![Op::Remove {
                        key: Key::new(PLACEMENTS, Some(&job.namespace), &job.name),
                    }];
                    let pods = lock(&self.pods).remove(&job).unwrap_or_default();
                    ops.extend(pods.into_keys().map(|pod| Op::Remove {
                        key: Key::new(PODS, Some(&job.namespace), &pod),
                    }));
                    let events = lock(&self.events).remove(&job).unwrap_or_default();
                    ops.extend(events.into_iter().map(|event| Op::Remove {
                        key: Key::new(EVENTS, Some(&job.namespace), &event),
                    }));
                    self.write(ops);
                }
                Action::Start {
                    spoke,
                    job,
                    run_id,
                    generation,
                } => self.start(spoke, job, run_id, generation),
                Action::Release { job, uid } => self.release(job, uid),
                Action::Event {
                    job,
                    uid,
                    warning,
                    reason,
                    message,
                } => {
                    let kind = if warning { "Warning" } else { "Normal" };
                    let event = trainjob_event(&job, Some(&uid), kind, reason, &message);
                    self.record_events(&job, vec![event]);
                }
                // Only TrainJobs in a queue are evicted; queues are not
                // wired yet.
                Action::Evicted {
                    job,
                    uid,
                    reason,
                    message,
                    preemption,
                } => {
                    // The Preempted condition says what the Evicted one
                    // does, as Kueue's do.
                    let preempted = preemption.map(|p| (p.reason, message.clone()));
                    let eviction = queues::Eviction {
                        uid,
                        reason,
                        message,
                        preempted,
                    };
                    lock(&self.evictions).insert(job, eviction);
                }
            }
        }
    }

    /// Removes [`FINALIZER`] from the deleted TrainJob `uid`; with it the
    /// last finalizer, the TrainJob goes (as the API server does when an
    /// update removes the last finalizer of a deleting object). Idempotent:
    /// a TrainJob without the finalizer, or another object under the same
    /// name, is left alone.
    ///
    /// [`FINALIZER`]: super::FINALIZER
    fn release(&self, job: JobKey, uid: String) {
        tracing::debug!(trainjob = %job, "releasing the TrainJob (the writer says when it is done)");
        let _ = self.writer.send(Write {
            edit: Some((
                Key::new(TRAINJOBS, Some(&job.namespace), &job.name),
                Edit::Release { uid },
            )),
            ..Write::default()
        });
    }

    fn commit_placement(&self, job: JobKey, placement: Placement) {
        let Some(uid) = self
            .store
            .get(&Key::new(TRAINJOBS, Some(&job.namespace), &job.name))
            .and_then(|o| o.value["metadata"]["uid"].as_str().map(String::from))
        else {
            return;
        };
        let value = json!({
            "uid": uid.clone(),
            "spoke": placement.spoke,
            "generation": placement.generation,
            "time": format_time(Timestamp::now()),
        });
        let key = Key::new(PLACEMENTS, Some(&job.namespace), &job.name);
        // The spoke annotation and the finalizer go in the same commit.
        let edit = (
            Key::new(TRAINJOBS, Some(&job.namespace), &job.name),
            Edit::Placed {
                uid: uid.clone(),
                spoke: placement.spoke.clone(),
            },
        );
        let done: Option<Box<dyn FnOnce(bool) + Send>> = if placement.spoke.is_some() {
            let this = self.self_arc();
            Some(Box::new(move |ok| {
                if let Some(this) = this {
                    if ok && let Some(spoke) = &placement.spoke {
                        this.observe.placed(&uid, spoke, placement.generation);
                        let event = trainjob_event(
                            &job,
                            Some(&uid),
                            "Normal",
                            core::reason::PLACED,
                            &format!(
                                "Placed on spoke {spoke} (placement {})",
                                placement.generation
                            ),
                        );
                        this.record_events(&job, vec![event]);
                    }
                    let actions = lock(&this.state).committed(&job, &placement, ok, this.now());
                    this.execute(actions);
                }
            }))
        } else {
            None
        };
        let _ = self.writer.send(Write {
            ops: vec![Op::Put { key, value }],
            merge: None,
            edit: Some(edit),
            done,
        });
    }

    /// Builds the objects for `spoke` and sends them.
    fn start(&self, spoke: String, job: JobKey, run_id: String, generation: i64) {
        let Some(this) = self.self_arc() else { return };
        tokio::spawn(async move {
            let Some(object) =
                this.store
                    .get(&Key::new(TRAINJOBS, Some(&job.namespace), &job.name))
            else {
                return;
            };
            let target = {
                let sessions = lock(&this.sessions);
                let Some(session) = sessions.get(&spoke) else {
                    // Gone meanwhile: the next hello starts it again.
                    return;
                };
                sdk::Target {
                    name: spoke.clone(),
                    labels: session
                        .labels
                        .iter()
                        .map(|(k, v)| sdk::KeyValue {
                            key: k.clone(),
                            value: v.clone(),
                        })
                        .collect(),
                    resources: session
                        .allocatable
                        .iter()
                        .map(|(name, milli)| sdk::Quantity {
                            name: name.clone(),
                            value: format!("{milli}m"),
                        })
                        .collect(),
                }
            };
            let span = this.observe.build(&run_id, &spoke, generation);
            // Built on this task's thread: a plugin call that runs long
            // hands the worker's other tasks off itself (see
            // `plugins::host`), and the rest is microseconds.
            let built = {
                let value = &object.value;
                let build = || {
                    let _build = span.enter();
                    let (job, runtime, pipeline) = this.pipeline_for(value)?;
                    let generation = value["metadata"]["generation"].as_i64().unwrap_or(0);
                    let uid = value["metadata"]["uid"].as_str().unwrap_or_default();
                    let built = match this.enforced.get(&(uid.to_string(), generation)) {
                        Some(info) => pipeline.build_enforced(&job, info.as_ref().clone(), &target),
                        None => pipeline.build(&job, &runtime, &target),
                    };
                    let mut rendered = built.map_err(StepError::from)?;
                    if let Some(reporting) = this.trainer_status.get() {
                        let meta = &value["metadata"];
                        let namespace = meta["namespace"].as_str().unwrap_or_default();
                        let name = meta["name"].as_str().unwrap_or_default();
                        reporting
                            .add_to(&mut rendered.objects, namespace, name, uid)
                            .map_err(|e| StepError {
                                message: format!("the trainer's status token: {e}"),
                                transient: true,
                            })?;
                    }
                    Ok::<_, StepError>(rendered)
                };
                // A panic in the host's own code fails this Build, as it
                // did when it ran as a task of its own.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(build))
                    .unwrap_or_else(|_| Err("the build panicked in the host".to_string().into()))
            };
            let uid = object.value["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if built.is_ok() {
                this.undefer(&job.namespace, &job.name, &uid, Step::Build);
            }
            match built {
                Ok(rendered) => {
                    let objects_json = rendered.objects.iter().map(Value::to_string).collect();
                    this.send(
                        &spoke,
                        pb::hub_message::Message::Start(pb::Start {
                            run_id,
                            generation,
                            namespace: job.namespace.clone(),
                            name: job.name.clone(),
                            trainjob_uid: object.value["metadata"]["uid"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            objects_json,
                            trace_context: trainhub_telemetry::propagation::inject(&span),
                        }),
                    );
                }
                Err(e) if e.transient => {
                    let (namespace, name) = (job.namespace.clone(), job.name.clone());
                    let retry_uid = uid.clone();
                    this.defer(
                        &namespace,
                        &name,
                        &uid,
                        Step::Build,
                        &e.message,
                        move |this| {
                            // Only while this run is still the placement the
                            // store holds: never a Start for a superseded run.
                            let current =
                                this.stored_placement(&job.namespace, &job.name, &retry_uid);
                            if current.is_some_and(|p| {
                                p.generation == generation && p.spoke.as_deref() == Some(&spoke)
                            }) {
                                this.start(spoke, job, run_id, generation);
                            }
                        },
                    );
                }
                Err(e) => this.fail(&job.namespace, &job.name, REASON_BUILD_FAILED, &e.message),
            }
        });
    }
}
