// The official OpenAI Node SDK against infergate, unchanged. Run by tests/openai_sdk.rs with
// OPENAI_BASE_URL (the gateway's /v1) and OPENAI_API_KEY set; exits non-zero, naming the failed
// check, on the first one that does not hold.
import OpenAI from "openai";

const SIM = process.env.SDK_SIM_MODEL ?? "llama-3-8b";
const CPU = process.env.SDK_CPU_MODEL ?? "infergate-tiny";
const client = new OpenAI({ maxRetries: 0, timeout: 60_000 });

function check(cond, what) {
  if (!cond) {
    console.error(`FAILED: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what.split(":")[0]}`);
}
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const str = (v) => JSON.stringify(v);

const m = await client.models.retrieve(SIM);
check(m.id === SIM && m.object === "model", `models.retrieve: ${str(m)}`);
try {
  await client.models.retrieve("no-such-model");
  check(false, "models.retrieve of an unknown model threw");
} catch (e) {
  check(e instanceof OpenAI.NotFoundError, `models.retrieve unknown: ${e}`);
}

for (const model of [SIM, CPU]) {
  const e = await client.embeddings.create({ model, input: ["hello world", "hello world", "other"] });
  const v = e.data.map((d) => d.embedding);
  check(v.length === 3 && v[0].length > 0 && v.every((x) => x.length === v[0].length), `embeddings ${model}: shape`);
  check(v.every((x) => Math.abs(norm(x) - 1) < 1e-3), `embeddings ${model}: unit norm`);
  check(str(v[0]) === str(v[1]) && str(v[0]) !== str(v[2]), `embeddings ${model}: same input, same vector`);
  check(e.usage.prompt_tokens > 0, `embeddings ${model}: usage ${str(e.usage)}`);
}

const r = await client.responses.create({ model: SIM, input: "Say hello.", max_output_tokens: 8 });
check(["completed", "incomplete"].includes(r.status) && r.output_text.length > 0, `responses.create: ${str(r)}`);
check(r.usage.output_tokens > 0 && r.usage.output_tokens <= 8, `responses usage: ${str(r.usage)}`);
const stream = await client.responses.create({ model: SIM, input: "Say hello.", max_output_tokens: 8, stream: true });
const types = [];
let text = "";
let done;
for await (const ev of stream) {
  types.push(ev.type);
  if (ev.type === "response.output_text.delta") text += ev.delta;
  if (ev.type === "response.completed" || ev.type === "response.incomplete") done = ev.response;
}
check(types[0] === "response.created" && ["response.completed", "response.incomplete"].includes(types.at(-1)), `responses stream: ${str(types)}`);
// The stream's events are raw JSON (output_text is a convenience of create() only).
const final = done?.output?.[0]?.content?.[0]?.text;
check(final === text && text.length > 0, `responses stream: deltas add up to the final text ${str(done)}`);

const c = await client.completions.create({ model: SIM, prompt: "Once upon a time", n: 3, max_tokens: 5, ignore_eos: true });
check(str(c.choices.map((x) => x.index).sort()) === "[0,1,2]", `n=3: ${str(c.choices)}`);
check(c.usage.completion_tokens === 15, `n=3 usage: ${str(c.usage)}`);

const echo = await client.completions.create({ model: CPU, prompt: "The capital of France is", echo: true, logprobs: 1, max_tokens: 1, temperature: 0 });
const lp = echo.choices[0].logprobs;
check(echo.choices[0].text.startsWith("The capital of France is"), `echo: ${str(echo.choices[0].text)}`);
check(lp.token_logprobs[0] === null && lp.token_logprobs.slice(1).every((x) => typeof x === "number"), `echo logprobs: ${str(lp.token_logprobs)}`);

const chat = await client.chat.completions.create({ model: CPU, messages: [{ role: "user", content: "Hi" }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 5, ignore_eos: true });
for (const t of chat.choices[0].logprobs.content) {
  const p = t.top_logprobs.map((x) => Math.exp(x.logprob));
  check(p.length === 5 && p.reduce((a, b) => a + b, 0) <= 1 + 1e-6, `top_logprobs=5: ${str(p)}`);
}

const seeded = async () =>
  (await client.chat.completions.create({ model: SIM, messages: [{ role: "user", content: "Tell me a story." }], max_tokens: 12, temperature: 1, seed: 42 })).choices[0].message.content;
const [a, b] = [await seeded(), await seeded()];
check(a === b, `seed reproducibility: ${str([a, b])}`);
console.log("all checks passed");
