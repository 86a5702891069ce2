//! Leader election on a real local etcd cluster (`LocalEtcd`): one leader,
//! handover, fencing by the leader key's create revision, stepping down
//! when etcd is unreachable.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::sync::{oneshot, watch};
use trainhub::leader::{self, ElectionTimings, Replica, Role};
use trainhub_apiserver::store::etcd::LocalEtcd;
use trainhub_apiserver::store::{EtcdConfig, Key, Op, Store, StoreError, Term};

fn timings() -> ElectionTimings {
    ElectionTimings {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
    }
}

struct Candidate {
    role: watch::Receiver<Role>,
    stop: Option<oneshot::Sender<()>>,
}

async fn candidate(client: &etcd_client::Client, name: &str, i: usize) -> Candidate {
    let (stop, stopped) = oneshot::channel::<()>();
    let role = leader::spawn(
        client.clone(),
        name.to_string(),
        Replica {
            identity: format!("hub-{i}"),
            api: format!("127.0.0.1:{}", 6443 + i),
            grpc: Some(format!("127.0.0.1:{}", 7443 + i)),
        },
        timings(),
        async move {
            let _ = stopped.await;
        },
    );
    Candidate {
        role,
        stop: Some(stop),
    }
}

/// Waits until exactly one of `candidates` leads and every other one
/// follows it by name; returns the leader's index and term.
async fn one_leader(candidates: &[Candidate], within: Duration) -> (usize, Term) {
    let deadline = Instant::now() + within;
    loop {
        let roles: Vec<Role> = candidates.iter().map(|c| c.role.borrow().clone()).collect();
        let leaders: Vec<(usize, Term)> = roles
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Role::Leader(t) => Some((i, t.clone())),
                _ => None,
            })
            .collect();
        if let [(i, term)] = leaders.as_slice() {
            let named = format!("127.0.0.1:{}", 7443 + i);
            let all_follow = roles.iter().enumerate().all(|(j, r)| {
                j == *i || candidates[j].stop.is_none() || r.leader_grpc() == Some(named.as_str())
            });
            if all_follow {
                return (*i, term.clone());
            }
        }
        assert!(leaders.len() <= 1, "two replicas lead at once: {roles:?}");
        assert!(
            Instant::now() < deadline,
            "no single leader within {within:?}: {roles:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A write fenced by `term`, as the store's fenced commits make it.
async fn fenced_put(client: &etcd_client::Client, term: &Term) -> bool {
    let rev = i64::try_from(term.revision).expect("a revision etcd gave");
    let txn = Txn::new()
        .when(vec![Compare::create_revision(
            term.key.as_str(),
            CompareOp::Equal,
            rev,
        )])
        .and_then(vec![TxnOp::put("/it-leader-fenced", "written", None)]);
    client
        .kv_client()
        .txn(txn)
        .await
        .expect("etcd answers the txn")
        .succeeded()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_replica_leads_and_a_deposed_leaders_term_no_longer_writes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = LocalEtcd::start_or_skip(3, dir.path()).unwrap() else {
        return;
    };
    let client = EtcdConfig {
        endpoints: etcd.endpoints(),
        ..EtcdConfig::default()
    }
    .connect()
    .await
    .unwrap();
    let name = "/it-election-leader";
    let mut candidates = Vec::new();
    for i in 0..3 {
        candidates.push(candidate(&client, name, i).await);
    }
    let (first, term) = one_leader(&candidates, Duration::from_secs(15)).await;
    assert!(term.revision > 0 && term.key.starts_with(name), "{term:?}");
    assert!(fenced_put(&client, &term).await, "the leader's term writes");

    // The leader goes (resigning on its way out): another leads at once.
    let started = Instant::now();
    drop(candidates[first].stop.take());
    let mut gone = candidates[first].role.clone();
    tokio::time::timeout(Duration::from_secs(2), gone.wait_for(|r| !r.is_leader()))
        .await
        .expect("a replica shutting down stops leading at once")
        .unwrap();
    let (second, new_term) = one_leader(&candidates, Duration::from_secs(10)).await;
    assert_ne!(second, first);
    assert_ne!(new_term, term);
    assert!(
        started.elapsed() < timings().lease_duration,
        "a resigning leader is replaced before its lease would expire ({:?})",
        started.elapsed()
    );
    assert!(
        !fenced_put(&client, &term).await,
        "a deposed leader's term must not write"
    );
    assert!(fenced_put(&client, &new_term).await);

    // The store view a term's dispatch and controllers write through
    // refuses the deposed term's commits, and counts them.
    let store = trainhub_apiserver::store::EtcdStore::open(
        &EtcdConfig {
            endpoints: etcd.endpoints(),
            prefix: "/it-fenced".into(),
            ..EtcdConfig::default()
        },
        1000,
    )
    .await
    .unwrap();
    let shared: std::sync::Arc<dyn Store> = store;
    let before = trainhub::metrics::hub().fenced_writes.get();
    let deposed = leader::Counted::fence(shared.clone(), term.clone());
    let put = |name: &str| Op::Put {
        key: Key::new("configmaps", Some("default"), name),
        value: serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}}),
    };
    let refused = deposed.commit(vec![put("by-the-deposed")]).await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
    assert_eq!(trainhub::metrics::hub().fenced_writes.get(), before + 1);
    assert!(
        shared
            .get(&Key::new("configmaps", Some("default"), "by-the-deposed"))
            .is_none()
    );
    let current = leader::Counted::fence(shared.clone(), new_term.clone());
    current.commit(vec![put("by-the-leader")]).await.unwrap();
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_steps_down_within_the_renew_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut etcd) = LocalEtcd::start_or_skip(1, dir.path()).unwrap() else {
        return;
    };
    let client = EtcdConfig {
        endpoints: etcd.endpoints(),
        ..EtcdConfig::default()
    }
    .connect()
    .await
    .unwrap();
    let candidates = vec![candidate(&client, "/it-cutoff-leader", 0).await];
    one_leader(&candidates, Duration::from_secs(15)).await;
    let cut = Instant::now();
    etcd.kill(0);
    let mut role = candidates[0].role.clone();
    let limit = timings().renew_deadline + timings().retry_period * 2;
    tokio::time::timeout(limit, role.wait_for(|r| !r.is_leader()))
        .await
        .unwrap_or_else(|_| panic!("still leading {limit:?} after etcd went away"))
        .unwrap();
    assert!(
        cut.elapsed() < timings().lease_duration,
        "stepped down after {:?}: not before its lease could expire",
        cut.elapsed()
    );
}
