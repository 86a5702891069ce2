//! Kubeconfig files that point kubectl and the Kubernetes clients at the hub.
//!
//! One cluster, one user, one context (named after the cluster), which is
//! the current context. Credentials are embedded (`certificate-authority-data`,
//! `token` or `client-certificate-data`/`client-key-data`), so the file
//! stands alone and is written with mode 0600.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::pki::write_file_atomically;

/// What a kubeconfig says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeconfigParams {
    /// Names the cluster entry and the context.
    pub cluster_name: String,
    /// `https://host:port`.
    pub server_url: String,
    /// The CA that signed the server's certificate.
    pub ca_pem: String,
    pub user_name: String,
    /// A bearer token from the hub's tokens file …
    pub token: Option<String>,
    /// … or a client certificate and its key (both or neither).
    pub client_cert_pem: Option<String>,
    pub client_key_pem: Option<String>,
    /// The context's default namespace.
    pub namespace: Option<String>,
}

/// Why a kubeconfig could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("kubeconfig {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
}

/// A kubeconfig (`apiVersion: v1`, `kind: Config`): the subset the hub
/// writes, and that reading one back needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kubeconfig {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    pub clusters: Vec<NamedCluster>,
    pub users: Vec<NamedUser>,
    pub contexts: Vec<NamedContext>,
    #[serde(rename = "current-context")]
    pub current_context: String,
    #[serde(default)]
    pub preferences: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedCluster {
    pub name: String,
    pub cluster: Cluster,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    pub server: String,
    #[serde(
        rename = "certificate-authority-data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub certificate_authority_data: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedUser {
    pub name: String,
    pub user: AuthInfo,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(
        rename = "client-certificate-data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_certificate_data: Option<String>,
    #[serde(
        rename = "client-key-data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_key_data: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedContext {
    pub name: String,
    pub context: Context,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    pub cluster: String,
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

fn required(field: &'static str, value: &str) -> Result<(), KubeconfigError> {
    if value.is_empty() {
        return Err(KubeconfigError::Invalid {
            field,
            message: "Required value".into(),
        });
    }
    Ok(())
}

impl Kubeconfig {
    /// The kubeconfig `params` describe.
    ///
    /// # Errors
    ///
    /// A required field is empty, the server URL is not `https://`, or the
    /// user has no credential (or a certificate without its key).
    pub fn from_params(params: &KubeconfigParams) -> Result<Kubeconfig, KubeconfigError> {
        required("cluster name", &params.cluster_name)?;
        required("server", &params.server_url)?;
        required("certificate authority", &params.ca_pem)?;
        required("user name", &params.user_name)?;
        if !params.server_url.starts_with("https://") {
            return Err(KubeconfigError::Invalid {
                field: "server",
                message: format!("{:?} must be an https:// URL", params.server_url),
            });
        }
        let user = match (
            &params.token,
            &params.client_cert_pem,
            &params.client_key_pem,
        ) {
            (token, Some(cert), Some(key)) => AuthInfo {
                token: token.clone().filter(|t| !t.is_empty()),
                client_certificate_data: Some(STANDARD.encode(cert)),
                client_key_data: Some(STANDARD.encode(key)),
            },
            (_, Some(_), None) | (_, None, Some(_)) => {
                return Err(KubeconfigError::Invalid {
                    field: "user",
                    message: "a client certificate needs its key, and a key its certificate".into(),
                });
            }
            (Some(token), None, None) if !token.is_empty() => AuthInfo {
                token: Some(token.clone()),
                ..AuthInfo::default()
            },
            _ => {
                return Err(KubeconfigError::Invalid {
                    field: "user",
                    message: "needs a token or a client certificate and key".into(),
                });
            }
        };
        let name = params.cluster_name.clone();
        Ok(Kubeconfig {
            api_version: "v1".into(),
            kind: "Config".into(),
            clusters: vec![NamedCluster {
                name: name.clone(),
                cluster: Cluster {
                    server: params.server_url.clone(),
                    certificate_authority_data: Some(STANDARD.encode(&params.ca_pem)),
                },
            }],
            users: vec![NamedUser {
                name: params.user_name.clone(),
                user,
            }],
            contexts: vec![NamedContext {
                name: name.clone(),
                context: Context {
                    cluster: name.clone(),
                    user: params.user_name.clone(),
                    namespace: params.namespace.clone().filter(|ns| !ns.is_empty()),
                },
            }],
            current_context: name,
            preferences: serde_json::Map::new(),
        })
    }

    /// Writes the kubeconfig `params` describe to `path`, atomically and
    /// with mode 0600, replacing any file there. Safe to repeat.
    pub fn write(path: impl AsRef<Path>, params: &KubeconfigParams) -> Result<(), KubeconfigError> {
        let path = path.as_ref();
        let yaml = Self::from_params(params)?.to_yaml()?;
        write_file_atomically(path, yaml.as_bytes(), 0o600).map_err(|source| KubeconfigError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    pub fn to_yaml(&self) -> Result<String, KubeconfigError> {
        serde_saphyr::to_string(self).map_err(|e| KubeconfigError::Invalid {
            field: "document",
            message: e.to_string(),
        })
    }

    /// Reads a kubeconfig (YAML or JSON).
    pub fn read(path: impl AsRef<Path>) -> Result<Kubeconfig, KubeconfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| KubeconfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        serde_saphyr::from_str(&text).map_err(|e| KubeconfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Ca;

    fn params(ca: &Ca) -> KubeconfigParams {
        KubeconfigParams {
            cluster_name: "trainhub".into(),
            server_url: "https://127.0.0.1:6443".into(),
            ca_pem: ca.cert_pem().to_string(),
            user_name: "alice".into(),
            token: Some("s3cret".into()),
            namespace: Some("team-a".into()),
            ..KubeconfigParams::default()
        }
    }

    fn kubectl_installed() -> bool {
        let found = std::process::Command::new("kubectl")
            .args(["version", "--client"])
            .output()
            .is_ok();
        if !found {
            eprintln!("kubectl not found; skipping");
        }
        found
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn token_kubeconfig_round_trips() {
        let ca = Ca::generate("ca").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        Kubeconfig::write(&path, &params(&ca)).unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&path), 0o600);
        let k = Kubeconfig::read(&path).unwrap();
        assert_eq!(k.api_version, "v1");
        assert_eq!(k.kind, "Config");
        assert_eq!(k.current_context, "trainhub");
        assert_eq!(k.clusters[0].cluster.server, "https://127.0.0.1:6443");
        let ca_data = k.clusters[0]
            .cluster
            .certificate_authority_data
            .as_ref()
            .unwrap();
        assert_eq!(STANDARD.decode(ca_data).unwrap(), ca.cert_pem().as_bytes());
        assert_eq!(k.users[0].user.token.as_deref(), Some("s3cret"));
        assert_eq!(k.users[0].user.client_certificate_data, None);
        assert_eq!(k.contexts[0].context.namespace.as_deref(), Some("team-a"));
        assert_eq!(k.contexts[0].context.user, "alice");
        assert_eq!(k, Kubeconfig::from_params(&params(&ca)).unwrap());
    }

    #[test]
    fn certificate_kubeconfig_embeds_cert_and_key() {
        let ca = Ca::generate("ca").unwrap();
        let id = ca.issue_client("alice", &["team-a"]).unwrap();
        let p = KubeconfigParams {
            token: None,
            client_cert_pem: Some(id.cert_pem.clone()),
            client_key_pem: Some(id.key_pem.clone()),
            namespace: None,
            ..params(&ca)
        };
        let k = Kubeconfig::from_params(&p).unwrap();
        let user = &k.users[0].user;
        assert_eq!(user.token, None);
        let cert = STANDARD
            .decode(user.client_certificate_data.as_ref().unwrap())
            .unwrap();
        assert_eq!(cert, id.cert_pem.as_bytes());
        let key = STANDARD
            .decode(user.client_key_data.as_ref().unwrap())
            .unwrap();
        assert_eq!(key, id.key_pem.as_bytes());
        assert_eq!(k.contexts[0].context.namespace, None);
        assert!(!k.to_yaml().unwrap().contains("namespace"));
    }

    #[test]
    fn missing_credentials_are_refused() {
        let ca = Ca::generate("ca").unwrap();
        let none = KubeconfigParams {
            token: None,
            ..params(&ca)
        };
        assert_eq!(
            Kubeconfig::from_params(&none).unwrap_err().to_string(),
            "kubeconfig user: needs a token or a client certificate and key"
        );
        let half = KubeconfigParams {
            client_cert_pem: Some("c".into()),
            ..params(&ca)
        };
        assert!(
            Kubeconfig::from_params(&half)
                .unwrap_err()
                .to_string()
                .contains("needs its key")
        );
        let http = KubeconfigParams {
            server_url: "http://127.0.0.1:6443".into(),
            ..params(&ca)
        };
        assert_eq!(
            Kubeconfig::from_params(&http).unwrap_err().to_string(),
            "kubeconfig server: \"http://127.0.0.1:6443\" must be an https:// URL"
        );
        let unnamed = KubeconfigParams {
            cluster_name: String::new(),
            ..params(&ca)
        };
        assert_eq!(
            Kubeconfig::from_params(&unnamed).unwrap_err().to_string(),
            "kubeconfig cluster name: Required value"
        );
    }

    /// kubectl reads what we write (skipped where kubectl is not installed).
    #[test]
    fn kubectl_accepts_it() {
        if !kubectl_installed() {
            return;
        }
        let ca = Ca::generate("ca").unwrap();
        let id = ca.issue_client("alice", &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        for (file, p) in [
            ("token", params(&ca)),
            (
                "cert",
                KubeconfigParams {
                    token: None,
                    client_cert_pem: Some(id.cert_pem.clone()),
                    client_key_pem: Some(id.key_pem.clone()),
                    ..params(&ca)
                },
            ),
        ] {
            let path = dir.path().join(file);
            Kubeconfig::write(&path, &p).unwrap();
            let out = std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&path)
                .args(["config", "view", "--raw", "-o", "json"])
                .env_remove("KUBECONFIG")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(view["current-context"], "trainhub");
            assert_eq!(
                view["clusters"][0]["cluster"]["server"],
                "https://127.0.0.1:6443"
            );
            assert_eq!(view["contexts"][0]["context"]["user"], "alice");
            assert_eq!(view["contexts"][0]["context"]["namespace"], "team-a");
            let user = &view["users"][0]["user"];
            if file == "token" {
                assert_eq!(user["token"], "s3cret");
            } else {
                assert_eq!(
                    user["client-certificate-data"],
                    STANDARD.encode(&id.cert_pem)
                );
            }
        }
    }

    /// kubectl, given a kubeconfig from here, talks h2 to [`crate::tls::serve`]
    /// and is identified by its token or its certificate.
    #[tokio::test]
    async fn kubectl_authenticates_against_the_tls_server() {
        use crate::auth::{Authenticator, TokenFile};
        use crate::tls::{PeerCertificate, serve, server_config};
        use axum::extract::{Extension, Request, State};
        use axum::http::StatusCode;
        use axum::response::{IntoResponse, Json, Response};
        use std::net::{IpAddr, Ipv4Addr};
        use std::sync::Arc;

        if !kubectl_installed() {
            return;
        }

        async fn whoami(
            State(authn): State<Arc<Authenticator>>,
            Extension(peer): Extension<PeerCertificate>,
            request: Request,
        ) -> Response {
            let header = request
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok());
            match authn.authenticate(header, peer.der()) {
                Ok(user) => Json(serde_json::json!({
                    "name": user.name,
                    "groups": user.groups,
                    "version": format!("{:?}", request.version()),
                }))
                .into_response(),
                Err(e) => {
                    (StatusCode::from_u16(e.code).unwrap(), Json(e.to_status())).into_response()
                }
            }
        }

        let ca = Ca::generate("ca").unwrap();
        let server = ca
            .issue_server("hub", &["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
            .unwrap();
        let config = server_config(&server.cert_pem, &server.key_pem, Some(ca.cert_pem())).unwrap();
        let tokens: TokenFile = "s3cret,alice,1,team-a\n".parse().unwrap();
        let authn = Arc::new(Authenticator::new(Some(tokens), true));
        let app = axum::Router::new()
            .route("/whoami", axum::routing::get(whoami))
            .with_state(authn);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(serve(listener, config, app, async move {
            let _ = stopped.await;
        }));

        let dir = tempfile::tempdir().unwrap();
        let kubectl = |file: &str, p: KubeconfigParams| {
            let path = dir.path().join(file);
            Kubeconfig::write(&path, &p).unwrap();
            async move {
                tokio::process::Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(&path)
                    .args(["get", "--raw", "/whoami", "--request-timeout=20s"])
                    .env_remove("KUBECONFIG")
                    .output()
                    .await
                    .unwrap()
            }
        };
        let base = KubeconfigParams {
            server_url: format!("https://{addr}"),
            ..params(&ca)
        };

        let out = kubectl("token", base.clone()).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let who: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(who["name"], "alice");
        assert_eq!(
            who["groups"],
            serde_json::json!(["team-a", "system:authenticated"])
        );
        assert_eq!(who["version"], "HTTP/2.0");

        let carol = ca
            .issue_client("carol", &["team-b", "trainhub:admins"])
            .unwrap();
        let out = kubectl(
            "cert",
            KubeconfigParams {
                user_name: "carol".into(),
                token: None,
                client_cert_pem: Some(carol.cert_pem.clone()),
                client_key_pem: Some(carol.key_pem.clone()),
                ..base.clone()
            },
        )
        .await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let who: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(who["name"], "carol");
        assert_eq!(
            who["groups"],
            serde_json::json!(["team-b", "trainhub:admins", "system:authenticated"])
        );

        let out = kubectl(
            "wrong",
            KubeconfigParams {
                token: Some("wrong".into()),
                ..base
            },
        )
        .await;
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("Unauthorized"), "{stderr}");

        stop.send(()).unwrap();
        done.await.unwrap();
    }
}
