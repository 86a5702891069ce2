//! Namespaces on the server: what kube-apiserver's `NamespaceLifecycle`
//! admission and kube-controller-manager's namespace controller do, for a
//! server that serves the core `namespaces` resource (see
//! [`crate::namespace`]). A server that does not serve it (the spoke tests'
//! stand-in) has none of this.
//!
//! - creating a namespaced object in a namespace that does not exist is 404
//!   `namespaces "x" not found`; in one being deleted, 403 with the cause
//!   `NamespaceTerminating`;
//! - protected namespaces (`default` and those the embedder names) cannot be
//!   deleted;
//! - [`Server::run_namespace_controller`] empties each deleted namespace
//!   through the normal deletion path (finalizers respected), then removes
//!   it;
//! - [`Server::ensure_namespaces`] creates the namespaces an existing store
//!   already uses, so an upgrade loses nothing;
//! - non-admins see in lists and watches only the namespaces they may get.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;

use super::handlers::{self, Ctx};
use super::request::{Format, Query, Target};
use super::{Server, meta_str};
use crate::auth::{Attributes, Authorizer, UserInfo};
use crate::namespace::{self, NAMESPACES};
use crate::resource::ResourceDef;
use crate::status::{ApiError, qualified};
use crate::store::{Key, Op};

/// How often the namespace controller looks at namespaces being deleted
/// (besides every change of a namespace).
const RESYNC: Duration = Duration::from_millis(500);

/// The server acting on its own behalf.
pub(crate) fn system_user() -> UserInfo {
    UserInfo {
        name: "system:trainhub".into(),
        uid: String::new(),
        groups: vec!["system:masters".into()],
    }
}

impl Server {
    /// Whether this server serves the core `namespaces` resource with its
    /// lifecycle ([`super::Builder::namespace_lifecycle`]).
    pub fn serves_namespaces(&self) -> bool {
        self.namespace_lifecycle && self.resource("", "v1", NAMESPACES).is_some()
    }

