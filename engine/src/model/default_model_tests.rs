use std::sync::atomic::{AtomicU64, Ordering};

use super::super::hf;
use super::*;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "infergate-default-model-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn load(dir: &Path) -> crate::model::LoadedModel {
    match hf::load_dir(dir) {
        Ok(m) => m,
        Err(e) => panic!("loading {}: {e}", dir.display()),
    }
}

#[test]
fn ensure_is_deterministic_across_roots() {
    let (a, b) = (TempDir::new("a"), TempDir::new("b"));
    let dir_a = ensure(&a.0).unwrap();
    let dir_b = ensure(&b.0).unwrap();
    assert_eq!(dir_a, a.0.join(NAME));
    for name in FILES {
        let (x, y) = (
            fs::read(dir_a.join(name)).unwrap(),
            fs::read(dir_b.join(name)).unwrap(),
        );
        assert!(x == y, "{name} differs between two builds");
    }
    // Nothing but the model is left in the root.
    let entries: Vec<_> = fs::read_dir(&a.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, vec![std::ffi::OsString::from(NAME)]);
    // A second call reuses the directory as is.
    let before = fs::metadata(dir_a.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(ensure(&a.0).unwrap(), dir_a);
    let after = fs::metadata(dir_a.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after);
}

#[test]
fn ensure_repairs_an_incomplete_directory() {
    let root = TempDir::new("repair");
    let dir = root.0.join(NAME);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("config.json"), "{}").unwrap();
    assert_eq!(ensure(&root.0).unwrap(), dir);
    assert!(is_complete(&dir));
    assert!(hf::parse_config(&fs::read_to_string(dir.join("config.json")).unwrap()).is_ok());
}

#[test]
fn ensure_survives_concurrent_callers() {
    let root = TempDir::new("race");
    let results: Vec<Result<PathBuf, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| ensure(&root.0))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        assert_eq!(r.unwrap(), root.0.join(NAME));
    }
    let entries: Vec<_> = fs::read_dir(&root.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        entries,
        vec![std::ffi::OsString::from(NAME)],
        "temporary directories left behind"
    );
    assert!(is_complete(&root.0.join(NAME)));
}

#[test]
fn default_model_loads_with_expected_shape() {
    let root = TempDir::new("load");
    let dir = ensure(&root.0).unwrap();
    let model = load(&dir);
    assert_eq!(model.name, NAME);
    let c = &model.config;
    assert_eq!(c.arch, crate::model::config::Arch::Llama);
    assert_eq!(c.vocab_size, VOCAB_SIZE);
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_layers),
        (256, 768, 4)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (8, 2, 32));
    assert_eq!(
        (c.rms_norm_eps, c.rope_theta, c.max_position_embeddings),
        (1e-5, 10000.0, 2048)
    );
    assert!(c.tie_word_embeddings && !c.attention_bias && c.rope_scaling.is_none());
    assert_eq!(c.bos_token_id, Some(ENDOFTEXT_ID));
    assert_eq!(c.eos_token_ids, vec![IM_END_ID, ENDOFTEXT_ID]);
    assert_eq!(model.tokenizer.get_vocab_size(true), VOCAB_SIZE);
    assert_eq!(model.bos_token, "<|endoftext|>");
    assert_eq!(model.eos_token, "<|im_end|>");
    assert_eq!(model.chat_template.as_deref(), Some(CHAT_TEMPLATE));
    assert!(model.weights.lm_head.is_none());

    // Norms are 1, the rest roughly N(0, 0.02).
    let w = &model.weights;
    assert!(w.norm.iter().all(|&v| v == 1.0));
    assert!(
        w.layers
            .iter()
            .all(|l| l.input_norm.iter().all(|&v| v == 1.0))
    );
    let q = &w.layers[0].q_proj.weight;
    let mean = q.iter().sum::<f32>() / q.len() as f32;
    let std = (q.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / q.len() as f32).sqrt();
    assert!(mean.abs() < 1e-3, "mean {mean}");
    assert!((std - 0.02).abs() < 1e-3, "std {std}");
    assert!(q.iter().all(|v| v.abs() < 0.07));
    // Tensors differ from one another.
    assert_ne!(w.layers[0].q_proj.weight, w.layers[1].q_proj.weight);
    assert_ne!(
        w.layers[0].gate_proj.weight[..100],
        w.layers[0].up_proj.weight[..100]
    );
}

