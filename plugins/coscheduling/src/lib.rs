//! trainhub's built-in `coscheduling` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::coscheduling`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::coscheduling::Coscheduling);
