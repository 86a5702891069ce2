//! What every page shares: the layout, a TrainJob's summary (state,
//! queue, spoke, progress) and links. Pure functions over objects.

use maud::{DOCTYPE, Markup, html};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use super::Session;

/// Characters left as they are in a path segment of a link.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_');

/// The page around `body`: navigation and, for a session, who is logged in
/// and the logout form.
pub(crate) fn layout(title: &str, session: Option<&Session>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · trainhub" }
                link rel="stylesheet" href="/dashboard/assets/dashboard.css";
                script src="/dashboard/assets/dashboard.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/dashboard/" { "trainhub" }
                    @if let Some(s) = session {
                        nav {
                            a href="/dashboard/" { "Overview" }
                            a href="/dashboard/trainjobs" { "TrainJobs" }
                            a href="/dashboard/plugins" { "Plugins and runtimes" }
                        }
                        span.user #user { (s.user.name) }
                        form.logout method="post" action="/dashboard/logout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// A hidden CSRF field for `session`'s forms.
pub(crate) fn csrf(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

/// The link to a TrainJob's detail page.
pub(crate) fn job_href(namespace: &str, name: &str) -> String {
    format!(
        "/dashboard/trainjobs/{}/{}",
        segment(namespace),
        segment(name)
    )
}

/// `s` percent-encoded as one path segment.
pub(crate) fn segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// The states the dashboard shows TrainJobs in.
pub(crate) const STATES: [&str; 6] = [
    "Pending",
    "Running",
    "Suspended",
    "Complete",
    "Failed",
    "Deleting",
];

/// A TrainJob's state: finished (`Complete`, `Failed`: their condition is
/// true), `Deleting`, `Suspended` (`spec.suspend`), `Running` (placed on a
/// spoke) or `Pending`.
pub(crate) fn state(job: &Value) -> &'static str {
    if condition_true(job, "Complete") {
        "Complete"
    } else if condition_true(job, "Failed") {
        "Failed"
    } else if job.pointer("/metadata/deletionTimestamp").is_some() {
        "Deleting"
    } else if job.pointer("/spec/suspend") == Some(&Value::Bool(true)) {
        "Suspended"
    } else if !spoke(job).is_empty() {
        "Running"
    } else {
        "Pending"
    }
}

pub(crate) fn condition_true(object: &Value, kind: &str) -> bool {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        })
}

pub(crate) fn str_at<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(crate) fn annotation<'a>(object: &'a Value, key: &str) -> &'a str {
    metadata_entry(object, "annotations", key)
}

pub(crate) fn label<'a>(object: &'a Value, key: &str) -> &'a str {
    metadata_entry(object, "labels", key)
}

/// `metadata.MAP[key]`, or "".
fn metadata_entry<'a>(object: &'a Value, map: &str, key: &str) -> &'a str {
    object
        .get("metadata")
        .and_then(|m| m.get(map))
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(crate) fn spoke(job: &Value) -> &str {
    annotation(job, crate::dispatch::ANNOTATION_SPOKE)
}

pub(crate) fn queue(job: &Value) -> &str {
    label(job, crate::kueue::LABEL_QUEUE_NAME)
}

pub(crate) fn runtime(job: &Value) -> &str {
    str_at(job, "/spec/runtimeRef/name")
}

/// `status.trainerStatus.progressPercentage`, when the trainer reported it.
pub(crate) fn progress(job: &Value) -> Option<i64> {
    job.pointer("/status/trainerStatus/progressPercentage")
        .and_then(Value::as_i64)
        .map(|p| p.clamp(0, 100))
}

