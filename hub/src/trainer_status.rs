//! Progress from a TrainJob's own pods: `status.trainerStatus`, as Kubeflow
//! Trainer's TrainJobStatus plugin and status server give it (KEP-2779).
//!
//! # What a pod gets
//!
//! When the hub offers it ([`Reporting`], `--trainer-status-url`), every
//! container of the trainer's pods (the replicated jobs labelled
//! `trainer.kubeflow.org/trainjob-ancestor-step: trainer`) gets upstream's
//! environment:
//!
//! - `KUBEFLOW_TRAINER_SERVER_URL`: `<url>/apis/trainer.kubeflow.org/v1alpha1/namespaces/NS/trainjobs/NAME/status`;
//! - `KUBEFLOW_TRAINER_SERVER_CA_CERT`: `/var/run/secrets/kubeflow/trainer/ca.crt`;
//! - `KUBEFLOW_TRAINER_SERVER_TOKEN`: `/var/run/secrets/kubeflow/trainer/token`;
//!
//! and the volume `kubeflow-trainer-token` mounted read-only there. Upstream
//! projects a service-account token (audience bound to the TrainJob) and a
//! ConfigMap `NAME-tls-config`; a spoke cluster has no way to mint tokens
//! the hub trusts, so the hub issues the token itself and ships it, with the
//! CA, in the Secret `NAME-trainer-status` built beside the JobSet.
//!
//! # The token
//!
//! `trainjob:NS:NAME:UID:MAC`, the MAC an HMAC-SHA256 of the rest under a key
//! every hub replica reads from the store ([`SigningKey`]). It authenticates
//! as the user `system:trainjob:NS:NAME` (uid = the TrainJob's uid, group
//! [`GROUP`]), and [`JobTokens`] authorizes that user for one thing only:
//! a POST to its own TrainJob's `/status`. It dies with the TrainJob: a
//! TrainJob created again under the same name has another uid, which the
//! old token does not name.
//!
//! # The request
//!
//! `POST .../trainjobs/NAME/status`, `Authorization: Bearer TOKEN`, a body of
//! at most 64 KiB: `{"trainerStatus": {"progressPercentage", "estimatedRemainingSeconds",
//! "metrics": [{"name", "value"}], "lastUpdatedTime"}}`, unknown fields
//! ignored, as upstream's server decodes it. The TrainJob's
//! `status.trainerStatus` becomes the posted one (the CRD's schema and
//! rules apply: 0–100, at most 256 metrics, `lastUpdatedTime` required);
//! the answer echoes the request. Kubeflow's SDK
//! (`kubeflow.trainer.update_trainjob_status`) posts exactly this.
//!
//! A TrainJob's status is taken at most once per [`POST_INTERVAL`] (per hub
//! replica): each post is a TrainJob write, which every watcher of
//! TrainJobs pays for, and the poster is the tenant's own command. A post
//! sooner is answered 429 TooManyRequests with `Retry-After`, as
//! kube-apiserver answers a client it holds back; the SDK throttles itself
//! to one post per 5 s and never sees it. A post refused before it is taken
//! (a token of another TrainJob, a body that does not decode) does not use
//! up the interval; one the schema refuses after does.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use base64::Engine as _;
use ring::hmac;
use serde::Deserialize;
use serde_json::{Value, json};
use trainhub_apiserver::auth::{Attributes, Authorizer, Rules, TokenAuthenticator, UserInfo};
use trainhub_apiserver::recent::Recent;
use trainhub_apiserver::resource::ResourceDef;
use trainhub_apiserver::server::{StatusPost, StatusPosted};
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{Key, Op, Store, StoreError};

use crate::api::TRAINJOBS;

