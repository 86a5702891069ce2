//! The few request bodies kubectl sends only as Kubernetes protobuf
//! (`application/vnd.kubernetes.protobuf`): its typed clients write
//! `Namespace` (`kubectl create namespace`), `ResourceQuota` (`kubectl
//! create quota`) and the self reviews (`kubectl auth can-i`, `kubectl auth
//! whoami`) that way, whatever the server
//! prefers. They are decoded into the JSON the rest of the server handles;
//! every other kind is 415, and answers are always JSON (kubectl accepts
//! it).
//!
//! The envelope is `k8s\0` and a `runtime.Unknown` (typeMeta = 1, raw = 2);
//! the messages are those of `k8s.io/api`, by field number.

use serde_json::{Map, Value, json};

use crate::status::ApiError;

/// The protobuf media type of Kubernetes.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8] = b"k8s\0";

enum Field<'a> {
    Varint,
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of one message, in order; `None` when it is malformed.
fn fields(mut buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    fn varint(buf: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = buf.split_first()?;
            *buf = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let field = match key & 7 {
            0 => {
                varint(&mut buf)?;
                Field::Varint
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                buf = buf.get(n..)?;
                Field::Fixed
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let (bytes, rest) = (buf.get(..len)?, buf.get(len..)?);
                buf = rest;
                Field::Bytes(bytes)
            }
            _ => return None,
        };
        out.push((key >> 3, field));
    }
    Some(out)
}

fn text(bytes: &[u8]) -> Option<String> {
    String::from_utf8(bytes.to_vec()).ok()
}

/// Reads the string fields of a message named by `names[number - 1]`.
fn strings(msg: &[u8], names: &[&str]) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    for (number, field) in fields(msg)? {
        let name = usize::try_from(number)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| names.get(i));
        if let (Some(name), Field::Bytes(b)) = (name, field)
            && !name.is_empty()
        {
            let s = text(b)?;
            if !s.is_empty() {
                out.insert((*name).to_string(), s.into());
            }
        }
    }
    Some(out)
}

fn string_map(entry: &[u8], map: &mut Map<String, Value>) -> Option<()> {
    let (mut key, mut value) = (String::new(), String::new());
    for (number, field) in fields(entry)? {
        match (number, field) {
            (1, Field::Bytes(b)) => key = text(b)?,
            (2, Field::Bytes(b)) => value = text(b)?,
            _ => {}
        }
    }
    map.insert(key, value.into());
    Some(())
}

/// `ObjectMeta`: what a client may set on a create.
fn object_meta(msg: &[u8]) -> Option<Value> {
    let mut meta = Map::new();
    let (mut labels, mut annotations, mut finalizers) = (Map::new(), Map::new(), Vec::new());
    for (number, field) in fields(msg)? {
        let Field::Bytes(b) = field else { continue };
        match number {
            1 => drop(meta.insert("name".into(), text(b)?.into())),
            2 => drop(meta.insert("generateName".into(), text(b)?.into())),
            3 => drop(meta.insert("namespace".into(), text(b)?.into())),
            6 => drop(meta.insert("resourceVersion".into(), text(b)?.into())),
            11 => string_map(b, &mut labels)?,
            12 => string_map(b, &mut annotations)?,
            14 => finalizers.push(Value::String(text(b)?)),
            _ => {}
        }
    }
    meta.retain(|_, v| v.as_str().is_none_or(|s| !s.is_empty()));
    if !labels.is_empty() {
        meta.insert("labels".into(), labels.into());
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), annotations.into());
    }
    if !finalizers.is_empty() {
        meta.insert("finalizers".into(), finalizers.into());
    }
    Some(Value::Object(meta))
}

fn message(msg: &[u8], number: u64) -> Option<Option<&[u8]>> {
    Some(fields(msg)?.into_iter().find_map(|(n, f)| match f {
        Field::Bytes(b) if n == number => Some(b),
        _ => None,
    }))
}

/// The object of `kind` encoded in `raw`.
fn object(api_version: &str, kind: &str, raw: &[u8]) -> Option<Value> {
    let metadata = match message(raw, 1)? {
        Some(m) => object_meta(m)?,
        None => json!({}),
    };
    let mut object = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
    let spec = message(raw, 2)?.unwrap_or_default();
    match kind {
        "Namespace" => {
            let mut finalizers = Vec::new();
            for (number, field) in fields(spec)? {
                if let (1, Field::Bytes(b)) = (number, field) {
                    finalizers.push(Value::String(text(b)?));
                }
            }
            object["spec"] = json!({"finalizers": finalizers});
        }
        "SelfSubjectAccessReview" => {
            let mut out = Map::new();
            if let Some(r) = message(spec, 1)? {
                let names = [
                    "namespace",
                    "verb",
                    "group",
                    "version",
                    "resource",
                    "subresource",
                    "name",
                ];
                out.insert("resourceAttributes".into(), strings(r, &names)?.into());
            }
            if let Some(n) = message(spec, 2)? {
                out.insert(
                    "nonResourceAttributes".into(),
                    strings(n, &["path", "verb"])?.into(),
                );
            }
            object["spec"] = Value::Object(out);
        }
        "SelfSubjectRulesReview" => {
            object["spec"] = Value::Object(strings(spec, &["namespace"])?);
        }
        "ResourceQuota" => {
            // hard = 1 (map to Quantity, whose string is 1), scopes = 2,
            // scopeSelector = 3 (kept only as present: the hub refuses it).
            let (mut hard, mut scopes, mut selector) = (Map::new(), Vec::new(), false);
            for (number, field) in fields(spec)? {
                let Field::Bytes(b) = field else { continue };
                match number {
                    1 => {
                        let (mut name, mut quantity) = (String::new(), String::new());
                        for (n, f) in fields(b)? {
                            match (n, f) {
                                (1, Field::Bytes(k)) => name = text(k)?,
                                (2, Field::Bytes(q)) => {
                                    quantity = message(q, 1)?.map_or(Some(String::new()), text)?;
                                }
                                _ => {}
                            }
                        }
                        hard.insert(name, quantity.into());
                    }
                    2 => scopes.push(Value::String(text(b)?)),
                    3 => selector = true,
                    _ => {}
                }
            }
            let mut out = Map::new();
            if !hard.is_empty() {
                out.insert("hard".into(), hard.into());
            }
            if !scopes.is_empty() {
                out.insert("scopes".into(), scopes.into());
            }
            if selector {
                out.insert("scopeSelector".into(), json!({}));
            }
            object["spec"] = Value::Object(out);
        }
        "SelfSubjectReview" => {}
        _ => return None,
    }
    Some(object)
}

