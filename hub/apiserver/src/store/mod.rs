//! The hub's object store: every API object and every state change the hub
//! acts on, committed before it is acted on.
//!
//! [`Store`] is the seam a replicated backend (etcd) can replace; the
//! embedded default is [`RedbStore`], a crash-safe B-tree file with group
//! commit. Semantics are those of the Kubernetes storage layer:
//! - one global, monotonic `resourceVersion` (across restarts), stamped into
//!   `metadata.resourceVersion` of every stored object;
//! - writes carry preconditions (must not exist, expected resourceVersion) and
//!   fail with [`StoreError::Conflict`] or [`StoreError::AlreadyExists`];
//! - a write is durable on disk before [`Store::commit`] returns;
//! - watches replay the events after a given resourceVersion, as long as the
//!   history still holds it ([`StoreError::Gone`] otherwise), then follow
//!   live.

mod cache;
pub mod etcd;
mod redb;
#[cfg(test)]
mod suite;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

pub use self::etcd::{EtcdConfig, EtcdStore};
pub use self::redb::RedbStore;

/// A resourceVersion.
pub type Rv = u64;

/// The most operations a writer puts in one commit when it removes or
/// writes many independent objects (expired events, a namespace's
/// read-only views): etcd refuses a Txn of more than 128 (its default
/// `--max-txn-ops`), and a fenced commit adds a compare of its own. Such a
/// writer commits in chunks of this size.
pub const MAX_COMMIT_OPS: usize = 100;

/// Where an object lives: its resource (plural, with group for API kinds,
/// e.g. `trainer.kubeflow.org/trainjobs`), namespace (empty when
/// cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(resource: &str, namespace: Option<&str>, name: &str) -> Self {
        Key {
            resource: resource.to_string(),
            namespace: namespace.unwrap_or_default().to_string(),
            name: name.to_string(),
        }
    }

    /// Whether the key can be stored and read back as it is: its namespace
    /// and name hold neither the storage separator `|` nor `/` (valid
    /// Kubernetes names never do; the store refuses the rest rather than read
    /// them back as another key).
    pub fn is_storable(&self) -> bool {
        !self.resource.contains('|')
            && [&self.namespace, &self.name]
                .iter()
                .all(|part| !part.contains(['|', '/']))
    }

    /// The storage key; `|` cannot occur in namespaces or names (see
    /// [`Key::is_storable`]).
    pub(crate) fn encode(&self) -> String {
        format!("{}|{}|{}", self.resource, self.namespace, self.name)
    }

    pub(crate) fn decode(s: &str) -> Option<Key> {
        let mut parts = s.splitn(3, '|');
        Some(Key {
            resource: parts.next()?.to_string(),
            namespace: parts.next()?.to_string(),
            name: parts.next()?.to_string(),
        })
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.resource, self.name)
        } else {
            write!(f, "{}/{}/{}", self.resource, self.namespace, self.name)
        }
    }
}

/// A stored object at one resourceVersion.
#[derive(Debug, Clone)]
pub struct Object {
    pub key: Key,
    pub rv: Rv,
    /// The object, with `metadata.resourceVersion` set to `rv`.
    pub value: Arc<Value>,
}

/// One write of a commit.
#[derive(Debug, Clone)]
pub enum Op {
    /// Fails with `AlreadyExists` if the key exists.
    Create { key: Key, value: Value },
    /// Fails with `NotFound` if absent, `Conflict` if `expected` is given and
    /// differs from the stored resourceVersion.
    Update {
        key: Key,
        value: Value,
        expected: Option<Rv>,
    },
    /// As `Update`, then removes the object.
    Delete { key: Key, expected: Option<Rv> },
    /// Creates or replaces, whatever is there: for a controller that is the
    /// only writer of its keys.
    Put { key: Key, value: Value },
    /// Deletes if present; absent is not an error.
    Remove { key: Key },
}

