//! Server-side apply and field ownership (`metadata.managedFields`), as
//! kube-apiserver's field manager keeps them.
//!
//! - [`apply`]: the applied configuration merges into the live object; its
//!   fields become the manager's; fields the manager applied before and no
//!   longer applies are removed unless another manager owns them; changing a
//!   field another manager owns is a conflict (409) unless forced, which
//!   moves the ownership.
//! - [`record_update`]: any other write (create, update, patch) gives its
//!   manager (an `Update` entry) the fields it changed and takes them from
//!   the others, so a later apply conflicts with, say, a `kubectl edit`.
//!
//! There is one entry per manager, operation and subresource; `Update`
//! entries beyond ten are merged, oldest first, into `ancient-changes`.
//! Entries are sorted as upstream sorts them (operation, time, manager).

use serde_json::{Map, Value};

use super::fieldset::{FieldSet, PathElement, Typer, path_string};
use super::keys::ListKeys;
use crate::status::{ApiError, Cause};

/// Upstream's cap on `Update` entries before the oldest are merged.
pub const MAX_UPDATE_MANAGERS: usize = 10;
const ANCIENT_CHANGES: &str = "ancient-changes";
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// Where a write lands, for the ownership it records.
#[derive(Debug, Clone, Copy, Default)]
pub struct ManagerScope<'a> {
    /// `""` for the main resource, `"status"` for `/status`; recorded in the
    /// entries' `subresource`.
    pub subresource: &'a str,
    /// Top-level fields the endpoint resets, whose ownership is not
    /// tracked: `["status"]` on the main resource of a kind with a status
    /// subresource, `["spec", "metadata"]` on `/status`.
    pub reset_fields: &'a [&'a str],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: Operation,
    api_version: String,
    time: Option<String>,
    subresource: String,
    set: FieldSet,
}

impl Entry {
    fn same_identity(&self, manager: &str, operation: Operation, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    /// How conflicts name a manager: `"kubectl"` for an applier,
    /// `"kubectl-edit" using v1` for an updater.
    fn printed(&self) -> String {
        match self.operation {
            Operation::Apply => format!("{:?}", self.manager),
            Operation::Update => format!("{:?} using {}", self.manager, self.api_version),
        }
    }

    fn encode(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), self.manager.clone().into());
        m.insert("operation".into(), self.operation.as_str().into());
        m.insert("apiVersion".into(), self.api_version.clone().into());
        if let Some(t) = &self.time {
            m.insert("time".into(), t.clone().into());
        }
        m.insert("fieldsType".into(), "FieldsV1".into());
        m.insert("fieldsV1".into(), self.set.to_fields_v1());
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), self.subresource.clone().into());
        }
        Value::Object(m)
    }

    fn decode(v: &Value) -> Result<Entry, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let operation = match v.get("operation").and_then(Value::as_str) {
            Some("Apply") => Operation::Apply,
            Some("Update") => Operation::Update,
            _ => return Err("operation must be `Apply` or `Update`".into()),
        };
        let api_version = s("apiVersion");
        if api_version.is_empty() {
            return Err("apiVersion must not be empty".into());
        }
        if s("fieldsType") != "FieldsV1" {
            return Err(format!("invalid fieldsType {:?}", s("fieldsType")));
        }
        let set = FieldSet::from_fields_v1(v.get("fieldsV1").unwrap_or(&Value::Null))?;
        Ok(Entry {
            manager: s("manager"),
            operation,
            api_version,
            time: v.get("time").and_then(Value::as_str).map(String::from),
            subresource: s("subresource"),
            set,
        })
    }
}

fn managed_fields(obj: Option<&Value>) -> Option<&Vec<Value>> {
    obj?.pointer("/metadata/managedFields")?.as_array()
}

