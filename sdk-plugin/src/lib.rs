//! Write trainhub pipeline plugins in Rust.
//!
//! A plugin is a WebAssembly component implementing some of Kubeflow
//! Trainer's runtime-framework phases (see `wit/plugin.wit`). With this crate
//! a plugin is a type implementing [`Plugin`] and one [`export_plugin!`] line:
//!
//! ```
//! use trainhub_plugin_sdk::prelude::*;
//!
//! #[derive(Default)]
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     fn describe(&self) -> Descriptor {
//!         Descriptor::new("hello", "0.1.0").frameworks(["hello"]).enforces_ml_policy()
//!     }
//!     fn enforce_ml_policy(&self, _: &Ctx, info: &mut RuntimeInfo, _: &TrainJob) -> Result<(), Failure> {
//!         info.trainer_mut()?.node_container_mut()?.upsert_env("GREETING", "hello");
//!         Ok(())
//!     }
//! }
//!
//! export_plugin!(Hello);
//! ```
//!
//! Build it with `cargo build --target wasm32-wasip2 --release` and drop the
//! `.wasm` file into the hub's plugins directory. The same code runs natively
//! under [`testing::Harness`], so plugin logic is unit-tested without wasm.

#[cfg(all(target_arch = "wasm32", feature = "arena"))]
mod arena;
/// A plugin's heap in wasm; see the `arena` module (feature `arena`, on by
/// default).
#[cfg(all(target_arch = "wasm32", feature = "arena"))]
#[global_allocator]
static ARENA: arena::Arena = arena::Arena::new();

pub mod guest;
mod helpers;
pub mod info;
pub mod runtime;
pub mod testing;

/// Bindings generated from `wit/plugin.wit`.
#[allow(unsafe_code, clippy::all, missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        default_bindings_module: "::trainhub_plugin_sdk::bindings",
    });
}

pub use bindings::trainhub::plugin::types::{
    Capabilities, Container, ContainerPort, Context, Descriptor, EnvVar, ErrorKind, Failure,
    FieldError, KeyValue, PodSet, Quantity, RuntimeInfo, Target, Validation, Volume, VolumeMount,
};
pub use guest::Ctx;
pub use runtime::Runtime;
pub use serde_json;
pub use trainhub_api as api;
pub use wit_bindgen;

use trainhub_api::jobset::JobSetStatus;
use trainhub_api::trainer::{TrainJob, TrainJobStatus};

/// Everything a plugin usually needs, in one `use`.
pub mod prelude {
    pub use crate::api::constants;
    pub use crate::api::jobset::{JobSet, JobSetStatus};
    pub use crate::api::trainer::{TrainJob, TrainJobStatus};
    pub use crate::{
        Capabilities, Container, ContainerPort, Ctx, Descriptor, EnvVar, ErrorKind, Failure,
        FieldError, KeyValue, Plugin, PodSet, Quantity, Runtime, RuntimeInfo, Target, Validation,
        Volume, VolumeMount, export_plugin,
    };
    pub use serde_json::{Value, json};
}

/// A trainhub pipeline plugin.
///
/// Implement [`Plugin::describe`] and the phases the descriptor declares; the
/// others keep their default, which does nothing. The host calls a phase only
/// if the descriptor declares it, and only for TrainJobs the plugin applies to
/// (its frameworks or pod-group policies).
///
/// Every call runs in a fresh sandbox: a plugin keeps no state between calls.
/// Its settings arrive with every call in [`Ctx`].
pub trait Plugin: Default {
    /// Startup: name, version, phases, and what the plugin handles.
    fn describe(&self) -> Descriptor;

    /// Startup: check the plugin's settings once, when the host loads it.
    /// Errors refuse the plugin.
    fn validate_settings(&self, settings: &serde_json::Value) -> Vec<FieldError> {
        let _ = settings;
        Vec::new()
    }

    /// PreExecution: validate a TrainJob against its runtime at admission.
    fn validate(&self, ctx: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let _ = (ctx, job, runtime);
        Validation::default()
    }

    /// Build: apply the ML policy (env, ports, counts) to the runtime info.
    fn enforce_ml_policy(
        &self,
        ctx: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        let _ = (ctx, info, job);
        Ok(())
    }

