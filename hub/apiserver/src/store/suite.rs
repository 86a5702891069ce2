//! The behaviour every [`Store`] owes its callers, as tests over
//! `&dyn Store`: the redb and the etcd store both run them.

use std::time::Duration;

use serde_json::{Value, json};

use super::{EventType, Key, Op, Rv, Store, StoreError, Watch};
use crate::limits::STORE_READABLE_DEPTH;

pub(crate) const JOBS: &str = "trainer.kubeflow.org/trainjobs";

pub(crate) fn key(name: &str) -> Key {
    Key::new(JOBS, Some("default"), name)
}

pub(crate) fn job(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default"}})
}

pub(crate) fn create(name: &str) -> Op {
    Op::Create {
        key: key(name),
        value: job(name),
    }
}

/// The next live event of `watch` in its scope, within 10 s.
pub(crate) async fn next(watch: &mut Watch) -> (EventType, String, Rv) {
    let event = tokio::time::timeout(Duration::from_secs(10), watch.live.recv())
        .await
        .expect("an event within 10 s")
        .expect("the live feed is open");
    (event.kind, event.object.key.name.clone(), event.object.rv)
}

pub(crate) async fn preconditions_are_exact(store: &dyn Store) {
    let a = store.commit(vec![create("a")]).await.expect("create");
    let rv = a[0].rv;
    assert_eq!(
        a[0].value["metadata"]["resourceVersion"],
        rv.to_string(),
        "the answer carries its resourceVersion"
    );
    assert_eq!(
        store.commit(vec![create("a")]).await.unwrap_err(),
        StoreError::AlreadyExists(key("a"))
    );
    assert_eq!(
        store
            .commit(vec![Op::Update {
                key: key("a"),
                value: job("a"),
                expected: Some(rv + 100),
            }])
            .await
            .unwrap_err(),
        StoreError::Conflict {
            key: key("a"),
            expected: rv + 100,
            current: rv,
        }
    );
    assert_eq!(
        store
            .commit(vec![Op::Delete {
                key: key("zz"),
                expected: None,
            }])
            .await
            .unwrap_err(),
        StoreError::NotFound(key("zz"))
    );
    assert_eq!(
        store
            .commit(vec![Op::Update {
                key: key("zz"),
                value: job("zz"),
                expected: None,
            }])
            .await
            .unwrap_err(),
        StoreError::NotFound(key("zz"))
    );
    // An atomic pair where the second fails writes nothing, and the error
    // names the failing key.
    let err = store
        .commit(vec![create("b"), create("a")])
        .await
        .unwrap_err();
    assert_eq!(err, StoreError::AlreadyExists(key("a")));
    assert!(store.get(&key("b")).is_none());
    assert_eq!(store.revision(), rv);
    // The expected version passes.
    let updated = store
        .commit(vec![Op::Update {
            key: key("a"),
            value: json!({"metadata": {"name": "a", "namespace": "default", "resourceVersion": "1"}, "spec": 2}),
            expected: Some(rv),
        }])
        .await
        .expect("update at the expected version");
    assert!(updated[0].rv > rv);
    let read = store.get(&key("a")).expect("a");
    assert_eq!(read.rv, updated[0].rv, "a replica reads what it wrote");
    assert_eq!(read.value["spec"], 2);
    assert_eq!(
        read.value["metadata"]["resourceVersion"],
        updated[0].rv.to_string()
    );
    let deleted = store
        .commit(vec![Op::Delete {
            key: key("a"),
            expected: Some(updated[0].rv),
        }])
        .await
        .expect("delete at the expected version");
    assert_eq!(
        deleted[0].value["spec"], 2,
        "a deletion answers the last state"
    );
    assert!(store.get(&key("a")).is_none());
}

pub(crate) async fn a_refused_commit_hands_its_operations_back(store: &dyn Store) {
    let a = store.commit(vec![create("a")]).await.expect("create");
    let rv = a[0].rv;
    let ops = vec![
        create("b"),
        Op::Update {
            key: key("a"),
            value: job("a"),
            expected: Some(rv + 1),
        },
        Op::Remove { key: key("c") },
    ];
    let (e, back) = store
        .commit_or_return(ops.clone())
        .await
        .expect_err("a stale update is refused");
    assert!(matches!(e, StoreError::Conflict { .. }), "{e}");
    assert_eq!(
        format!("{back:?}"),
        format!("{ops:?}"),
        "every op, as it was"
    );
    assert!(store.get(&key("b")).is_none(), "nothing of it written");
    let (e, back) = store
        .commit_or_return(vec![create("a"), create("d")])
        .await
        .expect_err("a is there");
    assert_eq!(e, StoreError::AlreadyExists(key("a")));
    assert_eq!(back.len(), 2);
    // Handed back and mended, they commit (the removal of nothing is no
    // change).
    let mut ops = ops;
    if let Op::Update { expected, .. } = &mut ops[1] {
        *expected = Some(rv);
    }
    let done = store
        .commit_or_return(ops)
        .await
        .expect("the mended commit");
    assert_eq!(done.len(), 2);
    assert!(store.get(&key("b")).is_some());
}

