//! The watch cache both stores serve reads from: an index of every object,
//! the recent history of changes, and the live feed of watches.
//!
//! Objects and history are held as their encoded JSON (shared between an
//! object and its latest event) and decoded on read; a bounded cache of
//! decoded objects keeps the reads of hot objects from decoding again (an
//! object enters it when it is read, and writes keep it fresh there, so
//! objects written and never read, such as Events, do not push the others
//! out). That cache is bounded by the bytes its objects were decoded from
//! as well as by their count, and an object over 1/32 of its budget is
//! decoded on each read: a tenant storing large objects of many tiny
//! fields cannot make it hold gigabytes of trees. A decoded value carries
//! `metadata.resourceVersion` stamped from the entry's revision, so what is
//! encoded need not hold it (etcd's values do not).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast;

use crate::recent::Recent;

use super::{
    EventType, Key, Live, LiveChange, Object, RawObject, Replay, Rv, StoreError, Watch,
    matches_scope,
};

/// Live changes a watcher may lag behind before its watch is ended (and
/// no further than the history holds: see [`LiveChange`]).
const LIVE_BUFFER: usize = 65_536;
/// The most bytes of objects the history of changes (what a watch resumes
/// from) holds, besides its count: without it, a tenant updating one 3 MiB
/// object in a loop made each version a history entry of 3 MiB, in memory
/// and on disk, up to the count (100,000 in the hub). The oldest changes go
/// first; a watch resuming from before them gets 410 Gone and relists.
pub const HISTORY_BYTES: usize = 128 << 20;
/// Decoded objects kept for reads, least recently used evicted first
/// (see [`Recent`]): what was just written is what is read next.
const DECODED: usize = 1024;
/// The most bytes of JSON the decoded objects kept may have been decoded
/// from, together: a count alone does not bound them, as an object may
/// be up to 3 MiB and its tree many times that. An object over 1/32 of
/// this (512 KiB) is decoded on every read instead.
const DECODED_BYTES: usize = 16 << 20;

/// A decoded object as the cache of them keeps it: with its revision,
/// and weighed by the size of the JSON it was decoded from.
type Decoded = (Rv, Arc<Value>, usize);

/// An object as the cache holds it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub rv: Rv,
    /// The object's JSON.
    pub bytes: Arc<[u8]>,
}

/// One change, as the history holds it. For a deletion, `bytes` is the
/// object's last state and `rv` the deletion's revision.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub kind: EventType,
    pub key: Key,
    pub rv: Rv,
    pub bytes: Arc<[u8]>,
    /// The decoded object with `rv` stamped, when the writer has it at hand
    /// (keeps an object read before fresh in the decoded cache, and saves
    /// watchers decoding it while the writer still holds it).
    pub value: Option<Arc<Value>>,
}

/// Every object as stored, found by its key in one hash lookup (a write
/// checks a precondition, a read finds the decoded value: dozens of
/// lookups per TrainJob, where a search of an ordered map compared the
/// keys' long shared prefix, `trainer.kubeflow.org/trainjobs`, at every
/// level), and listed in key order from a set of the same keys.
#[derive(Default)]
struct Index {
    by_key: HashMap<Arc<Key>, Stored>,
    order: BTreeSet<Arc<Key>>,
}

impl Index {
    fn new(objects: BTreeMap<Key, Stored>) -> Self {
        let mut index = Index::default();
        index.by_key.reserve(objects.len());
        for (key, stored) in objects {
            let key = Arc::new(key);
            index.order.insert(key.clone());
            index.by_key.insert(key, stored);
        }
        index
    }

    fn get(&self, key: &Key) -> Option<&Stored> {
        self.by_key.get(key)
    }

    fn insert(&mut self, key: &Key, stored: Stored) {
        match self.by_key.get_mut(key) {
            Some(at) => *at = stored,
            None => {
                let key = Arc::new(key.clone());
                self.order.insert(key.clone());
                self.by_key.insert(key, stored);
            }
        }
    }

