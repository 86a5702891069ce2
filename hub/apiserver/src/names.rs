//! Object and namespace names, labels and annotations, validated as
//! kube-apiserver validates them
//! (`k8s.io/apimachinery/pkg/util/validation`): namespace names are
//! DNS-1123 labels, object names DNS-1123 subdomains, with upstream's
//! messages word for word.
//!
//! Valid names never contain `/` or `|`, so they are also safe as path
//! segments and as parts of the store's keys.

use crate::field::FieldError;

/// Longest DNS-1123 label (namespace names).
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// Longest DNS-1123 subdomain (object names).
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;

const DNS1123_LABEL_ERROR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_ERROR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

fn max_len(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn is_label_body(label: &str) -> bool {
    let bytes = label.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

/// Upstream's `IsDNS1123Label`: the reasons `value` is not one (none when
/// it is).
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errors.push(max_len(DNS1123_LABEL_MAX_LENGTH));
    }
    if !is_label_body(value) {
        errors.push(DNS1123_LABEL_ERROR.to_string());
    }
    errors
}

/// Upstream's `IsDNS1123Subdomain`: the reasons `value` is not one.
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(max_len(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !value.split('.').all(is_label_body) {
        errors.push(DNS1123_SUBDOMAIN_ERROR.to_string());
    }
    errors
}

/// Field errors for `metadata.name` of an object: a namespace's name must be
/// a DNS-1123 label, every other object's a DNS-1123 subdomain.
pub fn validate_name(name: &str, is_namespace: bool) -> Vec<FieldError> {
    let reasons = if is_namespace {
        dns1123_label(name)
    } else {
        dns1123_subdomain(name)
    };
    reasons
        .into_iter()
        .map(|r| FieldError::invalid("metadata.name", name, r))
        .collect()
}

/// Field errors for `metadata.namespace` of a namespaced object.
pub fn validate_namespace(namespace: &str) -> Vec<FieldError> {
    dns1123_label(namespace)
        .into_iter()
        .map(|r| FieldError::invalid("metadata.namespace", namespace, r))
        .collect()
}

/// The most bytes an object's annotations may hold, keys and values
/// together (kube-apiserver's `TotalAnnotationSizeLimitB`).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// Field errors for `metadata.labels` and `metadata.annotations`, as
/// kube-apiserver's `ValidateObjectMeta` reports them: a label key must be a
/// qualified name and its value a label value; an annotation key a
/// qualified name (checked lowercased, as upstream does), and all
/// annotations together at most [`MAX_ANNOTATIONS_BYTES`].
pub fn validate_labels_and_annotations(meta: &serde_json::Value) -> Vec<FieldError> {
    use crate::selector::{label_value_errors, qualified_name_errors};
    let mut errors = Vec::new();
    if let Some(labels) = meta["labels"].as_object() {
        for (key, value) in labels {
            for reason in qualified_name_errors(key) {
                errors.push(FieldError::invalid("metadata.labels", key.as_str(), reason));
            }
            if let Some(value) = value.as_str() {
                for reason in label_value_errors(value) {
                    errors.push(FieldError::invalid("metadata.labels", value, reason));
                }
            }
        }
    }
    if let Some(annotations) = meta["annotations"].as_object() {
        let mut size = 0usize;
        for (key, value) in annotations {
            for reason in qualified_name_errors(&key.to_lowercase()) {
                errors.push(FieldError::invalid(
                    "metadata.annotations",
                    key.as_str(),
                    reason,
                ));
            }
            size = size
                .saturating_add(key.len())
                .saturating_add(value.as_str().map_or(0, str::len));
        }
        if size > MAX_ANNOTATIONS_BYTES {
            errors.push(FieldError::new(
                crate::field::ErrorType::TooLong,
                "metadata.annotations",
                None,
                format!("may not be more than {MAX_ANNOTATIONS_BYTES} bytes"),
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_annotations_read_like_kube_apiserver() {
        let ok = serde_json::json!({
            "labels": {"app.kubernetes.io/name": "mnist", "team": "", "a_b.c-d": "v_1.2-3"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "Note": "any text at all"},
        });
        assert!(validate_labels_and_annotations(&ok).is_empty());
        let bad = serde_json::json!({
            "labels": {"bad key": "ok", "fine": "bad value!", "x/": "", &"k".repeat(64): ""},
            "annotations": {"-no": "", "big": "x".repeat(MAX_ANNOTATIONS_BYTES)},
        });
        let errors: Vec<String> = validate_labels_and_annotations(&bad)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "metadata.labels: Invalid value: \"bad key\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "metadata.labels: Invalid value: \"bad value!\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                &format!(
                    "metadata.labels: Invalid value: \"{}\": name part must be no more than 63 bytes",
                    "k".repeat(64)
                ),
                "metadata.labels: Invalid value: \"x/\": name part must be non-empty",
                "metadata.labels: Invalid value: \"x/\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "metadata.annotations: Invalid value: \"-no\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "metadata.annotations: Too long: may not be more than 262144 bytes",
            ]
        );
    }

    #[test]
    fn subdomains_as_upstream() {
        for ok in ["a", "a-b", "a.b", "0", "a1.b-2.c", &"a".repeat(253)] {
            assert!(dns1123_subdomain(ok).is_empty(), "{ok}");
        }
        for bad in [
            "", "A", "a_b", "-a", "a-", "a..b", ".a", "a.", "a|b", "a/b", "a b", "é",
        ] {
            assert_eq!(
                dns1123_subdomain(bad),
                vec![DNS1123_SUBDOMAIN_ERROR.to_string()],
                "{bad:?}"
            );
        }
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254)),
            vec!["must be no more than 253 characters".to_string()]
        );
    }

    #[test]
    fn labels_as_upstream() {
        for ok in ["a", "team-a", "0-0", &"a".repeat(63)] {
            assert!(dns1123_label(ok).is_empty(), "{ok}");
        }
        for bad in ["", "a.b", "Team", "a|b", "a/b", "-a", "a-"] {
            assert_eq!(
                dns1123_label(bad),
                vec![DNS1123_LABEL_ERROR.to_string()],
                "{bad:?}"
            );
        }
        assert_eq!(
            dns1123_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters".to_string()]
        );
    }

    #[test]
    fn field_errors_read_like_kube_apiserver() {
        let errors = validate_name("A_b", false);
        assert_eq!(
            errors[0].to_string(),
            "metadata.name: Invalid value: \"A_b\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        );
        let errors = validate_name("team|a", true);
        assert_eq!(
            errors[0].to_string(),
            "metadata.name: Invalid value: \"team|a\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
        assert_eq!(validate_namespace("a.b")[0].field, "metadata.namespace");
    }
}
