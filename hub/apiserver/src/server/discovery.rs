//! Discovery (`/version`, `/api`, `/apis`, group and resource lists) and
//! OpenAPI v3, enough for kubectl to find resources, print them, validate
//! on the server (`fieldValidation`) and `explain`.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Server;
use super::request::{self, Format, Shared};
use crate::resource::ResourceDef;
use crate::status::ApiError;

fn ok(body: &Value) -> Response {
    request::respond(StatusCode::OK, body, Format::Json, &[])
}

pub(crate) async fn version(State(server): State<Shared>) -> Response {
    let v = &server.version;
    let (major, minor) = v
        .git_version
        .trim_start_matches('v')
        .split_once('.')
        .map(|(a, b)| {
            (
                a.to_string(),
                b.split('.').next().unwrap_or_default().to_string(),
            )
        })
        .unwrap_or_default();
    ok(&json!({
        "major": major,
        "minor": minor,
        "gitVersion": v.git_version,
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": v.platform,
    }))
}

pub(crate) async fn core_versions(State(server): State<Shared>) -> Response {
    let versions: Vec<&str> = if server.resources.iter().any(|r| r.group.is_empty()) {
        vec!["v1"]
    } else {
        vec![]
    };
    ok(&json!({
        "kind": "APIVersions",
        "versions": versions,
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }))
}

/// group → its versions, the preferred one first: versions some resource
/// of the group is stored at before versions only converted to, each in
/// kube-apiserver's order (GA, beta, alpha; higher numbers first).
fn group_versions(server: &Server) -> BTreeMap<&str, Vec<&str>> {
    let mut groups: BTreeMap<&str, Vec<(&str, bool)>> = BTreeMap::new();
    for r in server.resources.iter().filter(|r| !r.group.is_empty()) {
        let versions = groups.entry(&r.group).or_default();
        match versions.iter_mut().find(|(v, _)| *v == r.version) {
            Some((_, stored)) => *stored |= r.is_storage_version(),
            None => versions.push((&r.version, r.is_storage_version())),
        }
    }
    groups
        .into_iter()
        .map(|(group, mut versions)| {
            versions.sort_by(|(a, a_stored), (b, b_stored)| {
                b_stored
                    .cmp(a_stored)
                    .then_with(|| super::versions::compare_versions(a, b))
            });
            (group, versions.into_iter().map(|(v, _)| v).collect())
        })
        .collect()
}