    fn remove(&mut self, key: &Key) {
        if self.by_key.remove(key).is_some() {
            self.order.remove(key);
        }
    }

    /// The objects from `start` on, in key order.
    fn range(&self, start: Bound<Key>) -> impl Iterator<Item = (&Key, &Stored)> {
        self.order
            .range::<Key, _>((start, Bound::Unbounded))
            .filter_map(|k| Some((k.as_ref(), self.by_key.get(k.as_ref())?)))
    }
}

struct State {
    objects: Index,
    /// The revision reads are consistent at: the last applied change, or a
    /// later revision the source reported as complete.
    rv: Rv,
    history: VecDeque<Change>,
    /// The bytes of the objects in `history`.
    history_bytes: usize,
    live: broadcast::Sender<Arc<LiveChange>>,
}

impl State {
    /// Drops the oldest changes past `cap` changes or `budget` bytes.
    fn trim_history(&mut self, cap: usize, budget: usize) {
        while self.history.len() > cap || self.history_bytes > budget {
            let Some(oldest) = self.history.pop_front() else {
                break;
            };
            self.history_bytes -= oldest.bytes.len();
        }
    }
}

/// The in-memory side of a store. Writers (one per store) call
/// [`Cache::apply`] in revision order; readers never block writers for long.
pub(crate) struct Cache {
    state: RwLock<State>,
    history_cap: usize,
    history_budget: usize,
    decoded: Recent<Key, Decoded>,
    /// Resources whose written objects go into `decoded` as they are
    /// written ([`Cache::keep_written`]); others only refresh an entry a
    /// read made.
    kept: RwLock<Vec<String>>,
    /// The revision of the last applied change (or the load), for
    /// [`Cache::wait_for`].
    seen: tokio::sync::watch::Sender<Rv>,
}

impl Cache {
    /// A cache holding `objects` at `rv`, with `history` (oldest first)
    /// kept up to `history_cap` changes and [`HISTORY_BYTES`].
    pub fn new(
        objects: BTreeMap<Key, Stored>,
        rv: Rv,
        history: VecDeque<Change>,
        history_cap: usize,
    ) -> Self {
        Self::bounded(objects, rv, history, history_cap, HISTORY_BYTES)
    }

