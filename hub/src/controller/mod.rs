//! Controllers: loops that act on what the store holds, each a pure
//! decision function plus a runner that watches the store and writes back.
//!
//! - [`lifecycle`]: suspension and the active deadline of TrainJobs;
//! - [`events`]: Events expire a set time after their last write.

pub mod events;
pub mod lifecycle;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use tokio::sync::broadcast::error::RecvError;
use trainhub_apiserver::store::{Key, Object, Op, Store, StoreError};

use crate::api::TRAINJOBS;

/// Runs the lifecycle controller until `shutdown` resolves.
pub async fn run_lifecycle(store: Arc<dyn Store>, shutdown: impl std::future::Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            () = lifecycle_pass(store.as_ref()) => {
                // The watch ended (lagging, compaction): start over from a list.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Lists, reconciles everything, then follows changes and deadlines until
/// the watch breaks.
async fn lifecycle_pass(store: &dyn Store) {
    let mut timers: BTreeMap<Timestamp, HashSet<Key>> = BTreeMap::new();
    let (objects, rv) = store.list(TRAINJOBS, None);
    let mut watch = match store.watch(TRAINJOBS, None, Some(rv)) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "lifecycle: watching TrainJobs");
            return;
        }
    };
    for object in objects {
        reconcile_key(store, &object.key, Some(&object), &mut timers).await;
    }
    for event in std::mem::take(&mut watch.replay) {
        reconcile_key(store, &event.object.key, Some(&event.object), &mut timers).await;
    }
    loop {
        let next_timer = timers.keys().next().copied();
        let sleep = async {
            match next_timer {
                Some(at) => {
                    let wait = at.duration_since(Timestamp::now()).unsigned_abs();
                    tokio::time::sleep(wait.min(std::time::Duration::from_secs(3600))).await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = sleep => {
                let now = Timestamp::now();
                let due: Vec<Timestamp> = timers.range(..=now).map(|(t, _)| *t).collect();
                for t in due {
                    for key in timers.remove(&t).unwrap_or_default() {
                        reconcile_key(store, &key, None, &mut timers).await;
                    }
                }
            }
            event = watch.live.recv_latest(|key, rv| store.revision_of(key) == Some(rv)) => match event {
                Ok(event) => {
                    reconcile_key(store, &event.object.key, Some(&event.object), &mut timers).await
                }
                Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
            },
        }
    }
}

/// Reconciles the TrainJob at `key`: as `known` (the version a list or
/// watch gave, not decoded again) while that is the stored version, else
/// as the store has it.
async fn reconcile_key(
    store: &dyn Store,
    key: &Key,
    known: Option<&Object>,
    timers: &mut BTreeMap<Timestamp, HashSet<Key>>,
) {
    let mut known = known
        .filter(|o| store.revision_of(key) == Some(o.rv))
        .cloned();
    // Two tries: a conflict means someone wrote meanwhile; reread and redo.
    for _ in 0..2 {
        let Some(object) = known.take().or_else(|| store.get(key)) else {
            return;
        };
        let decision = lifecycle::reconcile(&object.value, Timestamp::now());
        if let Some(at) = decision.requeue_at {
            timers.entry(at).or_default().insert(key.clone());
        }
        let Some(status) = decision.status else {
            return;
        };
        let mut value = object.value.as_ref().clone();
        value["status"] = status;
        match store
            .commit(vec![Op::Update {
                key: key.clone(),
                value,
                expected: Some(object.rv),
            }])
            .await
        {
            Ok(_) => return,
            Err(StoreError::Conflict { .. }) => continue,
            Err(StoreError::NotFound(_)) => return,
            Err(e) => {
                tracing::warn!(%key, error = %e, "lifecycle: writing status");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use trainhub_apiserver::store::RedbStore;

    use super::*;

    #[tokio::test]
    async fn a_change_is_reconciled_as_received_unless_a_newer_version_is_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(&dir.path().join("s.redb"), 100).expect("store");
        let key = Key::new(TRAINJOBS, Some("default"), "j");
        let job = |suspend: bool| {
            json!({"metadata": {"name": "j", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"suspend": suspend}})
        };
        let suspended = |store: &RedbStore| {
            let object = store.get(&key).expect("stored");
            lifecycle::is_true(&object.value["status"], "Suspended")
        };
        let mut timers = BTreeMap::new();
        let created = store
            .commit(vec![Op::Create {
                key: key.clone(),
                value: job(true),
            }])
            .await
            .expect("create")
            .remove(0);
        reconcile_key(&store, &key, Some(&created), &mut timers).await;
        assert!(suspended(&store), "the version received is reconciled");

        // Received late: the stored version (resumed) is what counts.
        let stale = store.get(&key).expect("stored");
        let mut resumed = stale.value.as_ref().clone();
        resumed["spec"]["suspend"] = false.into();
        store
            .commit(vec![Op::Update {
                key: key.clone(),
                value: resumed,
                expected: Some(stale.rv),
            }])
            .await
            .expect("resume");
        reconcile_key(&store, &key, Some(&stale), &mut timers).await;
        assert!(!suspended(&store), "resumed, as stored");

        // Gone: nothing to do, whatever was received.
        store
            .commit(vec![Op::Remove { key: key.clone() }])
            .await
            .expect("remove");
        reconcile_key(&store, &key, Some(&stale), &mut timers).await;
        assert!(store.get(&key).is_none());
    }
}
