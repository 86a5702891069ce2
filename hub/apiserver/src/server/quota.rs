//! Resource quotas on the server (see [`crate::quota`]), for a server that
//! serves the core `resourcequotas` resource:
//!
//! - [`Server::quota_charges`]: what kube-apiserver's `ResourceQuota`
//!   admission does on a create, as writes committed with the object (each
//!   quota of the namespace that counts the resource gets `status.used`
//!   plus one, at the resourceVersion read), or the 403 that refuses it;
//! - [`Server::run_quota_controller`]: what kube-controller-manager's quota
//!   controller does: `status.hard` and `status.used` counted when a quota
//!   is created or its `spec.hard` changes, counted again after objects are
//!   deleted, and every [`RESYNC`] whatever happened.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::Server;
use crate::quota::{self, RESOURCE_QUOTAS};
use crate::resource::ResourceDef;
use crate::status::ApiError;
use crate::store::{Event, EventType, Op, StoreError, Watch};

/// Locks that creates charging a namespace's quotas take in turn, one per
/// namespace hash: within a replica such creates do not race each other
/// for the quota's resourceVersion (and retry), only across replicas.
pub(crate) struct Turns(Vec<tokio::sync::Mutex<()>>);

impl Default for Turns {
    fn default() -> Self {
        Turns((0..64).map(|_| tokio::sync::Mutex::new(())).collect())
    }
}

impl Turns {
    /// The turn of `namespace`'s creates; held until the guard drops.
    pub(crate) async fn take(&self, namespace: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hash = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(namespace);
        self.0[(hash % self.0.len() as u64) as usize].lock().await
    }
}

/// How often every quota is counted again, whatever changed (the quota
/// controller's full resync; kube-controller-manager's default is 5 min).
pub const RESYNC: Duration = Duration::from_secs(60);

impl Server {
    /// Whether this server serves the core `resourcequotas` resource.
    pub fn serves_quotas(&self) -> bool {
        self.resource("", "v1", RESOURCE_QUOTAS).is_some()
    }

    /// Every count name a quota may limit, with the store key of its
    /// objects, in name order.
    pub(crate) fn countable(&self) -> BTreeMap<String, String> {
        self.resources
            .iter()
            .filter(|d| quota::is_countable(d))
            .map(|d| (quota::count_name(d), d.store_key()))
            .collect()
    }

