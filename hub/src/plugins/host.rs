//! The wasmtime sandbox that runs pipeline plugins.
//!
//! One [`Engine`] per hub. A component is compiled once per sha256 digest
//! (kept in memory by moka, and on disk in the compilation cache so a
//! restart reuses the machine code) and pre-linked into an `InstancePre`.
//! With a cache directory the machine code is mapped from its cache file
//! rather than copied into the heap: only the pages calls execute are
//! resident, and they are the page cache's, shared and reclaimable
//! (docs/benchmarks.md, "The idle hub"). Every call
//! gets a fresh [`Store`] and a fresh instance: no state leaks between
//! TrainJobs, and a plugin that traps, loops or exhausts its memory fails that
//! call only.
//!
//! # Limits
//!
//! What stops a runaway plugin is CPU time, not wall-clock time: each call
//! has a budget of CPU time spent by the thread that runs it (its own
//! execution: instantiation, wasm, the host functions it calls), checked at
//! every epoch tick (10 ms) through an epoch-deadline callback. A busy
//! machine slows a call down but does not use up its budget, so a plugin
//! fails a TrainJob only for what it does itself ([`PluginError::CpuExhausted`]).
//! A generous wall-clock bound (queueing included) stays as the last resort;
//! its expiry is the host's fault, reported as [`PluginError::Deferred`],
//! which callers retry.
//!
//! # Threads
//!
//! A call runs on the thread that makes it, without a hop. On a
//! multi-threaded tokio runtime's worker, a call that starts at once runs
//! there, and if it is still running at the next epoch tick (at most
//! [`TICK`] later; a call takes tens of microseconds) the worker hands its
//! other tasks to another thread (`block_in_place`) and finishes the call
//! as a blocking thread: API requests keep being served while a plugin
//! runs long, and the usual short call does not pay for a hand-off (a
//! blocking thread woken per call: a third of the dispatch bench's futex
//! calls and context switches when every call paid it; `docs/benchmarks.md`). A
//! call that must wait for its turn hands the worker's tasks off before it
//! waits. A call from a current-thread runtime (whose only thread must not
//! block) runs on one of the host's own plugin threads; a call from a plain
//! thread runs there.
//! At most as many calls as there are plugin threads run at once, wherever
//! they run; at most [`PLUGIN_QUEUE`] more wait for their turn, and a
//! further call is refused at once as [`PluginError::Deferred`] (the host
//! is saturated).
//!
//! # Instances
//!
//! Instances come from wasmtime's pooling allocator: a fixed set of slots
//! whose address space is reserved once and whose linear memories are reset
//! (only the pages a call dirtied) when the call ends, with the component's
//! initial memory mapped copy-on-write. A fresh instance per call therefore
//! costs microseconds rather than an `mmap`, page faults and an `munmap`.
//! At most [`CONCURRENT_CALLS`] calls run at once; a further call waits for a
//! slot. Where the pool's address space cannot be reserved, the host falls
//! back to allocating each instance on demand, with the same guarantees.
//!
//! Capabilities are denied by default. The only imports satisfied are the
//! `trainhub:plugin/host` interface and the inert parts of WASI that Rust's
//! standard library links into every `wasm32-wasip2` component: an empty
//! environment, an empty stdin, stdout/stderr captured into the hub's log
//! (bounded), `exit`, which ends the call, and `random/insecure-seed`, which
//! std uses to seed `HashMap` hashing. A component importing anything else
//! (filesystem, sockets, clocks, secure random, HTTP ...) is refused at load.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use trainhub_plugin_sdk as sdk;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, HasSelf, InstancePre, Lift, Linker, Lower,
    ResourceTable,
};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter,
    Store, UpdateDeadline,
};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{self, Level, PluginPre, wit};
use super::convert::Convert;
use super::{Phase, PluginError, PluginId};

/// How often a running call's CPU time and wall-clock time are checked.
const TICK: Duration = Duration::from_millis(10);
/// Calls that may wait for their turn to run; a further call is deferred.
pub const PLUGIN_QUEUE: usize = 1024;
/// Bytes of a plugin's stdout/stderr kept per call.
const STDIO_CAPTURE: usize = 64 * 1024;
/// Upper bound on one `random-bytes` request.
const MAX_RANDOM_BYTES: u32 = 4096;

/// Plugin calls that may run at once (each holds one instance of the pool).
pub const CONCURRENT_CALLS: u32 = 64;
/// What one component instance may hold. A Rust plugin has one memory, two
/// tables and three core instances; other toolchains use a few more.
const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 8;
const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
/// Table elements a table may have, as [`MemoryCap`] allows it to grow.
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Bytes of a linear memory reset in place (rather than unmapped) when a
/// call ends, so the next call on that slot takes no page faults there.
/// Only pages the call dirtied are reset.
const KEEP_RESIDENT: usize = 2 << 20;

/// Interfaces a plugin may import, by name without version. Everything else
/// is refused at load.
const GRANTED_IMPORTS: &[&str] = &[
    "trainhub:plugin/types",
    "trainhub:plugin/host",
    // Linked by Rust's std into every wasm32-wasip2 component; satisfied inertly.
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    // Seeds std's HashMap hashing; not a source of secure randomness.
    "wasi:random/insecure-seed",
];

