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
//!
//! Values come from tenants too, and a count does not bound their size: a
//! cache of decoded objects or typed TrainJobs made with
//! [`Recent::with_budget`] weighs each value (its encoded size, say) and
//! also turns a generation over when its weight would pass its share of
//! the budget; a value heavier than that share is not kept at all (it is
//! made again on each use, at its owner's cost). So the whole cache never
//! weighs more than its budget, whatever tenants store.

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
    /// Weight per generation of a shard.
    half_budget: usize,
    weigh: fn(&V) -> usize,
}

/// A shard's two generations; each entry is kept with its weight.
struct Generations<K, V> {
    current: HashMap<K, (V, usize), RandomState>,
    previous: HashMap<K, (V, usize), RandomState>,
    /// The weights of `current`'s and `previous`'s entries, summed.
    current_weight: usize,
    previous_weight: usize,
}

/// A generation dropped whole, freed by the caller outside the lock.
type Dropped<K, V> = Option<HashMap<K, (V, usize), RandomState>>;

impl<K: Hash + Eq, V: Clone> Recent<K, V> {
    /// A cache holding at most about `capacity` entries (rounded up to
    /// two per shard).
    pub fn new(capacity: usize) -> Self {
        Self::with_budget(capacity, usize::MAX, |_| 0)
    }

    /// A cache holding at most about `capacity` entries whose weights
    /// (`weigh`) sum to at most `budget`. A value weighing more than
    /// `budget / 32` (a shard's generation's share) is not kept.
    pub fn with_budget(capacity: usize, budget: usize, weigh: fn(&V) -> usize) -> Self {
        let half = capacity.div_ceil(2 * SHARDS).max(1);
        let hasher = RandomState::default();
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Generations {
                    current: HashMap::with_hasher(hasher.clone()),
                    previous: HashMap::with_hasher(hasher.clone()),
                    current_weight: 0,
                    previous_weight: 0,
                })
            })
            .collect();
        Recent {
            shards,
            hasher,
            half,
            half_budget: budget / (2 * SHARDS),
            weigh,
        }
    }

    /// The most entries it holds at once.
    pub fn capacity(&self) -> usize {
        2 * self.half * SHARDS
    }

    /// The most its entries weigh together at once.
    pub fn budget(&self) -> usize {
        self.half_budget.saturating_mul(2 * SHARDS)
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
        if let Some((value, _)) = shard.current.get(key) {
            return Some(value.clone());
        }
        let (key, (value, weight)) = shard.previous.remove_entry(key)?;
        shard.previous_weight -= weight;
        let found = value.clone();
        let dropped = shard.put(key, value, weight, self.half, self.half_budget);
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
            .map(|(value, _)| value.clone())
    }

    /// Keeps `value` at `key`, counted as just used (or, when it weighs
    /// more than a generation's share of the budget, keeps nothing there).
    pub fn insert(&self, key: K, value: V) {
        let weight = (self.weigh)(&value);
        let mut shard = self.shard(&key);
        let old = shard.take(&key, false);
        let dropped = if weight > self.half_budget {
            Err((shard.take(&key, true), value))
        } else {
            Ok(shard.put(key, value, weight, self.half, self.half_budget))
        };
        // What was dropped, if anything, is freed outside the lock.
        drop(shard);
        drop((old, dropped));
    }

    /// Replaces the entry at `key` with `value` if there is one (removes it
    /// for `None`), without counting it as used: for a writer keeping what
    /// readers hold fresh, without making room for what they do not read.
    ///
    /// A new value that would take its generation over its share of the
    /// budget removes the entry instead.
    pub fn refresh(&self, key: &K, value: Option<V>) {
        let weight = value.as_ref().map(|v| (self.weigh)(v));
        let mut shard = self.shard(key);
        let in_current = shard.current.contains_key(key);
        let (map, sum) = shard.generation(in_current);
        let old = match (map.get_mut(key), value, weight) {
            // (Each weight kept is at most `half_budget`, as is each sum,
            // so this cannot overflow.)
            (Some(slot), Some(value), Some(weight))
                if weight <= self.half_budget && *sum - slot.1 + weight <= self.half_budget =>
            {
                *sum = *sum - slot.1 + weight;
                Some(std::mem::replace(slot, (value, weight)))
            }
            (Some(_), _, _) => map.remove(key).inspect(|(_, w)| *sum -= w),
            (None, _, _) => None,
        };
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
        let current = shard.take(key, true);
        let previous = shard.take(key, false);
        drop(shard);
        drop((current, previous));
    }

    /// Removes every entry.
    pub fn invalidate_all(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let current = std::mem::take(&mut shard.current);
            let previous = std::mem::take(&mut shard.previous);
            shard.current_weight = 0;
            shard.previous_weight = 0;
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

    /// What the entries held now weigh together.
    pub fn weight(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                s.current_weight + s.previous_weight
            })
            .sum()
    }
}

