#!/usr/bin/env python3
"""Write a seeded random checkpoint with the shape of a real model.

Useful for benchmarking the engine and the reference at realistic sizes
without downloading weights. The weights are random (randn * 0.02, norm
weights 1.0), so the model produces no meaningful text, but every tensor
name, shape, dtype and config field matches the real architecture.

Usage:
    HF_HUB_OFFLINE=1 python engine/tests/reference/make_random_checkpoint.py \
        /tmp/ref/qwen05b --shape qwen2.5-0.5b

Writes OUT_DIR/{config.json, generation_config.json, model.safetensors}
(about 1 GB in bfloat16 for qwen2.5-0.5b).

The model is constructed on the meta device (no default HF initialization),
then materialized with uninitialized storage and filled tensor by tensor
from a seeded generator, which takes seconds rather than minutes.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import add_legacy_config_keys  # noqa: E402


def qwen25_05b_config():
    """Qwen2.5-0.5B's architecture (attention q/k/v biases, tied embeddings)."""
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=32768,
        max_window_layers=24,
        bos_token_id=151643,
        eos_token_id=151643,
    )


SHAPES = {
    "qwen2.5-0.5b": (Qwen2ForCausalLM, qwen25_05b_config),
}

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def main():
    parser = argparse.ArgumentParser(description="seeded random checkpoint of a real model's shape")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--std", type=float, default=0.02)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    model_cls, make_config = SHAPES[args.shape]
    config = make_config()

    t0 = time.perf_counter()
    with torch.device("meta"):
        model = model_cls(config)
    model = model.to(dtype)  # still meta; sets the parameter dtype
    model.to_empty(device="cpu")  # real, uninitialized storage
    model.tie_weights()  # to_empty gives tied parameters separate storage; re-tie

    gen = torch.Generator().manual_seed(args.seed)
    n_params = 0
    with torch.no_grad():
        # named_parameters() yields a tied tensor once, so ties are preserved.
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * args.std)
            n_params += param.numel()
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    fill_s = time.perf_counter() - t0

    # Non-persistent buffers (RoPE inv_freq) are garbage after to_empty; they are
    # not saved and get recomputed when the checkpoint is loaded.
    model.config.dtype = dtype
    args.out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out_dir)
    add_legacy_config_keys(args.out_dir / "config.json")
    for p in args.out_dir.iterdir():
        p.chmod(0o644)
    total_s = time.perf_counter() - t0

    size = sum(p.stat().st_size for p in args.out_dir.glob("*.safetensors"))
    print(json.dumps({
        "out_dir": str(args.out_dir),
        "shape": args.shape,
        "dtype": args.dtype,
        "seed": args.seed,
        "params": n_params,
        "safetensors_bytes": size,
        "fill_s": round(fill_s, 2),
        "total_s": round(total_s, 2),
        "library": f"transformers {transformers.__version__} / torch {torch.__version__}",
    }, indent=2))


if __name__ == "__main__":
    sys.exit(main())