    /// Build: apply the pod-group policy (scheduler labels) to the runtime info.
    fn enforce_pod_group_policy(
        &self,
        ctx: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        let _ = (ctx, info, job);
        Ok(())
    }

    /// Build: the Kubernetes objects to create on the target spoke.
    fn build(
        &self,
        ctx: &Ctx,
        info: &RuntimeInfo,
        job: &TrainJob,
        target: &Target,
    ) -> Result<Vec<serde_json::Value>, Failure> {
        let _ = (ctx, info, job, target);
        Ok(Vec::new())
    }

    /// PostExecution: the TrainJob status for what the spoke observed, or
    /// `None` to leave the status as it is.
    fn status(
        &self,
        ctx: &Ctx,
        job: &TrainJob,
        observed: &JobSetStatus,
    ) -> Result<Option<TrainJobStatus>, Failure> {
        let _ = (ctx, job, observed);
        Ok(None)
    }
}

/// Exports a [`Plugin`] type as the component's implementation of the
/// `trainhub:plugin/plugin` world.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[doc(hidden)]
        struct __TrainhubPlugin;

        impl $crate::bindings::Guest for __TrainhubPlugin {
            fn describe() -> $crate::Descriptor {
                $crate::guest::describe::<$plugin>()
            }
            fn validate_settings(settings: String) -> Vec<$crate::FieldError> {
                $crate::guest::validate_settings::<$plugin>(&settings)
            }
            fn validate(ctx: $crate::Context, trainjob: String, runtime: String) -> $crate::Validation {
                $crate::guest::validate::<$plugin>(&ctx, &trainjob, &runtime)
            }
            fn enforce_ml_policy(
                ctx: $crate::Context,
                info: $crate::RuntimeInfo,
                trainjob: String,
            ) -> Result<$crate::RuntimeInfo, $crate::Failure> {
                $crate::guest::enforce_ml_policy::<$plugin>(&ctx, info, &trainjob)
            }
            fn enforce_pod_group_policy(
                ctx: $crate::Context,
                info: $crate::RuntimeInfo,
                trainjob: String,
            ) -> Result<$crate::RuntimeInfo, $crate::Failure> {
                $crate::guest::enforce_pod_group_policy::<$plugin>(&ctx, info, &trainjob)
            }
            fn build(
                ctx: $crate::Context,
                info: $crate::RuntimeInfo,
                trainjob: String,
                target: $crate::Target,
            ) -> Result<Vec<String>, $crate::Failure> {
                $crate::guest::build::<$plugin>(&ctx, &info, &trainjob, &target)
            }
            fn status(
                ctx: $crate::Context,
                trainjob: String,
                observed: String,
            ) -> Result<Option<String>, $crate::Failure> {
                $crate::guest::status::<$plugin>(&ctx, &trainjob, &observed)
            }
        }

        $crate::bindings::__export_plugin_world!(__TrainhubPlugin with_types_in $crate::bindings);
    };
}

/// `len` bytes from the host's secure random generator.
///
/// Plugins get no WASI `random` capability; this is their one source of
/// entropy (the MPI plugin's SSH key comes from it). Natively (tests), the
/// operating system's generator is used.
pub fn random_bytes(len: u32) -> Vec<u8> {
    #[cfg(target_family = "wasm")]
    {
        bindings::trainhub::plugin::host::random_bytes(len)
    }
    #[cfg(not(target_family = "wasm"))]
    {
        let mut buf = vec![0u8; len as usize];
        // The OS generator failing is not recoverable; an all-zero key would be worse.
        #[allow(clippy::expect_used)]
        getrandom::fill(&mut buf).expect("operating system random generator failed");
        buf
    }
}

/// Logs a line through the host, attributed to this plugin.
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_family = "wasm")]
    {
        use bindings::trainhub::plugin::host::{Level, log};
        let level = match level {
            LogLevel::Debug => Level::Debug,
            LogLevel::Info => Level::Info,
            LogLevel::Warn => Level::Warn,
        };
        log(level, message);
    }
    #[cfg(not(target_family = "wasm"))]
    {
        let _ = (level, message);
    }
}

/// Severity of a [`log`] line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
}
