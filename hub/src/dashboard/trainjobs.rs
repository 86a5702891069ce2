//! The TrainJobs table: server-side filters, sorting and paging over the
//! TrainJobs the caller may list, and its live updates (server-sent
//! events, one per changed row).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt as _};
use maud::{Markup, html};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use trainhub_apiserver::auth::Attributes;
use trainhub_apiserver::store::{EventType, Key, Rv, Store};

use super::view::{self, COLUMNS, STATES, Summary};
use super::{Dashboard, Session, error_page, html_response, query_pairs};
use crate::api::TRAINJOBS;

/// Rows a page shows unless asked otherwise, and at most.
pub const DEFAULT_PAGE_SIZE: usize = 50;
pub const MAX_PAGE_SIZE: usize = 500;
/// The last page number a query may ask for.
const MAX_PAGE: usize = 1_000_000;
/// Longest filter value (a label `key=value`: a 253-byte key, `=`, a
/// 63-byte value).
pub const MAX_FILTER_BYTES: usize = 317;
/// A live stream ends after this; the browser reconnects (and is
/// authenticated again).
const LIVE_LIFETIME: Duration = Duration::from_secs(15 * 60);

const GROUP: &str = "trainer.kubeflow.org";

/// The TrainJobs' namespaces a caller may list.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scope {
    All,
    Namespaces(Vec<String>),
}

impl Scope {
    fn contains(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespaces(list) => list.iter().any(|n| n == namespace),
        }
    }
}

fn list_attributes(namespace: Option<&str>) -> Attributes<'_> {
    super::attributes("list", GROUP, "trainjobs", namespace, "")
}

/// Where `session` may list TrainJobs: `namespace` if given (the API's 403
/// otherwise), else everywhere, or the namespaces it is granted.
pub(crate) fn scope(
    d: &Dashboard,
    session: &Session,
    namespace: Option<&str>,
) -> Result<Scope, Response> {
    if let Some(ns) = namespace {
        d.authorize(session, &list_attributes(Some(ns)))?;
        return Ok(Scope::Namespaces(vec![ns.to_string()]));
    }
    if d.allowed(session, &list_attributes(None)) {
        return Ok(Scope::All);
    }
    let (namespaces, _) = d
        .store()
        .list(trainhub_apiserver::namespace::NAMESPACES, None);
    Ok(Scope::Namespaces(
        namespaces
            .iter()
            .map(|n| n.key.name.clone())
            .filter(|ns| d.allowed(session, &list_attributes(Some(ns))))
            .collect(),
    ))
}

/// Summaries of the stored TrainJobs, each decoded once per
/// resourceVersion: a page over 10,000 TrainJobs decodes only those that
/// changed since the last one.
#[derive(Default)]
pub(crate) struct Summaries(Mutex<HashMap<Key, (Rv, Arc<Summary>)>>);

impl Summaries {
    pub async fn list(&self, store: &dyn Store, scope: &Scope) -> Vec<Arc<Summary>> {
        let mut raws = Vec::new();
        let namespaces: Vec<Option<&str>> = match scope {
            Scope::All => vec![None],
            Scope::Namespaces(list) => list.iter().map(|n| Some(n.as_str())).collect(),
        };
        for namespace in namespaces {
            match store.list_raw(TRAINJOBS, namespace, None, None).await {
                Ok((items, _)) => raws.extend(items),
                Err(e) => tracing::warn!(error = %e, "dashboard: listing TrainJobs"),
            }
        }
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(raws.len());
        for raw in &raws {
            match map.get(&raw.key) {
                Some((rv, summary)) if *rv == raw.rv => out.push(summary.clone()),
                _ => {
                    if let Some(object) = raw.decode() {
                        let summary = Arc::new(Summary::of(&object.value));
                        map.insert(raw.key.clone(), (raw.rv, summary.clone()));
                        out.push(summary);
                    }
                }
            }
        }
        // Forget what is gone from the namespaces just listed.
        let listed: HashSet<&Key> = raws.iter().map(|r| &r.key).collect();
        map.retain(|k, _| !scope.contains(&k.namespace) || listed.contains(k));
        out
    }
}

