//! trainhub's built-in `jobset` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::jobset`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::jobset::JobSet);
