//! A serving certificate that follows its files: rotate `tls.crt` and
//! `tls.key` on disk (`trainctl certs renew`, cert-manager, a Secret
//! update) and new TLS connections get the new pair, without a restart.
//!
//! The files' modification times and sizes are checked at most once per
//! `interval`, on the handshake path. A pair that does not load (a key
//! written before its certificate, a half-written file, a key that is not
//! the certificate's) keeps the previous pair in service and is tried
//! again at the next check; the failure is logged once per change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::pki::CertInfo;
use crate::tls::{TlsError, crypto_provider, parse_certificates, parse_private_key};

/// How often the files are checked, at most.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// What identifies one version of the pair on disk.
type Stamp = Option<(SystemTime, u64, SystemTime, u64)>;

struct State {
    current: Arc<CertifiedKey>,
    serial: String,
    not_after: i64,
    /// The files as they were when `current` was loaded (or last failed).
    stamp: Stamp,
    checked: Instant,
}

/// A certificate and key read from files, re-read when they change.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    what: &'static str,
    interval: Duration,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let c = std::fs::metadata(cert).ok()?;
    let k = std::fs::metadata(key).ok()?;
    Some((c.modified().ok()?, c.len(), k.modified().ok()?, k.len()))
}

impl ReloadingCert {
    /// Loads the pair; fails if it does not load now.
    pub fn load(
        what: &'static str,
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
        interval: Duration,
    ) -> Result<Arc<ReloadingCert>, TlsError> {
        let (cert_path, key_path) = (cert_path.into(), key_path.into());
        let provider = crypto_provider();
        let before = stamp(&cert_path, &key_path);
        let (current, info) = load_pair(what, &provider, &cert_path, &key_path)?;
        Ok(Arc::new(ReloadingCert {
            cert_path,
            key_path,
            what,
            interval,
            provider,
            state: Mutex::new(State {
                current,
                serial: info.serial,
                not_after: info.not_after,
                stamp: before,
                checked: Instant::now(),
            }),
        }))
    }

    /// The pair in service, re-read first if the files changed and the
    /// last check is older than the interval.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut state = lock(&self.state);
        if state.checked.elapsed() >= self.interval {
            state.checked = Instant::now();
            let now = stamp(&self.cert_path, &self.key_path);
            if now.is_some() && now != state.stamp {
                state.stamp = now;
                match load_pair(self.what, &self.provider, &self.cert_path, &self.key_path) {
                    Ok((pair, info)) => {
                        tracing::info!(
                            what = self.what,
                            cert = %self.cert_path.display(),
                            serial = %info.serial,
                            previous = %state.serial,
                            "reloaded the rotated certificate"
                        );
                        state.current = pair;
                        state.serial = info.serial;
                        state.not_after = info.not_after;
                    }
                    Err(e) => tracing::warn!(
                        what = self.what,
                        cert = %self.cert_path.display(),
                        error = %e,
                        "the certificate files changed but do not load; still serving the previous certificate"
                    ),
                }
            }
        }
        state.current.clone()
    }

    /// The serial (hex) and expiry (Unix seconds) of the pair in service.
    pub fn serial(&self) -> (String, i64) {
        let _ = self.current();
        let state = lock(&self.state);
        (state.serial.clone(), state.not_after)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn load_pair(
    what: &'static str,
    provider: &CryptoProvider,
    cert_path: &Path,
    key_path: &Path,
) -> Result<(Arc<CertifiedKey>, CertInfo), TlsError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|e| TlsError::Pem {
            what,
            message: format!("reading {}: {e}", path.display()),
        })
    };
    let key_pem = read(key_path)?;
    let chain = parse_certificates(what, &read(cert_path)?)?;
    let key = parse_private_key(what, &key_pem)?;
    // The key must be the certificate's (rustls cannot always tell).
    let key_spki = rcgen::KeyPair::from_pem(&key_pem)
        .map(|k| rcgen::PublicKeyData::subject_public_key_info(&k))
        .ok();
    let cert_spki = chain.first().and_then(|c| {
        use x509_parser::prelude::FromDer;
        x509_parser::prelude::X509Certificate::from_der(c.as_ref())
            .ok()
            .map(|(_, x)| x.public_key().raw.to_vec())
    });
    if key_spki.is_some() && key_spki != cert_spki {
        return Err(TlsError::Pem {
            what,
            message: format!(
                "the key in {} is not the key of the certificate in {}",
                key_path.display(),
                cert_path.display()
            ),
        });
    }
    let info = chain
        .first()
        .map(|c| CertInfo::from_der(c.as_ref()))
        .transpose()
        .map_err(|message| TlsError::Pem { what, message })?
        .ok_or(TlsError::NoCertificate { what })?;
    let pair = CertifiedKey::from_der(chain, key, provider)?;
    Ok((Arc::new(pair), info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Ca, PemDir};
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn a_rotated_pair_is_served_and_a_mismatched_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let pki = PemDir::new(dir.path());
        let ca = Ca::generate("ca").unwrap();
        let ip = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
        pki.write("hub", &ca.issue_server("hub", &["localhost"], &ip).unwrap())
            .unwrap();
        let reloading = ReloadingCert::load(
            "test",
            pki.cert_path("hub"),
            pki.key_path("hub"),
            Duration::ZERO,
        )
        .unwrap();
        let (first, _) = reloading.serial();

        // A key that is not the certificate's: the old pair stays.
        let other = ca.issue_server("hub", &["localhost"], &ip).unwrap();
        std::fs::write(pki.key_path("hub"), &other.key_pem).unwrap();
        assert_eq!(reloading.serial().0, first);

        // The whole pair rotated: served.
        let rotated = ca.renew(&other.cert_pem, 30).unwrap();
        pki.write("hub", &rotated).unwrap();
        let (second, not_after) = reloading.serial();
        assert_ne!(second, first);
        assert_eq!(
            second,
            CertInfo::from_pem(&rotated.cert_pem).unwrap().serial
        );
        assert!(not_after > 0);
        assert_eq!(
            reloading.current().cert[0].as_ref(),
            crate::pki::cert_der(&rotated.cert_pem).unwrap()
        );
    }
}
