//! The bounds of the protocol: how large a message, and each collection
//! and field in it, may be. The hub refuses a spoke message past them (the
//! message is dropped and logged with the spoke's name; a message past
//! [`MAX_MESSAGE_BYTES`] ends the stream); the agent keeps what it sends
//! within them (log chunks split, events of one report capped).
//!
//! Sized for what a spoke legitimately sends, with room: a report of a gang
//! of [`MAX_PODS_PER_REPORT`] pods of a few KiB each fits in
//! [`MAX_MESSAGE_BYTES`]; a Kubernetes object never exceeds etcd's 1.5 MiB.

use crate::{SpokeMessage, spoke_message::Message};

/// Largest encoded message, either way (a `Start` carries the built
/// objects, a `RunReport` the pods of a whole gang).
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;
/// Pods in one run report (JobSet gangs are at most a few thousand pods).
pub const MAX_PODS_PER_REPORT: usize = 10_000;
/// One pod, as JSON.
pub const MAX_POD_BYTES: usize = 256 << 10;
/// Events in one run report (those since the previous report).
pub const MAX_EVENTS_PER_REPORT: usize = 1_000;
/// One event, as JSON (Kubernetes caps an event's message at 1 KiB).
pub const MAX_EVENT_BYTES: usize = 32 << 10;
/// A JobSet status, as JSON.
pub const MAX_STATUS_BYTES: usize = 1 << 20;
/// The data of one log chunk; the agent splits larger reads.
pub const MAX_LOG_CHUNK_BYTES: usize = 64 << 10;
/// Ids (run ids are TrainJob uids, request ids 32 hex digits) and short
/// texts (a backend, a version, a resource name).
pub const MAX_ID_BYTES: usize = 128;
/// Free texts: an admission refusal's reason, a log error.
pub const MAX_TEXT_BYTES: usize = 4 << 10;
/// Labels of a hello; a key is at most 253 + 1 + 63 bytes and a value
/// 63, as Kubernetes label keys and values are.
pub const MAX_LABELS: usize = 64;
pub const MAX_LABEL_KEY_BYTES: usize = 317;
pub const MAX_LABEL_VALUE_BYTES: usize = 63;
/// Resources in a capacity (hello or heartbeat).
pub const MAX_RESOURCES: usize = 64;
/// Runs a hello lists, reservations a heartbeat lists.
pub const MAX_RUNS_PER_HELLO: usize = 100_000;

/// A message past a bound: what and which bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {size} is more than the limit of {limit}")]
pub struct LimitError {
    /// The field, as a path (`report.pods_json`, `hello.labels["x"]`).
    pub field: String,
    pub size: usize,
    pub limit: usize,
}

fn bound(field: impl FnOnce() -> String, size: usize, limit: usize) -> Result<(), LimitError> {
    if size > limit {
        return Err(LimitError {
            field: field(),
            size,
            limit,
        });
    }
    Ok(())
}

fn capacity(what: &str, capacity: &[crate::Capacity]) -> Result<(), LimitError> {
    bound(|| format!("{what}.capacity"), capacity.len(), MAX_RESOURCES)?;
    for (i, c) in capacity.iter().enumerate() {
        bound(
            || format!("{what}.capacity[{i}].resource"),
            c.resource.len(),
            MAX_ID_BYTES,
        )?;
    }
    Ok(())
}

fn runs(what: &str, runs: &[crate::RunRef], limit: usize) -> Result<(), LimitError> {
    bound(|| what.into(), runs.len(), limit)?;
    for (i, r) in runs.iter().enumerate() {
        bound(
            || format!("{what}[{i}].run_id"),
            r.run_id.len(),
            MAX_ID_BYTES,
        )?;
        bound(
            || format!("{what}[{i}].reason"),
            r.reason.len(),
            MAX_ID_BYTES,
        )?;
    }
    Ok(())
}