/// Resource limits of one plugin's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPU time one call may spend; past it the call fails as the plugin's
    /// own fault. The slowest built-in call needs well under a millisecond
    /// (docs/benchmarks.md).
    pub cpu: Duration,
    /// Wall-clock bound of one call, waiting for its turn included:
    /// the last resort against an overloaded host. Past it the call is
    /// deferred (retried later), not failed.
    pub wall: Duration,
    /// Linear memory cap of one call's instance, in bytes.
    pub memory: usize,
}

impl Limits {
    /// The defaults, with what a plugin's configuration sets: CPU and
    /// wall-clock milliseconds, memory in MiB.
    pub fn with(
        cpu_millis: Option<u64>,
        wall_clock_millis: Option<u64>,
        memory_mib: Option<u64>,
    ) -> Limits {
        let d = Limits::default();
        Limits {
            cpu: cpu_millis.map(Duration::from_millis).unwrap_or(d.cpu),
            wall: wall_clock_millis
                .map(Duration::from_millis)
                .unwrap_or(d.wall),
            memory: memory_mib
                .and_then(|m| m.checked_mul(1 << 20))
                .and_then(|b| usize::try_from(b).ok())
                .unwrap_or(d.memory),
        }
    }
}

impl Default for Limits {
    /// One second of CPU, 30 seconds of wall-clock time, 64 MiB.
    fn default() -> Self {
        Limits {
            cpu: Duration::from_secs(1),
            wall: Duration::from_secs(30),
            memory: 64 << 20,
        }
    }
}

/// Host-wide settings.
#[derive(Debug, Clone, Default)]
pub struct HostConfig {
    /// Where compiled machine code is kept across restarts; `None` keeps it
    /// in memory only.
    pub cache_dir: Option<PathBuf>,
    /// Threads that execute plugin calls; 0 picks twice the CPUs (at least
    /// 4, at most [`CONCURRENT_CALLS`]).
    pub threads: usize,
}

/// The plugin sandbox: one engine, compiled components by digest.
pub struct Host {
    engine: Engine,
    linker: Arc<Linker<CallState>>,
    compiled: moka::sync::Cache<[u8; 32], Component>,
    /// Compiled components, one file per digest (see [`Host::compile`]).
    cache_dir: Option<PathBuf>,
    ticker: Arc<AtomicBool>,
    /// Free instance slots, when instances come from the pool.
    slots: Option<Arc<Slots>>,
    threads: Arc<Threads>,
}

impl Drop for Host {
    fn drop(&mut self) {
        self.ticker.store(false, Ordering::Relaxed);
        self.threads.close();
    }
}

impl Host {
    pub fn new(config: &HostConfig) -> Result<Self, PluginError> {
        let mut wasm = Config::new();
        wasm.wasm_component_model(true)
            .epoch_interruption(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            // Guard pages, not bounds checks compiled into the plugins'
            // code (13% of the pipeline bench's time through them). A
            // slot's memory is made inaccessible past its initial size when
            // an instance is created, and accessible again if a call grows
            // it: two `mprotect`s, each taking the process's memory map lock
            // for writing. The SDK's arena keeps a call within the initial
            // memory, so the built-ins grow none: about a thousand
            // `mprotect`s in a saturated bench run of 70,000 calls
            // (docs/benchmarks.md).
            .memory_init_cow(true);
        // `perf` names the plugins' machine code with this set (see
        // docs/benchmarks.md); no effect otherwise.
        if std::env::var_os("TRAINHUB_WASM_PERFMAP").is_some() {
            wasm.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let cache_dir = match &config.cache_dir {
            // Absolute: a relative directory (`--data-dir .trainhub`) is
            // taken from the working directory at start.
            Some(dir) => Some(std::path::absolute(dir).map_err(|e| {
                PluginError::Host(format!("compilation cache {}: {e}", dir.display()))
            })?),
            None => None,
        };
        wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool_config()));
        let (engine, slots) = match Engine::new(&wasm) {
            Ok(engine) => (engine, Some(Arc::new(Slots::new(CONCURRENT_CALLS)))),
            Err(pool_error) => {
                tracing::warn!(error = %format!("{pool_error:#}"), "plugin instance pool unavailable; allocating instances on demand");
                wasm.allocation_strategy(InstanceAllocationStrategy::OnDemand);
                let engine = Engine::new(&wasm)
                    .map_err(|e| PluginError::Host(format!("wasmtime engine: {e}")))?;
                (engine, None)
            }
        };

        let mut linker = Linker::new(&engine);
        bindings::Plugin::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)
            .map_err(|e| PluginError::Host(format!("linking host interface: {e}")))?;
        add_inert_wasi(&mut linker)
            .map_err(|e| PluginError::Host(format!("linking inert WASI: {e}")))?;

        let ticker = Arc::new(AtomicBool::new(true));
        let weak = engine.weak();
        let running = ticker.clone();
        std::thread::Builder::new()
            .name("plugin-epoch".into())
            .spawn(move || {
                while running.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| PluginError::Host(format!("epoch thread: {e}")))?;

        let threads = match config.threads {
            0 => std::thread::available_parallelism()
                .map_or(2, usize::from)
                .saturating_mul(2)
                .clamp(4, CONCURRENT_CALLS as usize),
            n => n.min(CONCURRENT_CALLS as usize),
        };
        let threads = Threads::start(threads, PLUGIN_QUEUE)
            .map_err(|e| PluginError::Host(format!("plugin threads: {e}")))?;

        let host = Host {
            engine,
            linker: Arc::new(linker),
            compiled: moka::sync::Cache::new(256),
            cache_dir,
            ticker,
            slots,
            threads,
        };
        host.forget_other_engines();
        Ok(host)
    }

