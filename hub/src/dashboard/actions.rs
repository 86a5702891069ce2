//! The actions: suspend, resume and delete a TrainJob; cordon and
//! uncordon a spoke (admins). Each is a POST with the session's CSRF
//! token, carried out as the API request `kubectl` would make (a merge
//! patch of `spec.suspend` or `spec.unschedulable`, a delete), in-process
//! with the caller's credential: the API authorizes and admits it.

use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse as _, Redirect, Response};
use maud::html;
use serde_json::{Value, json};
use trainhub_apiserver::status::ApiError;

use super::view::{self, csrf, str_at};
use super::{Dashboard, Session, api_error_page, form_pairs, html_response};

const MERGE_PATCH: &str = "application/merge-patch+json";

fn trainjob_path(namespace: &str, name: &str) -> String {
    format!(
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{}/trainjobs/{}",
        view::segment(namespace),
        view::segment(name)
    )
}

/// The API's refusal of an action, as a page.
async fn refusal(session: &Session, response: Response) -> Response {
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("the API answered {status}"));
    api_error_page(session, &ApiError::new(status.as_u16(), "", message))
}

async fn act(
    d: &Dashboard,
    request: Request,
    method: Method,
    path: String,
    patch: Option<Value>,
    then: String,
) -> Response {
    let (parts, body) = request.into_parts();
    let form = match form_pairs(body).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let mut session = match d.action_session(&parts, &form) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (content_type, body) = match patch {
        Some(p) => (Some(MERGE_PATCH), p.to_string().into_bytes()),
        None => (None, Vec::new()),
    };
    // A merge patch names no resourceVersion: the API applies it again
    // itself when another write (a heartbeat, a status update) lands
    // between its read and its commit.
    let response = d.api(&mut session, method, &path, content_type, body).await;
    if response.status().is_success() {
        // 303 See Other: the browser GETs the page after the POST.
        Redirect::to(&then).into_response()
    } else {
        refusal(&session, response).await
    }
}

/// `suspend` or `resume`: a merge patch of `spec.suspend`.
pub(crate) async fn set_suspend(
    State(d): State<Dashboard>,
    Path((namespace, name, action)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    let suspend = match action.as_str() {
        "suspend" => true,
        "resume" => false,
        _ => return super::not_found(State(d), request).await,
    };
    let then = view::job_href(&namespace, &name);
    act(
        &d,
        request,
        Method::PATCH,
        trainjob_path(&namespace, &name),
        Some(json!({"spec": {"suspend": suspend}})),
        then,
    )
    .await
}

pub(crate) async fn delete(
    State(d): State<Dashboard>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let then = format!(
        "/dashboard/trainjobs?namespace={}",
        view::segment(&namespace)
    );
    act(
        &d,
        request,
        Method::DELETE,
        trainjob_path(&namespace, &name),
        None,
        then,
    )
    .await
}

/// Asks before deleting.
pub(crate) async fn confirm_delete(
    State(d): State<Dashboard>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let (session, job) = match super::detail::session_and_job(&d, request, &namespace, &name) {
        Ok(found) => found,
        Err(r) => return r,
    };
    let base = view::job_href(&namespace, &name);
    html_response(
        StatusCode::OK,
        view::layout(
            "Delete TrainJob",
            Some(&session),
            html! {
                section.confirm {
                    h1 { "Delete TrainJob " (str_at(&job, "/metadata/name")) "?" }
                    p { "Its pods on spoke " strong { (view::spoke(&job)) } " are stopped and its status is lost. This cannot be undone." }
                    form method="post" action={ (base) "/delete" } {
                        (csrf(&session))
                        button.danger #confirm-delete type="submit" { "Delete" }
                        " "
                        a href=(base) { "Cancel" }
                    }
                }
            },
        ),
    )
}

fn spoke_path(name: &str) -> String {
    format!(
        "/apis/trainhub.kubeflow.org/v1alpha1/spokes/{}",
        view::segment(name)
    )
}

/// `cordon` or `uncordon`: a merge patch of `spec.unschedulable`, as
/// `trainctl spoke cordon` makes.
pub(crate) async fn set_cordon(
    State(d): State<Dashboard>,
    Path((name, action)): Path<(String, String)>,
    request: Request,
) -> Response {
    let unschedulable = match action.as_str() {
        "cordon" => true,
        "uncordon" => false,
        _ => return super::not_found(State(d), request).await,
    };
    act(
        &d,
        request,
        Method::PATCH,
        spoke_path(&name),
        Some(json!({"spec": {"unschedulable": unschedulable}})),
        "/dashboard/".into(),
    )
    .await
}
