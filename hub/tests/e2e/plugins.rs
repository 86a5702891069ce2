//! `TrainerPlugin` objects through kubectl: the built-ins listed read-only,
//! a module pinned by digest loaded without a restart (or refused with the
//! reason in its status), live for admission at once, and gone when its
//! object is deleted.

use std::time::Duration;

use sha2::Digest as _;

use crate::common::{DevHub, tail};
use crate::kubectl::eventually;

/// The `Ready` condition of a TrainerPlugin as `status/reason/message`.
fn ready(hub: &DevHub, name: &str) -> String {
    let out = hub.kubectl(&[
        "get",
        "trainerplugin",
        name,
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].reason}/{.status.conditions[?(@.type=="Ready")].message}"#,
    ]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn plugin_object(module: &str, sha256: &str, settings: &str, generation_note: &str) -> String {
    format!(
        "apiVersion: trainhub.kubeflow.org/v1alpha1\nkind: TrainerPlugin\nmetadata:\n  name: acme\n  annotations:\n    note: {generation_note}\nspec:\n  module: {module}\n  sha256: {sha256:?}\n  settings: {settings}\n"
    )
}

fn apply(hub: &DevHub, yaml: &str) -> std::process::Output {
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(yaml))
}

#[test]
fn trainer_plugins_are_installed_checked_and_removed_through_the_api() {
    let hub = DevHub::start();
    // The built-ins are listed, Ready, and read-only.
    let mut table = String::new();
    let listed = eventually(Duration::from_secs(30), || {
        table = hub.kubectl_ok(&["get", "trainerplugins"]);
        table.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.first() == Some(&"builtin-torch")
                && cells.get(1) == Some(&"True")
                && cells.get(2) == Some(&"Builtin")
        })
    });
    assert!(listed, "{table}\n{}", tail(&hub.log(), 30));
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "REASON", "VERSION", "FRAMEWORKS", "AGE"],
        "{table}"
    );
    let refused = hub.kubectl(&["delete", "trainerplugin", "builtin-torch"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("the built-in plugins' objects are the hub's own"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // The acme component as a file on the hub, pinned by its digest.
    let bytes =
        std::fs::read(std::path::Path::new(trainhub::builtin::WASM_DIR).join("acme_plugin.wasm"))
            .expect("the acme plugin is built with the hub");
    let file = hub.dir.path().join("acme.wasm");
    std::fs::write(&file, &bytes).unwrap();
    let module = format!("file://{}", file.display());
    let sha = hex::encode(sha2::Sha256::digest(&bytes));

    // A wrong digest: refused, saying so.
    let out = apply(
        &hub,
        &plugin_object(&module, &"0".repeat(64), "{cluster: c1}", "wrong-digest"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut state = String::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            state = ready(&hub, "acme");
            state.starts_with("False/DigestMismatch/")
        }),
        "{state}"
    );
    assert!(
        state.contains(&sha),
        "the message names the digest found: {state}"
    );
    // The right digest without the settings it requires.
    apply(&hub, &plugin_object(&module, &sha, "{}", "no-settings"));
    assert!(
        eventually(Duration::from_secs(30), || {
            state = ready(&hub, "acme");
            state.starts_with("False/SettingsRejected/") && state.contains("settings.cluster")
        }),
        "{state}"
    );
    // A digest given twice that disagrees is refused at the API.
    let twice = plugin_object(
        &format!("oci://r.example/acme:1@sha256:{}", "1".repeat(64)),
        &sha,
        "{}",
        "x",
    );
    let out = apply(&hub, &twice);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("spec.sha256"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Acme's runtime: no plugin serves it yet.
    let runtime = std::fs::read_to_string(hub_repo().join("examples/acme/runtime.yaml")).unwrap();
    let out = apply(&hub, &runtime);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = |name: &str, with_project: bool| {
        let env = if with_project {
            "    env:\n      - name: ACME_PROJECT\n        value: recommender\n"
        } else {
            ""
        };
        format!(
            "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\nspec:\n  runtimeRef:\n    name: acme-distributed\n  trainer:\n    numNodes: 1\n{env}"
        )
    };

    // Loaded: Ready, its digest and description in the status, and live for
    // admission without a restart.
    apply(&hub, &plugin_object(&module, &sha, "{cluster: c1}", "good"));
    assert!(
        eventually(Duration::from_secs(30), || {
            state = ready(&hub, "acme");
            state.starts_with("True/Loaded/")
        }),
        "{state}\n{}",
        tail(&hub.log(), 30)
    );
    let digest = hub.kubectl_ok(&[
        "get",
        "trainerplugin",
        "acme",
        "-o",
        "jsonpath={.status.digest} {.status.plugin.name} {.status.plugin.frameworks}",
    ]);
    assert_eq!(digest.trim(), format!("sha256:{sha} acme [\"acme\"]"));
    let mut refusal = String::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            let out = apply(&hub, &job("no-project", false));
            refusal = String::from_utf8_lossy(&out.stderr).into_owned();
            !out.status.success() && refusal.contains("ACME_PROJECT must be set")
        }),
        "{refusal}"
    );
    let out = apply(&hub, &job("with-project", true));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Deleted: the plugin is gone; acme's runtime falls back to plainml,
    // which asks for no project.
    hub.kubectl_ok(&["delete", "trainerplugin", "acme"]);
    assert!(
        eventually(Duration::from_secs(10), || {
            apply(&hub, &job("after-delete", false)).status.success()
        }),
        "a TrainJob without ACME_PROJECT is still refused after the plugin's deletion"
    );
}