    /// Removes from the compilation cache the machine code compiled by
    /// other engines (another wasmtime, other settings): no engine of this
    /// hub reads it again, and each upgrade would otherwise leave a copy of
    /// every plugin behind. Only files named as the cache names them are
    /// touched.
    fn forget_other_engines(&self) {
        let Some(dir) = &self.cache_dir else { return };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let ours = format!("-{:016x}.cwasm", self.engine_hash());
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let cache_named = name.len() == 64 + 1 + 16 + 6
                && name.ends_with(".cwasm")
                && name.as_bytes()[64] == b'-'
                && name[..64].bytes().all(|b| b.is_ascii_hexdigit())
                && name[65..81].bytes().all(|b| b.is_ascii_hexdigit());
            if cache_named && !name.ends_with(&ours) && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(removed, dir = %dir.display(), "plugin compilation cache: removed what other engines compiled");
        }
    }

    /// The engine's compatibility hash, as the cache's file names carry it.
    fn engine_hash(&self) -> u64 {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        h.finish()
    }

    /// Whether instances come from the pool (else they are allocated on
    /// demand, see the module docs).
    pub fn pooled(&self) -> bool {
        self.slots.is_some()
    }

    /// Compiles (or finds compiled) `wasm`, checks what it imports, asks it
    /// to describe itself and validates `settings` with it.
    ///
    /// `source` names the component in errors (a file name, say).
    pub fn load(
        &self,
        source: &str,
        wasm: &[u8],
        settings: &serde_json::Value,
        limits: Limits,
    ) -> Result<Arc<LoadedPlugin>, PluginError> {
        let digest: [u8; 32] = Sha256::digest(wasm).into();
        self.load_digested(source, digest, wasm, settings, limits)
    }

    /// As [`Host::load`], with the sha256 `digest` of `wasm` known already
    /// (the built-ins' is computed at build time): `wasm` is read only when
    /// no compiled copy is cached, so a restart does not touch its pages.
    pub fn load_digested(
        &self,
        source: &str,
        digest: [u8; 32],
        wasm: &[u8],
        settings: &serde_json::Value,
        limits: Limits,
    ) -> Result<Arc<LoadedPlugin>, PluginError> {
        let id = PluginId {
            name: source.to_string(),
            digest: format!("sha256:{}", hex::encode(digest)),
        };
        let component = self
            .compiled
            .try_get_with(digest, || self.compile(digest, wasm))
            .map_err(|reason| PluginError::Load {
                plugin: id.clone(),
                reason: format!("not a valid WebAssembly component: {reason}"),
            })?;

        let ty = component.component_type();
        let refused: Vec<String> = ty
            .imports(&self.engine)
            .map(|(import, _)| import)
            .filter(|import| {
                let interface = import.split('@').next().unwrap_or(import);
                !GRANTED_IMPORTS.contains(&interface)
            })
            .map(str::to_string)
            .collect();
        if !refused.is_empty() {
            return Err(PluginError::ForbiddenImport {
                plugin: id,
                imports: refused,
            });
        }
        let not_a_plugin = |e: wasmtime::Error| PluginError::Load {
            plugin: id.clone(),
            reason: format!("does not implement trainhub:plugin/plugin@0.1.0: {e:#}"),
        };
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(not_a_plugin)?;
        // Checks every export of the world against its WIT type, once.
        PluginPre::new(pre.clone()).map_err(not_a_plugin)?;
        let exports = Exports::of(&component).map_err(not_a_plugin)?;

        let mut plugin = LoadedPlugin {
            id,
            descriptor: sdk::Descriptor::new("", ""),
            settings: settings.to_string(),
            limits,
            pre,
            exports,
            engine: self.engine.clone(),
            slots: self.slots.clone(),
            threads: self.threads.clone(),
        };
        let (descriptor,): (wit::Descriptor,) =
            plugin.call(Phase::Startup, plugin.exports.describe, ())?;
        let descriptor: sdk::Descriptor = descriptor.convert();
        check_descriptor(&plugin.id, &descriptor)?;
        plugin.id.name = descriptor.name.clone();
        plugin.descriptor = descriptor;
        let (errors,): (Vec<wit::FieldError>,) = plugin.call(
            Phase::Startup,
            plugin.exports.validate_settings,
            (plugin.settings.clone(),),
        )?;
        let errors: Vec<sdk::FieldError> = errors.convert();
        if !errors.is_empty() {
            return Err(PluginError::Settings {
                plugin: plugin.id,
                errors,
            });
        }
        Ok(Arc::new(plugin))
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The compilation cache's directory, if the host has one.
    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.cache_dir.as_deref()
    }

    /// Whether the machine code of the component whose sha256 is `digest`
    /// is in the compilation cache, for this engine.
    pub fn is_cached(&self, digest: [u8; 32]) -> bool {
        self.cache_file(digest).is_some_and(|f| f.exists())
    }

    /// The cache file of `digest`: named by the component's digest and the
    /// engine's compatibility hash (another wasmtime or other compilation
    /// settings use other files).
    fn cache_file(&self, digest: [u8; 32]) -> Option<PathBuf> {
        let dir = self.cache_dir.as_ref()?;
        Some(dir.join(format!(
            "{}-{:016x}.cwasm",
            hex::encode(digest),
            self.engine_hash()
        )))
    }

    /// The component of `wasm` (whose sha256 is `digest`): mapped from its
    /// cache file when there is one, else compiled, written to the cache
    /// (atomically: a crash leaves no partial file under the final name)
    /// and mapped from there. Without a cache directory, or when the cache
    /// cannot be written, the compiled code stays in memory.
    fn compile(&self, digest: [u8; 32], wasm: &[u8]) -> Result<Component, String> {
        let (Some(dir), Some(file)) = (&self.cache_dir, self.cache_file(digest)) else {
            return Component::new(&self.engine, wasm).map_err(|e| format!("{e:#}"));
        };
        if file.exists() {
            match map_compiled(&self.engine, &file) {
                Ok(component) => {
                    // Loading read the whole image; calls bring back the
                    // pages they run.
                    crate::memory::page_out(component.image_range());
                    return Ok(component);
                }
                // Unreadable or from another build: compiled again below.
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %format!("{e:#}"), "compiled plugin cache entry unusable; compiling again")
                }
            }
        }
        let component = Component::new(&self.engine, wasm).map_err(|e| format!("{e:#}"))?;
        let written = component
            .serialize()
            .map_err(|e| format!("{e:#}"))
            .and_then(|bytes| {
                std::fs::create_dir_all(dir)
                    .and_then(|()| {
                        trainhub_apiserver::pki::write_file_atomically(&file, &bytes, 0o600)
                    })
                    .map_err(|e| format!("writing {}: {e}", file.display()))
            })
            .and_then(|()| map_compiled(&self.engine, &file).map_err(|e| format!("{e:#}")));
        match written {
            Ok(mapped) => {
                crate::memory::page_out(mapped.image_range());
                Ok(mapped)
            }
            Err(e) => {
                tracing::warn!(error = %e, "compiled plugin not cached; keeping its code in memory");
                Ok(component)
            }
        }
    }
}

