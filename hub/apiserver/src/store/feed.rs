//! The live feed of a store's changes to its watchers: one ring that every
//! watcher reads at its own pace, bounded by the number of changes it holds
//! and by their bytes.
//!
//! tokio's broadcast channel, which this replaces, bounds its ring by count
//! only and keeps every change a lagging receiver has not read: one watcher
//! that stops reading (a client that never reads its watch stream) held up
//! to 65,536 changes, and with objects of 3 MiB a tenant updating one
//! object in a loop made that hundreds of gigabytes. Here the oldest
//! changes leave the ring when it passes either bound, whoever has not read
//! them, and a receiver that falls behind the ring's start learns it lagged
//! (its watch ends; the client resumes from the history or relists).
//!
//! The changes' bytes are those the store's history holds (one allocation
//! for both), so the ring adds no copies of them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::LiveChange;

/// The ring, shared by the store's writer and every receiver.
pub(crate) struct Feed {
    ring: RwLock<Ring>,
    sent: Notify,
    receivers: AtomicUsize,
}

struct Ring {
    /// The sequence number of `items[0]`.
    base: u64,
    items: VecDeque<(Arc<LiveChange>, usize)>,
    /// The bytes of the changes in `items`.
    bytes: usize,
    /// At most this many changes...
    cap: usize,
    /// ... and at most this many bytes of them (one change larger than this
    /// is still sent, alone).
    budget: usize,
    closed: bool,
}

impl Ring {
    fn end(&self) -> u64 {
        self.base + self.items.len() as u64
    }
}

impl Feed {
    pub fn new(cap: usize, budget: usize) -> Arc<Feed> {
        Arc::new(Feed {
            ring: RwLock::new(Ring {
                base: 0,
                items: VecDeque::new(),
                bytes: 0,
                cap: cap.max(1),
                budget,
                closed: false,
            }),
            sent: Notify::new(),
            receivers: AtomicUsize::new(0),
        })
    }

    /// A receiver of the changes sent from now on.
    pub fn subscribe(self: &Arc<Self>) -> Receiver {
        self.receivers.fetch_add(1, Ordering::Relaxed);
        let next = self.ring.read().unwrap_or_else(|p| p.into_inner()).end();
        Receiver {
            feed: self.clone(),
            next,
        }
    }

    pub fn receiver_count(&self) -> usize {
        self.receivers.load(Ordering::Relaxed)
    }

    /// Sends `changes` in order, dropping the oldest the ring no longer
    /// has room for.
    pub fn send(&self, changes: Vec<Arc<LiveChange>>) {
        if changes.is_empty() {
            return;
        }
        {
            let mut ring = self.ring.write().unwrap_or_else(|p| p.into_inner());
            for change in changes {
                let size = change.bytes.len();
                ring.bytes += size;
                ring.items.push_back((change, size));
            }
            while ring.items.len() > ring.cap || (ring.bytes > ring.budget && ring.items.len() > 1)
            {
                if let Some((_, size)) = ring.items.pop_front() {
                    ring.bytes -= size;
                    ring.base += 1;
                }
            }
        }
        self.sent.notify_waiters();
    }

    /// Ends the feed: receivers get what is left to them, then
    /// [`RecvError::Closed`].
    pub fn close(&self) {
        self.ring.write().unwrap_or_else(|p| p.into_inner()).closed = true;
        self.sent.notify_waiters();
    }

    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        (ring.items.len(), ring.bytes)
    }
}

