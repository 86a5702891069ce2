//! The spokes' sessions: hello and the fence-after check, one live session
//! per spoke, the messages a session carries (heartbeats, admission
//! answers, reports, log chunks, stops), and cordons.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use trainhub_proto as pb;

use super::{Dispatch, Session, check_fence_after, core, lock};

impl Dispatch {
    pub(super) fn send(&self, spoke: &str, message: pb::hub_message::Message) {
        if let Some(session) = lock(&self.sessions).get(spoke) {
            let _ = session.tx.send(pb::HubMessage {
                message: Some(message),
            });
        }
    }

    // ------------------------------------------------------------ spokes

    /// The spokes' sessions and certificates.
    pub fn spokes(&self) -> &Arc<crate::spokes::Registry> {
        &self.spokes
    }

    /// Cordons or uncordons a spoke (its `Spoke.spec.unschedulable`).
    pub fn set_unschedulable(&self, spoke: &str, unschedulable: bool) {
        let actions = lock(&self.state).set_unschedulable(spoke, unschedulable, self.now());
        self.execute(actions);
    }

    /// What dispatch knows of each spoke, for the `Spoke` objects' status.
    pub fn spoke_views(&self) -> std::collections::BTreeMap<String, core::SpokeView> {
        lock(&self.state).spoke_views()
    }

    /// Ends the open session of `spoke`, if any, telling it `reason`; the
    /// spoke is then disconnected (its runs follow the worker-lost path).
    pub fn close_session(&self, spoke: &str, reason: &str) {
        if let Some(session) = lock(&self.sessions).get(spoke) {
            let _ = session.close.send(Some(reason.to_string()));
        }
    }

    /// Ends every open session, telling each spoke `reason` (this replica
    /// stopped leading: the spokes go to the new leader).
    pub fn close_all_sessions(&self, reason: &str) {
        for session in lock(&self.sessions).values() {
            let _ = session.close.send(Some(reason.to_string()));
        }
    }

    // ------------------------------------------------------------ sessions

    /// How long a session may stay silent before it is ended.
    pub fn spoke_silence(&self) -> Duration {
        self.config.spoke_silence
    }

    /// Whether a spoke's hello may open a session: its fence-after must be
    /// set and strictly shorter than the worker-lost timeout, so that a
    /// spoke cut off from the hub stops its runs before the hub places
    /// them elsewhere.
    ///
    /// # Errors
    ///
    /// The rule broken, naming both values (a FailedPrecondition).
    pub fn check_hello(&self, hello: &pb::Hello) -> Result<(), String> {
        check_fence_after(
            hello.fence_after_ms,
            self.config.core.worker_lost_timeout_ms,
        )
    }

    /// A spoke said hello on a new stream. Returns the session id that its
    /// later calls carry.
    ///
    /// One live session per spoke: a newer session of the same spoke
    /// replaces it, and the older one is closed (`close` gets the reason;
    /// its stream ends), its pending offers count as refused and its log
    /// streams end. A spoke only opens a session after its previous one
    /// ended on its side, so what the old stream still carried is stale.
    pub fn connect(
        &self,
        spoke: &str,
        hello: pb::Hello,
        tx: mpsc::UnboundedSender<pb::HubMessage>,
        close: tokio::sync::watch::Sender<Option<String>>,
    ) -> u64 {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut labels: Vec<(String, String)> = hello.labels.into_iter().collect();
        labels.sort();
        let labels_json = Value::Object(
            labels
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        );
        let capacity = capacity_of(&hello.capacity);
        self.observe.spoke_seen(spoke, &capacity, true);
        let replaced = lock(&self.sessions).insert(
            spoke.to_string(),
            Session {
                id,
                tx,
                close,
                labels,
                allocatable: capacity.iter().map(|(r, a, _)| (r.clone(), *a)).collect(),
            },
        );
        if let Some(old) = replaced {
            tracing::warn!(
                spoke,
                session = old.id,
                by = id,
                "a newer session of the spoke replaced its open one, which is closed"
            );
            let _ = old.close.send(Some(format!(
                "session replaced by a newer session of spoke {spoke:?} (one live session per spoke)"
            )));
            self.end_logs(spoke, old.id, "the spoke's session was replaced");
            let actions = lock(&self.state).spoke_disconnected(spoke, self.now());
            self.execute(actions);
        }
        for lost in hello.runs.iter().filter(|r| r.lost) {
            tracing::warn!(spoke, run = %lost.run_id, generation = lost.generation, reason = %lost.reason, "the spoke reports a run lost");
            let actions = lock(&self.state).run_lost(
                spoke,
                &lost.run_id,
                lost.generation,
                &lost.reason,
                self.now(),
            );
            self.execute(actions);
        }
        let held: Vec<(String, i64)> = hello
            .runs
            .iter()
            .map(|r| (r.run_id.clone(), r.generation))
            .collect();
        tracing::info!(spoke, backend = %hello.backend, runs = held.len(), "spoke connected");
        let actions =
            lock(&self.state).spoke_connected(spoke, labels_json, capacity, &held, self.now());
        self.execute(actions);
        id
    }

