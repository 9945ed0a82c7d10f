#!/usr/bin/env python3
"""Create tiny random Llama-family checkpoints plus reference logits.

The checkpoints are built with Hugging Face transformers' own model classes
and saved with save_pretrained(); the reference logits are computed by
transformers/torch in float32 with the eager attention implementation.
The Rust engine's tests load the same safetensors files and compare their
logits against logits.json.

Usage (from the repository root):

    HF_HUB_OFFLINE=1 python engine/tests/reference/make_fixtures.py

Output: engine/tests/fixtures/reference/<name>/{config.json,
generation_config.json, model*.safetensors[.index.json], logits.json}

Everything is seeded, so re-running with the same torch/transformers versions
reproduces the same weights and (to float32 rounding) the same logits.
"""

import argparse
import copy
import inspect
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

SCRIPT_REL = "engine/tests/reference/make_fixtures.py"
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_OUT = REPO_ROOT / "engine" / "tests" / "fixtures" / "reference"

PROMPT_LENGTHS = (1, 7, 37)
DECIMALS = 6


def fixture_specs():
    """The three fixtures: name -> (model class, config, storage dtype, save kwargs, seed)."""
    llama_gqa = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )

    llama3_tied = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )

    qwen2_bias = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
    )

    return [
        ("llama_gqa_f32", LlamaForCausalLM, llama_gqa, torch.float32, {}, 1001),
        (
            "llama3_rope_tied_bf16_sharded",
            LlamaForCausalLM,
            llama3_tied,
            torch.bfloat16,
            {"max_shard_size": "50KB"},
            1002,
        ),
        ("qwen2_bias_f16", Qwen2ForCausalLM, qwen2_bias, torch.float16, {}, 1003),
    ]


