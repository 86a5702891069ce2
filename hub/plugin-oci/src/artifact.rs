//! The wasm OCI artifact: manifest and config shapes, media types, and the
//! choice of the module layer. Pure functions over bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::digest::{Digest, clip};
use crate::error::Error;

/// The layer media type of the CNCF TAG Runtime "Wasm OCI Artifact layout",
/// which [`crate::RegistryClient::push`] writes.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The config media type of that layout.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";

/// The layer media types a module is pulled from: the CNCF layout's, the
/// wasm-to-oci one that Kubewarden and oci-client use, and Solo.io's (Istio,
/// Envoy).
pub const WASM_LAYER_MEDIA_TYPES: [&str; 3] = [
    WASM_LAYER_MEDIA_TYPE,
    "application/vnd.wasm.content.layer.v1+wasm",
    "application/vnd.module.wasm.content.layer.v1+wasm",
];

pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const OCI_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_LIST_MEDIA_TYPE: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";

/// An OCI content descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl Descriptor {
    pub fn of(media_type: &str, bytes: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: Digest::of(bytes).to_string(),
            size: bytes.len() as u64,
            annotations: None,
        }
    }
}

/// An OCI (or Docker v2) image manifest; an index parses with `manifests`
/// set and no `config`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifests: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl Manifest {
    /// An OCI image manifest of `config` and `layers`.
    pub fn image(config: Descriptor, layers: Vec<Descriptor>) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST_MEDIA_TYPE.into()),
            config: Some(config),
            layers,
            manifests: None,
            annotations: None,
        }
    }

    /// Parses an image manifest (not an index).
    ///
    /// # Errors
    /// [`Error::NotAModule`] for an index, another schema, or malformed JSON.
    pub fn parse(reference: &str, bytes: &[u8]) -> Result<Manifest, Error> {
        let not_a_module = |reason: String| Error::NotAModule {
            reference: reference.to_string(),
            reason,
        };
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| not_a_module(format!("the manifest is not an OCI manifest: {e}")))?;
        let media_type = manifest.media_type.as_deref();
        if manifest.manifests.is_some()
            || matches!(
                media_type,
                Some(OCI_INDEX_MEDIA_TYPE) | Some(DOCKER_LIST_MEDIA_TYPE)
            )
        {
            return Err(not_a_module(
                "it is an image index (a list of manifests); pin the digest of one module manifest"
                    .into(),
            ));
        }
        if manifest.schema_version != 2 {
            return Err(not_a_module(format!(
                "schemaVersion {} (expected 2)",
                manifest.schema_version
            )));
        }
        if let Some(other) =
            media_type.filter(|m| *m != OCI_MANIFEST_MEDIA_TYPE && *m != DOCKER_MANIFEST_MEDIA_TYPE)
        {
            return Err(not_a_module(format!("manifest media type {}", clip(other))));
        }
        if manifest.config.is_none() {
            return Err(not_a_module("the manifest has no config".into()));
        }
        Ok(manifest)
    }

    /// The serialized manifest, as pushed.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Plain strings, numbers and maps always serialize.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The one wasm layer: its media type is one of
    /// [`WASM_LAYER_MEDIA_TYPES`]; other layers are ignored.
    ///
    /// # Errors
    /// [`Error::NotAModule`] when there is none, or more than one.
    pub fn wasm_layer(&self, reference: &str) -> Result<(&Descriptor, Digest), Error> {
        let not_a_module = |reason: String| Error::NotAModule {
            reference: reference.to_string(),
            reason,
        };
        let mut wasm = self
            .layers
            .iter()
            .filter(|l| WASM_LAYER_MEDIA_TYPES.contains(&l.media_type.as_str()));
        let Some(layer) = wasm.next() else {
            let found: Vec<String> = self
                .layers
                .iter()
                .map(|l| clip(&l.media_type))
                .take(4)
                .collect();
            return Err(not_a_module(format!(
                "no layer of a wasm media type ({}); found [{}]",
                WASM_LAYER_MEDIA_TYPES.join(", "),
                found.join(", ")
            )));
        };
        if wasm.next().is_some() {
            return Err(not_a_module(
                "more than one wasm layer; a plugin is one component".into(),
            ));
        }
        let digest = Digest::parse(&layer.digest, false)
            .map_err(|e| not_a_module(format!("the wasm layer's {e}")))?;
        Ok((layer, digest))
    }
}

