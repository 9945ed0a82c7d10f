#!/usr/bin/env python3
"""Measure the reference implementation (transformers + torch, CPU, float32).

Reports, as JSON on stdout:
  * prefill tokens/s: one forward over batch 1 x --prompt-len tokens
    (fresh KV cache, only the last position's logits), best of 3 after a warm-up;
  * decode tokens/s for each --batches entry: after an untimed prefill of
    batch x --prompt-len random tokens, a manual greedy loop of
    --decode-tokens single-token steps with a DynamicCache; only the decode
    steps are timed; tokens/s = batch * decode_tokens / time, best of 3.

--model is either a Hugging Face model directory (config.json + safetensors)
or a .gguf file, which transformers dequantizes to float32 on load.

Example:
    HF_HUB_OFFLINE=1 python engine/tests/reference/bench_reference.py \
        --model /tmp/ref/qwen05b --prompt-len 128 --decode-tokens 32 --batches 1,8
"""

import argparse
import inspect
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

REPEATS = 3


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_model(model_arg, attn):
    path = Path(model_arg)
    kwargs = {"dtype": torch.float32, "attn_implementation": attn}
    if path.is_file() and path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, **kwargs
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    model.eval()
    return model


class Runner:
    """Thin wrapper that hides the transformers 4.x / 5.x argument names."""

    def __init__(self, model):
        self.model = model
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.2x names the KV cache argument `cache`.
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.keep_kw = "logits_to_keep" if "logits_to_keep" in params else None

    def new_cache(self):
        return DynamicCache(config=self.model.config)

    @torch.no_grad()
    def forward(self, input_ids, cache):
        kwargs = {"input_ids": input_ids, "use_cache": True, self.cache_kw: cache}
        if self.keep_kw:
            kwargs[self.keep_kw] = 1
        return self.model(**kwargs).logits[:, -1, :]


def time_prefill(runner, prompt):
    runner.forward(prompt, runner.new_cache())  # warm-up
    times = []
    for _ in range(REPEATS):
        cache = runner.new_cache()
        t0 = time.perf_counter()
        runner.forward(prompt, cache)
        times.append(time.perf_counter() - t0)
    return times


def time_decode(runner, prompts, steps):
    """Untimed prefill, then `steps` greedy single-token steps (timed)."""
    cache = runner.new_cache()
    logits = runner.forward(prompts, cache)
    next_ids = logits.argmax(dim=-1, keepdim=True)
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = runner.forward(next_ids, cache)
        next_ids = logits.argmax(dim=-1, keepdim=True)
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description="transformers/torch CPU float32 reference benchmark")
    parser.add_argument("--model", required=True, help="HF model directory or .gguf file")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--batches", default="1,8", help="comma-separated decode batch sizes")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                        help="attention implementation (default sdpa, transformers' fastest on CPU)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]

    t0 = time.perf_counter()
    model = load_model(args.model, args.attn)
    load_s = time.perf_counter() - t0
    runner = Runner(model)
    config = model.config
    vocab = config.vocab_size
    n_params = sum(p.numel() for p in model.parameters())
    log(f"loaded {args.model} in {load_s:.1f}s: {config.model_type}, {n_params / 1e6:.1f}M params, "
        f"vocab {vocab}, threads {torch.get_num_threads()}")

    gen = torch.Generator().manual_seed(args.seed)
    max_batch = max(batches) if batches else 1
    all_prompts = torch.randint(0, vocab, (max(max_batch, 1), args.prompt_len), generator=gen)

    result = {
        "library": f"transformers {transformers.__version__} / torch {torch.__version__}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "model": str(args.model),
        "model_type": config.model_type,
        "params": n_params,
        "dtype": "float32",
        "attn_implementation": args.attn,
        "load_s": round(load_s, 3),
        "prompt_len": args.prompt_len,
        "decode_tokens": args.decode_tokens,
        "seed": args.seed,
    }

    log("prefill ...")
    times = time_prefill(runner, all_prompts[:1])
    best = min(times)
    result["prefill"] = {
        "batch": 1,
        "tokens": args.prompt_len,
        "tokens_per_s": round(args.prompt_len / best, 2),
        "best_s": round(best, 4),
        "all_s": [round(t, 4) for t in times],
    }
    log(f"prefill: {result['prefill']['tokens_per_s']} tok/s")

    result["decode"] = []
    for batch in batches:
        prompts = all_prompts[:batch]
        time_decode(runner, prompts, min(2, args.decode_tokens))  # warm-up
        times = [time_decode(runner, prompts, args.decode_tokens) for _ in range(REPEATS)]
        best = min(times)
        entry = {
            "batch": batch,
            "tokens_per_s": round(batch * args.decode_tokens / best, 2),
            "ms_per_step": round(1000 * best / args.decode_tokens, 2),
            "best_s": round(best, 4),
            "all_s": [round(t, 4) for t in times],
        }
        result["decode"].append(entry)
        log(f"decode batch {batch}: {entry['tokens_per_s']} tok/s")

    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
