//! Tests of how a request's sequences become choices: `best_of` ranking, indices of list
//! prompts × `n`, echo with prompt logprobs, usage, and the streamed chunks' indices.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hyper::body::Body;
use serde_json::Value;

use super::*;
use crate::logprobs::TokenLogprob;
use crate::openai::{Endpoint, ResponseMeta};
use crate::sequence::{self, FinishInfo, TokenChunk};
use crate::tokenizer::{EngineTokenizer, SimTokenizer};

fn tokenizer() -> (EngineTokenizer, &'static SimTokenizer) {
    let t = SimTokenizer::shared().unwrap();
    (EngineTokenizer::Sim(t), t)
}

fn finished(tokens: usize, cached: usize) -> SeqEvent {
    SeqEvent::Finished(Box::new(FinishInfo {
        reason: sequence::FinishReason::Length,
        prompt_tokens: 3,
        completion_tokens: tokens,
        cached_tokens: cached,
        graph_steps: 1,
        eager_steps: 1,
        preemptions: 0,
        ..FinishInfo::default()
    }))
}

fn lp(token: u32, logprob: f32) -> TokenLogprob {
    TokenLogprob {
        token,
        logprob,
        top: vec![(token, logprob)],
    }
}

/// A generation over `plan` for endpoint `endpoint` and the sender its sequences' events go to.
fn generation(endpoint: Endpoint, plan: RequestPlan) -> (Generation, mpsc::Sender<TaggedEvent>) {
    let (tx, rx) = mpsc::channel(1024);
    let stops = (0..plan.num_sequences())
        .map(|_| Arc::new(AtomicBool::new(false)))
        .collect();
    let g = Generation::new(
        ResponseMeta::new(endpoint, "m"),
        rx,
        plan,
        &SamplingParams::default(),
        stops,
        tokenizer().0,
    );
    (g, tx)
}

fn plan(prompts: usize, n: usize, best_of: usize, logprobs: bool) -> RequestPlan {
    RequestPlan {
        prompts: (0..prompts)
            .map(|_| PromptPlan {
                tokens: 3,
                first_token: 0,
                echo: None,
            })
            .collect(),
        n,
        best_of,
        logprobs,
        include_usage: true,
    }
}

async fn body(g: Generation) -> Value {
    let (text, _, _) = g.collect().await.unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn best_of_returns_the_n_highest_cumulative_logprobs() {
    let (_, t) = tokenizer();
    let words = ["zero", "one", "two", "three"];
    let (g, tx) = generation(Endpoint::Completions, plan(1, 2, 4, false));
    // Cumulative logprobs -3, -0.5, -2, -0.5: the best two are 1 then 3 (a tie keeps order).
    let sums = [[-1.0, -2.0], [-0.25, -0.25], [-1.0, -1.0], [-0.5, 0.0]];
    for (s, lps) in sums.iter().enumerate() {
        let ids = t.encode(&format!(" {} {}", words[s], words[s]));
        assert_eq!(ids.len(), 2);
        let chunk = TokenChunk {
            logprobs: ids.iter().zip(lps).map(|(&id, &l)| lp(id, l)).collect(),
            ids,
            prompt_logprobs: None,
        };
        tx.send((s, SeqEvent::Tokens(chunk))).await.unwrap();
        tx.send((s, finished(2, 0))).await.unwrap();
    }
    let v = body(g).await;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{v}");
    assert_eq!(choices[0]["index"], 0);
    assert_eq!(choices[0]["text"], " one one");
    assert_eq!(choices[1]["index"], 1);
    assert_eq!(choices[1]["text"], " three three");
    // Logprobs were only computed for ranking: not shown.
    assert!(choices[0]["logprobs"].is_null());
    assert_eq!(v["usage"]["completion_tokens"], 4, "returned choices only");
    assert_eq!(v["usage"]["prompt_tokens"], 3, "the prompt counts once");
}

#[tokio::test]
async fn list_prompts_times_n_are_indexed_prompt_major() {
    let (_, t) = tokenizer();
    let (g, tx) = generation(Endpoint::Completions, plan(2, 2, 2, false));
    for s in 0..4 {
        let chunk = TokenChunk {
            ids: t.encode(&format!(" s{s}")),
            ..TokenChunk::default()
        };
        // Sequences may finish in any order.
        tx.send((3 - s, SeqEvent::Tokens(TokenChunk::default())))
            .await
            .unwrap();
        tx.send((s, SeqEvent::Tokens(chunk))).await.unwrap();
    }
    for s in [2, 0, 3, 1] {
        tx.send((s, finished(1, if s % 2 == 0 { 5 } else { 0 })))
            .await
            .unwrap();
    }
    let v = body(g).await;
    let texts: Vec<&str> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, [" s0", " s1", " s2", " s3"]);
    assert_eq!(v["usage"]["prompt_tokens"], 6);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    // Each prompt's first sequence computed it: its cached tokens are the prompt's.
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
}

