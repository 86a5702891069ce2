//! The dispatch runner's store writer: the writes dispatch makes
//! (placements, TrainJob status and metadata, pods, events) queued from
//! anywhere and committed in batches.
//!
//! A batch is cut into commits that every store takes: at most
//! [`MAX_COMMIT_OPS`] operations each, no key written twice in one (etcd
//! takes one write per key and transaction). Commits whose keys are
//! disjoint form a wave and are handed to the store together (redb's
//! writer group-commits them; etcd's committer sends them in as few
//! transactions as fit); a write touching a key of the current wave waits
//! for the next one, so writes to one object keep their order.

use std::collections::HashMap;

use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use trainhub_apiserver::store::{Key, MAX_COMMIT_OPS, Op, Rv, Store, StoreError};

use super::{ANNOTATION_SPOKE, FINALIZER};
use crate::controller::lifecycle::{format_time, is_finished, set_condition};

/// A write for the store writer; `done` learns whether it was committed.
#[derive(Default)]
pub(super) struct Write {
    pub ops: Vec<Op>,
    /// A mapped status to merge into a TrainJob's status as it is when the
    /// write is committed (merges of one batch to one TrainJob become one
    /// update).
    pub merge: Option<(Key, Value)>,
    /// A change to a TrainJob's metadata, applied to it as it is when the
    /// write is committed, in the same commit as `ops`.
    pub edit: Option<(Key, Edit)>,
    pub done: Option<Box<dyn FnOnce(bool) + Send>>,
}

/// A change dispatch makes to the metadata of TrainJob `uid` (another
/// object under the same name is left alone).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Edit {
    /// Placed on `spoke` (annotation [`ANNOTATION_SPOKE`], and [`FINALIZER`]
    /// unless it is being deleted, when no finalizer may be added), or not
    /// placed (the annotation removed).
    Placed { uid: String, spoke: Option<String> },
    /// Its run is stopped: [`FINALIZER`] removed.
    Release { uid: String },
}

/// What an [`Edit`] did to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Edited {
    Unchanged,
    Changed,
    /// The last finalizer of a deleting object is gone: delete it.
    Delete,
}

/// Applies `edit` to the stored TrainJob `object`.
pub(super) fn apply_edit(object: &mut Value, edit: &Edit) -> Edited {
    let uid = match edit {
        Edit::Placed { uid, .. } | Edit::Release { uid } => uid,
    };
    if object["metadata"]["uid"].as_str() != Some(uid.as_str()) {
        return Edited::Unchanged;
    }
    let before = object["metadata"].clone();
    let deleting = !object["metadata"]["deletionTimestamp"].is_null();
    let meta = &mut object["metadata"];
    let mut finalizers: Vec<Value> = meta["finalizers"].as_array().cloned().unwrap_or_default();
    match edit {
        Edit::Placed { spoke, .. } => {
            match spoke {
                Some(spoke) => {
                    if !meta["annotations"].is_object() {
                        meta["annotations"] = json!({});
                    }
                    meta["annotations"][ANNOTATION_SPOKE] = spoke.as_str().into();
                    if !deleting && !finalizers.iter().any(|f| f == FINALIZER) {
                        finalizers.push(FINALIZER.into());
                    }
                }
                None => {
                    if let Some(a) = meta["annotations"].as_object_mut() {
                        a.remove(ANNOTATION_SPOKE);
                    }
                }
            }
            if !finalizers.is_empty() {
                meta["finalizers"] = Value::Array(finalizers);
            }
        }
        Edit::Release { .. } => {
            finalizers.retain(|f| f != FINALIZER);
            if deleting && finalizers.is_empty() {
                return Edited::Delete;
            }
            if let Some(m) = meta.as_object_mut() {
                if finalizers.is_empty() {
                    m.remove("finalizers");
                } else {
                    m.insert("finalizers".into(), Value::Array(finalizers));
                }
            }
        }
    }
    if object["metadata"] == before {
        Edited::Unchanged
    } else {
        Edited::Changed
    }
}