/// Maps a component compiled by [`Host::compile`] from its cache file.
#[allow(unsafe_code)]
fn map_compiled(engine: &Engine, file: &std::path::Path) -> wasmtime::Result<Component> {
    // SAFETY: wasmtime trusts the file to hold machine code it produced.
    // Only `Host::compile` writes these files (with `Component::serialize`,
    // renamed into place once complete), in the hub's own data directory,
    // which is private to the hub (0700) and hidden from the runs the
    // spokes start; the file name carries the engine's compatibility hash
    // and wasmtime checks the header against the engine as well. The file
    // is never modified in place while mapped: a new compilation is
    // renamed over it, which leaves the mapped inode untouched.
    unsafe { Component::deserialize_file(engine, file) }
}

fn check_descriptor(id: &PluginId, d: &sdk::Descriptor) -> Result<(), PluginError> {
    let label_ok = !d.name.is_empty()
        && d.name.len() <= 63
        && d.name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !d.name.starts_with('-')
        && !d.name.ends_with('-');
    if !label_ok {
        return Err(PluginError::Malformed {
            plugin: id.clone(),
            phase: Phase::Startup,
            detail: format!(
                "descriptor name {:?} must be a DNS-1123 label (lower-case letters, digits, '-')",
                d.name
            ),
        });
    }
    if d.version.is_empty() {
        return Err(PluginError::Malformed {
            plugin: id.clone(),
            phase: Phase::Startup,
            detail: "descriptor version is empty".into(),
        });
    }
    Ok(())
}

/// A loaded, validated plugin, ready to be called from any thread.
pub struct LoadedPlugin {
    id: PluginId,
    descriptor: sdk::Descriptor,
    settings: String,
    limits: Limits,
    pre: InstancePre<CallState>,
    exports: Exports,
    engine: Engine,
    slots: Option<Arc<Slots>>,
    threads: Arc<Threads>,
}

/// Where the world's exports are in a component, looked up once at load so
/// that a call resolves (and type-checks) only the function it calls.
struct Exports {
    describe: ComponentExportIndex,
    validate_settings: ComponentExportIndex,
    validate: ComponentExportIndex,
    enforce_ml_policy: ComponentExportIndex,
    enforce_pod_group_policy: ComponentExportIndex,
    build: ComponentExportIndex,
    status: ComponentExportIndex,
}

