//! Resources served at several versions: objects go to the storage version
//! before they are stored and come back to the version of the request in
//! every answer, as kube-apiserver converts custom resources.
//!
//! The [`Conversion`](crate::resource::Conversion) of the resource does the
//! work; here the server sets `apiVersion` and prunes what the target
//! version's schema does not declare. Objects of a resource served at one
//! version only pass through untouched (and uncopied).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::sync::Arc;

use serde_json::Value;

use super::Server;
use crate::resource::ResourceDef;
use crate::status::ApiError;
use crate::store::Object;

impl Server {
    /// The definition of `def`'s resource at its storage version.
    pub(crate) fn storage_def(&self, def: &ResourceDef) -> Option<&Arc<ResourceDef>> {
        self.resource(&def.group, def.storage_version(), &def.plural)
    }

    /// `object`, read at `def`'s version, at the storage version (itself
    /// when `def` is the storage version).
    ///
    /// # Errors
    ///
    /// 500 when the conversion fails or the storage version is not served.
    pub(crate) fn to_storage(&self, def: &ResourceDef, object: Value) -> Result<Value, ApiError> {
        let Some(storage) = &def.storage else {
            return Ok(object);
        };
        let target = self.storage_def(def).ok_or_else(|| {
            ApiError::internal(format!(
                "{}/{} {} is stored at {}, which this server does not serve",
                def.group, def.version, def.kind, storage.version
            ))
        })?;
        convert(def, target, storage.conversion.as_ref(), object)
    }

    /// A stored object as it reads at `def`'s version: borrowed when `def`
    /// is the storage version.
    ///
    /// # Errors
    ///
    /// 500 when the conversion fails or the storage version is not served.
    pub(crate) fn present<'a>(
        &self,
        def: &ResourceDef,
        stored: &'a Value,
    ) -> Result<Cow<'a, Value>, ApiError> {
        let Some(storage) = &def.storage else {
            return Ok(Cow::Borrowed(stored));
        };
        let source = self.storage_def(def).ok_or_else(|| {
            ApiError::internal(format!(
                "{}/{} {} is stored at {}, which this server does not serve",
                def.group, def.version, def.kind, storage.version
            ))
        })?;
        convert(source, def, storage.conversion.as_ref(), stored.clone()).map(Cow::Owned)
    }

    /// A stored object with its value as it reads at `def`'s version.
    pub(crate) fn present_object(
        &self,
        def: &ResourceDef,
        object: Object,
    ) -> Result<Object, ApiError> {
        if def.is_storage_version() {
            return Ok(object);
        }
        let value = self.present(def, &object.value)?.into_owned();
        Ok(Object {
            value: Arc::new(value),
            ..object
        })
    }
}

/// `object` from version `from` to version `to` of one resource.
fn convert(
    from: &ResourceDef,
    to: &ResourceDef,
    conversion: &dyn crate::resource::Conversion,
    object: Value,
) -> Result<Value, ApiError> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut converted = conversion
        .convert(object, &from.version, &to.version)
        .map_err(|e| {
            ApiError::internal(format!(
                "converting {} {name:?} from {} to {}: {e}",
                from.kind,
                from.api_version(),
                to.api_version()
            ))
        })?;
    let Some(map) = converted.as_object_mut() else {
        return Err(ApiError::internal(format!(
            "converting {} {name:?} to {}: the conversion did not answer an object",
            from.kind,
            to.api_version()
        )));
    };
    map.insert("apiVersion".into(), to.api_version().into());
    map.insert("kind".into(), to.kind.clone().into());
    if let Some(schema) = &to.schema {
        crate::schema::prune(&mut converted, schema);
    }
    Ok(converted)
}

