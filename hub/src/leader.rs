//! Leader election among hub replicas: etcd's election API on a lease.
//!
//! One replica leads at a time; only the leader runs dispatch, the spoke
//! sessions and the controllers, and every write it makes for them is
//! fenced by its [`Term`] (the leader key and its create revision), so a
//! deposed leader that has not noticed yet cannot write.
//!
//! Timings are client-go's leader election defaults: the lease lives
//! [`ElectionTimings::lease_duration`] (15 s) past the last renewal, is
//! renewed every [`ElectionTimings::retry_period`] (5 s here), and a leader
//! whose renewals have all failed for [`ElectionTimings::renew_deadline`]
//! (10 s) steps down on its own, before its lease can expire and another
//! replica be elected.
//!
//! A store only one process writes (redb) has one term for ever:
//! [`single`] says Leader at once.
//!
//! The rest of the hub follows the [`Role`] channel.

use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use trainhub_apiserver::store::{CommitFuture, Op, ReturningFuture, Store, StoreError, Term};

/// A replica's address book entry, the value it campaigns with: who it is
/// and where its API and its spokes' gRPC endpoint are reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub identity: String,
    /// `host:port` of the Kubernetes API.
    pub api: String,
    /// `host:port` of the spokes' gRPC endpoint, if it serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<String>,
}

/// What this replica is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Leading in this term.
    Leader(Term),
    /// Not leading; the leader, when known.
    Follower(Option<Replica>),
}

impl Role {
    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader(_))
    }

    /// The leader's gRPC address, when this replica follows a known leader.
    pub fn leader_grpc(&self) -> Option<&str> {
        match self {
            Role::Follower(Some(r)) => r.grpc.as_deref(),
            _ => None,
        }
    }
}

/// The election's timings (client-go's names and defaults, but the renew
/// period: etcd renews a lease with a keep-alive every 5 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionTimings {
    /// The lease's time to live (etcd rounds it up to whole seconds).
    pub lease_duration: Duration,
    /// A leader that has not renewed its lease for this long steps down.
    pub renew_deadline: Duration,
    /// How often the lease is renewed, and a lost campaign retried.
    pub retry_period: Duration,
}

impl Default for ElectionTimings {
    fn default() -> Self {
        ElectionTimings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(5),
        }
    }
}

impl ElectionTimings {
    /// The timings must nest: retry < renew deadline < lease, so that a
    /// leader steps down before its lease can expire.
    ///
    /// # Errors
    ///
    /// Which two values are out of order.
    pub fn check(&self) -> Result<(), String> {
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(format!(
                "--leader-elect-retry-period ({:?}) must be above zero and below --leader-elect-renew-deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be below --leader-elect-lease-duration ({:?}): a leader steps down before its lease can expire",
                self.renew_deadline, self.lease_duration
            ));
        }
        Ok(())
    }

    /// The lease's TTL in whole seconds, rounded up (at least 1).
    pub fn lease_ttl_seconds(&self) -> i64 {
        let ms = self.lease_duration.as_millis();
        i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX).max(1)
    }
}

/// The clap flags of the election (kube-controller-manager's names).
#[derive(Debug, Clone, clap::Args)]
pub struct ElectionArgs {
    /// With `--storage-backend etcd3`: the leader's lease lives this long
    /// past its last renewal; a new leader is elected at most this long
    /// after the old one died (Go duration syntax).
    #[arg(long, default_value = "15s", value_parser = crate::controller::events::parse_go_duration)]
    pub leader_elect_lease_duration: Duration,
    /// A leader that could not renew its lease for this long steps down
    /// (and goes on as a follower); must be below the lease duration.
    #[arg(long, default_value = "10s", value_parser = crate::controller::events::parse_go_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the lease is renewed (etcd keep-alive) and a follower
    /// looks up the leader; must be below the renew deadline.
    #[arg(long, default_value = "5s", value_parser = crate::controller::events::parse_go_duration)]
    pub leader_elect_retry_period: Duration,
}

impl ElectionArgs {
    pub fn timings(&self) -> ElectionTimings {
        let ElectionArgs {
            leader_elect_lease_duration,
            leader_elect_renew_deadline,
            leader_elect_retry_period,
        } = self;
        ElectionTimings {
            lease_duration: *leader_elect_lease_duration,
            renew_deadline: *leader_elect_renew_deadline,
            retry_period: *leader_elect_retry_period,
        }
    }
}

/// The one term of a store only this process writes (redb).
pub fn single_term() -> Term {
    Term {
        key: String::new(),
        revision: 0,
    }
}

