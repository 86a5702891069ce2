//! Choosing preemption victims: the fewest admitted workloads whose
//! eviction lets a workload in, its quota and its whole gang on one spoke.
//!
//! Rules (the candidates are chosen by the caller from the ClusterQueue's
//! preemption policy):
//! - a victim of the preemptor's own ClusterQueue (`InClusterQueue`) must
//!   run on the spoke chosen for the preemptor; a victim of cohort
//!   reclamation (`InCohortReclamation`) may run anywhere;
//! - after the victims stop, the preemptor fits its ClusterQueue's quota,
//!   and the chosen spoke's free capacity plus what the victims there free
//!   holds the whole gang;
//! - a decision with reclamation victims leaves the preemptor within its
//!   nominal quota (it reclaims what it lent), unless its queue's
//!   `borrowWithinCohort` allows every one of those victims (lower priority
//!   than the preemptor, and at most the threshold): then it may borrow;
//!   either way it takes from each other ClusterQueue only while that queue
//!   borrows: it still borrows when its last victim goes, the largest last;
//! - among the sets that work, the fewest victims win, then the least
//!   important (lowest priority, then most recently admitted, compared from
//!   the most important victim down), then the spoke named first.
//!
//! Sets are searched exhaustively by size within a budget of checks, so the
//! set found is the smallest; past the budget, each spoke's candidates are
//! taken greedily in preference order (those of the preemptor's queue
//! alone, and with reclamation) and then every victim that is not needed
//! is put back, which leaves a set none of whose victims could be spared.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::model::BorrowWithinCohort;
use super::tree::{NodeId, Tree};
use crate::dispatch::core::{JobKey, Millis, Resources};

/// Checks of a victim set one decision may make before the greedy search.
pub const SEARCH_BUDGET: usize = 2048;

/// An admitted workload that policy allows to be preempted.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub key: JobKey,
    /// Its ClusterQueue's node.
    pub node: NodeId,
    /// In the preemptor's ClusterQueue (else: reclaimed from the cohort).
    pub same_queue: bool,
    /// The spoke it runs on.
    pub spoke: String,
    /// (flavor, resource) → milli-units it holds.
    pub usage: BTreeMap<(String, String), i64>,
    /// Its gang's requests, freed on its spoke when it stops.
    pub gang: Resources,
    pub priority: i32,
    /// When it was admitted (placed).
    pub admitted_at: Millis,
}

/// The workload that needs room.
#[derive(Debug, Clone, Copy)]
pub struct Preemptor<'a> {
    pub node: NodeId,
    /// (flavor, resource) → milli-units it needs.
    pub usage: &'a BTreeMap<(String, String), i64>,
    pub gang: &'a Resources,
    pub priority: i32,
    /// Its ClusterQueue's `borrowWithinCohort`: whether, and whom, it may
    /// preempt in its cohort while it borrows.
    pub borrowing: BorrowWithinCohort,
}

/// A spoke the preemptor may go to, with its free capacity now.
#[derive(Debug, Clone)]
pub struct Room {
    pub spoke: String,
    pub free: Resources,
}

/// The spoke the preemptor goes to and the victims (indices into the
/// candidates, in preference order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub spoke: String,
    pub victims: Vec<usize>,
}

type Score = (usize, Vec<(i32, Reverse<Millis>)>);

fn score(candidates: &[Candidate], victims: &[usize]) -> Score {
    let mut importance: Vec<(i32, Reverse<Millis>)> = victims
        .iter()
        .map(|&v| (candidates[v].priority, Reverse(candidates[v].admitted_at)))
        .collect();
    importance.sort_by(|a, b| b.cmp(a));
    (victims.len(), importance)
}

/// Keeps `victims` on `spoke` if they beat the best so far.
fn consider<'a>(
    best: &mut Option<(Score, &'a str, Vec<usize>)>,
    candidates: &[Candidate],
    spoke: &'a str,
    victims: Vec<usize>,
) {
    let s = score(candidates, &victims);
    if best
        .as_ref()
        .is_none_or(|(bs, bspoke, _)| (&s, spoke) < (bs, *bspoke))
    {
        *best = Some((s, spoke, victims));
    }
}

