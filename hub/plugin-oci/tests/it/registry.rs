//! Push, pull by digest, tampering, limits, and a registry that goes away.

use trainhub_plugin_oci::artifact::{Manifest, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE};
use trainhub_plugin_oci::{
    Digest, Error, Limits, Object, PlainHttp, RegistryClient, RegistryOptions,
};

use crate::{CREATED, client, component, module_ref, no_annotations, push};
use trainhub_plugin_oci::local_registry::free_port;

#[tokio::test]
async fn push_then_pull_by_digest_round_trips() {
    let Some(registry) = crate::start_registry() else {
        return;
    };
    let client = client();
    let module = component(300_000, 1);
    let target = module_ref(&registry.address(), "plugins/acme:1.0");
    let pushed = client
        .push(&target, &module, CREATED, &no_annotations())
        .await
        .unwrap();
    assert_eq!(pushed.module_digest, Digest::of(&module));
    assert_eq!(pushed.reference.digest, Some(pushed.manifest_digest));
    assert_eq!(pushed.reference.tag.as_deref(), Some("1.0"));

    let pulled = client.pull(&pushed.reference).await.unwrap();
    assert_eq!(pulled.bytes, module);
    assert_eq!(pulled.module_digest, Digest::of(&module));
    assert_eq!(pulled.manifest_digest, pushed.manifest_digest);
    assert_eq!(pulled.media_type, WASM_LAYER_MEDIA_TYPE);

    // The tag resolves to the pushed digest; a tag alone is not pulled.
    let resolved = client.resolve(&target).await.unwrap();
    assert_eq!(resolved.digest, Some(pushed.manifest_digest));
    let e = client.pull(&target).await.unwrap_err();
    assert!(matches!(e, Error::NotPinned { .. }), "{e}");

    // A digest-only reference (no tag) pulls the same bytes.
    let by_digest = module_ref(
        &registry.address(),
        &format!("plugins/acme@{}", pushed.manifest_digest),
    );
    assert_eq!(client.pull(&by_digest).await.unwrap().bytes, module);

    // Pushing the same module again is idempotent: same manifest digest.
    let again = client
        .push(&target, &module, CREATED, &no_annotations())
        .await
        .unwrap();
    assert_eq!(again.manifest_digest, pushed.manifest_digest);

    // The layout is the CNCF one: config v0, one application/wasm layer,
    // config saying wasip2 with the layer's digest.
    let manifest_blob = std::fs::read(registry.blob_path(&pushed.manifest_digest)).unwrap();
    let manifest = Manifest::parse("m", &manifest_blob).unwrap();
    let config = manifest.config.as_ref().unwrap();
    assert_eq!(config.media_type, WASM_CONFIG_MEDIA_TYPE);
    assert_eq!(manifest.layers.len(), 1);
    let config_digest: Digest = config.digest.parse().unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(registry.blob_path(&config_digest)).unwrap())
            .unwrap();
    assert_eq!(config["os"], "wasip2");
    assert_eq!(config["architecture"], "wasm");
    assert_eq!(config["layerDigests"][0], Digest::of(&module).to_string());
    assert_eq!(config["component"]["exports"], serde_json::json!([]));

    // A digest nothing was pushed under is NotFound.
    let missing = module_ref(
        &registry.address(),
        &format!("plugins/acme@{}", Digest::of(b"nothing")),
    );
    let e = client.pull(&missing).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

#[tokio::test]
async fn a_tampered_layer_is_refused_with_digest_mismatch() {
    let Some(registry) = crate::start_registry() else {
        return;
    };
    let client = client();
    let module = component(50_000, 2);
    let pushed = push(&registry.address(), "plugins/tampered:1", &module).await;
    let blob = registry.blob_path(&pushed.module_digest);
    assert_eq!(std::fs::read(&blob).unwrap(), module);

    // Same length, one byte changed.
    let mut tampered = module.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 0xff;
    std::fs::write(&blob, &tampered).unwrap();
    let e = client.pull(&pushed.reference).await.unwrap_err();
    match &e {
        Error::DigestMismatch {
            object,
            expected,
            actual,
            ..
        } => {
            assert_eq!(*object, Object::Layer);
            assert_eq!(*expected, pushed.module_digest);
            assert_eq!(*actual, Digest::of(&tampered));
        }
        other => panic!("expected DigestMismatch, got {other}"),
    }
    assert_eq!(e.reason(), "DigestMismatch");
    assert!(
        e.to_string().contains(&pushed.module_digest.to_string()),
        "{e}"
    );

    // Longer than the descriptor says: stopped there.
    let mut longer = module.clone();
    longer.extend_from_slice(b"appended code");
    std::fs::write(&blob, &longer).unwrap();
    let e = client.pull(&pushed.reference).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::SizeMismatch {
                object: Object::Layer,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.reason(), "DigestMismatch");

    // Truncated.
    std::fs::write(&blob, &module[..module.len() / 2]).unwrap();
    let e = client.pull(&pushed.reference).await.unwrap_err();
    assert_eq!(e.reason(), "DigestMismatch", "{e}");

    // Restored, it pulls again.
    std::fs::write(&blob, &module).unwrap();
    assert_eq!(client.pull(&pushed.reference).await.unwrap().bytes, module);
}

