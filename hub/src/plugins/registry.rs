//! The set of active plugins: the built-ins plus a plugins directory that an
//! admin edits while the hub runs.
//!
//! The directory holds components (`NAME.wasm`) and optional sidecars
//! (`NAME.yaml` or `NAME.json`) with the plugin's settings and limits:
//!
//! ```yaml
//! settings: {team: ml-platform}   # any JSON/YAML value, validated by the plugin at load
//! cpuMillis: 1000                 # per-call CPU time budget (default 1000; alias timeoutMillis)
//! wallClockMillis: 30000          # per-call wall-clock last resort, retried when hit (default 30000)
//! memoryMiB: 64                   # per-call memory cap (default 64)
//! ```
//!
//! Changes take effect at the next [`Registry::rescan`] (the hub rescans on
//! a timer). Each scan publishes a new immutable [`Snapshot`]; a pipeline run
//! holds the snapshot it started with, so calls in flight finish on the
//! plugin version they started on. A plugin from the directory replaces the
//! built-in of the same name. A file that fails to load is reported and, if
//! an earlier version of it loaded, that version stays active.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::pipeline::PhasePlugin;
use super::{Host, Limits, PluginError};

/// One published set of plugins.
#[derive(Default)]
pub struct Snapshot {
    plugins: Vec<Arc<dyn PhasePlugin>>,
    problems: Vec<(PathBuf, String)>,
    loading: Vec<Loading>,
}

/// A `TrainerPlugin` whose module is being fetched and compiled for the
/// first time: until it serves, a TrainJob it may be for waits instead of
/// falling back to `plainml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loading {
    /// The object's name.
    pub name: String,
    /// Its `spec.frameworks`; empty when the object does not say (then
    /// every TrainJob that would fall back waits).
    pub frameworks: Vec<String>,
}

impl Snapshot {
    /// A snapshot of exactly these plugins.
    pub fn new(plugins: Vec<Arc<dyn PhasePlugin>>) -> Self {
        Snapshot {
            plugins,
            problems: Vec::new(),
            loading: Vec::new(),
        }
    }

    /// `TrainerPlugin`s loading for the first time.
    pub fn loading(&self) -> &[Loading] {
        &self.loading
    }

    pub fn plugins(&self) -> &[Arc<dyn PhasePlugin>] {
        &self.plugins
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn PhasePlugin>> {
        self.plugins.iter().find(|p| p.id().name == name)
    }

    /// Files in the plugins directory that did not load, with the reason.
    pub fn problems(&self) -> &[(PathBuf, String)] {
        &self.problems
    }
}

/// Settings and limits of one plugin file, from its sidecar.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Sidecar {
    #[serde(default)]
    pub settings: Option<serde_json::Value>,
    #[serde(alias = "timeoutMillis")]
    pub cpu_millis: Option<u64>,
    pub wall_clock_millis: Option<u64>,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    wasm: (SystemTime, u64),
    sidecar: Option<(PathBuf, SystemTime, u64)>,
}

struct Loaded {
    fingerprint: Fingerprint,
    plugin: Arc<dyn PhasePlugin>,
}

/// Built-in plugins plus the hot-reloaded plugins directory.
pub struct Registry {
    host: Arc<Host>,
    builtins: Vec<Arc<dyn PhasePlugin>>,
    dir: Option<PathBuf>,
    current: RwLock<Arc<Snapshot>>,
    files: Mutex<Files>,
    /// Plugins of `TrainerPlugin` objects (see [`super::objects`]), by
    /// object name; like the directory's, they replace built-ins of the
    /// same plugin name.
    objects: Mutex<Vec<Arc<dyn PhasePlugin>>>,
    /// Objects loading for the first time (see [`Loading`]).
    loading: Mutex<Vec<Loading>>,
    /// Every plugin version loaded since start, by digest: a TrainJob keeps
    /// the plugins it was admitted with (its runtime snapshot) after the
    /// directory replaced or removed them.
    retained: Mutex<HashMap<String, Arc<dyn PhasePlugin>>>,
}

/// What the last scans found, by path.
#[derive(Default)]
struct Files {
    loaded: HashMap<PathBuf, Loaded>,
    /// Files whose current version failed to load, so it is not retried
    /// until it changes.
    failed: HashMap<PathBuf, (Fingerprint, String)>,
}

