use super::*;

fn parse(body: Value) -> Result<(ParsedRequest, ResponsesEcho), ApiError> {
    parse_responses(body.to_string().as_bytes(), &ChatTemplate::default_chatml())
}

fn prompt_text(p: &ParsedRequest) -> String {
    match &p.prompts[0] {
        Prompt::Text(t) => t.clone(),
        Prompt::Tokens(_) => panic!("chat prompts are text"),
    }
}

#[test]
fn string_input_becomes_a_user_message_after_the_instructions() {
    let (p, echo) = parse(json!({
        "model": "m", "input": "hello there", "instructions": "be brief",
        "max_output_tokens": 9, "temperature": 0, "top_p": 0.5, "seed": 3, "stream": true,
        "metadata": {"k": "v"}
    }))
    .unwrap();
    let text = prompt_text(&p);
    let sys = text.find("be brief").unwrap();
    let user = text.find("hello there").unwrap();
    assert!(sys < user, "{text}");
    assert!(text.contains("system") && text.contains("user"), "{text}");
    assert_eq!(p.max_tokens, Some(9));
    assert_eq!(p.sampling.temperature, 0.0);
    assert_eq!(p.sampling.seed, Some(3));
    assert!(p.stream);
    assert_eq!((p.n, p.best_of), (1, 1));
    assert_eq!(echo.instructions.as_deref(), Some("be brief"));
    assert_eq!(echo.max_output_tokens, Some(9));
    assert_eq!(echo.top_p, 0.5);
    assert_eq!(echo.metadata, json!({"k": "v"}));
}

#[test]
fn message_items_with_parts_keep_their_roles() {
    let (p, echo) = parse(json!({
        "model": "m",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
            {"role": "developer", "content": "d"}
        ]
    }))
    .unwrap();
    let text = prompt_text(&p);
    assert!(
        text.contains("a\nb") && text.contains("assistant\nc"),
        "{text}"
    );
    assert_eq!(echo.metadata, json!({}));
    assert_eq!(echo.instructions, None);
}

#[test]
fn bad_inputs_name_their_param() {
    let param = |body: Value| parse(body).unwrap_err().param.unwrap_or_default();
    assert_eq!(param(json!({"model": "m"})), "input");
    assert_eq!(param(json!({"model": "m", "input": ""})), "input");
    assert_eq!(param(json!({"model": "m", "input": []})), "input");
    assert_eq!(param(json!({"model": "m", "input": 3})), "input");
    assert_eq!(
        param(json!({"model": "m", "input": [{"type": "function_call", "name": "f"}]})),
        "input[0]"
    );
    assert_eq!(
        param(json!({"model": "m", "input": [{"role": "robot", "content": "x"}]})),
        "input[0].role"
    );
    assert_eq!(
        param(
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]})
        ),
        "input[0].content[0]"
    );
    assert_eq!(
        param(json!({"model": "m", "input": "x", "max_output_tokens": 0})),
        "max_output_tokens"
    );
    assert_eq!(
        param(json!({"model": "m", "input": "x", "temperature": 3})),
        "temperature"
    );
    assert_eq!(
        param(json!({"model": "m", "input": "x", "metadata": [1]})),
        "metadata"
    );
    assert_eq!(param(json!({"input": "x"})), "model");
}

fn frame() -> ResponseFrame {
    let (_, echo) = parse(json!({"model": "m", "input": "x", "max_output_tokens": 4})).unwrap();
    ResponseFrame::new("m", echo)
}

#[test]
fn finished_objects_carry_the_message_and_usage() {
    let f = frame();
    assert!(f.id.starts_with("resp_") && f.item_id.starts_with("msg_"));
    let usage = Usage {
        prompt_tokens: 5,
        completion_tokens: 4,
        cached_tokens: 2,
    };
    let o = f.object(ResponseStatus::Incomplete, "hi", Some(&usage));
    assert_eq!(o["object"], "response");
    assert_eq!(o["status"], "incomplete");
    assert_eq!(o["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(o["output"][0]["type"], "message");
    assert_eq!(o["output"][0]["id"], json!(f.item_id));
    assert_eq!(o["output"][0]["role"], "assistant");
    assert_eq!(o["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(o["output"][0]["content"][0]["text"], "hi");
    assert_eq!(o["output"][0]["content"][0]["annotations"], json!([]));
    assert_eq!(o["usage"]["input_tokens"], 5);
    assert_eq!(o["usage"]["input_tokens_details"]["cached_tokens"], 2);
    assert_eq!(o["usage"]["output_tokens"], 4);
    assert_eq!(o["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(o["usage"]["total_tokens"], 9);
    assert_eq!(o["max_output_tokens"], 4);
    assert_eq!(o["tool_choice"], "none");
    assert_eq!(o["text"]["format"]["type"], "text");
    assert_eq!(o["error"], Value::Null);
    let o = f.object(ResponseStatus::Completed, "hi", Some(&usage));
    assert_eq!(o["status"], "completed");
    assert_eq!(o["incomplete_details"], Value::Null);
    let o = f.object(ResponseStatus::InProgress, "", None);
    assert_eq!(o["status"], "in_progress");
    assert_eq!(o["output"], json!([]));
    assert_eq!(o["usage"], Value::Null);
}

#[test]
fn events_name_their_type_twice() {
    let mut fields = frame().part_location();
    fields.insert("delta".into(), json!("x"));
    let e = sse_event("response.output_text.delta", 4, fields);
    let (head, data) = e.split_once('\n').unwrap();
    assert_eq!(head, "event: response.output_text.delta");
    assert!(e.ends_with("\n\n"));
    let j: Value = serde_json::from_str(data.trim().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(j["type"], "response.output_text.delta");
    assert_eq!(j["sequence_number"], 4);
    assert_eq!(j["output_index"], 0);
    assert_eq!(j["content_index"], 0);
    assert_eq!(j["delta"], "x");
}
