//! The TrainJob webhooks: the defaulter's runtime-patch timestamps, the
//! reference to the runtime, the runtime-patch update rule, and the
//! translation of plugin field errors.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use trainhub_api::constants;
use trainhub_api::trainer::RuntimeRef;
use trainhub_apiserver::field::{ErrorType, FieldError};
use trainhub_apiserver::store::Key;
use trainhub_plugin_sdk as sdk;

/// Store resource of ClusterTrainingRuntimes.
pub const CLUSTER_TRAINING_RUNTIMES: &str = "trainer.kubeflow.org/clustertrainingruntimes";
/// Store resource of TrainingRuntimes.
pub const TRAINING_RUNTIMES: &str = "trainer.kubeflow.org/trainingruntimes";

/// Stamps `spec.runtimePatches[].time` as upstream's defaulter does: on
/// create, every entry without a time gets `now`; on update, an entry equal
/// (time aside) to the old entry of the same manager keeps the old time, a
/// changed entry gets `now`, and a new entry without a time gets `now`.
pub fn default_patch_times(job: &mut Value, old: Option<&Value>, now: &str) {
    let old_patches = old
        .and_then(|o| o.pointer("/spec/runtimePatches"))
        .and_then(Value::as_array);
    let Some(patches) = job
        .pointer_mut("/spec/runtimePatches")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for patch in patches {
        let Some(entry) = patch.as_object_mut() else {
            continue;
        };
        let previous = old_patches.and_then(|olds| {
            olds.iter()
                .find(|o| o.get("manager").is_some() && o.get("manager") == entry.get("manager"))
        });
        match previous {
            Some(previous) => {
                let untimed = |v: &Value| {
                    let mut v = v.clone();
                    if let Some(m) = v.as_object_mut() {
                        m.remove("time");
                    }
                    v
                };
                if untimed(previous) == untimed(&Value::Object(entry.clone())) {
                    match previous.get("time") {
                        Some(t) => entry.insert("time".into(), t.clone()),
                        None => entry.remove("time"),
                    };
                } else {
                    entry.insert("time".into(), now.into());
                }
            }
            None => {
                if entry.get("time").is_none_or(Value::is_null) {
                    entry.insert("time".into(), now.into());
                }
            }
        }
    }
}

/// The runtime-patch rule on update: `spec.runtimePatches` may change only
/// while the TrainJob is suspended before or after the update, and not while
/// a replicated Job of its JobSet still has active Jobs (as the TrainJob's
/// `status.jobsStatus` reports them).
pub fn check_runtime_patches(old: &Value, new: &Value) -> Vec<FieldError> {
    const PATH: &str = "spec.runtimePatches";
    let patches = |v: &Value| {
        v.pointer("/spec/runtimePatches")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    if patches(old) == patches(new) {
        return Vec::new();
    }
    let suspended = |v: &Value| v.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true);
    if !suspended(old) && !suspended(new) {
        return vec![FieldError::forbidden(
            PATH,
            "RuntimePatches can only be modified when the TrainJob is suspended before or after the update",
        )];
    }
    old.pointer("/status/jobsStatus")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|j| j.get("active").and_then(Value::as_i64).unwrap_or(0) > 0)
        .map(|j| {
            let name = j.get("name").and_then(Value::as_str).unwrap_or_default();
            FieldError::forbidden(
                PATH,
                format!("RuntimePatches cannot be modified when the JobSet's ReplicatedJob {name} is still active"),
            )
        })
        .collect()
}

