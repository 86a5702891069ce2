//! ECDSA interoperability with an independent implementation: openssl
//! signs what trainhub verifies, and verifies what trainhub signs, the way
//! cosign's documentation signs payloads with openssl.

use std::path::Path;
use std::process::Command;

use trainhub_plugin_oci::{CosignSignature, DetachedSignature, Digest, PublicKey, SigningKey};

fn openssl(dir: &Path, args: &[&str]) -> Option<std::process::Output> {
    match Command::new("openssl").current_dir(dir).args(args).output() {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("skipped: openssl is not installed");
            None
        }
        Err(e) => panic!("running openssl: {e}"),
    }
}

#[test]
fn openssl_keys_and_signatures_interoperate() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let Some(out) = openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "key.pem",
        ],
    ) else {
        return;
    };
    assert!(out.status.success(), "{out:?}");
    let out = openssl(
        dir,
        &["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"],
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let public =
        PublicKey::from_pem(&std::fs::read_to_string(dir.join("pub.pem")).unwrap()).unwrap();
    // openssl's PKCS#8 private key is read, and is the same key.
    let signer =
        SigningKey::from_pem(&std::fs::read_to_string(dir.join("key.pem")).unwrap()).unwrap();
    assert_eq!(signer.public_key(), public);

    // openssl signs a cosign payload (as `cosign attach signature` takes it).
    let payload = trainhub_plugin_oci::cosign::payload(
        "127.0.0.1:5000/plugins/acme",
        &Digest::of(b"manifest"),
        &Default::default(),
    );
    std::fs::write(dir.join("payload.json"), &payload).unwrap();
    let out = openssl(
        dir,
        &[
            "dgst",
            "-sha256",
            "-sign",
            "key.pem",
            "-out",
            "payload.sig",
            "payload.json",
        ],
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let signature = CosignSignature {
        payload: payload.clone(),
        signature: std::fs::read(dir.join("payload.sig")).unwrap(),
    };
    assert!(signature.verifies_with(&public));

    // openssl verifies a detached signature trainhub wrote.
    let module = crate::component(4_000, 20);
    std::fs::write(dir.join("module.wasm"), &module).unwrap();
    let detached = DetachedSignature::sign(&signer, &module).unwrap();
    std::fs::write(dir.join("module.sig.der"), &detached.signature).unwrap();
    let verify = || {
        const ARGS: [&str; 7] = [
            "dgst",
            "-sha256",
            "-verify",
            "pub.pem",
            "-signature",
            "module.sig.der",
            "module.wasm",
        ];
        openssl(dir, &ARGS).unwrap()
    };
    let out = verify();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Verified OK"),
        "{out:?}"
    );
    // And refuses it for other bytes.
    std::fs::write(dir.join("module.wasm"), b"other").unwrap();
    assert!(!verify().status.success());
}