pub const ENV_URL: &str = "KUBEFLOW_TRAINER_SERVER_URL";
pub const ENV_CA_CERT: &str = "KUBEFLOW_TRAINER_SERVER_CA_CERT";
pub const ENV_TOKEN: &str = "KUBEFLOW_TRAINER_SERVER_TOKEN";
/// Where the token and the CA are mounted in the trainer's containers.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubeflow/trainer";
pub const VOLUME: &str = "kubeflow-trainer-token";
const CA_FILE: &str = "ca.crt";
const TOKEN_FILE: &str = "token";
/// The Secret with the token and the CA: `NAME` + this.
pub const SECRET_SUFFIX: &str = "-trainer-status";
/// The group of every TrainJob's token user.
pub const GROUP: &str = "trainhub:trainjobs";
const USER_PREFIX: &str = "system:trainjob:";
const TOKEN_PREFIX: &str = "trainjob";
/// Upstream's status server reads at most this much of a body.
pub const MAX_BODY: usize = 1 << 16;
/// The least time between two posts of one TrainJob's status that are taken.
pub const POST_INTERVAL: Duration = Duration::from_secs(1);
/// How many TrainJobs' last posts are remembered: a TrainJob forgotten
/// (the least recently posting) may post again at once.
const POSTERS_KEPT: usize = 65_536;

/// Where the key lives in the store (not an API object: never served).
fn key_location() -> Key {
    Key::new(
        "trainhub.kubeflow.org/internal-keys",
        None,
        "trainer-status",
    )
}

/// How long a replica waits to see the signing key another replica created.
const KEY_VISIBLE_WITHIN: Duration = Duration::from_secs(10);

/// The key that signs the TrainJobs' status tokens, one for all replicas:
/// the first replica to start creates it in the store, the others read it.
pub struct SigningKey {
    store: Arc<dyn Store>,
    key: OnceLock<hmac::Key>,
}

impl SigningKey {
    pub fn new(store: Arc<dyn Store>) -> Arc<SigningKey> {
        Arc::new(SigningKey {
            store,
            key: OnceLock::new(),
        })
    }

    /// Creates the key in the store unless a replica did, and loads it.
    ///
    /// # Errors
    ///
    /// The store refused the write, or holds something that is no key.
    pub async fn ensure(&self) -> Result<()> {
        if self.load().is_some() {
            return Ok(());
        }
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).context("generating the trainer-status key")?;
        let created = self
            .store
            .commit(vec![Op::Create {
                key: key_location(),
                value: json!({"key": hex::encode(bytes)}),
            }])
            .await;
        match created {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => {}
            Err(e) => return Err(e).context("storing the trainer-status key"),
        }
        // Created by another replica: this replica's view of a shared
        // store follows it by a watch, so the key may show a moment later.
        let deadline = tokio::time::Instant::now() + KEY_VISIBLE_WITHIN;
        loop {
            if self.load().is_some() {
                return Ok(());
            }
            if self.store.get(&key_location()).is_some() {
                anyhow::bail!("the stored trainer-status key is not 32 hex-encoded bytes");
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "the trainer-status key another replica created did not reach this \
                     replica's view of the store within {KEY_VISIBLE_WITHIN:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn load(&self) -> Option<&hmac::Key> {
        if let Some(key) = self.key.get() {
            return Some(key);
        }
        let stored = self.store.get(&key_location())?;
        let bytes = hex::decode(stored.value["key"].as_str()?).ok()?;
        (bytes.len() == 32).then(|| {
            self.key
                .get_or_init(|| hmac::Key::new(hmac::HMAC_SHA256, &bytes))
        })
    }

    /// HMAC-SHA256 of `data` for `purpose` with this key (another use of
    /// the same shared key: the purpose keeps the MACs of each use apart);
    /// `None` while the key is not in the store.
    pub fn mac(&self, purpose: &str, data: &[u8]) -> Option<Vec<u8>> {
        let key = self.load()?;
        let mut context = hmac::Context::with_key(key);
        context.update(purpose.as_bytes());
        context.update(&[0]);
        context.update(data);
        Some(context.sign().as_ref().to_vec())
    }

    /// The token of the TrainJob `namespace/name` with `uid`; `None` while
    /// the key is not in the store.
    pub fn token(&self, namespace: &str, name: &str, uid: &str) -> Option<String> {
        let key = self.load()?;
        let claims = format!("{TOKEN_PREFIX}:{namespace}:{name}:{uid}");
        let mac = hmac::sign(key, claims.as_bytes());
        Some(format!("{claims}:{}", hex::encode(mac.as_ref())))
    }
}

impl TokenAuthenticator for SigningKey {
    fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
        let (claims, mac) = token.rsplit_once(':')?;
        let mut parts = claims.split(':');
        let (Some(TOKEN_PREFIX), Some(namespace), Some(name), Some(uid), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let mac = hex::decode(mac).ok()?;
        hmac::verify(self.load()?, claims.as_bytes(), &mac).ok()?;
        Some(UserInfo {
            name: format!("{USER_PREFIX}{namespace}:{name}"),
            uid: uid.to_string(),
            groups: vec![GROUP.to_string()],
        })
    }
}

/// The TrainJob a token user stands for: (namespace, name).
fn job_of(user: &UserInfo) -> Option<(&str, &str)> {
    if !user.in_group(GROUP) {
        return None;
    }
    user.name.strip_prefix(USER_PREFIX)?.split_once(':')
}

/// Authorization with the TrainJobs' tokens in it: a token user may post
/// its own TrainJob's status and nothing else (not even discovery); every
/// other user is decided by `inner`.
pub struct JobTokens {
    pub inner: Arc<dyn Authorizer>,
}

impl Authorizer for JobTokens {
    fn authorize(&self, user: &UserInfo, a: &Attributes<'_>) -> Result<(), String> {
        if !user.in_group(GROUP) {
            return self.inner.authorize(user, a);
        }
        let Some((namespace, name)) = job_of(user) else {
            return Err("not a TrainJob's token user".into());
        };
        let own_status = a.verb == "create"
            && a.group == trainhub_api::trainer::GROUP
            && a.resource == "trainjobs"
            && a.subresource == Some("status")
            && a.namespace == Some(namespace)
            && a.name == name;
        if own_status {
            Ok(())
        } else {
            Err(format!(
                "a TrainJob's token may only post the status of TrainJob {namespace}/{name}"
            ))
        }
    }

