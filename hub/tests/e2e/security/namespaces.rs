//! Tenants are namespaces: real kubectl against `trainhub dev`, as an admin
//! and as a tenant (`alice`, granted `team-a`) trying what a hostile tenant
//! would: reading other namespaces, creating or labelling namespaces,
//! placing objects where no namespace is, names the store cannot hold, a
//! priority of its own choosing.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::{ALICE, DevHub, tail, tenant_files};

fn tenants() -> DevHub {
    // The first line is the dev admin; alice works in team-a only.
    DevHub::start_args(&["--spokes", "1"], tenant_files)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn alice(hub: &DevHub, args: &[&str]) -> Output {
    let mut all = vec!["--token", ALICE];
    all.extend_from_slice(args);
    hub.kubectl(&all)
}

fn alice_stdin(hub: &DevHub, args: &[&str], stdin: &str) -> Output {
    let mut all = vec!["--token", ALICE];
    all.extend_from_slice(args);
    hub.kubectl_stdin(&all, Some(stdin))
}

/// kubectl that must fail; returns its stderr.
fn refused(hub: &DevHub, out: Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} succeeded:\n{}\nhub log tail:\n{}",
        text(&out.stdout),
        tail(&hub.log(), 20)
    );
    text(&out.stderr)
}

/// The column names of kubectl's table `table`.
fn header(table: &str) -> Vec<&str> {
    table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect()
}

fn trainjob(name: &str, namespace: &str, extra_metadata: &str, command: &str) -> String {
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name:?}\n  namespace: {namespace:?}\n{extra_metadata}spec:\n  runtimeRef:\n    name: python-distributed\n  trainer:\n    numNodes: 1\n    command: [\"sh\", \"-c\", {command:?}]\n"
    )
}