/// Whether the gang fits `room` once `victims` there stop.
fn room_fits(room: &Room, gang: &Resources, candidates: &[Candidate], victims: &[usize]) -> bool {
    gang.iter()
        .filter(|(_, need)| **need > 0)
        .all(|(resource, need)| {
            let freed: i64 = victims
                .iter()
                .map(|&v| &candidates[v])
                .filter(|c| c.spoke == room.spoke)
                .map(|c| c.gang.get(resource).copied().unwrap_or(0))
                .sum();
            room.free
                .get(resource)
                .copied()
                .unwrap_or(0)
                .saturating_add(freed)
                >= *need
        })
}

fn remove(tree: &mut Tree, c: &Candidate) {
    for ((f, r), amount) in &c.usage {
        tree.remove_usage(c.node, f, r, *amount);
    }
}

fn restore(tree: &mut Tree, c: &Candidate) {
    for ((f, r), amount) in &c.usage {
        tree.add_usage(c.node, f, r, *amount);
    }
}

/// With `victims` removed from the tree: whether the preemptor fits, and
/// (`strict`) whether the reclamation rules hold.
fn quota_fits_removed(
    tree: &mut Tree,
    preemptor: &Preemptor<'_>,
    candidates: &[Candidate],
    victims: &[usize],
    strict: bool,
) -> bool {
    let fits = preemptor
        .usage
        .iter()
        .all(|((f, r), amount)| *amount <= tree.available(preemptor.node, f, r));
    if !fits || !strict || victims.iter().all(|&v| candidates[v].same_queue) {
        return fits;
    }
    let within_nominal = preemptor.usage.iter().all(|((f, r), amount)| {
        tree.usage(preemptor.node, f, r) + amount <= tree.subtree_quota(preemptor.node, f, r)
    });
    // Borrowing after the evictions: only over victims its queue's
    // `borrowWithinCohort` allows it to preempt.
    let may_borrow = || {
        victims
            .iter()
            .filter(|&&v| !candidates[v].same_queue)
            .all(|&v| {
                preemptor
                    .borrowing
                    .allows(preemptor.priority, candidates[v].priority)
            })
    };
    if !within_nominal && !may_borrow() {
        return false;
    }
    // Each queue reclaimed from is still borrowing when its last victim
    // goes, the largest last (then it was before every one of them).
    let mut largest: BTreeMap<NodeId, BTreeMap<&(String, String), i64>> = BTreeMap::new();
    for &v in victims.iter().filter(|&&v| !candidates[v].same_queue) {
        let c = &candidates[v];
        let per_node = largest.entry(c.node).or_default();
        for fr in preemptor.usage.keys() {
            let amount = c.usage.get(fr).copied().unwrap_or(0);
            let max = per_node.entry(fr).or_default();
            *max = (*max).max(amount);
        }
    }
    largest.iter().all(|(node, per_fr)| {
        per_fr
            .iter()
            .any(|((f, r), max)| tree.usage(*node, f, r) + max > tree.subtree_quota(*node, f, r))
    })
}

/// Whether evicting `victims` makes room for the preemptor on `room`.
fn works(
    tree: &mut Tree,
    preemptor: &Preemptor<'_>,
    room: &Room,
    candidates: &[Candidate],
    victims: &[usize],
    strict: bool,
) -> bool {
    if !room_fits(room, preemptor.gang, candidates, victims) {
        return false;
    }
    for &v in victims {
        remove(tree, &candidates[v]);
    }
    let fits = quota_fits_removed(tree, preemptor, candidates, victims, strict);
    for &v in victims {
        restore(tree, &candidates[v]);
    }
    fits
}

/// The candidates usable with `room`, in preference order: least
/// important first (lowest priority, then most recently admitted).
fn usable(candidates: &[Candidate], room: &Room) -> Vec<usize> {
    let mut list: Vec<usize> = (0..candidates.len())
        .filter(|&i| !candidates[i].same_queue || candidates[i].spoke == room.spoke)
        .collect();
    list.sort_by(|&a, &b| {
        let (a, b) = (&candidates[a], &candidates[b]);
        (a.priority, Reverse(a.admitted_at), &a.key).cmp(&(
            b.priority,
            Reverse(b.admitted_at),
            &b.key,
        ))
    });
    list
}

