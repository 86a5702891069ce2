//! What a caller may do: admin groups and namespace grants.
//!
//! The policy file is YAML:
//!
//! ```yaml
//! # Members of any of these groups may do everything, including writing
//! # cluster-scoped resources (ClusterTrainingRuntimes, plugins) and
//! # listing across all namespaces. Default when absent:
//! # ["system:masters", "trainhub:admins"]; [] means no admins.
//! adminGroups: ["system:masters", "trainhub:admins"]
//! # Namespaces granted to users (by name) and groups. Each namespace may be
//! # listed once, and must name at least one user or group.
//! namespaces:
//!   - namespace: team-a
//!     users: ["alice"]
//!     groups: ["team-a"]
//! ```
//!
//! Unknown fields are errors. An empty file is the default policy (default
//! admin groups, no grants).
//!
//! In a namespace granted to them, other authenticated users may:
//!
//! - do anything to `trainjobs` and `trainingruntimes`
//!   (`trainer.kubeflow.org`), and read `trainjobs/status`;
//! - get, list and watch `pods` and `events` (core and `events.k8s.io`), and
//!   get `pods/log`;
//! - get, list and watch `resourcequotas` (and get their `status`): the
//!   object counts an admin set for the namespace, and what is used;
//! - get, list and watch Kueue's `localqueues` and `workloads`
//!   (`kueue.x-k8s.io`), and get their `status`: an admin creates the
//!   LocalQueues that point a namespace at a ClusterQueue, and the hub
//!   writes the Workloads.
//!
//! They may get the `Namespace` objects of the namespaces granted to them,
//! and list and watch namespaces (the server shows them only those).
//!
//! Anywhere, they may get, list and watch `clustertrainingruntimes` (the
//! Kubeflow SDK lists them) and Kueue's cluster-scoped `resourceflavors`,
//! `clusterqueues`, `cohorts` and `workloadpriorityclasses` (to see the
//! quotas they submit against), and create the self-reviews that `kubectl
//! auth can-i` and `kubectl auth whoami` send. Everything else, including listing
//! a namespaced resource across all namespaces and any write of a
//! cluster-scoped resource (creating, labelling or deleting a namespace
//! among them), is for admins only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::str::FromStr;

use serde::Deserialize;

use super::{
    Attributes, AuthConfigError, Authorizer, NonResourceRule, PUBLIC_PATHS, ResourceRule, Rules,
    UserInfo,
};

/// The admin groups when the policy names none.
pub const DEFAULT_ADMIN_GROUPS: [&str; 2] = ["system:masters", "trainhub:admins"];

const TRAINER_GROUP: &str = "trainer.kubeflow.org";
const KUEUE_GROUP: &str = "kueue.x-k8s.io";
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// The parsed policy file; see the module docs for the format.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Policy {
    #[serde(default = "default_admin_groups")]
    pub admin_groups: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<NamespaceGrant>,
}

/// Users and groups granted one namespace.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceGrant {
    pub namespace: String,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
}

fn default_admin_groups() -> Vec<String> {
    DEFAULT_ADMIN_GROUPS.iter().map(|g| g.to_string()).collect()
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            admin_groups: default_admin_groups(),
            namespaces: Vec::new(),
        }
    }
}