    /// The writes that charge the quotas of `namespace` for one more
    /// object of `def` (named `name`, for the refusal), to commit with it;
    /// none when no quota counts it. A quota that would pass its hard
    /// limit, or has not been counted yet, refuses the create (403).
    pub(crate) fn quota_charges(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Op>, ApiError> {
        // No look-up of the served resources on every create: where quotas
        // are not served, none can be stored.
        if !quota::is_countable(def) {
            return Ok(Vec::new());
        }
        let (quotas, _) = self.store.list(RESOURCE_QUOTAS, Some(namespace));
        if quotas.is_empty() {
            return Ok(Vec::new());
        }
        let resource = quota::count_name(def);
        let mut charges = Vec::new();
        for q in quotas {
            match quota::charge(&q.value, &q.key.name, &resource) {
                Ok(None) => {}
                Ok(Some(charged)) => charges.push(Op::Update {
                    key: q.key,
                    value: charged,
                    expected: Some(q.rv),
                }),
                Err(refusal) => {
                    return Err(ApiError::forbidden_because(
                        &def.group,
                        &def.plural,
                        name,
                        &refusal.message(),
                    ));
                }
            }
        }
        Ok(charges)
    }

    /// Waits for the turn of `namespace`'s quota-charging creates.
    pub(crate) async fn quota_turn(&self, namespace: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.quota_turns.take(namespace).await
    }

    /// Keeps every quota's status counted until `shutdown` resolves. Safe
    /// on any number of replicas' leaders in turn: a count is written at
    /// the resourceVersion of the quota it was made for, so a create that
    /// charged the quota meanwhile makes it count again.
    pub async fn run_quota_controller(
        self: Arc<Self>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        if !self.serves_quotas() {
            return shutdown.await;
        }
        let countable = self.countable();
        let resources: Vec<&str> = countable.values().map(String::as_str).collect();
        let follow = || {
            self.store
                .watch(RESOURCE_QUOTAS, None, None)
                .ok()
                .map(|w| w.also_deletions(&resources))
        };
        let mut watch: Option<Watch> = follow();
        let mut ticker = tokio::time::interval(RESYNC);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut dirty = BTreeSet::new();
        let mut everything = false;
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => everything = true,
                event = async {
                    match watch.as_mut() {
                        Some(w) => w.live.recv().await,
                        None => std::future::pending().await,
                    }
                } => match event {
                    Ok(event) => {
                        mark(&event, &countable, &mut dirty);
                        // What else has come, before counting once for all.
                        while let Some(w) = watch.as_mut() {
                            match w.live.try_recv() {
                                Ok(event) => mark(&event, &countable, &mut dirty),
                                Err(TryRecvError::Lagged(_)) => {
                                    everything = true;
                                    watch = follow();
                                }
                                Err(_) => break,
                            }
                        }
                    }
                    // Behind: follow again from now and count everything.
                    Err(RecvError::Lagged(_)) => {
                        everything = true;
                        watch = follow();
                    }
                    // The store is closing: the ticker alone from now on.
                    Err(RecvError::Closed) => watch = None,
                }
            }
            if std::mem::take(&mut everything) {
                let (quotas, _) = self.store.list(RESOURCE_QUOTAS, None);
                dirty.extend(quotas.into_iter().map(|q| q.key.namespace));
            }
            let mut retry = BTreeSet::new();
            let mut failed = false;
            for namespace in std::mem::take(&mut dirty) {
                if let Err(e) = self.count_namespace(&namespace, &countable).await {
                    if !matches!(e, StoreError::Conflict { .. }) {
                        tracing::warn!(%namespace, error = %e, "counting the namespace's quota usage");
                        failed = true;
                    }
                    retry.insert(namespace);
                }
            }
            if !retry.is_empty() {
                // A create charged the quota meanwhile: count again
                // shortly; the store failed: not before a second.
                let pause = if failed { 1000 } else { 20 };
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(Duration::from_millis(pause)) => {}
                }
                dirty = retry;
            }
        }
    }

    /// Writes the counted status of each quota of `namespace` that differs.
    async fn count_namespace(
        &self,
        namespace: &str,
        countable: &BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        let (quotas, _) = self.store.list(RESOURCE_QUOTAS, Some(namespace));
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for q in quotas {
            for (name, _) in quota::hard(&q.value) {
                let Some(key) = countable.get(&name) else {
                    continue;
                };
                if !counts.contains_key(key.as_str()) {
                    // Counted from the store's encoded objects, none decoded.
                    let (objects, _) = self
                        .store
                        .list_raw(key, Some(namespace), None, None)
                        .await?;
                    counts.insert(key.as_str(), objects.len() as u64);
                }
            }
            let status = quota::status(&q.value, |name| {
                countable
                    .get(name)
                    .and_then(|key| counts.get(key.as_str()).copied())
            });
            if q.value["status"] == status {
                continue;
            }
            let mut counted = q.value.as_ref().clone();
            counted["status"] = status;
            self.store
                .commit(vec![Op::Update {
                    key: q.key,
                    value: counted,
                    expected: Some(q.rv),
                }])
                .await?;
        }
        Ok(())
    }
}

/// Marks the namespace of `event` for counting when it may have changed a
/// quota's usage or limits: a counted object deleted, or a quota whose
/// counted limits are not what its status was counted against (a new
/// quota, a changed `spec.hard`). A create's charge is neither.
fn mark(event: &Event, countable: &BTreeMap<String, String>, dirty: &mut BTreeSet<String>) {
    let key = &event.object.key;
    if key.resource == RESOURCE_QUOTAS {
        if event.kind != EventType::Deleted && !counted_as_specified(&event.object.value, countable)
        {
            dirty.insert(key.namespace.clone());
        }
    } else if event.kind == EventType::Deleted {
        dirty.insert(key.namespace.clone());
    }
}

/// Whether a quota's status was counted against its `spec.hard` as it is.
fn counted_as_specified(quota: &Value, countable: &BTreeMap<String, String>) -> bool {
    let specified = quota::status(quota, |name| countable.get(name).map(|_| 0));
    specified["hard"] == quota["status"]["hard"]
        && specified["hard"]
            .as_object()
            .into_iter()
            .flatten()
            .all(|(name, _)| quota::used(quota, name).is_some())
}
