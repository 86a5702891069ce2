//! Resource requests: get, list, create, update, patch, delete,
//! deletecollection, the `status` subresource and pod logs.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::request::{self, Format, Path, Query, Shared, Target};
use super::{discovery, meta, meta_str, namespaces, watch};
use crate::admission::{Operation, Outcome};
use crate::auth::UserInfo;
use crate::field::FieldError;
use crate::namespace::{self as ns, is_namespaces};
use crate::resource::ResourceDef;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::{self, ApiError};
use crate::store::etcd::CONTINUE_EXPIRED;
use crate::store::{Key, Object, Op, Rv, StoreError};
use crate::{admission, names, patch, review, schema, table};

/// Request bodies larger than this are refused with 413, as kube-apiserver
/// refuses them.
const MAX_BODY: usize = crate::limits::MAX_REQUEST_BYTES;

pub(crate) async fn core(State(server): State<Shared>, req: Request) -> Response {
    dispatch(server, true, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn grouped(State(server): State<Shared>, req: Request) -> Response {
    dispatch(server, false, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn not_found() -> Response {
    not_served().into_response()
}

fn not_served() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// Everything a handler needs about one request.
pub(crate) struct Ctx {
    pub server: Shared,
    pub def: Arc<ResourceDef>,
    pub target: Target,
    pub query: Query,
    pub headers: HeaderMap,
    pub user: UserInfo,
    pub format: Format,
}

impl Ctx {
    fn key(&self, name: &str) -> Key {
        Key::new(
            &self.def.store_key(),
            self.target.namespace.as_deref(),
            name,
        )
    }
    fn name(&self) -> &str {
        self.target.name.as_deref().unwrap_or_default()
    }
    fn sub(&self) -> Option<&str> {
        self.target.subresource.as_deref()
    }
    /// Field ownership scope of this endpoint: the main resource does not
    /// own status, `/status` owns nothing else.
    fn scope(&self) -> patch::ManagerScope<'static> {
        if self.sub() == Some("status") {
            patch::ManagerScope {
                subresource: "status",
                reset_fields: &["spec", "metadata"],
            }
        } else if self.def.status_subresource {
            patch::ManagerScope {
                subresource: "",
                reset_fields: &["status"],
            }
        } else {
            patch::ManagerScope::default()
        }
    }
    fn keys(&self) -> &dyn patch::ListKeys {
        self.server.keys(&self.def)
    }
    fn store_error(&self, e: crate::store::StoreError) -> ApiError {
        ApiError::from_store(e, &self.def.group, &self.def.plural)
    }
    fn dry_run(&self) -> bool {
        self.query.get("dryRun") == Some("All")
    }
    /// The field manager of a write: `?fieldManager=`, else the user agent's
    /// program name, as kube-apiserver derives it.
    fn manager(&self) -> String {
        if let Some(m) = self.query.get("fieldManager") {
            return m.to_string();
        }
        self.headers
            .get(axum::http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_string()
    }
    /// A stored object as it reads at the version of the request.
    fn present<'a>(&self, stored: &'a Value) -> Result<std::borrow::Cow<'a, Value>, ApiError> {
        self.server.present(&self.def, stored)
    }
    /// An object of the request's version at the storage version.
    fn to_storage(&self, value: Value) -> Result<Value, ApiError> {
        self.server.to_storage(&self.def, value)
    }
    fn respond(&self, code: StatusCode, value: &Value, warnings: &[String]) -> Response {
        let format = match self.format {
            Format::Yaml => Format::Yaml,
            _ => Format::Json,
        };
        request::respond(code, value, format, warnings)
    }
}

async fn dispatch(server: Shared, core: bool, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let user = parts
        .extensions
        .get::<UserInfo>()
        .cloned()
        .ok_or_else(ApiError::unauthorized)?;
    let rest = parts
        .uri
        .path()
        .strip_prefix(if core { "/api" } else { "/apis" })
        .unwrap_or_default();
    let path = request::parse_path(core, rest).ok_or_else(not_served)?;
    let target = match path {
        Path::GroupVersion { group, version } => {
            return discovery::group_version(&server, &group, version.as_deref());
        }
        Path::Resource(target) => target,
    };
    let def = server
        .resource(&target.group, &target.version, &target.plural)
        .cloned()
        .ok_or_else(not_served)?;
    // Every answer at a deprecated version says so, errors included.
    let deprecation = def.deprecation_warning.clone();
    let response = serve(server, def, target, parts, body, user)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    Ok(match deprecation {
        Some(warning) => request::with_warning(response, &warning),
        None => response,
    })
}

/// A request for `def` at `target`, authenticated as `user`.
async fn serve(
    server: Shared,
    def: Arc<ResourceDef>,
    target: Target,
    parts: axum::http::request::Parts,
    body: axum::body::Body,
    user: UserInfo,
) -> Result<Response, ApiError> {
    // A namespaced object needs a namespace; a cluster-scoped one has none.
    if (def.namespaced && target.namespace.is_none() && target.name.is_some())
        || (!def.namespaced && target.namespace.is_some())
    {
        return Err(not_served());
    }
    let query = Query::parse(parts.uri.query());
    let verb = request::verb(&parts.method, &target, &query);
    request::authorize(
        &server,
        &user,
        verb,
        &def,
        namespaces::authorization_namespace(&def, &target),
        target.name.as_deref().unwrap_or_default(),
        target.subresource.as_deref(),
    )?;
    let format = request::negotiate(&parts.headers)?;
    let body = read_body(body).await?;
    let ctx = Ctx {
        server,
        def,
        target,
        query,
        headers: parts.headers,
        user,
        format,
    };
    let method = parts.method;
    if review::is_review(&ctx.def) {
        return match (&method, ctx.sub(), ctx.target.name.is_some()) {
            (&Method::POST, None, false) => {
                let body = request::parse_body(&ctx.headers, &body)?;
                let answer =
                    review::answer(&ctx.def, &body, &ctx.user, ctx.server.authorizer.as_ref())?;
                Ok(ctx.respond(StatusCode::CREATED, &answer, &[]))
            }
            _ => Err(method_not_allowed(&method)),
        };
    }
    if method == Method::POST
        && ctx.sub() == Some("status")
        && ctx.target.name.is_some()
        && ctx.def.status_subresource
    {
        return match ctx.server.status_posts.clone() {
            Some(posts) if posts.serves(&ctx.def) => post_status(ctx, posts.as_ref(), &body).await,
            _ => Err(method_not_allowed(&method)),
        };
    }
    match (ctx.sub(), ctx.target.name.is_some()) {
        (None, false) => match method {
            Method::GET if ctx.query.flag("watch") => watch::serve(ctx).await,
            Method::GET => list(&ctx).await,
            Method::POST => create(&ctx, &body).await,
            Method::DELETE => delete_collection(&ctx, &body).await,
            _ => Err(method_not_allowed(&method)),
        },
        (None, true) | (Some("status"), true)
            if ctx.sub().is_none() || ctx.def.status_subresource =>
        {
            match method {
                Method::GET => get(&ctx),
                Method::PUT => update(&ctx, &body).await,
                Method::PATCH => patch(&ctx, &body).await,
                Method::DELETE if ctx.sub().is_none() => delete(&ctx, &body).await,
                _ => Err(method_not_allowed(&method)),
            }
        }
        (Some("log"), true) if ctx.def.log_subresource && method == Method::GET => logs(&ctx).await,
        _ => Err(not_served()),
    }
}

/// The whole request body, at most [`MAX_BODY`] bytes: 413 past it, as
/// kube-apiserver answers (`Request entity too large: limit is 3145728`).
async fn read_body(body: axum::body::Body) -> Result<bytes::Bytes, ApiError> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(format!(
            "Request entity too large: limit is {MAX_BODY}"
        ))),
        Err(e) => Err(ApiError::bad_request(format!(
            "the request body could not be read: {e}"
        ))),
    }
}

