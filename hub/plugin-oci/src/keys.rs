//! ECDSA P-256 keys in the PEM forms cosign reads and writes: a PKIX
//! `PUBLIC KEY` (what `cosign generate-key-pair` writes as `cosign.pub`) and a
//! PKCS#8 `PRIVATE KEY` (what `cosign import-key-pair` takes).

use std::fmt;

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, UnparsedPublicKey};

use crate::digest::Digest;
use crate::error::Error;

/// The longest PEM text read for a key.
pub const MAX_KEY_PEM_LEN: usize = 16 * 1024;

/// The DER SubjectPublicKeyInfo of a P-256 key is this prefix (SEQUENCE,
/// AlgorithmIdentifier id-ecPublicKey with the prime256v1 curve, BIT STRING)
/// followed by the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
const P256_POINT_LEN: usize = 65;

/// A P-256 public key that verifies ECDSA/SHA-256 ASN.1 signatures.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// The uncompressed point (0x04 ‖ X ‖ Y).
    point: Vec<u8>,
}

impl PublicKey {
    /// Reads a PEM `PUBLIC KEY` (PKIX SubjectPublicKeyInfo) of a P-256 key.
    ///
    /// # Errors
    /// [`Error::Key`]: not PEM, another label, another algorithm or curve.
    pub fn from_pem(pem: &str) -> Result<PublicKey, Error> {
        let der = pem_block(pem, "PUBLIC KEY")?;
        PublicKey::from_spki_der(&der)
    }

    /// Reads a DER SubjectPublicKeyInfo of a P-256 key.
    ///
    /// # Errors
    /// [`Error::Key`] for anything but an uncompressed P-256 key.
    pub fn from_spki_der(der: &[u8]) -> Result<PublicKey, Error> {
        let point = der.strip_prefix(&P256_SPKI_PREFIX[..]).ok_or_else(|| {
            Error::Key(
                "the public key is not an ECDSA P-256 key (cosign's default; RSA and ed25519 keys are not supported)".into(),
            )
        })?;
        if point.len() != P256_POINT_LEN || point[0] != 0x04 {
            return Err(Error::Key(
                "the P-256 public key is not an uncompressed point".into(),
            ));
        }
        Ok(PublicKey {
            point: point.to_vec(),
        })
    }

    /// The DER SubjectPublicKeyInfo.
    pub fn to_spki_der(&self) -> Vec<u8> {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.point);
        der
    }

    /// The PEM `PUBLIC KEY`, as `cosign.pub` holds it.
    pub fn to_pem(&self) -> String {
        pem_encode("PUBLIC KEY", &self.to_spki_der())
    }

    /// `sha256:` and the first 16 hex digits of the SubjectPublicKeyInfo's
    /// digest: a short, stable name for the key in messages.
    pub fn fingerprint(&self) -> String {
        let hex = Digest::of(&self.to_spki_der()).hex();
        format!("sha256:{}", &hex[..16])
    }

    /// Whether `signature` (ASN.1 DER ECDSA) is this key's signature of
    /// `message` (hashed with SHA-256).
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, &self.point)
            .verify(message, signature)
            .is_ok()
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.fingerprint())
    }
}

/// A P-256 private key that signs ECDSA/SHA-256 ASN.1.
pub struct SigningKey {
    pair: EcdsaKeyPair,
}

impl SigningKey {
    /// Reads a PEM `PRIVATE KEY` (unencrypted PKCS#8) of a P-256 key, as
    /// [`generate_key_pair`] and `openssl genpkey -algorithm EC -pkeyopt
    /// ec_paramgen_curve:P-256` write it.
    ///
    /// # Errors
    /// [`Error::Key`]: not PEM, an encrypted key (cosign's own `cosign.key`
    /// is encrypted: sign with cosign, or give trainctl an unencrypted
    /// PKCS#8 key), another algorithm.
    pub fn from_pem(pem: &str) -> Result<SigningKey, Error> {
        let der = pem_block(pem, "PRIVATE KEY")?;
        let pair = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &der,
            &SystemRandom::new(),
        )
        .map_err(|e| {
            Error::Key(format!(
                "the private key is not an unencrypted PKCS#8 ECDSA P-256 key: {e}"
            ))
        })?;
        Ok(SigningKey { pair })
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            point: self.pair.public_key().as_ref().to_vec(),
        }
    }

    /// The ASN.1 DER ECDSA signature of `message` (hashed with SHA-256).
    ///
    /// # Errors
    /// [`Error::Key`] when the system's random source fails.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        self.pair
            .sign(&SystemRandom::new(), message)
            .map(|s| s.as_ref().to_vec())
            .map_err(|e| Error::Key(format!("signing failed: {e}")))
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey(public {})", self.public_key().fingerprint())
    }
}

/// A new key pair as PEM texts: the PKCS#8 private key (keep it secret) and
/// the PKIX public key (for trust policies and `cosign verify --key`).
pub struct GeneratedKeys {
    pub private_pem: String,
    pub public_pem: String,
}