/// The config blob of the CNCF layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// RFC 3339.
    pub created: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Always `wasm`.
    pub architecture: String,
    /// `wasip2` for a component, `wasip1` for a core module.
    pub os: String,
    pub layer_digests: Vec<String>,
    /// Required for `wasip2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentInfo>,
}

/// A component's top-level imports and exports, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentInfo {
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl WasmConfig {
    /// The config for `module`: `wasip2` with its component's imports and
    /// exports when it is a component, `wasip1` when it is a core module.
    ///
    /// # Errors
    /// [`Error::NotAModule`] when the bytes are neither.
    pub fn for_module(module: &[u8], created: &str) -> Result<WasmConfig, Error> {
        let (os, component) = if wasmparser::Parser::is_component(module) {
            ("wasip2", Some(component_info(module)?))
        } else if wasmparser::Parser::is_core_wasm(module) {
            ("wasip1", None)
        } else {
            return Err(Error::NotAModule {
                reference: "the file".into(),
                reason: "it is neither a wasm component nor a core module (no \\0asm header)"
                    .into(),
            });
        };
        Ok(WasmConfig {
            created: created.to_string(),
            author: None,
            architecture: "wasm".into(),
            os: os.into(),
            layer_digests: vec![Digest::of(module).to_string()],
            component,
        })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The names of a component's own (outermost) imports and exports.
fn component_info(module: &[u8]) -> Result<ComponentInfo, Error> {
    use wasmparser::Payload;
    let invalid = |e: wasmparser::BinaryReaderError| Error::NotAModule {
        reference: "the file".into(),
        reason: format!("the component does not parse: {e}"),
    };
    let mut info = ComponentInfo::default();
    // Nested modules and components each open with a Version and close with
    // an End; only depth 1 is the component itself.
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        match payload.map_err(invalid)? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    info.imports
                        .push(import.map_err(invalid)?.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    info.exports
                        .push(export.map_err(invalid)?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_with(layers: &[&str]) -> Manifest {
        Manifest::image(
            Descriptor::of(WASM_CONFIG_MEDIA_TYPE, b"{}"),
            layers
                .iter()
                .map(|m| Descriptor::of(m, m.as_bytes()))
                .collect(),
        )
    }

    #[test]
    fn picks_the_one_wasm_layer_of_any_common_media_type() {
        for media_type in WASM_LAYER_MEDIA_TYPES {
            let m = manifest_with(&["text/plain", media_type]);
            let parsed = Manifest::parse("r", &m.to_bytes()).unwrap();
            let (layer, digest) = parsed.wasm_layer("r").unwrap();
            assert_eq!(layer.media_type, media_type);
            assert_eq!(digest, Digest::of(media_type.as_bytes()));
        }
        let e = manifest_with(&["text/plain"]).wasm_layer("r").unwrap_err();
        assert!(
            e.to_string().contains("no layer of a wasm media type"),
            "{e}"
        );
        let e = manifest_with(&["application/wasm", "application/wasm"])
            .wasm_layer("r")
            .unwrap_err();
        assert!(e.to_string().contains("more than one wasm layer"), "{e}");
    }

    #[test]
    fn refuses_indexes_and_other_schemas() {
        let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
        let e = Manifest::parse("r", index).unwrap_err();
        assert!(e.to_string().contains("image index"), "{e}");
        let v1 = br#"{"schemaVersion":1,"config":{"mediaType":"a","digest":"b","size":1}}"#;
        assert!(Manifest::parse("r", v1).is_err());
        assert!(Manifest::parse("r", b"\xff").is_err());
        let negative = br#"{"schemaVersion":2,"config":{"mediaType":"a","digest":"b","size":-1}}"#;
        assert!(Manifest::parse("r", negative).is_err());
    }

    #[test]
    fn config_describes_a_core_module_and_refuses_other_bytes() {
        let core = b"\0asm\x01\0\0\0";
        let config = WasmConfig::for_module(core, "2024-01-01T00:00:00Z").unwrap();
        assert_eq!(config.os, "wasip1");
        assert_eq!(config.architecture, "wasm");
        assert_eq!(config.layer_digests, [Digest::of(core).to_string()]);
        assert!(WasmConfig::for_module(b"ELF", "x").is_err());
    }
}