fn method_not_allowed(method: &Method) -> ApiError {
    ApiError::method_not_allowed(format!(
        "the server does not allow this method on the requested resource: {method}"
    ))
}

fn read_only(ctx: &Ctx) -> Result<(), ApiError> {
    if ctx.def.read_only {
        return Err(ApiError::method_not_allowed(format!(
            "{} are read-only here: the hub writes them from what spokes report",
            ctx.def.plural
        )));
    }
    Ok(())
}

fn get(ctx: &Ctx) -> Result<Response, ApiError> {
    let object = ctx
        .server
        .store
        .get(&ctx.key(ctx.name()))
        .ok_or_else(|| ApiError::not_found(&ctx.def.group, &ctx.def.plural, ctx.name()))?;
    let object = ctx.server.present_object(&ctx.def, object)?;
    let body = match ctx.format {
        Format::Table => table::to_table(
            &ctx.def,
            &[object.value.as_ref()],
            None,
            include_object(ctx)?,
            now(),
        ),
        Format::Metadata => partial_metadata(&object.value),
        _ => object.value.as_ref().clone(),
    };
    Ok(request::respond(StatusCode::OK, &body, ctx.format, &[]))
}

fn include_object(ctx: &Ctx) -> Result<table::IncludeObject, ApiError> {
    table::IncludeObject::parse(ctx.query.get("includeObject"))
}

pub(crate) fn partial_metadata(value: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": Value::Object(meta(value).clone()),
    })
}

pub(crate) fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The selectors of a list or watch.
pub(crate) struct Selectors {
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
    /// Namespaces: only those the caller may get are listed.
    visibility: Option<namespaces::Visibility>,
}

impl Selectors {
    pub fn parse(ctx: &Ctx) -> Result<Selectors, ApiError> {
        let labels = ctx
            .query
            .get("labelSelector")
            .map(LabelSelector::parse)
            .transpose()?;
        let mut supported: Vec<&str> = vec!["metadata.name", "metadata.namespace"];
        supported.extend(ctx.def.selectable_fields.iter().map(String::as_str));
        let fields = ctx
            .query
            .get("fieldSelector")
            .map(|s| FieldSelector::parse(s, &supported))
            .transpose()?;
        let visibility =
            is_namespaces(&ctx.def).then(|| namespaces::Visibility::new(&ctx.server, &ctx.user));
        Ok(Selectors {
            labels,
            fields,
            visibility,
        })
    }

    /// Whether these select everything (no label or field selector, no
    /// namespace visibility).
    pub fn is_empty(&self) -> bool {
        self.labels.is_none() && self.fields.is_none() && self.visibility.is_none()
    }

    pub fn matches(&self, value: &Value) -> bool {
        self.labels
            .as_ref()
            .is_none_or(|s| s.matches(meta(value).get("labels")))
            && self.fields.as_ref().is_none_or(|s| s.matches(value))
            && self.visibility.as_ref().is_none_or(|v| v.allows(value))
    }
}

