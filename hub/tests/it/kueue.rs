//! Kueue's kinds served by the hub's API, over HTTP on 127.0.0.1: Kueue's
//! own examples apply unchanged, v1beta1 and v1beta2 read each other's
//! writes, discovery and tables are Kueue's, invalid objects are 422 naming
//! the field, and tenants read what admins write.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is the test's report"
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper::header::HeaderMap;
use serde_json::{Value, json};
use trainhub::kueue::KueueAdmission;
use trainhub::kueue::workload::{self, Priority, WorkloadStatus};
use trainhub_apiserver::admission::AllowAll;
use trainhub_apiserver::auth::{Authenticator, Policy, PolicyAuthorizer, TokenFile};
use trainhub_apiserver::resource::ResourceDef;
use trainhub_apiserver::server::Server;
use trainhub_apiserver::store::{Key, Op, RedbStore, Store};

use crate::common::documents;

const ADMIN: &str = "admin-token";
const ALICE: &str = "alice-token";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// A hub's API for Kueue's kinds (the hub's resources and Kueue's
/// admission, the trainer kinds admitted as they come), its store in a
/// temporary directory, served on 127.0.0.1 with tokens for an admin and
/// for alice, who is granted `team-a`.
struct Api {
    addr: SocketAddr,
    store: Arc<RedbStore>,
    defs: Vec<ResourceDef>,
    _dir: tempfile::TempDir,
}

/// Kueue's examples, beside the trainer's upstream fixtures.
fn examples_dir() -> PathBuf {
    crate::common::upstream_dir()
        .join("..")
        .join("kueue")
        .join("examples")
}

impl Api {
    async fn start() -> Api {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RedbStore::open(&dir.path().join("store.redb"), 1000).unwrap());
        let tokens = TokenFile::parse(
            &format!("{ADMIN},root,1,\"trainhub:admins\"\n{ALICE},alice,2,\"team-a\"\n"),
            "tokens",
        )
        .unwrap();
        let policy: Policy = "namespaces:\n  - namespace: team-a\n    groups: [team-a]\n"
            .parse()
            .unwrap();
        let defs = trainhub::api::resources().unwrap();
        let mut builder = Server::builder(store.clone())
            .admission(Arc::new(
                KueueAdmission::new(store.clone(), Arc::new(AllowAll)).unwrap(),
            ))
            .authenticator(Arc::new(Authenticator::new(Some(tokens), false)))
            .authorizer(Arc::new(PolicyAuthorizer::new(policy)));
        for def in defs.clone() {
            builder = builder.resource(def);
        }
        let router = builder.build().router();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Api {
            addr,
            store,
            defs,
            _dir: dir,
        }
    }

    /// One request as `token`; the status, headers and JSON body.
    async fn send(
        &self,
        token: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> (StatusCode, HeaderMap, Value) {
        let stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {token}"));
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            request = request.header("content-type", "application/json");
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let response = sender
            .send_request(request.body(Full::new(body)).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            headers,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let (status, _, body) = self.send(ADMIN, method, path, &[], body).await;
        (status, body)
    }

    fn def(&self, kind: &str, version: &str) -> &ResourceDef {
        self.defs
            .iter()
            .find(|d| d.group == "kueue.x-k8s.io" && d.kind == kind && d.version == version)
            .unwrap_or_else(|| panic!("{kind} {version} not served"))
    }

    /// The collection path of `object` (from its apiVersion, kind and
    /// namespace).
    fn collection(&self, object: &Value) -> String {
        let api_version = object["apiVersion"].as_str().unwrap();
        let version = api_version.rsplit('/').next().unwrap();
        let def = self.def(object["kind"].as_str().unwrap(), version);
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default");
        collection(def, version, def.namespaced.then_some(namespace))
    }

    fn path(&self, object: &Value) -> String {
        format!(
            "{}/{}",
            self.collection(object),
            object["metadata"]["name"].as_str().unwrap()
        )
    }

    /// Creates `object` as kubectl does (strict field validation).
    async fn create(&self, object: &Value) -> (StatusCode, Value) {
        let path = format!("{}?fieldValidation=Strict", self.collection(object));
        self.admin("POST", &path, Some(object)).await
    }

    /// `kubectl apply` of an object: created, or else replaced.
    async fn apply(&self, object: &Value) -> (StatusCode, Value) {
        let (status, body) = self.create(object).await;
        if status != StatusCode::CONFLICT {
            return (status, body);
        }
        let (_, current) = self.admin("GET", &self.path(object), None).await;
        let mut replaced = object.clone();
        replaced["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        let path = format!("{}?fieldValidation=Strict", self.path(object));
        self.admin("PUT", &path, Some(&replaced)).await
    }

    fn stored(&self, resource: &str, namespace: Option<&str>, name: &str) -> Value {
        let key = Key::new(resource, namespace, name);
        self.store.get(&key).unwrap().value.as_ref().clone()
    }
}

fn collection(def: &ResourceDef, version: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!(
            "/apis/{}/{version}/namespaces/{ns}/{}",
            def.group, def.plural
        ),
        None => format!("/apis/{}/{version}/{}", def.group, def.plural),
    }
}

/// Every document of Kueue's examples, file by file.
fn examples() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .unwrap_or_else(|e| panic!("{}: {e}", examples_dir().display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    files
        .into_iter()
        .flat_map(|f| {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            documents(&f).into_iter().map(move |d| (name.clone(), d))
        })
        .collect()
}

/// The causes of a 422: (field, message) pairs.
fn causes(status: &Value) -> Vec<(String, String)> {
    status["details"]["causes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (
                        c["field"].as_str().unwrap_or_default().to_string(),
                        c["message"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn cluster_queue(version: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("kueue.x-k8s.io/{version}"), "kind": "ClusterQueue",
        "metadata": {"name": name}, "spec": spec,
    })
}

fn quota_spec() -> Value {
    json!({"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": 4}]}
    ]}]})
}

