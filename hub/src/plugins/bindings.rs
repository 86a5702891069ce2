//! The one `bindgen!` site of the hub: host-side bindings of `wit/plugin.wit`.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
});

pub use trainhub::plugin::host::Level;
pub use trainhub::plugin::types as wit;
