/// Errors returned by this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A generated manifest could not be rendered as YAML.
    #[error("cannot render {what} as YAML: {source}")]
    Yaml {
        /// What was being rendered, e.g. the CRD name.
        what: String,
        /// The serializer's error.
        #[source]
        source: serde_saphyr::SerializeError,
    },
}
