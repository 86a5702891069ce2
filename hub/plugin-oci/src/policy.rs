//! The trust policy: which signatures a module needs before it may load.
//!
//! The shape is Kubewarden's verification config, limited to key-based
//! signatures:
//!
//! ```yaml
//! apiVersion: v1            # optional
//! allOf:                    # every entry must be satisfied
//! - kind: pubKey
//!   owner: platform-team    # optional, for messages
//!   key: |
//!     -----BEGIN PUBLIC KEY-----
//!     ...
//!     -----END PUBLIC KEY-----
//!   annotations:            # optional: the signature must carry these
//!     env: prod
//! anyOf:                    # at least minimumMatches entries satisfied
//!   minimumMatches: 2       # default 1
//!   signatures:
//!   - kind: pubKey
//!     key: ...
//! ```
//!
//! An entry is satisfied when one signature verifies with its key, names the
//! module being loaded, and carries each of its annotations (cosign's `-a
//! key=value`, the payload's `optional`). Kubewarden's keyless kinds
//! (`githubAction`, `genericIssuer`, `genericIssuerUrlPrefix`) are refused:
//! they need Fulcio and Rekor, which trainhub does not consult.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cosign::CosignSignature;
use crate::detached::DetachedSignature;
use crate::digest::{Digest, clip};
use crate::error::Error;
use crate::keys::PublicKey;

/// The most entries (allOf and anyOf together) a policy may have.
pub const MAX_POLICY_ENTRIES: usize = 64;
/// The most annotations one entry may require.
pub const MAX_ENTRY_ANNOTATIONS: usize = 32;

/// A trust policy as written (YAML or JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrustPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_of: Option<Vec<SignatureRequirement>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any_of: Option<AnyOf>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnyOf {
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_matches: Option<u32>,
    #[serde(default)]
    pub signatures: Vec<SignatureRequirement>,
}

/// One entry. Only `kind: pubKey` is supported.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignatureRequirement {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// PEM `PUBLIC KEY` (P-256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Fields of other kinds, refused for `pubKey` (a misspelt
    /// `annotations` must not silently weaken the policy).
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl SignatureRequirement {
    /// A `pubKey` entry.
    pub fn pub_key(key_pem: &str) -> SignatureRequirement {
        SignatureRequirement {
            kind: "pubKey".into(),
            key: Some(key_pem.to_string()),
            ..SignatureRequirement::default()
        }
    }
}

/// A checked policy with its keys parsed, ready to evaluate signatures.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    all_of: Vec<Requirement>,
    any_of: Vec<Requirement>,
    minimum_matches: usize,
}

/// One entry of a compiled policy.
#[derive(Clone, Debug)]
pub struct Requirement {
    /// Where it is in the policy: `allOf[0]`, `anyOf.signatures[1]`.
    pub path: String,
    pub owner: Option<String>,
    pub key: PublicKey,
    pub annotations: BTreeMap<String, String>,
}

impl Requirement {
    fn identify(&self) -> KeyId {
        KeyId {
            path: self.path.clone(),
            owner: self.owner.clone(),
            fingerprint: self.key.fingerprint(),
        }
    }
}

/// A policy entry named in a verdict or a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyId {
    pub path: String,
    pub owner: Option<String>,
    /// [`PublicKey::fingerprint`].
    pub fingerprint: String,
}

/// The signatures satisfied the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Every satisfied entry, allOf's first.
    pub matched: Vec<KeyId>,
}

/// Why a module was refused, as a condition reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// A required key did not sign this module (or no signature was found).
    Untrusted,
    /// A trusted key's signature is there but does not hold for this module:
    /// it names another digest, or its payload is malformed.
    SignatureInvalid,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Untrusted => "Untrusted",
            RefusalReason::SignatureInvalid => "SignatureInvalid",
        }
    }
}

