//! The checked-in generated code matches `proto/`.

use std::path::Path;

#[test]
fn generated_code_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path().unwrap());
    tonic_prost_build::configure()
        .out_dir(out.path())
        .compile_with_config(
            config,
            &[root.join("proto/spoke.proto")],
            &[root.join("proto")],
        )
        .unwrap();
    let name = "trainhub.spoke.v1.rs";
    let fresh = std::fs::read_to_string(out.path().join(name)).unwrap();
    let checked_in = root.join("src/generated").join(name);
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        std::fs::write(&checked_in, &fresh).unwrap();
        return;
    }
    let current = std::fs::read_to_string(&checked_in).unwrap_or_default();
    assert!(
        current == fresh,
        "{} is stale: run `UPDATE_GENERATED=1 cargo test -p trainhub-proto`",
        checked_in.display()
    );
}
