//! The web dashboard, served by the hub on the API's port under
//! `/dashboard/`: server-rendered pages (maud), a few dozen lines of our
//! own JavaScript applying server-sent events (the live TrainJobs table,
//! followed logs), and forms for the actions.
//!
//! # Security
//!
//! - Who: the API's own authenticator. The login form takes a bearer
//!   token, checks it and keeps it in an `HttpOnly; Secure;
//!   SameSite=Strict` cookie scoped to `/dashboard`; an `Authorization`
//!   header or a client certificate works as with the API.
//! - What: every read is authorized by the API's authorizer for the same
//!   verb, resource and namespace as the API request it stands for; every
//!   action *is* an API request (made in-process through the API's router
//!   with the caller's credential), so admission, validation and refusals
//!   are the API's.
//! - Actions are POSTs carrying a CSRF token (an HMAC of the credential
//!   with the hub's shared key) and, from browsers, a same-origin `Origin`.
//! - Every answer has a strict Content-Security-Policy (no inline script
//!   or style), `nosniff` and `no-referrer`.
//! - Inputs are bounded: query strings, form bodies, filter values, page
//!   sizes; event streams read from bounded sources and end when their
//!   client falls behind.

// A handler's refusal is the page it answers: helpers return it as their
// error, once per request, as axum handlers return responses.
#![allow(clippy::result_large_err)]

mod actions;
mod detail;
mod overview;
mod plugins;
mod trainjobs;
pub(crate) mod view;

use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode, request::Parts};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{Markup, html};
use tower::ServiceExt as _;
use trainhub_apiserver::auth::{Attributes, UserInfo};
use trainhub_apiserver::server::{RequestSlot, Server};
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::Store;
use trainhub_apiserver::tls::PeerCertificate;

use crate::trainer_status::SigningKey;

/// Where the dashboard is served.
pub const PREFIX: &str = "/dashboard";
/// The cookie holding the session's bearer token (hex-encoded).
pub const COOKIE: &str = "trainhub_dashboard";
/// The Content-Security-Policy of every dashboard answer.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Longest query string a page takes.
pub const MAX_QUERY_BYTES: usize = 2048;
/// Largest form body an action or the login takes.
pub const MAX_FORM_BYTES: usize = 8 * 1024;
/// Longest bearer token the login form takes.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// The purpose of the CSRF tokens' MAC (see [`SigningKey::mac`]).
const CSRF_PURPOSE: &str = "trainhub-dashboard-csrf";

/// The `trainhub serve` and `trainhub dev` flags of the dashboard.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DashboardArgs {
    /// Links each TrainJob's trace id (annotation
    /// `trainhub.kubeflow.org/trace-id`) to the user's trace viewer: an
    /// http(s) URL with `{traceId}` where the id goes, e.g.
    /// `https://jaeger.example/trace/{traceId}`.
    #[arg(long, value_parser = parse_trace_url)]
    pub dashboard_trace_url: Option<String>,
}

/// Checks a `--dashboard-trace-url` template.
///
/// # Errors
///
/// Not `http://` or `https://`, no `{traceId}`, longer than 1024 bytes, or
/// characters that do not belong in a URL.
pub fn parse_trace_url(template: &str) -> Result<String, String> {
    if template.len() > 1024 {
        return Err("--dashboard-trace-url: at most 1024 bytes".into());
    }
    if !(template.starts_with("https://") || template.starts_with("http://")) {
        return Err(format!(
            "--dashboard-trace-url {template:?}: must start with https:// or http://"
        ));
    }
    if !template.contains("{traceId}") {
        return Err(format!(
            "--dashboard-trace-url {template:?}: must contain {{traceId}}, where the trace id goes"
        ));
    }
    if template
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '<' | '>' | '\\'))
    {
        return Err(format!(
            "--dashboard-trace-url {template:?}: no spaces, quotes, angle brackets or backslashes"
        ));
    }
    Ok(template.to_string())
}

/// The dashboard's shared state: the API server (set once it is built),
/// the store it reads, the key its CSRF tokens are made with.
#[derive(Clone)]
pub struct Dashboard(Arc<Inner>);

struct Inner {
    /// The API server and its router, from [`Dashboard::attach`] to
    /// [`Dashboard::detach`]. The server's routes hold the dashboard, so
    /// these links make a cycle that `detach` breaks.
    attached: RwLock<Option<(Arc<Server>, Router)>>,
    store: Arc<dyn Store>,
    key: Arc<SigningKey>,
    trace_url: Option<String>,
    summaries: trainjobs::Summaries,
}