    /// As [`Cache::new`], the history kept up to `history_budget` bytes.
    pub fn bounded(
        objects: BTreeMap<Key, Stored>,
        rv: Rv,
        history: VecDeque<Change>,
        history_cap: usize,
        history_budget: usize,
    ) -> Self {
        let mut history = history;
        for change in &mut history {
            change.value = None;
        }
        let history_bytes = history.iter().map(|c| c.bytes.len()).sum();
        let history_cap = history_cap.max(1);
        let mut state = State {
            objects: Index::new(objects),
            rv,
            history,
            history_bytes,
            live: broadcast::channel(LIVE_BUFFER).0,
        };
        state.trim_history(history_cap, history_budget);
        Cache {
            state: RwLock::new(state),
            history_cap,
            history_budget,
            decoded: Recent::with_budget(DECODED, DECODED_BYTES, |d| d.2),
            kept: RwLock::new(Vec::new()),
            seen: tokio::sync::watch::Sender::new(rv),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the objects of `resource` decoded as they are written, for a
    /// reader that reads back most writes of it soon after (the hub's
    /// TrainJobs). Resources written much and read little (Events, pods)
    /// are better left out: they would push out what is read.
    pub fn keep_written(&self, resource: &str) {
        let mut kept = self.kept.write().unwrap_or_else(|p| p.into_inner());
        if !kept.iter().any(|r| r == resource) {
            kept.push(resource.to_string());
        }
    }

    /// The object at `key` as stored (not decoded): for checking
    /// preconditions.
    pub fn stored(&self, key: &Key) -> Option<Stored> {
        self.read().objects.get(key).cloned()
    }

    /// The revision of the object at `key`.
    pub fn revision_of(&self, key: &Key) -> Option<Rv> {
        self.read().objects.get(key).map(|s| s.rv)
    }

    pub fn revision(&self) -> Rv {
        self.read().rv
    }

    /// Applies changes (in revision order, all newer than what was applied
    /// before) and moves the cache to `rv`, then feeds the live watches
    /// (encoded: see [`Live`]).
    pub fn apply(&self, changes: Vec<Change>, rv: Rv) {
        let mut s = self.write();
        let mut events = Vec::new();
        let watched = s.live.receiver_count() > 0;
        let kept = self.kept.read().unwrap_or_else(|p| p.into_inner());
        for mut change in changes {
            match change.kind {
                EventType::Deleted => {
                    s.objects.remove(&change.key);
                    self.decoded.invalidate(&change.key);
                }
                _ => {
                    s.objects.insert(
                        &change.key,
                        Stored {
                            rv: change.rv,
                            bytes: change.bytes.clone(),
                        },
                    );
                    // Kept fresh where it was read before; an object
                    // nobody reads (an Event, a pod shown) does not push
                    // out those that are.
                    let size = change.bytes.len();
                    let value = change.value.as_ref().map(|v| (change.rv, v.clone(), size));
                    match value {
                        Some(value) if kept.contains(&change.key.resource) => {
                            self.decoded.insert(change.key.clone(), value)
                        }
                        value => self.decoded.refresh(&change.key, value),
                    }
                }
            }
            if watched {
                events.push(Arc::new(LiveChange {
                    kind: change.kind,
                    key: change.key.clone(),
                    rv: change.rv,
                    bytes: Arc::downgrade(&change.bytes),
                    decoded: std::sync::Mutex::new(
                        change
                            .value
                            .as_ref()
                            .map(Arc::downgrade)
                            .unwrap_or_default(),
                    ),
                }));
            }
            change.value = None;
            // A change the source reports late (below a revision it said was
            // complete) still lands in revision order.
            s.history_bytes += change.bytes.len();
            if s.history.back().is_none_or(|last| last.rv <= change.rv) {
                s.history.push_back(change);
            } else {
                let at = s.history.partition_point(|c| c.rv <= change.rv);
                s.history.insert(at, change);
            }
        }
        s.trim_history(self.history_cap, self.history_budget);
        drop(kept);
        s.rv = s.rv.max(rv);
        for event in events {
            // No receiver is fine: nobody watches.
            let _ = s.live.send(event);
        }
        drop(s);
        // What was applied, not what a progress report claimed: a commit
        // waits for its own changes.
        self.seen.send_if_modified(|seen| {
            let moved = rv > *seen;
            *seen = (*seen).max(rv);
            moved
        });
    }

    /// Moves the cache's revision to `rv` without a change (the source says
    /// nothing happened up to `rv`), so lists and bookmarks carry it.
    pub fn advance(&self, rv: Rv) {
        let mut s = self.write();
        s.rv = s.rv.max(rv);
    }

    /// Replaces everything with a fresh load at `rv` (a relist): the history
    /// is forgotten, so watches from before get [`StoreError::Gone`], and
    /// the live watches are ended (their clients resume, get Gone, and
    /// relist).
    pub fn reset(&self, objects: BTreeMap<Key, Stored>, rv: Rv) {
        let mut s = self.write();
        s.objects = Index::new(objects);
        s.history.clear();
        s.history_bytes = 0;
        s.rv = rv;
        let (live, _) = broadcast::channel(LIVE_BUFFER);
        s.live = live;
        drop(s);
        self.decoded.invalidate_all();
        self.seen.send_if_modified(|seen| {
            let moved = rv > *seen;
            *seen = (*seen).max(rv);
            moved
        });
    }

    /// Forgets the history at and below `rv` (all of it when `rv` is the
    /// latest): watches from there get [`StoreError::Gone`].
    pub fn compact(&self, rv: Rv) {
        let mut s = self.write();
        while s.history.front().is_some_and(|c| c.rv <= rv) {
            if let Some(oldest) = s.history.pop_front() {
                s.history_bytes -= oldest.bytes.len();
            }
        }
    }

    /// The newest revision the history no longer holds (every change at or
    /// below it is gone from it): what a store may forget on disk too.
    pub fn history_floor(&self) -> Rv {
        let s = self.read();
        s.history.front().map_or(s.rv, |c| c.rv.saturating_sub(1))
    }

    /// Waits until the cache has applied revision `rv`.
    ///
    /// # Errors
    /// [`StoreError::Storage`] when it has not within `timeout`.
    pub async fn wait_for(&self, rv: Rv, timeout: Duration) -> Result<(), StoreError> {
        let mut seen = self.seen.subscribe();
        match tokio::time::timeout(timeout, seen.wait_for(|s| *s >= rv)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(StoreError::Storage(format!(
                "the watch cache has not reached revision {rv} within {timeout:?} (it is at {})",
                *self.seen.borrow()
            ))),
        }
    }

    pub fn get(&self, key: &Key) -> Option<Object> {
        let stored = self.read().objects.get(key).cloned()?;
        self.object(key, stored)
    }

    fn object(&self, key: &Key, stored: Stored) -> Option<Object> {
        if let Some((rv, value, _)) = self.decoded.get(key)
            && rv == stored.rv
        {
            return Some(Object {
                key: key.clone(),
                rv,
                value,
            });
        }
        let object = decode(key, stored.rv, &stored.bytes)?;
        self.decoded.insert(
            key.clone(),
            (object.rv, object.value.clone(), stored.bytes.len()),
        );
        Some(object)
    }

    pub fn list(&self, resource: &str, namespace: Option<&str>) -> (Vec<Object>, Rv) {
        let (entries, rv) = {
            let s = self.read();
            let start = Key::new(resource, namespace, "");
            let entries: Vec<(Key, Stored)> = s
                .objects
                .range(Bound::Included(start))
                .take_while(|(k, _)| k.resource == resource)
                .take_while(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
                .map(|(k, o)| (k.clone(), o.clone()))
                .collect();
            (entries, s.rv)
        };
        let items = entries
            .into_iter()
            .filter_map(|(k, stored)| {
                // Lists decode without filling the hot cache: a list of
                // every object would only evict the objects in use.
                match self.decoded.peek(&k) {
                    Some((rv, value, _)) if rv == stored.rv => Some(Object { key: k, rv, value }),
                    _ => decode(&k, stored.rv, &stored.bytes),
                }
            })
            .collect();
        (items, rv)
    }

    /// The encoded objects of `resource` (in `namespace`) after
    /// (namespace, name) `after`, in key order, and the revision.
    pub fn list_raw(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
    ) -> (Vec<RawObject>, Rv) {
        let s = self.read();
        let start = match after {
            Some((ns, name)) => Bound::Excluded(Key::new(resource, Some(ns), name)),
            None => Bound::Included(Key::new(resource, namespace, "")),
        };
        let items = s
            .objects
            .range(start)
            .take_while(|(k, _)| k.resource == resource)
            .skip_while(|(k, _)| namespace.is_some_and(|ns| k.namespace.as_str() < ns))
            .take_while(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(k, o)| RawObject {
                key: k.clone(),
                rv: o.rv,
                bytes: o.bytes.clone(),
            })
            .collect();
        (items, s.rv)
    }

    pub fn watch(
        &self,
        resource: &str,
        namespace: Option<&str>,
        since: Option<Rv>,
    ) -> Result<Watch, StoreError> {
        let s = self.read();
        // Subscribed under the lock, so no event falls between the replay
        // and the live feed.
        let live = s.live.subscribe();
        let replay = match since {
            None => Vec::new(),
            Some(since) if since > s.rv => Vec::new(),
            Some(since) => {
                let oldest = s.history.front().map(|c| c.rv).unwrap_or(s.rv + 1);
                if since + 1 < oldest {
                    return Err(StoreError::Gone {
                        requested: since,
                        oldest,
                    });
                }
                // One etcd transaction writing several objects gives them
                // one revision: a client that resumes from it may have seen
                // only some of them, so all of them are sent again (a
                // client sees one it had twice, never misses one).
                let at = s.history.partition_point(|c| c.rv < since);
                let after = s.history.partition_point(|c| c.rv <= since);
                let start = if after - at > 1 { at } else { after };
                s.history
                    .range(start..)
                    .filter(|c| matches_scope(&c.key, resource, namespace))
                    .cloned()
                    .collect()
            }
        };
        Ok(Watch {
            replay: Replay(replay),
            live: Live {
                rx: live,
                resources: vec![resource.to_string()],
                deletions: Vec::new(),
                namespace: namespace.map(str::to_string),
                after: s.rv,
            },
            replayed_up_to: s.rv,
        })
    }
}

/// The object in `bytes`, its resourceVersion stamped from `rv`. `None`
/// (logged) for bytes that are not a JSON object: a foreign writer's.
pub(crate) fn decode(key: &Key, rv: Rv, bytes: &[u8]) -> Option<Object> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(mut value) => {
            set_rv(&mut value, rv);
            Some(Object {
                key: key.clone(),
                rv,
                value: Arc::new(value),
            })
        }
        Err(e) => {
            tracing::error!(%key, rv, error = %e, "store: an object that does not decode is skipped");
            None
        }
    }
}

/// Sets `metadata.resourceVersion` to `rv`.
pub(crate) fn set_rv(value: &mut Value, rv: Rv) {
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    } else if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "metadata".into(),
            serde_json::json!({ "resourceVersion": rv.to_string() }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(kind: EventType, name: &str, rv: Rv, spec: i64) -> Change {
        let value = serde_json::json!({"metadata": {"name": name}, "spec": spec});
        Change {
            kind,
            key: Key::new("r", Some("ns"), name),
            rv,
            bytes: serde_json::to_vec(&value).unwrap_or_default().into(),
            value: None,
        }
    }

    #[test]
    fn reads_decode_with_the_revision_stamped_and_history_replays_in_order() {
        let cache = Cache::new(BTreeMap::new(), 0, VecDeque::new(), 10);
        cache.apply(vec![change(EventType::Added, "a", 1, 1)], 1);
        cache.apply(vec![change(EventType::Modified, "a", 2, 2)], 2);
        cache.apply(vec![change(EventType::Added, "b", 4, 3)], 4);
        let a = cache.get(&Key::new("r", Some("ns"), "a")).expect("a");
        assert_eq!(a.value["metadata"]["resourceVersion"], "2");
        assert_eq!(a.value["spec"], 2);
        // A change reported late lands in revision order.
        cache.apply(vec![change(EventType::Deleted, "c", 3, 0)], 3);
        assert_eq!(cache.revision(), 4);
        let watch = cache.watch("r", None, Some(1)).expect("watch");
        let rvs: Vec<_> = watch.replay.iter().map(|e| e.object.rv).collect();
        assert_eq!(rvs, [2, 3, 4]);
        cache.compact(2);
        assert!(matches!(
            cache.watch("r", None, Some(1)),
            Err(StoreError::Gone { .. })
        ));
        let (items, rv) = cache.list("r", Some("ns"));
        assert_eq!((items.len(), rv), (2, 4));
    }

    #[test]
    fn the_history_holds_no_more_bytes_than_its_budget() {
        let big = |name: &str, rv: Rv| {
            let mut c = change(EventType::Modified, name, rv, 0);
            let value = serde_json::json!({"metadata": {"name": name}, "spec": "x".repeat(300)});
            c.bytes = serde_json::to_vec(&value).unwrap_or_default().into();
            c
        };
        let size = big("a", 1).bytes.len();
        // Room for three of them by bytes, for a hundred by count.
        let cache = Cache::bounded(BTreeMap::new(), 0, VecDeque::new(), 100, 3 * size + 10);
        let mut watch = cache.watch("r", None, None).expect("watch");
        for rv in 1..=10 {
            cache.apply(vec![big("a", rv)], rv);
        }
        {
            let s = cache.read();
            let rvs: Vec<Rv> = s.history.iter().map(|c| c.rv).collect();
            assert_eq!(rvs, [8, 9, 10], "the newest that fit");
            assert_eq!(s.history_bytes, 3 * size);
        }
        assert_eq!(cache.history_floor(), 7);
        assert!(matches!(
            cache.watch("r", None, Some(6)),
            Err(StoreError::Gone { oldest: 8, .. })
        ));
        let resumed = cache.watch("r", None, Some(7)).expect("held");
        let rvs: Vec<Rv> = resumed.replay.iter().map(|e| e.object.rv).collect();
        assert_eq!(rvs, [8, 9, 10]);
        // The live feed holds none of the objects the history let go: a
        // watcher that read nothing meanwhile learns it lagged.
        assert!(matches!(
            watch.live.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(_))
        ));
        // A history loaded over its budget keeps its newest.
        let loaded: VecDeque<Change> = (1..=10).map(|rv| big("a", rv)).collect();
        let cache = Cache::bounded(BTreeMap::new(), 10, loaded, 100, 2 * size);
        assert_eq!(cache.history_floor(), 8);
    }

