//! Flavor assignment: for each resource group of a ClusterQueue, the
//! flavor a workload's requests are charged to, as Kueue's flavor assigner
//! chooses it, and whether they fit now, after preemption, or not at all.
//!
//! The workload is the TrainJob's whole gang (its pod sets summed per
//! resource): the gang goes to one spoke, so every pod set takes the same
//! flavor of a group.

use std::collections::BTreeMap;

use serde_json::Value;

use super::model::{ClusterQueue, Flavor, Fungibility, Toleration};
use super::tree::{NodeId, Tree};
use crate::dispatch::core::Resources;

/// How a flavor (or a whole assignment) can be had. Ordered worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Not even with preemption.
    NoFit,
    /// Within the ClusterQueue's nominal quota, were others preempted.
    Preempt,
    /// In unused quota now (perhaps borrowing).
    Fit,
}

/// The flavors chosen for a workload and what it charges to them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Assignment {
    /// Resource → flavor.
    pub flavors: BTreeMap<String, String>,
    /// (flavor, resource) → milli-units charged.
    pub usage: BTreeMap<(String, String), i64>,
    /// Whether any of it is over the ClusterQueue's nominal quota.
    pub borrows: bool,
}

impl Assignment {
    /// The distinct flavors assigned, in name order.
    pub fn flavor_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.flavors.values().map(String::as_str).collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// The outcome of flavor assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every requested resource fits in unused quota with these flavors.
    Fit(Assignment),
    /// It would fit with these flavors if others were preempted; `message`
    /// says what is short.
    Preempt {
        assignment: Assignment,
        message: String,
    },
    /// It cannot be admitted as the quotas stand. `inadmissible`: no quota
    /// change short of a new ClusterQueue spec would help (a resource no
    /// group covers).
    NoFit { inadmissible: bool, message: String },
}

/// What a workload asks of flavor assignment.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The gang's requests, summed, milli-units (zero entries ignored).
    pub demand: &'a Resources,
    /// The gang's pods, charged to the `pods` resource if a group covers it.
    pub pods: i64,
    /// The pods' tolerations.
    pub tolerations: &'a [Toleration],
    /// The pod set names, for messages.
    pub pod_sets: &'a str,
}

