//! End-to-end tests: the real `trainhub` binary driven by real clients
//! (kubectl, kube-rs, the Kubeflow Python SDK).

mod common;
mod kubectl;
