//! Reads a file during validation, so its component imports
//! `wasi:filesystem`; the host must refuse to load it.

use trainhub_plugin_sdk::prelude::*;

#[derive(Default)]
struct UsesFs;

impl Plugin for UsesFs {
    fn describe(&self) -> Descriptor {
        Descriptor::new("uses-fs", "0.1.0").validates()
    }

    fn validate(&self, _: &Ctx, _: &TrainJob, _: &Runtime) -> Validation {
        let mut v = Validation::default();
        if let Ok(secret) = std::fs::read_to_string("/etc/shadow") {
            v.warn(secret);
        }
        v
    }
}

export_plugin!(UsesFs);
