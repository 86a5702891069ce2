//! The replicated store: etcd's v3 API, with a watch cache per replica, as
//! kube-apiserver stores objects.
//!
//! # Layout
//! An object lives at `PREFIX` + `registry/` + `RESOURCE|NAMESPACE|NAME`
//! (e.g. `/trainhub/registry/trainer.kubeflow.org/trainjobs|default|j1`;
//! `|` cannot occur in names, see [`Key::is_storable`]), its value the
//! object's JSON without `metadata.resourceVersion`: the resourceVersion
//! is etcd's `mod_revision`, stamped when read. The compactor's key is
//! `PREFIX` + `compact_rev_key`.
//!
//! # Guarantees
//! - A commit is all its writes or none, at one revision. Create compares
//!   `create_revision == 0`; Update and Delete compare `mod_revision` with
//!   the expected resourceVersion (or that the key exists); Put and Remove
//!   are unconditional. A refused commit names the failing key.
//! - Commits that wait while others are in flight go to etcd together, in
//!   one transaction (see `committer`), and so share a revision; each
//!   still succeeds or fails on its own preconditions.
//! - A commit returns once this replica's watch cache has applied its
//!   revision, so a replica never reads older than what it wrote, and its
//!   reads never go back in time.
//! - Reads (get, list, watch) are served from the cache, which one etcd
//!   watch on the prefix feeds from the revision it loaded at. A broken
//!   watch resumes from the last revision seen; a compacted one makes the
//!   cache relist, and watches from before the relist get
//!   [`StoreError::Gone`].
//! - A progress request after each quiet second moves the cache's revision
//!   forward while nothing changes, so watch bookmarks carry a current
//!   resourceVersion. (etcd before 3.4.26 may answer one ahead of events it
//!   has yet to send; a change that arrives so still lands in order in the
//!   history.)

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use serde_json::Value;

use super::cache::{Cache, Change, Stored, decode, set_rv};
use super::{
    CommitFuture, EventType, Key, Object, Op, RawListFuture, RawObject, ReturningFuture, Rv, Store,
    StoreError, Term, Watch, readable,
};

mod local;
pub use self::local::LocalEtcd;

/// Where etcd is and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct EtcdConfig {
    /// Client URLs or `host:port`s (`http://` or `https://`).
    pub endpoints: Vec<String>,
    /// PEM: the CA that signs etcd's serving certificates.
    pub ca_file: Option<PathBuf>,
    /// PEM: this client's certificate and key (etcd `--client-cert-auth`).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Every key the hub writes starts with this (e.g. `/trainhub/`), so
    /// several hubs (or other users) can share one etcd.
    pub prefix: String,
}

impl EtcdConfig {
    /// A connected client, with TLS when a CA or client certificate is set.
    pub async fn connect(&self) -> Result<etcd_client::Client, StoreError> {
        let read = |p: &PathBuf| {
            std::fs::read(p)
                .map_err(|e| StoreError::Storage(format!("reading {}: {e}", p.display())))
        };
        let mut options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(5))
            .with_keep_alive(
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(5),
            )
            .with_keep_alive_while_idle(true);
        if self.ca_file.is_some() || self.cert_file.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &self.ca_file {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
            }
            match (&self.cert_file, &self.key_file) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
                }
                (None, None) => {}
                _ => {
                    return Err(StoreError::Storage(
                        "etcd: a client certificate needs both its certificate and its key file"
                            .into(),
                    ));
                }
            }
            options = options.with_tls(tls);
        }
        etcd_client::Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(|e| {
                StoreError::Storage(format!("connecting to etcd {:?}: {e}", self.endpoints))
            })
    }
}

/// Knobs of an [`EtcdStore`] beyond where etcd is.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// How often the compactor runs (kube-apiserver's
    /// `--etcd-compaction-interval`, 5 minutes); zero disables it. Each run
    /// compacts to the revision the previous run saw, and only one replica
    /// per interval does (they agree through the compactor's key).
    pub compaction_interval: Duration,
    /// Bytes of objects this replica writes after which the compactor runs
    /// without waiting for the rest of its interval (0: by time only).
    /// Between two compactions etcd keeps every version written, so a
    /// tenant updating a large object in a loop would otherwise fill etcd's
    /// quota (2 GiB by default) within one interval; with this, etcd holds
    /// at most about two such windows of old versions.
    pub compaction_bytes: usize,
    /// How often the cache asks etcd for watch progress while idle.
    pub progress_interval: Duration,
    /// How long a commit waits for this replica's cache to apply it.
    pub commit_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            compaction_interval: Duration::from_secs(300),
            compaction_bytes: 256 << 20,
            progress_interval: Duration::from_secs(1),
            commit_timeout: Duration::from_secs(10),
        }
    }
}

/// Objects read per range request when loading.
const LOAD_PAGE: i64 = 5_000;
/// The message kube-apiserver answers a continue token at a compacted
/// revision with.
pub const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results.";

/// The etcd-backed [`super::Store`].
pub struct EtcdStore {
    client: Client,
    /// `PREFIX` + `registry/`.
    registry: String,
    prefix: String,
    cache: Arc<Cache>,
    options: EtcdOptions,
    /// To the committer, which sends commits to etcd.
    commits: tokio::sync::mpsc::UnboundedSender<Pending>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    written: Arc<Written>,
}

/// Bytes this replica wrote since the compactor last ran, and the
/// compactor's call to run early.
#[derive(Default)]
struct Written {
    bytes: std::sync::atomic::AtomicUsize,
    past_threshold: tokio::sync::Notify,
}

impl Written {
    /// Counts `bytes` written; the compactor is called when they take the
    /// count past `threshold` (0: never).
    fn add(&self, bytes: usize, threshold: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let before = self.bytes.fetch_add(bytes, Relaxed);
        if threshold > 0 && before < threshold && before + bytes >= threshold {
            self.past_threshold.notify_one();
        }
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

fn etcd_error(what: &str, e: etcd_client::Error) -> StoreError {
    StoreError::Storage(format!("etcd: {what}: {e}"))
}

/// Whether the request never left this process: the client picked a
/// member it cannot connect to (a killed one, until its balancer notices).
/// Such a request is safe to send again, even a create.
fn unsent(e: &etcd_client::Error) -> bool {
    e.to_string().contains("tcp connect error")
}

/// Tries a request that failed [`unsent`] again, a few times.
async fn resend<T, F, Fut>(mut request: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let mut tries = 0;
    loop {
        match request().await {
            Err(e) if unsent(&e) && tries < 10 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20 * tries)).await;
            }
            answer => return answer,
        }
    }
}

/// The largest response this store reads from etcd: gRPC's default (4
/// MiB) is less than a page of large objects, or than the watch event of a
/// transaction that writes several.
const MAX_RESPONSE: usize = 64 << 20;

/// The client's key-value service, reading responses up to `max` bytes.
fn kv(client: &Client, max: usize) -> etcd_client::KvClient {
    client.kv_client().max_decoding_message_size(max)
}

/// Whether etcd refused a request as larger than it takes: gRPC's limit
/// (`--max-request-bytes` plus 512 KiB), or etcd's own.
fn refused_as_too_large(e: &etcd_client::Error) -> bool {
    let e = e.to_string();
    e.contains("received message larger than max") || e.contains("request is too large")
}

/// Whether etcd's answer was larger than the client reads.
fn too_large(e: &etcd_client::Error) -> bool {
    e.to_string().contains("decoded message length too large")
}

/// One page of a range read from `start` with `options` (no limit set), of
/// at most `*limit` keys. A page too large to read (over `max` bytes) is
/// asked for again with half as many keys, and `*limit` keeps the smaller
/// size for the next pages, so objects of any size load, however many a
/// page would hold.
async fn range_page(
    client: &Client,
    start: &[u8],
    options: &GetOptions,
    limit: &mut i64,
    max: usize,
) -> Result<etcd_client::GetResponse, etcd_client::Error> {
    loop {
        let options = options.clone().with_limit(*limit);
        let page = resend(|| {
            let mut kv = kv(client, max);
            let (start, options) = (start.to_vec(), options.clone());
            async move { kv.get(start, Some(options)).await }
        })
        .await;
        match page {
            Err(e) if too_large(&e) && *limit > 1 => *limit = (*limit / 2).max(1),
            page => return page,
        }
    }
}