impl Registry {
    /// A registry of `builtins` and, if given, the components in `dir`
    /// (scanned once now).
    pub fn new(host: Arc<Host>, builtins: Vec<Arc<dyn PhasePlugin>>, dir: Option<PathBuf>) -> Self {
        let registry = Registry {
            host,
            builtins: builtins.clone(),
            dir,
            current: RwLock::new(Arc::new(Snapshot::new(builtins.clone()))),
            files: Mutex::new(Files::default()),
            objects: Mutex::new(Vec::new()),
            loading: Mutex::new(Vec::new()),
            retained: Mutex::new(
                builtins
                    .into_iter()
                    .map(|p| (p.id().digest.clone(), p))
                    .collect(),
            ),
        };
        registry.rescan();
        registry
    }

    /// The plugins active now. Hold the `Arc` for the length of one pipeline
    /// run.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        match self.current.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Exactly the plugins `ids` names (by digest), loaded now or earlier
    /// since the hub started: what a TrainJob's runtime snapshot pins.
    ///
    /// # Errors
    ///
    /// Names the first plugin not loaded since the hub started (its file
    /// was replaced or removed before a restart): the TrainJob cannot be
    /// built or have its status mapped as admitted.
    pub fn pinned(&self, ids: &[super::PluginId]) -> Result<Snapshot, String> {
        let retained = lock(&self.retained);
        ids.iter()
            .map(|id| {
                retained
                    .get(&id.digest)
                    .filter(|p| p.id().name == id.name)
                    .cloned()
                    .ok_or_else(|| {
                        format!(
                            "{id}, which the TrainJob was admitted with, is no longer loaded \
                             (its file was replaced or removed before the hub restarted); \
                             restore it in the plugins directory or recreate the TrainJob"
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Snapshot::new)
    }

    pub fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// Reads the plugins directory and publishes a new snapshot if anything
    /// changed. Returns the snapshot now active.
    pub fn rescan(&self) -> Arc<Snapshot> {
        let Some(dir) = &self.dir else {
            return self.snapshot();
        };
        let mut files = match self.files.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut problems = Vec::new();
        let mut seen = Vec::new();
        let mut changed = false;
        for wasm in list_components(dir, &mut problems) {
            seen.push(wasm.clone());
            let fingerprint = match fingerprint(&wasm) {
                Ok(f) => f,
                Err(e) => {
                    problems.push((wasm, e));
                    continue;
                }
            };
            if files
                .loaded
                .get(&wasm)
                .is_some_and(|l| l.fingerprint == fingerprint)
            {
                continue;
            }
            if let Some((failed, problem)) = files.failed.get(&wasm)
                && *failed == fingerprint
            {
                problems.push((wasm, problem.clone()));
                continue;
            }
            match self.load_file(&wasm, &fingerprint) {
                Ok(plugin) => {
                    tracing::info!(file = %wasm.display(), plugin = %plugin.id(), "plugin loaded");
                    lock(&self.retained).insert(plugin.id().digest.clone(), plugin.clone());
                    files.failed.remove(&wasm);
                    files.loaded.insert(
                        wasm,
                        Loaded {
                            fingerprint,
                            plugin,
                        },
                    );
                    changed = true;
                }
                Err((e, transient)) => {
                    tracing::warn!(file = %wasm.display(), error = %e, "plugin not loaded");
                    // A load the host could not run now is retried at the
                    // next scan; any other failure waits for the file to
                    // change.
                    if !transient {
                        files.failed.insert(wasm.clone(), (fingerprint, e.clone()));
                    }
                    problems.push((wasm, e));
                }
            }
        }
        files.failed.retain(|path, _| seen.contains(path));
        let before = files.loaded.len();
        files.loaded.retain(|path, loaded| {
            let keep = seen.contains(path);
            if !keep {
                tracing::info!(file = %path.display(), plugin = %loaded.plugin.id(), "plugin removed");
            }
            keep
        });
        changed |= files.loaded.len() != before;

        let previous = self.snapshot();
        if !changed && previous.problems == problems {
            return previous;
        }
        self.publish(&files, problems)
    }

    /// Serves `plugins` (those of the `TrainerPlugin` objects) from now on,
    /// beside the built-ins and the directory's.
    pub fn set_object_plugins(&self, plugins: Vec<Arc<dyn PhasePlugin>>) {
        let files = lock(&self.files);
        *lock(&self.objects) = plugins;
        let problems = self.snapshot().problems.clone();
        self.publish(&files, problems);
    }

    /// Says which objects are loading for the first time (none: `vec![]`).
    pub fn set_loading(&self, loading: Vec<Loading>) {
        let files = lock(&self.files);
        if *lock(&self.loading) == loading {
            return;
        }
        *lock(&self.loading) = loading;
        let problems = self.snapshot().problems.clone();
        self.publish(&files, problems);
    }

    /// Keeps `plugin` by its digest for TrainJobs admitted with it (see
    /// [`Registry::pinned`]).
    pub fn retain(&self, plugin: Arc<dyn PhasePlugin>) {
        lock(&self.retained).insert(plugin.id().digest.clone(), plugin);
    }

    /// Publishes the snapshot of the built-ins, the directory's plugins and
    /// the objects' (a later source replaces a plugin of the same name).
    fn publish(&self, files: &Files, problems: Vec<(PathBuf, String)>) -> Arc<Snapshot> {
        let mut custom: Vec<Arc<dyn PhasePlugin>> =
            files.loaded.values().map(|l| l.plugin.clone()).collect();
        custom.sort_by(|a, b| a.id().name.cmp(&b.id().name));
        for plugin in lock(&self.objects).iter() {
            custom.retain(|c| c.id().name != plugin.id().name);
            custom.push(plugin.clone());
        }
        let mut plugins: Vec<Arc<dyn PhasePlugin>> = self
            .builtins
            .iter()
            .filter(|b| !custom.iter().any(|c| c.id().name == b.id().name))
            .cloned()
            .collect();
        plugins.extend(custom);
        let snapshot = Arc::new(Snapshot {
            plugins,
            problems,
            loading: lock(&self.loading).clone(),
        });
        match self.current.write() {
            Ok(mut s) => *s = snapshot.clone(),
            Err(poisoned) => *poisoned.into_inner() = snapshot.clone(),
        }
        snapshot
    }

    /// The built-in plugins.
    pub fn builtins(&self) -> &[Arc<dyn PhasePlugin>] {
        &self.builtins
    }

    /// Rescans every `interval` on a background thread, for as long as the
    /// registry lives.
    pub fn watch(self: &Arc<Self>, interval: Duration) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("plugin-watch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(interval);
                    match weak.upgrade() {
                        Some(registry) => {
                            registry.rescan();
                        }
                        None => break,
                    }
                }
            })
            .map(|_| ())
    }

    fn load_file(
        &self,
        wasm: &Path,
        fingerprint: &Fingerprint,
    ) -> Result<Arc<dyn PhasePlugin>, (String, bool)> {
        let sidecar = match &fingerprint.sidecar {
            Some((path, _, _)) => read_sidecar(path).map_err(|e| (e, false))?,
            None => Sidecar::default(),
        };
        let bytes =
            std::fs::read(wasm).map_err(|e| (format!("reading {}: {e}", wasm.display()), false))?;
        let limits = Limits::with(
            sidecar.cpu_millis,
            sidecar.wall_clock_millis,
            sidecar.memory_mib,
        );
        let settings = sidecar
            .settings
            .unwrap_or_else(|| serde_json::Value::Object(Default::default()));
        let source = wasm
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.host
            .load(&source, &bytes, &settings, limits)
            .map(|p| p as Arc<dyn PhasePlugin>)
            .map_err(|e: PluginError| (e.to_string(), e.is_transient()))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn list_components(dir: &Path, problems: &mut Vec<(PathBuf, String)>) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            problems.push((dir.to_path_buf(), format!("cannot list: {e}")));
            return Vec::new();
        }
    };
    let mut wasm: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    wasm.sort();
    wasm
}

