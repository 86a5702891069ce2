//! Watch streams: one JSON object per line, `{"type": ..., "object": ...}`,
//! as kube-apiserver writes them.
//!
//! - no `resourceVersion` (or `0`): the current objects as `ADDED`, then
//!   changes; a version: the changes after it, or one `ERROR` event with a
//!   410 Expired status when the history no longer holds it;
//! - `sendInitialEvents=true`: the current objects, then a bookmark
//!   annotated `k8s.io/initial-events-end`;
//! - `allowWatchBookmarks`: a `BOOKMARK` with the latest resourceVersion
//!   every bookmark interval;
//! - selectors apply to transitions: an object that stops matching is sent
//!   as `DELETED`, one that starts matching as `ADDED`;
//! - the stream ends after `timeoutSeconds` (default 30 minutes), when the
//!   client goes, or when it lags too far behind (the client re-watches).

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};

use super::handlers::{Ctx, Selectors, now, partial_metadata};
use super::inflight::{BudgetShare, WatchBudget};
use super::request::{self, Format};
use crate::status::ApiError;
use crate::store::{Event, EventType, Key, Rv};
use crate::table;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Lines a watch queues for its client before the client reads...
const QUEUED_LINES: usize = 64;
/// ... and the most bytes they may hold together: a client that reads
/// slowly holds at most this much of the hub's memory (and one line more:
/// an event larger than this is queued alone), however large its objects.
const QUEUED_BYTES: usize = 1 << 20;

/// A line queued for the client, holding its share of the queue's bytes
/// and of its user's budget until the response stream takes it.
type Queued = (bytes::Bytes, Held);

/// What a queued line holds until the response stream takes it.
struct Held {
    _queue: OwnedSemaphorePermit,
    _user: Option<BudgetShare>,
}

/// Where a watch's queued lines take room: its own queue's bytes, and the
/// budget of its user's watches together.
struct Room {
    queue: Arc<Semaphore>,
    user: Option<WatchBudget>,
}

