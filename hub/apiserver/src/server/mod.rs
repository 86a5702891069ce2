//! The HTTP side: Kubernetes REST conventions over [`Store`], for the
//! resources a [`Server`] is given.
//!
//! - [`discovery`]: `/version`, `/api`, `/apis`, resource lists, OpenAPI v3;
//! - [`handlers`]: get, list, create, update, patch, delete, deletecollection,
//!   the `status` subresource;
//! - [`watch`]: JSON watch streams with bookmarks and 410 Expired;
//! - [`request`]: URL and content negotiation, authentication, responses.

mod discovery;
mod handlers;
mod inflight;
mod namespaces;
mod quota;
mod request;
mod versions;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use serde_json::Value;

pub use self::inflight::{RequestLimits, Slot as RequestSlot};
pub use self::request::{ByteStream, LogSource, LogsFuture};
use crate::admission::{self, Admission};
use crate::auth::{self, Authenticator, Authorizer};
use crate::patch::{BuiltinListKeys, ListKeys, SchemaListKeys};
use crate::resource::ResourceDef;
use crate::store::Store;

/// The Kubernetes API level the server implements, as `/version` reports
/// it (major, minor). kubectl warns when its own minor version is more than
/// one away from the server's; 1.33 is the newest level both the kubectl
/// clients in use (1.32 and 1.33) accept silently and the oldest that the
/// `k8s-openapi` types (features `v1_33` to `v1_37`) describe. The core
/// objects served (namespaces, pods, events, configmaps, reviews) have not
/// changed shape between those levels.
pub const KUBERNETES_VERSION: (u32, u32) = (1, 33);

/// What `/version` answers: `major` and `minor` are read from
/// `git_version`.
#[derive(Debug, Clone)]
pub struct VersionInfo {
    pub git_version: String,
    pub platform: String,
}

impl VersionInfo {
    /// The Kubernetes API level with `program` and its version as build
    /// metadata, as k3s reports `v1.33.1+k3s1`:
    /// `v1.33.0+trainhub-0.1.0`.
    pub fn kubernetes_level(program: &str, version: &str) -> Self {
        let (major, minor) = KUBERNETES_VERSION;
        VersionInfo {
            git_version: format!("v{major}.{minor}.0+{program}-{version}"),
            platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        }
    }
}

impl Default for VersionInfo {
    fn default() -> Self {
        Self::kubernetes_level("trainhub", env!("CARGO_PKG_VERSION"))
    }
}

/// A Kubernetes-style API server over a store.
pub struct Server {
    store: Arc<dyn Store>,
    resources: Vec<Arc<ResourceDef>>,
    /// (group, version, plural) → index into `resources`.
    index: BTreeMap<(String, String, String), usize>,
    /// How each resource's lists merge (by index, as `resources`).
    keys: Vec<Arc<dyn ListKeys + Send + Sync>>,
    admission: Arc<dyn Admission>,
    /// `None`: every request runs as an anonymous admin (stand-ins, tests).
    authenticator: Option<Arc<Authenticator>>,
    authorizer: Arc<dyn Authorizer>,
    logs: Option<Arc<dyn LogSource>>,
    version: VersionInfo,
    bookmark_interval: Duration,
    /// Whether deletes honour `propagationPolicy` with the `foregroundDeletion`
    /// and `orphan` finalizers, for a garbage collector to act on.
    garbage_collection: bool,
    /// Per-user caps on requests in flight.
    inflight: inflight::InFlight,
    /// A watch whose client takes none of its events for this long ends.
    watch_send_timeout: Duration,
    /// Whether namespaces have their lifecycle (see `namespaces`): objects
    /// only in existing namespaces, deleted namespaces emptied.
    namespace_lifecycle: bool,
    /// Namespaces that cannot be deleted (`default` and the embedder's own).
    protected_namespaces: Vec<String>,
    /// Bumped by [`Server::close_watches`]; every open watch ends when it changes.
    watch_epoch: tokio::sync::watch::Sender<u64>,
    /// Routes served without authentication (metrics), and routes for
    /// authenticated callers (who are in the request's `UserInfo`
    /// extension).
    public_routes: Router,
    authenticated_routes: Router,
    /// Extra lines of `/readyz?verbose` (e.g. a replica's role).
    readiness: Option<Readiness>,
    /// What a POST to an object's `/status` does, if anything.
    status_posts: Option<Arc<dyn StatusPost>>,
    /// Creates that charge a namespace's quotas take turns per namespace
    /// (see `quota`), shared with the copies of [`Server::with_store`].
    quota_turns: Arc<quota::Turns>,
}

