use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;

/// The field errors of validating `value` (with `old` on updates) against
/// `schema`, as kube-apiserver prints them.
fn errors(schema: &Schema, value: Value, old: Option<Value>) -> Vec<String> {
    schema
        .validate(&value, old.as_ref(), "")
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn compile(node: Value) -> Schema {
    Schema::compile(&node).unwrap()
}

/// `rule` (message `m`) on the root of an untyped schema.
fn on_root(rule: &str) -> Schema {
    compile(json!({"x-kubernetes-validations": [{"rule": rule, "message": "m"}]}))
}

/// Whether `rule` holds for `value` (a failure is `m`; an evaluation error
/// panics with its message).
fn holds(rule: &str, value: Value) -> bool {
    let found = errors(&on_root(rule), value, None);
    match found.as_slice() {
        [] => true,
        [e] if e == "<nil>: Invalid value: \"\": m" => false,
        other => panic!("{rule}: {other:?}"),
    }
}

/// The error of evaluating `rule` on `value`.
fn evaluation_error_of(rule: &str, value: Value) -> String {
    let found = errors(&on_root(rule), value, None);
    assert_eq!(found.len(), 1, "{rule}: {found:?}");
    found[0].clone()
}

/// Expressions over `self` with the value they run on and what they must
/// evaluate to: one pass and one fail case at least per library function.
const CASES: &[(&str, &str, bool)] = &[
    // Operators and macros.
    (
        "self.a + 1 == 3 && self.a * 2 - 1 == 3 && self.a / 2 == 1 && self.a % 2 == 0 && -self.a < 0",
        r#"{"a": 2}"#,
        true,
    ),
    ("self.a > 2 || self.a >= 3", r#"{"a": 2}"#, false),
    ("self.a <= 2 && !(self.a != 2)", r#"{"a": 2}"#, true),
    ("has(self.a) ? self.a == 1 : false", r#"{"a": 1}"#, true),
    ("has(self.b)", r#"{"a": 1}"#, false),
    (
        "'a' in self && 1 in self.l && !('z' in self)",
        r#"{"a": 1, "l": [1, 2]}"#,
        true,
    ),
    (
        "self.l[1] == 2 && self['a'] == 1",
        r#"{"a": 1, "l": [1, 2]}"#,
        true,
    ),
    ("self.all(x, x > 0)", "[1, 2, 3]", true),
    ("self.all(x, x > 1)", "[1, 2, 3]", false),
    ("self.exists(x, x == 2)", "[1, 2, 3]", true),
    ("self.exists(x, x == 4)", "[1, 2, 3]", false),
    ("self.exists_one(x, x > 2)", "[1, 2, 3]", true),
    ("self.exists_one(x, x > 1)", "[1, 2, 3]", false),
    ("self.filter(x, x > 1) == [2, 3]", "[1, 2, 3]", true),
    ("self.map(x, x * 2) == [2, 4, 6]", "[1, 2, 3]", true),
    ("self.map(x, x * 2) == [2, 4]", "[1, 2, 3]", false),
    // A list or map the rule builds equals the object's, on either side.
    (
        "[1, 2, 3] == self && self == [1, 2, 3] && self.filter(x, true) == self && [1, 2] != self",
        "[1, 2, 3]",
        true,
    ),
    ("[1, 2, 3] == self", "[1, 2]", false),
    (
        "{'a': 1} == self && self == {'a': 1} && [1] == [self.a] && {'a': 2} != self",
        r#"{"a": 1}"#,
        true,
    ),
    (
        "self.all(k, k.startsWith('a'))",
        r#"{"ab": 1, "ac": 2}"#,
        true,
    ),
    // Standard functions.
    ("size(self) == 3 && self.size() == 3", "[1, 2, 3]", true),
    (
        "size(self.s) == 3 && self.s.size() == 3",
        r#"{"s": "héé"}"#,
        true,
    ),
    ("size(self) > 2", r#"{"a": 1}"#, false),
    (
        "self.matches('^[a-z]+$') && matches(self, 'b')",
        r#""abc""#,
        true,
    ),
    ("self.matches('^[a-z]+$')", r#""aBc""#, false),
    (
        "self.startsWith('ab') && self.endsWith('bc') && self.contains('b')",
        r#""abc""#,
        true,
    ),
    ("self.startsWith('b')", r#""abc""#, false),
    (
        "int('3') == 3 && uint(3) == 3u && double(1) == 1.0 && string(1) == '1' && bool('true') && bytes('a') == b'a'",
        "1",
        true,
    ),
    (
        "type(self) == int && dyn(self) == 1 && type(quantity('1')) == kubernetes.Quantity",
        "1",
        true,
    ),
    ("type(self) == string", "1", false),
    // Optionals.
    (
        "self.?a.orValue(0) == 1 && self.?b.orValue(7) == 7",
        r#"{"a": 1}"#,
        true,
    ),
    ("self.?b.hasValue()", r#"{"a": 1}"#, false),
    (
        "optional.of(1).value() == 1 && !optional.none().hasValue() && optional.ofNonZeroValue(0) == optional.none()",
        "1",
        true,
    ),
    ("optional.none().or(optional.of(2)).value() == 2", "1", true),
    ("self.?a.optMap(a, a + 1).value() == 2", r#"{"a": 1}"#, true),
    // Strings extension.
    (
        "self.charAt(1) == 'b' && self.indexOf('c') == 2 && self.lastIndexOf('b') == 3",
        r#""abcb""#,
        true,
    ),
    (
        "self.lowerAscii() == 'abc' && self.upperAscii() == 'ABC' && ' x '.trim() == 'x'",
        r#""aBc""#,
        true,
    ),
    (
        "self.replace('b', 'x') == 'axc' && self.split('b') == ['a', 'c'] && ['a', 'c'].join('-') == 'a-c'",
        r#""abc""#,
        true,
    ),
    (
        "self.substring(1) == 'bc' && self.reverse() == 'cba' && '%s!'.format([self]) == 'abc!' && strings.quote(self) == '\"abc\"'",
        r#""abc""#,
        true,
    ),
    ("self.indexOf('z') >= 0", r#""abc""#, false),
    // Kubernetes lists.
    (
        "self.isSorted() && self.sum() == 6 && self.min() == 1 && self.max() == 3",
        "[1, 2, 3]",
        true,
    ),
    ("self.isSorted()", "[1, 3, 2]", false),
    (
        "self.indexOf(2) == 1 && self.lastIndexOf(2) == 3 && self.indexOf(9) == -1",
        "[1, 2, 3, 2]",
        true,
    ),
    (
        "[1.5, 2.5].sum() == 4.0 && ['b', 'a'].min() == 'a'",
        "1",
        true,
    ),
    // Kubernetes regex.
    (
        "self.find('[0-9]+') == '42' && self.findAll('[a-z]') == ['a', 'b'] && self.findAll('[a-z]', 1) == ['a']",
        r#""a42b""#,
        true,
    ),
    ("self.find('[0-9]+') == ''", r#""a42b""#, false),
    // Kubernetes quantity.
    (
        "isQuantity(self) && quantity(self).isGreaterThan(quantity('1Gi')) && quantity(self).compareTo(quantity('2Gi')) == 0",
        r#""2Gi""#,
        true,
    ),
    (
        "quantity(self).isLessThan(quantity('1'))",
        r#""2Gi""#,
        false,
    ),
    (
        "quantity('1.5').add(quantity('500m')) == quantity('2') && quantity('2').sub(1).asInteger() == 1 && quantity('1').add(1).isInteger()",
        "1",
        true,
    ),
    (
        "quantity('-1').sign() == -1 && !quantity('1500m').isInteger() && quantity('1500m').asApproximateFloat() == 1.5",
        "1",
        true,
    ),
    ("isQuantity(self)", r#""1.5.5""#, false),
    // Kubernetes format.
    (
        "!format.dns1123Label().validate(self).hasValue()",
        r#""my-name""#,
        true,
    ),
    (
        "!format.dns1123Label().validate(self).hasValue()",
        r#""My_Name""#,
        false,
    ),
    (
        "format.named('dns1123Subdomain').value().validate(self) == optional.none() && !format.named('nope').hasValue()",
        r#""example.com""#,
        true,
    ),
    (
        "format.dns1035Label().validate('1a').hasValue() && format.qualifiedName().validate('a/b/c').hasValue() && format.labelValue().validate('-').hasValue() && format.uuid().validate('x').hasValue() && format.dns1123Subdomain().validate('-').hasValue()",
        "1",
        true,
    ),
];

#[test]
fn library_functions_evaluate_as_cel_does() {
    for (rule, value, expected) in CASES {
        let value: Value = serde_json::from_str(value).unwrap();
        assert_eq!(holds(rule, value), *expected, "{rule}");
    }
}

/// Whether `rule` calls `function`, as a member (`x.f(`) or not (`f(`).
fn calls(rule: &str, function: &str, member: bool) -> bool {
    rule.match_indices(&format!("{function}(")).any(|(at, _)| {
        let before = rule[..at].chars().next_back();
        if member {
            before == Some('.')
        } else {
            before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        }
    })
}

/// Every function a rule may call is exercised by [`CASES`], so the list
/// of what is provided is not a promise the environment cannot keep.
#[test]
fn every_provided_function_is_exercised() {
    let operator = |f: &str| !f.starts_with(|c: char| c.is_ascii_alphabetic());
    for f in library::GLOBAL_FUNCTIONS.iter().filter(|f| !operator(f)) {
        assert!(
            CASES.iter().any(|(rule, ..)| calls(rule, f, false)),
            "{f} is not exercised"
        );
    }
    for f in library::MEMBER_FUNCTIONS {
        assert!(
            CASES.iter().any(|(rule, ..)| calls(rule, f, true)),
            "{f} is not exercised"
        );
    }
}

#[test]
fn rules_that_use_what_is_not_provided_do_not_compile() {
    let fails = |entry: Value| {
        Rule::compile(&entry, &json!({}))
            .map(|_| ())
            .expect_err(&entry.to_string())
            .to_string()
    };
    assert!(fails(json!({"rule": "self.frobnicate()"})).contains("calls frobnicate"));
    assert!(fails(json!({"rule": "frobnicate(self)"})).contains("calls frobnicate"));
    assert!(fails(json!({"rule": "format.nope()"})).contains("calls nope"));
    assert!(
        fails(json!({"rule": "timestamp('2020-01-01T00:00:00Z') > self"}))
            .contains("calls timestamp")
    );
    assert!(fails(json!({"rule": "request.size() > 1"})).contains("refers to request"));
    assert!(fails(json!({"rule": "self.all(x, y > 1)"})).contains("refers to y"));
    assert!(fails(json!({"rule": "self.matches(self)"})).contains("must be a string literal"));
    assert!(fails(json!({"rule": "self.matches('(')"})).contains("regular expression"));
    assert!(fails(json!({"rule": "self ==="})).contains("does not parse"));
    assert!(fails(json!({"rule": "  "})).contains("no rule"));
    assert!(fails(json!({"message": "m"})).contains("no rule"));
    assert!(fails(json!({"rule": "true", "messageExpression": "nope"})).contains("refers to nope"));
    assert!(fails(json!({"rule": "true", "reason": "FieldValueBad"})).contains("reason"));
    assert!(fails(json!({"rule": "true", "fieldPath": ".nope"})).contains("valid field"));
    // A schema with such a rule does not compile, and says where it is.
    let error = Schema::compile(&json!({
        "properties": {"spec": {"x-kubernetes-validations": [{"rule": "self.nope()"}]}}
    }))
    .map(|_| ())
    .unwrap_err();
    assert_eq!(error.location, "spec");
    assert!(error.to_string().contains("calls nope"), "{error}");
}

#[test]
fn objects_read_as_kube_apiserver_reads_them() {
    // Unset fields are absent; selecting one is an evaluation error.
    assert!(!holds("has(self.b)", json!({"a": 1})));
    assert_eq!(
        evaluation_error_of("self.b == 1", json!({"a": 1})),
        "<nil>: Invalid value: \"\": no such key: b evaluating rule: m"
    );
    let typed = compile(json!({
        "type": "object",
        "properties": {
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "ios": {"x-kubernetes-int-or-string": true},
            "atomic": {"type": "array", "items": {"type": "string"}},
            "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        },
        "x-kubernetes-validations": [
            {"rule": "type(self.i) == int", "message": "i"},
            {"rule": "type(self.n) == double", "message": "n"},
            {"rule": "type(self.ios) == (self.ios == '50%' ? string : int)", "message": "ios"},
            {"rule": "self.set == ['b', 'a']", "message": "set"},
            {"rule": "self.atomic != ['b', 'a']", "message": "atomic"},
        ]
    }));
    for ios in [json!("50%"), json!(3)] {
        let object = json!({"i": 1, "n": 1, "ios": ios, "atomic": ["a", "b"], "set": ["a", "b"]});
        assert_eq!(errors(&typed, object, None), Vec::<String>::new());
    }
    // A rule on a null value is not evaluated.
    let nullable = compile(json!({
        "properties": {"x": {"nullable": true, "x-kubernetes-validations": [{"rule": "false"}]}}
    }));
    assert!(errors(&nullable, json!({"x": null}), None).is_empty());
    assert_eq!(errors(&nullable, json!({"x": 1}), None).len(), 1);
}

#[test]
fn messages_reasons_and_field_paths() {
    let schema = compile(json!({
        "type": "object",
        "properties": {"spec": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "m": {"type": "object", "additionalProperties": {"type": "string"}}},
            "x-kubernetes-validations": [
                {"rule": "self.a > 1"},
                {"rule": "self.a > 2", "message": " a is small ", "fieldPath": ".a"},
                {"rule": "self.a > 3", "messageExpression": "'a is ' + string(self.a)", "reason": "FieldValueForbidden"},
                {"rule": "self.a > 4", "message": "fallback", "messageExpression": "self.nope", "reason": "FieldValueRequired"},
                {"rule": "self.a > 5", "message": "fallback", "messageExpression": "1", "fieldPath": ".m['k.x']"},
                {"rule": "self.a > 6", "reason": "FieldValueDuplicate"},
            ]
        }}
    }));
    assert_eq!(
        errors(&schema, json!({"spec": {"a": 1, "m": {}}}), None),
        [
            "spec: Invalid value: \"object\": failed rule: self.a > 1",
            "spec.a: Invalid value: \"object\": a is small",
            "spec: Forbidden: a is 1",
            "spec: Required value: fallback",
            "spec.m[k.x]: Invalid value: \"object\": fallback",
            "spec: Duplicate value: \"object\"",
        ]
    );
    assert!(errors(&schema, json!({"spec": {"a": 7}}), None).is_empty());
}

#[test]
fn evaluation_errors_read_as_kube_apiserver_reports_them() {
    assert_eq!(
        evaluation_error_of("self + 1 > 0", json!(i64::MAX)),
        "<nil>: Invalid value: \"\": integer overflow evaluating rule: m"
    );
    assert_eq!(
        evaluation_error_of("self / 0 > 0", json!(1)),
        "<nil>: Invalid value: \"\": division by zero evaluating rule: m"
    );
    assert_eq!(
        evaluation_error_of("self[5] == 1", json!([1])),
        "<nil>: Invalid value: \"\": index out of bounds: 5 evaluating rule: m"
    );
    let overload = evaluation_error_of("self > 'a'", json!(1));
    assert!(
        overload.starts_with("<nil>: Invalid value: \"\": 'no such overload")
            && overload.ends_with(
                "call arguments did not match a supported operator, function or macro \
                 signature for rule: m"
            ),
        "{overload}"
    );
    assert!(evaluation_error_of("self", json!(1)).contains("did not evaluate to a bool"));
    assert!(
        evaluation_error_of("quantity(self) == quantity('1')", json!("x")).contains("quantity")
    );
}

#[test]
fn transition_rules_run_on_updates_with_an_old_value() {
    let schema = compile(json!({
        "type": "object",
        "properties": {
            "a": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "field is immutable"}]},
            "b": {"type": "string", "x-kubernetes-validations": [{
                "rule": "!oldSelf.hasValue() || oldSelf.value() == self",
                "message": "b is immutable once set",
                "optionalOldSelf": true
            }]},
            "c": {"type": "string", "x-kubernetes-validations": [{
                "rule": "oldSelf.hasValue() || self == 'first'",
                "message": "c starts as first",
                "optionalOldSelf": true
            }]},
        }
    }));
    // On create, `self == oldSelf` is not evaluated; optionalOldSelf rules are.
    assert_eq!(
        errors(&schema, json!({"a": "x", "b": "y", "c": "z"}), None),
        ["c: Invalid value: \"string\": c starts as first"]
    );
    let old = json!({"a": "x", "b": "y", "c": "first"});
    assert!(errors(&schema, old.clone(), Some(old.clone())).is_empty());
    assert_eq!(
        errors(
            &schema,
            json!({"a": "x2", "b": "y2", "c": "other"}),
            Some(old)
        ),
        [
            "a: Invalid value: \"string\": field is immutable",
            "b: Invalid value: \"string\": b is immutable once set",
        ]
    );
    // A field set by the update has no old value: its transition rule is skipped.
    assert!(errors(&schema, json!({"a": "x"}), Some(json!({}))).is_empty());
}

/// A hostile object cannot make a rule run long: the per-rule budget stops
/// it with kube-apiserver's error, and validation goes no further.
#[test]
fn evaluation_is_bounded() {
    let big: Vec<i64> = (0..10_000).collect();
    assert!(holds("self.all(x, x >= 0)", json!(big)));
    let schema = compile(json!({
        "type": "array",
        "x-kubernetes-validations": [
            {"rule": "self.all(x, self.all(y, x >= 0))", "message": "quadratic"},
            {"rule": "false", "message": "never reached"},
        ]
    }));
    let started = std::time::Instant::now();
    let found = errors(&schema, json!(big), None);
    assert_eq!(
        found,
        [
            "<nil>: Invalid value: \"array\": 'operation cancelled: actual cost limit exceeded': \
          no further validation rules will be run due to call cost exceeds limit for rule: \
          quadratic"
        ]
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // `==` on big lists is charged too.
    let equal = compile(
        json!({"x-kubernetes-validations": [{"rule": "self.all(x, self == self)", "message": "eq"}]}),
    );
    assert_eq!(errors(&equal, json!(big), None).len(), 1);
    // An object whose budget is spent gets kube-apiserver's error.
    let rule = Rule::compile(&json!({"rule": "self.all(x, x >= 0)"}), &json!({})).unwrap();
    let schema = compile(json!({}));
    let spent = Budget::new(5);
    match rule.evaluate(&json!(big), None, &schema, "spec", "array", &spent) {
        Outcome::Stop(e) => assert_eq!(
            e.to_string(),
            "spec: Invalid value: \"array\": validation failed due to running out of cost \
             budget, no further validation rules will be run"
        ),
        other => panic!("{other:?}"),
    }
}

/// `shared/upstream`, beside the checkout.
fn upstream() -> PathBuf {
    std::env::var_os("TRAINHUB_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
        .join("upstream")
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn crd(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The schema of version `version` of a CRD file.
fn crd_schema(path: &Path, version: &str) -> Schema {
    let crd = crd(path);
    let versions = crd["spec"]["versions"].as_array().unwrap();
    let v = versions.iter().find(|v| v["name"] == version).unwrap();
    compile(v["schema"]["openAPIV3Schema"].clone())
}

/// Every rule of every version of every CRD the hub serves or will serve
/// (the trainer kinds, spokes, Kueue's kinds, and upstream's trainer and
/// JobSet CRDs) compiles with what this module provides.
#[test]
fn every_rule_of_every_crd_compiles() {
    let dirs = [
        repo().join("manifests/crds"),
        upstream().join("kueue/crds"),
        upstream().join("jobset"),
        upstream().join("kubeflow-trainer/crds"),
    ];
    let mut files = 0;
    let mut rules = std::collections::BTreeSet::new();
    for dir in dirs {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let crd = crd(&path);
            let versions = crd["spec"]["versions"].as_array().unwrap();
            for version in versions {
                let schema = Schema::compile(&version["schema"]["openAPIV3Schema"])
                    .unwrap_or_else(|e| panic!("{} {}: {e}", path.display(), version["name"]));
                rules.extend(schema.rules().iter().map(|r| r.text.clone()));
            }
            files += 1;
        }
    }
    assert!(files >= 14, "only {files} CRD files found");
    // 48 distinct rules as of Kueue v0.14, JobSet v0.10 and Trainer v2.3.
    assert!(
        rules.len() >= 45,
        "only {} distinct rules: {rules:?}",
        rules.len()
    );
}

fn kueue(file: &str) -> Schema {
    crd_schema(&upstream().join("kueue/crds").join(file), "v1beta2")
}

#[test]
fn kueue_cluster_queue_rules() {
    let cq = kueue("kueue.x-k8s.io_clusterqueues.yaml");
    let group = |borrowing: Option<&str>| {
        let mut resource = json!({"name": "cpu", "nominalQuota": "10"});
        if let Some(limit) = borrowing {
            resource["borrowingLimit"] = json!(limit);
        }
        json!({"coveredResources": ["cpu"], "flavors": [{"name": "f", "resources": [resource]}]})
    };
    let with = |spec: Value| json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "q"}, "spec": spec});
    let borrowing =
        "spec: Invalid value: \"object\": borrowingLimit must be nil when cohort is empty";
    assert_eq!(
        errors(
            &cq,
            with(json!({"resourceGroups": [group(Some("5"))]})),
            None
        ),
        [borrowing]
    );
    assert!(
        errors(
            &cq,
            with(json!({"cohortName": "c", "resourceGroups": [group(Some("5"))]})),
            None
        )
        .is_empty()
    );
    assert!(errors(&cq, with(json!({"resourceGroups": [group(None)]})), None).is_empty());

    let preemption = |reclaim: &str, policy: &str| {
        with(
            json!({"preemption": {"reclaimWithinCohort": reclaim, "borrowWithinCohort": {"policy": policy}}}),
        )
    };
    assert_eq!(
        errors(&cq, preemption("Never", "LowerPriority"), None),
        [
            "spec.preemption: Invalid value: \"object\": reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never"
        ]
    );
    assert!(errors(&cq, preemption("Never", "Never"), None).is_empty());
    assert!(errors(&cq, preemption("Any", "LowerPriority"), None).is_empty());

    let uneven = json!({"coveredResources": ["cpu", "memory"], "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": "1"}]}]});
    assert_eq!(
        errors(
            &cq,
            with(json!({"cohortName": "c", "resourceGroups": [uneven]})),
            None
        ),
        [
            "spec.resourceGroups[0]: Invalid value: \"object\": flavors must have the same number of resources as the coveredResources"
        ]
    );
}

#[test]
fn kueue_toleration_rules() {
    let rf = kueue("kueue.x-k8s.io_resourceflavors.yaml");
    let with = |tolerations: Value| json!({"metadata": {"name": "f"}, "spec": {"tolerations": tolerations}});
    assert!(
        errors(&rf, with(json!([{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, {"operator": "Exists"}])), None)
            .is_empty()
    );
    let at = "spec.tolerations: Invalid value: \"array\": ";
    assert_eq!(
        errors(
            &rf,
            with(json!([{"key": "k", "operator": "Sometimes"}])),
            None
        ),
        [format!(
            "{at}supported toleration values: 'Equal'(default), 'Exists'"
        )]
    );
    assert_eq!(
        errors(
            &rf,
            with(json!([{"operator": "Equal", "value": "v"}])),
            None
        ),
        [format!(
            "{at}operator must be Exists when 'key' is empty, which means 'match all values and all keys'"
        )]
    );
    assert_eq!(
        errors(
            &rf,
            with(json!([{"key": "k", "operator": "Exists", "value": "v"}])),
            None
        ),
        [format!(
            "{at}a value must be empty when 'operator' is 'Exists'"
        )]
    );
    assert_eq!(
        errors(
            &rf,
            with(json!([{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}])),
            None
        ),
        [format!(
            "{at}effect must be 'NoExecute' when 'tolerationSeconds' is set"
        )]
    );
    // A toleration without an operator has none to check.
    assert!(errors(&rf, with(json!([{"key": "k"}])), None).is_empty());
}

#[test]
fn kueue_immutable_fields() {
    let lq = kueue("kueue.x-k8s.io_localqueues.yaml");
    let queue = |cq: &str| json!({"metadata": {"name": "lq", "namespace": "ns"}, "spec": {"clusterQueue": cq}});
    assert!(errors(&lq, queue("a"), None).is_empty());
    assert!(errors(&lq, queue("a"), Some(queue("a"))).is_empty());
    assert_eq!(
        errors(&lq, queue("b"), Some(queue("a"))),
        ["spec.clusterQueue: Invalid value: \"string\": field is immutable"]
    );
    let rf = kueue("kueue.x-k8s.io_resourceflavors.yaml");
    let flavor = |topology: Option<&str>| {
        let mut spec = json!({"nodeLabels": {"zone": "a"}});
        if let Some(t) = topology {
            spec["topologyName"] = json!(t);
        }
        json!({"metadata": {"name": "f"}, "spec": spec})
    };
    assert!(errors(&rf, flavor(Some("t")), Some(flavor(None))).is_empty());
    assert_eq!(
        errors(&rf, flavor(Some("u")), Some(flavor(Some("t")))),
        ["spec: Invalid value: \"object\": topologyName is immutable when topologyName is set"]
    );
}

#[test]
fn jobset_rules() {
    let jobset = crd_schema(
        &upstream().join("jobset/jobset.x-k8s.io_jobsets.yaml"),
        "v1alpha2",
    );
    let job = |depends: bool| {
        let mut j = json!({"name": "w", "replicas": 1, "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}});
        if depends {
            j["dependsOn"] = json!([{"name": "i", "status": "Complete"}]);
        }
        j
    };
    let with = |order: &str, depends: bool| json!({"metadata": {"name": "js"}, "spec": {"startupPolicy": {"startupPolicyOrder": order}, "replicatedJobs": [job(depends)]}});
    assert!(
        errors(&jobset, with("InOrder", true), None)
            .contains(&"spec: Invalid value: \"object\": StartupPolicy and DependsOn APIs are mutually exclusive".to_string())
    );
    assert!(
        !errors(&jobset, with("AnyOrder", true), None)
            .iter()
            .any(|e| e.contains("mutually exclusive"))
    );
}
