//! The web dashboard of `trainhub dev`: its HTML and headers over real
//! HTTPS (`html`), and a real headless Chromium driven over WebDriver
//! (`browser`).

mod browser;
mod html;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;

use crate::common::DevHub;

pub use crate::common::{ADMIN, ALICE};

/// A dev hub started with `args`, with an admin and `alice`, a tenant
/// granted `team-a`; the namespaces `team-a` and `team-b` exist.
pub fn tenants(args: &[&str]) -> DevHub {
    let hub = DevHub::start_args(args, crate::common::tenant_files);
    hub.kubectl_ok(&["create", "namespace", "team-a"]);
    hub.kubectl_ok(&["create", "namespace", "team-b"]);
    hub
}

/// A TrainJob of the built-in `python-distributed` runtime running `script`
/// on one node.
pub fn trainjob_yaml(namespace: &str, name: &str, labels: &[(&str, &str)], script: &str) -> String {
    let mut yaml = format!(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
    );
    if !labels.is_empty() {
        yaml.push_str("  labels:\n");
        for (k, v) in labels {
            yaml.push_str(&format!("    {k}: \"{v}\"\n"));
        }
    }
    yaml.push_str(&format!(
        "spec:\n  runtimeRef:\n    name: python-distributed\n  trainer:\n    numNodes: 1\n    command: [python3, -c, {script:?}]\n    resourcesPerNode:\n      requests:\n        cpu: \"1\"\n        memory: 128Mi\n"
    ));
    yaml
}

/// An HTTPS client of the hub, trusting its CA (HTTP/1.1, one connection
/// per request).
pub struct Http {
    port: u16,
    tls: tokio_rustls::TlsConnector,
}

/// An answer, its body read.
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

impl Http {
    pub fn new(hub: &DevHub) -> Http {
        Http {
            port: hub.port,
            tls: tokio_rustls::TlsConnector::from(hub.tls_client_config()),
        }
    }

    /// Sends a request; `headers` as given (plus Host).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Response<Incoming> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .unwrap();
        let tls = self
            .tls
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        sender.send_request(request).await.unwrap()
    }

    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let response = self.send(method, path, headers, body).await;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// POSTs a form with `headers`.
    pub async fn post_form(&self, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut all = vec![("content-type", "application/x-www-form-urlencoded")];
        all.extend_from_slice(headers);
        self.request("POST", path, &all, body).await
    }

    pub async fn get(&self, path: &str, cookie: &str) -> Answer {
        self.request("GET", path, &[("cookie", cookie)], "").await
    }

    /// Logs in with `token`: the session cookie (`name=value`).
    pub async fn login(&self, token: &str) -> String {
        let answer = self
            .post_form("/dashboard/login", &[], &format!("token={token}"))
            .await;
        assert_eq!(answer.status, 303, "login: {}", answer.body);
        let cookie = answer.header("set-cookie");
        cookie.split(';').next().unwrap().to_string()
    }
}

/// The value of the first `name="csrf"` field of a page.
pub fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a CSRF field");
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// The dashboard and the API server hold each other (the server's routes
/// hold the dashboard); a `Hub` dropped, served or not, must still let go
/// of its store, so the same process can open it again at once (a restart
/// in-process, as the benches and embedders do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_hub_lets_go_of_its_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    // The e2e tests' shared compile cache, so no plugin compiles here.
    std::fs::create_dir_all(crate::common::plugin_cache()).expect("plugin cache");
    std::os::unix::fs::symlink(crate::common::plugin_cache(), data.join("plugin-cache"))
        .expect("cache link");
    // Opening reads no certificate; serving would.
    let config = trainhub::hub::Config::local(
        data,
        dir.path().join("unused.crt"),
        dir.path().join("unused.key"),
    );
    for round in 0..2 {
        let hub = trainhub::hub::Hub::open(config.clone())
            .unwrap_or_else(|e| panic!("open #{round}: {e:#}"));
        let store = std::sync::Arc::downgrade(&hub.store);
        let server = std::sync::Arc::downgrade(&hub.server);
        drop(hub);
        assert_eq!(server.strong_count(), 0, "the API server outlived its hub");
        assert_eq!(store.strong_count(), 0, "the store outlived its hub");
    }
}