fn is_compacted(e: &etcd_client::Error) -> bool {
    e.to_string()
        .contains("required revision has been compacted")
}

/// etcd revisions are `i64`; resourceVersions `u64`.
fn rev(r: i64) -> Rv {
    Rv::try_from(r).unwrap_or(0)
}

fn etcd_rev(r: Rv) -> i64 {
    i64::try_from(r).unwrap_or(i64::MAX)
}

fn header_rev(header: Option<&etcd_client::ResponseHeader>) -> Rv {
    header.map(|h| rev(h.revision())).unwrap_or(0)
}

impl EtcdStore {
    /// Connects, loads the objects under the prefix into this replica's
    /// watch cache and starts following etcd's watch. `history` events are
    /// kept for resuming watches.
    pub async fn open(config: &EtcdConfig, history: usize) -> Result<Arc<EtcdStore>, StoreError> {
        Self::open_with(config, history, EtcdOptions::default()).await
    }

    /// As [`EtcdStore::open`], with `options`.
    pub async fn open_with(
        config: &EtcdConfig,
        history: usize,
        options: EtcdOptions,
    ) -> Result<Arc<EtcdStore>, StoreError> {
        let client = config.connect().await?;
        let prefix = if config.prefix.is_empty() || config.prefix.ends_with('/') {
            config.prefix.clone()
        } else {
            format!("{}/", config.prefix)
        };
        let registry = format!("{prefix}registry/");
        let (objects, rv) = load(&client, &registry, None).await?;
        let cache = Arc::new(Cache::new(objects, rv, VecDeque::new(), history));
        let (commits, committing) = tokio::sync::mpsc::unbounded_channel();
        let store = EtcdStore {
            client: client.clone(),
            registry: registry.clone(),
            prefix: prefix.clone(),
            cache: cache.clone(),
            options: options.clone(),
            commits,
            tasks: Mutex::new(Vec::new()),
            written: Arc::default(),
        };
        let committer = tokio::spawn(committer(client.clone(), committing));
        let follow = tokio::spawn(follow(
            client.clone(),
            registry,
            cache,
            rv,
            options.progress_interval,
        ));
        let mut tasks = vec![follow.abort_handle(), committer.abort_handle()];
        if !options.compaction_interval.is_zero() {
            let compactor = tokio::spawn(compactor(
                client,
                format!("{prefix}compact_rev_key"),
                options.compaction_interval,
                store.written.clone(),
            ));
            tasks.push(compactor.abort_handle());
        }
        *store.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
        Ok(Arc::new(store))
    }

    /// The client the store uses (the hub's leader election shares it).
    pub fn client(&self) -> etcd_client::Client {
        self.client.clone()
    }

    /// The key prefix every key of this store starts with (ends in `/`
    /// unless empty).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Compacts etcd's history at `rv` (physically, waiting for it) and
    /// forgets this replica's watch history up to `rv`: watches and
    /// continue tokens from before get 410 Gone, as after the compactor ran.
    pub async fn compact(&self, rv: Rv) -> Result<(), StoreError> {
        let mut client = self.client.clone();
        match client
            .compact(
                etcd_rev(rv),
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if is_compacted(&e) => {}
            Err(e) => return Err(etcd_error("compacting", e)),
        }
        self.cache.compact(rv);
        Ok(())
    }

    fn etcd_key(&self, key: &Key) -> String {
        format!("{}{}", self.registry, key.encode())
    }