impl<K: Hash + Eq, V> Generations<K, V> {
    /// Puts `key` (not in the previous generation, and weighing at most
    /// `half_budget`) in the current generation, turning generations over
    /// when the current one is full, by count or by weight; returns the
    /// generation dropped, for the caller to free outside the lock.
    fn put(
        &mut self,
        key: K,
        value: V,
        weight: usize,
        half: usize,
        half_budget: usize,
    ) -> Dropped<K, V> {
        let replaced = self.current.get(&key).map(|(_, w)| *w);
        let full = match replaced {
            Some(old) => self.current_weight - old + weight > half_budget,
            None => self.current.len() >= half || self.current_weight + weight > half_budget,
        };
        let mut dropped = None;
        if full {
            // The old entry, if any, goes with the rest of its generation.
            let hasher = self.current.hasher().clone();
            let full = std::mem::replace(&mut self.current, HashMap::with_hasher(hasher));
            dropped = Some(std::mem::replace(&mut self.previous, full));
            self.previous_weight = std::mem::take(&mut self.current_weight);
            if let Some((_, w)) = self.previous.remove(&key) {
                self.previous_weight -= w;
            }
        } else {
            self.current_weight -= replaced.unwrap_or(0);
        }
        self.current_weight += weight;
        self.current.insert(key, (value, weight));
        dropped
    }

    /// A generation and its weight: the current one, or the previous one.
    fn generation(
        &mut self,
        current: bool,
    ) -> (&mut HashMap<K, (V, usize), RandomState>, &mut usize) {
        if current {
            (&mut self.current, &mut self.current_weight)
        } else {
            (&mut self.previous, &mut self.previous_weight)
        }
    }

    /// Removes `key` from the current (or the previous) generation.
    fn take<Q>(&mut self, key: &Q, current: bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (map, sum) = self.generation(current);
        let (value, weight) = map.remove(key)?;
        *sum -= weight;
        Some(value)
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

    /// The weights the shards hold, summed from their entries.
    fn weights_held<K, V>(cache: &Recent<K, V>) -> usize {
        cache
            .shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap();
                let sum = |m: &HashMap<K, (V, usize), RandomState>| m.values().map(|e| e.1).sum();
                let (current, previous): (usize, usize) = (sum(&s.current), sum(&s.previous));
                assert_eq!(current, s.current_weight, "current generation's weight");
                assert_eq!(previous, s.previous_weight, "previous generation's weight");
                current + previous
            })
            .sum()
    }

    #[test]
    fn a_value_heavier_than_its_share_of_the_budget_is_not_kept() {
        // 32 generations of 1,000 bytes each.
        let cache: Recent<&str, Vec<u8>> = Recent::with_budget(1024, 32_000, Vec::len);
        assert_eq!(cache.budget(), 32_000);
        cache.insert("small", vec![0; 1000]);
        assert_eq!(cache.get("small").map(|v| v.len()), Some(1000));
        // Too heavy: not kept, and the lighter value it replaces is gone
        // too (a read must not find the old one).
        cache.insert("small", vec![0; 1001]);
        assert_eq!(cache.get("small"), None);
        assert_eq!(cache.weight(), 0);
        cache.insert("small", vec![0; 10]);
        cache.refresh(&"small", Some(vec![0; 5000]));
        assert_eq!(cache.get("small"), None, "a refresh too heavy removes");
        assert_eq!(weights_held(&cache), 0);
        // A weight at the limit of `usize` (a value that cannot be
        // weighed) is refused by insert and refresh alike.
        let unweighable: Recent<&str, usize> = Recent::with_budget(64, 32_000, |w| *w);
        unweighable.insert("a", 10);
        unweighable.refresh(&"a", Some(usize::MAX));
        assert_eq!(unweighable.get("a"), None);
        unweighable.insert("a", usize::MAX);
        assert_eq!(unweighable.get("a"), None);
        assert_eq!(weights_held(&unweighable), 0);
    }

    #[test]
    fn a_generation_turns_over_at_its_share_of_the_budget_before_its_count() {
        let cache: Recent<u32, Vec<u8>> = Recent::with_budget(1 << 20, 32 * 1000, Vec::len);
        let shard_of = |k: &u32| (cache.hasher.hash_one(k) as usize) & (SHARDS - 1);
        let keys: Vec<u32> = (0..10_000).filter(|k| shard_of(k) == 0).take(4).collect();
        let [a, b, c, d] = keys[..] else {
            panic!("four keys of shard 0")
        };
        cache.insert(a, vec![0; 400]);
        cache.insert(b, vec![0; 400]);
        // 1,200 bytes would pass the generation's 1,000: a and b become
        // the previous generation.
        cache.insert(c, vec![0; 400]);
        assert_eq!(weights_held(&cache), 1200);
        // Again: a and b are dropped whole.
        cache.insert(d, vec![0; 700]);
        assert_eq!(cache.peek(&a), None);
        assert_eq!(cache.peek(&b), None);
        assert!(cache.peek(&c).is_some() && cache.peek(&d).is_some());
        assert_eq!(weights_held(&cache), 1100);
    }

    proptest! {
        /// Whatever the calls, it never holds more than its capacity, nor
        /// weighs more than its budget, and what it answers is the last
        /// value kept at the key.
        #[test]
        fn bounded_and_never_stale(
            capacity in 1usize..200,
            budget in prop_oneof![Just(usize::MAX), 0usize..20_000],
            calls in proptest::collection::vec((0u8..4, 0u16..500, any::<u32>()), 1..2000),
        ) {
            let cache: Recent<u16, u32> =
                Recent::with_budget(capacity, budget, |v| (*v % 1000) as usize);
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
                let held = weights_held(&cache);
                prop_assert_eq!(held, cache.weight());
                prop_assert!(held <= cache.budget());
            }
            prop_assert!(cache.capacity() <= capacity.max(2 * SHARDS) + 2 * SHARDS);
        }
    }
}
