//! trainhub's built-in `volcano` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::volcano`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::volcano::Volcano);
