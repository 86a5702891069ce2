//! `ResourceQuota` (core v1), object counts: how many objects of a kind a
//! namespace may hold, as kube-apiserver's quota admission and the quota
//! controller keep them. The server side (the charge in the create's own
//! commit, the controller that recounts after deletions) is in
//! `server::quota`; this module is the kind and its rules, over JSON.
//!
//! - `spec.hard` names `count/<resource>.<group>` (`count/<resource>` for
//!   the core group) of a namespaced resource the server lets clients
//!   create, with a whole number: `count/trainjobs.trainer.kubeflow.org: 20`.
//!   Compute quota (`requests.cpu`, `limits.memory`, GPUs) is Kueue's
//!   ClusterQueues' here, so such names are refused, as are `scopes` and
//!   `scopeSelector` (which select pods by their own fields).
//! - `status.hard` is the quota the controller last counted against and
//!   `status.used` what it counted; every create adds one to `used` in the
//!   commit that stores the object, so concurrent creates (on any replica)
//!   never pass `hard` together; deletions are counted back by the
//!   controller.
//! - A create into a namespace whose quota has no usage yet for the
//!   resource is refused ("status unknown for quota"), as kube-apiserver
//!   does until its controller first counted.

use serde_json::{Map, Value, json};

use crate::field::FieldError;
use crate::resource::{PrinterColumn, ResourceDef, kind_schema};

/// The store key (and plural) of resource quotas.
pub const RESOURCE_QUOTAS: &str = "resourcequotas";
/// The most objects a quota may allow of one resource: more than a store
/// can hold, and small enough that counting never overflows.
pub const MAX_COUNT: u64 = 1 << 40;

/// Whether `def` is the core `resourcequotas` resource.
pub fn is_resource_quotas(def: &ResourceDef) -> bool {
    def.group.is_empty() && def.plural == RESOURCE_QUOTAS
}

/// The quota resource name counting the objects of `def`:
/// `count/trainjobs.trainer.kubeflow.org`, `count/configmaps`.
pub fn count_name(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        format!("count/{}", def.plural)
    } else {
        format!("count/{}.{}", def.plural, def.group)
    }
}

/// Whether clients' creates of `def` are counted: namespaced and writable
/// (the views the server writes itself, pods and events, are not).
pub fn is_countable(def: &ResourceDef) -> bool {
    def.namespaced && !def.read_only && def.is_storage_version()
}

/// A whole, non-negative number of objects as a quantity spells it: `10`,
/// `1k` (1000), `2Ki` (2048). `None` for anything else (fractions,
/// negative numbers, milli units, exponents).
pub fn parse_count(text: &str) -> Option<u64> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let number: u64 = digits.parse().ok()?;
    let factor: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    number.checked_mul(factor)
}

/// The counted resources a quota's `spec.hard` limits, with their limits,
/// in name order. Names and values it cannot read are left out (validation
/// refuses them before they are stored).
pub fn hard(quota: &Value) -> Vec<(String, u64)> {
    let Some(hard) = quota["spec"]["hard"].as_object() else {
        return Vec::new();
    };
    let mut limits: Vec<(String, u64)> = hard
        .iter()
        .filter(|(name, _)| name.starts_with("count/"))
        .filter_map(|(name, v)| Some((name.clone(), parse_count(v.as_str()?)?)))
        .collect();
    limits.sort();
    limits
}

/// What `status.used` says of `name`: `None` when the controller has not
/// counted it yet.
pub fn used(quota: &Value, name: &str) -> Option<u64> {
    quota["status"]["used"][name].as_str().and_then(parse_count)
}

/// `spec.hard` with its numbers as quantity strings (`10` as `"10"`), as
/// kube-apiserver stores a quantity whatever JSON type it came as.
pub fn normalize(quota: &mut Value) {
    if let Some(hard) = quota["spec"]["hard"].as_object_mut() {
        for value in hard.values_mut() {
            if let Value::Number(n) = value {
                *value = Value::String(n.to_string());
            }
        }
    }
}