#[tokio::test]
async fn echo_puts_the_prompt_and_its_logprobs_first() {
    let (_, t) = tokenizer();
    let prompt = t.encode("The cat");
    let mut p = plan(1, 1, 1, true);
    p.prompts[0] = PromptPlan {
        tokens: prompt.len(),
        first_token: prompt[0],
        echo: Some("The cat".to_owned()),
    };
    let (g, tx) = generation(Endpoint::Completions, p);
    let gen_ids = t.encode(" sat");
    let chunk = TokenChunk {
        logprobs: vec![lp(gen_ids[0], -0.75)],
        ids: gen_ids,
        prompt_logprobs: Some(vec![None, Some(lp(prompt[1], -2.0))]),
    };
    tx.send((0, SeqEvent::Tokens(chunk))).await.unwrap();
    tx.send((0, finished(1, 0))).await.unwrap();
    let v = body(g).await;
    let c = &v["choices"][0];
    assert_eq!(c["text"], "The cat sat");
    let l = &c["logprobs"];
    assert_eq!(l["tokens"], serde_json::json!(["The", " cat", " sat"]));
    assert_eq!(l["token_logprobs"], serde_json::json!([null, -2.0, -0.75]));
    assert!(l["top_logprobs"][0].is_null());
    assert_eq!(l["top_logprobs"][2][" sat"], -0.75);
    assert_eq!(l["text_offset"], serde_json::json!([0, 3, 7]));
}

#[tokio::test]
async fn echo_with_max_tokens_zero_is_the_prompt_alone() {
    let mut p = plan(1, 1, 1, false);
    p.prompts[0].echo = Some("Hello there".to_owned());
    let (g, tx) = generation(Endpoint::Completions, p);
    tx.send((0, finished(0, 0))).await.unwrap();
    let v = body(g).await;
    assert_eq!(v["choices"][0]["text"], "Hello there");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0);
}

/// Reads a whole SSE body into its `data:` JSON events.
async fn sse_events(mut body: SseBody) -> Vec<Value> {
    let mut out = Vec::new();
    let mut text = String::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(data) = frame.unwrap().into_data() else {
            continue;
        };
        text.push_str(std::str::from_utf8(&data).unwrap());
    }
    for block in text.split("\n\n") {
        if let Some(json) = block.strip_prefix("data: ")
            && json != "[DONE]"
        {
            out.push(serde_json::from_str(json).unwrap());
        }
    }
    out
}

#[tokio::test]
async fn streamed_chunks_name_their_choice_and_carry_logprobs() {
    let (_, t) = tokenizer();
    let (g, tx) = generation(Endpoint::ChatCompletions, plan(1, 2, 2, true));
    for s in [1usize, 0] {
        let ids = t.encode(&format!(" c{s}"));
        let chunk = TokenChunk {
            logprobs: ids.iter().map(|&id| lp(id, -0.5)).collect(),
            ids,
            prompt_logprobs: None,
        };
        tx.send((s, SeqEvent::Tokens(chunk))).await.unwrap();
    }
    tx.send((0, finished(1, 0))).await.unwrap();
    tx.send((1, finished(1, 0))).await.unwrap();
    drop(tx);
    let events = sse_events(g.into_sse(None)).await;
    let by_index = |i: u64| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["choices"][0]["index"] == i)
            .collect()
    };
    for i in 0..2u64 {
        let chunks = by_index(i);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, format!(" c{i}"));
        let with_lp: Vec<_> = chunks
            .iter()
            .filter(|c| !c["choices"][0]["logprobs"].is_null())
            .collect();
        assert_eq!(with_lp.len(), 1);
        let entry = &with_lp[0]["choices"][0]["logprobs"]["content"][0];
        assert_eq!(entry["logprob"], -0.5);
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "length"
        );
    }
    let usage = events.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 2);
}

/// Reads a whole SSE body as text.
async fn sse_text(mut body: SseBody) -> String {
    let mut text = String::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame.unwrap().into_data() {
            text.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
    text
}

#[tokio::test]
async fn the_flight_record_goes_last_before_done_and_with_a_whole_answer() {
    use crate::flight::{EngineInfo, Features, FlightRecord};
    let engine = Arc::new(EngineInfo::new("sim", &[1, 2, 4]));
    let features = Features {
        stream: true,
        tools: true,
        ..Features::default()
    };
    let (g, tx) = generation(Endpoint::ChatCompletions, plan(1, 2, 2, false));
    let g = g.with_flight(engine.clone(), features);
    for s in 0..2 {
        tx.send((s, finished(1, 2))).await.unwrap();
    }
    let text = sse_text(g.into_sse(None)).await;
    let (before, last) = text.trim_end().rsplit_once("\n\n").unwrap();
    assert_eq!(last, "data: [DONE]");
    let comment = before.rsplit("\n\n").next().unwrap();
    let json = comment.strip_prefix(": flight ").expect(comment);
    let r: FlightRecord = serde_json::from_str(json).unwrap();
    assert_eq!(r.features.n, 2);
    assert!(r.features.stream && r.features.tools);
    // `finished` reports one graph and one eager step per sequence.
    assert_eq!((r.steps.graph, r.steps.eager), (2, 2));
    assert_eq!(
        (r.tokens.prompt, r.tokens.decode, r.tokens.cached),
        (3, 2, 2)
    );
    assert_eq!(r.capture, vec![1, 2, 4]);

    let (g, tx) = generation(Endpoint::Completions, plan(1, 1, 1, true));
    let g = g.with_flight(engine, Features::default());
    tx.send((0, finished(1, 0))).await.unwrap();
    let (_, paths, r) = g.collect().await.unwrap();
    assert_eq!((paths.graph, paths.eager), (1, 1));
    assert_eq!((r.steps.graph, r.steps.eager), (1, 1));
    assert!(r.features.logprobs && !r.features.stream);
}
