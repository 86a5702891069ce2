//! A plugin that misbehaves on purpose, to test the host's sandbox. Its
//! `mode` setting picks the fault every phase commits: `loop`, `oom`,
//! `trap`, `garbage`, `busy` (compute for `iterations` rounds, default
//! 100 million, then behave), or `ok` (behave). Its `phases` setting (a
//! list of `validate`, `enforce-ml-policy`, `build`) limits the fault to
//! those phases; the others behave.

use trainhub_plugin_sdk::prelude::*;

#[derive(Default)]
struct Misbehaving;

fn mode(ctx: &Ctx) -> String {
    ctx.settings()
        .get("mode")
        .and_then(Value::as_str)
        .unwrap_or("ok")
        .to_string()
}

/// Whether the fault applies to `phase`.
fn in_phase(ctx: &Ctx, phase: &str) -> bool {
    match ctx.settings().get("phases").and_then(Value::as_array) {
        None => true,
        Some(phases) => phases.iter().any(|p| p.as_str() == Some(phase)),
    }
}

/// Commits the configured fault in `phase`; returns only in modes `ok`,
/// `busy` and `garbage`, or outside the configured phases.
fn misbehave(ctx: &Ctx, phase: &str) {
    if !in_phase(ctx, phase) {
        return;
    }
    match mode(ctx).as_str() {
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "oom" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(std::hint::black_box(vec![7u8; 1 << 20]));
            }
        }
        "trap" => panic!("misbehaving plugin panics on purpose"),
        "busy" => {
            let rounds = ctx
                .settings()
                .get("iterations")
                .and_then(Value::as_u64)
                .unwrap_or(100_000_000);
            let mut n: u64 = 0;
            for _ in 0..rounds {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        _ => {}
    }
}

impl Plugin for Misbehaving {
    fn describe(&self) -> Descriptor {
        Descriptor::new("misbehaving", "0.1.0")
            .frameworks(["misbehaving"])
            .validates()
            .enforces_ml_policy()
            .builds()
    }

    fn validate_settings(&self, settings: &Value) -> Vec<FieldError> {
        match settings.get("mode").and_then(Value::as_str) {
            None | Some("ok" | "loop" | "oom" | "trap" | "garbage" | "busy") => Vec::new(),
            Some(other) => vec![FieldError::not_supported(
                "settings.mode",
                Some(other.to_string()),
                "supported values: ok, loop, oom, trap, garbage, busy",
            )],
        }
    }

    fn validate(&self, ctx: &Ctx, _: &TrainJob, _: &Runtime) -> Validation {
        misbehave(ctx, "validate");
        Validation::default()
    }

    fn enforce_ml_policy(
        &self,
        ctx: &Ctx,
        _: &mut RuntimeInfo,
        _: &TrainJob,
    ) -> Result<(), Failure> {
        misbehave(ctx, "enforce-ml-policy");
        Ok(())
    }

    fn build(
        &self,
        ctx: &Ctx,
        _: &RuntimeInfo,
        _: &TrainJob,
        _: &Target,
    ) -> Result<Vec<Value>, Failure> {
        misbehave(ctx, "build");
        if mode(ctx) == "garbage" && in_phase(ctx, "build") {
            return Ok(vec![json!("this is not a Kubernetes object")]);
        }
        Ok(Vec::new())
    }
}

export_plugin!(Misbehaving);
