//! Pod logs: streams asked of the spoke that runs the pod, served to the
//! API server's `pods/log` without ever holding up a spoke's session.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use trainhub_apiserver::server::{ByteStream, LogSource};
use trainhub_apiserver::status::ApiError;
use trainhub_proto as pb;

use super::{ANNOTATION_RUN, ANNOTATION_SPOKE, Dispatch, lock};

/// Chunks buffered per log stream for its reader: with chunks of at most
/// [`pb::limits::MAX_LOG_CHUNK_BYTES`], 4 MiB. A reader that falls further
/// behind is dropped, with an error at the end of what it was sent.
pub const LOG_BUFFER_CHUNKS: usize = 64;

/// An open log stream: the spoke and the session it was asked of (only
/// they may write to it), and its reader's buffer.
pub(super) struct LogStream {
    spoke: String,
    session: u64,
    tx: mpsc::Sender<Bytes>,
    /// Why the stream ended early; the reader gets it after the buffered
    /// data.
    ended: Arc<Mutex<Option<String>>>,
}

/// A new log stream id: 128 random bits, hex (not guessable, so one
/// spoke cannot write into a stream another spoke serves).
fn log_stream_id() -> Result<String, ApiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::internal(format!("no randomness for a log stream id: {e}")))?;
    Ok(hex::encode(bytes))
}

impl Dispatch {
    /// A chunk of a log stream: handed to its reader without waiting. Only
    /// the session the stream was asked of may write to it; a reader whose
    /// buffer is full is dropped (its stream ends with an error, the spoke
    /// is told to stop), so no reader ever holds up the session.
    pub(super) fn on_log_chunk(&self, spoke: &str, session: u64, chunk: pb::LogChunk) {
        use tokio::sync::mpsc::error::TrySendError;
        let mut logs = lock(&self.logs);
        let Some(stream) = logs.get(&chunk.request_id) else {
            // Cancelled meanwhile, or never asked for.
            tracing::debug!(spoke, "a log chunk for no open stream dropped");
            return;
        };
        if stream.spoke != spoke || stream.session != session {
            tracing::warn!(
                spoke,
                session,
                "refused a log chunk for a stream this session was not asked to serve"
            );
            return;
        }
        let mut ended = None;
        let mut cancel = false;
        if !chunk.data.is_empty() {
            match stream.tx.try_send(Bytes::from(chunk.data)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    tracing::info!(spoke, "dropped a log stream whose reader fell behind");
                    ended = Some(format!(
                        "the log reader fell behind: more than {LOG_BUFFER_CHUNKS} chunks waited to be read, so the stream was closed; read the log again"
                    ));
                    cancel = true;
                }
                Err(TrySendError::Closed(_)) => cancel = true,
            }
        }
        if ended.is_none() && !chunk.error.is_empty() {
            ended = Some(chunk.error);
        }
        if !(chunk.eof || cancel || ended.is_some()) {
            return;
        }
        let Some(stream) = logs.remove(&chunk.request_id) else {
            return;
        };
        drop(logs);
        if let Some(error) = ended {
            *lock(&stream.ended) = Some(error);
        }
        if cancel && !chunk.eof {
            self.send(
                spoke,
                pb::hub_message::Message::LogRequest(pb::LogRequest {
                    request_id: chunk.request_id,
                    cancel: true,
                    ..Default::default()
                }),
            );
        }
    }

    /// Ends the log streams that session `session` of `spoke` served.
    pub(super) fn end_logs(&self, spoke: &str, session: u64, why: &str) {
        let ended: Vec<LogStream> = {
            let mut logs = lock(&self.logs);
            let ids: Vec<String> = logs
                .iter()
                .filter(|(_, s)| s.spoke == spoke && s.session == session)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| logs.remove(id)).collect()
        };
        for stream in ended {
            *lock(&stream.ended) = Some(why.to_string());
        }
    }

    /// A log stream of a pod the hub shows, from the spoke that runs it.
    pub(crate) fn open_logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> Result<ByteStream, ApiError> {
        let meta = &pod["metadata"];
        let name = meta["name"].as_str().unwrap_or_default();
        let spoke = meta["annotations"][ANNOTATION_SPOKE]
            .as_str()
            .unwrap_or_default();
        let run = meta["annotations"][ANNOTATION_RUN]
            .as_str()
            .unwrap_or_default();
        let run_id = run.rsplit_once('.').map_or(run, |(id, _)| id);
        let container = container
            .map(String::from)
            .or_else(|| {
                pod["spec"]["containers"][0]["name"]
                    .as_str()
                    .map(String::from)
            })
            .unwrap_or_default();
        let session = lock(&self.sessions)
            .get(spoke)
            .map(|s| (s.id, s.tx.clone()));
        let Some((session, tx)) = session else {
            return Err(ApiError::unavailable(format!(
                "the logs of pod {name:?} are on spoke {spoke:?}, which is not connected"
            )));
        };
        let request_id = log_stream_id()?;
        let (chunk_tx, chunk_rx) = mpsc::channel(LOG_BUFFER_CHUNKS);
        let ended = Arc::new(Mutex::new(None));
        lock(&self.logs).insert(
            request_id.clone(),
            LogStream {
                spoke: spoke.to_string(),
                session,
                tx: chunk_tx,
                ended: ended.clone(),
            },
        );
        let _ = tx.send(pb::HubMessage {
            message: Some(pb::hub_message::Message::LogRequest(pb::LogRequest {
                request_id: request_id.clone(),
                run_id: run_id.to_string(),
                pod: name.to_string(),
                container,
                follow,
                tail_lines: tail_lines.unwrap_or(-1),
                cancel: false,
            })),
        });
        let guard = LogGuard {
            request_id,
            run_id: run_id.to_string(),
            tx,
            logs: self.self_arc(),
        };
        // The buffered chunks, then the reason the stream ended early, if
        // it did.
        let stream =
            futures_util::stream::unfold(Some((chunk_rx, guard, ended)), |state| async move {
                let (mut rx, guard, ended) = state?;
                match rx.recv().await {
                    Some(bytes) => Some((Ok(bytes), Some((rx, guard, ended)))),
                    None => {
                        let error = lock(&ended).take()?;
                        Some((Err(std::io::Error::other(error)), None))
                    }
                }
            });
        Ok(Box::pin(stream))
    }
}

