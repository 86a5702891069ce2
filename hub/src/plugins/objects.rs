//! `TrainerPlugin` objects: plugins installed through the API, loaded by
//! every hub replica from what the store holds.
//!
//! ```yaml
//! apiVersion: trainhub.kubeflow.org/v1alpha1
//! kind: TrainerPlugin
//! metadata: {name: acme}
//! spec:
//!   module: file:///srv/plugins/acme.wasm     # or oci://..., https://...
//!   sha256: 3b1f...                            # unless the reference carries @sha256:
//!   settings: {team: ml-platform}
//!   frameworks: [acme]                         # default: what the plugin describes
//!   phases: [Validate, EnforceMLPolicy, Build] # default: all it implements
//!   failurePolicy: Fail                        # or Ignore
//!   limits: {cpuMillis: 1000, wallClockMillis: 30000, memoryMiB: 64}
//! ```
//!
//! Each replica runs an [`ObjectPlugins`] loader: it watches the objects,
//! fetches each module ([`super::sources::Sources`]), checks its SHA-256
//! and the trust policy's signatures before compiling,
//! loads it and publishes the set to the [`Registry`]; a plugin of the same
//! name as a built-in replaces it. A module that cannot be had now (the
//! file or registry unreachable) keeps the version loaded before serving,
//! and is tried again. The leader writes each object's `status` (see
//! [`run_status`]): `Ready` with the loaded digest and the plugin's own
//! description, or why not. The built-in plugins are listed as read-only
//! objects named `builtin-NAME` with `module: builtin:NAME`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::{Value, json};
use sha2::Digest as _;
use tokio::sync::watch;
use trainhub_apiserver::store::{Key, Op, Store, StoreError};
use trainhub_plugin_sdk::{self as sdk, Capabilities, RuntimeInfo, Target, Validation};

use super::pipeline::PhasePlugin;
use super::registry::{Loading, Registry};
use super::{Limits, PluginError, PluginId};

/// Store key of the kind (cluster-scoped).
pub const RESOURCE: &str = "trainhub.kubeflow.org/trainerplugins";
pub const GROUP: &str = "trainhub.kubeflow.org";
pub const KIND: &str = "TrainerPlugin";
/// Label of the objects that list the built-in plugins.
pub const LABEL_BUILTIN: &str = "trainhub.kubeflow.org/builtin";
/// Objects the hub itself writes (the built-ins, the plugins directory's).
pub const MANAGER: &str = "trainhub";
/// How often modules that could not be fetched are tried again.
const RETRY: Duration = Duration::from_secs(30);
/// The largest module accepted.
pub const MAX_MODULE_BYTES: usize = 64 << 20;

/// Why a plugin is not serving: the `Ready` condition's reason, with what
/// happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    pub reason: &'static str,
    pub message: String,
    /// Worth trying again without a change to the object (a registry or
    /// file that was not reachable).
    pub transient: bool,
}

impl LoadFailure {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        LoadFailure {
            reason,
            message: message.into(),
            transient: false,
        }
    }

    pub fn transient(reason: &'static str, message: impl Into<String>) -> Self {
        LoadFailure {
            transient: true,
            ..Self::new(reason, message)
        }
    }
}

pub const REASON_LOADED: &str = "Loaded";
pub const REASON_BUILTIN: &str = "Builtin";
pub const REASON_DIGEST_MISMATCH: &str = "DigestMismatch";
pub const REASON_PULL_FAILED: &str = "PullFailed";
pub const REASON_COMPILE_FAILED: &str = "CompileFailed";
pub const REASON_SETTINGS_REJECTED: &str = "SettingsRejected";
pub const REASON_INVALID: &str = "InvalidSpec";

