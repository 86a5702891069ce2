//! Locating and reading the upstream reference files.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The `shared/` directory: `$TRAINHUB_SHARED_DIR`, else `../../../shared` from this crate.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("TRAINHUB_SHARED_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}

/// The directory of the upstream Kubeflow Trainer manifests.
pub fn trainer_dir() -> PathBuf {
    shared_dir().join("upstream/kubeflow-trainer")
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} (set TRAINHUB_SHARED_DIR?): {e}",
            path.display()
        )
    })
}

/// The `*.yaml` files directly in `dir`, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| {
        panic!(
            "cannot list {} (set TRAINHUB_SHARED_DIR?): {e}",
            dir.display()
        )
    });
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// The non-empty YAML documents of `text`, as JSON values.
pub fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

pub fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// The differences between two JSON values, one line per differing leaf, with its path.
pub fn json_diff(ours: &Value, theirs: &Value) -> Vec<String> {
    fn walk(ours: &Value, theirs: &Value, path: &str, out: &mut Vec<String>) {
        match (ours, theirs) {
            (Value::Object(a), Value::Object(b)) => {
                for (key, value) in a {
                    match b.get(key) {
                        Some(other) => walk(value, other, &format!("{path}/{key}"), out),
                        None => out.push(format!("{path}/{key}: extra {value}")),
                    }
                }
                for key in b.keys().filter(|key| !a.contains_key(*key)) {
                    out.push(format!("{path}/{key}: missing {}", b[key]));
                }
            }
            (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    walk(x, y, &format!("{path}/{i}"), out);
                }
            }
            _ if ours != theirs => out.push(format!("{path}: ours {ours}, upstream {theirs}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(ours, theirs, "", &mut out);
    out
}
