//! Writes the generated trainer.kubeflow.org CRDs to `manifests/crds/` (or to the directory
//! given as the only argument), overwriting the files there.
//!
//! ```text
//! cargo run -p trainhub-api --example crdgen [DIR]
//! ```

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = match std::env::args_os().nth(1) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../manifests/crds"),
    };
    std::fs::create_dir_all(&dir)?;
    for (name, yaml) in trainhub_api::crd::manifests()? {
        let path = dir.join(name);
        std::fs::write(&path, yaml)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