/// The role channel of a store only one process writes: Leader at once,
/// for ever.
pub fn single() -> watch::Receiver<Role> {
    let (tx, rx) = watch::channel(Role::Leader(single_term()));
    // Kept open: the receivers never see the channel close.
    std::mem::forget(tx);
    rx
}

/// The election's name (its keys' prefix) for a store `prefix`: beside the
/// store's keys, not under them, so the store's watch never sees it.
pub fn election_name(prefix: &str) -> String {
    format!("{}-leader", prefix.trim_end_matches('/'))
}

/// Campaigns for leadership until `shutdown` and publishes this replica's
/// role. Starts as a follower with an unknown leader.
///
/// # Guarantees
///
/// - `Leader(term)` is published only once etcd elected this replica with
///   the leader key `term.key` created at `term.revision`.
/// - A leader publishes `Follower` as soon as no renewal of its lease has
///   succeeded for the renew deadline, when a renewal finds the lease gone,
///   or when the leader key is gone; it then campaigns again on a new lease.
/// - On shutdown the replica publishes `Follower` and revokes its lease
///   (best effort), so the next replica does not wait for it to expire.
pub fn spawn(
    client: etcd_client::Client,
    name: String,
    me: Replica,
    timings: ElectionTimings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> watch::Receiver<Role> {
    let (tx, rx) = watch::channel(Role::Follower(None));
    tokio::spawn(async move {
        tokio::pin!(shutdown);
        let value = match serde_json::to_vec(&me) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "leader election: encoding this replica's value");
                return;
            }
        };
        // The lease campaigned on, revoked on shutdown: the leader key goes
        // with it and the next replica is elected at once.
        let lease: std::sync::Mutex<Option<i64>> = std::sync::Mutex::new(None);
        loop {
            let ended = tokio::select! {
                () = &mut shutdown => None,
                r = one_lease(&client, &name, &value, timings, &tx, &lease) => Some(r),
            };
            let Some(ended) = ended else {
                break;
            };
            if let Err(e) = ended {
                tracing::warn!(error = %e, "leader election: campaigning again");
            }
            if tx.borrow().is_leader() {
                tx.send_replace(Role::Follower(None));
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(timings.retry_period) => {}
            }
        }
        if tx.borrow().is_leader() {
            crate::metrics::hub().leader.set(0);
            tracing::info!("stepping down: shutting down");
        }
        tx.send_replace(Role::Follower(None));
        let held = *lease.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = held {
            let mut leases = client.lease_client();
            let _ = tokio::time::timeout(timings.retry_period, leases.revoke(id)).await;
        }
    });
    rx
}

/// Grants a lease, keeps it alive, campaigns on it and leads while it
/// lasts. Returns when this lease is of no more use (lost, expired, or
/// leadership lost); the caller campaigns again on a new one.
async fn one_lease(
    client: &etcd_client::Client,
    name: &str,
    value: &[u8],
    timings: ElectionTimings,
    role: &watch::Sender<Role>,
    held: &std::sync::Mutex<Option<i64>>,
) -> Result<(), String> {
    let call = timings.retry_period;
    let mut leases = client.lease_client();
    let grant = tokio::time::timeout(call, leases.grant(timings.lease_ttl_seconds(), None))
        .await
        .map_err(|_| "granting a lease: timed out".to_string())?
        .map_err(|e| format!("granting a lease: {e}"))?;
    let lease = grant.id();
    *held.lock().unwrap_or_else(|p| p.into_inner()) = Some(lease);
    // The lease's last successful renewal (its grant to begin with).
    let (renewed_tx, renewed) = watch::channel(Some(Instant::now()));
    let keeper = tokio::spawn(keep_alive(client.clone(), lease, timings, renewed_tx));
    let _keeper = AbortOnDrop(keeper);
    let result = async {
        let mut election = client.election_client();
        // Followers learn who leads while the campaign waits.
        let campaign = election.campaign(name, value.to_vec(), lease);
        tokio::pin!(campaign);
        let mut look = tokio::time::interval(call);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Lookups in a row that found no leader while this campaign waited.
        let mut leaderless = 0u32;
        let leader_key = loop {
            tokio::select! {
                r = &mut campaign => {
                    let mut r = r.map_err(|e| format!("campaigning: {e}"))?;
                    break r.take_leader().ok_or("campaigning: etcd answered without a leader key")?;
                }
                _ = look.tick() => {
                    if lease_expired(&renewed, timings) {
                        return Err("the lease could not be renewed".to_string());
                    }
                    let leader = lookup(client, name, call).await;
                    // A campaign waits only while another key leads; one
                    // that still waits when none does (its call lost on a
                    // failed etcd member) starts over.
                    leaderless = if leader.is_none() { leaderless + 1 } else { 0 };
                    if leaderless >= 3 {
                        return Err("the campaign made no progress while no replica led".to_string());
                    }
                    role.send_if_modified(|r| {
                        let new = Role::Follower(leader.clone());
                        (*r != new).then(|| *r = new).is_some()
                    });
                }
            }
        };
        let term = Term {
            key: String::from_utf8_lossy(leader_key.key()).into_owned(),
            revision: u64::try_from(leader_key.rev()).unwrap_or_default(),
        };
        tracing::info!(key = %term.key, revision = term.revision, "leading: elected by etcd");
        crate::metrics::hub().leader.set(1);
        role.send_replace(Role::Leader(term.clone()));
        let outcome = lead(client, &term, &renewed, timings).await;
        crate::metrics::hub().leader.set(0);
        role.send_replace(Role::Follower(None));
        tracing::warn!(key = %term.key, reason = %outcome, "stepped down: no longer the leader");
        // Best effort: the lease's keys go now rather than when it expires.
        let mut resign = client.election_client();
        let _ = tokio::time::timeout(
            call,
            resign.resign(Some(
                etcd_client::ResignOptions::new().with_leader(leader_key),
            )),
        )
        .await;
        Ok(())
    }
    .await;
    let _ = tokio::time::timeout(call, leases.revoke(lease)).await;
    *held.lock().unwrap_or_else(|p| p.into_inner()) = None;
    result
}