    /// A request context for the server's own writes to `def`.
    pub(crate) fn system_ctx(
        self: &Arc<Self>,
        def: Arc<ResourceDef>,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Ctx {
        Ctx {
            server: self.clone(),
            target: Target {
                group: def.group.clone(),
                version: def.version.clone(),
                namespace: namespace.map(str::to_string),
                plural: def.plural.clone(),
                name: name.map(str::to_string),
                subresource: None,
            },
            def,
            query: Query::default(),
            headers: axum::http::HeaderMap::new(),
            user: system_user(),
            format: Format::Json,
        }
    }

    /// Creates the namespaces `names` and every namespace a stored object of
    /// a served namespaced resource is in, those that do not exist yet.
    /// Returns the names it created. Idempotent; a no-op on a server that
    /// does not serve namespaces.
    ///
    /// # Errors
    ///
    /// The first creation that fails for another reason than that the
    /// namespace exists.
    pub async fn ensure_namespaces(
        self: &Arc<Self>,
        names: &[&str],
    ) -> Result<Vec<String>, ApiError> {
        if !self.serves_namespaces() {
            return Ok(Vec::new());
        }
        let mut wanted: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
        for def in self
            .resources
            .iter()
            .filter(|d| d.namespaced && d.is_storage_version())
        {
            let (objects, _) = self.store.list(&def.store_key(), None);
            wanted.extend(objects.into_iter().map(|o| o.key.namespace));
        }
        let mut created = Vec::new();
        for name in wanted.into_iter().filter(|n| !n.is_empty()) {
            if self.store.get(&Key::new(NAMESPACES, None, &name)).is_some() {
                continue;
            }
            match self.create_object(namespace::object(&name)).await {
                Ok(_) => created.push(name),
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(created)
    }

    /// Empties and removes deleted namespaces until `shutdown` resolves:
    /// every object in a terminating namespace is deleted as a client's
    /// delete would (objects with finalizers are marked and wait for them),
    /// the read-only views (pods, events) once nothing else remains; then
    /// the `kubernetes` finalizer goes and with the last finalizer the
    /// namespace. Safe to run after a crash at any point: it resumes from
    /// what the store holds.
    pub async fn run_namespace_controller(
        self: Arc<Self>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        if !self.serves_namespaces() {
            return shutdown.await;
        }
        let mut ticker = tokio::time::interval(RESYNC);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut watch = self.store.watch(NAMESPACES, None, None).ok();
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
                event = async {
                    match watch.as_mut() {
                        Some(w) => w.live.recv().await,
                        None => std::future::pending().await,
                    }
                } => match event {
                    Ok(_) => {}
                    // Behind: follow again from now (this pass lists anyway).
                    Err(RecvError::Lagged(_)) => watch = self.store.watch(NAMESPACES, None, None).ok(),
                    // The store is closing: the ticker alone from now on.
                    Err(RecvError::Closed) => watch = None,
                }
            }
            let (namespaces, _) = self.store.list(NAMESPACES, None);
            for ns in namespaces
                .iter()
                .filter(|o| namespace::is_terminating(&o.value))
            {
                if let Err(e) = self.finalize_namespace(&ns.key.name).await {
                    tracing::warn!(namespace = %ns.key.name, error = %e.message, "deleting the namespace's contents");
                }
            }
        }
    }

    /// One pass over a terminating namespace.
    async fn finalize_namespace(self: &Arc<Self>, name: &str) -> Result<(), ApiError> {
        let mut remaining: Vec<(String, usize)> = Vec::new();
        // Writable resources first: their deletion (a TrainJob's) may clean
        // up the read-only views itself.
        // Each resource once, at the version its objects are stored at.
        let mut defs: Vec<&Arc<ResourceDef>> = self
            .resources
            .iter()
            .filter(|d| d.namespaced && d.is_storage_version())
            .collect();
        defs.sort_by_key(|d| d.read_only);
        let mut writable_left = false;
        for def in defs {
            let (objects, _) = self.store.list(&def.store_key(), Some(name));
            if objects.is_empty() {
                continue;
            }
            remaining.push((qualified(&def.plural, &def.group), objects.len()));
            if def.read_only {
                if writable_left {
                    continue;
                }
                for chunk in objects.chunks(crate::store::MAX_COMMIT_OPS) {
                    let ops = chunk
                        .iter()
                        .map(|o| Op::Remove { key: o.key.clone() })
                        .collect();
                    self.store
                        .commit(ops)
                        .await
                        .map_err(|e| ApiError::from_store(e, &def.group, &def.plural))?;
                }
                continue;
            }
            writable_left = true;
            let ctx = self.system_ctx(def.clone(), Some(name), None);
            for object in objects {
                if meta_str(&object.value, "deletionTimestamp").is_some() {
                    continue; // waiting on its finalizers
                }
                match handlers::delete_object(&ctx, &object, &Value::Null).await {
                    Ok(_) => {}
                    Err(e) if e.code == 404 || e.code == 409 => {} // changed meanwhile; next pass
                    Err(e) => return Err(e),
                }
            }
        }
        let key = Key::new(NAMESPACES, None, name);
        let Some(stored) = self.store.get(&key) else {
            return Ok(());
        };
        let mut value = stored.value.as_ref().clone();
        let now = handlers::now_rfc3339();
        if !remaining.is_empty() {
            namespace::set_content_remaining(&mut value, &remaining, &now);
            if value != *stored.value {
                self.commit_namespace(Op::Update {
                    key,
                    value,
                    expected: Some(stored.rv),
                })
                .await?;
            }
            return Ok(());
        }
        namespace::finalize(&mut value);
        let metadata_finalizers = value["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        let op = if namespace::spec_finalizers(&value).is_empty() && !metadata_finalizers {
            Op::Delete {
                key,
                expected: Some(stored.rv),
            }
        } else {
            namespace::set_content_remaining(&mut value, &[], &now);
            if value == *stored.value {
                return Ok(());
            }
            Op::Update {
                key,
                value,
                expected: Some(stored.rv),
            }
        };
        self.commit_namespace(op).await
    }

    async fn commit_namespace(&self, op: Op) -> Result<(), ApiError> {
        match self.store.commit(vec![op]).await {
            Ok(_) => Ok(()),
            // Written meanwhile: the next pass sees the new state.
            Err(
                crate::store::StoreError::Conflict { .. } | crate::store::StoreError::NotFound(_),
            ) => Ok(()),
            Err(e) => Err(ApiError::from_store(e, "", NAMESPACES)),
        }
    }
}

/// NamespaceLifecycle for a create of `name` of `def` in `namespace`: 404
/// when the namespace does not exist, 403 when it is being deleted.
pub(crate) fn check_create(
    server: &Server,
    def: &ResourceDef,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    if !server.serves_namespaces() {
        return Ok(());
    }
    let Some(stored) = server.store.get(&Key::new(NAMESPACES, None, namespace)) else {
        return Err(ApiError::not_found("", NAMESPACES, namespace));
    };
    if namespace::is_terminating(&stored.value) {
        return Err(ApiError::forbidden_because(
            &def.group,
            &def.plural,
            name,
            &format!("unable to create new content in namespace {namespace} because it is being terminated"),
        )
        .with_cause(
            "NamespaceTerminating",
            &format!("namespace {namespace} is being terminated"),
            "metadata.namespace",
        ));
    }
    Ok(())
}

/// Refuses the deletion of a protected namespace, as kube-apiserver refuses
/// `default`'s.
pub(crate) fn check_delete(server: &Server, name: &str) -> Result<(), ApiError> {
    if server.protected_namespaces.iter().any(|n| n == name) {
        return Err(ApiError::forbidden_because(
            "",
            NAMESPACES,
            name,
            "this namespace may not be deleted",
        ));
    }
    Ok(())
}

/// Which namespaces a caller sees in lists and watches: those it may get.
pub(crate) struct Visibility {
    authorizer: Arc<dyn Authorizer>,
    user: UserInfo,
}

impl Visibility {
    pub fn new(server: &Server, user: &UserInfo) -> Visibility {
        Visibility {
            authorizer: server.authorizer.clone(),
            user: user.clone(),
        }
    }

    pub fn allows(&self, namespace: &Value) -> bool {
        let name = meta_str(namespace, "name").unwrap_or_default();
        self.authorizer
            .authorize(&self.user, &attributes("get", Some(name), None))
            .is_ok()
    }
}

/// The authorization attributes of a request about namespace `name`: as
/// kube-apiserver's request info has it, a namespace is in itself, so a
/// grant of namespace `x` covers `get namespaces/x`.
pub(crate) fn attributes<'a>(
    verb: &'a str,
    name: Option<&'a str>,
    subresource: Option<&'a str>,
) -> Attributes<'a> {
    Attributes {
        verb,
        group: "",
        resource: NAMESPACES,
        subresource,
        namespace: name,
        name: name.unwrap_or_default(),
    }
}

/// The namespace a request about `def` is authorized in.
pub(crate) fn authorization_namespace<'a>(
    def: &ResourceDef,
    target: &'a Target,
) -> Option<&'a str> {
    if namespace::is_namespaces(def) {
        target.name.as_deref()
    } else {
        target.namespace.as_deref()
    }
}