/// Polls `check` every 100 ms until it holds; fails after `timeout` with
/// the hub's log.
fn eventually(hub: &DevHub, what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; hub log tail:\n{}",
            tail(&hub.log(), 40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tenants_are_namespaces_and_cannot_reach_past_their_own() {
    let hub = tenants();

    // Namespaces, as an admin.
    for ns in ["team-a", "team-b"] {
        let out = hub.kubectl_ok(&["create", "namespace", ns]);
        assert_eq!(out.trim(), format!("namespace/{ns} created"));
    }
    let table = hub.kubectl_ok(&["get", "ns"]);
    assert_eq!(header(&table), ["NAME", "STATUS", "AGE"], "{table}");
    for ns in ["default", "kubeflow-system", "team-a", "team-b"] {
        assert!(
            table
                .lines()
                .any(|l| l.split_whitespace().take(2).eq([ns, "Active"])),
            "{ns} missing from:\n{table}"
        );
    }
    let out = hub.kubectl_ok(&["label", "ns", "team-a", "tier=gold"]);
    assert_eq!(out.trim(), "namespace/team-a labeled");
    let gold = hub.kubectl_ok(&["get", "ns", "-l", "tier=gold", "-o", "name"]);
    assert_eq!(gold.trim(), "namespace/team-a");
    let by_name = hub.kubectl_ok(&[
        "get",
        "ns",
        "-l",
        "kubernetes.io/metadata.name=team-b",
        "-o",
        "name",
    ]);
    assert_eq!(by_name.trim(), "namespace/team-b");

    // A tenant sees its own namespace only, and changes none.
    let out = alice(&hub, &["get", "ns", "-o", "name"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "namespace/team-a");
    let out = alice(&hub, &["get", "ns", "team-a"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let e = refused(&hub, alice(&hub, &["get", "ns", "team-b"]), "get ns team-b");
    assert!(
        e.contains("(Forbidden)")
            && e.contains("User \"alice\" cannot get resource \"namespaces\""),
        "{e}"
    );
    let e = refused(
        &hub,
        alice(&hub, &["create", "namespace", "mine"]),
        "tenant creates a namespace",
    );
    assert!(
        e.contains("namespaces is forbidden: User \"alice\" cannot create resource \"namespaces\" in API group \"\" at the cluster scope"),
        "{e}"
    );
    let e = refused(
        &hub,
        alice(
            &hub,
            &["label", "ns", "team-a", "tier=platinum", "--overwrite"],
        ),
        "tenant labels its namespace",
    );
    assert!(e.contains("cannot patch resource \"namespaces\""), "{e}");
    let e = refused(
        &hub,
        alice(&hub, &["delete", "ns", "team-a"]),
        "tenant deletes its namespace",
    );
    assert!(e.contains("cannot delete resource \"namespaces\""), "{e}");

    // kubectl auth can-i / whoami answer from the policy.
    let out = alice(
        &hub,
        &["auth", "can-i", "create", "trainjobs", "-n", "team-a"],
    );
    assert_eq!(text(&out.stdout).trim(), "yes", "{}", text(&out.stderr));
    assert!(out.status.success());
    let out = alice(
        &hub,
        &["auth", "can-i", "create", "trainjobs", "-n", "team-b"],
    );
    // kubectl prints the policy's reason after "no".
    assert_eq!(
        text(&out.stdout).trim(),
        "no - namespace \"team-b\" is not granted to the user",
        "{}",
        text(&out.stderr)
    );
    assert!(!out.status.success());
    let out = alice(&hub, &["auth", "can-i", "create", "namespaces"]);
    assert!(text(&out.stdout).starts_with("no"), "{}", text(&out.stderr));
    assert!(!out.status.success());
    let out = hub.kubectl(&["auth", "can-i", "delete", "namespaces"]);
    assert_eq!(text(&out.stdout).trim(), "yes", "{}", text(&out.stderr));
    let out = alice(&hub, &["auth", "can-i", "--list", "-n", "team-a"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout)
            .lines()
            .any(|l| l.starts_with("trainjobs.trainer.kubeflow.org ")),
        "{}",
        text(&out.stdout)
    );
    let out = alice(&hub, &["auth", "whoami"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let who = text(&out.stdout);
    assert!(
        who.contains("alice") && who.contains("team-a") && who.contains("system:authenticated"),
        "{who}"
    );

    // kubectl version: a Kubernetes level, no skew warning.
    let out = hub.kubectl(&["version"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("Server Version: v1.33.0+trainhub-"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(text(&out.stderr), "", "kubectl version warned");

    // Objects only in namespaces that exist, with names the store can hold.
    let e = refused(
        &hub,
        hub.kubectl_stdin(
            &["create", "-f", "-"],
            Some(&trainjob("lost", "nope", "", "true")),
        ),
        "TrainJob into a missing namespace",
    );
    assert!(
        e.contains("Error from server (NotFound)") && e.contains("namespaces \"nope\" not found"),
        "{e}"
    );
    let e = refused(
        &hub,
        hub.kubectl_stdin(
            &["create", "-f", "-"],
            Some(&trainjob("a|b", "team-a", "", "true")),
        ),
        "TrainJob named a|b",
    );
    assert!(
        e.contains("is invalid: metadata.name: Invalid value: \"a|b\": a lowercase RFC 1123 subdomain must consist of"),
        "{e}"
    );
    let e = refused(
        &hub,
        hub.kubectl(&["create", "namespace", "team|c"]),
        "namespace named team|c",
    );
    assert!(
        e.contains(
            "metadata.name: Invalid value: \"team|c\": a lowercase RFC 1123 label must consist of"
        ),
        "{e}"
    );

    // A tenant cannot choose its priority; without it, its job is fine.
    let prio = "  annotations:\n    trainhub.kubeflow.org/priority: \"1000\"\n";
    let e = refused(
        &hub,
        alice_stdin(
            &hub,
            &["create", "-f", "-"],
            &trainjob("urgent", "team-a", prio, "true"),
        ),
        "tenant sets the priority annotation",
    );
    assert!(
        e.contains("(Forbidden)")
            && e.contains("may set the annotation trainhub.kubeflow.org/priority"),
        "{e}"
    );
    let out = alice_stdin(
        &hub,
        &["create", "-f", "-"],
        &trainjob("modest", "team-a", "", "true"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let e = refused(
        &hub,
        alice(
            &hub,
            &[
                "annotate",
                "trainjob",
                "modest",
                "-n",
                "team-a",
                "trainhub.kubeflow.org/priority=1000",
            ],
        ),
        "tenant annotates its priority",
    );
    assert!(e.contains("(Forbidden)"), "{e}");
    // An admin may.
    hub.kubectl_ok(&[
        "annotate",
        "trainjob",
        "modest",
        "-n",
        "team-a",
        "trainhub.kubeflow.org/priority=1000",
    ]);
    // Other namespaces stay out of reach.
    let e = refused(
        &hub,
        alice_stdin(
            &hub,
            &["create", "-f", "-"],
            &trainjob("intruder", "team-b", "", "true"),
        ),
        "tenant writes into team-b",
    );
    assert!(e.contains("(Forbidden)"), "{e}");
}

#[test]
fn deleting_a_namespace_stops_its_runs_and_removes_it() {
    let hub = tenants();
    hub.kubectl_ok(&["create", "namespace", "team-b"]);
    // A running job held by a finalizer keeps the namespace Terminating.
    let marker = format!("ns-e2e-{}", std::process::id());
    let script = format!("sleep 600; echo {marker}");
    let held = "  finalizers: [\"example.com/hold\"]\n";
    hub.kubectl_stdin(
        &["create", "-f", "-"],
        Some(&trainjob("held", "team-b", held, &script)),
    );
    hub.kubectl_stdin(
        &["create", "-f", "-"],
        Some(&trainjob("plain", "team-b", "", "sleep 600")),
    );
    let running = || {
        std::process::Command::new("pgrep")
            .args(["-f", &marker])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    eventually(
        &hub,
        "the held job's run",
        Duration::from_secs(120),
        running,
    );

    let out = hub.kubectl_ok(&["delete", "namespace", "team-b", "--wait=false"]);
    assert!(out.contains("deleted"), "{out}");
    let phase = hub.kubectl_ok(&[
        "get",
        "namespace",
        "team-b",
        "-o",
        "jsonpath={.status.phase}",
    ]);
    assert_eq!(phase, "Terminating");
    let e = refused(
        &hub,
        hub.kubectl_stdin(
            &["create", "-f", "-"],
            Some(&trainjob("late", "team-b", "", "true")),
        ),
        "TrainJob into a terminating namespace",
    );
    assert!(
        e.contains("(Forbidden)")
            && e.contains(
                "unable to create new content in namespace team-b because it is being terminated"
            ),
        "{e}"
    );
    // Its TrainJobs go through their deletion: runs stopped, the plain one
    // gone, the held one waiting for its finalizer.
    eventually(&hub, "the run stopped", Duration::from_secs(60), || {
        !running()
    });
    eventually(&hub, "plain deleted", Duration::from_secs(30), || {
        !hub.kubectl(&["get", "trainjob", "plain", "-n", "team-b"])
            .status
            .success()
    });
    let marked = hub.kubectl_ok(&[
        "get",
        "trainjob",
        "held",
        "-n",
        "team-b",
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    ]);
    assert!(!marked.is_empty(), "held is not being deleted");
    hub.kubectl_ok(&[
        "patch",
        "trainjob",
        "held",
        "-n",
        "team-b",
        "--type=merge",
        "-p",
        "{\"metadata\":{\"finalizers\":null}}",
    ]);
    eventually(&hub, "team-b removed", Duration::from_secs(30), || {
        let out = hub.kubectl(&["get", "namespace", "team-b"]);
        !out.status.success() && text(&out.stderr).contains("(NotFound)")
    });
    // default and kubeflow-system stay.
    for ns in ["default", "kubeflow-system"] {
        let e = refused(
            &hub,
            hub.kubectl(&["delete", "namespace", ns]),
            "deleting a protected namespace",
        );
        assert!(e.contains("this namespace may not be deleted"), "{e}");
    }
}

#[test]
fn namespaces_of_an_older_store_are_created_at_start() {
    let mut hub = DevHub::start();
    hub.kubectl_ok(&["create", "namespace", "legacy"]);
    hub.kubectl_stdin(
        &["create", "-f", "-"],
        Some(&trainjob("old", "legacy", "", "true")),
    );
    hub.kill();
    // As a store written before namespaces were served: no Namespace object.
    {
        use trainhub_apiserver::store::{Key, Op, RedbStore, Store};
        let store =
            RedbStore::open(&hub.dir.path().join("store.redb"), 100).expect("opening the store");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(store.commit(vec![Op::Remove {
            key: Key::new("namespaces", None, "legacy"),
        }]))
        .expect("removing the namespace");
        assert!(store.get(&Key::new("namespaces", None, "legacy")).is_none());
    }
    hub.start_again();
    let phase = hub.kubectl_ok(&[
        "get",
        "namespace",
        "legacy",
        "-o",
        "jsonpath={.status.phase}",
    ]);
    assert_eq!(phase, "Active");
    hub.kubectl_ok(&["get", "trainjob", "old", "-n", "legacy"]);
}

#[test]
fn a_namespaces_resource_quota_bounds_how_many_trainjobs_a_tenant_keeps() {
    const COUNT: &str = "count/trainjobs.trainer.kubeflow.org";
    let hub = tenants();
    hub.kubectl_ok(&["create", "namespace", "team-a"]);
    let suspended = |name: &str| trainjob(name, "team-a", "", "sleep 60") + "  suspend: true\n";

    // An admin sets the quota with kubectl's own verb; what the hub cannot
    // count is refused by field and rule; a tenant may not set one.
    let out = hub.kubectl_ok(&[
        "create",
        "quota",
        "trainjobs",
        &format!("--hard={COUNT}=2"),
        "-n",
        "team-a",
    ]);
    assert_eq!(out.trim(), "resourcequota/trainjobs created");
    let e = refused(
        &hub,
        hub.kubectl(&[
            "create",
            "quota",
            "cpu",
            "--hard=requests.cpu=4",
            "-n",
            "team-a",
        ]),
        "a compute quota",
    );
    assert!(
        e.contains("ResourceQuota \"cpu\" is invalid: spec.hard: Invalid value: \"requests.cpu\": the hub's quotas count objects"),
        "{e}"
    );
    let e = refused(
        &hub,
        alice(
            &hub,
            &[
                "create",
                "quota",
                "mine",
                &format!("--hard={COUNT}=100"),
                "-n",
                "team-a",
            ],
        ),
        "alice's own quota",
    );
    assert!(
        e.contains("User \"alice\" cannot create resource \"resourcequotas\""),
        "{e}"
    );

    // The tenant sees it, counted, in kubectl's columns.
    eventually(&hub, "the quota counted", Duration::from_secs(20), || {
        let out = alice(&hub, &["get", "quota", "-n", "team-a"]);
        text(&out.stdout).contains(&format!("{COUNT}: 0/2"))
    });
    let table = text(&alice(&hub, &["get", "quota", "-n", "team-a"]).stdout);
    assert_eq!(
        header(&table),
        ["NAME", "AGE", "REQUEST", "LIMIT"],
        "{table}"
    );

    // Two TrainJobs fit; the third is refused as kube-apiserver words it.
    for name in ["a", "b"] {
        let out = alice_stdin(&hub, &["create", "-f", "-"], &suspended(name));
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }
    let e = refused(
        &hub,
        alice_stdin(&hub, &["create", "-f", "-"], &suspended("c")),
        "a third TrainJob",
    );
    assert!(
        e.contains(&format!(
            "Error from server (Forbidden): error when creating \"STDIN\": trainjobs.trainer.kubeflow.org \"c\" is forbidden: exceeded quota: trainjobs, requested: {COUNT}=1, used: {COUNT}=2, limited: {COUNT}=2"
        )),
        "{e}"
    );
    let described = text(&alice(&hub, &["describe", "quota", "trainjobs", "-n", "team-a"]).stdout);
    let row: Vec<&str> = described
        .lines()
        .find(|l| l.starts_with(COUNT))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row, [COUNT, "2", "2"], "{described}");

    // Deleting one makes room again once the deletion is counted.
    let out = alice(&hub, &["delete", "trainjob", "a", "-n", "team-a"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    eventually(
        &hub,
        "room for a third TrainJob",
        Duration::from_secs(20),
        || {
            alice_stdin(&hub, &["create", "-f", "-"], &suspended("c"))
                .status
                .success()
        },
    );
    let out = text(&alice(&hub, &["get", "quota", "-n", "team-a"]).stdout);
    assert!(out.contains(&format!("{COUNT}: 2/2")), "{out}");
}
