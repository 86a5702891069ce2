//! TrainJob lifecycle that needs no spoke: suspension and the active
//! deadline, with conditions spelled as upstream's controller sets them.
//!
//! - `spec.suspend: true` → `Suspended=True` (reason `Suspended`);
//! - resumed after a suspension → `Suspended=False` (reason `Resumed`);
//! - `spec.activeDeadlineSeconds` counts from the job's start: its creation,
//!   or its last resumption (the `Resumed` condition's transition time);
//!   suspended jobs do not run out; past the deadline → `Failed=True`
//!   (reason `DeadlineExceeded`);
//! - a finished job (`Complete` or `Failed` is `True`) is left alone.

use jiff::Timestamp;
use serde_json::{Value, json};
use trainhub_api::constants::{
    CONDITION_COMPLETE, CONDITION_FAILED, CONDITION_SUSPENDED, MESSAGE_DEADLINE_EXCEEDED,
    MESSAGE_RESUMED, MESSAGE_SUSPENDED, REASON_DEADLINE_EXCEEDED, REASON_RESUMED, REASON_SUSPENDED,
};

/// What reconciling one TrainJob decided.
#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    /// The new `status`, when it changes.
    pub status: Option<Value>,
    /// When to look again (the deadline), if anything is pending.
    pub requeue_at: Option<Timestamp>,
}

pub(crate) fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

pub(crate) fn is_true(status: &Value, type_: &str) -> bool {
    condition(status, type_).is_some_and(|c| c["status"] == "True")
}

/// Whether a TrainJob's status says it finished: Complete or Failed.
pub(crate) fn is_finished(status: &Value) -> bool {
    is_true(status, CONDITION_COMPLETE) || is_true(status, CONDITION_FAILED)
}

/// Sets a condition; the transition time moves only when its status does.
pub(crate) fn set_condition(
    status: &mut Value,
    type_: &str,
    state: &str,
    reason: &str,
    message: &str,
    now: &str,
) {
    if !status.is_object() {
        *status = json!({});
    }
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let new = json!({
        "type": type_,
        "status": state,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    });
    let Some(conditions) = status["conditions"].as_array_mut() else {
        return;
    };
    match conditions.iter_mut().find(|c| c["type"] == type_) {
        Some(c) if c["status"] == state => {
            c["reason"] = reason.into();
            c["message"] = message.into();
        }
        Some(c) => *c = new,
        None => conditions.push(new),
    }
}

fn parse_time(v: &Value) -> Option<Timestamp> {
    v.as_str()?.parse().ok()
}

pub fn format_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// When the job started running, for its active deadline.
fn started_at(job: &Value, status: &Value) -> Option<Timestamp> {
    match condition(status, CONDITION_SUSPENDED) {
        Some(c) if c["status"] == "False" && c["reason"] == REASON_RESUMED => {
            parse_time(&c["lastTransitionTime"])
        }
        _ => parse_time(&job["metadata"]["creationTimestamp"]),
    }
}

