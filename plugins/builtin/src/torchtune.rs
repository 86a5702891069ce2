//! TorchTune on the torch plugin, as upstream's
//! `pkg/runtime/framework/plugins/torch/torchtune.go` handles it: a TrainJob
//! whose `trainer.command` is exactly `tune run` gets the rest of the command
//! from the model (named by the runtime), the node count and the processes per
//! node, and the paths the runtime manages; the TrainJob's `trainer.args`
//! (its config overrides) follow as the container's args.

use std::fmt;

use trainhub_plugin_sdk::api::jobset::JobSetSpec;
use trainhub_plugin_sdk::api::trainer::Trainer;
use trainhub_plugin_sdk::prelude::*;

use crate::common::master_address;

/// The command that selects TorchTune.
pub(crate) const ENTRYPOINT: [&str; 2] = ["tune", "run"];

const ARG_RDZV_ENDPOINT: &str = "--rdzv_endpoint";
const ARG_CONFIG: &str = "--config";

const LORA_ATTN_MODULES: &str = "model.lora_attn_modules";
const QUANTIZE_BASE: &str = "model.quantize_base";
const USE_DORA: &str = "model.use_dora";

/// Config keys the runtime sets (on its own `node` command) and a TrainJob
/// may not override.
const IMMUTABLE_CONFIGS: [&str; 4] = [
    "output_dir",
    "tokenizer.path",
    "checkpointer.checkpoint_dir",
    "tokenizer.merges_file",
];

const LLAMA3_2_1B: &str = "llama3_2/1B";
const LLAMA3_2_3B: &str = "llama3_2/3B";
const LLAMA3_3_70B: &str = "llama3_3/70B";
const QWEN2_5_1_5B: &str = "qwen2_5/1.5B";
const SUPPORTED_MODELS: [&str; 4] = [LLAMA3_2_1B, LLAMA3_2_3B, LLAMA3_3_70B, QWEN2_5_1_5B];

/// Config name suffixes that mean QLoRA, and QLoRA on one device.
const QLORA_DISTRIBUTED_SUFFIX: &str = "_qlora";
const QLORA_SINGLE_DEVICE_SUFFIX: &str = "_qlora_single_device";

/// Processes per node as torchrun takes them: `auto`, or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProcsPerNode {
    Auto,
    Count(i128),
}

impl fmt::Display for ProcsPerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcsPerNode::Auto => f.write_str("auto"),
            ProcsPerNode::Count(n) => write!(f, "{n}"),
        }
    }
}

/// What decides the recipe and its config.
pub(crate) struct Shape<'a> {
    pub num_nodes: i128,
    pub procs: ProcsPerNode,
    pub gpus: i128,
    pub args: &'a [String],
    pub runtime_name: &'a str,
}

/// Whether `command` is exactly `tune run`.
pub(crate) fn is_entrypoint(command: Option<&[String]>) -> bool {
    command.is_some_and(|c| c.iter().map(String::as_str).eq(ENTRYPOINT))
}

/// The model a runtime named `<prefix>-<model>-<size>` fine-tunes:
/// `<model>/<SIZE>` with dots in the model turned into underscores
/// (`torchtune-llama3.2-1b` → `llama3_2/1B`); empty for any other name.
pub(crate) fn model_from_runtime_name(name: &str) -> String {
    match name.split('-').collect::<Vec<_>>()[..] {
        [_, model, size] => format!("{}/{}", model.replace('.', "_"), size.to_uppercase()),
        _ => String::new(),
    }
}

/// The recipe and the config (model and suffix) for `shape`.
pub(crate) fn recipe_and_config(shape: &Shape) -> (&'static str, String) {
    let one_node = shape.num_nodes == 1;
    let one_device = shape.procs == ProcsPerNode::Count(1) || shape.gpus == 1;
    let qlora = qlora_enabled(shape.args);
    let lora = lora_enabled(shape.args);
    let (recipe, suffix) = if one_node && one_device {
        if qlora {
            ("lora_finetune_single_device", QLORA_SINGLE_DEVICE_SUFFIX)
        } else if lora {
            ("lora_finetune_single_device", "_lora_single_device")
        } else {
            ("full_finetune_single_device", "_full_single_device")
        }
    } else if one_node && qlora {
        ("lora_finetune_distributed", QLORA_DISTRIBUTED_SUFFIX)
    } else if one_node && lora {
        ("lora_finetune_distributed", "_lora")
    } else if shape.num_nodes > 1 {
        ("full_finetune_distributed", "_full_multinode")
    } else {
        ("full_finetune_distributed", "_full")
    };
    let model = model_from_runtime_name(shape.runtime_name);
    (recipe, format!("{model}{suffix}"))
}