/// Decodes entries; a list that does not decode counts as empty, as
/// upstream treats it.
fn decode_all(list: Option<&Vec<Value>>) -> Vec<Entry> {
    list.map(|l| l.iter().map(Entry::decode).collect::<Result<Vec<_>, _>>())
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// `managedFields: [{}]` asks to drop all ownership.
fn is_reset(list: Option<&Vec<Value>>) -> bool {
    matches!(list, Some(l) if l.len() == 1 && l[0].as_object().is_some_and(|m| m.values().all(is_zero)))
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

fn field(name: &str) -> PathElement {
    PathElement::Field(name.into())
}

/// Drops what ownership does not track: identity and server-set metadata
/// (as upstream's strip-meta manager does) and the endpoint's reset fields.
fn strip(set: &mut FieldSet, scope: &ManagerScope) {
    for top in ["apiVersion", "kind"] {
        set.remove_member(&[field(top)]);
    }
    set.remove_member(&[field("metadata")]);
    for m in [
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "resourceVersion",
    ] {
        set.remove_member(&[field("metadata"), field(m)]);
    }
    set.remove_subtree(&[field("metadata"), field("managedFields")]);
    for f in scope.reset_fields {
        set.remove_subtree(&[field(f)]);
    }
}

fn without_managed_fields(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    o
}

fn set_managed_fields(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    cap_update_managers(&mut entries);
    entries.sort_by(|a, b| {
        (
            a.operation,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                b.operation,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    let Some(obj) = obj.as_object_mut() else {
        return;
    };
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    if let Some(meta) = meta.as_object_mut() {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert(
                "managedFields".into(),
                Value::Array(entries.iter().map(Entry::encode).collect()),
            );
        }
    }
}

/// Merges the oldest `Update` entries into `ancient-changes` until at most
/// [`MAX_UPDATE_MANAGERS`] remain.
fn cap_update_managers(entries: &mut Vec<Entry>) {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].operation == Operation::Update)
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort_by(|&a, &b| {
        (&entries[a].time, &entries[a].manager).cmp(&(&entries[b].time, &entries[b].manager))
    });
    let excess = updaters.len() - MAX_UPDATE_MANAGERS;
    // The oldest `excess + 1` entries become one bucket.
    let oldest: Vec<usize> = updaters.iter().take(excess + 1).copied().collect();
    let mut bucket = Entry {
        manager: ANCIENT_CHANGES.into(),
        operation: Operation::Update,
        api_version: String::new(),
        time: None,
        subresource: String::new(),
        set: FieldSet::default(),
    };
    for &i in &oldest {
        bucket.set.union_with(&entries[i].set);
        bucket.time = entries[i].time.clone();
        bucket.api_version = entries[i].api_version.clone();
    }
    let mut i = 0;
    entries.retain(|_| {
        let keep = !oldest.contains(&i);
        i += 1;
        keep
    });
    if let Some(existing) = entries
        .iter_mut()
        .find(|e| e.same_identity(ANCIENT_CHANGES, Operation::Update, ""))
    {
        existing.set.union_with(&bucket.set);
        existing.time = bucket.time;
    } else {
        entries.push(bucket);
    }
}

fn typed_patch_error(applied: &Value, err: &str) -> ApiError {
    let s = |p: &str| applied.pointer(p).and_then(Value::as_str).unwrap_or("");
    let api_version = s("/apiVersion");
    let gv = if api_version.contains('/') {
        api_version.to_string()
    } else {
        format!("/{api_version}")
    };
    ApiError::bad_request(format!(
        "failed to create typed patch object ({}/{}; {gv}, Kind={}): {err}",
        s("/metadata/namespace"),
        s("/metadata/name"),
        s("/kind")
    ))
}

/// Server-side apply of `applied` (the request body) by `manager` on `live`
/// (`None` to create). Returns the object to store, with its
/// `metadata.managedFields`; the caller sets server fields (uid,
/// resourceVersion, creationTimestamp) and resets the endpoint's ignored
/// fields. `now` is an RFC 3339 time (seconds, UTC).
///
/// # Errors
///
/// 400 when the body is not an object, sets `metadata.managedFields`, names
/// another apiVersion or kind than the live object, or has a list item
/// without its key or two items with one key; 409 Conflict with one
/// `FieldManagerConflict` cause per field when, without `force`, it changes
/// fields another manager owns.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    keys: &dyn ListKeys,
    now: &str,
) -> Result<Value, ApiError> {
    apply_in(
        live,
        applied,
        manager,
        force,
        keys,
        now,
        &ManagerScope::default(),
    )
}

/// [`apply`] on a subresource or with reset fields.
#[allow(clippy::too_many_arguments)]
pub fn apply_in(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    keys: &dyn ListKeys,
    now: &str,
    scope: &ManagerScope,
) -> Result<Value, ApiError> {
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "error decoding YAML: json: cannot unmarshal non-object into Go value of type map[string]interface {}",
        ));
    }
    if applied
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    let applied_version = applied
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(live) = live {
        let expected = live.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !expected.is_empty() && applied_version != expected {
            return Err(ApiError::bad_request(format!(
                "Incorrect version specified in apply patch. Specified patch version: {applied_version}, expected: {expected}"
            )));
        }
        let kind = live.get("kind").and_then(Value::as_str).unwrap_or("");
        let applied_kind = applied.get("kind").and_then(Value::as_str).unwrap_or("");
        if !kind.is_empty() && applied_kind != kind {
            return Err(ApiError::bad_request(format!(
                "invalid object type: {applied_version}, Kind={applied_kind}"
            )));
        }
    }

    let typer = Typer { keys };
    let mut config_set = typer
        .config_set(applied)
        .map_err(|e| typed_patch_error(applied, &e))?;
    strip(&mut config_set, scope);

    let live_obj = live
        .map(without_managed_fields)
        .unwrap_or_else(|| Value::Object(Map::new()));
    let mut entries = decode_all(managed_fields(live));

    // An object nobody tracked yet: its fields go to one updater first.
    if live.is_some() && entries.is_empty() {
        let mut c = typer.compare(&Value::Object(Map::new()), &live_obj);
        c.exclude(|s| strip(s, scope));
        let set = c.added.union(&c.modified);
        entries.push(Entry {
            manager: BEFORE_FIRST_APPLY.into(),
            operation: Operation::Update,
            api_version: live_obj
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or(applied_version)
                .to_string(),
            time: Some(now.to_string()),
            subresource: scope.subresource.to_string(),
            set,
        });
    }

    let mut merged = typer.merge(Some(&live_obj), applied);

    let me = entries
        .iter()
        .position(|e| e.same_identity(manager, Operation::Apply, scope.subresource));
    let (last_set, last_time) = match me {
        Some(i) => {
            let e = entries.remove(i);
            (e.set, e.time)
        }
        None => (FieldSet::default(), None),
    };

    // Prune what this manager stopped applying and nobody else owns.
    let mut owned = config_set.clone();
    for e in &entries {
        owned.union_with(&e.set);
    }
    let to_remove = last_set.difference(&owned);
    if !to_remove.is_empty() {
        typer.prune(&mut merged, &to_remove, &owned);
    }

    // Conflicts: fields of other managers this apply changes.
    let mut c = typer.compare(&live_obj, &merged);
    c.exclude(|s| strip(s, scope));
    let changed = c.modified.union(&c.added);
    let mut conflicts: Vec<(String, Vec<PathElement>)> = Vec::new();
    for e in &entries {
        for p in e.set.intersection(&changed).paths() {
            conflicts.push((e.printed(), p));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(conflicts));
    }
    for e in &mut entries {
        e.set = e.set.difference(&changed).difference(&c.removed);
    }

    let unchanged = merged == live_obj;
    entries.push(Entry {
        manager: manager.to_string(),
        operation: Operation::Apply,
        api_version: applied_version.to_string(),
        time: if unchanged {
            last_time.or_else(|| Some(now.to_string()))
        } else {
            Some(now.to_string())
        },
        subresource: scope.subresource.to_string(),
        set: config_set,
    });
    set_managed_fields(&mut merged, entries);
    Ok(merged)
}

