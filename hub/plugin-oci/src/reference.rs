//! Module references: `oci://registry/repository:tag@sha256:<hex>`.

use std::fmt;
use std::str::FromStr;

use crate::digest::{Digest, clip};
use crate::error::Error;

/// The longest reference accepted (OCI's own limits are 255 characters for a
/// repository name, 128 for a tag).
pub const MAX_REFERENCE_LEN: usize = 1024;

/// A module in an OCI registry: a repository, optionally a tag, and the
/// manifest digest that pins it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ModuleRef {
    /// `host[:port]`, as written (`docker.io` for references without one).
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    /// The manifest's digest. Without it the reference is a tag, which may
    /// move: [`crate::RegistryClient::resolve`] pins it.
    pub digest: Option<Digest>,
}

impl ModuleRef {
    /// Parses `oci://registry/repo:tag@sha256:<hex>`; the `oci://` (or
    /// Kubewarden's `registry://`) prefix is optional, and so are the tag and
    /// the digest (not both). Docker's rules apply to a reference without a
    /// registry host (`repo:tag` is `docker.io/library/repo:tag`).
    ///
    /// # Errors
    /// [`Error::InvalidReference`] naming the input and what is wrong.
    pub fn parse(input: &str) -> Result<ModuleRef, Error> {
        let invalid = |reason: String| Error::InvalidReference {
            reference: clip(input),
            reason,
        };
        if input.len() > MAX_REFERENCE_LEN {
            return Err(invalid(format!(
                "longer than {MAX_REFERENCE_LEN} characters"
            )));
        }
        let text = input
            .strip_prefix("oci://")
            .or_else(|| input.strip_prefix("registry://"))
            .unwrap_or(input);
        if text.contains("://") {
            return Err(invalid(
                "only oci:// references name a registry module (an https URL is fetched with its sha256 instead)"
                    .into(),
            ));
        }
        let parsed = oci_client::Reference::try_from(text).map_err(|e| invalid(e.to_string()))?;
        let digest = match parsed.digest() {
            Some(d) => Some(Digest::parse(d, false).map_err(invalid)?),
            None => None,
        };
        // oci-spec fills in `latest` for a reference with neither tag nor
        // digest; a module reference must say which it means.
        let explicit_tag = parsed.tag().filter(|_| {
            text.rsplit('/')
                .next()
                .is_some_and(|last| last.split('@').next().is_some_and(|n| n.contains(':')))
        });
        if explicit_tag.is_none() && digest.is_none() {
            return Err(invalid(
                "names neither a tag nor a digest (add :TAG or @sha256:<hex>)".into(),
            ));
        }
        Ok(ModuleRef {
            registry: parsed.registry().to_string(),
            repository: parsed.repository().to_string(),
            tag: explicit_tag.map(str::to_string),
            digest,
        })
    }

    /// The same repository and tag, pinned to `digest`.
    pub fn pinned(&self, digest: Digest) -> ModuleRef {
        ModuleRef {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// The same repository at another tag, without a digest.
    pub fn at_tag(&self, tag: &str) -> ModuleRef {
        ModuleRef {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        }
    }

    /// `registry/repository`: what cosign writes as the payload's
    /// `critical.identity.docker-reference`.
    pub fn repository_name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The host of [`Self::registry`], without the port.
    pub fn host(&self) -> &str {
        host_of(&self.registry)
    }

    /// The reference oci-client takes: by digest when pinned, else by tag.
    pub(crate) fn to_oci(&self) -> oci_client::Reference {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => oci_client::Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                digest.to_string(),
            ),
            (None, Some(tag)) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                tag.clone(),
            ),
            (None, None) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                "latest".into(),
            ),
        }
    }
}

/// The host part of `host[:port]` (and of `[v6]:port`).
pub(crate) fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    registry.split(':').next().unwrap_or(registry)
}

impl FromStr for ModuleRef {
    type Err = Error;

    fn from_str(text: &str) -> Result<ModuleRef, Error> {
        ModuleRef::parse(text)
    }
}

impl fmt::Display for ModuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ModuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_tag_and_digest_with_and_without_the_scheme() {
        for text in [
            format!("oci://127.0.0.1:5000/plugins/acme:1.0@sha256:{HEX}"),
            format!("127.0.0.1:5000/plugins/acme:1.0@sha256:{HEX}"),
        ] {
            let r = ModuleRef::parse(&text).unwrap();
            assert_eq!(r.registry, "127.0.0.1:5000");
            assert_eq!(r.repository, "plugins/acme");
            assert_eq!(r.tag.as_deref(), Some("1.0"));
            assert_eq!(r.digest.unwrap().hex(), HEX);
            assert_eq!(r.host(), "127.0.0.1");
            assert_eq!(
                r.to_string(),
                format!("oci://127.0.0.1:5000/plugins/acme:1.0@sha256:{HEX}")
            );
        }
    }

    #[test]
    fn digest_only_and_tag_only() {
        let r = ModuleRef::parse(&format!("oci://ghcr.io/acme/p@sha256:{HEX}")).unwrap();
        assert_eq!(r.tag, None);
        assert!(r.digest.is_some());
        let r = ModuleRef::parse("oci://ghcr.io/acme/p:v2").unwrap();
        assert_eq!(r.tag.as_deref(), Some("v2"));
        assert_eq!(r.digest, None);
        let r = ModuleRef::parse("localhost:5000/p:v2").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.host()),
            ("localhost:5000", "localhost")
        );
    }

    #[test]
    fn refuses_the_ambiguous_and_the_malformed() {
        let e = ModuleRef::parse("oci://ghcr.io/acme/p").unwrap_err();
        assert!(e.to_string().contains("neither a tag nor a digest"), "{e}");
        let e = ModuleRef::parse("oci://ghcr.io/acme/p@sha256:abc").unwrap_err();
        assert!(matches!(e, Error::InvalidReference { .. }), "{e}");
        let e = ModuleRef::parse(&format!("oci://ghcr.io/acme/p@sha512:{HEX}{HEX}")).unwrap_err();
        assert!(matches!(e, Error::InvalidReference { .. }), "{e}");
        let e = ModuleRef::parse("https://example.com/p.wasm").unwrap_err();
        assert!(e.to_string().contains("https URL"), "{e}");
        let e = ModuleRef::parse(&"a".repeat(5000)).unwrap_err();
        assert!(e.to_string().len() < 300, "{e}");
        assert!(ModuleRef::parse("oci://Ghcr.io/UPPER/p:1").is_err());
        assert!(ModuleRef::parse("").is_err());
    }

    #[test]
    fn host_of_handles_ports_and_v6() {
        assert_eq!(host_of("[::1]:5000"), "::1");
        assert_eq!(host_of("example.com"), "example.com");
        assert_eq!(host_of("example.com:443"), "example.com");
    }
}