/// `spec` of a ResourceQuota, against the rules above: `countable` is every
/// count name the server accepts.
pub fn validate(quota: &Value, countable: &[String]) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &quota["spec"];
    match &spec["hard"] {
        Value::Null => {}
        Value::Object(hard) => {
            for (name, value) in hard {
                let field = format!("spec.hard[{name}]");
                if !countable.iter().any(|c| c == name) {
                    let detail = if name.starts_with("count/") {
                        format!(
                            "must count a namespaced resource clients create here, one of: {}",
                            countable.join(", ")
                        )
                    } else {
                        format!(
                            "the hub's quotas count objects (count/<resource>.<group>, e.g. {}); compute quota (requests, limits, GPUs) is set in Kueue's ClusterQueues",
                            countable
                                .first()
                                .map_or("count/trainjobs.trainer.kubeflow.org", String::as_str)
                        )
                    };
                    errors.push(FieldError::invalid(
                        "spec.hard",
                        Value::String(name.clone()),
                        detail,
                    ));
                    continue;
                }
                match value.as_str().and_then(parse_count) {
                    Some(n) if n <= MAX_COUNT => {}
                    Some(_) => errors.push(FieldError::invalid(
                        field,
                        value.clone(),
                        format!("must be less than or equal to {MAX_COUNT}"),
                    )),
                    None => errors.push(FieldError::invalid(
                        field,
                        value.clone(),
                        "must be a whole, non-negative number of objects, such as 10 or 1k",
                    )),
                }
            }
        }
        other => errors.push(FieldError::invalid(
            "spec.hard",
            other.clone(),
            "must be a map of resource names to quantities",
        )),
    }
    for field in ["scopes", "scopeSelector"] {
        if !spec[field].is_null() {
            errors.push(FieldError::forbidden(
                format!("spec.{field}"),
                "not supported by the hub: a quota counts every object of its resources in the namespace",
            ));
        }
    }
    errors
}

/// The status a quota should have once `count` (objects of a count name
/// in the quota's namespace) is known: `hard` as `spec.hard` gives it,
/// `used` counted, for the names of `spec.hard` that `count` knows.
pub fn status(quota: &Value, count: impl Fn(&str) -> Option<u64>) -> Value {
    let mut hard = Map::new();
    let mut used = Map::new();
    for (name, value) in quota["spec"]["hard"].as_object().into_iter().flatten() {
        if let Some(n) = count(name) {
            hard.insert(name.clone(), value.clone());
            used.insert(name.clone(), n.to_string().into());
        }
    }
    json!({"hard": hard, "used": used})
}

/// Why a create is refused by a quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The controller has not counted `resource` under `quota` yet.
    Unknown { quota: String, resource: String },
    /// One more would pass the quota's hard limit.
    Exceeded {
        quota: String,
        resource: String,
        used: u64,
        hard: u64,
    },
}

impl Refusal {
    /// The reason as kube-apiserver's quota admission words it.
    pub fn message(&self) -> String {
        match self {
            Refusal::Unknown { quota, resource } => {
                format!("status unknown for quota: {quota}, resources: {resource}")
            }
            Refusal::Exceeded {
                quota,
                resource,
                used,
                hard,
            } => format!(
                "exceeded quota: {quota}, requested: {resource}=1, used: {resource}={used}, limited: {resource}={hard}"
            ),
        }
    }
}

/// One more object counted as `resource` under `quota`: the quota with
/// `status.used` raised by one, `None` when the quota does not count
/// `resource`, or why the object may not be created.
pub fn charge(quota: &Value, quota_name: &str, resource: &str) -> Result<Option<Value>, Refusal> {
    let Some(&(_, hard)) = hard(quota).iter().find(|(name, _)| name == resource) else {
        return Ok(None);
    };
    let Some(used) = used(quota, resource) else {
        return Err(Refusal::Unknown {
            quota: quota_name.to_string(),
            resource: resource.to_string(),
        });
    };
    if used >= hard {
        return Err(Refusal::Exceeded {
            quota: quota_name.to_string(),
            resource: resource.to_string(),
            used,
            hard,
        });
    }
    let mut charged = quota.clone();
    charged["status"]["used"][resource] = (used + 1).to_string().into();
    Ok(Some(charged))
}

