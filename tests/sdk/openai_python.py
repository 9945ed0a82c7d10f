"""The official OpenAI Python SDK against infergate, unchanged: every call a user's tools make.

Run by tests/e2e/openai/openai_sdk.rs with OPENAI_BASE_URL (the gateway's /v1) and OPENAI_API_KEY set.
SIM is the sim-backed model, CPU the real model on the cpu backend. Exits non-zero, naming the
failed check, on the first one that does not hold.
"""

import math
import os
import sys
import urllib.request

import openai

SIM = os.environ.get("SDK_SIM_MODEL", "llama-3-8b")
CPU = os.environ.get("SDK_CPU_MODEL", "infergate-tiny")
client = openai.OpenAI(max_retries=0, timeout=60)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.split(':')[0]}")


def norm(v):
    return math.sqrt(sum(x * x for x in v))


# What guidellm checks before a run: GET /health (no /v1), then the models list.
base = str(client.base_url).rstrip("/")
root = base[: -len("/v1")] if base.endswith("/v1") else base
with urllib.request.urlopen(f"{root}/health", timeout=10) as res:
    check(res.status == 200, f"GET /health: {res.status}")
check(any(m.id == SIM for m in client.models.list()), "models.list names the sim model")

m = client.models.retrieve(SIM)
check(m.id == SIM and m.object == "model", f"models.retrieve: {m}")
try:
    client.models.retrieve("no-such-model")
    check(False, "models.retrieve of an unknown model raised")
except openai.NotFoundError:
    check(True, "models.retrieve of an unknown model: NotFoundError")

for model in (SIM, CPU):
    e = client.embeddings.create(model=model, input=["hello world", "hello world", "other text"])
    dims = {len(d.embedding) for d in e.data}
    check(len(e.data) == 3 and len(dims) == 1 and dims.pop() > 0, f"embeddings {model}: shape")
    check([d.index for d in e.data] == [0, 1, 2], f"embeddings {model}: indices")
    check(all(abs(norm(d.embedding) - 1.0) < 1e-3 for d in e.data), f"embeddings {model}: unit norm")
    check(e.data[0].embedding == e.data[1].embedding, f"embeddings {model}: same input, same vector")
    check(e.data[0].embedding != e.data[2].embedding, f"embeddings {model}: other input, other vector")
    check(e.usage.prompt_tokens > 0 and e.usage.total_tokens == e.usage.prompt_tokens,
          f"embeddings {model}: usage {e.usage}")

r = client.responses.create(model=SIM, input="Say hello.", instructions="Be brief.",
                            max_output_tokens=8)
# Cut by max_output_tokens, a response is `incomplete` (as OpenAI answers), else `completed`.
check(r.status in ("completed", "incomplete") and r.output_text != "", f"responses.create: {r}")
check(0 < r.usage.output_tokens <= 8 and r.usage.input_tokens > 0, f"responses usage: {r.usage}")
events, deltas, done = [], [], None
with client.responses.create(model=SIM, input="Say hello.", max_output_tokens=8,
                             stream=True) as stream:
    for ev in stream:
        events.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        if ev.type in ("response.completed", "response.incomplete"):
            done = ev.response
check(events[0] == "response.created"
      and events[-1] in ("response.completed", "response.incomplete"),
      f"responses stream events: {events}")
check(done is not None and done.output_text == "".join(deltas) and deltas,
      "responses stream: deltas add up to the final text")
check(0 < done.usage.output_tokens <= 8, f"responses stream usage: {done.usage}")

c = client.completions.create(model=SIM, prompt="Once upon a time", n=3, max_tokens=5,
                              extra_body={"ignore_eos": True})
check(sorted(ch.index for ch in c.choices) == [0, 1, 2], f"n=3 choices: {c.choices}")
check(c.usage.completion_tokens == 15, f"n=3 usage counts every choice: {c.usage}")

prompt = "The capital of France is"
c = client.completions.create(model=CPU, prompt=prompt, echo=True, logprobs=1, max_tokens=1,
                              temperature=0, extra_body={"ignore_eos": True})
lp = c.choices[0].logprobs
check(c.choices[0].text.startswith(prompt), f"echo: {c.choices[0].text!r}")
check(lp.token_logprobs[0] is None and all(x is not None for x in lp.token_logprobs[1:]),
      f"echo logprobs: first prompt token null, others numbers: {lp.token_logprobs}")
check(len(lp.tokens) == c.usage.prompt_tokens + 1, f"echo logprobs cover prompt and answer: {lp}")

chat = client.chat.completions.create(
    model=CPU, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
    logprobs=True, top_logprobs=5, extra_body={"ignore_eos": True})
content = chat.choices[0].logprobs.content
check(len(content) == 4, f"chat logprobs per token: {content}")
for t in content:
    probs = [math.exp(x.logprob) for x in t.top_logprobs]
    check(len(probs) == 5 and sum(probs) <= 1 + 1e-6, f"top_logprobs=5 sum <= 1: {probs}")
    check(probs == sorted(probs, reverse=True), "top_logprobs sorted")
    check(abs(t.logprob - t.top_logprobs[0].logprob) < 1e-4, "greedy token is the top one")

texts = [client.chat.completions.create(
    model=SIM, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=12,
    temperature=1.0, seed=42).choices[0].message.content for _ in range(2)]
check(texts[0] == texts[1], f"seed reproducibility: {texts}")

stream = client.chat.completions.create(
    model=SIM, messages=[{"role": "user", "content": "Hello"}], max_tokens=6, stream=True,
    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
chunks = list(stream)
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6,
      f"streamed chat with include_usage: {chunks[-1]}")
print("all checks passed")