/// The full `tune run` command: the rendezvous endpoint when more than one
/// process runs, the recipe and its config, then the paths the runtime's own
/// command sets (see [`runtime_overrides`]).
pub(crate) fn command(job: &TrainJob, shape: &Shape, runtime_command: &[String]) -> Vec<String> {
    let mut command: Vec<String> = ENTRYPOINT.iter().map(|s| s.to_string()).collect();
    let several_processes = shape.num_nodes > 1
        || matches!(shape.procs, ProcsPerNode::Count(n) if n > 1)
        || (shape.procs == ProcsPerNode::Auto && shape.gpus > 1);
    if several_processes {
        command.push(format!(
            "{ARG_RDZV_ENDPOINT}={}:{}",
            master_address(job),
            constants::CONTAINER_TRAINER_PORT
        ));
    }
    let (recipe, config) = recipe_and_config(shape);
    command.extend([recipe.to_string(), ARG_CONFIG.to_string(), config]);
    command.extend(runtime_overrides(runtime_command));
    command
}

/// The `key=value` entries of the runtime's command whose key the runtime
/// manages (output directory, tokenizer, checkpoints), in its order.
pub(crate) fn runtime_overrides(runtime_command: &[String]) -> Vec<String> {
    runtime_command
        .iter()
        .filter(|entry| is_immutable(entry))
        .cloned()
        .collect()
}

/// The command of the `node` container of the runtime's trainer step (after
/// the TrainJob's runtime patches), empty without one.
pub(crate) fn runtime_command(info: &RuntimeInfo) -> Result<Vec<String>, Failure> {
    let spec: JobSetSpec = info.template_as()?;
    let command = spec
        .replicated_jobs
        .iter()
        .flatten()
        .filter(|rjob| {
            rjob.template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.as_ref())
                .and_then(|l| l.get(constants::LABEL_TRAINJOB_ANCESTOR))
                .is_some_and(|a| a == constants::ANCESTOR_TRAINER)
        })
        .filter_map(|rjob| rjob.template.spec.as_ref()?.template.spec.as_ref())
        .flat_map(|pod| pod.containers.iter())
        .filter(|c| c.name == constants::NODE)
        .flat_map(|c| c.command.iter().flatten().cloned())
        .collect();
    Ok(command)
}

/// Upstream's TorchTune checks of a TrainJob running `tune run`: a supported
/// model, one node except for Llama 3.3 70B, QLoRA only where it fits, no
/// LoRA across nodes, and no override of what the runtime manages.
pub(crate) fn validate(job: &TrainJob, trainer: &Trainer, gpus: i128) -> Vec<FieldError> {
    let runtime_name = job.spec.runtime_ref.name.as_str();
    let model = model_from_runtime_name(runtime_name);
    let args = trainer.args.as_deref().unwrap_or_default();
    let num_nodes = trainer.num_nodes.unwrap_or(1);
    let procs = trainer
        .num_proc_per_node
        .map_or(ProcsPerNode::Auto, |n| ProcsPerNode::Count(n.into()));
    let mut errors = Vec::new();
    if !SUPPORTED_MODELS.contains(&model.as_str()) {
        errors.push(FieldError::invalid(
            "spec.runtimeRef.name",
            Some(runtime_name.to_string()),
            format!("must have a supported pretrained model, invalid model configured: {model}"),
        ));
    }
    if num_nodes > 1 && model != LLAMA3_3_70B {
        errors.push(FieldError::invalid(
            "spec.trainer.numNodes",
            Some(num_nodes.to_string()),
            format!("must be 1 for {model} model"),
        ));
    }
    let shape = Shape {
        num_nodes: num_nodes.into(),
        procs,
        gpus,
        args,
        runtime_name,
    };
    let (_, config) = recipe_and_config(&shape);
    if config.contains(QLORA_DISTRIBUTED_SUFFIX) {
        errors.extend(qlora_errors(trainer, runtime_name, &config, procs));
    }
    if num_nodes > 1 && (lora_enabled(args) || qlora_enabled(args)) {
        errors.push(FieldError::invalid(
            "spec.trainer.numNodes",
            Some(num_nodes.to_string()),
            "LoRA fine-tuning is not supported for multi-node training in TorchTune",
        ));
    }
    errors.extend(immutable_arg_errors(args));
    errors
}

/// QLoRA is not offered for Qwen 2.5 1.5B, and runs on one device for the
/// Llama 3.2 models.
fn qlora_errors(
    trainer: &Trainer,
    runtime_name: &str,
    config: &str,
    procs: ProcsPerNode,
) -> Vec<FieldError> {
    let model = model_from_runtime_name(runtime_name);
    let model = model.as_str();
    let mut errors = Vec::new();
    if model == QWEN2_5_1_5B {
        errors.push(FieldError::invalid(
            "spec.runtimeRef.name",
            Some(runtime_name.to_string()),
            format!("QLoRA is not supported for {model} model"),
        ));
    }
    if !config.contains(QLORA_SINGLE_DEVICE_SUFFIX) && [LLAMA3_2_1B, LLAMA3_2_3B].contains(&model) {
        errors.push(FieldError::invalid(
            "spec.trainer.numProcPerNode",
            Some(procs.to_string()),
            format!("must be auto or 1 for {model} model when using QLoRA"),
        ));
        errors.push(FieldError::invalid(
            "spec.trainer.resourcesPerNode",
            trainer
                .resources_per_node
                .as_ref()
                .and_then(|r| serde_json::to_string(r).ok()),
            format!("must have gpu resource with value 1 for {model} model when using QLoRA"),
        ));
    }
    errors
}

