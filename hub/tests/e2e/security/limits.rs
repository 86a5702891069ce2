//! Bounded requests: a hostile tenant's patch bomb, depth bomb, oversized
//! body, connection flood and slowloris client, each refused with a clear
//! error while the hub keeps serving kubectl.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::common::{DevHub, tail};

const NS_TRAINJOBS: &str = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs";

fn trainjob_yaml(name: &str) -> String {
    format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\nspec:\n  runtimeRef:\n    name: torch-distributed\n"
    )
}

/// The hub's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib(hub: &DevHub) -> u64 {
    let pid = hub.pid().expect("the hub runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Writes `text` to a file in the hub's data directory; returns its path.
fn file(hub: &DevHub, name: &str, text: &[u8]) -> String {
    let path = hub.dir.path().join(name);
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(text))
        .expect("writing a test file");
    path.to_string_lossy().into_owned()
}

/// kubectl that must fail; returns its stderr.
fn kubectl_fails(hub: &DevHub, args: &[&str]) -> String {
    let out = hub.kubectl(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "kubectl {args:?} succeeded:\n{}\nhub log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        tail(&hub.log(), 30)
    );
    stderr
}

fn kubectl_still_works(hub: &DevHub) {
    let table = hub.kubectl_ok(&["get", "trainjobs"]);
    assert!(table.contains("victim"), "{table}");
}

#[test]
fn a_json_patch_bomb_is_refused_while_memory_stays_small() {
    let hub = DevHub::start();
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&trainjob_yaml("victim")));
    hub.kubectl_ok(&["get", "trainjob", "victim"]);
    let before = peak_rss_kib(&hub);
    // The issue's bomb: a 64 KiB string in a list, the list copied into
    // itself 14 times (1 GiB if applied).
    let blob = "x".repeat(64 * 1024);
    let mut ops = vec![serde_json::json!({"op": "add", "path": "/spec/bomb", "value": [blob]})];
    for _ in 0..14 {
        ops.push(serde_json::json!({"op": "copy", "from": "/spec/bomb", "path": "/spec/bomb/-"}));
    }
    let patch = file(
        &hub,
        "bomb.json",
        serde_json::to_string(&ops).unwrap().as_bytes(),
    );
    let stderr = kubectl_fails(
        &hub,
        &[
            "patch",
            "trainjob",
            "victim",
            "--type",
            "json",
            "--patch-file",
            &patch,
        ],
    );
    assert!(
        stderr.contains("RequestEntityTooLarge") && stderr.contains("3145728 bytes"),
        "{stderr}"
    );
    let after = peak_rss_kib(&hub);
    assert!(
        after < before + 200 * 1024,
        "the hub's peak memory grew from {before} KiB to {after} KiB"
    );
    // The TrainJob is untouched and kubectl works.
    let yaml = hub.kubectl_ok(&["get", "trainjob", "victim", "-o", "yaml"]);
    assert!(!yaml.contains("bomb"), "{yaml}");
    kubectl_still_works(&hub);
}

/// A TrainJob as JSON whose spec holds `levels` nested lists.
fn deep_trainjob(name: &str, levels: usize) -> String {
    format!(
        r#"{{"apiVersion":"trainer.kubeflow.org/v1alpha1","kind":"TrainJob","metadata":{{"name":"{name}"}},"spec":{{"runtimeRef":{{"name":"torch-distributed"}},"deep":{}1{}}}}}"#,
        "[".repeat(levels),
        "]".repeat(levels)
    )
}

