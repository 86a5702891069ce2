//! The REST machinery end to end through the router (no network): CRUD,
//! status subresource, conflicts, watches, discovery.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use trainhub_apiserver::resource::ResourceDef;
use trainhub_apiserver::server::Server;
use trainhub_apiserver::store::RedbStore;

fn widgets() -> ResourceDef {
    ResourceDef {
        group: "example.com".into(),
        version: "v1".into(),
        kind: "Widget".into(),
        list_kind: "WidgetList".into(),
        plural: "widgets".into(),
        singular: "widget".into(),
        namespaced: true,
        status_subresource: true,
        schema: Some(json!({
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                "spec": {"type": "object", "properties": {"size": {"type": "integer"}, "suspend": {"type": "boolean"}}},
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
            },
        })),
        ..Default::default()
    }
}

struct Api {
    router: axum::Router,
    _dir: tempfile::TempDir,
}

fn api() -> Api {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(&dir.path().join("db"), 1000).unwrap());
    let server = Server::builder(store)
        .resource(widgets())
        .bookmark_interval(Duration::from_millis(50))
        .build();
    Api {
        router: server.router(),
        _dir: dir,
    }
}

const BASE: &str = "/apis/example.com/v1/namespaces/ns/widgets";

impl Api {
    async fn call(
        &self,
        method: &str,
        uri: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type)
            .body(body.map_or(Body::empty(), |b| Body::from(b.to_string())))
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
    async fn json(&self, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call(method, uri, "application/json", body).await
    }
}

fn widget(name: &str, size: i64) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "labels": {"app": "a"}}, "spec": {"size": size}})
}

