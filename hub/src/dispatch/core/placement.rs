//! Spokes as placement sees them: capacity, whether a gang fits, and
//! which spokes a queued job may go to (its selector, its flavors).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use trainhub_apiserver::selector::LabelSelector;

use super::{JobKey, Millis, OfferState, Resources};
use crate::dispatch::quota::{Assignment, Flavor, Quotas};

#[derive(Debug, Clone)]
pub(super) struct Spoke {
    pub(super) labels: Value,
    pub(super) allocatable: Resources,
    pub(super) free: Resources,
    /// None while connected.
    pub(super) disconnected_at: Option<Millis>,
}

impl Spoke {
    /// A spoke known only from a stored placement: not connected since `now`.
    pub(super) fn unseen(now: Millis) -> Spoke {
        Spoke {
            labels: Value::Null,
            allocatable: Resources::new(),
            free: Resources::new(),
            disconnected_at: Some(now),
        }
    }

    pub(super) fn could_ever_fit(&self, demand: &Resources) -> bool {
        demand
            .iter()
            .all(|(r, m)| *m <= 0 || self.allocatable.get(r).is_some_and(|a| a >= m))
    }

    pub(super) fn fits_now(&self, demand: &Resources) -> bool {
        demand
            .iter()
            .all(|(r, m)| *m <= 0 || self.free.get(r).is_some_and(|f| f >= m))
    }
}

/// The share of a spoke's allocatable left free after placing `demand`, on
/// the resource the demand leaves scarcest (1.0 for an empty demand).
pub(super) fn headroom(spoke: &Spoke, demand: &Resources) -> f64 {
    demand
        .iter()
        .filter(|(_, m)| **m > 0)
        .map(|(r, m)| {
            let alloc = spoke.allocatable.get(r).copied().unwrap_or(0).max(1) as f64;
            let free = spoke.free.get(r).copied().unwrap_or(0) as f64;
            (free - *m as f64) / alloc
        })
        .fold(1.0, f64::min)
}

pub(super) fn split_capacity(capacity: Vec<(String, i64, i64)>) -> (Resources, Resources) {
    let mut allocatable = Resources::new();
    let mut free = Resources::new();
    for (resource, alloc, f) in capacity {
        allocatable.insert(resource.clone(), alloc);
        free.insert(resource, f);
    }
    (allocatable, free)
}

/// Where a job in a queue may go: spokes that provide every flavor it was
/// assigned (their labels include each flavor's `nodeLabels`), and only the
/// spoke room was made on when it preempted. A job without a reservation
/// may go anywhere.
#[derive(Debug, Default)]
pub(super) struct Where<'a> {
    flavors: Vec<&'a Flavor>,
    pin: Option<&'a str>,
}

impl<'a> Where<'a> {
    /// The constraint of `key`'s reservation.
    pub(super) fn of(quotas: &'a Quotas, key: &JobKey) -> Where<'a> {
        match quotas.reservation(key) {
            Some(r) => Where {
                flavors: flavors_of(quotas, &r.assignment),
                pin: r.pin.as_ref().map(|(spoke, _)| spoke.as_str()),
            },
            None => Where::default(),
        }
    }

    /// The constraint of an assignment not reserved yet.
    pub(super) fn assigned(quotas: &'a Quotas, assignment: &Assignment) -> Where<'a> {
        Where {
            flavors: flavors_of(quotas, assignment),
            pin: None,
        }
    }

    /// Pinned to the spoke room was made on: it is offered there whether
    /// or not the spoke reports room yet (its victims are stopping).
    pub(super) fn pinned(&self) -> bool {
        self.pin.is_some()
    }

    pub(super) fn allows(&self, name: &str, spoke: &Spoke) -> bool {
        self.pin.is_none_or(|p| p == name)
            && self
                .flavors
                .iter()
                .all(|f| provides(&spoke.labels, &f.node_labels))
    }

    /// The flavor names, for messages.
    pub(super) fn flavor_names(&self) -> String {
        let names: Vec<&str> = self.flavors.iter().map(|f| f.name.as_str()).collect();
        names.join(", ")
    }
}

fn flavors_of<'a>(quotas: &'a Quotas, assignment: &Assignment) -> Vec<&'a Flavor> {
    assignment
        .flavor_names()
        .into_iter()
        .filter_map(|name| quotas.config().flavors.get(name))
        .collect()
}

/// Whether spoke labels include every one of a flavor's node labels.
pub fn provides(labels: &Value, node_labels: &BTreeMap<String, String>) -> bool {
    node_labels
        .iter()
        .all(|(k, v)| labels.get(k).and_then(Value::as_str) == Some(v.as_str()))
}

/// Which spokes a queued job may be offered to.
pub(super) struct Eligibility<'a> {
    pub(super) cordoned: &'a BTreeSet<String>,
    /// Spokes it was offered to (pending or refused).
    pub(super) offered: &'a BTreeMap<String, OfferState>,
    pub(super) demand: &'a Resources,
    pub(super) selector: Option<&'a LabelSelector>,
    pub(super) place: &'a Where<'a>,
    /// Whether the spoke must report room for the gang now.
    pub(super) room_now: bool,
}

impl Eligibility<'_> {
    /// Connected, not cordoned, not offered it already, able to hold the
    /// whole gang (now, if asked), matching its selector and flavors.
    pub(super) fn allows(&self, name: &str, spoke: &Spoke) -> bool {
        spoke.disconnected_at.is_none()
            && !self.cordoned.contains(name)
            && !self.offered.contains_key(name)
            && spoke.could_ever_fit(self.demand)
            && (!self.room_now || spoke.fits_now(self.demand))
            && self.place.allows(name, spoke)
            && self.selector.is_none_or(|s| s.matches(Some(&spoke.labels)))
    }
}
