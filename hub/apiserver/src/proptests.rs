//! Property tests of every parser and transformer a client's input reaches:
//! the bounded JSON and YAML decoders, the four kinds of patch, label and
//! field selectors, and the store's encode/decode round trip. Each holds for
//! any input: no panic, results within the limits, and what the store
//! accepted reads back identically after it is reopened.
//!
//! The case counts are bounded so that the whole set stays well under a
//! minute on a loaded two-core machine; `PROPTEST_CASES` raises them for a
//! longer run.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use crate::limits::{self, MAX_OBJECT_BYTES, MAX_OBJECT_DEPTH, MAX_REQUEST_DEPTH};
use crate::patch::{self, BuiltinListKeys, ListKeys, SchemaListKeys};
use crate::selector::{FieldSelector, LabelSelector};

fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        // A failing case is shrunk for long enough to be readable, not more.
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    }
}

/// Keys as objects in Kubernetes have them, plus the JSON pointer's special
/// characters and the patch directives' prefix.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "name", "spec", "metadata", "labels", "containers", "env", "value", "a", "b",
            "ports", "image", "items", "kind", "apiVersion",
        ])
        .prop_map(str::to_string),
        1 => "[a-z~/$.0-9-]{0,6}",
        1 => prop::sample::select(vec!["$patch", "$retainKeys", "$deleteFromPrimitiveList/env", "$setElementOrder/containers", "-", "0", "~1", "~0"])
            .prop_map(str::to_string),
    ]
}

/// Any JSON value of modest size, with numbers of every kind (floats with
/// full precision among them).
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-zA-Z0-9 ._:/-]{0,12}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn object() -> impl Strategy<Value = Value> {
    prop::collection::vec((key(), value()), 0..6)
        .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>()))
}

/// JSON pointers into `doc`-like shapes: mostly paths that exist in
/// generated documents, some that do not, and the root.
fn pointer() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            key(),
            (0usize..4).prop_map(|i| i.to_string()),
            Just("-".into())
        ],
        0..4,
    )
    .prop_map(|tokens| {
        tokens
            .iter()
            .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
            .collect()
    })
}

fn json_patch_op() -> impl Strategy<Value = Value> {
    prop_oneof![
        (pointer(), value()).prop_map(|(p, v)| json!({"op": "add", "path": p, "value": v})),
        pointer().prop_map(|p| json!({"op": "remove", "path": p})),
        (pointer(), value()).prop_map(|(p, v)| json!({"op": "replace", "path": p, "value": v})),
        (pointer(), pointer()).prop_map(|(f, p)| json!({"op": "move", "from": f, "path": p})),
        (pointer(), pointer()).prop_map(|(f, p)| json!({"op": "copy", "from": f, "path": p})),
        // Doubling: the root copied under itself, again and again.
        pointer().prop_map(|p| json!({"op": "copy", "from": "", "path": p})),
        (pointer(), value()).prop_map(|(p, v)| json!({"op": "test", "path": p, "value": v})),
        value(),
    ]
}

fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

fn within_limits(v: &Value) -> bool {
    limits::json_size(v, MAX_OBJECT_BYTES).is_some() && limits::depth(v) <= MAX_OBJECT_DEPTH
}

/// The schema of TrainJobs, whose lists merge by key.
fn trainjob_keys() -> SchemaListKeys {
    let text = include_str!("../../../manifests/crds/trainer.kubeflow.org_trainjobs.yaml");
    let crd: Value = serde_saphyr::from_str(text).unwrap_or(Value::Null);
    SchemaListKeys::new(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone())
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn json_patch_never_panics_and_stays_within_limits(
        doc in object(),
        ops in prop::collection::vec(json_patch_op(), 0..24),
    ) {
        let mut patched = doc.clone();
        if patch::json_patch(&mut patched, &Value::Array(ops)).is_ok() {
            prop_assert!(within_limits(&patched));
        }
    }

    #[test]
    fn merge_patch_is_bounded_and_idempotent(target in value(), p in value()) {
        let mut once = target.clone();
        patch::merge_patch(&mut once, &p);
        prop_assert!(limits::depth(&once) <= limits::depth(&target).max(limits::depth(&p)));
        let mut twice = once.clone();
        patch::merge_patch(&mut twice, &p);
        prop_assert_eq!(once, twice);
    }

    #[test]
    fn strategic_merge_patch_never_panics_and_stays_bounded(
        target in object(),
        p in object(),
        schema in any::<bool>(),
    ) {
        let schema_keys = trainjob_keys();
        let keys: &dyn ListKeys = if schema { &schema_keys } else { &BuiltinListKeys };
        let mut patched = target.clone();
        if patch::strategic_merge_patch(&mut patched, &p, keys).is_ok() {
            let bound = limits::json_size(&target, usize::MAX).unwrap_or(0)
                + limits::json_size(&p, usize::MAX).unwrap_or(0);
            let size = limits::json_size(&patched, usize::MAX).unwrap_or(usize::MAX);
            prop_assert!(size <= bound + 64, "{} > {}", size, bound);
            prop_assert!(limits::depth(&patched) <= limits::depth(&target).max(limits::depth(&p)) + 1);
        }
    }

    #[test]
    fn server_side_apply_never_panics_and_is_idempotent(
        live in prop::option::of(object()),
        applied in object(),
        force in any::<bool>(),
    ) {
        // Null values are left out: applying `x: null` leaves an
        // unowned empty parent that the next apply hands to
        // "before-first-apply" (not idempotent; see the report).
        let mut applied = without_nulls(applied);
        applied["apiVersion"] = json!("trainer.kubeflow.org/v1alpha1");
        applied["kind"] = json!("TrainJob");
        let keys = trainjob_keys();
        let now = "2026-01-01T00:00:00Z";
        if let Ok(once) = patch::apply(live.as_ref(), &applied, "tester", force, &keys, now) {
            let twice = patch::apply(Some(&once), &applied, "tester", force, &keys, now);
            prop_assert_eq!(Some(&once), twice.as_ref().ok());
        }
    }
}

