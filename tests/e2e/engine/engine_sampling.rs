//! End-to-end tests of the engine's sampling surface over real HTTP to real processes: `n`
//! parallel choices sharing the prompt's KV blocks, `best_of`, list prompts, `echo`, logprobs
//! (completions and chat, streamed and not), seeds, and the 400s for bad values; on the `sim`
//! backend and the `cpu` backend (the default model, and SmolLM2 when present).

use crate::common;

use common::{Engine, assert_error, post_json, stream, words};
use hyper::StatusCode;
use serde_json::{Value, json};

const MODEL: &str = "llama-3-8b";

fn completion(prompt: Value, max_tokens: u64, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens});
    merge(&mut body, extra);
    body
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
}

fn choices(res: &Value) -> &Vec<Value> {
    res["choices"]
        .as_array()
        .unwrap_or_else(|| panic!("no choices in {res}"))
}

fn texts(res: &Value) -> Vec<String> {
    choices(res)
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_owned())
        .collect()
}

/// Sum of a completions choice's generated tokens' logprobs.
fn cumulative(choice: &Value) -> f64 {
    choice["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .sum()
}

async fn sim() -> Engine {
    Engine::start(&["--gpu", "h100"]).await
}

#[tokio::test]
async fn n_choices_share_the_prompt_blocks_and_usage_counts_every_choice() {
    let e = sim().await;
    let url = e.at("/v1/completions");
    // 60 words: several full 16-token blocks for the siblings to share.
    let prompt = words(60, 1);
    let body = completion(
        json!(prompt),
        5,
        json!({"n": 3, "ignore_eos": true, "seed": 11, "temperature": 1.0}),
    );
    let hits_before = e.metric("vllm:prefix_cache_hits_total").await;
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let cs = choices(&res);
    assert_eq!(cs.len(), 3, "{res}");
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(c["text"].as_str().unwrap().split_whitespace().count(), 5);
    }
    let t = texts(&res);
    assert!(t[0] != t[1] || t[1] != t[2], "choices differ: {t:?}");
    let usage = &res["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!((55..=70).contains(&prompt_tokens), "counted once: {usage}");
    assert_eq!(usage["completion_tokens"], 15, "every choice: {usage}");
    assert_eq!(usage["total_tokens"], prompt_tokens + 15);
    // The two siblings read the first sequence's full prompt blocks from the prefix cache.
    let full_blocks = (prompt_tokens - 1) / 16 * 16;
    let hits = e.metric("vllm:prefix_cache_hits_total").await - hits_before;
    assert_eq!(hits, (2 * full_blocks) as f64, "{usage}");
    // The request counts once in the request-level histograms, with n = 3.
    assert_eq!(e.metric("vllm:request_params_n_count").await, 1.0);
    assert_eq!(e.metric("vllm:request_params_n_sum").await, 3.0);

    // Chat: the same, with message choices.
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                      "max_tokens": 4, "n": 2, "ignore_eos": true});
    let (status, _, res) = post_json(&e.at("/v1/chat/completions"), &chat).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(choices(&res).len(), 2);
    assert_eq!(res["choices"][1]["index"], 1);
    assert!(res["choices"][1]["message"]["content"].is_string());
    assert_eq!(res["usage"]["completion_tokens"], 8);
}

