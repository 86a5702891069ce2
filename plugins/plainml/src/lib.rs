//! trainhub's built-in `plainml` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::plainml`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::plainml::PlainMl);
