//! Plugins and runtimes: the TrainerPlugin objects (module, digest,
//! signature, readiness) and the runtimes with the plugins their
//! framework selects.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use serde_json::Value;
use trainhub_apiserver::auth::Attributes;

use super::view::{self, str_at};
use super::{Dashboard, Session, attributes, html_response};
use crate::api::{CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES};

const FRAMEWORK_LABEL: &str = "trainer.kubeflow.org/framework";

fn list<'a>(group: &'a str, resource: &'a str, namespace: Option<&'a str>) -> Attributes<'a> {
    attributes("list", group, resource, namespace, "")
}

pub(crate) async fn page(State(d): State<Dashboard>, request: Request) -> Response {
    let (session, _) = match d.page_session(request) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let store = d.store();
    let values = |resource: &str, namespace: Option<&str>| -> Vec<Arc<Value>> {
        store
            .list(resource, namespace)
            .0
            .into_iter()
            .map(|o| o.value)
            .collect()
    };
    let plugins = d
        .allowed(
            &session,
            &list("trainhub.kubeflow.org", "trainerplugins", None),
        )
        .then(|| values(crate::plugins::objects::RESOURCE, None));
    let cluster_runtimes = d
        .allowed(
            &session,
            &list("trainer.kubeflow.org", "clustertrainingruntimes", None),
        )
        .then(|| values(CLUSTER_TRAINING_RUNTIMES, None));
    let runtimes = if d.allowed(
        &session,
        &list("trainer.kubeflow.org", "trainingruntimes", None),
    ) {
        values(TRAINING_RUNTIMES, None)
    } else {
        store
            .list(trainhub_apiserver::namespace::NAMESPACES, None)
            .0
            .iter()
            .filter(|n| {
                d.allowed(
                    &session,
                    &list(
                        "trainer.kubeflow.org",
                        "trainingruntimes",
                        Some(&n.key.name),
                    ),
                )
            })
            .flat_map(|n| values(TRAINING_RUNTIMES, Some(&n.key.name)))
            .collect()
    };
    html_response(
        StatusCode::OK,
        render(
            &session,
            plugins.as_deref(),
            cluster_runtimes.as_deref(),
            &runtimes,
        ),
    )
}

fn frameworks(plugin: &Value) -> Vec<&str> {
    plugin
        .pointer("/status/plugin/frameworks")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn ready(plugin: &Value) -> (&str, &str) {
    plugin
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| (str_at(c, "/status"), str_at(c, "/reason")))
        .unwrap_or(("Unknown", ""))
}

/// The plugins whose frameworks include the runtime's.
fn plugins_of<'a>(runtime: &Value, plugins: &'a [Arc<Value>]) -> Vec<&'a str> {
    let framework = view::label(runtime, FRAMEWORK_LABEL);
    if framework.is_empty() {
        return Vec::new();
    }
    plugins
        .iter()
        .filter(|p| frameworks(p).contains(&framework))
        .map(|p| str_at(p, "/metadata/name"))
        .collect()
}

pub(crate) fn render(
    session: &Session,
    plugins: Option<&[Arc<Value>]>,
    cluster_runtimes: Option<&[Arc<Value>]>,
    runtimes: &[Arc<Value>],
) -> Markup {
    let known: &[Arc<Value>] = plugins.unwrap_or(&[]);
    let runtime_rows = |list: &[Arc<Value>]| {
        html! {
            @for r in list {
                tr {
                    td { (str_at(r, "/metadata/namespace")) }
                    td { (str_at(r, "/metadata/name")) }
                    td { (view::label(r, FRAMEWORK_LABEL)) }
                    td { (plugins_of(r, known).join(", ")) }
                }
            }
        }
    };
    view::layout(
        "Plugins and runtimes",
        Some(session),
        html! {
            h1 { "Plugins and runtimes" }
            section #plugins {
                h2 { "TrainerPlugins" }
                @match plugins {
                    None => p.empty { "You may not list TrainerPlugins." },
                    Some([]) => p.empty { "None." },
                    Some(plugins) => table {
                        thead { tr {
                            th { "Plugin" } th { "Ready" } th { "Version" } th { "Frameworks" }
                            th { "Module" } th { "Digest" } th { "Signature" }
                        } }
                        tbody {
                            @for p in plugins {
                                @let (status, reason) = ready(p);
                                tr data-ready=(status) {
                                    td { (str_at(p, "/metadata/name")) }
                                    td { (status) @if !reason.is_empty() { " (" (reason) ")" } }
                                    td { (str_at(p, "/status/plugin/version")) }
                                    td { (frameworks(p).join(", ")) }
                                    td { code { (str_at(p, "/spec/module")) } }
                                    td { code.digest { (str_at(p, "/status/digest")) } }
                                    td { @if str_at(p, "/spec/signature").is_empty() { "—" } @else { "signed" } }
                                }
                            }
                        }
                    },
                }
            }
            section #runtimes {
                h2 { "Runtimes" }
                table {
                    thead { tr { th { "Namespace" } th { "Runtime" } th { "Framework" } th { "Plugins" } } }
                    tbody {
                        @if let Some(list) = cluster_runtimes { (runtime_rows(list)) }
                        (runtime_rows(runtimes))
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_runtime_uses_the_plugins_of_its_framework() {
        let plugins = vec![
            Arc::new(
                json!({"metadata": {"name": "builtin-torch"}, "status": {"plugin": {"frameworks": ["torch"]}}}),
            ),
            Arc::new(
                json!({"metadata": {"name": "builtin-mpi"}, "status": {"plugin": {"frameworks": ["mpi"]}}}),
            ),
        ];
        let runtime = json!({"metadata": {"name": "torch-distributed",
            "labels": {"trainer.kubeflow.org/framework": "torch"}}});
        assert_eq!(plugins_of(&runtime, &plugins), ["builtin-torch"]);
        assert!(plugins_of(&json!({}), &plugins).is_empty());
    }
}