impl Dashboard {
    pub fn new(store: Arc<dyn Store>, key: Arc<SigningKey>, args: &DashboardArgs) -> Dashboard {
        Dashboard(Arc::new(Inner {
            attached: RwLock::new(None),
            store,
            key,
            trace_url: args.dashboard_trace_url.clone(),
            summaries: trainjobs::Summaries::default(),
        }))
    }

    /// Gives the dashboard the API server it authenticates, authorizes and
    /// acts through. Until then every page answers 503.
    pub fn attach(&self, server: &Arc<Server>) {
        *self.0.attached.write().unwrap_or_else(|p| p.into_inner()) =
            Some((server.clone(), server.router()));
    }

    /// Decodes the TrainJobs' table summaries now rather than when the
    /// first page is opened (10,000 TrainJobs: about 140 ms). The hub runs
    /// it while serving.
    pub async fn warm(&self) {
        self.summaries()
            .list(self.store().as_ref(), &trainjobs::Scope::All)
            .await;
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.0.store
    }

    pub(crate) fn summaries(&self) -> &trainjobs::Summaries {
        &self.0.summaries
    }

    pub(crate) fn trace_url(&self) -> Option<&str> {
        self.0.trace_url.as_deref()
    }

    /// Lets go of the API server (the hub is stopping or dropped): every
    /// page answers 503 from now on, and the server can be freed.
    pub fn detach(&self) {
        self.0
            .attached
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    fn attached(&self) -> Option<(Arc<Server>, Router)> {
        self.0
            .attached
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn server(&self) -> Result<Arc<Server>, Response> {
        self.attached().map(|(server, _)| server).ok_or_else(|| {
            error_page(
                None,
                StatusCode::SERVICE_UNAVAILABLE,
                "The hub is starting; try again in a moment.",
            )
        })
    }

    /// The routes, all under [`PREFIX`], served without the API's
    /// authentication layer: each handler authenticates itself (cookie,
    /// header or certificate) and answers the login page or 401.
    pub fn routes(&self) -> Router {
        let r = Router::new()
            .route(PREFIX, get(|| async { Redirect::to("/dashboard/") }))
            .route("/dashboard/", get(overview::page))
            .route("/dashboard/login", get(login_form).post(login))
            .route("/dashboard/logout", post(logout))
            .route("/dashboard/assets/dashboard.css", get(css))
            .route("/dashboard/assets/dashboard.js", get(js))
            .route("/dashboard/trainjobs", get(trainjobs::page))
            .route("/dashboard/trainjobs/live", get(trainjobs::live))
            .route("/dashboard/trainjobs/{namespace}/{name}", get(detail::page))
            .route(
                "/dashboard/trainjobs/{namespace}/{name}/logs/{pod}",
                get(detail::logs),
            )
            .route(
                "/dashboard/trainjobs/{namespace}/{name}/delete",
                get(actions::confirm_delete).post(actions::delete),
            )
            .route(
                "/dashboard/trainjobs/{namespace}/{name}/{action}",
                post(actions::set_suspend),
            )
            .route(
                "/dashboard/spokes/{name}/{action}",
                post(actions::set_cordon),
            )
            .route("/dashboard/plugins", get(plugins::page))
            .route("/dashboard/{*rest}", get(not_found).post(not_found))
            .layer(axum::middleware::from_fn(security_headers))
            .with_state(self.clone());
        Router::new().merge(r)
    }

    /// The caller of `parts`: the `Authorization` header, else the
    /// session cookie, else the client certificate.
    ///
    /// # Errors
    ///
    /// GET pages: a redirect to the login form; others: 401.
    pub(crate) fn session(&self, parts: &Parts) -> Result<Session, Response> {
        let server = self.server()?;
        let mut headers = HeaderMap::new();
        let mut credential: Option<Vec<u8>> = None;
        if let Some(value) = parts.headers.get(header::AUTHORIZATION) {
            headers.insert(header::AUTHORIZATION, value.clone());
            credential = Some(value.as_bytes().to_vec());
        } else if let Some(token) = cookie_token(&parts.headers) {
            let value = HeaderValue::from_str(&format!("Bearer {token}")).ok();
            if let Some(value) = value {
                credential = Some(value.as_bytes().to_vec());
                headers.insert(header::AUTHORIZATION, value);
            }
        }
        let cert = parts.extensions.get::<PeerCertificate>().cloned();
        if credential.is_none() {
            credential = cert.as_ref().and_then(|c| c.der()).map(<[u8]>::to_vec);
        }
        let mut extensions = axum::http::Extensions::new();
        if let Some(cert) = &cert {
            extensions.insert(cert.clone());
        }
        let unauthenticated = || {
            if parts.method == Method::GET && !parts.uri.path().ends_with("/live") {
                Redirect::to("/dashboard/login").into_response()
            } else {
                error_page(
                    None,
                    StatusCode::UNAUTHORIZED,
                    "Not logged in: log in again with a bearer token.",
                )
            }
        };
        let Some(credential) = credential else {
            return Err(unauthenticated());
        };
        let user = server
            .authenticate(&headers, &extensions)
            .map_err(|_| unauthenticated())?;
        // A page load counts against the caller's in-flight caps as an API
        // request does; the live table's stream as a watch does.
        let slot = server
            .admit(&user, is_stream(parts))
            .map_err(|e| too_many(&e))?;
        let csrf = self
            .0
            .key
            .mac(CSRF_PURPOSE, &credential)
            .map(hex::encode)
            .unwrap_or_default();
        Ok(Session {
            user,
            authorization: headers.get(header::AUTHORIZATION).cloned(),
            cert,
            csrf,
            slot: Some(slot),
        })
    }

    /// The session of a page request, and the request's parts.
    pub(crate) fn page_session(&self, request: Request) -> Result<(Session, Parts), Response> {
        let (parts, _) = request.into_parts();
        let session = self.session(&parts)?;
        Ok((session, parts))
    }

    /// The session of an action: as [`Dashboard::session`], and the form's
    /// CSRF token and the request's origin checked.
    pub(crate) fn action_session(
        &self,
        parts: &Parts,
        form: &[(String, String)],
    ) -> Result<Session, Response> {
        same_origin(&parts.headers).map_err(|why| error_page(None, StatusCode::FORBIDDEN, why))?;
        let session = self.session(parts)?;
        let sent = form
            .iter()
            .find(|(k, _)| k == "csrf")
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        if session.csrf.is_empty() || !constant_time_eq(sent.as_bytes(), session.csrf.as_bytes()) {
            return Err(error_page(
                Some(&session),
                StatusCode::FORBIDDEN,
                "The form's CSRF token is missing or wrong: reload the page and try again.",
            ));
        }
        Ok(session)
    }

    /// Whether `session` may do `attributes`, as the API decides, without
    /// logging a refusal (for what a page offers).
    pub(crate) fn allowed(&self, session: &Session, attributes: &Attributes<'_>) -> bool {
        self.attached()
            .is_some_and(|(s, _)| s.allows(&session.user, attributes))
    }

    /// As the API authorizes `attributes` for `session`: the API's 403 as
    /// a page otherwise.
    pub(crate) fn authorize(
        &self,
        session: &Session,
        attributes: &Attributes<'_>,
    ) -> Result<(), Response> {
        let server = self.server()?;
        server
            .authorize(&session.user, attributes)
            .map_err(|e| api_error_page(session, &e))
    }

    /// An API request made in-process as `session`'s caller, through the
    /// API's own router (authentication, limits, authorization,
    /// admission): the API's answer. The page's place under the caller's
    /// in-flight caps goes to the API request, which takes its own.
    pub(crate) async fn api(
        &self,
        session: &mut Session,
        method: Method,
        path: &str,
        content_type: Option<&'static str>,
        body: Vec<u8>,
    ) -> Response {
        let Some((_, api)) = self.attached() else {
            return error_page(
                Some(session),
                StatusCode::SERVICE_UNAVAILABLE,
                "The hub is starting.",
            );
        };
        drop(session.take_slot());
        let mut request = Request::new(Body::from(body));
        *request.method_mut() = method;
        match path.parse() {
            Ok(uri) => *request.uri_mut() = uri,
            Err(_) => {
                return error_page(Some(session), StatusCode::BAD_REQUEST, "Not a valid path.");
            }
        }
        if let Some(value) = &session.authorization {
            request
                .headers_mut()
                .insert(header::AUTHORIZATION, value.clone());
        }
        if let Some(ct) = content_type {
            request
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        if let Some(cert) = &session.cert {
            request.extensions_mut().insert(cert.clone());
        }
        match api.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// What the API authorizes for a request: `verb` on `resource` of `group`
/// (in `namespace`; `name` for one object), no subresource.
pub(crate) fn attributes<'a>(
    verb: &'a str,
    group: &'a str,
    resource: &'a str,
    namespace: Option<&'a str>,
    name: &'a str,
) -> Attributes<'a> {
    Attributes {
        verb,
        group,
        resource,
        subresource: None,
        namespace,
        name,
    }
}

/// The authenticated caller of a dashboard request.
pub(crate) struct Session {
    pub user: UserInfo,
    /// What in-process API requests carry (the header or the cookie's token).
    authorization: Option<HeaderValue>,
    cert: Option<PeerCertificate>,
    /// The token the session's forms carry.
    pub csrf: String,
    /// The request's place under the caller's in-flight caps.
    slot: Option<RequestSlot>,
}

impl Session {
    /// The request's place under the in-flight caps, for a stream to hold
    /// for as long as it runs.
    pub(crate) fn take_slot(&mut self) -> Option<RequestSlot> {
        self.slot.take()
    }
}

/// Whether the request opens a stream that lasts as long as the client
/// wants: the table's live updates. (A followed log is the API's own
/// stream, held under the caps by the API request behind it.)
fn is_stream(parts: &Parts) -> bool {
    parts.uri.path().ends_with("/live")
}

/// The API's 429 as a page, with its `Retry-After`.
fn too_many(e: &ApiError) -> Response {
    let mut response = error_page(None, StatusCode::TOO_MANY_REQUESTS, &e.message);
    if let Some(seconds) = e.retry_after_seconds
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// The bearer token in the dashboard's cookie.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    for value in headers.get_all(header::COOKIE) {
        let Ok(text) = value.to_str() else { continue };
        for pair in text.split(';') {
            let Some((name, value)) = pair.trim().split_once('=') else {
                continue;
            };
            if name == COOKIE && value.len() <= 2 * MAX_TOKEN_BYTES {
                let bytes = hex::decode(value).ok()?;
                return String::from_utf8(bytes).ok();
            }
        }
    }
    None
}

/// A browser's POST must come from this origin: `Sec-Fetch-Site:
/// same-origin` where the browser sends it, and an `Origin` naming this
/// host where it is not `null` (with `Referrer-Policy: no-referrer`,
/// browsers send `Origin: null` on form posts). Clients that send neither
/// are no browsers; they still need the CSRF token.
fn same_origin(headers: &HeaderMap) -> Result<(), &'static str> {
    const REFUSED: &str = "Refused: the request comes from another origin.";
    let site = headers.get("sec-fetch-site").map(|v| v.to_str());
    match site {
        Some(Ok("same-origin")) | None => {}
        Some(_) => return Err(REFUSED),
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    match headers.get(header::ORIGIN).map(|o| o.to_str()) {
        None => Ok(()),
        Some(Ok("null")) if site.is_some() => Ok(()),
        Some(Ok(origin)) => match (origin.strip_prefix("https://"), host) {
            (Some(o), Some(h)) if o.eq_ignore_ascii_case(h) => Ok(()),
            // HTTP/2 requests carry the host in the URI, not a Host header.
            (Some(_), None) if site.is_some() => Ok(()),
            _ => Err(REFUSED),
        },
        Some(Err(_)) => Err(REFUSED),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The query string's pairs, bounded.
///
/// # Errors
///
/// A 400 page when the query string is longer than [`MAX_QUERY_BYTES`].
pub(crate) fn query_pairs(
    parts: &Parts,
    session: Option<&Session>,
) -> Result<Vec<(String, String)>, Response> {
    let raw = parts.uri.query().unwrap_or_default();
    if raw.len() > MAX_QUERY_BYTES {
        return Err(error_page(
            session,
            StatusCode::BAD_REQUEST,
            &format!("The query string is longer than {MAX_QUERY_BYTES} bytes."),
        ));
    }
    Ok(form_urlencoded::parse(raw.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect())
}

/// A form body's pairs, bounded by [`MAX_FORM_BYTES`].
pub(crate) async fn form_pairs(body: Body) -> Result<Vec<(String, String)>, Response> {
    let bytes = axum::body::to_bytes(body, MAX_FORM_BYTES)
        .await
        .map_err(|_| {
            error_page(
                None,
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("The form is larger than {MAX_FORM_BYTES} bytes."),
            )
        })?;
    Ok(form_urlencoded::parse(&bytes)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect())
}

/// Adds the security headers to every answer.
async fn security_headers(request: Request, next: axum::middleware::Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let set = |h: &mut HeaderMap, name: HeaderName, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(headers, header::CONTENT_SECURITY_POLICY, CSP);
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::REFERRER_POLICY, "no-referrer");
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    if !headers.contains_key(header::CACHE_CONTROL) {
        set(headers, header::CACHE_CONTROL, "no-store");
    }
    response
}

/// An HTML answer.
pub(crate) fn html_response(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// A page saying what went wrong, with `status`.
pub(crate) fn error_page(session: Option<&Session>, status: StatusCode, message: &str) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    html_response(
        status,
        view::layout(
            title,
            session,
            html! {
                section.error {
                    h1 { (status.as_u16()) " " (title) }
                    p.message { (message) }
                }
            },
        ),
    )
}

/// The API's refusal as a page: its code and message, nothing more.
pub(crate) fn api_error_page(session: &Session, e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error_page(Some(session), status, &e.message)
}

pub(crate) async fn not_found(State(d): State<Dashboard>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let session = d.session(&parts).ok();
    error_page(
        session.as_ref(),
        StatusCode::NOT_FOUND,
        "No such page in the dashboard.",
    )
}

async fn css() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("assets/dashboard.css"),
    )
}

async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/dashboard.js"),
    )
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        text,
    )
        .into_response()
}