#[test]
fn default_chat_template_renders_chatml() {
    let env = minijinja::Environment::new();
    let messages = vec![
        minijinja::context! { role => "system", content => "Be brief." },
        minijinja::context! { role => "user", content => "Hi" },
    ];
    let out = env
        .render_str(
            CHAT_TEMPLATE,
            minijinja::context! { messages, add_generation_prompt => true },
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn tokenizer_round_trips_text() {
    let root = TempDir::new("tok");
    let dir = ensure(&root.0).unwrap();
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let texts = [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.\n\n  Indented   spaces\ttab",
        "café au lait, naïve résumé",
        "日本語のテキスト and emoji 🦀",
        "",
        " leading space and trailing ",
        "numbers 1234567890 and symbols ~!@#$%^&*()_+{}|:\"<>?",
    ];
    for text in texts {
        let enc = tok.encode(text, false).unwrap();
        let ids = enc.get_ids();
        assert_eq!(tok.decode(ids, false).unwrap(), text, "ids {ids:?}");
        assert!(ids.iter().all(|&id| (id as usize) < VOCAB_SIZE));
    }
    // Common words become single tokens thanks to the merges.
    let hello = tok.encode("Hello, world!", false).unwrap();
    assert!(
        hello.get_ids().len() < "Hello, world!".len(),
        "{:?}",
        hello.get_tokens()
    );
    assert_eq!(tok.encode(" the", false).unwrap().get_ids().len(), 1);
}

#[test]
fn tokenizer_keeps_special_tokens_whole() {
    let root = TempDir::new("special");
    let dir = ensure(&root.0).unwrap();
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    for (i, special) in SPECIALS.iter().enumerate() {
        let enc = tok.encode(*special, false).unwrap();
        assert_eq!(enc.get_ids(), &[i as u32], "{special}");
        assert_eq!(tok.token_to_id(special), Some(i as u32));
    }
    let enc = tok
        .encode("<|im_start|>user\nHi there<|im_end|>\n", false)
        .unwrap();
    let ids = enc.get_ids();
    assert_eq!(ids[0], 1);
    assert!(ids.contains(&IM_END_ID));
    assert_eq!(
        tok.decode(ids, false).unwrap(),
        "<|im_start|>user\nHi there<|im_end|>\n"
    );
    assert_eq!(tok.decode(ids, true).unwrap(), "user\nHi there\n");
}

#[test]
fn byte_chars_follow_gpt2() {
    let chars = byte_chars();
    assert_eq!(chars[usize::from(b'A')], 'A');
    assert_eq!(chars[usize::from(b' ')], 'Ġ');
    assert_eq!(chars[usize::from(b'\n')], 'Ċ');
    assert_eq!(chars[0], 'Ā');
    assert_eq!(chars[0xAD], 'Ń');
    let unique: std::collections::HashSet<char> = chars.iter().copied().collect();
    assert_eq!(unique.len(), 256);
    // The same alphabet the tokenizers crate uses.
    let alphabet = ByteLevel::alphabet();
    assert!(chars.iter().all(|c| alphabet.contains(c)));
}

#[test]
fn merges_are_learned_up_to_the_vocab_size() {
    let t = build_tokenizer().unwrap();
    assert_eq!(t.tokens.len(), VOCAB_SIZE);
    assert!(t.merges.len() >= VOCAB_SIZE - 259);
    // The first merge joins the corpus's most frequent pair.
    let (l, r) = t.merges[0];
    assert!(!t.tokens[l as usize].is_empty() && !t.tokens[r as usize].is_empty());
    assert!(t.tokens.contains(&"Ġthe".to_owned()));
}

#[test]
fn merge_pair_is_left_to_right() {
    let mut s = vec![1, 1, 1, 2, 1, 1];
    merge_pair(&mut s, (1, 1), 9);
    assert_eq!(s, vec![9, 1, 2, 9]);
}

#[test]
fn config_json_is_what_transformers_expects() {
    let v: serde_json::Value =
        serde_json::from_slice(&to_json(&model_config(VOCAB_SIZE)).unwrap()).unwrap();
    assert_eq!(v["architectures"][0], "LlamaForCausalLM");
    assert_eq!(v["model_type"], "llama");
    assert_eq!(v["num_key_value_heads"], 2);
    assert_eq!(v["rope_scaling"], serde_json::Value::Null);
    let g: serde_json::Value =
        serde_json::from_slice(&to_json(&generation_config()).unwrap()).unwrap();
    assert_eq!(g["eos_token_id"], serde_json::json!([2, 0]));
}

#[test]
fn cache_root_is_absolute_or_temp() {
    // Only checks the shape, so the environment need not be touched.
    let root = cache_root();
    assert!(!root.as_os_str().is_empty());
    assert!(models_dir().ends_with("models"));
    assert!(models_dir().starts_with(&root));
}