/// The 409 upstream answers: `Apply failed with 1 conflict: conflict with
/// "m" using v1: .spec.x`, or per manager for several.
fn conflict_error(mut conflicts: Vec<(String, Vec<PathElement>)>) -> ApiError {
    conflicts.sort();
    let message = if let [(manager, path)] = conflicts.as_slice() {
        format!(
            "Apply failed with 1 conflict: conflict with {manager}: {}",
            path_string(path)
        )
    } else {
        let mut lines = Vec::new();
        let mut current: Option<&str> = None;
        for (manager, path) in &conflicts {
            if current != Some(manager.as_str()) {
                lines.push(format!("conflicts with {manager}:"));
                current = Some(manager);
            }
            lines.push(format!("- {}", path_string(path)));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut e = ApiError::new(409, "Conflict", message);
    e.causes = conflicts
        .iter()
        .map(|(manager, path)| Cause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with {manager}"),
            field: path_string(path),
        })
        .collect();
    e
}

/// Records in `new.metadata.managedFields` the ownership a non-apply write
/// by `manager` takes: the fields it changed from `old` (`None` for a
/// create), lists typed by `keys` as [`apply`] types them. Clients that send `managedFields` back unchanged keep them;
/// `managedFields: [{}]` drops all ownership. An existing object without
/// ownership stays untracked until its first apply, as upstream does.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    keys: &dyn ListKeys,
    now: &str,
) {
    record_update_in(
        old,
        new,
        manager,
        api_version,
        keys,
        now,
        &ManagerScope::default(),
    );
}