fn hub_repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `oci://` modules: pushed to a real registry on loopback, pulled by
/// digest, refused when tampered, unsigned or signed by an untrusted key
/// under the hub's trust policy, loaded when a trusted key signed them; a
/// registry gone leaves the loaded version serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_plugins_are_pulled_by_digest_and_checked_against_the_trust_policy() {
    use std::collections::BTreeMap;
    use trainhub_plugin_oci::local_registry::LocalRegistry;
    use trainhub_plugin_oci::{
        CosignSignature, ModuleRef, PlainHttp, RegistryClient, RegistryOptions, SigningKey,
        TrustPolicy, generate_key_pair,
    };

    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(mut registry) =
        LocalRegistry::start_or_skip(&dir.path().join("registry"), None).unwrap()
    else {
        return;
    };
    let address = registry.address();
    let (trusted, stranger) = (generate_key_pair().unwrap(), generate_key_pair().unwrap());
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        serde_json::to_string(&TrustPolicy::all_of_keys(std::slice::from_ref(
            &trusted.public_pem,
        )))
        .unwrap(),
    )
    .unwrap();
    let policy_arg = policy.display().to_string();
    // An HTTPS server for https:// modules, its CA given to the hub.
    let web = dir.path().join("web");
    std::fs::create_dir_all(&web).unwrap();
    let ca = trainhub_apiserver::pki::Ca::generate("plugins-test-ca").unwrap();
    let served = ca.issue_server("localhost", &["localhost"], &[]).unwrap();
    for (file, pem) in [
        ("ca.pem", ca.cert_pem()),
        ("cert.pem", served.cert_pem.as_str()),
        ("key.pem", served.key_pem.as_str()),
    ] {
        std::fs::write(dir.path().join(file), pem).unwrap();
    }
    let https_port = crate::common::free_port();
    let mut https_server = std::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-WWW", "-accept"])
        .arg(format!("127.0.0.1:{https_port}"))
        .arg("-cert")
        .arg(dir.path().join("cert.pem"))
        .arg("-key")
        .arg(dir.path().join("key.pem"))
        .current_dir(&web)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("openssl s_server");
    let ca_arg = dir.path().join("ca.pem").display().to_string();
    let hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--plugin-insecure-registries",
            &address,
            "--plugin-trust-policy",
            &policy_arg,
            "--plugin-ca-file",
            &ca_arg,
        ],
        |_| {},
    );
    let client = RegistryClient::new(RegistryOptions {
        plain_http: PlainHttp::Loopback,
        ..RegistryOptions::default()
    });
    let acme =
        std::fs::read(std::path::Path::new(trainhub::builtin::WASM_DIR).join("acme_plugin.wasm"))
            .unwrap();
    let push = |tag: &str, bytes: Vec<u8>| {
        let client = client.clone();
        let target = ModuleRef::parse(&format!("oci://{address}/plugins/acme:{tag}")).unwrap();
        async move {
            client
                .push(&target, &bytes, "2026-11-26T00:00:00Z", &BTreeMap::new())
                .await
                .unwrap()
        }
    };
    let sign = |pushed: &trainhub_plugin_oci::PushedModule, pem: &str| {
        let client = client.clone();
        let key = SigningKey::from_pem(pem).unwrap();
        let signature = CosignSignature::sign(
            &key,
            &pushed.reference.repository_name(),
            &pushed.manifest_digest,
            &BTreeMap::new(),
        )
        .unwrap();
        let reference = pushed.reference.pinned(pushed.manifest_digest);
        async move { client.push_signature(&reference, &signature).await.unwrap() }
    };
    // Each variant a different module: a custom section changes the digest.
    let variant = |note: &[u8]| {
        let mut bytes = acme.clone();
        let name = b"note";
        bytes.push(0);
        bytes.push(u8::try_from(1 + name.len() + note.len()).unwrap());
        bytes.push(u8::try_from(name.len()).unwrap());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(note);
        bytes
    };
    let object = |name: &str, pushed: &trainhub_plugin_oci::PushedModule| {
        format!(
            "apiVersion: trainhub.kubeflow.org/v1alpha1\nkind: TrainerPlugin\nmetadata:\n  name: {name}\nspec:\n  module: oci://{address}/plugins/acme@{}\n  settings: {{cluster: c1}}\n",
            pushed.manifest_digest
        )
    };
    let wait_ready = |name: &str, expected: &str| {
        let mut state = String::new();
        let ok = eventually(Duration::from_secs(60), || {
            state = ready(&hub, name);
            state.starts_with(expected)
        });
        assert!(ok, "{name}: {state}\n{}", tail(&hub.log(), 30));
        state
    };

    // Signed by the trusted key: loaded, the module's digest in the status.
    let good = push("good", variant(b"good")).await;
    sign(&good, &trusted.private_pem).await;
    assert!(apply(&hub, &object("good", &good)).status.success());
    wait_ready("good", "True/Loaded/");
    let digest = hub.kubectl_ok(&["get", "tplugin", "good", "-o", "jsonpath={.status.digest}"]);
    assert_eq!(digest, good.module_digest.to_string());

    // Unsigned, and signed by a key the policy does not name: Untrusted,
    // naming the key that is missing.
    let unsigned = push("unsigned", variant(b"unsigned")).await;
    apply(&hub, &object("unsigned", &unsigned));
    let state = wait_ready("unsigned", "False/Untrusted/");
    assert!(
        state.contains("no signature found") && state.contains("allOf[0]"),
        "{state}"
    );
    let foreign = push("foreign", variant(b"foreign")).await;
    sign(&foreign, &stranger.private_pem).await;
    apply(&hub, &object("foreign", &foreign));
    let state = wait_ready("foreign", "False/Untrusted/");
    assert!(state.contains("allOf[0]"), "{state}");

    // A layer changed in the registry's storage: DigestMismatch.
    let tampered = push("tampered", variant(b"tampered")).await;
    sign(&tampered, &trusted.private_pem).await;
    let blob = registry.blob_path(&tampered.module_digest);
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    apply(&hub, &object("tampered", &tampered));
    wait_ready("tampered", "False/DigestMismatch/");

    // An https:// module pinned by its sha256, its detached signature by
    // the trusted key in spec.signature: loaded. Unsigned: Untrusted. A
    // sha256 other than the served bytes': DigestMismatch.
    let served = variant(b"https");
    std::fs::write(web.join("acme.wasm"), &served).unwrap();
    let served_sha = hex::encode(sha2::Sha256::digest(&served));
    let signature = trainhub_plugin_oci::DetachedSignature::sign(
        &SigningKey::from_pem(&trusted.private_pem).unwrap(),
        &served,
    )
    .unwrap()
    .to_file_text();
    let url_object = |name: &str, sha: &str, signature: Option<&str>| {
        let signature = signature
            .map(|s| format!("  signature: \"{}\"\n", s.trim()))
            .unwrap_or_default();
        format!(
            "apiVersion: trainhub.kubeflow.org/v1alpha1\nkind: TrainerPlugin\nmetadata:\n  name: {name}\nspec:\n  module: https://localhost:{https_port}/acme.wasm\n  sha256: \"{sha}\"\n  settings: {{cluster: c1}}\n{signature}"
        )
    };
    let out = apply(&hub, &url_object("web", &served_sha, Some(&signature)));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_ready("web", "True/Loaded/");
    apply(&hub, &url_object("web-unsigned", &served_sha, None));
    wait_ready("web-unsigned", "False/Untrusted/");
    let other_sha = hex::encode(sha2::Sha256::digest(b"other bytes"));
    apply(
        &hub,
        &url_object("web-pinned-elsewhere", &other_sha, Some(&signature)),
    );
    let state = wait_ready("web-pinned-elsewhere", "False/DigestMismatch/");
    assert!(state.contains(&other_sha), "{state}");
    let _ = https_server.kill();
    let _ = https_server.wait();

    // The registry gone: a new generation of `good` cannot be pulled, and
    // the version loaded before keeps serving.
    registry.kill();
    let moved = hub.kubectl(&[
        "patch",
        "tplugin",
        "good",
        "--type=merge",
        "-p",
        r#"{"spec":{"settings":{"cluster":"c2"}}}"#,
    ]);
    assert!(
        moved.status.success(),
        "{}",
        String::from_utf8_lossy(&moved.stderr)
    );
    let state = wait_ready("good", "False/PullFailed/");
    assert!(
        state.contains(&format!(
            "(the earlier version {} keeps serving)",
            good.module_digest
        )),
        "{state}"
    );
    let runtime = std::fs::read_to_string(hub_repo().join("examples/acme/runtime.yaml")).unwrap();
    assert!(apply(&hub, &runtime).status.success());
    let job = "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: no-project\nspec:\n  runtimeRef:\n    name: acme-distributed\n";
    let out = apply(&hub, job);
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("ACME_PROJECT must be set"),
        "the loaded version still validates: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `trainhub compile-builtin-plugins`, which a hub's first start runs as a