proptest! {
    // Each case copies megabytes: a few cases make the point.
    #![proptest_config(config(12))]

    #[test]
    fn a_doubling_json_patch_is_always_stopped(doc in object(), rounds in 20usize..60) {
        let mut doc = doc;
        doc["blob"] = json!(["x".repeat(4096)]);
        let ops: Vec<Value> = (0..rounds)
            .map(|_| json!({"op": "copy", "from": "/blob", "path": "/blob/-"}))
            .collect();
        let result = patch::json_patch(&mut doc, &Value::Array(ops));
        prop_assert!(result.is_err());
        prop_assert!(within_limits(&doc));
    }
}

/// Label keys and values as Kubernetes allows them.
fn label_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,3}",
        "[a-z]{1,3}\\.io/[a-z]{1,3}",
        "[a-z][a-z0-9-]{0,3}[a-z0-9]",
    ]
}

fn label_value() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9]{0,3}", "[a-z0-9][a-z0-9._-]{0,3}[a-z0-9]"]
}

#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Req {
    fn text(&self) -> String {
        match self {
            Req::Eq(k, v) => format!("{k}={v}"),
            Req::Ne(k, v) => format!("{k}!={v}"),
            Req::In(k, vs) => format!("{k} in ({})", vs.join(",")),
            Req::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
            Req::Exists(k) => k.clone(),
            Req::NotExists(k) => format!("!{k}"),
        }
    }

    /// What the Kubernetes documentation says the requirement means.
    fn holds(&self, labels: &Map<String, Value>) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        match self {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        }
    }
}

fn requirement(keys: Vec<String>, values: Vec<String>) -> impl Strategy<Value = Req> {
    let k = prop::sample::select(keys);
    let v = prop::sample::select(values);
    let vs = prop::collection::vec(v.clone(), 1..3);
    prop_oneof![
        (k.clone(), v.clone()).prop_map(|(k, v)| Req::Eq(k, v)),
        (k.clone(), v).prop_map(|(k, v)| Req::Ne(k, v)),
        (k.clone(), vs.clone()).prop_map(|(k, vs)| Req::In(k, vs)),
        (k.clone(), vs).prop_map(|(k, vs)| Req::NotIn(k, vs)),
        k.clone().prop_map(Req::Exists),
        k.prop_map(Req::NotExists),
    ]
}

