//! (filled by the namespaces work)