/// A POST to the `/status` of an object: Kubernetes has no such verb, but
/// Kubeflow Trainer's status server takes the training pods' progress that
/// way (`POST .../trainjobs/NAME/status` with `{"trainerStatus": ...}`).
/// The request is authenticated and authorized as any other (verb
/// `create` on the `status` subresource); the embedder turns the body into
/// the object's new status, which the server then writes as an update of
/// `/status` by the field manager [`STATUS_POST_MANAGER`]: schema, CEL
/// rules and admission apply, a conflicting write meanwhile is retried.
pub trait StatusPost: Send + Sync + 'static {
    /// Whether POSTs to the status of `def`'s objects are taken at all
    /// (others are 405, as kube-apiserver answers).
    fn serves(&self, def: &ResourceDef) -> bool;

    /// For `body` posted by `user` to `object`'s status: the new status
    /// (`None`: nothing to write) and the answer to send with 200.
    ///
    /// # Errors
    ///
    /// The body is refused; the error is the answer.
    #[allow(clippy::result_large_err)]
    fn post(
        &self,
        user: &auth::UserInfo,
        object: &Value,
        body: &[u8],
    ) -> Result<StatusPosted, crate::status::ApiError>;
}

/// The field manager of the writes [`StatusPost`] makes (upstream's status
/// server applies as `trainer-status`).
pub const STATUS_POST_MANAGER: &str = "trainer-status";

/// What [`StatusPost::post`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusPosted {
    /// The object's whole new status; `None` leaves it as it is.
    pub status: Option<Value>,
    /// The 200 answer's JSON body.
    pub answer: Value,
}

/// What `/readyz?verbose` adds, as `name: detail` pairs, checked at each
/// request (a replica's role: leader or follower).
pub type Readiness = Arc<dyn Fn() -> Vec<(String, String)> + Send + Sync>;

/// Builds a [`Server`].
pub struct Builder {
    server: Server,
}

impl Builder {
    pub fn resource(mut self, def: ResourceDef) -> Self {
        let key = (def.group.clone(), def.version.clone(), def.plural.clone());
        self.server.index.insert(key, self.server.resources.len());
        // A read-only resource is never patched: no copy of its schema
        // (a Workload's is megabytes) for list keys it would never use.
        let keys: Arc<dyn ListKeys + Send + Sync> = match &def.schema {
            Some(schema) if !def.read_only => Arc::new(SchemaListKeys::new(schema.clone())),
            _ => Arc::new(BuiltinListKeys),
        };
        self.server.keys.push(keys);
        self.server.resources.push(Arc::new(def));
        self
    }
    pub fn admission(mut self, admission: Arc<dyn Admission>) -> Self {
        self.server.admission = admission;
        self
    }
    pub fn authenticator(mut self, authenticator: Arc<Authenticator>) -> Self {
        self.server.authenticator = Some(authenticator);
        self
    }
    /// What a POST to an object's `/status` does (see [`StatusPost`]).
    pub fn status_posts(mut self, posts: Arc<dyn StatusPost>) -> Self {
        self.server.status_posts = Some(posts);
        self
    }
    pub fn authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.server.authorizer = authorizer;
        self
    }
    pub fn logs(mut self, logs: Arc<dyn LogSource>) -> Self {
        self.server.logs = Some(logs);
        self
    }
    pub fn version(mut self, version: VersionInfo) -> Self {
        self.server.version = version;
        self
    }
    /// How often an idle watch that asked for bookmarks gets one (default 60 s,
    /// kube-apiserver sends them about once a minute).
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.server.bookmark_interval = interval;
        self
    }
    /// Deletes with `propagationPolicy: Foreground` (or `Orphan`) mark the
    /// object with the `foregroundDeletion` (or `orphan`) finalizer instead of
    /// removing it, as kube-apiserver does; a garbage collector running beside
    /// the server must then delete the dependents (or release them) and
    /// remove the finalizer. Off by default: without a collector such objects
    /// would never go.
    pub fn garbage_collection(mut self, enabled: bool) -> Self {
        self.server.garbage_collection = enabled;
        self
    }

    /// Per-user caps on requests in flight (default
    /// [`RequestLimits::default`]).
    pub fn request_limits(mut self, limits: RequestLimits) -> Self {
        self.server.inflight = inflight::InFlight::new(limits);
        self
    }

    /// A watch whose client has taken none of its pending events for this
    /// long is ended, so a client that stops reading holds no more than the
    /// events queued for it (default 60 s).
    pub fn watch_send_timeout(mut self, timeout: Duration) -> Self {
        self.server.watch_send_timeout = timeout;
        self
    }

    /// Gives namespaces kube-apiserver's lifecycle, for a server that serves
    /// [`crate::namespace::resource_def`]: objects are created only in
    /// namespaces that exist and are not being deleted; a deleted namespace
    /// is `Terminating` until [`Server::run_namespace_controller`] has
    /// emptied it. Off by default: a stand-in whose client manages
    /// namespaces itself keeps them plain objects.
    pub fn namespace_lifecycle(mut self, enabled: bool) -> Self {
        self.server.namespace_lifecycle = enabled;
        self
    }

    /// Namespaces that cannot be deleted besides `default` (the embedder's
    /// own, e.g. where it publishes its configuration).
    pub fn protected_namespaces(mut self, names: &[&str]) -> Self {
        for name in names {
            if !self.server.protected_namespaces.iter().any(|n| n == name) {
                self.server.protected_namespaces.push(name.to_string());
            }
        }
        self
    }

    /// Routes of the embedding server: `public` ones are served without
    /// authentication; `authenticated` ones after it, with the caller as an
    /// `axum::Extension<UserInfo>` (their handlers authorize).
    pub fn routes(mut self, public: Router, authenticated: Router) -> Self {
        self.server.public_routes = public;
        self.server.authenticated_routes = authenticated;
        self
    }

    /// Details `/readyz?verbose` lists after kube-apiserver's `[+]ping ok`
    /// (every line is a passed check: readiness stays true).
    pub fn readiness(mut self, readiness: Readiness) -> Self {
        self.server.readiness = Some(readiness);
        self
    }

    pub fn build(self) -> Arc<Server> {
        Arc::new(self.server)
    }
}