    /// The stream of session `id` ended.
    pub fn disconnect(&self, spoke: &str, id: u64) {
        {
            let mut sessions = lock(&self.sessions);
            if sessions.get(spoke).is_none_or(|s| s.id != id) {
                return;
            }
            sessions.remove(spoke);
        }
        self.end_logs(spoke, id, "the spoke disconnected");
        tracing::warn!(spoke, "spoke disconnected");
        let actions = lock(&self.state).spoke_disconnected(spoke, self.now());
        self.execute(actions);
    }

    /// One message of session `session` of a spoke.
    ///
    /// Reports and heartbeats of a session that a newer one has replaced are
    /// dropped: the spoke switched to the new session only after putting a
    /// fresh report of every run it holds on it, so whatever the old session
    /// still carries is older than what the hub has (or is about to have)
    /// from the new one, and taking it would set a TrainJob's status back.
    /// Admission answers still count (a late one is withdrawn like any
    /// other); log chunks go only to streams the same session was asked to
    /// serve, and a replaced session's streams have ended.
    ///
    /// Never waits: a chunk for a log reader that is not keeping up drops
    /// that reader, not the session.
    pub fn on_message(&self, spoke: &str, session: u64, message: pb::spoke_message::Message) {
        use pb::spoke_message::Message;
        if matches!(message, Message::Report(_) | Message::Heartbeat(_))
            && lock(&self.sessions)
                .get(spoke)
                .is_none_or(|s| s.id != session)
        {
            match &message {
                Message::Report(report) => {
                    tracing::info!(spoke, session, run = %report.run_id, seq = report.seq, "dropped a report of a replaced session");
                }
                _ => tracing::debug!(spoke, session, "dropped a heartbeat of a replaced session"),
            }
            return;
        }
        match message {
            Message::Hello(_) => {
                tracing::warn!(spoke, "second hello on one stream ignored");
            }
            Message::Heartbeat(hb) => {
                // The spoke's proof that the hub hears it (it fences itself
                // when these stop).
                self.send(
                    spoke,
                    pb::hub_message::Message::HeartbeatAck(pb::HeartbeatAck {
                        worker_lost_timeout_ms: i64::try_from(
                            self.config.core.worker_lost_timeout_ms,
                        )
                        .unwrap_or(i64::MAX),
                    }),
                );
                let capacity = capacity_of(&hb.capacity);
                self.observe.spoke_seen(spoke, &capacity, false);
                if let Some(s) = lock(&self.sessions).get_mut(spoke) {
                    s.allocatable = capacity.iter().map(|(r, a, _)| (r.clone(), *a)).collect();
                }
                let reservations: Vec<(String, i64)> = hb
                    .reservations
                    .iter()
                    .map(|r| (r.run_id.clone(), r.generation))
                    .collect();
                let actions =
                    lock(&self.state).spoke_heartbeat(spoke, capacity, &reservations, self.now());
                self.execute(actions);
            }
            Message::Admit(answer) => {
                if !answer.admitted {
                    tracing::debug!(spoke, run = %answer.run_id, reason = %answer.reason, "offer refused");
                }
                let actions = lock(&self.state).admit_answer(
                    spoke,
                    &answer.run_id,
                    answer.generation,
                    answer.admitted,
                    self.now(),
                );
                self.execute(actions);
            }
            Message::Report(report) => self.on_report(spoke, report),
            Message::Log(chunk) => self.on_log_chunk(spoke, session, chunk),
            Message::Stopped(stopped) => {
                tracing::debug!(spoke, run = %stopped.run_id, generation = stopped.generation, "run stopped");
                let actions =
                    lock(&self.state).run_stopped(spoke, &stopped.run_id, stopped.generation);
                self.execute(actions);
            }
        }
    }
}

fn capacity_of(capacity: &[pb::Capacity]) -> Vec<(String, i64, i64)> {
    capacity
        .iter()
        .map(|c| (c.resource.clone(), c.allocatable_milli, c.free_milli))
        .collect()
}
