//! The garbage collector of kube-controller-manager, for the stand-in: it
//! acts on `ownerReferences` and on the finalizers the server puts on deletes
//! with a propagation policy.
//!
//! - an object all of whose owners are gone (by uid) is deleted
//!   (background propagation);
//! - an object being deleted with the `foregroundDeletion` finalizer has its
//!   dependents deleted first (themselves in the foreground), and goes when
//!   none is left;
//! - an object being deleted with the `orphan` finalizer has the references
//!   to it removed from its dependents, then goes;
//! - objects of a namespace that is gone are deleted.
//!
//! The collector is level-triggered: after every burst of store events it
//! looks at everything again, so a write that loses a race is redone on the
//! next pass. Dependents are found by owner uid, as upstream does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use trainhub_apiserver::store::{Key, Object, Op, Store};

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

/// Runs until the store closes. `resources`: the store keys of every
/// served resource.
pub async fn run(store: Arc<dyn Store>, resources: Vec<String>) {
    let Some((first, rest)) = resources.split_first() else {
        return;
    };
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let Ok(watch) = store.watch(first, None, None) else {
        return;
    };
    let watch = watch.also(&rest);
    let mut live = watch.live;
    loop {
        collect(store.as_ref(), &resources).await;
        match live.recv().await {
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
        // A burst of events is one pass.
        while let Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) =
            live.try_recv()
        {}
    }
}

fn meta(o: &Object) -> &Value {
    &o.value["metadata"]
}

fn uid(o: &Object) -> &str {
    meta(o)["uid"].as_str().unwrap_or_default()
}

fn deleting(o: &Object) -> bool {
    meta(o).get("deletionTimestamp").is_some()
}

fn finalizers(o: &Object) -> Vec<String> {
    meta(o)["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn owner_uids(o: &Object) -> Vec<&str> {
    meta(o)["ownerReferences"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["uid"].as_str()).collect())
        .unwrap_or_default()
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// One pass: what should change, then each change committed on its own (a
/// conflict is left to the next pass).
async fn collect(store: &dyn Store, resources: &[String]) {
    let objects: Vec<Object> = resources
        .iter()
        .flat_map(|r| store.list(r, None).0)
        .collect();
    let by_uid: HashMap<&str, &Object> = objects.iter().map(|o| (uid(o), o)).collect();
    let mut dependents: HashMap<&str, Vec<&Object>> = HashMap::new();
    for o in &objects {
        for owner in owner_uids(o) {
            dependents.entry(owner).or_default().push(o);
        }
    }
    let live_namespaces: HashSet<&str> = objects
        .iter()
        .filter(|o| o.key.resource == crate::resources::NAMESPACES && !deleting(o))
        .map(|o| o.key.name.as_str())
        .collect();
    let mut ops: BTreeMap<Key, Op> = BTreeMap::new();
    let mut plan = |op: Op| {
        ops.entry(op.key().clone()).or_insert(op);
    };
    for o in &objects {
        let owners = owner_uids(o);
        let orphaned = !owners.is_empty() && owners.iter().all(|u| !by_uid.contains_key(u));
        let namespace_gone =
            !o.key.namespace.is_empty() && !live_namespaces.contains(o.key.namespace.as_str());
        if orphaned || namespace_gone {
            plan(delete(o, false, dependents.contains_key(uid(o))));
        }
        if !deleting(o) {
            continue;
        }
        let mine = dependents.get(uid(o)).cloned().unwrap_or_default();
        let fins = finalizers(o);
        if fins.iter().any(|f| f == FOREGROUND) {
            if mine.is_empty() {
                plan(remove_finalizer(o, FOREGROUND));
            }
            for d in mine.iter().filter(|d| !deleting(d)) {
                plan(delete(d, true, dependents.contains_key(uid(d))));
            }
        } else if fins.iter().any(|f| f == ORPHAN) {
            for d in &mine {
                plan(release(d, uid(o)));
            }
            if mine.is_empty() {
                plan(remove_finalizer(o, ORPHAN));
            }
        }
    }
    for (_, op) in ops {
        if let Err(e) = store.commit(vec![op]).await {
            tracing::debug!(error = %e, "garbage collection write lost a race; retried next pass");
        }
    }
}

/// Deletes `o`: at once when nothing holds it, else marks it; in the
/// foreground, an object with dependents is held by `foregroundDeletion`.
fn delete(o: &Object, foreground: bool, has_dependents: bool) -> Op {
    let mut fins = finalizers(o);
    if foreground && has_dependents && !fins.iter().any(|f| f == FOREGROUND) {
        fins.push(FOREGROUND.into());
    }
    if fins.is_empty() {
        return Op::Delete {
            key: o.key.clone(),
            expected: Some(o.rv),
        };
    }
    let mut value = o.value.as_ref().clone();
    if !deleting(o) {
        value["metadata"]["deletionTimestamp"] = now().into();
        value["metadata"]["deletionGracePeriodSeconds"] = 0.into();
    }
    value["metadata"]["finalizers"] = json!(fins);
    Op::Update {
        key: o.key.clone(),
        value,
        expected: Some(o.rv),
    }
}

fn remove_finalizer(o: &Object, finalizer: &str) -> Op {
    let rest: Vec<String> = finalizers(o)
        .into_iter()
        .filter(|f| f != finalizer)
        .collect();
    if rest.is_empty() && deleting(o) {
        return Op::Delete {
            key: o.key.clone(),
            expected: Some(o.rv),
        };
    }
    let mut value = o.value.as_ref().clone();
    value["metadata"]["finalizers"] = json!(rest);
    Op::Update {
        key: o.key.clone(),
        value,
        expected: Some(o.rv),
    }
}

/// Removes the reference to `owner` from `o`.
fn release(o: &Object, owner: &str) -> Op {
    let mut value = o.value.as_ref().clone();
    if let Some(refs) = value["metadata"]["ownerReferences"].as_array_mut() {
        refs.retain(|r| r["uid"].as_str() != Some(owner));
    }
    Op::Update {
        key: o.key.clone(),
        value,
        expected: Some(o.rv),
    }
}
