//! The built-in plugins: jobset, torch, mpi, plainml, python, jax,
//! xgboost, flux, coscheduling and volcano. They are wasm components like any admin's
//! plugin, built from `plugins/` by the hub's build script and embedded in
//! the binary; their logic is also linked natively, for benchmarks.

use std::sync::Arc;

use crate::plugins::pipeline::{NativePlugin, PhasePlugin};
use crate::plugins::{Host, Limits, PluginError};

include!(concat!(env!("OUT_DIR"), "/builtin_components.rs"));

/// Directory of the wasm components built with the hub (built-ins, the
/// example `acme` plugin and the test plugins).
pub const WASM_DIR: &str = env!("TRAINHUB_WASM_DIR");

/// Loads every built-in component into `host` with default settings and limits.
pub fn load(host: &Host) -> Result<Vec<Arc<dyn PhasePlugin>>, PluginError> {
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