/// Chooses the victims, or None if no set of candidates makes room on any
/// of `rooms` (no victims if the preemptor fits as things are). The tree is
/// left as it was given.
pub fn choose(
    tree: &mut Tree,
    preemptor: &Preemptor<'_>,
    rooms: &[Room],
    candidates: &[Candidate],
    budget: usize,
) -> Option<Decision> {
    let mut budget = budget;
    if let Some(room) = rooms
        .iter()
        .find(|r| works(tree, preemptor, r, candidates, &[], true))
    {
        return Some(Decision {
            spoke: room.spoke.clone(),
            victims: Vec::new(),
        });
    }
    // Spokes where even every usable candidate's eviction would not do
    // (ignoring the reclamation rules, which only forbid more) are out.
    let mut options: Vec<(&Room, Vec<usize>)> = Vec::new();
    for room in rooms {
        let list = usable(candidates, room);
        if list.is_empty() {
            continue;
        }
        budget = budget.saturating_sub(1);
        if works(tree, preemptor, room, candidates, &list, false) {
            options.push((room, list));
        }
    }
    let longest = options.iter().map(|(_, l)| l.len()).max()?;
    let mut best: Option<(Score, &str, Vec<usize>)> = None;
    'sizes: for size in 1..=longest {
        for (room, list) in &options {
            if list.len() < size {
                continue;
            }
            let mut pick: Vec<usize> = (0..size).collect();
            loop {
                if budget == 0 {
                    break 'sizes;
                }
                budget -= 1;
                let victims: Vec<usize> = pick.iter().map(|&i| list[i]).collect();
                if works(tree, preemptor, room, candidates, &victims, true) {
                    consider(&mut best, candidates, &room.spoke, victims);
                }
                if !next_combination(&mut pick, list.len()) {
                    break;
                }
            }
        }
        if let Some((_, spoke, victims)) = best {
            return Some(Decision {
                spoke: spoke.to_string(),
                victims,
            });
        }
    }
    if best.is_none() {
        for (room, list) in &options {
            for reclaim in [false, true] {
                if let Some(victims) = greedy(tree, preemptor, room, candidates, list, reclaim) {
                    consider(&mut best, candidates, &room.spoke, victims);
                }
            }
        }
    }
    best.map(|(_, spoke, victims)| Decision {
        spoke: spoke.to_string(),
        victims,
    })
}