/// Removes the hub's finalizer from a TrainJob whose merged status says
/// its run ended (Complete or Failed), in the same update: the release
/// dispatch would otherwise write next (see `core::jobs`), one TrainJob
/// write fewer per run. A TrainJob being deleted is left to dispatch,
/// which stops its run first. Whether it removed the finalizer.
fn release_if_finished(object: &mut Value) -> bool {
    if !is_finished(&object["status"]) || !object["metadata"]["deletionTimestamp"].is_null() {
        return false;
    }
    let Some(uid) = object["metadata"]["uid"].as_str().map(String::from) else {
        return false;
    };
    apply_edit(object, &Edit::Release { uid }) != Edited::Unchanged
}

/// Says that the TrainJob at `key` was released, once the commit that
/// removed the hub's finalizer has landed.
fn log_released(key: &Key) {
    tracing::info!(trainjob = %key, "TrainJob released: the hub's finalizer is gone (its run finished, or was stopped or given up)");
}

/// The key a write reads and updates (its status merge's, else its
/// edit's): merges and edits of one commit to one TrainJob become one update.
fn target(w: &Write) -> Option<&Key> {
    match (&w.merge, &w.edit) {
        (Some((key, _)), _) | (None, Some((key, _))) => Some(key),
        (None, None) => None,
    }
}

/// Cuts a batch, in order, into waves of commits (see the module doc). A
/// write with no key at all (a barrier) is committed alone, after every
/// write before it and before every write after it. A single write of more
/// than [`MAX_COMMIT_OPS`] operations is a commit of its own.
pub(super) fn waves(batch: Vec<Write>) -> Vec<Vec<Vec<Write>>> {
    let mut waves: Vec<Vec<Vec<Write>>> = Vec::new();
    let mut wave: Vec<Vec<Write>> = Vec::new();
    // Per chunk of the current wave: operations so far (a target counts
    // once).
    let mut sizes: Vec<usize> = Vec::new();
    // Keys of the current wave: the chunk holding each, and whether it is a
    // write's target (which later writes to the same chunk may share).
    let mut owner: HashMap<Key, (usize, bool)> = HashMap::new();
    for w in batch {
        let target = target(&w).cloned();
        if w.ops.is_empty() && target.is_none() {
            if !wave.is_empty() {
                waves.push(std::mem::take(&mut wave));
            }
            waves.push(vec![vec![w]]);
            sizes.clear();
            owner.clear();
            continue;
        }
        let ops = w.ops.len();
        // The chunk this write must join (its target is there already), or
        // None: any chunk with room; Err: it conflicts with the wave.
        let mut joins: Result<Option<usize>, ()> = Ok(None);
        if let Some(t) = &target {
            match owner.get(t) {
                Some(&(chunk, true)) if sizes[chunk] + ops <= MAX_COMMIT_OPS => {
                    joins = Ok(Some(chunk))
                }
                Some(_) => joins = Err(()),
                None => {}
            }
        }
        let mut op_keys = std::collections::HashSet::new();
        if w.ops
            .iter()
            .any(|op| owner.contains_key(op.key()) || !op_keys.insert(op.key()))
            || target.as_ref().is_some_and(|t| op_keys.contains(t))
        {
            joins = Err(());
        }
        let joins = match joins {
            Ok(j) => j,
            Err(()) => {
                waves.push(std::mem::take(&mut wave));
                sizes.clear();
                owner.clear();
                None
            }
        };
        let cost = ops + usize::from(joins.is_none() && target.is_some());
        let chunk = match joins {
            Some(chunk) => chunk,
            None => match sizes.last() {
                Some(&size) if size + cost <= MAX_COMMIT_OPS => sizes.len() - 1,
                _ => {
                    wave.push(Vec::new());
                    sizes.push(0);
                    sizes.len() - 1
                }
            },
        };
        sizes[chunk] += cost;
        for op in &w.ops {
            owner.insert(op.key().clone(), (chunk, false));
        }
        if let Some(t) = target {
            owner.insert(t, (chunk, true));
        }
        wave[chunk].push(w);
    }
    if !wave.is_empty() {
        waves.push(wave);
    }
    waves.retain(|w| !w.is_empty());
    waves
}