/// The table's filters, sorting and page, from the query string.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Filter {
    pub namespace: String,
    pub queue: String,
    pub state: String,
    pub spoke: String,
    pub runtime: String,
    /// `key` or `key=value`.
    pub label: String,
    /// Names starting with this.
    pub prefix: String,
    pub sort: String,
    pub descending: bool,
    pub page: usize,
    pub size: usize,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            namespace: String::new(),
            queue: String::new(),
            state: String::new(),
            spoke: String::new(),
            runtime: String::new(),
            label: String::new(),
            prefix: String::new(),
            sort: "created".into(),
            descending: true,
            page: 1,
            size: DEFAULT_PAGE_SIZE,
        }
    }
}

/// The columns the table sorts by (`created`: the Age column).
const SORTS: [&str; 8] = [
    "namespace",
    "name",
    "state",
    "queue",
    "runtime",
    "spoke",
    "progress",
    "created",
];

impl Filter {
    /// # Errors
    ///
    /// A sentence naming the parameter and the rule it broke.
    pub fn parse(pairs: &[(String, String)]) -> Result<Filter, String> {
        let mut f = Filter::default();
        for (key, value) in pairs {
            let value = value.trim();
            if value.len() > MAX_FILTER_BYTES {
                return Err(format!("{key}: at most {MAX_FILTER_BYTES} bytes"));
            }
            let number = |max: usize| -> Result<usize, String> {
                match value.parse::<usize>() {
                    Ok(n) if (1..=max).contains(&n) => Ok(n),
                    _ => Err(format!(
                        "{key}: {value:?} is not a whole number from 1 to {max}"
                    )),
                }
            };
            match key.as_str() {
                "namespace" => f.namespace = value.into(),
                "queue" => f.queue = value.into(),
                "state" => {
                    if !value.is_empty() && !STATES.contains(&value) {
                        return Err(format!("state: {value:?} is none of {}", STATES.join(", ")));
                    }
                    f.state = value.into();
                }
                "spoke" => f.spoke = value.into(),
                "runtime" => f.runtime = value.into(),
                "label" => f.label = value.into(),
                "prefix" => f.prefix = value.into(),
                "sort" => {
                    if !value.is_empty() {
                        if !SORTS.contains(&value) {
                            return Err(format!("sort: {value:?} is none of {}", SORTS.join(", ")));
                        }
                        f.sort = value.into();
                    }
                }
                "order" => {
                    f.descending = match value {
                        "" | "desc" => true,
                        "asc" => false,
                        _ => return Err(format!("order: {value:?} is neither asc nor desc")),
                    }
                }
                "page" => f.page = number(MAX_PAGE)?,
                "size" => f.size = number(MAX_PAGE_SIZE)?,
                other => {
                    return Err(format!(
                        "unknown query parameter {other:?}: the table takes namespace, queue, state, spoke, runtime, label, prefix, sort, order, page and size"
                    ));
                }
            }
        }
        Ok(f)
    }

    pub fn matches(&self, s: &Summary) -> bool {
        let eq = |want: &str, have: &str| want.is_empty() || want == have;
        eq(&self.namespace, &s.namespace)
            && eq(&self.queue, &s.queue)
            && eq(&self.state, s.state)
            && eq(&self.spoke, &s.spoke)
            && eq(&self.runtime, &s.runtime)
            && s.name.starts_with(&self.prefix)
            && (self.label.is_empty()
                || match self.label.split_once('=') {
                    Some((k, v)) => s.labels.iter().any(|(lk, lv)| lk == k && lv == v),
                    None => s.labels.iter().any(|(lk, _)| *lk == self.label),
                })
    }

