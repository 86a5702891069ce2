//! trainhub's built-in `mpi` plugin as a WebAssembly component; the logic is `trainhub_builtin_plugins::mpi`.
trainhub_plugin_sdk::export_plugin!(trainhub_builtin_plugins::mpi::Mpi);
