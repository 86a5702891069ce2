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