#[tokio::test]
async fn every_upstream_example_is_accepted_at_v1beta2() {
    let api = Api::start().await;
    for (file, object) in examples() {
        assert_eq!(object["apiVersion"], "kueue.x-k8s.io/v1beta2", "{file}");
        let (status, body) = api.apply(&object).await;
        assert!(
            status == StatusCode::CREATED || status == StatusCode::OK,
            "{file}: {status} {body:#}"
        );
        assert_eq!(body["apiVersion"], "kueue.x-k8s.io/v1beta2", "{file}");
    }
    // Stored as written, with the CRD's defaults.
    let cq = api.stored("kueue.x-k8s.io/clusterqueues", None, "cluster-queue");
    assert_eq!(cq["apiVersion"], "kueue.x-k8s.io/v1beta2");
    assert_eq!(cq["spec"]["queueingStrategy"], "BestEffortFIFO");
    assert_eq!(cq["spec"]["stopPolicy"], "None");
    assert_eq!(
        cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"],
        "36Gi"
    );
    let lq = api.stored("kueue.x-k8s.io/localqueues", Some("default"), "user-queue");
    assert_eq!(lq["spec"]["clusterQueue"], "cluster-queue");
    // The two examples named "spot": the second replaced the first.
    let spot = api.stored("kueue.x-k8s.io/resourceflavors", None, "spot");
    assert_eq!(spot["spec"]["tolerations"][0]["key"], "spot-taint");
    assert!(spot["spec"].get("nodeTaints").is_none(), "{spot:#}");
}