/// Assigns a flavor to each resource group the request touches, trying
/// each group's flavors in order, as Kueue does: a flavor whose taints the
/// workload does not tolerate (its own tolerations and the flavor's) is
/// skipped; the first flavor where every requested resource fits without
/// borrowing is taken; one that fits by borrowing is taken at once unless
/// `whenCanBorrow: TryNextFlavor`; one that needs preemption is kept while
/// later flavors are tried unless `whenCanPreempt: MayStopSearch`; of the
/// flavors kept, the best is taken. Costs O(resources × flavors × depth of
/// the cohort tree).
pub fn assign(
    tree: &Tree,
    node: NodeId,
    cq: &ClusterQueue,
    flavors: &BTreeMap<String, Flavor>,
    request: Request<'_>,
) -> Outcome {
    let mut demand: BTreeMap<&str, i64> = request
        .demand
        .iter()
        .filter(|(_, m)| **m > 0)
        .map(|(r, m)| (r.as_str(), *m))
        .collect();
    if request.pods > 0 && cq.group_of("pods").is_some() {
        demand.insert("pods", request.pods.saturating_mul(1000));
    }
    let uncovered: Vec<&str> = demand
        .keys()
        .filter(|r| cq.group_of(r).is_none())
        .copied()
        .collect();
    if !uncovered.is_empty() {
        let reasons: Vec<String> = uncovered
            .iter()
            .map(|r| format!("resource {r} unavailable in ClusterQueue"))
            .collect();
        return Outcome::NoFit {
            inadmissible: true,
            message: message(request.pod_sets, reasons),
        };
    }
    let mut assignment = Assignment::default();
    let mut worst = Mode::Fit;
    let mut reasons = Vec::new();
    for group in &cq.resource_groups {
        let wanted: Vec<(&str, i64)> = group
            .covered
            .iter()
            .filter_map(|r| demand.get(r.as_str()).map(|m| (r.as_str(), *m)))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let mut best: Option<(Mode, bool, &str)> = None;
        for fq in &group.flavors {
            let name = fq.flavor.as_str();
            let Some(flavor) = flavors.get(name) else {
                reasons.push(format!("flavor {name} not found"));
                continue;
            };
            if let Some(taint) = flavor.taints.iter().find(|t| {
                t.binds()
                    && !request
                        .tolerations
                        .iter()
                        .chain(&flavor.tolerations)
                        .any(|tol| tol.tolerates(t))
            }) {
                reasons.push(format!("untolerated taint {taint} in flavor {name}"));
                continue;
            }
            let mut mode = Mode::Fit;
            let mut borrows = false;
            for (resource, amount) in &wanted {
                let (m, b) = fits(
                    tree,
                    node,
                    (name, resource, *amount),
                    cq.preemption.borrow_within_cohort.lower_priority,
                    &mut reasons,
                );
                mode = mode.min(m);
                borrows |= b;
                if mode == Mode::NoFit {
                    break;
                }
            }
            if mode == Mode::NoFit {
                continue;
            }
            let fungibility = cq.flavor_fungibility;
            let stop = match mode {
                Mode::Fit => !borrows || fungibility.when_can_borrow == Fungibility::MayStopSearch,
                Mode::Preempt => {
                    fungibility.when_can_preempt == Fungibility::MayStopSearch
                        && (!borrows || fungibility.when_can_borrow == Fungibility::MayStopSearch)
                }
                Mode::NoFit => false,
            };
            let better = best.is_none_or(|(bm, bb, _)| {
                if fungibility.when_can_borrow == Fungibility::TryNextFlavor && borrows != bb {
                    !borrows
                } else if mode != bm {
                    mode > bm
                } else {
                    !borrows && bb
                }
            });
            if stop || better {
                best = Some((mode, borrows, name));
            }
            if stop {
                break;
            }
        }
        let Some((mode, borrows, flavor)) = best else {
            return Outcome::NoFit {
                inadmissible: false,
                message: message(request.pod_sets, reasons),
            };
        };
        worst = worst.min(mode);
        assignment.borrows |= borrows;
        for (resource, amount) in wanted {
            assignment
                .flavors
                .insert(resource.to_string(), flavor.to_string());
            assignment
                .usage
                .insert((flavor.to_string(), resource.to_string()), amount);
        }
    }
    match worst {
        Mode::Fit => Outcome::Fit(assignment),
        Mode::Preempt => Outcome::Preempt {
            assignment,
            message: message(request.pod_sets, reasons),
        },
        Mode::NoFit => Outcome::NoFit {
            inadmissible: false,
            message: message(request.pod_sets, reasons),
        },
    }
}

/// How `amount` of `resource` fits in `flavor` for the ClusterQueue at
/// `node`, and whether it borrows; a shortfall is explained in `reasons`.
/// Preemption can make room within the nominal quota, and beyond it (up to
/// what the cohort could lend) when the queue may preempt while borrowing
/// (`borrowWithinCohort`).
fn fits(
    tree: &Tree,
    node: NodeId,
    (flavor, resource, amount): (&str, &str, i64),
    preempt_borrowing: bool,
    reasons: &mut Vec<String>,
) -> (Mode, bool) {
    let most = tree.potential_available(node, flavor, resource);
    if amount > most {
        reasons.push(format!(
            "insufficient quota for {resource} in flavor {flavor}, request > maximum capacity ({} > {})",
            quantity_string(resource, amount),
            quantity_string(resource, most)
        ));
        return (Mode::NoFit, false);
    }
    let borrows =
        tree.usage(node, flavor, resource) + amount > tree.subtree_quota(node, flavor, resource);
    let available = tree.available(node, flavor, resource);
    if amount <= available {
        return (Mode::Fit, borrows);
    }
    reasons.push(format!(
        "insufficient unused quota for {resource} in flavor {flavor}, {} more needed",
        quantity_string(resource, amount - available)
    ));
    if amount <= tree.quota(node, flavor, resource).nominal {
        (Mode::Preempt, false)
    } else if preempt_borrowing {
        (Mode::Preempt, borrows)
    } else {
        (Mode::NoFit, borrows)
    }
}

