//! The process backend (placeholder until it is written).
