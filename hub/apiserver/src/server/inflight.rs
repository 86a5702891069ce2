//! Per-user caps on requests in flight, so that one client cannot starve the
//! others: kube-apiserver's `--max-requests-inflight` answer (429
//! TooManyRequests with `Retry-After`), counted per authenticated user, and a
//! separate cap on long-running requests (watches, followed logs), which
//! hold their slot until their stream ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::Uri;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::request::Query;
use crate::auth::UserInfo;
use crate::status::ApiError;

/// The group whose members are never refused for load, as kube-apiserver
/// exempts it: an administrator must always get an answer.
const PRIVILEGED_GROUP: &str = "system:masters";

/// Caps on what one authenticated user may have in flight at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Requests other than watches and followed logs, per user (members of
    /// `system:masters` are exempt). 0: no cap.
    pub max_requests_in_flight_per_user: usize,
    /// Watches and followed logs open at once, per user. 0: no cap.
    pub max_long_running_per_user: usize,
    /// Watches and followed logs open at once, all users together. 0: no
    /// cap.
    pub max_long_running: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            // kube-apiserver allows 400 + 200 (mutating) in flight for all
            // clients; a quarter of that for one.
            max_requests_in_flight_per_user: 100,
            // An informer holds one watch per kind; a user with many
            // terminals following logs stays far below this.
            max_long_running_per_user: 250,
            max_long_running: 10_000,
        }
    }
}

/// A slot taken for one request; given back when dropped.
pub struct Slot {
    _user: Option<OwnedSemaphorePermit>,
    _all: Option<OwnedSemaphorePermit>,
}

/// The counters behind [`RequestLimits`].
pub(crate) struct InFlight {
    limits: RequestLimits,
    short: Mutex<HashMap<String, Arc<Semaphore>>>,
    long: Mutex<HashMap<String, Arc<Semaphore>>>,
    all_long: Arc<Semaphore>,
}

impl InFlight {
    pub fn new(limits: RequestLimits) -> Self {
        InFlight {
            limits,
            short: Mutex::default(),
            long: Mutex::default(),
            all_long: Arc::new(Semaphore::new(
                limits.max_long_running.min(Semaphore::MAX_PERMITS),
            )),
        }
    }

    pub fn limits(&self) -> RequestLimits {
        self.limits
    }

    /// A slot for a request of `user` to `uri`, or 429 naming the limit;
    /// and whether the request is long-running.
    pub fn admit(&self, user: &UserInfo, uri: &Uri) -> Result<(Slot, bool), ApiError> {
        let long_running = is_long_running(uri);
        Ok((self.admit_as(user, long_running)?, long_running))
    }

    /// A slot for a request of `user` (a stream that lasts as long as the
    /// client wants, if `long_running`), or 429 naming the limit.
    pub fn admit_as(&self, user: &UserInfo, long_running: bool) -> Result<Slot, ApiError> {
        if long_running {
            let all = match self.limits.max_long_running {
                0 => None,
                max => Some(self.all_long.clone().try_acquire_owned().map_err(|_| {
                    too_many(format!(
                        "the server has {max} watches and log streams open, its limit"
                    ))
                })?),
            };
            let mine = take(
                &self.long,
                &user.name,
                self.limits.max_long_running_per_user,
            )
            .map_err(|max| {
                too_many(format!(
                    "user \"{}\" has {max} watches and log streams open, the limit per user",
                    user.name
                ))
            })?;
            return Ok(Slot {
                _user: mine,
                _all: all,
            });
        }
        if user.groups.iter().any(|g| g == PRIVILEGED_GROUP) {
            return Ok(Slot {
                _user: None,
                _all: None,
            });
        }
        let mine = take(
            &self.short,
            &user.name,
            self.limits.max_requests_in_flight_per_user,
        )
        .map_err(|max| {
            too_many(format!(
                "user \"{}\" has {max} requests in flight, the limit per user",
                user.name
            ))
        })?;
        Ok(Slot {
            _user: mine,
            _all: None,
        })
    }
}

/// A permit of `user`'s semaphore of `max` (`None` when uncapped), or
/// `Err(max)` when all are taken.
fn take(
    map: &Mutex<HashMap<String, Arc<Semaphore>>>,
    user: &str,
    max: usize,
) -> Result<Option<OwnedSemaphorePermit>, usize> {
    if max == 0 {
        return Ok(None);
    }
    let semaphore = {
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        // Forget users with nothing in flight, so the map stays as small as
        // the set of active users.
        if map.len() > 1024 {
            map.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < max);
        }
        map.entry(user.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))))
            .clone()
    };
    semaphore.try_acquire_owned().map(Some).map_err(|_| max)
}

/// Watches and followed logs: they last as long as the client wants.
pub(crate) fn is_long_running(uri: &Uri) -> bool {
    let query = Query::parse(uri.query());
    query.flag("watch") || (uri.path().ends_with("/log") && query.flag("follow"))
}

/// kube-apiserver's answer to a client over its in-flight limit.
fn too_many(detail: String) -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        format!("Too many requests, please try again later: {detail}"),
    );
    e.retry_after_seconds = Some(1);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn one_user_at_the_cap_does_not_block_another() {
        let limits = InFlight::new(RequestLimits {
            max_requests_in_flight_per_user: 2,
            max_long_running_per_user: 1,
            max_long_running: 10,
        });
        let get: Uri = "/apis/g/v1/namespaces/a/things".parse().unwrap();
        let alice = user("alice", &[]);
        let a1 = limits.admit(&alice, &get).unwrap();
        let _a2 = limits.admit(&alice, &get).unwrap();
        let e = limits.admit(&alice, &get).err().unwrap();
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        assert_eq!(e.retry_after_seconds, Some(1));
        assert!(e.message.contains("2 requests in flight"), "{}", e.message);
        // Bob is not alice.
        assert!(limits.admit(&user("bob", &[]), &get).is_ok());
        // A request done frees its slot.
        drop(a1);
        assert!(limits.admit(&alice, &get).is_ok());
        // Watches count apart.
        let watch: Uri = "/apis/g/v1/things?watch=true".parse().unwrap();
        let (w, long) = limits.admit(&alice, &watch).unwrap();
        assert!(long);
        let e = limits.admit(&alice, &watch).err().unwrap();
        assert!(
            e.message.contains("1 watches and log streams"),
            "{}",
            e.message
        );
        drop(w);
        assert!(limits.admit(&alice, &watch).is_ok());
    }

    #[test]
    fn admins_are_not_refused_for_load() {
        let limits = InFlight::new(RequestLimits {
            max_requests_in_flight_per_user: 1,
            ..RequestLimits::default()
        });
        let get: Uri = "/api/v1/pods".parse().unwrap();
        let admin = user("admin", &["system:masters"]);
        let _held: Vec<_> = (0..10)
            .map(|_| limits.admit(&admin, &get).unwrap())
            .collect();
    }

    #[test]
    fn long_running_requests() {
        for (uri, long) in [
            ("/apis/g/v1/things?watch=true", true),
            ("/apis/g/v1/things?watch=1&labelSelector=a", true),
            ("/apis/g/v1/things?watch=false", false),
            ("/api/v1/namespaces/a/pods/p/log?follow=true", true),
            ("/api/v1/namespaces/a/pods/p/log", false),
            ("/api/v1/namespaces/a/pods/p?follow=true", false),
        ] {
            assert_eq!(is_long_running(&uri.parse().unwrap()), long, "{uri}");
        }
    }
}