/// The signatures did not satisfy the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: RefusalReason,
    /// How many signatures were found.
    pub signatures_found: usize,
    /// The allOf entries not satisfied, and why.
    pub missing: Vec<(KeyId, String)>,
    /// `(satisfied, required)` when anyOf fell short.
    pub any_of_shortfall: Option<(usize, usize)>,
    /// The anyOf entries not satisfied when anyOf fell short, and why.
    pub any_of_missing: Vec<(KeyId, String)>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.reason.as_str())?;
        if self.signatures_found == 0 {
            write!(f, "no signature found; ")?;
        }
        let mut parts = Vec::new();
        for (id, why) in &self.missing {
            parts.push(format!("required {} {why}", describe_id(id)));
        }
        if let Some((got, needed)) = self.any_of_shortfall {
            let candidates: Vec<String> = self
                .any_of_missing
                .iter()
                .map(|(id, why)| format!("{} {why}", describe_id(id)))
                .collect();
            parts.push(format!(
                "anyOf needs {needed} matching signatures, found {got} ({})",
                candidates.join("; ")
            ));
        }
        write!(f, "{}", parts.join("; "))
    }
}

impl std::error::Error for Refusal {}

fn describe_id(id: &KeyId) -> String {
    match &id.owner {
        Some(owner) => format!("{} (owner {owner:?}, key {})", id.path, id.fingerprint),
        None => format!("{} (key {})", id.path, id.fingerprint),
    }
}

/// How far the signatures got with one entry; later variants are better.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Unsigned,
    /// The key signed, but the signature does not hold for this module.
    Invalid(String),
    /// The key signed this module without the required annotations.
    MissingAnnotations(Vec<String>),
    Satisfied,
}

impl Outcome {
    fn why(&self) -> String {
        match self {
            Outcome::Unsigned => "has not signed it".into(),
            Outcome::Invalid(detail) => format!("signed, but {detail}"),
            Outcome::MissingAnnotations(keys) => format!(
                "signed it without the required annotations {}",
                keys.join(", ")
            ),
            Outcome::Satisfied => "signed it".into(),
        }
    }
}

impl TrustPolicy {
    /// A policy that every key in `key_pems` (PEM `PUBLIC KEY`s) must have
    /// signed.
    pub fn all_of_keys(key_pems: &[String]) -> TrustPolicy {
        TrustPolicy {
            all_of: Some(
                key_pems
                    .iter()
                    .map(|k| SignatureRequirement::pub_key(k))
                    .collect(),
            ),
            ..TrustPolicy::default()
        }
    }

    /// Checks the policy and parses its keys.
    ///
    /// # Errors
    /// [`Error::Policy`] naming the entry (`allOf[1].key`) and what is wrong.
    pub fn compile(&self) -> Result<CompiledPolicy, Error> {
        if let Some(v) = &self.api_version
            && v != "v1"
        {
            return Err(Error::Policy(format!(
                "apiVersion: {} is not supported (v1)",
                clip(v)
            )));
        }
        let all_of = self.all_of.as_deref().unwrap_or_default();
        let any_of = self
            .any_of
            .as_ref()
            .map(|a| a.signatures.as_slice())
            .unwrap_or_default();
        if all_of.is_empty() && any_of.is_empty() {
            return Err(Error::Policy(
                "the policy requires no signature: give allOf or anyOf.signatures".into(),
            ));
        }
        if all_of.len() + any_of.len() > MAX_POLICY_ENTRIES {
            return Err(Error::Policy(format!(
                "more than {MAX_POLICY_ENTRIES} entries"
            )));
        }
        let minimum_matches = match &self.any_of {
            None => 0,
            Some(a) => {
                let m = a.minimum_matches.unwrap_or(1) as usize;
                if a.signatures.is_empty() {
                    return Err(Error::Policy("anyOf.signatures: is empty".into()));
                }
                if m == 0 {
                    return Err(Error::Policy(
                        "anyOf.minimumMatches: must be at least 1".into(),
                    ));
                }
                if m > a.signatures.len() {
                    return Err(Error::Policy(format!(
                        "anyOf.minimumMatches: {m} is more than the {} signatures listed",
                        a.signatures.len()
                    )));
                }
                m
            }
        };
        let compile_list = |list: &[SignatureRequirement], prefix: &str| {
            list.iter()
                .enumerate()
                .map(|(i, r)| compile_requirement(r, format!("{prefix}[{i}]")))
                .collect::<Result<Vec<_>, Error>>()
        };
        Ok(CompiledPolicy {
            all_of: compile_list(all_of, "allOf")?,
            any_of: compile_list(any_of, "anyOf.signatures")?,
            minimum_matches,
        })
    }
}