pub(crate) async fn put_and_remove_are_unconditional(store: &dyn Store) {
    let mut watch = store.watch(JOBS, None, None).expect("watch");
    let put = |v: Value| Op::Put {
        key: key("a"),
        value: v,
    };
    store.commit(vec![put(job("a"))]).await.expect("put new");
    let mut replaced = job("a");
    replaced["spec"] = json!({"x": 1});
    store.commit(vec![put(replaced)]).await.expect("put again");
    assert_eq!(store.get(&key("a")).expect("a").value["spec"]["x"], 1);
    let none = store
        .commit(vec![Op::Remove { key: key("zz") }])
        .await
        .expect("remove absent");
    assert!(none.is_empty(), "removing an absent key writes nothing");
    let removed = store
        .commit(vec![Op::Remove { key: key("a") }])
        .await
        .expect("remove a");
    assert_eq!(removed.len(), 1);
    assert!(store.get(&key("a")).is_none());
    let mut kinds = Vec::new();
    let mut last = 0;
    for _ in 0..3 {
        let (kind, _, rv) = next(&mut watch).await;
        assert!(rv > last, "live events come in resourceVersion order");
        last = rv;
        kinds.push(kind);
    }
    assert_eq!(
        kinds,
        [EventType::Added, EventType::Modified, EventType::Deleted]
    );
    assert_eq!(store.revision(), last);
}

pub(crate) async fn watches_replay_then_follow(store: &dyn Store) {
    let a = store.commit(vec![create("a")]).await.expect("a")[0].rv;
    let b = store.commit(vec![create("b")]).await.expect("b")[0].rv;
    // Another resource and namespace stay out of the watch.
    store
        .commit(vec![Op::Create {
            key: Key::new("pods", Some("default"), "p"),
            value: job("p"),
        }])
        .await
        .expect("pod");
    store
        .commit(vec![Op::Create {
            key: Key::new(JOBS, Some("other"), "o"),
            value: job("o"),
        }])
        .await
        .expect("other namespace");
    let gone = store
        .commit(vec![Op::Delete {
            key: key("a"),
            expected: None,
        }])
        .await
        .expect("delete a")[0]
        .rv;
    let mut watch = store.watch(JOBS, Some("default"), Some(a)).expect("watch");
    let replay: Vec<_> = watch
        .replay
        .iter()
        .map(|e| (e.kind, e.object.key.name.clone(), e.object.rv))
        .collect();
    assert_eq!(
        replay,
        [
            (EventType::Added, "b".to_string(), b),
            (EventType::Deleted, "a".to_string(), gone)
        ]
    );
    assert_eq!(
        watch
            .replay
            .iter()
            .nth(1)
            .expect("the deletion")
            .object
            .value["metadata"]["resourceVersion"],
        gone.to_string(),
        "a deletion carries the deletion's resourceVersion"
    );
    let c = store.commit(vec![create("c")]).await.expect("c")[0].rv;
    assert_eq!(next(&mut watch).await, (EventType::Added, "c".into(), c));
    let (items, rv) = store.list(JOBS, Some("default"));
    let names: Vec<_> = items.iter().map(|o| o.key.name.as_str()).collect();
    assert_eq!(names, ["b", "c"]);
    assert!(rv >= c);
    assert_eq!(store.list(JOBS, None).0.len(), 3);
}

/// A follower of latest versions skips, undecoded, a change to an object
/// changed again since, and still gets every latest version and deletion.
pub(crate) async fn a_follower_of_latest_versions_skips_superseded_changes(store: &dyn Store) {
    let mut watch = store.watch(JOBS, Some("default"), None).expect("watch");
    let update = |name: &str, n: i64| Op::Put {
        key: key(name),
        value: json!({"metadata": {"name": name, "namespace": "default"}, "n": n}),
    };
    store.commit(vec![create("a")]).await.expect("a");
    store.commit(vec![update("a", 1)]).await.expect("a again");
    let b = store.commit(vec![create("b")]).await.expect("b")[0].rv;
    let a = store.commit(vec![update("a", 2)]).await.expect("a last")[0].rv;
    let gone = store
        .commit(vec![Op::Remove { key: key("b") }])
        .await
        .expect("remove b")[0]
        .rv;
    // Received after all were written: a's first two versions and b's
    // creation were superseded by then (b is gone), so they are skipped;
    // a's last version and b's deletion are received; then c, written
    // after, shows nothing else was waiting.
    let c = store.commit(vec![create("c")]).await.expect("c")[0].rv;
    let mut seen = Vec::new();
    while seen
        .last()
        .is_none_or(|(_, name, _, _): &(EventType, String, Rv, Option<i64>)| name != "c")
    {
        let event = tokio::time::timeout(
            Duration::from_secs(10),
            watch
                .live
                .recv_latest(|k, rv| store.revision_of(k) == Some(rv)),
        )
        .await
        .expect("an event within 10 s")
        .expect("the live feed is open");
        seen.push((
            event.kind,
            event.object.key.name.clone(),
            event.object.rv,
            event.object.value["n"].as_i64(),
        ));
    }
    assert_eq!(
        seen,
        [
            (EventType::Modified, "a".to_string(), a, Some(2)),
            (EventType::Deleted, "b".to_string(), gone, None),
            (EventType::Added, "c".to_string(), c, None),
        ],
        "b was created at {b}"
    );
}