/// The assignment of a workload already running on a spoke with `labels`
/// (an admission loaded at start-up): in each group the first flavor the
/// spoke provides (the first flavor if none does, or the spoke's labels are
/// not known yet), whatever the quota left. Resources no group covers are
/// not charged.
pub fn assign_for_spoke(
    cq: &ClusterQueue,
    flavors: &BTreeMap<String, Flavor>,
    demand: &Resources,
    pods: i64,
    labels: &Value,
) -> Assignment {
    let mut wanted: BTreeMap<&str, i64> = demand
        .iter()
        .filter(|(_, m)| **m > 0)
        .map(|(r, m)| (r.as_str(), *m))
        .collect();
    if pods > 0 && cq.group_of("pods").is_some() {
        wanted.insert("pods", pods.saturating_mul(1000));
    }
    let mut assignment = Assignment::default();
    for group in &cq.resource_groups {
        let provided = group.flavors.iter().find(|fq| {
            flavors.get(&fq.flavor).is_some_and(|f| {
                f.node_labels
                    .iter()
                    .all(|(k, v)| labels.get(k).and_then(Value::as_str) == Some(v.as_str()))
            })
        });
        let Some(fq) = provided.or_else(|| group.flavors.first()) else {
            continue;
        };
        for resource in &group.covered {
            if let Some(amount) = wanted.get(resource.as_str()) {
                assignment
                    .flavors
                    .insert(resource.clone(), fq.flavor.clone());
                assignment
                    .usage
                    .insert((fq.flavor.clone(), resource.clone()), *amount);
                if let Some(q) = fq.quotas.get(resource) {
                    assignment.borrows |= *amount > q.nominal;
                }
            }
        }
    }
    assignment
}

/// Kueue's shape of a flavor assignment failure: the reasons sorted and
/// deduplicated, after the pod set names.
fn message(pod_sets: &str, mut reasons: Vec<String>) -> String {
    reasons.sort();
    reasons.dedup();
    format!(
        "couldn't assign flavors to pod set {pod_sets}: {}",
        reasons.join(", ")
    )
}