/// The next `k`-combination of `0..n` in lexicographic order; false after
/// the last.
fn next_combination(pick: &mut [usize], n: usize) -> bool {
    let k = pick.len();
    for i in (0..k).rev() {
        if pick[i] < n - k + i {
            pick[i] += 1;
            for j in i + 1..k {
                pick[j] = pick[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

/// Candidates taken in preference order until the preemptor fits (those
/// of other queues only with `reclaim`, and only while their queue still
/// borrows what the preemptor needs), then every victim that is not needed
/// put back, one at a time or all of another queue's at once, until none
/// can be.
fn greedy(
    tree: &mut Tree,
    preemptor: &Preemptor<'_>,
    room: &Room,
    candidates: &[Candidate],
    list: &[usize],
    reclaim: bool,
) -> Option<Vec<usize>> {
    let mut victims = Vec::new();
    let mut found = false;
    for &c in list {
        let candidate = &candidates[c];
        if !candidate.same_queue {
            let borrowing = preemptor.usage.keys().any(|(f, r)| {
                tree.usage(candidate.node, f, r) > tree.subtree_quota(candidate.node, f, r)
            });
            if !reclaim || !borrowing {
                continue;
            }
        }
        remove(tree, candidate);
        victims.push(c);
        if room_fits(room, preemptor.gang, candidates, &victims)
            && quota_fits_removed(tree, preemptor, candidates, &victims, true)
        {
            found = true;
            break;
        }
    }
    for &v in &victims {
        restore(tree, &candidates[v]);
    }
    if !found {
        return None;
    }
    loop {
        let mut spared = false;
        for i in (0..victims.len()).rev() {
            let mut fewer = victims.clone();
            fewer.remove(i);
            if works(tree, preemptor, room, candidates, &fewer, true) {
                victims = fewer;
                spared = true;
            }
        }
        let own: Vec<usize> = victims
            .iter()
            .copied()
            .filter(|&v| candidates[v].same_queue)
            .collect();
        if own.len() < victims.len() && works(tree, preemptor, room, candidates, &own, true) {
            victims = own;
            spared = true;
        }
        if !spared {
            break;
        }
    }
    works(tree, preemptor, room, candidates, &victims, true).then_some(victims)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::model::{FlavorQuotas, Quota, ResourceGroup};
    use super::*;

    fn key(name: &str) -> JobKey {
        JobKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn cpu_groups(nominal: i64) -> Vec<ResourceGroup> {
        vec![ResourceGroup {
            covered: vec!["cpu".into()],
            flavors: vec![FlavorQuotas {
                flavor: "f".into(),
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

    fn usage(cpu: i64) -> BTreeMap<(String, String), i64> {
        [(("f".to_string(), "cpu".to_string()), cpu)].into()
    }

    fn gang(cpu: i64) -> Resources {
        [("cpu".to_string(), cpu)].into()
    }

    /// A preemptor of priority 10 that may not preempt while borrowing.
    fn preemptor<'a>(
        node: NodeId,
        usage: &'a BTreeMap<(String, String), i64>,
        gang: &'a Resources,
    ) -> Preemptor<'a> {
        Preemptor {
            node,
            usage,
            gang,
            priority: 10,
            borrowing: BorrowWithinCohort::default(),
        }
    }

    fn candidate(
        name: &str,
        node: NodeId,
        same: bool,
        spoke: &str,
        cpu: i64,
        priority: i32,
        at: Millis,
    ) -> Candidate {
        Candidate {
            key: key(name),
            node,
            same_queue: same,
            spoke: spoke.into(),
            usage: usage(cpu),
            gang: gang(cpu),
            priority,
            admitted_at: at,
        }
    }

    fn lone(nominal: i64, used: &[i64]) -> Tree {
        let mut t = Tree::default();
        let n = t.add_node(&cpu_groups(nominal));
        t.finish();
        for u in used {
            t.add_usage(n, "f", "cpu", *u);
        }
        t
    }

    fn room(spoke: &str, free: i64) -> Room {
        Room {
            spoke: spoke.into(),
            free: gang(free),
        }
    }

    #[test]
    fn the_fewest_victims_win_over_greedy_priority_order() {
        // 8 cpus used by two 1-cpu jobs of priority 0 and one 6-cpu job of
        // priority 1; 4 needed: the one big job is enough.
        let mut t = lone(8000, &[1000, 1000, 6000]);
        let candidates = vec![
            candidate("small-1", 0, true, "s", 1000, 0, 1),
            candidate("small-2", 0, true, "s", 1000, 0, 2),
            candidate("big", 0, true, "s", 6000, 1, 3),
        ];
        let need = usage(4000);
        let g = gang(4000);
        let p = preemptor(0, &need, &g);
        let d = choose(&mut t, &p, &[room("s", 0)], &candidates, SEARCH_BUDGET).unwrap();
        assert_eq!(d.victims, [2]);
        assert_eq!(t.usage(0, "f", "cpu"), 8000, "the tree is restored");
    }

    #[test]
    fn among_equals_the_least_important_and_newest_go() {
        let mut t = lone(4000, &[2000, 2000]);
        let candidates = vec![
            candidate("old", 0, true, "s", 2000, 0, 1),
            candidate("new", 0, true, "s", 2000, 0, 5),
        ];
        let need = usage(2000);
        let g = gang(2000);
        let p = preemptor(0, &need, &g);
        let d = choose(&mut t, &p, &[room("s", 0)], &candidates, SEARCH_BUDGET).unwrap();
        assert_eq!(d.victims, [1]);
    }

    #[test]
    fn victims_of_the_same_queue_sit_on_the_one_spoke_that_then_holds_the_gang() {
        // Quota would be freed by a's or b's eviction, but only spoke y has
        // room for the gang once its victim stops.
        let mut t = lone(4000, &[2000, 2000]);
        let candidates = vec![
            candidate("a", 0, true, "x", 2000, 0, 9),
            candidate("b", 0, true, "y", 2000, 0, 1),
        ];
        let need = usage(2000);
        let g = gang(3000);
        let p = preemptor(0, &need, &g);
        let rooms = [room("x", 0), room("y", 1000)];
        let d = choose(&mut t, &p, &rooms, &candidates, SEARCH_BUDGET).unwrap();
        assert_eq!((d.spoke.as_str(), d.victims.as_slice()), ("y", &[1][..]));
        // No spoke can hold it: nothing is preempted.
        let g = gang(5000);
        let p = preemptor(0, &need, &g);
        assert_eq!(choose(&mut t, &p, &rooms, &candidates, SEARCH_BUDGET), None);
    }

    #[test]
    fn reclamation_takes_only_from_a_borrowing_queue_while_it_borrows() {
        // Cohort of a (4) and b (4); b uses 6 (borrows 2) in three jobs of 2.
        let mut t = Tree::default();
        let cohort = t.add_node(&[]);
        let a = t.add_node(&cpu_groups(4000));
        let b = t.add_node(&cpu_groups(4000));
        t.set_parent(a, cohort);
        t.set_parent(b, cohort);
        t.finish();
        for _ in 0..3 {
            t.add_usage(b, "f", "cpu", 2000);
        }
        t.add_usage(a, "f", "cpu", 2000);
        let candidates: Vec<Candidate> = (0..3)
            .map(|i| candidate(&format!("b{i}"), b, false, &format!("s{i}"), 2000, 0, i))
            .collect();
        let need = usage(2000);
        let g = gang(2000);
        let p = preemptor(a, &need, &g);
        let d = choose(&mut t, &p, &[room("z", 2000)], &candidates, SEARCH_BUDGET).unwrap();
        assert_eq!(d.victims.len(), 1, "one victim reclaims the 2 b borrows");
        assert_eq!(d.spoke, "z");
        // a needing 4 more would push b under its nominal: not reclaimable.
        let need = usage(4000);
        let g = gang(4000);
        let p = preemptor(a, &need, &g);
        assert_eq!(
            choose(&mut t, &p, &[room("z", 4000)], &candidates, SEARCH_BUDGET),
            None
        );
    }

    #[test]
    fn borrow_within_cohort_lets_a_preemptor_borrow_over_lower_priorities_only() {
        // Cohort of a, b and c (4 each); c idle, b uses 8 (borrows c's 4)
        // in four jobs of 2 at priority 0. a needs 6: its 4 and 2 more,
        // which only evicting one of b's jobs frees.
        let mut t = Tree::default();
        let cohort = t.add_node(&[]);
        let [a, b, c] = [0; 3].map(|_| t.add_node(&cpu_groups(4000)));
        for n in [a, b, c] {
            t.set_parent(n, cohort);
        }
        t.finish();
        for _ in 0..4 {
            t.add_usage(b, "f", "cpu", 2000);
        }
        let candidates: Vec<Candidate> = (0..4)
            .map(|i| candidate(&format!("b{i}"), b, false, &format!("s{i}"), 2000, 0, i))
            .collect();
        let need = usage(6000);
        let g = gang(6000);
        let rooms = [room("z", 6000)];
        // Reclaiming alone keeps a within its nominal quota: no.
        let p = preemptor(a, &need, &g);
        assert_eq!(choose(&mut t, &p, &rooms, &candidates, SEARCH_BUDGET), None);
        // borrowWithinCohort LowerPriority: one victim, the newest.
        let mut p = preemptor(a, &need, &g);
        p.borrowing = BorrowWithinCohort {
            lower_priority: true,
            max_priority_threshold: None,
        };
        let d = choose(&mut t, &p, &rooms, &candidates, SEARCH_BUDGET).unwrap();
        assert_eq!(d.victims, [3], "{d:?}");
        // Victims above the threshold, or not below the preemptor, are not
        // taken while borrowing.
        p.borrowing.max_priority_threshold = Some(-1);
        assert_eq!(choose(&mut t, &p, &rooms, &candidates, SEARCH_BUDGET), None);
        p.borrowing.max_priority_threshold = None;
        p.priority = 0;
        assert_eq!(choose(&mut t, &p, &rooms, &candidates, SEARCH_BUDGET), None);
    }

    #[test]
    fn past_the_budget_the_greedy_set_keeps_no_spare_victim() {
        let mut t = lone(10_000, &[1000; 10]);
        let candidates: Vec<Candidate> = (0..10)
            .map(|i| candidate(&format!("j{i}"), 0, true, "s", 1000, 0, i))
            .collect();
        let need = usage(3000);
        let g = gang(3000);
        let p = preemptor(0, &need, &g);
        let d = choose(&mut t, &p, &[room("s", 0)], &candidates, 3).unwrap();
        assert_eq!(d.victims.len(), 3);
        assert_eq!(t.usage(0, "f", "cpu"), 10_000);
    }

    /// (same queue, spoke, cpus, priority, admitted at)
    type Spec = (bool, usize, i64, i32, u64);

    /// A cohort of the preemptor's queue (node 1) and another (node 2),
    /// with the candidates' usage charged as far as quota allows.
    fn world(mine: i64, other: i64, specs: &[Spec]) -> (Tree, Vec<Candidate>) {
        let mut t = Tree::default();
        let cohort = t.add_node(&[]);
        let p = t.add_node(&cpu_groups(mine));
        let o = t.add_node(&cpu_groups(other));
        t.set_parent(p, cohort);
        t.set_parent(o, cohort);
        t.finish();
        let mut candidates = Vec::new();
        for (i, (same, spoke, cpu, priority, at)) in specs.iter().enumerate() {
            let node = if *same { p } else { o };
            if t.available(node, "f", "cpu") < *cpu {
                continue;
            }
            t.add_usage(node, "f", "cpu", *cpu);
            let c = candidate(
                &format!("c{i}"),
                node,
                *same,
                &format!("s{spoke}"),
                *cpu,
                *priority,
                *at,
            );
            candidates.push(c);
        }
        // Reclamation takes only from a borrowing queue.
        let borrowing = t.usage(o, "f", "cpu") > t.subtree_quota(o, "f", "cpu");
        candidates.retain(|c| c.same_queue || borrowing);
        (t, candidates)
    }

    fn subsets(n: usize) -> impl Iterator<Item = Vec<usize>> {
        (0u32..(1 << n)).map(move |mask| (0..n).filter(|i| mask & (1 << i) != 0).collect())
    }

    /// Chooses with `budget` in random worlds and checks the decision
    /// against every subset of the candidates: it works, its victims of the
    /// preemptor's queue are on its spoke, no proper subset of it would do,
    /// and (`complete`) it is a smallest set that works on any spoke, and
    /// found whenever one exists.
    fn check_choice(budget: usize, complete: bool) {
        let cfg = crate::dispatch::quota::proptest_config(256);
        let spec = (any::<bool>(), 0usize..3, 1i64..5, 0i32..3, 0u64..50);
        proptest::proptest!(cfg, |(
            mine in 1i64..9,
            other in 1i64..9,
            specs in proptest::collection::vec(spec, 0..7),
            need in 1i64..7,
            free in proptest::collection::vec(0i64..5, 3),
        )| {
            let (mut t, candidates) = world(mine * 1000, other * 1000, &specs.iter().map(|s| (s.0, s.1, s.2 * 1000, s.3, s.4)).collect::<Vec<_>>());
            let usage_before = t.usage(1, "f", "cpu") + t.usage(2, "f", "cpu");
            let need_usage = usage(need * 1000);
            let g = gang(need * 1000);
            let p = preemptor(1, &need_usage, &g);
            let rooms: Vec<Room> = free.iter().enumerate().map(|(i, f)| room(&format!("s{i}"), f * 1000)).collect();
            let decision = choose(&mut t, &p, &rooms, &candidates, budget);
            prop_assert_eq!(t.usage(1, "f", "cpu") + t.usage(2, "f", "cpu"), usage_before);
            // Every set that works, per spoke, by brute force.
            let mut smallest: Option<usize> = None;
            for r in &rooms {
                for set in subsets(candidates.len()) {
                    let usable = set.iter().all(|&v| !candidates[v].same_queue || candidates[v].spoke == r.spoke);
                    if usable && works(&mut t, &p, r, &candidates, &set, true) {
                        smallest = Some(smallest.map_or(set.len(), |s| s.min(set.len())));
                    }
                }
            }
            match decision {
                None => prop_assert!(!complete || smallest.is_none(), "a set works but none was chosen"),
                Some(d) => {
                    let r = rooms.iter().find(|r| r.spoke == d.spoke).unwrap();
                    prop_assert!(works(&mut t, &p, r, &candidates, &d.victims, true));
                    for &v in &d.victims {
                        prop_assert!(!candidates[v].same_queue || candidates[v].spoke == d.spoke,
                            "victim {} of the same queue is on {}, not {}", v, candidates[v].spoke, d.spoke);
                    }
                    for set in subsets(d.victims.len()) {
                        if set.len() == d.victims.len() {
                            continue;
                        }
                        let fewer: Vec<usize> = set.iter().map(|&i| d.victims[i]).collect();
                        prop_assert!(!works(&mut t, &p, r, &candidates, &fewer, true),
                            "{:?} of {:?} would do", fewer, d.victims);
                    }
                    if complete {
                        prop_assert_eq!(Some(d.victims.len()), smallest);
                    }
                }
            }
        });
    }

    #[test]
    fn the_victims_chosen_are_a_smallest_set_that_works_on_one_spoke() {
        check_choice(SEARCH_BUDGET, true);
    }

    #[test]
    fn past_the_budget_the_victims_chosen_still_work_and_none_is_spare() {
        check_choice(0, false);
    }

    #[test]
    fn combinations_are_enumerated_in_order() {
        let mut pick = vec![0, 1];
        let mut all = vec![pick.clone()];
        while next_combination(&mut pick, 4) {
            all.push(pick.clone());
        }
        assert_eq!(all, [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]);
    }
}
