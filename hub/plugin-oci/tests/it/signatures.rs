//! Cosign signatures in the registry, evaluated by trust policies.

use std::collections::BTreeMap;

use trainhub_plugin_oci::cosign::{SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE, signature_tag};
use trainhub_plugin_oci::policy::{AnyOf, SignatureRequirement};
use trainhub_plugin_oci::{CosignSignature, PublicKey, RefusalReason, TrustPolicy};

use crate::{Signer, client, component, no_annotations, push, signer};

fn all_of(signers: &[&Signer]) -> TrustPolicy {
    let keys: Vec<String> = signers.iter().map(|s| s.keys.public_pem.clone()).collect();
    TrustPolicy::all_of_keys(&keys)
}

fn fingerprint(s: &Signer) -> String {
    PublicKey::from_pem(&s.keys.public_pem)
        .unwrap()
        .fingerprint()
}

#[tokio::test]
async fn signed_with_the_trusted_key_passes_and_another_key_fails() {
    let Some(registry) = crate::start_registry() else {
        return;
    };
    let client = client();
    let (alice, mallory) = (signer(), signer());
    let pushed = push(
        &registry.address(),
        "plugins/signed:1",
        &component(5_000, 10),
    )
    .await;
    let reference = &pushed.reference;
    let signature = CosignSignature::sign(
        &alice.key,
        &reference.repository_name(),
        &pushed.manifest_digest,
        &no_annotations(),
    )
    .unwrap();
    client.push_signature(reference, &signature).await.unwrap();

    // Stored where and how cosign stores it.
    let sig_ref = reference.at_tag(&signature_tag(&pushed.manifest_digest));
    let sig_manifest = client.resolve(&sig_ref).await.unwrap();
    let blob = std::fs::read(registry.blob_path(&sig_manifest.digest.unwrap())).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&blob).unwrap();
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["layers"][0]["mediaType"],
        SIMPLE_SIGNING_MEDIA_TYPE
    );
    assert_eq!(
        manifest["layers"][0]["annotations"][SIGNATURE_ANNOTATION],
        signature.signature_b64()
    );
    let payload: serde_json::Value = serde_json::from_slice(&signature.payload).unwrap();
    assert_eq!(
        payload["critical"]["image"]["docker-manifest-digest"],
        pushed.manifest_digest.to_string()
    );
    assert_eq!(
        payload["critical"]["identity"]["docker-reference"],
        format!("{}/plugins/signed", registry.address())
    );

    let found = client.signatures(reference).await.unwrap();
    assert_eq!(found, std::slice::from_ref(&signature));
    let verdict = all_of(&[&alice])
        .compile()
        .unwrap()
        .evaluate_cosign(&pushed.manifest_digest, &found)
        .unwrap();
    assert_eq!(verdict.matched.len(), 1);
    assert_eq!(verdict.matched[0].fingerprint, fingerprint(&alice));

    let refusal = all_of(&[&mallory])
        .compile()
        .unwrap()
        .evaluate_cosign(&pushed.manifest_digest, &found)
        .unwrap_err();
    assert_eq!(refusal.reason, RefusalReason::Untrusted);
    assert_eq!(refusal.missing[0].0.fingerprint, fingerprint(&mallory));

    // Pushing the same signature again adds nothing.
    client.push_signature(reference, &signature).await.unwrap();
    assert_eq!(client.signatures(reference).await.unwrap().len(), 1);

    // Alice's signature copied onto another module does not hold there.
    let other = push(
        &registry.address(),
        "plugins/signed:2",
        &component(5_000, 11),
    )
    .await;
    client
        .push_signature(&other.reference, &signature)
        .await
        .unwrap();
    let copied = client.signatures(&other.reference).await.unwrap();
    let refusal = all_of(&[&alice])
        .compile()
        .unwrap()
        .evaluate_cosign(&other.manifest_digest, &copied)
        .unwrap_err();
    assert_eq!(refusal.reason, RefusalReason::SignatureInvalid);
}