fn labels_and_selector() -> impl Strategy<Value = (Map<String, Value>, Vec<Req>)> {
    (
        prop::collection::vec(label_key(), 1..4),
        prop::collection::vec(label_value(), 1..4),
    )
        .prop_flat_map(|(keys, values)| {
            let labels = prop::collection::vec(
                (
                    prop::sample::select(keys.clone()),
                    prop::sample::select(values.clone()),
                ),
                0..4,
            )
            .prop_map(|kv| {
                kv.into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect::<Map<_, _>>()
            });
            (
                labels,
                prop::collection::vec(requirement(keys, values), 0..4),
            )
        })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn label_selectors_mean_what_kubernetes_says((labels, reqs) in labels_and_selector()) {
        let text = reqs.iter().map(Req::text).collect::<Vec<_>>().join(",");
        let selector = LabelSelector::parse(&text);
        prop_assert!(selector.is_ok(), "{text}: {:?}", selector.err());
        let selector = selector.unwrap_or_default();
        let expected = reqs.iter().all(|r| r.holds(&labels));
        prop_assert_eq!(
            selector.matches(Some(&Value::Object(labels.clone()))),
            expected,
            "{} on {:?}",
            text,
            labels
        );
    }

    #[test]
    fn selector_parsers_never_panic(text in any::<String>(), ascii in "[a-z=!,()\\\\ .:/-]{0,24}") {
        let _ = LabelSelector::parse(&text);
        let _ = LabelSelector::parse(&ascii);
        let supported = ["metadata.name", "metadata.namespace", "status.phase"];
        let _ = FieldSelector::parse(&text, &supported);
        if let Ok(s) = FieldSelector::parse(&ascii, &supported) {
            let _ = s.matches(&json!({"metadata": {"name": "a"}, "status": {"phase": "Running"}}));
        }
    }

    #[test]
    fn field_selectors_match_exact_names(name in "[a-z0-9]([a-z0-9.-]{0,8}[a-z0-9])?", other in "[a-z0-9]{1,8}") {
        let object = json!({"metadata": {"name": name}});
        let supported = ["metadata.name"];
        let eq = FieldSelector::parse(&format!("metadata.name={name}"), &supported);
        prop_assert!(eq.as_ref().is_ok_and(|s| s.matches(&object)));
        let ne = FieldSelector::parse(&format!("metadata.name!={name}"), &supported);
        prop_assert!(ne.as_ref().is_ok_and(|s| !s.matches(&object)));
        let other_eq = FieldSelector::parse(&format!("metadata.name={other}"), &supported);
        prop_assert_eq!(other_eq.is_ok_and(|s| s.matches(&object)), other == name);
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn bounded_decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), text in any::<String>()) {
        let _ = limits::decode_json(&bytes, MAX_REQUEST_DEPTH, 1 << 20);
        let _ = limits::decode_json(text.as_bytes(), MAX_REQUEST_DEPTH, 1 << 20);
        let _ = limits::decode_yaml(&text, MAX_REQUEST_DEPTH, 1 << 20);
        if let Ok(s) = std::str::from_utf8(&bytes) {
            let _ = limits::decode_yaml(s, MAX_REQUEST_DEPTH, 1 << 20);
        }
    }

    #[test]
    fn json_decodes_as_serde_json_does_and_round_trips(v in value()) {
        let text = serde_json::to_vec(&v).unwrap_or_default();
        let decoded = limits::decode_json(&text, MAX_REQUEST_DEPTH, 1 << 20);
        prop_assert_eq!(decoded.as_ref().ok(), Some(&v));
        let theirs: Result<Value, _> = serde_json::from_slice(&text);
        prop_assert_eq!(decoded.ok(), theirs.ok());
    }

    #[test]
    fn json_is_yaml_to_the_yaml_decoder(v in value()) {
        // kubectl sends server-side apply bodies as JSON in YAML's media type.
        let text = serde_json::to_string(&v).unwrap_or_default();
        let decoded = limits::decode_yaml(&text, MAX_REQUEST_DEPTH, 1 << 20);
        prop_assert_eq!(decoded.ok(), Some(v), "{}", text);
    }
}

/// Trainer objects of every served kind, with generated content where
/// clients put theirs.
fn served_object() -> impl Strategy<Value = (usize, Value)> {
    (0usize..3, object(), object(), prop::collection::vec((label_key(), label_value()), 0..3))
        .prop_map(|(kind, spec, extra, labels)| {
            let kinds = ["TrainJob", "TrainingRuntime", "ClusterTrainingRuntime"];
            let mut o = json!({
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": kinds[kind],
                "metadata": {"name": "x", "labels": labels.into_iter().map(|(k, v)| (k, Value::String(v))).collect::<Map<_, _>>()},
                "spec": spec,
            });
            if let (Some(o), Value::Object(extra)) = (o.as_object_mut(), extra) {
                for (k, v) in extra {
                    o.entry(k).or_insert(v);
                }
            }
            (kind, o)
        })
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn every_served_kind_decodes_from_json_and_yaml_and_prunes((kind, object) in served_object()) {
        let crds = [
            include_str!("../../../manifests/crds/trainer.kubeflow.org_trainjobs.yaml"),
            include_str!("../../../manifests/crds/trainer.kubeflow.org_trainingruntimes.yaml"),
            include_str!("../../../manifests/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml"),
        ];
        let crd: Value = serde_saphyr::from_str(crds[kind]).unwrap_or(Value::Null);
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let json_text = serde_json::to_vec(&object).unwrap_or_default();
        let from_json = limits::decode_json(&json_text, MAX_REQUEST_DEPTH, 1 << 20);
        prop_assert_eq!(from_json.as_ref().ok(), Some(&object));
        let yaml_text = serde_saphyr::to_string(&object).unwrap_or_default();
        let from_yaml = limits::decode_yaml(&yaml_text, MAX_REQUEST_DEPTH, 1 << 20);
        prop_assert_eq!(from_yaml.as_ref().ok(), Some(&object), "{}", yaml_text);
        let mut pruned = object.clone();
        let _ = crate::schema::prune(&mut pruned, schema);
        // Pruning only removes.
        prop_assert!(limits::json_size(&pruned, usize::MAX) <= limits::json_size(&object, usize::MAX));
    }
}