    fn authorize_non_resource(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<(), String> {
        if user.in_group(GROUP) {
            return Err("a TrainJob's token reaches no path but its TrainJob's status".into());
        }
        self.inner.authorize_non_resource(user, verb, path)
    }

    fn rules(&self, user: &UserInfo, namespace: &str) -> Option<Rules> {
        if user.in_group(GROUP) {
            return Some(Rules::default());
        }
        self.inner.rules(user, namespace)
    }
}

/// The body upstream's status server decodes.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateRequest {
    #[serde(default)]
    trainer_status: Option<PostedStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PostedStatus {
    #[serde(default)]
    progress_percentage: Option<i64>,
    #[serde(default)]
    estimated_remaining_seconds: Option<i64>,
    #[serde(default)]
    metrics: Option<Vec<PostedMetric>>,
    #[serde(default)]
    last_updated_time: Option<String>,
}

#[derive(Deserialize)]
struct PostedMetric {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

/// POSTs to a TrainJob's `/status`: the `trainerStatus` it carries
/// replaces the stored one, at most once per interval per TrainJob.
pub struct StatusPosts {
    interval: Duration,
    /// When each TrainJob (by uid) last had a post taken.
    last: Recent<String, Arc<Mutex<Option<Instant>>>>,
}

impl Default for StatusPosts {
    fn default() -> Self {
        StatusPosts::with_interval(POST_INTERVAL)
    }
}

impl StatusPosts {
    pub fn with_interval(interval: Duration) -> StatusPosts {
        StatusPosts {
            interval,
            last: Recent::new(POSTERS_KEPT),
        }
    }

    /// Takes a post of the TrainJob `uid` now, or says how long until one
    /// is taken.
    fn take(&self, uid: &str) -> Result<(), Duration> {
        let slot = self
            .last
            .try_get_with(uid.to_string(), || {
                Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(None)))
            })
            .unwrap_or_else(|never| match never {});
        let mut last = slot.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if let Some(at) = *last {
            let since = now.saturating_duration_since(at);
            if since < self.interval {
                return Err(self.interval - since);
            }
        }
        *last = Some(now);
        Ok(())
    }
}

impl StatusPost for StatusPosts {
    fn serves(&self, def: &ResourceDef) -> bool {
        def.store_key() == TRAINJOBS
    }