impl Op {
    pub fn key(&self) -> &Key {
        match self {
            Op::Create { key, .. }
            | Op::Update { key, .. }
            | Op::Delete { key, .. }
            | Op::Put { key, .. }
            | Op::Remove { key } => key,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The watch event type as the Kubernetes API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change. For `Deleted`, the object's last state with the deletion's
/// resourceVersion.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventType,
    pub object: Object,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(Key),
    #[error("{0} already exists")]
    AlreadyExists(Key),
    #[error(
        "{key}: the object has been modified (resourceVersion {current}, expected {expected}); please apply your changes to the latest version and try again"
    )]
    Conflict { key: Key, expected: Rv, current: Rv },
    #[error("too old resource version: {requested} ({oldest})")]
    Gone { requested: Rv, oldest: Rv },
    /// A namespace or name the store cannot hold (see [`Key::is_storable`]).
    #[error("{0}: not a storable key: names and namespaces must not contain '|' or '/'")]
    InvalidKey(Key),
    #[error("storage: {0}")]
    Storage(String),
    /// A write larger than the storage takes in one request (etcd's
    /// `--max-request-bytes`); nothing of it was written.
    #[error("{0}")]
    TooLarge(String),
    /// A write made in the name of a leadership [`Term`] that has ended:
    /// another replica leads now, and this one must stop acting.
    #[error("not the leader: the leadership term {0} has ended")]
    Fenced(Rv),
}

/// One term of leadership among hub replicas: the leader key in the store
/// and the revision that created it. Writes made in a term's name (see
/// [`Store::fenced`]) succeed only while that key still exists with that
/// create revision, so a deposed leader that has not noticed yet cannot
/// write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// The leader key (etcd: the election's key, lease-bound).
    pub key: String,
    /// The leader key's create revision; 0 for a store only one process
    /// writes.
    pub revision: Rv,
}

pub type CommitFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Object>, StoreError>> + Send + 'a>>;

/// A commit that hands its operations back when it is refused.
pub type ReturningFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Object>, (StoreError, Vec<Op>)>> + Send + 'a>>;

pub type RawListFuture<'a> =
    Pin<Box<dyn Future<Output = Result<(Vec<RawObject>, Rv), StoreError>> + Send + 'a>>;

/// An object as the store holds it: its JSON (without
/// `metadata.resourceVersion`), not decoded. A paged list decodes only the
/// objects it returns or filters.
#[derive(Debug, Clone)]
pub struct RawObject {
    pub key: Key,
    pub rv: Rv,
    pub bytes: Arc<[u8]>,
}

impl RawObject {
    /// The object, `metadata.resourceVersion` stamped; `None` (logged) for
    /// bytes that are not a JSON object.
    pub fn decode(&self) -> Option<Object> {
        cache::decode(&self.key, self.rv, &self.bytes)
    }
}

/// Refuses a write the store could not read back: an object nested deeper
/// than [`STORE_READABLE_DEPTH`](crate::limits::STORE_READABLE_DEPTH). The
/// API refuses far less deep objects first; this guards every other writer.
pub(crate) fn readable(ops: &[Op]) -> Result<(), StoreError> {
    use crate::limits::STORE_READABLE_DEPTH;
    for op in ops {
        if let Op::Create { key, value } | Op::Update { key, value, .. } | Op::Put { key, value } =
            op
            && crate::limits::depth(value) > STORE_READABLE_DEPTH
        {
            return Err(StoreError::Storage(format!(
                "{key}: the object is nested more than {STORE_READABLE_DEPTH} levels deep, more than the store can read back"
            )));
        }
    }
    Ok(())
}

/// A watch: the events to replay, then the live feed.
pub struct Watch {
    /// Events after the requested resourceVersion, oldest first.
    pub replay: Replay,
    /// The live events of the watch's scope after those replayed. Lagging
    /// behind by more than the feed holds ends the watch, as an API server
    /// closes a slow watcher; the client then relists.
    pub live: Live,
    /// Live events at or below this resourceVersion were replayed already.
    pub replayed_up_to: Rv,
}

impl Watch {
    /// Follows `resources` too, in the same namespace scope, on the live
    /// feed (the replay holds the first resource's events only): for a
    /// follower that reacts to a change of any of several kinds.
    #[must_use]
    pub fn also(mut self, resources: &[&str]) -> Self {
        self.live
            .resources
            .extend(resources.iter().map(|r| (*r).to_string()));
        self
    }