    #[test]
    fn a_replay_holds_the_historys_bytes_and_decodes_as_it_is_read() {
        let cache = Cache::new(BTreeMap::new(), 0, VecDeque::new(), 10);
        for rv in 1..=4 {
            cache.apply(vec![change(EventType::Modified, "a", rv, rv as i64)], rv);
        }
        let watch = cache.watch("r", None, Some(1)).expect("watch");
        {
            // Nothing decoded or copied while the store's lock was held:
            // the replay shares the history's bytes.
            let s = cache.read();
            assert_eq!(watch.replay.len(), 3);
            for (replayed, held) in watch.replay.0.iter().zip(s.history.range(1..)) {
                assert!(Arc::ptr_eq(&replayed.bytes, &held.bytes));
                assert!(replayed.value.is_none());
            }
        }
        let specs: Vec<i64> = watch
            .replay
            .into_iter()
            .map(|e| e.object.value["spec"].as_i64().unwrap_or_default())
            .collect();
        assert_eq!(specs, [2, 3, 4]);
    }

    #[test]
    fn a_watch_from_a_revision_of_several_changes_replays_all_of_them() {
        let cache = Cache::new(BTreeMap::new(), 0, VecDeque::new(), 10);
        cache.apply(vec![change(EventType::Added, "a", 1, 1)], 1);
        // One transaction, two objects, one revision.
        cache.apply(
            vec![
                change(EventType::Added, "b", 2, 2),
                change(EventType::Added, "c", 2, 3),
            ],
            2,
        );
        cache.apply(vec![change(EventType::Modified, "a", 3, 4)], 3);
        let names = |since| -> Vec<String> {
            let watch = cache.watch("r", None, Some(since)).expect("watch");
            watch
                .replay
                .iter()
                .map(|e| e.object.key.name.clone())
                .collect()
        };
        // A client that saw b (rv 2) and lost the stream before c gets c.
        assert_eq!(names(2), ["b", "c", "a"]);
        // A revision of one change is not sent again.
        assert_eq!(names(1), ["b", "c", "a"]);
        assert!(names(3).is_empty());
    }

