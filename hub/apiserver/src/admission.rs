//! The admission seam: defaulting and validation of every write, where
//! kube-apiserver runs mutating and validating admission webhooks.

use serde_json::Value;

use crate::auth::UserInfo;
use crate::resource::ResourceDef;
use crate::status::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// One write under admission.
pub struct Request<'a> {
    pub operation: Operation,
    pub resource: &'a ResourceDef,
    /// `Some("status")` for writes through the status subresource.
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// The stored object, for updates and deletes.
    pub old: Option<&'a Value>,
    pub user: &'a UserInfo,
    pub dry_run: bool,
}

/// What admission answers for an accepted write.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Sent to the client in `Warning: 299 - "..."` headers.
    pub warnings: Vec<String>,
    /// Further writes committed in the same transaction as a create (not
    /// for dry runs): what the object needs kept beside it, such as the
    /// runtime a TrainJob was admitted with. Other operations ignore them.
    pub also: Vec<crate::store::Op>,
}

/// Defaults and validates writes. `object` is the object to be stored
/// (after the server's own bookkeeping of metadata); an implementation may
/// change it (defaulting) and answers an [`ApiError`] (422 Invalid with one
/// cause per field, 403 Forbidden, ...) to refuse it.
pub trait Admission: Send + Sync + 'static {
    fn admit(&self, request: &Request<'_>, object: &mut Value) -> Result<Outcome, ApiError>;
}

/// Admits everything unchanged.
pub struct AllowAll;

impl Admission for AllowAll {
    fn admit(&self, _: &Request<'_>, _: &mut Value) -> Result<Outcome, ApiError> {
        Ok(Outcome::default())
    }
}