/// Cancels a log request on the spoke when its reader goes away.
struct LogGuard {
    request_id: String,
    run_id: String,
    tx: mpsc::UnboundedSender<pb::HubMessage>,
    logs: Option<Arc<Dispatch>>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        let open = self
            .logs
            .as_ref()
            .is_some_and(|d| lock(&d.logs).remove(&self.request_id).is_some());
        if open {
            let _ = self.tx.send(pb::HubMessage {
                message: Some(pb::hub_message::Message::LogRequest(pb::LogRequest {
                    request_id: self.request_id.clone(),
                    run_id: self.run_id.clone(),
                    cancel: true,
                    ..Default::default()
                })),
            });
        }
    }
}

/// The pod log source the API server serves `pods/log` from.
pub struct SpokeLogs(pub Arc<Dispatch>);

impl LogSource for SpokeLogs {
    fn logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> trainhub_apiserver::server::LogsFuture {
        let result = self.0.open_logs(pod, container, follow, tail_lines);
        Box::pin(async move { result })
    }
}

/// The pod log source of a hub replica: the spokes' sessions live on the
/// leader, so a replica serves logs while it leads and refuses with 503
/// (retry later, or ask the leader) while it follows.
pub struct LeaderLogs(pub tokio::sync::watch::Receiver<Option<Arc<Dispatch>>>);

impl LogSource for LeaderLogs {
    fn logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> trainhub_apiserver::server::LogsFuture {
        let current = self.0.borrow().clone();
        let result = match current {
            Some(dispatch) => dispatch.open_logs(pod, container, follow, tail_lines),
            None => Err(ApiError::new(
                503,
                "ServiceUnavailable",
                "pod logs are streamed by the leading hub replica, where the spokes' sessions are; this replica follows: retry (a load balancer in front of the replicas tries another)",
            )),
        };
        Box::pin(async move { result })
    }
}

/// The log source of a replica that serves logs while `current` holds the
/// dispatch of its term.
pub fn leader_log_source(
    current: tokio::sync::watch::Receiver<Option<Arc<Dispatch>>>,
) -> Arc<dyn LogSource> {
    Arc::new(LeaderLogs(current))
}

impl Dispatch {
    /// The log source for the API server.
    pub fn log_source(self: &Arc<Self>) -> Arc<dyn LogSource> {
        Arc::new(SpokeLogs(self.clone()))
    }
}
