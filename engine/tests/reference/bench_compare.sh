#!/usr/bin/env bash
# Side-by-side CPU throughput, one run: infergate's cpu forward pass (cargo bench cpu_model) and
# Hugging Face transformers (bench_reference.py) on the same checkpoints, same prompt length,
# decode length and batch sizes, each using all cores. Prints one markdown table.
#
#   engine/tests/reference/bench_compare.sh
#
# Env: PY (python with torch+transformers+gguf+accelerate, default /tmp/ref/venv/bin/python),
# SMOLLM2_GGUF, QWEN_DIR (a Qwen2.5-0.5B-shaped checkpoint from make_random_checkpoint.py,
# created if missing), BENCH_CACHE (where the default model is generated).
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-/tmp/ref/venv/bin/python}
SMOL=${SMOLLM2_GGUF:-target/test-models/SmolLM2-135M-Instruct.Q4_1.gguf}
QWEN=${QWEN_DIR:-/tmp/ref/qwen05b}
export INFERGATE_CACHE_DIR=${BENCH_CACHE:-/tmp/ref/cache}
export HF_HUB_OFFLINE=1
PROMPT=128 DECODE=32 BATCHES=1,8
out=$(mktemp -d)

[ -d "$QWEN" ] || "$PY" engine/tests/reference/make_random_checkpoint.py "$QWEN" --shape qwen2.5-0.5b >&2
cargo bench -p infergate-engine --bench cpu_model --no-run >&2
# Generates the default model (the same bytes every time) so both sides can load it.
CPU_BENCH_MODEL=default CPU_BENCH_DECODE=1 CPU_BENCH_BATCHES=1 CPU_BENCH_PROMPT_LEN=8 \
  cargo bench -q -p infergate-engine --bench cpu_model >/dev/null
DEFAULT="$INFERGATE_CACHE_DIR/models/infergate-tiny-v1"

i=0
for model in "$SMOL" "$DEFAULT" "$QWEN"; do
  i=$((i + 1))
  CPU_BENCH_MODEL="$model" CPU_BENCH_PROMPT_LEN=$PROMPT CPU_BENCH_DECODE=$DECODE CPU_BENCH_BATCHES=$BATCHES \
    cargo bench -q -p infergate-engine --bench cpu_model | tail -n 1 > "$out/ours$i.json"
  "$PY" engine/tests/reference/bench_reference.py --model "$model" --prompt-len $PROMPT \
    --decode-tokens $DECODE --batches $BATCHES > "$out/ref$i.json" 2>/dev/null
done

"$PY" - "$out" <<'PYEOF'
import json, sys, os
out = sys.argv[1]
print("| model | implementation | prefill 128 tok/s | decode B=1 tok/s | decode B=8 tok/s |")
print("|---|---|---|---|---|")
i = 1
while os.path.exists(f"{out}/ours{i}.json"):
    ours = json.load(open(f"{out}/ours{i}.json"))
    ref = json.load(open(f"{out}/ref{i}.json"))
    name = os.path.basename(ours["model"].rstrip("/"))
    rd = {str(d["batch"]): d["tokens_per_s"] for d in ref["decode"]}
    od = ours["decode_tok_s"]
    print(f"| {name} ({ours['parameters']/1e6:.0f}M) | infergate cpu | {ours['prefill_tok_s']:.0f} | {od['1']:.1f} | {od['8']:.1f} |")
    print(f"| | {ref['library']} | {ref['prefill']['tokens_per_s']:.0f} | {rd['1']:.1f} | {rd['8']:.1f} |")
    print(f"| | ratio ours/reference | {ours['prefill_tok_s']/ref['prefill']['tokens_per_s']:.2f} | {od['1']/rd['1']:.2f} | {od['8']/rd['8']:.2f} |")
    i += 1
PYEOF
