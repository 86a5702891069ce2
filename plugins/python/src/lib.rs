//! trainhub's built-in `python` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::python`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::python::Python);
