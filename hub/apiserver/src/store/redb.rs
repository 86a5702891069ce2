//! The embedded store: a redb file, an in-memory index of every object, and
//! one writer thread that group-commits.
//!
//! # Guarantees
//! - A commit is durable (fsync'd by redb) before its future resolves; a
//!   crash at any moment loses no answered write and half-applies none.
//! - Concurrent commits are batched into one transaction: one fsync serves
//!   every request waiting at that moment. Preconditions are checked on the
//!   writer thread, the single serialisation point, so they are exact.
//! - The resourceVersion counter and the watch history are stored in the same
//!   transaction as the objects, so both survive restarts.
//! - A change is written once, as an event; the objects table takes an
//!   object only when the events table lets go of its last change, so the
//!   state is the objects table with the events after it applied (see
//!   `persist` and `load`).
//! - A commit that fails on the file (a full disk, a failed fsync) is
//!   refused, and the file is opened again for the next one (redb refuses
//!   every write after an I/O error until then): once the disk has room
//!   again, writes go on without a restart. Should the reopened file hold
//!   another revision than the one served (the failed commit landed after
//!   all), writes stay refused until a restart loads it.
//!
//! Reads are served from the shared watch cache ([`super::cache`]), which
//! holds each object as the JSON the file holds.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use tokio::sync::oneshot;

use super::cache::{Cache, Change, HISTORY_BYTES, Stored, decode, set_rv};
use super::{
    CommitFuture, Event, EventType, Key, Object, Op, RawListFuture, ReturningFuture, Rv, Store,
    StoreError, Term, Watch, readable,
};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_RV: &str = "rv";

/// redb's page cache: the B-tree pages writes walk (reads never reach redb).
/// 8 MiB holds the branch pages of a store of a million objects; leaves a
/// write misses are read from the operating system's page cache.
const REDB_CACHE_BYTES: usize = 8 << 20;
/// Requests taken into one transaction at most.
const MAX_BATCH: usize = 4096;

struct Request {
    ops: Vec<Op>,
    reply: oneshot::Sender<Answer>,
}

/// A request's answer: its stored objects, or why it was refused and its
/// operations back.
type Answer = Result<Vec<Object>, (StoreError, Vec<Op>)>;