/// The continue token of a paged list: the resourceVersion of the first
/// page and the last (namespace, name) it returned. Pages follow the
/// store's order, namespace first, then name, compared as tuples: a
/// token compared as one `namespace/name` string would disagree with that
/// order wherever a name is a prefix of another (`a` / `a-b`, `a` / `a0`)
/// and skip or repeat objects.
#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    rv: Rv,
    ns: String,
    name: String,
}

impl Continue {
    fn after(key: &Key, rv: Rv) -> Continue {
        Continue {
            rv,
            ns: key.namespace.clone(),
            name: key.name.clone(),
        }
    }
}

/// A list; its continue pages are read at the first page's resourceVersion
/// (410 Expired once that is compacted), as kube-apiserver reads them.
async fn list(ctx: &Ctx) -> Result<Response, ApiError> {
    let selectors = Selectors::parse(ctx)?;
    let after = match ctx.query.get("continue") {
        Some(token) => Some(decode_continue(token)?),
        None => None,
    };
    let resource = ctx.def.store_key();
    let namespace = ctx.target.namespace.as_deref();
    let (raw, rv) = ctx
        .server
        .store
        .list_raw(
            &resource,
            namespace,
            after.as_ref().map(|a| (a.ns.as_str(), a.name.as_str())),
            after.as_ref().map(|a| a.rv),
        )
        .await
        .map_err(|e| match e {
            StoreError::Gone { .. } => ApiError::expired(CONTINUE_EXPIRED),
            e => ctx.store_error(e),
        })?;
    let limit = match ctx.query.get("limit") {
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("limit: invalid value {l:?}")))?,
        ),
        None => None,
    }
    .filter(|&l| l > 0);
    // Objects are decoded only as far as the page reaches: a paged list of
    // N objects costs O(N) in all, not O(N) per page.
    let mut items: Vec<Object> = Vec::new();
    let mut next = None;
    // As kube-apiserver: remainingItemCount only for a list without
    // selectors (counting the rest would mean decoding it).
    let mut remaining = None;
    for (i, entry) in raw.iter().enumerate() {
        let Some(object) = entry.decode() else {
            continue;
        };
        let object = ctx.server.present_object(&ctx.def, object)?;
        if !selectors.matches(&object.value) {
            continue;
        }
        if let Some(limit) = limit
            && items.len() == limit
        {
            let rv = after.as_ref().map_or(rv, |a| a.rv);
            next = items
                .last()
                .map(|o| encode_continue(&Continue::after(&o.key, rv)));
            remaining = selectors.is_empty().then(|| raw.len() - i);
            break;
        }
        items.push(object);
    }
    let list_rv = after.map_or(rv, |a| a.rv).to_string();
    let values: Vec<&Value> = items.iter().map(|o| o.value.as_ref()).collect();
    let body = match ctx.format {
        Format::Table => {
            let mut t = table::to_table(
                &ctx.def,
                &values,
                Some(&list_rv),
                include_object(ctx)?,
                now(),
            );
            if let Some(next) = &next {
                t["metadata"]["continue"] = next.clone().into();
            }
            t
        }
        format => {
            let (api_version, kind, items): (String, String, Vec<Value>) =
                if format == Format::Metadata {
                    (
                        "meta.k8s.io/v1".into(),
                        "PartialObjectMetadataList".into(),
                        values.iter().map(|v| partial_metadata(v)).collect(),
                    )
                } else {
                    (
                        ctx.def.api_version(),
                        ctx.def.list_kind.clone(),
                        values.iter().map(|v| (*v).clone()).collect(),
                    )
                };
            let mut metadata = Map::new();
            metadata.insert("resourceVersion".into(), list_rv.into());
            if let Some(next) = next {
                metadata.insert("continue".into(), next.into());
                if let Some(remaining) = remaining {
                    metadata.insert("remainingItemCount".into(), remaining.into());
                }
            }
            json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "items": items})
        }
    };
    Ok(request::respond(StatusCode::OK, &body, ctx.format, &[]))
}

fn encode_continue(c: &Continue) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(c).unwrap_or_default())
}

fn decode_continue(token: &str) -> Result<Continue, ApiError> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| ApiError::bad_request("continue key is not valid: illegal base64 data"))
}

/// Checks `apiVersion` and `kind` of a written object against the URL.
fn check_type(ctx: &Ctx, value: &Value) -> Result<(), ApiError> {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is not a JSON object",
        ));
    }
    if kind.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Object 'Kind' is missing in '{}'",
            truncate(value)
        )));
    }
    if api_version != ctx.def.api_version() || kind != ctx.def.kind {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({}) or the kind ({kind}) is not {}",
            ctx.def.api_version(),
            ctx.def.kind
        )));
    }
    Ok(())
}

fn truncate(value: &Value) -> String {
    let mut s = value.to_string();
    if s.len() > 200 {
        let mut end = 200;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

fn metadata_mut(value: &mut Value) -> &mut Map<String, Value> {
    if !value.get("metadata").is_some_and(Value::is_object) {
        value["metadata"] = json!({});
    }
    match value.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just set to an object"),
    }
}

/// A ResourceQuota's `spec.hard` (numbers made quantity strings) against
/// what the server counts: 422 naming each field otherwise.
fn check_quota_spec(ctx: &Ctx, object: &mut Value, name: &str) -> Result<(), ApiError> {
    if !crate::quota::is_resource_quotas(&ctx.def) {
        return Ok(());
    }
    crate::quota::normalize(object);
    let countable: Vec<String> = ctx.server.countable().into_keys().collect();
    invalid_unless_empty(ctx, name, &crate::quota::validate(object, &countable))
}

/// 422 Invalid with `errors`, one cause each, unless there are none.
fn invalid_unless_empty(ctx: &Ctx, name: &str, errors: &[FieldError]) -> Result<(), ApiError> {
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &ctx.def.group,
        &ctx.def.kind,
        name,
        errors,
    ))
}