    /// Checks `ops`, hands them to the committer (which may send them in
    /// one etcd transaction with other callers' commits) and waits for its
    /// answer, then for this replica's cache to apply the revision.
    /// Commits `ops` (fenced by `term`, if any); a commit refused before it
    /// was written (a precondition, a key, the term) hands its operations
    /// back, one that failed in etcd or after does not.
    async fn commit_in(
        &self,
        ops: Vec<Op>,
        term: Option<&Term>,
    ) -> Result<Vec<Object>, (StoreError, Vec<Op>)> {
        let parts = match self.prepare(&ops) {
            Ok(parts) => parts,
            Err(e) => return Err((e, ops)),
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let bytes = parts.bytes;
        let pending = Pending {
            ops,
            parts,
            term: term.cloned(),
            reply,
        };
        if let Err(tokio::sync::mpsc::error::SendError(pending)) = self.commits.send(pending) {
            return Err((
                StoreError::Storage("etcd store: the committer has stopped".into()),
                pending.ops,
            ));
        }
        let (results, revision) = answer.await.map_err(|_| {
            (
                StoreError::Storage("etcd store: the committer stopped before answering".into()),
                Vec::new(),
            )
        })??;
        self.written.add(bytes, self.options.compaction_bytes);
        if let Some(revision) = revision {
            self.cache
                .wait_for(revision, self.options.commit_timeout)
                .await
                .map_err(|e| (e, Vec::new()))?;
        }
        Ok(results)
    }

    /// The transaction's parts for `ops`.
    fn prepare(&self, ops: &[Op]) -> Result<Parts, StoreError> {
        readable(ops)?;
        let mut seen = std::collections::HashSet::new();
        for op in ops {
            let key = op.key();
            if !key.is_storable() {
                return Err(StoreError::InvalidKey(key.clone()));
            }
            if !seen.insert(key.clone()) {
                return Err(StoreError::Storage(format!(
                    "{key}: one commit writes this key twice; etcd takes one write per key and transaction"
                )));
            }
        }
        let mut compares = Vec::new();
        let mut writes = Vec::with_capacity(ops.len());
        let mut reads = Vec::with_capacity(ops.len());
        let (mut bytes, mut reply_bytes) = (0, 0);
        for op in ops {
            let k = self.etcd_key(op.key());
            bytes += k.len();
            if matches!(op, Op::Delete { .. } | Op::Remove { .. }) {
                reply_bytes += self.cache.stored(op.key()).map_or(0, |s| s.bytes.len());
            }
            match op {
                Op::Create { value, .. } => {
                    compares.push(Compare::create_revision(k.clone(), CompareOp::Equal, 0));
                    let value = encode(value)?;
                    bytes += value.len();
                    writes.push(TxnOp::put(k.clone(), value, None));
                }
                Op::Update {
                    value, expected, ..
                } => {
                    compares.push(precondition(&k, *expected));
                    let value = encode(value)?;
                    bytes += value.len();
                    writes.push(TxnOp::put(k.clone(), value, None));
                }
                Op::Delete { expected, .. } => {
                    compares.push(precondition(&k, *expected));
                    writes.push(TxnOp::delete(
                        k.clone(),
                        Some(DeleteOptions::new().with_prev_key()),
                    ));
                }
                Op::Put { value, .. } => {
                    let value = encode(value)?;
                    bytes += value.len();
                    writes.push(TxnOp::put(k.clone(), value, None));
                }
                Op::Remove { .. } => writes.push(TxnOp::delete(
                    k.clone(),
                    Some(DeleteOptions::new().with_prev_key()),
                )),
            }
            reads.push(TxnOp::get(k, Some(GetOptions::new().with_keys_only())));
        }
        Ok(Parts {
            compares,
            writes,
            reads,
            bytes,
            reply_bytes,
        })
    }

    /// The encoded objects of `resource` (in `namespace`) after (namespace,
    /// name) `after`, read from etcd at revision `rv`, in key order (the
    /// cache's order, which etcd's byte order of the keys is not).
    async fn list_raw_at(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        rv: Rv,
    ) -> Result<(Vec<RawObject>, Rv), StoreError> {
        let scope = match namespace {
            Some(ns) => format!("{}{resource}|{ns}|", self.registry),
            None => format!("{}{resource}|", self.registry),
        };
        let client = self.client.clone();
        let mut items = Vec::new();
        let mut start = scope.clone().into_bytes();
        let end = prefix_end(scope.as_bytes());
        let options = GetOptions::new()
            .with_range(end)
            .with_revision(etcd_rev(rv));
        let mut limit = LOAD_PAGE;
        loop {
            let page = range_page(&client, &start, &options, &mut limit, MAX_RESPONSE)
                .await
                .map_err(|e| {
                    if is_compacted(&e) {
                        StoreError::Gone {
                            requested: rv,
                            oldest: rv + 1,
                        }
                    } else {
                        etcd_error("listing", e)
                    }
                })?;
            for kv in page.kvs() {
                if let Some(key) = parse_key(&self.registry, kv.key())
                    && after.is_none_or(|(ns, name)| {
                        (key.namespace.as_str(), key.name.as_str()) > (ns, name)
                    })
                {
                    items.push(RawObject {
                        key,
                        rv: rev(kv.mod_revision()),
                        bytes: Arc::from(kv.value()),
                    });
                }
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => break,
            }
        }
        items.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((items, rv))
    }
}

/// The compare of an Update or Delete: the expected resourceVersion, or
/// that the key exists.
fn precondition(key: &str, expected: Option<Rv>) -> Compare {
    match expected {
        Some(rv) => Compare::mod_revision(key, CompareOp::Equal, etcd_rev(rv)),
        None => Compare::create_revision(key, CompareOp::Greater, 0),
    }
}

/// Why `ops` cannot commit, from their keys as read in a refused
/// transaction's failure branch (`answers`, one per op, read at the
/// revision the compares were evaluated at): the first op whose
/// precondition fails; `None` when every one holds.
fn refused(ops: &[Op], answers: &[TxnOpResponse]) -> Option<StoreError> {
    let current = |i: usize| -> Option<Rv> {
        match answers.get(i) {
            Some(TxnOpResponse::Get(range)) => range.kvs().first().map(|kv| rev(kv.mod_revision())),
            _ => None,
        }
    };
    for (i, op) in ops.iter().enumerate() {
        let key = op.key().clone();
        match (op, current(i)) {
            (Op::Create { .. }, Some(_)) => return Some(StoreError::AlreadyExists(key)),
            (Op::Update { .. } | Op::Delete { .. }, None) => {
                return Some(StoreError::NotFound(key));
            }
            (
                Op::Update {
                    expected: Some(expected),
                    ..
                }
                | Op::Delete {
                    expected: Some(expected),
                    ..
                },
                Some(current),
            ) if *expected != current => {
                return Some(StoreError::Conflict {
                    key,
                    expected: *expected,
                    current,
                });
            }
            _ => {}
        }
    }
    None
}

/// Transactions sent to etcd at once. While one is in flight, the commits
/// that arrive wait, and go together in the next. One: measured against
/// two, four and eight with 32 clients creating (docs/benchmarks.md), one
/// makes the largest transactions and costs etcd's members the least CPU
/// per commit, which is what limits a hub sharing its cores with them.
const COMMITS_IN_FLIGHT: usize = 1;
/// Operations of commits merged into one transaction: etcd refuses more
/// than 128 compares, or writes, or reads in a failure branch (its default
/// `--max-txn-ops`), and the fencing term takes one compare and one read.
const MERGED_OPS: usize = 127;
/// Bytes of keys and values merged into one transaction, under etcd's
/// default `--max-request-bytes` (1.5 MiB).
const MERGED_BYTES: usize = 1 << 20;
/// Bytes of deleted objects (a deletion's answer carries the object)
/// merged into one transaction's answer, well under what the hub reads
/// ([`MAX_RESPONSE`]): deletions are small to send and their answers are
/// not, so 127 of large objects merged would be an answer too large to
/// read, failing every commit in it though etcd wrote them.
const MERGED_REPLY_BYTES: usize = MAX_RESPONSE / 4;

/// What a commit gets back from the committer: the stored objects, and the
/// revision to wait for when it wrote.
/// A commit's part of a transaction.
struct Parts {
    /// One per Create, Update and Delete.
    compares: Vec<Compare>,
    /// One per op.
    writes: Vec<TxnOp>,
    /// One per op: the key (no value), for saying why a transaction was
    /// refused.
    reads: Vec<TxnOp>,
    /// Its keys and values.
    bytes: usize,
    /// What its answer carries: the objects it deletes, as the cache
    /// holds them.
    reply_bytes: usize,
}

/// A commit's answer: what it stored and the revision, or why it was
/// refused with its operations back (none after a failure in etcd).
type Committed = Result<(Vec<Object>, Option<Rv>), (StoreError, Vec<Op>)>;

/// One commit on its way to etcd: its ops, checked, and its part of a
/// transaction.
struct Pending {
    ops: Vec<Op>,
    parts: Parts,
    term: Option<Term>,
    reply: tokio::sync::oneshot::Sender<Committed>,
}

/// Sends the commits that callers hand over, merging those waiting into
/// one transaction, as redb's writer merges them into one write
/// transaction: much of etcd's cost is per transaction (a request, a raft
/// entry, a backend write, a watch response) rather than per key.
///
/// Merged commits write disjoint keys, in the name of the same term (or
/// none), within etcd's limits; they share one revision, as the writes of
/// one commit always have (a watch resumed from a revision of several
/// changes replays all of them, see [`Cache::watch`]). A merged
/// transaction whose compares fail answers, from the keys it read, the
/// commits whose own preconditions (or term) fail with their error, as
/// each would have been refused alone at that revision, and sends the
/// others again: one conflicting commit never fails its neighbours.
async fn committer(client: Client, mut commits: tokio::sync::mpsc::UnboundedReceiver<Pending>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(COMMITS_IN_FLIGHT));
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        if waiting.is_empty() {
            match commits.recv().await {
                Some(pending) => waiting.push_back(pending),
                None => return,
            }
        }
        while let Ok(pending) = commits.try_recv() {
            waiting.push_back(pending);
        }
        let batch = take_batch(&mut waiting);
        if batch.is_empty() {
            continue;
        }
        let client = client.clone();
        tokio::spawn(async move {
            send(&client, batch).await;
            drop(slot);
        });
    }
}

/// The first waiting commit and those after it that can go in the same
/// transaction; the rest stay waiting, in order. A commit that shares a key
/// with one taken (or with one left waiting before it) stays, so commits of
/// one key go in the order they came. Commits whose callers have gone are
/// dropped.
fn take_batch(waiting: &mut VecDeque<Pending>) -> Vec<Pending> {
    waiting.retain(|p| !p.reply.is_closed());
    let Some(first) = waiting.pop_front() else {
        return Vec::new();
    };
    let mut keys: std::collections::HashSet<Key> =
        first.ops.iter().map(|op| op.key().clone()).collect();
    let mut blocked: std::collections::HashSet<Key> = std::collections::HashSet::new();
    let (mut ops, mut bytes, mut reply) =
        (first.ops.len(), first.parts.bytes, first.parts.reply_bytes);
    let mut batch = vec![first];
    let mut i = 0;
    while i < waiting.len() && ops < MERGED_OPS {
        let p = &waiting[i];
        let fits = p.term == batch[0].term
            && ops + p.ops.len() <= MERGED_OPS
            && bytes + p.parts.bytes <= MERGED_BYTES
            && reply + p.parts.reply_bytes <= MERGED_REPLY_BYTES
            && p.ops
                .iter()
                .all(|op| !keys.contains(op.key()) && !blocked.contains(op.key()));
        if !fits {
            blocked.extend(p.ops.iter().map(|op| op.key().clone()));
            i += 1;
            continue;
        }
        if let Some(p) = waiting.remove(i) {
            ops += p.ops.len();
            bytes += p.parts.bytes;
            reply += p.parts.reply_bytes;
            keys.extend(p.ops.iter().map(|op| op.key().clone()));
            batch.push(p);
        }
    }
    batch
}

