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

pub use authenticator::{Authenticator, user_from_certificate};
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
}

/// Allows everything: for tests and stand-ins.
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn authorize(&self, _: &UserInfo, _: &Attributes<'_>) -> Result<(), String> {
        Ok(())
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
