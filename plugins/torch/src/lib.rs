//! trainhub's built-in `torch` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::torch`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::torch::Torch);
