//! A bounded cache of recently used entries, cheap enough to sit on every
//! read of the hot path (the store's decoded objects, the dispatcher's
//! typed TrainJobs, admission's parsed runtimes).
//!
//! Each shard keeps two generations. An insert goes into the current one;
//! a hit in the previous one moves the entry into the current one; when the
//! current one holds half the shard's capacity it becomes the previous one,
//! and the old previous one is dropped whole. So an entry used within the
//! last `capacity / 2` inserts of its shard is kept, one unused for
//! `capacity` of them is gone, and a shard never holds more than its
//! capacity: least-recently-used order within a factor of two, for one lock
//! and one or two hash lookups per call. (moka's cache, used here before,
//! also queues every read for its eviction policy, runs housekeeping on the
//! caller's thread and frees entries through an epoch collector: 9% of the
//! dispatch bench's CPU, see `docs/benchmarks.md`.)
//!
//! It keeps by recency, not frequency, on purpose: what these caches hold
//! was just written or computed and is read again soon after, and a
//! frequency filter (moka's default, TinyLFU) turns most new keys away in a
//! burst of new TrainJobs.
//!
//! Keys come from tenants (names), so each shard's map is small and bounded
//! whatever they hash to; the hasher is seeded per process.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard};

use foldhash::fast::RandomState;

/// Shards (a power of two): calls on different keys rarely wait for each
/// other.
const SHARDS: usize = 16;

/// A bounded map of recently used entries; see the module's documentation.
pub struct Recent<K, V> {
    shards: Box<[Mutex<Generations<K, V>>]>,
    hasher: RandomState,
    /// Entries per generation of a shard.
    half: usize,
}

struct Generations<K, V> {
    current: HashMap<K, V, RandomState>,
    previous: HashMap<K, V, RandomState>,
}