    fn sort(&self, rows: &mut [Arc<Summary>]) {
        let key = |s: &Summary| -> String {
            match self.sort.as_str() {
                "namespace" => s.namespace.clone(),
                "name" => s.name.clone(),
                "state" => s.state.to_string(),
                "queue" => s.queue.clone(),
                "runtime" => s.runtime.clone(),
                "spoke" => s.spoke.clone(),
                "progress" => format!("{:03}", s.progress.unwrap_or(-1).max(0)),
                _ => s.created.clone(),
            }
        };
        rows.sort_by(|a, b| {
            let order = key(a)
                .cmp(&key(b))
                .then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            if self.descending {
                order.reverse()
            } else {
                order
            }
        });
    }

    /// The query string of this filter with `change` applied.
    pub fn query(&self, change: impl FnOnce(&mut Filter)) -> String {
        let mut f = self.clone();
        change(&mut f);
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("namespace", &f.namespace),
            ("queue", &f.queue),
            ("state", &f.state),
            ("spoke", &f.spoke),
            ("runtime", &f.runtime),
            ("label", &f.label),
            ("prefix", &f.prefix),
        ] {
            if !v.is_empty() {
                q.append_pair(k, v);
            }
        }
        let default = Filter::default();
        if f.sort != default.sort || f.descending != default.descending {
            q.append_pair("sort", &f.sort);
            q.append_pair("order", if f.descending { "desc" } else { "asc" });
        }
        if f.page != 1 {
            q.append_pair("page", &f.page.to_string());
        }
        if f.size != DEFAULT_PAGE_SIZE {
            q.append_pair("size", &f.size.to_string());
        }
        q.finish()
    }
}

/// One page of the table: the rows, how many matched in all.
pub(crate) struct TablePage {
    pub rows: Vec<Arc<Summary>>,
    pub total: usize,
}

/// Filters, sorts and cuts one page out of `all`.
pub(crate) fn select(all: Vec<Arc<Summary>>, filter: &Filter) -> TablePage {
    let mut rows: Vec<Arc<Summary>> = all.into_iter().filter(|s| filter.matches(s)).collect();
    let total = rows.len();
    filter.sort(&mut rows);
    let start = (filter.page - 1).saturating_mul(filter.size).min(total);
    let end = start.saturating_add(filter.size).min(total);
    TablePage {
        rows: rows[start..end].to_vec(),
        total,
    }
}

/// The caller, the filter of the query string, and where the caller may
/// list TrainJobs (within the filter's namespace).
fn table_request(d: &Dashboard, request: Request) -> Result<(Session, Filter, Scope), Response> {
    let (session, parts) = d.page_session(request)?;
    let pairs = query_pairs(&parts, Some(&session))?;
    let filter = Filter::parse(&pairs)
        .map_err(|why| error_page(Some(&session), StatusCode::BAD_REQUEST, &why))?;
    let namespace = Some(filter.namespace.as_str()).filter(|n| !n.is_empty());
    let scope = scope(d, &session, namespace)?;
    Ok((session, filter, scope))
}

pub(crate) async fn page(State(d): State<Dashboard>, request: Request) -> Response {
    let (session, filter, scope) = match table_request(&d, request) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let all = d.summaries().list(d.store().as_ref(), &scope).await;
    let table = select(all, &filter);
    html_response(
        StatusCode::OK,
        render(&session, &filter, &scope, &table, jiff::Timestamp::now()),
    )
}