def reinit_parameters(model, seed):
    """Give every parameter a non-degenerate random value under a fixed seed.

    Norm weights: 1 + 0.1*randn, biases: 0.1*randn, everything else
    (embeddings, projections, lm_head): 0.2*randn.  Tied parameters appear
    once in named_parameters(), so the tie is preserved.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name.endswith(".bias"):
                value = 0.1 * noise
            elif "norm" in name:
                value = 1.0 + 0.1 * noise
            else:
                value = 0.2 * noise
            param.copy_(value.to(param.dtype))


def make_prompts(vocab_size, seed):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS
    ]


@torch.no_grad()
def compute_logits(model, prompts):
    """Full-sequence logits (float32) for each prompt, batch size 1, no cache."""
    out = []
    for ids in prompts:
        input_ids = torch.tensor([ids], dtype=torch.long)
        logits = model(input_ids=input_ids, use_cache=False).logits[0]
        out.append(logits.to(torch.float32))
    return out


def cache_kwarg_name(model):
    """transformers >= 5.2x calls the KV-cache argument `cache`; older ones `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def load_f32(path):
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    return model


def add_legacy_config_keys(config_path):
    """Add the pre-v5 spellings of the RoPE/dtype fields to config.json.

    transformers 5 writes `rope_parameters` (with rope_theta inside) and
    `dtype`; most checkpoints in the wild use top-level `rope_theta`,
    `rope_scaling` and `torch_dtype`. Writing both keeps the fixtures
    readable by either kind of loader. The values are copies, so
    transformers reads the same model either way (the reload self-check
    below runs on the rewritten file).
    """
    with open(config_path) as f:
        cfg = json.load(f)
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            cfg.setdefault(
                "rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"}
            )
    if "dtype" in cfg:
        cfg.setdefault("torch_dtype", cfg["dtype"])
    with open(config_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def build_fixture(out_root, name, model_cls, config, store_dtype, save_kwargs, seed):
    out_dir = out_root / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)

    torch.manual_seed(seed)
    model = model_cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    reinit_parameters(model, seed)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    # Save a copy converted to the storage dtype. The in-memory model keeps
    # float32 buffers (e.g. RoPE inv_freq) and only has its parameters rounded
    # through the storage dtype, so it is the exact twin of the checkpoint
    # reloaded as float32.
    to_save = copy.deepcopy(model).to(store_dtype)
    to_save.save_pretrained(out_dir, **save_kwargs)
    del to_save
    add_legacy_config_keys(out_dir / "config.json")
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(store_dtype).to(torch.float32))
    in_memory = model

    prompts = make_prompts(config.vocab_size, seed + 500)
    expected = compute_logits(in_memory, prompts)

    # Reference logits come from the checkpoint as saved, reloaded as float32.
    reloaded = load_f32(out_dir)
    reference = compute_logits(reloaded, prompts)

    # Self-check 1: the saved checkpoint reproduces the in-memory model.
    reload_diff = max((a - b).abs().max().item() for a, b in zip(expected, reference))
    assert reload_diff <= 1e-5, f"{name}: reload differs by {reload_diff}"

    # Self-check 2: logits at the last position via an incremental KV-cache
    # decode match the full forward (guards against a broken reference).
    ids = prompts[-1]
    with torch.no_grad():
        cache = DynamicCache(config=reloaded.config)
        cache_kw = cache_kwarg_name(reloaded)
        step_logits = []
        for tok in ids:
            o = reloaded(input_ids=torch.tensor([[tok]]), use_cache=True, **{cache_kw: cache})
            step_logits.append(o.logits[0, -1].to(torch.float32))
        cache_diff = (torch.stack(step_logits) - reference[-1]).abs().max().item()
    assert cache_diff <= 1e-4, f"{name}: cached decode differs by {cache_diff}"

    cases = []
    for ids, logits in zip(prompts, reference):
        cases.append(
            {
                "prompt_ids": ids,
                "max_abs_logit": round(logits.abs().max().item(), DECIMALS),
                "logits": [[round(v, DECIMALS) for v in row] for row in logits.tolist()],
            }
        )
    doc = {
        "library": f"transformers {transformers.__version__} / torch {torch.__version__}",
        "script": SCRIPT_REL,
        "dtype": "float32 compute",
        "storage_dtype": str(store_dtype).replace("torch.", ""),
        "attn_implementation": "eager",
        "seed": seed,
        "cases": cases,
    }
    with open(out_dir / "logits.json", "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")

    # Self-check 3: a fresh reload agrees with the rounded values on disk.
    with open(out_dir / "logits.json") as f:
        stored = json.load(f)
    again = compute_logits(load_f32(out_dir), [c["prompt_ids"] for c in stored["cases"]])
    json_diff = max(
        (torch.tensor(c["logits"]) - t).abs().max().item()
        for c, t in zip(stored["cases"], again)
    )
    assert json_diff <= 1e-5, f"{name}: logits.json differs from reload by {json_diff}"

    for p in out_dir.iterdir():
        p.chmod(0o644)  # save_pretrained creates the weight files 0600
    files = sorted(p.name for p in out_dir.iterdir())
    weight_bytes = sum(
        p.stat().st_size for p in out_dir.iterdir() if p.suffix == ".safetensors"
    )
    shards = [f for f in files if f.endswith(".safetensors")]
    print(
        f"{name}: {len(shards)} safetensors file(s), {weight_bytes} weight bytes; "
        f"max|logit| per case = {[c['max_abs_logit'] for c in cases]}; "
        f"self-check: reload diff {reload_diff:.2e}, cached-decode diff {cache_diff:.2e}, "
        f"json-vs-reload diff {json_diff:.2e}"
    )
    return out_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    print(f"transformers {transformers.__version__} / torch {torch.__version__}", file=sys.stderr)

    for name, model_cls, config, store_dtype, save_kwargs, seed in fixture_specs():
        build_fixture(args.out, name, model_cls, config, store_dtype, save_kwargs, seed)


if __name__ == "__main__":
    main()