#[tokio::test]
async fn limits_bound_what_is_read() {
    let Some(registry) = crate::start_registry() else {
        return;
    };
    let module = component(20_000, 3);
    let pushed = push(&registry.address(), "plugins/big:1", &module).await;
    // Each limit below what the module needs stops the pull at that object.
    let cases = [
        (
            Limits {
                max_module_bytes: 10_000,
                ..Limits::default()
            },
            Object::Layer,
        ),
        (
            Limits {
                max_manifest_bytes: 100,
                ..Limits::default()
            },
            Object::Manifest,
        ),
    ];
    for (limits, expected) in cases {
        let limit = limits.max_module_bytes.min(limits.max_manifest_bytes);
        let client = RegistryClient::new(RegistryOptions {
            plain_http: PlainHttp::Loopback,
            limits,
            ..RegistryOptions::default()
        });
        let e = client.pull(&pushed.reference).await.unwrap_err();
        match e {
            Error::TooLarge {
                object, limit: l, ..
            } => assert_eq!((object, l), (expected, limit)),
            other => panic!("expected TooLarge for the {expected}, got {other}"),
        }
    }
}

#[tokio::test]
async fn a_registry_that_goes_away_is_unavailable() {
    let Some(mut registry) = crate::start_registry() else {
        return;
    };
    let client = client();
    let module = component(1_000, 4);
    let pushed = push(&registry.address(), "plugins/gone:1", &module).await;
    let last_good = client.pull(&pushed.reference).await.unwrap();

    registry.kill();
    let e = client.pull(&pushed.reference).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    assert!(e.is_transient());
    assert_eq!(e.reason(), "RegistryUnavailable");
    let text = e.to_string();
    assert!(text.contains(&registry.address()), "{text}");
    assert!(text.contains("unavailable"), "{text}");
    // What the caller kept is intact.
    assert_eq!(last_good.bytes, module);

    // Without plain HTTP allowed, a loopback registry is spoken to over TLS
    // only (here: nothing listens at all).
    let nobody = module_ref(
        &format!("127.0.0.1:{}", free_port().unwrap()),
        &format!("plugins/x@{}", Digest::of(b"x")),
    );
    let https_only = RegistryClient::new(RegistryOptions::default());
    let e = https_only.pull(&nobody).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
}

#[tokio::test]
async fn https_is_used_unless_plain_http_is_allowed() {
    let Some(registry) = crate::start_registry() else {
        return;
    };
    let target = module_ref(&registry.address(), "plugins/tls:1");
    let e = RegistryClient::new(RegistryOptions::default())
        .push(&target, &component(10, 5), CREATED, &no_annotations())
        .await
        .unwrap_err();
    // The plain-HTTP registry does not speak TLS: the client never falls
    // back to HTTP by itself.
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    // Listing the registry by name allows it.
    let listed = RegistryClient::new(RegistryOptions {
        plain_http: PlainHttp::Registries(vec![registry.address()]),
        ..RegistryOptions::default()
    });
    listed
        .push(&target, &component(10, 5), CREATED, &no_annotations())
        .await
        .unwrap();
}

/// `trainhub:trainhub-test-password`, bcrypt (cost 4).
const HTPASSWD: &str = "trainhub:$2b$04$nHMFqOtYgLXFTKSS5Ns5i.lo9p9tYrwfemLzoWh8V.lj11wQ2XBDK\n";

#[tokio::test]
async fn basic_credentials_are_sent_and_required() {
    use trainhub_plugin_oci::Credentials;
    let Some(registry) = crate::start_registry_with(Some(HTPASSWD)) else {
        return;
    };
    let with = |credentials: Credentials| {
        RegistryClient::new(RegistryOptions {
            credentials,
            plain_http: PlainHttp::Loopback,
            ..RegistryOptions::default()
        })
    };
    let target = module_ref(&registry.address(), "plugins/private:1");
    let module = component(100, 6);

    let e = with(Credentials::Anonymous)
        .push(&target, &module, CREATED, &no_annotations())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    let wrong = Credentials::Basic {
        username: "trainhub".into(),
        password: "wrong".into(),
    };
    let e = with(wrong)
        .push(&target, &module, CREATED, &no_annotations())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");

    let right = with(Credentials::Basic {
        username: "trainhub".into(),
        password: "trainhub-test-password".into(),
    });
    let pushed = right
        .push(&target, &module, CREATED, &no_annotations())
        .await
        .unwrap();
    assert_eq!(right.pull(&pushed.reference).await.unwrap().bytes, module);
    let e = with(Credentials::Anonymous)
        .pull(&pushed.reference)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
}