/// `compact` makes every resourceVersion before the latest too old.
pub(crate) async fn a_compacted_version_is_gone<F, Fut>(store: &dyn Store, compact: F)
where
    F: FnOnce(Rv) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let first = store.commit(vec![create("a")]).await.expect("a")[0].rv;
    for name in ["b", "c", "d"] {
        store.commit(vec![create(name)]).await.expect("create");
    }
    compact(store.revision()).await;
    assert!(matches!(
        store.watch(JOBS, None, Some(first)),
        Err(StoreError::Gone { .. })
    ));
    let now = store
        .watch(JOBS, None, Some(store.revision()))
        .expect("the latest version is never gone");
    assert!(now.replay.is_empty());
}

pub(crate) async fn values_read_back_exactly(store: &dyn Store) {
    let numbers = json!([
        8.053220295982734e151,
        -4.0463105740735334e246,
        0.1,
        1e-300,
        u64::MAX,
        i64::MIN
    ]);
    let mut value = job("n");
    value["spec"] = numbers.clone();
    value["metadata"]["labels"] = json!({"z": "1", "a": "2"});
    store
        .commit(vec![Op::Create {
            key: key("n"),
            value: value.clone(),
        }])
        .await
        .expect("create");
    let read = store.get(&key("n")).expect("n");
    assert_eq!(read.value["spec"], numbers);
    assert_eq!(
        read.value["metadata"]["labels"],
        json!({"z": "1", "a": "2"})
    );

    let mut spec = Value::from(1);
    for _ in 1..STORE_READABLE_DEPTH {
        spec = Value::Array(vec![spec]);
    }
    let mut deepest = job("deepest");
    deepest["spec"] = spec.clone();
    assert_eq!(crate::limits::depth(&deepest), STORE_READABLE_DEPTH);
    store
        .commit(vec![Op::Create {
            key: key("deepest"),
            value: deepest,
        }])
        .await
        .expect("the deepest readable object is stored");
    assert_eq!(
        crate::limits::depth(&store.get(&key("deepest")).expect("deepest").value),
        STORE_READABLE_DEPTH
    );
    let mut deeper = job("deeper");
    deeper["spec"] = Value::Array(vec![spec]);
    let e = store
        .commit(vec![Op::Put {
            key: key("deeper"),
            value: deeper,
        }])
        .await
        .expect_err("one level more is refused");
    assert!(
        e.to_string().contains("more than the store can read back"),
        "{e}"
    );
}

pub(crate) async fn keys_that_would_read_back_as_others_are_refused(store: &dyn Store) {
    let before = store.revision();
    for bad in [
        Key::new(JOBS, Some("a|b"), "c"),
        Key::new(JOBS, Some("a"), "b|c"),
        Key::new(JOBS, Some("a"), "b/c"),
        Key::new(JOBS, Some("a/b"), "c"),
    ] {
        let e = store
            .commit(vec![Op::Create {
                key: bad.clone(),
                value: job("c"),
            }])
            .await
            .unwrap_err();
        assert_eq!(e, StoreError::InvalidKey(bad));
    }
    let e = store
        .commit(vec![
            create("ok"),
            Op::Put {
                key: Key::new("pods", Some("x|y"), "p"),
                value: job("p"),
            },
        ])
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::InvalidKey(_)), "{e}");
    assert!(store.get(&key("ok")).is_none());
    assert_eq!(store.revision(), before);
}