fn compile_requirement(r: &SignatureRequirement, path: String) -> Result<Requirement, Error> {
    if r.kind != "pubKey" {
        return Err(Error::Policy(format!(
            "{path}.kind: {} is not supported; only pubKey (keyless kinds need Fulcio and Rekor)",
            clip(&r.kind)
        )));
    }
    if let Some(field) = r.other.keys().next() {
        return Err(Error::Policy(format!(
            "{path}: unknown field {} for kind pubKey (owner, key, annotations)",
            clip(field)
        )));
    }
    let key = r
        .key
        .as_deref()
        .ok_or_else(|| Error::Policy(format!("{path}.key: required for kind pubKey")))?;
    let key = PublicKey::from_pem(key).map_err(|e| Error::Policy(format!("{path}.key: {e}")))?;
    let annotations = r.annotations.clone().unwrap_or_default();
    if annotations.len() > MAX_ENTRY_ANNOTATIONS {
        return Err(Error::Policy(format!(
            "{path}.annotations: more than {MAX_ENTRY_ANNOTATIONS}"
        )));
    }
    Ok(Requirement {
        path,
        owner: r.owner.clone(),
        key,
        annotations,
    })
}

impl CompiledPolicy {
    /// The entries, allOf's first.
    pub fn requirements(&self) -> impl Iterator<Item = &Requirement> {
        self.all_of.iter().chain(&self.any_of)
    }

    /// Evaluates cosign signatures found for the manifest `manifest_digest`.
    ///
    /// # Errors
    /// A [`Refusal`] naming the entries not satisfied.
    pub fn evaluate_cosign(
        &self,
        manifest_digest: &Digest,
        signatures: &[CosignSignature],
    ) -> Result<Verdict, Refusal> {
        let expected = manifest_digest.to_string();
        self.evaluate(signatures.len(), |req| {
            signatures
                .iter()
                .filter(|s| s.verifies_with(&req.key))
                .map(|s| match s.claim() {
                    Err(e) => Outcome::Invalid(e.to_string()),
                    Ok(claim) if claim.manifest_digest != expected => Outcome::Invalid(format!(
                        "for another manifest ({}), not {expected}",
                        clip(&claim.manifest_digest)
                    )),
                    Ok(claim) => annotations_outcome(&req.annotations, &claim.annotations),
                })
                .max()
                .unwrap_or(Outcome::Unsigned)
        })
    }

    /// Evaluates detached signatures of `module`.
    ///
    /// # Errors
    /// A [`Refusal`] naming the entries not satisfied.
    pub fn evaluate_detached(
        &self,
        module: &[u8],
        signatures: &[DetachedSignature],
    ) -> Result<Verdict, Refusal> {
        let none = BTreeMap::new();
        self.evaluate(signatures.len(), |req| {
            signatures
                .iter()
                .filter(|s| s.verifies(&req.key, module))
                .map(|_| annotations_outcome(&req.annotations, &none))
                .max()
                .unwrap_or(Outcome::Unsigned)
        })
    }