/// [`record_update`] on a subresource or with reset fields.
pub fn record_update_in(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    keys: &dyn ListKeys,
    now: &str,
    scope: &ManagerScope,
) {
    let requested = managed_fields(Some(new));
    let mut entries = if !scope.subresource.is_empty() {
        decode_all(managed_fields(old))
    } else if is_reset(requested) {
        Vec::new()
    } else {
        let from_request = decode_all(requested);
        if from_request.is_empty() {
            decode_all(managed_fields(old))
        } else {
            from_request
        }
    };
    if entries.is_empty() && old.is_some() {
        set_managed_fields(new, Vec::new());
        return;
    }

    let old_obj = old
        .map(without_managed_fields)
        .unwrap_or_else(|| Value::Object(Map::new()));
    let new_obj = without_managed_fields(new);
    let typer = Typer { keys };
    let mut c = typer.compare(&old_obj, &new_obj);
    c.exclude(|s| strip(s, scope));
    let changed = c.modified.union(&c.added);

    let me = entries
        .iter()
        .position(|e| e.same_identity(manager, Operation::Update, scope.subresource));
    for (i, e) in entries.iter_mut().enumerate() {
        e.set = if Some(i) == me {
            e.set.difference(&c.removed)
        } else {
            e.set.difference(&changed).difference(&c.removed)
        };
    }
    if !changed.is_empty() {
        match me {
            Some(i) => {
                let e = &mut entries[i];
                e.set.union_with(&changed);
                e.time = Some(now.to_string());
                e.api_version = api_version.to_string();
            }
            None => entries.push(Entry {
                manager: manager.to_string(),
                operation: Operation::Update,
                api_version: api_version.to_string(),
                time: Some(now.to_string()),
                subresource: scope.subresource.to_string(),
                set: changed,
            }),
        }
    }
    set_managed_fields(new, entries);
}

#[cfg(test)]
mod tests {
    use super::super::keys::BuiltinListKeys;
    use super::*;
    use serde_json::json;

    const T0: &str = "2025-06-01T10:00:00Z";
    const T1: &str = "2025-06-01T10:05:00Z";
    const T2: &str = "2025-06-01T10:10:00Z";
    const TJ: &str = "trainer.kubeflow.org/v1alpha1";

    fn trainjob(spec: Value) -> Value {
        json!({"apiVersion": TJ, "kind": "TrainJob",
               "metadata": {"name": "pytorch-dist", "namespace": "team-a"}, "spec": spec})
    }

    fn entries(obj: &Value) -> Vec<Value> {
        obj["metadata"]["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn stored(mut obj: Value) -> Value {
        // What the server adds on create.
        obj["metadata"]["uid"] = json!("5b5c8a5e-0000-4000-8000-000000000001");
        obj["metadata"]["resourceVersion"] = json!("1");
        obj
    }

    #[test]
    fn apply_creates_and_records_ownership() {
        let cfg = trainjob(json!({"runtimeRef": {"name": "torch-distributed"},
                                  "trainer": {"numNodes": 2, "env": [{"name": "A", "value": "1"}]}}));
        let obj = apply(None, &cfg, "kubectl", false, &BuiltinListKeys, T0).unwrap();
        assert_eq!(obj["spec"]["trainer"]["numNodes"], 2);
        let mf = entries(&obj);
        assert_eq!(mf.len(), 1);
        assert_eq!(
            mf[0],
            json!({"manager": "kubectl", "operation": "Apply", "apiVersion": TJ, "time": T0,
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {
                       "f:runtimeRef": {"f:name": {}},
                       "f:trainer": {"f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}},
                                     "f:numNodes": {}}}}})
        );
    }