impl Exports {
    fn of(component: &Component) -> wasmtime::Result<Self> {
        let index = |name: &str| {
            component
                .get_export_index(None, name)
                .ok_or_else(|| wasmtime::format_err!("no export named {name}"))
        };
        Ok(Exports {
            describe: index("describe")?,
            validate_settings: index("validate-settings")?,
            validate: index("validate")?,
            enforce_ml_policy: index("enforce-ml-policy")?,
            enforce_pod_group_policy: index("enforce-pod-group-policy")?,
            build: index("build")?,
            status: index("status")?,
        })
    }
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("id", &self.id)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl LoadedPlugin {
    pub fn id(&self) -> &PluginId {
        &self.id
    }

    pub fn descriptor(&self) -> &sdk::Descriptor {
        &self.descriptor
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn context(&self) -> wit::Context {
        wit::Context {
            settings: self.settings.clone(),
        }
    }

    /// Calls `export` with `params` on a fresh instance in a fresh store,
    /// in its turn, under the plugin's CPU budget, wall-clock bound and
    /// memory cap, and classifies what went wrong (where it runs: see the
    /// module docs).
    fn call<P, R>(
        &self,
        phase: Phase,
        export: ComponentExportIndex,
        params: P,
    ) -> Result<R, PluginError>
    where
        P: ComponentNamedList + Lower + Send + Sync + 'static,
        R: ComponentNamedList + Lift + Send + Sync + 'static,
    {
        let span = trainhub_telemetry::span!(
            "plugin",
            plugin.name = %self.id.name,
            plugin.digest = %self.id.digest,
            plugin.phase = phase.as_str(),
            plugin.outcome = tracing::field::Empty,
        );
        let submitted = Instant::now();
        let call = Call {
            id: self.id.clone(),
            phase,
            pre: self.pre.clone(),
            engine: self.engine.clone(),
            slots: self.slots.clone(),
            limits: self.limits,
            submitted,
        };
        let run = {
            let span = span.clone();
            move || {
                let _entered = span.enter();
                call.execute::<P, R>(export, params)
            }
        };
        let result = self.threads.run(run).unwrap_or_else(|reason| {
            Err(PluginError::Deferred {
                plugin: self.id.clone(),
                phase,
                reason,
            })
        });
        let outcome = match &result {
            Ok(_) => "ok",
            Err(PluginError::OutOfMemory { .. }) => "out-of-memory",
            Err(PluginError::CpuExhausted { .. }) => "cpu-exhausted",
            Err(PluginError::Deferred { .. }) => "deferred",
            Err(_) => "trap",
        };
        span.record("plugin.outcome", outcome);
        crate::metrics::hub().plugin_call(
            &self.id.name,
            phase.as_str(),
            outcome,
            submitted.elapsed(),
        );
        result
    }

    fn failed(&self, phase: Phase, failure: wit::Failure) -> PluginError {
        PluginError::Failed {
            plugin: self.id.clone(),
            phase,
            message: failure.message,
        }
    }

    /// PreExecution: validate a TrainJob against its runtime (both JSON).
    pub fn validate(&self, trainjob: &str, runtime: &str) -> Result<sdk::Validation, PluginError> {
        let ctx = self.context();
        let (validation,): (wit::Validation,) = self.call(
            Phase::Validate,
            self.exports.validate,
            (ctx, trainjob.to_string(), runtime.to_string()),
        )?;
        Ok(validation.convert())
    }

    pub fn enforce_ml_policy(
        &self,
        info: sdk::RuntimeInfo,
        trainjob: &str,
    ) -> Result<sdk::RuntimeInfo, PluginError> {
        let ctx = self.context();
        let info: wit::RuntimeInfo = info.convert();
        let (result,): (Result<wit::RuntimeInfo, wit::Failure>,) = self.call(
            Phase::EnforceMlPolicy,
            self.exports.enforce_ml_policy,
            (ctx, info, trainjob.to_string()),
        )?;
        result
            .map(Convert::convert)
            .map_err(|f| self.failed(Phase::EnforceMlPolicy, f))
    }

    pub fn enforce_pod_group_policy(
        &self,
        info: sdk::RuntimeInfo,
        trainjob: &str,
    ) -> Result<sdk::RuntimeInfo, PluginError> {
        let ctx = self.context();
        let info: wit::RuntimeInfo = info.convert();
        let (result,): (Result<wit::RuntimeInfo, wit::Failure>,) = self.call(
            Phase::EnforcePodGroupPolicy,
            self.exports.enforce_pod_group_policy,
            (ctx, info, trainjob.to_string()),
        )?;
        result
            .map(Convert::convert)
            .map_err(|f| self.failed(Phase::EnforcePodGroupPolicy, f))
    }

    /// Build: the objects for `target`, as JSON text; the pipeline checks each
    /// is a Kubernetes object (`check_object`).
    pub fn build(
        &self,
        info: &sdk::RuntimeInfo,
        trainjob: &str,
        target: &sdk::Target,
    ) -> Result<Vec<String>, PluginError> {
        let ctx = self.context();
        let info: wit::RuntimeInfo = info.clone().convert();
        let target: wit::Target = target.clone().convert();
        let (result,): (Result<Vec<String>, wit::Failure>,) = self.call(
            Phase::Build,
            self.exports.build,
            (ctx, info, trainjob.to_string(), target),
        )?;
        result.map_err(|f| self.failed(Phase::Build, f))
    }

    /// PostExecution: the TrainJob status JSON, if the plugin sets one.
    pub fn status(&self, trainjob: &str, observed: &str) -> Result<Option<String>, PluginError> {
        let ctx = self.context();
        let (result,): (Result<Option<String>, wit::Failure>,) = self.call(
            Phase::Status,
            self.exports.status,
            (ctx, trainjob.to_string(), observed.to_string()),
        )?;
        result.map_err(|f| self.failed(Phase::Status, f))
    }
}

/// One call, as the thread that runs it executes it.
struct Call {
    id: PluginId,
    phase: Phase,
    pre: InstancePre<CallState>,
    engine: Engine,
    slots: Option<Arc<Slots>>,
    limits: Limits,
    submitted: Instant,
}

impl Call {
    fn deferred(&self, reason: String) -> PluginError {
        PluginError::Deferred {
            plugin: self.id.clone(),
            phase: self.phase,
            reason,
        }
    }

    fn execute<P, R>(self, export: ComponentExportIndex, params: P) -> Result<R, PluginError>
    where
        P: ComponentNamedList + Lower + Send + Sync,
        R: ComponentNamedList + Lift + Send + Sync,
    {
        let waited = self.submitted.elapsed();
        if waited >= self.limits.wall {
            return Err(self.deferred(format!(
                "waited {waited:?} for its turn, past the wall-clock bound of {:?}: \
                 the host is overloaded",
                self.limits.wall
            )));
        }
        // Held until the store (declared after it, so dropped before it) has
        // given its instance back to the pool.
        let _slot = self.slots.as_ref().map(Slots::acquire);
        let stdio = MemoryOutputPipe::new(STDIO_CAPTURE);
        let wasi = WasiCtx::builder()
            .stdout(stdio.clone())
            .stderr(stdio.clone())
            .build();
        let state = CallState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryCap {
                limit: self.limits.memory,
                hit: false,
            },
            plugin: self.id.name.clone(),
            clock: CallClock {
                cpu_start: thread_cpu_time(),
                cpu_budget: self.limits.cpu,
                submitted: self.submitted,
                wall: self.limits.wall,
                stopped: None,
            },
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        // Checked at every tick: the call's CPU time, then its wall-clock time.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            hand_off_worker();
            let clock = &mut ctx.data_mut().clock;
            Ok(match clock.check() {
                None => UpdateDeadline::Continue(1),
                Some(stop) => {
                    clock.stopped = Some(stop);
                    UpdateDeadline::Interrupt
                }
            })
        });

        let instance = match self.pre.instantiate(&mut store) {
            Ok(instance) => instance,
            Err(error) => {
                let state = store.data();
                let own = state.limiter.hit
                    || state.clock.stopped.is_some()
                    || error.downcast_ref::<wasmtime::Trap>().is_some();
                if !own {
                    // Not the plugin's doing (it instantiated at load): the
                    // instance slot or its memory could not be had.
                    return Err(self.deferred(format!(
                        "cannot instantiate (the host is short of resources): {error:#}"
                    )));
                }
                return Err(self.classify(state, error, &stdio.contents()));
            }
        };
        let result = instance
            .get_typed_func::<P, R>(&mut store, export)
            .and_then(|f| f.call(&mut store, params));
        let output = stdio.contents();
        if !output.is_empty() {
            tracing::info!(plugin = %self.id, phase = %self.phase, output = %String::from_utf8_lossy(&output), "plugin wrote to stdio");
        }
        result.map_err(|error| self.classify(store.data(), error, &output))
    }