    fn post(&self, user: &UserInfo, object: &Value, body: &[u8]) -> Result<StatusPosted, ApiError> {
        // A token names one TrainJob, by uid: not one created again under
        // its name since.
        if job_of(user).is_some() && object["metadata"]["uid"].as_str() != Some(user.uid.as_str()) {
            return Err(ApiError::new(403, "Forbidden", "Forbidden"));
        }
        if body.len() > MAX_BODY {
            return Err(ApiError::too_large(format!(
                "Request entity too large: limit is {MAX_BODY}"
            )));
        }
        let request: UpdateRequest = serde_json::from_slice(body)
            .map_err(|e| ApiError::new(422, "Invalid", format!("Invalid payload: {e}")))?;
        let Some(posted) = request.trainer_status else {
            return Ok(StatusPosted {
                status: None,
                answer: json!({}),
            });
        };
        let trainer_status = normalize(posted)?;
        let uid = object["metadata"]["uid"].as_str().unwrap_or_default();
        if let Err(wait) = self.take(uid) {
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                format!(
                    "status.trainerStatus: this TrainJob's status was posted less than {}s ago; at most one post per {}s is taken",
                    self.interval.as_secs_f64(),
                    self.interval.as_secs_f64()
                ),
            );
            e.retry_after_seconds = Some(
                u32::try_from(wait.as_secs_f64().ceil() as u64)
                    .unwrap_or(u32::MAX)
                    .max(1),
            );
            return Err(e);
        }
        let mut status = object.get("status").cloned().unwrap_or_else(|| json!({}));
        if !status.is_object() {
            status = json!({});
        }
        status["trainerStatus"] = trainer_status.clone();
        Ok(StatusPosted {
            status: Some(status),
            answer: json!({"trainerStatus": trainer_status}),
        })
    }
}

/// The posted status as the API stores it: times in RFC 3339 at seconds
/// (as a `metav1.Time` reads and writes them), fields the client left out
/// absent. Ranges are the schema's to check, with its messages.
fn normalize(posted: PostedStatus) -> Result<Value, ApiError> {
    let mut out = serde_json::Map::new();
    if let Some(p) = posted.progress_percentage {
        out.insert("progressPercentage".into(), p.into());
    }
    if let Some(s) = posted.estimated_remaining_seconds {
        out.insert("estimatedRemainingSeconds".into(), s.into());
    }
    if let Some(metrics) = posted.metrics {
        let metrics: Vec<Value> = metrics
            .into_iter()
            .map(|m| json!({"name": m.name, "value": m.value}))
            .collect();
        out.insert("metrics".into(), metrics.into());
    }
    if let Some(time) = posted.last_updated_time {
        let at: jiff::Timestamp = time.parse().map_err(|e| {
            ApiError::invalid(
                trainhub_api::trainer::GROUP,
                "TrainJob",
                "",
                &[trainhub_apiserver::field::FieldError::invalid(
                    "status.trainerStatus.lastUpdatedTime",
                    time.as_str(),
                    format!("must be an RFC 3339 time: {e}"),
                )],
            )
        })?;
        let seconds = jiff::Timestamp::from_second(at.as_second()).unwrap_or(at);
        out.insert(
            "lastUpdatedTime".into(),
            seconds.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().into(),
        );
    }
    Ok(Value::Object(out))
}

/// What the hub gives the trainer's pods to post their progress with.
pub struct Reporting {
    /// The hub's API as the pods reach it (`https://host:port`), once known.
    url: OnceLock<String>,
    /// PEM the pods verify the hub's serving certificate with.
    ca_pem: String,
    key: Arc<SigningKey>,
}

impl Reporting {
    /// `url`: the hub's API as the pods reach it; `None` until
    /// [`Reporting::set_url`] says (once the listener's port is known).
    pub fn new(url: Option<&str>, ca_pem: String, key: Arc<SigningKey>) -> Reporting {
        let reporting = Reporting {
            url: OnceLock::new(),
            ca_pem,
            key,
        };
        if let Some(url) = url {
            reporting.set_url(url);
        }
        reporting
    }

