//! Sets of field paths as structured-merge-diff keeps them, their `FieldsV1`
//! encoding, and the walks that type an object by its list keys: the fields
//! an object sets, what differs between two objects, and how an applied
//! configuration merges into a live object.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::keys::ListKeys;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PathElement {
    /// `f:<name>`: a field of an object.
    Field(String),
    /// `k:<json>`: an item of a list map, by its key fields (sorted by name).
    Key(String),
    /// `v:<json>`: an item of a set.
    Value(String),
    /// `i:<n>`: an item by position.
    Index(usize),
}

impl PathElement {
    fn encode(&self) -> String {
        match self {
            PathElement::Field(n) => format!("f:{n}"),
            PathElement::Key(k) => format!("k:{k}"),
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    fn decode(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid path element {s:?}");
        let (prefix, rest) = s.split_once(':').ok_or_else(bad)?;
        match prefix {
            "f" => Ok(PathElement::Field(rest.to_string())),
            "k" => {
                let v: Value = serde_json::from_str(rest).map_err(|_| bad())?;
                let Value::Object(m) = v else {
                    return Err(bad());
                };
                let mut fields: Vec<(String, Value)> = m.into_iter().collect();
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(PathElement::Key(key_json(&fields)))
            }
            "v" => {
                let v: Value = serde_json::from_str(rest).map_err(|_| bad())?;
                Ok(PathElement::Value(v.to_string()))
            }
            "i" => rest.parse().map(PathElement::Index).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }

    /// As structured-merge-diff prints paths: `.spec`, `[name="node"]`,
    /// `[="a"]`, `[0]`.
    fn display(&self) -> String {
        match self {
            PathElement::Field(n) => format!(".{n}"),
            PathElement::Key(k) => {
                let parts: Vec<String> = match serde_json::from_str::<Value>(k) {
                    Ok(Value::Object(m)) => m.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                    _ => vec![k.clone()],
                };
                format!("[{}]", parts.join(","))
            }
            PathElement::Value(v) => format!("[={v}]"),
            PathElement::Index(i) => format!("[{i}]"),
        }
    }
}

/// The canonical JSON of a list map item's key: fields sorted by name.
fn key_json(fields: &[(String, Value)]) -> String {
    let mut m = Map::new();
    for (k, v) in fields {
        m.insert(k.clone(), v.clone());
    }
    Value::Object(m).to_string()
}

pub(crate) fn path_string(path: &[PathElement]) -> String {
    path.iter().map(PathElement::display).collect()
}

/// A set of field paths: a tree whose nodes are members of the set or only
/// lead to members.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSet {
    member: bool,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    pub fn insert(&mut self, path: &[PathElement]) {
        match path.split_first() {
            None => self.member = true,
            Some((first, rest)) => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    #[cfg(test)]
    pub fn get(&self, path: &[PathElement]) -> Option<&FieldSet> {
        match path.split_first() {
            None => Some(self),
            Some((first, rest)) => self.children.get(first)?.get(rest),
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(FieldSet::is_empty)
    }

    /// Whether this node or any node below it is a member.
    pub fn has_members(&self) -> bool {
        !self.is_empty()
    }

    pub fn union_with(&mut self, other: &FieldSet) {
        self.member |= other.member;
        for (pe, child) in &other.children {
            self.children
                .entry(pe.clone())
                .or_default()
                .union_with(child);
        }
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.union_with(other);
        out
    }

    /// The members of `self` that are not members of `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && !other.member,
            children: BTreeMap::new(),
        };
        for (pe, child) in &self.children {
            let d = match other.children.get(pe) {
                Some(o) => child.difference(o),
                None => child.clone(),
            };
            if !d.is_empty() {
                out.children.insert(pe.clone(), d);
            }
        }
        out
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && other.member,
            children: BTreeMap::new(),
        };
        for (pe, child) in &self.children {
            if let Some(o) = other.children.get(pe) {
                let i = child.intersection(o);
                if !i.is_empty() {
                    out.children.insert(pe.clone(), i);
                }
            }
        }
        out
    }

    /// Removes `path` and everything below it.
    pub fn remove_subtree(&mut self, path: &[PathElement]) {
        match path {
            [] => *self = FieldSet::default(),
            [last] => {
                self.children.remove(last);
            }
            [first, rest @ ..] => {
                if let Some(child) = self.children.get_mut(first) {
                    child.remove_subtree(rest);
                    if child.is_empty() {
                        self.children.remove(first);
                    }
                }
            }
        }
    }

    /// Removes `path` from the set, keeping what is below it.
    pub fn remove_member(&mut self, path: &[PathElement]) {
        match path.split_first() {
            None => self.member = false,
            Some((first, rest)) => {
                if let Some(child) = self.children.get_mut(first) {
                    child.remove_member(rest);
                    if child.is_empty() {
                        self.children.remove(first);
                    }
                }
            }
        }
    }

    /// Every member path, in order.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        let mut prefix = Vec::new();
        self.collect(&mut prefix, &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        if self.member && !prefix.is_empty() {
            out.push(prefix.clone());
        }
        for (pe, child) in &self.children {
            prefix.push(pe.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    pub fn children(&self) -> &BTreeMap<PathElement, FieldSet> {
        &self.children
    }

    pub fn is_member(&self) -> bool {
        self.member
    }

    /// The `fieldsV1` encoding: `.` for a member with children, `{}` for a
    /// member leaf.
    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        for (pe, child) in &self.children {
            if child.is_empty() {
                continue;
            }
            m.insert(pe.encode(), child.to_fields_v1());
        }
        Value::Object(m)
    }

    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, String> {
        let mut set = FieldSet::default();
        let Value::Object(m) = v else {
            return Err("fieldsV1 must be an object".into());
        };
        for (k, child) in m {
            if k == "." {
                set.member = true;
                continue;
            }
            let pe = PathElement::decode(k)?;
            let mut c = FieldSet::from_fields_v1(child)?;
            if c.children.is_empty() {
                c.member = true;
            }
            set.children.insert(pe, c);
        }
        Ok(set)
    }
}

/// How the items of a list are told apart.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ListKind {
    Atomic,
    Set,
    Map(Vec<String>),
}

/// Types objects by their list keys. In strict mode (applied
/// configurations) a list item without its keys, or two items with the same
/// key, is an error; otherwise (live objects) such a list is treated as
/// atomic.
pub(crate) struct Typer<'a> {
    pub keys: &'a dyn ListKeys,
}

pub(crate) fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Object(_) | Value::Array(_))
}