    #[tokio::test]
    async fn the_live_feed_sends_a_watch_its_scope_decoded_once_for_all_watchers() {
        let cache = Cache::new(BTreeMap::new(), 0, VecDeque::new(), 10);
        let mut one = cache
            .watch("r", Some("ns"), None)
            .expect("watch")
            .also(&["q"]);
        let mut two = cache.watch("r", Some("ns"), None).expect("watch");
        let in_ns = |resource: &str, name: &str, rv: Rv| {
            let mut c = change(EventType::Added, name, rv, 1);
            c.key = Key::new(resource, Some("ns"), name);
            c
        };
        let mut elsewhere = change(EventType::Added, "x", 2, 1);
        elsewhere.key = Key::new("r", Some("other"), "x");
        // Bytes that do not decode, of a resource nobody watches: skipped
        // without a decode.
        let mut unwatched = in_ns("z", "z", 4);
        unwatched.bytes = Arc::from(&b"not json"[..]);
        cache.apply(
            vec![
                in_ns("r", "a", 1),
                elsewhere,
                in_ns("q", "b", 3),
                unwatched,
                in_ns("r", "c", 5),
            ],
            5,
        );
        let mut names = Vec::new();
        while let Ok(event) = one.live.try_recv() {
            names.push(format!(
                "{}/{}",
                event.object.key.resource, event.object.key.name
            ));
        }
        assert_eq!(names, ["r/a", "q/b", "r/c"]);
        let first = two.live.try_recv().expect("r/a");
        assert_eq!(first.object.value["metadata"]["resourceVersion"], "1");
        let again = cache.watch("r", Some("ns"), Some(0)).expect("replay");
        assert_eq!(
            again.replay.len(),
            2,
            "the replay holds the first resource's events"
        );
        // Decoded once while in use: both watchers received the same
        // event; once nobody holds it, the feed keeps only the bytes.
        let mut three = cache.watch("r", None, None).expect("watch");
        cache.apply(vec![in_ns("r", "d", 6), in_ns("r", "e", 7)], 7);
        let (a, b) = (
            three.live.try_recv().expect("d"),
            two.live.try_recv().expect("c"),
        );
        assert_eq!(b.object.key.name, "c");
        assert!(Arc::ptr_eq(
            &a.object.value,
            &two.live.try_recv().expect("d").object.value
        ));
        let e = three.live.try_recv().expect("e");
        let weak = Arc::downgrade(&e.object.value);
        drop(e);
        assert!(
            weak.upgrade().is_none(),
            "the feed does not hold a decoded value"
        );
        assert_eq!(two.live.try_recv().expect("e").object.key.name, "e");
        // The writer's decoded value, while it holds it, is shared too.
        let mut written = in_ns("r", "f", 8);
        let value = decode(&written.key, 8, &written.bytes)
            .expect("decodes")
            .value;
        written.value = Some(value.clone());
        cache.apply(vec![written], 8);
        assert!(Arc::ptr_eq(
            &two.live.try_recv().expect("f").object.value,
            &value
        ));
    }

