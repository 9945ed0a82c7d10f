#!/usr/bin/env bash
# Instructions per request through the plain gateway (no tenants, no limits, round-robin pool of
# one worker), counted by callgrind: deterministic where timings on a shared 2-core machine are
# not. It counts user-space instructions only (no syscalls, no cross-core cache traffic), so it
# ranks CPU changes in our code; benches/gateway_overhead.rs says what they are worth in req/s.
#   benches/callgrind/gateway.sh target/release/infergate [label]     (N=2000 requests by default)
# FEATURES=1 turns on the features-on column's tenant key, limits and `prefix` routing, and sends
# its 6 KB chat body. LIMITS=1 gives the anonymous tier the features-on tier's limits (the
# gateway_overhead tenant-limits column); LEDGER=1 adds the usage ledger and prices to that (its
# usage-ledger column; the writer thread's instructions count too). CALLGRIND_OPTS adds callgrind options (e.g. --cache-sim=yes); KEEP=path keeps the callgrind file
# there (for callgrind_annotate). Needs valgrind and python3; the
# upstream and client are small Python servers on loopback.
# With RELAY=1 the binary is the gateway_overhead bench's (target/release/deps/gateway_overhead-*),
# run as its bare hyper relay column: the same count for a proxy that does nothing but relay.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$1"; label="${2:-gateway}"; n="${N:-2000}"
BENCH_KEY=ig-bench-overhead-key
dir="$(mktemp -d)"; trap 'kill -9 ${vpid:-} ${upid:-} 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up=$(port); gw=$(port); admin=$(port)
mkdir -p "$dir/policies"
cat > "$dir/infergate.yaml" <<YAML
listen: "127.0.0.1:$gw"
admin: {listen: "127.0.0.1:$admin"}
log: {format: text, level: warn}
policies: policies
models:
  - {name: bench, pool: bench}
pools:
  - name: bench
    dialect: vllm
    workers:
      - url: http://127.0.0.1:$up
YAML
# The features-on and limits columns' tier: limits far above the load, so each request runs the
# limiter without being refused.
bench_tier() {
  printf 'tiers:\n  bench: {requests_per_minute: 1000000000, tokens_per_minute: 1000000000000, max_concurrent: 100000}\ndefault_tier: bench\n' > "$dir/policies/tenants.yaml"
}
if [ -n "${FEATURES:-}" ]; then
  # The gateway_overhead bench's features-on column: a tenant with a key, a tier with request,
  # token and concurrency limits, `prefix` routing; the client sends a 6 KB chat body.
  hash=$(printf '%s' "$BENCH_KEY" | sha256sum | cut -d' ' -f1)
  printf 'tenants:\n  - {name: acme, tier: bench, keys: ["sha256:%s"]}\n' "$hash" >> "$dir/infergate.yaml"
  bench_tier
  printf 'pools:\n  bench:\n    policy: prefix\n' > "$dir/policies/routing.yaml"
  export CALLGRIND_CLIENT_KEY="$BENCH_KEY"
else
  printf 'pools:\n  bench:\n    policy: round_robin\n' > "$dir/policies/routing.yaml"
  if [ -n "${LIMITS:-}${LEDGER:-}" ]; then
    bench_tier
  fi
  if [ -n "${LEDGER:-}" ]; then
    printf 'ledger: {path: usage.sqlite}\n' >> "$dir/infergate.yaml"
    printf 'version: 1\nmodels:\n  bench: {input: 1.0, cached_input: 0.25, output: 4.0}\n' > "$dir/policies/prices.yaml"
  fi
fi
python3 "$here/upstream.py" "$up" & upid=$!
if [ -n "${RELAY:-}" ]; then
  valgrind --tool=callgrind ${CALLGRIND_OPTS:-} --callgrind-out-file="$dir/cg.%p" "$bin" relay "http://127.0.0.1:$up" \
    > "$dir/gateway.log" 2>&1 & vpid=$!
  for _ in $(seq 1 240); do grep -q "relay listening" "$dir/gateway.log" && break; sleep 0.5; done
  gw=$(grep "relay listening" "$dir/gateway.log" | grep -o "127.0.0.1:[0-9]*" | head -1 | cut -d: -f2)
else
  valgrind --tool=callgrind ${CALLGRIND_OPTS:-} --callgrind-out-file="$dir/cg.%p" "$bin" gateway --config "$dir/infergate.yaml" \
    --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$admin" > "$dir/gateway.log" 2>&1 & vpid=$!
  for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$gw/readyz" >/dev/null && break; sleep 0.5; done
fi
python3 "$here/client.py" "$gw" 400 >/dev/null     # warm-up: pools filled, caches built
callgrind_control -z "$vpid" >/dev/null 2>&1
python3 "$here/client.py" "$gw" "$n"
callgrind_control -d "$vpid" >/dev/null 2>&1
sleep 1
file="$(ls -t "$dir"/cg."$vpid"* | head -1)"
total="$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')"
[ -n "${KEEP:-}" ] && cp "$file" "$KEEP"
echo "$label: $((total / n)) instructions per request ($total over $n requests)"
# With extra options (a cache simulation), every event's total too.
if [ -n "${CALLGRIND_OPTS:-}" ]; then
  callgrind_annotate "$file" 2>/dev/null | grep -E '^Events shown|PROGRAM TOTALS'
fi
