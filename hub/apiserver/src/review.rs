//! The self reviews kubectl asks the server about its caller, answered from
//! the server's own authenticator and authorizer, never stored:
//!
//! - `SelfSubjectAccessReview` (authorization.k8s.io/v1): `kubectl auth can-i`;
//! - `SelfSubjectRulesReview` (authorization.k8s.io/v1): `kubectl auth can-i --list`;
//! - `SelfSubjectReview` (authentication.k8s.io/v1): `kubectl auth whoami`.
//!
//! A create of one returns it with its `status` filled in (201), as
//! kube-apiserver does.

use serde_json::{Value, json};

use crate::auth::{Attributes, Authorizer, UserInfo};
use crate::field::FieldError;
use crate::namespace::NAMESPACES;
use crate::resource::ResourceDef;
use crate::status::ApiError;

pub const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";
pub const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";
const ACCESS: &str = "selfsubjectaccessreviews";
const RULES: &str = "selfsubjectrulesreviews";
const WHOAMI: &str = "selfsubjectreviews";

fn def(group: &str, kind: &str, plural: &str) -> ResourceDef {
    ResourceDef {
        group: group.into(),
        version: "v1".into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        namespaced: false,
        ..Default::default()
    }
}

/// The three review resources, to serve beside the others.
pub fn resource_defs() -> Vec<ResourceDef> {
    vec![
        def(AUTHORIZATION_GROUP, "SelfSubjectAccessReview", ACCESS),
        def(AUTHORIZATION_GROUP, "SelfSubjectRulesReview", RULES),
        def(AUTHENTICATION_GROUP, "SelfSubjectReview", WHOAMI),
    ]
}

/// Whether `def` is one of the reviews: created and answered, never stored.
pub fn is_review(def: &ResourceDef) -> bool {
    matches!(
        (def.group.as_str(), def.plural.as_str()),
        (AUTHORIZATION_GROUP, ACCESS | RULES) | (AUTHENTICATION_GROUP, WHOAMI)
    )
}

fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v.get(field).and_then(Value::as_str).unwrap_or_default()
}

/// Answers the review `body` of kind `def` for `user`.
///
/// # Errors
///
/// 422 when the body asks nothing answerable (an access review without
/// exactly one of `resourceAttributes` and `nonResourceAttributes`).
#[allow(clippy::result_large_err, reason = "ApiError is the crate's error")]
pub fn answer(
    def: &ResourceDef,
    body: &Value,
    user: &UserInfo,
    authorizer: &dyn Authorizer,
) -> Result<Value, ApiError> {
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = match def.plural.as_str() {
        ACCESS => access(def, &spec, user, authorizer)?,
        RULES => rules(&spec, user, authorizer),
        _ => json!({"userInfo": user_info(user)}),
    };
    let mut metadata = body
        .get("metadata")
        .filter(|m| m.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}));
    metadata["creationTimestamp"] = Value::Null;
    let mut answer = json!({
        "kind": def.kind,
        "apiVersion": def.api_version(),
        "metadata": metadata,
        "status": status,
    });
    if def.plural != WHOAMI {
        answer["spec"] = spec;
    }
    Ok(answer)
}

fn user_info(user: &UserInfo) -> Value {
    let mut info = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = user.uid.clone().into();
    }
    info
}

#[allow(clippy::result_large_err, reason = "ApiError is the crate's error")]
fn access(
    def: &ResourceDef,
    spec: &Value,
    user: &UserInfo,
    authorizer: &dyn Authorizer,
) -> Result<Value, ApiError> {
    let decision = match (
        spec.get("resourceAttributes"),
        spec.get("nonResourceAttributes"),
    ) {
        (Some(r), None) => {
            let resource = text(r, "resource");
            let name = text(r, "name");
            let mut namespace = Some(text(r, "namespace")).filter(|n| !n.is_empty());
            // A namespace is in itself, as on the request path.
            if r.get("group").is_none_or(|g| g == "") && resource == NAMESPACES && !name.is_empty()
            {
                namespace = namespace.or(Some(name));
            }
            let attributes = Attributes {
                verb: text(r, "verb"),
                group: text(r, "group"),
                resource,
                subresource: Some(text(r, "subresource")).filter(|s| !s.is_empty()),
                namespace,
                name,
            };
            authorizer.authorize(user, &attributes)
        }
        (None, Some(n)) => {
            authorizer.authorize_non_resource(user, text(n, "verb"), text(n, "path"))
        }
        _ => {
            return Err(ApiError::invalid(
                &def.group,
                &def.kind,
                "",
                &[FieldError::invalid(
                    "spec.resourceAttributes",
                    spec.get("resourceAttributes")
                        .cloned()
                        .unwrap_or(Value::Null),
                    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                )],
            ));
        }
    };
    Ok(match decision {
        Ok(()) => json!({"allowed": true, "reason": "allowed by the trainhub policy"}),
        Err(reason) => json!({"allowed": false, "reason": reason}),
    })
}

