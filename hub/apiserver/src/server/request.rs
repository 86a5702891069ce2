//! One API request: where it goes (URL), who sends it (authentication), what
//! it accepts (content negotiation), and how answers are written.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use serde_json::Value;

use super::Server;
use crate::auth::{Attributes, UserInfo};
use crate::limits;
use crate::resource::ResourceDef;
use crate::status::ApiError;

/// Where a resource request points, parsed from the URL path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// What a path under `/api` or `/apis` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Path {
    /// `/api/v1`, `/apis/g`, `/apis/g/v`: discovery.
    GroupVersion {
        group: String,
        version: Option<String>,
    },
    Resource(Target),
}

/// Parses the part after `/api/` (core) or `/apis/` (named groups). Each
/// segment is percent-decoded, as kube-apiserver reads it: a namespace or
/// name sent as `a%7Cb` is `a|b`, and validated (and refused) as such.
pub(crate) fn parse_path(core: bool, rest: &str) -> Option<Path> {
    let decoded: Vec<String> = rest
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode_segment)
        .collect();
    let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
    let (group, rest) = if core {
        ("", &segments[..])
    } else {
        let (first, rest) = segments.split_first()?;
        (*first, rest)
    };
    let Some((version, rest)) = rest.split_first() else {
        return (!core).then(|| Path::GroupVersion {
            group: group.to_string(),
            version: None,
        });
    };
    let target = |namespace: Option<&str>, rest: &[&str]| -> Option<Path> {
        let (plural, rest) = rest.split_first()?;
        let (name, subresource) = match rest {
            [] => (None, None),
            [name] => (Some(*name), None),
            [name, sub] => (Some(*name), Some(*sub)),
            _ => return None,
        };
        Some(Path::Resource(Target {
            group: group.to_string(),
            version: version.to_string(),
            namespace: namespace.map(str::to_string),
            plural: plural.to_string(),
            name: name.map(str::to_string),
            subresource: subresource.map(str::to_string),
        }))
    };
    match rest {
        [] => Some(Path::GroupVersion {
            group: group.to_string(),
            version: Some(version.to_string()),
        }),
        // A namespace's own subresource, not a resource in the namespace.
        ["namespaces", _, "status"] if core => target(None, rest),
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => target(Some(ns), tail),
        tail => target(None, tail),
    }
}

/// Query parameters, decoded.
#[derive(Debug, Default)]
pub(crate) struct Query(HashMap<String, String>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let mut map = HashMap::new();
        for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            map.insert(decode(k), decode(v));
        }
        Query(map)
    }
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.0.get(key).map(String::as_str), Some("true" | "1" | ""))
            && self.0.contains_key(key)
    }
}

/// Percent-decoding of a path segment (`+` stays `+`).
fn decode_segment(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    percent_decode(s, false)
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(s: &str) -> String {
    percent_decode(s, true)
}

fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How the client wants objects returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Json,
    /// `application/json;as=Table;v=v1;g=meta.k8s.io`
    Table,
    /// `application/json;as=PartialObjectMetadata[List];v=v1;g=meta.k8s.io`
    Metadata,
    Yaml,
}

/// Picks the first acceptable representation of `Accept` that we serve.
pub(crate) fn negotiate(headers: &HeaderMap) -> Result<Format, ApiError> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(Format::Json);
    };
    for item in accept.split(',') {
        let mut parts = item.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        let params: HashMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
        let json = matches!(media, "application/json" | "*/*" | "application/*");
        if media == "application/yaml" && params.is_empty() {
            return Ok(Format::Yaml);
        }
        if !json {
            continue;
        }
        match params.get("as").copied() {
            None => return Ok(Format::Json),
            Some("Table") if params.get("g") == Some(&"meta.k8s.io") => return Ok(Format::Table),
            Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                if params.get("g") == Some(&"meta.k8s.io") =>
            {
                return Ok(Format::Metadata);
            }
            Some(_) => continue,
        }
    }
    Err(ApiError::not_acceptable(format!(
        "only the following media types are accepted: application/json, application/yaml, application/json;as=Table;v=v1;g=meta.k8s.io; got {accept:?}"
    )))
}