#[tokio::test]
async fn cohort_and_cohort_name_read_back_across_versions() {
    let api = Api::start().await;
    // Written at v1beta1 with `cohort`...
    let old = cluster_queue("v1beta1", "team-a", {
        let mut spec = quota_spec();
        spec["cohort"] = json!("research");
        spec
    });
    let (status, headers, created) = api
        .send(ADMIN, "POST", &api.collection(&old), &[], Some(&old))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created:#}");
    assert_eq!(created["apiVersion"], "kueue.x-k8s.io/v1beta1");
    assert_eq!(created["spec"]["cohort"], "research");
    let warning = headers.get("warning").unwrap().to_str().unwrap();
    assert_eq!(
        warning,
        "299 - \"This version is deprecated. Use v1beta2 instead.\""
    );
    // ...stored and read at v1beta2 with `cohortName`.
    let stored = api.stored("kueue.x-k8s.io/clusterqueues", None, "team-a");
    assert_eq!(stored["apiVersion"], "kueue.x-k8s.io/v1beta2");
    assert_eq!(stored["spec"]["cohortName"], "research");
    assert!(stored["spec"].get("cohort").is_none());
    let (_, at_v1beta2) = api
        .admin(
            "GET",
            "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/team-a",
            None,
        )
        .await;
    assert_eq!(at_v1beta2["apiVersion"], "kueue.x-k8s.io/v1beta2");
    assert_eq!(at_v1beta2["spec"]["cohortName"], "research");
    assert!(at_v1beta2["spec"].get("cohort").is_none());
    assert_eq!(
        at_v1beta2["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );

    // And the other way round.
    let new = cluster_queue("v1beta2", "team-b", {
        let mut spec = quota_spec();
        spec["cohortName"] = json!("research");
        spec
    });
    let (status, _) = api.create(&new).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, at_v1beta1) = api
        .admin(
            "GET",
            "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/team-b",
            None,
        )
        .await;
    assert_eq!(at_v1beta1["apiVersion"], "kueue.x-k8s.io/v1beta1");
    assert_eq!(at_v1beta1["spec"]["cohort"], "research");
    assert!(at_v1beta1["spec"].get("cohortName").is_none());

    // A merge patch at v1beta1 moves the queue to another cohort.
    let (status, _, patched) = api
        .send(
            ADMIN,
            "PATCH",
            "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/team-b",
            &[("content-type", "application/merge-patch+json")],
            Some(&json!({"spec": {"cohort": "vision"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched:#}");
    assert_eq!(patched["spec"]["cohort"], "vision");
    let stored = api.stored("kueue.x-k8s.io/clusterqueues", None, "team-b");
    assert_eq!(stored["spec"]["cohortName"], "vision");

    // A v1beta2-only field cannot be dropped by an update at v1beta1: Kueue's
    // webhook compares with the object as stored.
    let with_policy = cluster_queue("v1beta2", "team-c", {
        let mut spec = quota_spec();
        spec["concurrentAdmissionPolicy"] = json!({"migration": {"mode": "TryPreferredFlavors"}});
        spec
    });
    assert_eq!(api.create(&with_policy).await.0, StatusCode::CREATED);
    let (_, mut at_v1beta1) = api
        .admin(
            "GET",
            "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/team-c",
            None,
        )
        .await;
    assert!(
        at_v1beta1["spec"]
            .get("concurrentAdmissionPolicy")
            .is_none()
    );
    at_v1beta1["spec"]["queueingStrategy"] = json!("StrictFIFO");
    let (status, refused) = api
        .admin(
            "PUT",
            "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/team-c",
            Some(&at_v1beta1),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused:#}");
    assert_eq!(
        causes(&refused),
        [(
            "spec.concurrentAdmissionPolicy".to_string(),
            "Invalid value: null: field is immutable".to_string()
        )]
    );

    // Lists at v1beta1 are v1beta1 throughout.
    let (_, list) = api
        .admin("GET", "/apis/kueue.x-k8s.io/v1beta1/clusterqueues", None)
        .await;
    assert_eq!(list["apiVersion"], "kueue.x-k8s.io/v1beta1");
    let cohorts: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["spec"]["cohort"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(cohorts, ["research", "vision", ""]);
}

#[tokio::test]
async fn discovery_has_both_versions_and_the_short_names() {
    let api = Api::start().await;
    let (_, group) = api.admin("GET", "/apis/kueue.x-k8s.io", None).await;
    assert_eq!(
        group["versions"],
        json!([
            {"groupVersion": "kueue.x-k8s.io/v1beta2", "version": "v1beta2"},
            {"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"},
        ])
    );
    assert_eq!(group["preferredVersion"]["version"], "v1beta2");
    for version in ["v1beta2", "v1beta1"] {
        let (status, list) = api
            .admin("GET", &format!("/apis/kueue.x-k8s.io/{version}"), None)
            .await;
        assert_eq!(status, StatusCode::OK);
        let resource = |name: &str| {
            list["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("{name} missing at {version}: {list:#}"))
        };
        for (name, short, namespaced) in [
            ("clusterqueues", "cq", false),
            ("localqueues", "lq", true),
            ("resourceflavors", "rf", false),
            ("workloadpriorityclasses", "wpc", false),
            ("cohorts", "co", false),
            ("workloads", "wl", true),
        ] {
            let r = resource(name);
            assert!(
                r["shortNames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s == short),
                "{name}: {r}"
            );
            assert_eq!(r["namespaced"], namespaced, "{name}");
        }
        assert_eq!(
            resource("workloads")["verbs"],
            json!(["get", "list", "watch"])
        );
        assert_eq!(
            resource("clusterqueues")["verbs"].as_array().unwrap().len(),
            8
        );
        assert_eq!(resource("workloads/status")["verbs"], json!(["get"]));
        assert_eq!(
            resource("clusterqueues/status")["verbs"],
            json!(["get", "patch", "update"])
        );
    }
    let (_, openapi) = api.admin("GET", "/openapi/v3", None).await;
    for version in ["v1beta1", "v1beta2"] {
        let path = format!("apis/kueue.x-k8s.io/{version}");
        assert!(openapi["paths"][&path].is_object(), "{path} missing");
        let (_, doc) = api.admin("GET", &format!("/openapi/v3/{path}"), None).await;
        let cq = &doc["components"]["schemas"][format!("io.x-k8s.kueue.{version}.ClusterQueue")];
        let cohort_field = if version == "v1beta1" {
            "cohort"
        } else {
            "cohortName"
        };
        assert!(
            cq["properties"]["spec"]["properties"][cohort_field].is_object(),
            "{version}: no spec.{cohort_field}"
        );
    }
}

#[tokio::test]
async fn a_clusterqueue_table_has_kueues_columns() {
    let api = Api::start().await;
    for (_, object) in examples() {
        api.apply(&object).await;
    }
    let (status, _, table) = api
        .send(
            ADMIN,
            "GET",
            "/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
            &[("accept", TABLE)],
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(table["kind"], "Table");
    let columns: Vec<(&str, i64)> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["priority"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Name", 0),
            ("Cohort", 0),
            ("Strategy", 1),
            ("Pending Workloads", 0),
            ("Admitted Workloads", 1),
        ]
    );
    assert_eq!(
        table["rows"][0]["cells"],
        json!(["cluster-queue", null, "BestEffortFIFO", null, null])
    );
    // The v1beta1 table reads the cohort from `spec.cohort`.
    let cq = cluster_queue("v1beta2", "in-cohort", {
        let mut spec = quota_spec();
        spec["cohortName"] = json!("research");
        spec
    });
    api.create(&cq).await;
    let (_, _, table) = api
        .send(
            ADMIN,
            "GET",
            "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/in-cohort",
            &[("accept", TABLE)],
            None,
        )
        .await;
    assert_eq!(table["rows"][0]["cells"][1], "research");

    // Workloads, written by the hub, read through both versions.
    let trainjob = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "mnist", "namespace": "default", "uid": "0b1c2d3e-0000-4000-8000-000000000001",
                     "labels": {"kueue.x-k8s.io/queue-name": "user-queue", "kueue.x-k8s.io/priority-class": "high"}},
    });
    let priority = Priority {
        class: Some("high".into()),
        value: 100,
    };
    let pod_sets = [trainhub::dispatch::core::PodSetDemand {
        name: "node".into(),
        count: 2,
        requests_milli: [("cpu".to_string(), 1000)].into(),
    }];
    let wl = workload::workload_for(&trainjob, &pod_sets, &priority, &WorkloadStatus::default());
    let name = wl["metadata"]["name"].as_str().unwrap().to_string();
    api.store
        .commit(vec![Op::Create {
            key: Key::new(trainhub::kueue::WORKLOADS, Some("default"), &name),
            value: wl,
        }])
        .await
        .unwrap();
    let (_, _, table) = api
        .send(
            ADMIN,
            "GET",
            "/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads",
            &[("accept", TABLE)],
            None,
        )
        .await;
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Queue",
            "Reserved in",
            "Admitted",
            "Finished",
            "Age"
        ]
    );
    assert_eq!(table["rows"][0]["cells"][0], name);
    assert_eq!(table["rows"][0]["cells"][1], "user-queue");
    let (_, at_v1beta1) = api
        .admin(
            "GET",
            &format!("/apis/kueue.x-k8s.io/v1beta1/namespaces/default/workloads/{name}"),
            None,
        )
        .await;
    assert_eq!(
        at_v1beta1["spec"]["priorityClassSource"],
        "kueue.x-k8s.io/workloadpriorityclass"
    );
    assert_eq!(at_v1beta1["spec"]["priorityClassName"], "high");
    let (status, _) = api
        .admin(
            "POST",
            "/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads",
            Some(&json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "mine"}})),
        )
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn invalid_objects_are_refused_with_the_field() {
    let api = Api::start().await;
    let refused = |status: StatusCode, body: &Value| {
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body:#}");
        assert_eq!(body["reason"], "Invalid");
        causes(body)
    };

    // Kueue's webhook: a lending limit needs a cohort, at either version.
    for version in ["v1beta2", "v1beta1"] {
        let mut spec = quota_spec();
        spec["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] = json!(2);
        let (status, body) = api.create(&cluster_queue(version, "lender", spec)).await;
        assert_eq!(
            refused(status, &body),
            [(
                "spec.resourceGroups[0].flavors[0].resources[0].lendingLimit".to_string(),
                "Invalid value: \"2\": must be nil when cohort is empty".to_string()
            )],
            "{version}"
        );
        assert_eq!(
            body["message"],
            "ClusterQueue.kueue.x-k8s.io \"lender\" is invalid: spec.resourceGroups[0].flavors[0].resources[0].lendingLimit: Invalid value: \"2\": must be nil when cohort is empty"
        );
    }

    // A flavor in two resource groups, a resource in two groups.
    let spec = json!({"resourceGroups": [
        {"coveredResources": ["cpu"], "flavors": [{"name": "a", "resources": [{"name": "cpu", "nominalQuota": 1}]}]},
        {"coveredResources": ["cpu"], "flavors": [{"name": "a", "resources": [{"name": "cpu", "nominalQuota": 1}]}]},
    ]});
    let (status, body) = api.create(&cluster_queue("v1beta2", "twice", spec)).await;
    let fields: Vec<String> = refused(status, &body).into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        fields,
        [
            "spec.resourceGroups[1].coveredResources[0]",
            "spec.resourceGroups[1].flavors[0].name"
        ]
    );

    // The CRD schema: an enum, at v1beta2.
    let mut spec = quota_spec();
    spec["queueingStrategy"] = json!("Fastest");
    let (status, body) = api.create(&cluster_queue("v1beta2", "enum", spec)).await;
    let causes = refused(status, &body);
    assert_eq!(causes[0].0, "spec.queueingStrategy");
    assert!(
        causes[0].1.starts_with("Unsupported value: \"Fastest\""),
        "{causes:?}"
    );

    // The LocalQueue's ClusterQueue cannot change (the CRD's rule).
    let lq = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                    "metadata": {"name": "q", "namespace": "team-a"}, "spec": {"clusterQueue": "a"}});
    let (status, _) = api.create(&lq).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, body) = api
        .send(
            ADMIN,
            "PATCH",
            &api.path(&lq),
            &[("content-type", "application/merge-patch+json")],
            Some(&json!({"spec": {"clusterQueue": "b"}})),
        )
        .await;
    assert_eq!(
        refused(status, &body),
        [(
            "spec.clusterQueue".to_string(),
            "Invalid value: \"string\": field is immutable".to_string()
        )]
    );

    // Cohorts may not make a cycle.
    let cohort = |name: &str, parent: &str| {
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort",
               "metadata": {"name": name}, "spec": {"parentName": parent}})
    };
    assert_eq!(api.create(&cohort("a", "b")).await.0, StatusCode::CREATED);
    assert_eq!(api.create(&cohort("b", "c")).await.0, StatusCode::CREATED);
    let (status, body) = api.create(&cohort("c", "a")).await;
    assert_eq!(
        refused(status, &body),
        [(
            "spec.parentName".to_string(),
            "Invalid value: \"a\": cohort has a cycle: c -> a -> b -> c; a Cohort may not be its own ancestor".to_string()
        )]
    );
    assert_eq!(
        api.create(&cohort("c", "root")).await.0,
        StatusCode::CREATED
    );

    // A ResourceFlavor's taints are unique by key and effect.
    let rf = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "dup"},
                    "spec": {"nodeTaints": [{"key": "k", "value": "a", "effect": "NoSchedule"},
                                            {"key": "k", "value": "b", "effect": "NoSchedule"}]}});
    let (status, body) = api.create(&rf).await;
    let causes = refused(status, &body);
    assert_eq!(causes[0].0, "spec.nodeTaints[1]");
    assert!(
        causes[0]
            .1
            .ends_with("taints must be unique by key and effect pair")
    );
}