/// One watcher's place in a [`Feed`].
pub(crate) struct Receiver {
    feed: Arc<Feed>,
    /// The sequence number of the next change to read.
    next: u64,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.feed.receivers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Receiver {
    /// The next change sent, without waiting.
    ///
    /// # Errors
    /// `Lagged(n)` when `n` changes left the ring before this receiver read
    /// them (the next read continues with the oldest still held), `Closed`
    /// once the feed is closed and everything sent before was read, `Empty`
    /// when nothing new was sent.
    pub fn try_recv(&mut self) -> Result<Arc<LiveChange>, TryRecvError> {
        read_at(&self.feed, &mut self.next)
    }

    /// The next change, waiting for one to be sent.
    ///
    /// # Errors
    /// As [`Receiver::try_recv`], without `Empty`.
    pub async fn recv(&mut self) -> Result<Arc<LiveChange>, RecvError> {
        loop {
            // Registered before looking, so a send in between wakes it.
            let sent = self.feed.sent.notified();
            tokio::pin!(sent);
            sent.as_mut().enable();
            match read_at(&self.feed, &mut self.next) {
                Ok(change) => return Ok(change),
                Err(TryRecvError::Lagged(n)) => return Err(RecvError::Lagged(n)),
                Err(TryRecvError::Closed) => return Err(RecvError::Closed),
                Err(TryRecvError::Empty) => sent.await,
            }
        }
    }
}

/// The change at sequence number `next` in `feed`, moving `next` past it.
fn read_at(feed: &Feed, next: &mut u64) -> Result<Arc<LiveChange>, TryRecvError> {
    let ring = feed.ring.read().unwrap_or_else(|p| p.into_inner());
    if *next < ring.base {
        let missed = ring.base - *next;
        *next = ring.base;
        return Err(TryRecvError::Lagged(missed));
    }
    // `next` is between `base` and `end` here, so the offset fits.
    let at = usize::try_from(*next - ring.base).unwrap_or(usize::MAX);
    match ring.items.get(at) {
        Some((change, _)) => {
            *next += 1;
            Ok(change.clone())
        }
        None if ring.closed => Err(TryRecvError::Closed),
        None => Err(TryRecvError::Empty),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EventType, Key};

    fn change(rv: u64, size: usize) -> Arc<LiveChange> {
        Arc::new(LiveChange {
            kind: EventType::Modified,
            key: Key::new("things", Some("ns"), &format!("t{rv}")),
            rv,
            bytes: vec![b' '; size].into(),
            decoded: std::sync::Mutex::new(std::sync::Weak::new()),
        })
    }

    #[tokio::test]
    async fn every_receiver_reads_every_change_in_order_at_its_own_pace() {
        let feed = Feed::new(100, 1 << 20);
        let mut fast = feed.subscribe();
        let mut slow = feed.subscribe();
        assert_eq!(feed.receiver_count(), 2);
        let waiting = tokio::spawn(async move {
            let mut rvs = Vec::new();
            for _ in 0..3 {
                rvs.push(fast.recv().await.expect("sent").rv);
            }
            rvs
        });
        tokio::task::yield_now().await;
        feed.send(vec![change(1, 10), change(2, 10)]);
        feed.send(vec![change(3, 10)]);
        assert_eq!(waiting.await.expect("task"), [1, 2, 3]);
        assert_eq!(
            feed.receiver_count(),
            1,
            "a dropped receiver is not counted"
        );
        for rv in 1..=3 {
            assert_eq!(slow.try_recv().expect("held").rv, rv);
        }
        assert_eq!(slow.try_recv().err(), Some(TryRecvError::Empty));
        // A receiver sees only what is sent after it subscribed.
        let mut late = feed.subscribe();
        assert_eq!(late.try_recv().err(), Some(TryRecvError::Empty));
        feed.send(vec![change(4, 10)]);
        assert_eq!(late.try_recv().expect("sent after").rv, 4);
    }

    #[test]
    fn the_ring_holds_no_more_bytes_than_its_budget_and_a_lagging_receiver_learns_it() {
        let feed = Feed::new(1000, 100);
        let mut idle = feed.subscribe();
        feed.send((1..=10).map(|rv| change(rv, 30)).collect());
        // 10 changes of 30 bytes in a budget of 100: the newest 3 stay.
        assert_eq!(feed.held(), (3, 90));
        assert_eq!(idle.try_recv().err(), Some(TryRecvError::Lagged(7)));
        assert_eq!(idle.try_recv().expect("oldest held").rv, 8);
        // One change over the whole budget is still sent, alone.
        feed.send(vec![change(11, 500)]);
        assert_eq!(feed.held(), (1, 500));
        assert_eq!(idle.try_recv().err(), Some(TryRecvError::Lagged(2)));
        assert_eq!(idle.try_recv().expect("the large one").rv, 11);
    }

    #[test]
    fn the_ring_holds_no_more_changes_than_its_count() {
        let feed = Feed::new(4, usize::MAX);
        let mut idle = feed.subscribe();
        feed.send((1..=6).map(|rv| change(rv, 1)).collect());
        assert_eq!(feed.held(), (4, 4));
        assert_eq!(idle.try_recv().err(), Some(TryRecvError::Lagged(2)));
        assert_eq!(idle.try_recv().expect("oldest held").rv, 3);
    }

    #[tokio::test]
    async fn a_closed_feed_gives_what_is_left_then_closed() {
        let feed = Feed::new(10, 1000);
        let mut rx = feed.subscribe();
        let mut waiting = feed.subscribe();
        let waited = tokio::spawn(async move {
            let first = waiting.recv().await.map(|c| c.rv);
            (first, waiting.recv().await.err())
        });
        tokio::task::yield_now().await;
        feed.send(vec![change(1, 1)]);
        feed.close();
        assert_eq!(rx.recv().await.expect("left").rv, 1);
        assert_eq!(rx.recv().await.err(), Some(RecvError::Closed));
        // A receiver waiting when the feed closes is woken to see it.
        assert_eq!(
            waited.await.expect("task"),
            (Ok(1), Some(RecvError::Closed))
        );
        let mut after = feed.subscribe();
        assert_eq!(after.try_recv().err(), Some(TryRecvError::Closed));
    }
}