/// Middleware: authenticates the caller (401 otherwise), takes a slot of
/// its in-flight limits (429 otherwise) and leaves the [`UserInfo`] in the
/// request's extensions. A long-running request (watch, followed log) holds
/// its slot until its response body is done.
pub(crate) async fn authenticated(
    axum::extract::State(server): axum::extract::State<Shared>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let user = match authenticate(&server, req.headers(), req.extensions()) {
        Ok(user) => user,
        Err(e) => return e.into_response(),
    };
    let (slot, long_running) = match server.inflight.admit(&user, req.uri()) {
        Ok(admitted) => admitted,
        Err(e) => return e.into_response(),
    };
    req.extensions_mut().insert(user);
    let response = next.run(req).await;
    if long_running {
        response.map(|body| {
            Body::new(crate::tls::Guarded {
                inner: body,
                _guard: slot,
            })
        })
    } else {
        drop(slot);
        response
    }
}

/// The caller, as the authenticator established.
pub(super) fn authenticate(
    server: &Server,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
) -> Result<UserInfo, ApiError> {
    let Some(authenticator) = &server.authenticator else {
        return Ok(UserInfo {
            name: "system:anonymous-admin".into(),
            uid: String::new(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        });
    };
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let cert = extensions
        .get::<crate::tls::PeerCertificate>()
        .and_then(|c| c.der());
    authenticator.authenticate(authorization, cert)
}

pub(crate) fn authorize(
    server: &Server,
    user: &UserInfo,
    verb: &str,
    def: &ResourceDef,
    namespace: Option<&str>,
    name: &str,
    subresource: Option<&str>,
) -> Result<(), ApiError> {
    let attributes = Attributes {
        verb,
        group: &def.group,
        resource: &def.plural,
        subresource,
        namespace,
        name,
    };
    crate::auth::authorize(server.authorizer.as_ref(), user, &attributes)
}

/// The RBAC verb of a request.
pub(crate) fn verb(method: &Method, target: &Target, query: &Query) -> &'static str {
    match (method.as_str(), target.name.is_some()) {
        ("GET", _) if query.flag("watch") => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// Reads a request body as JSON (or YAML for the YAML media types), within
/// the request limits: at most [`limits::MAX_REQUEST_DEPTH`] deep (422
/// otherwise) and decoding to at most [`limits::MAX_REQUEST_BYTES`] (413).
pub(crate) fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let content_type = content_type(headers);
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    const WHAT: &str = "the request body";
    if content_type == crate::protobuf::MEDIA_TYPE {
        return crate::protobuf::decode(body);
    }
    if content_type.ends_with("yaml") {
        let text = std::str::from_utf8(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not UTF-8: {e}")))?;
        return limits::decode_yaml(text, limits::MAX_REQUEST_DEPTH, limits::MAX_REQUEST_BYTES)
            .map_err(|e| {
                e.into_api(WHAT, |m| {
                    ApiError::bad_request(format!("error decoding YAML: {m}"))
                })
            });
    }
    limits::decode_json(body, limits::MAX_REQUEST_DEPTH, limits::MAX_REQUEST_BYTES).map_err(|e| {
        e.into_api(WHAT, |m| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized or malformed: {m}"
            ))
        })
    })
}

/// The media type of the body, without parameters.
pub(crate) fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// A JSON (or YAML) answer with `Warning` headers.
pub(crate) fn respond(
    status: StatusCode,
    body: &Value,
    format: Format,
    warnings: &[String],
) -> Response {
    let (bytes, media) = match format {
        Format::Yaml => (
            serde_saphyr::to_string(body)
                .unwrap_or_default()
                .into_bytes(),
            "application/yaml",
        ),
        _ => (
            serde_json::to_vec(body).unwrap_or_default(),
            "application/json",
        ),
    };
    let mut response = (status, bytes).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    for warning in warnings {
        if let Ok(v) = HeaderValue::from_str(&warning_header(warning)) {
            response.headers_mut().append("warning", v);
        }
    }
    response
}