    #[tokio::test]
    async fn a_watch_of_deletions_takes_only_the_deletions_of_those_resources() {
        let cache = Cache::new(BTreeMap::new(), 0, VecDeque::new(), 10);
        let mut watch = cache
            .watch("r", None, None)
            .expect("watch")
            .also_deletions(&["q"]);
        let of_q = |kind: EventType, name: &str, rv: Rv| {
            let mut c = change(kind, name, rv, 1);
            c.key = Key::new("q", Some("ns"), name);
            c
        };
        cache.apply(
            vec![
                of_q(EventType::Added, "a", 1),
                of_q(EventType::Modified, "a", 2),
                change(EventType::Added, "b", 3, 1),
                of_q(EventType::Deleted, "a", 4),
            ],
            4,
        );
        let mut seen = Vec::new();
        while let Ok(event) = watch.live.try_recv() {
            seen.push(format!(
                "{} {}/{}",
                event.kind.as_str(),
                event.object.key.resource,
                event.object.key.name
            ));
        }
        assert_eq!(seen, ["ADDED r/b", "DELETED q/a"]);
    }

    #[test]
    fn the_written_objects_of_a_kept_resource_are_read_without_a_decode() {
        let cache = Cache::new(BTreeMap::new(), 0, VecDeque::new(), 10);
        cache.keep_written("q");
        let written = |resource: &str, name: &str, rv: Rv| {
            let mut c = change(EventType::Added, name, rv, 1);
            c.key = Key::new(resource, Some("ns"), name);
            c.value = Some(decode(&c.key, rv, &c.bytes).expect("decodes").value);
            c
        };
        let (kept, other) = (written("q", "a", 1), written("r", "b", 1));
        let (kept_value, other_value) = (kept.value.clone(), other.value.clone());
        cache.apply(vec![kept, other], 1);
        let read = |resource: &str, name: &str| {
            cache
                .get(&Key::new(resource, Some("ns"), name))
                .expect("stored")
                .value
        };
        // The writer's value, not a decode of the bytes.
        assert!(Arc::ptr_eq(
            &read("q", "a"),
            kept_value.as_ref().expect("value")
        ));
        // Another resource's write is decoded on its first read (an Event,
        // a pod: written much, read little), and kept from then on.
        let first = read("r", "b");
        assert!(!Arc::ptr_eq(&first, other_value.as_ref().expect("value")));
        assert!(Arc::ptr_eq(&first, &read("r", "b")));
        // A newer write of a kept object replaces the one read before.
        let newer = written("q", "a", 2);
        let newer_value = newer.value.clone().expect("value");
        cache.apply(vec![newer], 2);
        let again = read("q", "a");
        assert!(Arc::ptr_eq(&again, &newer_value));
        assert_eq!(again["metadata"]["resourceVersion"], "2");
    }

