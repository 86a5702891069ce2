//! The spoke's certificate files, re-read on every connect and watched
//! while connected: when `--cert` or `--key` (or `--ca`) change on disk
//! (`trainctl certs renew`, a mounted Secret updated), the agent ends its
//! session and reconnects with the new files, without a restart.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// How often the files are checked while connected.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Where the agent's identity and the hub's CA are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// What identifies one version of the files.
pub type Stamp = Vec<Option<(SystemTime, u64)>>;

/// PEM texts read from [`CertFiles`].
#[derive(Clone)]
pub struct Pems {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

impl CertFiles {
    /// The files' modification times and sizes now.
    pub fn stamp(&self) -> Stamp {
        [&self.cert, &self.key, &self.ca]
            .iter()
            .map(|p| {
                let m = std::fs::metadata(p).ok()?;
                Some((m.modified().ok()?, m.len()))
            })
            .collect()
    }

    /// Reads the three files.
    pub fn read(&self) -> Result<Pems, String> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))
        };
        Ok(Pems {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
            ca: read(&self.ca)?,
        })
    }

    /// Resolves once the files differ from `since` and have stayed the
    /// same for one more check (a renewal writes the key, then the
    /// certificate).
    pub async fn changed(&self, since: Stamp, every: Duration) {
        let mut last = since.clone();
        loop {
            tokio::time::sleep(every).await;
            let now = self.stamp();
            if now != since && now == last && now.iter().all(Option::is_some) {
                tracing::info!(
                    cert = %self.cert.display(),
                    "the certificate files changed: reconnecting with them"
                );
                return;
            }
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_is_seen_once_the_files_settle() {
        let dir = tempfile::tempdir().unwrap();
        let files = CertFiles {
            cert: dir.path().join("s.crt"),
            key: dir.path().join("s.key"),
            ca: dir.path().join("ca.crt"),
        };
        for p in [&files.cert, &files.key, &files.ca] {
            std::fs::write(p, "a").unwrap();
        }
        let before = files.stamp();
        assert_eq!(files.read().unwrap().cert, "a");
        let watching = {
            let files = files.clone();
            let before = before.clone();
            tokio::spawn(async move {
                files.changed(before, Duration::from_millis(20)).await;
            })
        };
        std::fs::write(&files.cert, "bb").unwrap();
        tokio::time::timeout(Duration::from_secs(5), watching)
            .await
            .expect("the change is seen")
            .unwrap();
        assert_ne!(files.stamp(), before);
    }
}
