//! Spokes as API objects: the cluster-scoped `Spoke` kind
//! (`trainhub.kubeflow.org/v1alpha1`, short name `sp`).
//!
//! - A `Spoke` is created when a spoke with a valid certificate first
//!   connects (or ahead of it by an admin), with the finalizer
//!   [`FINALIZER_REVOKE`].
//! - Its status is the hub's view: the session ([`Registry`], fed by the
//!   gRPC layer) and dispatch's spoke state (labels, capacity, running
//!   TrainJobs). It is written when something but the heartbeat time
//!   changes, and the heartbeat time at most every [`HEARTBEAT_WRITE`], as
//!   Kubernetes' node status is.
//! - `spec.unschedulable: true` cordons the spoke: dispatch offers it no
//!   new TrainJobs; those placed on it are left alone.
//! - Deleting it revokes it: the serial of the certificate it connected
//!   with is recorded in the store ([`REVOKED`], one object per serial, so
//!   every hub replica sees it), its open session is ended (its TrainJobs
//!   follow the worker-lost path) and from then on a session with that
//!   certificate is refused. A certificate with another serial for the
//!   same name may join again: issuing it is the admin's decision.
//!
//! Only admins write Spokes (the policy keeps every write of a
//! cluster-scoped kind for admins); tenants cannot read them either.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use trainhub_apiserver::admission::{Admission, Operation, Outcome, Request};
use trainhub_apiserver::field::FieldError;
use trainhub_apiserver::pki::CertInfo;
use trainhub_apiserver::server::Server;
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{Key, Op, Store};

use crate::api::SPOKES;
use crate::controller::lifecycle::{format_time, set_condition};
use crate::dispatch::Dispatch;
use crate::dispatch::core::SpokeView;

pub const GROUP: &str = "trainhub.kubeflow.org";
pub const API_VERSION: &str = "trainhub.kubeflow.org/v1alpha1";
pub const KIND: &str = "Spoke";
/// Revoked certificate serials: one object per serial (its name), not
/// served by the API. Removed once the certificate has expired.
pub const REVOKED: &str = "trainhub.kubeflow.org/revokedcertificates";
/// Held on every Spoke until the hub has recorded its certificate as
/// revoked.
pub const FINALIZER_REVOKE: &str = "trainhub.kubeflow.org/revoke-certificate";
/// Spoke certificates' default lifetime (`trainctl certs spoke --days`).
pub const DEFAULT_CERT_DAYS: i64 = 30;
/// A connected spoke whose certificate expires sooner is warned about.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);
/// The heartbeat time alone is written at most this often.
pub const HEARTBEAT_WRITE: Duration = Duration::from_secs(30);
/// How often status and spec are reconciled.
const SYNC_EVERY: Duration = Duration::from_secs(1);

/// Condition types and reasons of a Spoke. `Active` is MultiKueueCluster's.
pub const CONDITION_CONNECTED: &str = "Connected";
pub const CONDITION_ACTIVE: &str = "Active";
pub const REASON_SESSION_OPEN: &str = "SessionOpen";
pub const REASON_DISCONNECTED: &str = "Disconnected";
pub const REASON_WORKER_LOST: &str = "WorkerLost";
pub const REASON_NEVER_CONNECTED: &str = "NeverConnected";
pub const REASON_ACTIVE: &str = "Active";
pub const REASON_CORDONED: &str = "Cordoned";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One spoke's latest session as the gRPC layer saw it.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub id: u64,
    pub cert: CertInfo,
    pub backend: String,
    pub connected_at: Timestamp,
    pub last_heard: Timestamp,
    /// None while open.
    pub ended_at: Option<Timestamp>,
    /// Whether the coming expiry was logged for this session.
    warned: bool,
}

/// The spokes' sessions and the revoked serials. Cheap to share.
pub struct Registry {
    store: Arc<dyn Store>,
    sessions: Mutex<HashMap<String, SessionInfo>>,
}

