//! TEMPORARY local stub (not committed) until the process backend lands.
#![allow(dead_code, unused_variables)]
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use super::*;

pub struct ProcessConfig {
    pub work_dir: PathBuf,
    pub capacity: BTreeMap<String, i64>,
    pub path_env: Option<OsString>,
}
pub struct ProcessBackend;
impl ProcessBackend {
    pub fn new(
        config: ProcessConfig,
        reports: tokio::sync::mpsc::UnboundedSender<RunReport>,
    ) -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(ProcessBackend))
    }
}
pub fn parse_quantity_milli(s: &str) -> Result<i64, String> {
    let (n, mult) = if let Some(n) = s.strip_suffix("Gi") {
        (n, 1i64 << 30)
    } else if let Some(n) = s.strip_suffix("Mi") {
        (n, 1 << 20)
    } else {
        (s, 1)
    };
    n.parse::<i64>()
        .map(|v| v * mult * 1000)
        .map_err(|e| e.to_string())
}
impl Backend for ProcessBackend {
    fn kind(&self) -> &'static str {
        "process"
    }
    fn capacity(&self) -> Vec<Capacity> {
        vec![]
    }
    fn admit(&self, key: &RunKey, pod_sets: &[PodSetRequest]) -> Result<(), BackendError> {
        Ok(())
    }
    fn withdraw(&self, key: &RunKey) {}
    fn start(&self, spec: RunSpec) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }
    fn stop(&self, run_id: &str, generation: i64) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    fn runs(&self) -> Vec<HeldRun> {
        vec![]
    }
    fn report(&self, key: &RunKey) -> Option<RunReport> {
        None
    }
    fn logs(
        &self,
        run_id: &str,
        pod: &str,
        container: Option<&str>,
        follow: bool,
        tail_lines: Option<i64>,
    ) -> BoxFuture<'_, Result<LogStream, BackendError>> {
        Box::pin(async { Err(BackendError::NotFound("x".into())) })
    }
}