/// Commits `batch` (disjoint keys, one term) and answers each caller.
async fn send(client: &Client, batch: Vec<Pending>) {
    let mut rounds = vec![batch];
    while let Some(batch) = rounds.pop() {
        let tried = batch.len();
        let rest = attempt(client, batch).await;
        if rest.len() < tried {
            // Some were answered: the rest go together again.
            if !rest.is_empty() {
                rounds.push(rest);
            }
        } else {
            // None could be told apart (not expected): each alone.
            rounds.extend(rest.into_iter().map(|p| vec![p]));
        }
    }
}

/// One transaction of `batch`'s commits. Answers those it committed or
/// that are refused, and returns the others: those a neighbour's failed
/// compare held back.
async fn attempt(client: &Client, batch: Vec<Pending>) -> Vec<Pending> {
    let term = batch.first().and_then(|p| p.term.clone());
    let mut compares = Vec::new();
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    for p in &batch {
        compares.extend(p.parts.compares.iter().cloned());
        writes.extend(p.parts.writes.iter().cloned());
        reads.extend(p.parts.reads.iter().cloned());
    }
    if let Some(term) = &term {
        compares.push(Compare::create_revision(
            term.key.clone(),
            CompareOp::Equal,
            etcd_rev(term.revision),
        ));
        reads.push(TxnOp::get(
            term.key.clone(),
            Some(GetOptions::new().with_keys_only()),
        ));
    }
    let txn = Txn::new().when(compares).and_then(writes).or_else(reads);
    let response = match resend(|| {
        let mut kv = kv(client, MAX_RESPONSE);
        let txn = txn.clone();
        async move { kv.txn(txn).await }
    })
    .await
    {
        Ok(response) => response,
        Err(e) => {
            let e = if refused_as_too_large(&e) {
                StoreError::TooLarge(format!(
                    "the write is larger than etcd takes in one request (its --max-request-bytes, 1.5 MiB unless set): {e}"
                ))
            } else {
                etcd_error("committing", e)
            };
            for p in batch {
                let _ = p.reply.send(Err((e.clone(), Vec::new())));
            }
            return Vec::new();
        }
    };
    let revision = header_rev(response.header());
    let answers = response.op_responses();
    // Each commit's answers, in order.
    let mut parts = Vec::with_capacity(batch.len());
    let mut offset = 0;
    for p in &batch {
        parts.push(
            answers
                .get(offset..offset + p.ops.len())
                .unwrap_or_default(),
        );
        offset += p.ops.len();
    }
    if response.succeeded() {
        for (p, answers) in batch.into_iter().zip(parts) {
            let _ = p.reply.send(Ok(stored(p.ops, answers, revision)));
        }
        return Vec::new();
    }
    let fenced = term.as_ref().and_then(|term| {
        let current = match answers.last() {
            Some(TxnOpResponse::Get(range)) => range.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        };
        (current != Some(etcd_rev(term.revision))).then_some(StoreError::Fenced(term.revision))
    });
    let alone = batch.len() == 1;
    let mut rest = Vec::new();
    for (p, answers) in batch.into_iter().zip(parts) {
        match refused(&p.ops, answers).or_else(|| fenced.clone()) {
            Some(e) => {
                let _ = p.reply.send(Err((e, p.ops)));
            }
            None if alone => {
                let _ = p.reply.send(Err((
                    StoreError::Storage(
                        "etcd refused the transaction, yet every precondition holds".into(),
                    ),
                    p.ops,
                )));
            }
            None => rest.push(p),
        }
    }
    rest
}

/// What a committed commit's caller gets: the stored objects (for a
/// deletion, the last state) and the revision, if it wrote.
fn stored(ops: Vec<Op>, answers: &[TxnOpResponse], revision: Rv) -> (Vec<Object>, Option<Rv>) {
    let mut results = Vec::with_capacity(ops.len());
    let mut wrote = false;
    for (op, answer) in ops.into_iter().zip(answers) {
        match (op, answer) {
            (
                Op::Create { key, mut value }
                | Op::Update { key, mut value, .. }
                | Op::Put { key, mut value },
                _,
            ) => {
                wrote = true;
                set_rv(&mut value, revision);
                results.push(Object {
                    key,
                    rv: revision,
                    value: Arc::new(value),
                });
            }
            (Op::Delete { key, .. } | Op::Remove { key }, TxnOpResponse::Delete(deleted)) => {
                wrote |= deleted.deleted() > 0;
                if let Some(prev) = deleted.prev_kvs().first()
                    && let Some(object) = decode(&key, revision, prev.value())
                {
                    results.push(object);
                }
            }
            _ => {}
        }
    }
    (results, wrote.then_some(revision))
}

/// The object's JSON as stored: without `metadata.resourceVersion`.
fn encode(value: &Value) -> Result<Vec<u8>, StoreError> {
    let mut value = value.clone();
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    serde_json::to_vec(&value).map_err(|e| StoreError::Storage(format!("encoding: {e}")))
}

/// The key after every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn parse_key(registry: &str, raw: &[u8]) -> Option<Key> {
    let key = std::str::from_utf8(raw).ok()?.strip_prefix(registry)?;
    Key::decode(key)
}

/// Every object under `registry`, at `at` or the latest revision, and the
/// revision.
async fn load(
    client: &Client,
    registry: &str,
    at: Option<Rv>,
) -> Result<(BTreeMap<Key, Stored>, Rv), StoreError> {
    let client = client.clone();
    let end = prefix_end(registry.as_bytes());
    let mut start = registry.as_bytes().to_vec();
    let mut objects = BTreeMap::new();
    let mut revision = at.unwrap_or(0);
    let mut limit = LOAD_PAGE;
    loop {
        let mut options = GetOptions::new().with_range(end.clone());
        if revision > 0 {
            options = options.with_revision(etcd_rev(revision));
        }
        let page = range_page(&client, &start, &options, &mut limit, MAX_RESPONSE)
            .await
            .map_err(|e| etcd_error("loading", e))?;
        if revision == 0 {
            revision = header_rev(page.header());
        }
        for kv in page.kvs() {
            match parse_key(registry, kv.key()) {
                Some(key) => {
                    objects.insert(
                        key,
                        Stored {
                            rv: rev(kv.mod_revision()),
                            bytes: kv.value().into(),
                        },
                    );
                }
                None => tracing::warn!(
                    key = %String::from_utf8_lossy(kv.key()),
                    "etcd store: a key under the prefix that is not an object's is skipped"
                ),
            }
        }
        match page.kvs().last() {
            Some(last) if page.more() => {
                start = last.key().to_vec();
                start.push(0);
            }
            _ => break,
        }
    }
    Ok((objects, revision))
}

/// How a watch stream ended.
enum Ended {
    /// etcd compacted past where the watch was: relist.
    Compacted,
}

