//! `trainhub`: the hub server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use trainhub::dev::DevArgs;
use trainhub::hub::{Config, Hub};

trainhub::jemalloc!();

/// Returns every arena's freed pages to the system now.
#[allow(unsafe_code)]
fn purge_jemalloc() {
    // SAFETY: `arena.<MALLCTL_ARENAS_ALL>.purge` takes and gives nothing:
    // all pointers null, length 0; the name is a NUL-terminated literal.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

#[derive(Parser)]
#[command(
    name = "trainhub",
    version,
    about = "Federation hub for Kubeflow Trainer TrainJobs"
)]
struct Cli {
    /// Log format: text or json.
    #[arg(
        long,
        global = true,
        default_value = "text",
        env = "TRAINHUB_LOG_FORMAT"
    )]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Serve the hub (Kubernetes API over TLS; the embedded store, or etcd
    /// shared by several replicas of which one leads).
    Serve(ServeArgs),
    /// The embedded default: a hub on 127.0.0.1 with its own CA, an admin
    /// token and a kubeconfig, and local spokes.
    Dev(DevArgs),
    /// Compiles the built-in plugins into a compilation cache and exits (a
    /// hub's first start runs it as a child: see `builtin::set_compile_apart`).
    #[command(hide = true)]
    CompileBuiltinPlugins {
        #[arg(long)]
        cache_dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    #[arg(long)]
    data_dir: PathBuf,
    #[arg(long, default_value = "0.0.0.0:6443")]
    listen: SocketAddr,
    #[arg(long)]
    tls_cert_file: PathBuf,
    #[arg(long)]
    tls_private_key_file: PathBuf,
    /// Accept client certificates signed by this CA (user = CN, groups = O).
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// Bearer tokens, kube-apiserver's format: token,user,uid,"group1,group2".
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Admin groups and namespace grants (YAML).
    #[arg(long)]
    authorization_policy_file: Option<PathBuf>,
    /// Custom plugins directory, hot-reloaded.
    #[arg(long)]
    plugins_dir: Option<PathBuf>,
    /// The spokes' gRPC endpoint (mutual TLS with the serving certificate).
    #[arg(long)]
    grpc_listen: Option<SocketAddr>,
    /// CA that signs spoke certificates (`trainctl certs spoke`).
    #[arg(long)]
    spoke_ca_file: Option<PathBuf>,
    /// Events are removed this long after their last write (kube-apiserver's
    /// `--event-ttl`; Go duration syntax; 0 keeps them).
    #[arg(long, default_value = "1h0m0s", value_parser = trainhub::controller::events::parse_go_duration)]
    event_ttl: std::time::Duration,
    #[command(flatten)]
    dispatch: trainhub::dispatch::DispatchArgs,
    #[command(flatten)]
    api_limits: trainhub::api_limits::ApiLimitsArgs,
    #[command(flatten)]
    storage: trainhub::hub::StorageArgs,
    #[command(flatten)]
    trainer_status: trainhub::hub::TrainerStatusArgs,
    #[command(flatten)]
    plugin_sources: trainhub::plugins::sources::SourceArgs,
    #[command(flatten)]
    dashboard: trainhub::dashboard::DashboardArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    trainhub::memory::set_allocator_release(purge_jemalloc);
    if let Command::CompileBuiltinPlugins { cache_dir } = &cli.command {
        return compile_builtins(cache_dir);
    }
    trainhub::builtin::set_compile_apart(compile_builtins_apart);
    let mut telemetry = trainhub::logging::init(&cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Dev(args) => trainhub::dev::run(args, shutdown_signal()).await,
            // Handled before the runtime starts.
            Command::CompileBuiltinPlugins { .. } => Ok(()),
            Command::Serve(args) => {
                let replication = args.storage.replication()?;
                let trainer_status = args.trainer_status.config(args.client_ca_file.as_ref())?;
                let hub = Hub::open_replicated(
                    Config {
                        data_dir: args.data_dir,
                        listen: args.listen,
                        tls_cert: args.tls_cert_file,
                        tls_key: args.tls_private_key_file,
                        client_ca: args.client_ca_file,
                        token_file: args.token_auth_file,
                        policy_file: args.authorization_policy_file,
                        plugins_dir: args.plugins_dir,
                        grpc_listen: args.grpc_listen,
                        spoke_ca: args.spoke_ca_file,
                        dispatch: args.dispatch.config(),
                        event_ttl: args.event_ttl,
                        api_limits: args.api_limits,
                        trainer_status,
                        plugin_sources: args.plugin_sources,
                        dashboard: args.dashboard,
                    },
                    replication,
                )
                .await?;
                // As an upstream install ships them: the built-in runtimes
                // (created when absent) and the ConfigMap the Kubeflow SDK
                // reads the trainer version from, which no client may write.
                hub.install(trainhub::hub::default_objects()?).await?;
                hub.serve(|_| {}, shutdown_signal()).await
            }
        }
    });
    // Export the last spans before the runtime (and the process) goes.
    if let Some(t) = telemetry.as_mut() {
        t.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `trainhub compile-builtin-plugins`: the built-ins compiled into
/// `cache_dir`.
fn compile_builtins(cache_dir: &std::path::Path) -> ExitCode {
    let compiled = trainhub::plugins::Host::new(&trainhub::plugins::HostConfig {
        cache_dir: Some(cache_dir.to_path_buf()),
        ..trainhub::plugins::HostConfig::default()
    })
    .and_then(|host| trainhub::builtin::load(&host));
    match compiled {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: compiling the built-in plugins: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs this binary as `compile-builtin-plugins` and waits for it.
fn compile_builtins_apart(cache_dir: &std::path::Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
    let status = std::process::Command::new(&exe)
        .arg("compile-builtin-plugins")
        .arg("--cache-dir")
        .arg(cache_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} compile-builtin-plugins: {status}",
            exe.display()
        ))
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
