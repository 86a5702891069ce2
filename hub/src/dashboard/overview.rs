//! The overview: the spokes (connected, heartbeat, capacity and what is
//! free, certificate expiry, cordoned), the ClusterQueues (usage against
//! nominal quota, borrowed, pending), the caller's TrainJobs by state and
//! the object counts its namespaces' ResourceQuotas allow.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use serde_json::Value;

use super::trainjobs::{self, Filter, Scope};
use super::view::{self, STATES, Summary, str_at};
use super::{Dashboard, Session, attributes, html_response};
use crate::api::SPOKES;
use crate::kueue::CLUSTER_QUEUES;
use trainhub_apiserver::quota::RESOURCE_QUOTAS;

/// A certificate expiring sooner than this is flagged.
const EXPIRY_WARNING: i64 = 7 * 24 * 3600;

pub(crate) async fn page(State(d): State<Dashboard>, request: Request) -> Response {
    let (session, _) = match d.page_session(request) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let spokes: Option<Vec<(Arc<Value>, bool)>> = d
        .allowed(
            &session,
            &attributes("list", "trainhub.kubeflow.org", "spokes", None, ""),
        )
        .then(|| {
            d.store()
                .list(SPOKES, None)
                .0
                .into_iter()
                .map(|o| {
                    let may_cordon = d.allowed(
                        &session,
                        &attributes(
                            "patch",
                            "trainhub.kubeflow.org",
                            "spokes",
                            None,
                            &o.key.name,
                        ),
                    );
                    (o.value, may_cordon)
                })
                .collect()
        });
    let queues: Option<Vec<Arc<Value>>> = d
        .allowed(
            &session,
            &attributes("list", "kueue.x-k8s.io", "clusterqueues", None, ""),
        )
        .then(|| {
            d.store()
                .list(CLUSTER_QUEUES, None)
                .0
                .into_iter()
                .map(|o| o.value)
                .collect()
        });
    let scope = match trainjobs::scope(&d, &session, None) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let jobs = d.summaries().list(d.store().as_ref(), &scope).await;
    let quotas = namespace_quotas(&d, &session, &scope);
    html_response(
        StatusCode::OK,
        render(
            &session,
            spokes.as_deref(),
            queues.as_deref(),
            &jobs,
            &quotas,
            jiff::Timestamp::now(),
        ),
    )
}

/// The ResourceQuotas of the namespaces in `scope` that `session` may list
/// them in.
fn namespace_quotas(d: &Dashboard, session: &Session, scope: &Scope) -> Vec<Arc<Value>> {
    let may_list = |namespace: Option<&str>| {
        d.allowed(
            session,
            &attributes("list", "", RESOURCE_QUOTAS, namespace, ""),
        )
    };
    let namespaces: Vec<Option<&str>> = match scope {
        Scope::All if may_list(None) => vec![None],
        Scope::All => Vec::new(),
        Scope::Namespaces(list) => list
            .iter()
            .map(|n| Some(n.as_str()))
            .filter(|n| may_list(*n))
            .collect(),
    };
    namespaces
        .into_iter()
        .flat_map(|ns| d.store().list(RESOURCE_QUOTAS, ns).0)
        .map(|o| o.value)
        .collect()
}