    #[test]
    fn apply_removes_fields_it_no_longer_applies_unless_shared() {
        let cfg = trainjob(json!({"suspend": true, "trainer": {"numNodes": 2},
                                  "labelsX": {"a": "b"}}));
        let live = stored(apply(None, &cfg, "kubectl", false, &BuiltinListKeys, T0).unwrap());
        // Another applier sets numNodes to the same value: shared ownership.
        let other = trainjob(json!({"trainer": {"numNodes": 2}}));
        let live = apply(Some(&live), &other, "ci", false, &BuiltinListKeys, T1).unwrap();
        let cfg2 = trainjob(json!({"labelsX": {"a": "b"}}));
        let out = apply(Some(&live), &cfg2, "kubectl", false, &BuiltinListKeys, T2).unwrap();
        assert!(out["spec"].get("suspend").is_none(), "{out}");
        assert_eq!(out["spec"]["trainer"]["numNodes"], 2);
        assert_eq!(out["spec"]["labelsX"], json!({"a": "b"}));
        // Both appliers listed, Apply entries first by time.
        let mf = entries(&out);
        let managers: Vec<&str> = mf.iter().map(|e| e["manager"].as_str().unwrap()).collect();
        assert_eq!(managers, ["ci", "kubectl"]);
    }

    #[test]
    fn conflict_with_an_updater_is_409_and_force_takes_ownership() {
        let cfg = trainjob(json!({"suspend": true}));
        let live = stored(apply(None, &cfg, "kubectl", false, &BuiltinListKeys, T0).unwrap());
        // kubectl edit flips suspend.
        let mut edited = live.clone();
        edited["spec"]["suspend"] = json!(false);
        record_update(
            Some(&live),
            &mut edited,
            "kubectl-edit",
            TJ,
            &BuiltinListKeys,
            T1,
        );
        let mf = entries(&edited);
        assert_eq!(mf.len(), 1, "the applier lost its only field: {mf:?}");
        assert_eq!(mf[0]["manager"], "kubectl-edit");
        assert_eq!(mf[0]["operation"], "Update");
        assert_eq!(mf[0]["fieldsV1"], json!({"f:spec": {"f:suspend": {}}}));

        let e = apply(Some(&edited), &cfg, "kubectl", false, &BuiltinListKeys, T2).unwrap_err();
        assert_eq!((e.code, e.reason), (409, "Conflict"));
        assert_eq!(
            e.message,
            format!(
                "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using {TJ}: .spec.suspend"
            )
        );
        let s = e.to_status();
        assert_eq!(
            s["details"]["causes"],
            json!([{"reason": "FieldManagerConflict",
                    "message": format!("conflict with \"kubectl-edit\" using {TJ}"),
                    "field": ".spec.suspend"}])
        );

        // Applying the live value is no conflict: ownership is shared.
        let same = trainjob(json!({"suspend": false}));
        let out = apply(Some(&edited), &same, "kubectl", false, &BuiltinListKeys, T2).unwrap();
        assert_eq!(entries(&out).len(), 2);

        let forced = apply(Some(&edited), &cfg, "kubectl", true, &BuiltinListKeys, T2).unwrap();
        assert_eq!(forced["spec"]["suspend"], true);
        let mf = entries(&forced);
        assert_eq!(mf.len(), 1);
        assert_eq!(mf[0]["manager"], "kubectl");
    }

