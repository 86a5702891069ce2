//! `pods/log` of the stand-in: the simulated container output.
//!
//! The text is a function of the pod alone ([`crate::sim::pod_log`]), so the
//! stand-in and the kmock wrapper serve the same log without talking to the
//! simulator. A pod that has not started yet answers 400 as the kubelet
//! does; `follow` keeps the stream open until the pod terminates or goes.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use trainhub_apiserver::server::{ByteStream, LogSource};
use trainhub_apiserver::status::ApiError;
use trainhub_apiserver::store::{EventType, Key, Store};

use crate::sim::{container_name, pod_log};

pub struct SimulatedLogs {
    pub store: Arc<dyn Store>,
}

fn terminal(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

fn tail(text: &str, lines: Option<i64>) -> String {
    let Some(n) = lines.and_then(|n| usize::try_from(n).ok()) else {
        return text.to_string();
    };
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(n);
    all[start..].iter().map(|l| format!("{l}\n")).collect()
}

impl LogSource for SimulatedLogs {
    fn logs(
        &self,
        pod: &Value,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> trainhub_apiserver::server::LogsFuture {
        let pod = pod.clone();
        let container = container.map(str::to_string);
        let store = self.store.clone();
        Box::pin(async move {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let Some(c) = container_name(&pod, container.as_deref()) else {
                return Err(ApiError::bad_request(format!(
                    "container {} is not valid for pod {name}",
                    container.unwrap_or_default()
                )));
            };
            if pod["status"]["phase"].as_str().unwrap_or("Pending") == "Pending" {
                return Err(ApiError::bad_request(format!(
                    "container \"{c}\" in pod \"{name}\" is waiting to start: ContainerCreating"
                )));
            }
            let text = tail(&pod_log(&pod, Some(&c)), tail_lines);
            let first = futures_util::stream::once(async move {
                Ok::<_, std::io::Error>(bytes::Bytes::from(text))
            });
            if !follow || terminal(&pod) {
                return Ok(Box::pin(first) as ByteStream);
            }
            let key = Key::new(
                "pods",
                pod["metadata"]["namespace"].as_str(),
                pod["metadata"]["name"].as_str().unwrap_or_default(),
            );
            let watch = store
                .watch("pods", Some(&key.namespace), None)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            let mut live = watch.live;
            // Ends (with no more bytes) once the pod is terminal or gone.
            let until_done = futures_util::stream::once(async move {
                loop {
                    match store.get(&key) {
                        Some(p) if !terminal(&p.value) => {}
                        _ => break,
                    }
                    match live.recv().await {
                        Ok(e) if e.object.key == key && e.kind == EventType::Deleted => break,
                        Ok(_) | Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => break,
                    }
                }
                Ok::<_, std::io::Error>(bytes::Bytes::new())
            });
            Ok(Box::pin(futures_util::StreamExt::chain(first, until_done)) as ByteStream)
        })
    }
}