    /// Sets the API's URL, unless it is set already.
    pub fn set_url(&self, url: &str) {
        let _ = self.url.set(url.trim_end_matches('/').to_string());
    }

    /// The status URL of the TrainJob `namespace/name`.
    pub fn status_url(&self, namespace: &str, name: &str) -> Option<String> {
        Some(format!(
            "{}/apis/{}/{}/namespaces/{namespace}/trainjobs/{name}/status",
            self.url.get()?,
            trainhub_api::trainer::GROUP,
            trainhub_api::trainer::VERSION
        ))
    }

    /// Adds the environment, mount and volume to the trainer's containers
    /// of the built JobSet, and the Secret they read, as the
    /// TrainJobStatus plugin's EnforceMLPolicy and Build do. Nothing when
    /// no replicated job is the trainer's (as upstream).
    ///
    /// # Errors
    ///
    /// The key is not in the store yet, or the URL not known yet.
    pub fn add_to(
        &self,
        objects: &mut Vec<Value>,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), String> {
        let url = self
            .status_url(namespace, name)
            .ok_or("the hub's API address is not known yet")?;
        let env = [
            (ENV_URL, url),
            (ENV_CA_CERT, format!("{MOUNT_PATH}/{CA_FILE}")),
            (ENV_TOKEN, format!("{MOUNT_PATH}/{TOKEN_FILE}")),
        ];
        let secret_name = format!("{name}{SECRET_SUFFIX}");
        let mut added = false;
        for jobset in objects.iter_mut().filter(|o| o["kind"] == "JobSet") {
            let Some(jobs) = jobset
                .pointer_mut("/spec/replicatedJobs")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            for job in jobs.iter_mut().filter(|j| is_trainer(j)) {
                let Some(pod) = job.pointer_mut("/template/spec/template/spec") else {
                    continue;
                };
                for container in pod["containers"].as_array_mut().into_iter().flatten() {
                    for (var, value) in &env {
                        upsert_named(&mut container["env"], json!({"name": var, "value": value}));
                    }
                    upsert_named(
                        &mut container["volumeMounts"],
                        json!({"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": true}),
                    );
                }
                upsert_named(
                    &mut pod["volumes"],
                    json!({"name": VOLUME, "secret": {"secretName": secret_name}}),
                );
                added = true;
            }
        }
        if !added {
            return Ok(());
        }
        let token = self
            .key
            .token(namespace, name, uid)
            .ok_or("the trainer-status key is not in the store yet")?;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        objects.push(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret_name,
                "namespace": namespace,
                "ownerReferences": [{
                    "apiVersion": format!("{}/{}", trainhub_api::trainer::GROUP, trainhub_api::trainer::VERSION),
                    "kind": "TrainJob",
                    "name": name,
                    "uid": uid,
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
            },
            "type": "Opaque",
            "data": {TOKEN_FILE: b64(&token), CA_FILE: b64(&self.ca_pem)},
        }));
        Ok(())
    }
}

fn is_trainer(replicated_job: &Value) -> bool {
    replicated_job
        .pointer("/template/metadata/labels")
        .and_then(|l| l.get(trainhub_api::constants::LABEL_TRAINJOB_ANCESTOR))
        .and_then(Value::as_str)
        == Some(trainhub_api::constants::ANCESTOR_TRAINER)
}

