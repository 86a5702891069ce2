//! Authentication and authorization.
//!
//! Who is calling: a bearer token from a tokens file (kube-apiserver's
//! `--token-auth-file` format) or a client certificate (user = CN, groups =
//! O). What they may do: see [`Authorizer`].

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