#[tokio::test]
async fn unsigned_under_a_policy_fails_naming_the_missing_key() {
    let Some(registry) = crate::start_registry() else {
        return;
    };
    let client = client();
    let alice = signer();
    let mut requirement = SignatureRequirement::pub_key(&alice.keys.public_pem);
    requirement.owner = Some("platform-team".into());
    let policy = TrustPolicy {
        all_of: Some(vec![requirement]),
        ..TrustPolicy::default()
    };
    let pushed = push(
        &registry.address(),
        "plugins/unsigned:1",
        &component(100, 12),
    )
    .await;
    let found = client.signatures(&pushed.reference).await.unwrap();
    assert!(found.is_empty());
    let refusal = policy
        .compile()
        .unwrap()
        .evaluate_cosign(&pushed.manifest_digest, &found)
        .unwrap_err();
    assert_eq!(refusal.reason, RefusalReason::Untrusted);
    let text = refusal.to_string();
    assert!(text.contains("no signature found"), "{text}");
    assert!(text.contains("allOf[0]"), "{text}");
    assert!(text.contains("\"platform-team\""), "{text}");
    assert!(text.contains(&fingerprint(&alice)), "{text}");
}

#[tokio::test]
async fn any_of_minimum_matches_counts_signatures_in_the_registry() {
    let Some(registry) = crate::start_registry() else {
        return;
    };
    let client = client();
    let (a, b, c) = (signer(), signer(), signer());
    let pushed = push(&registry.address(), "plugins/quorum:1", &component(100, 13)).await;
    let reference = &pushed.reference;
    let policy = |minimum: u32| {
        TrustPolicy {
            any_of: Some(AnyOf {
                minimum_matches: Some(minimum),
                signatures: [&a, &b, &c]
                    .iter()
                    .map(|s| SignatureRequirement::pub_key(&s.keys.public_pem))
                    .collect(),
            }),
            ..TrustPolicy::default()
        }
        .compile()
        .unwrap()
    };
    let sign = |s: &Signer, annotations: BTreeMap<String, String>| {
        CosignSignature::sign(
            &s.key,
            &reference.repository_name(),
            &pushed.manifest_digest,
            &annotations,
        )
        .unwrap()
    };
    client
        .push_signature(reference, &sign(&a, no_annotations()))
        .await
        .unwrap();
    let found = client.signatures(reference).await.unwrap();
    assert!(
        policy(1)
            .evaluate_cosign(&pushed.manifest_digest, &found)
            .is_ok()
    );
    let refusal = policy(2)
        .evaluate_cosign(&pushed.manifest_digest, &found)
        .unwrap_err();
    assert_eq!(refusal.any_of_shortfall, Some((1, 2)));

    // A second signer appends; the first signature stays.
    let env = BTreeMap::from([("env".to_string(), "prod".to_string())]);
    client
        .push_signature(reference, &sign(&c, env.clone()))
        .await
        .unwrap();
    let found = client.signatures(reference).await.unwrap();
    assert_eq!(found.len(), 2);
    let verdict = policy(2)
        .evaluate_cosign(&pushed.manifest_digest, &found)
        .unwrap();
    let paths: Vec<&str> = verdict.matched.iter().map(|k| k.path.as_str()).collect();
    assert_eq!(paths, ["anyOf.signatures[0]", "anyOf.signatures[2]"]);
    let refusal = policy(3)
        .evaluate_cosign(&pushed.manifest_digest, &found)
        .unwrap_err();
    assert_eq!(refusal.any_of_shortfall, Some((2, 3)));
    assert_eq!(refusal.any_of_missing.len(), 1);
    assert_eq!(refusal.any_of_missing[0].0.path, "anyOf.signatures[1]");

    // The annotation carried through the registry satisfies an entry that
    // requires it; Alice's unannotated signature does not.
    let mut wants_prod = SignatureRequirement::pub_key(&c.keys.public_pem);
    wants_prod.annotations = Some(env);
    let mut alice_prod = SignatureRequirement::pub_key(&a.keys.public_pem);
    alice_prod.annotations = wants_prod.annotations.clone();
    let strict = TrustPolicy {
        all_of: Some(vec![wants_prod, alice_prod]),
        ..TrustPolicy::default()
    };
    let refusal = strict
        .compile()
        .unwrap()
        .evaluate_cosign(&pushed.manifest_digest, &found)
        .unwrap_err();
    assert_eq!(refusal.missing.len(), 1);
    assert_eq!(refusal.missing[0].0.path, "allOf[1]");
    assert!(refusal.missing[0].1.contains("env=prod"));
}
