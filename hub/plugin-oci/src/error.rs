//! The crate's errors.

use crate::digest::Digest;

/// What a digest or size check was about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    Manifest,
    /// The module's wasm layer.
    Layer,
    /// A signature manifest or payload.
    Signature,
    /// A module read from a file or URL, checked against its `sha256`.
    Module,
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Object::Manifest => "manifest",
            Object::Layer => "wasm layer",
            Object::Signature => "signature",
            Object::Module => "module",
        })
    }
}

/// Everything that can go wrong pulling, pushing, signing or verifying.
/// Each message names the reference, object or field involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid module reference {reference}: {reason}")]
    InvalidReference { reference: String, reason: String },
    #[error("{reference}: not pinned to a digest (add @sha256:<hex>, or resolve the tag first)")]
    NotPinned { reference: String },
    /// The bytes received are not those the digest names: the registry's
    /// storage, a proxy or the wire altered them.
    #[error(
        "{reference}: the {object}'s content does not match its digest: expected {expected}, got {actual}"
    )]
    DigestMismatch {
        reference: String,
        object: Object,
        expected: Digest,
        actual: Digest,
    },
    /// The registry sent more or fewer bytes than the descriptor says.
    #[error("{reference}: the {object} is {actual} bytes, its descriptor says {expected}")]
    SizeMismatch {
        reference: String,
        object: Object,
        expected: u64,
        actual: u64,
    },
    #[error("{reference}: the {object} is larger than the limit of {limit} bytes ({size} bytes)")]
    TooLarge {
        reference: String,
        object: Object,
        limit: u64,
        size: u64,
    },
    /// Connecting failed, timed out, broke off, or the registry answered
    /// with a server error: it is down or unreachable.
    #[error("registry {registry} is unavailable: {detail}")]
    Unavailable { registry: String, detail: String },
    #[error("{reference}: not found in the registry")]
    NotFound { reference: String },
    #[error("registry {registry} refused the credentials or requires some: {detail}")]
    Unauthorized { registry: String, detail: String },
    /// Any other registry failure (an error answer, a protocol violation).
    #[error("{reference}: {detail}")]
    Registry { reference: String, detail: String },
    /// The manifest is not a wasm module artifact.
    #[error("{reference}: not a wasm module: {reason}")]
    NotAModule { reference: String, reason: String },
    #[error("key: {0}")]
    Key(String),
    #[error("signature: {0}")]
    InvalidSignature(String),
    #[error("trust policy: {0}")]
    Policy(String),
    #[error("registry client: {0}")]
    Client(String),
}

impl Error {
    /// The condition reason a plugin object's status gives for this error:
    /// `DigestMismatch` for content that is not what its digest names,
    /// `SignatureInvalid` for malformed signatures, `RegistryUnavailable` for
    /// an unreachable registry, `PullFailed` for the rest.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::DigestMismatch { .. } | Error::SizeMismatch { .. } => "DigestMismatch",
            Error::InvalidSignature(_) => "SignatureInvalid",
            Error::Unavailable { .. } => "RegistryUnavailable",
            Error::Policy(_) => "InvalidTrustPolicy",
            _ => "PullFailed",
        }
    }

    /// Whether trying again later may succeed (the registry was unavailable);
    /// a caller keeps the last good version meanwhile.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}
