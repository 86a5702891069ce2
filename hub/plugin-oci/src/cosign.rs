//! Cosign's key-based signatures, as cosign stores them in a registry.
//!
//! For a manifest `sha256:<hex>` in a repository, cosign keeps an OCI image
//! manifest at the tag `sha256-<hex>.sig` of the same repository. Each of its
//! layers is one signature: the layer blob is the "simple signing" payload
//! (media type [`SIMPLE_SIGNING_MEDIA_TYPE`]),
//!
//! ```json
//! {"critical":{"identity":{"docker-reference":"registry/repo"},
//!              "image":{"docker-manifest-digest":"sha256:<hex>"},
//!              "type":"cosign container image signature"},
//!  "optional":{"key":"value"}}
//! ```
//!
//! and the layer's annotation [`SIGNATURE_ANNOTATION`] holds the base64 ASN.1
//! ECDSA signature of the payload's bytes. `optional` carries the
//! annotations given to `cosign sign -a key=value` (`null` without any).
//! Signing again appends a layer; earlier signatures stay.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::Error;
use crate::keys::{PublicKey, SigningKey};

/// The layer media type of a cosign signature payload.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// `critical.type` of a cosign payload.
pub const COSIGN_SIGNATURE_TYPE: &str = "cosign container image signature";
/// The config media type of cosign's signature manifests.
pub const SIGNATURE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";

/// The longest base64 signature annotation read (a P-256 DER signature is
/// at most 72 bytes, 96 in base64).
pub const MAX_SIGNATURE_B64_LEN: usize = 1024;

/// The tag at which cosign stores the signatures of `digest`.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// One signature as stored: the payload bytes and the signature over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CosignSignature {
    pub payload: Vec<u8>,
    /// ASN.1 DER ECDSA.
    pub signature: Vec<u8>,
}

/// What a verified payload says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedClaim {
    /// `critical.image.docker-manifest-digest`.
    pub manifest_digest: String,
    /// `critical.identity.docker-reference`.
    pub docker_reference: String,
    /// `optional`, values that are not strings in their JSON spelling.
    pub annotations: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
struct Payload {
    critical: Critical,
    #[serde(default)]
    optional: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The simple signing payload cosign writes for `digest` in the repository
/// `repository_name` (`registry/repo`), with `annotations` as `optional`.
pub fn payload(
    repository_name: &str,
    digest: &Digest,
    annotations: &BTreeMap<String, String>,
) -> Vec<u8> {
    let payload = Payload {
        critical: Critical {
            identity: Identity {
                docker_reference: repository_name.to_string(),
            },
            image: Image {
                docker_manifest_digest: digest.to_string(),
            },
            kind: COSIGN_SIGNATURE_TYPE.to_string(),
        },
        optional: (!annotations.is_empty()).then(|| {
            annotations
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect()
        }),
    };
    // Serializing plain strings and maps cannot fail.
    serde_json::to_vec(&payload).unwrap_or_default()
}

impl CosignSignature {
    /// Signs the payload for `digest` in `repository_name` with `key`.
    ///
    /// # Errors
    /// [`Error::Key`] when the random source fails.
    pub fn sign(
        key: &SigningKey,
        repository_name: &str,
        digest: &Digest,
        annotations: &BTreeMap<String, String>,
    ) -> Result<CosignSignature, Error> {
        let payload = payload(repository_name, digest, annotations);
        let signature = key.sign(&payload)?;
        Ok(CosignSignature { payload, signature })
    }

