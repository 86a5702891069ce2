//! Gang admission against declared capacity: who holds how much of what.

use std::collections::BTreeMap;

use super::quantity::format_milli;
use crate::backend::{BackendError, Capacity, PodSetRequest, RunKey};

/// Allocatable capacity and the reservations of admitted or running runs.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    allocatable: BTreeMap<String, i64>,
    reserved: BTreeMap<RunKey, BTreeMap<String, i64>>,
}

impl Ledger {
    /// A ledger with nothing reserved.
    pub fn new(allocatable: BTreeMap<String, i64>) -> Self {
        Self {
            allocatable,
            reserved: BTreeMap::new(),
        }
    }

    /// Whether `key` holds a reservation.
    pub fn holds(&self, key: &RunKey) -> bool {
        self.reserved.contains_key(key)
    }

    /// Reserves the whole gang for `key`, or nothing.
    ///
    /// # Guarantees
    ///
    /// Idempotent: a key that already holds a reservation is Ok and keeps the
    /// reservation it has.
    ///
    /// # Errors
    ///
    /// `DoesNotFit` naming the first resource that does not fit (one that is
    /// not declared at all, or more than is free); `Invalid` for a negative
    /// request or a total beyond 64 bits.
    pub fn admit(&mut self, key: &RunKey, pod_sets: &[PodSetRequest]) -> Result<(), BackendError> {
        if self.holds(key) {
            return Ok(());
        }
        let demand = demand(pod_sets)?;
        let free = self.free();
        for (resource, want) in &demand {
            if *want <= 0 {
                continue;
            }
            let Some(allocatable) = self.allocatable.get(resource) else {
                return Err(BackendError::DoesNotFit(format!(
                    "{resource}: the gang requests {} and this spoke declares no {resource} capacity",
                    format_milli(*want)
                )));
            };
            let free = free.get(resource).copied().unwrap_or(*allocatable);
            if *want > free {
                return Err(BackendError::DoesNotFit(format!(
                    "{resource}: the gang requests {}, {} of {} is free",
                    format_milli(*want),
                    format_milli(free),
                    format_milli(*allocatable)
                )));
            }
        }
        self.reserved.insert(key.clone(), demand);
        Ok(())
    }

    /// The keys holding reservations.
    pub fn keys(&self) -> Vec<RunKey> {
        self.reserved.keys().cloned().collect()
    }

    /// Releases the reservation of `key`; false if it held none.
    pub fn release(&mut self, key: &RunKey) -> bool {
        self.reserved.remove(key).is_some()
    }

    /// Free milli-units per declared resource.
    fn free(&self) -> BTreeMap<String, i64> {
        let mut free = self.allocatable.clone();
        for demand in self.reserved.values() {
            for (resource, amount) in demand {
                if let Some(left) = free.get_mut(resource) {
                    *left = left.saturating_sub(*amount);
                }
            }
        }
        free
    }

    /// Allocatable and free capacity of every declared resource.
    pub fn capacity(&self) -> Vec<Capacity> {
        let free = self.free();
        self.allocatable
            .iter()
            .map(|(resource, allocatable)| Capacity {
                resource: resource.clone(),
                allocatable_milli: *allocatable,
                free_milli: free.get(resource).copied().unwrap_or(*allocatable),
            })
            .collect()
    }
}

/// Sum over pod sets of count × per-pod requests.
fn demand(pod_sets: &[PodSetRequest]) -> Result<BTreeMap<String, i64>, BackendError> {
    let mut total: BTreeMap<String, i64> = BTreeMap::new();
    for set in pod_sets {
        for (resource, per_pod) in &set.requests_milli {
            if *per_pod < 0 {
                return Err(BackendError::Invalid(format!(
                    "pod set {:?}: request for {resource} is negative ({per_pod}m)",
                    set.name
                )));
            }
            let overflow = || {
                BackendError::Invalid(format!(
                    "pod set {:?}: total request for {resource} is beyond 64 bits of milli-units",
                    set.name
                ))
            };
            let amount = per_pod
                .checked_mul(i64::from(set.count))
                .ok_or_else(overflow)?;
            let slot = total.entry(resource.clone()).or_default();
            *slot = slot.checked_add(amount).ok_or_else(overflow)?;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: i64) -> RunKey {
        RunKey {
            run_id: "r".into(),
            generation: n,
        }
    }

    fn set(name: &str, count: u32, reqs: &[(&str, i64)]) -> PodSetRequest {
        PodSetRequest {
            name: name.into(),
            count,
            requests_milli: reqs.iter().map(|(r, m)| (r.to_string(), *m)).collect(),
        }
    }

    fn ledger() -> Ledger {
        Ledger::new([("cpu".to_string(), 4000), ("nvidia.com/gpu".into(), 2000)].into())
    }

    #[test]
    fn admits_the_whole_gang_or_nothing() {
        let mut l = ledger();
        l.admit(
            &key(1),
            &[set("node", 2, &[("cpu", 1000), ("nvidia.com/gpu", 1000)])],
        )
        .unwrap();
        assert_eq!(
            l.capacity(),
            vec![
                Capacity {
                    resource: "cpu".into(),
                    allocatable_milli: 4000,
                    free_milli: 2000
                },
                Capacity {
                    resource: "nvidia.com/gpu".into(),
                    allocatable_milli: 2000,
                    free_milli: 0
                },
            ]
        );
        // cpu would fit, gpu does not: nothing is reserved.
        let err = l
            .admit(
                &key(2),
                &[
                    set("a", 1, &[("cpu", 500)]),
                    set("b", 1, &[("nvidia.com/gpu", 1000)]),
                ],
            )
            .unwrap_err();
        assert_eq!(
            err,
            BackendError::DoesNotFit("nvidia.com/gpu: the gang requests 1, 0 of 2 is free".into())
        );
        assert_eq!(l.capacity()[0].free_milli, 2000);
        assert!(!l.holds(&key(2)));
    }

    #[test]
    fn admit_is_idempotent_and_release_frees() {
        let mut l = ledger();
        let gang = [set("node", 4, &[("cpu", 1000)])];
        l.admit(&key(1), &gang).unwrap();
        l.admit(&key(1), &gang).unwrap();
        assert_eq!(l.capacity()[0].free_milli, 0);
        assert!(l.release(&key(1)));
        assert!(!l.release(&key(1)));
        assert_eq!(l.capacity()[0].free_milli, 4000);
    }

    #[test]
    fn undeclared_resources_do_not_fit_unless_zero() {
        let mut l = ledger();
        let err = l
            .admit(&key(1), &[set("n", 1, &[("memory", 1)])])
            .unwrap_err();
        assert_eq!(
            err,
            BackendError::DoesNotFit(
                "memory: the gang requests 1m and this spoke declares no memory capacity".into()
            )
        );
        l.admit(&key(1), &[set("n", 1, &[("memory", 0)])]).unwrap();
    }

    #[test]
    fn negative_and_overflowing_requests_are_invalid() {
        let mut l = ledger();
        assert!(matches!(
            l.admit(&key(1), &[set("n", 1, &[("cpu", -1)])]),
            Err(BackendError::Invalid(m)) if m.contains("negative")
        ));
        assert!(matches!(
            l.admit(&key(1), &[set("n", 3, &[("cpu", i64::MAX / 2)])]),
            Err(BackendError::Invalid(m)) if m.contains("64 bits")
        ));
    }
}
