//! The quota book: the configuration, the cohort tree built from it, and
//! every reservation charged to it, indexed per ClusterQueue and per spoke
//! so that admission and preemption never scan all workloads.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::admit::{self, Assignment, Outcome, Request};
use super::model::{ClusterQueue, QuotaConfig, ReclaimWithinCohort, WithinClusterQueue};
use super::preempt::{self, Candidate, Decision, Preemptor, Room};
use super::status::{FlavorUsage, ResourceUsage};
use super::tree::{NodeId, Tree};
use crate::dispatch::core::{JobKey, Millis, Resources};

/// Quota held by one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub cluster_queue: String,
    pub local_queue: String,
    pub assignment: Assignment,
    pub priority: i32,
    /// Creation time (queue order).
    pub created: i64,
    /// Its gang's requests (what its spoke frees when it stops).
    pub gang: Resources,
    /// The spoke it is placed on (admitted), and since when.
    pub admitted: Option<(String, Millis)>,
    /// Room was made for it by preemption on this spoke, at this time: it
    /// goes there only, and keeps its quota while it waits for the victims
    /// to go.
    pub pin: Option<(String, Millis)>,
}

/// The quota configuration and what is charged to it.
#[derive(Debug, Clone, Default)]
pub struct Quotas {
    config: QuotaConfig,
    tree: Tree,
    /// ClusterQueue → its node.
    nodes: HashMap<String, NodeId>,
    /// ClusterQueue → the ClusterQueues of its cohort tree (itself
    /// included), in name order.
    tree_members: HashMap<String, Vec<String>>,
    /// ClusterQueue → why it is inactive.
    inactive: HashMap<String, String>,
    reservations: HashMap<JobKey, Reservation>,
    /// ClusterQueue → its admitted workloads.
    admitted_in: HashMap<String, BTreeSet<JobKey>>,
    /// Spoke → the admitted workloads on it.
    admitted_on: HashMap<String, BTreeSet<JobKey>>,
}

impl Quotas {
    /// Replaces the configuration. Reservations are charged again to the
    /// new tree as they are (a quota that shrank below what is reserved
    /// leaves its ClusterQueue over quota until workloads finish; nothing
    /// new is admitted meanwhile).
    pub fn set_config(&mut self, config: QuotaConfig) {
        let mut tree = Tree::default();
        let mut cohort_nodes: BTreeMap<String, NodeId> = BTreeMap::new();
        let mut names: BTreeSet<&str> = config.cohorts.keys().map(String::as_str).collect();
        names.extend(
            config
                .cluster_queues
                .values()
                .filter_map(|q| q.cohort.as_deref()),
        );
        names.extend(config.cohorts.values().filter_map(|c| c.parent.as_deref()));
        for name in names {
            let groups = config
                .cohorts
                .get(name)
                .map(|c| c.resource_groups.as_slice())
                .unwrap_or_default();
            cohort_nodes.insert(name.to_string(), tree.add_node(groups));
        }
        // A cohort on a cycle of parents is cut loose, and every
        // ClusterQueue under it inactive (as Kueue disables them).
        let mut cyclic: HashSet<&str> = HashSet::new();
        for name in config.cohorts.keys() {
            let mut seen = vec![name.as_str()];
            let mut at = name.as_str();
            while let Some(parent) = config.cohorts.get(at).and_then(|c| c.parent.as_deref()) {
                if let Some(i) = seen.iter().position(|s| *s == parent) {
                    cyclic.extend(&seen[i..]);
                    break;
                }
                seen.push(parent);
                at = parent;
            }
        }
        for cohort in config.cohorts.values() {
            if cyclic.contains(cohort.name.as_str()) {
                continue;
            }
            if let (Some(parent), Some(&child)) = (&cohort.parent, cohort_nodes.get(&cohort.name))
                && let Some(&p) = cohort_nodes.get(parent)
            {
                tree.set_parent(child, p);
            }
        }
        let mut nodes = HashMap::new();
        let mut inactive = HashMap::new();
        let mut roots: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        for cq in config.cluster_queues.values() {
            let node = tree.add_node(&cq.resource_groups);
            if let Some(&cohort) = cq.cohort.as_ref().and_then(|c| cohort_nodes.get(c)) {
                tree.set_parent(node, cohort);
            }
            nodes.insert(cq.name.clone(), node);
            let missing: Vec<&str> = cq
                .resource_groups
                .iter()
                .flat_map(|g| &g.flavors)
                .map(|f| f.flavor.as_str())
                .filter(|f| !config.flavors.contains_key(*f))
                .collect();
            if !missing.is_empty() {
                inactive.insert(
                    cq.name.clone(),
                    format!("flavor {} not found", missing.join(", ")),
                );
            }
            let mut in_cycle = false;
            let mut at = cq.cohort.as_deref();
            let mut hops = 0;
            while let Some(c) = at {
                if cyclic.contains(c) {
                    in_cycle = true;
                    break;
                }
                at = config.cohorts.get(c).and_then(|c| c.parent.as_deref());
                hops += 1;
                if hops > config.cohorts.len() {
                    break;
                }
            }
            if in_cycle {
                inactive.insert(cq.name.clone(), "its cohort tree has a cycle".into());
            }
            let mut root = node;
            while let Some(p) = tree.parent(root) {
                root = p;
            }
            roots.entry(root).or_default().push(cq.name.clone());
        }
        tree.finish();
        let mut tree_members = HashMap::new();
        for members in roots.into_values() {
            for m in &members {
                tree_members.insert(m.clone(), members.clone());
            }
        }
        self.config = config;
        self.tree = tree;
        self.nodes = nodes;
        self.tree_members = tree_members;
        self.inactive = inactive;
        for r in self.reservations.values() {
            if let Some(&node) = self.nodes.get(&r.cluster_queue) {
                for ((f, res), amount) in &r.assignment.usage {
                    self.tree.add_usage(node, f, res, *amount);
                }
            }
        }
    }