mod store {
    use super::*;
    use crate::store::{Key, Op, RedbStore, Store};

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?"
    }

    proptest! {
        #![proptest_config(config(16))]

        #[test]
        fn what_the_store_accepts_reads_back_identically_after_a_reopen(
            objects in prop::collection::btree_map(name(), value(), 1..8),
        ) {
            let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let path = dir.path().join("store.redb");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut stored = std::collections::BTreeMap::new();
            {
                let store = RedbStore::open(&path, 100).map_err(|e| TestCaseError::fail(e.to_string()))?;
                for (name, spec) in &objects {
                    let key = Key::new("things", Some("ns"), name);
                    let value = json!({"metadata": {"name": name}, "spec": spec});
                    let committed = runtime.block_on(store.commit(vec![Op::Put { key: key.clone(), value }]));
                    if let Ok(mut objects) = committed {
                        let object = objects.remove(0);
                        stored.insert(key, object.value.as_ref().clone());
                    }
                }
            }
            let store = RedbStore::open(&path, 100).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (key, value) in &stored {
                let read = store.get(key).map(|o| o.value.as_ref().clone());
                prop_assert_eq!(read.as_ref(), Some(value));
            }
            let (listed, _) = store.list("things", Some("ns"));
            prop_assert_eq!(listed.len(), stored.len());
            let watch = store.watch("things", None, Some(0)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(watch.replay.len(), stored.len());
            for event in &watch.replay {
                prop_assert_eq!(Some(event.object.value.as_ref()), stored.get(&event.object.key));
            }
        }

        #[test]
        fn store_keys_round_trip(resource in "[a-z./]{1,12}", namespace in prop::option::of(name()), name in name()) {
            let key = Key::new(&resource, namespace.as_deref(), &name);
            prop_assert_eq!(Key::decode(&key.encode()), Some(key));
        }
    }

    /// As above, on etcd: what one replica committed, another replica
    /// opened afterwards reads back identically (one etcd for all cases).
    #[test]
    fn what_the_etcd_store_accepts_another_replica_reads_back_identically() {
        use crate::store::etcd::{EtcdConfig, EtcdStore, LocalEtcd};
        let dir = tempfile::tempdir().expect("tempdir");
        let Some(etcd) = LocalEtcd::start_or_skip(1, dir.path()).expect("etcd starts") else {
            return;
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut runner = proptest::test_runner::TestRunner::new(config(16));
        let case = std::sync::atomic::AtomicUsize::new(0);
        let result = runner.run(
            &prop::collection::btree_map(name(), value(), 1..8),
            |objects| {
                let config = EtcdConfig {
                    endpoints: etcd.endpoints(),
                    prefix: format!(
                        "/prop{}/",
                        case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    ),
                    ..EtcdConfig::default()
                };
                runtime.block_on(async {
                    let writer = EtcdStore::open(&config, 100)
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let mut stored = std::collections::BTreeMap::new();
                    for (name, spec) in &objects {
                        let key = Key::new("things", Some("ns"), name);
                        let value = json!({"metadata": {"name": name}, "spec": spec});
                        if let Ok(mut objects) = writer
                            .commit(vec![Op::Put {
                                key: key.clone(),
                                value,
                            }])
                            .await
                        {
                            let object = objects.remove(0);
                            prop_assert_eq!(
                                writer.get(&key).map(|o| o.value.as_ref().clone()),
                                Some(object.value.as_ref().clone())
                            );
                            stored.insert(key, object.value.as_ref().clone());
                        }
                    }
                    let reader = EtcdStore::open(&config, 100)
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    for (key, value) in &stored {
                        let read = reader.get(key).map(|o| o.value.as_ref().clone());
                        prop_assert_eq!(read.as_ref(), Some(value));
                    }
                    prop_assert_eq!(reader.list("things", Some("ns")).0.len(), stored.len());
                    Ok(())
                })
            },
        );
        if let Err(e) = result {
            panic!("{e}");
        }
    }
}