/// Each quota's counted resources, used against hard, as `kubectl describe
/// quota` shows them.
fn quotas_section(quotas: &[Arc<Value>]) -> Markup {
    html! {
        section #quotas {
            h2 { "Namespace quotas" }
            @if quotas.is_empty() {
                p.empty { "No ResourceQuota in your namespaces: they may hold any number of objects." }
            } @else {
                table {
                    thead { tr { th { "Namespace" } th { "Quota" } th { "Resource" } th { "Used / hard" } } }
                    tbody {
                        @for q in quotas {
                            @let hard = q.pointer("/spec/hard").and_then(Value::as_object);
                            @for (resource, limit) in hard.into_iter().flatten() {
                                @let used = q.pointer("/status/used").and_then(|u| u.get(resource)).and_then(Value::as_str);
                                @let full = used.is_some_and(|u| Some(u) == limit.as_str());
                                tr.full[full] {
                                    td { (str_at(q, "/metadata/namespace")) }
                                    td { (str_at(q, "/metadata/name")) }
                                    td { (resource) }
                                    td { (used.unwrap_or("not counted yet")) " / " (limit.as_str().unwrap_or_default()) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Per flavor and resource: (nominal quota, used, borrowed).
type Usage = BTreeMap<(String, String), (String, String, String)>;

fn queue_usage(queue: &Value) -> Usage {
    let mut usage = Usage::new();
    for group in queue
        .pointer("/spec/resourceGroups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for flavor in group["flavors"].as_array().into_iter().flatten() {
            for r in flavor["resources"].as_array().into_iter().flatten() {
                let key = (
                    str_at(flavor, "/name").to_string(),
                    str_at(r, "/name").to_string(),
                );
                usage.entry(key).or_default().0 = quantity(&r["nominalQuota"]);
            }
        }
    }
    let status = &queue["status"];
    let used = status
        .get("flavorsUsage")
        .or_else(|| status.get("flavorUsage"));
    for flavor in used.and_then(Value::as_array).into_iter().flatten() {
        for r in flavor["resources"].as_array().into_iter().flatten() {
            let key = (
                str_at(flavor, "/name").to_string(),
                str_at(r, "/name").to_string(),
            );
            let entry = usage.entry(key).or_default();
            entry.1 = quantity(&r["total"]);
            entry.2 = quantity(&r["borrowed"]);
        }
    }
    usage
}

/// `spec.cohortName` (Kueue v1beta2, as stored), or v1beta1's `spec.cohort`.
fn cohort(queue: &Value) -> &str {
    match str_at(queue, "/spec/cohortName") {
        "" => str_at(queue, "/spec/cohort"),
        name => name,
    }
}

fn quantity(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => "0".into(),
    }
}

/// Seconds until an RFC 3339 time, if it parses.
fn seconds_until(t: &str, now: jiff::Timestamp) -> Option<i64> {
    let t: jiff::Timestamp = t.parse().ok()?;
    Some(t.as_second() - now.as_second())
}

pub(crate) fn render(
    session: &Session,
    spokes: Option<&[(Arc<Value>, bool)]>,
    queues: Option<&[Arc<Value>]>,
    jobs: &[Arc<Summary>],
    quotas: &[Arc<Value>],
    now: jiff::Timestamp,
) -> Markup {
    let mut counts: BTreeMap<&str, usize> = STATES.iter().map(|s| (*s, 0)).collect();
    for j in jobs {
        *counts.entry(j.state).or_default() += 1;
    }
    view::layout(
        "Overview",
        Some(session),
        html! {
            h1 { "Overview" }
            section #counts {
                h2 { "TrainJobs" }
                ul.counts {
                    li { a href="/dashboard/trainjobs" { strong { (jobs.len()) } " in all" } }
                    @for state in STATES {
                        li data-state=(state) {
                            a href={ "/dashboard/trainjobs?" (Filter::default().query(|f| f.state = state.into())) } {
                                strong { (counts.get(state).copied().unwrap_or(0)) } " " (state)
                            }
                        }
                    }
                }
            }
            section #spokes {
                h2 { "Spokes" }
                @match spokes {
                    None => p.empty { "You may not list spokes." },
                    Some([]) => p.empty { "No spoke has connected yet." },
                    Some(spokes) => table {
                        thead { tr {
                            th { "Spoke" } th { "State" } th { "Last heartbeat" } th { "Capacity" }
                            th { "Free" } th { "Flavors" } th { "Running" } th { "Certificate expires" } th {}
                        } }
                        tbody {
                            @for (spoke, may_cordon) in spokes {
                                @let name = str_at(spoke, "/metadata/name");
                                @let cordoned = spoke.pointer("/spec/unschedulable") == Some(&Value::Bool(true));
                                @let expires = str_at(spoke, "/status/certificate/notAfter");
                                @let soon = seconds_until(expires, now).is_some_and(|s| s < EXPIRY_WARNING);
                                tr.spoke id={ "spoke-" (name) } data-state=(str_at(spoke, "/status/state")) {
                                    td { (name) }
                                    td.state { (str_at(spoke, "/status/state"))
                                        @if view::condition_true(spoke, "Connected") { " (connected)" } }
                                    td { (view::age(str_at(spoke, "/status/lastHeartbeatTime"), now)) " ago" }
                                    td { (str_at(spoke, "/status/capacitySummary")) }
                                    td { (str_at(spoke, "/status/freeSummary")) }
                                    td { (str_at(spoke, "/status/flavorsSummary")) }
                                    td { (spoke.pointer("/status/running").and_then(Value::as_i64).unwrap_or(0)) }
                                    td.expiry.warning[soon] { (expires) }
                                    td {
                                        @if *may_cordon {
                                            @let action = if cordoned { "uncordon" } else { "cordon" };
                                            form method="post" action={ "/dashboard/spokes/" (view::segment(name)) "/" (action) } {
                                                (view::csrf(session))
                                                button type="submit" { (if cordoned { "Uncordon" } else { "Cordon" }) }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    },
                }
            }
            section #queues {
                h2 { "ClusterQueues" }
                @match queues {
                    None => p.empty { "You may not list ClusterQueues." },
                    Some([]) => p.empty { "No ClusterQueue: TrainJobs without a queue label are dispatched first come, first served." },
                    Some(queues) => table {
                        thead { tr {
                            th { "ClusterQueue" } th { "Cohort" } th { "Flavor" } th { "Resource" }
                            th { "Used / nominal" } th { "Borrowed" } th { "Pending" } th { "Admitted" }
                        } }
                        tbody {
                            @for q in queues {
                                @let usage = queue_usage(q);
                                @let rows = usage.len().max(1);
                                @for (i, ((flavor, resource), (nominal, used, borrowed))) in usage.iter().enumerate() {
                                    tr {
                                        @if i == 0 {
                                            td rowspan=(rows) { (str_at(q, "/metadata/name")) }
                                            td rowspan=(rows) { (cohort(q)) }
                                        }
                                        td { (flavor) } td { (resource) }
                                        td { (used) " / " (nominal) } td { (borrowed) }
                                        @if i == 0 {
                                            td rowspan=(rows) { (q.pointer("/status/pendingWorkloads").and_then(Value::as_i64).unwrap_or(0)) }
                                            td rowspan=(rows) { (q.pointer("/status/admittedWorkloads").and_then(Value::as_i64).unwrap_or(0)) }
                                        }
                                    }
                                }
                                @if usage.is_empty() {
                                    tr { td { (str_at(q, "/metadata/name")) } td { (cohort(q)) } td colspan="6" { "no quota" } }
                                }
                            }
                        }
                    },
                }
            }
            (quotas_section(quotas))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quotas_show_used_against_hard_per_resource() {
        let q = Arc::new(json!({
            "metadata": {"name": "objects", "namespace": "team-a"},
            "spec": {"hard": {"count/trainjobs.trainer.kubeflow.org": "2", "count/trainingruntimes.trainer.kubeflow.org": "5"}},
            "status": {"used": {"count/trainjobs.trainer.kubeflow.org": "2"}},
        }));
        let page = quotas_section(&[q]).into_string();
        assert!(
            page.contains(r#"<tr class="full"><td>team-a</td><td>objects</td><td>count/trainjobs.trainer.kubeflow.org</td><td>2 / 2</td></tr>"#),
            "{page}"
        );
        assert!(
            page.contains(
                "<td>count/trainingruntimes.trainer.kubeflow.org</td><td>not counted yet / 5</td>"
            ),
            "{page}"
        );
        assert!(
            quotas_section(&[])
                .into_string()
                .contains("No ResourceQuota")
        );
    }

    #[test]
    fn queue_usage_pairs_nominal_with_used_and_borrowed() {
        let q = json!({
            "spec": {"resourceGroups": [{"flavors": [{"name": "gpu", "resources": [
                {"name": "cpu", "nominalQuota": "8"}, {"name": "memory", "nominalQuota": "16Gi"}]}]}]},
            "status": {"flavorsUsage": [{"name": "gpu", "resources": [
                {"name": "cpu", "total": "10", "borrowed": "2"}]}]}
        });
        let u = queue_usage(&q);
        assert_eq!(
            u[&("gpu".to_string(), "cpu".to_string())],
            ("8".into(), "10".into(), "2".into())
        );
        assert_eq!(u[&("gpu".to_string(), "memory".to_string())].0, "16Gi");
    }
}