async fn login_form() -> Response {
    html_response(StatusCode::OK, login_markup(None))
}

fn login_markup(problem: Option<&str>) -> Markup {
    view::layout(
        "Log in",
        None,
        html! {
            section.login {
                h1 { "Log in to trainhub" }
                p { "Paste a bearer token the hub accepts (the " code { "token" } " of your kubeconfig's user)." }
                @if let Some(problem) = problem {
                    p.message.error #login-error { (problem) }
                }
                form method="post" action="/dashboard/login" {
                    label for="token" { "Bearer token" }
                    input #token type="password" name="token" autocomplete="off" required maxlength=(MAX_TOKEN_BYTES);
                    button type="submit" { "Log in" }
                }
            }
        },
    )
}

/// Checks the posted token with the API's authenticator; on success keeps
/// it in the session cookie.
async fn login(State(d): State<Dashboard>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if let Err(why) = same_origin(&parts.headers) {
        return error_page(None, StatusCode::FORBIDDEN, why);
    }
    let server = match d.server() {
        Ok(s) => s,
        Err(r) => return r,
    };
    let form = match form_pairs(body).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let token = form
        .iter()
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.trim())
        .unwrap_or_default();
    let refused = |why: &str| html_response(StatusCode::UNAUTHORIZED, login_markup(Some(why)));
    if token.is_empty() {
        return refused("token: required");
    }
    if token.len() > MAX_TOKEN_BYTES {
        return refused(&format!("token: at most {MAX_TOKEN_BYTES} bytes"));
    }
    let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) else {
        return refused("token: only visible ASCII characters");
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, value);
    if server
        .authenticate(&headers, &axum::http::Extensions::new())
        .is_err()
    {
        return refused("The hub does not accept this token.");
    }
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; Secure; SameSite=Strict; Path={PREFIX}",
        hex::encode(token)
    );
    let mut response = Redirect::to("/dashboard/").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn logout(State(d): State<Dashboard>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let form = match form_pairs(body).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    if let Err(r) = d.action_session(&parts, &form) {
        return r;
    }
    let mut response = Redirect::to("/dashboard/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "trainhub_dashboard=; HttpOnly; Secure; SameSite=Strict; Path=/dashboard; Max-Age=0",
        ),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_url_needs_a_scheme_and_the_placeholder() {
        assert!(parse_trace_url("https://jaeger.example/trace/{traceId}").is_ok());
        assert!(
            parse_trace_url("javascript:alert(1)//{traceId}")
                .unwrap_err()
                .contains("https://")
        );
        assert!(
            parse_trace_url("https://jaeger.example/trace/")
                .unwrap_err()
                .contains("{traceId}")
        );
        assert!(parse_trace_url("https://x/\"{traceId}").is_err());
    }

    #[test]
    fn cookie_token_reads_only_our_cookie() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("other=1; trainhub_dashboard=616263"),
        );
        assert_eq!(cookie_token(&headers).as_deref(), Some("abc"));
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("trainhub_dashboard=zz"),
        );
        assert_eq!(cookie_token(&headers), None);
    }

    #[test]
    fn a_cross_origin_post_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("hub:6443"));
        headers.insert(header::ORIGIN, HeaderValue::from_static("https://hub:6443"));
        assert!(same_origin(&headers).is_ok());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(same_origin(&headers).is_err());
        headers.insert(header::ORIGIN, HeaderValue::from_static("http://hub:6443"));
        assert!(same_origin(&headers).is_err());
        headers.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(
            same_origin(&headers).is_err(),
            "null without Sec-Fetch-Site"
        );
        headers.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_origin(&headers).is_ok());
        headers.remove(header::ORIGIN);
        headers.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(same_origin(&headers).is_err());
    }
}
