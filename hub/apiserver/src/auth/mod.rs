//! Authentication and authorization.
//!
//! Who is calling ([`Authenticator`]): a client certificate verified by the
//! TLS layer against the client CA (user = Subject CN, groups = Subject O),
//! or a bearer token from a [`TokenFile`] (kube-apiserver's
//! `--token-auth-file` format). Anonymous requests are refused with 401.
//!
//! What they may do ([`Authorizer`]): [`PolicyAuthorizer`] reads a small YAML
//! [`Policy`] of admin groups and namespace grants; [`AllowAll`] is for tests
//! and stand-ins. A refusal becomes a 403 through [`forbidden`], worded as
//! kube-apiserver words it.

mod authenticator;
mod policy;
mod tokenfile;

use std::path::PathBuf;

pub use authenticator::{Authenticator, TokenAuthenticator, user_from_certificate};
pub use policy::{DEFAULT_ADMIN_GROUPS, NamespaceGrant, Policy, PolicyAuthorizer};
pub use tokenfile::{TokenEntry, TokenFile};

use crate::status::{ApiError, Subject, qualified};

/// The group every authenticated user is in, as upstream adds it.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// The request an authorizer decides on (RBAC's attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes<'a> {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    /// `None` for cluster-scoped resources and all-namespace lists.
    pub namespace: Option<&'a str>,
    pub name: &'a str,
}

/// Decides whether a user may do something.
pub trait Authorizer: Send + Sync + 'static {
    /// `Ok` to allow; `Err(reason)` to refuse with 403 (the reason is logged,
    /// the client sees the standard forbidden message).
    fn authorize(&self, user: &UserInfo, attributes: &Attributes<'_>) -> Result<(), String>;

    /// Decides a request for a path that is no resource (`/version`,
    /// `/metrics`), for access reviews. By default what every authenticated
    /// user may do: get the discovery, version and health endpoints, as
    /// kube-apiserver's `system:discovery` and `system:public-info-viewer`
    /// roles allow.
    fn authorize_non_resource(
        &self,
        _user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<(), String> {
        public_non_resource(verb, path)
    }

    /// What `user` may do in `namespace` (and cluster-wide), for
    /// `SelfSubjectRulesReview` (`kubectl auth can-i --list`); `None` when
    /// this authorizer cannot enumerate its rules (the review then says
    /// `incomplete`).
    fn rules(&self, _user: &UserInfo, _namespace: &str) -> Option<Rules> {
        None
    }
}

/// Paths every authenticated user may get (see
/// [`Authorizer::authorize_non_resource`]).
pub const PUBLIC_PATHS: [&str; 10] = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/openapi",
    "/openapi/*",
    "/version",
    "/healthz",
    "/livez",
    "/readyz",
];

fn public_non_resource(verb: &str, path: &str) -> Result<(), String> {
    let public = PUBLIC_PATHS.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => path == *p,
    });
    if verb == "get" && public {
        Ok(())
    } else {
        Err(format!("{verb} of {path} is for admins only"))
    }
}

/// The rules of a user, as `SelfSubjectRulesReview` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub resource_rules: Vec<ResourceRule>,
    pub non_resource_rules: Vec<NonResourceRule>,
}

/// RBAC's `ResourceRule`: `*` means all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceRule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    /// `resource` or `resource/subresource`.
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
}

/// RBAC's `NonResourceRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NonResourceRule {
    pub verbs: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

/// Allows everything: for tests and stand-ins.
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn authorize(&self, _: &UserInfo, _: &Attributes<'_>) -> Result<(), String> {
        Ok(())
    }
    fn authorize_non_resource(&self, _: &UserInfo, _: &str, _: &str) -> Result<(), String> {
        Ok(())
    }
    fn rules(&self, _: &UserInfo, _: &str) -> Option<Rules> {
        Some(Rules::everything())
    }
}

impl Rules {
    /// Everything, everywhere (admins).
    pub fn everything() -> Rules {
        let all = || vec!["*".to_string()];
        Rules {
            resource_rules: vec![ResourceRule {
                verbs: all(),
                api_groups: all(),
                resources: all(),
                resource_names: vec![],
            }],
            non_resource_rules: vec![NonResourceRule {
                verbs: all(),
                non_resource_urls: all(),
            }],
        }
    }
}

/// Asks `authorizer`; on refusal logs the reason and answers the 403 that
/// kube-apiserver would.
// ApiError is the crate's error; its size is the crate's call.
#[allow(clippy::result_large_err)]
pub fn authorize(
    authorizer: &dyn Authorizer,
    user: &UserInfo,
    attributes: &Attributes<'_>,
) -> Result<(), ApiError> {
    authorizer.authorize(user, attributes).map_err(|reason| {
        tracing::info!(
            user = %user.name,
            verb = attributes.verb,
            group = attributes.group,
            resource = attributes.resource,
            subresource = attributes.subresource.unwrap_or(""),
            namespace = attributes.namespace.unwrap_or(""),
            name = attributes.name,
            %reason,
            "forbidden"
        );
        forbidden(user, attributes)
    })
}

