//! End-to-end tests of the engine's `/v1/embeddings` and `/v1/responses` over real HTTP to real
//! `infergate engine` processes: shapes, determinism, usage, the Responses event stream, and
//! the 400s.

use crate::common;

use common::{Engine, assert_error, post_json, stream};
use hyper::StatusCode;
use serde_json::{Value, json};

const MODEL: &str = "llama-3-8b";

fn vector(res: &Value, i: usize) -> Vec<f64> {
    res["data"][i]["embedding"]
        .as_array()
        .unwrap_or_else(|| panic!("no embedding {i} in {res}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// The checks both backends share: dimension, unit norm, same input ⇒ same vector, different
/// input ⇒ different vector, usage, and list inputs.
async fn check_embeddings(e: &Engine, model: &str, dim: usize) {
    let url = e.at("/v1/embeddings");
    let (status, _, a) =
        post_json(&url, &json!({"model": model, "input": "rivers and stones"})).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    assert_eq!(a["object"], "list");
    assert_eq!(a["model"], model);
    assert_eq!(a["data"][0]["object"], "embedding");
    assert_eq!(a["data"][0]["index"], 0);
    let va = vector(&a, 0);
    assert_eq!(va.len(), dim);
    assert!((norm(&va) - 1.0).abs() < 1e-3, "norm {}", norm(&va));
    let tokens = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens >= 2, "{}", a["usage"]);
    assert_eq!(a["usage"]["total_tokens"], tokens);

    let (_, _, again) =
        post_json(&url, &json!({"model": model, "input": "rivers and stones"})).await;
    assert_eq!(vector(&again, 0), va, "same input, different vector");

    let (status, _, list) = post_json(
        &url,
        &json!({"model": model, "input": ["rivers and stones", "a completely different text"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
    assert_eq!(list["data"][1]["index"], 1);
    assert_eq!(vector(&list, 0), va, "batching changed a vector");
    assert_ne!(vector(&list, 1), va, "different inputs, same vector");
    assert!(list["usage"]["prompt_tokens"].as_u64().unwrap() > tokens);

    // Token-id inputs, one and several.
    let (status, _, ids) = post_json(
        &url,
        &json!({"model": model, "input": [[1, 2, 3], [3, 2, 1]]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{ids}");
    assert_eq!(ids["usage"]["prompt_tokens"], 6);
    assert_ne!(vector(&ids, 0), vector(&ids, 1));
    let (_, _, one) = post_json(&url, &json!({"model": model, "input": [1, 2, 3]})).await;
    assert_eq!(vector(&one, 0), vector(&ids, 0));

    // `dimensions` equal to the model's is accepted.
    let (status, _, same) = post_json(
        &url,
        &json!({"model": model, "input": [1, 2, 3], "dimensions": dim}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{same}");
    // base64: the little-endian f32 bytes of the same vector.
    let (status, _, b64) = post_json(
        &url,
        &json!({"model": model, "input": [1, 2, 3], "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{b64}");
    let s = b64["data"][0]["embedding"].as_str().unwrap();
    assert_eq!(s.len(), (dim * 4).div_ceil(3) * 4);
}

#[tokio::test]
async fn sim_embeddings_are_synthetic_unit_vectors_of_the_hidden_size() {
    let e = Engine::start(&[]).await;
    check_embeddings(&e, MODEL, 4096).await;
}

#[tokio::test]
async fn cpu_embeddings_come_from_the_model() {
    let (e, dir, name) = common::cpu_default("embeddings", &[]).await;
    let config: Value = std::fs::read_dir(dir.join("models"))
        .unwrap()
        .flatten()
        .find_map(|d| std::fs::read_to_string(d.path().join("config.json")).ok())
        .map(|s| serde_json::from_str(&s).unwrap())
        .expect("the default model's config.json");
    let hidden = config["hidden_size"].as_u64().unwrap() as usize;
    check_embeddings(&e, &name, hidden).await;
    // Generation still works after embeddings (the serving cache was not touched).
    let (status, _, res) = post_json(
        &e.at("/v1/chat/completions"),
        &json!({"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn embeddings_refuse_bad_requests() {
    let e = Engine::start(&["--max-model-len", "64"]).await;
    let url = e.at("/v1/embeddings");
    let cases = [
        (json!({"model": MODEL}), "input", "`input` is required"),
        (
            json!({"model": MODEL, "input": []}),
            "input",
            "must not be empty",
        ),
        (json!({"model": MODEL, "input": [1, "a"]}), "input", "input"),
        (
            json!({"model": MODEL, "input": "x", "encoding_format": "int8"}),
            "encoding_format",
            "int8",
        ),
        (
            json!({"model": MODEL, "input": "x", "dimensions": 8}),
            "dimensions",
            "4096",
        ),
        (
            json!({"model": MODEL, "input": [vec![1; 65]]}),
            "input",
            "maximum context length is 64",
        ),
        (
            json!({"model": MODEL, "input": [4_000_000_000u64]}),
            "input",
            "out of vocabulary",
        ),
    ];
    for (body, param, needle) in cases {
        let (status, _, res) = post_json(&url, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {res}");
        let err = assert_error(status, &res, &[needle]);
        assert_eq!(err["param"], param, "{body} → {res}");
    }
    let (status, _, res) = post_json(&url, &json!({"model": "nope", "input": "x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(status, &res, &["nope"]);
    let (status, _) = common::get(&url).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

fn responses_body(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "input": "Tell me about rivers.", "seed": 11});
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    body
}

fn output_text(res: &Value) -> String {
    res["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no output text in {res}"))
        .to_owned()
}

#[tokio::test]
async fn responses_answer_in_the_responses_shape_over_the_chat_path() {
    let e = Engine::start(&[]).await;
    let url = e.at("/v1/responses");
    let body = responses_body(json!({
        "instructions": "Be brief.", "metadata": {"run": "7"}, "temperature": 0.5, "top_p": 0.9
    }));
    let (status, headers, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert!(headers.contains_key("x-infergate-exec-path"));
    assert!(res["id"].as_str().unwrap().starts_with("resp_"), "{res}");
    assert_eq!(res["object"], "response");
    assert!(res["created_at"].as_u64().unwrap() > 0);
    assert_eq!(res["model"], MODEL);
    assert_eq!(res["instructions"], "Be brief.");
    assert_eq!(res["metadata"], json!({"run": "7"}));
    assert_eq!(res["temperature"], 0.5);
    assert!((res["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6);
    assert_eq!(res["tools"], json!([]));
    assert_eq!(res["tool_choice"], "none");
    assert_eq!(res["text"]["format"]["type"], "text");
    assert_eq!(res["error"], Value::Null);
    let item = &res["output"][0];
    assert_eq!(item["type"], "message");
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(item["role"], "assistant");
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["annotations"], json!([]));
    let u = &res["usage"];
    let (input, output) = (
        u["input_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    );
    assert!(input > 5 && output >= 1, "{u}");
    assert_eq!(u["total_tokens"], input + output);
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64());

    // The same conversation through chat completions: same text, same token counts.
    let chat = json!({
        "model": MODEL, "seed": 11, "temperature": 0.5, "top_p": 0.9,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tell me about rivers."}
        ]
    });
    let (_, _, c) = post_json(&e.at("/v1/chat/completions"), &chat).await;
    assert_eq!(c["choices"][0]["message"]["content"], output_text(&res));
    assert_eq!(c["usage"]["completion_tokens"], output);
    assert_eq!(c["usage"]["prompt_tokens"], input);
    let status_of = |r: &Value| r["status"].as_str().unwrap().to_owned();
    let finish = c["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(
        status_of(&res),
        if finish == "length" {
            "incomplete"
        } else {
            "completed"
        }
    );

    // Message items with input_text parts render as the string form does.
    let (_, _, items) = post_json(
        &url,
        &responses_body(json!({
            "instructions": "Be brief.", "temperature": 0.5, "top_p": 0.9,
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "Tell me about rivers."}]}]
        })),
    )
    .await;
    assert_eq!(output_text(&items), output_text(&res));

    // Cut by max_output_tokens: incomplete, exactly that many tokens.
    let (status, _, cut) = post_json(
        &url,
        &responses_body(json!({"max_output_tokens": 3, "ignore_eos": true})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{cut}");
    assert_eq!(cut["status"], "incomplete");
    assert_eq!(cut["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(cut["usage"]["output_tokens"], 3);
    assert_eq!(cut["max_output_tokens"], 3);
}

#[tokio::test]
async fn streamed_responses_send_typed_events_in_order() {
    let e = Engine::start(&[]).await;
    let url = e.at("/v1/responses");
    for (extra, final_kind) in [
        (json!({}), None),
        (
            json!({"max_output_tokens": 4, "ignore_eos": true}),
            Some("response.incomplete"),
        ),
    ] {
        let mut body = responses_body(extra.clone());
        let (_, _, whole) = post_json(&url, &body).await;
        body["stream"] = json!(true);
        let s = stream(&url, &body).await;
        assert_eq!(s.status, StatusCode::OK);
        assert!(s.exec_path().is_some(), "no exec-path comment");
        assert!(
            s.events
                .iter()
                .all(|ev| ev.data.as_deref() != Some("[DONE]"))
        );
        let events = s.chunks();
        let kinds: Vec<String> = events
            .iter()
            .map(|j| j["type"].as_str().unwrap().to_owned())
            .collect();
        for (i, j) in events.iter().enumerate() {
            assert_eq!(j["sequence_number"], i as u64, "{j}");
        }
        let head = [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        assert_eq!(kinds[..4], head);
        let n = kinds.len();
        let last = match final_kind {
            Some(k) => k.to_owned(),
            None => format!("response.{}", whole["status"].as_str().unwrap()),
        };
        assert_eq!(
            kinds[n - 4..],
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                last.as_str(),
            ]
        );
        assert!(
            kinds[4..n - 4]
                .iter()
                .all(|k| k == "response.output_text.delta")
        );
        assert_eq!(events[0]["response"]["status"], "in_progress");
        let item_id = events[2]["item"]["id"].as_str().unwrap();
        let deltas: String = events[4..n - 4]
            .iter()
            .map(|j| {
                assert_eq!(j["item_id"], item_id);
                assert_eq!(j["output_index"], 0);
                assert_eq!(j["content_index"], 0);
                j["delta"].as_str().unwrap().to_owned()
            })
            .collect();
        let fin = &events[n - 1]["response"];
        assert_eq!(output_text(fin), deltas);
        assert_eq!(events[n - 4]["text"], deltas);
        // Streamed and whole answers agree (seeded), usage included.
        assert_eq!(output_text(&whole), deltas);
        assert_eq!(
            fin["usage"]["output_tokens"],
            whole["usage"]["output_tokens"]
        );
        assert_eq!(fin["status"], whole["status"]);
        if final_kind.is_some() {
            assert_eq!(fin["usage"]["output_tokens"], 4);
            assert_eq!(fin["incomplete_details"]["reason"], "max_output_tokens");
        }
    }
}

#[tokio::test]
async fn responses_refuse_bad_requests() {
    let e = Engine::start(&["--max-model-len", "64"]).await;
    let url = e.at("/v1/responses");
    let cases = [
        (json!({"model": MODEL}), "input"),
        (json!({"model": MODEL, "input": []}), "input"),
        (
            json!({"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]}),
            "input[0]",
        ),
        (
            json!({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
            "input[0].content[0]",
        ),
        (
            json!({"model": MODEL, "input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"model": MODEL, "input": "x", "temperature": 5}),
            "temperature",
        ),
        (
            json!({"model": MODEL, "input": "x", "max_output_tokens": 100}),
            "max_tokens",
        ),
    ];
    for (body, param) in cases {
        let (status, _, res) = post_json(&url, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {res}");
        let err = assert_error(status, &res, &[]);
        assert_eq!(err["param"], param, "{body} → {res}");
    }
    let (status, _, res) = post_json(&url, &json!({"model": "nope", "input": "x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{res}");
    let (status, _) = common::get(&url).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, body) = common::get(&e.at("/v1/nothing")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body.contains("/v1/responses") && body.contains("/v1/embeddings"),
        "{body}"
    );
}