/// The embedded, crash-safe store.
pub struct RedbStore {
    cache: Arc<Cache>,
    writer: Option<mpsc::Sender<Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RedbStore {
    /// Lets the writer finish what it was given and close the file, so the
    /// store can be reopened at once.
    fn drop(&mut self) {
        self.writer.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl RedbStore {
    /// Opens (or creates) the store file at `path`, keeping `history` events
    /// for watch resumption.
    pub fn open(path: &Path, history: usize) -> Result<Self, StoreError> {
        Self::open_bounded(path, history, HISTORY_BYTES)
    }

    /// As [`RedbStore::open`], the history kept up to `history_bytes` bytes
    /// of objects as well (in memory and in the file).
    pub fn open_bounded(
        path: &Path,
        history: usize,
        history_bytes: usize,
    ) -> Result<Self, StoreError> {
        // Reads are served from the watch cache, so redb's page cache (1 GiB
        // by default) only needs the pages writes touch.
        let db = open_file(path)?;
        let cache = Arc::new(load(&db, history.max(1), history_bytes)?);
        let (writer, requests) = mpsc::channel();
        let writer_cache = cache.clone();
        let file = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || {
                let db = Reopening { file, db: Some(db) };
                write_loop(db, writer_cache, requests, history.max(1));
            })
            .map_err(|e| StoreError::Storage(format!("starting the writer: {e}")))?;
        Ok(RedbStore {
            cache,
            writer: Some(writer),
            thread: Some(thread),
        })
    }

    /// Forgets the watch history, as etcd compaction does: a watch from any
    /// resourceVersion older than the latest then fails with
    /// [`StoreError::Gone`] (410 Expired), and the client must relist. The
    /// file forgets it too, at the next commit.
    pub fn compact(&self) {
        self.cache.compact(Rv::MAX);
    }
}

/// The store's redb file, created if absent.
fn open_file(path: &Path) -> Result<Database, StoreError> {
    redb::Builder::new()
        .set_cache_size(REDB_CACHE_BYTES)
        .create(path)
        .map_err(storage)
}

/// The writer's database, opened again after a failed commit: redb refuses
/// every write after an I/O error (a full disk, a failed fsync) until the
/// file is reopened, so without this one full disk would stop the store's
/// writes for good, even once there is room again.
struct Reopening {
    file: std::path::PathBuf,
    /// `None` while the file cannot be opened again, or after it was found
    /// to differ from what the store serves.
    db: Option<Database>,
}

impl Reopening {
    /// The open database, opening it again if a failed commit closed it;
    /// only a file at `served` (the revision the store's cache holds) is
    /// used, anything else would serve writes the cache does not know.
    fn get(&mut self, served: Rv) -> Result<&Database, StoreError> {
        if self.db.is_none() {
            let db = open_file(&self.file)?;
            let stored = stored_revision(&db)?;
            if stored != served {
                return Err(StoreError::Storage(format!(
                    "the store file holds revision {stored} after a failed commit, the store serves {served}: restart to load it"
                )));
            }
            tracing::info!(
                revision = stored,
                "store file opened again after a failed commit"
            );
            self.db = Some(db);
        }
        self.db
            .as_ref()
            .ok_or_else(|| StoreError::Storage("the store file is not open".into()))
    }

    /// After a failed commit: closes the file, so that the next batch opens
    /// it again and finds whether it is still at the served revision.
    fn failed(&mut self) {
        self.db = None;
    }
}

fn stored_revision(db: &Database) -> Result<Rv, StoreError> {
    let read = db.begin_read().map_err(storage)?;
    let rv = read
        .open_table(META)
        .map_err(storage)?
        .get(META_RV)
        .map_err(storage)?
        .map(|v| v.value())
        .unwrap_or(0);
    Ok(rv)
}

fn storage(e: impl std::fmt::Display) -> StoreError {
    StoreError::Storage(e.to_string())
}

fn load(db: &Database, history_cap: usize, history_budget: usize) -> Result<Cache, StoreError> {
    let txn = db.begin_write().map_err(storage)?;
    // Make sure the tables exist, so that reads of a new file succeed.
    {
        txn.open_table(OBJECTS).map_err(storage)?;
        txn.open_table(EVENTS).map_err(storage)?;
        txn.open_table(META).map_err(storage)?;
    }
    txn.commit().map_err(storage)?;

    let rv = stored_revision(db)?;
    let read = db.begin_read().map_err(storage)?;
    let mut objects = BTreeMap::new();
    for entry in read
        .open_table(OBJECTS)
        .map_err(storage)?
        .iter()
        .map_err(storage)?
    {
        let (k, v) = entry.map_err(storage)?;
        let key = Key::decode(k.value())
            .ok_or_else(|| StoreError::Storage(format!("bad key {:?}", k.value())))?;
        let value: Value = serde_json::from_slice(v.value()).map_err(storage)?;
        let stored = Stored {
            rv: object_rv(&value),
            bytes: v.value().into(),
        };
        objects.insert(key, stored);
    }
    // The objects table holds each object as of the last change the
    // events table let go of it (see `persist`); the events since are the
    // rest, applied in order.
    let events = read.open_table(EVENTS).map_err(storage)?;
    for entry in events.iter().map_err(storage)? {
        let (rv, bytes) = entry.map_err(storage)?;
        let (kind, key, object) = event_parts(rv.value(), bytes.value())?;
        match kind {
            EventType::Deleted => {
                objects.remove(&key);
            }
            _ => {
                let stored = Stored {
                    rv: rv.value(),
                    bytes: object.as_ref().into(),
                };
                objects.insert(key, stored);
            }
        }
    }
    // The newest events first, as many as the history keeps.
    let mut history = VecDeque::new();
    let mut history_bytes = 0;
    for entry in events.iter().map_err(storage)?.rev() {
        if history.len() >= history_cap || history_bytes > history_budget {
            break;
        }
        let (rv, bytes) = entry.map_err(storage)?;
        let rv = rv.value();
        let (kind, key, object) = event_parts(rv, bytes.value())?;
        // The latest event of an object shares the object's bytes.
        let bytes = match objects.get(&key) {
            Some(stored) if stored.rv == rv => stored.bytes.clone(),
            _ => object.as_ref().into(),
        };
        history_bytes += bytes.len();
        history.push_front(Change {
            kind,
            key,
            rv,
            bytes,
            value: None,
        });
    }
    Ok(Cache::bounded(
        objects,
        rv,
        history,
        history_cap,
        history_budget,
    ))
}

fn object_rv(value: &Value) -> Rv {
    value
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// `{"type": ..., "key": ..., "object": ...}` around the object's JSON,
/// which the caller has already encoded.
fn encode_event(kind: EventType, key: &Key, object_json: &[u8]) -> Result<Vec<u8>, StoreError> {
    let mut out = event_head(kind, key)?;
    out.reserve(object_json.len() + 1);
    out.extend_from_slice(object_json);
    out.push(b'}');
    Ok(out)
}

/// What an event record holds before its object's JSON.
fn event_head(kind: EventType, key: &Key) -> Result<Vec<u8>, StoreError> {
    let key = serde_json::to_string(&key.encode()).map_err(storage)?;
    let kind = kind.as_str();
    let mut out = Vec::with_capacity(key.len() + 40);
    out.extend_from_slice(br#"{"type":""#);
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(br#"","key":"#);
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(br#","object":"#);
    Ok(out)
}

/// An event record's kind, key and object JSON, read without decoding the
/// object (a record written as [`encode_event`] writes it), else decoded
/// and the object encoded again.
fn event_parts(
    rv: Rv,
    bytes: &[u8],
) -> Result<(EventType, Key, std::borrow::Cow<'_, [u8]>), StoreError> {
    let head = || -> Option<(EventType, Key, &[u8])> {
        let rest = bytes.strip_prefix(br#"{"type":""#)?;
        let kind = [EventType::Added, EventType::Modified, EventType::Deleted]
            .into_iter()
            .find(|k| rest.starts_with(k.as_str().as_bytes()))?;
        let rest = rest[kind.as_str().len()..].strip_prefix(br#"","key":"#)?;
        let mut strings = serde_json::Deserializer::from_slice(rest).into_iter::<String>();
        let key = Key::decode(&strings.next()?.ok()?)?;
        let object = rest[strings.byte_offset()..]
            .strip_prefix(br#","object":"#)?
            .strip_suffix(b"}")?;
        Some((kind, key, object))
    };
    if let Some((kind, key, object)) = head() {
        return Ok((kind, key, object.into()));
    }
    let event = decode_event(rv, bytes)?;
    let object = serde_json::to_vec(&*event.object.value).map_err(storage)?;
    Ok((event.kind, event.object.key, object.into()))
}

fn decode_event(rv: Rv, bytes: &[u8]) -> Result<Event, StoreError> {
    let mut v: Value = serde_json::from_slice(bytes).map_err(storage)?;
    let kind = match v.get("type").and_then(Value::as_str) {
        Some("ADDED") => EventType::Added,
        Some("MODIFIED") => EventType::Modified,
        Some("DELETED") => EventType::Deleted,
        other => return Err(StoreError::Storage(format!("bad event type {other:?}"))),
    };
    let key = v
        .get("key")
        .and_then(Value::as_str)
        .and_then(Key::decode)
        .ok_or_else(|| StoreError::Storage("event without key".into()))?;
    let object = v.get_mut("object").map(Value::take).unwrap_or(Value::Null);
    Ok(Event {
        kind,
        object: Object {
            key,
            rv,
            value: Arc::new(object),
        },
    })
}

/// Staged effect of one request on the state, before commit.
struct Staged {
    events: Vec<Arc<Event>>,
    results: Vec<Object>,
}

fn write_loop(
    mut db: Reopening,
    cache: Arc<Cache>,
    requests: mpsc::Receiver<Request>,
    history: usize,
) {
    while let Ok(first) = requests.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match requests.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }

        // Stage every request against the state plus the requests before it.
        // The writer is the cache's only writer, so its revision is ours.
        let (mut rv, mut overlay) = (cache.revision(), BTreeMap::<Key, Option<Object>>::new());
        let mut outcomes: Vec<Result<Staged, (StoreError, Vec<Op>)>> =
            Vec::with_capacity(batch.len());
        for request in &mut batch {
            let ops = std::mem::take(&mut request.ops);
            let outcome = stage(&cache, &mut overlay, &mut rv, ops);
            outcomes.push(outcome);
        }

        let committed = if outcomes.iter().all(Result::is_err) {
            Ok(Vec::new())
        } else {
            let served = cache.revision();
            let floor = cache.history_floor();
            let committed = db.get(served).and_then(|db| {
                persist(db, &outcomes, rv, history, floor, |k| cache.revision_of(k))
            });
            if committed.is_err() {
                db.failed();
            }
            committed
        };
        match committed {
            Ok(encoded) => {
                let mut encoded = encoded.into_iter();
                let mut changes = Vec::new();
                for staged in outcomes.iter().flatten() {
                    for event in &staged.events {
                        let Some(bytes) = encoded.next() else { break };
                        changes.push(Change {
                            kind: event.kind,
                            key: event.object.key.clone(),
                            rv: event.object.rv,
                            bytes,
                            value: Some(event.object.value.clone()),
                        });
                    }
                }
                cache.apply(changes, rv);
                for (request, outcome) in batch.into_iter().zip(outcomes) {
                    let _ = request.reply.send(outcome.map(|s| s.results));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "store commit failed");
                // Those refused before the write keep their own answer.
                for (request, outcome) in batch.into_iter().zip(outcomes) {
                    let answer = match outcome {
                        Ok(_) => Err((e.clone(), Vec::new())),
                        Err(refused) => Err(refused),
                    };
                    let _ = request.reply.send(answer);
                }
            }
        }
    }
}

/// An object's state before an op, as the plan sees it.
enum Cur<'a> {
    /// Written by an earlier op of the same request: its revision, and its
    /// place among the request's results.
    Earlier(Rv, usize),
    /// Written earlier in the same batch.
    Staged(&'a Object),
    /// As the cache holds it.
    Stored(Stored),
}

impl Cur<'_> {
    fn rv(&self) -> Rv {
        match self {
            Cur::Earlier(rv, _) => *rv,
            Cur::Staged(o) => o.rv,
            Cur::Stored(s) => s.rv,
        }
    }
}

/// Where a deletion finds the object's last state.
enum Last {
    /// The result of an earlier op of the same request.
    Earlier(usize),
    Value(Arc<Value>),
}

/// What an op will do, once every op of its request is known to succeed.
struct Step {
    kind: EventType,
    rv: Rv,
    /// A deletion's last state.
    last: Option<Last>,
}

/// Checks one request's ops against the state plus the batch's earlier
/// requests, without consuming them: each op's step (`None`: a removal of
/// nothing), or why the request is refused.
fn plan(
    cache: &Cache,
    overlay: &BTreeMap<Key, Option<Object>>,
    rv: Rv,
    ops: &[Op],
) -> Result<Vec<Option<Step>>, StoreError> {
    // Keys written by the ops before: their revision and result, or None
    // once deleted.
    let mut local: Vec<(&Key, Option<(Rv, usize)>)> = Vec::with_capacity(ops.len());
    let mut next = rv;
    let mut steps = Vec::with_capacity(ops.len());
    // Results so far (a removal of nothing has none).
    let mut results = 0;
    for op in ops {
        let key = op.key();
        if !key.is_storable() {
            return Err(StoreError::InvalidKey(key.clone()));
        }
        // The current state: earlier in this request, in this batch, else
        // the cache's (its value decoded only if a deletion needs it).
        let current: Option<Cur> = match local.iter().rev().find(|(k, _)| *k == key) {
            Some((_, o)) => o.map(|(rv, at)| Cur::Earlier(rv, at)),
            None => match overlay.get(key) {
                Some(o) => o.as_ref().map(Cur::Staged),
                None => cache.stored(key).map(Cur::Stored),
            },
        };
        let check = |expected: &Option<Rv>| -> Result<&Cur, StoreError> {
            let current = current
                .as_ref()
                .ok_or_else(|| StoreError::NotFound(key.clone()))?;
            match expected {
                Some(e) if *e != current.rv() => Err(StoreError::Conflict {
                    key: key.clone(),
                    expected: *e,
                    current: current.rv(),
                }),
                _ => Ok(current),
            }
        };
        let (kind, last) = match op {
            Op::Put { .. } if current.is_some() => (EventType::Modified, None),
            Op::Put { .. } => (EventType::Added, None),
            Op::Create { .. } if current.is_some() => {
                return Err(StoreError::AlreadyExists(key.clone()));
            }
            Op::Create { .. } => (EventType::Added, None),
            Op::Update { expected, .. } => {
                check(expected)?;
                (EventType::Modified, None)
            }
            Op::Remove { .. } if current.is_none() => {
                steps.push(None);
                continue;
            }
            Op::Delete { expected, .. } => (
                EventType::Deleted,
                Some(last(cache, key, check(expected)?)?),
            ),
            Op::Remove { .. } => (EventType::Deleted, Some(last(cache, key, check(&None)?)?)),
        };
        next += 1;
        local.push((key, (kind != EventType::Deleted).then_some((next, results))));
        steps.push(Some(Step {
            kind,
            rv: next,
            last,
        }));
        results += 1;
    }
    Ok(steps)
}

/// The last state of an object a deletion removes.
fn last(cache: &Cache, key: &Key, current: &Cur) -> Result<Last, StoreError> {
    match current {
        Cur::Earlier(_, at) => Ok(Last::Earlier(*at)),
        Cur::Staged(o) => Ok(Last::Value(o.value.clone())),
        Cur::Stored(s) => cache
            .get(key)
            .filter(|o| o.rv == s.rv)
            .or_else(|| decode(key, s.rv, &s.bytes))
            .map(|o| Last::Value(o.value))
            .ok_or_else(|| {
                StoreError::Storage(format!("{key}: the stored object does not decode"))
            }),
    }
}

/// Checks and applies one request's ops to the overlay; on any failure the
/// overlay and `rv` are left as they were and the ops are handed back.
fn stage(
    cache: &Cache,
    overlay: &mut BTreeMap<Key, Option<Object>>,
    rv: &mut Rv,
    ops: Vec<Op>,
) -> Result<Staged, (StoreError, Vec<Op>)> {
    let steps = match plan(cache, overlay, *rv, &ops) {
        Ok(steps) => steps,
        Err(e) => return Err((e, ops)),
    };
    let mut local: Vec<(Key, Option<Object>)> = Vec::with_capacity(ops.len());
    let mut events = Vec::with_capacity(ops.len());
    let mut results: Vec<Object> = Vec::with_capacity(ops.len());
    for (op, step) in ops.into_iter().zip(steps) {
        let Some(step) = step else { continue };
        let key = op.key().clone();
        let mut value = match (op, step.last) {
            (Op::Put { value, .. } | Op::Create { value, .. } | Op::Update { value, .. }, _) => {
                value
            }
            (_, Some(Last::Earlier(at))) => results
                .get(at)
                .map_or(Value::Null, |o| o.value.as_ref().clone()),
            (_, Some(Last::Value(v))) => v.as_ref().clone(),
            // The plan gives every deletion its last state.
            (_, None) => Value::Null,
        };
        set_rv(&mut value, step.rv);
        let object = Object {
            key: key.clone(),
            rv: step.rv,
            value: Arc::new(value),
        };
        local.push((
            key,
            (step.kind != EventType::Deleted).then(|| object.clone()),
        ));
        results.push(object.clone());
        events.push(Arc::new(Event {
            kind: step.kind,
            object,
        }));
        *rv = step.rv;
    }
    overlay.extend(local);
    Ok(Staged { events, results })
}

/// Writes the staged events, and forgets those at or below `floor` (which
/// the cache's history no longer holds) or beyond the newest `history`;
/// returns each event's object JSON, in order.
///
/// A change is written once, as its event: the objects table is written
/// only as events are forgotten, with the objects whose forgotten change
/// is still their latest (and without those a forgotten change deleted).
/// So an object written again while its last change is in the history (a
/// TrainJob's status, a pod's phase) costs one B-tree write, not two; the
/// objects table and the events after it are the state (see [`load`]).
/// `latest`: an object's revision in the cache, before this batch.
fn persist(
    db: &Database,
    outcomes: &[Result<Staged, (StoreError, Vec<Op>)>],
    rv: Rv,
    history: usize,
    floor: Rv,
    latest: impl Fn(&Key) -> Option<Rv>,
) -> Result<Vec<Arc<[u8]>>, StoreError> {
    let mut encoded = Vec::new();
    // What this batch leaves of the objects it writes.
    let mut written: std::collections::HashMap<&Key, Option<Rv>> = std::collections::HashMap::new();
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut events = txn.open_table(EVENTS).map_err(storage)?;
        for staged in outcomes.iter().flatten() {
            for event in &staged.events {
                let object_json = serde_json::to_vec(&*event.object.value).map_err(storage)?;
                let bytes = encode_event(event.kind, &event.object.key, &object_json)?;
                events
                    .insert(event.object.rv, bytes.as_slice())
                    .map_err(storage)?;
                let kept = (event.kind != EventType::Deleted).then_some(event.object.rv);
                written.insert(&event.object.key, kept);
                encoded.push(object_json.into());
            }
        }
        // Keep the newest `history` events, and none the cache dropped;
        // what the forgotten ones leave goes into the objects table.
        let floor = rv.saturating_sub(history as u64).max(floor);
        if floor > 0 {
            let latest = |key: &Key| match written.get(key) {
                Some(kept) => *kept,
                None => latest(key),
            };
            let mut settled: Vec<(Key, Option<Vec<u8>>)> = Vec::new();
            let mut failed = None;
            events
                .retain_in(..=floor, |at, bytes| {
                    match event_parts(at, bytes) {
                        Ok((EventType::Deleted, key, _)) => settled.push((key, None)),
                        Ok((_, key, object)) if latest(&key) == Some(at) => {
                            settled.push((key, Some(object.into_owned())));
                        }
                        Ok(_) => {}
                        Err(e) => failed = Some(e),
                    }
                    false
                })
                .map_err(storage)?;
            if let Some(e) = failed {
                return Err(e);
            }
            let mut objects = txn.open_table(OBJECTS).map_err(storage)?;
            for (key, object) in settled {
                let key = key.encode();
                match object {
                    Some(json) => objects.insert(key.as_str(), json.as_slice()),
                    None => objects.remove(key.as_str()),
                }
                .map_err(storage)?;
            }
        }
        txn.open_table(META)
            .map_err(storage)?
            .insert(META_RV, rv)
            .map_err(storage)?;
    }
    txn.commit().map_err(storage)?;
    Ok(encoded)
}

impl Store for RedbStore {
    fn get(&self, key: &Key) -> Option<Object> {
        self.cache.get(key)
    }

    fn revision_of(&self, key: &Key) -> Option<Rv> {
        self.cache.revision_of(key)
    }

    fn get_raw(&self, key: &Key) -> Option<(Rv, Arc<[u8]>)> {
        self.cache.stored(key).map(|s| (s.rv, s.bytes))
    }

    fn keep_written(&self, resource: &str) {
        self.cache.keep_written(resource);
    }

    fn list(&self, resource: &str, namespace: Option<&str>) -> (Vec<Object>, Rv) {
        self.cache.list(resource, namespace)
    }

    /// The latest state whatever `at` asks: redb keeps no old versions.
    fn list_raw(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        _at: Option<Rv>,
    ) -> RawListFuture<'_> {
        let latest = self.cache.list_raw(resource, namespace, after);
        Box::pin(async move { Ok(latest) })
    }

    fn commit(&self, ops: Vec<Op>) -> CommitFuture<'_> {
        let commit = self.commit_or_return(ops);
        Box::pin(async move { commit.await.map_err(|(e, _)| e) })
    }

    fn commit_or_return(&self, ops: Vec<Op>) -> ReturningFuture<'_> {
        if let Err(e) = readable(&ops) {
            return Box::pin(async move { Err((e, ops)) });
        }
        let stopped = || StoreError::Storage("the store writer has stopped".into());
        let (reply, answer) = oneshot::channel();
        let sent = match &self.writer {
            Some(writer) => writer
                .send(Request { ops, reply })
                .map_err(|mpsc::SendError(r)| r.ops),
            None => Err(ops),
        };
        Box::pin(async move {
            sent.map_err(|ops| (stopped(), ops))?;
            answer.await.map_err(|_| (stopped(), Vec::new()))?
        })
    }

    fn watch(
        &self,
        resource: &str,
        namespace: Option<&str>,
        since: Option<Rv>,
    ) -> Result<Watch, StoreError> {
        self.cache.watch(resource, namespace, since)
    }

    fn revision(&self) -> Rv {
        self.cache.revision()
    }

    fn fenced(self: Arc<Self>, _term: Term) -> Arc<dyn Store> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::STORE_READABLE_DEPTH;
    use crate::store::suite;

    /// A store in its own directory (the store is dropped first).
    struct Temp {
        store: RedbStore,
        _dir: tempfile::TempDir,
    }

    impl std::ops::Deref for Temp {
        type Target = RedbStore;
        fn deref(&self) -> &RedbStore {
            &self.store
        }
    }

    async fn temp() -> Temp {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(&dir.path().join("s.redb"), 1000).expect("open");
        Temp { store, _dir: dir }
    }

    #[tokio::test]
    async fn the_store_suite_passes_on_redb() {
        suite::run_all(temp).await;
        let store = temp().await;
        suite::a_compacted_version_is_gone(&*store, |_| async { store.compact() }).await;
    }

    fn key(name: &str) -> Key {
        Key::new("trainer.kubeflow.org/trainjobs", Some("default"), name)
    }

    /// Ops of one commit see the ones before them: a deletion answers the
    /// state an earlier op of the same commit wrote, and an op after it
    /// finds the object gone.
    #[tokio::test]
    async fn an_op_sees_the_ops_before_it_in_its_commit() {
        let store = temp().await;
        let mut put = job("a");
        put["spec"] = 1.into();
        let done = store
            .commit(vec![
                // A removal of nothing, which has no result.
                Op::Remove { key: key("zz") },
                Op::Put {
                    key: key("a"),
                    value: put,
                },
                Op::Delete {
                    key: key("a"),
                    expected: Some(1),
                },
                Op::Remove { key: key("a") },
                Op::Create {
                    key: key("a"),
                    value: job("a"),
                },
            ])
            .await
            .expect("commit");
        let seen: Vec<_> = done
            .iter()
            .map(|o| (o.rv, o.value["spec"].clone()))
            .collect();
        assert_eq!(seen, [(1, 1.into()), (2, 1.into()), (3, Value::Null)]);
        assert_eq!(store.get(&key("a")).expect("a").rv, 3);
        // A refused op after them hands every op back and writes nothing.
        let (e, back) = store
            .commit_or_return(vec![
                Op::Remove { key: key("a") },
                Op::Delete {
                    key: key("a"),
                    expected: None,
                },
            ])
            .await
            .expect_err("the second deletion finds nothing");
        assert_eq!(e, StoreError::NotFound(key("a")));
        assert_eq!(back.len(), 2);
        assert_eq!(store.revision(), 3);
    }

    fn job(name: &str) -> Value {
        serde_json::json!({"metadata": {"name": name, "namespace": "default"}})
    }

    #[tokio::test]
    async fn put_creates_or_replaces_and_remove_ignores_absent_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(&dir.path().join("store.redb"), 100).expect("open");
        let mut watch = store
            .watch("trainer.kubeflow.org/trainjobs", None, Some(0))
            .expect("watch");
        let put = |v: Value| Op::Put {
            key: key("a"),
            value: v,
        };
        store.commit(vec![put(job("a"))]).await.expect("put new");
        let mut replaced = job("a");
        replaced["spec"] = serde_json::json!({"x": 1});
        store.commit(vec![put(replaced)]).await.expect("put again");
        assert_eq!(store.get(&key("a")).expect("a").value["spec"]["x"], 1);
        // Removing an absent key writes nothing and is no error.
        let none = store
            .commit(vec![Op::Remove { key: key("zz") }])
            .await
            .expect("remove absent");
        assert!(none.is_empty());
        store
            .commit(vec![Op::Remove { key: key("a") }])
            .await
            .expect("remove a");
        assert!(store.get(&key("a")).is_none());
        let mut kinds = Vec::new();
        for _ in 0..3 {
            kinds.push(watch.live.recv().await.expect("event").kind);
        }
        assert_eq!(
            kinds,
            [EventType::Added, EventType::Modified, EventType::Deleted]
        );
        assert_eq!(store.revision(), 3);
    }

    /// A job whose whole depth is `levels` (its spec holds the nesting).
    fn deep_job(name: &str, levels: usize) -> Value {
        let mut spec = Value::from(1);
        for _ in 1..levels {
            spec = Value::Array(vec![spec]);
        }
        let mut job = job(name);
        job["spec"] = spec;
        assert_eq!(crate::limits::depth(&job), levels);
        job
    }

    #[tokio::test]
    async fn what_the_store_accepts_it_reads_back_after_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        {
            let store = RedbStore::open(&path, 100).expect("open");
            let deepest = deep_job("deepest", STORE_READABLE_DEPTH);
            store
                .commit(vec![Op::Create {
                    key: key("deepest"),
                    value: deepest,
                }])
                .await
                .expect("the deepest readable object is stored");
            let e = store
                .commit(vec![Op::Put {
                    key: key("deeper"),
                    value: deep_job("deeper", STORE_READABLE_DEPTH + 1),
                }])
                .await
                .expect_err("one level more is refused");
            assert!(
                e.to_string().contains("more than the store can read back"),
                "{e}"
            );
        }
        let store = RedbStore::open(&path, 100).expect("reopen: every object and event decodes");
        let object = store.get(&key("deepest")).expect("deepest");
        assert_eq!(crate::limits::depth(&object.value), STORE_READABLE_DEPTH);
        assert!(store.get(&key("deeper")).is_none());
        let watch = store
            .watch("trainer.kubeflow.org/trainjobs", None, Some(0))
            .expect("watch");
        assert_eq!(watch.replay.len(), 1);
    }