#[tokio::test]
async fn create_get_update_with_optimistic_concurrency() {
    let api = api();
    let (code, created) = api.json("POST", BASE, Some(widget("w1", 1))).await;
    assert_eq!(code, StatusCode::CREATED, "{created}");
    let meta = &created["metadata"];
    assert_eq!(meta["namespace"], "ns");
    assert_eq!(meta["generation"], 1);
    assert!(meta["uid"].as_str().unwrap().len() == 36);
    assert!(meta["creationTimestamp"].as_str().unwrap().ends_with('Z'));
    let rv1 = meta["resourceVersion"].as_str().unwrap().to_string();

    let (code, again) = api.json("POST", BASE, Some(widget("w1", 1))).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert_eq!(again["reason"], "AlreadyExists");

    // Update with the current resourceVersion: generation moves on.
    let mut w = created.clone();
    w["spec"]["size"] = json!(2);
    let (code, updated) = api
        .json("PUT", &format!("{BASE}/w1"), Some(w.clone()))
        .await;
    assert_eq!(code, StatusCode::OK, "{updated}");
    assert_eq!(updated["metadata"]["generation"], 2);
    assert_ne!(
        updated["metadata"]["resourceVersion"].as_str().unwrap(),
        rv1
    );

    // The stale resourceVersion now conflicts.
    let (code, status) = api.json("PUT", &format!("{BASE}/w1"), Some(w)).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(status["kind"], "Status");

    // Status through the main resource is ignored; through /status it lands
    // and the generation stays.
    let mut s = updated.clone();
    s["status"] = json!({"phase": "Running"});
    let (code, after) = api
        .json("PUT", &format!("{BASE}/w1"), Some(s.clone()))
        .await;
    assert_eq!(code, StatusCode::OK);
    assert!(after.get("status").is_none());
    let (code, after) = api.json("PUT", &format!("{BASE}/w1/status"), Some(s)).await;
    assert_eq!(code, StatusCode::OK, "{after}");
    assert_eq!(after["status"]["phase"], "Running");
    assert_eq!(after["metadata"]["generation"], 2);

    let (code, got) = api.json("GET", &format!("{BASE}/w1"), None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(got, after);

    let (code, missing) = api.json("GET", &format!("{BASE}/nope"), None).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(missing["message"], "widgets.example.com \"nope\" not found");
}

#[tokio::test]
async fn list_has_kind_and_resource_version_and_pages() {
    let api = api();
    for i in 0..5 {
        api.json("POST", BASE, Some(widget(&format!("w{i}"), i)))
            .await;
    }
    let (code, list) = api.json("GET", BASE, None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(list["kind"], "WidgetList");
    assert_eq!(list["apiVersion"], "example.com/v1");
    assert_eq!(list["items"].as_array().unwrap().len(), 5);
    assert!(
        list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 5
    );

    let (_, page) = api.json("GET", &format!("{BASE}?limit=2"), None).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    assert_eq!(page["metadata"]["remainingItemCount"], 3);
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, page2) = api
        .json("GET", &format!("{BASE}?limit=2&continue={token}"), None)
        .await;
    assert_eq!(page2["items"][0]["metadata"]["name"], "w2");

    // With a selector the rest is not counted (kube-apiserver leaves
    // remainingItemCount out then); the pages still cover every match.
    let (_, selected) = api
        .json(
            "GET",
            &format!("{BASE}?limit=2&labelSelector=app%3Da"),
            None,
        )
        .await;
    assert_eq!(selected["items"].as_array().unwrap().len(), 2);
    assert!(
        selected["metadata"].get("remainingItemCount").is_none(),
        "{selected}"
    );
    let token = selected["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, rest) = api
        .json(
            "GET",
            &format!("{BASE}?limit=3&labelSelector=app%3Da&continue={token}"),
            None,
        )
        .await;
    let names: Vec<&str> = rest["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["w2", "w3", "w4"]);
    assert!(rest["metadata"].get("continue").is_none(), "{rest}");
}

#[tokio::test]
async fn unknown_fields_warn_or_fail_strictly() {
    let api = api();
    let mut w = widget("w", 1);
    w["spec"]["colour"] = json!("red");
    let (code, status) = api
        .json(
            "POST",
            &format!("{BASE}?fieldValidation=Strict"),
            Some(w.clone()),
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(
        status["message"],
        "strict decoding error: unknown field \"spec.colour\""
    );
    let (code, created) = api.json("POST", BASE, Some(w)).await;
    assert_eq!(code, StatusCode::CREATED);
    assert!(created["spec"].get("colour").is_none());
}

#[tokio::test]
async fn bad_requests_name_the_problem() {
    let api = api();
    let mut w = widget("Bad_Name", 1);
    let (code, status) = api.json("POST", BASE, Some(w.clone())).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(status["details"]["causes"][0]["field"], "metadata.name");
    w["kind"] = json!("Gadget");
    let (code, _) = api.json("POST", BASE, Some(w)).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let (code, _) = api.call("POST", BASE, "application/json", None).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let (code, status) = api
        .json("GET", "/apis/example.com/v1/namespaces/ns/gadgets", None)
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(status["kind"], "Status");
}

#[tokio::test]
async fn merge_patch_and_finalizers_delay_deletion() {
    let api = api();
    let mut w = widget("w", 1);
    w["metadata"]["finalizers"] = json!(["example.com/cleanup"]);
    api.json("POST", BASE, Some(w)).await;
    let (code, patched) = api
        .call(
            "PATCH",
            &format!("{BASE}/w"),
            "application/merge-patch+json",
            Some(json!({"spec": {"size": 7}})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{patched}");
    assert_eq!(patched["spec"]["size"], 7);

    let (code, marked) = api.json("DELETE", &format!("{BASE}/w"), None).await;
    assert_eq!(code, StatusCode::OK);
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    let (code, _) = api.json("GET", &format!("{BASE}/w"), None).await;
    assert_eq!(code, StatusCode::OK);
    // Removing the last finalizer deletes it.
    let (code, _) = api
        .call(
            "PATCH",
            &format!("{BASE}/w"),
            "application/merge-patch+json",
            Some(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    let (code, _) = api.json("GET", &format!("{BASE}/w"), None).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

/// Reads watch events until `n` arrived.
async fn watch_events(api: &Api, uri: &str, n: usize) -> Vec<Value> {
    let req = Request::builder().uri(uri).body(Body::empty()).unwrap();
    let resp = api.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut events = Vec::new();
    while events.len() < n {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("watch event in time");
        let Some(Ok(frame)) = frame else { break };
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            events.push(serde_json::from_slice(&line).unwrap());
        }
    }
    events
}

#[tokio::test]
async fn watch_replays_from_a_version_follows_and_filters() {
    let api = api();
    let (_, a) = api.json("POST", BASE, Some(widget("a", 1))).await;
    let rv = a["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut b = widget("b", 2);
    b["metadata"]["labels"]["app"] = json!("other");
    api.json("POST", BASE, Some(b)).await;

    // From the start: both as ADDED.
    let uri = format!("{BASE}?watch=1");
    let events = watch_events(&api, &uri, 2).await;
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["object"]["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert!(events.iter().all(|e| e["type"] == "ADDED"));

    // From a's version with a selector: b is filtered out; a later change of
    // a arrives live, as MODIFIED: a client resuming from a's version knows a.
    let uri = format!("{BASE}?watch=true&resourceVersion={rv}&labelSelector=app%3Da");
    let router = api.router.clone();
    let patcher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let req = Request::builder()
            .method("PATCH")
            .uri(format!("{BASE}/a"))
            .header("content-type", "application/merge-patch+json")
            .body(Body::from(json!({"spec": {"size": 9}}).to_string()))
            .unwrap();
        router.oneshot(req).await.unwrap().status()
    });
    let events = watch_events(&api, &uri, 1).await;
    assert_eq!(events[0]["type"], "MODIFIED");
    assert_eq!(events[0]["object"]["spec"]["size"], 9);
    assert_eq!(patcher.await.unwrap(), StatusCode::OK);
}

#[tokio::test]
async fn watch_from_a_compacted_version_is_410() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(&dir.path().join("db"), 2).unwrap());
    let server = Server::builder(store).resource(widgets()).build();
    let api = Api {
        router: server.router(),
        _dir: dir,
    };
    for i in 0..5 {
        api.json("POST", BASE, Some(widget(&format!("w{i}"), i)))
            .await;
    }
    let events = watch_events(&api, &format!("{BASE}?watch=1&resourceVersion=1"), 1).await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
}

#[tokio::test]
async fn bookmarks_carry_the_latest_version() {
    let api = api();
    api.json("POST", BASE, Some(widget("a", 1))).await;
    let events = watch_events(&api, &format!("{BASE}?watch=1&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"), 3).await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[1]["type"], "BOOKMARK");
    assert_eq!(
        events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(events[2]["type"], "BOOKMARK");
}

#[tokio::test]
async fn discovery_lists_groups_and_resources() {
    let api = api();
    let (code, groups) = api.json("GET", "/apis", None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(groups["groups"][0]["name"], "example.com");
    assert_eq!(
        groups["groups"][0]["preferredVersion"]["groupVersion"],
        "example.com/v1"
    );
    let (_, list) = api.json("GET", "/apis/example.com/v1", None).await;
    let names: Vec<&str> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["widgets", "widgets/status"]);
    let (_, index) = api.json("GET", "/openapi/v3", None).await;
    let url = index["paths"]["apis/example.com/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, doc) = api.json("GET", &url, None).await;
    assert_eq!(code, StatusCode::OK);
    let patch =
        &doc["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]["patch"];
    assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Widget");
    assert!(
        patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation")
    );
}

/// A watch of every widget (for at most 20 s), opened.
async fn open_watch(api: &Api) -> axum::response::Response {
    let watch = api
        .router
        .clone()
        .oneshot(
            Request::get(format!("{BASE}?watch=true&timeoutSeconds=20"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(watch.status(), StatusCode::OK);
    watch
}

/// Creates `big`, a widget of 200 KB (an annotation), and patches it until
/// `versions` versions of it were written.
async fn write_versions_of_a_large_widget(api: &Api, versions: usize) {
    let mut big = widget("big", 1);
    big["metadata"]["annotations"] = json!({"pad": "p".repeat(200_000), "n": "0"});
    let (status, _) = api.json("POST", BASE, Some(big)).await;
    assert_eq!(status, StatusCode::CREATED);
    for n in 1..versions {
        let patch = json!({"metadata": {"annotations": {"n": n.to_string()}}});
        let (status, _) = api
            .call(
                "PATCH",
                &format!("{BASE}/big"),
                "application/merge-patch+json",
                Some(patch),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    }
}

/// The lines of a watch's response, read to its end; fails if it has not
/// ended within 10 s.
async fn lines_until_the_end(watch: axum::response::Response) -> usize {
    let mut body = watch.into_body();
    let mut bytes = Vec::new();
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .unwrap_or_else(|_| panic!("the watch did not end: {} bytes read", bytes.len()))
    {
        if let Ok(data) = frame.unwrap().into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count()
}

#[tokio::test]
async fn a_watch_whose_client_reads_nothing_holds_a_bounded_number_of_bytes_then_ends() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(&dir.path().join("db"), 1000).unwrap());
    let server = Server::builder(store)
        .resource(widgets())
        .watch_send_timeout(Duration::from_millis(300))
        .build();
    let api = Api {
        router: server.router(),
        _dir: dir,
    };
    let watch = open_watch(&api).await;
    // 20 versions of an object of 200 KB (an annotation), none read: more
    // than the watch's queue takes by bytes (1 MiB), fewer than by count.
    write_versions_of_a_large_widget(&api, 20).await;
    // The watch could not queue the rest within its send timeout: it ended
    // with what its queue held, well before its own timeout. (Waited ten
    // times the send timeout, so a slow machine still sees it end first.)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let events = lines_until_the_end(watch).await;
    assert!(
        (1..=7).contains(&events),
        "{events} events were queued for a client that read nothing (1 MiB of 200 KB each, plus one)"
    );
}

#[tokio::test]
async fn a_users_unread_watches_hold_no_more_than_the_users_budget_together() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(&dir.path().join("db"), 1000).unwrap());
    let server = Server::builder(store)
        .resource(widgets())
        .watch_send_timeout(Duration::from_millis(300))
        .request_limits(trainhub_apiserver::server::RequestLimits {
            max_watch_bytes_per_user: 600_000,
            ..Default::default()
        })
        .build();
    let api = Api {
        router: server.router(),
        _dir: dir,
    };
    // Two watches of one user, neither read; ten versions of an object of
    // 200 KB: each watch's own queue (1 MiB) would take five of them.
    let watches = [open_watch(&api).await, open_watch(&api).await];
    write_versions_of_a_large_widget(&api, 10).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Both ended (they could not queue within their send timeout), having
    // queued together what the user's 600 KB hold: three events.
    let mut events = 0;
    for watch in watches {
        events += lines_until_the_end(watch).await;
    }
    assert!(
        (1..=3).contains(&events),
        "the user's two watches queued {events} events of 200 KB with a budget of 600 KB"
    );
    // Their bytes are the user's again: a new watch gets the object.
    let watch = open_watch(&api).await;
    let mut body = watch.into_body();
    let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the new watch sent nothing")
        .unwrap()
        .unwrap();
    let data = frame.into_data().unwrap();
    assert!(data.starts_with(b"{\"type\":\"ADDED\""), "{data:?}");
}

#[tokio::test]
async fn watches_past_the_per_user_cap_are_429_until_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(&dir.path().join("db"), 1000).unwrap());
    let server = Server::builder(store)
        .resource(widgets())
        .request_limits(trainhub_apiserver::server::RequestLimits {
            max_long_running_per_user: 2,
            ..Default::default()
        })
        .build();
    let router = server.router();
    let watch = || {
        Request::get(format!("{BASE}?watch=true"))
            .body(Body::empty())
            .unwrap()
    };
    let first = router.clone().oneshot(watch()).await.unwrap();
    let second = router.clone().oneshot(watch()).await.unwrap();
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let refused = router.clone().oneshot(watch()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    let bytes = refused.into_body().collect().await.unwrap().to_bytes();
    let status: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status["reason"], "TooManyRequests");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("2 watches and log streams open"),
        "{status}"
    );
    // Other requests of the same user still pass.
    let list = router
        .clone()
        .oneshot(Request::get(BASE).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(list.status(), StatusCode::OK);
    // A watch that ends gives its slot back.
    drop(first);
    let again = router.clone().oneshot(watch()).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    drop(second);
}

#[tokio::test]
async fn a_body_nested_past_the_limit_is_422_naming_the_path() {
    let api = api();
    let nested = |levels: usize| -> Value {
        let mut v = json!(1);
        for _ in 0..levels {
            v = json!([v]);
        }
        v
    };
    let mut deep = widget("deep", 1);
    deep["metadata"]["x"] = nested(101);
    let (code, status) = api.call("POST", BASE, "application/json", Some(deep)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
    assert_eq!(status["reason"], "Invalid");
    assert!(
        status["details"]["causes"][0]["field"]
            .as_str()
            .unwrap()
            .starts_with("metadata.x[0][0]"),
        "{status}"
    );
    // At the limit, it is accepted.
    let mut at_limit = widget("at-limit", 1);
    at_limit["metadata"]["x"] = nested(98);
    let (code, status) = api
        .call("POST", BASE, "application/json", Some(at_limit))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{status}");
}

// Namespaces, names, paging, reviews and /version.

use trainhub_apiserver::auth::{Authenticator, Policy, PolicyAuthorizer, TokenFile};
use trainhub_apiserver::namespace;
use trainhub_apiserver::quota;
use trainhub_apiserver::review;
use trainhub_apiserver::store::{Key, Op, Store};

/// A server like the hub's: namespaces with their lifecycle, reviews, a
/// tokens file (`admin`, and `alice` granted `team-a`).
struct Hub {
    server: Arc<Server>,
    store: Arc<RedbStore>,
    router: axum::Router,
    _dir: tempfile::TempDir,
}

const ADMIN: &str = "admin-token";
const ALICE: &str = "alice-token";

fn hub() -> Hub {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(&dir.path().join("db"), 1000).unwrap());
    let tokens = TokenFile::parse(
        "admin-token,admin,1,\"system:masters\"\nalice-token,alice,2,\"team-a\"\n",
        "tokens",
    )
    .unwrap();
    let policy: Policy = "namespaces:\n  - namespace: team-a\n    groups: [team-a]\n"
        .parse()
        .unwrap();
    let mut builder = Server::builder(store.clone())
        .resource(widgets())
        .resource(namespace::resource_def())
        .resource(quota::resource_def())
        .authenticator(Arc::new(Authenticator::new(Some(tokens), false)))
        .authorizer(Arc::new(PolicyAuthorizer::new(policy)))
        .namespace_lifecycle(true);
    for def in review::resource_defs() {
        builder = builder.resource(def);
    }
    let server = builder.build();
    Hub {
        router: server.router(),
        server,
        store,
        _dir: dir,
    }
}

impl Hub {
    async fn call(
        &self,
        token: &str,
        method: &str,
        uri: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type)
            .header("authorization", format!("Bearer {token}"))
            .body(body.map_or(Body::empty(), |b| Body::from(b.to_string())))
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
    async fn json(
        &self,
        token: &str,
        method: &str,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call(token, method, uri, "application/json", body)
            .await
    }
    async fn create_namespace(&self, name: &str) -> (StatusCode, Value) {
        self.json(
            ADMIN,
            "POST",
            "/api/v1/namespaces",
            Some(namespace::object(name)),
        )
        .await
    }
}

fn widgets_in(ns: &str) -> String {
    format!("/apis/example.com/v1/namespaces/{ns}/widgets")
}

/// Polls `check` every 10 ms until it holds; fails after 10 s.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn paging_returns_every_object_once_in_store_order() {
    let api = api();
    // Names and namespaces where "ns/name" order and (namespace, name)
    // order disagree: "a" / "a-b" / "a.b" / "a0", long common prefixes.
    let long = "x".repeat(200);
    let namespaces = ["a", "a-b", "a-0", "a0", "ab", "b"];
    let names = [
        "a".to_string(),
        "a-b".into(),
        "a.b".into(),
        "a0".into(),
        "a-b-c".into(),
        "a-0".into(),
        long.clone(),
        format!("{long}-1"),
        format!("{long}.1"),
        format!("{long}1"),
    ];
    let mut expected = Vec::new();
    for ns in namespaces {
        for name in &names {
            let (code, body) = api
                .json(
                    "POST",
                    &format!("/apis/example.com/v1/namespaces/{ns}/widgets"),
                    Some(widget(name, 1)),
                )
                .await;
            assert_eq!(code, StatusCode::CREATED, "{body}");
            expected.push((ns.to_string(), name.clone()));
        }
    }
    expected.sort();
    let key = |item: &Value| {
        (
            item["metadata"]["namespace"].as_str().unwrap().to_string(),
            item["metadata"]["name"].as_str().unwrap().to_string(),
        )
    };
    let (_, all) = api.json("GET", "/apis/example.com/v1/widgets", None).await;
    let unpaged: Vec<_> = all["items"].as_array().unwrap().iter().map(key).collect();
    assert_eq!(unpaged, expected);
    for limit in [1, 2, 3, 7, 59] {
        let mut seen = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let uri = match &token {
                Some(t) => format!("/apis/example.com/v1/widgets?limit={limit}&continue={t}"),
                None => format!("/apis/example.com/v1/widgets?limit={limit}"),
            };
            let (code, page) = api.json("GET", &uri, None).await;
            assert_eq!(code, StatusCode::OK, "{page}");
            let items = page["items"].as_array().unwrap();
            assert!(items.len() <= limit);
            seen.extend(items.iter().map(key));
            match page["metadata"]["continue"].as_str() {
                Some(t) => {
                    assert_eq!(
                        page["metadata"]["remainingItemCount"],
                        expected.len() - seen.len()
                    );
                    token = Some(t.to_string());
                }
                None => break,
            }
            assert!(
                seen.len() <= expected.len(),
                "limit {limit}: pages repeat objects"
            );
        }
        assert_eq!(seen, expected, "limit {limit}");
    }
    // One namespace pages the same way.
    let (_, page) = api
        .json(
            "GET",
            "/apis/example.com/v1/namespaces/a-b/widgets?limit=4",
            None,
        )
        .await;
    let t = page["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, rest) = api
        .json(
            "GET",
            &format!("/apis/example.com/v1/namespaces/a-b/widgets?limit=100&continue={t}"),
            None,
        )
        .await;
    assert_eq!(
        page["items"].as_array().unwrap().len() + rest["items"].as_array().unwrap().len(),
        names.len()
    );
    assert!(rest["metadata"].get("continue").is_none());
}

#[tokio::test]
async fn names_and_namespaces_are_validated_as_kubernetes_does() {
    let api = api();
    for bad in ["a|b", "A_b", "a_b", "-a", "a..b"] {
        let (code, status) = api.json("POST", BASE, Some(widget(bad, 1))).await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {status}");
        assert_eq!(
            status["message"],
            format!(
                "Widget.example.com \"{bad}\" is invalid: metadata.name: Invalid value: \"{bad}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            )
        );
    }
    // An object's namespace is a DNS-1123 label: `|` and `.` are refused.
    for bad_ns in ["team%7Ca", "a.b"] {
        let (code, status) = api
            .json("POST", &widgets_in(bad_ns), Some(widget("w", 1)))
            .await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
        assert_eq!(
            status["details"]["causes"][0]["field"],
            "metadata.namespace"
        );
    }
    let (code, _) = api
        .json("POST", BASE, Some(widget(&"a".repeat(254), 1)))
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
}

/// Labels and annotations are checked on every write, create, update and
/// patch alike, with kube-apiserver's messages; nothing is stored.
#[tokio::test]
async fn labels_and_annotations_are_validated_on_every_write() {
    let api = api();
    let mut bad = widget("w", 1);
    bad["metadata"]["labels"] = json!({"bad key": "x"});
    let (code, status) = api.json("POST", BASE, Some(bad)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["details"]["causes"][0]["field"], "metadata.labels");
    assert!(
        status["message"].as_str().unwrap().starts_with(
            "Widget.example.com \"w\" is invalid: metadata.labels: Invalid value: \"bad key\": name part must consist of"
        ),
        "{status}"
    );
    let (code, _) = api.json("GET", &format!("{BASE}/w"), None).await;
    assert_eq!(code, StatusCode::NOT_FOUND, "nothing stored");

    let (code, created) = api.json("POST", BASE, Some(widget("w", 1))).await;
    assert_eq!(code, StatusCode::CREATED, "{created}");
    let mut update = created.clone();
    update["metadata"]["annotations"] = json!({"big": "x".repeat(256 * 1024)});
    let (code, status) = api.json("PUT", &format!("{BASE}/w"), Some(update)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "FieldValueTooLong"
    );
    assert_eq!(
        status["details"]["causes"][0]["message"],
        "Too long: may not be more than 262144 bytes"
    );
    let (code, status) = api
        .call(
            "PATCH",
            &format!("{BASE}/w"),
            "application/merge-patch+json",
            Some(json!({"metadata": {"labels": {"app": "not a label value"}}})),
        )
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
    let (_, kept) = api.json("GET", &format!("{BASE}/w"), None).await;
    assert_eq!(kept["metadata"]["labels"], json!({"app": "a"}));
    assert!(kept["metadata"].get("annotations").is_none());
}

#[tokio::test]
async fn namespaces_have_kube_apiservers_lifecycle() {
    let hub = hub();
    let (code, ns) = hub.create_namespace("team-a").await;
    assert_eq!(code, StatusCode::CREATED, "{ns}");
    assert_eq!(ns["status"]["phase"], "Active");
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
    assert_eq!(
        ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "team-a"
    );
    for bad in ["team|a", "Team", "a.b"] {
        let (code, status) = hub.create_namespace(bad).await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("a lowercase RFC 1123 label must consist of"),
            "{status}"
        );
    }

    // Objects only in namespaces that exist, as NamespaceLifecycle answers.
    let (code, status) = hub
        .json(ADMIN, "POST", &widgets_in("nope"), Some(widget("w", 1)))
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{status}");
    assert_eq!(status["message"], "namespaces \"nope\" not found");
    assert_eq!(status["reason"], "NotFound");
    assert_eq!(
        status["details"],
        json!({"name": "nope", "kind": "namespaces"})
    );
    let (code, _) = hub
        .json(
            ADMIN,
            "POST",
            &widgets_in("team-a"),
            Some(widget("plain", 1)),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED);
    let mut held = widget("held", 1);
    held["metadata"]["finalizers"] = json!(["example.com/cleanup"]);
    let (code, _) = hub
        .json(ADMIN, "POST", &widgets_in("team-a"), Some(held))
        .await;
    assert_eq!(code, StatusCode::CREATED);

    // Labels change; spec and status do not through the main resource.
    let (code, labelled) = hub
        .call(
            ADMIN,
            "PATCH",
            "/api/v1/namespaces/team-a",
            "application/merge-patch+json",
            Some(json!({"metadata": {"labels": {"tier": "gold"}}, "spec": {"finalizers": []}})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{labelled}");
    assert_eq!(labelled["metadata"]["labels"]["tier"], "gold");
    assert_eq!(labelled["spec"]["finalizers"], json!(["kubernetes"]));

    // Deleted: Terminating, and no new content.
    let (code, deleting) = hub
        .json(ADMIN, "DELETE", "/api/v1/namespaces/team-a", None)
        .await;
    assert_eq!(code, StatusCode::OK, "{deleting}");
    assert_eq!(deleting["status"]["phase"], "Terminating");
    let (code, status) = hub
        .json(
            ADMIN,
            "POST",
            &widgets_in("team-a"),
            Some(widget("late", 1)),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{status}");
    assert_eq!(
        status["message"],
        "widgets.example.com \"late\" is forbidden: unable to create new content in namespace team-a because it is being terminated"
    );
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "NamespaceTerminating"
    );
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "metadata.namespace"
    );

    // The controller empties it, finalizers respected, then removes it.
    let controller = tokio::spawn(
        hub.server
            .clone()
            .run_namespace_controller(std::future::pending()),
    );
    let get = |name: &'static str| {
        let hub = &hub;
        async move {
            hub.json(
                ADMIN,
                "GET",
                &format!("{}/{name}", widgets_in("team-a")),
                None,
            )
            .await
        }
    };
    eventually("plain deleted", async || {
        get("plain").await.0 == StatusCode::NOT_FOUND
    })
    .await;
    eventually("held marked", async || {
        get("held").await.1["metadata"]["deletionTimestamp"].is_string()
    })
    .await;
    let (code, ns) = hub
        .json(ADMIN, "GET", "/api/v1/namespaces/team-a", None)
        .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(ns["status"]["phase"], "Terminating");
    let (code, _) = hub
        .call(
            ADMIN,
            "PATCH",
            &format!("{}/held", widgets_in("team-a")),
            "application/merge-patch+json",
            Some(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    eventually("namespace removed", async || {
        hub.json(ADMIN, "GET", "/api/v1/namespaces/team-a", None)
            .await
            .0
            == StatusCode::NOT_FOUND
    })
    .await;
    controller.abort();

    // `default` stays.
    hub.create_namespace("default").await;
    let (code, status) = hub
        .json(ADMIN, "DELETE", "/api/v1/namespaces/default", None)
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert_eq!(
        status["message"],
        "namespaces \"default\" is forbidden: this namespace may not be deleted"
    );
}

#[tokio::test]
async fn namespaces_in_use_are_created_at_start() {
    let hub = hub();
    // A store written before namespaces were served.
    hub.store
        .commit(vec![Op::Create {
            key: Key::new("example.com/widgets", Some("legacy"), "w"),
            value: json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "legacy"}}),
        }])
        .await
        .unwrap();
    let created = hub.server.ensure_namespaces(&["default"]).await.unwrap();
    assert_eq!(created, ["default", "legacy"]);
    assert!(
        hub.server
            .ensure_namespaces(&["default"])
            .await
            .unwrap()
            .is_empty()
    );
    let (code, legacy) = hub
        .json(ADMIN, "GET", "/api/v1/namespaces/legacy", None)
        .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(legacy["status"]["phase"], "Active");
}

#[tokio::test]
async fn tenants_see_and_review_only_what_the_policy_grants() {
    let hub = hub();
    for ns in ["team-a", "team-b"] {
        assert_eq!(hub.create_namespace(ns).await.0, StatusCode::CREATED);
    }
    let names = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, all) = hub.json(ADMIN, "GET", "/api/v1/namespaces", None).await;
    assert_eq!(names(&all), ["team-a", "team-b"]);
    let (code, mine) = hub.json(ALICE, "GET", "/api/v1/namespaces", None).await;
    assert_eq!(code, StatusCode::OK, "{mine}");
    assert_eq!(names(&mine), ["team-a"]);
    assert_eq!(
        hub.json(ALICE, "GET", "/api/v1/namespaces/team-a", None)
            .await
            .0,
        StatusCode::OK
    );
    let (code, status) = hub
        .json(ALICE, "GET", "/api/v1/namespaces/team-b", None)
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{status}");
    let (code, status) = hub
        .json(
            ALICE,
            "POST",
            "/api/v1/namespaces",
            Some(namespace::object("mine")),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{status}");
    assert_eq!(
        status["message"],
        "namespaces is forbidden: User \"alice\" cannot create resource \"namespaces\" in API group \"\" at the cluster scope"
    );
    let (code, _) = hub
        .json(ALICE, "DELETE", "/api/v1/namespaces/team-a", None)
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);

    // A watch shows the granted namespace only.
    let req = Request::builder()
        .uri("/api/v1/namespaces?watch=1&timeoutSeconds=1")
        .header("authorization", format!("Bearer {ALICE}"))
        .body(Body::empty())
        .unwrap();
    let resp = hub.router.clone().oneshot(req).await.unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let events: Vec<Value> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["object"]["metadata"]["name"], "team-a");

    // kubectl auth can-i / whoami.
    let can_i = |ns: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": ns, "verb": "create", "group": "example.com", "resource": "widgets"}}})
    };
    let uri = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    let (code, answer) = hub.json(ALICE, "POST", uri, Some(can_i("team-b"))).await;
    assert_eq!(code, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["status"]["allowed"], false);
    let (_, answer) = hub.json(ADMIN, "POST", uri, Some(can_i("team-b"))).await;
    assert_eq!(answer["status"]["allowed"], true);
    // Reviews are created, never listed.
    let (code, _) = hub.json(ALICE, "GET", uri, None).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let (code, _) = hub.json(ADMIN, "GET", uri, None).await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    let (code, me) = hub
        .json(
            ALICE,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{me}");
    assert_eq!(me["status"]["userInfo"]["username"], "alice");
    assert_eq!(
        me["status"]["userInfo"]["groups"],
        json!(["team-a", "system:authenticated"])
    );
    let (_, discovery) = hub
        .json(ALICE, "GET", "/apis/authorization.k8s.io/v1", None)
        .await;
    assert_eq!(discovery["resources"][0]["verbs"], json!(["create"]));
}

#[tokio::test]
async fn version_is_a_kubernetes_level_with_trainhubs_version() {
    let api = api();
    let (code, v) = api.json("GET", "/version", None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        (v["major"].as_str(), v["minor"].as_str()),
        (Some("1"), Some("33"))
    );
    assert_eq!(
        v["gitVersion"],
        format!("v1.33.0+trainhub-{}", env!("CARGO_PKG_VERSION"))
    );
}

/// kube-apiserver's paged list on etcd: every continue page is read at the
/// first page's resourceVersion, and once that is compacted the token is
/// refused with 410 Expired and kube-apiserver's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_pages_are_consistent_at_the_first_pages_version_on_etcd() {
    use trainhub_apiserver::store::etcd::{CONTINUE_EXPIRED, EtcdConfig, EtcdStore, LocalEtcd};
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = LocalEtcd::start_or_skip(1, dir.path()).unwrap() else {
        return;
    };
    let config = EtcdConfig {
        endpoints: etcd.endpoints(),
        prefix: "/api/".into(),
        ..EtcdConfig::default()
    };
    let store = EtcdStore::open(&config, 1000).await.unwrap();
    let server = Server::builder(store.clone()).resource(widgets()).build();
    let api = Api {
        router: server.router(),
        _dir: tempfile::tempdir().unwrap(),
    };
    for i in 0..5 {
        let (code, body) = api
            .json("POST", BASE, Some(widget(&format!("w{i}"), i)))
            .await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
    }
    let (_, page) = api.json("GET", &format!("{BASE}?limit=2"), None).await;
    let rv = page["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    // Changes after the first page stay out of the pages after it.
    let (code, _) = api.json("DELETE", &format!("{BASE}/w2"), None).await;
    assert_eq!(code, StatusCode::OK);
    let (code, _) = api.json("POST", BASE, Some(widget("w5", 5))).await;
    assert_eq!(code, StatusCode::CREATED);
    let (code, rest) = api
        .json("GET", &format!("{BASE}?limit=10&continue={token}"), None)
        .await;
    assert_eq!(code, StatusCode::OK, "{rest}");
    let names: Vec<_> = rest["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["w2", "w3", "w4"]);
    assert_eq!(rest["metadata"]["resourceVersion"], rv.as_str());

    store.compact(store.revision()).await.unwrap();
    let (code, status) = api
        .json("GET", &format!("{BASE}?limit=10&continue={token}"), None)
        .await;
    assert_eq!(code, StatusCode::GONE, "{status}");
    assert_eq!(status["reason"], "Expired");
    assert_eq!(status["message"], CONTINUE_EXPIRED);
}

/// A store whose first `races` commits of an update to a widget are each
/// beaten by another writer's update of the same widget (its label
/// `raced` counts them), as when a controller writes between a patch's
/// read and its commit.
struct Racing {
    inner: Arc<RedbStore>,
    races: std::sync::atomic::AtomicUsize,
}

impl trainhub_apiserver::store::Store for Racing {
    trainhub_apiserver::forward_store_reads!(inner);

    fn commit(
        &self,
        ops: Vec<trainhub_apiserver::store::Op>,
    ) -> trainhub_apiserver::store::CommitFuture<'_> {
        use std::sync::atomic::Ordering;
        use trainhub_apiserver::store::Op;
        Box::pin(async move {
            if let [Op::Update { key, .. }] = ops.as_slice()
                && self
                    .races
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                && let Some(current) = self.inner.get(key)
            {
                let mut value = current.value.as_ref().clone();
                let raced = value["metadata"]["labels"]["raced"]
                    .as_str()
                    .map_or(0, |n| n.parse::<u32>().unwrap());
                value["metadata"]["labels"]["raced"] = json!((raced + 1).to_string());
                self.inner
                    .commit(vec![Op::Update {
                        key: key.clone(),
                        value,
                        expected: Some(current.rv),
                    }])
                    .await
                    .unwrap();
            }
            self.inner.commit(ops).await
        })
    }
    fn fenced(
        self: Arc<Self>,
        _term: trainhub_apiserver::store::Term,
    ) -> Arc<dyn trainhub_apiserver::store::Store> {
        self
    }
}

/// A patch without a resourceVersion is applied again to the newest object
/// when another write lands between its read and its commit (as
/// kube-apiserver does), and keeps the other writer's change; one that
/// names a resourceVersion is refused with 409; a patch beaten at every
/// attempt ends in 409 too.
#[tokio::test]
async fn a_patch_beaten_by_another_write_is_applied_again_unless_preconditioned() {
    let dir = tempfile::tempdir().unwrap();
    let racing = Arc::new(Racing {
        inner: Arc::new(RedbStore::open(&dir.path().join("db"), 1000).unwrap()),
        races: std::sync::atomic::AtomicUsize::new(0),
    });
    let server = Server::builder(racing.clone()).resource(widgets()).build();
    let api = Api {
        router: server.router(),
        _dir: dir,
    };
    let (code, _) = api.json("POST", BASE, Some(widget("w", 1))).await;
    assert_eq!(code, StatusCode::CREATED);
    let set = |races: usize| {
        racing
            .races
            .store(races, std::sync::atomic::Ordering::SeqCst);
    };

    set(2);
    let (code, patched) = api
        .call(
            "PATCH",
            &format!("{BASE}/w"),
            "application/merge-patch+json",
            Some(json!({"spec": {"size": 7}})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{patched}");
    assert_eq!(patched["spec"]["size"], 7);
    assert_eq!(patched["metadata"]["labels"]["raced"], "2", "{patched}");

    set(1);
    let rv = patched["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, refused) = api
        .call(
            "PATCH",
            &format!("{BASE}/w"),
            "application/merge-patch+json",
            Some(json!({"metadata": {"resourceVersion": rv}, "spec": {"size": 8}})),
        )
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["reason"], "Conflict");

    set(100);
    let (code, refused) = api
        .call(
            "PATCH",
            &format!("{BASE}/w"),
            "application/merge-patch+json",
            Some(json!({"spec": {"size": 9}})),
        )
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{refused}");
    set(0);
    let (_, current) = api.json("GET", &format!("{BASE}/w"), None).await;
    assert_eq!(current["spec"]["size"], 7, "{current}");
}

const WIDGET_COUNT: &str = "count/widgets.example.com";

fn quota_of(hard: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "objects"}, "spec": {"hard": hard}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quota_bounds_a_namespaces_objects_even_under_concurrent_creates() {
    let hub = hub();
    let controller = tokio::spawn(
        hub.server
            .clone()
            .run_quota_controller(std::future::pending()),
    );
    assert_eq!(hub.create_namespace("team-a").await.0, StatusCode::CREATED);
    let quotas = "/api/v1/namespaces/team-a/resourcequotas";
    // Before any quota, creates are free.
    let (code, body) = hub
        .json(
            ADMIN,
            "POST",
            &widgets_in("team-a"),
            Some(widget("before", 1)),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");

    // What a quota may count, refused by field and rule; and only admins
    // may set one.
    let (code, status) = hub
        .json(
            ADMIN,
            "POST",
            quotas,
            Some(quota_of(
                json!({"requests.cpu": "4", WIDGET_COUNT: "-1", "count/pods": "2"}),
            )),
        )
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
    let causes: Vec<String> = status["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{}: {}",
                c["field"].as_str().unwrap(),
                c["message"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(causes.len(), 3, "{causes:#?}");
    assert!(causes.contains(&format!("spec.hard[{WIDGET_COUNT}]: Invalid value: \"-1\": must be a whole, non-negative number of objects, such as 10 or 1k")), "{causes:#?}");
    assert!(
        causes.iter().any(|c| c.starts_with(
            "spec.hard: Invalid value: \"requests.cpu\": the hub's quotas count objects"
        )),
        "{causes:#?}"
    );
    let (code, _) = hub
        .json(
            ALICE,
            "POST",
            quotas,
            Some(quota_of(json!({WIDGET_COUNT: "1000"}))),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);

    // Five widgets in all: one exists, the controller counts it.
    let (code, body) = hub
        .json(
            ADMIN,
            "POST",
            quotas,
            Some(quota_of(json!({WIDGET_COUNT: 5}))),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["spec"]["hard"][WIDGET_COUNT], "5",
        "a number is stored as a quantity"
    );
    eventually("the quota counted", async || {
        let (_, q) = hub
            .json(ALICE, "GET", &format!("{quotas}/objects"), None)
            .await;
        q["status"] == json!({"hard": {WIDGET_COUNT: "5"}, "used": {WIDGET_COUNT: "1"}})
    })
    .await;

    // Sixteen creates at once on four threads, through two servers over
    // the one store (replicas, which do not take turns with each other):
    // exactly four more fit.
    let replica = Server::builder(hub.store.clone())
        .resource(widgets())
        .resource(namespace::resource_def())
        .resource(quota::resource_def())
        .namespace_lifecycle(true)
        .build()
        .router();
    let mut creates = Vec::new();
    for i in 0..16 {
        let router = if i % 2 == 0 {
            hub.router.clone()
        } else {
            replica.clone()
        };
        creates.push(tokio::spawn(async move {
            let req = Request::builder()
                .method("POST")
                .uri(widgets_in("team-a"))
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {ADMIN}"))
                .body(Body::from(widget(&format!("w{i}"), 1).to_string()))
                .unwrap();
            let resp = router.oneshot(req).await.unwrap();
            let code = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (
                code,
                serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            )
        }));
    }
    let mut created = 0;
    for create in creates {
        let (code, body) = create.await.unwrap();
        match code {
            StatusCode::CREATED => created += 1,
            StatusCode::FORBIDDEN => assert!(
                body["message"].as_str().unwrap().contains(&format!(
                    "is forbidden: exceeded quota: objects, requested: {WIDGET_COUNT}=1, used: {WIDGET_COUNT}=5, limited: {WIDGET_COUNT}=5"
                )),
                "{body}"
            ),
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(created, 4);
    let (_, list) = hub.json(ADMIN, "GET", &widgets_in("team-a"), None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 5);
    // A dry run is checked too.
    let (code, _) = hub
        .json(
            ADMIN,
            "POST",
            &format!("{}?dryRun=All", widgets_in("team-a")),
            Some(widget("dry", 1)),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    // Another namespace is not this quota's business.
    assert_eq!(hub.create_namespace("team-b").await.0, StatusCode::CREATED);
    let (code, _) = hub
        .json(
            ADMIN,
            "POST",
            &widgets_in("team-b"),
            Some(widget("elsewhere", 1)),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED);

    // A deletion is counted back, and makes room for one more.
    let (code, _) = hub
        .json(
            ADMIN,
            "DELETE",
            &format!("{}/before", widgets_in("team-a")),
            None,
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    eventually("the deletion counted", async || {
        let (_, q) = hub
            .json(ALICE, "GET", &format!("{quotas}/objects"), None)
            .await;
        q["status"]["used"][WIDGET_COUNT] == "4"
    })
    .await;
    let (code, body) = hub
        .json(
            ADMIN,
            "POST",
            &widgets_in("team-a"),
            Some(widget("after", 1)),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");

    // A lowered limit holds at once for creates; what exists stays.
    let (code, body) = hub
        .call(
            ADMIN,
            "PATCH",
            &format!("{quotas}/objects"),
            "application/merge-patch+json",
            Some(json!({"spec": {"hard": {WIDGET_COUNT: "2"}}})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, _) = hub
        .json(
            ADMIN,
            "POST",
            &widgets_in("team-a"),
            Some(widget("lowered", 1)),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    eventually("the new limit counted", async || {
        let (_, q) = hub
            .json(ALICE, "GET", &format!("{quotas}/objects"), None)
            .await;
        q["status"] == json!({"hard": {WIDGET_COUNT: "2"}, "used": {WIDGET_COUNT: "5"}})
    })
    .await;
    let (_, list) = hub.json(ADMIN, "GET", &widgets_in("team-a"), None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 5);

    // kubectl's columns: NAME AGE REQUEST LIMIT.
    let req = Request::builder()
        .uri(quotas)
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .header("authorization", format!("Bearer {ALICE}"))
        .body(Body::empty())
        .unwrap();
    let resp = hub.router.clone().oneshot(req).await.unwrap();
    let table: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Name", "Age", "Request", "Limit"]);
    assert_eq!(table["rows"][0]["cells"][2], format!("{WIDGET_COUNT}: 5/2"));
    assert_eq!(table["rows"][0]["cells"][3], "");
    controller.abort();
}