/// Feeds the cache from one etcd watch for as long as the store lives.
async fn follow(
    client: Client,
    registry: String,
    cache: Arc<Cache>,
    loaded: Rv,
    progress: Duration,
) {
    let mut last = loaded;
    let mut backoff = Duration::from_millis(100);
    loop {
        match watch_once(&client, &registry, &cache, &mut last, progress).await {
            Ok(Ended::Compacted) => {
                tracing::warn!(
                    revision = last,
                    "etcd store: the watch fell behind a compaction; relisting"
                );
                match load(&client, &registry, None).await {
                    Ok((objects, rv)) => {
                        cache.reset(objects, rv);
                        last = rv;
                        backoff = Duration::from_millis(100);
                        continue;
                    }
                    Err(e) => tracing::warn!(error = %e, "etcd store: relisting"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, revision = last, "etcd store: the watch broke; resuming");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn watch_once(
    client: &Client,
    registry: &str,
    cache: &Cache,
    last: &mut Rv,
    progress: Duration,
) -> Result<Ended, StoreError> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(etcd_rev(*last + 1))
        .with_progress_notify();
    // No previous values: a deletion's is the cache's (its last version
    // before the deletion, as the events come in order), and with them
    // one transaction's events could be many times what it wrote.
    let stream = client
        .watch_client()
        .max_decoding_message_size(MAX_RESPONSE)
        .watch(registry, Some(options))
        .await
        .map_err(|e| etcd_error("watching", e))?;
    let (mut requests, mut responses) = stream.split();
    let mut tick = tokio::time::interval(progress.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Progress is asked for only after a tick without events: events move
    // the cache along anyway, and an idle watch is a caught-up one (etcd
    // before 3.4.26 answers a progress request with its own revision even
    // while the watch still has events to send).
    let mut quiet = false;
    loop {
        tokio::select! {
            message = responses.message() => {
                let Some(response) = message.map_err(|e| etcd_error("watching", e))? else {
                    return Err(StoreError::Storage("etcd closed the watch".into()));
                };
                if response.canceled() {
                    if response.compact_revision() > 0 {
                        return Ok(Ended::Compacted);
                    }
                    return Err(StoreError::Storage(format!(
                        "etcd cancelled the watch: {}",
                        response.cancel_reason()
                    )));
                }
                if response.created() && response.events().is_empty() {
                    continue;
                }
                if response.events().is_empty() {
                    // A progress notification: nothing under the prefix
                    // changed up to its revision.
                    cache.advance(header_rev(response.header()));
                    continue;
                }
                let mut changes = Vec::with_capacity(response.events().len());
                // What this response put, for a deletion after it in it.
                let mut put: HashMap<Key, Arc<[u8]>> = HashMap::new();
                let mut top = *last;
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let Some(key) = parse_key(registry, kv.key()) else { continue };
                    let at = rev(kv.mod_revision());
                    top = top.max(at);
                    let change = match event.event_type() {
                        etcd_client::EventType::Put => {
                            let bytes: Arc<[u8]> = kv.value().into();
                            put.insert(key.clone(), bytes.clone());
                            Change {
                                kind: if kv.version() == 1 {
                                    EventType::Added
                                } else {
                                    EventType::Modified
                                },
                                key,
                                rv: at,
                                bytes,
                                value: None,
                            }
                        }
                        etcd_client::EventType::Delete => {
                            let last = put.remove(&key).or_else(|| cache.stored(&key).map(|s| s.bytes));
                            let bytes: Arc<[u8]> = match last {
                                Some(last) => last,
                                None => serde_json::to_vec(&serde_json::json!({
                                    "metadata": {"name": key.name, "namespace": key.namespace}
                                }))
                                .unwrap_or_default()
                                .into(),
                            };
                            Change {
                                kind: EventType::Deleted,
                                key,
                                rv: at,
                                bytes,
                                value: None,
                            }
                        }
                    };
                    changes.push(change);
                }
                cache.apply(changes, top);
                *last = top;
                quiet = false;
            }
            _ = tick.tick() => {
                if quiet {
                    requests
                        .request_progress()
                        .await
                        .map_err(|e| etcd_error("requesting watch progress", e))?;
                }
                quiet = true;
            }
        }
    }
}

/// kube-apiserver's compactor: every `interval`, compact to the revision
/// the previous run saw, unless another replica ran in between (the
/// compactor key's version is the shared clock). It also runs as soon as
/// this replica has written `EtcdOptions::compaction_bytes` since its last
/// run, and its interval starts again from there.
async fn compactor(client: Client, key: String, interval: Duration, written: Arc<Written>) {
    let mut clock = 0;
    let mut last = 0;
    let mut tick = tokio::time::interval(interval);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = written.past_threshold.notified() => tick.reset(),
        }
        written.bytes.store(0, std::sync::atomic::Ordering::Relaxed);
        match compact_once(&client, &key, clock, last).await {
            Ok((c, r)) => (clock, last) = (c, r),
            Err(e) => tracing::warn!(error = %e, "etcd store: compacting"),
        }
    }
}

async fn compact_once(
    client: &Client,
    key: &str,
    clock: i64,
    last: i64,
) -> Result<(i64, i64), StoreError> {
    let mut client = client.clone();
    let txn = Txn::new()
        .when(vec![Compare::version(key, CompareOp::Equal, clock)])
        .and_then(vec![TxnOp::put(key, last.to_string(), None)])
        .or_else(vec![TxnOp::get(key, None)]);
    let response = client
        .txn(txn)
        .await
        .map_err(|e| etcd_error("compaction clock", e))?;
    let current = response.header().map(|h| h.revision()).unwrap_or(0);
    if !response.succeeded() {
        let version = match response.op_responses().first() {
            Some(TxnOpResponse::Get(range)) => range.kvs().first().map(|kv| kv.version()),
            _ => None,
        }
        .unwrap_or(0);
        return Ok((version, current));
    }
    if last > 0 {
        match client.compact(last, None).await {
            Ok(_) => tracing::info!(revision = last, "etcd store: compacted"),
            Err(e) if is_compacted(&e) => {}
            Err(e) => return Err(etcd_error("compacting", e)),
        }
    }
    Ok((clock + 1, current))
}

impl Store for EtcdStore {
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

    fn commit(&self, ops: Vec<Op>) -> CommitFuture<'_> {
        Box::pin(async move { self.commit_in(ops, None).await.map_err(|(e, _)| e) })
    }

    fn commit_or_return(&self, ops: Vec<Op>) -> ReturningFuture<'_> {
        Box::pin(self.commit_in(ops, None))
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

    fn list_raw(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        at: Option<Rv>,
    ) -> RawListFuture<'_> {
        let Some(rv) = at else {
            let latest = self.cache.list_raw(resource, namespace, after);
            return Box::pin(async move { Ok(latest) });
        };
        let resource = resource.to_string();
        let namespace = namespace.map(str::to_string);
        let after = after.map(|(ns, name)| (ns.to_string(), name.to_string()));
        Box::pin(async move {
            let after = after
                .as_ref()
                .map(|(ns, name)| (ns.as_str(), name.as_str()));
            self.list_raw_at(&resource, namespace.as_deref(), after, rv)
                .await
        })
    }

    fn fenced(self: Arc<Self>, term: Term) -> Arc<dyn Store> {
        Arc::new(Fenced { store: self, term })
    }
}

/// An [`EtcdStore`] whose commits also require a leadership term.
struct Fenced {
    store: Arc<EtcdStore>,
    term: Term,
}

impl Store for Fenced {
    crate::forward_store_reads!(store);