impl Policy {
    /// Reads, parses and checks the file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Policy, AuthConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| AuthConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks policy text; `source_name` is used in error messages.
    pub fn parse(text: &str, source_name: &str) -> Result<Policy, AuthConfigError> {
        let err = |message: String| AuthConfigError::Policy {
            source_name: source_name.to_string(),
            message,
        };
        let blank = text.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---"
        });
        let policy: Policy = if blank {
            Policy::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| err(e.to_string()))?
        };
        policy.check().map_err(err)?;
        Ok(policy)
    }

    fn check(&self) -> Result<(), String> {
        for (i, group) in self.admin_groups.iter().enumerate() {
            if group.is_empty() {
                return Err(format!("adminGroups[{i}]: must not be empty"));
            }
        }
        let mut seen = BTreeMap::new();
        for (i, grant) in self.namespaces.iter().enumerate() {
            if grant.namespace.is_empty() {
                return Err(format!("namespaces[{i}].namespace: Required value"));
            }
            if let Some(first) = seen.insert(grant.namespace.as_str(), i) {
                return Err(format!(
                    "namespaces[{i}].namespace: Duplicate value: \"{}\" (also namespaces[{first}]); list each namespace once",
                    grant.namespace
                ));
            }
            if grant.users.is_empty() && grant.groups.is_empty() {
                return Err(format!(
                    "namespaces[{i}]: grants \"{}\" to no one; list users or groups",
                    grant.namespace
                ));
            }
            for (field, names) in [("users", &grant.users), ("groups", &grant.groups)] {
                if let Some(j) = names.iter().position(String::is_empty) {
                    return Err(format!("namespaces[{i}].{field}[{j}]: must not be empty"));
                }
            }
        }
        Ok(())
    }
}

impl FromStr for Policy {
    type Err = AuthConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text, "policy")
    }
}

#[derive(Debug, Default)]
struct Grantees {
    users: BTreeSet<String>,
    groups: BTreeSet<String>,
}

/// [`Authorizer`] over a [`Policy`]; the rules are in the module docs.
#[derive(Debug)]
pub struct PolicyAuthorizer {
    admin_groups: Vec<String>,
    namespaces: BTreeMap<String, Grantees>,
}

impl PolicyAuthorizer {
    pub fn new(policy: Policy) -> Self {
        let namespaces = policy
            .namespaces
            .into_iter()
            .map(|g| {
                let grantees = Grantees {
                    users: g.users.into_iter().collect(),
                    groups: g.groups.into_iter().collect(),
                };
                (g.namespace, grantees)
            })
            .collect();
        PolicyAuthorizer {
            admin_groups: policy.admin_groups,
            namespaces,
        }
    }

    fn is_admin(&self, user: &UserInfo) -> bool {
        self.admin_groups.iter().any(|g| user.in_group(g))
    }

    fn granted(&self, user: &UserInfo, namespace: &str) -> bool {
        self.namespaces.get(namespace).is_some_and(|g| {
            g.users.contains(&user.name) || user.groups.iter().any(|ug| g.groups.contains(ug))
        })
    }

    fn in_granted_namespace(&self, user: &UserInfo, a: &Attributes<'_>) -> Result<(), String> {
        match a.namespace.filter(|ns| !ns.is_empty()) {
            None => Err(format!(
                "{} of {} across all namespaces is for admins only",
                a.verb, a.resource
            )),
            Some(ns) if self.granted(user, ns) => Ok(()),
            Some(ns) => Err(format!("namespace \"{ns}\" is not granted to the user")),
        }
    }
}

/// What a non-admin may do to a resource, before the namespace check.
enum Rule {
    /// Namespaced: `verbs` on the resource itself, `get` on `get_subresources`.
    Namespaced {
        verbs: &'static [&'static str],
        get_subresources: &'static [&'static str],
    },
    /// Cluster-scoped, read-only.
    ClusterRead,
    /// Cluster-scoped, create only (self reviews).
    SelfReview,
    /// Namespaces: get of a granted one (a namespace is in itself); list
    /// and watch of all, which the server filters to those the caller may
    /// get.
    Namespaces,
}

const ALL_VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