/// Whether `ctx` is about namespaces with their lifecycle.
fn lifecycle(ctx: &Ctx) -> bool {
    is_namespaces(&ctx.def) && ctx.server.serves_namespaces()
}

/// Labels and annotations as kube-apiserver validates them on every write
/// (see [`names::validate_labels_and_annotations`]).
fn check_meta(ctx: &Ctx, object: &Value) -> Result<(), ApiError> {
    let errors = names::validate_labels_and_annotations(&object["metadata"]);
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    invalid_unless_empty(ctx, name, &errors)
}

/// Names as kube-apiserver validates them: a namespace's a DNS-1123 label,
/// every other object's a DNS-1123 subdomain; the namespace of a namespaced
/// object a DNS-1123 label.
fn check_name(ctx: &Ctx, name: &str) -> Result<(), ApiError> {
    let mut errors = names::validate_name(name, is_namespaces(&ctx.def));
    if let Some(namespace) = ctx.target.namespace.as_deref() {
        errors.extend(names::validate_namespace(namespace));
    }
    invalid_unless_empty(ctx, name, &errors)
}

/// Prunes fields the schema does not know, and reports them as the
/// `fieldValidation` mode asks: Strict fails, Warn (default) warns, Ignore
/// drops silently.
fn validate_fields(
    ctx: &Ctx,
    value: &mut Value,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    let Some(schema) = &ctx.def.schema else {
        return Ok(());
    };
    let unknown = schema::prune(value, schema);
    if unknown.is_empty() {
        return Ok(());
    }
    let messages: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field \"{p}\""))
        .collect();
    match ctx.query.get("fieldValidation").unwrap_or("Warn") {
        "Strict" => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            messages.join(", ")
        ))),
        "Ignore" => Ok(()),
        "Warn" => {
            warnings.extend(messages);
            Ok(())
        }
        other => Err(ApiError::bad_request(format!(
            "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Warn\", \"Strict\""
        ))),
    }
}

fn run_admission(
    ctx: &Ctx,
    operation: Operation,
    old: Option<&Value>,
    object: &mut Value,
) -> Result<Outcome, ApiError> {
    let name = meta_str(object, "name")
        .or(old.and_then(|o| meta_str(o, "name")))
        .unwrap_or_default()
        .to_string();
    let request = admission::Request {
        operation,
        resource: &ctx.def,
        subresource: ctx.sub(),
        namespace: ctx.target.namespace.as_deref(),
        name: &name,
        old,
        user: &ctx.user,
        dry_run: ctx.dry_run(),
    };
    // Admission changes `object` in place: a refusal ends the request, so
    // no caller reads an object that admission left half changed.
    ctx.server.admission.admit(&request, object)
}

/// Random suffix of `generateName`: kube's alphabet without vowels and
/// look-alikes.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

async fn create(ctx: &Ctx, body: &[u8]) -> Result<Response, ApiError> {
    read_only(ctx)?;
    let object = request::parse_body(&ctx.headers, body)?;
    let (stored, warnings) = create_object(ctx, object, None).await?;
    Ok(ctx.respond(StatusCode::CREATED, &stored, &warnings))
}