/// Where the referenced runtime is stored, or the field error for a
/// reference to something that is not a trainer.kubeflow.org runtime.
pub fn runtime_key(runtime_ref: &RuntimeRef, namespace: &str) -> Result<Key, FieldError> {
    let group = runtime_ref.api_group_or_default();
    let kind = runtime_ref.kind_or_default();
    match (group, kind) {
        (constants::TRAINER_GROUP, constants::CLUSTER_TRAINING_RUNTIME_KIND) => {
            Ok(Key::new(CLUSTER_TRAINING_RUNTIMES, None, &runtime_ref.name))
        }
        (constants::TRAINER_GROUP, constants::TRAINING_RUNTIME_KIND) => Ok(Key::new(
            TRAINING_RUNTIMES,
            Some(namespace),
            &runtime_ref.name,
        )),
        _ => Err(FieldError::invalid(
            "spec.runtimeRef",
            ref_value(runtime_ref),
            format!("unsupported runtime: {kind}.{group}"),
        )),
    }
}

/// The error for a reference to a runtime that does not exist.
pub fn missing_runtime(runtime_ref: &RuntimeRef) -> FieldError {
    let (plural, what) = match runtime_ref.kind_or_default() {
        constants::TRAINING_RUNTIME_KIND => ("trainingruntimes", "trainingRuntime"),
        _ => ("clustertrainingruntimes", "clusterTrainingRuntime"),
    };
    FieldError::invalid(
        "spec.runtimeRef",
        ref_value(runtime_ref),
        format!(
            "{plural}.{} \"{}\" not found: specified {what} must be created before the TrainJob is created",
            constants::TRAINER_GROUP,
            runtime_ref.name
        ),
    )
}

fn ref_value(runtime_ref: &RuntimeRef) -> Value {
    serde_json::to_value(runtime_ref).unwrap_or(Value::Null)
}

/// A plugin's field error as the API reports it. Plugins hand values over
/// as text; integers and booleans are shown bare, as upstream prints them,
/// and so are lists and objects a plugin hands over as JSON (a list of env
/// entries, say), rather than as a quoted string of JSON.
pub fn from_plugin(e: sdk::FieldError) -> FieldError {
    let kind = match e.kind {
        sdk::ErrorKind::Required => ErrorType::Required,
        sdk::ErrorKind::Invalid => ErrorType::Invalid,
        sdk::ErrorKind::Forbidden => ErrorType::Forbidden,
        sdk::ErrorKind::NotSupported => ErrorType::NotSupported,
        sdk::ErrorKind::Duplicate => ErrorType::Duplicate,
        sdk::ErrorKind::TooMany => ErrorType::TooMany,
    };
    let value = e.value.map(|text| {
        if let Ok(n) = text.parse::<i64>() {
            Value::from(n)
        } else if let Ok(b) = text.parse::<bool>() {
            Value::Bool(b)
        } else if let Some(v) = text
            .starts_with(['[', '{'])
            .then(|| serde_json::from_str::<Value>(&text).ok())
            .flatten()
        {
            v
        } else {
            Value::String(text)
        }
    });
    FieldError::new(kind, e.field, value, e.detail)
}

