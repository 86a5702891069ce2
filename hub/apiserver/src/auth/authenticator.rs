//! Who is calling: client certificate first, then bearer token.

use std::sync::Arc;

use x509_parser::prelude::{FromDer, X509Certificate};

use super::{AUTHENTICATED_GROUP, TokenFile, UserInfo};
use crate::status::ApiError;

/// Authenticates requests the way kube-apiserver's union authenticator does
/// with its x509 and token-file authenticators: the client certificate is
/// tried first, then the bearer token; the first that succeeds wins. A wrong
/// token therefore does not spoil a valid certificate, and anything else
/// (no credentials, a wrong token, an unusable certificate) is 401:
/// anonymous access is off.
#[derive(Clone, Default)]
pub struct Authenticator {
    tokens: Option<TokenFile>,
    trust_client_certificates: bool,
    /// Tried, in order, for a bearer token the token file does not know.
    issued: Vec<Arc<dyn TokenAuthenticator>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("tokens", &self.tokens)
            .field("trust_client_certificates", &self.trust_client_certificates)
            .field("issued", &self.issued.len())
            .finish()
    }
}

/// Bearer tokens the embedding server issues itself (kube-apiserver's
/// service-account tokens play this part): who a token names, if it is one
/// of them and still valid.
pub trait TokenAuthenticator: Send + Sync + 'static {
    fn authenticate_token(&self, token: &str) -> Option<UserInfo>;
}

impl Authenticator {
    /// `trust_client_certificates`: whether a certificate that passed the TLS
    /// layer's verification against the client CA identifies the caller.
    /// Without it, presented certificates are ignored.
    pub fn new(tokens: Option<TokenFile>, trust_client_certificates: bool) -> Self {
        Authenticator {
            tokens,
            trust_client_certificates,
            issued: Vec::new(),
        }
    }

    /// Also accepts the tokens `issued` recognises (after the token file).
    #[must_use]
    pub fn with_issued_tokens(mut self, issued: Arc<dyn TokenAuthenticator>) -> Self {
        self.issued.push(issued);
        self
    }

    /// `authorization_header`: the `Authorization` header's value, if any.
    /// `peer_certificate_der`: the client's leaf certificate, already
    /// verified by the TLS layer.
    ///
    /// # Errors
    ///
    /// 401 `Unauthorized` when no credential identifies the caller; the
    /// reason is logged, not told to the client.
    // ApiError is the crate's error; its size is the crate's call.
    #[allow(clippy::result_large_err)]
    pub fn authenticate(
        &self,
        authorization_header: Option<&str>,
        peer_certificate_der: Option<&[u8]>,
    ) -> Result<UserInfo, ApiError> {
        let mut failures = Vec::new();
        if let Some(der) = peer_certificate_der.filter(|_| self.trust_client_certificates) {
            match user_from_certificate(der) {
                Ok(user) => return Ok(with_authenticated_group(user)),
                Err(reason) => failures.push(reason),
            }
        }
        if let Some(token) = authorization_header.and_then(bearer_token) {
            let user = match self.tokens.as_ref().and_then(|t| t.lookup(token)) {
                Some(user) => Some(user.clone()),
                None => self.issued.iter().find_map(|i| i.authenticate_token(token)),
            };
            match user {
                Some(user) => return Ok(with_authenticated_group(user)),
                None => failures.push("invalid bearer token".to_string()),
            }
        }
        if failures.is_empty() {
            tracing::debug!("unauthorized: no credentials (anonymous access is off)");
        } else {
            tracing::info!(reasons = %failures.join("; "), "unauthorized");
        }
        Err(ApiError::unauthorized())
    }
}

fn with_authenticated_group(mut user: UserInfo) -> UserInfo {
    if !user.in_group(AUTHENTICATED_GROUP) {
        user.groups.push(AUTHENTICATED_GROUP.to_string());
    }
    user
}