    #[tokio::test]
    async fn numbers_read_back_exactly_after_a_reopen() {
        // Found by the property tests: without serde_json's float_roundtrip
        // these read back one ulp off.
        let numbers =
            serde_json::json!([8.053220295982734e151, -4.0463105740735334e246, 0.1, 1e-300]);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let mut value = job("n");
        value["spec"] = numbers.clone();
        {
            let store = RedbStore::open(&path, 100).expect("open");
            store
                .commit(vec![Op::Create {
                    key: key("n"),
                    value,
                }])
                .await
                .expect("create");
        }
        let store = RedbStore::open(&path, 100).expect("reopen");
        assert_eq!(store.get(&key("n")).expect("n").value["spec"], numbers);
    }

    #[tokio::test]
    async fn keys_that_would_read_back_as_others_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let store = RedbStore::open(&path, 100).expect("open");
        // "a|b" / "c" would be stored as "...|a|b|c" and read back as "a" / "b|c".
        for key in [
            Key::new("trainer.kubeflow.org/trainjobs", Some("a|b"), "c"),
            Key::new("trainer.kubeflow.org/trainjobs", Some("a"), "b|c"),
            Key::new("trainer.kubeflow.org/trainjobs", Some("a"), "b/c"),
            Key::new("trainer.kubeflow.org/trainjobs", Some("a/b"), "c"),
        ] {
            let e = store
                .commit(vec![Op::Create {
                    key: key.clone(),
                    value: job("c"),
                }])
                .await
                .unwrap_err();
            assert_eq!(e, StoreError::InvalidKey(key));
        }
        // A refused op refuses its whole commit.
        let e = store
            .commit(vec![
                Op::Create {
                    key: key("ok"),
                    value: job("ok"),
                },
                Op::Put {
                    key: Key::new("pods", Some("x|y"), "p"),
                    value: job("p"),
                },
            ])
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::InvalidKey(_)), "{e}");
        assert!(store.get(&key("ok")).is_none());
        assert_eq!(store.revision(), 0);
    }

    #[tokio::test]
    async fn writes_survive_reopen_and_rv_stays_monotonic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let last = {
            let store = RedbStore::open(&path, 100).expect("open");
            store
                .commit(vec![Op::Create {
                    key: key("a"),
                    value: job("a"),
                }])
                .await
                .expect("create a");
            let b = store
                .commit(vec![Op::Create {
                    key: key("b"),
                    value: job("b"),
                }])
                .await
                .expect("create b");
            store
                .commit(vec![Op::Delete {
                    key: key("a"),
                    expected: None,
                }])
                .await
                .expect("delete a");
            assert_eq!(b[0].rv, 2);
            store.revision()
        };
        let store = RedbStore::open(&path, 100).expect("reopen");
        assert_eq!(store.revision(), last);
        let (items, rv) = store.list("trainer.kubeflow.org/trainjobs", Some("default"));
        assert_eq!(rv, 3);
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].value["metadata"]["resourceVersion"], "2");
        let c = store
            .commit(vec![Op::Create {
                key: key("c"),
                value: job("c"),
            }])
            .await
            .expect("create c");
        assert_eq!(c[0].rv, 4, "resourceVersion continues after a restart");
        // The history survived too: a watch from rv 1 replays b, the deletion of a, and c.
        let watch = store
            .watch("trainer.kubeflow.org/trainjobs", None, Some(1))
            .expect("watch");
        let replay: Vec<_> = watch
            .replay
            .iter()
            .map(|e| (e.kind, e.object.key.name.clone(), e.object.rv))
            .collect();
        assert_eq!(
            replay,
            [
                (EventType::Added, "b".into(), 2),
                (EventType::Deleted, "a".into(), 3),
                (EventType::Added, "c".into(), 4)
            ]
        );
    }

    #[tokio::test]
    async fn preconditions_are_exact() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(&dir.path().join("s.redb"), 100).expect("open");
        store
            .commit(vec![Op::Create {
                key: key("a"),
                value: job("a"),
            }])
            .await
            .expect("create");
        assert_eq!(
            store
                .commit(vec![Op::Create {
                    key: key("a"),
                    value: job("a")
                }])
                .await
                .unwrap_err(),
            StoreError::AlreadyExists(key("a"))
        );
        assert!(matches!(
            store
                .commit(vec![Op::Update {
                    key: key("a"),
                    value: job("a"),
                    expected: Some(7)
                }])
                .await,
            Err(StoreError::Conflict {
                expected: 7,
                current: 1,
                ..
            })
        ));
        assert!(matches!(
            store
                .commit(vec![Op::Delete {
                    key: key("zz"),
                    expected: None
                }])
                .await,
            Err(StoreError::NotFound(_))
        ));
        // An atomic pair where the second fails writes nothing.
        let err = store
            .commit(vec![
                Op::Create {
                    key: key("b"),
                    value: job("b"),
                },
                Op::Create {
                    key: key("a"),
                    value: job("a"),
                },
            ])
            .await;
        assert!(err.is_err());
        assert!(store.get(&key("b")).is_none());
        assert_eq!(store.revision(), 1);
    }

    #[tokio::test]
    async fn concurrent_creates_are_group_committed_without_loss() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(RedbStore::open(&dir.path().join("s.redb"), 10_000).expect("open"));
        let mut tasks = Vec::new();
        for i in 0..200 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store
                    .commit(vec![Op::Create {
                        key: key(&format!("j{i}")),
                        value: job(&format!("j{i}")),
                    }])
                    .await
            }));
        }
        let mut rvs = Vec::new();
        for t in tasks {
            rvs.push(t.await.expect("task").expect("create")[0].rv);
        }
        rvs.sort();
        rvs.dedup();
        assert_eq!(rvs.len(), 200, "every create got its own resourceVersion");
        assert_eq!(
            store.list("trainer.kubeflow.org/trainjobs", None).0.len(),
            200
        );
    }

    #[tokio::test]
    async fn a_compacted_version_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(&dir.path().join("s.redb"), 3).expect("open");
        for i in 0..10 {
            store
                .commit(vec![Op::Create {
                    key: key(&format!("j{i}")),
                    value: job("x"),
                }])
                .await
                .expect("create");
        }
        assert!(matches!(
            store.watch("trainer.kubeflow.org/trainjobs", None, Some(2)),
            Err(StoreError::Gone { .. })
        ));
        let ok = store
            .watch("trainer.kubeflow.org/trainjobs", None, Some(7))
            .expect("recent version");
        assert_eq!(ok.replay.len(), 3);
    }

    #[tokio::test]
    async fn the_history_in_the_file_is_bounded_by_bytes_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        let padded = |i: usize| {
            let mut value = job("x");
            value["spec"]["padding"] = "p".repeat(2000).into();
            value["metadata"]["labels"] = serde_json::json!({"i": i.to_string()});
            value
        };
        let size = serde_json::to_vec(&padded(0)).expect("json").len() + 40;
        let events_on_disk = |path: &Path| {
            let db = open_file(path).expect("reopen");
            let read = db.begin_read().expect("read");
            read.open_table(EVENTS)
                .expect("events")
                .iter()
                .expect("iter")
                .count()
        };
        {
            // Room for about four such objects, for a thousand by count.
            let store = RedbStore::open_bounded(&path, 1000, 4 * size).expect("open");
            for i in 0..30 {
                store
                    .commit(vec![Op::Put {
                        key: key("big"),
                        value: padded(i),
                    }])
                    .await
                    .expect("put");
            }
            assert!(matches!(
                store.watch("trainer.kubeflow.org/trainjobs", None, Some(10)),
                Err(StoreError::Gone { .. })
            ));
            let recent = store
                .watch("trainer.kubeflow.org/trainjobs", None, Some(27))
                .expect("recent version");
            assert_eq!(recent.replay.len(), 3);
        }
        let held = events_on_disk(&path);
        assert!(
            (3..=6).contains(&held),
            "{held} events kept in the file, not all 30"
        );
        // Reopened, the history is what the file kept, within the bound.
        let store = RedbStore::open_bounded(&path, 1000, 4 * size).expect("reopen");
        assert!(
            store
                .watch("trainer.kubeflow.org/trainjobs", None, Some(10))
                .is_err()
        );
        let recent = store
            .watch("trainer.kubeflow.org/trainjobs", None, Some(27))
            .expect("recent version");
        assert_eq!(recent.replay.len(), 3);
        assert_eq!(
            store.get(&key("big")).expect("stored").value["metadata"]["labels"]["i"],
            "29"
        );
    }

    /// One step of a history of writes: a commit of puts and removes (of
    /// keys `k0`..`k3`), or the store closed and opened again.
    #[derive(Debug, Clone)]
    enum Step {
        Commit(Vec<(u8, Option<i64>)>),
        Reopen,
    }

    fn steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
        use proptest::prelude::*;
        let write = (0u8..4, prop::option::weighted(0.75, 0i64..1000));
        let step = prop_oneof![
            8 => prop::collection::vec(write, 1..4).prop_map(Step::Commit),
            1 => Just(Step::Reopen),
        ];
        prop::collection::vec(step, 1..40)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Whatever the history keeps (one change or a thousand), a store
        /// opened again holds exactly what was committed: the objects table,
        /// written only as changes leave the history, and the changes since.
        #[test]
        fn a_reopened_store_holds_what_was_committed_whatever_the_history_keeps(
            history in proptest::sample::select(vec![1usize, 2, 5, 1000]),
            steps in steps(),
        ) {
            use proptest::prelude::*;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("s.redb");
            let mut store = RedbStore::open(&path, history).expect("open");
            let mut model: BTreeMap<String, i64> = BTreeMap::new();
            let held = |store: &RedbStore| -> BTreeMap<String, i64> {
                store
                    .list("trainer.kubeflow.org/trainjobs", None)
                    .0
                    .into_iter()
                    .map(|o| (o.key.name.clone(), o.value["spec"]["v"].as_i64().unwrap_or(-1)))
                    .collect()
            };
            for step in steps {
                match step {
                    Step::Commit(writes) => {
                        // One op per key and commit, the last one kept.
                        let mut ops: BTreeMap<u8, Option<i64>> = BTreeMap::new();
                        ops.extend(writes);
                        let ops: Vec<Op> = ops
                            .into_iter()
                            .map(|(k, v)| {
                                let name = format!("k{k}");
                                match v {
                                    Some(v) => {
                                        model.insert(name.clone(), v);
                                        let mut value = job(&name);
                                        value["spec"] = serde_json::json!({"v": v});
                                        Op::Put { key: key(&name), value }
                                    }
                                    None => {
                                        model.remove(&name);
                                        Op::Remove { key: key(&name) }
                                    }
                                }
                            })
                            .collect();
                        runtime.block_on(store.commit(ops)).expect("commit");
                    }
                    Step::Reopen => {
                        let rv = store.revision();
                        drop(store);
                        store = RedbStore::open(&path, history).expect("reopen");
                        prop_assert_eq!(store.revision(), rv);
                    }
                }
                prop_assert_eq!(held(&store), model.clone());
            }
            let rv = store.revision();
            drop(store);
            let store = RedbStore::open(&path, history).expect("reopen");
            prop_assert_eq!(store.revision(), rv);
            prop_assert_eq!(held(&store), model);
        }
    }

    /// A file written before the objects table was written lazily (every
    /// change written to both tables) reads back the same.
    #[test]
    fn a_file_with_every_object_in_its_objects_table_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        {
            let db = open_file(&path).expect("create");
            let txn = db.begin_write().expect("txn");
            {
                let mut objects = txn.open_table(OBJECTS).expect("objects");
                let mut events = txn.open_table(EVENTS).expect("events");
                let mut write = |rv: Rv, kind: EventType, name: &str, v: i64| {
                    let mut value = job(name);
                    value["spec"] = serde_json::json!({"v": v});
                    set_rv(&mut value, rv);
                    let json = serde_json::to_vec(&value).expect("json");
                    let k = key(name);
                    match kind {
                        EventType::Deleted => objects.remove(k.encode().as_str()).map(drop),
                        _ => objects
                            .insert(k.encode().as_str(), json.as_slice())
                            .map(drop),
                    }
                    .expect("object");
                    let event = encode_event(kind, &k, &json).expect("event");
                    events.insert(rv, event.as_slice()).expect("event");
                };
                write(1, EventType::Added, "a", 1);
                write(2, EventType::Added, "b", 2);
                write(3, EventType::Modified, "a", 3);
                write(4, EventType::Deleted, "b", 2);
            }
            txn.open_table(META)
                .expect("meta")
                .insert(META_RV, 4)
                .expect("rv");
            txn.commit().expect("commit");
        }
        let store = RedbStore::open(&path, 1000).expect("open");
        assert_eq!(store.revision(), 4);
        let a = store.get(&key("a")).expect("a");
        assert_eq!((a.rv, a.value["spec"]["v"].as_i64()), (3, Some(3)));
        assert!(store.get(&key("b")).is_none());
        let replay = store
            .watch("trainer.kubeflow.org/trainjobs", None, Some(0))
            .expect("watch")
            .replay;
        assert_eq!(replay.len(), 4);
    }
}