/// Creates `object` (from a POST, or an apply to a missing object):
/// bookkeeping, field validation, admission, commit.
pub(crate) async fn create_object(
    ctx: &Ctx,
    mut object: Value,
    applied_by: Option<&str>,
) -> Result<(Value, Vec<String>), ApiError> {
    check_type(ctx, &object)?;
    let mut warnings = Vec::new();
    let url_ns = ctx.target.namespace.clone();
    let meta = metadata_mut(&mut object);
    match (meta.get("namespace").and_then(Value::as_str), &url_ns) {
        (Some(body_ns), Some(url)) if !body_ns.is_empty() && body_ns != url => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        (Some(ns), None) if !ns.is_empty() => {
            meta.remove("namespace");
        }
        _ => {}
    }
    if let Some(ns) = &url_ns {
        meta.insert("namespace".into(), ns.clone().into());
    }
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if name.is_empty()
        && let Some(prefix) = meta
            .get("generateName")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
    {
        name = format!("{prefix}{}", random_suffix());
        meta.insert("name".into(), name.clone().into());
    }
    if let Some(url_name) = ctx.target.name.as_deref()
        && name != url_name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({url_name})"
        )));
    }
    if name.is_empty() {
        return Err(ApiError::invalid(
            &ctx.def.group,
            &ctx.def.kind,
            "",
            &[FieldError::required(
                "metadata.name",
                "name or generateName is required",
            )],
        ));
    }
    if let Some(namespace) = &url_ns {
        namespaces::check_create(&ctx.server, &ctx.def, namespace, &name)?;
    }
    meta.insert("uid".into(), uuid::Uuid::new_v4().to_string().into());
    meta.insert("creationTimestamp".into(), now_rfc3339().into());
    meta.insert("generation".into(), 1.into());
    for field in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(field);
    }
    check_name(ctx, &name)?;
    if ctx.def.status_subresource
        && let Some(obj) = object.as_object_mut()
    {
        obj.remove("status");
    }
    if lifecycle(ctx) {
        ns::prepare_create(&mut object, &name);
    }
    validate_fields(ctx, &mut object, &mut warnings)?;
    check_quota_spec(ctx, &mut object, &name)?;
    let manager = ctx.manager();
    match applied_by {
        Some(_) => {}
        None => patch::record_update_in(
            None,
            &mut object,
            &manager,
            &ctx.def.api_version(),
            ctx.keys(),
            &now_rfc3339(),
            &ctx.scope(),
        ),
    }
    let outcome = run_admission(ctx, Operation::Create, None, &mut object)?;
    warnings.extend(outcome.warnings);
    // Quotas are checked on a dry run too; only a real create charges them.
    let charge = || match &url_ns {
        Some(namespace) => ctx.server.quota_charges(&ctx.def, namespace, &name),
        None => Ok(Vec::new()),
    };
    let mut charges = charge()?;
    if ctx.dry_run() {
        return Ok((object, warnings));
    }
    let object = ctx.to_storage(object)?;
    crate::limits::check_object(&object, "the object")?;
    check_meta(ctx, &object)?;
    // The object, what admission keeps beside it and the quotas' charges,
    // in one transaction. A quota another create charged first (on another
    // replica, or the quota controller's count) is read again and charged
    // anew, as kube-apiserver's quota admission retries.
    let mut create = Op::Create {
        key: ctx.key(&name),
        value: object,
    };
    let mut also = outcome.also;
    // Creates charging the same quotas take turns (in this replica), each
    // charging what the one before left.
    let _turn = match &url_ns {
        Some(namespace) if !charges.is_empty() => {
            let turn = ctx.server.quota_turn(namespace).await;
            charges = charge()?;
            Some(turn)
        }
        _ => None,
    };
    let mut attempts = 0;
    let stored = loop {
        attempts += 1;
        let mut ops = Vec::with_capacity(1 + also.len() + charges.len());
        ops.push(create);
        let kept = also.len();
        let charging = !charges.is_empty();
        ops.extend(also);
        ops.extend(charges);
        // Only a create that charges a quota may need its operations back
        // (a store without its own `commit_or_return` copies them first).
        let committed = if charging {
            ctx.server.store.commit_or_return(ops).await
        } else {
            ctx.server
                .store
                .commit(ops)
                .await
                .map_err(|e| (e, Vec::new()))
        };
        match committed {
            Ok(stored) => break stored,
            Err((crate::store::StoreError::Conflict { key, .. }, mut returned))
                if key.resource == crate::quota::RESOURCE_QUOTAS
                    && attempts < QUOTA_ATTEMPTS
                    && returned.len() > kept =>
            {
                returned.truncate(1 + kept);
                also = returned.split_off(1);
                create = returned.remove(0);
                charges = charge()?;
            }
            Err((crate::store::StoreError::Conflict { key, .. }, _))
                if key.resource == crate::quota::RESOURCE_QUOTAS =>
            {
                return Err(ApiError::conflict(
                    &ctx.def.group,
                    &ctx.def.plural,
                    &name,
                    &format!(
                        "the resource quota {:?} of namespace {:?} kept changing under this create ({attempts} attempts); please try again",
                        key.name, key.namespace
                    ),
                ));
            }
            Err((e, _)) => return Err(ctx.store_error(e)),
        }
    };
    let value = match stored.into_iter().next() {
        Some(o) => ctx.present(&o.value)?.into_owned(),
        None => Value::Null,
    };
    Ok((value, warnings))
}

/// How often a create tries its commit when the quotas it charges keep
/// changing under it (creates on other replicas, the controller's counts),
/// before it answers 409 Conflict.
const QUOTA_ATTEMPTS: usize = 8;

/// Commits one write (at the storage version); returns the stored object
/// (for a delete, its last state) at the request's version.
async fn commit_one(ctx: &Ctx, op: Op) -> Result<Value, ApiError> {
    if let Op::Create { value, .. } | Op::Update { value, .. } = &op {
        crate::limits::check_object(value, "the object")?;
        check_meta(ctx, value)?;
    }
    let stored = ctx
        .server
        .store
        .commit(vec![op])
        .await
        .map_err(|e| ctx.store_error(e))?;
    match stored.into_iter().next() {
        Some(o) => Ok(ctx.present(&o.value)?.into_owned()),
        None => Ok(Value::Null),
    }
}

fn current(ctx: &Ctx) -> Result<Object, ApiError> {
    ctx.server
        .store
        .get(&ctx.key(ctx.name()))
        .ok_or_else(|| ApiError::not_found(&ctx.def.group, &ctx.def.plural, ctx.name()))
}

fn parse_rv(s: &str) -> Result<Rv, ApiError> {
    s.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resourceVersion {s:?}: must be an unsigned integer"
        ))
    })
}

async fn update(ctx: &Ctx, body: &[u8]) -> Result<Response, ApiError> {
    read_only(ctx)?;
    let old = ctx.server.present_object(&ctx.def, current(ctx)?)?;
    let new = request::parse_body(&ctx.headers, body)?;
    check_type(ctx, &new)?;
    let name = meta_str(&new, "name").unwrap_or_default();
    if name != ctx.name() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            ctx.name()
        )));
    }
    let Some(rv) = meta_str(&new, "resourceVersion").filter(|s| !s.is_empty()) else {
        return Err(ApiError::invalid(
            &ctx.def.group,
            &ctx.def.kind,
            ctx.name(),
            &[FieldError::invalid(
                "metadata.resourceVersion",
                "0x0",
                "must be specified for an update",
            )],
        ));
    };
    let expected = parse_rv(rv)?;
    let (code, value, warnings) = write_update(ctx, &old, new, Some(expected)).await?;
    Ok(ctx.respond(code, &value, &warnings))
}