/// Decodes a protobuf request body of one of the kinds above.
///
/// # Errors
///
/// 415 for other kinds (send JSON), 400 for a malformed body.
#[allow(clippy::result_large_err, reason = "ApiError is the crate's error")]
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let malformed =
        || ApiError::bad_request("the object provided is unrecognized or malformed: bad protobuf");
    let envelope = body.strip_prefix(MAGIC).ok_or_else(malformed)?;
    let type_meta = message(envelope, 1)
        .ok_or_else(malformed)?
        .unwrap_or_default();
    let raw = message(envelope, 2)
        .ok_or_else(malformed)?
        .unwrap_or_default();
    let tm = strings(type_meta, &["apiVersion", "kind"]).ok_or_else(malformed)?;
    let api_version = tm
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = tm.get("kind").and_then(Value::as_str).unwrap_or_default();
    if !matches!(
        kind,
        "Namespace"
            | "ResourceQuota"
            | "SelfSubjectAccessReview"
            | "SelfSubjectRulesReview"
            | "SelfSubjectReview"
    ) {
        return Err(ApiError::unsupported_media_type(&format!(
            "{MEDIA_TYPE} ({api_version} {kind}: send it as application/json)"
        )));
    }
    object(api_version, kind, raw).ok_or_else(malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `k8s\0` envelope of a type meta `tm` and an object `raw`.
    fn envelope(tm: &[u8], raw: &[u8]) -> Vec<u8> {
        [
            &b"k8s\x00"[..],
            &[0x0a, tm.len() as u8],
            tm,
            &[0x12, raw.len() as u8],
            raw,
        ]
        .concat()
    }

    #[test]
    fn decodes_what_kubectl_sends() {
        // `kubectl create namespace x`, as kubectl 1.33 sends it.
        let ns = b"k8s\x00\n\x0f\n\x02v1\x12\tNamespace\x12\x19\n\x11\n\x01x\x12\x00\x1a\x00\"\x00*\x002\x008\x00B\x00\x12\x00\x1a\x02\n\x00\x1a\x00\"\x00";
        assert_eq!(
            decode(ns).unwrap(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}, "spec": {"finalizers": []}})
        );
        // A SelfSubjectAccessReview of `create trainjobs -n team-b`.
        let attrs = [
            (1u8, "team-b"),
            (2, "create"),
            (3, "trainer.kubeflow.org"),
            (5, "trainjobs"),
        ];
        let mut r = Vec::new();
        for (n, s) in attrs {
            r.extend([n << 3 | 2, s.len() as u8]);
            r.extend(s.as_bytes());
        }
        let spec = [&[0x0a, r.len() as u8][..], &r].concat();
        let raw = [&[0x12, spec.len() as u8][..], &spec].concat();
        let tm = b"\n\x17authorization.k8s.io/v1\x12\x17SelfSubjectAccessReview";
        let v = decode(&envelope(tm, &raw)).unwrap();
        assert_eq!(
            v["spec"]["resourceAttributes"],
            json!({"namespace": "team-b", "verb": "create", "group": "trainer.kubeflow.org", "resource": "trainjobs"})
        );
        assert_eq!(
            decode(b"k8s\x00\n\x07\n\x02v1\x12\x01X").unwrap_err().code,
            415
        );
        // `kubectl create quota q --hard=count/trainjobs.trainer.kubeflow.org=2,x=1k`.
        let entry = |name: &str, quantity: &str| {
            let q = [&[0x0a, quantity.len() as u8][..], quantity.as_bytes()].concat();
            let e = [
                &[0x0a, name.len() as u8][..],
                name.as_bytes(),
                &[0x12, q.len() as u8],
                &q,
            ]
            .concat();
            [&[0x0a, e.len() as u8][..], &e].concat()
        };
        let spec = [
            entry("count/trainjobs.trainer.kubeflow.org", "2"),
            entry("x", "1k"),
            b"\x12\x0aBestEffort".to_vec(),
        ]
        .concat();
        let raw = [
            &b"\x0a\x03\x0a\x01q"[..],
            &[0x12, spec.len() as u8],
            &spec,
            b"\x1a\x00",
        ]
        .concat();
        let tm = b"\n\x02v1\x12\x0dResourceQuota";
        assert_eq!(
            decode(&envelope(tm, &raw)).unwrap(),
            json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"}, "spec": {
                "hard": {"count/trainjobs.trainer.kubeflow.org": "2", "x": "1k"},
                "scopes": ["BestEffort"],
            }})
        );
        assert_eq!(decode(b"nope").unwrap_err().code, 400);
        assert_eq!(decode(b"k8s\x00\n\xff").unwrap_err().code, 400);
    }
}