    fn evaluate(
        &self,
        signatures_found: usize,
        outcome: impl Fn(&Requirement) -> Outcome,
    ) -> Result<Verdict, Refusal> {
        let all: Vec<(&Requirement, Outcome)> =
            self.all_of.iter().map(|r| (r, outcome(r))).collect();
        let any: Vec<(&Requirement, Outcome)> =
            self.any_of.iter().map(|r| (r, outcome(r))).collect();
        let satisfied = |list: &[(&Requirement, Outcome)]| {
            list.iter()
                .filter(|(_, o)| *o == Outcome::Satisfied)
                .map(|(r, _)| r.identify())
                .collect::<Vec<_>>()
        };
        let unsatisfied = |list: &[(&Requirement, Outcome)]| {
            list.iter()
                .filter(|(_, o)| *o != Outcome::Satisfied)
                .map(|(r, o)| (r.identify(), o.why()))
                .collect::<Vec<_>>()
        };
        let any_matched = satisfied(&any);
        let missing = unsatisfied(&all);
        let shortfall = (any_matched.len() < self.minimum_matches)
            .then_some((any_matched.len(), self.minimum_matches));
        if missing.is_empty() && shortfall.is_none() {
            let mut matched = satisfied(&all);
            matched.extend(any_matched);
            return Ok(Verdict { matched });
        }
        // An entry that failed because its key's signature does not hold
        // makes the refusal SignatureInvalid rather than Untrusted.
        let invalid = all
            .iter()
            .chain(any.iter().filter(|_| shortfall.is_some()))
            .any(|(_, o)| matches!(o, Outcome::Invalid(_)));
        let reason = if invalid {
            RefusalReason::SignatureInvalid
        } else {
            RefusalReason::Untrusted
        };
        Err(Refusal {
            reason,
            signatures_found,
            missing,
            any_of_shortfall: shortfall,
            any_of_missing: if shortfall.is_some() {
                unsatisfied(&any)
            } else {
                Vec::new()
            },
        })
    }
}