fn api_group(name: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

pub(crate) async fn groups(State(server): State<Shared>) -> Response {
    let groups: Vec<Value> = group_versions(&server)
        .iter()
        .map(|(g, v)| api_group(g, v))
        .collect();
    ok(&json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
}

/// `/apis/{group}` (an APIGroup) and `/api/v1`, `/apis/{group}/{version}`
/// (an APIResourceList).
pub(crate) fn group_version(
    server: &Server,
    group: &str,
    version: Option<&str>,
) -> Result<Response, ApiError> {
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let Some(version) = version else {
        let groups = group_versions(server);
        let versions = groups.get(group).ok_or_else(not_found)?;
        let mut g = api_group(group, versions);
        g["kind"] = "APIGroup".into();
        g["apiVersion"] = "v1".into();
        return Ok(ok(&g));
    };
    let defs: Vec<&ResourceDef> = server
        .resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .map(AsRef::as_ref)
        .collect();
    if defs.is_empty() {
        return Err(not_found());
    }
    let mut resources = Vec::new();
    for r in defs {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        resources.push(entry);
        if r.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": if r.read_only { vec!["get"] } else { vec!["get", "patch", "update"] },
            }));
        }
        if r.log_subresource {
            resources.push(json!({
                "name": format!("{}/log", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(ok(&json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })))
}

/// The OpenAPI v3 path of a group version: `api/v1`, `apis/g/v`.
fn openapi_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

pub(crate) async fn openapi_index(State(server): State<Shared>) -> Response {
    let mut paths = serde_json::Map::new();
    let mut seen = Vec::new();
    for r in server.resources.iter() {
        if seen.contains(&(&r.group, &r.version)) {
            continue;
        }
        seen.push((&r.group, &r.version));
        let path = openapi_path(&r.group, &r.version);
        let doc = openapi_document(&server, &r.group, &r.version);
        let hash = hex::encode(Sha256::digest(serde_json::to_vec(&doc).unwrap_or_default()));
        paths.insert(path.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", hash.to_uppercase())}));
    }
    ok(&json!({"paths": paths}))
}

pub(crate) async fn openapi_doc(
    State(server): State<Shared>,
    Path(path): Path<String>,
) -> Response {
    let segments: Vec<&str> = path.split('/').collect();
    let (group, version) = match segments.as_slice() {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => {
            return axum::response::IntoResponse::into_response(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
    };
    if !server
        .resources
        .iter()
        .any(|r| r.group == group && r.version == version)
    {
        return axum::response::IntoResponse::into_response(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    ok(&openapi_document(&server, group, version))
}

/// `io.kubeflow.trainer.v1alpha1.TrainJob`, `io.k8s.api.core.v1.Pod`: the
/// schema names kube-apiserver publishes.
fn schema_name(r: &ResourceDef) -> String {
    if r.group.is_empty() {
        return format!("io.k8s.api.core.{}.{}", r.version, r.kind);
    }
    let reversed: Vec<&str> = r.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), r.version, r.kind)
}

fn openapi_document(server: &Server, group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for r in server
        .resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .filter(|r| !crate::review::is_review(r))
    {
        let name = schema_name(r);
        let gvk = json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
        let mut schema = r.schema.clone().unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        schema["x-kubernetes-group-version-kind"] = gvk.clone();
        schemas.insert(name.clone(), schema);
        let object_ref = json!({"$ref": format!("#/components/schemas/{name}")});
        let base = if r.group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let collection = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        let namespace_param = r.namespaced.then(|| {
            param(
                "namespace",
                "path",
                "object name and auth scope, such as for teams and projects",
            )
        });
        let name_param = param("name", "path", &format!("name of the {}", r.kind));
        let op = |action: &str, params: Vec<Value>, body: bool| -> Value {
            let mut all: Vec<Value> = namespace_param.iter().cloned().collect();
            all.extend(params);
            let mut op = json!({
                "operationId": format!("{action}{}", r.kind),
                "parameters": all,
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": object_ref}}}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk[0],
            });
            if body {
                op["requestBody"] = json!({"content": {"*/*": {"schema": object_ref}}});
            }
            op
        };
        let write_params = || {
            vec![
                param(
                    "dryRun",
                    "query",
                    "when present, the write is not persisted",
                ),
                param(
                    "fieldManager",
                    "query",
                    "the name of the actor making the change",
                ),
                param(
                    "fieldValidation",
                    "query",
                    "Ignore, Warn (default) or Strict: what to do with unknown fields",
                ),
            ]
        };
        let list_params = vec![
            param("labelSelector", "query", "a selector on labels"),
            param("fieldSelector", "query", "a selector on fields"),
            param(
                "resourceVersion",
                "query",
                "resourceVersion to list or watch from",
            ),
            param("watch", "query", "watch for changes"),
            param("allowWatchBookmarks", "query", "ask for BOOKMARK events"),
            param("limit", "query", "page size"),
            param("continue", "query", "continue token of a paged list"),
            param("timeoutSeconds", "query", "timeout of a list or watch"),
        ];
        let mut coll = json!({"get": op("list", list_params, false)});
        if !r.read_only {
            coll["post"] = op("post", write_params(), true);
            coll["delete"] = op("deletecollection", vec![], false);
        }
        paths.insert(collection.clone(), coll);
        let mut item = json!({"get": op("get", vec![name_param.clone()], false)});
        if !r.read_only {
            let mut with_name = write_params();
            with_name.insert(0, name_param.clone());
            item["put"] = op("put", with_name.clone(), true);
            let mut patch_params = with_name.clone();
            patch_params.push(param(
                "force",
                "query",
                "force apply, taking ownership of conflicting fields",
            ));
            item["patch"] = op("patch", patch_params, true);
            item["delete"] = op("delete", vec![name_param.clone()], false);
        }
        paths.insert(format!("{collection}/{{name}}"), item);
        if r.status_subresource {
            let mut with_name = write_params();
            with_name.insert(0, name_param.clone());
            let mut status = json!({"get": op("get", vec![name_param.clone()], false)});
            if !r.read_only {
                status["put"] = op("put", with_name.clone(), true);
                status["patch"] = op("patch", with_name, true);
            }
            paths.insert(format!("{collection}/{{name}}/status"), status);
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "trainhub", "version": server.version.git_version},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

fn param(name: &str, location: &str, description: &str) -> Value {
    json!({
        "name": name,
        "in": location,
        "description": description,
        "required": location == "path",
        "schema": {"type": "string", "uniqueItems": true},
    })
}