/// child so that the compiler's memory is not the hub's: it fills the
/// compilation cache with every built-in not cached yet, one file per
/// digest, and leaves those already there untouched.
#[test]
fn the_builtins_are_compiled_into_the_cache_by_a_child_process() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cache = dir.path().join("plugin-cache");
    std::fs::create_dir_all(&cache).unwrap();
    // What the other tests compiled already, but one, to keep this quick.
    let mut copied = Vec::new();
    for entry in std::fs::read_dir(crate::common::plugin_cache())
        .into_iter()
        .flatten()
        .flatten()
    {
        std::fs::copy(entry.path(), cache.join(entry.file_name())).unwrap();
        copied.push(entry.file_name());
    }
    // One built-in this engine has in the cache (files of other engines,
    // from before a change of wasmtime or of its settings, may be there
    // too) is removed, with every file of its digest.
    let host = trainhub::plugins::Host::new(&trainhub::plugins::HostConfig {
        cache_dir: Some(cache.clone()),
        ..Default::default()
    })
    .unwrap();
    let removed = trainhub::builtin::BUILTIN_COMPONENTS
        .iter()
        .map(|(_, digest, _)| *digest)
        .find(|digest| host.is_cached(*digest));
    if let Some(digest) = removed {
        let prefix = format!("{}-", hex::encode(digest));
        copied.retain(|name| {
            let of_it = name.to_string_lossy().starts_with(&prefix);
            if of_it {
                std::fs::remove_file(cache.join(name)).unwrap();
            }
            !of_it
        });
        assert!(!host.is_cached(digest));
    }
    let kept: Vec<(std::ffi::OsString, std::time::SystemTime)> = copied
        .iter()
        .map(|n| {
            (
                n.clone(),
                cache.join(n).metadata().unwrap().modified().unwrap(),
            )
        })
        .collect();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trainhub"))
        .args(["compile-builtin-plugins", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for (name, digest, _) in trainhub::builtin::BUILTIN_COMPONENTS {
        let prefix = format!("{}-", hex::encode(digest));
        assert!(
            files
                .iter()
                .any(|f| f.starts_with(&prefix) && f.ends_with(".cwasm")),
            "{name} is not in the cache: {files:?}"
        );
    }
    if let Some(digest) = removed {
        assert!(
            host.is_cached(digest),
            "{} compiled again",
            hex::encode(digest)
        );
    }
    for (name, modified) in kept {
        assert_eq!(
            cache.join(&name).metadata().unwrap().modified().unwrap(),
            modified,
            "{name:?} was cached and is rewritten"
        );
    }
}
