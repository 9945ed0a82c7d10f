#!/usr/bin/env bash
# The training run of a profile-guided build (deploy/pgo/build.sh): the instrumented binary BIN
# serves the embedded default (`infergate up`: the demo tenant's key, its tier's limits, the usage
# ledger, `prefix` routing, stable and canary pools of sim engine workers), and the binary itself
# drives it: `infergate bench` streams two shipped workloads, then a few thousand non-streaming
# chat requests with ~6 KB prompts go through curl, 8 at a time. Everything is on loopback and
# under a scratch directory; nothing is downloaded. The gateway and its workers exit through
# SIGTERM, so each process writes its profile.
#   deploy/pgo/train.sh path/to/instrumented/infergate
# NONSTREAM=N sets the number of non-streaming requests (default 3000), BENCH_SECONDS each
# streaming workload's run (default 15), BENCH_RATE its arrivals a second (default 40) and
# PARALLEL the non-streaming requests in flight (default 8): the e2e test runs it small, beside
# other tests.
set -euo pipefail
bin="$1"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
nonstream="${NONSTREAM:-3000}"
secs="${BENCH_SECONDS:-15}"
rate="${BENCH_RATE:-40}"
parallel="${PARALLEL:-8}"
command -v curl >/dev/null || { echo "error: curl is needed for the training run" >&2; exit 2; }
dir="$(mktemp -d)"
up_pid=""
stop() {
  if [ -n "$up_pid" ] && kill -0 "$up_pid" 2>/dev/null; then
    kill -TERM "$up_pid" 2>/dev/null || true
    for _ in $(seq 1 120); do kill -0 "$up_pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$up_pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap stop EXIT

# The shipped config and policies, with the `paid` tier (the demo key's) far above the load, so
# that requests are admitted (the limiter still runs on each); the ledger and the CPU worker's
# model live under the scratch cache, not the user's.
mkdir -p "$dir/config"
cp "$root/config/infergate.yaml" "$dir/config/"
cp -r "$root/policies" "$dir/policies"
sed -i '/^  paid:/,/^  [a-z]*:$/{s/requests_per_minute: .*/requests_per_minute: 100000000/;s/tokens_per_minute: .*/tokens_per_minute: 100000000000/;s/max_concurrent: .*/max_concurrent: 100000/}' \
  "$dir/policies/tenants.yaml"
grep -q 'requests_per_minute: 100000000$' "$dir/policies/tenants.yaml" \
  || { echo "error: policies/tenants.yaml has no paid tier to raise" >&2; exit 1; }
INFERGATE_CACHE_DIR="$dir/cache" "$bin" up --config "$dir/config/infergate.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  > "$dir/up.log" 2>&1 &
up_pid=$!
url=""; key=""
for _ in $(seq 1 240); do
  url="$(grep -o 'gateway listening on http://[0-9.:]*' "$dir/up.log" | head -1 | sed 's/.* on //')" || true
  key="$(grep -o 'demo API key (new at every start): [^ ]*' "$dir/up.log" | head -1 | sed 's/.*: //')" || true
  if [ -n "$url" ] && [ -n "$key" ] && grep -q "gateway ready" "$dir/up.log"; then break; fi
  kill -0 "$up_pid" 2>/dev/null || { cat "$dir/up.log" >&2; exit 1; }
  sleep 0.25
done
[ -n "$url" ] && [ -n "$key" ] || { echo "error: infergate up did not start" >&2; cat "$dir/up.log" >&2; exit 1; }
echo "training against $url"

# Streaming: shipped workloads (shared system prompts, per-tenant traffic), in the binary's own
# load driver.
for workload in chat shared-system-prompt; do
  "$bin" bench --url "$url" --api-key "$key" --workload "$workload" --rate "$rate" \
    --duration "${secs}s" --out "$dir/bench-$workload.json" > "$dir/bench-$workload.log" 2>&1 \
    || { cat "$dir/bench-$workload.log" >&2; exit 1; }
  sent="$(grep -o '"requests": *[0-9]*' "$dir/bench-$workload.json" | head -1 | grep -o '[0-9]*$')"
  ok="$(grep -o '"ok": *[0-9]*' "$dir/bench-$workload.json" | head -1 | grep -o '[0-9]*$')"
  echo "streaming $workload: $ok of $sent answered 2xx"
  [ "${sent:-0}" -gt 0 ] && [ "${ok:-0}" -ge $((sent / 2)) ] || { cat "$dir/bench-$workload.log" >&2; exit 1; }
done

# Non-streaming: a ~6 KB system prompt shared by every request and a question that differs, the
# shape of the gateway_overhead bench's features-on column (not its bytes).
system="$(for i in $(seq 1 40); do printf 'Policy %d: answer from the handbook, quote the clause, and say when it does not apply. ' "$i"; done)"
cfg="$dir/curl.cfg"
: > "$cfg"
for i in $(seq 1 "$nonstream"); do
  [ "$i" -gt 1 ] && echo next >> "$cfg"
  printf 'url = "%s/v1/chat/completions"\nheader = "authorization: Bearer %s"\nheader = "content-type: application/json"\ndata = "{\\"model\\":\\"llama-3-8b\\",\\"max_tokens\\":4,\\"messages\\":[{\\"role\\":\\"system\\",\\"content\\":\\"%s\\"},{\\"role\\":\\"user\\",\\"content\\":\\"Question %d: which clause covers trip %d?\\"}]}"\noutput = "/dev/null"\nwrite-out = "%%{http_code}\\n"\n' \
    "$url" "$key" "$system" "$i" "$((i * 7919 % 100003))" >> "$cfg"
done
codes="$(curl -s --no-progress-meter --parallel --parallel-max "$parallel" -K "$cfg")"
ok="$(printf '%s\n' "$codes" | grep -c '^200$' || true)"
echo "non-streaming: $ok of $nonstream answered 200"
# The paid tier is raised above, so all should pass; a run that mostly fails trains the wrong path.
[ "$ok" -ge $((nonstream / 2)) ] || { printf '%s\n' "$codes" | sort | uniq -c >&2; exit 1; }