    /// Follows the deletions of `resources` too, on the live feed, and
    /// nothing else of them: their other changes are skipped before they
    /// are decoded (a follower that only counts what goes away).
    #[must_use]
    pub fn also_deletions(mut self, resources: &[&str]) -> Self {
        self.live
            .deletions
            .extend(resources.iter().map(|r| (*r).to_string()));
        self
    }
}

/// The changes a watch replays, held as the history holds them (their
/// encoded JSON, shared with it) and decoded one at a time as they are
/// iterated: a watch resuming from far back neither holds the store's
/// lock while a long history is decoded, nor holds it all decoded at once.
#[derive(Default)]
pub struct Replay(Vec<cache::Change>);

impl Replay {
    /// The changes to replay (one that does not decode is skipped, and
    /// logged, when iterated).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The events, oldest first, each decoded as it is reached.
    pub fn iter(&self) -> ReplayIter<'_> {
        self.into_iter()
    }
}

impl IntoIterator for Replay {
    type Item = Arc<Event>;
    type IntoIter = ReplayIntoIter;

    fn into_iter(self) -> ReplayIntoIter {
        ReplayIntoIter(self.0.into_iter())
    }
}

impl<'a> IntoIterator for &'a Replay {
    type Item = Arc<Event>;
    type IntoIter = ReplayIter<'a>;

    fn into_iter(self) -> ReplayIter<'a> {
        ReplayIter(self.0.iter())
    }
}

/// A [`Replay`]'s events, decoded as they are reached.
pub struct ReplayIntoIter(std::vec::IntoIter<cache::Change>);

impl Iterator for ReplayIntoIter {
    type Item = Arc<Event>;

    fn next(&mut self) -> Option<Arc<Event>> {
        self.0.by_ref().find_map(|c| replayed(&c))
    }
}

/// A borrowed [`Replay`]'s events, decoded as they are reached.
pub struct ReplayIter<'a>(std::slice::Iter<'a, cache::Change>);

impl Iterator for ReplayIter<'_> {
    type Item = Arc<Event>;

    fn next(&mut self) -> Option<Arc<Event>> {
        self.0.by_ref().find_map(replayed)
    }
}

fn replayed(change: &cache::Change) -> Option<Arc<Event>> {
    let object = cache::decode(&change.key, change.rv, &change.bytes)?;
    Some(Arc::new(Event {
        kind: change.kind,
        object,
    }))
}

/// A watch's live feed. The store sends each change as its encoded bytes
/// (shared with the stored object); a change is decoded when a watcher of
/// its scope receives it, unless its decoded value is still in use (the
/// writer's, or one another watcher decoded), which is then shared. So a
/// watcher lagging behind a burst keeps bytes in the feed, never decoded
/// values (the feed does not hold what a faster watcher decoded), and
/// changes nobody watches are never decoded.
pub struct Live {
    rx: tokio::sync::broadcast::Receiver<Arc<LiveChange>>,
    resources: Vec<String>,
    /// Resources of which only deletions are followed.
    deletions: Vec<String>,
    namespace: Option<String>,
    after: Rv,
}

impl Live {
    /// The next event in scope.
    ///
    /// # Errors
    /// `Lagged` when changes were lost to a full feed (the watch should
    /// end), `Closed` when the store has ended the feed (a relist).
    pub async fn recv(&mut self) -> Result<Arc<Event>, tokio::sync::broadcast::error::RecvError> {
        self.recv_latest(|_, _| true).await
    }

    /// As [`Live::recv`], for a follower that acts only on an object's
    /// latest version: a change to an object changed again since (its
    /// `rv` is not what `latest` says the store holds now) is skipped
    /// without being decoded, as its next change follows on this feed.
    /// Deletions are always received. `latest` is typically
    /// `|key, rv| store.revision_of(key) == Some(rv)`.
    ///
    /// # Errors
    /// As [`Live::recv`].
    pub async fn recv_latest(
        &mut self,
        latest: impl Fn(&Key, Rv) -> bool,
    ) -> Result<Arc<Event>, tokio::sync::broadcast::error::RecvError> {
        loop {
            let change = self.rx.recv().await?;
            match self.accept(&change, &latest) {
                Ok(Some(event)) => return Ok(event),
                Ok(None) => {}
                Err(Lost) => return Err(tokio::sync::broadcast::error::RecvError::Lagged(1)),
            }
        }
    }

