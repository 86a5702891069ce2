//! JSON values as CEL sees them: each value is read through the schema
//! node it sits under, lazily, without copying the object.
//!
//! As kube-apiserver's `UnstructuredToVal` does: objects are maps whose
//! absent fields are absent (`has(self.x)` is false, `self.x` is the error
//! `no such key: x`); numbers are `int` under `type: integer`, `double`
//! under `type: number` and as written under `x-kubernetes-int-or-string`;
//! lists of `x-kubernetes-list-type` `set` or `map` compare equal without
//! regard to order. Strings stay strings whatever their `format` (kube-apiserver
//! makes `date-time` a timestamp and `byte` bytes; no served rule reads such a
//! field as one).
//!
//! Every step that grows with the object (an element of a comprehension, a
//! pair compared by `==`, an element searched by `in`) is charged to a
//! [`Budget`]; once it is spent, iteration stops early and the evaluation is
//! discarded as out of budget (see [`super::Rule`]).

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cel::ExecutionError;
use cel::common::traits::{self, Adder, Container, Indexer, Iterable, Sizer, Zeroer};
use cel::common::types::{
    self, CelBool, CelDouble, CelInt, CelList, CelNull, CelString, CelUInt, Kind, Type,
};
use cel::common::value::{CowVal, Val};
use serde_json::{Map, Value};

use crate::admission::schema::Schema;

/// How much work evaluations may still do, in steps (see the module doc).
/// Shared by the values of one evaluation; atomics only because CEL values
/// must be `Sync`.
#[derive(Debug)]
pub struct Budget {
    remaining: AtomicU64,
    spent: AtomicU64,
    exhausted: AtomicBool,
}

impl Budget {
    pub fn new(steps: u64) -> Self {
        Budget {
            remaining: AtomicU64::new(steps),
            spent: AtomicU64::new(0),
            exhausted: AtomicBool::new(false),
        }
    }

    /// Takes `steps` from the budget; false (and the budget marked
    /// exhausted) when there are not that many left.
    pub fn charge(&self, steps: u64) -> bool {
        let taken = self
            .remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                r.checked_sub(steps)
            })
            .is_ok();
        if taken {
            self.spent.fetch_add(steps, Ordering::Relaxed);
        } else {
            self.exhausted.store(true, Ordering::Relaxed);
        }
        taken
    }

    pub fn remaining(&self) -> u64 {
        self.remaining.load(Ordering::Relaxed)
    }

    pub fn spent(&self) -> u64 {
        self.spent.load(Ordering::Relaxed)
    }

    /// Whether a charge was refused.
    pub fn exhausted(&self) -> bool {
        self.exhausted.load(Ordering::Relaxed)
    }
}

/// A JSON value, the schema node it is validated against (none for a value
/// the schema does not describe), and the budget of the evaluation.
#[derive(Clone, Copy)]
pub struct Node<'v> {
    pub value: &'v Value,
    pub schema: Option<&'v Schema>,
    pub budget: &'v Budget,
}

impl<'v> Node<'v> {
    fn with(self, value: &'v Value, schema: Option<&'v Schema>) -> Node<'v> {
        Node {
            value,
            schema,
            budget: self.budget,
        }
    }
}

/// `node` as a CEL value.
pub fn to_val<'v>(node: Node<'v>) -> Box<dyn Val + 'v> {
    match node.value {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => number(n, node.schema),
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(items) => Box::new(JsonList {
            node,
            items,
            vals: OnceLock::new(),
        }),
        Value::Object(map) => Box::new(JsonMap {
            node,
            map,
            keys: OnceLock::new(),
        }),
    }
}

/// A JSON number as the type its schema gives it.
fn number<'v>(n: &serde_json::Number, schema: Option<&Schema>) -> Box<dyn Val + 'v> {
    let double = || Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)));
    match schema.map(Schema::cel_number) {
        Some(NumberKind::Double) => double(),
        Some(NumberKind::Int) | None => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Box::new(CelInt::from(i)),
            (None, Some(u), _) => Box::new(CelUInt::from(u)),
            // 2.0 under `type: integer` is the integer 2.
            (None, None, Some(f))
                if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 =>
            {
                Box::new(CelInt::from(f as i64))
            }
            _ => double(),
        },
    }
}

/// How a schema node types the numbers under it.
pub enum NumberKind {
    Int,
    Double,
}