fn rules(spec: &Value, user: &UserInfo, authorizer: &dyn Authorizer) -> Value {
    let namespace = text(spec, "namespace");
    let Some(rules) = authorizer.rules(user, namespace) else {
        return json!({
            "resourceRules": [],
            "nonResourceRules": [],
            "incomplete": true,
            "evaluationError": "this server's authorizer does not list its rules",
        });
    };
    let resource_rules: Vec<Value> = rules
        .resource_rules
        .iter()
        .map(|r| {
            let mut v =
                json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
            if !r.resource_names.is_empty() {
                v["resourceNames"] = json!(r.resource_names);
            }
            v
        })
        .collect();
    let non_resource_rules: Vec<Value> = rules
        .non_resource_rules
        .iter()
        .map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}))
        .collect();
    json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Policy, PolicyAuthorizer};

    fn authz() -> PolicyAuthorizer {
        PolicyAuthorizer::new(
            "namespaces:\n  - namespace: team-a\n    users: [alice]\n"
                .parse::<Policy>()
                .unwrap(),
        )
    }

    fn alice() -> UserInfo {
        UserInfo {
            name: "alice".into(),
            uid: "a-1".into(),
            groups: vec!["system:authenticated".into()],
        }
    }

    fn review(plural: &str) -> ResourceDef {
        resource_defs()
            .into_iter()
            .find(|d| d.plural == plural)
            .unwrap()
    }

    fn can_i(verb: &str, resource: &str, namespace: &str) -> Value {
        let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "group": "trainer.kubeflow.org", "resource": resource, "namespace": namespace}}});
        answer(&review(ACCESS), &body, &alice(), &authz()).unwrap()
    }

    #[test]
    fn access_reviews_answer_from_the_policy() {
        assert_eq!(
            can_i("create", "trainjobs", "team-a")["status"]["allowed"],
            true
        );
        let no = can_i("create", "trainjobs", "team-b");
        assert_eq!(no["status"]["allowed"], false);
        assert_eq!(
            no["status"]["reason"],
            "namespace \"team-b\" is not granted to the user"
        );
        assert_eq!(no["kind"], "SelfSubjectAccessReview");
        assert_eq!(no["spec"]["resourceAttributes"]["namespace"], "team-b");
        // A namespace is in itself.
        let body = json!({"spec": {"resourceAttributes": {"verb": "get", "resource": "namespaces", "name": "team-a"}}});
        assert_eq!(
            answer(&review(ACCESS), &body, &alice(), &authz()).unwrap()["status"]["allowed"],
            true
        );
        let body = json!({"spec": {"nonResourceAttributes": {"verb": "get", "path": "/metrics"}}});
        assert_eq!(
            answer(&review(ACCESS), &body, &alice(), &authz()).unwrap()["status"]["allowed"],
            false
        );
        let e = answer(&review(ACCESS), &json!({"spec": {}}), &alice(), &authz()).unwrap_err();
        assert_eq!(e.code, 422);
    }

    #[test]
    fn whoami_and_rules() {
        let who = answer(&review(WHOAMI), &json!({}), &alice(), &authz()).unwrap();
        assert_eq!(who["status"]["userInfo"]["username"], "alice");
        assert_eq!(who["status"]["userInfo"]["uid"], "a-1");
        assert_eq!(
            who["status"]["userInfo"]["groups"][0],
            "system:authenticated"
        );
        assert_eq!(who["apiVersion"], "authentication.k8s.io/v1");
        let body = json!({"spec": {"namespace": "team-a"}});
        let rules = answer(&review(RULES), &body, &alice(), &authz()).unwrap();
        assert_eq!(rules["status"]["incomplete"], false);
        assert!(
            rules["status"]["resourceRules"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["resources"][0] == "trainjobs")
        );
        assert!(resource_defs().iter().all(is_review));
    }
}