/// Whether no renewal has succeeded for the renew deadline.
fn lease_expired(renewed: &watch::Receiver<Option<Instant>>, timings: ElectionTimings) -> bool {
    match *renewed.borrow() {
        Some(at) => at.elapsed() >= timings.renew_deadline,
        None => true,
    }
}

/// Leads until the lease is no longer renewed in time or the leader key
/// is gone; says why it stopped.
async fn lead(
    client: &etcd_client::Client,
    term: &Term,
    renewed: &watch::Receiver<Option<Instant>>,
    timings: ElectionTimings,
) -> String {
    let mut kv = client.kv_client();
    // Checked often enough to step down well before the lease expires.
    let check = (timings.lease_duration - timings.renew_deadline)
        .min(timings.retry_period)
        .min(Duration::from_secs(2))
        .max(Duration::from_millis(100))
        / 2;
    let mut last_key_check = Instant::now();
    loop {
        tokio::time::sleep(check).await;
        if lease_expired(renewed, timings) {
            return format!(
                "no lease renewal succeeded for {:?} (--leader-elect-renew-deadline)",
                timings.renew_deadline
            );
        }
        if last_key_check.elapsed() >= timings.retry_period {
            last_key_check = Instant::now();
            // Unreachable etcd: the renew deadline decides.
            let got =
                tokio::time::timeout(timings.retry_period, kv.get(term.key.as_str(), None)).await;
            if let Ok(Ok(r)) = got {
                let current = r
                    .kvs()
                    .first()
                    .map(|kv| u64::try_from(kv.create_revision()).unwrap_or_default());
                if current != Some(term.revision) {
                    return "the leader key is gone".to_string();
                }
            }
        }
    }
}

/// Renews the lease every retry period and records each success; a
/// renewal that finds the lease gone records `None` and ends.
async fn keep_alive(
    client: etcd_client::Client,
    lease: i64,
    timings: ElectionTimings,
    renewed: watch::Sender<Option<Instant>>,
) {
    let mut leases = client.lease_client();
    loop {
        let opened = tokio::time::timeout(timings.retry_period, leases.keep_alive(lease)).await;
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            _ => {
                tokio::time::sleep(timings.retry_period / 4).await;
                continue;
            }
        };
        loop {
            let sent_at = Instant::now();
            let answer = tokio::time::timeout(timings.retry_period, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match answer {
                Ok(Ok(Some(r))) if r.ttl() > 0 => {
                    let _ = renewed.send(Some(sent_at));
                }
                Ok(Ok(Some(_))) => {
                    tracing::warn!(lease, "leader election: the lease expired");
                    let _ = renewed.send(None);
                    return;
                }
                // The stream broke or timed out: open another.
                _ => break,
            }
            let wait = timings.retry_period.saturating_sub(sent_at.elapsed());
            tokio::time::sleep(wait).await;
        }
    }
}