    /// The next event in scope already sent, without waiting.
    ///
    /// # Errors
    /// As [`Live::recv`], and `Empty` when none is waiting.
    pub fn try_recv(&mut self) -> Result<Arc<Event>, tokio::sync::broadcast::error::TryRecvError> {
        loop {
            let change = self.rx.try_recv()?;
            match self.accept(&change, &|_, _| true) {
                Ok(Some(event)) => return Ok(event),
                Ok(None) => {}
                Err(Lost) => return Err(tokio::sync::broadcast::error::TryRecvError::Lagged(1)),
            }
        }
    }

    /// The event `change` is for this watch, if it is in its scope and
    /// `latest` (see [`Live::recv_latest`]); `Lost` when its object is no
    /// longer held (see [`LiveChange`]).
    fn accept(
        &self,
        change: &LiveChange,
        latest: &dyn Fn(&Key, Rv) -> bool,
    ) -> Result<Option<Arc<Event>>, Lost> {
        let followed = self.resources.contains(&change.key.resource)
            || (change.kind == EventType::Deleted && self.deletions.contains(&change.key.resource));
        let in_scope = change.rv > self.after
            && followed
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| change.key.namespace == ns);
        // A superseded change is skipped before it is decoded.
        if !in_scope || (change.kind != EventType::Deleted && !latest(&change.key, change.rv)) {
            return Ok(None);
        }
        let mut decoded = change.decoded.lock().unwrap_or_else(|p| p.into_inner());
        let object = match decoded.upgrade() {
            Some(value) => Object {
                key: change.key.clone(),
                rv: change.rv,
                value,
            },
            None => {
                let bytes = change.bytes.upgrade().ok_or(Lost)?;
                let Some(object) = cache::decode(&change.key, change.rv, &bytes) else {
                    return Ok(None);
                };
                *decoded = Arc::downgrade(&object.value);
                object
            }
        };
        Ok(Some(Arc::new(Event {
            kind: change.kind,
            object,
        })))
    }
}

/// A change a watcher lagged too far behind to receive: its object left the
/// history before the watcher read it.
struct Lost;

/// One change on the live feed, as the store sends it. Its object's bytes
/// are the history's (or the stored object's): the feed holds them weakly,
/// so a watcher that stops reading keeps no object the history has let go
/// (the history is bounded by bytes; the feed only by count), and learns,
/// when it reads again, that it lagged.
pub(crate) struct LiveChange {
    kind: EventType,
    key: Key,
    rv: Rv,
    bytes: std::sync::Weak<[u8]>,
    /// The decoded object, with `rv` stamped, while something holds it.
    decoded: std::sync::Mutex<std::sync::Weak<Value>>,
}

fn matches_scope(key: &Key, resource: &str, namespace: Option<&str>) -> bool {
    key.resource == resource && namespace.is_none_or(|ns| key.namespace == ns)
}

/// Implements the reads of [`Store`] (everything but `commit`,
/// `commit_or_return` and `fenced`) by calling the same methods on the
/// store in field `$inner`: for a store that wraps another and changes only
/// how it writes (a leadership term's fence, retries). Written inside the
/// wrapper's `impl Store`.
#[macro_export]
macro_rules! forward_store_reads {
    ($inner:ident) => {
        fn get(&self, key: &$crate::store::Key) -> Option<$crate::store::Object> {
            $crate::store::Store::get(&*self.$inner, key)
        }

        fn revision_of(&self, key: &$crate::store::Key) -> Option<$crate::store::Rv> {
            $crate::store::Store::revision_of(&*self.$inner, key)
        }

        fn get_raw(
            &self,
            key: &$crate::store::Key,
        ) -> Option<($crate::store::Rv, std::sync::Arc<[u8]>)> {
            $crate::store::Store::get_raw(&*self.$inner, key)
        }

        fn keep_written(&self, resource: &str) {
            $crate::store::Store::keep_written(&*self.$inner, resource)
        }

        fn list(
            &self,
            resource: &str,
            namespace: Option<&str>,
        ) -> (Vec<$crate::store::Object>, $crate::store::Rv) {
            $crate::store::Store::list(&*self.$inner, resource, namespace)
        }

        fn watch(
            &self,
            resource: &str,
            namespace: Option<&str>,
            since: Option<$crate::store::Rv>,
        ) -> Result<$crate::store::Watch, $crate::store::StoreError> {
            $crate::store::Store::watch(&*self.$inner, resource, namespace, since)
        }

        fn revision(&self) -> $crate::store::Rv {
            $crate::store::Store::revision(&*self.$inner)
        }

        fn list_raw(
            &self,
            resource: &str,
            namespace: Option<&str>,
            after: Option<(&str, &str)>,
            at: Option<$crate::store::Rv>,
        ) -> $crate::store::RawListFuture<'_> {
            $crate::store::Store::list_raw(&*self.$inner, resource, namespace, after, at)
        }
    };
}