/// How long ago `timestamp` (RFC 3339) was, as kubectl prints ages.
pub(crate) fn age(timestamp: &str, now: jiff::Timestamp) -> String {
    let Ok(t) = timestamp.parse::<jiff::Timestamp>() else {
        return String::new();
    };
    let secs = now.as_second().saturating_sub(t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// What the TrainJobs table shows and filters on, of one TrainJob (kept
/// per resourceVersion, so a page decodes only what changed).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    pub namespace: String,
    pub name: String,
    pub state: &'static str,
    pub queue: String,
    pub runtime: String,
    pub spoke: String,
    pub progress: Option<i64>,
    pub created: String,
    pub labels: Vec<(String, String)>,
}

impl Summary {
    pub fn of(job: &Value) -> Summary {
        let labels = job
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        Summary {
            namespace: str_at(job, "/metadata/namespace").to_string(),
            name: str_at(job, "/metadata/name").to_string(),
            state: state(job),
            queue: queue(job).to_string(),
            runtime: runtime(job).to_string(),
            spoke: spoke(job).to_string(),
            progress: progress(job),
            created: str_at(job, "/metadata/creationTimestamp").to_string(),
            labels,
        }
    }

    /// The cells of its table row, by column name.
    pub fn cells(&self, now: jiff::Timestamp) -> [(&'static str, String); 8] {
        [
            ("namespace", self.namespace.clone()),
            ("name", self.name.clone()),
            ("state", self.state.to_string()),
            ("queue", self.queue.clone()),
            ("runtime", self.runtime.clone()),
            ("spoke", self.spoke.clone()),
            (
                "progress",
                self.progress.map(|p| format!("{p}%")).unwrap_or_default(),
            ),
            ("age", age(&self.created, now)),
        ]
    }
}

/// The columns of the TrainJobs table, in order, with their headings.
pub(crate) const COLUMNS: [(&str, &str); 8] = [
    ("namespace", "Namespace"),
    ("name", "Name"),
    ("state", "State"),
    ("queue", "Queue"),
    ("runtime", "Runtime"),
    ("spoke", "Spoke"),
    ("progress", "Progress"),
    ("age", "Age"),
];

/// The id of a TrainJob's table row.
pub(crate) fn row_id(namespace: &str, name: &str) -> String {
    format!("tj/{namespace}/{name}")
}

/// A table row of one TrainJob.
pub(crate) fn job_row(job: &Summary, now: jiff::Timestamp) -> Markup {
    let cells = job.cells(now);
    html! {
        tr id=(row_id(&job.namespace, &job.name)) data-state=(job.state) {
            @for (column, text) in &cells {
                @if *column == "name" {
                    td data-col=(column) { a href=(job_href(&job.namespace, &job.name)) { (text) } }
                } @else {
                    td data-col=(column) { (text) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn state_follows_conditions_suspend_and_placement() {
        let mut job = json!({"metadata": {"name": "j"}, "spec": {}});
        assert_eq!(state(&job), "Pending");
        job["metadata"]["annotations"] = json!({"trainhub.kubeflow.org/spoke": "s1"});
        assert_eq!(state(&job), "Running");
        job["spec"]["suspend"] = json!(true);
        assert_eq!(state(&job), "Suspended");
        job["status"] = json!({"conditions": [{"type": "Complete", "status": "True"}]});
        assert_eq!(state(&job), "Complete");
        job["status"] = json!({"conditions": [{"type": "Failed", "status": "False"}]});
        assert_eq!(state(&job), "Suspended");
    }

    #[test]
    fn links_encode_their_segments() {
        assert_eq!(job_href("ns", "a b/c"), "/dashboard/trainjobs/ns/a%20b%2Fc");
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let now: jiff::Timestamp = "2026-01-01T10:00:00Z".parse().unwrap();
        assert_eq!(age("2026-01-01T09:59:30Z", now), "30s");
        assert_eq!(age("2026-01-01T09:00:00Z", now), "60m");
        assert_eq!(age("2025-12-30T10:00:00Z", now), "2d");
        assert_eq!(age("garbage", now), "");
    }

    #[test]
    fn hostile_names_are_escaped_in_rows() {
        let job = json!({"metadata": {"namespace": "ns", "name": "<script>x</script>",
            "labels": {"kueue.x-k8s.io/queue-name": "\"><img src=x>"}}});
        let html = job_row(&Summary::of(&job), jiff::Timestamp::UNIX_EPOCH).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }
}
