//! trainhub's built-in `flux` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::flux`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::flux::Flux);