pub fn reconcile(job: &Value, now: Timestamp) -> Decision {
    let old = job.get("status").cloned().unwrap_or_else(|| json!({}));
    if is_finished(&old) {
        return Decision::default();
    }
    let now_text = format_time(now);
    let mut status = old.clone();
    // Held by its queue (the hub's quota said no: `QuotaReserved` False) is
    // suspended as Kueue suspends a TrainJob it has not admitted: the
    // Suspended condition says so (and `kubectl get trainjobs` prints it),
    // and the active deadline counts from the admission, not from creation.
    let held = condition(&old, crate::kueue::conditions::QUOTA_RESERVED)
        .is_some_and(|c| c["status"] == "False");
    let suspend = job["spec"]["suspend"].as_bool() == Some(true) || held;
    let mut requeue_at = None;
    if suspend {
        set_condition(
            &mut status,
            CONDITION_SUSPENDED,
            "True",
            REASON_SUSPENDED,
            MESSAGE_SUSPENDED,
            &now_text,
        );
    } else {
        if is_true(&status, CONDITION_SUSPENDED) {
            set_condition(
                &mut status,
                CONDITION_SUSPENDED,
                "False",
                REASON_RESUMED,
                MESSAGE_RESUMED,
                &now_text,
            );
        }
        if let (Some(seconds), Some(start)) = (
            job["spec"]["activeDeadlineSeconds"].as_i64(),
            started_at(job, &status),
        ) {
            let deadline = start
                .checked_add(jiff::SignedDuration::from_secs(seconds))
                .unwrap_or(Timestamp::MAX);
            if now >= deadline {
                set_condition(
                    &mut status,
                    CONDITION_FAILED,
                    "True",
                    REASON_DEADLINE_EXCEEDED,
                    MESSAGE_DEADLINE_EXCEEDED,
                    &now_text,
                );
            } else {
                requeue_at = Some(deadline);
            }
        }
    }
    Decision {
        status: (status != old).then_some(status),
        requeue_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn job(spec: Value) -> Value {
        json!({"metadata": {"name": "j", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec})
    }

    #[test]
    fn suspension_and_resumption_are_conditions() {
        let mut j = job(json!({"suspend": true}));
        let d = reconcile(&j, t("2026-01-01T00:00:05Z"));
        let status = d.status.unwrap();
        let c = &status["conditions"][0];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (Some("Suspended"), Some("True"), Some("Suspended"))
        );
        assert_eq!(c["message"], "TrainJob is suspended");
        j["status"] = status;
        // Nothing changes while it stays suspended.
        assert_eq!(reconcile(&j, t("2026-01-01T00:01:00Z")).status, None);
        j["spec"]["suspend"] = false.into();
        let status = reconcile(&j, t("2026-01-01T00:02:00Z")).status.unwrap();
        let c = &status["conditions"][0];
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("False"), Some("Resumed"))
        );
        assert_eq!(c["lastTransitionTime"], "2026-01-01T00:02:00Z");
        // A job never suspended has no Suspended condition.
        assert_eq!(
            reconcile(&job(json!({})), t("2026-01-01T00:00:05Z")),
            Decision::default()
        );
    }

    #[test]
    fn the_deadline_counts_from_start_or_resumption() {
        let j = job(json!({"activeDeadlineSeconds": 60}));
        let d = reconcile(&j, t("2026-01-01T00:00:30Z"));
        assert_eq!(d.status, None);
        assert_eq!(d.requeue_at, Some(t("2026-01-01T00:01:00Z")));
        let status = reconcile(&j, t("2026-01-01T00:01:00Z")).status.unwrap();
        let failed = condition(&status, "Failed").unwrap();
        assert_eq!(failed["reason"], "DeadlineExceeded");
        assert_eq!(failed["message"], "TrainJob exceeded its active deadline");

        // Resumed at 00:05: the deadline is 00:06.
        let mut j = job(json!({"activeDeadlineSeconds": 60}));
        j["status"] = json!({"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed", "message": "TrainJob is resumed", "lastTransitionTime": "2026-01-01T00:05:00Z"}]});
        assert_eq!(
            reconcile(&j, t("2026-01-01T00:05:30Z")).requeue_at,
            Some(t("2026-01-01T00:06:00Z"))
        );
        // Suspended jobs do not run out.
        let mut j = job(json!({"activeDeadlineSeconds": 1, "suspend": true}));
        j["status"] = json!({"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended", "message": "TrainJob is suspended", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        assert_eq!(
            reconcile(&j, t("2026-02-01T00:00:00Z")),
            Decision::default()
        );
    }

    #[test]
    fn a_trainjob_its_queue_holds_is_suspended_until_admitted() {
        let mut j = job(json!({"activeDeadlineSeconds": 60}));
        let waiting = json!({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "couldn't assign flavors", "lastTransitionTime": "2026-01-01T00:00:00Z"});
        j["status"] = json!({"conditions": [waiting]});
        // Waiting an hour: suspended (printed last), the deadline not running.
        let d = reconcile(&j, t("2026-01-01T01:00:00Z"));
        assert_eq!(d.requeue_at, None);
        let status = d.status.unwrap();
        let last = &status["conditions"][1];
        assert_eq!(
            (last["type"].as_str(), last["status"].as_str()),
            (Some("Suspended"), Some("True"))
        );
        // Admitted at 02:00: resumed, and the deadline is a minute later.
        j["status"] = status;
        j["status"]["conditions"][0]["status"] = "True".into();
        j["status"]["conditions"][0]["reason"] = "QuotaReserved".into();
        let d = reconcile(&j, t("2026-01-01T02:00:00Z"));
        let status = d.status.unwrap();
        assert_eq!(
            condition(&status, "Suspended").unwrap()["reason"],
            "Resumed"
        );
        assert_eq!(d.requeue_at, Some(t("2026-01-01T02:01:00Z")));
    }

    #[test]
    fn finished_jobs_are_left_alone() {
        let mut j = job(json!({"activeDeadlineSeconds": 1, "suspend": true}));
        j["status"] = json!({"conditions": [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        assert_eq!(
            reconcile(&j, t("2026-02-01T00:00:00Z")),
            Decision::default()
        );
    }
}
