//! Spokes as API objects against the real binaries: `kubectl get spokes`,
//! cordon and drain on `trainhub dev --spokes 2`; revocation and
//! certificate rotation with an external `trainspoke` process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use trainhub_apiserver::pki::CertInfo;

use crate::common::{DevHub, free_port, tail, trainspoke_binary, wait_for};

const ADMIN: &str = "admin-token-0123456789abcdef";
const ALICE: &str = "alice-token-0123456789abcdef";

fn trainctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainctl"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running trainctl")
}

fn trainctl_ok(args: &[&str]) -> String {
    let out = trainctl(args);
    assert!(
        out.status.success(),
        "trainctl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn spoke_object(hub: &DevHub, name: &str) -> Option<Value> {
    let out = hub.kubectl(&["get", "spoke", name, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

async fn eventually<T>(
    what: &str,
    hub: &DevHub,
    extra_log: impl Fn() -> String,
    check: impl FnMut() -> Option<T>,
) -> T {
    wait_for(
        what,
        Duration::from_secs(60),
        || format!("hub log:\n{}\n{}", tail(&hub.log(), 60), extra_log()),
        check,
    )
    .await
}

fn trainjob(name: &str, command: &str) -> String {
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\nspec:\n  runtimeRef:\n    name: python-distributed\n  trainer:\n    numNodes: 1\n    command: [\"sh\", \"-c\", \"{command}\"]\n---\n"
    )
}

fn condition_true(job: &Value, type_: &str) -> bool {
    job["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == "True")
    })
}

fn trainjob_complete(hub: &DevHub, name: &str) -> bool {
    let out = hub.kubectl(&["get", "trainjob", name, "-o", "json"]);
    serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|j| condition_true(&j, "Complete"))
}

/// The spokes the hub's `Placed` events put `job` on.
fn placed_on(hub: &DevHub, job: &str) -> Vec<String> {
    let out = hub.kubectl_ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={job},reason=Placed"),
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            e["message"]
                .as_str()?
                .strip_prefix("Placed on spoke ")?
                .split(' ')
                .next()
                .map(String::from)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spokes_are_listed_and_a_cordoned_spoke_gets_nothing_new_and_drains() {
    let hub = DevHub::start_args(&["--spokes", "2", "--grpc-port", "0"], |dir| {
        // The first line is the dev admin; alice is a tenant.
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{ADMIN},admin,admin,\"system:masters\"\n{ALICE},alice,alice-uid,\"team-a\"\n"),
        )
        .unwrap();
    });
    let kubeconfig = hub.kubeconfig();
    let kubeconfig = kubeconfig.to_str().unwrap();
    let none = String::new;

    // Both local spokes, Connected, with their capacity and certificate.
    let spokes = eventually("both spokes listed Connected", &hub, none, || {
        let out = hub.kubectl(&["get", "spokes", "-o", "json"]);
        let list: Value = serde_json::from_slice(&out.stdout).ok()?;
        let items = list["items"].as_array()?.clone();
        (items.len() == 2
            && items.iter().all(|s| {
                s["status"]["state"] == "Connected"
                    && s["status"]["capacitySummary"] == "cpu=4,memory=8Gi"
            }))
        .then_some(items)
    })
    .await;
    for spoke in &spokes {
        let status = &spoke["status"];
        assert_eq!(status["backend"], "process", "{status}");
        assert_eq!(status["running"], 0, "{status}");
        assert!(
            status["certificate"]["serial"].as_str().is_some(),
            "{status}"
        );
        let not_after: jiff::Timestamp = status["certificate"]["notAfter"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let days = (not_after.as_second() - jiff::Timestamp::now().as_second()) / 86_400;
        assert!(
            (29..=30).contains(&days),
            "30-day spoke certificates: {days}"
        );
        let active = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Active")
            .unwrap();
        assert_eq!(active["status"], "True", "{status}");
        assert!(
            spoke["metadata"]["finalizers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == "trainhub.kubeflow.org/revoke-certificate")
        );
    }
    let table = hub.kubectl_ok(&["get", "sp"]);
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "NAME",
        "STATUS",
        "BACKEND",
        "CAPACITY",
        "FREE",
        "RUNNING",
        "LAST HEARTBEAT",
        "CERT EXPIRES",
        "AGE",
    ] {
        assert!(header.contains(column), "{column} missing: {table}");
    }
    assert!(
        table.contains("spoke-1") && table.contains("Connected"),
        "{table}"
    );
    let wide = hub.kubectl_ok(&["get", "spokes", "-o", "wide"]);
    assert!(
        wide.contains("LABELS") && wide.contains("trainhub.kubeflow.org/spoke=spoke-2"),
        "{wide}"
    );

    // Spokes are for admins: a tenant can neither read nor cordon one.
    for args in [
        &["get", "spokes"][..],
        &[
            "patch",
            "spoke",
            "spoke-1",
            "--type=merge",
            "-p",
            r#"{"spec":{"unschedulable":true}}"#,
        ],
    ] {
        let out = hub.kubectl(&[&["--token", ALICE][..], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("Forbidden"),
            "{args:?}: {stderr}"
        );
    }

    // A spoke's spec is validated: a Status naming the field and the rule.
    let bad = hub.kubectl(&[
        "patch",
        "spoke",
        "spoke-1",
        "--type=merge",
        "-p",
        r#"{"spec":{"unschedulable":"yes"}}"#,
    ]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success()
            && stderr.contains("spec.unschedulable")
            && stderr.contains("boolean"),
        "{stderr}"
    );

    // Cordon spoke-1: everything new goes to spoke-2.
    let out = trainctl_ok(&["spoke", "cordon", "spoke-1", "--kubeconfig", kubeconfig]);
    assert!(out.contains("cordoned"), "{out}");
    eventually("spoke-1 shown cordoned", &hub, none, || {
        let s = spoke_object(&hub, "spoke-1")?;
        (s["status"]["state"] == "Connected,SchedulingDisabled").then_some(())
    })
    .await;
    let jobs = ["cordon-a", "cordon-b", "cordon-c", "cordon-d"];
    let yaml: String = jobs.iter().map(|j| trainjob(j, "true")).collect();
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&yaml));
    for job in jobs {
        eventually(&format!("{job} Complete"), &hub, none, || {
            trainjob_complete(&hub, job).then_some(())
        })
        .await;
        assert_eq!(placed_on(&hub, job), ["spoke-2"], "{job}");
    }

    // Drain spoke-2 while a TrainJob runs there (spoke-1 is uncordoned
    // first, so nothing is stranded): with a short timeout it fails and
    // stays cordoned; then it waits until the run is done.
    trainctl_ok(&["spoke", "uncordon", "spoke-1", "--kubeconfig", kubeconfig]);
    eventually("spoke-1 shown schedulable", &hub, none, || {
        let s = spoke_object(&hub, "spoke-1")?;
        (s["status"]["state"] == "Connected").then_some(())
    })
    .await;
    trainctl_ok(&["spoke", "cordon", "spoke-1", "--kubeconfig", kubeconfig]);
    eventually("spoke-1 shown cordoned again", &hub, none, || {
        let s = spoke_object(&hub, "spoke-1")?;
        (s["status"]["state"] == "Connected,SchedulingDisabled").then_some(())
    })
    .await;
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("drained", "sleep 10")),
    );
    eventually("drained running on spoke-2", &hub, none, || {
        let s = spoke_object(&hub, "spoke-2")?;
        (s["status"]["running"] == 1).then_some(())
    })
    .await;
    trainctl_ok(&["spoke", "uncordon", "spoke-1", "--kubeconfig", kubeconfig]);
    let early = trainctl(&[
        "spoke",
        "drain",
        "spoke-2",
        "--timeout",
        "1s",
        "--kubeconfig",
        kubeconfig,
    ]);
    let stderr = String::from_utf8_lossy(&early.stderr);
    assert!(
        !early.status.success() && stderr.contains("1 TrainJob(s) still running"),
        "{stderr}"
    );
    assert_eq!(
        spoke_object(&hub, "spoke-2").unwrap()["spec"]["unschedulable"],
        true
    );
    let out = trainctl_ok(&[
        "spoke",
        "drain",
        "spoke-2",
        "--timeout",
        "60s",
        "--kubeconfig",
        kubeconfig,
    ]);
    assert!(out.contains("spoke/spoke-2 drained"), "{out}");
    // The run finished where it was: drain does not move it.
    assert_eq!(placed_on(&hub, "drained"), ["spoke-2"]);
    eventually("drained Complete", &hub, none, || {
        trainjob_complete(&hub, "drained").then_some(())
    })
    .await;
    // Anything new goes to spoke-1 now.
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("after-drain", "true")),
    );
    eventually("after-drain placed", &hub, none, || {
        let on = placed_on(&hub, "after-drain");
        (!on.is_empty()).then_some(on)
    })
    .await
    .iter()
    .for_each(|s| assert_eq!(s, "spoke-1"));
}

