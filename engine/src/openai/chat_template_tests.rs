//! Tests of chat template compilation, loading and rendering.

use super::*;

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Meta-Llama-3-8B-Instruct's template.
const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// A Mistral-style template that rejects non-alternating roles.
const STRICT: &str = "{{ bos_token }}{% for message in messages %}\n    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\n    {% endif %}\n    {% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}\n{% endfor %}\n";

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.to_owned(),
        content: content.to_owned(),
    }
}

fn convo() -> Vec<ChatMessage> {
    vec![msg("system", "Be brief."), msg("user", "Hi!")]
}

#[test]
fn chatml_default() {
    let out = ChatTemplate::default_chatml()
        .render(&convo(), true)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    );
    let out = ChatTemplate::default_chatml()
        .render(&convo(), false)
        .unwrap();
    assert!(out.ends_with("Hi!<|im_end|>\n"));
}

#[test]
fn chatml_jinja_matches_builtin() {
    let jinja = ChatTemplate::from_source(CHATML, "", "").unwrap();
    for add in [true, false] {
        assert_eq!(
            jinja.render(&convo(), add).unwrap(),
            ChatTemplate::default_chatml()
                .render(&convo(), add)
                .unwrap()
        );
    }
}

#[test]
fn llama3() {
    let t = ChatTemplate::from_source(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    let out = t
        .render(&[msg("system", "Be brief. "), msg("user", " Hi!")], true)
        .unwrap();
    assert_eq!(
        out,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn trim_and_lstrip_blocks_and_special_tokens() {
    let t = ChatTemplate::from_source(STRICT, "<s>", "</s>").unwrap();
    let out = t
        .render(
            &[msg("user", "a"), msg("assistant", "b"), msg("user", "c")],
            false,
        )
        .unwrap();
    assert_eq!(out, "<s>[INST] a [/INST]b</s>[INST] c [/INST]");
}

#[test]
fn raise_exception_is_a_400_with_its_message() {
    let t = ChatTemplate::from_source(STRICT, "<s>", "</s>").unwrap();
    let err = t.render(&[msg("assistant", "x")], true).unwrap_err();
    assert_eq!(err.status, hyper::StatusCode::BAD_REQUEST);
    assert_eq!(
        err.message,
        "Conversation roles must alternate user/assistant/user/assistant/..."
    );
}

#[test]
fn runtime_errors_are_400s() {
    let t = ChatTemplate::from_source("{{ messages[0].content + 1 }}", "", "").unwrap();
    let err = t.render(&convo(), true).unwrap_err();
    assert_eq!(err.status, hyper::StatusCode::BAD_REQUEST);
    assert!(
        err.message.starts_with("chat template error"),
        "{}",
        err.message
    );
}

#[test]
fn syntax_errors_fail_to_compile() {
    let err = ChatTemplate::from_source("{% for m in messages %}", "", "").unwrap_err();
    assert!(err.starts_with("invalid chat template"), "{err}");
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("infergate-tmpl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn tokenizer_config_string_template_and_token_objects() {
    let dir = temp_dir("string");
    let cfg = serde_json::json!({
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}",
        "bos_token": {"content": "<s>", "lstrip": false},
        "eos_token": "</s>",
    });
    let path = dir.join("tokenizer_config.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let t = ChatTemplate::from_tokenizer_config(&path).unwrap().unwrap();
    assert_eq!(t.render(&convo(), true).unwrap(), "<s>Be brief.Hi!</s>");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tokenizer_config_named_templates() {
    let dir = temp_dir("named");
    let path = dir.join("tokenizer_config.json");
    let cfg = serde_json::json!({"chat_template": [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "default"},
    ]});
    std::fs::write(&path, cfg.to_string()).unwrap();
    let t = ChatTemplate::from_tokenizer_config(&path).unwrap().unwrap();
    assert_eq!(t.render(&convo(), true).unwrap(), "default");

    let cfg = serde_json::json!({"chat_template": [{"name": "tool_use", "template": "tools"}]});
    std::fs::write(&path, cfg.to_string()).unwrap();
    assert!(ChatTemplate::from_tokenizer_config(&path).is_err());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tokenizer_config_without_template_and_sibling_files() {
    let dir = temp_dir("sibling");
    let path = dir.join("tokenizer_config.json");
    std::fs::write(&path, r#"{"eos_token": "</s>"}"#).unwrap();
    assert!(
        ChatTemplate::from_tokenizer_config(&path)
            .unwrap()
            .is_none()
    );

    std::fs::write(
        dir.join("chat_template.json"),
        r#"{"chat_template": "json {{ eos_token }}"}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_tokenizer_config(&path).unwrap().unwrap();
    assert_eq!(t.render(&convo(), true).unwrap(), "json </s>");

    std::fs::write(
        dir.join("chat_template.jinja"),
        "jinja {{ messages | length }}",
    )
    .unwrap();
    let t = ChatTemplate::from_tokenizer_config(&path).unwrap().unwrap();
    assert_eq!(t.render(&convo(), true).unwrap(), "jinja 2");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tokenizer_config_errors() {
    let dir = temp_dir("errors");
    let path = dir.join("tokenizer_config.json");
    assert!(
        ChatTemplate::from_tokenizer_config(&path)
            .unwrap_err()
            .contains("reading")
    );
    std::fs::write(&path, "{").unwrap();
    assert!(
        ChatTemplate::from_tokenizer_config(&path)
            .unwrap_err()
            .contains("parsing")
    );
    std::fs::write(&path, r#"{"chat_template": 3}"#).unwrap();
    assert!(ChatTemplate::from_tokenizer_config(&path).is_err());
    std::fs::write(&path, r#"{"chat_template": "{% if %}"}"#).unwrap();
    assert!(ChatTemplate::from_tokenizer_config(&path).is_err());
    std::fs::remove_dir_all(dir).unwrap();
}