/// The bytes of a `file:///` module.
///
/// # Errors
///
/// Not a `file:///` reference, too large or unreadable.
pub async fn read_file_module(module: &str) -> Result<Vec<u8>, LoadFailure> {
    let Some(path) = module.strip_prefix("file://") else {
        return Err(LoadFailure::new(
            REASON_PULL_FAILED,
            format!("{module}: this hub fetches no modules of this kind"),
        ));
    };
    let path = PathBuf::from(path);
    let meta = tokio::fs::metadata(&path).await.map_err(|e| {
        LoadFailure::transient(REASON_PULL_FAILED, format!("{}: {e}", path.display()))
    })?;
    if !meta.is_file() {
        return Err(LoadFailure::new(
            REASON_PULL_FAILED,
            format!("{}: not a regular file", path.display()),
        ));
    }
    let too_large = || {
        LoadFailure::new(
            REASON_PULL_FAILED,
            format!(
                "{}: more than the {MAX_MODULE_BYTES} bytes a module may have",
                path.display()
            ),
        )
    };
    if meta.len() > MAX_MODULE_BYTES as u64 {
        return Err(too_large());
    }
    // Read at most one byte past the cap: the file may grow meanwhile.
    use tokio::io::AsyncReadExt as _;
    let file = tokio::fs::File::open(&path).await.map_err(|e| {
        LoadFailure::transient(REASON_PULL_FAILED, format!("{}: {e}", path.display()))
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_MODULE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| {
            LoadFailure::transient(REASON_PULL_FAILED, format!("{}: {e}", path.display()))
        })?;
    if bytes.len() > MAX_MODULE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

/// A `TrainerPlugin`'s spec, as the loader reads it (the API validated it).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub module: String,
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub settings: Option<Value>,
    #[serde(default)]
    pub frameworks: Option<Vec<String>>,
    #[serde(default)]
    pub phases: Option<Vec<String>>,
    #[serde(default)]
    pub failure_policy: Option<String>,
    #[serde(default)]
    pub limits: Option<SpecLimits>,
    /// A detached signature of a `file://` module (one line of base64).
    #[serde(default)]
    pub signature: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SpecLimits {
    pub cpu_millis: Option<u64>,
    pub wall_clock_millis: Option<u64>,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
}

impl Spec {
    /// The digest the module must have (hex): `spec.sha256`, else the
    /// reference's `@sha256:`; both given, they must agree.
    ///
    /// # Errors
    ///
    /// Neither, or two that differ.
    pub fn digest(&self) -> Result<String, LoadFailure> {
        let pinned = self
            .module
            .rsplit_once("@sha256:")
            .map(|(_, d)| d.to_ascii_lowercase());
        match (&self.sha256, pinned) {
            (Some(a), Some(b)) if *a != b => Err(LoadFailure::new(
                REASON_INVALID,
                format!("spec.sha256 {a} differs from the digest in spec.module ({b})"),
            )),
            (Some(a), _) => Ok(a.clone()),
            (None, Some(b)) => Ok(b),
            (None, None) => Err(LoadFailure::new(
                REASON_INVALID,
                "spec.sha256 is required unless spec.module carries a digest",
            )),
        }
    }

    fn limits(&self) -> Limits {
        let l = self.limits.clone().unwrap_or_default();
        Limits::with(l.cpu_millis, l.wall_clock_millis, l.memory_mib)
    }
}

/// The phases a `TrainerPlugin` may name, and the capability of each.
const PHASES: [(&str, Capabilities); 5] = [
    ("Validate", Capabilities::VALIDATE),
    ("EnforceMLPolicy", Capabilities::ENFORCE_ML_POLICY),
    (
        "EnforcePodGroupPolicy",
        Capabilities::ENFORCE_POD_GROUP_POLICY,
    ),
    ("Build", Capabilities::BUILD),
    ("Status", Capabilities::STATUS),
];

fn phase_names(capabilities: Capabilities) -> Vec<&'static str> {
    PHASES
        .iter()
        .filter(|(_, c)| capabilities.contains(*c))
        .map(|(n, _)| *n)
        .collect()
}

/// A loaded plugin as its object configures it: the frameworks and phases
/// it serves, and what a failed call does.
pub struct Configured {
    inner: Arc<dyn PhasePlugin>,
    descriptor: sdk::Descriptor,
    ignore_failures: bool,
}

impl Configured {
    /// # Errors
    ///
    /// A phase the plugin does not implement, or an unknown one.
    pub fn new(inner: Arc<dyn PhasePlugin>, spec: &Spec) -> Result<Configured, LoadFailure> {
        let mut descriptor = inner.descriptor().clone();
        if let Some(frameworks) = &spec.frameworks {
            descriptor.frameworks = frameworks.clone();
        }
        if let Some(phases) = &spec.phases {
            let mut chosen = Capabilities::empty();
            for phase in phases {
                let Some((_, capability)) = PHASES.iter().find(|(n, _)| n == phase) else {
                    return Err(LoadFailure::new(
                        REASON_INVALID,
                        format!("spec.phases: unknown phase {phase:?}"),
                    ));
                };
                if !inner.descriptor().capabilities.contains(*capability) {
                    return Err(LoadFailure::new(
                        REASON_INVALID,
                        format!(
                            "spec.phases: {} does not implement {phase} (it implements {})",
                            inner.id().name,
                            phase_names(inner.descriptor().capabilities).join(", ")
                        ),
                    ));
                }
                chosen |= *capability;
            }
            descriptor.capabilities = chosen;
        }
        Ok(Configured {
            inner,
            descriptor,
            ignore_failures: spec.failure_policy.as_deref() == Some("Ignore"),
        })
    }

    /// The call's result, or, under `failurePolicy: Ignore`, `fallback` for
    /// a failure that is the plugin's (not the host's: those are retried).
    fn or_ignore<T>(
        &self,
        result: Result<T, PluginError>,
        fallback: impl FnOnce() -> T,
    ) -> Result<T, PluginError> {
        match result {
            Err(e) if self.ignore_failures && !e.is_transient() => {
                tracing::warn!(plugin = %self.inner.id(), error = %e, "plugin call failed; ignored (failurePolicy: Ignore)");
                Ok(fallback())
            }
            other => other,
        }
    }
}

impl PhasePlugin for Configured {
    fn id(&self) -> &PluginId {
        self.inner.id()
    }
    fn descriptor(&self) -> &sdk::Descriptor {
        &self.descriptor
    }
    fn validate(&self, trainjob: &str, runtime: &str) -> Result<Validation, PluginError> {
        self.or_ignore(self.inner.validate(trainjob, runtime), Validation::default)
    }
    fn enforce_ml_policy(
        &self,
        info: RuntimeInfo,
        trainjob: &str,
    ) -> Result<RuntimeInfo, PluginError> {
        let kept = info.clone();
        self.or_ignore(self.inner.enforce_ml_policy(info, trainjob), || kept)
    }
    fn enforce_pod_group_policy(
        &self,
        info: RuntimeInfo,
        trainjob: &str,
    ) -> Result<RuntimeInfo, PluginError> {
        let kept = info.clone();
        self.or_ignore(self.inner.enforce_pod_group_policy(info, trainjob), || kept)
    }
    fn build(
        &self,
        info: &RuntimeInfo,
        trainjob: &str,
        target: &Target,
    ) -> Result<Vec<String>, PluginError> {
        self.or_ignore(self.inner.build(info, trainjob, target), Vec::new)
    }
    fn status(&self, trainjob: &str, observed: &str) -> Result<Option<String>, PluginError> {
        self.or_ignore(self.inner.status(trainjob, observed), || None)
    }
}

/// What became of one object on this replica.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The object's `metadata.generation` this is for.
    pub generation: i64,
    pub result: Result<Serving, LoadFailure>,
    /// The version serving while `result` is a failure (an earlier one).
    pub still_serving: Option<Serving>,
}