/// Tries a patch again on the newest object when another write landed
/// between its read and its commit, as kube-apiserver does, unless the
/// patch itself names a `resourceVersion` (a precondition the client
/// meant to be refused on).
async fn patch(ctx: &Ctx, body: &[u8]) -> Result<Response, ApiError> {
    const ATTEMPTS: usize = 5;
    let preconditioned = body.windows(15).any(|w| w == b"resourceVersion");
    let mut attempt = 1;
    loop {
        match patch_once(ctx, body).await {
            Err(e)
                if e.code == 409 && !preconditioned && attempt < ATTEMPTS && is_write_race(&e) =>
            {
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// A 409 from the store's optimistic concurrency (not an apply's field
/// conflict or an existing name).
fn is_write_race(e: &ApiError) -> bool {
    e.message.contains("the object has been modified")
}

async fn patch_once(ctx: &Ctx, body: &[u8]) -> Result<Response, ApiError> {
    read_only(ctx)?;
    let content_type = request::content_type(&ctx.headers);
    let keys = ctx.keys();
    let old = match ctx.server.store.get(&ctx.key(ctx.name())) {
        Some(old) => ctx.server.present_object(&ctx.def, old)?,
        None if content_type == "application/apply-patch+yaml" && ctx.sub().is_none() => {
            let applied = request::parse_body(&ctx.headers, body)?;
            let manager = required_manager(ctx)?;
            let object = patch::apply_in(
                None,
                &applied,
                &manager,
                force(ctx),
                keys,
                &now_rfc3339(),
                &ctx.scope(),
            )?;
            let (stored, warnings) = create_object(ctx, object, Some(&manager)).await?;
            return Ok(ctx.respond(StatusCode::CREATED, &stored, &warnings));
        }
        None => {
            return Err(ApiError::not_found(
                &ctx.def.group,
                &ctx.def.plural,
                ctx.name(),
            ));
        }
    };
    let mut patched = old.value.as_ref().clone();
    match content_type.as_str() {
        "application/merge-patch+json" => {
            let p = request::parse_body(&ctx.headers, body)?;
            patch::merge_patch(&mut patched, &p);
        }
        "application/json-patch+json" => {
            let p = request::parse_body(&ctx.headers, body)?;
            patch::json_patch(&mut patched, &p)?;
        }
        "application/strategic-merge-patch+json" => {
            let p = request::parse_body(&ctx.headers, body)?;
            patch::strategic_merge_patch(&mut patched, &p, keys)?;
        }
        "application/apply-patch+yaml" => {
            let applied = request::parse_body(&ctx.headers, body)?;
            check_type(ctx, &applied)?;
            let manager = required_manager(ctx)?;
            patched = patch::apply_in(
                Some(&patched),
                &applied,
                &manager,
                force(ctx),
                keys,
                &now_rfc3339(),
                &ctx.scope(),
            )?;
        }
        other => return Err(ApiError::unsupported_media_type(other)),
    }
    crate::limits::check_object(&patched, "the patched object")?;
    check_meta(ctx, &patched)?;
    // A patch that sets metadata.resourceVersion is a precondition.
    let expected = match meta_str(&patched, "resourceVersion") {
        Some(rv) if rv != old.rv.to_string() => Some(parse_rv(rv)?),
        _ => None,
    };
    let (code, value, warnings) = write_update(ctx, &old, patched, expected).await?;
    Ok(ctx.respond(code, &value, &warnings))
}

fn required_manager(ctx: &Ctx) -> Result<String, ApiError> {
    ctx.query
        .get("fieldManager")
        .map(str::to_string)
        .ok_or_else(|| {
            ApiError::bad_request(
                "PATCH, application/apply-patch+yaml: fieldManager is required for apply requests",
            )
        })
}

fn force(ctx: &Ctx) -> bool {
    ctx.query.flag("force")
}

/// The part of an object that bumps `metadata.generation` when it changes:
/// everything but metadata and status.
fn spec_part(value: &Value) -> Map<String, Value> {
    let mut m = value.as_object().cloned().unwrap_or_default();
    m.remove("metadata");
    m.remove("status");
    m
}

/// Finishes an update (PUT or PATCH, main resource or status): carries over
/// what clients cannot change, validates, admits and commits. Returns 200
/// and the stored object.
async fn write_update(
    ctx: &Ctx,
    old: &Object,
    mut new: Value,
    expected: Option<Rv>,
) -> Result<(StatusCode, Value, Vec<String>), ApiError> {
    let mut warnings = Vec::new();
    if !new.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is not a JSON object",
        ));
    }
    if let Some(expected) = expected
        && expected != old.rv
    {
        return Err(ApiError::conflict(
            &ctx.def.group,
            &ctx.def.plural,
            ctx.name(),
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let status_write = ctx.sub() == Some("status");
    if status_write {
        // Only status changes through /status.
        let mut merged = old.value.as_ref().clone();
        merged["status"] = new.get("status").cloned().unwrap_or(Value::Null);
        if merged["status"].is_null()
            && let Some(o) = merged.as_object_mut()
        {
            o.remove("status");
        }
        new = merged;
    } else if ctx.def.status_subresource {
        match old.value.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    if lifecycle(ctx) && !status_write {
        ns::prepare_update(&mut new, &old.value, ctx.name());
    }
    // What the server owns in metadata.
    let old_meta = meta(&old.value).clone();
    let meta = metadata_mut(&mut new);
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old_meta.get(field) {
            Some(v) => meta.insert(field.into(), v.clone()),
            None => meta.remove(field),
        };
    }
    meta.insert("resourceVersion".into(), old.rv.to_string().into());
    validate_fields(ctx, &mut new, &mut warnings)?;
    if !status_write {
        check_quota_spec(ctx, &mut new, ctx.name())?;
    }
    if spec_part(&new) != spec_part(&old.value) {
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        metadata_mut(&mut new).insert("generation".into(), generation.into());
    }
    // Apply recorded its own ownership; other writes own what they changed.
    if !is_apply(ctx) {
        patch::record_update_in(
            Some(&old.value),
            &mut new,
            &ctx.manager(),
            &ctx.def.api_version(),
            ctx.keys(),
            &now_rfc3339(),
            &ctx.scope(),
        );
    }
    if new == *old.value {
        // A no-op write does not change the resourceVersion.
        return Ok((StatusCode::OK, new, warnings));
    }
    let outcome = run_admission(ctx, Operation::Update, Some(&old.value), &mut new)?;
    warnings.extend(outcome.warnings);
    if ctx.dry_run() {
        return Ok((StatusCode::OK, new, warnings));
    }
    // The last finalizer gone from an object being deleted: delete it.
    let finalizers_empty = meta_finalizers(&new).is_empty();
    let deleting = super::meta(&new).contains_key("deletionTimestamp");
    let op = if deleting && finalizers_empty {
        Op::Delete {
            key: ctx.key(ctx.name()),
            expected: Some(old.rv),
        }
    } else {
        Op::Update {
            key: ctx.key(ctx.name()),
            value: ctx.to_storage(new)?,
            expected: Some(old.rv),
        }
    };
    let value = commit_one(ctx, op).await?;
    Ok((StatusCode::OK, value, warnings))
}

/// A POST to `/status` (see [`super::StatusPost`]): the embedder's new
/// status, written as an update of `/status` by
/// [`super::STATUS_POST_MANAGER`], on the latest object (a write that
/// raced it is redone on what that write left).
async fn post_status(
    mut ctx: Ctx,
    posts: &dyn super::StatusPost,
    body: &[u8],
) -> Result<Response, ApiError> {
    read_only(&ctx)?;
    ctx.query = Query::parse(Some(&format!(
        "fieldManager={}",
        super::STATUS_POST_MANAGER
    )));
    let mut last = None;
    for _ in 0..5 {
        let old = ctx.server.present_object(&ctx.def, current(&ctx)?)?;
        let posted = posts.post(&ctx.user, &old.value, body)?;
        let Some(status) = posted.status else {
            return Ok(request::respond(
                StatusCode::OK,
                &posted.answer,
                Format::Json,
                &[],
            ));
        };
        let mut new = old.value.as_ref().clone();
        new["status"] = status;
        crate::limits::check_object(&new, "the posted status")?;
        match write_update(&ctx, &old, new, Some(old.rv)).await {
            Ok((_, _, warnings)) => {
                return Ok(request::respond(
                    StatusCode::OK,
                    &posted.answer,
                    Format::Json,
                    &warnings,
                ));
            }
            Err(e) if e.code == 409 => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| ApiError::internal("the status could not be written")))
}

fn is_apply(ctx: &Ctx) -> bool {
    request::content_type(&ctx.headers) == "application/apply-patch+yaml"
}

fn meta_finalizers(value: &Value) -> Vec<String> {
    meta(value)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `DeleteOptions` of a delete request body, when given.
fn delete_options(ctx: &Ctx, body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    request::parse_body(&ctx.headers, body)
}

async fn delete(ctx: &Ctx, body: &[u8]) -> Result<Response, ApiError> {
    read_only(ctx)?;
    let options = delete_options(ctx, body)?;
    let old = current(ctx)?;
    let (code, value, warnings) = delete_object(ctx, &old, &options).await?;
    Ok(ctx.respond(code, &value, &warnings))
}

/// Deletes one object: with finalizers it is marked (`deletionTimestamp`)
/// and stays until they are removed; without, it goes at once.
pub(crate) async fn delete_object(
    ctx: &Ctx,
    old: &Object,
    options: &Value,
) -> Result<(StatusCode, Value, Vec<String>), ApiError> {
    let name = old.key.name.clone();
    let preconditions = options.get("preconditions");
    if let Some(uid) = preconditions
        .and_then(|p| p.get("uid"))
        .and_then(Value::as_str)
        && Some(uid) != meta_str(&old.value, "uid")
    {
        return Err(ApiError::conflict(
            &ctx.def.group,
            &ctx.def.plural,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(&old.value, "uid").unwrap_or_default()
            ),
        ));
    }
    let expected = match preconditions
        .and_then(|p| p.get("resourceVersion"))
        .and_then(Value::as_str)
    {
        Some(rv) => Some(parse_rv(rv)?),
        None => None,
    };
    if expected.is_some_and(|rv| rv != old.rv) {
        return Err(ApiError::conflict(
            &ctx.def.group,
            &ctx.def.plural,
            &name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {}, ResourceVersion in object meta: {}",
                expected.unwrap_or_default(),
                old.rv
            ),
        ));
    }
    let namespace_object = lifecycle(ctx);
    if namespace_object {
        namespaces::check_delete(&ctx.server, &name)?;
    }
    // Admission sees the object at the request's version. What is written
    // back (marked for deletion) is the stored object, unless admission
    // changed it: a round trip through another version may lose fields.
    let shown = ctx.present(&old.value)?.into_owned();
    let mut admitted = shown.clone();
    let outcome = run_admission(ctx, Operation::Delete, Some(&shown), &mut admitted)?;
    let mut marked = if admitted == shown {
        old.value.as_ref().clone()
    } else {
        ctx.to_storage(admitted)?
    };
    let dry_run = ctx.dry_run()
        || options
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|v| v == "All"));
    let key = Key::new(&ctx.def.store_key(), ctx.target.namespace.as_deref(), &name);
    let gc_finalizer = match propagation_policy(ctx, options)? {
        Some(policy) if ctx.server.garbage_collection => gc_finalizer(policy),
        _ => None,
    };
    let finalizers = meta_finalizers(&old.value);
    // A namespace with spec finalizers stays, Terminating, until the
    // namespace controller has emptied it.
    let held = namespace_object && !ns::spec_finalizers(&old.value).is_empty();
    if finalizers.is_empty() && gc_finalizer.is_none() && !held {
        if !dry_run {
            ctx.server
                .store
                .commit(vec![Op::Delete {
                    key,
                    expected: Some(old.rv),
                }])
                .await
                .map_err(|e| ctx.store_error(e))?;
        }
        let uid = meta_str(&old.value, "uid").unwrap_or_default();
        return Ok((
            StatusCode::OK,
            status::success(&ctx.def.group, &ctx.def.plural, &name, uid),
            outcome.warnings,
        ));
    }
    let deleting = super::meta(&old.value).contains_key("deletionTimestamp");
    let adds_finalizer = gc_finalizer.is_some_and(|f| !finalizers.iter().any(|g| g == f));
    if (deleting && !adds_finalizer) || dry_run {
        return Ok((StatusCode::OK, shown, outcome.warnings));
    }
    if namespace_object {
        ns::mark_terminating(&mut marked, &now_rfc3339());
    }
    let meta = metadata_mut(&mut marked);
    if !deleting {
        meta.insert("deletionTimestamp".into(), now_rfc3339().into());
        meta.insert("deletionGracePeriodSeconds".into(), 0.into());
    }
    if let Some(finalizer) = gc_finalizer.filter(|_| adds_finalizer) {
        let mut all = finalizers;
        all.push(finalizer.to_string());
        meta.insert("finalizers".into(), json!(all));
    }
    let value = commit_one(
        ctx,
        Op::Update {
            key,
            value: marked,
            expected: Some(old.rv),
        },
    )
    .await?;
    Ok((StatusCode::OK, value, outcome.warnings))
}

/// `propagationPolicy` of a delete, from its `DeleteOptions` or the query
/// (the deprecated `orphanDependents: true` means `Orphan`).
fn propagation_policy<'a>(ctx: &'a Ctx, options: &'a Value) -> Result<Option<&'a str>, ApiError> {
    let policy = options
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or_else(|| ctx.query.get("propagationPolicy"))
        .or_else(|| {
            (options.get("orphanDependents") == Some(&Value::Bool(true))).then_some("Orphan")
        });
    match policy {
        None | Some("Foreground" | "Background" | "Orphan") => Ok(policy),
        Some(other) => Err(ApiError::invalid(
            &ctx.def.group,
            &ctx.def.kind,
            ctx.name(),
            &[FieldError::not_supported(
                "propagationPolicy",
                other,
                &["Foreground", "Background", "Orphan"],
            )],
        )),
    }
}

/// The finalizer that holds an object for the garbage collector under a
/// propagation policy, as kube-apiserver names them.
fn gc_finalizer(policy: &str) -> Option<&'static str> {
    match policy {
        "Foreground" => Some("foregroundDeletion"),
        "Orphan" => Some("orphan"),
        _ => None,
    }
}