/// The hub's storage.
pub trait Store: Send + Sync + 'static {
    fn get(&self, key: &Key) -> Option<Object>;

    /// The resourceVersion of the object at `key`, without decoding it: for
    /// a reader that keeps what it made of a version (and only needs the
    /// object when that version is new to it).
    fn revision_of(&self, key: &Key) -> Option<Rv> {
        self.get(key).map(|o| o.rv)
    }

    /// The object at `key` as its stored JSON (which need not hold
    /// `metadata.resourceVersion`) and its resourceVersion: for a reader
    /// that wants a few fields of a large object and parses only those.
    /// By default encoded from [`Store::get`].
    fn get_raw(&self, key: &Key) -> Option<(Rv, Arc<[u8]>)> {
        let object = self.get(key)?;
        let bytes = serde_json::to_vec(&*object.value).ok()?;
        Some((object.rv, bytes.into()))
    }

    /// Keeps the objects of `resource` decoded as they are written, for a
    /// reader that reads most of them back soon after; by default, and for
    /// any other resource, a write only refreshes an object a read decoded.
    /// Only where the writer hands the cache what it wrote (redb's writer;
    /// an etcd replica learns every write from etcd's watch, as bytes).
    fn keep_written(&self, _resource: &str) {}

    /// Objects of `resource` (in `namespace`, or all), sorted by key, and the
    /// resourceVersion the list is consistent at.
    fn list(&self, resource: &str, namespace: Option<&str>) -> (Vec<Object>, Rv);

    /// Commits `ops` atomically: all or none. Returns the stored objects (for
    /// `Delete`, the last state) in order. Durable before it resolves.
    fn commit(&self, ops: Vec<Op>) -> CommitFuture<'_>;

    /// Commits `ops` as [`Store::commit`] does; a commit refused before it
    /// was written (a precondition, a key, a term) hands its operations
    /// back, so a caller can try them again, or some of them, without
    /// having kept a copy. After a failed write to storage they may be
    /// gone (an empty list). This default keeps a copy; a store that can
    /// return them does better.
    fn commit_or_return(&self, ops: Vec<Op>) -> ReturningFuture<'_> {
        let copy = ops.clone();
        let commit = self.commit(ops);
        Box::pin(async move { commit.await.map_err(|e| (e, copy)) })
    }

    /// Events of `resource` (in `namespace`, or all) after `since`; `None`
    /// means from now.
    fn watch(
        &self,
        resource: &str,
        namespace: Option<&str>,
        since: Option<Rv>,
    ) -> Result<Watch, StoreError>;

    /// The latest committed resourceVersion.
    fn revision(&self) -> Rv;

    /// Objects of `resource` (in `namespace`, or all) whose (namespace,
    /// name) comes after `after`, sorted by key, encoded, and the
    /// resourceVersion they are consistent at: what a paged list (limit and
    /// continue) decodes only as far as it needs. `at` is a continue token's
    /// resourceVersion: etcd reads at that revision ([`StoreError::Gone`] once
    /// it is compacted); a store that keeps no old versions (redb) answers
    /// from its latest state. `None`: the latest state.
    fn list_raw(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        at: Option<Rv>,
    ) -> RawListFuture<'_>;

    /// This store, its commits fenced by `term`: each commit also checks
    /// that the term is current and fails with [`StoreError::Fenced`] once
    /// it is not. Reads are unchanged. A store only one process writes
    /// (redb) has a single term and returns itself.
    fn fenced(self: Arc<Self>, term: Term) -> Arc<dyn Store>;
}
