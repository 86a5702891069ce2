//! The cohort tree and its arithmetic: quotas, what each node may still
//! use, and usage that flows up to the parent past a node's own share, as
//! Kueue's scheduler cache computes them.
//!
//! Every node (a ClusterQueue is a leaf, a Cohort an inner node) has, per
//! flavor and resource:
//! - its quota (`nominal`, `borrowing_limit`, `lending_limit`);
//! - its subtree quota: its nominal plus what its children lend it (a
//!   child lends its subtree quota less what its lending limit keeps back);
//! - its usage: for a ClusterQueue what its workloads reserve, for a
//!   Cohort what its children use past what they keep back.
//!
//! A node may use what it keeps back, plus what its parent has available
//! within the node's borrowing limit. Usage is a function of the leaves'
//! usage: adding and removing the same amounts in any order gives the same
//! tree.

use std::collections::HashMap;

use super::model::{Quota, ResourceGroup};

/// What one node holds of one flavor-resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cell {
    /// Absent: nominal 0, no limits.
    quota: Quota,
    subtree: i64,
    usage: i64,
}

/// A node of the tree.
#[derive(Debug, Clone, Default)]
struct Node {
    parent: Option<usize>,
    /// flavor → resource → cell.
    cells: HashMap<String, HashMap<String, Cell>>,
}

/// Node index in a [`Tree`].
pub type NodeId = usize;

