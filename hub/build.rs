//! Builds the WebAssembly plugins (the built-ins, which the hub embeds, plus
//! the example and test plugins the tests load) with a nested cargo
//! invocation for `wasm32-wasip2`, in its own target directory.

use sha2::Digest as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Built-in plugins, embedded in the hub in this order.
const BUILTINS: [&str; 10] = [
    "jobset",
    "torch",
    "mpi",
    "plainml",
    "python",
    "jax",
    "xgboost",
    "flux",
    "coscheduling",
    "volcano",
];
/// Other components the tests and examples load from disk.
const EXTRA: [&str; 4] = [
    "acme-plugin",
    "trainhub-test-plugin-misbehaving",
    "trainhub-test-plugin-uses-fs",
    "trainhub-test-plugin-uses-net",
];

fn main() {
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest
        .parent()
        .expect("hub/ is inside the workspace")
        .to_path_buf();
    for watched in [
        "wit",
        "sdk-plugin",
        "plugins",
        "hub/api/src",
        "hub/api/Cargo.toml",
        "examples/acme-plugin",
        "tests/plugins",
        "Cargo.lock",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    println!("cargo:rerun-if-env-changed=TRAINHUB_WASM_TARGET_DIR");

    let target_dir = std::env::var_os("TRAINHUB_WASM_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target").join("wasm-plugins"));
    ensure_wasm_target();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .args(["build", "--profile", "plugin", "--target", "wasm32-wasip2"])
        .env("CARGO_TARGET_DIR", &target_dir);
    // Flags and wrappers of the outer (host) build must not leak into the wasm build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    for name in BUILTINS {
        cmd.args(["-p", &format!("trainhub-plugin-{name}")]);
    }
    for package in EXTRA {
        cmd.args(["-p", package]);
    }
    let status = cmd
        .status()
        .expect("running cargo to build the wasm plugins");
    if !status.success() {
        panic!(
            "building the wasm plugins failed (see the cargo output above); is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`"
        );
    }

    let wasm_dir = target_dir.join("wasm32-wasip2").join("plugin");
    println!("cargo:rustc-env=TRAINHUB_WASM_DIR={}", wasm_dir.display());
    let mut generated = String::from(
        "/// Built-in plugin components: (name, sha256 of the wasm, wasm bytes).\npub const BUILTIN_COMPONENTS: &[(&str, [u8; 32], &[u8])] = &[\n",
    );
    for name in BUILTINS {
        let file = wasm_dir.join(format!("trainhub_plugin_{name}.wasm"));
        let wasm =
            std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        // Known at build time, so that a start with the compiled plugins
        // cached does not read (and keep resident) the embedded bytes.
        let digest: [u8; 32] = sha2::Sha256::digest(&wasm).into();
        generated.push_str(&format!(
            "    ({name:?}, {digest:?}, include_bytes!({:?})),\n",
            file.display().to_string()
        ));
    }
    generated.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    write_if_changed(&out.join("builtin_components.rs"), &generated);
}

const WASM_TARGET: &str = "wasm32-wasip2";

/// Adds the wasm target to the toolchain building us when it lacks it, as
/// `rust-toolchain.toml` asks; rustup skips that when the pinned toolchain is
/// linked to an installed one. Without rustup the nested build's own error
/// says what is missing.
fn ensure_wasm_target() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let Some(sysroot) = sysroot else { return };
    if sysroot.join("lib/rustlib").join(WASM_TARGET).exists() {
        return;
    }
    let mut rustup = Command::new("rustup");
    rustup.args(["target", "add", WASM_TARGET]);
    if let Ok(toolchain) = std::env::var("RUSTUP_TOOLCHAIN") {
        rustup.args(["--toolchain", &toolchain]);
    }
    println!("cargo:warning=the {WASM_TARGET} target is missing; adding it with rustup");
    match rustup.status() {
        Ok(status) if status.success() => {}
        Ok(status) => println!(
            "cargo:warning=`rustup target add {WASM_TARGET}` exited with {status}; the plugins' build will fail"
        ),
        Err(e) => println!(
            "cargo:warning=rustup not found ({e}): install the {WASM_TARGET} target for {}",
            sysroot.display()
        ),
    }
}

fn write_if_changed(path: &Path, contents: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(contents) {
        std::fs::write(path, contents).expect("writing generated file");
    }
}