impl fmt::Debug for GeneratedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GeneratedKeys")
            .field("public_pem", &self.public_pem)
            .finish_non_exhaustive()
    }
}

/// Generates an ECDSA P-256 key pair.
///
/// # Errors
/// [`Error::Key`] when the system's random source fails.
pub fn generate_key_pair() -> Result<GeneratedKeys, Error> {
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &SystemRandom::new(),
    )
    .map_err(|e| Error::Key(format!("generating a key: {e}")))?;
    let private_pem = pem_encode("PRIVATE KEY", pkcs8.as_ref());
    let public_pem = SigningKey::from_pem(&private_pem)?.public_key().to_pem();
    Ok(GeneratedKeys {
        private_pem,
        public_pem,
    })
}

/// The DER contents of the first PEM block labelled `label` in `text`.
fn pem_block(text: &str, label: &str) -> Result<Vec<u8>, Error> {
    if text.len() > MAX_KEY_PEM_LEN {
        return Err(Error::Key(format!(
            "the key's PEM text is longer than {MAX_KEY_PEM_LEN} bytes"
        )));
    }
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let Some(start) = text.find(&begin) else {
        let found = text
            .find("-----BEGIN ")
            .and_then(|i| text[i + 11..].split("-----").next())
            .map(|l| format!(" (found {l:?})"))
            .unwrap_or_default();
        let hint = if found.contains("ENCRYPTED") {
            "; an encrypted key (cosign's cosign.key is one) cannot be read: use an unencrypted PKCS#8 key (trainctl plugin keygen)"
        } else {
            ""
        };
        return Err(Error::Key(format!("no PEM block {label:?}{found}{hint}")));
    };
    let body_start = start + begin.len();
    let Some(body_len) = text[body_start..].find(&end) else {
        return Err(Error::Key(format!(
            "the PEM block {label:?} has no END line"
        )));
    };
    let body: String = text[body_start..body_start + body_len]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| Error::Key(format!("the PEM block {label:?} is not base64: {e}")))
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kubewarden's documentation's example key (a P-256 `cosign.pub`).
    const KUBEWARDEN_EXAMPLE_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEQiTy5S+2JFvVlhUwWPLziM7iTM2j
byLgh2IjpNQN0Uio/9pZOTP/CsJmXoUNshfpTUHd3OxgHgz/6adtf2nBwQ==
-----END PUBLIC KEY-----
";

    #[test]
    fn reads_a_cosign_public_key_and_writes_it_back_unchanged() {
        let key = PublicKey::from_pem(KUBEWARDEN_EXAMPLE_PUB).unwrap();
        assert_eq!(key.to_pem(), KUBEWARDEN_EXAMPLE_PUB);
        assert!(key.fingerprint().starts_with("sha256:"));
        assert_eq!(key.fingerprint().len(), 7 + 16);
    }

    #[test]
    fn generated_keys_sign_and_verify() {
        let keys = generate_key_pair().unwrap();
        assert!(
            keys.private_pem
                .starts_with("-----BEGIN PRIVATE KEY-----\n")
        );
        assert!(keys.public_pem.starts_with("-----BEGIN PUBLIC KEY-----\n"));
        let signer = SigningKey::from_pem(&keys.private_pem).unwrap();
        let public = PublicKey::from_pem(&keys.public_pem).unwrap();
        assert_eq!(signer.public_key(), public);
        let sig = signer.sign(b"payload").unwrap();
        assert!(public.verifies(b"payload", &sig));
        assert!(!public.verifies(b"payload!", &sig));
        let other = PublicKey::from_pem(&generate_key_pair().unwrap().public_pem).unwrap();
        assert!(!other.verifies(b"payload", &sig));
        assert!(!public.verifies(b"payload", b"not a signature"));
    }

    #[test]
    fn refuses_other_keys_with_a_reason() {
        let e = PublicKey::from_pem("nothing here").unwrap_err();
        assert!(e.to_string().contains("no PEM block"), "{e}");
        let e = SigningKey::from_pem(
            "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("encrypted key"), "{e}");
        // An RSA SubjectPublicKeyInfo (the prefix differs).
        let e = PublicKey::from_spki_der(&[0x30, 0x82, 0x01, 0x22, 0x30, 0x0d]).unwrap_err();
        assert!(e.to_string().contains("not an ECDSA P-256 key"), "{e}");
        let e = PublicKey::from_pem("-----BEGIN PUBLIC KEY-----\n!!!\n-----END PUBLIC KEY-----")
            .unwrap_err();
        assert!(e.to_string().contains("base64"), "{e}");
        let e = PublicKey::from_pem(&"A".repeat(MAX_KEY_PEM_LEN + 1)).unwrap_err();
        assert!(e.to_string().contains("longer"), "{e}");
        let e = PublicKey::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA").unwrap_err();
        assert!(e.to_string().contains("no END line"), "{e}");
    }
}
