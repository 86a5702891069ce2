#!/usr/bin/env bash
# Regenerates src/rpc/generated/ from proto/ as etcd-client's own build script
# does (tonic-prost-build 0.14, client only). Needs protoc; run from anywhere.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
cat > "$work/Cargo.toml" <<'TOML'
[package]
name = "etcd-client-codegen"
version = "0.0.0"
edition = "2021"
publish = false
[workspace]
[dependencies]
tonic-prost-build = "0.14"
# The version etcd-client 0.21.1 was generated with here (later ones differ in `packed`).
prost-build = "=0.14.4"
TOML
cat > "$work/src/main.rs" <<RS
fn main() {
    let root = "$here/proto";
    tonic_prost_build::configure()
        .build_server(false)
        .out_dir("$here/src/rpc/generated")
        .compile_protos(
            &[
                "proto/etcd/api/authpb/auth.proto",
                "proto/etcd/api/etcdserverpb/rpc.proto",
                "proto/etcd/api/mvccpb/kv.proto",
                "proto/etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
                "proto/etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
            ].map(|p| format!("{root}/{}", p.trim_start_matches("proto/"))),
            &[root.to_string()],
        )
        .expect("compiling etcd's protos");
}
RS
cargo run --quiet --manifest-path "$work/Cargo.toml"
rm -f "$here"/src/rpc/generated/google.*.rs "$here"/src/rpc/generated/grpc.*.rs