#[tokio::test]
async fn tenants_read_the_quotas_admins_write() {
    let api = Api::start().await;
    for (_, object) in examples() {
        api.apply(&object).await;
    }
    let lq = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                    "metadata": {"name": "team-queue", "namespace": "team-a"}, "spec": {"clusterQueue": "cluster-queue"}});
    let as_alice = |method: &'static str, path: String, body: Option<Value>| {
        let api = &api;
        async move { api.send(ALICE, method, &path, &[], body.as_ref()).await.0 }
    };
    let v1beta2 = "/apis/kueue.x-k8s.io/v1beta2";
    for plural in [
        "clusterqueues",
        "resourceflavors",
        "cohorts",
        "workloadpriorityclasses",
    ] {
        assert_eq!(
            as_alice("GET", format!("{v1beta2}/{plural}"), None).await,
            StatusCode::OK,
            "{plural}"
        );
    }
    assert_eq!(
        as_alice(
            "GET",
            format!("{v1beta2}/clusterqueues/cluster-queue"),
            None
        )
        .await,
        StatusCode::OK
    );
    let cq = cluster_queue("v1beta2", "mine", quota_spec());
    assert_eq!(
        as_alice("POST", format!("{v1beta2}/clusterqueues"), Some(cq)).await,
        StatusCode::FORBIDDEN
    );
    // LocalQueues: read in the granted namespace, written by admins.
    assert_eq!(
        as_alice("POST", api.collection(&lq), Some(lq.clone())).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(api.create(&lq).await.0, StatusCode::CREATED);
    assert_eq!(as_alice("GET", api.path(&lq), None).await, StatusCode::OK);
    assert_eq!(
        as_alice(
            "GET",
            format!("{v1beta2}/namespaces/team-a/workloads"),
            None
        )
        .await,
        StatusCode::OK
    );
    assert_eq!(
        as_alice(
            "GET",
            format!("{v1beta2}/namespaces/default/localqueues"),
            None
        )
        .await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        as_alice("DELETE", api.path(&lq), None).await,
        StatusCode::FORBIDDEN
    );
}