/// The whole TrainJobs page.
pub(crate) fn render(
    session: &Session,
    filter: &Filter,
    scope: &Scope,
    table: &TablePage,
    now: jiff::Timestamp,
) -> Markup {
    let pages = table.total.div_ceil(filter.size).max(1);
    // New TrainJobs appear live only where they would sort: on the first
    // page of the newest-first order.
    let insert = filter.page == 1 && filter.sort == "created" && filter.descending;
    let live = format!("/dashboard/trainjobs/live?{}", filter.query(|_| {}));
    view::layout(
        "TrainJobs",
        Some(session),
        html! {
            h1 { "TrainJobs" }
            form.filters #filters method="get" action="/dashboard/trainjobs" {
                label { "Namespace"
                    @if let Scope::Namespaces(list) = scope {
                        @if filter.namespace.is_empty() {
                            select name="namespace" {
                                option value="" { "(all mine)" }
                                @for ns in list { option value=(ns) { (ns) } }
                            }
                        } @else {
                            input name="namespace" value=(filter.namespace) maxlength=(MAX_FILTER_BYTES);
                        }
                    } @else {
                        input name="namespace" value=(filter.namespace) maxlength=(MAX_FILTER_BYTES);
                    }
                }
                label { "Queue" input name="queue" value=(filter.queue) maxlength=(MAX_FILTER_BYTES); }
                label { "State"
                    select name="state" {
                        option value="" { "(any)" }
                        @for s in STATES { option value=(s) selected[filter.state == s] { (s) } }
                    }
                }
                label { "Spoke" input name="spoke" value=(filter.spoke) maxlength=(MAX_FILTER_BYTES); }
                label { "Runtime" input name="runtime" value=(filter.runtime) maxlength=(MAX_FILTER_BYTES); }
                label { "Label" input name="label" value=(filter.label) placeholder="key=value" maxlength=(MAX_FILTER_BYTES); }
                label { "Name prefix" input name="prefix" value=(filter.prefix) maxlength=(MAX_FILTER_BYTES); }
                button type="submit" { "Filter" }
                a href="/dashboard/trainjobs" { "Clear" }
            }
            p.count #count { (table.total) " TrainJob" @if table.total != 1 { "s" } " · page " (filter.page) " of " (pages) }
            table.jobs {
                thead { tr {
                    @for (column, heading) in COLUMNS {
                        @let sort = if column == "age" { "created" } else { column };
                        @let descending = if filter.sort == sort { !filter.descending } else { sort == "created" };
                        th data-col=(column) {
                            a href={ "/dashboard/trainjobs?" (filter.query(|f| { f.sort = sort.into(); f.descending = descending; f.page = 1; })) } {
                                (heading)
                                @if filter.sort == sort { (if filter.descending { " ▼" } else { " ▲" }) }
                            }
                        }
                    }
                } }
                tbody #jobs data-live=(live) data-insert=(if insert { "top" } else { "" }) {
                    @for row in &table.rows { (view::job_row(row, now)) }
                }
            }
            nav.pager {
                @if filter.page > 1 {
                    a rel="prev" href={ "/dashboard/trainjobs?" (filter.query(|f| f.page -= 1)) } { "← Previous" }
                }
                @if filter.page < pages {
                    a rel="next" href={ "/dashboard/trainjobs?" (filter.query(|f| f.page += 1)) } { "Next →" }
                }
            }
        },
    )
}