/// How a schema node compares lists under it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ListOrder {
    /// Element by element (`atomic`, the default).
    Ordered,
    /// Without regard to order (`set` and `map`).
    Unordered,
}

/// A JSON object: a CEL map of strings.
struct JsonMap<'v> {
    node: Node<'v>,
    map: &'v Map<String, Value>,
    /// The keys, made on the first iteration.
    keys: OnceLock<Vec<Box<dyn Val + 'v>>>,
}

impl<'v> JsonMap<'v> {
    fn child(&self, key: &str, value: &'v Value) -> Node<'v> {
        self.node
            .with(value, self.node.schema.and_then(|s| s.member(key)))
    }

    fn keys(&self) -> &[Box<dyn Val + 'v>] {
        self.keys.get_or_init(|| {
            self.map
                .keys()
                .map(|k| Box::new(CelString::from(k.as_str())) as Box<dyn Val + 'v>)
                .collect()
        })
    }
}

impl fmt::Debug for JsonMap<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "map of {} entries", self.map.len())
    }
}

impl<'v> Val for JsonMap<'v> {
    fn get_type(&self) -> &Type {
        &types::MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &types::MAP_TYPE
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        if other.get_type().kind() != Kind::Map {
            return false;
        }
        let (Some(size), Some(theirs)) = (other.as_sizer(), other.as_indexer()) else {
            return false;
        };
        if *size.size().inner() != self.map.len() as i64 {
            return false;
        }
        self.map.iter().all(|(k, v)| {
            self.node.budget.charge(1)
                && theirs
                    .get(&CelString::from(k.as_str()))
                    .is_ok_and(|w| to_val(self.child(k, v)).equals(w.as_ref()))
        })
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(JsonMap {
            node: self.node,
            map: self.map,
            keys: OnceLock::new(),
        })
    }
}

impl<'v> Indexer for JsonMap<'v> {
    fn get<'b, 'w>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        let Some(key) = idx.downcast_ref::<CelString>() else {
            return Err(ExecutionError::UnexpectedType {
                got: idx.get_type().name().to_owned(),
                want: "string".to_owned(),
            });
        };
        match self.map.get_key_value(key.inner()) {
            Some((k, v)) => Ok(CowVal::Owned(to_val(self.child(k, v)))),
            None => Err(ExecutionError::no_such_key(key.inner())),
        }
    }

    fn steal<'w>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'v> Iterable for JsonMap<'v> {
    fn iter<'b, 'w>(&'b self) -> Box<dyn traits::Iterator<'b, 'w> + 'b>
    where
        Self: 'w,
    {
        Box::new(Charged {
            items: self.keys().iter(),
            budget: self.node.budget,
        })
    }
}

impl Container for JsonMap<'_> {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(value
            .downcast_ref::<CelString>()
            .is_some_and(|k| self.map.contains_key(k.inner())))
    }
}

impl Sizer for JsonMap<'_> {
    fn size(&self) -> CelInt {
        CelInt::from(self.map.len() as i64)
    }
}

impl Zeroer for JsonMap<'_> {
    fn is_zero_value(&self) -> bool {
        self.map.is_empty()
    }
}

/// A JSON array: a CEL list.
struct JsonList<'v> {
    node: Node<'v>,
    items: &'v [Value],
    /// The elements as values, made on the first iteration.
    vals: OnceLock<Vec<Box<dyn Val + 'v>>>,
}

impl<'v> JsonList<'v> {
    fn child(&self, value: &'v Value) -> Node<'v> {
        self.node
            .with(value, self.node.schema.and_then(Schema::item_schema))
    }

    fn vals(&self) -> &[Box<dyn Val + 'v>] {
        self.vals
            .get_or_init(|| self.items.iter().map(|v| to_val(self.child(v))).collect())
    }

    fn order(&self) -> ListOrder {
        self.node
            .schema
            .map_or(ListOrder::Ordered, Schema::list_order)
    }
}

impl fmt::Debug for JsonList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "list of {} elements", self.items.len())
    }
}

impl<'v> Val for JsonList<'v> {
    fn get_type(&self) -> &Type {
        &types::LIST_TYPE
    }

