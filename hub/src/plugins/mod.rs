//! Pipeline plugins: the wasmtime host, the plugin registry (built-ins plus a
//! hot-reloaded plugins directory) and the phase driver.

mod bindings;
mod convert;
pub mod host;
pub mod objects;
pub mod pipeline;
pub mod registry;
pub mod sources;

use std::fmt;
use std::time::Duration;

use trainhub_plugin_sdk::FieldError;

pub use convert::Weigh;
pub use host::{Host, HostConfig, Limits, LoadedPlugin};
pub use pipeline::{LAST_APPLIED, Pipeline, PipelineError, Rendered, plugin_trainjob};
pub use registry::{Loading, Registry, Snapshot};

/// A plugin as errors name it: its name (or file, before it has described
/// itself) and the sha256 digest of its component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginId {
    pub name: String,
    pub digest: String,
}

impl fmt::Display for PluginId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin {} ({})", self.name, self.digest)
    }
}

/// A pipeline phase, as errors, logs and metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Startup,
    Validate,
    EnforceMlPolicy,
    EnforcePodGroupPolicy,
    Build,
    Status,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Startup => "startup",
            Phase::Validate => "validate",
            Phase::EnforceMlPolicy => "enforce-ml-policy",
            Phase::EnforcePodGroupPolicy => "enforce-pod-group-policy",
            Phase::Build => "build",
            Phase::Status => "status",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a plugin could not be loaded or a call to it failed. Each variant is a
/// distinct cause; all name the plugin and its digest.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin host: {0}")]
    Host(String),
    #[error("{plugin}: {reason}")]
    Load { plugin: PluginId, reason: String },
    #[error(
        "{plugin} imports {}, which trainhub does not grant: plugins get no filesystem, \
         network, clock, random or environment access; use the trainhub:plugin/host interface \
         (random-bytes, log) instead", .imports.join(", ")
    )]
    ForbiddenImport {
        plugin: PluginId,
        imports: Vec<String>,
    },
    #[error("{plugin}: invalid settings: {}", format_field_errors(.errors))]
    Settings {
        plugin: PluginId,
        errors: Vec<FieldError>,
    },
    /// The call used up its CPU budget: the plugin's own fault.
    #[error(
        "{plugin}: {phase} exceeded its CPU budget of {budget:?} (stopped after {used:?} of CPU time)"
    )]
    CpuExhausted {
        plugin: PluginId,
        phase: Phase,
        budget: Duration,
        used: Duration,
    },
    /// The host could not run the call now (saturated, overloaded, short of
    /// resources): not the plugin's fault, and worth retrying later.
    #[error("{plugin}: {phase} deferred: {reason}")]
    Deferred {
        plugin: PluginId,
        phase: Phase,
        reason: String,
    },
    #[error("{plugin}: {phase} exceeded its memory cap of {} MiB", .limit >> 20)]
    OutOfMemory {
        plugin: PluginId,
        phase: Phase,
        limit: usize,
    },
    #[error("{plugin}: {phase} trapped: {message}")]
    Trap {
        plugin: PluginId,
        phase: Phase,
        message: String,
    },
    #[error("{plugin}: {phase} returned malformed output: {detail}")]
    Malformed {
        plugin: PluginId,
        phase: Phase,
        detail: String,
    },
    #[error("{plugin}: {phase} failed: {message}")]
    Failed {
        plugin: PluginId,
        phase: Phase,
        message: String,
    },
}

impl PluginError {
    /// The plugin concerned, if any.
    pub fn plugin(&self) -> Option<&PluginId> {
        match self {
            PluginError::Host(_) => None,
            PluginError::Load { plugin, .. }
            | PluginError::ForbiddenImport { plugin, .. }
            | PluginError::Settings { plugin, .. }
            | PluginError::CpuExhausted { plugin, .. }
            | PluginError::Deferred { plugin, .. }
            | PluginError::OutOfMemory { plugin, .. }
            | PluginError::Trap { plugin, .. }
            | PluginError::Malformed { plugin, .. }
            | PluginError::Failed { plugin, .. } => Some(plugin),
        }
    }
}

impl PluginError {
    /// Whether the failure is the host's (overloaded, saturated, short of
    /// resources) rather than the plugin's: the call may succeed if retried
    /// later, so it must not fail a TrainJob.
    pub fn is_transient(&self) -> bool {
        matches!(self, PluginError::Deferred { .. })
    }
}

/// `field: detail` pairs, as one line.
pub fn format_field_errors(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| {
            let field = if e.field.is_empty() {
                "<root>"
            } else {
                &e.field
            };
            match &e.value {
                Some(v) => format!("{field}: {} (value {v:?})", e.detail),
                None => format!("{field}: {}", e.detail),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}