/// `t` as `metav1.Time` serialises it: RFC 3339 in UTC, whole seconds.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let days = i64::try_from(secs / 86_400).unwrap_or_default();
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    const NOW: &str = "2025-06-15T12:00:00Z";
    const THEN: &str = "2025-01-01T00:00:00Z";

    fn job(patches: Value, suspend: bool) -> Value {
        json!({"spec": {"suspend": suspend, "runtimePatches": patches}})
    }

    #[test]
    fn create_stamps_patches_without_a_time() {
        let mut j = job(
            json!([{"manager": "a"}, {"manager": "b", "time": THEN}]),
            false,
        );
        default_patch_times(&mut j, None, NOW);
        assert_eq!(j["spec"]["runtimePatches"][0]["time"], NOW);
        assert_eq!(j["spec"]["runtimePatches"][1]["time"], THEN);
    }

    #[test]
    fn update_keeps_the_time_of_unchanged_patches() {
        let old = job(
            json!([
                {"manager": "a", "time": THEN, "trainingRuntimeSpec": {"template": {}}},
                {"manager": "b", "time": THEN},
            ]),
            true,
        );
        let mut new = job(
            json!([
                {"manager": "a", "time": "2024-01-01T00:00:00Z", "trainingRuntimeSpec": {"template": {}}},
                {"manager": "b", "trainingRuntimeSpec": {}},
                {"manager": "c"},
            ]),
            true,
        );
        default_patch_times(&mut new, Some(&old), NOW);
        let times: Vec<&Value> = (0..3)
            .map(|i| &new["spec"]["runtimePatches"][i]["time"])
            .collect();
        assert_eq!(times, [&json!(THEN), &json!(NOW), &json!(NOW)]);
    }

    #[test]
    fn patches_change_only_around_suspension() {
        let before = job(json!([{"manager": "a"}]), false);
        let after = job(json!([{"manager": "b"}]), false);
        let errors = check_runtime_patches(&before, &after);
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.runtimePatches: Forbidden: RuntimePatches can only be modified when the TrainJob is suspended before or after the update"
            ]
        );
        assert!(check_runtime_patches(&job(json!([{"manager": "a"}]), true), &after).is_empty());
        assert!(check_runtime_patches(&before, &job(json!([{"manager": "b"}]), true)).is_empty());
        assert!(check_runtime_patches(&before, &job(json!([{"manager": "a"}]), false)).is_empty());

        let mut running = job(json!([{"manager": "a"}]), false);
        running["status"] = json!({"jobsStatus": [{"name": "node", "active": 2}]});
        let errors = check_runtime_patches(&running, &job(json!([]), true));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]
                .detail
                .contains("ReplicatedJob node is still active")
        );
    }

    #[test]
    fn runtime_references() {
        let mut r = RuntimeRef {
            name: "torch".into(),
            ..Default::default()
        };
        assert_eq!(
            runtime_key(&r, "ns").unwrap(),
            Key::new(CLUSTER_TRAINING_RUNTIMES, None, "torch")
        );
        r.kind = Some("TrainingRuntime".into());
        assert_eq!(
            runtime_key(&r, "ns").unwrap(),
            Key::new(TRAINING_RUNTIMES, Some("ns"), "torch")
        );
        r.kind = Some("JobSet".into());
        assert_eq!(
            runtime_key(&r, "ns").unwrap_err().detail,
            "unsupported runtime: JobSet.trainer.kubeflow.org"
        );
        r.kind = None;
        assert_eq!(
            missing_runtime(&r).to_string(),
            "spec.runtimeRef: Invalid value: {\"name\":\"torch\"}: clustertrainingruntimes.trainer.kubeflow.org \"torch\" not found: specified clusterTrainingRuntime must be created before the TrainJob is created"
        );
    }

    #[test]
    fn plugin_values_keep_their_type() {
        let e = from_plugin(sdk::FieldError::invalid(
            "spec.trainer.numNodes",
            Some("0".into()),
            "bad",
        ));
        assert_eq!(
            e.to_string(),
            "spec.trainer.numNodes: Invalid value: 0: bad"
        );
        let e = from_plugin(sdk::FieldError::invalid(
            "spec.trainer.env[0].name",
            Some("PET_NNODES".into()),
            "bad",
        ));
        assert_eq!(
            e.to_string(),
            "spec.trainer.env[0].name: Invalid value: \"PET_NNODES\": bad"
        );
        let e = from_plugin(sdk::FieldError::invalid(
            "spec.trainer.env",
            Some(r#"[{"name":"PET_NNODES","value":"4"}]"#.into()),
            "bad",
        ));
        assert_eq!(
            e.to_string(),
            r#"spec.trainer.env: Invalid value: [{"name":"PET_NNODES","value":"4"}]: bad"#
        );
        // Text that only looks like JSON stays a string.
        let e = from_plugin(sdk::FieldError::invalid("spec.x", Some("[a".into()), "bad"));
        assert_eq!(e.to_string(), r#"spec.x: Invalid value: "[a": bad"#);
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_749_988_800)),
            "2025-06-15T12:00:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400 + 86_399)),
            "2000-02-29T23:59:59Z"
        );
    }
}
