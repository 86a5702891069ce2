//! The redb store on a disk that fills up: commits are refused while the
//! file cannot grow, and once there is room again they succeed, with every
//! accepted write kept and no refused one. A full disk is the process's file
//! size limit here (`RLIMIT_FSIZE`: the kernel refuses writes past it with
//! `EFBIG`, as a full disk refuses them with `ENOSPC`), which is why this
//! test has a process of its own.
#![allow(clippy::unwrap_used)]

use serde_json::json;
use trainhub_apiserver::store::{Key, Op, RedbStore, Store, StoreError};

/// Sets the soft limit on the size of files this process writes.
#[allow(
    unsafe_code,
    reason = "getrlimit and setrlimit have no safe wrapper here"
)]
fn file_size_limit(bytes: libc::rlim_t) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit), 0);
        limit.rlim_cur = bytes.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
    }
}

fn object(name: &str, filler: usize) -> Op {
    Op::Create {
        key: Key::new("widgets", Some("ns"), name),
        value: json!({"metadata": {"name": name, "namespace": "ns"}, "filler": "x".repeat(filler)}),
    }
}

/// Writing past the limit raises SIGXFSZ, which would end the process.
#[allow(unsafe_code, reason = "signal has no safe wrapper here")]
fn ignore_sigxfsz() {
    // SAFETY: ignoring a signal; no handler runs.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

#[tokio::test]
async fn a_full_disk_refuses_commits_until_there_is_room_again() {
    ignore_sigxfsz();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = RedbStore::open(&path, 1000).unwrap();
    let mut accepted = Vec::new();
    for i in 0..3 {
        let name = format!("small-{i}");
        store.commit(vec![object(&name, 100)]).await.unwrap();
        accepted.push(name);
    }

    // The disk is full: the file may not grow. Large objects until one is
    // refused.
    file_size_limit(std::fs::metadata(&path).unwrap().len());
    let mut refused = None;
    for i in 0..64 {
        let name = format!("large-{i}");
        match store.commit(vec![object(&name, 256 << 10)]).await {
            Ok(_) => accepted.push(name),
            Err(e) => {
                refused = Some((name, e));
                break;
            }
        }
    }
    let (refused_name, error) = refused.expect("a commit past the file size limit was refused");
    assert!(
        matches!(&error, StoreError::Storage(m) if m.contains("File too large")),
        "{error:?}"
    );
    // Still full: refused again, the store keeps answering.
    assert!(
        store
            .commit(vec![object("still-full", 256 << 10)])
            .await
            .is_err()
    );
    assert!(
        store
            .get(&Key::new("widgets", Some("ns"), &refused_name))
            .is_none()
    );

    // Room again: writes succeed without a restart.
    file_size_limit(libc::RLIM_INFINITY);
    for name in ["after-1", "after-2"] {
        store
            .commit(vec![object(name, 256 << 10)])
            .await
            .unwrap_or_else(|e| panic!("{name} after the disk had room again: {e}"));
        accepted.push(name.to_string());
    }

    // Every accepted write and no refused one, also once reopened.
    let names = |store: &RedbStore| {
        let mut names: Vec<String> = store
            .list("widgets", Some("ns"))
            .0
            .into_iter()
            .map(|o| o.key.name)
            .collect();
        names.sort();
        names
    };
    accepted.sort();
    assert_eq!(names(&store), accepted);
    drop(store);
    let reopened = RedbStore::open(&path, 1000).unwrap();
    assert_eq!(names(&reopened), accepted);
}