/// The 403 for `attributes`, as kube-apiserver spells it; a subresource is
/// named in the sentence (`pods/log`), not in the qualified resource:
/// `pods "p" is forbidden: User "bob" cannot get resource "pods/log" in API group "" in the namespace "ns"`.
pub fn forbidden(user: &UserInfo, attributes: &Attributes<'_>) -> ApiError {
    let Some(subresource) = attributes.subresource.filter(|s| !s.is_empty()) else {
        return ApiError::forbidden(
            &user.name,
            attributes.verb,
            attributes.group,
            attributes.resource,
            attributes.namespace,
            attributes.name,
        );
    };
    let resource = qualified(attributes.resource, attributes.group);
    let target = if attributes.name.is_empty() {
        resource
    } else {
        format!("{resource} \"{}\"", attributes.name)
    };
    let scope = match attributes.namespace {
        Some(ns) if !ns.is_empty() => format!(" in the namespace \"{ns}\""),
        _ => " at the cluster scope".to_string(),
    };
    let mut e = ApiError::new(
        403,
        "Forbidden",
        format!(
            "{target} is forbidden: User \"{}\" cannot {} resource \"{}/{subresource}\" in API group \"{}\"{scope}",
            user.name, attributes.verb, attributes.resource, attributes.group
        ),
    );
    e.subject = Some(Box::new(Subject {
        group: attributes.group.to_string(),
        kind: attributes.resource.to_string(),
        name: attributes.name.to_string(),
    }));
    e
}

/// A tokens file or policy file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `source_name` is the file's path, or `token file` for text not read
    /// from a file.
    #[error("{source_name}: line {line}: {message}")]
    TokenLine {
        source_name: String,
        line: usize,
        message: String,
    },
    #[error("{source_name}: {message}")]
    Policy {
        source_name: String,
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bob() -> UserInfo {
        UserInfo {
            name: "bob".into(),
            uid: "2".into(),
            groups: vec![AUTHENTICATED_GROUP.into()],
        }
    }

    struct DenyAll;
    impl Authorizer for DenyAll {
        fn authorize(&self, _: &UserInfo, _: &Attributes<'_>) -> Result<(), String> {
            Err("no".into())
        }
    }

    #[test]
    fn forbidden_names_object_and_namespace() {
        let a = Attributes {
            verb: "delete",
            group: "trainer.kubeflow.org",
            resource: "trainjobs",
            subresource: None,
            namespace: Some("team-b"),
            name: "j",
        };
        let e = authorize(&DenyAll, &bob(), &a).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(e.reason, "Forbidden");
        assert_eq!(
            e.message,
            "trainjobs.trainer.kubeflow.org \"j\" is forbidden: User \"bob\" cannot delete resource \"trainjobs\" in API group \"trainer.kubeflow.org\" in the namespace \"team-b\""
        );
        assert!(authorize(&AllowAll, &bob(), &a).is_ok());
    }

    #[test]
    fn forbidden_puts_subresource_in_the_sentence() {
        let a = Attributes {
            verb: "get",
            group: "",
            resource: "pods",
            subresource: Some("log"),
            namespace: Some("team-b"),
            name: "p-0",
        };
        let e = forbidden(&bob(), &a);
        assert_eq!(
            e.message,
            "pods \"p-0\" is forbidden: User \"bob\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"team-b\""
        );
        let s = e.to_status();
        assert_eq!(s["details"]["kind"], "pods");
        assert_eq!(s["details"]["name"], "p-0");
        assert_eq!(s["code"], 403);
    }

    #[test]
    fn discovery_and_health_are_public_paths() {
        for path in [
            "/api",
            "/apis/trainer.kubeflow.org/v1alpha1",
            "/version",
            "/healthz",
            "/openapi/v3",
        ] {
            assert!(public_non_resource("get", path).is_ok(), "{path}");
        }
        assert!(public_non_resource("post", "/api").is_err());
        assert!(public_non_resource("get", "/metrics").is_err());
        assert!(public_non_resource("get", "/debug/flags/v").is_err());
        assert!(
            DenyAll
                .authorize_non_resource(&bob(), "get", "/version")
                .is_ok()
        );
    }

    #[test]
    fn forbidden_all_namespace_list_is_cluster_scope() {
        let a = Attributes {
            verb: "list",
            group: "trainer.kubeflow.org",
            resource: "trainjobs",
            subresource: None,
            namespace: None,
            name: "",
        };
        assert_eq!(
            forbidden(&bob(), &a).message,
            "trainjobs.trainer.kubeflow.org is forbidden: User \"bob\" cannot list resource \"trainjobs\" in API group \"trainer.kubeflow.org\" at the cluster scope"
        );
    }
}