    /// The plugin's own fault (memory cap, CPU budget, trap), or the host's
    /// (wall-clock bound).
    fn classify(&self, state: &CallState, error: wasmtime::Error, output: &[u8]) -> PluginError {
        match state.clock.stopped {
            Some(Stop::Cpu { used }) => {
                return PluginError::CpuExhausted {
                    plugin: self.id.clone(),
                    phase: self.phase,
                    budget: self.limits.cpu,
                    used,
                };
            }
            Some(Stop::Wall { elapsed, cpu }) => {
                return self.deferred(format!(
                    "still running after {elapsed:?} of wall-clock time (the bound is {:?}) \
                     having used only {cpu:?} of its {:?} CPU budget: the host is overloaded",
                    self.limits.wall, self.limits.cpu
                ));
            }
            None => {}
        }
        if state.limiter.hit {
            return PluginError::OutOfMemory {
                plugin: self.id.clone(),
                phase: self.phase,
                limit: self.limits.memory,
            };
        }
        let mut message = format!("{error:#}");
        if !output.is_empty() {
            message.push_str(&format!(
                "; plugin output: {}",
                String::from_utf8_lossy(output).trim()
            ));
        }
        PluginError::Trap {
            plugin: self.id.clone(),
            phase: self.phase,
            message,
        }
    }
}

/// Why a call was stopped at a tick.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Cpu { used: Duration },
    Wall { elapsed: Duration, cpu: Duration },
}

/// A call's budgets, checked at every epoch tick.
struct CallClock {
    cpu_start: Duration,
    cpu_budget: Duration,
    submitted: Instant,
    wall: Duration,
    stopped: Option<Stop>,
}

impl CallClock {
    fn check(&self) -> Option<Stop> {
        let cpu = thread_cpu_time().saturating_sub(self.cpu_start);
        if cpu >= self.cpu_budget {
            return Some(Stop::Cpu { used: cpu });
        }
        let elapsed = self.submitted.elapsed();
        if elapsed >= self.wall {
            return Some(Stop::Wall { elapsed, cpu });
        }
        None
    }
}

/// CPU time the current thread has used: what a call costs, whatever else
/// the machine is doing.
fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// The store data of one call.
struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryCap,
    plugin: String,
    clock: CallClock,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl bindings::trainhub::plugin::types::Host for CallState {}