/// `response` with one more `Warning` header.
pub(crate) fn with_warning(mut response: Response, warning: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(&warning_header(warning)) {
        response.headers_mut().append("warning", v);
    }
    response
}

/// `299 - "text"`, with the text escaped as RFC 7234 wants it.
fn warning_header(text: &str) -> String {
    let escaped: String = text
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| match c {
            '"' => "\\\"".to_string(),
            '\\' => "\\\\".to_string(),
            c if c.is_ascii() => c.to_string(),
            _ => "?".to_string(),
        })
        .collect();
    format!("299 - \"{escaped}\"")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = respond(status, &self.to_status(), Format::Json, &[]);
        if let Some(seconds) = self.retry_after_seconds
            && let Ok(v) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if self.code == 401 {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"trainhub\""),
            );
        }
        response
    }
}

/// A byte stream (pod logs).
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send>>;

/// Where pod logs come from: the spokes, through the hub.
/// What [`LogSource::logs`] returns: the log's byte stream, once open.
pub type LogsFuture =
    Pin<Box<dyn std::future::Future<Output = Result<ByteStream, ApiError>> + Send>>;

pub trait LogSource: Send + Sync + 'static {
    /// The log of `container` (or the pod's only/first container) of a pod
    /// the store holds. `follow` keeps the stream open while the pod runs.
    fn logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> LogsFuture;
}

/// A streamed response body.
pub(crate) fn stream_response(content_type: &'static str, stream: ByteStream) -> Response {
    let mut response = Response::new(Body::from_stream(stream));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

pub(crate) type Shared = Arc<Server>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let p = parse_path(
            false,
            "trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/j/status",
        );
        assert_eq!(
            p,
            Some(Path::Resource(Target {
                group: "trainer.kubeflow.org".into(),
                version: "v1alpha1".into(),
                namespace: Some("ns".into()),
                plural: "trainjobs".into(),
                name: Some("j".into()),
                subresource: Some("status".into()),
            }))
        );
        let p = parse_path(true, "v1/pods");
        assert!(
            matches!(p, Some(Path::Resource(Target { ref plural, namespace: None, .. })) if plural == "pods")
        );
        assert_eq!(
            parse_path(false, "trainer.kubeflow.org"),
            Some(Path::GroupVersion {
                group: "trainer.kubeflow.org".into(),
                version: None
            })
        );
        assert_eq!(parse_path(true, "v1/a/b/c/d"), None);
        let p = parse_path(true, "v1/namespaces/a%7Cb/pods/x%2By+z");
        assert!(
            matches!(p, Some(Path::Resource(Target { ref namespace, ref name, .. }))
                if namespace.as_deref() == Some("a|b") && name.as_deref() == Some("x+y+z")),
            "{p:?}"
        );
        let p = parse_path(true, "v1/namespaces/team-a/status");
        assert!(
            matches!(p, Some(Path::Resource(Target { ref plural, namespace: None, ref name, ref subresource, .. }))
                if plural == "namespaces" && name.as_deref() == Some("team-a") && subresource.as_deref() == Some("status")),
            "{p:?}"
        );
        let p = parse_path(true, "v1/namespaces/team-a/pods/p");
        assert!(
            matches!(p, Some(Path::Resource(Target { ref plural, ref namespace, .. }))
                if plural == "pods" && namespace.as_deref() == Some("team-a")),
            "{p:?}"
        );
    }

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some(
            "labelSelector=app%3Dx%2Cenv+in+(a)&watch=1&allowWatchBookmarks=true",
        ));
        assert_eq!(q.get("labelSelector"), Some("app=x,env in (a)"));
        assert!(q.flag("watch"));
        assert!(!q.flag("missing"));
    }

    #[test]
    fn accepts_tables_from_kubectl() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"),
        );
        assert_eq!(negotiate(&h).ok(), Some(Format::Table));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf, */*"),
        );
        assert_eq!(negotiate(&h).ok(), Some(Format::Json));
        h.insert(header::ACCEPT, HeaderValue::from_static("text/html"));
        assert_eq!(negotiate(&h).map_err(|e| e.code), Err(406));
    }
}
