//! End-to-end tests: the real `trainhub` binary driven by real clients
//! (kubectl, kube-rs, the Kubeflow Python SDK), and the packaging that
//! starts them (Helm charts, Dockerfiles).
#![allow(clippy::unwrap_used)]

mod charts;
mod common;
mod dashboard;
mod dispatch;
mod faults;
mod ha;
mod kube;
mod kube_clients;
mod kubectl;
mod plugins;
mod progress;
mod quotas;
mod readme;
mod sdk;
mod security;
mod telemetry;