impl bindings::trainhub::plugin::host::Host for CallState {
    fn random_bytes(&mut self, len: u32) -> Vec<u8> {
        let mut buf = vec![0u8; len.min(MAX_RANDOM_BYTES) as usize];
        if let Err(e) = getrandom::fill(&mut buf) {
            // Without entropy a key would be predictable: fail loudly but do
            // not crash the hub; the plugin sees zeroes and the log says why.
            tracing::error!(plugin = %self.plugin, error = %e, "no entropy for plugin");
        }
        buf
    }

    fn log(&mut self, level: Level, message: String) {
        match level {
            Level::Debug => tracing::debug!(plugin = %self.plugin, "{message}"),
            Level::Info => tracing::info!(plugin = %self.plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin = %self.plugin, "{message}"),
        }
    }
}

/// Caps linear memory and remembers whether the cap was hit, so an
/// allocation failure (which Rust turns into a trap) is reported as memory
/// exhaustion rather than as a generic trap.
struct MemoryCap {
    limit: usize,
    hit: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// The instance pool: [`CONCURRENT_CALLS`] component instances, each with
/// room for what one plugin instance holds, linear memories of any size up
/// to 4 GiB (each plugin's own cap is enforced by [`MemoryCap`]).
fn pool_config() -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(CONCURRENT_CALLS)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .total_memories(CONCURRENT_CALLS * MEMORIES_PER_COMPONENT)
        .total_tables(CONCURRENT_CALLS * TABLES_PER_COMPONENT)
        .total_core_instances(CONCURRENT_CALLS * CORE_INSTANCES_PER_COMPONENT)
        .max_tables_per_module(TABLES_PER_COMPONENT)
        .table_elements(MAX_TABLE_ELEMENTS)
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(64 << 10)
        .pagemap_scan(Enabled::Auto);
    pool
}

/// Counts the pool's free instance slots, so that a call beyond the pool's
/// capacity waits for one rather than failing.
struct Slots {
    free: Mutex<u32>,
    freed: Condvar,
}

/// One taken slot, given back on drop.
struct Slot(Arc<Slots>);

impl Slots {
    fn new(count: u32) -> Self {
        Slots {
            free: Mutex::new(count),
            freed: Condvar::new(),
        }
    }

    fn acquire(self: &Arc<Self>) -> Slot {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        Slot(self.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.0.freed.notify_one();
    }
}

thread_local! {
    /// Set while this thread, on a multi-threaded tokio runtime, runs a call
    /// without having handed its worker's tasks off (see the module docs).
    static INLINE_ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the thread as running a call inline, until dropped.
struct InlineOnWorker(bool);

impl InlineOnWorker {
    fn enter() -> Self {
        InlineOnWorker(INLINE_ON_WORKER.replace(true))
    }
}

impl Drop for InlineOnWorker {
    fn drop(&mut self) {
        INLINE_ON_WORKER.set(self.0);
    }
}

/// How long a worker that hands its tasks off waits, at most, for them to
/// run elsewhere: on a loaded machine the thread that takes them may start
/// late, and were the wait to end first the worker would take its tasks
/// back, to hand them off again at the next tick.
const HAND_OFF_WAIT: Duration = TICK;

/// At an epoch tick of a call running inline on an async runtime's worker:
/// hands the worker's other tasks to another thread, so that the call
/// finishes as a blocking thread, and waits until a task spawned meanwhile
/// has run (some thread is serving the runtime) or [`HAND_OFF_WAIT`] has
/// passed. Once handed off, each tick only sees that task run.
fn hand_off_worker() {
    if !INLINE_ON_WORKER.get() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    tokio::task::block_in_place(|| {
        let served = Arc::new(AtomicBool::new(false));
        let flag = served.clone();
        drop(runtime.spawn(async move { flag.store(true, Ordering::Release) }));
        let deadline = Instant::now() + HAND_OFF_WAIT;
        while !served.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
    });
}

/// Where calls run, and how many at once: a fixed set of plugin threads
/// (for callers that must not block), and a gate that lets at most that
/// many calls run at once, wherever they run, with at most `bound` waiting.
struct Threads {
    queue: Mutex<Queue>,
    ready: Condvar,
    bound: usize,
    gate: Mutex<Gate>,
    turn: Condvar,
}

/// Calls running, calls waiting for their turn.
struct Gate {
    running: usize,
    waiting: usize,
    limit: usize,
}

/// A call's turn to run, given back on drop.
struct Turn<'a>(&'a Threads);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.gate().running -= 1;
        self.0.turn.notify_one();
    }
}

struct Queue {
    jobs: VecDeque<Box<dyn FnOnce() + Send>>,
    closed: bool,
}