fn rule_of(group: &str, resource: &str) -> Option<Rule> {
    match (group, resource) {
        (TRAINER_GROUP, "trainjobs") => Some(Rule::Namespaced {
            verbs: &ALL_VERBS,
            get_subresources: &["status"],
        }),
        (TRAINER_GROUP, "trainingruntimes") => Some(Rule::Namespaced {
            verbs: &ALL_VERBS,
            get_subresources: &[],
        }),
        ("", "pods") => Some(Rule::Namespaced {
            verbs: &READ_VERBS,
            get_subresources: &["log"],
        }),
        ("", "resourcequotas") => Some(Rule::Namespaced {
            verbs: &READ_VERBS,
            get_subresources: &["status"],
        }),
        ("", "events") | ("events.k8s.io", "events") => Some(Rule::Namespaced {
            verbs: &READ_VERBS,
            get_subresources: &[],
        }),
        (KUEUE_GROUP, "localqueues" | "workloads") => Some(Rule::Namespaced {
            verbs: &READ_VERBS,
            get_subresources: &["status"],
        }),
        (TRAINER_GROUP, "clustertrainingruntimes")
        | (
            KUEUE_GROUP,
            "resourceflavors" | "clusterqueues" | "cohorts" | "workloadpriorityclasses",
        ) => Some(Rule::ClusterRead),
        ("", "namespaces") => Some(Rule::Namespaces),
        ("authorization.k8s.io", "selfsubjectaccessreviews")
        | ("authorization.k8s.io", "selfsubjectrulesreviews")
        | ("authentication.k8s.io", "selfsubjectreviews") => Some(Rule::SelfReview),
        _ => None,
    }
}