async fn delete_collection(ctx: &Ctx, body: &[u8]) -> Result<Response, ApiError> {
    read_only(ctx)?;
    let options = delete_options(ctx, body)?;
    let selectors = Selectors::parse(ctx)?;
    let (objects, _) = ctx
        .server
        .store
        .list(&ctx.def.store_key(), ctx.target.namespace.as_deref());
    let mut deleted = Vec::new();
    let mut warnings = Vec::new();
    for object in &objects {
        let shown = ctx.present(&object.value)?;
        if !selectors.matches(&shown) {
            continue;
        }
        match delete_object(ctx, object, &options).await {
            Ok((_, _, w)) => {
                deleted.push(shown.into_owned());
                warnings.extend(w);
            }
            // Deleted meanwhile: nothing left to do.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let body = json!({
        "apiVersion": ctx.def.api_version(),
        "kind": ctx.def.list_kind,
        "metadata": {"resourceVersion": ctx.server.store.revision().to_string()},
        "items": deleted,
    });
    Ok(ctx.respond(StatusCode::OK, &body, &warnings))
}

async fn logs(ctx: &Ctx) -> Result<Response, ApiError> {
    let pod = current(ctx)?;
    let Some(source) = &ctx.server.logs else {
        return Err(ApiError::new(
            400,
            "BadRequest",
            format!("no logs are available for pod {}", ctx.name()),
        ));
    };
    let tail = match ctx.query.get("tailLines") {
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("tailLines: invalid value {t:?}")))?,
        ),
        None => None,
    };
    let stream = source
        .logs(
            &pod.value,
            ctx.query.get("container"),
            ctx.query.flag("follow"),
            tail,
        )
        .await?;
    Ok(request::stream_response("text/plain", stream))
}