/// A plugin serving: its digest and what it says of itself (as the
/// status's `plugin`).
#[derive(Debug, Clone, PartialEq)]
pub struct Serving {
    pub digest: String,
    pub plugin: Value,
}

impl Serving {
    fn of(digest: String, descriptor: &sdk::Descriptor, builtin: bool) -> Serving {
        Serving {
            digest,
            plugin: json!({
                "name": descriptor.name,
                "version": descriptor.version,
                "frameworks": descriptor.frameworks,
                "podGroupPolicies": descriptor.pod_group_policies,
                "phases": phase_names(descriptor.capabilities),
                "builtin": builtin,
            }),
        }
    }
}

struct Entry {
    uid: String,
    generation: i64,
    plugin: Option<Arc<dyn PhasePlugin>>,
    serving: Option<Serving>,
    /// The last load failed and may succeed if tried again.
    retry: bool,
}

/// The `TrainerPlugin` objects of the store, loaded into the registry.
pub struct ObjectPlugins {
    registry: Arc<Registry>,
    sources: Arc<super::sources::Sources>,
    entries: Mutex<HashMap<String, Entry>>,
    outcomes: watch::Sender<BTreeMap<String, Outcome>>,
}

impl ObjectPlugins {
    pub fn new(
        registry: Arc<Registry>,
        sources: Arc<super::sources::Sources>,
    ) -> Arc<ObjectPlugins> {
        Arc::new(ObjectPlugins {
            registry,
            sources,
            entries: Mutex::new(HashMap::new()),
            outcomes: watch::Sender::new(BTreeMap::new()),
        })
    }

    /// What became of each object (by name), as it changes.
    pub fn outcomes(&self) -> watch::Receiver<BTreeMap<String, Outcome>> {
        self.outcomes.subscribe()
    }

    /// Loads what `store` holds now.
    pub async fn load_now(&self, store: &dyn Store) {
        let (objects, _) = store.list(RESOURCE, None);
        self.reconcile(objects.iter().map(|o| o.value.as_ref()))
            .await;
    }