pub(crate) async fn serve(ctx: Ctx) -> Result<Response, ApiError> {
    let selectors = Selectors::parse(&ctx)?;
    let rv = match ctx.query.get("resourceVersion") {
        None | Some("0") => None,
        Some(rv) => Some(
            rv.parse::<Rv>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
    };
    let send_initial = ctx.query.flag("sendInitialEvents");
    let bookmarks = ctx.query.flag("allowWatchBookmarks");
    let timeout =
        match ctx.query.get("timeoutSeconds") {
            Some(t) => Duration::from_secs(t.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("timeoutSeconds: invalid value {t:?}"))
            })?),
            None => DEFAULT_TIMEOUT,
        };
    let store = ctx.server.store.clone();
    let resource = ctx.def.store_key();
    let namespace = ctx.target.namespace.clone();

    // The initial state, when asked for, and the version to follow from:
    // the objects as stored, each decoded as it is sent.
    let (initial, since) = match rv {
        Some(rv) if !send_initial => (Vec::new(), rv),
        _ => store
            .list_raw(&resource, namespace.as_deref(), None, None)
            .await
            .map_err(|e| ApiError::from_store(e, &ctx.def.group, &ctx.def.plural))?,
    };
    let (tx, rx) = mpsc::channel::<Queued>(QUEUED_LINES);
    let room = Room {
        queue: Arc::new(Semaphore::new(QUEUED_BYTES)),
        user: ctx.server.inflight.watch_budget(&ctx.user.name),
    };
    let format = ctx.format;
    let watch = match store.watch(&resource, namespace.as_deref(), Some(since)) {
        Ok(w) => w,
        Err(crate::store::StoreError::Gone { requested, oldest }) => {
            let status =
                ApiError::expired(format!("too old resource version: {requested} ({oldest})"))
                    .to_status();
            let timeout = ctx.server.watch_send_timeout;
            let _ = enqueue(&tx, &room, line("ERROR", &status), timeout).await;
            drop(tx);
            return Ok(streaming(rx));
        }
        Err(e) => return Err(ApiError::from_store(e, &ctx.def.group, &ctx.def.plural)),
    };
    let interval = ctx.server.bookmark_interval;
    let mut epoch = ctx.server.watch_epoch.subscribe();
    let resumed = rv.is_some() && !send_initial;
    tokio::spawn(async move {
        let mut w = Writer::new(ctx, selectors, tx, room, format, since, resumed);
        for raw in initial {
            let Some(object) = raw.decode() else { continue };
            let line = w.state_line(EventType::Added, &object.key, &object.value);
            drop(object);
            if !w.send_line(line).await {
                return;
            }
        }
        if send_initial {
            let bookmark = w.bookmark(since, true);
            if !w.send_raw("BOOKMARK", &bookmark).await {
                return;
            }
        }
        for event in watch.replay {
            if !w.send_event(event).await {
                return;
            }
        }
        let mut live = watch.live;
        let closed = w.tx.clone();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = epoch.changed() => return,
                _ = closed.closed() => return,
                _ = ticker.tick(), if bookmarks => {
                    let b = w.bookmark(w.last_rv, false);
                    if !w.send_raw("BOOKMARK", &b).await {
                        return;
                    }
                }
                event = live.recv() => match event {
                    Ok(event) => {
                        if event.object.rv <= watch.replayed_up_to.max(since) {
                            continue;
                        }
                        if !w.send_event(event).await {
                            return;
                        }
                    }
                    // Too far behind, or the store is closing: end the watch,
                    // the client re-watches from its last version.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    Ok(streaming(rx))
}

struct Writer {
    ctx: Ctx,
    selectors: Selectors,
    tx: mpsc::Sender<Queued>,
    /// The bytes the queue (and the user's watches) have room for.
    room: Room,
    format: Format,
    /// Keys the client currently sees (for selector transitions).
    visible: HashSet<Key>,
    last_rv: Rv,
    /// Resumed from a resourceVersion: the client may know objects this
    /// stream never sent, so their changes and deletions go out as such.
    resumed: bool,
}

impl Writer {
    fn new(
        ctx: Ctx,
        selectors: Selectors,
        tx: mpsc::Sender<Queued>,
        room: Room,
        format: Format,
        since: Rv,
        resumed: bool,
    ) -> Self {
        Writer {
            ctx,
            selectors,
            tx,
            room,
            format,
            visible: HashSet::new(),
            last_rv: since,
            resumed,
        }
    }

    fn matches(&self, key: &Key, value: &Value) -> bool {
        self.ctx
            .target
            .name
            .as_deref()
            .is_none_or(|n| n == key.name)
            && self.selectors.matches(value)
    }

    /// Sends what the client must see of `event`. The event (its decoded
    /// object, many times its JSON) is let go once its line is written, so
    /// a watch waiting for its client holds bytes only.
    async fn send_event(&mut self, event: Arc<Event>) -> bool {
        self.last_rv = event.object.rv;
        let line = self.state_line(event.kind, &event.object.key, &event.object.value);
        drop(event);
        self.send_line(line).await
    }

    async fn send_line(&self, line: Line) -> bool {
        match line {
            Line::Nothing => true,
            Line::Event(line) => self.queue(line).await,
            Line::Error(line) => {
                let _ = self.queue(line).await;
                false
            }
        }
    }

    /// What the client must see of a change, given what it saw before.
    fn state_line(&mut self, kind: EventType, key: &Key, stored: &Value) -> Line {
        // At the version the client watches; an object that cannot be
        // converted ends the watch with an ERROR event, as kube-apiserver
        // reports a failing conversion webhook.
        let value = match self.ctx.server.present(&self.ctx.def, stored) {
            Ok(value) => value,
            Err(e) => return Line::Error(line("ERROR", &e.to_status())),
        };
        let value = value.as_ref();
        let matches = kind != EventType::Deleted && self.matches(key, value);
        // An object a resumed client may have listed, first seen here.
        let was_visible = self.visible.contains(key)
            || (self.resumed && kind != EventType::Added && self.matches(key, value));
        let sent_type = match (was_visible, matches) {
            (false, true) => {
                self.visible.insert(key.clone());
                "ADDED"
            }
            (true, true) => {
                self.visible.insert(key.clone());
                "MODIFIED"
            }
            (true, false) => {
                self.visible.remove(key);
                "DELETED"
            }
            (false, false) => return Line::Nothing,
        };
        Line::Event(line(sent_type, &self.render(value)))
    }

    fn render<'v>(&self, value: &'v Value) -> Cow<'v, Value> {
        match self.format {
            Format::Table => Cow::Owned(table::to_table(
                &self.ctx.def,
                &[value],
                None,
                table::IncludeObject::Metadata,
                now(),
            )),
            Format::Metadata => Cow::Owned(partial_metadata(value)),
            _ => Cow::Borrowed(value),
        }
    }

    fn bookmark(&self, rv: Rv, initial_end: bool) -> Value {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"kind": self.ctx.def.kind, "apiVersion": self.ctx.def.api_version(), "metadata": metadata})
    }

    async fn send_raw(&self, kind: &str, object: &Value) -> bool {
        self.queue(line(kind, object)).await
    }

    /// Queues one line; a client that has made no room for it within the
    /// server's watch send timeout ends its watch (it watches again when it
    /// reads again), as does one whose user's watches hold their whole
    /// budget while others of them wait for it already.
    async fn queue(&self, line: bytes::Bytes) -> bool {
        enqueue(
            &self.tx,
            &self.room,
            line,
            self.ctx.server.watch_send_timeout,
        )
        .await
    }
}

