//! Kubernetes-style REST API machinery: the hub serves its TrainJob API with
//! it, and the spoke's Kubernetes-backend tests use it as an API server
//! stand-in.
//!
//! The crate knows nothing of TrainJobs. A server is a set of
//! [`resource::ResourceDef`]s over a [`store::Store`], with an
//! [`admission::Admission`] hook and an [`auth`] policy:
//!
//! - [`store`]: the crash-safe embedded store (redb) behind a trait;
//! - [`status`] and [`field`]: errors as `metav1.Status`, field errors as
//!   upstream's `field.Error`;
//! - [`resource`]: what a resource is (group, version, kind, scope,
//!   subresources, printer columns, schema);
//! - [`names`] and [`namespace`]: names validated as Kubernetes does, and
//!   the `Namespace` kind;
//! - [`quota`]: the `ResourceQuota` kind, object counts per namespace;
//! - [`admission`]: the seam for defaulting and validation;
//! - [`review`]: the self reviews (`kubectl auth can-i`, `whoami`);
//! - [`auth`]: who is calling (tokens file, client certificates) and what
//!   they may do (admin group, namespace grants);
//! - [`recent`]: the bounded cache of recently used entries the hot reads
//!   go through;
//! - [`limits`]: how large and deep a request and a stored object may be,
//!   and the bounded decoders that enforce it;
//! - [`tls`], [`pki`], [`reload`] and [`kubeconfig`]: serving over TLS
//!   (HTTP/1.1 and h2, optional client certificates), a small CA, serving
//!   certificates re-read when rotated on disk, and kubeconfigs for clients.

pub mod admission;
pub mod auth;
pub mod field;
pub mod kubeconfig;
pub mod limits;
pub mod names;
pub mod namespace;
pub mod patch;
pub mod pki;
pub mod protobuf;
pub mod quota;
pub mod recent;
pub mod reload;
pub mod resource;
pub mod review;
pub mod schema;
pub mod selector;
pub mod server;
pub mod status;
pub mod store;
pub mod table;
pub mod tls;

#[cfg(test)]
mod proptests;
