//! trainhub's built-in `xgboost` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::xgboost`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::xgboost::Xgboost);