/// kubectl's REQUEST column (or LIMIT, for `limits.*` names): every name of
/// `status.hard` as `name: used/hard`, in name order.
fn usage_column(quota: &Value, limits: bool) -> Value {
    let Some(hard) = quota["status"]["hard"].as_object() else {
        return Value::String(String::new());
    };
    let mut names: Vec<&String> = hard.keys().collect();
    names.sort();
    let cells: Vec<String> = names
        .into_iter()
        .filter(|name| name.starts_with("limits.") == limits)
        .map(|name| {
            let show = |v: &Value| v.as_str().unwrap_or("0").to_string();
            format!(
                "{name}: {}/{}",
                show(&quota["status"]["used"][name.as_str()]),
                show(&hard[name.as_str()])
            )
        })
        .collect();
    Value::String(cells.join(", "))
}

fn request_column(quota: &Value) -> Value {
    usage_column(quota, false)
}

fn limit_column(quota: &Value) -> Value {
    usage_column(quota, true)
}

/// The served `ResourceQuota` resource: `kubectl get quota` shows NAME AGE
/// REQUEST LIMIT, as kube-apiserver prints it.
pub fn resource_def() -> ResourceDef {
    let quantities = json!({
        "type": "object",
        "additionalProperties": {"x-kubernetes-int-or-string": true},
    });
    ResourceDef {
        group: String::new(),
        version: "v1".into(),
        kind: "ResourceQuota".into(),
        list_kind: "ResourceQuotaList".into(),
        plural: RESOURCE_QUOTAS.into(),
        singular: "resourcequota".into(),
        short_names: vec!["quota".into()],
        namespaced: true,
        status_subresource: true,
        printer_columns: vec![
            PrinterColumn {
                name: "Age".into(),
                type_: "date".into(),
                json_path: ".metadata.creationTimestamp".into(),
                description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
                ..Default::default()
            },
            PrinterColumn {
                name: "Request".into(),
                type_: "string".into(),
                description: "Request represents a minimum amount of cpu/memory that a container may consume.".into(),
                render: Some(request_column),
                ..Default::default()
            },
            PrinterColumn {
                name: "Limit".into(),
                type_: "string".into(),
                description: "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.".into(),
                render: Some(limit_column),
                ..Default::default()
            },
        ],
        schema: Some(kind_schema(
            "ResourceQuota sets aggregate quota restrictions enforced per namespace",
            (
                "Spec defines the desired quota.",
                json!({
                    "hard": quantities.clone(),
                    "scopes": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "atomic"},
                    "scopeSelector": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }),
            ),
            (
                "Status defines the actual enforced quota and its current usage.",
                json!({"hard": quantities.clone(), "used": quantities}),
            ),
        )),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TJ: &str = "count/trainjobs.trainer.kubeflow.org";

    fn quota(hard: Value, status: Value) -> Value {
        json!({"metadata": {"name": "q", "namespace": "team-a"}, "spec": {"hard": hard}, "status": status})
    }

    #[test]
    fn counts_are_whole_quantities() {
        assert_eq!(parse_count("0"), Some(0));
        assert_eq!(parse_count("25"), Some(25));
        assert_eq!(parse_count("1k"), Some(1000));
        assert_eq!(parse_count("2Ki"), Some(2048));
        for bad in [
            "",
            "-1",
            "1.5",
            "500m",
            "1e3",
            "k",
            "10 ",
            "99999999999999999999",
            "1x",
        ] {
            assert_eq!(parse_count(bad), None, "{bad:?}");
        }
        assert_eq!(parse_count("18446744073709551615Ti"), None, "overflow");
    }

    #[test]
    fn a_quota_is_charged_one_object_until_its_hard_limit() {
        let q = quota(
            json!({TJ: "2"}),
            json!({"hard": {TJ: "2"}, "used": {TJ: "1"}}),
        );
        let charged = charge(&q, "q", TJ).unwrap().expect("counted");
        assert_eq!(charged["status"]["used"][TJ], "2");
        assert_eq!(
            charge(&charged, "q", TJ),
            Err(Refusal::Exceeded {
                quota: "q".into(),
                resource: TJ.into(),
                used: 2,
                hard: 2
            })
        );
        assert_eq!(
            charge(&charged, "q", TJ).unwrap_err().message(),
            "exceeded quota: q, requested: count/trainjobs.trainer.kubeflow.org=1, used: count/trainjobs.trainer.kubeflow.org=2, limited: count/trainjobs.trainer.kubeflow.org=2"
        );
        // Another resource is not this quota's business.
        assert_eq!(
            charge(&q, "q", "count/trainingruntimes.trainer.kubeflow.org"),
            Ok(None)
        );
        // Not counted yet: refused, not let through.
        let fresh = quota(json!({TJ: "2"}), Value::Null);
        assert_eq!(
            charge(&fresh, "q", TJ).unwrap_err().message(),
            "status unknown for quota: q, resources: count/trainjobs.trainer.kubeflow.org"
        );
        // A hard limit of zero allows none.
        let zero = quota(
            json!({TJ: "0"}),
            json!({"hard": {TJ: "0"}, "used": {TJ: "0"}}),
        );
        assert!(matches!(
            charge(&zero, "q", TJ),
            Err(Refusal::Exceeded { .. })
        ));
    }

    #[test]
    fn validation_names_the_field_and_the_rule() {
        let countable = vec![TJ.to_string()];
        assert!(validate(&quota(json!({TJ: "10"}), Value::Null), &countable).is_empty());
        let errors = validate(
            &json!({"spec": {
                "hard": {TJ: "1.5", "requests.cpu": "4", "count/pods": "3", "count/trainingruntimes.trainer.kubeflow.org": 2},
                "scopes": ["BestEffort"],
            }}),
            &countable,
        );
        let text: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message()))
            .collect();
        assert_eq!(errors.len(), 5, "{text:#?}");
        assert!(text.iter().any(|t| t.starts_with("spec.hard[count/trainjobs.trainer.kubeflow.org]: Invalid value: \"1.5\": must be a whole")), "{text:#?}");
        assert!(
            text.iter()
                .any(|t| t.contains("\"requests.cpu\": the hub's quotas count objects")),
            "{text:#?}"
        );
        assert!(text.iter().any(|t| t.contains("\"count/pods\": must count a namespaced resource clients create here, one of: count/trainjobs.trainer.kubeflow.org")), "{text:#?}");
        assert!(
            text.iter().any(|t| t.starts_with("spec.scopes: Forbidden")),
            "{text:#?}"
        );
        let too_many = validate(&quota(json!({TJ: "2Ti"}), Value::Null), &countable);
        assert_eq!(too_many.len(), 1);
        // A YAML number is a quantity too, once normalized.
        let mut number = quota(json!({TJ: 10}), Value::Null);
        assert_eq!(validate(&number, &countable).len(), 1);
        normalize(&mut number);
        assert!(validate(&number, &countable).is_empty());
        assert_eq!(hard(&number), vec![(TJ.to_string(), 10)]);
    }

    #[test]
    fn status_counts_what_spec_limits_and_columns_print_it() {
        let q = quota(
            json!({TJ: "10", "count/other.example.com": "1"}),
            Value::Null,
        );
        let status = status(&q, |name| (name == TJ).then_some(3));
        assert_eq!(status, json!({"hard": {TJ: "10"}, "used": {TJ: "3"}}));
        let shown = json!({"status": {"hard": {TJ: "10", "limits.cpu": "4"}, "used": {TJ: "3"}}});
        assert_eq!(
            request_column(&shown),
            "count/trainjobs.trainer.kubeflow.org: 3/10"
        );
        assert_eq!(limit_column(&shown), "limits.cpu: 0/4");
        assert_eq!(request_column(&json!({})), "");
    }
}
