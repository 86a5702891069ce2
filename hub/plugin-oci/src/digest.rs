//! SHA-256 content digests, as OCI spells them (`sha256:<64 lowercase hex>`).

use std::fmt;
use std::str::FromStr;

/// A SHA-256 digest. Only `sha256` is accepted: it is what OCI registries,
/// cosign and trainhub's compile cache use.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        let mut context = Hasher::new();
        context.update(bytes);
        context.finish()
    }

    /// The 64 lowercase hex digits, without the `sha256:` prefix.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses `sha256:<hex>`, or 64 hex digits alone when `bare` is allowed
    /// (a `spec.sha256` field holds just the hex).
    ///
    /// # Errors
    /// Another algorithm, a wrong length, uppercase or non-hex digits.
    pub fn parse(text: &str, bare: bool) -> Result<Digest, String> {
        let hex_part = match text.split_once(':') {
            Some(("sha256", rest)) => rest,
            Some((algorithm, _)) => {
                return Err(format!(
                    "digest {}: only sha256 is supported, not {algorithm:?}",
                    clip(text)
                ));
            }
            None if bare => text,
            None => {
                return Err(format!(
                    "digest {}: expected sha256:<64 hex digits>",
                    clip(text)
                ));
            }
        };
        if hex_part.len() != 64
            || !hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "digest {}: expected 64 lowercase hex digits after sha256:",
                clip(text)
            ));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out)
            .map_err(|e| format!("digest {}: {e}", clip(text)))?;
        Ok(Digest(out))
    }
}

/// At most 80 characters of an input quoted in an error message.
pub(crate) fn clip(text: &str) -> String {
    let mut end = text.len().min(80);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end < text.len() {
        format!("{:?}…", &text[..end])
    } else {
        format!("{text:?}")
    }
}

impl FromStr for Digest {
    type Err = String;

    fn from_str(text: &str) -> Result<Digest, String> {
        Digest::parse(text, false)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Digest, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Digest::parse(&text, false).map_err(serde::de::Error::custom)
    }
}

/// An incremental SHA-256, for bytes that arrive in chunks.
pub(crate) struct Hasher(ring::digest::Context);

impl Hasher {
    pub(crate) fn new() -> Hasher {
        Hasher(ring::digest::Context::new(&ring::digest::SHA256))
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub(crate) fn finish(self) -> Digest {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.finish().as_ref());
        Digest(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_has_the_well_known_digest() {
        assert_eq!(
            Digest::of(b"").to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn parse_round_trips_and_refuses_the_malformed() {
        let d = Digest::of(b"module");
        assert_eq!(d.to_string().parse::<Digest>(), Ok(d));
        assert_eq!(Digest::parse(&d.hex(), true), Ok(d));
        assert!(Digest::parse(&d.hex(), false).is_err());
        assert!(
            Digest::parse(&format!("sha512:{}", d.hex()), false)
                .unwrap_err()
                .contains("only sha256")
        );
        assert!(Digest::parse(&format!("sha256:{}", d.hex().to_uppercase()), false).is_err());
        assert!(Digest::parse("sha256:abc", false).is_err());
        assert!(Digest::parse("sha256:ééééé", false).is_err());
        let long = "x".repeat(10_000);
        assert!(Digest::parse(&long, false).unwrap_err().len() < 200);
    }
}