/// Queues `line` once the queue, and the budget of its user's watches,
/// have room for it (a line larger than either waits for all of it); false
/// if there is none within `timeout` (or at once, see [`WatchBudget::take`])
/// or the response is gone.
async fn enqueue(
    tx: &mpsc::Sender<Queued>,
    room: &Room,
    line: bytes::Bytes,
    timeout: Duration,
) -> bool {
    let share = u32::try_from(line.len().min(QUEUED_BYTES)).unwrap_or(u32::MAX);
    let queued = async {
        let queue = room.queue.clone().acquire_many_owned(share).await.ok()?;
        let user = match &room.user {
            Some(budget) => Some(budget.take(line.len()).await?),
            None => None,
        };
        let held = Held {
            _queue: queue,
            _user: user,
        };
        tx.send((line, held)).await.ok()
    };
    matches!(tokio::time::timeout(timeout, queued).await, Ok(Some(())))
}

/// One change's line for the client.
enum Line {
    /// The client does not see this change.
    Nothing,
    Event(bytes::Bytes),
    /// The watch ends with this line.
    Error(bytes::Bytes),
}

/// `{"type": kind, "object": object}` and a newline, written as
/// kube-apiserver writes it (type first), without copying `object`.
fn line(kind: &str, object: &Value) -> bytes::Bytes {
    let mut bytes = Vec::with_capacity(256);
    bytes.extend_from_slice(b"{\"type\":");
    let written = serde_json::to_writer(&mut bytes, kind).and_then(|()| {
        bytes.extend_from_slice(b",\"object\":");
        serde_json::to_writer(&mut bytes, object)
    });
    if written.is_err() {
        // Writing a JSON value to memory does not fail; were it to, no
        // half-written line goes out.
        return bytes::Bytes::new();
    }
    bytes.extend_from_slice(b"}\n");
    bytes::Bytes::from(bytes)
}

/// The response streaming the queued lines. A line's share of the queue
/// and of its user's budget is given back when the response asks for the
/// next line, not when it takes this one: the HTTP connection asks for more
/// only once it holds less than its write buffer (hyper's, about 400 KiB;
/// HTTP/2: one chunk per stream), so a line a client does not read counts
/// against its user while the connection holds it.
fn streaming(rx: mpsc::Receiver<Queued>) -> Response {
    let stream = futures_util::stream::unfold((rx, None), |(mut rx, written)| async move {
        drop::<Option<Held>>(written);
        rx.recv()
            .await
            .map(|(line, held)| (Ok::<_, std::io::Error>(line), (rx, Some(held))))
    });
    let mut response = request::stream_response("application/json", Box::pin(stream));
    *response.status_mut() = StatusCode::OK;
    response
}