    #[test]
    fn several_conflicts_are_grouped_by_manager() {
        let live = stored(trainjob(
            json!({"suspend": false, "trainer": {"numNodes": 1}}),
        ));
        let mut a = live.clone();
        record_update(None, &mut a, "kubectl-create", TJ, &BuiltinListKeys, T0);
        let applier = json!({"apiVersion": TJ, "kind": "TrainJob",
                             "metadata": {"name": "pytorch-dist", "labels": {"x": "y"}}});
        let a = apply(Some(&a), &applier, "ops", false, &BuiltinListKeys, T0).unwrap();
        let cfg = json!({"apiVersion": TJ, "kind": "TrainJob",
                         "metadata": {"name": "pytorch-dist", "labels": {"x": "z"}},
                         "spec": {"suspend": true, "trainer": {"numNodes": 4}}});
        let e = apply(Some(&a), &cfg, "me", false, &BuiltinListKeys, T1).unwrap_err();
        assert_eq!(
            e.message,
            format!(
                "Apply failed with 3 conflicts: conflicts with \"kubectl-create\" using {TJ}:\n- .spec.suspend\n- .spec.trainer.numNodes\nconflicts with \"ops\":\n- .metadata.labels.x"
            )
        );
        assert_eq!(e.causes.len(), 3);
    }

