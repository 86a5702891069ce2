//! The flags that bound what clients of the Kubernetes API can hold of the
//! hub: connections, HTTP timeouts, and per-user requests in flight. Shared
//! by `trainhub serve` and `trainhub dev`; the defaults are
//! [`ServeOptions::default`] and [`RequestLimits::default`], sized so that
//! kubectl, the SDK and many watchers keep working. The spokes' gRPC
//! listener has its own.

use std::time::Duration;

use trainhub_apiserver::server::RequestLimits;
use trainhub_apiserver::tls::ServeOptions;

use crate::controller::events::parse_go_duration;

#[derive(Debug, Clone, clap::Args)]
pub struct ApiLimitsArgs {
    /// Connections the API listener serves at once; more are closed when
    /// accepted.
    #[arg(long, default_value_t = ServeOptions::default().max_connections)]
    pub max_connections: usize,
    /// Connections the API listener serves at once from one client address.
    #[arg(long, default_value_t = ServeOptions::default().max_connections_per_client)]
    pub max_connections_per_client: usize,
    /// HTTP/2 requests in flight on one connection.
    #[arg(long, default_value_t = ServeOptions::default().http2_max_concurrent_streams)]
    pub http2_max_streams_per_connection: u32,
    /// An HTTP/1.1 client must send a request's headers within this (Go
    /// duration syntax); an idle keep-alive connection closes after it.
    #[arg(long, default_value = "30s", value_parser = parse_go_duration)]
    pub http_header_read_timeout: Duration,
    /// A connection with nothing in flight (no watch either) closes after
    /// this.
    #[arg(long, default_value = "1m30s", value_parser = parse_go_duration)]
    pub http_idle_timeout: Duration,
    /// A client that reads nothing of a response (or a watch's events) for
    /// this long is cut off.
    #[arg(long, default_value = "1m0s", value_parser = parse_go_duration)]
    pub http_write_timeout: Duration,
    /// Requests in flight per user, watches and followed logs apart
    /// (kube-apiserver's `--max-requests-inflight`, per user; 429 with
    /// Retry-After past it; `system:masters` is exempt; 0: no cap).
    #[arg(long, default_value_t = RequestLimits::default().max_requests_in_flight_per_user)]
    pub max_requests_inflight_per_user: usize,
    /// Watches and followed logs open at once per user (0: no cap).
    #[arg(long, default_value_t = RequestLimits::default().max_long_running_per_user)]
    pub max_long_running_requests_per_user: usize,
    /// Watches and followed logs open at once, all users (0: no cap).
    #[arg(long, default_value_t = RequestLimits::default().max_long_running)]
    pub max_long_running_requests: usize,
    /// Bytes of events a user's watches may hold queued for clients that
    /// have not read them, all the user's watches together (each holds at
    /// most 1 MiB besides; 0: no cap).
    #[arg(long, default_value_t = RequestLimits::default().max_watch_bytes_per_user)]
    pub max_watch_bytes_per_user: usize,
}

impl Default for ApiLimitsArgs {
    fn default() -> Self {
        let serve = ServeOptions::default();
        let requests = RequestLimits::default();
        ApiLimitsArgs {
            max_connections: serve.max_connections,
            max_connections_per_client: serve.max_connections_per_client,
            http2_max_streams_per_connection: serve.http2_max_concurrent_streams,
            http_header_read_timeout: serve.header_read_timeout,
            http_idle_timeout: serve.idle_timeout,
            http_write_timeout: serve.write_timeout,
            max_requests_inflight_per_user: requests.max_requests_in_flight_per_user,
            max_long_running_requests_per_user: requests.max_long_running_per_user,
            max_long_running_requests: requests.max_long_running,
            max_watch_bytes_per_user: requests.max_watch_bytes_per_user,
        }
    }
}

impl ApiLimitsArgs {
    pub fn serve_options(&self) -> ServeOptions {
        let ApiLimitsArgs {
            max_connections,
            max_connections_per_client,
            http2_max_streams_per_connection,
            http_header_read_timeout,
            http_idle_timeout,
            http_write_timeout,
            max_requests_inflight_per_user: _,
            max_long_running_requests_per_user: _,
            max_long_running_requests: _,
            max_watch_bytes_per_user: _,
        } = self.clone();
        ServeOptions {
            header_read_timeout: http_header_read_timeout,
            idle_timeout: http_idle_timeout,
            write_timeout: http_write_timeout,
            max_connections,
            max_connections_per_client,
            http2_max_concurrent_streams: http2_max_streams_per_connection,
            ..ServeOptions::default()
        }
    }

    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            max_requests_in_flight_per_user: self.max_requests_inflight_per_user,
            max_long_running_per_user: self.max_long_running_requests_per_user,
            max_long_running: self.max_long_running_requests,
            max_watch_bytes_per_user: self.max_watch_bytes_per_user,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        limits: ApiLimitsArgs,
    }

    #[test]
    fn defaults_match_the_libraries_and_flags_apply() {
        let cli = Cli::parse_from(["x"]);
        assert_eq!(
            cli.limits.serve_options().idle_timeout,
            ServeOptions::default().idle_timeout
        );
        assert_eq!(cli.limits.request_limits(), RequestLimits::default());
        let cli = Cli::parse_from([
            "x",
            "--max-connections-per-client",
            "8",
            "--http-header-read-timeout",
            "2s",
            "--max-requests-inflight-per-user",
            "3",
            "--max-watch-bytes-per-user",
            "1048576",
        ]);
        let serve = cli.limits.serve_options();
        assert_eq!(serve.max_connections_per_client, 8);
        assert_eq!(serve.header_read_timeout, Duration::from_secs(2));
        assert_eq!(
            cli.limits.request_limits().max_requests_in_flight_per_user,
            3
        );
        assert_eq!(
            cli.limits.request_limits().max_watch_bytes_per_user,
            1 << 20
        );
    }
}