impl Typer<'_> {
    pub fn list_kind(&self, names: &[String]) -> ListKind {
        let path: Vec<&str> = names.iter().map(String::as_str).collect();
        match self.keys.merge_key(&path) {
            None => ListKind::Atomic,
            Some(k) if k.is_empty() => ListKind::Set,
            Some(k) => ListKind::Map(k),
        }
    }

    /// The path elements of a list's items; `Ok(None)` when the list is to
    /// be treated as atomic.
    pub fn item_ids(
        &self,
        list: &[Value],
        names: &[String],
        path: &[PathElement],
        strict: bool,
    ) -> Result<Option<Vec<PathElement>>, String> {
        let kind = self.list_kind(names);
        let mut ids: Vec<PathElement> = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let id = match &kind {
                ListKind::Atomic => return Ok(None),
                ListKind::Set => {
                    if !is_scalar(item) {
                        if strict {
                            return Err(format!(
                                "{}: element {i}: a set may only hold scalars",
                                path_string(path)
                            ));
                        }
                        return Ok(None);
                    }
                    PathElement::Value(item.to_string())
                }
                ListKind::Map(keys) => {
                    let Value::Object(m) = item else {
                        if strict {
                            return Err(format!(
                                "{}: element {i}: associative list with keys has an element that is not a map",
                                path_string(path)
                            ));
                        }
                        return Ok(None);
                    };
                    let mut fields = Vec::with_capacity(keys.len());
                    for key in keys {
                        let value = match m.get(key) {
                            Some(v) if is_scalar(v) && !v.is_null() => v.clone(),
                            _ => {
                                let pathv: Vec<&str> = names.iter().map(String::as_str).collect();
                                match self.keys.key_default(&pathv, key) {
                                    Some(d) => d,
                                    None if strict => {
                                        return Err(format!(
                                            "{}: element {i}: associative list with keys has an element that omits key field {key:?} (and doesn't have default value)",
                                            path_string(path)
                                        ));
                                    }
                                    None => return Ok(None),
                                }
                            }
                        };
                        fields.push((key.clone(), value));
                    }
                    fields.sort_by(|a, b| a.0.cmp(&b.0));
                    PathElement::Key(key_json(&fields))
                }
            };
            if ids.contains(&id) {
                if strict {
                    return Err(format!(
                        "{}: duplicate entries for key {}",
                        path_string(path),
                        id.display()
                    ));
                }
                return Ok(None);
            }
            ids.push(id);
        }
        Ok(Some(ids))
    }

    /// The fields an applied configuration sets, as structured-merge-diff's
    /// `ToFieldSet`: scalars, empty maps and lists, atomic lists and list
    /// items are members; `null` fields are not set.
    pub fn config_set(&self, config: &Value) -> Result<FieldSet, String> {
        let mut set = FieldSet::default();
        let mut names = Vec::new();
        let mut path = Vec::new();
        self.walk_set(config, &mut names, &mut path, &mut set, true, false)?;
        Ok(set)
    }

    /// Every path of `value`, maps included: what a comparison counts as
    /// added or removed.
    fn all_paths(
        &self,
        value: &Value,
        names: &mut Vec<String>,
        path: &mut Vec<PathElement>,
        out: &mut FieldSet,
    ) {
        out.insert(path);
        // Lenient walks cannot fail.
        let _ = self.walk_set(value, names, path, out, false, true);
    }

    fn walk_set(
        &self,
        value: &Value,
        names: &mut Vec<String>,
        path: &mut Vec<PathElement>,
        out: &mut FieldSet,
        strict: bool,
        with_parents: bool,
    ) -> Result<(), String> {
        match value {
            Value::Object(m) => {
                for (k, v) in m {
                    if v.is_null() && strict {
                        continue;
                    }
                    names.push(k.clone());
                    path.push(PathElement::Field(k.clone()));
                    let r = self.walk_child(v, names, path, out, strict, with_parents);
                    path.pop();
                    names.pop();
                    r?;
                }
                Ok(())
            }
            Value::Array(items) => {
                let Some(ids) = self.item_ids(items, names, path, strict)? else {
                    return Ok(());
                };
                for (item, id) in items.iter().zip(ids) {
                    path.push(id);
                    out.insert(path);
                    let r = if item.is_object() {
                        self.walk_set(item, names, path, out, strict, with_parents)
                    } else {
                        Ok(())
                    };
                    path.pop();
                    r?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn walk_child(
        &self,
        v: &Value,
        names: &mut Vec<String>,
        path: &mut Vec<PathElement>,
        out: &mut FieldSet,
        strict: bool,
        with_parents: bool,
    ) -> Result<(), String> {
        let leaf = match v {
            Value::Object(m) => m.is_empty(),
            Value::Array(a) => a.is_empty() || self.item_ids(a, names, path, strict)?.is_none(),
            _ => true,
        };
        if leaf || with_parents {
            out.insert(path);
        }
        if !leaf {
            self.walk_set(v, names, path, out, strict, with_parents)?;
        }
        Ok(())
    }

    /// What changed from `old` to `new`.
    pub fn compare(&self, old: &Value, new: &Value) -> Comparison {
        let mut c = Comparison::default();
        let mut names = Vec::new();
        let mut path = Vec::new();
        self.compare_at(Some(old), Some(new), &mut names, &mut path, &mut c);
        c
    }

    fn compare_at(
        &self,
        old: Option<&Value>,
        new: Option<&Value>,
        names: &mut Vec<String>,
        path: &mut Vec<PathElement>,
        c: &mut Comparison,
    ) {
        match (old, new) {
            (None, None) => {}
            (None, Some(n)) => self.all_paths(n, names, path, &mut c.added),
            (Some(o), None) => self.all_paths(o, names, path, &mut c.removed),
            (Some(Value::Object(o)), Some(Value::Object(n))) => {
                let keys: Vec<&String> = o
                    .keys()
                    .chain(n.keys().filter(|k| !o.contains_key(*k)))
                    .collect();
                for k in keys {
                    names.push(k.clone());
                    path.push(PathElement::Field(k.clone()));
                    self.compare_at(o.get(k), n.get(k), names, path, c);
                    path.pop();
                    names.pop();
                }
            }
            (Some(Value::Array(o)), Some(Value::Array(n))) => {
                let ids = (
                    self.item_ids(o, names, path, false).ok().flatten(),
                    self.item_ids(n, names, path, false).ok().flatten(),
                );
                let (Some(oids), Some(nids)) = ids else {
                    if o != n {
                        c.modified.insert(path);
                    }
                    return;
                };
                if o.is_empty() != n.is_empty() {
                    // An empty list is a leaf; a list with items is not.
                    c.modified.insert(path);
                }
                for (i, id) in oids.iter().enumerate() {
                    let matching = nids.iter().position(|x| x == id).map(|j| &n[j]);
                    path.push(id.clone());
                    self.compare_at(Some(&o[i]), matching, names, path, c);
                    path.pop();
                }
                for (j, id) in nids.iter().enumerate() {
                    if !oids.contains(id) {
                        path.push(id.clone());
                        self.compare_at(None, Some(&n[j]), names, path, c);
                        path.pop();
                    }
                }
            }
            (Some(o), Some(n)) => {
                if o == n {
                    return;
                }
                c.modified.insert(path);
                if !is_scalar(o) {
                    let mut removed = FieldSet::default();
                    self.all_paths(o, names, path, &mut removed);
                    removed.remove_member(path);
                    c.removed.union_with(&removed);
                }
                if !is_scalar(n) {
                    let mut added = FieldSet::default();
                    self.all_paths(n, names, path, &mut added);
                    added.remove_member(path);
                    c.added.union_with(&added);
                }
            }
        }
    }

    /// `live` with the applied configuration merged in, as
    /// structured-merge-diff merges: objects field by field, list maps and
    /// sets item by item (the configuration's order, live-only items kept in
    /// place), everything else replaced. `null` in the configuration removes
    /// the field.
    pub fn merge(&self, live: Option<&Value>, config: &Value) -> Value {
        let mut names = Vec::new();
        let mut path = Vec::new();
        self.merge_at(live, config, &mut names, &mut path)
    }

    fn merge_at(
        &self,
        live: Option<&Value>,
        config: &Value,
        names: &mut Vec<String>,
        path: &mut Vec<PathElement>,
    ) -> Value {
        match (live, config) {
            (Some(Value::Object(l)), Value::Object(c)) => {
                let mut out = l.clone();
                for (k, cv) in c {
                    if cv.is_null() {
                        out.remove(k);
                        continue;
                    }
                    names.push(k.clone());
                    path.push(PathElement::Field(k.clone()));
                    let merged = self.merge_at(l.get(k), cv, names, path);
                    path.pop();
                    names.pop();
                    out.insert(k.clone(), merged);
                }
                Value::Object(out)
            }
            (Some(Value::Array(l)), Value::Array(c)) => {
                let lids = self.item_ids(l, names, path, false).ok().flatten();
                let cids = self.item_ids(c, names, path, false).ok().flatten();
                let (Some(lids), Some(cids)) = (lids, cids) else {
                    return without_nulls(config);
                };
                let mut out = Vec::with_capacity(l.len().max(c.len()));
                let mut emitted = vec![false; l.len()];
                let (mut li, mut ci) = (0, 0);
                while li < l.len() || ci < c.len() {
                    if li < l.len() {
                        if emitted[li] {
                            li += 1;
                            continue;
                        }
                        match cids.iter().position(|x| *x == lids[li]) {
                            None => {
                                out.push(l[li].clone());
                                emitted[li] = true;
                                li += 1;
                                continue;
                            }
                            Some(j) if j == ci => {
                                path.push(cids[ci].clone());
                                out.push(self.merge_at(Some(&l[li]), &c[ci], names, path));
                                path.pop();
                                emitted[li] = true;
                                li += 1;
                                ci += 1;
                                continue;
                            }
                            Some(_) => {}
                        }
                    }
                    if ci < c.len() {
                        let matching = lids.iter().position(|x| *x == cids[ci]);
                        if let Some(m) = matching {
                            emitted[m] = true;
                        }
                        path.push(cids[ci].clone());
                        out.push(self.merge_at(matching.map(|m| &l[m]), &c[ci], names, path));
                        path.pop();
                        ci += 1;
                        continue;
                    }
                    li += 1;
                }
                Value::Array(out)
            }
            (_, c) => without_nulls(c),
        }
    }

    /// Removes from `value` the members of `remove` that nothing in `keep`
    /// is at or under; maps emptied this way go too. Key fields of list
    /// items that stay are kept.
    pub fn prune(&self, value: &mut Value, remove: &FieldSet, keep: &FieldSet) {
        let mut names = Vec::new();
        let mut path = Vec::new();
        self.prune_at(value, remove, Some(keep), &mut names, &mut path, &[]);
    }

    fn prune_at(
        &self,
        value: &mut Value,
        remove: &FieldSet,
        keep: Option<&FieldSet>,
        names: &mut Vec<String>,
        path: &mut Vec<PathElement>,
        protected: &[String],
    ) {
        match value {
            Value::Object(m) => {
                for (pe, rchild) in remove.children() {
                    let PathElement::Field(name) = pe else {
                        continue;
                    };
                    if protected.contains(name) {
                        continue;
                    }
                    let kchild = keep.and_then(|k| k.children().get(pe));
                    let kept = kchild.is_some_and(FieldSet::has_members);
                    if rchild.is_member() && !kept {
                        m.remove(name);
                        continue;
                    }
                    let Some(child) = m.get_mut(name) else {
                        continue;
                    };
                    let was_empty = child.as_object().is_some_and(Map::is_empty);
                    names.push(name.clone());
                    path.push(pe.clone());
                    self.prune_at(child, rchild, kchild, names, path, &[]);
                    path.pop();
                    names.pop();
                    let now_empty = child.as_object().is_some_and(Map::is_empty);
                    if now_empty && !was_empty && !kept {
                        m.remove(name);
                    }
                }
            }
            Value::Array(items) => {
                let Ok(Some(ids)) = self.item_ids(items, names, path, false) else {
                    return;
                };
                let key_fields = match self.list_kind(names) {
                    ListKind::Map(k) => k,
                    _ => Vec::new(),
                };
                let mut drop = vec![false; items.len()];
                for (i, id) in ids.iter().enumerate() {
                    let Some(rchild) = remove.children().get(id) else {
                        continue;
                    };
                    let kchild = keep.and_then(|k| k.children().get(id));
                    let kept = kchild.is_some_and(FieldSet::has_members);
                    if rchild.is_member() && !kept {
                        drop[i] = true;
                        continue;
                    }
                    path.push(id.clone());
                    self.prune_at(&mut items[i], rchild, kchild, names, path, &key_fields);
                    path.pop();
                }
                let mut i = 0;
                items.retain(|_| {
                    let keep_item = !drop[i];
                    i += 1;
                    keep_item
                });
            }
            _ => {}
        }
    }
}

fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// What differs between two objects: paths only in the new one, only in the
/// old one, and leaves whose values differ.
#[derive(Debug, Default)]
pub(crate) struct Comparison {
    pub added: FieldSet,
    pub removed: FieldSet,
    pub modified: FieldSet,
}

impl Comparison {
    pub fn exclude(&mut self, f: impl Fn(&mut FieldSet)) {
        f(&mut self.added);
        f(&mut self.removed);
        f(&mut self.modified);
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::BuiltinListKeys;
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_v1_round_trip() {
        let v = json!({
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {
                "f:replicatedJobs": {
                    "k:{\"name\":\"node\"}": {".": {}, "f:name": {}, "f:replicas": {}}
                },
                "f:finalizers": {"v:\"a\"": {}}
            }
        });
        let set = FieldSet::from_fields_v1(&v).unwrap();
        assert!(set.get(&[PathElement::Field("metadata".into())]).is_some());
        let encoded = set.to_fields_v1();
        assert_eq!(
            encoded["f:spec"]["f:replicatedJobs"]["k:{\"name\":\"node\"}"],
            json!({".": {}, "f:name": {}, "f:replicas": {}})
        );
        assert_eq!(FieldSet::from_fields_v1(&encoded).unwrap(), set);
        assert!(FieldSet::from_fields_v1(&json!({"x:y": {}})).is_err());
        assert!(FieldSet::from_fields_v1(&json!({"k:[1]": {}})).is_err());
    }

    #[test]
    fn config_set_types_lists_by_key() {
        let t = Typer {
            keys: &BuiltinListKeys,
        };
        let set = t
            .config_set(&json!({
                "spec": {"replicatedJobs": [{"name": "node", "replicas": 2}],
                         "ports": [{"containerPort": 29500}],
                         "command": ["a", "b"], "empty": {}, "gone": null}
            }))
            .unwrap();
        let paths: Vec<String> = set.paths().iter().map(|p| path_string(p)).collect();
        assert_eq!(
            paths,
            [
                ".spec.command",
                ".spec.empty",
                ".spec.ports[containerPort=29500,protocol=\"TCP\"]",
                ".spec.ports[containerPort=29500,protocol=\"TCP\"].containerPort",
                ".spec.replicatedJobs[name=\"node\"]",
                ".spec.replicatedJobs[name=\"node\"].name",
                ".spec.replicatedJobs[name=\"node\"].replicas",
            ]
        );
        let e = t
            .config_set(&json!({"spec": {"replicatedJobs": [{"replicas": 2}]}}))
            .unwrap_err();
        assert_eq!(
            e,
            ".spec.replicatedJobs: element 0: associative list with keys has an element that omits key field \"name\" (and doesn't have default value)"
        );
        let e = t
            .config_set(&json!({"spec": {"replicatedJobs": [{"name": "a"}, {"name": "a"}]}}))
            .unwrap_err();
        assert_eq!(
            e,
            ".spec.replicatedJobs: duplicate entries for key [name=\"a\"]"
        );
    }

    #[test]
    fn merge_keeps_live_only_items_in_place() {
        let t = Typer {
            keys: &BuiltinListKeys,
        };
        let live = json!({"env": [{"name": "A", "value": "1"}, {"name": "X", "value": "x"}, {"name": "B", "value": "2"}]});
        let out = t.merge(
            Some(&live),
            &json!({"env": [{"name": "B", "value": "3"}, {"name": "A"}, {"name": "C", "value": "c"}]}),
        );
        assert_eq!(
            out["env"],
            json!([{"name": "B", "value": "3"}, {"name": "A", "value": "1"},
                   {"name": "X", "value": "x"}, {"name": "C", "value": "c"}])
        );
    }
}