/// The current leader, if any can be read within `timeout`.
async fn lookup(client: &etcd_client::Client, name: &str, timeout: Duration) -> Option<Replica> {
    let mut election = client.election_client();
    let r = tokio::time::timeout(timeout, election.leader(name))
        .await
        .ok()?
        .ok()?;
    serde_json::from_slice(r.kv()?.value()).ok()
}

/// How long a term's write that failed for the storage's sake is tried
/// again.
pub const TRANSIENT_RETRY: Duration = Duration::from_secs(10);

/// The store a leadership term's dispatch and controllers write through:
/// fenced by the term; a write it refuses because the term ended is counted
/// and logged (`trainhub_fenced_writes_total`), so a deposed leader that
/// acted before it noticed says so; a write that failed for the storage's
/// sake (an etcd member gone, an election in etcd) is tried again for up
/// to [`TRANSIENT_RETRY`] while the term lasts.
///
/// # Guarantees
///
/// Trying again is safe: every write carries its preconditions (must not
/// exist, expected resourceVersion, the term), so one that did land the
/// first time fails the second with `AlreadyExists` or `Conflict`, which
/// the writer handles as it does any concurrent change.
pub struct TermStore {
    inner: Arc<dyn Store>,
    term: Term,
    logged: AtomicBool,
}

impl TermStore {
    /// `store` fenced by `term`, counted. A store only one process writes
    /// (redb: `fenced` returns itself) is returned as it is.
    pub fn fence(store: Arc<dyn Store>, term: Term) -> Arc<dyn Store> {
        if term == single_term() {
            return store.fenced(term);
        }
        Arc::new(TermStore {
            inner: store.fenced(term.clone()),
            term,
            logged: AtomicBool::new(false),
        })
    }
}

impl Store for TermStore {
    trainhub_apiserver::forward_store_reads!(inner);

    fn commit(&self, ops: Vec<Op>) -> CommitFuture<'_> {
        let commit = self.commit_or_return(ops);
        Box::pin(async move { commit.await.map_err(|(e, _)| e) })
    }

    /// Tries again with the operations the store hands back, not a copy
    /// kept of them (a leader's writes carry whole objects).
    fn commit_or_return(&self, ops: Vec<Op>) -> ReturningFuture<'_> {
        Box::pin(async move {
            let started = Instant::now();
            let mut wait = Duration::from_millis(100);
            let mut ops = ops;
            let result = loop {
                match self.inner.commit_or_return(ops).await {
                    Err((StoreError::Storage(e), back))
                        if started.elapsed() < TRANSIENT_RETRY && !back.is_empty() =>
                    {
                        tracing::debug!(error = %e, "a term's write failed; trying again");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(1));
                        ops = back;
                    }
                    result => break result,
                }
            };
            if let Err((StoreError::Fenced(rev), _)) = &result {
                crate::metrics::hub().fenced_writes.inc();
                if !self.logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(key = %self.term.key, revision = rev, "a write of an ended leadership term was refused (StoreError::Fenced): another replica leads");
                }
            }
            result
        })
    }

    fn fenced(self: Arc<Self>, term: Term) -> Arc<dyn Store> {
        self.inner.clone().fenced(term)
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_client_gos_and_nest() {
        let t = ElectionTimings::default();
        assert_eq!(t.lease_duration, Duration::from_secs(15));
        assert_eq!(t.renew_deadline, Duration::from_secs(10));
        assert_eq!(t.retry_period, Duration::from_secs(5));
        assert!(t.check().is_ok());
        assert_eq!(t.lease_ttl_seconds(), 15);
    }

    #[test]
    fn timings_out_of_order_are_refused() {
        let t = ElectionTimings {
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        assert!(t.check().unwrap_err().contains("renew-deadline"));
        let t = ElectionTimings {
            retry_period: Duration::from_secs(10),
            ..ElectionTimings::default()
        };
        assert!(t.check().unwrap_err().contains("retry-period"));
        let t = ElectionTimings {
            lease_duration: Duration::from_millis(2500),
            ..ElectionTimings::default()
        };
        assert_eq!(t.lease_ttl_seconds(), 3);
    }

    #[test]
    fn the_election_is_beside_the_store_prefix() {
        assert_eq!(election_name("/trainhub"), "/trainhub-leader");
        assert_eq!(election_name("/trainhub/"), "/trainhub-leader");
    }

    #[tokio::test]
    async fn a_single_writer_store_leads_at_once_for_ever() {
        let rx = single();
        assert_eq!(*rx.borrow(), Role::Leader(single_term()));
        assert!(rx.has_changed().is_ok(), "the channel stays open");
    }
}