/// Commits queued writes until the sender is gone: each batch of what is
/// waiting, wave by wave, the commits of a wave together.
pub(super) async fn run(store: &dyn Store, mut rx: mpsc::UnboundedReceiver<Write>) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 4096).await > 0 {
        for wave in waves(std::mem::take(&mut batch)) {
            futures_util::future::join_all(wave.into_iter().map(|chunk| commit(store, chunk)))
                .await;
        }
    }
}

/// Commits `batch` as one store commit, status merges and edits included
/// (applied to each TrainJob as it is now, each updated once with its
/// merges and edits in order); a commit that fails is retried write by
/// write (the store hands the operations back) so one bad write does not
/// sink the others. Every write's `done` learns the outcome.
async fn commit(store: &dyn Store, mut batch: Vec<Write>) {
    let counts: Vec<usize> = batch.iter().map(|w| w.ops.len()).collect();
    let own: usize = counts.iter().sum();
    let mut ops: Vec<Op> = Vec::with_capacity(own + batch.len());
    for w in &mut batch {
        ops.append(&mut w.ops);
    }
    // (key, resourceVersion read, object with the merges and edits, what
    // they did)
    let mut merged: Vec<(Key, Rv, Value, Edited)> = Vec::new();
    // The TrainJobs whose finalizer the commit removes.
    let mut released: Vec<Key> = Vec::new();
    for w in &batch {
        let Some(key) = target(w) else { continue };
        let at = match merged.iter().position(|(k, ..)| k == key) {
            Some(at) => at,
            None => {
                let Some(object) = store.get(key) else {
                    continue;
                };
                let value = object.value.as_ref().clone();
                merged.push((key.clone(), object.rv, value, Edited::Unchanged));
                merged.len() - 1
            }
        };
        let (_, _, value, outcome) = &mut merged[at];
        if *outcome == Edited::Delete {
            continue;
        }
        if let Some((_, mapped)) = &w.merge {
            let mut status = value["status"].take();
            let changed = merge_status(&mut status, mapped);
            value["status"] = status;
            if changed {
                *outcome = Edited::Changed;
                if release_if_finished(value) {
                    released.push(key.clone());
                }
            }
        }
        if let Some((_, edit)) = &w.edit {
            match apply_edit(value, edit) {
                Edited::Unchanged => {}
                done => {
                    if matches!(edit, Edit::Release { .. }) {
                        released.push(key.clone());
                    }
                    *outcome = done;
                }
            }
        }
    }
    for (key, rv, value, outcome) in merged {
        match outcome {
            Edited::Unchanged => {}
            Edited::Changed => ops.push(Op::Update {
                key,
                value,
                expected: Some(rv),
            }),
            Edited::Delete => ops.push(Op::Delete {
                key,
                expected: Some(rv),
            }),
        }
    }
    let returned = if ops.is_empty() {
        Ok(Vec::new())
    } else {
        store.commit_or_return(ops).await.map_err(|(_, back)| back)
    };
    let back = match returned {
        Ok(_) => {
            released.iter().for_each(log_released);
            for w in batch {
                if let Some(done) = w.done {
                    done(true);
                }
            }
            return;
        }
        Err(back) => back,
    };
    // Each write gets its own operations back (they come first, in order;
    // the merged updates after them are made again below). A failed write
    // to storage may have kept them: those writes fail.
    let whole = back.len() >= own;
    let mut back = back.into_iter();
    for (w, n) in batch.into_iter().zip(counts) {
        if !whole && n > 0 {
            tracing::warn!("dispatch: write failed, its operations lost with the commit");
            if let Some(done) = w.done {
                done(false);
            }
            continue;
        }
        let ops: Vec<Op> = back.by_ref().take(n).collect();
        let mut ok = match &w.edit {
            Some((key, edit)) => commit_edited(store, ops, key, edit).await,
            None if ops.is_empty() => true,
            None => match store.commit(ops).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "dispatch: write failed");
                    false
                }
            },
        };
        if let Some((key, mapped)) = &w.merge {
            ok &= update_status(store, key, |status| merge_status(status, mapped)).await;
        }
        if let Some(done) = w.done {
            done(ok);
        }
    }
}

