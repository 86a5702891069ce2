//! The plugin side of the ABI: what [`export_plugin!`](crate::export_plugin)
//! calls for each exported function.
//!
//! These functions parse the JSON that crosses the boundary into typed
//! Kubeflow objects, call the [`Plugin`] and serialise its answer. The hub's
//! native adapter and [`testing::Harness`](crate::testing::Harness) call the
//! very same functions, so a plugin behaves identically natively and in wasm.

use serde::de::DeserializeOwned;
use trainhub_api::jobset::JobSetStatus;
use trainhub_api::trainer::TrainJob;

use crate::{
    Context, Descriptor, ErrorKind, Failure, FieldError, Plugin, Runtime, RuntimeInfo, Target,
    Validation,
};

/// Per-call context handed to every phase: the plugin's settings.
#[derive(Debug, Clone, Default)]
pub struct Ctx {
    settings: serde_json::Value,
}

impl Ctx {
    /// A context with the given settings.
    pub fn new(settings: serde_json::Value) -> Self {
        Ctx { settings }
    }

    /// The settings as JSON (`{}` when none are configured).
    pub fn settings(&self) -> &serde_json::Value {
        &self.settings
    }

    /// The settings parsed into the plugin's own type. They were validated at
    /// load, so a failure here means the plugin's two readings disagree.
    pub fn settings_as<T: DeserializeOwned>(&self) -> Result<T, Failure> {
        serde_json::from_value(self.settings.clone())
            .map_err(|e| Failure::new(format!("settings: {e}")))
    }

    fn from_wire(ctx: &Context) -> Result<Self, Failure> {
        let settings = if ctx.settings.trim().is_empty() {
            serde_json::Value::Object(Default::default())
        } else {
            serde_json::from_str(&ctx.settings)
                .map_err(|e| Failure::new(format!("settings are not JSON: {e}")))?
        };
        Ok(Ctx { settings })
    }
}

fn parse<T: DeserializeOwned>(what: &str, json: &str) -> Result<T, Failure> {
    serde_json::from_str(json).map_err(|e| Failure::new(format!("{what} is not valid: {e}")))
}

fn to_json<T: serde::Serialize>(what: &str, value: &T) -> Result<String, Failure> {
    serde_json::to_string(value).map_err(|e| Failure::new(format!("cannot serialise {what}: {e}")))
}

pub fn describe<P: Plugin>() -> Descriptor {
    P::default().describe()
}

pub fn validate_settings<P: Plugin>(settings: &str) -> Vec<FieldError> {
    let settings = if settings.trim().is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        match serde_json::from_str(settings) {
            Ok(v) => v,
            Err(e) => {
                return vec![FieldError::invalid(
                    "settings",
                    None,
                    format!("settings must be a JSON object: {e}"),
                )];
            }
        }
    };
    P::default().validate_settings(&settings)
}

pub fn validate<P: Plugin>(ctx: &Context, trainjob: &str, runtime: &str) -> Validation {
    let inputs = Ctx::from_wire(ctx).and_then(|ctx| {
        let job: TrainJob = parse("TrainJob", trainjob)?;
        let runtime = Runtime::from_json(runtime)
            .map_err(|e| Failure::new(format!("runtime is not valid: {e}")))?;
        Ok((ctx, job, runtime))
    });
    match inputs {
        Ok((ctx, job, runtime)) => P::default().validate(&ctx, &job, &runtime),
        Err(failure) => Validation {
            warnings: Vec::new(),
            errors: vec![FieldError {
                kind: ErrorKind::Invalid,
                field: String::new(),
                value: None,
                detail: failure.message,
            }],
        },
    }
}

pub fn enforce_ml_policy<P: Plugin>(
    ctx: &Context,
    mut info: RuntimeInfo,
    trainjob: &str,
) -> Result<RuntimeInfo, Failure> {
    let ctx = Ctx::from_wire(ctx)?;
    let job: TrainJob = parse("TrainJob", trainjob)?;
    P::default().enforce_ml_policy(&ctx, &mut info, &job)?;
    Ok(info)
}

pub fn enforce_pod_group_policy<P: Plugin>(
    ctx: &Context,
    mut info: RuntimeInfo,
    trainjob: &str,
) -> Result<RuntimeInfo, Failure> {
    let ctx = Ctx::from_wire(ctx)?;
    let job: TrainJob = parse("TrainJob", trainjob)?;
    P::default().enforce_pod_group_policy(&ctx, &mut info, &job)?;
    Ok(info)
}

pub fn build<P: Plugin>(
    ctx: &Context,
    info: &RuntimeInfo,
    trainjob: &str,
    target: &Target,
) -> Result<Vec<String>, Failure> {
    let ctx = Ctx::from_wire(ctx)?;
    let job: TrainJob = parse("TrainJob", trainjob)?;
    P::default()
        .build(&ctx, info, &job, target)?
        .iter()
        .map(|object| to_json("object", object))
        .collect()
}

pub fn status<P: Plugin>(
    ctx: &Context,
    trainjob: &str,
    observed: &str,
) -> Result<Option<String>, Failure> {
    let ctx = Ctx::from_wire(ctx)?;
    let job: TrainJob = parse("TrainJob", trainjob)?;
    let observed: JobSetStatus = parse("observed JobSet status", observed)?;
    P::default()
        .status(&ctx, &job, &observed)?
        .map(|status| to_json("TrainJob status", &status))
        .transpose()
}