/// kube-apiserver's order of versions within a group (its
/// `CompareKubeAwareVersionStrings`): GA before beta before alpha, higher
/// numbers first, then versions of other shapes by name.
pub(crate) fn compare_versions(a: &str, b: &str) -> Ordering {
    match (kube_version(a), kube_version(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// `v2` → (2, 2, 0), `v1beta3` → (1, 1, 3), `v1alpha1` → (0, 1, 1):
/// stability (GA 2, beta 1, alpha 0), major and minor version, ordered so
/// that a greater tuple is preferred.
fn kube_version(v: &str) -> Option<(u8, u64, u64)> {
    let rest = v.strip_prefix('v')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let major: u64 = rest[..digits].parse().ok().filter(|m| *m > 0)?;
    let tail = &rest[digits..];
    if tail.is_empty() {
        return Some((2, major, 0));
    }
    let (stability, minor) = if let Some(n) = tail.strip_prefix("beta") {
        (1, n)
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (0, n)
    } else {
        return None;
    };
    let minor: u64 = minor.parse().ok().filter(|m| *m > 0)?;
    Some((stability, major, minor))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use serde_json::json;
    use tower::ServiceExt;

    use super::*;
    use crate::resource::{Conversion, PrinterColumn, StorageVersion};
    use crate::store::{Key, RedbStore};

    #[test]
    fn versions_sort_as_kube_apiserver_sorts_them() {
        let mut versions = vec![
            "v1alpha1",
            "v11alpha2",
            "foo10",
            "v10",
            "v2",
            "v1beta2",
            "v1",
            "v10beta3",
            "v12alpha1",
            "foo1",
            "v1beta1",
        ];
        versions.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(
            versions,
            [
                "v10",
                "v2",
                "v1",
                "v10beta3",
                "v1beta2",
                "v1beta1",
                "v12alpha1",
                "v11alpha2",
                "v1alpha1",
                "foo1",
                "foo10"
            ]
        );
    }

    /// Gadgets: stored at v2 with `spec.replicas`; v1 calls it `spec.size`
    /// and has no `spec.zone`.
    struct GadgetConversion;

    impl Conversion for GadgetConversion {
        fn convert(&self, mut object: Value, from: &str, to: &str) -> Result<Value, String> {
            let (old, new) = match (from, to) {
                ("v1", "v2") => ("size", "replicas"),
                ("v2", "v1") => ("replicas", "size"),
                _ => return Err(format!("no conversion from {from} to {to}")),
            };
            if object["spec"]["size"] == json!(-1) {
                return Err("spec.size: -1 has no v2 equivalent".into());
            }
            if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut)
                && let Some(v) = spec.remove(old)
            {
                spec.insert(new.into(), v);
            }
            Ok(object)
        }
    }

    fn gadgets(version: &str, field: &str) -> ResourceDef {
        let mut spec = json!({"type": "object", "properties": {field: {"type": "integer"}}});
        if version == "v2" {
            spec["properties"]["zone"] = json!({"type": "string"});
        }
        ResourceDef {
            group: "example.com".into(),
            version: version.into(),
            kind: "Gadget".into(),
            list_kind: "GadgetList".into(),
            plural: "gadgets".into(),
            singular: "gadget".into(),
            short_names: vec!["gd".into()],
            namespaced: true,
            status_subresource: true,
            printer_columns: vec![PrinterColumn {
                name: "Size".into(),
                type_: "integer".into(),
                json_path: format!(".spec.{field}"),
                description: String::new(),
                priority: 0,
                render: None,
            }],
            schema: Some(json!({
                "type": "object",
                "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": {"type": "object"}, "spec": spec,
                    "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
                },
            })),
            ..Default::default()
        }
    }

    struct Api {
        server: Arc<Server>,
        _dir: tempfile::TempDir,
    }

    /// Registered v1 first: the storage version is preferred all the same.
    fn api() -> Api {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RedbStore::open(&dir.path().join("db"), 1000).unwrap());
        let mut v1 = gadgets("v1", "size");
        v1.storage = Some(StorageVersion {
            version: "v2".into(),
            conversion: Arc::new(GadgetConversion),
        });
        v1.deprecation_warning =
            Some("example.com/v1 Gadget is deprecated; use example.com/v2 Gadget".into());
        let server = Server::builder(store)
            .resource(v1)
            .resource(gadgets("v2", "replicas"))
            .bookmark_interval(Duration::from_millis(50))
            .build();
        Api { server, _dir: dir }
    }

    const V1: &str = "/apis/example.com/v1/namespaces/ns/gadgets";
    const V2: &str = "/apis/example.com/v2/namespaces/ns/gadgets";

    impl Api {
        async fn send(
            &self,
            method: &str,
            uri: &str,
            headers: &[(&str, &str)],
            body: Option<Value>,
        ) -> axum::response::Response {
            let mut req = Request::builder().method(method).uri(uri);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let req = req
                .body(body.map_or(Body::empty(), |b| Body::from(b.to_string())))
                .unwrap();
            self.server.router().oneshot(req).await.unwrap()
        }

        async fn call(
            &self,
            method: &str,
            uri: &str,
            content_type: &str,
            body: Option<Value>,
        ) -> (StatusCode, Value) {
            let resp = self
                .send(method, uri, &[("content-type", content_type)], body)
                .await;
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

        fn stored(&self, name: &str) -> Value {
            let key = Key::new("example.com/gadgets", Some("ns"), name);
            self.server
                .store()
                .get(&key)
                .unwrap()
                .value
                .as_ref()
                .clone()
        }
    }

    fn gadget_v1(name: &str, size: i64) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": name}, "spec": {"size": size}})
    }

    #[tokio::test]
    async fn a_write_at_another_version_is_stored_at_the_storage_version() {
        let api = api();
        let (code, created) = api.json("POST", V1, Some(gadget_v1("g", 3))).await;
        assert_eq!(code, StatusCode::CREATED, "{created}");
        assert_eq!(created["apiVersion"], "example.com/v1");
        assert_eq!(created["spec"], json!({"size": 3}));
        let stored = api.stored("g");
        assert_eq!(stored["apiVersion"], "example.com/v2");
        assert_eq!(stored["spec"], json!({"replicas": 3}));
        assert_eq!(
            stored["metadata"]["resourceVersion"],
            created["metadata"]["resourceVersion"]
        );

        // Read back at either version.
        let (_, v2) = api.json("GET", &format!("{V2}/g"), None).await;
        assert_eq!(v2["apiVersion"], "example.com/v2");
        assert_eq!(v2["spec"], json!({"replicas": 3}));
        let (_, v1) = api.json("GET", &format!("{V1}/g"), None).await;
        assert_eq!(v1, created);

        // A v2-only field written at v2 is not shown at v1 (pruned), and
        // survives an update at v1 that does not know it only if the
        // conversion keeps it: this one does not, as a lossy webhook would.
        let mut at_v2 = v2.clone();
        at_v2["spec"]["zone"] = json!("eu");
        let (code, _) = api.json("PUT", &format!("{V2}/g"), Some(at_v2)).await;
        assert_eq!(code, StatusCode::OK);
        let (_, v1) = api.json("GET", &format!("{V1}/g"), None).await;
        assert_eq!(v1["spec"], json!({"size": 3}));
        assert_eq!(v1["metadata"]["generation"], 2);

        // Update and merge patch at v1.
        let mut update = v1.clone();
        update["spec"]["size"] = json!(4);
        let (code, updated) = api.json("PUT", &format!("{V1}/g"), Some(update)).await;
        assert_eq!(code, StatusCode::OK, "{updated}");
        assert_eq!(updated["apiVersion"], "example.com/v1");
        assert_eq!(updated["spec"], json!({"size": 4}));
        assert_eq!(api.stored("g")["spec"], json!({"replicas": 4}));
        let (code, patched) = api
            .call(
                "PATCH",
                &format!("{V1}/g"),
                "application/merge-patch+json",
                Some(json!({"spec": {"size": 5}})),
            )
            .await;
        assert_eq!(code, StatusCode::OK, "{patched}");
        assert_eq!(patched["spec"], json!({"size": 5}));
        assert_eq!(api.stored("g")["spec"], json!({"replicas": 5}));
        assert_eq!(api.stored("g")["apiVersion"], "example.com/v2");

        // The status subresource at v1.
        let mut status = patched.clone();
        status["status"] = json!({"ready": true});
        let (code, after) = api
            .json("PUT", &format!("{V1}/g/status"), Some(status))
            .await;
        assert_eq!(code, StatusCode::OK, "{after}");
        assert_eq!(after["status"]["ready"], true);
        assert_eq!(api.stored("g")["status"]["ready"], true);

        // A delete at v1 answers the Status; the object is gone.
        let (code, _) = api.json("DELETE", &format!("{V1}/g"), None).await;
        assert_eq!(code, StatusCode::OK);
        let (code, _) = api.json("GET", &format!("{V2}/g"), None).await;
        assert_eq!(code, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_delete_at_another_version_keeps_what_that_version_cannot_show() {
        let api = api();
        let gadget = json!({"apiVersion": "example.com/v2", "kind": "Gadget",
            "metadata": {"name": "f", "finalizers": ["example.com/hold"]},
            "spec": {"replicas": 1, "zone": "eu"}});
        let (code, _) = api.json("POST", V2, Some(gadget)).await;
        assert_eq!(code, StatusCode::CREATED);
        let (code, marked) = api.json("DELETE", &format!("{V1}/f"), None).await;
        assert_eq!(code, StatusCode::OK, "{marked}");
        assert_eq!(marked["apiVersion"], "example.com/v1");
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        let stored = api.stored("f");
        assert!(stored["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(stored["spec"], json!({"replicas": 1, "zone": "eu"}));
    }

    #[tokio::test]
    async fn server_side_apply_at_another_version() {
        let api = api();
        let (code, applied) = api
            .call(
                "PATCH",
                &format!("{V1}/g?fieldManager=kubectl"),
                "application/apply-patch+yaml",
                Some(gadget_v1("g", 2)),
            )
            .await;
        assert_eq!(code, StatusCode::CREATED, "{applied}");
        assert_eq!(applied["spec"], json!({"size": 2}));
        let (code, applied) = api
            .call(
                "PATCH",
                &format!("{V1}/g?fieldManager=kubectl"),
                "application/apply-patch+yaml",
                Some(gadget_v1("g", 6)),
            )
            .await;
        assert_eq!(code, StatusCode::OK, "{applied}");
        assert_eq!(applied["spec"], json!({"size": 6}));
        assert_eq!(api.stored("g")["spec"], json!({"replicas": 6}));
    }

    #[tokio::test]
    async fn lists_tables_and_deletions_answer_at_the_request_version() {
        let api = api();
        for (name, size) in [("a", 1), ("b", 2)] {
            let (code, _) = api.json("POST", V1, Some(gadget_v1(name, size))).await;
            assert_eq!(code, StatusCode::CREATED);
        }
        let (_, list) = api.json("GET", V1, None).await;
        assert_eq!(list["apiVersion"], "example.com/v1");
        assert_eq!(list["kind"], "GadgetList");
        for item in list["items"].as_array().unwrap() {
            assert_eq!(item["apiVersion"], "example.com/v1");
            assert!(item["spec"]["size"].is_i64(), "{item}");
        }
        let (_, list) = api.json("GET", &format!("{V2}?limit=1"), None).await;
        assert_eq!(list["items"][0]["spec"], json!({"replicas": 1}));
        assert!(list["metadata"]["continue"].is_string());

        let table = |uri: String| {
            let api = &api;
            async move {
                let resp = api
                    .send(
                        "GET",
                        &uri,
                        &[("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")],
                        None,
                    )
                    .await;
                let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                serde_json::from_slice::<Value>(&bytes).unwrap()
            }
        };
        let t = table(V1.to_string()).await;
        assert_eq!(t["columnDefinitions"][1]["name"], "Size");
        assert_eq!(t["rows"][1]["cells"], json!(["b", 2]));
        assert_eq!(t["rows"][1]["object"]["apiVersion"], "meta.k8s.io/v1");
        let t = table(format!("{V2}/a?includeObject=Object")).await;
        assert_eq!(t["rows"][0]["cells"], json!(["a", 1]));
        assert_eq!(t["rows"][0]["object"]["apiVersion"], "example.com/v2");

        let (code, deleted) = api.json("DELETE", V1, None).await;
        assert_eq!(code, StatusCode::OK, "{deleted}");
        assert_eq!(deleted["items"][0]["apiVersion"], "example.com/v1");
        assert_eq!(deleted["items"][0]["spec"], json!({"size": 1}));
    }

    #[tokio::test]
    async fn watch_events_are_converted() {
        let api = api();
        api.json("POST", V2, Some(json!({"apiVersion": "example.com/v2", "kind": "Gadget", "metadata": {"name": "w"}, "spec": {"replicas": 7}})))
            .await;
        let resp = api
            .send("GET", &format!("{V1}?watch=1&timeoutSeconds=5"), &[], None)
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let mut text = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !text.contains('\n') {
            let frame = tokio::time::timeout_at(deadline, body.frame())
                .await
                .expect("an event within the deadline")
                .unwrap()
                .unwrap();
            if let Ok(data) = frame.into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
        }
        let event: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"]["apiVersion"], "example.com/v1");
        assert_eq!(event["object"]["spec"], json!({"size": 7}));
    }

    #[tokio::test]
    async fn discovery_and_openapi_list_every_version_storage_preferred() {
        let api = api();
        let (_, group) = api.json("GET", "/apis/example.com", None).await;
        assert_eq!(group["preferredVersion"]["version"], "v2");
        let versions: Vec<&str> = group["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["version"].as_str().unwrap())
            .collect();
        assert_eq!(versions, ["v2", "v1"]);
        let (_, groups) = api.json("GET", "/apis", None).await;
        assert_eq!(
            groups["groups"][0]["preferredVersion"]["groupVersion"],
            "example.com/v2"
        );
        for version in ["v1", "v2"] {
            let (code, list) = api
                .json("GET", &format!("/apis/example.com/{version}"), None)
                .await;
            assert_eq!(code, StatusCode::OK);
            assert_eq!(list["resources"][0]["name"], "gadgets");
            assert_eq!(list["resources"][0]["shortNames"], json!(["gd"]));
            assert_eq!(list["resources"][1]["name"], "gadgets/status");
        }
        let (_, index) = api.json("GET", "/openapi/v3", None).await;
        assert!(index["paths"]["apis/example.com/v1"].is_object(), "{index}");
        assert!(index["paths"]["apis/example.com/v2"].is_object(), "{index}");
        let (_, doc) = api
            .json("GET", "/openapi/v3/apis/example.com/v1", None)
            .await;
        let schema = &doc["components"]["schemas"]["com.example.v1.Gadget"];
        assert!(
            schema["properties"]["spec"]["properties"]["size"].is_object(),
            "{doc}"
        );
        let (_, doc) = api
            .json("GET", "/openapi/v3/apis/example.com/v2", None)
            .await;
        let schema = &doc["components"]["schemas"]["com.example.v2.Gadget"];
        assert!(schema["properties"]["spec"]["properties"]["replicas"].is_object());
    }

    #[tokio::test]
    async fn a_deprecated_version_warns_and_a_failed_conversion_is_500() {
        let api = api();
        let resp = api.send("GET", V1, &[], None).await;
        let warnings: Vec<&str> = resp
            .headers()
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        assert_eq!(
            warnings,
            ["299 - \"example.com/v1 Gadget is deprecated; use example.com/v2 Gadget\""]
        );
        let resp = api.send("GET", V2, &[], None).await;
        assert!(resp.headers().get("warning").is_none());

        // The v1 schema is applied to a write at v1: v2's zone is pruned.
        let mut g = gadget_v1("z", 1);
        g["spec"]["zone"] = json!("eu");
        let (code, status) = api
            .json("POST", &format!("{V1}?fieldValidation=Strict"), Some(g))
            .await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("unknown field \"spec.zone\""),
            "{status}"
        );
        // A version in the body other than the URL's is refused.
        let mut g = gadget_v1("z", 1);
        g["apiVersion"] = json!("example.com/v2");
        let (code, _) = api.json("POST", V1, Some(g)).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);

        let (code, status) = api.json("POST", V1, Some(gadget_v1("bad", -1))).await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            status["message"].as_str().unwrap().contains(
                "converting Gadget \"bad\" from example.com/v1 to example.com/v2: spec.size: -1"
            ),
            "{status}"
        );
        let (code, _) = api.json("GET", &format!("{V2}/bad"), None).await;
        assert_eq!(code, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_version_whose_storage_version_is_not_served_fails_plainly() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RedbStore::open(&dir.path().join("db"), 10).unwrap());
        let mut v1 = gadgets("v1", "size");
        v1.storage = Some(StorageVersion {
            version: "v2".into(),
            conversion: Arc::new(GadgetConversion),
        });
        let server = Server::builder(store).resource(v1).build();
        let req = Request::builder()
            .method("POST")
            .uri(V1)
            .header("content-type", "application/json")
            .body(Body::from(gadget_v1("g", 1).to_string()))
            .unwrap();
        let resp = server.router().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
