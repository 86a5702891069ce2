//! The built-in plugins: jobset, torch, mpi, plainml, python, jax,
//! xgboost, flux, coscheduling and volcano. They are wasm components like any admin's
//! plugin, built from `plugins/` by the hub's build script and embedded in
//! the binary; their logic is also linked natively, for benchmarks.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::plugins::pipeline::{NativePlugin, PhasePlugin};
use crate::plugins::{Host, Limits, PluginError};

include!(concat!(env!("OUT_DIR"), "/builtin_components.rs"));

/// Directory of the wasm components built with the hub (built-ins, the
/// example `acme` plugin and the test plugins).
pub const WASM_DIR: &str = env!("TRAINHUB_WASM_DIR");

/// How the binary compiles the built-in components into a cache
/// directory in a process of its own (see [`set_compile_apart`]).
pub type CompileApart = fn(&Path) -> Result<(), String>;

static COMPILE_APART: OnceLock<CompileApart> = OnceLock::new();

/// Sets how the built-ins are compiled apart (once; later calls are
/// ignored): the `trainhub` binary runs itself as a child that compiles
/// them into the cache and exits. The compiler's threads and what they
/// leave allocated then die with the child, and the hub maps the machine
/// code from the cache as every later start does; its first start holds
/// what a restart holds.
pub fn set_compile_apart(compile: CompileApart) {
    let _ = COMPILE_APART.set(compile);
}

/// Loads every built-in component into `host` with default settings and
/// limits. With a compilation cache and a [`set_compile_apart`] hook, the
/// components not cached yet are compiled apart first; if that fails they
/// are compiled here.
pub fn load(host: &Host) -> Result<Vec<Arc<dyn PhasePlugin>>, PluginError> {
    if let (Some(compile), Some(dir)) = (COMPILE_APART.get(), host.cache_dir())
        && BUILTIN_COMPONENTS
            .iter()
            .any(|(_, digest, _)| !host.is_cached(*digest))
        && let Err(e) = compile(dir)
    {
        tracing::warn!(error = %e, "compiling the built-in plugins in a child process failed; compiling them here");
    }
    BUILTIN_COMPONENTS
        .iter()
        .map(|(name, digest, wasm)| {
            host.load_digested(
                &format!("builtin:{name}"),
                *digest,
                wasm,
                &serde_json::json!({}),
                Limits::default(),
            )
            .map(|p| {
                // Read only to compile it; its compiled code is mapped from
                // the cache now.
                crate::memory::release_static(wasm);
                p as Arc<dyn PhasePlugin>
            })
        })
        .collect()
}

/// The same plugins linked natively, called through the same JSON boundary.
pub fn native() -> Vec<Arc<dyn PhasePlugin>> {
    use trainhub_builtin_plugins as b;
    let settings = serde_json::json!({});
    vec![
        Arc::new(NativePlugin::<b::jobset::JobSet>::new(&settings)),
        Arc::new(NativePlugin::<b::torch::Torch>::new(&settings)),
        Arc::new(NativePlugin::<b::mpi::Mpi>::new(&settings)),
        Arc::new(NativePlugin::<b::plainml::PlainMl>::new(&settings)),
        Arc::new(NativePlugin::<b::python::Python>::new(&settings)),
        Arc::new(NativePlugin::<b::jax::Jax>::new(&settings)),
        Arc::new(NativePlugin::<b::xgboost::Xgboost>::new(&settings)),
        Arc::new(NativePlugin::<b::flux::Flux>::new(&settings)),
        Arc::new(NativePlugin::<b::coscheduling::Coscheduling>::new(
            &settings,
        )),
        Arc::new(NativePlugin::<b::volcano::Volcano>::new(&settings)),
    ]
}