/// Commits `ops` with `edit` applied to the TrainJob at `key` as it is
/// now, in one commit, retried on conflicts. A TrainJob that is gone (or
/// another object) is not edited; `ops` still commit.
async fn commit_edited(store: &dyn Store, mut ops: Vec<Op>, key: &Key, edit: &Edit) -> bool {
    for _ in 0..5 {
        let own = ops.len();
        if let Some(object) = store.get(key) {
            let mut value = object.value.as_ref().clone();
            match apply_edit(&mut value, edit) {
                Edited::Unchanged => {}
                Edited::Changed => ops.push(Op::Update {
                    key: key.clone(),
                    value,
                    expected: Some(object.rv),
                }),
                Edited::Delete => ops.push(Op::Delete {
                    key: key.clone(),
                    expected: Some(object.rv),
                }),
            }
        }
        if ops.is_empty() {
            return true;
        }
        let edited = ops.len() > own;
        match store.commit_or_return(ops).await {
            Ok(_) => {
                if edited && matches!(edit, Edit::Release { .. }) {
                    log_released(key);
                }
                return true;
            }
            Err((StoreError::Conflict { .. } | StoreError::NotFound(_), mut back))
                if back.len() >= own =>
            {
                // The TrainJob changed meanwhile: edit it as it is now.
                back.truncate(own);
                ops = back;
            }
            Err((e, _)) => {
                tracing::warn!(%key, error = %e, "dispatch: write failed");
                return false;
            }
        }
    }
    tracing::warn!(%key, "dispatch: write still conflicting after 5 attempts");
    false
}

/// Sets the mapped conditions and jobsStatus on `status`; whether it changed.
pub(super) fn merge_status(status: &mut Value, mapped: &Value) -> bool {
    let before = status.clone();
    let now = format_time(Timestamp::now());
    if let Some(conditions) = mapped["conditions"].as_array() {
        for c in conditions {
            let (Some(type_), Some(state)) = (c["type"].as_str(), c["status"].as_str()) else {
                continue;
            };
            set_condition(
                status,
                type_,
                state,
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default(),
                c["lastTransitionTime"].as_str().unwrap_or(&now),
            );
        }
    }
    if !mapped["jobsStatus"].is_null() {
        if !status.is_object() {
            *status = json!({});
        }
        status["jobsStatus"] = mapped["jobsStatus"].clone();
    }
    *status != before
}

