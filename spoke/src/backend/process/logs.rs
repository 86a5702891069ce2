//! Container logs: the file's tail, then (following) new bytes until the
//! container ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream;
use tokio::io::AsyncReadExt as _;

use super::Shared;
use crate::backend::{BackendError, LogStream, RunKey};

/// How often a followed log is polled for new bytes.
const POLL: Duration = Duration::from_millis(100);

/// Where the last `lines` lines of `bytes` start (a final newline does not
/// begin an empty line).
pub fn tail_start(bytes: &[u8], lines: u64) -> usize {
    if lines == 0 {
        return bytes.len();
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                return i + 1;
            }
        }
    }
    0
}

/// Opens a log for reading, refusing a symlink or anything but a regular
/// file: the pod's directory is the run's, and the spoke must not read
/// (or block on) what the run put there in the log's place.
async fn open_nofollow(path: &std::path::Path) -> std::io::Result<tokio::fs::File> {
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .await
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the log was replaced by a symlink; it is not followed",
                )
            } else {
                e
            }
        })?;
    if !file.metadata().await?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the log was replaced by something other than a file",
        ));
    }
    Ok(file)
}

/// One container's log, as asked.
pub(super) struct LogRequest {
    pub shared: Arc<Shared>,
    pub key: RunKey,
    pub pod: String,
    pub container: String,
    pub path: PathBuf,
    pub follow: bool,
    pub tail_lines: Option<u64>,
}

impl LogRequest {
    fn ended(&self) -> bool {
        self.shared
            .container_ended(&self.key, &self.pod, &self.container)
    }

    /// # Errors
    ///
    /// `Invalid` when the container has not started and the stream would
    /// not follow; `Internal` when the file cannot be read.
    pub(super) async fn open(self) -> Result<LogStream, BackendError> {
        let mut file = loop {
            match open_nofollow(&self.path).await {
                Ok(file) => break file,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    if self.ended() {
                        return Ok(stream::empty().boxed());
                    }
                    if !self.follow {
                        return Err(BackendError::Invalid(format!(
                            "container {:?} in pod {:?} is waiting to start",
                            self.container, self.pod
                        )));
                    }
                    tokio::time::sleep(POLL).await;
                }
                Err(err) => {
                    return Err(BackendError::Internal(format!(
                        "cannot read {}: {err}",
                        self.path.display()
                    )));
                }
            }
        };
        let mut head = Vec::new();
        file.read_to_end(&mut head).await.map_err(|err| {
            BackendError::Internal(format!("cannot read {}: {err}", self.path.display()))
        })?;
        let start = self.tail_lines.map_or(0, |n| tail_start(&head, n));
        let head = Bytes::from(head).slice(start..);
        let first = stream::iter((!head.is_empty()).then_some(Ok(head)));
        if !self.follow {
            return Ok(first.boxed());
        }
        let rest = stream::unfold(Some((self, file)), |state| async move {
            let (request, mut file) = state?;
            let mut buf = vec![0; 64 * 1024];
            loop {
                // Looked at before reading, so bytes written before the end are not lost.
                let ended = request.ended();
                match file.read(&mut buf).await {
                    Ok(0) if ended => return None,
                    Ok(0) => tokio::time::sleep(POLL).await,
                    Ok(n) => {
                        buf.truncate(n);
                        return Some((Ok(Bytes::from(buf)), Some((request, file))));
                    }
                    Err(err) => return Some((Err(format!("reading the log: {err}")), None)),
                }
            }
        });
        Ok(first.chain(rest).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let text = b"a\nb\nc\n";
        assert_eq!(&text[tail_start(text, 2)..], b"b\nc\n");
        assert_eq!(&text[tail_start(text, 3)..], text);
        assert_eq!(&text[tail_start(text, 10)..], text);
        assert_eq!(&text[tail_start(text, 0)..], b"");
        let partial = b"a\nb\nc";
        assert_eq!(&partial[tail_start(partial, 1)..], b"c");
        assert_eq!(&partial[tail_start(partial, 2)..], b"b\nc");
        assert_eq!(tail_start(b"", 3), 0);
    }
}