impl<K: Hash + Eq, V: Clone> Recent<K, V> {
    /// A cache holding at most about `capacity` entries (rounded up to
    /// two per shard).
    pub fn new(capacity: usize) -> Self {
        let half = capacity.div_ceil(2 * SHARDS).max(1);
        let hasher = RandomState::default();
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Generations {
                    current: HashMap::with_hasher(hasher.clone()),
                    previous: HashMap::with_hasher(hasher.clone()),
                })
            })
            .collect();
        Recent {
            shards,
            hasher,
            half,
        }
    }

    /// The most entries it holds at once.
    pub fn capacity(&self) -> usize {
        2 * self.half * SHARDS
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> MutexGuard<'_, Generations<K, V>> {
        let index = (self.hasher.hash_one(key) as usize) & (SHARDS - 1);
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The entry at `key`, now counted as used.
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut shard = self.shard(key);
        if let Some(value) = shard.current.get(key) {
            return Some(value.clone());
        }
        let (key, value) = shard.previous.remove_entry(key)?;
        let found = value.clone();
        let dropped = shard.put(key, value, self.half);
        drop(shard);
        drop(dropped);
        Some(found)
    }

    /// The entry at `key`, not counted as used: for a scan over many keys,
    /// which should not turn the cache over.
    pub fn peek<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard(key);
        shard
            .current
            .get(key)
            .or_else(|| shard.previous.get(key))
            .cloned()
    }

    /// Keeps `value` at `key`, counted as just used.
    pub fn insert(&self, key: K, value: V) {
        let mut shard = self.shard(&key);
        shard.previous.remove(&key);
        let dropped = shard.put(key, value, self.half);
        // The generation dropped, if any, is freed outside the lock.
        drop(shard);
        drop(dropped);
    }

    /// Replaces the entry at `key` with `value` if there is one (removes it
    /// for `None`), without counting it as used: for a writer keeping what
    /// readers hold fresh, without making room for what they do not read.
    pub fn refresh(&self, key: &K, value: Option<V>) {
        let mut shard = self.shard(key);
        let generations = &mut *shard;
        let old = [&mut generations.current, &mut generations.previous]
            .into_iter()
            .find(|map| map.contains_key(key))
            .and_then(|map| match value {
                Some(value) => map.get_mut(key).map(|slot| std::mem::replace(slot, value)),
                None => map.remove(key),
            });
        drop(shard);
        drop(old);
    }

    /// Removes the entry at `key`.
    pub fn invalidate<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut shard = self.shard(key);
        let current = shard.current.remove(key);
        let previous = shard.previous.remove(key);
        drop(shard);
        drop((current, previous));
    }

    /// Removes every entry.
    pub fn invalidate_all(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let current = std::mem::take(&mut shard.current);
            let previous = std::mem::take(&mut shard.previous);
            drop(shard);
            drop((current, previous));
        }
    }

    /// The entry at `key`, or `make`'s value kept there. Two callers
    /// missing at once may both call `make`; the later one's is kept.
    ///
    /// # Errors
    /// `make`'s error, and nothing is kept.
    pub fn try_get_with<E>(&self, key: K, make: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        if let Some(value) = self.get(&key) {
            return Ok(value);
        }
        let value = make()?;
        self.insert(key, value.clone());
        Ok(value)
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                s.current.len() + s.previous.len()
            })
            .sum()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Hash + Eq, V> Generations<K, V> {
    /// Puts `key` in the current generation (not in the previous one),
    /// turning generations over when the current one is full; returns the
    /// generation dropped, for the caller to free outside the lock.
    fn put(&mut self, key: K, value: V, half: usize) -> Option<HashMap<K, V, RandomState>> {
        let mut dropped = None;
        if self.current.len() >= half && !self.current.contains_key(&key) {
            let hasher = self.current.hasher().clone();
            let full = std::mem::replace(&mut self.current, HashMap::with_hasher(hasher));
            dropped = Some(std::mem::replace(&mut self.previous, full));
        }
        self.current.insert(key, value);
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_entry_used_since_the_last_turnover_stays_and_one_left_unused_goes() {
        // One entry per generation per shard: every shard turns over at
        // each insert into it, so follow a single shard's keys.
        let cache: Recent<u32, u32> = Recent::new(2 * SHARDS);
        assert_eq!(cache.half, 1);
        let shard_of = |k: &u32| (cache.hasher.hash_one(k) as usize) & (SHARDS - 1);
        let keys: Vec<u32> = (0..10_000).filter(|k| shard_of(k) == 0).take(5).collect();
        let [a, b, c, d, e] = keys[..] else {
            panic!("five keys of shard 0")
        };
        cache.insert(a, 1);
        cache.insert(b, 2); // turnover: a previous, b current
        assert_eq!(cache.get(&a), Some(1)); // a back to current: b previous
        cache.insert(c, 3); // a previous, c current, b dropped
        assert_eq!(cache.get(&b), None, "b went unused through two turnovers");
        cache.insert(d, 4); // c previous, d current, a dropped
        assert_eq!(cache.get(&a), None, "a went unused through two turnovers");
        assert_eq!(cache.get(&c), Some(3)); // c current, d previous
        cache.insert(e, 5); // c previous, e current, d dropped
        assert_eq!(cache.get(&d), None);
        assert_eq!(cache.get(&c), Some(3));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn refresh_replaces_or_removes_only_what_is_there() {
        let cache: Recent<String, u32> = Recent::new(64);
        cache.refresh(&"absent".to_string(), Some(1));
        assert_eq!(cache.get("absent"), None);
        cache.insert("a".into(), 1);
        cache.refresh(&"a".to_string(), Some(2));
        assert_eq!(cache.get("a"), Some(2));
        cache.refresh(&"a".to_string(), None);
        assert_eq!(cache.get("a"), None);
        cache.insert("b".into(), 1);
        cache.invalidate("b");
        assert!(cache.is_empty());
    }

    #[test]
    fn try_get_with_keeps_a_value_and_not_an_error() {
        let cache: Recent<u32, u32> = Recent::new(64);
        assert_eq!(cache.try_get_with(1, || Err::<u32, _>("no")), Err("no"));
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.try_get_with(1, || Ok::<_, ()>(7)), Ok(7));
        assert_eq!(cache.try_get_with(1, || Err("not called")), Ok(7));
        cache.invalidate_all();
        assert_eq!(cache.get(&1), None);
    }

    proptest! {
        /// Whatever the calls, it never holds more than its capacity, and
        /// what it answers is the last value kept at the key.
        #[test]
        fn bounded_and_never_stale(
            capacity in 1usize..200,
            calls in proptest::collection::vec((0u8..4, 0u16..500, any::<u32>()), 1..2000),
        ) {
            let cache: Recent<u16, u32> = Recent::new(capacity);
            let mut last: HashMap<u16, u32> = HashMap::new();
            for (op, key, value) in calls {
                match op {
                    0 => { cache.insert(key, value); last.insert(key, value); }
                    1 => {
                        let peeked = cache.peek(&key);
                        if let Some(found) = cache.get(&key) {
                            prop_assert_eq!(Some(&found), peeked.as_ref());
                            prop_assert_eq!(Some(&found), last.get(&key));
                        } else {
                            prop_assert!(peeked.is_none());
                        }
                    }
                    2 => {
                        let present = cache.get(&key).is_some();
                        cache.refresh(&key, Some(value));
                        if present { last.insert(key, value); }
                    }
                    _ => { cache.invalidate(&key); last.remove(&key); }
                }
                prop_assert!(cache.len() <= cache.capacity());
            }
            prop_assert!(cache.capacity() <= capacity.max(2 * SHARDS) + 2 * SHARDS);
        }
    }
}