    #[test]
    fn list_map_items_merge_by_key_and_prune_by_item() {
        let rj = |jobs: Value| {
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                   "metadata": {"name": "pytorch-dist"}, "spec": {"replicatedJobs": jobs}})
        };
        let live = stored(
            apply(
                None,
                &rj(json!([{"name": "dataset-initializer", "replicas": 1},
                           {"name": "node", "replicas": 2}])),
                "trainhub-spoke",
                false,
                &BuiltinListKeys,
                T0,
            )
            .unwrap(),
        );
        // The JobSet controller (an updater) sets a field on one item.
        let mut ctl = live.clone();
        ctl["spec"]["replicatedJobs"][1]["template"] = json!({"spec": {"parallelism": 2}});
        record_update(
            Some(&live),
            &mut ctl,
            "jobset-controller",
            "jobset.x-k8s.io/v1alpha2",
            &BuiltinListKeys,
            T1,
        );
        // The spoke stops applying the node job: its own fields go, the
        // controller's stay with the key.
        let out = apply(
            Some(&ctl),
            &rj(json!([{"name": "dataset-initializer", "replicas": 1}])),
            "trainhub-spoke",
            false,
            &BuiltinListKeys,
            T2,
        )
        .unwrap();
        assert_eq!(
            out["spec"]["replicatedJobs"],
            json!([{"name": "dataset-initializer", "replicas": 1},
                   {"name": "node", "template": {"spec": {"parallelism": 2}}}])
        );
        // Without the updater the item goes entirely.
        let out = apply(
            Some(&live),
            &rj(json!([{"name": "dataset-initializer", "replicas": 1}])),
            "trainhub-spoke",
            false,
            &BuiltinListKeys,
            T2,
        )
        .unwrap();
        assert_eq!(
            out["spec"]["replicatedJobs"],
            json!([{"name": "dataset-initializer", "replicas": 1}])
        );
    }

    #[test]
    fn managed_fields_stay_stable_over_repeated_applies() {
        let cfg = trainjob(json!({"suspend": true}));
        let mut live = stored(apply(None, &cfg, "kubectl", false, &BuiltinListKeys, T0).unwrap());
        for t in [T1, T2] {
            live = apply(Some(&live), &cfg, "kubectl", false, &BuiltinListKeys, t).unwrap();
        }
        let mf = entries(&live);
        assert_eq!(mf.len(), 1);
        // A no-op apply keeps the entry's time.
        assert_eq!(mf[0]["time"], T0);
        // Repeated updates by one manager keep one entry.
        for (i, t) in [T1, T2].iter().enumerate() {
            let mut next = live.clone();
            next["spec"]["activeDeadlineSeconds"] = json!(100 + i);
            record_update(
                Some(&live),
                &mut next,
                "kubectl-edit",
                TJ,
                &BuiltinListKeys,
                t,
            );
            live = next;
        }
        assert_eq!(entries(&live).len(), 2);
        // Eleven updaters: the oldest two merge into ancient-changes.
        for i in 0..11 {
            let mut next = live.clone();
            next["metadata"]["labels"] = json!({format!("l{i}"): "x"});
            record_update(
                Some(&live),
                &mut next,
                &format!("m{i:02}"),
                TJ,
                &BuiltinListKeys,
                &format!("2025-06-02T00:00:{i:02}Z"),
            );
            live = next;
        }
        let updaters = entries(&live)
            .into_iter()
            .filter(|e| e["operation"] == "Update")
            .count();
        assert!(updaters <= MAX_UPDATE_MANAGERS, "{updaters}");
    }

    #[test]
    fn create_records_an_update_entry_with_parents() {
        let mut obj = trainjob(json!({"runtimeRef": {"name": "torch-distributed"}}));
        obj["metadata"]["labels"] = json!({"app": "x"});
        record_update(None, &mut obj, "kubectl-create", TJ, &BuiltinListKeys, T0);
        assert_eq!(
            entries(&obj)[0]["fieldsV1"],
            json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                   "f:spec": {".": {}, "f:runtimeRef": {".": {}, "f:name": {}}}})
        );
        // An existing object without ownership stays untracked...
        let mut untracked = stored(trainjob(json!({"suspend": true})));
        let old = untracked.clone();
        untracked["spec"]["suspend"] = json!(false);
        record_update(
            Some(&old),
            &mut untracked,
            "kubectl-edit",
            TJ,
            &BuiltinListKeys,
            T0,
        );
        assert!(untracked["metadata"].get("managedFields").is_none());
        // ...until an apply, which gives its fields to before-first-apply.
        let e = apply(
            Some(&untracked),
            &trainjob(json!({"suspend": true})),
            "kubectl",
            false,
            &BuiltinListKeys,
            T1,
        )
        .unwrap_err();
        assert!(
            e.message.contains("\"before-first-apply\""),
            "{}",
            e.message
        );
        // [{}] resets ownership.
        let mut reset = obj.clone();
        reset["metadata"]["managedFields"] = json!([{}]);
        record_update(
            Some(&stored(obj.clone())),
            &mut reset,
            "kubectl",
            TJ,
            &BuiltinListKeys,
            T1,
        );
        assert!(reset["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn status_is_not_tracked_on_the_main_resource() {
        let scope = ManagerScope {
            subresource: "",
            reset_fields: &["status"],
        };
        let cfg = trainjob(json!({"suspend": true}));
        let mut cfg_with_status = cfg.clone();
        cfg_with_status["status"] = json!({"conditions": [{"type": "Complete", "status": "True"}]});
        let out = apply_in(
            None,
            &cfg_with_status,
            "kubectl",
            false,
            &BuiltinListKeys,
            T0,
            &scope,
        )
        .unwrap();
        assert!(entries(&out)[0]["fieldsV1"].get("f:status").is_none());
        // On /status, conditions are owned by their type.
        let status_scope = ManagerScope {
            subresource: "status",
            reset_fields: &["spec", "metadata"],
        };
        let live = stored(out);
        let mut new = live.clone();
        new["status"] = json!({"conditions": [{"type": "Created", "status": "True"}]});
        record_update_in(
            Some(&live),
            &mut new,
            "trainhub",
            TJ,
            &BuiltinListKeys,
            T1,
            &status_scope,
        );
        let mf = entries(&new);
        let st = mf.iter().find(|e| e["subresource"] == "status").unwrap();
        assert!(
            st["fieldsV1"]["f:status"]["f:conditions"]
                .get("k:{\"type\":\"Created\"}")
                .is_some()
        );
    }

    #[test]
    fn bad_requests() {
        let mut cfg = trainjob(json!({}));
        cfg["metadata"]["managedFields"] = json!([]);
        let e = apply(None, &cfg, "m", false, &BuiltinListKeys, T0).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "metadata.managedFields must be nil")
        );
        let live = stored(trainjob(json!({})));
        let mut other = trainjob(json!({}));
        other["apiVersion"] = json!("trainer.kubeflow.org/v1");
        let e = apply(Some(&live), &other, "m", false, &BuiltinListKeys, T0).unwrap_err();
        assert_eq!(
            e.message,
            "Incorrect version specified in apply patch. Specified patch version: trainer.kubeflow.org/v1, expected: trainer.kubeflow.org/v1alpha1"
        );
        let e = apply(
            None,
            &trainjob(json!({"trainer": {"env": [{"value": "1"}]}})),
            "m",
            false,
            &BuiltinListKeys,
            T0,
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "failed to create typed patch object (team-a/pytorch-dist; trainer.kubeflow.org/v1alpha1, Kind=TrainJob): .spec.trainer.env: element 0: associative list with keys has an element that omits key field \"name\" (and doesn't have default value)"
        );
    }
}