impl Registry {
    pub fn new(store: Arc<dyn Store>) -> Arc<Registry> {
        Arc::new(Registry {
            store,
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// Why a session with this certificate is refused, if it is revoked.
    pub fn refusal(&self, spoke: &str, cert: &CertInfo) -> Option<String> {
        let record = self
            .store
            .get(&Key::new(REVOKED, None, &cert.serial))?
            .value;
        Some(format!(
            "the certificate of spoke {spoke:?} (serial {}) was revoked at {} when Spoke {:?} was deleted; an admin must issue a new certificate (`trainctl certs spoke {spoke}`) for it to join again",
            cert.serial,
            record["revokedAt"].as_str().unwrap_or("?"),
            record["spoke"].as_str().unwrap_or(spoke),
        ))
    }

    /// A session of `spoke` started, with certificate `cert`.
    pub fn started(&self, spoke: &str, id: u64, cert: CertInfo, backend: &str) {
        let now = Timestamp::now();
        let left = Duration::from_secs(
            u64::try_from(cert.not_after.saturating_sub(now.as_second())).unwrap_or(0),
        );
        let warned = left < EXPIRY_WARNING;
        if warned {
            warn_expiry(spoke, &cert, left);
        }
        lock(&self.sessions).insert(
            spoke.to_string(),
            SessionInfo {
                id,
                cert,
                backend: backend.to_string(),
                connected_at: now,
                last_heard: now,
                ended_at: None,
                warned,
            },
        );
    }

    /// A message of session `id` of `spoke` arrived.
    pub fn heard(&self, spoke: &str, id: u64) {
        if let Some(s) = lock(&self.sessions).get_mut(spoke)
            && s.id == id
        {
            s.last_heard = Timestamp::now();
        }
    }

    /// Session `id` of `spoke` ended (a newer one may have replaced it).
    pub fn ended(&self, spoke: &str, id: u64) {
        if let Some(s) = lock(&self.sessions).get_mut(spoke)
            && s.id == id
            && s.ended_at.is_none()
        {
            s.ended_at = Some(Timestamp::now());
        }
    }

    fn snapshot(&self) -> HashMap<String, SessionInfo> {
        lock(&self.sessions).clone()
    }

    /// Forgets a revoked spoke's session (so its object is not made
    /// again from it).
    fn forget(&self, spoke: &str) {
        lock(&self.sessions).remove(spoke);
    }

    /// Logs, once per session, the connected spokes whose certificate
    /// expires within [`EXPIRY_WARNING`].
    fn warn_expiring(&self, now: Timestamp) {
        for (spoke, s) in lock(&self.sessions).iter_mut() {
            if s.warned || s.ended_at.is_some() {
                continue;
            }
            let left = s.cert.not_after.saturating_sub(now.as_second());
            if left < EXPIRY_WARNING.as_secs() as i64 {
                s.warned = true;
                warn_expiry(
                    spoke,
                    &s.cert,
                    Duration::from_secs(u64::try_from(left).unwrap_or(0)),
                );
            }
        }
    }
}

fn warn_expiry(spoke: &str, cert: &CertInfo, left: Duration) {
    tracing::warn!(
        spoke,
        serial = %cert.serial,
        not_after = %time_of(cert.not_after),
        hours_left = left.as_secs() / 3600,
        "the spoke's certificate expires within 7 days: renew it (`trainctl certs renew`); the spoke picks up the new files without a restart"
    );
}

/// RFC 3339 of Unix seconds.
fn time_of(seconds: i64) -> String {
    Timestamp::from_second(seconds)
        .map(format_time)
        .unwrap_or_default()
}

/// Milli-units as a Kubernetes quantity: `4`, `500m`, `8Gi`.
pub fn quantity(milli: i64) -> String {
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let units = milli / 1000;
    for (suffix, size) in [
        ("Ti", 1i64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if units != 0 && units % size == 0 {
            return format!("{}{suffix}", units / size);
        }
    }
    units.to_string()
}

fn summary(map: &BTreeMap<String, i64>) -> String {
    map.iter()
        .map(|(r, m)| format!("{r}={}", quantity(*m)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Quota used on a spoke, per ClusterQueue: `team-a[pool-x:cpu=2,memory=1Gi]`.
fn queue_summary(usage: &BTreeMap<(String, String, String), i64>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut current: Option<&str> = None;
    let mut parts: Vec<String> = Vec::new();
    for ((cq, flavor, resource), milli) in usage {
        if current != Some(cq.as_str()) {
            if let Some(c) = current {
                out.push(format!("{c}[{}]", parts.join(",")));
            }
            parts.clear();
            current = Some(cq);
        }
        parts.push(format!("{flavor}:{resource}={}", quantity(*milli)));
    }
    if let Some(c) = current {
        out.push(format!("{c}[{}]", parts.join(",")));
    }
    out.join(" ")
}

/// The status a Spoke should have, from its stored status and what the
/// hub knows now. Fields the hub does not know now (a spoke that has not
/// connected since the hub started) keep their stored values.
pub fn desired_status(
    old: &Value,
    view: Option<&SpokeView>,
    session: Option<&SessionInfo>,
    unschedulable: bool,
    now: Timestamp,
) -> Value {
    let mut status = if old.is_object() {
        old.clone()
    } else {
        json!({})
    };
    let now_text = format_time(now);
    let connected = session.is_some_and(|s| s.ended_at.is_none());
    let (state, reason, message) = match session {
        Some(s) if s.ended_at.is_none() => (
            "Connected",
            REASON_SESSION_OPEN,
            format!("session open since {}", format_time(s.connected_at)),
        ),
        Some(s) if view.is_some() => (
            "Disconnected",
            REASON_DISCONNECTED,
            format!(
                "no session since {}; its TrainJobs are requeued if it stays away past the worker-lost timeout",
                s.ended_at.map(format_time).unwrap_or_default()
            ),
        ),
        Some(s) => (
            "Lost",
            REASON_WORKER_LOST,
            format!(
                "no session since {}, past the worker-lost timeout: its TrainJobs were requeued",
                s.ended_at.map(format_time).unwrap_or_default()
            ),
        ),
        None if status["certificate"].is_object() => (
            "Disconnected",
            REASON_DISCONNECTED,
            "not connected since the hub started".to_string(),
        ),
        None => (
            "Disconnected",
            REASON_NEVER_CONNECTED,
            "no spoke of this name has connected".to_string(),
        ),
    };
    status["state"] = if unschedulable {
        format!("{state},SchedulingDisabled")
    } else {
        state.to_string()
    }
    .into();
    let connected_state = if connected { "True" } else { "False" };
    set_condition(
        &mut status,
        CONDITION_CONNECTED,
        connected_state,
        reason,
        &message,
        &now_text,
    );
    let (active, active_reason, active_message) = if unschedulable {
        (
            "False",
            REASON_CORDONED,
            "spec.unschedulable is true: no new TrainJobs are placed on it".to_string(),
        )
    } else if connected {
        (
            "True",
            REASON_ACTIVE,
            "connected and schedulable".to_string(),
        )
    } else {
        ("False", reason, message)
    };
    set_condition(
        &mut status,
        CONDITION_ACTIVE,
        active,
        active_reason,
        &active_message,
        &now_text,
    );
    match view {
        Some(v) => {
            let quantities = |m: &BTreeMap<String, i64>| {
                Value::Object(
                    m.iter()
                        .map(|(r, q)| (r.clone(), Value::String(quantity(*q))))
                        .collect(),
                )
            };
            status["allocatable"] = quantities(&v.allocatable);
            status["free"] = quantities(&v.free);
            status["capacitySummary"] = summary(&v.allocatable).into();
            status["freeSummary"] = summary(&v.free).into();
            status["labels"] = if v.labels.is_object() {
                v.labels.clone()
            } else {
                json!({})
            };
            status["labelsSummary"] = v
                .labels
                .as_object()
                .map(|l| {
                    l.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default()
                .into();
            status["running"] = (v.running as i64).into();
            status["flavors"] = v.flavors.clone().into();
            status["flavorsSummary"] = v.flavors.join(",").into();
            let usage: Vec<Value> = v
                .queue_usage
                .iter()
                .map(|((cq, flavor, resource), milli)| {
                    json!({"clusterQueue": cq, "flavor": flavor, "resource": resource, "total": quantity(*milli)})
                })
                .collect();
            status["queueUsage"] = usage.into();
            status["queueSummary"] = queue_summary(&v.queue_usage).into();
        }
        None => status["running"] = 0.into(),
    }
    if let Some(s) = session {
        status["backend"] = s.backend.clone().into();
        status["certificate"] = json!({
            "serial": s.cert.serial,
            "notAfter": time_of(s.cert.not_after),
        });
        status["lastHeartbeatTime"] = format_time(s.last_heard).into();
    }
    status
}

/// Whether `new` must be written over `old`: anything but the heartbeat
/// time changed, or the heartbeat time moved by [`HEARTBEAT_WRITE`].
pub fn worth_writing(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("lastHeartbeatTime");
        }
        v
    };
    if strip(old) != strip(new) {
        return true;
    }
    let at = |v: &Value| {
        v["lastHeartbeatTime"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
    };
    match (at(old), at(new)) {
        (Some(o), Some(n)) => n.as_second() - o.as_second() >= HEARTBEAT_WRITE.as_secs() as i64,
        (None, Some(_)) => true,
        _ => false,
    }
}

fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Cordons the spokes whose Spoke says so, before any session starts.
pub fn apply_cordons(store: &dyn Store, dispatch: &Dispatch) {
    let (objects, _) = store.list(SPOKES, None);
    for object in objects {
        if object.value["spec"]["unschedulable"] == true {
            dispatch.set_unschedulable(&object.key.name, true);
        }
    }
}

/// Keeps the Spoke objects and dispatch in step until `shutdown`.
pub async fn run(
    store: Arc<dyn Store>,
    server: Arc<Server>,
    dispatch: Arc<Dispatch>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut controller = Controller {
        store,
        server,
        dispatch,
        cordoned: BTreeMap::new(),
        passes: 0,
    };
    tokio::pin!(shutdown);
    let mut interval = tokio::time::interval(SYNC_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = interval.tick() => controller.sync().await,
        }
    }
}

struct Controller {
    store: Arc<dyn Store>,
    server: Arc<Server>,
    dispatch: Arc<Dispatch>,
    /// The cordon last handed to dispatch, per spoke.
    cordoned: BTreeMap<String, bool>,
    passes: u64,
}

impl Controller {
    async fn sync(&mut self) {
        self.passes += 1;
        let registry = self.dispatch.spokes().clone();
        let views = self.dispatch.spoke_views();
        let sessions = registry.snapshot();
        let now = Timestamp::now();
        registry.warn_expiring(now);
        let (objects, _) = self.store.list(SPOKES, None);
        let mut seen = BTreeSet::new();
        let mut writes = Vec::new();
        for object in objects {
            let name = object.key.name.clone();
            let value = object.value.as_ref();
            let mut finalizers = finalizers(value);
            let ours = finalizers.iter().any(|f| f == FINALIZER_REVOKE);
            if !value["metadata"]["deletionTimestamp"].is_null() {
                if ours {
                    self.revoke(&object, sessions.get(&name)).await;
                }
                continue;
            }
            seen.insert(name.clone());
            let unschedulable = value["spec"]["unschedulable"] == true;
            if self.cordoned.get(&name) != Some(&unschedulable) {
                tracing::info!(spoke = %name, unschedulable, "spoke cordon set");
                self.dispatch.set_unschedulable(&name, unschedulable);
                self.cordoned.insert(name.clone(), unschedulable);
            }
            let status = desired_status(
                &value["status"],
                views.get(&name),
                sessions.get(&name),
                unschedulable,
                now,
            );
            if ours && !worth_writing(&value["status"], &status) {
                continue;
            }
            let mut updated = value.clone();
            updated["status"] = status;
            if !ours {
                finalizers.push(FINALIZER_REVOKE.to_string());
                updated["metadata"]["finalizers"] = json!(finalizers);
            }
            writes.push(Op::Update {
                key: object.key.clone(),
                value: updated,
                expected: Some(object.rv),
            });
        }
        // One commit for the pass; if one write conflicts (an admin's
        // cordon meanwhile), the others go one by one and it waits for the
        // next pass.
        if !writes.is_empty() && self.store.commit(writes.clone()).await.is_err() {
            for op in writes {
                let key = op.key().clone();
                if let Err(e) = self.store.commit(vec![op]).await {
                    tracing::debug!(spoke = %key.name, error = %e, "writing the Spoke status");
                }
            }
        }
        // Spokes gone from the store are no longer cordoned.
        let gone: Vec<String> = self
            .cordoned
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.cordoned.remove(&name);
            self.dispatch.set_unschedulable(&name, false);
        }
        // Connected spokes without an object: created.
        for (name, session) in &sessions {
            if session.ended_at.is_some() || seen.contains(name) {
                continue;
            }
            if registry.refusal(name, &session.cert).is_some() {
                continue;
            }
            let object = json!({
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": name, "finalizers": [FINALIZER_REVOKE]},
                "spec": {"unschedulable": false},
            });
            match self.server.create_object(object).await {
                Ok(_) => tracing::info!(spoke = %name, "Spoke created for a newly connected spoke"),
                Err(e) if e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(spoke = %name, error = %e.message, "creating the Spoke")
                }
            }
        }
        if self.passes % 60 == 1 {
            self.expire_revocations(now).await;
        }
    }

    /// Records the certificate of a deleted Spoke as revoked, ends its
    /// session, then lets the object go. Safe to repeat: the record is
    /// put, the finalizer removed under the object's resourceVersion.
    async fn revoke(
        &mut self,
        object: &trainhub_apiserver::store::Object,
        session: Option<&SessionInfo>,
    ) {
        let name = &object.key.name;
        let value = object.value.as_ref();
        let now = format_time(Timestamp::now());
        let mut serials: BTreeMap<String, String> = BTreeMap::new();
        if let Some(serial) = value["status"]["certificate"]["serial"].as_str()
            && !serial.is_empty()
        {
            let not_after = value["status"]["certificate"]["notAfter"]
                .as_str()
                .unwrap_or_default();
            serials.insert(serial.to_string(), not_after.to_string());
        }
        if let Some(s) = session {
            serials.insert(s.cert.serial.clone(), time_of(s.cert.not_after));
        }
        let mut ops: Vec<Op> = serials
            .iter()
            .map(|(serial, not_after)| Op::Put {
                key: Key::new(REVOKED, None, serial),
                value: json!({
                    "apiVersion": API_VERSION,
                    "kind": "RevokedCertificate",
                    "metadata": {"name": serial},
                    "spoke": name,
                    "serial": serial,
                    "notAfter": not_after,
                    "revokedAt": now,
                }),
            })
            .collect();
        let rest: Vec<String> = finalizers(value)
            .into_iter()
            .filter(|f| f != FINALIZER_REVOKE)
            .collect();
        if rest.is_empty() {
            ops.push(Op::Delete {
                key: object.key.clone(),
                expected: Some(object.rv),
            });
        } else {
            let mut updated = value.clone();
            updated["metadata"]["finalizers"] = json!(rest);
            ops.push(Op::Update {
                key: object.key.clone(),
                value: updated,
                expected: Some(object.rv),
            });
        }
        if let Err(e) = self.store.commit(ops).await {
            tracing::warn!(spoke = %name, error = %e, "recording the revocation of a deleted Spoke; retrying");
            return;
        }
        let serial_list: Vec<&str> = serials.keys().map(String::as_str).collect();
        tracing::warn!(spoke = %name, serials = ?serial_list, "Spoke deleted: its certificate is revoked and its session ended");
        self.dispatch.spokes().forget(name);
        self.cordoned.remove(name);
        self.dispatch.set_unschedulable(name, false);
        self.dispatch.close_session(
            name,
            &format!(
                "Spoke {name:?} was deleted: its certificate (serial {}) is revoked",
                serial_list.join(", ")
            ),
        );
    }

    /// Removes the records of revoked certificates that have expired (TLS
    /// refuses those anyway).
    async fn expire_revocations(&self, now: Timestamp) {
        let (records, _) = self.store.list(REVOKED, None);
        let ops: Vec<Op> = records
            .iter()
            .filter(|r| {
                r.value["notAfter"]
                    .as_str()
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .is_some_and(|t| t < now)
            })
            .map(|r| Op::Remove { key: r.key.clone() })
            .collect();
        if !ops.is_empty()
            && let Err(e) = self.store.commit(ops).await
        {
            tracing::debug!(error = %e, "removing expired revocations");
        }
    }
}

/// Admission of Spokes, in front of the hub's other admission: a Spoke's
/// name is a spoke's name (a DNS-1123 label, its certificate's CN) and
/// `spec.unschedulable` a boolean (defaulted to false).
pub struct SpokeAdmission {
    pub inner: Arc<dyn Admission>,
}

impl Admission for SpokeAdmission {
    fn admit(&self, request: &Request<'_>, object: &mut Value) -> Result<Outcome, ApiError> {
        if request.resource.group != GROUP || request.resource.kind != KIND {
            return self.inner.admit(request, object);
        }
        if request.operation == Operation::Delete || request.subresource.is_some() {
            return Ok(Outcome::default());
        }
        let mut errors = Vec::new();
        if request.operation == Operation::Create && !crate::grpc::is_dns_label(request.name) {
            errors.push(FieldError::invalid(
                "metadata.name",
                request.name,
                "a spoke's name (its certificate's CN) must be a DNS-1123 label: lowercase letters, digits and '-', at most 63, alphanumeric at both ends",
            ));
        }
        match &object["spec"] {
            Value::Null => object["spec"] = json!({"unschedulable": false}),
            Value::Object(_) => match &object["spec"]["unschedulable"] {
                Value::Null => object["spec"]["unschedulable"] = false.into(),
                Value::Bool(_) => {}
                other => errors.push(FieldError::invalid(
                    "spec.unschedulable",
                    other.clone(),
                    "must be a boolean",
                )),
            },
            other => errors.push(FieldError::invalid(
                "spec",
                other.clone(),
                "must be an object",
            )),
        }
        if errors.is_empty() {
            Ok(Outcome::default())
        } else {
            Err(ApiError::invalid(GROUP, KIND, request.name, &errors))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(ended: bool) -> SessionInfo {
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        SessionInfo {
            id: 1,
            cert: CertInfo {
                serial: "abc".into(),
                not_before: 0,
                not_after: 1_802_592_000,
                common_name: "s".into(),
                organizations: vec![],
                dns_names: vec![],
                ips: vec![],
                server: false,
            },
            backend: "process".into(),
            connected_at: t,
            last_heard: t,
            ended_at: ended.then_some(t),
            warned: false,
        }
    }

    fn view(running: usize) -> SpokeView {
        SpokeView {
            labels: json!({"region": "eu"}),
            allocatable: [
                ("cpu".to_string(), 4000),
                ("memory".to_string(), 8_000 << 30),
            ]
            .into(),
            free: [
                ("cpu".to_string(), 1500),
                ("memory".to_string(), 8_000 << 30),
            ]
            .into(),
            disconnected_at: None,
            running,
            flavors: vec!["pool-x".into()],
            queue_usage: [
                (("team-a".into(), "pool-x".into(), "cpu".into()), 2000),
                (
                    ("team-a".into(), "pool-x".into(), "memory".into()),
                    (1 << 30) * 1000,
                ),
                (("team-b".into(), "pool-x".into(), "cpu".into()), 500),
            ]
            .into(),
        }
    }

    fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
        status["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == type_))
            .unwrap_or(&Value::Null)
    }

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(quantity(4000), "4");
        assert_eq!(quantity(1500), "1500m");
        assert_eq!(quantity(8 * (1000i64 << 30)), "8Gi");
        assert_eq!(quantity(0), "0");
    }

    #[test]
    fn a_connected_spoke_shows_capacity_certificate_and_active() {
        let now = Timestamp::from_second(1_800_000_010).unwrap();
        let s = desired_status(
            &Value::Null,
            Some(&view(2)),
            Some(&session(false)),
            false,
            now,
        );
        assert_eq!(s["state"], "Connected");
        assert_eq!(s["capacitySummary"], "cpu=4,memory=8Gi");
        assert_eq!(s["freeSummary"], "cpu=1500m,memory=8Gi");
        assert_eq!(s["running"], 2);
        assert_eq!(s["backend"], "process");
        assert_eq!(s["labelsSummary"], "region=eu");
        assert_eq!(s["flavorsSummary"], "pool-x");
        assert_eq!(
            s["queueSummary"],
            "team-a[pool-x:cpu=2,pool-x:memory=1Gi] team-b[pool-x:cpu=500m]"
        );
        assert_eq!(s["queueUsage"][2]["clusterQueue"], "team-b");
        assert_eq!(s["certificate"]["serial"], "abc");
        assert_eq!(s["certificate"]["notAfter"], "2027-02-14T08:00:00Z");
        assert_eq!(condition(&s, CONDITION_CONNECTED)["status"], "True");
        assert_eq!(condition(&s, CONDITION_ACTIVE)["reason"], REASON_ACTIVE);
    }

    #[test]
    fn cordoned_disconnected_and_lost_spokes_say_so() {
        let now = Timestamp::from_second(1_800_000_010).unwrap();
        let cordoned = desired_status(
            &Value::Null,
            Some(&view(1)),
            Some(&session(false)),
            true,
            now,
        );
        assert_eq!(cordoned["state"], "Connected,SchedulingDisabled");
        assert_eq!(
            condition(&cordoned, CONDITION_ACTIVE)["reason"],
            REASON_CORDONED
        );
        let away = desired_status(&cordoned, Some(&view(1)), Some(&session(true)), false, now);
        assert_eq!(away["state"], "Disconnected");
        assert_eq!(
            condition(&away, CONDITION_CONNECTED)["reason"],
            REASON_DISCONNECTED
        );
        let lost = desired_status(&away, None, Some(&session(true)), false, now);
        assert_eq!(lost["state"], "Lost");
        assert_eq!(lost["running"], 0);
        // What is not known now stays as it was.
        assert_eq!(lost["capacitySummary"], "cpu=4,memory=8Gi");
        let never = desired_status(&Value::Null, None, None, false, now);
        assert_eq!(
            condition(&never, CONDITION_CONNECTED)["reason"],
            REASON_NEVER_CONNECTED
        );
    }

    #[test]
    fn heartbeats_alone_are_written_at_most_every_30_seconds() {
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut a = session(false);
        let old = desired_status(&Value::Null, Some(&view(0)), Some(&a), false, t(0));
        a.last_heard = t(10);
        let new = desired_status(&old, Some(&view(0)), Some(&a), false, t(10));
        assert!(!worth_writing(&old, &new));
        a.last_heard = t(31);
        let later = desired_status(&old, Some(&view(0)), Some(&a), false, t(31));
        assert!(worth_writing(&old, &later));
        // A capacity change is written at once.
        let busier = desired_status(&old, Some(&view(1)), Some(&a), false, t(10));
        assert!(worth_writing(&old, &busier));
    }
}