impl Server {
    pub fn builder(store: Arc<dyn Store>) -> Builder {
        Builder {
            server: Server {
                store,
                resources: Vec::new(),
                index: BTreeMap::new(),
                keys: Vec::new(),
                admission: Arc::new(admission::AllowAll),
                authenticator: None,
                authorizer: Arc::new(auth::AllowAll),
                logs: None,
                version: VersionInfo::default(),
                bookmark_interval: Duration::from_secs(60),
                garbage_collection: false,
                inflight: inflight::InFlight::new(RequestLimits::default()),
                watch_send_timeout: Duration::from_secs(60),
                namespace_lifecycle: false,
                protected_namespaces: vec![crate::namespace::DEFAULT.to_string()],
                watch_epoch: tokio::sync::watch::Sender::new(0),
                public_routes: Router::new(),
                authenticated_routes: Router::new(),
                readiness: None,
                status_posts: None,
                quota_turns: Arc::default(),
            },
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// This server's resources, admission and settings over another view of
    /// its store (a fenced one, see [`Store::fenced`]), for controllers
    /// whose writes must carry a leadership term. The copy serves no
    /// requests of its own: its request caps and watch epoch are fresh.
    pub fn with_store(self: &Arc<Self>, store: Arc<dyn Store>) -> Arc<Server> {
        Arc::new(Server {
            store,
            resources: self.resources.clone(),
            index: self.index.clone(),
            keys: self.keys.clone(),
            admission: self.admission.clone(),
            authenticator: self.authenticator.clone(),
            authorizer: self.authorizer.clone(),
            logs: self.logs.clone(),
            version: self.version.clone(),
            bookmark_interval: self.bookmark_interval,
            garbage_collection: self.garbage_collection,
            inflight: inflight::InFlight::new(self.inflight.limits()),
            watch_send_timeout: self.watch_send_timeout,
            namespace_lifecycle: self.namespace_lifecycle,
            protected_namespaces: self.protected_namespaces.clone(),
            watch_epoch: tokio::sync::watch::Sender::new(0),
            public_routes: self.public_routes.clone(),
            authenticated_routes: self.authenticated_routes.clone(),
            readiness: self.readiness.clone(),
            status_posts: self.status_posts.clone(),
            quota_turns: self.quota_turns.clone(),
        })
    }

    pub fn resources(&self) -> &[Arc<ResourceDef>] {
        &self.resources
    }

    /// The caller of a request the embedder serves itself (a web page), as
    /// the API would authenticate it: the `Authorization` header's bearer
    /// token or the client certificate in `extensions`.
    ///
    /// # Errors
    ///
    /// The API's 401 when no credential identifies the caller.
    #[allow(clippy::result_large_err)]
    pub fn authenticate(
        &self,
        headers: &axum::http::HeaderMap,
        extensions: &axum::http::Extensions,
    ) -> Result<auth::UserInfo, crate::status::ApiError> {
        request::authenticate(self, headers, extensions)
    }

    /// A place for a request of `user` that does not come through the API
    /// (a dashboard page, a stream of its updates if `long_running`) under
    /// the same per-user in-flight caps as the API's requests: held until
    /// dropped.
    ///
    /// # Errors
    ///
    /// The API's 429 TooManyRequests naming the limit.
    #[allow(clippy::result_large_err)]
    pub fn admit(
        &self,
        user: &auth::UserInfo,
        long_running: bool,
    ) -> Result<RequestSlot, crate::status::ApiError> {
        self.inflight.admit_as(user, long_running)
    }

    /// Whether the API's authorizer allows `user` to do what `attributes`
    /// describe, without logging a refusal (for what a page offers).
    pub fn allows(&self, user: &auth::UserInfo, attributes: &auth::Attributes<'_>) -> bool {
        self.authorizer.authorize(user, attributes).is_ok()
    }

    /// Whether `user` may do what `attributes` describe, decided by the
    /// API's authorizer.
    ///
    /// # Errors
    ///
    /// The 403 the API would answer (the reason is logged).
    #[allow(clippy::result_large_err)]
    pub fn authorize(
        &self,
        user: &auth::UserInfo,
        attributes: &auth::Attributes<'_>,
    ) -> Result<(), crate::status::ApiError> {
        auth::authorize(self.authorizer.as_ref(), user, attributes)
    }

    /// Ends every open watch stream, as an API server restart or a load
    /// balancer dropping connections would; clients must re-watch from their
    /// last resourceVersion.
    pub fn close_watches(&self) {
        self.watch_epoch.send_modify(|epoch| *epoch += 1);
    }

    fn keys(&self, def: &ResourceDef) -> &dyn ListKeys {
        let index = self
            .index
            .get(&(def.group.clone(), def.version.clone(), def.plural.clone()));
        match index.and_then(|&i| self.keys.get(i)) {
            Some(keys) => keys.as_ref(),
            None => &BuiltinListKeys,
        }
    }

    fn resource(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<ResourceDef>> {
        self.index
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .map(|&i| &self.resources[i])
    }

    /// The HTTP routes. Serve them with [`crate::tls::serve`] (TLS, client
    /// certificates) or any axum server.
    pub fn router(self: &Arc<Self>) -> Router {
        let ok = || async { "ok" };
        // Everything but health and version needs an authenticated caller.
        let authenticated = Router::new()
            .route("/api", get(discovery::core_versions))
            .route("/apis", get(discovery::groups))
            .route("/openapi/v3", get(discovery::openapi_index))
            .route("/openapi/v3/{*path}", get(discovery::openapi_doc))
            .route("/api/{*rest}", axum::routing::any(handlers::core))
            .route("/apis/{*rest}", axum::routing::any(handlers::grouped))
            .merge(self.authenticated_routes.clone().with_state(()))
            .fallback(handlers::not_found)
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                request::authenticated,
            ));
        Router::new()
            .route("/healthz", get(ok))
            .route("/livez", get(ok))
            .route("/readyz", get(readyz))
            .route("/version", get(discovery::version))
            .merge(self.public_routes.clone().with_state(()))
            .merge(authenticated)
            .with_state(self.clone())
    }
}

/// `/readyz`: `ok`; with `?verbose`, kube-apiserver's check list, the
/// embedder's details included.
async fn readyz(
    axum::extract::State(server): axum::extract::State<Arc<Server>>,
    uri: axum::http::Uri,
) -> String {
    let verbose = uri.query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    if !verbose {
        return "ok".into();
    }
    let mut text = String::from("[+]ping ok\n");
    if let Some(readiness) = &server.readiness {
        for (name, detail) in readiness() {
            text.push_str(&format!("[+]{name} ok: {detail}\n"));
        }
    }
    text.push_str("readyz check passed\n");
    text
}

/// `metadata` of an object, or an empty map.
pub(crate) fn meta(value: &Value) -> &serde_json::Map<String, Value> {
    static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> = std::sync::OnceLock::new();
    value
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or_else(|| EMPTY.get_or_init(serde_json::Map::new))
}

pub(crate) fn meta_str<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    meta(value).get(field).and_then(Value::as_str)
}

impl Server {
    /// Creates `object` as the server itself (no authentication or
    /// authorization; admission and validation apply), for objects a server
    /// installs at start. The resource comes from `apiVersion` and `kind`,
    /// the namespace from `metadata.namespace` (default `default`).
    pub async fn create_object(
        self: &Arc<Self>,
        object: Value,
    ) -> Result<Value, crate::status::ApiError> {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let def = self
            .resources
            .iter()
            .find(|r| r.api_version() == api_version && r.kind == kind)
            .cloned()
            .ok_or_else(|| {
                crate::status::ApiError::bad_request(format!(
                    "no resource serves {api_version} {kind}"
                ))
            })?;
        let namespace = def.namespaced.then(|| {
            meta_str(&object, "namespace")
                .unwrap_or(crate::namespace::DEFAULT)
                .to_string()
        });
        let ctx = self.system_ctx(def, namespace.as_deref(), None);
        handlers::create_object(&ctx, object, None)
            .await
            .map(|(value, _)| value)
    }
}
