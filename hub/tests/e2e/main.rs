//! End-to-end tests: the real `trainhub` binary driven by real clients
//! (kubectl, kube-rs, the Kubeflow Python SDK).
#![allow(clippy::unwrap_used)]

mod common;
mod dispatch;
mod kube;
mod kube_clients;
mod kubectl;
mod sdk;
mod telemetry;