/// The cohort tree with its quotas and usage.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    /// Adds a node under `parent` with the quotas of `groups`. Subtree
    /// quotas are computed by [`Tree::finish`] once every node is in.
    pub fn add_node(&mut self, groups: &[ResourceGroup]) -> NodeId {
        let mut node = Node::default();
        for group in groups {
            for flavor in &group.flavors {
                let cells = node.cells.entry(flavor.flavor.clone()).or_default();
                for (resource, quota) in &flavor.quotas {
                    cells.insert(
                        resource.clone(),
                        Cell {
                            quota: *quota,
                            ..Cell::default()
                        },
                    );
                }
            }
        }
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Hangs `child` under `parent`. The caller keeps the tree acyclic.
    pub fn set_parent(&mut self, child: NodeId, parent: NodeId) {
        if let Some(node) = self.nodes.get_mut(child) {
            node.parent = Some(parent);
        }
    }

    pub fn parent(&self, node: NodeId) -> Option<NodeId> {
        self.nodes.get(node).and_then(|n| n.parent)
    }

    /// Computes every node's subtree quota from its own quota and its
    /// children's (usage must be zero: call before any is added).
    pub fn finish(&mut self) {
        // Children before parents: a node's depth orders it.
        let depth = |tree: &Tree, mut n: NodeId| {
            let mut d = 0usize;
            while let Some(p) = tree.parent(n) {
                d += 1;
                n = p;
                if d > tree.nodes.len() {
                    break;
                }
            }
            d
        };
        let mut order: Vec<(usize, NodeId)> =
            (0..self.nodes.len()).map(|n| (depth(self, n), n)).collect();
        order.sort_by(|a, b| b.cmp(a));
        for node in &mut self.nodes {
            for cells in node.cells.values_mut() {
                for cell in cells.values_mut() {
                    cell.subtree = cell.quota.nominal;
                }
            }
        }
        for (_, n) in order {
            let Some(parent) = self.nodes[n].parent else {
                continue;
            };
            let lent: Vec<(String, String, i64)> = self.nodes[n]
                .cells
                .iter()
                .flat_map(|(f, cells)| {
                    cells
                        .iter()
                        .map(move |(r, c)| (f.clone(), r.clone(), c.subtree - local_of(c)))
                })
                .collect();
            for (f, r, amount) in lent {
                let cell = self.nodes[parent]
                    .cells
                    .entry(f)
                    .or_default()
                    .entry(r)
                    .or_default();
                cell.subtree += amount;
            }
        }
    }

    fn cell(&self, node: NodeId, flavor: &str, resource: &str) -> Cell {
        self.nodes
            .get(node)
            .and_then(|n| n.cells.get(flavor))
            .and_then(|c| c.get(resource))
            .copied()
            .unwrap_or_default()
    }

    fn cell_mut(&mut self, node: NodeId, flavor: &str, resource: &str) -> Option<&mut Cell> {
        let node = self.nodes.get_mut(node)?;
        if !node.cells.contains_key(flavor) {
            node.cells.insert(flavor.to_string(), HashMap::new());
        }
        let cells = node.cells.get_mut(flavor)?;
        if !cells.contains_key(resource) {
            cells.insert(resource.to_string(), Cell::default());
        }
        cells.get_mut(resource)
    }

    /// The node's own quota.
    pub fn quota(&self, node: NodeId, flavor: &str, resource: &str) -> Quota {
        self.cell(node, flavor, resource).quota
    }

    /// Its nominal quota plus what its subtree lends it (for a ClusterQueue,
    /// its nominal quota).
    pub fn subtree_quota(&self, node: NodeId, flavor: &str, resource: &str) -> i64 {
        self.cell(node, flavor, resource).subtree
    }

    /// What counts against its subtree quota.
    pub fn usage(&self, node: NodeId, flavor: &str, resource: &str) -> i64 {
        self.cell(node, flavor, resource).usage
    }

    /// Usage past its subtree quota (for a ClusterQueue: past nominal).
    pub fn borrowed(&self, node: NodeId, flavor: &str, resource: &str) -> i64 {
        let c = self.cell(node, flavor, resource);
        (c.usage - c.subtree).max(0)
    }

    /// What more the node may use now: what it keeps back unused, plus
    /// what its parent has available within its borrowing limit. Negative
    /// when quota shrank under existing usage.
    pub fn available(&self, node: NodeId, flavor: &str, resource: &str) -> i64 {
        let c = self.cell(node, flavor, resource);
        let Some(parent) = self.parent(node) else {
            return c.subtree - c.usage;
        };
        let mut from_parent = self.available(parent, flavor, resource);
        if let Some(limit) = c.quota.borrowing_limit {
            let local = local_of(&c);
            let stored_in_parent = c.subtree - local;
            let used_in_parent = (c.usage - local).max(0);
            from_parent = from_parent.min(stored_in_parent - used_in_parent + limit);
        }
        (local_of(&c) - c.usage).max(0) + from_parent
    }

    /// The most the node could use were nothing else used.
    pub fn potential_available(&self, node: NodeId, flavor: &str, resource: &str) -> i64 {
        let c = self.cell(node, flavor, resource);
        let Some(parent) = self.parent(node) else {
            return c.subtree;
        };
        let mut most = local_of(&c) + self.potential_available(parent, flavor, resource);
        if let Some(limit) = c.quota.borrowing_limit {
            most = most.min(c.subtree + limit);
        }
        most
    }

    /// Adds usage at `node`; what exceeds what it keeps back unused flows up.
    pub fn add_usage(&mut self, node: NodeId, flavor: &str, resource: &str, amount: i64) {
        let parent = self.parent(node);
        let Some(c) = self.cell_mut(node, flavor, resource) else {
            return;
        };
        let local_free = (local_of(c) - c.usage).max(0);
        c.usage += amount;
        if let Some(parent) = parent
            && amount > local_free
        {
            self.add_usage(parent, flavor, resource, amount - local_free);
        }
    }

    /// Removes usage added by [`Tree::add_usage`].
    pub fn remove_usage(&mut self, node: NodeId, flavor: &str, resource: &str, amount: i64) {
        let parent = self.parent(node);
        let Some(c) = self.cell_mut(node, flavor, resource) else {
            return;
        };
        let stored_in_parent = c.usage - local_of(c);
        c.usage -= amount;
        if let Some(parent) = parent
            && stored_in_parent > 0
        {
            self.remove_usage(parent, flavor, resource, amount.min(stored_in_parent));
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every flavor-resource the node has a cell for.
    pub fn flavor_resources(&self, node: NodeId) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .nodes
            .get(node)
            .map(|n| {
                n.cells
                    .iter()
                    .flat_map(|(f, cells)| cells.keys().map(move |r| (f.clone(), r.clone())))
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }
}

/// What a node keeps back from its parent: its subtree quota beyond its
/// lending limit (nothing without a limit).
fn local_of(c: &Cell) -> i64 {
    c.quota
        .lending_limit
        .map_or(0, |limit| (c.subtree - limit).max(0))
}

#[cfg(test)]
mod tests {
    use super::super::model::FlavorQuotas;
    use super::*;

    fn groups(nominal: i64, borrowing: Option<i64>, lending: Option<i64>) -> Vec<ResourceGroup> {
        vec![ResourceGroup {
            covered: vec!["cpu".into()],
            flavors: vec![FlavorQuotas {
                flavor: "f".into(),
                quotas: [(
                    "cpu".to_string(),
                    Quota {
                        nominal,
                        borrowing_limit: borrowing,
                        lending_limit: lending,
                    },
                )]
                .into(),
            }],
        }]
    }

    /// Two ClusterQueues `a` and `b` in a cohort without quota of its own.
    fn pair(a: Vec<ResourceGroup>, b: Vec<ResourceGroup>) -> (Tree, NodeId, NodeId) {
        let mut t = Tree::default();
        let cohort = t.add_node(&[]);
        let a = t.add_node(&a);
        let b = t.add_node(&b);
        t.set_parent(a, cohort);
        t.set_parent(b, cohort);
        t.finish();
        (t, a, b)
    }

    #[test]
    fn a_lone_clusterqueue_has_its_nominal_quota_and_no_more() {
        let mut t = Tree::default();
        let cq = t.add_node(&groups(4000, Some(1000), None));
        t.finish();
        assert_eq!(t.available(cq, "f", "cpu"), 4000);
        assert_eq!(t.potential_available(cq, "f", "cpu"), 4000);
        t.add_usage(cq, "f", "cpu", 3000);
        assert_eq!(t.available(cq, "f", "cpu"), 1000);
        assert_eq!(t.available(cq, "g", "cpu"), 0);
    }

    #[test]
    fn a_cohort_member_borrows_what_others_leave_unused_within_its_limit() {
        let (mut t, a, b) = pair(groups(4000, Some(2000), None), groups(4000, None, None));
        assert_eq!(t.available(a, "f", "cpu"), 6000);
        assert_eq!(t.potential_available(a, "f", "cpu"), 6000);
        assert_eq!(t.available(b, "f", "cpu"), 8000);
        t.add_usage(b, "f", "cpu", 3000);
        assert_eq!(t.available(a, "f", "cpu"), 5000);
        t.add_usage(a, "f", "cpu", 5000);
        assert_eq!(t.borrowed(a, "f", "cpu"), 1000);
        assert_eq!(t.available(b, "f", "cpu"), 0);
        t.remove_usage(b, "f", "cpu", 3000);
        t.remove_usage(a, "f", "cpu", 5000);
        assert_eq!(t.available(a, "f", "cpu"), 6000);
        assert_eq!(t.available(b, "f", "cpu"), 8000);
    }

    #[test]
    fn a_lending_limit_keeps_quota_back_for_its_owner() {
        // b lends at most 1 of its 4 cpus: a may borrow 1, b keeps 3 to itself.
        let (mut t, a, b) = pair(groups(4000, None, None), groups(4000, None, Some(1000)));
        assert_eq!(t.available(a, "f", "cpu"), 5000);
        assert_eq!(t.potential_available(a, "f", "cpu"), 5000);
        t.add_usage(a, "f", "cpu", 5000);
        assert_eq!(t.available(b, "f", "cpu"), 3000);
        t.add_usage(b, "f", "cpu", 3000);
        assert_eq!(t.available(b, "f", "cpu"), 0);
        t.remove_usage(a, "f", "cpu", 5000);
        assert_eq!(t.available(b, "f", "cpu"), 1000 + 4000);
    }

    #[test]
    fn a_cohort_with_quota_of_its_own_shares_it_and_lends_to_its_parent_within_limits() {
        let mut t = Tree::default();
        let root = t.add_node(&[]);
        // The child cohort has 2 cpus of its own, lends at most 1 upwards
        // and borrows at most 1 from its parent.
        let cohort = t.add_node(&groups(2000, Some(1000), Some(1000)));
        let a = t.add_node(&groups(1000, None, None));
        let other = t.add_node(&groups(4000, None, None));
        t.set_parent(cohort, root);
        t.set_parent(a, cohort);
        t.set_parent(other, root);
        t.finish();
        // a: its 1, the cohort's 2, and 1 borrowed from the root.
        assert_eq!(t.potential_available(a, "f", "cpu"), 4000);
        assert_eq!(t.available(a, "f", "cpu"), 4000);
        // other: its 4, plus the 1 the cohort lends (its subtree is 3, keeps 2).
        assert_eq!(t.available(other, "f", "cpu"), 5000);
        t.add_usage(other, "f", "cpu", 5000);
        assert_eq!(t.available(a, "f", "cpu"), 2000);
        t.remove_usage(other, "f", "cpu", 5000);
        assert_eq!(t.available(a, "f", "cpu"), 4000);
    }
}
