#!/usr/bin/env bash
# A profile-guided release build of the `infergate` binary: build it instrumented, run it on the
# training run of deploy/pgo/train.sh, merge the profiles, and build it again with them. The
# profile lays out hot code together and inlines along the paths requests really take (hyper,
# tokio, serde_json and the pipeline); on the gateway_overhead bench it takes about a third of
# the gateway's user CPU per request (BENCHMARKS.md). Two release builds and ~1 minute of
# training: about 20 minutes on 2 cores.
#   deploy/pgo/build.sh [extra cargo build flags, e.g. --no-default-features]
# Writes target/pgo/infergate (PGO_DIR sets target/pgo). Needs curl, and llvm-profdata from the
# toolchain's `llvm-tools` component (added with rustup when missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
out="$(mkdir -p "${PGO_DIR:-target/pgo}" && cd "${PGO_DIR:-target/pgo}" && pwd)"

# llvm-profdata must match rustc's LLVM, so it is the toolchain's own, not the system's.
profdata() {
  ls "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -1
}
if [ -z "$(profdata)" ]; then
  rustup component add llvm-tools
fi
tool="$(profdata)"
[ -n "$tool" ] || { echo "error: llvm-profdata not found in $(rustc --print sysroot)" >&2; exit 2; }

echo "== 1/3 instrumented build"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$out/profiles" \
  cargo build --release --locked -p infergate-cli --target-dir "$out/instrumented" "$@"
echo "== 2/3 training run"
# Build scripts and proc macros ran instrumented too: only the training run's profiles count.
rm -rf "$out/profiles"
mkdir -p "$out/profiles"
# %m: one file per binary, merged as processes exit; %p keeps concurrent processes apart.
LLVM_PROFILE_FILE="$out/profiles/%m_%p.profraw" "$here/train.sh" "$out/instrumented/release/infergate"
"$tool" merge -o "$out/infergate.profdata" "$out/profiles"
echo "== 3/3 optimized build"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$out/infergate.profdata" \
  cargo build --release --locked -p infergate-cli --target-dir "$out/optimized" "$@"
cp "$out/optimized/release/infergate" "$out/infergate"
echo "built $out/infergate"
