//! Opens a TCP connection during validation, so its component imports
//! `wasi:sockets`; the host must refuse to load it.

use trainhub_plugin_sdk::prelude::*;

#[derive(Default)]
struct UsesNet;

impl Plugin for UsesNet {
    fn describe(&self) -> Descriptor {
        Descriptor::new("uses-net", "0.1.0").validates()
    }

    fn validate(&self, _: &Ctx, _: &TrainJob, _: &Runtime) -> Validation {
        let mut v = Validation::default();
        if std::net::TcpStream::connect("127.0.0.1:9").is_ok() {
            v.warn("connected");
        }
        v
    }
}

export_plugin!(UsesNet);