/// A file's modification time and length: what tells a changed file.
pub(crate) fn stat(path: &Path) -> std::io::Result<(SystemTime, u64)> {
    let meta = std::fs::metadata(path)?;
    Ok((meta.modified()?, meta.len()))
}

/// The sidecar of a component (`NAME.yaml`, `.yml` or `.json`), if any.
pub(crate) fn sidecar_of(wasm: &Path) -> Option<PathBuf> {
    ["yaml", "yml", "json"]
        .iter()
        .map(|ext| wasm.with_extension(ext))
        .find(|p| p.exists())
}

fn fingerprint(wasm: &Path) -> Result<Fingerprint, String> {
    let wasm_stat = stat(wasm).map_err(|e| format!("{}: {e}", wasm.display()))?;
    let sidecar = sidecar_of(wasm)
        .map(|p| {
            stat(&p)
                .map(|(t, l)| (p.clone(), t, l))
                .map_err(|e| format!("{}: {e}", p.display()))
        })
        .transpose()?;
    Ok(Fingerprint {
        wasm: wasm_stat,
        sidecar,
    })
}

pub(crate) fn read_sidecar(path: &Path) -> Result<Sidecar, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        serde_saphyr::from_str(&text).map_err(|e| e.to_string())
    };
    parsed.map_err(|e| {
        format!(
            "{}: {e} (expected keys: settings, cpuMillis, wallClockMillis, memoryMiB)",
            path.display()
        )
    })
}
