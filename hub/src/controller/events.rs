//! Event expiry: Events are removed a set time after they were last
//! written, as kube-apiserver does with `--event-ttl` (default one hour).
//! Without it a long-running hub would keep every pod's Scheduled and
//! Started events, and every placement's, for as long as their TrainJob.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use trainhub_apiserver::store::{Key, MAX_COMMIT_OPS, Object, Op, Store};

use crate::api::EVENTS;

/// kube-apiserver's default `--event-ttl`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

/// When an Event was last written: the latest of its `lastTimestamp`,
/// `eventTime`, `firstTimestamp` and `metadata.creationTimestamp` (what
/// events.k8s.io and core/v1 writers set varies).
pub fn last_written(event: &Value) -> Option<Timestamp> {
    [
        &event["lastTimestamp"],
        &event["eventTime"],
        &event["series"]["lastObservedTime"],
        &event["firstTimestamp"],
        &event["metadata"]["creationTimestamp"],
    ]
    .into_iter()
    .filter_map(|v| v.as_str()?.parse::<Timestamp>().ok())
    .max()
}

/// The Events among `events` that have outlived `ttl` at `now`. An Event
/// with no time at all is kept (nothing says how old it is).
pub fn expired(events: &[Object], now: Timestamp, ttl: Duration) -> Vec<Key> {
    let Ok(ttl) = jiff::SignedDuration::try_from(ttl) else {
        return Vec::new();
    };
    let Ok(cutoff) = now.checked_sub(ttl) else {
        return Vec::new();
    };
    events
        .iter()
        .filter(|e| last_written(&e.value).is_some_and(|t| t < cutoff))
        .map(|e| e.key.clone())
        .collect()
}

/// How often expiry runs for a given TTL: a tenth of it, between one
/// second and one minute.
pub fn period(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Removes expired Events every [`period`] until `shutdown` resolves.
pub async fn run(
    store: Arc<dyn Store>,
    ttl: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut interval = tokio::time::interval(period(ttl));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = interval.tick() => {
                let (events, _) = store.list(EVENTS, None);
                let keys = expired(&events, Timestamp::now(), ttl);
                if keys.is_empty() {
                    continue;
                }
                // In chunks: etcd takes at most 128 operations per Txn.
                for chunk in keys.chunks(MAX_COMMIT_OPS) {
                    let ops = chunk
                        .iter()
                        .map(|key| Op::Remove { key: key.clone() })
                        .collect();
                    match store.commit(ops).await {
                        Ok(_) => tracing::debug!(count = chunk.len(), "removed expired events"),
                        Err(e) => tracing::warn!(error = %e, "removing expired events"),
                    }
                }
            }
        }
    }
}

/// A duration as Go (and so kube-apiserver's `--event-ttl`) writes it:
/// `1h0m0s`, `90m`, `1.5h`, `30s`, `500ms`; a unit is required.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (for example 1h0m0s, 90m, 30s)");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(name: &str, value: Value) -> Object {
        Object {
            key: Key::new(EVENTS, Some("default"), name),
            value: Arc::new(value),
            rv: 1,
        }
    }

    #[test]
    fn events_older_than_the_ttl_by_their_last_write_expire() {
        let now: Timestamp = "2026-11-22T12:00:00Z".parse().unwrap();
        let events = vec![
            event(
                "old",
                json!({"lastTimestamp": "2026-11-22T10:59:59Z",
                       "firstTimestamp": "2026-11-22T09:00:00Z"}),
            ),
            // First seen long ago, but written again recently.
            event(
                "repeated",
                json!({"firstTimestamp": "2026-11-22T08:00:00Z",
                       "lastTimestamp": "2026-11-22T11:30:00Z"}),
            ),
            // events.k8s.io style: only eventTime.
            event("micro", json!({"eventTime": "2026-11-22T10:00:00.123456Z"})),
            event(
                "created",
                json!({"metadata": {"creationTimestamp": "2026-11-22T11:59:00Z"}}),
            ),
            event("timeless", json!({"reason": "Placed"})),
            event("garbled", json!({"lastTimestamp": "yesterday"})),
        ];
        let keys = expired(&events, now, DEFAULT_TTL);
        let names: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["old", "micro"]);
    }

    #[test]
    fn the_period_follows_the_ttl_within_bounds() {
        assert_eq!(period(DEFAULT_TTL), Duration::from_secs(60));
        assert_eq!(period(Duration::from_secs(30)), Duration::from_secs(3));
        assert_eq!(period(Duration::from_millis(100)), Duration::from_secs(1));
    }

    #[test]
    fn go_durations_parse_like_kube_apiserver_flags() {
        assert_eq!(parse_go_duration("1h0m0s"), Ok(DEFAULT_TTL));
        assert_eq!(parse_go_duration("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "1", "1d", "h", "1h-5m", "1..5s"] {
            let err = parse_go_duration(bad).unwrap_err();
            assert!(err.contains("not a duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_absurd_ttl_expires_nothing() {
        let now = Timestamp::now();
        let events = vec![event("e", json!({"lastTimestamp": "2000-01-01T00:00:00Z"}))];
        assert!(expired(&events, now, Duration::MAX).is_empty());
    }
}