    pub fn config(&self) -> &QuotaConfig {
        &self.config
    }

    pub fn cluster_queue(&self, name: &str) -> Option<&ClusterQueue> {
        self.config.cluster_queues.get(name)
    }

    /// Why the ClusterQueue admits nothing (a flavor it names does not
    /// exist, its cohort tree has a cycle); None while it is active.
    pub fn inactive(&self, name: &str) -> Option<&str> {
        self.inactive.get(name).map(String::as_str)
    }

    /// The ClusterQueues sharing a cohort tree with `name` (itself
    /// included; only itself outside a cohort).
    pub fn tree_members(&self, name: &str) -> &[String] {
        self.tree_members
            .get(name)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Flavor assignment for a workload of ClusterQueue `name` (see
    /// [`admit::assign`]); None if there is no such ClusterQueue.
    pub fn assign(&self, name: &str, request: Request<'_>) -> Option<Outcome> {
        let cq = self.config.cluster_queues.get(name)?;
        let node = *self.nodes.get(name)?;
        Some(admit::assign(
            &self.tree,
            node,
            cq,
            &self.config.flavors,
            request,
        ))
    }

    /// Charges a reservation (replacing any the workload held).
    pub fn reserve(&mut self, key: JobKey, reservation: Reservation) {
        self.release(&key);
        if let Some(&node) = self.nodes.get(&reservation.cluster_queue) {
            for ((f, r), amount) in &reservation.assignment.usage {
                self.tree.add_usage(node, f, r, *amount);
            }
        }
        if let Some((spoke, _)) = &reservation.admitted {
            self.index_admitted(&key, &reservation.cluster_queue, spoke);
        }
        self.reservations.insert(key, reservation);
    }

    fn index_admitted(&mut self, key: &JobKey, cq: &str, spoke: &str) {
        self.admitted_in
            .entry(cq.to_string())
            .or_default()
            .insert(key.clone());
        self.admitted_on
            .entry(spoke.to_string())
            .or_default()
            .insert(key.clone());
    }

    /// The workload was placed on `spoke` at `at`.
    pub fn admit(&mut self, key: &JobKey, spoke: &str, at: Millis) {
        let Some(r) = self.reservations.get_mut(key) else {
            return;
        };
        r.admitted = Some((spoke.to_string(), at));
        r.pin = None;
        let cq = r.cluster_queue.clone();
        self.index_admitted(key, &cq, spoke);
    }

    /// Gives back the workload's quota; what it held, if anything.
    pub fn release(&mut self, key: &JobKey) -> Option<Reservation> {
        let r = self.reservations.remove(key)?;
        if let Some(&node) = self.nodes.get(&r.cluster_queue) {
            for ((f, res), amount) in &r.assignment.usage {
                self.tree.remove_usage(node, f, res, *amount);
            }
        }
        if let Some((spoke, _)) = &r.admitted {
            if let Some(set) = self.admitted_in.get_mut(&r.cluster_queue) {
                set.remove(key);
            }
            if let Some(set) = self.admitted_on.get_mut(spoke) {
                set.remove(key);
            }
        }
        Some(r)
    }

    pub fn reservation(&self, key: &JobKey) -> Option<&Reservation> {
        self.reservations.get(key)
    }

    pub fn reservations(&self) -> impl Iterator<Item = (&JobKey, &Reservation)> {
        self.reservations.iter()
    }

    pub fn is_reserved(&self, key: &JobKey) -> bool {
        self.reservations.contains_key(key)
    }

    /// Ends a pin: the workload keeps its quota only while offers of it are
    /// pending.
    pub fn unpin(&mut self, key: &JobKey) {
        if let Some(r) = self.reservations.get_mut(key) {
            r.pin = None;
        }
    }

    /// The admitted workloads on `spoke`.
    pub fn admitted_on(&self, spoke: &str) -> impl Iterator<Item = &JobKey> {
        self.admitted_on.get(spoke).into_iter().flatten()
    }

    /// The admitted workloads of ClusterQueue `cq`.
    pub fn admitted_in(&self, cq: &str) -> impl Iterator<Item = &JobKey> {
        self.admitted_in.get(cq).into_iter().flatten()
    }

    /// The admitted workloads its ClusterQueue's preemption policy lets a
    /// workload of priority `priority`, created at `created`, in `cq`, with
    /// `assignment`, preempt: of its own queue by `withinClusterQueue`, of
    /// the other queues of its cohort tree that borrow a flavor-resource it
    /// needs by `reclaimWithinCohort`. Only workloads holding some of what
    /// it needs are candidates.
    pub fn candidates(
        &self,
        cq: &str,
        priority: i32,
        created: i64,
        assignment: &Assignment,
    ) -> Vec<Candidate> {
        let Some(queue) = self.config.cluster_queues.get(cq) else {
            return Vec::new();
        };
        let policy = queue.preemption;
        let needs = |r: &Reservation| {
            r.assignment
                .usage
                .keys()
                .any(|fr| assignment.usage.contains_key(fr))
        };
        let mut out = Vec::new();
        let mut take = |key: &JobKey, r: &Reservation, same_queue: bool| {
            let (Some((spoke, at)), Some(&node)) = (&r.admitted, self.nodes.get(&r.cluster_queue))
            else {
                return;
            };
            out.push(Candidate {
                key: key.clone(),
                node,
                same_queue,
                spoke: spoke.clone(),
                usage: r.assignment.usage.clone(),
                gang: r.gang.clone(),
                priority: r.priority,
                admitted_at: *at,
            });
        };
        let within = |r: &Reservation| match policy.within_cluster_queue {
            WithinClusterQueue::Never => false,
            WithinClusterQueue::LowerPriority => r.priority < priority,
            WithinClusterQueue::LowerOrNewerEqualPriority => {
                r.priority < priority || (r.priority == priority && r.created > created)
            }
        };
        for key in self.admitted_in(cq) {
            if let Some(r) = self.reservations.get(key)
                && within(r)
                && needs(r)
            {
                take(key, r, true);
            }
        }
        if queue.cohort.is_some() && policy.reclaim_within_cohort != ReclaimWithinCohort::Never {
            for other in self.tree_members(cq) {
                if other == cq {
                    continue;
                }
                let Some(&node) = self.nodes.get(other) else {
                    continue;
                };
                let borrowing = assignment.usage.keys().any(|(f, r)| {
                    self.tree.usage(node, f, r) > self.tree.subtree_quota(node, f, r)
                });
                if !borrowing {
                    continue;
                }
                for key in self.admitted_in(other) {
                    if let Some(r) = self.reservations.get(key)
                        && needs(r)
                        && (policy.reclaim_within_cohort == ReclaimWithinCohort::Any
                            || r.priority < priority)
                    {
                        take(key, r, false);
                    }
                }
            }
        }
        out
    }

    /// Chooses victims among `candidates` for a workload of `cq` and
    /// `priority` needing `assignment` and a spoke among `rooms` for its
    /// `gang` (see [`preempt::choose`]).
    pub fn choose_victims(
        &mut self,
        cq: &str,
        priority: i32,
        assignment: &Assignment,
        gang: &Resources,
        rooms: &[Room],
        candidates: &[Candidate],
    ) -> Option<Decision> {
        let node = *self.nodes.get(cq)?;
        let preemptor = Preemptor {
            node,
            usage: &assignment.usage,
            gang,
            priority,
            borrowing: self
                .config
                .cluster_queues
                .get(cq)?
                .preemption
                .borrow_within_cohort,
        };
        preempt::choose(
            &mut self.tree,
            &preemptor,
            rooms,
            candidates,
            preempt::SEARCH_BUDGET,
        )
    }

    /// Per flavor and resource of the ClusterQueue, what its reservations
    /// (`admitted_only`: its admitted workloads) hold and how much of it is
    /// over its nominal quota. Every flavor-resource of its resource groups
    /// is listed, zero or not, in the spec's order.
    pub fn flavors_usage(&self, cq: &str, admitted_only: bool) -> Vec<FlavorUsage> {
        let Some(queue) = self.config.cluster_queues.get(cq) else {
            return Vec::new();
        };
        let node = self.nodes.get(cq).copied();
        let mut totals: BTreeMap<(String, String), i64> = BTreeMap::new();
        if admitted_only {
            for key in self.admitted_in(cq) {
                if let Some(r) = self.reservations.get(key) {
                    for (fr, amount) in &r.assignment.usage {
                        *totals.entry(fr.clone()).or_default() += amount;
                    }
                }
            }
        } else if let Some(node) = node {
            for (f, r) in self.tree.flavor_resources(node) {
                let used = self.tree.usage(node, &f, &r);
                totals.insert((f, r), used);
            }
        }
        let mut out: Vec<FlavorUsage> = Vec::new();
        let mut listed: HashSet<(String, String)> = HashSet::new();
        let nominal = |f: &str, r: &str| node.map_or(0, |n| self.tree.quota(n, f, r).nominal);
        for group in &queue.resource_groups {
            for fq in &group.flavors {
                let resources = group
                    .covered
                    .iter()
                    .map(|r| {
                        let fr = (fq.flavor.clone(), r.clone());
                        let total = totals.get(&fr).copied().unwrap_or(0);
                        listed.insert(fr);
                        ResourceUsage {
                            name: r.clone(),
                            total,
                            borrowed: (total - nominal(&fq.flavor, r)).max(0),
                        }
                    })
                    .collect();
                out.push(FlavorUsage {
                    name: fq.flavor.clone(),
                    resources,
                });
            }
        }
        // Held under a spec that has changed since: still reported.
        for ((f, r), total) in totals {
            if total == 0 || listed.contains(&(f.clone(), r.clone())) {
                continue;
            }
            let usage = ResourceUsage {
                name: r.clone(),
                total,
                borrowed: (total - nominal(&f, &r)).max(0),
            };
            match out.iter_mut().find(|u| u.name == f) {
                Some(u) => u.resources.push(usage),
                None => out.push(FlavorUsage {
                    name: f,
                    resources: vec![usage],
                }),
            }
        }
        out
    }

    /// What the tree says of one flavor-resource of a ClusterQueue: its
    /// usage, and its nominal quota plus what it may borrow (None: no
    /// borrowing limit). For checks of the invariants.
    pub fn usage_and_limit(
        &self,
        cq: &str,
        flavor: &str,
        resource: &str,
    ) -> Option<(i64, Option<i64>)> {
        let node = *self.nodes.get(cq)?;
        let quota = self.tree.quota(node, flavor, resource);
        let limit = match (self.tree.parent(node), quota.borrowing_limit) {
            (None, _) => Some(quota.nominal),
            (Some(_), Some(b)) => Some(quota.nominal + b),
            (Some(_), None) => None,
        };
        Some((self.tree.usage(node, flavor, resource), limit))
    }

    /// What ClusterQueue `cq` may still use of a flavor-resource (negative
    /// if over quota).
    pub fn available(&self, cq: &str, flavor: &str, resource: &str) -> Option<i64> {
        let node = *self.nodes.get(cq)?;
        Some(self.tree.available(node, flavor, resource))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::model::{Cohort, Flavor, FlavorQuotas, Quota, ResourceGroup};
    use super::*;

    fn groups(flavor: &str, nominal: i64) -> Vec<ResourceGroup> {
        vec![ResourceGroup {
            covered: vec!["cpu".into()],
            flavors: vec![FlavorQuotas {
                flavor: flavor.into(),
                quotas: [(
                    "cpu".to_string(),
                    Quota {
                        nominal,
                        ..Quota::default()
                    },
                )]
                .into(),
            }],
        }]
    }

    fn config() -> QuotaConfig {
        let mut c = QuotaConfig::default();
        c.flavors.insert(
            "f".into(),
            Flavor {
                name: "f".into(),
                ..Flavor::default()
            },
        );
        for (name, cohort) in [("a", Some("c")), ("b", Some("c")), ("solo", None)] {
            c.cluster_queues.insert(
                name.into(),
                ClusterQueue {
                    name: name.into(),
                    cohort: cohort.map(str::to_string),
                    resource_groups: groups("f", 4000),
                    ..ClusterQueue::default()
                },
            );
        }
        c
    }

    fn key(name: &str) -> JobKey {
        JobKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn reservation(cq: &str, cpu: i64) -> Reservation {
        Reservation {
            cluster_queue: cq.into(),
            local_queue: "lq".into(),
            assignment: Assignment {
                flavors: [("cpu".to_string(), "f".to_string())].into(),
                usage: [(("f".to_string(), "cpu".to_string()), cpu)].into(),
                borrows: false,
            },
            priority: 0,
            created: 0,
            gang: [("cpu".to_string(), cpu)].into(),
            admitted: None,
            pin: None,
        }
    }

    #[test]
    fn cohort_members_are_grouped_and_a_missing_flavor_makes_a_queue_inactive() {
        let mut c = config();
        c.cluster_queues.get_mut("solo").unwrap().resource_groups = groups("gone", 1000);
        let mut q = Quotas::default();
        q.set_config(c);
        assert_eq!(q.tree_members("a"), ["a", "b"]);
        assert_eq!(q.tree_members("solo"), ["solo"]);
        assert_eq!(q.inactive("solo"), Some("flavor gone not found"));
        assert_eq!(q.inactive("a"), None);
    }

    #[test]
    fn a_cohort_cycle_makes_its_queues_inactive() {
        let mut c = config();
        for (name, parent) in [("c", "d"), ("d", "c")] {
            c.cohorts.insert(
                name.into(),
                Cohort {
                    name: name.into(),
                    parent: Some(parent.into()),
                    ..Cohort::default()
                },
            );
        }
        let mut q = Quotas::default();
        q.set_config(c);
        assert_eq!(q.inactive("a"), Some("its cohort tree has a cycle"));
        assert_eq!(q.inactive("solo"), None);
    }

    #[test]
    fn reservations_survive_a_new_configuration_and_release_gives_quota_back() {
        let mut q = Quotas::default();
        q.set_config(config());
        q.reserve(key("j"), reservation("a", 3000));
        q.admit(&key("j"), "s1", 5);
        assert_eq!(q.available("b", "f", "cpu"), Some(5000));
        let mut c = config();
        c.cluster_queues.get_mut("b").unwrap().resource_groups = groups("f", 8000);
        q.set_config(c);
        assert_eq!(q.available("b", "f", "cpu"), Some(9000));
        assert_eq!(q.admitted_on("s1").collect::<Vec<_>>(), [&key("j")]);
        let usage = q.flavors_usage("a", true);
        assert_eq!(usage[0].resources[0].total, 3000);
        assert!(q.release(&key("j")).is_some());
        assert_eq!(q.available("b", "f", "cpu"), Some(12_000));
        assert_eq!(q.admitted_on("s1").count(), 0);
        assert!(q.release(&key("j")).is_none());
    }

    #[test]
    fn reservation_and_usage_report_totals_and_what_is_borrowed() {
        let mut q = Quotas::default();
        q.set_config(config());
        q.reserve(key("placed"), reservation("a", 3000));
        q.admit(&key("placed"), "s", 1);
        q.reserve(key("offered"), reservation("a", 2000));
        let reserved = q.flavors_usage("a", false);
        assert_eq!(
            reserved,
            [FlavorUsage {
                name: "f".into(),
                resources: vec![ResourceUsage {
                    name: "cpu".into(),
                    total: 5000,
                    borrowed: 1000
                }]
            }]
        );
        let used = q.flavors_usage("a", true);
        assert_eq!(used[0].resources[0].total, 3000);
        assert_eq!(used[0].resources[0].borrowed, 0);
        assert_eq!(q.flavors_usage("b", false)[0].resources[0].total, 0);
    }

    /// (nominal, borrowing limit, lending limit) in cpus, per queue.
    type Limits = (i64, Option<i64>, Option<i64>);

    /// Queues q0..q2 under cohort `inner` (which has quota of its own and a
    /// parent `root`), q3 under `root`, q4 alone; two flavors.
    fn hierarchical(limits: &[Limits], inner: Limits) -> QuotaConfig {
        let quota = |(n, b, l): Limits| Quota {
            nominal: n * 1000,
            borrowing_limit: b.map(|b| b * 1000),
            lending_limit: l.map(|l| l * 1000),
        };
        let groups = |q: Quota| {
            vec![ResourceGroup {
                covered: vec!["cpu".into()],
                flavors: ["x", "y"]
                    .iter()
                    .map(|f| FlavorQuotas {
                        flavor: f.to_string(),
                        quotas: [("cpu".to_string(), q)].into(),
                    })
                    .collect(),
            }]
        };
        let mut c = QuotaConfig::default();
        for f in ["x", "y"] {
            c.flavors.insert(
                f.into(),
                Flavor {
                    name: f.into(),
                    ..Flavor::default()
                },
            );
        }
        c.cohorts.insert(
            "inner".into(),
            Cohort {
                name: "inner".into(),
                parent: Some("root".into()),
                resource_groups: groups(quota(inner)),
                ..Cohort::default()
            },
        );
        for (i, l) in limits.iter().enumerate() {
            let cohort = match i {
                0..=2 => Some("inner".to_string()),
                3 => Some("root".to_string()),
                _ => None,
            };
            c.cluster_queues.insert(
                format!("q{i}"),
                ClusterQueue {
                    name: format!("q{i}"),
                    cohort,
                    resource_groups: groups(quota(*l)),
                    ..ClusterQueue::default()
                },
            );
        }
        c
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit { queue: usize, cpu: i64 },
        Release(usize),
    }

    #[test]
    fn admission_never_exceeds_quota_and_releasing_everything_returns_to_zero() {
        let cfg = crate::dispatch::quota::proptest_config(128);
        let limits = (
            0i64..6,
            proptest::option::of(0i64..4),
            proptest::option::of(0i64..4),
        );
        let op = prop_oneof![
            3 => (0usize..5, 1i64..5).prop_map(|(queue, cpu)| Op::Admit { queue, cpu: cpu * 1000 }),
            1 => (0usize..64).prop_map(Op::Release),
        ];
        proptest::proptest!(cfg, |(
            queues in proptest::collection::vec(limits.clone(), 5),
            inner in limits,
            ops in proptest::collection::vec(op, 1..80),
        )| {
            let config = hierarchical(&queues, inner);
            let mut fresh = Quotas::default();
            fresh.set_config(config.clone());
            let mut q = Quotas::default();
            q.set_config(config);
            let mut held: Vec<JobKey> = Vec::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Admit { queue, cpu } => {
                        let cq = format!("q{queue}");
                        let demand: Resources = [("cpu".to_string(), cpu)].into();
                        let request = Request { demand: &demand, pods: 1, tolerations: &[], pod_sets: "main" };
                        if let Some(Outcome::Fit(assignment)) = q.assign(&cq, request) {
                            let mut r = reservation(&cq, cpu);
                            r.assignment = assignment;
                            q.reserve(key(&format!("j{n}")), r);
                            held.push(key(&format!("j{n}")));
                        }
                    }
                    Op::Release(i) => {
                        if !held.is_empty() {
                            let k = held.remove(i % held.len());
                            prop_assert!(q.release(&k).is_some());
                        }
                    }
                }
                for i in 0..5 {
                    for f in ["x", "y"] {
                        let cq = format!("q{i}");
                        let available = q.available(&cq, f, "cpu").unwrap();
                        prop_assert!(available >= 0, "{}/{}: {} available", cq, f, available);
                        let (usage, limit) = q.usage_and_limit(&cq, f, "cpu").unwrap();
                        if let Some(limit) = limit {
                            prop_assert!(usage <= limit, "{}/{}: {} > {}", cq, f, usage, limit);
                        }
                    }
                }
            }
            for k in held {
                prop_assert!(q.release(&k).is_some());
            }
            for i in 0..5 {
                for f in ["x", "y"] {
                    let cq = format!("q{i}");
                    prop_assert_eq!(q.usage_and_limit(&cq, f, "cpu").unwrap().0, 0);
                    prop_assert_eq!(q.available(&cq, f, "cpu"), fresh.available(&cq, f, "cpu"));
                }
            }
        });
    }

    #[test]
    fn candidates_follow_the_preemption_policies() {
        let mut c = config();
        let a = c.cluster_queues.get_mut("a").unwrap();
        a.preemption.within_cluster_queue = WithinClusterQueue::LowerOrNewerEqualPriority;
        a.preemption.reclaim_within_cohort = ReclaimWithinCohort::LowerPriority;
        let mut q = Quotas::default();
        q.set_config(c);
        let mut add = |name: &str, cq: &str, cpu: i64, priority: i32, created: i64| {
            let mut r = reservation(cq, cpu);
            r.priority = priority;
            r.created = created;
            q.reserve(key(name), r);
            q.admit(&key(name), "s", 0);
        };
        add("low", "a", 1000, 0, 0);
        add("same-newer", "a", 1000, 5, 20);
        add("same-older", "a", 1000, 5, 1);
        add("higher", "a", 1000, 9, 0);
        add("b-low", "b", 5000, 0, 0);
        add("b-high", "b", 1000, 9, 0);
        let assignment = reservation("a", 1000).assignment;
        let mut names: Vec<(String, bool)> = q
            .candidates("a", 5, 10, &assignment)
            .into_iter()
            .map(|c| (c.key.name, c.same_queue))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("b-low".to_string(), false),
                ("low".to_string(), true),
                ("same-newer".to_string(), true)
            ]
        );
        // b no longer borrows: nothing to reclaim from it.
        q.release(&key("b-low"));
        assert!(
            q.candidates("a", 5, 10, &assignment)
                .iter()
                .all(|c| c.same_queue)
        );
    }
}
