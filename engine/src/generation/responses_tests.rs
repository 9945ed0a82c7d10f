//! The Responses answer over a scripted sequence: the object's status and usage, and the
//! stream's event order, sequence numbers and text.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::super::{Generation, PromptPlan, RequestPlan, TaggedEvent};
use crate::openai::{Endpoint, ResponseFrame, ResponseMeta, ResponsesEcho};
use crate::request::SamplingParams;
use crate::sequence::{self, FinishInfo, SeqEvent, TokenChunk};
use crate::tokenizer::{EngineTokenizer, SimTokenizer};

fn frame() -> ResponseFrame {
    ResponseFrame::new(
        "m",
        ResponsesEcho {
            instructions: None,
            max_output_tokens: Some(2),
            temperature: 1.0,
            top_p: 1.0,
            metadata: serde_json::json!({"a": "b"}),
        },
    )
}

/// A one-sequence generation whose events are already queued: `words` one token each, then
/// the end with `reason`.
async fn scripted(words: &[&str], reason: sequence::FinishReason) -> Generation {
    let t = SimTokenizer::shared().unwrap();
    let (tx, rx) = mpsc::channel::<TaggedEvent>(64);
    let plan = RequestPlan {
        prompts: vec![PromptPlan {
            tokens: 3,
            first_token: 0,
            echo: None,
        }],
        n: 1,
        best_of: 1,
        logprobs: false,
        include_usage: false,
    };
    let g = Generation::new(
        ResponseMeta::new(Endpoint::ChatCompletions, "m"),
        rx,
        plan,
        &SamplingParams::default(),
        vec![Arc::new(AtomicBool::new(false))],
        EngineTokenizer::Sim(t),
    );
    for w in words {
        let chunk = TokenChunk {
            ids: t.encode(w),
            logprobs: Vec::new(),
            prompt_logprobs: None,
        };
        tx.send((0, SeqEvent::Tokens(chunk))).await.unwrap();
    }
    let info = FinishInfo {
        reason,
        prompt_tokens: 3,
        completion_tokens: words.len(),
        cached_tokens: 1,
        graph_steps: 0,
        eager_steps: 2,
        preemptions: 0,
        ..FinishInfo::default()
    };
    tx.send((0, SeqEvent::Finished(Box::new(info))))
        .await
        .unwrap();
    g
}

#[tokio::test]
async fn a_cut_answer_is_incomplete_with_usage() {
    let g = scripted(&[" a", " b"], sequence::FinishReason::Length).await;
    let (body, paths, _) = g.collect_response(&frame()).await.unwrap();
    let o: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(o["status"], "incomplete");
    assert_eq!(o["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(o["output"][0]["content"][0]["text"], " a b");
    assert_eq!(o["usage"]["input_tokens"], 3);
    assert_eq!(o["usage"]["output_tokens"], 2);
    assert_eq!(o["usage"]["input_tokens_details"]["cached_tokens"], 1);
    assert_eq!(o["metadata"]["a"], "b");
    assert_eq!(paths.eager, 2);
}

#[tokio::test]
async fn the_stream_opens_deltas_and_closes_in_order() {
    let mut g = scripted(&[" a", " b"], sequence::FinishReason::Stop).await;
    let first = g.first_event().await.unwrap();
    let bytes = g
        .into_responses_sse(frame(), first)
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(!text.contains("[DONE]"));
    assert!(text.contains(": x-infergate-exec-path graph=0,eager=2"));
    let mut kinds = Vec::new();
    let mut deltas = String::new();
    let mut last = Value::Null;
    for block in text
        .split("\n\n")
        .filter(|b| !b.starts_with(':') && !b.is_empty())
    {
        let (event, data) = block.split_once('\n').unwrap();
        let kind = event.strip_prefix("event: ").unwrap();
        let j: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(j["type"], kind);
        assert_eq!(j["sequence_number"], kinds.len());
        if kind == "response.output_text.delta" {
            deltas.push_str(j["delta"].as_str().unwrap());
        }
        kinds.push(kind.to_owned());
        last = j;
    }
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(deltas, " a b");
    assert_eq!(last["response"]["status"], "completed");
    assert_eq!(last["response"]["output"][0]["content"][0]["text"], deltas);
    assert_eq!(last["response"]["usage"]["output_tokens"], 2);
}