#[test]
fn a_depth_bomb_is_refused_and_the_hub_restarts_cleanly() {
    let mut hub = DevHub::start();
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&trainjob_yaml("victim")));
    for (name, levels) in [("deep", 200), ("deeper", 100_000)] {
        let body = file(
            &hub,
            &format!("{name}.json"),
            deep_trainjob(name, levels).as_bytes(),
        );
        let stderr = kubectl_fails(&hub, &["create", "--raw", NS_TRAINJOBS, "-f", &body]);
        assert!(
            stderr.contains("nested too deeply") && stderr.contains("at most 100 levels"),
            "{levels} levels: {stderr}"
        );
    }
    // Through a merge patch and server-side apply (YAML) too.
    let patch = format!(
        r#"{{"spec":{{"deep":{}1{}}}}}"#,
        "[".repeat(150),
        "]".repeat(150)
    );
    let patch = file(&hub, "deep-patch.json", patch.as_bytes());
    let stderr = kubectl_fails(
        &hub,
        &[
            "patch",
            "trainjob",
            "victim",
            "--type",
            "merge",
            "--patch-file",
            &patch,
        ],
    );
    assert!(stderr.contains("nested too deeply"), "{stderr}");
    let mut yaml = trainjob_yaml("victim");
    yaml.push_str("  deep:\n");
    for i in 0..150 {
        yaml.push_str(&format!("{}- \n", "  ".repeat(i + 2)));
    }
    let out = hub.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&yaml));
    assert!(!out.status.success(), "a 150-level apply was accepted");
    // An object at the limit is stored (its managed fields keep the
    // nesting) and the hub reads it back after a restart.
    let mut fields = String::from("{}");
    for _ in 0..93 {
        fields = format!(r#"{{"f:a":{fields}}}"#);
    }
    let at_limit = format!(
        r#"{{"apiVersion":"trainer.kubeflow.org/v1alpha1","kind":"TrainJob","metadata":{{"name":"at-limit","managedFields":[{{"manager":"deep","operation":"Update","apiVersion":"trainer.kubeflow.org/v1alpha1","fieldsType":"FieldsV1","fieldsV1":{fields}}}]}},"spec":{{"runtimeRef":{{"name":"torch-distributed"}}}}}}"#
    );
    let body = file(&hub, "at-limit.json", at_limit.as_bytes());
    hub.kubectl_ok(&["create", "--raw", NS_TRAINJOBS, "-f", &body]);
    let stored_depth = |hub: &DevHub| {
        let json = hub.kubectl_ok(&[
            "get",
            "trainjob",
            "at-limit",
            "-o",
            "json",
            "--show-managed-fields",
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        trainhub_apiserver::limits::depth(&v)
    };
    let before = stored_depth(&hub);
    assert!(before >= 95, "the stored object is {before} deep");
    hub.restart();
    kubectl_still_works(&hub);
    assert_eq!(stored_depth(&hub), before);
}

#[test]
fn a_body_over_3_mib_is_413() {
    let hub = DevHub::start();
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&trainjob_yaml("victim")));
    let big = format!(
        r#"{{"apiVersion":"trainer.kubeflow.org/v1alpha1","kind":"TrainJob","metadata":{{"name":"big","annotations":{{"a":"{}"}}}},"spec":{{"runtimeRef":{{"name":"torch-distributed"}}}}}}"#,
        "x".repeat(3 * 1024 * 1024 + 1)
    );
    let body = file(&hub, "big.json", big.as_bytes());
    let stderr = kubectl_fails(&hub, &["create", "--raw", NS_TRAINJOBS, "-f", &body]);
    assert!(
        stderr.contains("RequestEntityTooLarge") || stderr.contains("Request entity too large"),
        "{stderr}"
    );
    assert!(stderr.contains("3145728"), "{stderr}");
    kubectl_still_works(&hub);
}

/// A TCP connection to the hub from `source` (another loopback address is
/// another client).
async fn connect_from(hub: &DevHub, source: IpAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket
        .connect(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), hub.port))
        .await
}

/// Whether the server closed `tcp` within `wait` (EOF or reset).
async fn closed_within(tcp: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(wait, tcp.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => false,
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_per_client_cap_are_closed_while_kubectl_works() {
    let hub = DevHub::start_args(
        &["--spokes", "0", "--max-connections-per-client", "16"],
        |_| {},
    );
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&trainjob_yaml("victim")));
    // A flood from 127.0.0.2; kubectl connects from 127.0.0.1.
    let flooder = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(connect_from(&hub, flooder).await.expect("connect"));
    }
    let mut refused = 0;
    for _ in 0..24 {
        let mut extra = connect_from(&hub, flooder).await.expect("connect");
        if closed_within(&mut extra, Duration::from_secs(5)).await {
            refused += 1;
        }
    }
    assert_eq!(
        refused, 24,
        "every connection past the cap is closed at once"
    );
    // The first 16 are still open (until the handshake timeout).
    for tcp in held.iter_mut().take(4) {
        assert!(!closed_within(tcp, Duration::from_millis(200)).await);
    }
    let h = &hub;
    tokio::task::block_in_place(|| kubectl_still_works(h));
    // Once the flood is gone, that address may connect again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = connect_from(&hub, flooder).await.expect("connect");
        if !closed_within(&mut again, Duration::from_millis(300)).await {
            break;
        }
        assert!(Instant::now() < deadline, "the address stayed refused");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_is_cut_off_while_kubectl_works() {
    let hub = DevHub::start_args(
        &["--spokes", "0", "--http-header-read-timeout", "2s"],
        |_| {},
    );
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&trainjob_yaml("victim")));
    let tcp = connect_from(&hub, IpAddr::V4(Ipv4Addr::LOCALHOST))
        .await
        .expect("connect");
    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
    let mut tls = tokio_rustls::TlsConnector::from(hub.tls_client_config())
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    // Headers, one byte at a time, never finished.
    let started = Instant::now();
    let header = b"GET /version HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
    let mut cut_off = None;
    for &byte in header.iter().chain(std::iter::repeat(&b'a')) {
        if tls.write_all(&[byte]).await.is_err() || tls.flush().await.is_err() {
            cut_off = Some(started.elapsed());
            break;
        }
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(100), tls.read(&mut buf)).await {
            // A 408 or a close: either way, cut off.
            Ok(Ok(_)) | Ok(Err(_)) => {
                cut_off = Some(started.elapsed());
                break;
            }
            Err(_) => {}
        }
        if started.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    let cut_off = cut_off.expect("the slow client was never cut off");
    assert!(
        cut_off >= Duration::from_millis(1500) && cut_off < Duration::from_secs(10),
        "cut off after {cut_off:?}, the header read timeout is 2 s"
    );
    let h = &hub;
    tokio::task::block_in_place(|| kubectl_still_works(h));
}