impl Threads {
    fn start(count: usize, bound: usize) -> std::io::Result<Arc<Self>> {
        let threads = Arc::new(Threads {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            bound,
            gate: Mutex::new(Gate {
                running: 0,
                waiting: 0,
                limit: count.max(1),
            }),
            turn: Condvar::new(),
        });
        for i in 0..count.max(1) {
            let me = threads.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("plugin-{i}"))
                .spawn(move || me.work());
            if let Err(e) = spawned {
                threads.close();
                return Err(e);
            }
        }
        Ok(threads)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a call's turn to run; `Err` when `bound` calls already
    /// wait (the host is saturated).
    fn take_turn(&self) -> Result<Turn<'_>, String> {
        let mut gate = self.gate();
        if gate.running >= gate.limit {
            if gate.waiting >= self.bound {
                return Err(format!(
                    "{} plugin calls run and {} wait for their turn: the host is saturated",
                    gate.running, gate.waiting
                ));
            }
            gate.waiting += 1;
            while gate.running >= gate.limit {
                gate = self.turn.wait(gate).unwrap_or_else(PoisonError::into_inner);
            }
            gate.waiting -= 1;
        }
        gate.running += 1;
        Ok(Turn(self))
    }

    /// A turn if one is free now.
    fn try_turn(&self) -> Option<Turn<'_>> {
        let mut gate = self.gate();
        if gate.running >= gate.limit {
            return None;
        }
        gate.running += 1;
        Some(Turn(self))
    }

    /// Runs `work` on the caller's thread in its turn. A panic in the host's
    /// own code ends that call, not the caller.
    fn run_here<R>(&self, work: impl FnOnce() -> R) -> Result<R, String> {
        let turn = self.take_turn()?;
        Self::run_in_turn(turn, work)
    }

    fn run_in_turn<R>(turn: Turn<'_>, work: impl FnOnce() -> R) -> Result<R, String> {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
            .map_err(|_| "the plugin call panicked in the host".to_string());
        drop(turn);
        result
    }

    /// Runs `work` where the caller's thread allows (see the module docs)
    /// and waits for its result; `Err` says why it could not run.
    fn run<R: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, String> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::CurrentThread => {
                self.run_on_thread(work)
            }
            Ok(_) => match self.try_turn() {
                Some(turn) => {
                    let _inline = InlineOnWorker::enter();
                    Self::run_in_turn(turn, work)
                }
                None => tokio::task::block_in_place(|| self.run_here(work)),
            },
            Err(_) => self.run_here(work),
        }
    }

    fn work(&self) {
        loop {
            let job = {
                let mut queue = self.lock();
                loop {
                    if let Some(job) = queue.jobs.pop_front() {
                        break job;
                    }
                    if queue.closed {
                        return;
                    }
                    queue = self
                        .ready
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            };
            // A panic in the host's own code ends that call (its caller sees
            // no answer), not the thread.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        }
    }

    /// Ends the threads once the calls queued have run.
    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Runs `work` on a plugin thread, in its turn, and waits for its
    /// result; `Err` says why it could not run (the queue is full, the host
    /// is closing).
    fn run_on_thread<R: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut queue = self.lock();
            if queue.closed {
                return Err("the plugin host is shutting down".into());
            }
            if queue.jobs.len() >= self.bound {
                return Err(format!(
                    "{} calls already wait for a plugin thread: the host is saturated",
                    queue.jobs.len()
                ));
            }
            let me = Arc::clone(self);
            queue.jobs.push_back(Box::new(move || {
                let _ = tx.send(me.run_here(work));
            }));
        }
        self.ready.notify_one();
        rx.recv()
            .map_err(|_| "the plugin thread ended the call without an answer".to_string())?
    }
}

/// Links the inert WASI interfaces of [`GRANTED_IMPORTS`].
fn add_inert_wasi(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView as _};
    use wasmtime_wasi::p2::bindings::cli;
    use wasmtime_wasi::p2::bindings::sync::io;
    use wasmtime_wasi::random::WasiRandom;
    let l = linker;
    cli::exit::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::environment::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::stdin::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::stdout::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::stderr::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::terminal_input::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::terminal_output::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::terminal_stdin::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::terminal_stdout::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    cli::terminal_stderr::add_to_linker::<CallState, WasiCli>(l, CallState::cli)?;
    io::error::add_to_linker::<CallState, HasTable>(l, |s| &mut s.table)?;
    io::poll::add_to_linker::<CallState, HasTable>(l, |s| &mut s.table)?;
    io::streams::add_to_linker::<CallState, HasTable>(l, |s| &mut s.table)?;
    wasmtime_wasi::p2::bindings::random::insecure_seed::add_to_linker::<CallState, WasiRandom>(
        l,
        |s| s.wasi.random(),
    )?;
    Ok(())
}

/// Gives the WASI I/O interfaces the call's resource table.
struct HasTable;

impl wasmtime::component::HasData for HasTable {
    type Data<'a> = &'a mut ResourceTable;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_removes_what_other_engines_compiled_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let config = HostConfig {
            cache_dir: Some(dir.path().to_path_buf()),
            ..HostConfig::default()
        };
        let ours = Host::new(&config).unwrap().engine_hash();
        let digest = "ab".repeat(32);
        let other_engine = format!("{digest}-{:016x}.cwasm", ours.wrapping_add(1));
        let this_engine = format!("{digest}-{ours:016x}.cwasm");
        let not_ours = ["notes.txt", "x-0000000000000000.cwasm", "partial.cwasm.tmp"];
        for name in not_ours
            .iter()
            .copied()
            .chain([&*other_engine, &*this_engine])
        {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        Host::new(&config).unwrap();
        assert!(!dir.path().join(&other_engine).exists());
        assert!(dir.path().join(&this_engine).exists());
        for name in not_ours {
            assert!(dir.path().join(name).exists(), "{name} was removed");
        }
    }
}