fn immutable_arg_errors(args: &[String]) -> Vec<FieldError> {
    args.iter()
        .enumerate()
        .filter(|(_, arg)| is_immutable(arg))
        .map(|(i, arg)| {
            let key = config_key(arg);
            FieldError::invalid(
                format!("spec.trainer.args[{i}]"),
                Some(arg.clone()),
                format!(
                    "must not set immutable config {key:?} in trainer args; it is managed by the runtime"
                ),
            )
        })
        .collect()
}

fn config_key(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(key, _)| key)
}

fn is_immutable(entry: &str) -> bool {
    IMMUTABLE_CONFIGS.contains(&config_key(entry))
}

/// LoRA: an argument mentions the LoRA attention modules.
fn lora_enabled(args: &[String]) -> bool {
    args.iter().any(|arg| arg.contains(LORA_ATTN_MODULES))
}

/// QLoRA: the base model is quantised, and DoRA is not on.
fn qlora_enabled(args: &[String]) -> bool {
    !bool_arg_enabled(args, USE_DORA) && bool_arg_enabled(args, QUANTIZE_BASE)
}

/// A `key=value` argument whose key mentions `item` and whose value is
/// Python's true (any case, surrounding spaces ignored).
fn bool_arg_enabled(args: &[String], item: &str) -> bool {
    args.iter().any(|arg| {
        arg.split_once('=').is_some_and(|(key, value)| {
            key.contains(item) && value.trim().eq_ignore_ascii_case("true")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn config(num_nodes: i128, procs: ProcsPerNode, gpus: i128, list: &[&str]) -> String {
        let args = args(list);
        let shape = Shape {
            num_nodes,
            procs,
            gpus,
            args: &args,
            runtime_name: "torchtune-llama3.2-1b",
        };
        let (recipe, config) = recipe_and_config(&shape);
        format!("{recipe} {config}")
    }

    #[test]
    fn models_come_from_three_part_runtime_names() {
        assert_eq!(
            model_from_runtime_name("torchtune-llama3.2-1b"),
            LLAMA3_2_1B
        );
        assert_eq!(
            model_from_runtime_name("torchtune-qwen2.5-1.5b"),
            QWEN2_5_1_5B
        );
        assert_eq!(model_from_runtime_name("torch-distributed"), "");
        assert_eq!(model_from_runtime_name("a-b-c-d"), "");
    }

    #[test]
    fn recipes_follow_nodes_devices_and_lora() {
        use ProcsPerNode::{Auto, Count};
        let one = "full_finetune_single_device llama3_2/1B_full_single_device";
        assert_eq!(config(1, Count(1), 0, &[]), one);
        assert_eq!(config(1, Auto, 1, &[]), one);
        assert_eq!(
            config(1, Auto, 2, &[]),
            "full_finetune_distributed llama3_2/1B_full"
        );
        assert_eq!(
            config(2, Auto, 2, &[]),
            "full_finetune_distributed llama3_2/1B_full_multinode"
        );
        let lora = ["model.lora_attn_modules=[q_proj,v_proj]"];
        assert_eq!(
            config(1, Count(1), 0, &lora),
            "lora_finetune_single_device llama3_2/1B_lora_single_device"
        );
        assert_eq!(
            config(1, Auto, 4, &lora),
            "lora_finetune_distributed llama3_2/1B_lora"
        );
        let qlora = ["model.quantize_base= True "];
        assert_eq!(
            config(1, Auto, 1, &qlora),
            "lora_finetune_single_device llama3_2/1B_qlora_single_device"
        );
        assert_eq!(
            config(1, Auto, 4, &qlora),
            "lora_finetune_distributed llama3_2/1B_qlora"
        );
        let dora = ["model.quantize_base=True", "model.use_dora=true"];
        assert_eq!(
            config(1, Auto, 4, &dora),
            "full_finetune_distributed llama3_2/1B_full"
        );
        assert_eq!(
            config(1, Auto, 4, &["model.quantize_base=False"]),
            "full_finetune_distributed llama3_2/1B_full"
        );
    }

    #[test]
    fn only_managed_keys_are_taken_from_the_runtime() {
        let runtime = args(&[
            "tune",
            "run",
            "dataset.source=parquet",
            "output_dir=/workspace/output",
            "tokenizer.path=/workspace/model/original/tokenizer.model",
            "checkpointer.checkpoint_dir=/workspace/model",
        ]);
        assert_eq!(
            runtime_overrides(&runtime),
            args(&[
                "output_dir=/workspace/output",
                "tokenizer.path=/workspace/model/original/tokenizer.model",
                "checkpointer.checkpoint_dir=/workspace/model",
            ])
        );
    }
}