/// The token of `Bearer <token>` (scheme case-insensitive, as upstream);
/// `None` for other schemes and an empty token.
fn bearer_token(header: &str) -> Option<&str> {
    let mut parts = header.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// User = Subject CN, groups = Subject O values, as upstream's
/// `CommonNameUserConversion`. A certificate without a CN identifies no one.
pub fn user_from_certificate(der: &[u8]) -> Result<UserInfo, String> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("cannot parse client certificate: {e}"))?;
    let subject = cert.subject();
    // Go keeps the last CN when a subject has several; so do we.
    let name = subject
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .last()
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        return Err("client certificate has no Subject CN".into());
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(String::from)
        .collect();
    Ok(UserInfo {
        name,
        uid: String::new(),
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Ca;

    fn tokens() -> TokenFile {
        "good,alice,1,team-a\n".parse().unwrap()
    }

    fn client_cert(cn: &str, orgs: &[&str]) -> Vec<u8> {
        let ca = Ca::generate("test-ca").unwrap();
        let issued = ca.issue_client(cn, orgs).unwrap();
        crate::pki::cert_der(&issued.cert_pem).unwrap()
    }

    #[test]
    fn bearer_token_authenticates() {
        let a = Authenticator::new(Some(tokens()), true);
        let user = a.authenticate(Some("Bearer good"), None).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.uid, "1");
        assert_eq!(user.groups, vec!["team-a", AUTHENTICATED_GROUP]);
        // Scheme is case-insensitive, surrounding space is ignored.
        assert_eq!(
            a.authenticate(Some("  bearer good "), None).unwrap().name,
            "alice"
        );
    }

    #[test]
    fn wrong_or_missing_credentials_are_401() {
        let a = Authenticator::new(Some(tokens()), true);
        for header in [
            Some("Bearer bad"),
            Some("Basic Z29vZA=="),
            Some("Bearer"),
            Some("good"),
            None,
        ] {
            let e = a.authenticate(header, None).unwrap_err();
            assert_eq!(e.code, 401, "{header:?}");
            assert_eq!(e.reason, "Unauthorized");
            assert_eq!(e.message, "Unauthorized");
        }
        // Without a tokens file no token is valid.
        let no_tokens = Authenticator::new(None, true);
        assert_eq!(
            no_tokens
                .authenticate(Some("Bearer good"), None)
                .unwrap_err()
                .code,
            401
        );
    }

    #[test]
    fn issued_tokens_come_after_the_token_file() {
        struct Issued;
        impl TokenAuthenticator for Issued {
            fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
                token.strip_prefix("job:").map(|name| UserInfo {
                    name: format!("system:job:{name}"),
                    uid: String::new(),
                    groups: vec!["jobs".into()],
                })
            }
        }
        let a = Authenticator::new(Some(tokens()), false).with_issued_tokens(Arc::new(Issued));
        let user = a.authenticate(Some("Bearer job:x"), None).unwrap();
        assert_eq!(user.name, "system:job:x");
        assert_eq!(user.groups, vec!["jobs", AUTHENTICATED_GROUP]);
        assert_eq!(
            a.authenticate(Some("Bearer good"), None).unwrap().name,
            "alice"
        );
        assert_eq!(
            a.authenticate(Some("Bearer other"), None).unwrap_err().code,
            401
        );
        // Without a token file the issued tokens still authenticate.
        let alone = Authenticator::new(None, false).with_issued_tokens(Arc::new(Issued));
        assert_eq!(
            alone.authenticate(Some("Bearer job:y"), None).unwrap().name,
            "system:job:y"
        );
    }

    #[test]
    fn certificate_gives_cn_and_organizations() {
        let a = Authenticator::new(None, true);
        let der = client_cert("carol", &["team-b", "trainhub:admins"]);
        let user = a.authenticate(None, Some(&der)).unwrap();
        assert_eq!(user.name, "carol");
        assert_eq!(user.uid, "");
        assert_eq!(
            user.groups,
            vec!["team-b", "trainhub:admins", AUTHENTICATED_GROUP]
        );
    }

    #[test]
    fn certificate_wins_over_a_bad_token_and_before_a_good_one() {
        let a = Authenticator::new(Some(tokens()), true);
        let der = client_cert("carol", &[]);
        assert_eq!(
            a.authenticate(Some("Bearer bad"), Some(&der)).unwrap().name,
            "carol"
        );
        assert_eq!(
            a.authenticate(Some("Bearer good"), Some(&der))
                .unwrap()
                .name,
            "carol"
        );
    }

    #[test]
    fn untrusted_or_unusable_certificate_falls_back_to_token() {
        let der = client_cert("carol", &[]);
        let untrusting = Authenticator::new(Some(tokens()), false);
        assert_eq!(
            untrusting.authenticate(None, Some(&der)).unwrap_err().code,
            401
        );
        assert_eq!(
            untrusting
                .authenticate(Some("Bearer good"), Some(&der))
                .unwrap()
                .name,
            "alice"
        );
        let a = Authenticator::new(Some(tokens()), true);
        let garbage = b"not a certificate";
        assert_eq!(
            a.authenticate(Some("Bearer good"), Some(garbage))
                .unwrap()
                .name,
            "alice"
        );
        assert_eq!(a.authenticate(None, Some(garbage)).unwrap_err().code, 401);
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "team-b");
        let key = rcgen::KeyPair::generate().unwrap();
        let no_cn = params.self_signed(&key).unwrap().der().to_vec();
        assert_eq!(a.authenticate(None, Some(&no_cn)).unwrap_err().code, 401);
    }
}