    fn cel_type() -> &'static Type {
        &types::LIST_TYPE
    }

    fn as_adder<'b, 'w>(&'b self) -> Option<&'b (dyn Adder + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        if other.get_type().kind() != Kind::List {
            return false;
        }
        let Some(theirs) = other.as_iterable() else {
            return false;
        };
        let mut theirs_iter = theirs.iter();
        let mut others: Vec<&dyn Val> = Vec::with_capacity(self.items.len());
        while let Some(v) = theirs_iter.next() {
            if others.len() == self.items.len() {
                return false;
            }
            others.push(v);
        }
        if others.len() != self.items.len() {
            return false;
        }
        let mine = self.vals();
        let budget = self.node.budget;
        match self.order() {
            ListOrder::Ordered => mine
                .iter()
                .zip(others)
                .all(|(a, b)| budget.charge(1) && a.equals(b)),
            ListOrder::Unordered => {
                let mut used = vec![false; others.len()];
                mine.iter().all(|a| {
                    for (i, b) in others.iter().enumerate() {
                        if !budget.charge(1) {
                            return false;
                        }
                        if !used[i] && a.equals(*b) {
                            used[i] = true;
                            return true;
                        }
                    }
                    false
                })
            }
        }
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(JsonList {
            node: self.node,
            items: self.items,
            vals: OnceLock::new(),
        })
    }
}

impl<'v> Adder for JsonList<'v> {
    fn add<'b, 'w>(&'b self, rhs: &(dyn Val + 'w)) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        let Some(theirs) = rhs.as_iterable() else {
            return Err(ExecutionError::no_such_overload(
                "_+_",
                vec!["list".to_owned(), rhs.get_type().name().to_owned()],
            ));
        };
        let mut out: Vec<Box<dyn Val + 'w>> = Vec::with_capacity(self.items.len());
        for v in self.vals() {
            if !self.node.budget.charge(1) {
                break;
            }
            out.push(v.clone_as_boxed());
        }
        let mut theirs = theirs.iter();
        while let Some(v) = theirs.next() {
            if !self.node.budget.charge(1) {
                break;
            }
            out.push(v.clone_as_boxed());
        }
        Ok(CowVal::owned(CelList::from(out)))
    }
}

impl<'v> Indexer for JsonList<'v> {
    fn get<'b, 'w>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        let i = if let Some(i) = idx.downcast_ref::<CelInt>() {
            *i.inner()
        } else if let Some(u) = idx.downcast_ref::<CelUInt>() {
            i64::try_from(*u.inner()).unwrap_or(i64::MAX)
        } else if let Some(d) = idx.downcast_ref::<CelDouble>()
            && d.inner().fract() == 0.0
        {
            *d.inner() as i64
        } else {
            return Err(ExecutionError::UnexpectedType {
                got: idx.get_type().name().to_owned(),
                want: "int".to_owned(),
            });
        };
        usize::try_from(i)
            .ok()
            .and_then(|i| self.items.get(i))
            .map(|v| CowVal::Owned(to_val(self.child(v))))
            .ok_or_else(|| ExecutionError::IndexOutOfBounds(i.into()))
    }

    fn steal<'w>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'v> Iterable for JsonList<'v> {
    fn iter<'b, 'w>(&'b self) -> Box<dyn traits::Iterator<'b, 'w> + 'b>
    where
        Self: 'w,
    {
        Box::new(Charged {
            items: self.vals().iter(),
            budget: self.node.budget,
        })
    }
}

impl Container for JsonList<'_> {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        for v in self.vals() {
            if !self.node.budget.charge(1) {
                return Ok(false);
            }
            if v.equals(value) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl Sizer for JsonList<'_> {
    fn size(&self) -> CelInt {
        CelInt::from(self.items.len() as i64)
    }
}

impl Zeroer for JsonList<'_> {
    fn is_zero_value(&self) -> bool {
        self.items.is_empty()
    }
}

/// Lends elements, one budget step each; ends early once the budget is
/// spent.
struct Charged<'b, 'v> {
    items: std::slice::Iter<'b, Box<dyn Val + 'v>>,
    budget: &'b Budget,
}

impl<'b, 'v: 'w, 'w> traits::Iterator<'b, 'w> for Charged<'b, 'v> {
    fn next(&mut self) -> Option<&'b (dyn Val + 'w)> {
        if self.items.len() == 0 || !self.budget.charge(1) {
            return None;
        }
        self.items.next().map(|v| v.as_ref() as &(dyn Val + 'w))
    }
}