/// Whether a spoke's message keeps within the bounds (sizes in bytes or
/// entries). The encoded size is tonic's to check, before decoding.
pub fn check(message: &SpokeMessage) -> Result<(), LimitError> {
    let Some(message) = &message.message else {
        return Ok(());
    };
    match message {
        Message::Hello(h) => {
            bound(|| "hello.labels".into(), h.labels.len(), MAX_LABELS)?;
            for (k, v) in &h.labels {
                bound(
                    || format!("hello.labels key {:?}", trimmed(k)),
                    k.len(),
                    MAX_LABEL_KEY_BYTES,
                )?;
                bound(
                    || format!("hello.labels[{:?}]", trimmed(k)),
                    v.len(),
                    MAX_LABEL_VALUE_BYTES,
                )?;
            }
            bound(|| "hello.backend".into(), h.backend.len(), MAX_ID_BYTES)?;
            bound(|| "hello.version".into(), h.version.len(), MAX_ID_BYTES)?;
            capacity("hello", &h.capacity)?;
            bound(|| "hello.runs".into(), h.runs.len(), MAX_RUNS_PER_HELLO)?;
            runs("hello.runs", &h.runs, MAX_RUNS_PER_HELLO)?;
        }
        Message::Heartbeat(hb) => {
            capacity("heartbeat", &hb.capacity)?;
            runs(
                "heartbeat.reservations",
                &hb.reservations,
                MAX_RUNS_PER_HELLO,
            )?;
        }
        Message::Stopped(s) => bound(|| "stopped.run_id".into(), s.run_id.len(), MAX_ID_BYTES)?,
        Message::Admit(a) => {
            bound(|| "admit.run_id".into(), a.run_id.len(), MAX_ID_BYTES)?;
            bound(|| "admit.reason".into(), a.reason.len(), MAX_TEXT_BYTES)?;
        }
        Message::Report(r) => {
            bound(|| "report.run_id".into(), r.run_id.len(), MAX_ID_BYTES)?;
            bound(
                || "report.jobset_status_json".into(),
                r.jobset_status_json.len(),
                MAX_STATUS_BYTES,
            )?;
            bound(
                || "report.pods_json".into(),
                r.pods_json.len(),
                MAX_PODS_PER_REPORT,
            )?;
            for (i, p) in r.pods_json.iter().enumerate() {
                bound(|| format!("report.pods_json[{i}]"), p.len(), MAX_POD_BYTES)?;
            }
            bound(
                || "report.events_json".into(),
                r.events_json.len(),
                MAX_EVENTS_PER_REPORT,
            )?;
            for (i, e) in r.events_json.iter().enumerate() {
                bound(
                    || format!("report.events_json[{i}]"),
                    e.len(),
                    MAX_EVENT_BYTES,
                )?;
            }
        }
        Message::Log(l) => {
            bound(|| "log.request_id".into(), l.request_id.len(), MAX_ID_BYTES)?;
            bound(|| "log.data".into(), l.data.len(), MAX_LOG_CHUNK_BYTES)?;
            bound(|| "log.error".into(), l.error.len(), MAX_TEXT_BYTES)?;
        }
    }
    Ok(())
}

/// At most 64 characters of a text, for a message.
fn trimmed(text: &str) -> &str {
    match text.char_indices().nth(64) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LogChunk, RunReport};

    fn report(pods: usize, pod_bytes: usize) -> SpokeMessage {
        SpokeMessage {
            message: Some(Message::Report(RunReport {
                run_id: "r".into(),
                pods_json: vec!["x".repeat(pod_bytes); pods],
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_report_of_a_large_gang_fits_and_one_pod_more_does_not() {
        assert_eq!(check(&report(MAX_PODS_PER_REPORT, 2048)), Ok(()));
        let e = check(&report(MAX_PODS_PER_REPORT + 1, 10)).unwrap_err();
        assert_eq!(e.field, "report.pods_json");
        assert_eq!(
            e.to_string(),
            format!(
                "report.pods_json: {} is more than the limit of {MAX_PODS_PER_REPORT}",
                MAX_PODS_PER_REPORT + 1
            )
        );
        let e = check(&report(2, MAX_POD_BYTES + 1)).unwrap_err();
        assert_eq!(e.field, "report.pods_json[0]");
    }

    #[test]
    fn a_log_chunk_past_the_limit_is_refused() {
        let chunk = |n: usize| SpokeMessage {
            message: Some(Message::Log(LogChunk {
                request_id: "id".into(),
                data: vec![b'a'; n],
                ..Default::default()
            })),
        };
        assert_eq!(check(&chunk(MAX_LOG_CHUNK_BYTES)), Ok(()));
        assert_eq!(
            check(&chunk(MAX_LOG_CHUNK_BYTES + 1)).unwrap_err().field,
            "log.data"
        );
    }

    #[test]
    fn a_gang_report_at_the_pod_limit_fits_in_a_message() {
        use prost::Message as _;
        // A process-backend pod is about 2 KiB of JSON.
        let encoded = report(MAX_PODS_PER_REPORT, 2048).encoded_len();
        assert!(encoded < MAX_MESSAGE_BYTES, "{encoded}");
    }
}
