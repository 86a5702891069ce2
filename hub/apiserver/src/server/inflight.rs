//! Per-user caps on requests in flight, so that one client cannot starve the
//! others: kube-apiserver's `--max-requests-inflight` answer (429
//! TooManyRequests with `Retry-After`), counted per authenticated user, and a
//! separate cap on long-running requests (watches, followed logs), which
//! hold their slot until their stream ends; and a budget of the bytes a
//! user's watches may hold queued for their clients, all together.

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
    /// Bytes of events a user's watches may hold queued for their clients,
    /// all together (each watch also holds at most 1 MiB). 0: no cap.
    pub max_watch_bytes_per_user: usize,
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
            // An informer's watch holds little: its client reads as the
            // events come. What a user's watches hold beyond this is a
            // client that stopped reading, so a tenant's 250 watches hold
            // tens of MiB of the hub's memory, not gigabytes.
            max_watch_bytes_per_user: 64 << 20,
        }
    }
}

/// Watches of one user waiting at once for room in the user's
/// [`WatchBudget`], each holding the one event it waits to queue; a watch
/// finding none free ends (its client watches again).
pub(crate) const WATCHES_WAITING_PER_USER: usize = 4;

/// The bytes one user's watches may hold queued, all together.
#[derive(Clone)]
pub(crate) struct WatchBudget {
    bytes: Arc<Semaphore>,
    max: usize,
    waiting: Arc<Semaphore>,
}

/// A watch's share of its user's [`WatchBudget`]; given back on drop.
pub(crate) struct BudgetShare {
    _permit: OwnedSemaphorePermit,
}

impl WatchBudget {
    fn new(max: usize) -> Self {
        WatchBudget {
            bytes: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            max,
            waiting: Arc::new(Semaphore::new(WATCHES_WAITING_PER_USER)),
        }
    }

    /// The share of a line of `len` bytes (one larger than the budget takes
    /// all of it): at once if there is room, else once there is, if fewer
    /// than [`WATCHES_WAITING_PER_USER`] of the user's watches wait already;
    /// `None` if too many wait.
    pub async fn take(&self, len: usize) -> Option<BudgetShare> {
        let share = u32::try_from(len.min(self.max)).unwrap_or(u32::MAX);
        if let Ok(permit) = self.bytes.clone().try_acquire_many_owned(share) {
            return Some(BudgetShare { _permit: permit });
        }
        let _waiting = self.waiting.try_acquire().ok()?;
        let permit = self.bytes.clone().acquire_many_owned(share).await.ok()?;
        Some(BudgetShare { _permit: permit })
    }

    /// Whether nothing of it is taken and no watch waits for it.
    fn unused(&self) -> bool {
        self.bytes.available_permits() == self.max.min(Semaphore::MAX_PERMITS)
            && self.waiting.available_permits() == WATCHES_WAITING_PER_USER
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
    watch_bytes: Mutex<HashMap<String, WatchBudget>>,
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
            watch_bytes: Mutex::default(),
        }
    }

    /// The budget of `user`'s watches (`None` when uncapped).
    pub fn watch_budget(&self, user: &str) -> Option<WatchBudget> {
        let max = self.limits.max_watch_bytes_per_user;
        if max == 0 {
            return None;
        }
        let mut map = self.watch_bytes.lock().unwrap_or_else(|p| p.into_inner());
        // Forget users whose watches hold nothing, so the map stays as
        // small as the set of users watching.
        if map.len() > 1024 {
            map.retain(|_, b| Arc::strong_count(&b.bytes) > 1 || !b.unused());
        }
        Some(
            map.entry(user.to_string())
                .or_insert_with(|| WatchBudget::new(max))
                .clone(),
        )
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
            ..RequestLimits::default()
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

    #[tokio::test]
    async fn a_users_watches_share_one_budget_of_bytes_and_few_of_them_wait_for_it() {
        let limits = InFlight::new(RequestLimits {
            max_watch_bytes_per_user: 1000,
            ..RequestLimits::default()
        });
        let alice = limits.watch_budget("alice").unwrap();
        // Another watch of alice's draws on the same budget.
        let also_alice = limits.watch_budget("alice").unwrap();
        let first = alice.take(600).await.unwrap();
        let second = also_alice.take(400).await.unwrap();
        // Bob has his own.
        let bob = limits.watch_budget("bob").unwrap();
        let _bobs = bob.take(1000).await.unwrap();
        // Alice's is full: up to WATCHES_WAITING_PER_USER watches wait for
        // room, the next one is refused at once.
        let waiting: Vec<_> = (0..WATCHES_WAITING_PER_USER)
            .map(|_| {
                let budget = alice.clone();
                tokio::spawn(async move { budget.take(100).await.is_some() })
            })
            .collect();
        tokio::task::yield_now().await;
        while alice.waiting.available_permits() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert!(alice.take(100).await.is_none(), "a fifth waiter was let in");
        // Room given back lets the waiters in; a line larger than the whole
        // budget takes all of it.
        drop((first, second));
        for waiter in waiting {
            assert!(waiter.await.unwrap());
        }
        let whole = tokio::time::timeout(std::time::Duration::from_secs(5), alice.take(5000))
            .await
            .expect("a line larger than the budget waits for all of it, not forever")
            .unwrap();
        assert_eq!(alice.bytes.available_permits(), 0);
        drop(whole);
        assert!(alice.unused());
        // Uncapped: no budget.
        let uncapped = InFlight::new(RequestLimits {
            max_watch_bytes_per_user: 0,
            ..RequestLimits::default()
        });
        assert!(uncapped.watch_budget("alice").is_none());
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