/// A `trainspoke` process with its certificate files in the hub's `pki/`.
struct ExternalSpoke {
    child: Child,
    log: PathBuf,
}

impl Drop for ExternalSpoke {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ExternalSpoke {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn start_spoke(pki: &Path, work: &Path, name: &str, grpc: u16) -> ExternalSpoke {
    let log = work.join(format!("{name}.log"));
    let child = Command::new(trainspoke_binary())
        .args(["--hub", &format!("https://127.0.0.1:{grpc}")])
        .arg("--ca")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join(format!("{name}.crt")))
        .arg("--key")
        .arg(pki.join(format!("{name}.key")))
        .arg("--work-dir")
        .arg(work.join(name))
        .args(["--heartbeat-seconds", "1", "--run-as-user", "none"])
        // Not the machine's: the test asserts the summary.
        .args(["--capacity", "cpu=4,memory=8Gi"])
        // Below the hub's 3 s worker-lost timeout, as the hub requires.
        .args(["--fence-after-seconds", "2"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting trainspoke");
    ExternalSpoke { child, log }
}

fn serial_in(pki: &Path, name: &str) -> CertInfo {
    CertInfo::from_pem(&std::fs::read_to_string(pki.join(format!("{name}.crt"))).unwrap()).unwrap()
}

/// The serial of the certificate the hub serves on `port` to a new
/// connection.
async fn served_serial(port: u16, ca_pem: &str) -> Option<String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in trainhub_apiserver::tls::parse_certificates("ca", ca_pem).ok()? {
        roots.add(cert).ok()?;
    }
    let config =
        rustls::ClientConfig::builder_with_provider(trainhub_apiserver::tls::crypto_provider())
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let name = rustls_pki_types::ServerName::try_from("localhost").ok()?;
    let tls = connector.connect(name, tcp).await.ok()?;
    let der = tls.get_ref().1.peer_certificates()?.first()?.clone();
    CertInfo::from_der(der.as_ref()).ok().map(|c| c.serial)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_are_used_without_restart_and_a_deleted_spoke_is_revoked() {
    let grpc = free_port();
    let hub = DevHub::start_args(
        &[
            "--spokes",
            "0",
            "--grpc-port",
            &grpc.to_string(),
            "--worker-lost-timeout-seconds",
            "3",
        ],
        |_| {},
    );
    let pki = hub.dir.path().join("pki");
    let pki_arg = pki.to_str().unwrap();
    let work = tempfile::tempdir().unwrap();

    // An admin may create a Spoke ahead of its spoke (here cordoned): the
    // hub adds its finalizer and says it never connected.
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: trainhub.kubeflow.org/v1alpha1\nkind: Spoke\nmetadata:\n  name: ahead-1\nspec:\n  unschedulable: true\n"),
    );
    let ahead = eventually("ahead-1's status", &hub, String::new, || {
        let s = spoke_object(&hub, "ahead-1")?;
        (s["status"]["state"] == "Disconnected,SchedulingDisabled").then_some(s)
    })
    .await;
    assert_eq!(
        ahead["metadata"]["finalizers"][0],
        "trainhub.kubeflow.org/revoke-certificate"
    );
    let connected = ahead["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Connected")
        .unwrap();
    assert_eq!(connected["reason"], "NeverConnected", "{ahead}");
    // Deleting a Spoke that never connected revokes nothing and goes.
    hub.kubectl_ok(&["delete", "spoke", "ahead-1", "--timeout", "30s"]);
    trainctl_ok(&["certs", "spoke", "ext-1", "--dir", pki_arg]);
    let first = serial_in(&pki, "ext-1");
    let spoke = start_spoke(&pki, work.path(), "ext-1", grpc);
    let spoke_log = || format!("spoke log:\n{}", tail(&spoke.log(), 30));
    eventually(
        "ext-1 Connected with its certificate",
        &hub,
        spoke_log,
        || {
            let s = spoke_object(&hub, "ext-1")?;
            (s["status"]["state"] == "Connected"
                && s["status"]["certificate"]["serial"] == first.serial.as_str())
            .then_some(())
        },
    )
    .await;

    // The spoke's certificate renewed on disk (5 days: the hub warns): the
    // spoke reconnects with it, and the Spoke shows the new expiry.
    let out = trainctl_ok(&["certs", "renew", "ext-1", "--dir", pki_arg, "--days", "5"]);
    assert!(out.contains("renewed"), "{out}");
    let renewed = serial_in(&pki, "ext-1");
    assert_ne!(renewed.serial, first.serial);
    eventually(
        "ext-1 reconnected with the renewed certificate",
        &hub,
        spoke_log,
        || {
            let s = spoke_object(&hub, "ext-1")?;
            let not_after: jiff::Timestamp = s["status"]["certificate"]["notAfter"]
                .as_str()?
                .parse()
                .ok()?;
            (s["status"]["state"] == "Connected"
                && s["status"]["certificate"]["serial"] == renewed.serial.as_str()
                && not_after.as_second() == renewed.not_after)
                .then_some(())
        },
    )
    .await;
    assert!(
        spoke.log().contains("certificate files changed"),
        "{}",
        spoke_log()
    );
    eventually("the expiry warning", &hub, spoke_log, || {
        hub.log().contains("expires within 7 days").then_some(())
    })
    .await;

    // The hub's certificate renewed on disk: a new connection gets it.
    let ca_pem = std::fs::read_to_string(pki.join("ca.crt")).unwrap();
    let before = served_serial(hub.port, &ca_pem)
        .await
        .expect("a TLS connection");
    assert_eq!(before, serial_in(&pki, "hub").serial);
    trainctl_ok(&["certs", "renew", "hub", "--dir", pki_arg]);
    let hub_renewed = serial_in(&pki, "hub");
    assert_ne!(hub_renewed.serial, before);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if served_serial(hub.port, &ca_pem).await.as_deref() == Some(hub_renewed.serial.as_str()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hub still serves {before}\n{}",
            tail(&hub.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // kubectl (a new connection, verifying against the CA) still works.
    hub.kubectl_ok(&["get", "spokes"]);

    // A TrainJob running on it when it is revoked follows the worker-lost
    // path: requeued after the timeout, placed again once a spoke can take
    // it.
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob("on-revoked", "sleep 30")),
    );
    eventually("on-revoked running on ext-1", &hub, spoke_log, || {
        let s = spoke_object(&hub, "ext-1")?;
        (s["status"]["running"] == 1).then_some(())
    })
    .await;

    // Deleting the Spoke revokes its certificate: the session ends, its
    // reconnects are refused (said on both sides), and no Spoke comes back.
    hub.kubectl_ok(&["delete", "spoke", "ext-1", "--timeout", "30s"]);
    eventually("ext-1 refused as revoked", &hub, spoke_log, || {
        (spoke.log().matches("was revoked").count() >= 2).then_some(())
    })
    .await;
    assert!(
        hub.log()
            .contains("refused a session: the spoke's certificate is revoked"),
        "{}",
        tail(&hub.log(), 40)
    );
    assert!(
        spoke_object(&hub, "ext-1").is_none(),
        "the revoked spoke's Spoke came back"
    );

    // Past the worker-lost timeout its TrainJob is queued again.
    eventually("on-revoked requeued", &hub, spoke_log, || {
        let metrics = hub.kubectl_ok(&["get", "--raw", "/metrics"]);
        metrics
            .lines()
            .any(|l| l.trim() == "trainhub_queue_depth 1")
            .then_some(())
    })
    .await;

    // A new certificate (a new serial) for the same name may join again.
    trainctl_ok(&["certs", "spoke", "ext-1", "--dir", pki_arg]);
    let reissued = serial_in(&pki, "ext-1");
    eventually("ext-1 back with a new certificate", &hub, spoke_log, || {
        let s = spoke_object(&hub, "ext-1")?;
        (s["status"]["state"] == "Connected"
            && s["status"]["certificate"]["serial"] == reissued.serial.as_str())
        .then_some(())
    })
    .await;
    eventually(
        "on-revoked placed again (placement 2)",
        &hub,
        spoke_log,
        || (placed_on(&hub, "on-revoked").len() == 2).then_some(()),
    )
    .await;
    hub.kubectl_ok(&["delete", "trainjob", "on-revoked", "--timeout", "30s"]);
}