    /// Loads what `store` holds, then follows it until `stop`.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        let mut retry = tokio::time::interval(RETRY);
        retry.tick().await;
        loop {
            let (objects, rv) = store.list(RESOURCE, None);
            self.reconcile(objects.iter().map(|o| o.value.as_ref()))
                .await;
            let mut watch = match store.watch(RESOURCE, None, Some(rv)) {
                Ok(watch) => watch,
                Err(e) => {
                    tracing::warn!(error = %e, "watching TrainerPlugins; listing again");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        () = &mut stop => return,
                    }
                }
            };
            let mut changed = !watch.replay.is_empty();
            loop {
                if changed {
                    // Objects are few: a relist sees every change up to now.
                    let (objects, _) = store.list(RESOURCE, None);
                    self.reconcile(objects.iter().map(|o| o.value.as_ref()))
                        .await;
                }
                tokio::select! {
                    event = watch.live.recv() => match event {
                        Ok(_) => changed = true,
                        // Lagged or closed: list again.
                        Err(_) => break,
                    },
                    _ = retry.tick() => changed = true,
                    () = &mut stop => return,
                }
            }
        }
    }

    /// Brings the loaded set to `objects`: loads new and changed ones (and
    /// failed ones worth retrying), drops removed ones, publishes.
    pub async fn reconcile<'a>(&self, objects: impl Iterator<Item = &'a Value>) {
        let objects: Vec<&Value> = objects.collect();
        let mut todo = Vec::new();
        {
            let entries = lock(&self.entries);
            for object in &objects {
                let Some((name, uid, generation)) = identity(object) else {
                    continue;
                };
                let current = entries.get(name);
                let unchanged = current.is_some_and(|e| e.uid == uid && e.generation == generation);
                if !unchanged || current.is_some_and(|e| e.retry) {
                    todo.push((*object).clone());
                }
            }
        }
        // Objects not serving yet hold the TrainJobs they may be for (see
        // `Loading`) until their first load ends, either way.
        let loading: Vec<Loading> = {
            let entries = lock(&self.entries);
            todo.iter()
                .filter(|o| {
                    // A first attempt (a retry of the same generation
                    // holds nothing: the object says why it failed).
                    identity(o).is_some_and(|(name, uid, generation)| {
                        entries.get(name).is_none_or(|e| {
                            e.uid != uid || (e.plugin.is_none() && e.generation != generation)
                        })
                    }) && !o["spec"]["module"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("builtin:"))
                })
                .filter_map(|o| {
                    Some(Loading {
                        name: identity(o)?.0.to_string(),
                        frameworks: o["spec"]["frameworks"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|f| f.as_str().map(str::to_string))
                            .collect(),
                    })
                })
                .collect()
        };
        self.registry.set_loading(loading);
        let mut outcomes = self.outcomes.borrow().clone();
        for object in todo {
            let Some((name, uid, generation)) = identity(&object) else {
                continue;
            };
            let (name, uid) = (name.to_string(), uid.to_string());
            let loaded = self.load(&object).await;
            let mut entries = lock(&self.entries);
            let entry = entries.entry(name.clone()).or_insert_with(|| Entry {
                uid: uid.clone(),
                generation,
                plugin: None,
                serving: None,
                retry: false,
            });
            if entry.uid != uid {
                // Another object of the same name: nothing of the old one serves.
                entry.plugin = None;
                entry.serving = None;
            }
            entry.uid = uid;
            entry.generation = generation;
            let outcome = match loaded {
                Ok(Some((plugin, serving))) => {
                    tracing::info!(object = %name, plugin = %plugin.id(), "TrainerPlugin loaded");
                    entry.plugin = Some(plugin);
                    entry.serving = Some(serving.clone());
                    entry.retry = false;
                    Outcome {
                        generation,
                        result: Ok(serving),
                        still_serving: None,
                    }
                }
                Ok(None) => {
                    entry.retry = false;
                    continue;
                }
                Err(failure) => {
                    tracing::warn!(object = %name, reason = failure.reason, error = %failure.message, "TrainerPlugin not loaded");
                    entry.retry = failure.transient;
                    Outcome {
                        generation,
                        result: Err(failure),
                        still_serving: entry.serving.clone(),
                    }
                }
            };
            outcomes.insert(name, outcome);
        }
        let present: Vec<&str> = objects
            .iter()
            .filter_map(|o| identity(o))
            .map(|(n, ..)| n)
            .collect();
        let plugins: Vec<Arc<dyn PhasePlugin>> = {
            let mut entries = lock(&self.entries);
            entries.retain(|name, _| present.contains(&name.as_str()));
            let mut named: Vec<(&String, &Entry)> = entries.iter().collect();
            named.sort_by(|a, b| a.0.cmp(b.0));
            named
                .into_iter()
                .filter_map(|(_, e)| e.plugin.clone())
                .collect()
        };
        outcomes.retain(|name, _| present.contains(&name.as_str()));
        self.registry.set_object_plugins(plugins);
        self.registry.set_loading(Vec::new());
        self.outcomes.send_if_modified(|current| {
            let changed = *current != outcomes;
            *current = outcomes;
            changed
        });
    }

    /// Fetches, checks and loads one object's module; `None` for the
    /// built-ins' objects (the hub serves those itself).
    async fn load(
        &self,
        object: &Value,
    ) -> Result<Option<(Arc<dyn PhasePlugin>, Serving)>, LoadFailure> {
        let spec: Spec = serde_json::from_value(object["spec"].clone())
            .map_err(|e| LoadFailure::new(REASON_INVALID, format!("spec: {e}")))?;
        if spec.module.starts_with("builtin:") {
            return Ok(None);
        }
        let fetched = self.sources.fetch(&spec).await?;
        let bytes = fetched.bytes;
        let settings = spec.settings.clone().unwrap_or_else(|| json!({}));
        let host = self.registry.host().clone();
        let source = spec.module.clone();
        let limits = spec.limits();
        let loaded =
            tokio::task::spawn_blocking(move || host.load(&source, &bytes, &settings, limits))
                .await
                .map_err(|e| {
                    LoadFailure::transient(
                        REASON_COMPILE_FAILED,
                        format!("the load task failed: {e}"),
                    )
                })?;
        let plugin = loaded.map_err(|e| match e {
            PluginError::Settings { .. } => {
                LoadFailure::new(REASON_SETTINGS_REJECTED, e.to_string())
            }
            e if e.is_transient() => LoadFailure::transient(REASON_COMPILE_FAILED, e.to_string()),
            e => LoadFailure::new(REASON_COMPILE_FAILED, e.to_string()),
        })?;
        self.registry.retain(plugin.clone());
        let configured = Configured::new(plugin, &spec)?;
        let serving = Serving::of(fetched.module_digest, configured.descriptor(), false);
        Ok(Some((Arc::new(configured), serving)))
    }
}