/// Read-modify-write of a TrainJob's status, retried on conflicts; whether
/// it ended written (or with nothing to write).
pub(super) async fn update_status(
    store: &dyn Store,
    key: &Key,
    mut change: impl FnMut(&mut Value) -> bool,
) -> bool {
    for _ in 0..5 {
        let Some(object) = store.get(key) else {
            return true;
        };
        let mut value = object.value.as_ref().clone();
        let mut status = value["status"].take();
        if !change(&mut status) {
            return true;
        }
        value["status"] = status;
        match store
            .commit(vec![Op::Update {
                key: key.clone(),
                value,
                expected: Some(object.rv),
            }])
            .await
        {
            Ok(_) | Err(StoreError::NotFound(_)) => return true,
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => {
                tracing::warn!(%key, error = %e, "writing TrainJob status");
                return false;
            }
        }
    }
    tracing::warn!(%key, "writing TrainJob status: still conflicting after 5 attempts");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(name: &str) -> Op {
        Op::Put {
            key: Key::new("events", Some("default"), name),
            value: json!({}),
        }
    }

    fn ops(name: &str) -> Write {
        Write {
            ops: vec![put(name)],
            ..Write::default()
        }
    }

    fn merge(job: &str) -> Write {
        Write {
            merge: Some((Key::new("trainjobs", Some("default"), job), json!({}))),
            ..Write::default()
        }
    }

    /// The shape of waves: per wave, per commit, the number of writes.
    fn shape(waves: &[Vec<Vec<Write>>]) -> Vec<Vec<usize>> {
        waves
            .iter()
            .map(|w| w.iter().map(Vec::len).collect())
            .collect()
    }

    #[test]
    fn independent_writes_are_cut_into_commits_that_etcd_takes_all_in_one_wave() {
        let batch = (0..250).map(|i| ops(&format!("e{i}"))).collect();
        assert_eq!(shape(&waves(batch)), vec![vec![100, 100, 50]]);
    }

    #[test]
    fn a_key_written_again_waits_for_the_next_wave_and_merges_to_one_trainjob_share_a_commit() {
        let batch = vec![
            ops("a"),
            merge("j"),
            ops("b"),
            merge("j"),
            ops("a"),
            ops("c"),
        ];
        let waves = waves(batch);
        // "a" again opens a second wave; both merges of "j" are one update.
        assert_eq!(shape(&waves), vec![vec![4], vec![2]]);
        let keys: Vec<Vec<String>> = waves
            .iter()
            .map(|w| {
                w[0].iter()
                    .filter_map(|w| w.ops.first())
                    .map(|o| o.key().name.clone())
                    .collect()
            })
            .collect();
        assert_eq!(keys, vec![vec!["a", "b"], vec!["a", "c"]]);
    }

    #[test]
    fn a_trainjob_written_as_an_op_and_as_a_merge_is_not_in_one_commit() {
        let update = Write {
            ops: vec![Op::Update {
                key: Key::new("trainjobs", Some("default"), "j"),
                value: json!({}),
                expected: None,
            }],
            ..Write::default()
        };
        assert_eq!(
            shape(&waves(vec![merge("j"), update])),
            vec![vec![1], vec![1]]
        );
        // A write whose own op and target are the same key commits alone.
        let mut both = merge("k");
        both.ops.push(Op::Remove {
            key: Key::new("trainjobs", Some("default"), "k"),
        });
        assert_eq!(shape(&waves(vec![ops("x"), both])), vec![vec![1], vec![1]]);
    }

    #[test]
    fn a_barrier_commits_after_everything_before_it_and_before_everything_after() {
        let batch = vec![ops("a"), ops("b"), Write::default(), ops("c")];
        let waves = waves(batch);
        assert_eq!(shape(&waves), vec![vec![2], vec![1], vec![1]]);
        assert!(waves[1][0][0].ops.is_empty());
    }

    #[test]
    fn a_full_commit_does_not_take_a_merge_to_its_trainjob_that_would_overflow_it() {
        let mut batch: Vec<Write> = vec![merge("j")];
        batch.extend((0..99).map(|i| ops(&format!("e{i}"))));
        // The commit holds 100 operations now; a merge to "j" adds none.
        batch.push(merge("j"));
        // A write of two operations with target "j" would make 102.
        let mut big = merge("j");
        big.ops = vec![put("x"), put("y")];
        batch.push(big);
        assert_eq!(shape(&waves(batch)), vec![vec![101], vec![1]]);
    }

    #[test]
    fn a_placement_sets_the_spoke_and_the_finalizer_and_a_release_deletes_a_deleting_trainjob() {
        let mut job =
            json!({"metadata": {"name": "j", "uid": "u1", "finalizers": ["example.com/keep"]}});
        let placed = Edit::Placed {
            uid: "u1".into(),
            spoke: Some("gpu-1".into()),
        };
        assert_eq!(apply_edit(&mut job, &placed), Edited::Changed);
        assert_eq!(job["metadata"]["annotations"][ANNOTATION_SPOKE], "gpu-1");
        assert_eq!(
            job["metadata"]["finalizers"],
            json!(["example.com/keep", FINALIZER])
        );
        assert_eq!(
            apply_edit(&mut job, &placed),
            Edited::Unchanged,
            "idempotent"
        );
        // Another object under the same name is left alone.
        let other = Edit::Release { uid: "u2".into() };
        assert_eq!(apply_edit(&mut job, &other), Edited::Unchanged);
        // Requeued: no spoke shown; the finalizer stays.
        let unplaced = Edit::Placed {
            uid: "u1".into(),
            spoke: None,
        };
        assert_eq!(apply_edit(&mut job, &unplaced), Edited::Changed);
        assert!(job["metadata"]["annotations"][ANNOTATION_SPOKE].is_null());
        let release = Edit::Release { uid: "u1".into() };
        let mut deleting = job.clone();
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        // Another finalizer holds it: only ours goes.
        assert_eq!(apply_edit(&mut deleting, &release), Edited::Changed);
        assert_eq!(
            deleting["metadata"]["finalizers"],
            json!(["example.com/keep"])
        );
        deleting["metadata"]["finalizers"] = json!([FINALIZER]);
        assert_eq!(apply_edit(&mut deleting, &release), Edited::Delete);
        // Being deleted: no finalizer may be added.
        let mut marked =
            json!({"metadata": {"uid": "u1", "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        apply_edit(&mut marked, &placed);
        assert!(marked["metadata"]["finalizers"].is_null());
    }

    #[tokio::test]
    async fn a_status_merge_that_ends_the_run_releases_the_trainjob_in_the_same_update() {
        use trainhub_apiserver::store::RedbStore;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(&dir.path().join("s.redb"), 100).expect("store");
        let job = |name: &str| {
            json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                "finalizers": ["example.com/keep", FINALIZER]}})
        };
        let key = |name: &str| Key::new("trainjobs", Some("default"), name);
        let mut ops = Vec::new();
        for name in ["done", "running", "deleting"] {
            ops.push(Op::Create {
                key: key(name),
                value: job(name),
            });
        }
        store.commit(ops).await.expect("create");
        // Marked for deletion as the API server marks it (finalizers held).
        let mut marked = store
            .get(&key("deleting"))
            .expect("stored")
            .value
            .as_ref()
            .clone();
        marked["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        store
            .commit(vec![Op::Update {
                key: key("deleting"),
                value: marked,
                expected: None,
            }])
            .await
            .expect("mark");
        let complete = json!({"conditions": [{"type": "Complete", "status": "True", "reason": "JobSetCompleted", "message": "done"}]});
        let running = json!({"jobsStatus": [{"name": "node", "active": 2}]});
        let rv = |name: &str| store.get(&key(name)).expect("stored").rv;
        let before = (rv("done"), rv("running"));
        let merge = |name: &str, status: &Value| Write {
            merge: Some((key(name), status.clone())),
            ..Write::default()
        };
        commit(
            &store,
            vec![
                merge("done", &complete),
                merge("running", &running),
                merge("deleting", &complete),
            ],
        )
        .await;
        let done = store.get(&key("done")).expect("stored");
        assert_eq!(done.value["status"]["conditions"][0]["type"], "Complete");
        assert_eq!(
            done.value["metadata"]["finalizers"],
            json!(["example.com/keep"]),
            "the run ended: only the hub's finalizer goes"
        );
        let running_now = store.get(&key("running")).expect("stored");
        assert_eq!(running_now.value["metadata"]["finalizers"][1], FINALIZER);
        assert!(done.rv > before.0 && running_now.rv > before.1);
        let changes = store
            .watch("trainjobs", Some("default"), Some(before.0.max(before.1)))
            .expect("watch")
            .replay;
        let names: Vec<String> = changes.iter().map(|e| e.object.key.name.clone()).collect();
        assert_eq!(
            names.iter().filter(|n| **n == "done").count(),
            1,
            "status and release in one update: {names:?}"
        );
        let deleting = store.get(&key("deleting")).expect("stored");
        assert_eq!(
            deleting.value["status"]["conditions"][0]["type"],
            "Complete"
        );
        assert_eq!(
            deleting.value["metadata"]["finalizers"][1], FINALIZER,
            "a TrainJob being deleted is released by dispatch after its run stops"
        );
    }

    /// A commit refused for one write's op is made again write by write,
    /// from the operations the store hands back: the others land, the
    /// refused one fails alone, and a placement's edit still reaches its
    /// TrainJob.
    #[tokio::test]
    async fn a_refused_write_fails_alone_and_the_rest_of_its_commit_lands() {
        use std::sync::{Arc, Mutex};
        use trainhub_apiserver::store::RedbStore;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RedbStore::open(&dir.path().join("s.redb"), 100).expect("store");
        let job_key = Key::new("trainjobs", Some("default"), "j");
        store
            .commit(vec![
                Op::Create {
                    key: job_key.clone(),
                    value: json!({"metadata": {"name": "j", "namespace": "default", "uid": "u1"}}),
                },
                Op::Create {
                    key: Key::new("events", Some("default"), "taken"),
                    value: json!({}),
                },
            ])
            .await
            .expect("create");
        let outcomes: Arc<Mutex<Vec<(&str, bool)>>> = Arc::default();
        let done = |name: &'static str| -> Option<Box<dyn FnOnce(bool) + Send>> {
            let outcomes = outcomes.clone();
            Some(Box::new(move |ok| {
                outcomes.lock().unwrap().push((name, ok))
            }))
        };
        let writes = vec![
            Write {
                done: done("a"),
                ..ops("a")
            },
            Write {
                ops: vec![Op::Create {
                    key: Key::new("events", Some("default"), "taken"),
                    value: json!({}),
                }],
                done: done("taken"),
                ..Write::default()
            },
            Write {
                ops: vec![put("placement")],
                edit: Some((
                    job_key.clone(),
                    Edit::Placed {
                        uid: "u1".into(),
                        spoke: Some("s1".into()),
                    },
                )),
                done: done("placed"),
                ..Write::default()
            },
        ];
        commit(&store, writes).await;
        assert_eq!(
            *outcomes.lock().unwrap(),
            [("a", true), ("taken", false), ("placed", true)]
        );
        assert!(
            store
                .get(&Key::new("events", Some("default"), "a"))
                .is_some()
        );
        assert!(
            store
                .get(&Key::new("events", Some("default"), "placement"))
                .is_some()
        );
        let job = store.get(&job_key).expect("j");
        assert_eq!(job.value["metadata"]["annotations"][ANNOTATION_SPOKE], "s1");
        assert_eq!(job.value["metadata"]["finalizers"], json!([FINALIZER]));
    }

    #[test]
    fn merged_status_keeps_other_conditions_and_reports_change() {
        let mut status =
            json!({"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed"}]});
        let mapped = json!({
            "conditions": [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "message": "done"}],
            "jobsStatus": [{"name": "node", "succeeded": 2}]
        });
        assert!(merge_status(&mut status, &mapped));
        assert_eq!(status["conditions"][0]["type"], "Suspended");
        assert_eq!(status["conditions"][1]["reason"], "AllJobsCompleted");
        assert_eq!(status["jobsStatus"][0]["succeeded"], 2);
        assert!(!merge_status(&mut status, &mapped), "same again: no write");
    }
}