fn annotations_outcome(
    required: &BTreeMap<String, String>,
    present: &BTreeMap<String, String>,
) -> Outcome {
    let missing: Vec<String> = required
        .iter()
        .filter(|(k, v)| present.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if missing.is_empty() {
        Outcome::Satisfied
    } else {
        Outcome::MissingAnnotations(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{SigningKey, generate_key_pair};

    struct Signer {
        key: SigningKey,
        public_pem: String,
    }

    fn signer() -> Signer {
        let keys = generate_key_pair().unwrap();
        Signer {
            key: SigningKey::from_pem(&keys.private_pem).unwrap(),
            public_pem: keys.public_pem,
        }
    }

    fn sign(s: &Signer, digest: &Digest, annotations: &[(&str, &str)]) -> CosignSignature {
        let annotations = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CosignSignature::sign(&s.key, "r/m", digest, &annotations).unwrap()
    }

    fn pub_keys(signers: &[&Signer]) -> Vec<SignatureRequirement> {
        signers
            .iter()
            .map(|s| SignatureRequirement::pub_key(&s.public_pem))
            .collect()
    }

    fn all_of(signers: &[&Signer]) -> CompiledPolicy {
        let keys: Vec<String> = signers.iter().map(|s| s.public_pem.clone()).collect();
        TrustPolicy::all_of_keys(&keys).compile().unwrap()
    }

    fn any_of(signers: &[&Signer], minimum: u32) -> CompiledPolicy {
        let any_of = AnyOf {
            minimum_matches: Some(minimum),
            signatures: pub_keys(signers),
        };
        let policy = TrustPolicy {
            any_of: Some(any_of),
            ..TrustPolicy::default()
        };
        policy.compile().unwrap()
    }

    #[test]
    fn all_of_needs_every_key() {
        let (alice, bob) = (signer(), signer());
        let digest = Digest::of(b"manifest");
        let policy = all_of(&[&alice, &bob]);

        let both = [sign(&alice, &digest, &[]), sign(&bob, &digest, &[])];
        let verdict = policy.evaluate_cosign(&digest, &both).unwrap();
        assert_eq!(verdict.matched.len(), 2);
        assert_eq!(verdict.matched[0].path, "allOf[0]");

        let refusal = policy.evaluate_cosign(&digest, &both[..1]).unwrap_err();
        assert_eq!(refusal.reason, RefusalReason::Untrusted);
        assert_eq!(refusal.missing.len(), 1);
        assert_eq!(refusal.missing[0].0.path, "allOf[1]");
        assert_eq!(
            refusal.missing[0].0.fingerprint,
            PublicKey::from_pem(&bob.public_pem).unwrap().fingerprint()
        );
        let text = refusal.to_string();
        assert!(text.starts_with("Untrusted: required allOf[1]"), "{text}");
        assert!(text.contains("has not signed it"), "{text}");
    }

    #[test]
    fn unsigned_is_untrusted_and_says_so() {
        let alice = signer();
        let policy = all_of(&[&alice]);
        let refusal = policy.evaluate_cosign(&Digest::of(b"m"), &[]).unwrap_err();
        assert_eq!(refusal.reason, RefusalReason::Untrusted);
        assert_eq!(refusal.signatures_found, 0);
        assert!(
            refusal.to_string().contains("no signature found"),
            "{refusal}"
        );
    }

    #[test]
    fn another_keys_signature_is_untrusted() {
        let (alice, mallory) = (signer(), signer());
        let digest = Digest::of(b"m");
        let refusal = all_of(&[&alice])
            .evaluate_cosign(&digest, &[sign(&mallory, &digest, &[])])
            .unwrap_err();
        assert_eq!(refusal.reason, RefusalReason::Untrusted);
        assert_eq!(refusal.signatures_found, 1);
    }

    #[test]
    fn a_trusted_signature_of_another_digest_is_invalid() {
        let alice = signer();
        let (digest, other) = (Digest::of(b"m"), Digest::of(b"other"));
        let refusal = all_of(&[&alice])
            .evaluate_cosign(&digest, &[sign(&alice, &other, &[])])
            .unwrap_err();
        assert_eq!(refusal.reason, RefusalReason::SignatureInvalid);
        assert!(
            refusal.to_string().contains("another manifest"),
            "{refusal}"
        );
    }

    #[test]
    fn any_of_counts_distinct_keys_up_to_minimum_matches() {
        let (a, b, c) = (signer(), signer(), signer());
        let digest = Digest::of(b"m");
        let policy = any_of(&[&a, &b, &c], 2);
        // Two signatures by the same key count once.
        let refusal = policy
            .evaluate_cosign(&digest, &[sign(&a, &digest, &[]), sign(&a, &digest, &[])])
            .unwrap_err();
        assert_eq!(refusal.any_of_shortfall, Some((1, 2)));
        assert_eq!(refusal.any_of_missing.len(), 2);
        assert!(
            refusal
                .to_string()
                .contains("anyOf needs 2 matching signatures, found 1")
        );
        let verdict = policy
            .evaluate_cosign(&digest, &[sign(&c, &digest, &[]), sign(&a, &digest, &[])])
            .unwrap();
        let paths: Vec<&str> = verdict.matched.iter().map(|k| k.path.as_str()).collect();
        assert_eq!(paths, ["anyOf.signatures[0]", "anyOf.signatures[2]"]);
        // minimumMatches defaults to 1.
        let mut loose = TrustPolicy {
            any_of: Some(AnyOf {
                minimum_matches: None,
                signatures: vec![SignatureRequirement::pub_key(&b.public_pem)],
            }),
            ..TrustPolicy::default()
        };
        assert!(
            loose
                .compile()
                .unwrap()
                .evaluate_cosign(&digest, &[sign(&b, &digest, &[])])
                .is_ok()
        );
        loose.all_of = Some(vec![SignatureRequirement::pub_key(&a.public_pem)]);
        let refusal = loose
            .compile()
            .unwrap()
            .evaluate_cosign(&digest, &[sign(&b, &digest, &[])])
            .unwrap_err();
        assert_eq!(refusal.missing[0].0.path, "allOf[0]");
        assert_eq!(refusal.any_of_shortfall, None);
    }

    #[test]
    fn annotations_must_be_on_the_signature() {
        let alice = signer();
        let digest = Digest::of(b"m");
        let mut requirement = SignatureRequirement::pub_key(&alice.public_pem);
        requirement.annotations = Some(BTreeMap::from([("env".into(), "prod".into())]));
        let policy = TrustPolicy {
            all_of: Some(vec![requirement]),
            ..TrustPolicy::default()
        }
        .compile()
        .unwrap();
        let refusal = policy
            .evaluate_cosign(&digest, &[sign(&alice, &digest, &[("env", "dev")])])
            .unwrap_err();
        assert!(
            refusal
                .to_string()
                .contains("without the required annotations env=prod")
        );
        policy
            .evaluate_cosign(
                &digest,
                &[
                    sign(&alice, &digest, &[("env", "dev")]),
                    sign(&alice, &digest, &[("env", "prod"), ("x", "y")]),
                ],
            )
            .unwrap();
        // A detached signature carries no annotations.
        let module = b"module";
        let detached = DetachedSignature::sign(&alice.key, module).unwrap();
        assert!(policy.evaluate_detached(module, &[detached]).is_err());
    }

    #[test]
    fn detached_signatures_verify_against_the_module() {
        let (alice, bob) = (signer(), signer());
        let policy = all_of(&[&alice]);
        let module = b"module bytes";
        let sig = DetachedSignature::sign(&alice.key, module).unwrap();
        assert!(
            policy
                .evaluate_detached(module, std::slice::from_ref(&sig))
                .is_ok()
        );
        assert!(policy.evaluate_detached(b"other bytes", &[sig]).is_err());
        let by_bob = DetachedSignature::sign(&bob.key, module).unwrap();
        let refusal = policy.evaluate_detached(module, &[by_bob]).unwrap_err();
        assert_eq!(refusal.reason, RefusalReason::Untrusted);
    }

    #[test]
    fn malformed_policies_are_refused_with_the_path() {
        let alice = signer();
        let key = &alice.public_pem;
        let cases: Vec<(String, &str)> = vec![
            ("{}".into(), "requires no signature"),
            (r#"{"apiVersion": "v2", "allOf": []}"#.into(), "apiVersion"),
            (
                r#"{"allOf": [{"kind": "githubAction", "owner": "x"}]}"#.into(),
                "allOf[0].kind",
            ),
            (r#"{"allOf": [{"kind": "pubKey"}]}"#.into(), "allOf[0].key: required"),
            (r#"{"allOf": [{"kind": "pubKey", "key": "x"}]}"#.into(), "allOf[0].key"),
            (
                serde_json::json!({"allOf": [{"kind": "pubKey", "key": key, "anotations": {}}]})
                    .to_string(),
                "unknown field \"anotations\"",
            ),
            (
                serde_json::json!({"anyOf": {"minimumMatches": 2, "signatures": [{"kind": "pubKey", "key": key}]}})
                    .to_string(),
                "anyOf.minimumMatches: 2 is more than",
            ),
            (
                serde_json::json!({"anyOf": {"minimumMatches": 0, "signatures": [{"kind": "pubKey", "key": key}]}})
                    .to_string(),
                "at least 1",
            ),
        ];
        for (text, expected) in cases {
            let policy: TrustPolicy = serde_json::from_str(&text).unwrap();
            let e = policy.compile().unwrap_err();
            assert!(e.to_string().contains(expected), "{text}: {e}");
        }
        let e = serde_json::from_str::<TrustPolicy>(r#"{"alOf": []}"#).unwrap_err();
        assert!(e.to_string().contains("alOf"), "{e}");
    }
}