/// Replaces the entry of `list` with `item`'s name in place, or appends it
/// (upstream's `apply.Upsert*`); a missing list is created.
fn upsert_named(list: &mut Value, item: Value) {
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    let Some(entries) = list.as_array_mut() else {
        return;
    };
    match entries.iter_mut().find(|e| e["name"] == item["name"]) {
        Some(entry) => *entry = item,
        None => entries.push(item),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainhub_apiserver::auth::AllowAll;
    use trainhub_apiserver::store::RedbStore;

    async fn key() -> (tempfile::TempDir, Arc<SigningKey>) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(RedbStore::open(&dir.path().join("s.redb"), 100).unwrap());
        let key = SigningKey::new(store);
        assert!(key.token("ns", "j", "u").is_none(), "no key before ensure");
        key.ensure().await.unwrap();
        (dir, key)
    }

    /// A replica's view of a shared store that shows the first `hidden`
    /// reads of the signing key as absent, as a view fed by a watch does
    /// just after another replica created it.
    struct Lagging {
        inner: Arc<dyn Store>,
        hidden: std::sync::atomic::AtomicUsize,
    }

    impl Store for Lagging {
        fn get(&self, key: &Key) -> Option<trainhub_apiserver::store::Object> {
            let hide = self
                .hidden
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |n| n.checked_sub(1),
                )
                .is_ok();
            if hide { None } else { self.inner.get(key) }
        }
        fn list(
            &self,
            resource: &str,
            namespace: Option<&str>,
        ) -> (
            Vec<trainhub_apiserver::store::Object>,
            trainhub_apiserver::store::Rv,
        ) {
            self.inner.list(resource, namespace)
        }
        fn commit(&self, ops: Vec<Op>) -> trainhub_apiserver::store::CommitFuture<'_> {
            self.inner.commit(ops)
        }
        fn watch(
            &self,
            resource: &str,
            namespace: Option<&str>,
            since: Option<trainhub_apiserver::store::Rv>,
        ) -> Result<trainhub_apiserver::store::Watch, StoreError> {
            self.inner.watch(resource, namespace, since)
        }
        fn revision(&self) -> trainhub_apiserver::store::Rv {
            self.inner.revision()
        }
        fn list_raw(
            &self,
            resource: &str,
            namespace: Option<&str>,
            after: Option<(&str, &str)>,
            at: Option<trainhub_apiserver::store::Rv>,
        ) -> trainhub_apiserver::store::RawListFuture<'_> {
            self.inner.list_raw(resource, namespace, after, at)
        }
        fn fenced(self: Arc<Self>, _term: trainhub_apiserver::store::Term) -> Arc<dyn Store> {
            self
        }
    }

    #[tokio::test]
    async fn a_replica_that_sees_the_key_late_waits_for_it_and_signs_alike() {
        let (_dir, first) = key().await;
        let second = SigningKey::new(Arc::new(Lagging {
            inner: first.store.clone(),
            hidden: std::sync::atomic::AtomicUsize::new(5),
        }));
        second.ensure().await.unwrap();
        assert_eq!(
            second.token("ns", "j", "u"),
            first.token("ns", "j", "u"),
            "both replicas sign with the key the first created"
        );
    }

    #[tokio::test]
    async fn a_token_names_its_trainjob_and_nothing_else_verifies() {
        let (_dir, key) = key().await;
        let token = key.token("team-a", "mnist", "uid-1").unwrap();
        let user = key.authenticate_token(&token).unwrap();
        assert_eq!(user.name, "system:trainjob:team-a:mnist");
        assert_eq!(user.uid, "uid-1");
        assert_eq!(user.groups, [GROUP]);
        // Another job's claims under this MAC, a truncated MAC, junk.
        let forged = token.replace("mnist", "other");
        assert!(key.authenticate_token(&forged).is_none());
        assert!(key.authenticate_token(&token[..token.len() - 2]).is_none());
        for junk in [
            "",
            "trainjob",
            "trainjob:a:b:c:zz",
            "x:a:b:c:00",
            "trainjob:a:b:c:d:00",
        ] {
            assert!(key.authenticate_token(junk).is_none(), "{junk:?}");
        }
        // A second replica on the same store reads the same key.
        let again = SigningKey::new(key.store.clone());
        again.ensure().await.unwrap();
        assert_eq!(again.authenticate_token(&token).unwrap(), user);
    }

    #[test]
    fn a_token_user_may_post_its_own_status_only() {
        let authz = JobTokens {
            inner: Arc::new(AllowAll),
        };
        let user = UserInfo {
            name: "system:trainjob:team-a:mnist".into(),
            uid: "u".into(),
            groups: vec![GROUP.into(), "system:authenticated".into()],
        };
        let attrs = |verb, sub, ns, name| Attributes {
            verb,
            group: "trainer.kubeflow.org",
            resource: "trainjobs",
            subresource: sub,
            namespace: ns,
            name,
        };
        assert!(
            authz
                .authorize(
                    &user,
                    &attrs("create", Some("status"), Some("team-a"), "mnist")
                )
                .is_ok()
        );
        for denied in [
            attrs("create", Some("status"), Some("team-a"), "other"),
            attrs("create", Some("status"), Some("team-b"), "mnist"),
            attrs("get", None, Some("team-a"), "mnist"),
            attrs("update", Some("status"), Some("team-a"), "mnist"),
            attrs("patch", None, Some("team-a"), "mnist"),
            attrs("create", None, Some("team-a"), ""),
        ] {
            assert!(authz.authorize(&user, &denied).is_err(), "{denied:?}");
        }
        assert!(
            authz
                .authorize_non_resource(&user, "get", "/version")
                .is_err()
        );
        // Everyone else is the inner authorizer's.
        let alice = UserInfo {
            name: "alice".into(),
            ..UserInfo::default()
        };
        assert!(
            authz
                .authorize(&alice, &attrs("get", None, Some("team-b"), "x"))
                .is_ok()
        );
    }

    fn job() -> Value {
        json!({"metadata": {"name": "mnist", "namespace": "team-a", "uid": "u1"},
               "status": {"conditions": [{"type": "Created"}]}})
    }

    fn token_user(uid: &str) -> UserInfo {
        UserInfo {
            name: "system:trainjob:team-a:mnist".into(),
            uid: uid.into(),
            groups: vec![GROUP.into()],
        }
    }

    #[test]
    fn a_post_replaces_trainer_status_and_keeps_the_rest() {
        let body =
            br#"{"trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 90,
            "metrics": [{"name": "loss", "value": "0.25"}],
            "lastUpdatedTime": "2026-11-26T10:00:00.123456+00:00", "extra": 1}, "unknown": true}"#;
        let posted = StatusPosts::default()
            .post(&token_user("u1"), &job(), body)
            .unwrap();
        let expected = json!({"progressPercentage": 40, "estimatedRemainingSeconds": 90,
            "metrics": [{"name": "loss", "value": "0.25"}], "lastUpdatedTime": "2026-11-26T10:00:00Z"});
        let status = posted.status.unwrap();
        assert_eq!(status["trainerStatus"], expected);
        assert_eq!(status["conditions"], json!([{"type": "Created"}]));
        assert_eq!(posted.answer, json!({"trainerStatus": expected}));
        // Without trainerStatus nothing is written.
        let empty = StatusPosts::default()
            .post(&token_user("u1"), &job(), b"{}")
            .unwrap();
        assert_eq!(empty.status, None);
    }

    #[test]
    fn bad_posts_are_refused_with_their_reason() {
        let user = token_user("u1");
        // Another TrainJob of the same name (a new uid).
        assert_eq!(
            StatusPosts::default()
                .post(&token_user("u0"), &job(), b"{}")
                .unwrap_err()
                .code,
            403
        );
        let e = StatusPosts::default()
            .post(&user, &job(), b"{not json")
            .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert!(e.message.starts_with("Invalid payload"), "{}", e.message);
        let e = StatusPosts::default()
            .post(
                &user,
                &job(),
                br#"{"trainerStatus": {"progressPercentage": "half"}}"#,
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        let e = StatusPosts::default()
            .post(
                &user,
                &job(),
                br#"{"trainerStatus": {"lastUpdatedTime": "yesterday"}}"#,
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message.contains("status.trainerStatus.lastUpdatedTime"),
            "{}",
            e.message
        );
        let big = vec![b' '; MAX_BODY + 1];
        assert_eq!(
            StatusPosts::default()
                .post(&user, &job(), &big)
                .unwrap_err()
                .code,
            413
        );
    }

    #[test]
    fn a_trainjob_posting_faster_than_the_interval_is_held_back() {
        let post = br#"{"trainerStatus": {"progressPercentage": 7, "lastUpdatedTime": "2026-11-28T10:00:00Z"}}"#;
        let user = token_user("u1");
        let posts = StatusPosts::with_interval(Duration::from_secs(3600));
        // A refused post does not use up the interval.
        assert_eq!(
            posts.post(&user, &job(), b"{not json").unwrap_err().code,
            422
        );
        assert!(posts.post(&user, &job(), post).unwrap().status.is_some());
        let e = posts.post(&user, &job(), post).unwrap_err();
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        assert!(
            e.message.starts_with("status.trainerStatus: "),
            "{}",
            e.message
        );
        let wait = e.retry_after_seconds.unwrap();
        assert!((3599..=3600).contains(&wait), "{wait}");
        // Another TrainJob is not held back by this one.
        let mut other = job();
        other["metadata"]["uid"] = json!("u2");
        assert!(posts.post(&token_user("u2"), &other, post).is_ok());
        // Once the interval has passed, a post is taken again.
        let posts = StatusPosts::with_interval(Duration::from_millis(20));
        assert!(posts.post(&user, &job(), post).is_ok());
        std::thread::sleep(Duration::from_millis(25));
        assert!(posts.post(&user, &job(), post).is_ok());
    }

    #[tokio::test]
    async fn the_trainer_pods_get_env_mount_volume_and_the_secret() {
        let (_dir, key) = key().await;
        let reporting = Reporting::new(
            Some("https://hub.example:6443/"),
            "CA PEM".into(),
            key.clone(),
        );
        let trainer = json!({"name": "node", "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "node", "env": [{"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": "stale"}, {"name": "A", "value": "1"}]},
                {"name": "sidecar"}]}}}}});
        let initializer = json!({"name": "dataset-initializer", "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}},
            "spec": {"template": {"spec": {"containers": [{"name": "dataset-initializer"}]}}}}});
        let mut objects = vec![
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "mnist"}, "spec": {"replicatedJobs": [initializer.clone(), trainer]}}),
        ];
        reporting
            .add_to(&mut objects, "team-a", "mnist", "u1")
            .unwrap();
        assert_eq!(objects.len(), 2);
        let jobs = &objects[0]["spec"]["replicatedJobs"];
        assert_eq!(jobs[0], initializer, "only the trainer's pods");
        let pod = &jobs[1]["template"]["spec"]["template"]["spec"];
        let url = "https://hub.example:6443/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/mnist/status";
        assert_eq!(
            pod["containers"][0]["env"],
            json!([{"name": ENV_URL, "value": url}, {"name": "A", "value": "1"},
                   {"name": ENV_CA_CERT, "value": "/var/run/secrets/kubeflow/trainer/ca.crt"},
                   {"name": ENV_TOKEN, "value": "/var/run/secrets/kubeflow/trainer/token"}])
        );
        for container in pod["containers"].as_array().unwrap() {
            assert_eq!(
                container["volumeMounts"],
                json!([{"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": true}])
            );
        }
        assert_eq!(
            pod["volumes"],
            json!([{"name": VOLUME, "secret": {"secretName": "mnist-trainer-status"}}])
        );
        let secret = &objects[1];
        assert_eq!(secret["kind"], "Secret");
        assert_eq!(secret["metadata"]["name"], "mnist-trainer-status");
        assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "u1");
        let decode = |v: &Value| {
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap())
                    .unwrap(),
            )
            .unwrap()
        };
        assert_eq!(decode(&secret["data"]["ca.crt"]), "CA PEM");
        let token = decode(&secret["data"]["token"]);
        assert_eq!(
            key.authenticate_token(&token).unwrap().name,
            "system:trainjob:team-a:mnist"
        );
        // No trainer job: nothing added.
        let mut plain = vec![json!({"kind": "JobSet", "spec": {"replicatedJobs": [initializer]}})];
        let before = plain.clone();
        reporting.add_to(&mut plain, "team-a", "x", "u").unwrap();
        assert_eq!(plain, before);
    }
}