    /// The signature as the layer annotation holds it.
    pub fn signature_b64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.signature)
    }

    /// A signature from a layer: its payload blob and the annotation.
    ///
    /// # Errors
    /// [`Error::InvalidSignature`] when the annotation is too long or not
    /// base64.
    pub fn from_layer(payload: Vec<u8>, signature_b64: &str) -> Result<CosignSignature, Error> {
        if signature_b64.len() > MAX_SIGNATURE_B64_LEN {
            return Err(Error::InvalidSignature(format!(
                "the {SIGNATURE_ANNOTATION} annotation is longer than {MAX_SIGNATURE_B64_LEN} characters"
            )));
        }
        let signature = base64::engine::general_purpose::STANDARD
            .decode(signature_b64.trim())
            .map_err(|e| {
                Error::InvalidSignature(format!(
                    "the {SIGNATURE_ANNOTATION} annotation is not base64: {e}"
                ))
            })?;
        Ok(CosignSignature { payload, signature })
    }

    /// Whether `key` signed this payload.
    pub fn verifies_with(&self, key: &PublicKey) -> bool {
        key.verifies(&self.payload, &self.signature)
    }

    /// What the payload claims, once its signature is known to be good.
    ///
    /// # Errors
    /// [`Error::InvalidSignature`]: not JSON of the simple signing shape, or
    /// not of cosign's type.
    pub fn claim(&self) -> Result<SignedClaim, Error> {
        let payload: Payload = serde_json::from_slice(&self.payload).map_err(|e| {
            Error::InvalidSignature(format!("the payload is not a simple signing payload: {e}"))
        })?;
        if payload.critical.kind != COSIGN_SIGNATURE_TYPE {
            return Err(Error::InvalidSignature(format!(
                "the payload's critical.type is {:?}, not {COSIGN_SIGNATURE_TYPE:?}",
                crate::digest::clip(&payload.critical.kind)
            )));
        }
        let annotations = payload
            .optional
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, v)
            })
            .collect();
        Ok(SignedClaim {
            manifest_digest: payload.critical.image.docker_manifest_digest,
            docker_reference: payload.critical.identity.docker_reference,
            annotations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::generate_key_pair;

    #[test]
    fn payload_has_cosigns_shape() {
        let digest = Digest::of(b"manifest");
        let bytes = payload("127.0.0.1:5000/plugins/acme", &digest, &BTreeMap::new());
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"critical":{{"identity":{{"docker-reference":"127.0.0.1:5000/plugins/acme"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
            )
        );
        let annotations = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        let text = String::from_utf8(payload("r/x", &digest, &annotations)).unwrap();
        assert!(text.ends_with(r#""optional":{"env":"prod"}}"#), "{text}");
    }

    #[test]
    fn a_signature_verifies_and_claims_its_digest() {
        let keys = generate_key_pair().unwrap();
        let signer = SigningKey::from_pem(&keys.private_pem).unwrap();
        let digest = Digest::of(b"manifest");
        let annotations = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        let sig = CosignSignature::sign(&signer, "r/x", &digest, &annotations).unwrap();
        let read = CosignSignature::from_layer(sig.payload.clone(), &sig.signature_b64()).unwrap();
        assert!(read.verifies_with(&signer.public_key()));
        let claim = read.claim().unwrap();
        assert_eq!(claim.manifest_digest, digest.to_string());
        assert_eq!(claim.docker_reference, "r/x");
        assert_eq!(claim.annotations, annotations);

        let mut tampered = read.clone();
        tampered.payload[0] = b' ';
        assert!(!tampered.verifies_with(&signer.public_key()));
    }

    #[test]
    fn claims_of_another_shape_are_refused() {
        let sig = CosignSignature {
            payload: br#"{"critical":{"identity":{"docker-reference":"r"},"image":{"docker-manifest-digest":"sha256:00"},"type":"atomic container signature"},"optional":{"n":1}}"#.to_vec(),
            signature: Vec::new(),
        };
        let e = sig.claim().unwrap_err();
        assert!(e.to_string().contains("critical.type"), "{e}");
        let sig = CosignSignature {
            payload: b"[]".to_vec(),
            signature: Vec::new(),
        };
        assert!(sig.claim().is_err());
        assert!(CosignSignature::from_layer(Vec::new(), "%%%").is_err());
        assert!(CosignSignature::from_layer(Vec::new(), &"A".repeat(5000)).is_err());
    }

    #[test]
    fn signature_tag_is_cosigns() {
        let digest = Digest::of(b"m");
        assert_eq!(
            signature_tag(&digest),
            format!("sha256-{}.sig", digest.hex())
        );
    }
}