    #[test]
    fn an_object_too_large_for_the_decoded_cache_is_decoded_on_each_read() {
        let cache = Cache::new(BTreeMap::new(), 0, VecDeque::new(), 10);
        cache.keep_written("r");
        // Many tiny fields: a tree many times its JSON's size.
        let big: serde_json::Map<String, Value> = (0..DECODED_BYTES / 32 / 8)
            .map(|i| (format!("f{i}"), Value::from(0)))
            .collect();
        let mut large = change(EventType::Added, "large", 1, 1);
        let value = serde_json::json!({"metadata": {"name": "large"}, "spec": big});
        large.bytes = serde_json::to_vec(&value).expect("encodes").into();
        assert!(large.bytes.len() > DECODED_BYTES / 32);
        large.value = Some(decode(&large.key, 1, &large.bytes).expect("decodes").value);
        let small = change(EventType::Added, "small", 1, 1);
        cache.apply(vec![large, small], 1);
        let read = |name: &str| cache.get(&Key::new("r", Some("ns"), name)).expect("stored");
        let (first, second) = (read("large"), read("large"));
        assert_eq!(first.value, second.value);
        assert!(
            !Arc::ptr_eq(&first.value, &second.value),
            "not kept: each read decodes it"
        );
        assert!(Arc::ptr_eq(&read("small").value, &read("small").value));
        assert!(cache.decoded.weight() <= DECODED_BYTES);
        assert_eq!(cache.decoded.len(), 1);
    }

    #[tokio::test]
    async fn a_reset_ends_live_watches_and_forgets_the_history() {
        let cache = Cache::new(BTreeMap::new(), 0, VecDeque::new(), 10);
        cache.apply(vec![change(EventType::Added, "a", 1, 1)], 1);
        let mut watch = cache.watch("r", None, Some(0)).expect("watch");
        cache.reset(BTreeMap::new(), 5);
        assert!(matches!(
            watch.live.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
        assert!(matches!(
            cache.watch("r", None, Some(1)),
            Err(StoreError::Gone { .. })
        ));
        cache
            .wait_for(5, Duration::from_millis(10))
            .await
            .expect("the reset's revision counts as seen");
        assert!(
            cache.wait_for(6, Duration::from_millis(10)).await.is_err(),
            "a revision not reached times out"
        );
    }
}