/// Many commits at once, some of them conflicting with each other or
/// with what is stored: each caller gets its own answer, what succeeded is
/// stored, and a watch from any resourceVersion in between misses none of
/// it. Returns the resourceVersions of the successful commits.
pub(crate) async fn concurrent_commits_each_get_their_own_answer(store: &dyn Store) -> Vec<Rv> {
    let before = store.commit(vec![create("taken")]).await.expect("taken")[0].rv;
    let name = |i: usize| format!("n{i:02}");
    let mut commits: Vec<Vec<Op>> = Vec::new();
    // 40 new names, the first ten of them twice: one of each pair wins.
    for i in (0..40).chain(0..10) {
        commits.push(vec![create(&name(i))]);
    }
    // A stored name, and a stale update of it.
    for _ in 0..5 {
        commits.push(vec![create("taken")]);
        commits.push(vec![Op::Update {
            key: key("taken"),
            value: job("taken"),
            expected: Some(before + 1000),
        }]);
    }
    // Pairs that share one key: one pair wins, the others write nothing.
    for i in 0..5 {
        commits.push(vec![create(&format!("p{i}")), create("shared")]);
    }
    let answers =
        futures_util::future::join_all(commits.iter().map(|ops| store.commit(ops.clone()))).await;
    let mut won = std::collections::BTreeMap::new();
    let mut shared = 0;
    for (ops, answer) in commits.iter().zip(&answers) {
        let first = ops[0].key().clone();
        match (ops.len(), &ops[0], answer) {
            (1, Op::Create { .. }, Ok(objects)) if first.name != "taken" => {
                assert_eq!(objects.len(), 1);
                assert_eq!(objects[0].key, first);
                assert_eq!(
                    objects[0].value["metadata"]["resourceVersion"],
                    objects[0].rv.to_string()
                );
                assert!(
                    won.insert(first.name.clone(), objects[0].rv).is_none(),
                    "{first}: created twice"
                );
            }
            (1, Op::Create { .. }, Err(e)) => {
                assert_eq!(e, &StoreError::AlreadyExists(first.clone()));
                assert!(
                    first.name == "taken" || name_index(&first.name) < 10,
                    "{first}: {e}"
                );
            }
            (1, Op::Update { .. }, Err(e)) => assert_eq!(
                e,
                &StoreError::Conflict {
                    key: key("taken"),
                    expected: before + 1000,
                    current: before,
                }
            ),
            (2, _, Ok(objects)) => {
                shared += 1;
                assert_eq!(objects.len(), 2);
                assert_eq!(objects[0].key, first);
                for object in objects {
                    assert!(won.insert(object.key.name.clone(), object.rv).is_none());
                }
            }
            (2, _, Err(e)) => {
                assert_eq!(e, &StoreError::AlreadyExists(key("shared")));
                assert!(store.get(&first).is_none(), "{first}: half a commit stored");
            }
            _ => panic!("{ops:?}: unexpected {answer:?}"),
        }
    }
    assert_eq!(shared, 1, "exactly one pair creates the shared key");
    assert_eq!(won.len(), 40 + 2);
    for (name, rv) in &won {
        let stored = store.get(&key(name)).expect("stored");
        assert_eq!(stored.rv, *rv, "{name}");
    }
    assert_eq!(store.get(&key("taken")).expect("taken").rv, before);
    // From before the burst: every change once. From any revision of it:
    // every later change (those of that revision may come again).
    let mut rvs: Vec<Rv> = won.values().copied().collect();
    rvs.sort_unstable();
    rvs.dedup();
    for since in std::iter::once(before).chain(rvs.iter().copied()) {
        let watch = store
            .watch(JOBS, Some("default"), Some(since))
            .expect("watch");
        let mut replayed: Vec<(String, Rv)> = watch
            .replay
            .iter()
            .map(|e| {
                assert_eq!(e.kind, EventType::Added);
                (e.object.key.name.clone(), e.object.rv)
            })
            .collect();
        if since == before {
            let all: Vec<(String, Rv)> = won.iter().map(|(n, rv)| (n.clone(), *rv)).collect();
            replayed.sort();
            assert_eq!(replayed, all, "each change once");
            continue;
        }
        for (name, rv) in &won {
            if *rv > since {
                assert!(
                    replayed.contains(&(name.clone(), *rv)),
                    "a watch from {since} misses {name} at {rv}"
                );
            }
        }
        assert!(replayed.iter().all(|(_, rv)| *rv >= since));
    }
    rvs
}

fn name_index(name: &str) -> usize {
    name.trim_start_matches('n').parse().unwrap_or(usize::MAX)
}

/// Every behaviour above but compaction, each on a fresh store from `open`.
pub(crate) async fn run_all<F, Fut, S>(open: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = S>,
    S: std::ops::Deref,
    S::Target: Store + Sized,
{
    preconditions_are_exact(&*open().await).await;
    a_refused_commit_hands_its_operations_back(&*open().await).await;
    put_and_remove_are_unconditional(&*open().await).await;
    watches_replay_then_follow(&*open().await).await;
    a_follower_of_latest_versions_skips_superseded_changes(&*open().await).await;
    values_read_back_exactly(&*open().await).await;
    keys_that_would_read_back_as_others_are_refused(&*open().await).await;
    concurrent_commits_each_get_their_own_answer(&*open().await).await;
}