#[tokio::test]
async fn best_of_returns_the_n_with_the_highest_cumulative_logprob() {
    let e = sim().await;
    let url = e.at("/v1/completions");
    let prompt = json!("rivers stones rivers light garden rivers window stones paper");
    let extra = json!({"seed": 5, "ignore_eos": true, "logprobs": 0, "temperature": 1.0});
    // n = 4 with the same seed runs the very same four sequences best_of = 4 chooses from.
    let mut all = extra.clone();
    merge(&mut all, json!({"n": 4}));
    let (status, _, every) = post_json(&url, &completion(prompt.clone(), 6, all)).await;
    assert_eq!(status, StatusCode::OK, "{every}");
    let mut ranked: Vec<(f64, String)> = choices(&every)
        .iter()
        .map(|c| (cumulative(c), c["text"].as_str().unwrap().to_owned()))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));

    let mut best = extra.clone();
    merge(&mut best, json!({"n": 2, "best_of": 4}));
    let (status, _, res) = post_json(&url, &completion(prompt.clone(), 6, best)).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let cs = choices(&res);
    assert_eq!(cs.len(), 2, "{res}");
    assert_eq!(cs[0]["index"], 0);
    assert_eq!(cs[1]["index"], 1);
    assert!(
        cumulative(&cs[0]) >= cumulative(&cs[1]),
        "best first: {res}"
    );
    assert!(
        (cumulative(&cs[0]) - ranked[0].0).abs() < 1e-6,
        "{ranked:?} vs {res}"
    );
    assert!(
        (cumulative(&cs[1]) - ranked[1].0).abs() < 1e-6,
        "{ranked:?} vs {res}"
    );
    assert_eq!(res["usage"]["completion_tokens"], 12, "returned choices");

    // Without logprobs asked for, they are still ranked but not shown.
    let (status, _, res) = post_json(
        &url,
        &completion(
            prompt,
            6,
            json!({"seed": 5, "ignore_eos": true, "n": 1, "best_of": 4}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(choices(&res).len(), 1);
    assert!(res["choices"][0]["logprobs"].is_null());
    // The sim's probabilities tie often: the text is one of those with the best sum.
    let best: Vec<&str> = ranked
        .iter()
        .filter(|(c, _)| (c - ranked[0].0).abs() < 1e-6)
        .map(|(_, t)| t.as_str())
        .collect();
    let text = res["choices"][0]["text"].as_str().unwrap();
    assert!(best.contains(&text), "{text:?} not among {best:?}");
}

#[tokio::test]
async fn list_prompts_get_their_own_choices_in_prompt_major_order() {
    let e = sim().await;
    let url = e.at("/v1/completions");
    let prompts = ["rivers stones rivers stones", "garden window garden window"];
    let body = completion(json!(prompts), 3, json!({"n": 2, "ignore_eos": true}));
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let cs = choices(&res);
    assert_eq!(cs.len(), 4, "{res}");
    for (k, c) in cs.iter().enumerate() {
        assert_eq!(c["index"], k);
        // The sim answers with its prompt's own words: choice k belongs to prompt k / n.
        let own: Vec<&str> = prompts[k / 2].split(' ').collect();
        for w in c["text"].as_str().unwrap().split_whitespace() {
            assert!(own.contains(&w), "choice {k}: {w:?} not from {own:?}");
        }
    }
    // Each prompt alone gives the same prompt tokens; together they add up.
    let mut sum = 0;
    for p in prompts {
        let (_, _, one) = post_json(&url, &completion(json!(p), 1, json!({}))).await;
        sum += one["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    assert_eq!(res["usage"]["prompt_tokens"], sum);
    assert_eq!(res["usage"]["completion_tokens"], 12);

    // Token-id arrays too.
    let ids = json!([[1000, 1001, 1002], [2000, 2001]]);
    let (status, _, res) = post_json(&url, &completion(ids, 2, json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(choices(&res).len(), 2);
    assert_eq!(res["usage"]["prompt_tokens"], 5);
}

/// Checks a completions `logprobs` object of `n` tokens with `k` alternatives, whose first
/// `nulls` entries (the echoed prompt's first token) have none.
fn check_completion_logprobs(l: &Value, n: usize, k: usize, nulls: usize) {
    let tokens = l["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), n, "{l}");
    let lps = l["token_logprobs"].as_array().unwrap();
    let tops = l["top_logprobs"].as_array().unwrap();
    let offsets = l["text_offset"].as_array().unwrap();
    assert_eq!((lps.len(), tops.len(), offsets.len()), (n, n, n));
    for i in 0..n {
        if i < nulls {
            assert!(lps[i].is_null() && tops[i].is_null(), "{l}");
            continue;
        }
        let lp = lps[i].as_f64().unwrap();
        assert!(lp <= 0.0, "{lp}");
        let top = tops[i].as_object().unwrap();
        assert!(top.len() <= k && (k == 0 || !top.is_empty()), "{l}");
        let mass: f64 = top.values().map(|v| v.as_f64().unwrap().exp()).sum();
        assert!(mass <= 1.0 + 1e-6, "{mass}");
    }
    let offs: Vec<u64> = offsets.iter().map(|o| o.as_u64().unwrap()).collect();
    assert!(offs.windows(2).all(|w| w[0] <= w[1]), "{offs:?}");
    assert_eq!(offs[0], 0);
}

#[tokio::test]
async fn echo_with_logprobs_returns_the_prompt_tokens_first() {
    let e = sim().await;
    let url = e.at("/v1/completions");
    let prompt = "rivers and stones and light";
    let body = completion(
        json!(prompt),
        3,
        json!({"echo": true, "logprobs": 1, "ignore_eos": true}),
    );
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let c = &res["choices"][0];
    let text = c["text"].as_str().unwrap();
    assert!(text.starts_with(prompt), "{text:?}");
    assert!(text.len() > prompt.len());
    let n_prompt = res["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    check_completion_logprobs(&c["logprobs"], n_prompt + 3, 1, 1);
    let tokens: String = c["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens, text, "the tokens spell the text");

    // lm-eval's loglikelihood request: the prompt alone.
    let body = completion(json!(prompt), 0, json!({"echo": true, "logprobs": 1}));
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let c = &res["choices"][0];
    assert_eq!(c["text"], prompt);
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(res["usage"]["completion_tokens"], 0);
    check_completion_logprobs(&c["logprobs"], n_prompt, 1, 1);

    // Echo without logprobs; and streamed, the prompt comes first.
    let body = completion(json!(prompt), 2, json!({"echo": true}));
    let (_, _, res) = post_json(&url, &body).await;
    assert!(res["choices"][0]["logprobs"].is_null());
    assert!(
        res["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(prompt)
    );
    let mut body = completion(json!(prompt), 2, json!({"echo": true, "logprobs": 0}));
    body["stream"] = json!(true);
    let s = stream(&url, &body).await;
    let chunks = s.chunks();
    assert!(
        chunks[0]["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(prompt)
    );
    let first_lp = &chunks[0]["choices"][0]["logprobs"];
    assert!(first_lp["token_logprobs"][0].is_null(), "{first_lp}");
}

#[tokio::test]
async fn streamed_choices_carry_their_index_and_match_the_whole_answer() {
    let e = sim().await;
    let url = e.at("/v1/completions");
    let body = completion(
        json!("rivers stones light garden window paper"),
        6,
        json!({"n": 2, "seed": 3, "ignore_eos": true, "logprobs": 2, "temperature": 1.0,
               "stream_options": {"include_usage": true}, "stream": true}),
    );
    let s = stream(&url, &body).await;
    assert_eq!(s.status, StatusCode::OK);
    let chunks = s.chunks();
    let mut streamed = [String::new(), String::new()];
    let mut finished = [0, 0];
    let mut tokens = [0, 0];
    for c in &chunks {
        let Some(choice) = c["choices"].as_array().and_then(|a| a.first()) else {
            continue;
        };
        let i = choice["index"].as_u64().unwrap() as usize;
        streamed[i] += choice["text"].as_str().unwrap();
        if !choice["finish_reason"].is_null() {
            finished[i] += 1;
        }
        if let Some(t) = choice["logprobs"]["tokens"].as_array() {
            tokens[i] += t.len();
        }
    }
    assert_eq!(finished, [1, 1], "one finishing chunk per choice");
    assert_eq!(tokens, [6, 6], "every token's logprob, streamed");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 12, "{usage}");

    let mut whole = body.clone();
    whole["stream"] = json!(false);
    whole.as_object_mut().unwrap().remove("stream_options");
    let (_, _, res) = post_json(&url, &whole).await;
    assert_eq!(texts(&res), streamed.to_vec(), "streamed = whole");

    // Chat streams open each choice with its role chunk.
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello there"}],
                      "max_tokens": 3, "n": 2, "stream": true, "ignore_eos": true});
    let s = stream(&e.at("/v1/chat/completions"), &chat).await;
    for i in 0..2 {
        let first = s
            .chunks()
            .into_iter()
            .find(|c| c["choices"][0]["index"] == i)
            .unwrap();
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    }
}

#[tokio::test]
async fn the_same_seed_reproduces_every_choice() {
    let e = sim().await;
    let url = e.at("/v1/completions");
    let body = |seed: u64| {
        completion(
            json!("rivers stones light garden window paper silver market"),
            8,
            json!({"n": 3, "seed": seed, "temperature": 1.0}),
        )
    };
    let (_, _, a) = post_json(&url, &body(7)).await;
    let (_, _, b) = post_json(&url, &body(7)).await;
    let (_, _, c) = post_json(&url, &body(8)).await;
    assert_eq!(texts(&a), texts(&b));
    assert_ne!(texts(&a), texts(&c));
    // Choice 0 of n = 3 is the n = 1 answer with that seed.
    let mut one = body(7);
    one["n"] = json!(1);
    let (_, _, single) = post_json(&url, &one).await;
    assert_eq!(texts(&single)[0], texts(&a)[0]);
}

#[tokio::test]
async fn bad_choice_and_logprob_parameters_are_400s_naming_the_field() {
    let e = Engine::start(&["--gpu", "h100", "--max-waiting-requests", "8"]).await;
    let url = e.at("/v1/completions");
    let chat_url = e.at("/v1/chat/completions");
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (&url, completion(json!("hi"), 4, json!({"n": 0})), "n"),
        (&url, completion(json!("hi"), 4, json!({"n": 129})), "n"),
        (
            &url,
            completion(json!("hi"), 4, json!({"n": 3, "best_of": 2})),
            "best_of",
        ),
        (
            &url,
            completion(json!("hi"), 4, json!({"best_of": 3, "stream": true})),
            "best_of",
        ),
        (
            &url,
            completion(json!("hi"), 4, json!({"logprobs": 21})),
            "logprobs",
        ),
        (&url, completion(json!("hi"), 0, json!({})), "max_tokens"),
        (&url, completion(json!(["a", ""]), 4, json!({})), "prompt"),
        (&url, completion(json!(["a", 1]), 4, json!({})), "prompt"),
        // 2 prompts × 5 sequences > the queue of 8.
        (
            &url,
            completion(json!(["a", "b"]), 4, json!({"n": 5})),
            "prompt",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": msgs, "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": msgs, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": msgs, "echo": true}),
            "echo",
        ),
    ];
    for (u, body, param) in cases {
        let (status, _, res) = post_json(u, &body).await;
        let err = assert_error(status, &res, &[]);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {res}");
        assert_eq!(err["param"], param, "{body}: {res}");
        assert_eq!(err["type"], "invalid_request_error");
    }
}

/// Checks a chat `logprobs.content` list against greedy decoding with `k` alternatives.
fn check_chat_logprobs(content: &[Value], k: usize) {
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), k, "{entry}");
        let values: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(
            values.windows(2).all(|w| w[0] >= w[1]),
            "sorted: {values:?}"
        );
        let mass: f64 = values.iter().map(|v| v.exp()).sum();
        assert!(mass <= 1.0 + 1e-6, "{mass}");
        // Temperature 0 takes the argmax, which is the top entry, with the same logprob.
        assert_eq!(top[0]["token"], entry["token"], "{entry}");
        assert_eq!(top[0]["logprob"], entry["logprob"], "{entry}");
        let bytes: Vec<u8> = entry["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            entry["token"].as_str().unwrap()
        );
    }
}

#[tokio::test]
async fn cpu_chat_top_logprobs_are_sorted_probabilities_of_the_greedy_tokens() {
    let (e, dir, model) = common::cpu_default("sampling-chat-logprobs", &[]).await;
    let url = e.at("/v1/chat/completions");
    let body = json!({"model": model, "messages": [{"role": "user", "content": "Tell me a story"}],
                      "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 5});
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let content = res["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!content.is_empty());
    assert!(content.len() as u64 >= res["usage"]["completion_tokens"].as_u64().unwrap());
    check_chat_logprobs(content, 5);

    // Streamed, the same entries arrive with their chunks.
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let s = stream(&url, &streamed_body).await;
    let streamed: Vec<Value> = s
        .chunks()
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, content);

    // lm-eval's loglikelihood pattern on real logits: echo, logprobs, no new tokens.
    let (status, _, res) = post_json(
        &e.at("/v1/completions"),
        &json!({"model": model, "prompt": "The cat sat on the mat", "max_tokens": 0,
                "echo": true, "logprobs": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let n_prompt = res["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    check_completion_logprobs(&res["choices"][0]["logprobs"], n_prompt, 1, 1);
    assert_eq!(res["choices"][0]["text"], "The cat sat on the mat");

    // Seeds reproduce sampled choices on real logits too.
    let seeded = json!({"model": model, "prompt": "Once upon a time", "max_tokens": 6,
                        "temperature": 1.0, "seed": 99, "n": 2});
    let (_, _, a) = post_json(&e.at("/v1/completions"), &seeded).await;
    let (_, _, b) = post_json(&e.at("/v1/completions"), &seeded).await;
    assert_eq!(texts(&a), texts(&b));
    drop(e);
    let _ = std::fs::remove_dir_all(dir);
}

/// Log-softmax of one row of logits in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits
        .iter()
        .map(|&x| f64::from(x))
        .fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = logits.iter().map(|&x| (f64::from(x) - m).exp()).sum();
    logits.iter().map(|&x| f64::from(x) - m - s.ln()).collect()
}

#[tokio::test]
async fn smollm2_logprobs_agree_with_a_full_log_softmax_of_its_logits() {
    use infergate_engine::model::forward::{Model, SeqChunk};

    let Some(path) = common::smollm2_gguf(false) else {
        return;
    };
    let loaded = infergate_engine::model::load(std::path::Path::new(&path)).unwrap_or_else(|e| {
        panic!("{e}");
    });
    let prompt: Vec<u32> = loaded
        .tokenizer
        .encode("The capital of France is", true)
        .unwrap()
        .get_ids()
        .to_vec();
    let model = Model::new(loaded.config, loaded.weights);
    let bs = 16;
    let mut cache = model.new_cache(prompt.len().div_ceil(bs), bs);
    let table: Vec<u32> = (0..prompt.len().div_ceil(bs) as u32).collect();
    let chunk = SeqChunk {
        tokens: &prompt,
        start: 0,
        block_table: &table,
        want_logits: false,
        prompt_len: prompt.len(),
    };
    let rows: Vec<(usize, usize)> = (0..prompt.len()).map(|p| (0, p)).collect();
    let mut reference = Vec::new();
    model
        .forward_with_rows(&mut cache, &[chunk], &rows, &mut |_, l| {
            reference.push(log_softmax(l));
        })
        .unwrap();
    drop(model);

    let e = Engine::start_with(
        "cpu",
        &["--model", &path, "--served-model-name", "smollm2"],
        &[],
    )
    .await;
    let body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0,
                      "echo": true, "logprobs": 5});
    let (status, _, res) = post_json(&e.at("/v1/completions"), &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let l = &res["choices"][0]["logprobs"];
    let lps = l["token_logprobs"].as_array().unwrap();
    let tops = l["top_logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), prompt.len() + 1);
    assert!(lps[0].is_null());
    for pos in 1..=prompt.len() {
        let want = &reference[pos - 1];
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let got = lps[pos].as_f64().unwrap();
        let expected = if pos < prompt.len() {
            want[prompt[pos] as usize]
        } else {
            sorted[0] // greedy: the generated token is the argmax
        };
        assert!(
            (got - expected).abs() < 1e-4,
            "position {pos}: {got} vs {expected}"
        );
        let mut top: Vec<f64> = tops[pos]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .collect();
        top.sort_by(|a, b| b.total_cmp(a));
        assert!(!top.is_empty() && top.len() <= 5);
        assert!((top[0] - sorted[0]).abs() < 1e-4, "position {pos}");
        for v in &top {
            assert!(
                sorted[..5].iter().any(|w| (v - w).abs() < 1e-4),
                "position {pos}: {v} is not among {:?}",
                &sorted[..5]
            );
        }
    }
}
