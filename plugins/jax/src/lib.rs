//! trainhub's built-in `jax` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::jax`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::jax::Jax);