/// (name, uid, generation) of an object.
fn identity(object: &Value) -> Option<(&str, &str, i64)> {
    let meta = &object["metadata"];
    Some((
        meta["name"].as_str()?,
        meta["uid"].as_str().unwrap_or_default(),
        meta["generation"].as_i64().unwrap_or(0),
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The object listing the built-in `plugin`.
pub fn builtin_object(plugin: &dyn PhasePlugin) -> Value {
    let name = &plugin.id().name;
    json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": KIND,
        "metadata": {
            "name": format!("builtin-{name}"),
            "labels": {LABEL_BUILTIN: "true"},
        },
        "spec": {
            "module": format!("builtin:{name}"),
            "sha256": plugin.id().digest.trim_start_matches("sha256:"),
        },
    })
}

/// The status an object should have, from this replica's outcome; builtin
/// objects are Ready with the built-in's description.
fn desired_status(
    object: &Value,
    outcome: Option<&Outcome>,
    builtins: &[Arc<dyn PhasePlugin>],
    now: &str,
) -> Option<Value> {
    let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
    let module = object["spec"]["module"].as_str().unwrap_or_default();
    let (ready, reason, message, serving) = if let Some(name) = module.strip_prefix("builtin:") {
        let builtin = builtins.iter().find(|b| b.id().name == name)?;
        let serving = Serving::of(builtin.id().digest.clone(), builtin.descriptor(), true);
        (
            true,
            REASON_BUILTIN,
            "built into the hub".to_string(),
            Some(serving),
        )
    } else {
        let outcome = outcome.filter(|o| o.generation == generation)?;
        match &outcome.result {
            Ok(serving) => (
                true,
                REASON_LOADED,
                "loaded".to_string(),
                Some(serving.clone()),
            ),
            Err(f) => {
                let message = match &outcome.still_serving {
                    Some(s) => format!(
                        "{} (the earlier version {} keeps serving)",
                        f.message, s.digest
                    ),
                    None => f.message.clone(),
                };
                (false, f.reason, message, outcome.still_serving.clone())
            }
        }
    };
    let old = &object["status"];
    let old_ready = old["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    let status_word = if ready { "True" } else { "False" };
    let transition = match old_ready {
        Some(c) if c["status"] == status_word => c["lastTransitionTime"].clone(),
        _ => Value::from(now),
    };
    let mut status = json!({
        "observedGeneration": generation,
        "conditions": [{
            "type": "Ready",
            "status": status_word,
            "reason": reason,
            "message": message,
            "lastTransitionTime": transition,
            "observedGeneration": generation,
        }],
    });
    if let Some(s) = serving {
        status["digest"] = s.digest.into();
        status["plugin"] = s.plugin;
    }
    Some(status)
}

/// The leader's part: lists the built-ins as objects (created or brought
/// up to date; those of built-ins no longer in the hub removed), then
/// writes every object's status from `plugins`' outcomes, until `stop`.
pub async fn run_status(
    server: Arc<trainhub_apiserver::server::Server>,
    plugins: Arc<ObjectPlugins>,
    builtins: Vec<Arc<dyn PhasePlugin>>,
    stop: impl Future<Output = ()>,
) {
    let store = server.store().clone();
    if let Err(e) = install_builtins(&server, &builtins).await {
        tracing::warn!(error = %e, "listing the built-in plugins as TrainerPlugins");
    }
    let mut outcomes = plugins.outcomes();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tokio::pin!(stop);
    loop {
        let current = outcomes.borrow_and_update().clone();
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let (objects, _) = store.list(RESOURCE, None);
        for object in objects {
            let name = object.key.name.clone();
            let Some(status) = desired_status(&object.value, current.get(&name), &builtins, &now)
            else {
                continue;
            };
            if object.value.get("status") == Some(&status) {
                continue;
            }
            let mut value = object.value.as_ref().clone();
            value["status"] = status;
            match store
                .commit(vec![Op::Update {
                    key: object.key.clone(),
                    value,
                    expected: Some(object.rv),
                }])
                .await
            {
                Ok(_) | Err(StoreError::Conflict { .. } | StoreError::NotFound(_)) => {}
                Err(StoreError::Fenced(_)) => return,
                Err(e) => {
                    tracing::warn!(object = %name, error = %e, "writing a TrainerPlugin's status")
                }
            }
        }
        // Statuses also follow the objects (a new generation is written
        // once its outcome is in); the tick catches writes that conflicted.
        tokio::select! {
            r = outcomes.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
            () = &mut stop => return,
        }
    }
}

async fn install_builtins(
    server: &Arc<trainhub_apiserver::server::Server>,
    builtins: &[Arc<dyn PhasePlugin>],
) -> Result<(), String> {
    let objects = builtins
        .iter()
        .map(|b| builtin_object(b.as_ref()))
        .collect();
    put_hub_objects(server, LABEL_BUILTIN, objects).await
}

/// Makes the objects labelled `label: "true"` exactly `wanted` (each with
/// that label): creates the missing ones through the API (admission and
/// defaults as for any create), gives changed ones their new spec (a new
/// generation), removes the others. An object of a wanted name that is not
/// the hub's (an admin's) is left alone.
async fn put_hub_objects(
    server: &Arc<trainhub_apiserver::server::Server>,
    label: &str,
    wanted: Vec<Value>,
) -> Result<(), String> {
    let store = server.store();
    let (existing, _) = store.list(RESOURCE, None);
    let ours = |o: &Value| o["metadata"]["labels"][label] == "true";
    let mut ops = Vec::new();
    let mut problems = Vec::new();
    for object in &wanted {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let key = Key::new(RESOURCE, None, name);
        match existing.iter().find(|o| o.key == key) {
            Some(old) if !ours(&old.value) => {
                problems.push(format!(
                    "{name}: a TrainerPlugin of this name is not the hub's; left alone"
                ));
            }
            Some(old) if old.value["spec"] == object["spec"] => {}
            Some(old) => {
                let mut value = old.value.as_ref().clone();
                value["spec"] = object["spec"].clone();
                let generation = value["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
                value["metadata"]["generation"] = generation.into();
                ops.push(Op::Update {
                    key,
                    value,
                    expected: Some(old.rv),
                });
            }
            None => match server.create_object(object.clone()).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => problems.push(format!("{name}: {}", e.message)),
            },
        }
    }
    for old in &existing {
        let wanted_name = wanted
            .iter()
            .any(|w| w["metadata"]["name"].as_str() == Some(old.key.name.as_str()));
        if ours(&old.value) && !wanted_name {
            ops.push(Op::Remove {
                key: old.key.clone(),
            });
        }
    }
    if !ops.is_empty()
        && let Err(e) = store.commit(ops).await
    {
        problems.push(e.to_string());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Label of the objects made from the plugins directory.
pub const LABEL_PLUGINS_DIR: &str = "trainhub.kubeflow.org/plugins-dir";

/// The objects the plugins directory stands for: one per `NAME.wasm`,
/// named `NAME` (lowercase, `_` as `-`), the module its `file://` path pinned by its digest, the
/// settings and limits of its sidecar (`NAME.yaml`).
pub fn dir_objects(dir: &Path, digests: &mut Digests) -> (Vec<Value>, Vec<String>) {
    let mut problems = Vec::new();
    let mut listed = Vec::new();
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut unlisted = Vec::new();
    let components = super::registry::list_components(&dir, &mut unlisted);
    let seen = components.clone();
    for wasm in components {
        // An object's name is a DNS subdomain: `acme_plugin.wasm` is `acme-plugin`.
        let name = wasm
            .file_stem()
            .map(|s| s.to_string_lossy().to_lowercase().replace('_', "-"))
            .unwrap_or_default();
        let digest = match digests.of(&wasm) {
            Ok(d) => d,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let sidecar =
            match super::registry::sidecar_of(&wasm).map(|p| super::registry::read_sidecar(&p)) {
                Some(Ok(s)) => s,
                Some(Err(e)) => {
                    problems.push(e);
                    continue;
                }
                None => super::registry::Sidecar::default(),
            };
        let mut spec = json!({
            "module": format!("file://{}", wasm.display()),
            "sha256": digest,
        });
        if let Some(settings) = sidecar.settings {
            spec["settings"] = settings;
        }
        let mut limits = serde_json::Map::new();
        for (field, value) in [
            ("cpuMillis", sidecar.cpu_millis),
            ("wallClockMillis", sidecar.wall_clock_millis),
            ("memoryMiB", sidecar.memory_mib),
        ] {
            if let Some(v) = value {
                limits.insert(field.into(), v.into());
            }
        }
        if !limits.is_empty() {
            spec["limits"] = limits.into();
        }
        listed.push(json!({
            "apiVersion": format!("{GROUP}/v1alpha1"),
            "kind": KIND,
            "metadata": {"name": name, "labels": {LABEL_PLUGINS_DIR: "true"}},
            "spec": spec,
        }));
    }
    digests.keep(&seen);
    problems.extend(
        unlisted
            .into_iter()
            .map(|(p, e)| format!("{}: {e}", p.display())),
    );
    (listed, problems)
}

/// The sha256 of each module of the plugins directory, kept while its
/// modification time and length stay as they were (as the registry tells a
/// changed file): the directory is checked every few seconds, and a module
/// of megabytes is read and hashed again only when it changed.
#[derive(Debug, Default)]
pub struct Digests(HashMap<PathBuf, ((SystemTime, u64), String)>);

impl Digests {
    /// The hex sha256 of `wasm`, or why it cannot be had.
    fn of(&mut self, wasm: &Path) -> Result<String, String> {
        let problem = |e: std::io::Error| format!("{}: {e}", wasm.display());
        let stamp = super::registry::stat(wasm).map_err(problem)?;
        if let Some((known, digest)) = self.0.get(wasm)
            && *known == stamp
        {
            return Ok(digest.clone());
        }
        let too_big = |len: u64| {
            format!(
                "{}: {len} bytes, more than {MAX_MODULE_BYTES}",
                wasm.display()
            )
        };
        if stamp.1 > MAX_MODULE_BYTES as u64 {
            return Err(too_big(stamp.1));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(wasm)
            .and_then(|f| f.take(MAX_MODULE_BYTES as u64 + 1).read_to_end(&mut bytes))
            .map_err(problem)?;
        if bytes.len() > MAX_MODULE_BYTES {
            return Err(too_big(bytes.len() as u64));
        }
        let digest = hex::encode(sha2::Sha256::digest(&bytes));
        self.0.insert(wasm.to_path_buf(), (stamp, digest.clone()));
        Ok(digest)
    }

    /// Forgets the files not among `seen`.
    fn keep(&mut self, seen: &[PathBuf]) {
        self.0.retain(|path, _| seen.contains(path));
    }
}

/// Makes the objects of the plugins directory `dir` what it holds now.
///
/// # Errors
///
/// What could not be read or written, by file or object.
pub async fn sync_dir(
    server: &Arc<trainhub_apiserver::server::Server>,
    dir: &std::path::Path,
    digests: &mut Digests,
) -> Result<(), String> {
    let (objects, mut problems) = dir_objects(dir, digests);
    if let Err(e) = put_hub_objects(server, LABEL_PLUGINS_DIR, objects).await {
        problems.push(e);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// The leader's part for a plugins directory: keeps its objects in step
/// with it, checking every `interval`, until `stop`.
pub async fn run_dir(
    server: Arc<trainhub_apiserver::server::Server>,
    dir: PathBuf,
    interval: Duration,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut last_problem = None;
    let mut digests = Digests::default();
    loop {
        let result = sync_dir(&server, &dir, &mut digests).await.err();
        if result != last_problem {
            if let Some(problem) = &result {
                tracing::warn!(dir = %dir.display(), %problem, "plugins directory");
            }
            last_problem = result;
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = &mut stop => return,
        }
    }
}

/// Who the hub's own writes are made as (the API server's system user).
const SYSTEM_USER: &str = "system:trainhub";

fn is_builtin(object: &Value) -> bool {
    object["metadata"]["labels"][LABEL_BUILTIN] == "true"
        || object["spec"]["module"]
            .as_str()
            .is_some_and(|m| m.starts_with("builtin:"))
}

/// Admission of `TrainerPlugin`s: the built-ins' objects are the hub's
/// (read-only to everyone else), and a digest given twice must agree.
pub struct PluginAdmission {
    pub inner: Arc<dyn trainhub_apiserver::admission::Admission>,
}

impl trainhub_apiserver::admission::Admission for PluginAdmission {
    fn admit(
        &self,
        request: &trainhub_apiserver::admission::Request<'_>,
        object: &mut Value,
    ) -> Result<trainhub_apiserver::admission::Outcome, trainhub_apiserver::status::ApiError> {
        use trainhub_apiserver::admission::Operation;
        use trainhub_apiserver::status::ApiError;
        if request.resource.group != GROUP || request.resource.kind != KIND {
            return self.inner.admit(request, object);
        }
        let builtin = is_builtin(object) || request.old.is_some_and(is_builtin);
        if builtin && request.user.name != SYSTEM_USER && request.subresource.is_none() {
            return Err(ApiError::forbidden_because(
                GROUP,
                &request.resource.plural,
                request.name,
                "the built-in plugins' objects are the hub's own: they list what is built in and cannot be created, changed or deleted",
            ));
        }
        if request.operation != Operation::Delete && request.subresource.is_none() {
            let spec: Spec = serde_json::from_value(object["spec"].clone()).unwrap_or_default();
            if !builtin && let Err(e) = spec.digest() {
                return Err(ApiError::invalid(
                    GROUP,
                    KIND,
                    request.name,
                    &[trainhub_apiserver::field::FieldError::invalid(
                        "spec.sha256",
                        object["spec"]["sha256"].clone(),
                        e.message,
                    )],
                ));
            }
        }
        Ok(trainhub_apiserver::admission::Outcome::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_is_read_and_hashed_again_only_when_its_time_or_length_changed() {
        let dir = tempfile::tempdir().unwrap();
        let wasm = dir.path().join("p.wasm");
        let sha = |b: &[u8]| hex::encode(sha2::Sha256::digest(b));
        std::fs::write(&wasm, b"aaaa").unwrap();
        let mut digests = Digests::default();
        assert_eq!(digests.of(&wasm).unwrap(), sha(b"aaaa"));
        // The same length and time: the digest known, the file not read.
        let time = std::fs::metadata(&wasm).unwrap().modified().unwrap();
        let set_time = |t: SystemTime| {
            std::fs::File::options()
                .write(true)
                .open(&wasm)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        std::fs::write(&wasm, b"bbbb").unwrap();
        set_time(time);
        assert_eq!(digests.of(&wasm).unwrap(), sha(b"aaaa"));
        // Another time, or another length: read again.
        set_time(time + Duration::from_secs(1));
        assert_eq!(digests.of(&wasm).unwrap(), sha(b"bbbb"));
        std::fs::write(&wasm, b"ccccc").unwrap();
        set_time(time + Duration::from_secs(1));
        assert_eq!(digests.of(&wasm).unwrap(), sha(b"ccccc"));
        // A module over the limit is refused by its length, unread.
        let big = dir.path().join("big.wasm");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_MODULE_BYTES as u64 + 1)
            .unwrap();
        let e = digests.of(&big).unwrap_err();
        assert!(e.contains(&format!("more than {MAX_MODULE_BYTES}")), "{e}");
        // A file gone from the directory is forgotten.
        digests.keep(std::slice::from_ref(&wasm));
        assert_eq!(digests.0.len(), 1);
    }

    fn spec(value: Value) -> Spec {
        serde_json::from_value(value).unwrap()
    }

    #[tokio::test]
    async fn file_modules_are_regular_files_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.wasm");
        std::fs::write(&path, b"\0asm").unwrap();
        let module = format!("file://{}", path.display());
        assert_eq!(read_file_module(&module).await.unwrap(), b"\0asm");
        let dev = read_file_module("file:///dev/zero").await.unwrap_err();
        assert!(dev.message.contains("not a regular file"), "{dev:?}");
        let missing = read_file_module("file:///nonexistent/m.wasm")
            .await
            .unwrap_err();
        assert!(missing.transient && missing.reason == REASON_PULL_FAILED);
        let other = read_file_module("https://example.invalid/m.wasm")
            .await
            .unwrap_err();
        assert!(!other.transient);
        let big = dir.path().join("big.wasm");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_MODULE_BYTES as u64 + 1)
            .unwrap();
        let e = read_file_module(&format!("file://{}", big.display()))
            .await
            .unwrap_err();
        assert!(e.message.contains("more than"), "{e:?}");
    }

    #[test]
    fn the_digest_comes_from_sha256_or_the_reference_and_must_agree() {
        let d = "a".repeat(64);
        let e = "b".repeat(64);
        assert_eq!(
            spec(json!({"module": "file:///p.wasm", "sha256": d}))
                .digest()
                .unwrap(),
            d
        );
        let pinned = format!("oci://r.example/p:1@sha256:{}", d.to_uppercase());
        assert_eq!(spec(json!({"module": pinned})).digest().unwrap(), d);
        let both = spec(json!({"module": format!("oci://r/p@sha256:{d}"), "sha256": e}));
        assert_eq!(both.digest().unwrap_err().reason, REASON_INVALID);
        let none = spec(json!({"module": "https://x/p.wasm"}));
        assert!(
            none.digest()
                .unwrap_err()
                .message
                .contains("spec.sha256 is required")
        );
    }

    fn empty_info() -> RuntimeInfo {
        RuntimeInfo {
            labels: Vec::new(),
            annotations: Vec::new(),
            ml_policy: "{}".into(),
            pod_group_policy: None,
            framework: None,
            pod_sets: Vec::new(),
            template: "{}".into(),
        }
    }

    /// A native stand-in for a component, whose calls fail when `fail`.
    struct Fake {
        id: PluginId,
        descriptor: sdk::Descriptor,
        fail: bool,
    }

    impl Fake {
        fn plugin(fail: bool) -> Arc<dyn PhasePlugin> {
            Arc::new(Fake {
                id: PluginId {
                    name: "acme".into(),
                    digest: "sha256:00".into(),
                },
                descriptor: sdk::Descriptor::new("acme", "1.0.0")
                    .frameworks(["acme"])
                    .validates()
                    .builds(),
                fail,
            })
        }

        fn result<T>(&self, ok: T) -> Result<T, PluginError> {
            if self.fail {
                Err(PluginError::Load {
                    plugin: self.id.clone(),
                    reason: "trapped".into(),
                })
            } else {
                Ok(ok)
            }
        }
    }

    impl PhasePlugin for Fake {
        fn id(&self) -> &PluginId {
            &self.id
        }
        fn descriptor(&self) -> &sdk::Descriptor {
            &self.descriptor
        }
        fn validate(&self, _: &str, _: &str) -> Result<Validation, PluginError> {
            let mut v = Validation::default();
            v.warnings.push("checked".into());
            self.result(v)
        }
        fn enforce_ml_policy(
            &self,
            info: RuntimeInfo,
            _: &str,
        ) -> Result<RuntimeInfo, PluginError> {
            self.result(info)
        }
        fn enforce_pod_group_policy(
            &self,
            info: RuntimeInfo,
            _: &str,
        ) -> Result<RuntimeInfo, PluginError> {
            self.result(info)
        }
        fn build(&self, _: &RuntimeInfo, _: &str, _: &Target) -> Result<Vec<String>, PluginError> {
            self.result(vec!["{}".into()])
        }
        fn status(&self, _: &str, _: &str) -> Result<Option<String>, PluginError> {
            self.result(None)
        }
    }

    #[test]
    fn an_object_narrows_phases_and_names_frameworks() {
        let configured = Configured::new(
            Fake::plugin(false),
            &spec(json!({"module": "builtin:x", "phases": ["Build"], "frameworks": ["acme", "acme-v2"]})),
        )
        .unwrap();
        assert_eq!(configured.descriptor().capabilities, Capabilities::BUILD);
        assert_eq!(configured.descriptor().frameworks, ["acme", "acme-v2"]);
        let unimplemented = Configured::new(
            Fake::plugin(false),
            &spec(json!({"module": "builtin:x", "phases": ["Status"]})),
        )
        .err()
        .unwrap();
        assert!(
            unimplemented.message.contains("does not implement Status"),
            "{unimplemented:?}"
        );
        assert!(
            unimplemented.message.contains("Validate, Build"),
            "{unimplemented:?}"
        );
    }

    #[test]
    fn failure_policy_ignore_goes_on_without_the_plugin() {
        let ignore = Configured::new(
            Fake::plugin(true),
            &spec(json!({"module": "builtin:x", "failurePolicy": "Ignore"})),
        )
        .unwrap();
        assert!(ignore.validate("{}", "{}").unwrap().warnings.is_empty());
        assert!(
            ignore
                .build(&empty_info(), "{}", &sdk::testing::target("s"))
                .unwrap()
                .is_empty()
        );
        assert_eq!(ignore.status("{}", "{}").unwrap(), None);
        let fail =
            Configured::new(Fake::plugin(true), &spec(json!({"module": "builtin:x"}))).unwrap();
        assert!(fail.validate("{}", "{}").is_err());
        let fine = Configured::new(
            Fake::plugin(false),
            &spec(json!({"module": "builtin:x", "failurePolicy": "Ignore"})),
        )
        .unwrap();
        assert_eq!(fine.validate("{}", "{}").unwrap().warnings, ["checked"]);
    }

    #[test]
    fn status_says_ready_or_why_not_and_what_still_serves() {
        let object = json!({"metadata": {"name": "acme", "generation": 2},
            "spec": {"module": "file:///p.wasm", "sha256": "00"}});
        let serving = Serving::of("sha256:11".into(), Fake::plugin(false).descriptor(), false);
        let loaded = Outcome {
            generation: 2,
            result: Ok(serving.clone()),
            still_serving: None,
        };
        let now = "2026-11-26T00:00:00Z";
        let status = desired_status(&object, Some(&loaded), &[], now).unwrap();
        assert_eq!(status["conditions"][0]["status"], "True");
        assert_eq!(status["conditions"][0]["reason"], REASON_LOADED);
        assert_eq!(status["digest"], "sha256:11");
        assert_eq!(status["plugin"]["phases"], json!(["Validate", "Build"]));
        assert_eq!(status["observedGeneration"], 2);
        // An outcome of an older generation says nothing yet.
        let stale = Outcome {
            generation: 1,
            ..loaded.clone()
        };
        assert!(desired_status(&object, Some(&stale), &[], now).is_none());
        let failed = Outcome {
            generation: 2,
            result: Err(LoadFailure::transient(
                REASON_PULL_FAILED,
                "registry.example: connection refused",
            )),
            still_serving: Some(serving),
        };
        let status = desired_status(&object, Some(&failed), &[], now).unwrap();
        assert_eq!(status["conditions"][0]["status"], "False");
        assert_eq!(status["conditions"][0]["reason"], REASON_PULL_FAILED);
        assert!(
            status["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .ends_with("(the earlier version sha256:11 keeps serving)"),
            "{status}"
        );
        assert_eq!(status["digest"], "sha256:11");
        // The transition time stays while the condition does.
        let mut again = object.clone();
        again["status"] = status.clone();
        let later = desired_status(&again, Some(&failed), &[], "2027-01-01T00:00:00Z").unwrap();
        assert_eq!(later["conditions"][0]["lastTransitionTime"], now);
    }
}