/// Every (group, resource) with a non-admin rule, for listing rules.
const RULED: [(&str, &str); 17] = [
    (TRAINER_GROUP, "trainjobs"),
    (TRAINER_GROUP, "trainingruntimes"),
    ("", "pods"),
    ("", "resourcequotas"),
    ("", "events"),
    ("events.k8s.io", "events"),
    (KUEUE_GROUP, "localqueues"),
    (KUEUE_GROUP, "workloads"),
    (TRAINER_GROUP, "clustertrainingruntimes"),
    (KUEUE_GROUP, "resourceflavors"),
    (KUEUE_GROUP, "clusterqueues"),
    (KUEUE_GROUP, "cohorts"),
    (KUEUE_GROUP, "workloadpriorityclasses"),
    ("", "namespaces"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
];

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

impl Authorizer for PolicyAuthorizer {
    fn authorize_non_resource(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<(), String> {
        if self.is_admin(user) {
            return Ok(());
        }
        super::public_non_resource(verb, path)
    }

    fn rules(&self, user: &UserInfo, namespace: &str) -> Option<Rules> {
        if self.is_admin(user) {
            return Some(Rules::everything());
        }
        let granted = !namespace.is_empty() && self.granted(user, namespace);
        let mut rules = Vec::new();
        for (group, resource) in RULED {
            let rule = |verbs: &[&str], resources: Vec<String>, names: Vec<String>| ResourceRule {
                verbs: strings(verbs),
                api_groups: vec![group.to_string()],
                resources,
                resource_names: names,
            };
            match rule_of(group, resource) {
                Some(Rule::Namespaced {
                    verbs,
                    get_subresources,
                }) if granted => {
                    rules.push(rule(verbs, vec![resource.to_string()], vec![]));
                    for sub in get_subresources {
                        rules.push(rule(&["get"], vec![format!("{resource}/{sub}")], vec![]));
                    }
                }
                Some(Rule::ClusterRead) => {
                    rules.push(rule(&READ_VERBS, vec![resource.to_string()], vec![]));
                }
                Some(Rule::SelfReview) => {
                    rules.push(rule(&["create"], vec![resource.to_string()], vec![]));
                }
                Some(Rule::Namespaces) => {
                    rules.push(rule(&["list", "watch"], vec![resource.to_string()], vec![]));
                    if granted {
                        rules.push(rule(
                            &READ_VERBS,
                            vec![resource.to_string()],
                            vec![namespace.to_string()],
                        ));
                    }
                }
                _ => {}
            }
        }
        Some(Rules {
            resource_rules: rules,
            non_resource_rules: vec![NonResourceRule {
                verbs: strings(&["get"]),
                non_resource_urls: strings(&PUBLIC_PATHS),
            }],
        })
    }

    fn authorize(&self, user: &UserInfo, a: &Attributes<'_>) -> Result<(), String> {
        if self.is_admin(user) {
            return Ok(());
        }
        let subresource = a.subresource.filter(|s| !s.is_empty());
        let resource = match subresource {
            Some(s) => format!("{}/{s}", a.resource),
            None => a.resource.to_string(),
        };
        let Some(rule) = rule_of(a.group, a.resource) else {
            return Err(format!(
                "{resource} in API group \"{}\" is for admins only",
                a.group
            ));
        };
        let refused = || format!("{} of {resource} is for admins only", a.verb);
        match rule {
            Rule::Namespaced {
                verbs,
                get_subresources,
            } => {
                let allowed = match subresource {
                    None => verbs.contains(&a.verb),
                    Some(s) => a.verb == "get" && get_subresources.contains(&s),
                };
                if !allowed {
                    return Err(refused());
                }
                self.in_granted_namespace(user, a)
            }
            Rule::ClusterRead => match subresource {
                None if READ_VERBS.contains(&a.verb) => Ok(()),
                _ => Err(refused()),
            },
            Rule::SelfReview => match subresource {
                None if a.verb == "create" => Ok(()),
                _ => Err(refused()),
            },
            Rule::Namespaces => match (subresource, a.namespace.filter(|n| !n.is_empty())) {
                (None, None) if matches!(a.verb, "list" | "watch") => Ok(()),
                (None, Some(ns)) if READ_VERBS.contains(&a.verb) => {
                    if self.granted(user, ns) {
                        Ok(())
                    } else {
                        Err(format!("namespace \"{ns}\" is not granted to the user"))
                    }
                }
                _ => Err(refused()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AUTHENTICATED_GROUP;

    const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

    const POLICY: &str = r#"
namespaces:
  - namespace: team-a
    users: ["alice"]
    groups: ["team-a"]
  - namespace: shared
    groups: ["system:authenticated"]
"#;

    fn authz() -> PolicyAuthorizer {
        PolicyAuthorizer::new(POLICY.parse().unwrap())
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        groups.push(AUTHENTICATED_GROUP.into());
        UserInfo {
            name: name.into(),
            uid: String::new(),
            groups,
        }
    }

    fn attrs<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        subresource: Option<&'a str>,
        namespace: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group,
            resource,
            subresource,
            namespace,
            name: "",
        }
    }

    fn allowed(u: &UserInfo, a: Attributes<'_>) -> bool {
        authz().authorize(u, &a).is_ok()
    }

    #[test]
    fn admins_may_do_everything() {
        let admin = user("root", &["system:masters"]);
        let also = user("ops", &["trainhub:admins"]);
        for a in [
            attrs(
                "create",
                TRAINER_GROUP,
                "clustertrainingruntimes",
                None,
                None,
            ),
            attrs("delete", "trainhub.io", "plugins", None, None),
            attrs("list", TRAINER_GROUP, "trainjobs", None, None),
            attrs(
                "update",
                TRAINER_GROUP,
                "trainjobs",
                Some("status"),
                Some("x"),
            ),
        ] {
            assert!(allowed(&admin, a.clone()), "{a:?}");
            assert!(allowed(&also, a.clone()), "{a:?}");
        }
    }

    #[test]
    fn admin_groups_are_configurable() {
        let p: Policy = "adminGroups: [\"ops\"]".parse().unwrap();
        let z = PolicyAuthorizer::new(p);
        let a = attrs("delete", "trainhub.io", "plugins", None, None);
        assert!(z.authorize(&user("o", &["ops"]), &a).is_ok());
        assert!(z.authorize(&user("m", &["system:masters"]), &a).is_err());
    }

    #[test]
    fn granted_user_and_group_write_trainer_resources() {
        let alice = user("alice", &[]);
        let member = user("mallory", &["team-a"]);
        for verb in ALL_VERBS {
            for resource in ["trainjobs", "trainingruntimes"] {
                let a = attrs(verb, TRAINER_GROUP, resource, None, Some("team-a"));
                assert!(allowed(&alice, a.clone()), "{a:?}");
                assert!(allowed(&member, a.clone()), "{a:?}");
            }
        }
        // A grant to system:authenticated is a grant to everyone.
        let bob = user("bob", &[]);
        assert!(allowed(
            &bob,
            attrs("create", TRAINER_GROUP, "trainjobs", None, Some("shared"))
        ));
    }

    #[test]
    fn ungranted_namespace_is_refused() {
        let bob = user("bob", &["team-b"]);
        let e = authz()
            .authorize(
                &bob,
                &attrs("get", TRAINER_GROUP, "trainjobs", None, Some("team-a")),
            )
            .unwrap_err();
        assert_eq!(e, "namespace \"team-a\" is not granted to the user");
        assert!(!allowed(
            &bob,
            attrs("list", "", "pods", None, Some("team-a"))
        ));
    }

    #[test]
    fn status_is_read_only_for_users() {
        let alice = user("alice", &[]);
        let ns = Some("team-a");
        assert!(allowed(
            &alice,
            attrs("get", TRAINER_GROUP, "trainjobs", Some("status"), ns)
        ));
        for verb in ["update", "patch"] {
            assert!(!allowed(
                &alice,
                attrs(verb, TRAINER_GROUP, "trainjobs", Some("status"), ns)
            ));
        }
        assert!(!allowed(
            &alice,
            attrs("get", TRAINER_GROUP, "trainingruntimes", Some("status"), ns)
        ));
    }

    #[test]
    fn pods_events_and_logs_are_read_only() {
        let alice = user("alice", &[]);
        let ns = Some("team-a");
        for verb in READ_VERBS {
            assert!(allowed(&alice, attrs(verb, "", "pods", None, ns)));
            assert!(allowed(&alice, attrs(verb, "", "events", None, ns)));
            assert!(allowed(
                &alice,
                attrs(verb, "events.k8s.io", "events", None, ns)
            ));
        }
        assert!(allowed(&alice, attrs("get", "", "pods", Some("log"), ns)));
        for verb in WRITE_VERBS {
            assert!(!allowed(&alice, attrs(verb, "", "pods", None, ns)));
            assert!(!allowed(&alice, attrs(verb, "", "events", None, ns)));
        }
        assert!(!allowed(
            &alice,
            attrs("create", "", "pods", Some("exec"), ns)
        ));
        assert!(!allowed(&alice, attrs("get", "", "pods", Some("exec"), ns)));
        assert!(!allowed(&alice, attrs("get", "", "secrets", None, ns)));
    }

    #[test]
    fn cluster_runtimes_are_readable_never_writable() {
        let bob = user("bob", &[]);
        for verb in READ_VERBS {
            assert!(allowed(
                &bob,
                attrs(verb, TRAINER_GROUP, "clustertrainingruntimes", None, None)
            ));
        }
        for verb in WRITE_VERBS {
            let e = authz()
                .authorize(
                    &bob,
                    &attrs(verb, TRAINER_GROUP, "clustertrainingruntimes", None, None),
                )
                .unwrap_err();
            assert_eq!(
                e,
                format!("{verb} of clustertrainingruntimes is for admins only")
            );
        }
        assert!(!allowed(
            &bob,
            attrs("get", "trainhub.io", "plugins", None, None)
        ));
    }

    #[test]
    fn kueue_quotas_are_admin_written_and_tenant_read() {
        let alice = user("alice", &[]);
        let admin = user("root", &["trainhub:admins"]);
        for resource in [
            "resourceflavors",
            "clusterqueues",
            "cohorts",
            "workloadpriorityclasses",
        ] {
            for verb in READ_VERBS {
                assert!(allowed(
                    &alice,
                    attrs(verb, KUEUE_GROUP, resource, None, None)
                ));
            }
            for verb in WRITE_VERBS {
                assert_eq!(
                    authz()
                        .authorize(&alice, &attrs(verb, KUEUE_GROUP, resource, None, None))
                        .unwrap_err(),
                    format!("{verb} of {resource} is for admins only")
                );
                assert!(allowed(
                    &admin,
                    attrs(verb, KUEUE_GROUP, resource, None, None)
                ));
            }
        }
        // LocalQueues and Workloads: read in granted namespaces only;
        // LocalQueues are written by admins, Workloads by the hub.
        for resource in ["localqueues", "workloads"] {
            for verb in READ_VERBS {
                assert!(allowed(
                    &alice,
                    attrs(verb, KUEUE_GROUP, resource, None, Some("team-a"))
                ));
                assert!(!allowed(
                    &alice,
                    attrs(verb, KUEUE_GROUP, resource, None, Some("team-b"))
                ));
            }
            assert!(allowed(
                &alice,
                attrs("get", KUEUE_GROUP, resource, Some("status"), Some("team-a"))
            ));
            for verb in WRITE_VERBS {
                assert!(!allowed(
                    &alice,
                    attrs(verb, KUEUE_GROUP, resource, None, Some("team-a"))
                ));
            }
        }
        assert!(allowed(
            &admin,
            attrs("create", KUEUE_GROUP, "localqueues", None, Some("team-a"))
        ));
    }

    #[test]
    fn all_namespace_lists_are_for_admins() {
        let alice = user("alice", &["team-a"]);
        for (group, resource) in [(TRAINER_GROUP, "trainjobs"), ("", "pods"), ("", "events")] {
            let e = authz()
                .authorize(&alice, &attrs("list", group, resource, None, None))
                .unwrap_err();
            assert_eq!(
                e,
                format!("list of {resource} across all namespaces is for admins only")
            );
            assert!(!allowed(
                &alice,
                attrs("watch", group, resource, None, Some(""))
            ));
        }
    }

    #[test]
    fn self_reviews_are_allowed() {
        let bob = user("bob", &[]);
        assert!(allowed(
            &bob,
            attrs(
                "create",
                "authorization.k8s.io",
                "selfsubjectaccessreviews",
                None,
                None
            )
        ));
        assert!(allowed(
            &bob,
            attrs(
                "create",
                "authentication.k8s.io",
                "selfsubjectreviews",
                None,
                None
            )
        ));
        assert!(!allowed(
            &bob,
            attrs(
                "create",
                "authorization.k8s.io",
                "subjectaccessreviews",
                None,
                None
            )
        ));
    }

    #[test]
    fn tenants_get_their_namespaces_and_write_none() {
        let alice = user("alice", &[]);
        let ns = |verb, name| attrs(verb, "", "namespaces", None, name);
        assert!(allowed(&alice, ns("get", Some("team-a"))));
        assert!(allowed(&alice, ns("watch", Some("team-a"))));
        assert!(!allowed(&alice, ns("get", Some("team-b"))));
        // Lists of all namespaces are filtered by the server.
        assert!(allowed(&alice, ns("list", None)));
        assert!(allowed(&alice, ns("watch", None)));
        assert!(!allowed(&alice, ns("get", None)));
        for verb in WRITE_VERBS {
            let e = authz()
                .authorize(&alice, &ns(verb, Some("team-a")))
                .unwrap_err();
            assert_eq!(e, format!("{verb} of namespaces is for admins only"));
            assert!(!allowed(&alice, ns(verb, None)));
        }
        assert!(!allowed(
            &alice,
            attrs("get", "", "namespaces", Some("status"), Some("team-a"))
        ));
        let admin = user("root", &["system:masters"]);
        assert!(allowed(&admin, ns("create", None)));
        assert!(allowed(&admin, ns("delete", Some("team-b"))));
    }

    #[test]
    fn rules_list_what_authorize_allows() {
        let alice = user("alice", &[]);
        let z = authz();
        let rules = z.rules(&alice, "team-a").unwrap();
        // Every listed rule is allowed, in team-a (and no more in team-b).
        for r in &rules.resource_rules {
            for verb in &r.verbs {
                for resource in &r.resources {
                    let (resource, sub) = match resource.split_once('/') {
                        Some((r, s)) => (r, Some(s)),
                        None => (resource.as_str(), None),
                    };
                    let a = attrs(verb, &r.api_groups[0], resource, sub, Some("team-a"));
                    let a = if resource == "clustertrainingruntimes"
                        || resource.starts_with("self")
                        || (resource == "namespaces" && r.resource_names.is_empty())
                    {
                        Attributes {
                            namespace: None,
                            ..a
                        }
                    } else {
                        a
                    };
                    assert!(z.authorize(&alice, &a).is_ok(), "{a:?}");
                }
            }
        }
        assert!(
            rules
                .resource_rules
                .iter()
                .any(|r| r.resources == ["trainjobs"] && r.verbs.len() == 8)
        );
        let elsewhere = z.rules(&alice, "team-b").unwrap();
        assert!(
            !elsewhere
                .resource_rules
                .iter()
                .any(|r| r.resources == ["trainjobs"])
        );
        assert!(
            elsewhere
                .resource_rules
                .iter()
                .any(|r| r.resources == ["selfsubjectaccessreviews"])
        );
        let admin = user("root", &["trainhub:admins"]);
        assert_eq!(z.rules(&admin, "x"), Some(Rules::everything()));
        assert!(z.authorize_non_resource(&admin, "get", "/metrics").is_ok());
        assert!(z.authorize_non_resource(&alice, "get", "/metrics").is_err());
        assert!(z.authorize_non_resource(&alice, "get", "/version").is_ok());
    }

    #[test]
    fn unknown_verbs_are_refused() {
        let alice = user("alice", &[]);
        assert!(!allowed(
            &alice,
            attrs("escalate", TRAINER_GROUP, "trainjobs", None, Some("team-a"))
        ));
    }

    #[test]
    fn defaults_apply_when_absent() {
        let p: Policy = "namespaces: []".parse().unwrap();
        assert_eq!(p.admin_groups, vec!["system:masters", "trainhub:admins"]);
        let empty: Policy = "# nothing here\n".parse().unwrap();
        assert_eq!(empty, Policy::default());
        let none: Policy = "adminGroups: []".parse().unwrap();
        assert!(none.admin_groups.is_empty());
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = "adminGroup: [x]".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("adminGroup"), "{e}");
        assert!(e.starts_with("policy: "), "{e}");
        let e = "namespaces:\n  - namespace: a\n    user: [alice]\n"
            .parse::<Policy>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("`user`"), "{e}");
    }

    #[test]
    fn grants_are_checked() {
        let err = |t: &str| t.parse::<Policy>().unwrap_err().to_string();
        assert_eq!(
            err(
                "namespaces:\n  - namespace: a\n    users: [x]\n  - namespace: a\n    groups: [y]\n"
            ),
            "policy: namespaces[1].namespace: Duplicate value: \"a\" (also namespaces[0]); list each namespace once"
        );
        assert_eq!(
            err("namespaces:\n  - namespace: a\n"),
            "policy: namespaces[0]: grants \"a\" to no one; list users or groups"
        );
        assert_eq!(
            err("namespaces:\n  - namespace: \"\"\n    users: [x]\n"),
            "policy: namespaces[0].namespace: Required value"
        );
        assert_eq!(
            err("namespaces:\n  - namespace: a\n    groups: [\"\"]\n"),
            "policy: namespaces[0].groups[0]: must not be empty"
        );
    }

    #[test]
    fn load_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, "namespaces:\n  - namespace: a\n").unwrap();
        let e = Policy::load(&path).unwrap_err().to_string();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
        std::fs::write(&path, POLICY).unwrap();
        assert_eq!(Policy::load(&path).unwrap().namespaces.len(), 2);
    }
}