/// A milli-unit amount as a Kubernetes quantity (`2`, `500m`, `36Gi` for
/// byte resources that are whole kibibytes).
pub fn quantity_string(resource: &str, milli: i64) -> String {
    let bytes = resource == "memory"
        || resource == "ephemeral-storage"
        || resource.starts_with("hugepages-");
    let text = if bytes && milli % 1000 == 0 && milli != 0 && (milli / 1000) % 1024 == 0 {
        format!("{}Ki", milli / 1000 / 1024)
    } else {
        format!("{milli}m")
    };
    trainhub_builtin_plugins::quantity::Quantity::parse(&text)
        .map_or_else(|_| format!("{milli}m"), |q| q.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::model::{
        FlavorFungibility, FlavorQuotas, Quota, ResourceGroup, Taint, Toleration,
    };
    use super::*;

    fn flavor(name: &str) -> Flavor {
        Flavor {
            name: name.into(),
            ..Flavor::default()
        }
    }

    fn group(covered: &[&str], flavors: &[(&str, i64)]) -> ResourceGroup {
        ResourceGroup {
            covered: covered.iter().map(|r| r.to_string()).collect(),
            flavors: flavors
                .iter()
                .map(|(f, nominal)| FlavorQuotas {
                    flavor: f.to_string(),
                    quotas: covered
                        .iter()
                        .map(|r| {
                            (
                                r.to_string(),
                                Quota {
                                    nominal: *nominal,
                                    ..Quota::default()
                                },
                            )
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    fn cq(groups: Vec<ResourceGroup>) -> ClusterQueue {
        ClusterQueue {
            name: "cq".into(),
            resource_groups: groups,
            ..ClusterQueue::default()
        }
    }

    fn request(demand: &Resources) -> Request<'_> {
        Request {
            demand,
            pods: 1,
            tolerations: &[],
            pod_sets: "node",
        }
    }

    fn flavors(names: &[&str]) -> BTreeMap<String, Flavor> {
        names.iter().map(|n| (n.to_string(), flavor(n))).collect()
    }

    /// One ClusterQueue, alone, with `groups`; `used` milli-units of the
    /// first covered resource already used in flavor `on`.
    fn lone(
        groups: Vec<ResourceGroup>,
        on: &str,
        resource: &str,
        used: i64,
    ) -> (Tree, ClusterQueue) {
        let mut t = Tree::default();
        let node = t.add_node(&groups);
        t.finish();
        t.add_usage(node, on, resource, used);
        (t, cq(groups))
    }

    fn cpu(milli: i64) -> Resources {
        [("cpu".to_string(), milli)].into()
    }

    #[test]
    fn the_first_flavor_with_room_is_taken() {
        let (t, q) = lone(
            vec![group(&["cpu"], &[("a", 4000), ("b", 8000)])],
            "a",
            "cpu",
            3000,
        );
        let Outcome::Fit(a) = assign(&t, 0, &q, &flavors(&["a", "b"]), request(&cpu(2000))) else {
            panic!("should fit");
        };
        assert_eq!(a.flavors["cpu"], "b");
        assert_eq!(a.usage[&("b".to_string(), "cpu".to_string())], 2000);
        assert!(!a.borrows);
        let Outcome::Fit(a) = assign(&t, 0, &q, &flavors(&["a", "b"]), request(&cpu(1000))) else {
            panic!("should fit");
        };
        assert_eq!(a.flavors["cpu"], "a");
    }

    #[test]
    fn a_shortfall_within_nominal_needs_preemption_and_says_how_much() {
        let (t, q) = lone(
            vec![group(&["cpu"], &[("default-flavor", 4000)])],
            "default-flavor",
            "cpu",
            3000,
        );
        let out = assign(
            &t,
            0,
            &q,
            &flavors(&["default-flavor"]),
            request(&cpu(3000)),
        );
        let Outcome::Preempt {
            assignment,
            message,
        } = out
        else {
            panic!("{out:?}");
        };
        assert_eq!(assignment.flavors["cpu"], "default-flavor");
        assert_eq!(
            message,
            "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default-flavor, 2 more needed"
        );
    }

    #[test]
    fn a_request_over_the_maximum_never_fits() {
        let (t, q) = lone(vec![group(&["cpu"], &[("f", 4000)])], "f", "cpu", 0);
        let out = assign(&t, 0, &q, &flavors(&["f"]), request(&cpu(4500)));
        assert_eq!(
            out,
            Outcome::NoFit {
                inadmissible: false,
                message: "couldn't assign flavors to pod set node: insufficient quota for cpu in flavor f, request > maximum capacity (4500m > 4)".into()
            }
        );
    }

    #[test]
    fn a_resource_no_group_covers_is_inadmissible() {
        let (t, q) = lone(vec![group(&["cpu"], &[("f", 4000)])], "f", "cpu", 0);
        let demand: Resources = [
            ("cpu".to_string(), 1000),
            ("nvidia.com/gpu".to_string(), 1000),
        ]
        .into();
        let out = assign(&t, 0, &q, &flavors(&["f"]), request(&demand));
        assert_eq!(
            out,
            Outcome::NoFit {
                inadmissible: true,
                message: "couldn't assign flavors to pod set node: resource nvidia.com/gpu unavailable in ClusterQueue".into()
            }
        );
        // A zero request needs no quota.
        let demand: Resources =
            [("cpu".to_string(), 1000), ("nvidia.com/gpu".to_string(), 0)].into();
        assert!(matches!(
            assign(&t, 0, &q, &flavors(&["f"]), request(&demand)),
            Outcome::Fit(_)
        ));
    }

    #[test]
    fn pods_are_charged_when_a_group_covers_them() {
        let (t, q) = lone(vec![group(&["cpu", "pods"], &[("f", 4000)])], "f", "cpu", 0);
        let demand = cpu(1000);
        let mut r = request(&demand);
        r.pods = 5;
        let out = assign(&t, 0, &q, &flavors(&["f"]), r);
        assert!(matches!(out, Outcome::NoFit { .. }), "{out:?}");
        r.pods = 4;
        let Outcome::Fit(a) = assign(&t, 0, &q, &flavors(&["f"]), r) else {
            panic!("four pods fit");
        };
        assert_eq!(a.usage[&("f".to_string(), "pods".to_string())], 4000);
    }

    #[test]
    fn each_group_gets_its_own_flavor() {
        let groups = vec![
            group(&["cpu", "memory"], &[("cpu-a", 8000)]),
            group(&["nvidia.com/gpu"], &[("h100", 0), ("a100", 8000)]),
        ];
        let (t, q) = lone(groups, "cpu-a", "cpu", 0);
        let demand: Resources = [
            ("cpu".to_string(), 2000),
            ("memory".to_string(), 1000),
            ("nvidia.com/gpu".to_string(), 4000),
        ]
        .into();
        let Outcome::Fit(a) = assign(
            &t,
            0,
            &q,
            &flavors(&["cpu-a", "h100", "a100"]),
            request(&demand),
        ) else {
            panic!("should fit");
        };
        assert_eq!(a.flavors["cpu"], "cpu-a");
        assert_eq!(a.flavors["memory"], "cpu-a");
        assert_eq!(a.flavors["nvidia.com/gpu"], "a100");
        assert_eq!(a.flavor_names(), ["a100", "cpu-a"]);
    }

    #[test]
    fn an_untolerated_taint_skips_the_flavor_and_a_toleration_allows_it() {
        let (t, q) = lone(
            vec![group(&["cpu"], &[("spot", 4000), ("on-demand", 4000)])],
            "spot",
            "cpu",
            0,
        );
        let mut fl = flavors(&["on-demand"]);
        let mut spot = flavor("spot");
        spot.taints.push(Taint {
            key: "spot".into(),
            value: "true".into(),
            effect: "NoSchedule".into(),
        });
        fl.insert("spot".into(), spot.clone());
        let Outcome::Fit(a) = assign(&t, 0, &q, &fl, request(&cpu(1000))) else {
            panic!("on-demand fits");
        };
        assert_eq!(a.flavors["cpu"], "on-demand");
        let tolerations = [Toleration {
            key: "spot".into(),
            exists: true,
            ..Toleration::default()
        }];
        let demand = cpu(1000);
        let mut r = request(&demand);
        r.tolerations = &tolerations;
        let Outcome::Fit(a) = assign(&t, 0, &q, &fl, r) else {
            panic!("spot fits when tolerated");
        };
        assert_eq!(a.flavors["cpu"], "spot");
        // The flavor's own tolerations count too.
        spot.tolerations = tolerations.to_vec();
        fl.insert("spot".into(), spot);
        let Outcome::Fit(a) = assign(&t, 0, &q, &fl, request(&cpu(1000))) else {
            panic!("spot fits when it tolerates itself");
        };
        assert_eq!(a.flavors["cpu"], "spot");
        // Only spot, untolerated: the reason names the taint.
        let (t, q) = lone(vec![group(&["cpu"], &[("spot", 4000)])], "spot", "cpu", 0);
        let mut only_spot = flavors(&[]);
        let mut s = flavor("spot");
        s.taints.push(Taint {
            key: "spot".into(),
            value: "true".into(),
            effect: "NoSchedule".into(),
        });
        only_spot.insert("spot".into(), s);
        let Outcome::NoFit { message, .. } = assign(&t, 0, &q, &only_spot, request(&cpu(1000)))
        else {
            panic!("untolerated");
        };
        assert!(
            message.ends_with("untolerated taint spot=true:NoSchedule in flavor spot"),
            "{message}"
        );
    }

    /// Two ClusterQueues in a cohort, each with 4 cpus of flavors `a` and `b`
    /// (in that order) for `cq`, `cq` having used 3 of `a`.
    /// Two ClusterQueues of `groups` in a cohort: the tree, the first (a
    /// queue of `groups` in cohort `c`, node 1) and the second's node.
    fn pair(groups: Vec<ResourceGroup>) -> (Tree, ClusterQueue, NodeId) {
        let mut t = Tree::default();
        let cohort = t.add_node(&[]);
        let me = t.add_node(&groups);
        let other = t.add_node(&groups);
        t.set_parent(me, cohort);
        t.set_parent(other, cohort);
        t.finish();
        let mut q = cq(groups);
        q.cohort = Some("c".into());
        (t, q, other)
    }

    fn borrowing(fungibility: FlavorFungibility) -> (Tree, ClusterQueue) {
        let (mut t, mut q, _) = pair(vec![group(&["cpu"], &[("a", 4000), ("b", 4000)])]);
        t.add_usage(1, "a", "cpu", 3000);
        q.flavor_fungibility = fungibility;
        (t, q)
    }

    #[test]
    fn beyond_nominal_preemption_is_tried_only_when_the_queue_may_borrow_preempting() {
        // Cohort of me and other (4 each); other uses its 4: me can borrow
        // nothing now, 4 once other's quota frees.
        let (mut t, mut q, other) = pair(vec![group(&["cpu"], &[("f", 4000)])]);
        t.add_usage(other, "f", "cpu", 4000);
        let me = 1;
        let out = assign(&t, me, &q, &flavors(&["f"]), request(&cpu(6000)));
        assert!(matches!(out, Outcome::NoFit { .. }), "{out:?}");
        q.preemption.borrow_within_cohort.lower_priority = true;
        let out = assign(&t, me, &q, &flavors(&["f"]), request(&cpu(6000)));
        let Outcome::Preempt { assignment, .. } = out else {
            panic!("{out:?}");
        };
        assert!(assignment.borrows);
    }

    #[test]
    fn by_default_borrowing_in_the_first_flavor_is_preferred_to_the_next_flavor() {
        let (t, q) = borrowing(FlavorFungibility::default());
        let Outcome::Fit(a) = assign(&t, 1, &q, &flavors(&["a", "b"]), request(&cpu(2000))) else {
            panic!("fits by borrowing");
        };
        assert_eq!(a.flavors["cpu"], "a");
        assert!(a.borrows);
    }

    #[test]
    fn try_next_flavor_prefers_a_flavor_without_borrowing() {
        let (t, q) = borrowing(FlavorFungibility {
            when_can_borrow: Fungibility::TryNextFlavor,
            when_can_preempt: Fungibility::TryNextFlavor,
        });
        let Outcome::Fit(a) = assign(&t, 1, &q, &flavors(&["a", "b"]), request(&cpu(2000))) else {
            panic!("fits");
        };
        assert_eq!(a.flavors["cpu"], "b");
        assert!(!a.borrows);
    }

    #[test]
    fn a_flavor_needing_preemption_is_passed_over_for_one_that_fits() {
        let groups = vec![group(&["cpu"], &[("a", 4000), ("b", 4000)])];
        let (mut t, q) = lone(groups, "a", "cpu", 3000);
        let Outcome::Fit(a) = assign(&t, 0, &q, &flavors(&["a", "b"]), request(&cpu(2000))) else {
            panic!("b fits");
        };
        assert_eq!(a.flavors["cpu"], "b");
        // Both short: the first that preemption could free is kept.
        t.add_usage(0, "b", "cpu", 3000);
        let Outcome::Preempt {
            assignment,
            message,
        } = assign(&t, 0, &q, &flavors(&["a", "b"]), request(&cpu(2000)))
        else {
            panic!("preempt");
        };
        assert_eq!(assignment.flavors["cpu"], "a");
        assert!(
            message.contains("flavor a, 1 more needed")
                && message.contains("flavor b, 1 more needed"),
            "{message}"
        );
    }

    #[test]
    fn quantities_print_as_kubernetes_prints_them() {
        assert_eq!(quantity_string("cpu", 2000), "2");
        assert_eq!(quantity_string("cpu", 500), "500m");
        assert_eq!(
            quantity_string("memory", 36 * 1024 * 1024 * 1024 * 1000),
            "36Gi"
        );
        assert_eq!(quantity_string("memory", 1000), "1");
        assert_eq!(quantity_string("nvidia.com/gpu", 0), "0");
    }
}
