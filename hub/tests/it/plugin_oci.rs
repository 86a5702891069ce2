//! `trainctl plugin` end to end: keygen, push with a signature, verify with
//! the right and the wrong key, detached signatures of a file, against a
//! real registry on loopback.

use std::path::Path;
use std::process::Command;

use trainhub_plugin_oci::local_registry::LocalRegistry;
use trainhub_plugin_oci::{Digest, ModuleRef, PlainHttp, RegistryClient, RegistryOptions};

use crate::common::wasm;

fn trainctl(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trainctl"))
        .current_dir(dir)
        .args(["plugin"])
        .args(args)
        .env("SOURCE_DATE_EPOCH", "1735689600")
        .env_remove("TRAINHUB_REGISTRY_USERNAME")
        .output()
        .expect("run trainctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn keygen_push_sign_verify_through_trainctl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(registry) = LocalRegistry::start_or_skip(&dir.path().join("registry"), None)
        .unwrap_or_else(|e| panic!("{e}"))
    else {
        return;
    };
    let dir = dir.path();
    for (key, public) in [("alice.key", "alice.pub"), ("mallory.key", "mallory.pub")] {
        let (code, out, err) = trainctl(dir, &["keygen", "--key", key, "--pub", public]);
        assert_eq!(code, 0, "{out}{err}");
    }
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir.join("alice.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (code, _, err) = trainctl(dir, &["keygen", "--key", "alice.key", "--pub", "x.pub"]);
    assert_ne!(code, 0);
    assert!(err.contains("exists"), "{err}");

    // A real component, pushed and signed in one go.
    let module = wasm("acme_plugin");
    std::fs::write(dir.join("acme.wasm"), &module).unwrap();
    let target = format!("oci://{}/plugins/acme:1.0", registry.address());
    let (code, out, err) = trainctl(
        dir,
        &[
            "push",
            "acme.wasm",
            &target,
            "--key",
            "alice.key",
            "--plain-http",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let pinned = out.trim().to_string();
    assert!(pinned.starts_with(&format!("{target}@sha256:")), "{out}");
    assert!(err.contains(&Digest::of(&module).hex()), "{err}");

    // The library pulls exactly those bytes; the config lists the
    // component's exports.
    let client = RegistryClient::new(RegistryOptions {
        plain_http: PlainHttp::Loopback,
        ..RegistryOptions::default()
    });
    let reference = ModuleRef::parse(&pinned).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pulled = runtime.block_on(client.pull(&reference)).unwrap();
    assert_eq!(pulled.bytes, module);
    let blob = |digest: &Digest| std::fs::read(registry.blob_path(digest)).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(&pulled.manifest_digest)).unwrap();
    let config_digest: Digest = manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let config: serde_json::Value = serde_json::from_slice(&blob(&config_digest)).unwrap();
    assert_eq!(config["os"], "wasip2");
    let exports = &config["component"]["exports"];
    assert!(
        exports
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e == "describe")),
        "{config}"
    );

    // The same module and SOURCE_DATE_EPOCH push to the same digest.
    let (code, out, err) = trainctl(dir, &["push", "acme.wasm", &target, "--plain-http"]);
    assert_eq!((code, out.trim()), (0, pinned.as_str()), "{err}");

    let (code, out, err) = trainctl(
        dir,
        &["verify", &pinned, "--key", "alice.pub", "--plain-http"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("verified, signed by allOf[0]"), "{out}");

    let (code, out, err) = trainctl(
        dir,
        &["verify", &pinned, "--key", "mallory.pub", "--plain-http"],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("Untrusted"), "{err}");

    // A tag alone is refused unless asked for.
    let (code, _, err) = trainctl(
        dir,
        &["verify", &target, "--key", "alice.pub", "--plain-http"],
    );
    assert_ne!(code, 0);
    assert!(err.contains("names a tag"), "{err}");
    let (code, _, err) = trainctl(
        dir,
        &[
            "verify",
            &target,
            "--key",
            "alice.pub",
            "--plain-http",
            "--allow-tag",
        ],
    );
    assert_eq!(code, 0, "{err}");

    // A policy file: anyOf of both keys, two needed; Mallory then signs.
    let policy = format!(
        "anyOf:\n  minimumMatches: 2\n  signatures:\n  - kind: pubKey\n    owner: alice\n    key: |\n{}  - kind: pubKey\n    owner: mallory\n    key: |\n{}",
        indent(&std::fs::read_to_string(dir.join("alice.pub")).unwrap()),
        indent(&std::fs::read_to_string(dir.join("mallory.pub")).unwrap()),
    );
    std::fs::write(dir.join("policy.yaml"), policy).unwrap();
    let verify_policy = || {
        trainctl(
            dir,
            &["verify", &pinned, "--policy", "policy.yaml", "--plain-http"],
        )
    };
    let (code, _, err) = verify_policy();
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("anyOf needs 2 matching signatures, found 1"),
        "{err}"
    );
    assert!(err.contains("\"mallory\""), "{err}");
    let (code, out, err) = trainctl(
        dir,
        &["sign", &pinned, "--key", "mallory.key", "--plain-http"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = verify_policy();
    assert_eq!(code, 0, "{out}{err}");

    // Detached: sign a file, verify it, refuse it once changed.
    let (code, out, err) = trainctl(dir, &["sign", "acme.wasm", "--key", "alice.key"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(dir.join("acme.wasm.sig").is_file());
    let verify_file = |key: &str| {
        trainctl(
            dir,
            &[
                "verify",
                "acme.wasm",
                "--key",
                key,
                "--sha256",
                &Digest::of(&module).hex(),
            ],
        )
    };
    let (code, out, err) = verify_file("alice.pub");
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = verify_file("mallory.pub");
    assert_eq!(code, 1, "{err}");

    // install: the objects that load them, digests filled in.
    std::fs::write(dir.join("settings.yaml"), "cluster: c1\n").unwrap();
    let (code, out, err) = trainctl(
        dir,
        &[
            "install",
            "acme.wasm",
            "--name",
            "acme",
            "--settings",
            "settings.yaml",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let object: serde_json::Value = serde_saphyr::from_str(&out).unwrap();
    assert_eq!(object["kind"], "TrainerPlugin");
    assert_eq!(object["metadata"]["name"], "acme");
    let spec = &object["spec"];
    assert_eq!(
        spec["module"],
        format!("file://{}", dir.join("acme.wasm").display())
    );
    assert_eq!(spec["sha256"], Digest::of(&module).hex());
    let sig = std::fs::read_to_string(dir.join("acme.wasm.sig")).unwrap();
    assert_eq!(spec["signature"], sig.trim());
    assert_eq!(spec["settings"], serde_json::json!({"cluster": "c1"}));
    let (code, out, err) = trainctl(dir, &["install", &target, "--name", "acme", "--plain-http"]);
    assert_eq!(code, 0, "{out}{err}");
    let object: serde_json::Value = serde_saphyr::from_str(&out).unwrap();
    assert_eq!(
        object["spec"]["module"], pinned,
        "the tag resolved to its digest"
    );
    let (code, _, err) = trainctl(dir, &["install", "acme.wasm", "--name", "Not_A_Name"]);
    assert_ne!(code, 0);
    assert!(err.contains("--name"), "{err}");
    let mut changed = module.clone();
    changed.push(0);
    std::fs::write(dir.join("acme.wasm"), &changed).unwrap();
    let (code, _, err) = verify_file("alice.pub");
    assert_ne!(code, 0);
    assert!(err.contains("DigestMismatch"), "{err}");
}

/// A PEM block indented for a YAML block scalar under `key: |`.
fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("      {l}\n")).collect()
}
