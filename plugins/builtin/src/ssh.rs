//! The SSH key pair MPI pods authenticate each other with: ECDSA on P-521,
//! as upstream generates it, from the host's entropy.

use base64::Engine as _;
use p521::elliptic_curve::sec1::ToSec1Point as _;
use p521::pkcs8::LineEnding;

/// A freshly generated key pair, in the encodings the `kubernetes.io/ssh-auth`
/// Secret carries.
pub struct SshKeyPair {
    /// SEC 1 `EC PRIVATE KEY` PEM.
    pub private_pem: String,
    /// One OpenSSH `authorized_keys` line, `ecdsa-sha2-nistp521 AAAA...\n`.
    pub public_authorized_key: String,
}

/// Generates a key pair from `entropy`, a source of uniformly random bytes
/// (the host's `random-bytes` in a plugin).
///
/// A candidate scalar is drawn from 521 random bits and rejected unless it
/// lies in `[1, n)`; a draw is rejected with probability below 2⁻²⁶⁰, so the
/// bounded retries only guard against a broken entropy source.
pub fn generate(mut entropy: impl FnMut(u32) -> Vec<u8>) -> Result<SshKeyPair, String> {
    const FIELD_BYTES: usize = 66;
    for _ in 0..16 {
        let mut candidate = entropy(FIELD_BYTES as u32);
        if candidate.len() != FIELD_BYTES {
            return Err(format!(
                "the entropy source returned {} bytes, expected {FIELD_BYTES}",
                candidate.len()
            ));
        }
        // Keep 521 bits: the top byte carries a single bit.
        candidate[0] &= 0x01;
        let Ok(secret) = p521::SecretKey::from_slice(&candidate) else {
            continue;
        };
        let private_pem = secret
            .to_sec1_pem(LineEnding::LF)
            .map_err(|e| format!("cannot encode the private key: {e}"))?
            .to_string();
        let point = secret.public_key().to_sec1_point(false);
        return Ok(SshKeyPair {
            private_pem,
            public_authorized_key: authorized_key(point.as_bytes()),
        });
    }
    Err("the entropy source gave no valid P-521 scalar in 16 draws".to_string())
}

/// The OpenSSH public key line for an uncompressed P-521 point (RFC 5656).
fn authorized_key(point: &[u8]) -> String {
    const KEY_TYPE: &str = "ecdsa-sha2-nistp521";
    let mut blob = Vec::with_capacity(4 + KEY_TYPE.len() + 4 + 8 + 4 + point.len());
    for field in [KEY_TYPE.as_bytes(), b"nistp521", point] {
        // Every field is far below 4 GiB.
        blob.extend_from_slice(&(field.len() as u32).to_be_bytes());
        blob.extend_from_slice(field);
    }
    format!(
        "{KEY_TYPE} {}\n",
        base64::engine::general_purpose::STANDARD.encode(blob)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn generates_a_pem_private_key_and_an_authorized_keys_line() {
        let pair = generate(|n| vec![7u8; n as usize]).unwrap();
        assert!(
            pair.private_pem
                .starts_with("-----BEGIN EC PRIVATE KEY-----\n")
        );
        assert!(pair.private_pem.ends_with("-----END EC PRIVATE KEY-----\n"));
        let line = pair.public_authorized_key.strip_suffix('\n').unwrap();
        let (kind, blob) = line.split_once(' ').unwrap();
        assert_eq!(kind, "ecdsa-sha2-nistp521");
        let blob = base64::engine::general_purpose::STANDARD
            .decode(blob)
            .unwrap();
        // type (4+19) + curve (4+8) + point (4+133)
        assert_eq!(blob.len(), 23 + 12 + 137);
        assert_eq!(&blob[4..23], b"ecdsa-sha2-nistp521");
        assert_eq!(blob[35 + 4], 0x04, "uncompressed point");
    }

    #[test]
    fn keys_differ_with_the_entropy() {
        let a = generate(|n| vec![1u8; n as usize]).unwrap();
        let b = generate(|n| vec![2u8; n as usize]).unwrap();
        assert_ne!(a.private_pem, b.private_pem);
        assert_ne!(a.public_authorized_key, b.public_authorized_key);
    }

    #[test]
    fn a_broken_entropy_source_is_an_error_not_a_panic() {
        assert!(generate(|_| Vec::new()).is_err());
        assert!(generate(|n| vec![0u8; n as usize]).is_err());
    }
}
