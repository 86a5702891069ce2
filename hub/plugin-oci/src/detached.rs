//! Detached signatures, for modules fetched from a URL or read from a file.
//!
//! # Format
//! A detached signature file (by convention `MODULE.wasm.sig`) holds one
//! line: the standard base64 (with padding) of the ASN.1 DER ECDSA P-256
//! signature of the module's SHA-256 digest, i.e. ECDSA/SHA-256 over the
//! module's bytes. Surrounding whitespace is ignored; the file is at most
//! [`MAX_DETACHED_LEN`] bytes.
//!
//! This is what `cosign sign-blob --key KEY --output-signature FILE MODULE`
//! writes (with `--tlog-upload=false`; cosign 3 also needs
//! `--new-bundle-format=false --use-signing-config=false`), and what
//! `cosign verify-blob --key cosign.pub --signature FILE
//! --insecure-ignore-tlog MODULE` accepts. A detached signature carries no
//! annotations: a trust policy entry that requires annotations is never
//! satisfied by one.

use base64::Engine as _;

use crate::error::Error;
use crate::keys::{PublicKey, SigningKey};

/// The longest detached signature file read.
pub const MAX_DETACHED_LEN: usize = 1024;

/// A parsed detached signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetachedSignature {
    /// ASN.1 DER ECDSA.
    pub signature: Vec<u8>,
}

impl DetachedSignature {
    /// Signs `module` with `key`.
    ///
    /// # Errors
    /// [`Error::Key`] when the random source fails.
    pub fn sign(key: &SigningKey, module: &[u8]) -> Result<DetachedSignature, Error> {
        Ok(DetachedSignature {
            signature: key.sign(module)?,
        })
    }

    /// The file's contents: base64 and a newline.
    pub fn to_file_text(&self) -> String {
        let mut text = base64::engine::general_purpose::STANDARD.encode(&self.signature);
        text.push('\n');
        text
    }

    /// Reads a signature file's contents.
    ///
    /// # Errors
    /// [`Error::InvalidSignature`]: too long, not base64, empty.
    pub fn parse(file: &[u8]) -> Result<DetachedSignature, Error> {
        if file.len() > MAX_DETACHED_LEN {
            return Err(Error::InvalidSignature(format!(
                "the detached signature is longer than {MAX_DETACHED_LEN} bytes"
            )));
        }
        let text = std::str::from_utf8(file)
            .map_err(|_| Error::InvalidSignature("the detached signature is not text".into()))?
            .trim();
        if text.is_empty() {
            return Err(Error::InvalidSignature(
                "the detached signature file is empty".into(),
            ));
        }
        let signature = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| {
                Error::InvalidSignature(format!("the detached signature is not base64: {e}"))
            })?;
        Ok(DetachedSignature { signature })
    }

    /// Whether `key` signed `module`.
    pub fn verifies(&self, key: &PublicKey, module: &[u8]) -> bool {
        key.verifies(module, &self.signature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::generate_key_pair;

    #[test]
    fn round_trips_through_its_file_form() {
        let keys = generate_key_pair().unwrap();
        let signer = SigningKey::from_pem(&keys.private_pem).unwrap();
        let module = b"\0asm\x0d\0\x01\0 component bytes";
        let sig = DetachedSignature::sign(&signer, module).unwrap();
        let text = sig.to_file_text();
        assert!(text.ends_with('\n'));
        let read = DetachedSignature::parse(format!("  {text}\n\n").as_bytes()).unwrap();
        assert_eq!(read, sig);
        assert!(read.verifies(&signer.public_key(), module));
        assert!(!read.verifies(&signer.public_key(), b"another module"));
    }

    #[test]
    fn refuses_what_is_not_a_signature_file() {
        for bad in [
            &b""[..],
            b"   \n",
            b"not base64!",
            &[0xff, 0xfe],
            &[b'A'; 2000],
        ] {
            assert!(
                matches!(
                    DetachedSignature::parse(bad),
                    Err(Error::InvalidSignature(_))
                ),
                "{bad:?}"
            );
        }
    }
}