    fn commit(&self, ops: Vec<Op>) -> CommitFuture<'_> {
        Box::pin(async move {
            self.store
                .commit_in(ops, Some(&self.term))
                .await
                .map_err(|(e, _)| e)
        })
    }

    fn commit_or_return(&self, ops: Vec<Op>) -> ReturningFuture<'_> {
        Box::pin(self.store.commit_in(ops, Some(&self.term)))
    }

    fn fenced(self: Arc<Self>, term: Term) -> Arc<dyn Store> {
        Arc::new(Fenced {
            store: self.store.clone(),
            term,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::store::suite::{self, JOBS, create, key, next};

    /// A cluster of `members`, or `None` (printed) when etcd is missing and
    /// not required.
    fn cluster(members: usize) -> Option<(tempfile::TempDir, LocalEtcd)> {
        let dir = tempfile::tempdir().expect("tempdir");
        let etcd = LocalEtcd::start_or_skip(members, dir.path()).expect("etcd starts")?;
        Some((dir, etcd))
    }

    /// Commits `ops`, retrying storage errors (etcd electing a new leader
    /// after a member was killed) for up to 20 s; a precondition refused on
    /// a retry is the earlier attempt having landed and is taken as done.
    async fn commit_retrying(store: &dyn Store, ops: Vec<Op>) -> Vec<Object> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut retried = false;
        loop {
            match store.commit(ops.clone()).await {
                Ok(objects) => return objects,
                Err(StoreError::AlreadyExists(_) | StoreError::NotFound(_)) if retried => {
                    return Vec::new();
                }
                Err(e @ StoreError::Storage(_)) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "still failing after 20 s: {e}"
                    );
                    eprintln!("retrying a commit: {e}");
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("commit refused: {e}"),
            }
        }
    }

    async fn open(etcd: &LocalEtcd, prefix: &str) -> Arc<EtcdStore> {
        let config = EtcdConfig {
            endpoints: etcd.endpoints(),
            prefix: prefix.to_string(),
            ..EtcdConfig::default()
        };
        let options = EtcdOptions {
            compaction_interval: Duration::ZERO,
            compaction_bytes: 0,
            progress_interval: Duration::from_millis(100),
            commit_timeout: Duration::from_secs(10),
        };
        EtcdStore::open_with(&config, 1000, options)
            .await
            .expect("open")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_suite_passes_on_etcd() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let n = AtomicUsize::new(0);
        let etcd = &etcd;
        let n = &n;
        suite::run_all(|| async move {
            open(
                etcd,
                &format!("/suite{}/", n.fetch_add(1, Ordering::Relaxed)),
            )
            .await
        })
        .await;
        let store = open(etcd, "/compaction/").await;
        suite::a_compacted_version_is_gone(&*store, |rv| {
            let store = store.clone();
            async move { store.compact(rv).await.expect("compact") }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn objects_are_stored_as_kube_apiserver_stores_them() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let store = open(&etcd, "/layout").await;
        let mut value = suite::job("a");
        value["metadata"]["resourceVersion"] = "123".into();
        let rv = store
            .commit(vec![Op::Create {
                key: key("a"),
                value,
            }])
            .await
            .expect("create")[0]
            .rv;
        let mut client = store.client();
        let raw = client
            .get(
                "/layout/registry/trainer.kubeflow.org/trainjobs|default|a",
                None,
            )
            .await
            .expect("get");
        let kv = raw.kvs().first().expect("the object's key");
        assert_eq!(
            rev(kv.mod_revision()),
            rv,
            "resourceVersion is mod_revision"
        );
        let stored: Value = serde_json::from_slice(kv.value()).expect("JSON");
        assert!(
            stored["metadata"].get("resourceVersion").is_none(),
            "the resourceVersion is not stored: {stored}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn continue_pages_read_at_their_revision_until_compacted() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let store = open(&etcd, "/pages/").await;
        for name in ["a", "b", "c"] {
            store.commit(vec![create(name)]).await.expect("create");
        }
        let at = store.revision();
        store
            .commit(vec![Op::Delete {
                key: key("b"),
                expected: None,
            }])
            .await
            .expect("delete b");
        store.commit(vec![create("d")]).await.expect("create d");
        let names = |items: &[Object]| -> Vec<String> {
            items.iter().map(|o| o.key.name.clone()).collect()
        };
        let decoded = |(raw, rv): (Vec<RawObject>, Rv)| -> (Vec<Object>, Rv) {
            (raw.iter().filter_map(RawObject::decode).collect(), rv)
        };
        let (then, rv) = decoded(
            store
                .list_raw(JOBS, Some("default"), None, Some(at))
                .await
                .expect("list at"),
        );
        assert_eq!(
            (names(&then), rv),
            (vec!["a".into(), "b".into(), "c".into()], at)
        );
        assert_eq!(
            then[1].value["metadata"]["resourceVersion"],
            (at - 1).to_string()
        );
        let (now, _) = decoded(
            store
                .list_raw(JOBS, None, None, Some(store.revision()))
                .await
                .expect("list now"),
        );
        assert_eq!(names(&now), ["a", "c", "d"]);
        // A page after a (namespace, name) at a revision, in the cache's key
        // order: "default" < "default-b" as tuples, though etcd's byte order
        // of `default-b|` and `default|` is the other way round.
        store
            .commit(vec![Op::Create {
                key: Key::new(JOBS, Some("default-b"), "a"),
                value: serde_json::json!({"metadata": {"name": "a", "namespace": "default-b"}}),
            }])
            .await
            .expect("create in default-b");
        let (after_a, _) = decoded(
            store
                .list_raw(JOBS, None, Some(("default", "a")), Some(store.revision()))
                .await
                .expect("list after default/a"),
        );
        let keys: Vec<(String, String)> = after_a
            .iter()
            .map(|o| (o.key.namespace.clone(), o.key.name.clone()))
            .collect();
        let pair = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        assert_eq!(
            keys,
            [
                pair("default", "c"),
                pair("default", "d"),
                pair("default-b", "a")
            ]
        );
        let (cached, _) = decoded(
            store
                .list_raw(JOBS, None, Some(("default", "a")), None)
                .await
                .expect("list after default/a, latest"),
        );
        assert_eq!(names(&cached), names(&after_a), "the cache pages alike");
        store.compact(store.revision()).await.expect("compact");
        assert!(matches!(
            store.list_raw(JOBS, Some("default"), None, Some(at)).await,
            Err(StoreError::Gone { .. })
        ));
    }

    /// Writers that commit many objects chunk them by `MAX_COMMIT_OPS`:
    /// such a chunk, fenced, fits in one etcd Txn; one over 128 does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fenced_chunk_of_max_commit_ops_fits_in_one_txn() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let store = open(&etcd, "/chunks/").await;
        let mut client = store.client();
        let (_, term) = lead(&mut client, "/chunks/leader", "r1").await;
        let fenced = store.clone().fenced(term);
        let chunk: Vec<Op> = (0..crate::store::MAX_COMMIT_OPS)
            .map(|i| create(&format!("c{i}")))
            .collect();
        fenced.commit(chunk).await.expect("a full chunk commits");
        let too_many: Vec<Op> = (0..129).map(|i| create(&format!("d{i}"))).collect();
        assert!(
            fenced.commit(too_many).await.is_err(),
            "etcd refuses a Txn of more than 128 operations"
        );
    }

    /// Campaigns for `election` as `name` on a new lease: the lease and the
    /// term it leads.
    async fn lead(client: &mut etcd_client::Client, election: &str, name: &str) -> (i64, Term) {
        let lease = client.lease_grant(60, None).await.expect("lease").id();
        let campaign = client
            .campaign(election, name, lease)
            .await
            .expect("campaign");
        let leader = campaign.leader().expect("leader key");
        let term = Term {
            key: String::from_utf8(leader.key().to_vec()).expect("utf-8"),
            revision: rev(leader.rev()),
        };
        (lease, term)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fenced_commit_fails_once_another_replica_leads() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let store = open(&etcd, "/fence/").await;
        let mut client = store.client();
        let (first, term) = lead(&mut client, "/fence/leader", "r1").await;
        let fenced = store.clone().fenced(term.clone());
        fenced
            .commit(vec![create("a")])
            .await
            .expect("the leader writes");
        assert_eq!(
            fenced.commit(vec![create("a")]).await.unwrap_err(),
            StoreError::AlreadyExists(key("a")),
            "other refusals are reported as they are"
        );
        client.lease_revoke(first).await.expect("revoke");
        lead(&mut client, "/fence/leader", "r2").await;
        assert_eq!(
            fenced.commit(vec![create("b")]).await.unwrap_err(),
            StoreError::Fenced(term.revision)
        );
        assert!(store.get(&key("b")).is_none());
        // A view fenced by the current term writes again.
        store
            .commit(vec![create("c")])
            .await
            .expect("unfenced writes go on");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_commits_share_transactions_and_keep_their_own_answers() {
        let Some((_dir, etcd)) = cluster(3) else {
            return;
        };
        let store = open(&etcd, "/merged/").await;
        let rvs = suite::concurrent_commits_each_get_their_own_answer(&*store).await;
        assert!(
            rvs.len() < 42,
            "42 commits that succeeded together took {} transactions",
            rvs.len()
        );
        // A second replica sees every object at the revision its writer got.
        let other = open(&etcd, "/merged/").await;
        let (items, _) = other.list(JOBS, None);
        assert_eq!(items.len(), 43);
        for item in items {
            assert_eq!(store.get(&item.key).map(|o| o.rv), Some(item.rv));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn merged_commits_keep_their_own_terms() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let store = open(&etcd, "/terms/").await;
        let mut client = store.client();
        let (first, term) = lead(&mut client, "/terms/leader", "r1").await;
        let fenced = store.clone().fenced(term.clone());
        fenced.commit(vec![create("taken")]).await.expect("taken");
        // While the term holds: one refusal among many commits.
        let names: Vec<String> = (0..20)
            .map(|i| format!("a{i}"))
            .chain(["taken".to_string()])
            .collect();
        let answers =
            futures_util::future::join_all(names.iter().map(|n| fenced.commit(vec![create(n)])))
                .await;
        for (name, answer) in names.iter().zip(answers) {
            match name.as_str() {
                "taken" => assert_eq!(answer.unwrap_err(), StoreError::AlreadyExists(key(name))),
                _ => assert_eq!(answer.expect("created")[0].key, key(name)),
            }
        }
        // Another replica leads: the old term's commits are all fenced,
        // unfenced commits sent alongside them are not.
        client.lease_revoke(first).await.expect("revoke");
        lead(&mut client, "/terms/leader", "r2").await;
        let mut commits = Vec::new();
        for i in 0..20 {
            let (view, name): (&dyn Store, String) = if i % 2 == 0 {
                (&*fenced, format!("b{i}"))
            } else {
                (&*store, format!("c{i}"))
            };
            commits.push(async move { (name.clone(), view.commit(vec![create(&name)]).await) });
        }
        for (name, answer) in futures_util::future::join_all(commits).await {
            if name.starts_with('b') {
                assert_eq!(answer.unwrap_err(), StoreError::Fenced(term.revision));
                assert!(store.get(&key(&name)).is_none(), "{name} written");
            } else {
                answer.expect("unfenced writes go on");
                assert!(store.get(&key(&name)).is_some());
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_replicas_see_each_others_writes_in_order() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let a = open(&etcd, "/two/").await;
        let b = open(&etcd, "/two/").await;
        let mut watch = b.watch(JOBS, None, Some(b.revision())).expect("watch");
        let mut written = Vec::new();
        for i in 0..20 {
            let name = format!("j{i:02}");
            written.push((
                name.clone(),
                a.commit(vec![create(&name)]).await.expect("create")[0].rv,
            ));
        }
        for (name, rv) in &written {
            assert_eq!(
                next(&mut watch).await,
                (EventType::Added, name.clone(), *rv)
            );
        }
        assert_eq!(b.list(JOBS, None).0.len(), 20);
        assert!(b.get(&key("j19")).is_some());
        // And back: b writes, a reads it once its watch shows it.
        let mut watch = a.watch(JOBS, None, None).expect("watch a");
        let rv = b
            .commit(vec![Op::Delete {
                key: key("j00"),
                expected: Some(written[0].1),
            }])
            .await
            .expect("delete through b")[0]
            .rv;
        assert_eq!(
            next(&mut watch).await,
            (EventType::Deleted, "j00".into(), rv)
        );
        assert!(a.get(&key("j00")).is_none());
        assert!(a.revision() >= rv);
        // A replica opened now serves from its load on.
        let c = open(&etcd, "/two/").await;
        assert_eq!(c.list(JOBS, None).0.len(), 19);
        assert!(c.watch(JOBS, None, Some(c.revision())).is_ok());
        assert!(matches!(
            c.watch(JOBS, None, Some(written[0].1)),
            Err(StoreError::Gone { .. })
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn progress_moves_an_idle_replica_forward() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let store = open(&etcd, "/progress/").await;
        let before = store.revision();
        // A write outside the prefix moves etcd's revision, not the objects.
        let mut client = store.client();
        let other = client.put("/elsewhere", "x", None).await.expect("put");
        let target = header_rev(other.header());
        assert!(target > before);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.revision() < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no progress within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_and_watches_go_on_when_a_member_is_killed() {
        let Some((_dir, mut etcd)) = cluster(3) else {
            return;
        };
        let store = open(&etcd, "/kill/").await;
        let mut watch = store.watch(JOBS, None, None).expect("watch");
        let mut written = Vec::new();
        for i in 0..10 {
            if i == 5 {
                etcd.kill(0);
            }
            let name = format!("j{i}");
            let rv = match commit_retrying(&*store, vec![create(&name)]).await.first() {
                Some(object) => object.rv,
                // Landed on an earlier attempt: read it once the cache has it.
                None => {
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                    loop {
                        if let Some(object) = store.get(&key(&name)) {
                            break object.rv;
                        }
                        assert!(tokio::time::Instant::now() < deadline, "{name} never read");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            };
            written.push((name, rv));
        }
        for (name, rv) in written {
            assert_eq!(next(&mut watch).await, (EventType::Added, name, rv));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_behind_a_compaction_relists_and_its_old_watches_end() {
        let Some((_dir, mut etcd)) = cluster(3) else {
            return;
        };
        let config = EtcdConfig {
            endpoints: vec![etcd.endpoint(0)],
            prefix: "/relist/".into(),
            ..EtcdConfig::default()
        };
        let options = EtcdOptions {
            compaction_interval: Duration::ZERO,
            compaction_bytes: 0,
            progress_interval: Duration::from_millis(100),
            commit_timeout: Duration::from_secs(10),
        };
        let behind = EtcdStore::open_with(&config, 1000, options.clone())
            .await
            .expect("open on member 0");
        let other = EtcdStore::open_with(
            &EtcdConfig {
                endpoints: vec![etcd.endpoint(1), etcd.endpoint(2)],
                ..config.clone()
            },
            1000,
            options,
        )
        .await
        .expect("open on members 1 and 2");
        behind.commit(vec![create("a")]).await.expect("create a");
        let old = behind.revision();
        let mut watch = behind.watch(JOBS, None, Some(old)).expect("watch");
        etcd.kill(0);
        commit_retrying(&*other, vec![create("b")]).await;
        commit_retrying(
            &*other,
            vec![Op::Delete {
                key: key("a"),
                expected: None,
            }],
        )
        .await;
        other.compact(other.revision()).await.expect("compact");
        etcd.restart(0).expect("restart member 0");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while behind.get(&key("b")).is_none() || behind.get(&key("a")).is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the replica did not relist within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(behind.revision() >= other.revision());
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = watch.live.recv().await {
                    break e;
                }
            }
        })
        .await
        .expect("the old watch ends");
        assert_eq!(ended, tokio::sync::broadcast::error::RecvError::Closed);
        assert!(matches!(
            behind.watch(JOBS, None, Some(old)),
            Err(StoreError::Gone { .. })
        ));
        // It follows again after the relist.
        let mut watch = behind.watch(JOBS, None, None).expect("watch again");
        let c = other.commit(vec![create("c")]).await.expect("create c")[0].rv;
        assert_eq!(next(&mut watch).await, (EventType::Added, "c".into(), c));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn objects_past_grpcs_default_message_size_load_list_and_follow() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let a = open(&etcd, "/large/").await;
        // Ten objects of 600 KB: one page of a load or list (and the watch
        // event of deleting them in one transaction, which carries each
        // previous value) is 6 MB, past gRPC's default 4 MiB.
        let big = |name: &str| padded(name, 600_000);
        for n in 0..10 {
            a.commit(vec![big(&format!("o{n}"))]).await.expect("create");
        }
        let b = open(&etcd, "/large/").await;
        assert_eq!(b.list(JOBS, None).0.len(), 10, "b loaded them all");
        let (page, _) = b
            .list_raw(JOBS, None, None, None)
            .await
            .expect("a list read from etcd");
        assert_eq!(page.len(), 10);
        let mut watch = b.watch(JOBS, None, Some(b.revision())).expect("watch");
        let removes = (0..10)
            .map(|n| Op::Remove {
                key: key(&format!("o{n}")),
            })
            .collect();
        a.commit(removes).await.expect("remove all ten at once");
        for _ in 0..10 {
            assert_eq!(next(&mut watch).await.0, EventType::Deleted);
        }
        // b still follows etcd.
        let c = a.commit(vec![create("c")]).await.expect("create")[0].rv;
        assert_eq!(next(&mut watch).await, (EventType::Added, "c".into(), c));
        // Pages over what the client reads are asked for again, smaller.
        for n in 0..10 {
            a.commit(vec![big(&format!("p{n}"))]).await.expect("create");
        }
        let client = a.client();
        let prefix = b"/large/registry/".to_vec();
        let options = GetOptions::new().with_range(prefix_end(&prefix));
        let mut limit = LOAD_PAGE;
        let page = range_page(&client, &prefix, &options, &mut limit, 2 << 20)
            .await
            .expect("a page within 2 MiB");
        let bytes: usize = page.kvs().iter().map(|kv| kv.value().len()).sum();
        assert!(!page.kvs().is_empty() && bytes <= 2 << 20, "{bytes} bytes");
        assert!(page.more(), "eleven objects do not fit in 2 MiB");
        assert!(
            limit <= page.kvs().len() as i64,
            "the smaller page size is kept: {limit}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_larger_than_etcd_takes_is_refused_as_too_large_and_alone() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let store = open(&etcd, "/too-large/").await;
        // Past gRPC's limit (1.5 MiB + 512 KiB), and between it and etcd's
        // own (1.5 MiB): each refused as too large, with the small commits
        // sent beside it written.
        for (name, bytes) in [("huge", 2_500_000), ("big", 1_700_000)] {
            let small = store.commit(vec![create(&format!("{name}-beside"))]);
            let large = store.commit(vec![padded(name, bytes)]);
            let (small, large) = tokio::join!(small, large);
            match large {
                Err(e @ StoreError::TooLarge(_)) => {
                    let api =
                        crate::status::ApiError::from_store(e, "trainer.kubeflow.org", "trainjobs");
                    assert_eq!((api.code, api.reason), (413, "RequestEntityTooLarge"));
                    assert!(
                        api.message.contains("--max-request-bytes"),
                        "{}",
                        api.message
                    );
                }
                other => panic!("{name}: {other:?}"),
            }
            small.expect("the commit beside it");
            assert!(store.get(&key(name)).is_none());
        }
        assert_eq!(store.list(JOBS, None).0.len(), 2);
    }

    /// The create of `name` with `bytes` of padding.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deletions_of_many_large_objects_at_once_each_get_their_answer() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let store = open(&etcd, "/deletions/").await;
        // 80 objects of 1 MB. Their deletions, sent at once, are small
        // enough to merge into one transaction, whose answer (each deleted
        // object) would be 80 MB, past what the hub reads.
        for n in 0..80 {
            store
                .commit(vec![padded(&format!("o{n}"), 1_000_000)])
                .await
                .expect("create");
        }
        let deletions = (0..80).map(|n| {
            store.commit(vec![Op::Remove {
                key: key(&format!("o{n}")),
            }])
        });
        let answers = futures_util::future::join_all(deletions).await;
        for (n, answer) in answers.into_iter().enumerate() {
            let deleted = answer.unwrap_or_else(|e| panic!("deleting o{n}: {e}"));
            assert_eq!(deleted.len(), 1, "o{n}: the deleted object");
            assert_eq!(
                deleted[0].value["pad"].as_str().map(str::len),
                Some(1_000_000),
                "o{n} as it was"
            );
        }
        assert!(store.list(JOBS, None).0.is_empty());
    }

    fn padded(name: &str, bytes: usize) -> Op {
        let mut op = create(name);
        if let Op::Create { value, .. } = &mut op {
            value["pad"] = serde_json::json!("p".repeat(bytes));
        }
        op
    }

    /// Waits until etcd has compacted `rv` (reading `prefix` at it fails
    /// so); fails after `within`.
    async fn compacted_within(client: &mut Client, prefix: &str, rv: Rv, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let at = GetOptions::new().with_prefix().with_revision(etcd_rev(rv));
            match client.get(prefix, Some(at)).await {
                Err(e) if is_compacted(&e) => return,
                Err(e) => panic!("reading at {rv}: {e}"),
                Ok(_) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "revision {rv} not compacted within {within:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_that_writes_many_bytes_compacts_before_its_interval() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let config = EtcdConfig {
            endpoints: etcd.endpoints(),
            prefix: "/bytes/".into(),
            ..EtcdConfig::default()
        };
        let options = EtcdOptions {
            compaction_interval: Duration::from_secs(3600),
            compaction_bytes: 1 << 20,
            ..EtcdOptions::default()
        };
        let store = EtcdStore::open_with(&config, 1000, options)
            .await
            .expect("open");
        // One object of 100 KB updated in a loop: a tenant's loop, written
        // well within the hour.
        let first = store
            .commit(vec![padded("big", 100_000)])
            .await
            .expect("create")[0]
            .rv;
        let mut client = store.client();
        let mut last = first;
        // The compactor runs at once past 1 MiB, and compacts to what its
        // previous run saw: two runs, so about 2 MiB, then a little more
        // for the compaction to land.
        for n in 0..40 {
            let mut object = store.get(&key("big")).expect("stored");
            let value = Arc::make_mut(&mut object.value);
            value["n"] = serde_json::json!(n);
            last = store
                .commit(vec![Op::Update {
                    key: key("big"),
                    value: value.clone(),
                    expected: Some(last),
                }])
                .await
                .expect("update")[0]
                .rv;
        }
        compacted_within(
            &mut client,
            "/bytes/registry/",
            first,
            Duration::from_secs(15),
        )
        .await;
        // Not the latest: the object reads as written.
        let now = store.get(&key("big")).expect("stored");
        assert_eq!(now.value["n"], 39);
        // With the bytes trigger off, nothing is compacted within the hour.
        let config = EtcdConfig {
            prefix: "/bytes-off/".into(),
            ..config
        };
        let off = EtcdStore::open_with(
            &config,
            1000,
            EtcdOptions {
                compaction_interval: Duration::from_secs(3600),
                compaction_bytes: 0,
                ..EtcdOptions::default()
            },
        )
        .await
        .expect("open");
        let rv = off.commit(vec![create("x")]).await.expect("create")[0].rv;
        for n in 0..40 {
            off.commit(vec![padded(&format!("y{n}"), 100_000)])
                .await
                .expect("create");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let at = GetOptions::new().with_prefix().with_revision(etcd_rev(rv));
        assert!(client.get("/bytes-off/registry/", Some(at)).await.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_compactor_compacts_what_the_previous_run_saw() {
        let Some((_dir, etcd)) = cluster(1) else {
            return;
        };
        let config = EtcdConfig {
            endpoints: etcd.endpoints(),
            prefix: "/compactor/".into(),
            ..EtcdConfig::default()
        };
        let options = EtcdOptions {
            compaction_interval: Duration::from_millis(200),
            ..EtcdOptions::default()
        };
        // Two replicas share one compaction clock.
        let a = EtcdStore::open_with(&config, 1000, options.clone())
            .await
            .expect("open");
        let _b = EtcdStore::open_with(&config, 1000, options)
            .await
            .expect("open");
        let first = a.commit(vec![create("a")]).await.expect("create")[0].rv;
        a.commit(vec![create("b")]).await.expect("create");
        let mut client = a.client();
        compacted_within(
            &mut client,
            "/compactor/registry/",
            first,
            Duration::from_secs(15),
        )
        .await;
        let clock = client
            .get("/compactor/compact_rev_key", None)
            .await
            .expect("get");
        assert!(
            clock.kvs().first().is_some_and(|kv| kv.version() >= 2),
            "the compactor keeps its clock in its key"
        );
        // The objects themselves are still there.
        assert_eq!(a.list(JOBS, None).0.len(), 2);
    }
}