/// The live table: one `row` event per changed TrainJob of the caller's
/// scope (`{"id", "state", "href", "cells"}`, or `{"id", "gone": true}`
/// when it was deleted or no longer matches the filters). The stream reads
/// the store's bounded broadcast: a client that falls behind gets a
/// `reload` event and the stream ends.
pub(crate) async fn live(State(d): State<Dashboard>, request: Request) -> Response {
    let (mut session, filter, scope) = match table_request(&d, request) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let watch = match d.store().watch(TRAINJOBS, None, None) {
        Ok(w) => w,
        Err(e) => {
            return error_page(
                Some(&session),
                StatusCode::SERVICE_UNAVAILABLE,
                &e.to_string(),
            );
        }
    };
    // The stream holds the caller's place under the caps while it runs.
    let slot = session.take_slot();
    let events = row_events(watch.live, scope, filter).map(move |event| {
        let _held = &slot;
        event
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

fn row_events(
    live: trainhub_apiserver::store::Live,
    scope: Scope,
    filter: Filter,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let deadline = tokio::time::Instant::now() + LIVE_LIFETIME;
    stream::unfold(Some(live), move |state| {
        let (scope, filter) = (scope.clone(), filter.clone());
        async move {
            let mut live = state?;
            loop {
                let received = tokio::time::timeout_at(deadline, live.recv()).await;
                let event = match received {
                    Err(_) | Ok(Err(RecvError::Closed)) => return None,
                    Ok(Err(RecvError::Lagged(_))) => {
                        return Some((Ok(Event::default().event("reload").data("lagged")), None));
                    }
                    Ok(Ok(event)) => event,
                };
                let key = &event.object.key;
                if !scope.contains(&key.namespace) {
                    continue;
                }
                let id = view::row_id(&key.namespace, &key.name);
                let summary = Summary::of(&event.object.value);
                let data = if event.kind == EventType::Deleted || !filter.matches(&summary) {
                    json!({"id": id, "gone": true})
                } else {
                    let cells: serde_json::Map<String, serde_json::Value> = summary
                        .cells(jiff::Timestamp::now())
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v.into()))
                        .collect();
                    json!({
                        "id": id,
                        "state": summary.state,
                        "href": view::job_href(&summary.namespace, &summary.name),
                        "cells": cells,
                    })
                };
                return Some((
                    Ok(Event::default().event("row").data(data.to_string())),
                    Some(live),
                ));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(q.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    fn summary(ns: &str, name: &str, state: &'static str, created: &str) -> Arc<Summary> {
        Arc::new(Summary {
            namespace: ns.into(),
            name: name.into(),
            state,
            queue: String::new(),
            runtime: "torch".into(),
            spoke: String::new(),
            progress: None,
            created: created.into(),
            labels: vec![("team".into(), "a".into())],
        })
    }

    #[test]
    fn bad_parameters_are_named() {
        assert!(
            Filter::parse(&pairs("state=Sleeping"))
                .unwrap_err()
                .starts_with("state:")
        );
        assert!(
            Filter::parse(&pairs("size=100000"))
                .unwrap_err()
                .starts_with("size:")
        );
        assert!(
            Filter::parse(&pairs("page=0"))
                .unwrap_err()
                .starts_with("page:")
        );
        assert!(
            Filter::parse(&pairs("sort=x"))
                .unwrap_err()
                .starts_with("sort:")
        );
        assert!(
            Filter::parse(&pairs("bogus=1"))
                .unwrap_err()
                .contains("\"bogus\"")
        );
        let long = format!("prefix={}", "a".repeat(MAX_FILTER_BYTES + 1));
        assert!(
            Filter::parse(&pairs(&long))
                .unwrap_err()
                .starts_with("prefix:")
        );
    }

    #[test]
    fn filters_sort_and_page() {
        let all = vec![
            summary("a", "j1", "Running", "2026-01-01T00:00:01Z"),
            summary("a", "j2", "Complete", "2026-01-01T00:00:02Z"),
            summary("b", "k3", "Running", "2026-01-01T00:00:03Z"),
            summary("b", "j4", "Running", "2026-01-01T00:00:04Z"),
        ];
        let f = Filter::parse(&pairs("state=Running&prefix=j")).unwrap();
        let page = select(all.clone(), &f);
        assert_eq!(page.total, 2);
        assert_eq!(page.rows[0].name, "j4", "newest first");
        let f = Filter::parse(&pairs("sort=name&order=asc&size=2&page=2")).unwrap();
        let page = select(all.clone(), &f);
        assert_eq!(page.total, 4);
        let names: Vec<&str> = page.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["j4", "k3"]);
        let f = Filter::parse(&pairs("label=team%3Da&namespace=b")).unwrap();
        assert_eq!(select(all.clone(), &f).total, 2);
        let f = Filter::parse(&pairs("label=team%3Db")).unwrap();
        assert_eq!(select(all.clone(), &f).total, 0);
        let f = Filter::parse(&pairs("page=9")).unwrap();
        assert!(select(all, &f).rows.is_empty());
    }

    #[test]
    fn query_round_trips() {
        let f = Filter::parse(&pairs(
            "state=Running&label=a%3Db&sort=name&order=asc&page=3",
        ))
        .unwrap();
        assert_eq!(Filter::parse(&pairs(&f.query(|_| {}))).unwrap(), f);
        assert_eq!(f.query(|f| *f = Filter::default()), "");
    }
}
