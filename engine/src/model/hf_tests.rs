use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::tensor::TensorView;
use serde_json::json;

use super::*;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "infergate-hf-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn write(&self, name: &str, bytes: impl AsRef<[u8]>) {
        std::fs::write(self.0.join(name), bytes).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `load_dir`'s error (`LoadedModel` is not `Debug`, so no `unwrap_err`).
fn load_err(dir: &Path) -> String {
    match load_dir(dir) {
        Ok(_) => panic!("{} loaded, expected an error", dir.display()),
        Err(e) => e,
    }
}

fn load_ok(dir: &Path) -> LoadedModel {
    match load_dir(dir) {
        Ok(m) => m,
        Err(e) => panic!("loading {}: {e}", dir.display()),
    }
}

/// Named tensors with their shapes and values.
type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Tiny shape: vocab 8, hidden 4, intermediate 6, 2 layers, 2 heads of 2, 1 kv head.
fn tiny_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 8,
        "hidden_size": 4,
        "intermediate_size": 6,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 64,
        "bos_token_id": 1,
        "eos_token_id": 2,
    })
}

fn with(mut config: Value, key: &str, value: Value) -> Value {
    config[key] = value;
    config
}

/// A word-level tokenizer with 8 tokens.
const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"<unk>":0,"<s>":1,"</s>":2,"a":3,"b":4,"c":5,"d":6,"e":7},
"unk_token":"<unk>"}}"#;

/// Every tensor the config calls for, with values exactly representable in f16 and bf16.
fn tensors(config: &ModelConfig, lm_head: bool) -> Tensors {
    let h = config.hidden_size;
    let (q, kv, im) = (config.q_dim(), config.kv_dim(), config.intermediate_size);
    let mut specs = vec![(
        "model.embed_tokens.weight".to_owned(),
        vec![config.vocab_size, h],
    )];
    for i in 0..config.num_layers {
        let p = format!("model.layers.{i}");
        specs.push((format!("{p}.input_layernorm.weight"), vec![h]));
        for (name, out, inp) in [("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h)] {
            specs.push((format!("{p}.self_attn.{name}.weight"), vec![out, inp]));
            if config.attention_bias {
                specs.push((format!("{p}.self_attn.{name}.bias"), vec![out]));
            }
        }
        specs.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        specs.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        specs.push((format!("{p}.mlp.gate_proj.weight"), vec![im, h]));
        specs.push((format!("{p}.mlp.up_proj.weight"), vec![im, h]));
        specs.push((format!("{p}.mlp.down_proj.weight"), vec![h, im]));
    }
    specs.push(("model.norm.weight".to_owned(), vec![h]));
    if lm_head {
        specs.push(("lm_head.weight".to_owned(), vec![config.vocab_size, h]));
    }
    specs
        .into_iter()
        .enumerate()
        .map(|(t, (name, shape))| {
            let n: usize = shape.iter().product();
            let values = (0..n)
                .map(|i| ((i * 7 + t * 3) % 13) as f32 * 0.125 - 0.75)
                .collect();
            (name, shape, values)
        })
        .collect()
}

fn encode(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
        Dtype::I32 => values
            .iter()
            .flat_map(|v| (*v as i32).to_le_bytes())
            .collect(),
        other => panic!("test encoder lacks {other}"),
    }
}

fn serialize(tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) -> Vec<u8> {
    let encoded: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.clone(), s.clone(), encode(dtype, v)))
        .collect();
    let views: Vec<(&str, TensorView<'_>)> = encoded
        .iter()
        .map(|(n, s, b)| (n.as_str(), TensorView::new(dtype, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// A model directory with config, tokenizer and a single `model.safetensors`.
fn write_model(config: &Value, dtype: Dtype, lm_head: bool) -> (TempDir, ModelConfig, Tensors) {
    let dir = TempDir::new("model");
    let text = config.to_string();
    let parsed = parse_config(&text).unwrap();
    let tensors = tensors(&parsed, lm_head);
    dir.write("config.json", &text);
    dir.write("tokenizer.json", TOKENIZER);
    dir.write("model.safetensors", serialize(&tensors, dtype));
    (dir, parsed, tensors)
}

fn value_of<'a>(tensors: &'a [(String, Vec<usize>, Vec<f32>)], name: &str) -> &'a [f32] {
    &tensors.iter().find(|t| t.0 == name).unwrap().2
}

fn check_values(model: &LoadedModel, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let w = &model.weights;
    assert_eq!(
        w.embed_tokens,
        value_of(tensors, "model.embed_tokens.weight")
    );
    assert_eq!(w.norm, value_of(tensors, "model.norm.weight"));
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        assert_eq!(
            l.input_norm,
            value_of(tensors, &format!("{p}.input_layernorm.weight"))
        );
        assert_eq!(
            l.q_proj.weight,
            value_of(tensors, &format!("{p}.self_attn.q_proj.weight"))
        );
        assert_eq!(
            l.k_proj.weight,
            value_of(tensors, &format!("{p}.self_attn.k_proj.weight"))
        );
        assert_eq!(
            l.v_proj.weight,
            value_of(tensors, &format!("{p}.self_attn.v_proj.weight"))
        );
        assert_eq!(
            l.o_proj.weight,
            value_of(tensors, &format!("{p}.self_attn.o_proj.weight"))
        );
        assert_eq!(
            l.post_attention_norm,
            value_of(tensors, &format!("{p}.post_attention_layernorm.weight"))
        );
        assert_eq!(
            l.gate_proj.weight,
            value_of(tensors, &format!("{p}.mlp.gate_proj.weight"))
        );
        assert_eq!(
            l.up_proj.weight,
            value_of(tensors, &format!("{p}.mlp.up_proj.weight"))
        );
        assert_eq!(
            l.down_proj.weight,
            value_of(tensors, &format!("{p}.mlp.down_proj.weight"))
        );
    }
}

#[test]
fn parse_config_applies_defaults() {
    let json = json!({
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 32, "hidden_size": 16, "intermediate_size": 40,
        "num_hidden_layers": 3, "num_attention_heads": 4,
    });
    let c = parse_config(&json.to_string()).unwrap();
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 4, 4));
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.max_position_embeddings, 2048);
    assert!(!c.tie_word_embeddings && !c.attention_bias);
    assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (None, vec![]));
}

#[test]
fn parse_config_reads_every_field() {
    let json = json!({
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "max_position_embeddings": 131072, "tie_word_embeddings": true,
        "attention_bias": true, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009, 128001],
        "hidden_act": "silu", "mlp_bias": false, "torch_dtype": "bfloat16",
    });
    let c = parse_config(&json.to_string()).unwrap();
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.intermediate_size),
        (128256, 2048, 8192)
    );
    assert_eq!(
        (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim),
        (16, 32, 8, 64)
    );
    assert_eq!((c.rms_norm_eps, c.rope_theta), (1e-5, 500000.0));
    assert_eq!(c.max_position_embeddings, 131072);
    assert!(c.tie_word_embeddings && c.attention_bias);
    assert_eq!(c.bos_token_id, Some(128000));
    // A list, deduplicated, order kept.
    assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
}

#[test]
fn parse_config_architectures_and_model_type() {
    let base = tiny_config();
    let qwen = with(base.clone(), "architectures", json!(["Qwen2ForCausalLM"]));
    let c = parse_config(&qwen.to_string()).unwrap();
    assert_eq!(c.arch, Arch::Qwen2);
    assert!(c.attention_bias, "Qwen2 always has q/k/v biases");
    let qwen = with(qwen, "attention_bias", json!(false));
    assert!(parse_config(&qwen.to_string()).unwrap().attention_bias);

    let mistral = with(base.clone(), "architectures", json!(["MistralForCausalLM"]));
    assert_eq!(
        parse_config(&mistral.to_string()).unwrap().arch,
        Arch::Mistral
    );

    for (model_type, arch) in [
        ("llama", Arch::Llama),
        ("mistral", Arch::Mistral),
        ("qwen2", Arch::Qwen2),
    ] {
        let mut c = with(base.clone(), "model_type", json!(model_type));
        c.as_object_mut().unwrap().remove("architectures");
        assert_eq!(parse_config(&c.to_string()).unwrap().arch, arch);
    }

    let gpt = with(base.clone(), "architectures", json!(["GPT2LMHeadModel"]));
    let e = parse_config(&gpt.to_string()).unwrap_err();
    assert!(
        e.contains("GPT2LMHeadModel") && e.contains("LlamaForCausalLM"),
        "{e}"
    );
    let mut phi = with(base.clone(), "model_type", json!("phi3"));
    phi.as_object_mut().unwrap().remove("architectures");
    let e = parse_config(&phi.to_string()).unwrap_err();
    assert!(e.contains("phi3") && e.contains("llama"), "{e}");
    let mut none = base.clone();
    none.as_object_mut().unwrap().remove("architectures");
    assert!(
        parse_config(&none.to_string())
            .unwrap_err()
            .contains("architectures")
    );
}

#[test]
fn parse_config_rejects_bad_values() {
    let base = tiny_config();
    let mut missing = base.clone();
    missing.as_object_mut().unwrap().remove("hidden_size");
    assert!(
        parse_config(&missing.to_string())
            .unwrap_err()
            .contains("hidden_size")
    );
    let e =
        parse_config(&with(base.clone(), "num_key_value_heads", json!(3)).to_string()).unwrap_err();
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = parse_config(&with(base.clone(), "vocab_size", json!("8")).to_string()).unwrap_err();
    assert!(e.contains("vocab_size"), "{e}");
    let e = parse_config(&with(base.clone(), "hidden_act", json!("gelu")).to_string()).unwrap_err();
    assert!(e.contains("gelu"), "{e}");
    let e = parse_config(&with(base.clone(), "mlp_bias", json!(true)).to_string()).unwrap_err();
    assert!(e.contains("mlp_bias"), "{e}");
    let q = json!({"quant_method": "awq", "bits": 4});
    let e = parse_config(&with(base.clone(), "quantization_config", q).to_string()).unwrap_err();
    assert!(e.contains("awq"), "{e}");
    assert!(parse_config("[1, 2]").is_err());
    assert!(parse_config("{").unwrap_err().contains("JSON"));
}

#[test]
fn parse_config_rope_scaling_variants() {
    let base = tiny_config();
    let parse =
        |scaling: Value| parse_config(&with(base.clone(), "rope_scaling", scaling).to_string());

    assert_eq!(parse(Value::Null).unwrap().rope_scaling, None);
    assert_eq!(
        parse(json!({"rope_type": "default"})).unwrap().rope_scaling,
        None
    );
    assert_eq!(
        parse(json!({"type": "linear", "factor": 4.0}))
            .unwrap()
            .rope_scaling,
        Some(RopeScaling::Linear { factor: 4.0 })
    );
    assert_eq!(
        parse(json!({"rope_type": "linear", "factor": 2}))
            .unwrap()
            .rope_scaling,
        Some(RopeScaling::Linear { factor: 2.0 })
    );
    let llama3 = json!({
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    });
    assert_eq!(
        parse(llama3).unwrap().rope_scaling,
        Some(RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        })
    );
    let e = parse(json!({"rope_type": "llama3", "factor": 8.0})).unwrap_err();
    assert!(e.contains("low_freq_factor"), "{e}");
    for kind in ["yarn", "dynamic", "longrope"] {
        let e = parse(json!({"rope_type": kind, "factor": 4.0})).unwrap_err();
        assert!(
            e.contains("unsupported rope_scaling") && e.contains(kind),
            "{e}"
        );
    }
    let e = parse(json!({"type": "linear"})).unwrap_err();
    assert!(e.contains("factor"), "{e}");
}

#[test]
fn parse_config_rope_parameters() {
    // Newer transformers nest theta (and the scaling) under rope_parameters.
    let c = with(
        tiny_config(),
        "rope_parameters",
        json!({"rope_type": "default", "rope_theta": 1e6}),
    );
    let c = parse_config(&c.to_string()).unwrap();
    assert_eq!((c.rope_theta, c.rope_scaling), (1e6, None));
    let c = with(
        tiny_config(),
        "rope_parameters",
        json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 20000}),
    );
    let c = parse_config(&c.to_string()).unwrap();
    assert_eq!(
        (c.rope_theta, c.rope_scaling),
        (20000.0, Some(RopeScaling::Linear { factor: 2.0 }))
    );
    // A top-level rope_theta wins.
    let c = with(tiny_config(), "rope_theta", json!(1234.0));
    let c = with(c, "rope_parameters", json!({"rope_theta": 5678.0}));
    assert_eq!(parse_config(&c.to_string()).unwrap().rope_theta, 1234.0);
}

#[test]
fn generation_config_eos_merges_after_config() {
    assert_eq!(
        generation_eos(r#"{"eos_token_id": [5, 2, 5]}"#).unwrap(),
        vec![5, 2]
    );
    assert_eq!(generation_eos(r#"{"eos_token_id": 7}"#).unwrap(), vec![7]);
    assert_eq!(
        generation_eos(r#"{"do_sample": true}"#).unwrap(),
        Vec::<u32>::new()
    );
    assert!(generation_eos(r#"{"eos_token_id": "x"}"#).is_err());
    let mut ids = vec![2, 3];
    merge_eos(&mut ids, &[3, 6, 2, 7]);
    assert_eq!(ids, vec![2, 3, 6, 7]);

    let (dir, _, _) = write_model(&tiny_config(), Dtype::F32, true);
    dir.write(
        "generation_config.json",
        r#"{"eos_token_id": [6, 2], "bos_token_id": 1}"#,
    );
    assert_eq!(load_ok(dir.path()).config.eos_token_ids, vec![2, 6]);
    dir.write("generation_config.json", "not json");
    assert!(load_err(dir.path()).contains("generation_config.json"));
}

#[test]
fn loads_f32_f16_bf16_checkpoints() {
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        let (dir, config, tensors) = write_model(&tiny_config(), dtype, true);
        let model = load_ok(dir.path());
        assert_eq!(model.config, config, "{dtype}");
        check_values(&model, &tensors);
        let head = model.weights.lm_head.as_ref().unwrap();
        assert_eq!(head.weight, value_of(&tensors, "lm_head.weight"));
        assert!(model.weights.layers[0].q_proj.bias.is_none());
    }
}

#[test]
fn converts_half_precision_exactly() {
    let values = [0.0f32, 1.0, -2.5, 0.099975586, 65504.0, -1e-3];
    for dtype in [Dtype::F16, Dtype::BF16] {
        let got = to_f32(dtype, &encode(dtype, &values)).unwrap();
        for (g, v) in got.iter().zip(values) {
            let expect = match dtype {
                Dtype::F16 => half::f16::from_f32(v).to_f32(),
                _ => half::bf16::from_f32(v).to_f32(),
            };
            assert_eq!(*g, expect);
        }
    }
    assert!(to_f32(Dtype::I8, &[1, 2]).is_none());
}

#[test]
fn loads_sharded_checkpoint() {
    let (dir, config, tensors) = write_model(&tiny_config(), Dtype::F32, true);
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let (first, second) = tensors.split_at(tensors.len() / 2);
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    dir.write(names[0], serialize(first, Dtype::BF16));
    dir.write(names[1], serialize(second, Dtype::F16));
    let mut weight_map = serde_json::Map::new();
    for (part, name) in [(first, names[0]), (second, names[1])] {
        for t in part {
            weight_map.insert(t.0.clone(), json!(name));
        }
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    dir.write("model.safetensors.index.json", index.to_string());
    let model = load_ok(dir.path());
    assert_eq!(model.config, config);
    check_values(&model, &tensors);

    // A shard the index names but the directory lacks.
    std::fs::remove_file(dir.path().join(names[1])).unwrap();
    let e = load_err(dir.path());
    assert!(e.contains(names[1]), "{e}");

    // Paths leaving the directory are refused.
    let bad = json!({"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}});
    dir.write("model.safetensors.index.json", bad.to_string());
    assert!(load_err(dir.path()).contains("../elsewhere.safetensors"));
}

#[test]
fn reports_tensor_in_two_shards() {
    let (dir, _, tensors) = write_model(&tiny_config(), Dtype::F32, false);
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    dir.write("a.safetensors", serialize(&tensors, Dtype::F32));
    dir.write("b.safetensors", serialize(&tensors[..1], Dtype::F32));
    let index = json!({"weight_map": {"model.norm.weight": "a.safetensors", "model.embed_tokens.weight": "b.safetensors"}});
    dir.write("model.safetensors.index.json", index.to_string());
    let e = load_err(dir.path());
    assert!(
        e.contains("model.embed_tokens.weight") && e.contains("both"),
        "{e}"
    );
}

#[test]
fn reports_shape_mismatch_by_name() {
    let (dir, config, mut tensors) = write_model(&tiny_config(), Dtype::F32, false);
    let name = "model.layers.1.self_attn.k_proj.weight";
    let t = tensors.iter_mut().find(|t| t.0 == name).unwrap();
    t.1 = vec![config.hidden_size, config.kv_dim()];
    dir.write("model.safetensors", serialize(&tensors, Dtype::F32));
    let e = load_err(dir.path());
    assert!(
        e.contains(name) && e.contains("[4, 2]") && e.contains("[2, 4]"),
        "{e}"
    );
    assert!(e.contains("model.safetensors"), "{e}");
}

#[test]
fn reports_missing_tensor_by_name() {
    let (dir, _, mut tensors) = write_model(&tiny_config(), Dtype::F32, false);
    let name = "model.layers.1.mlp.up_proj.weight";
    tensors.retain(|t| t.0 != name);
    dir.write("model.safetensors", serialize(&tensors, Dtype::F32));
    let e = load_err(dir.path());
    assert!(e.contains(name) && e.contains("model.safetensors"), "{e}");
}

#[test]
fn reports_unsupported_dtype_by_name() {
    let (dir, _, tensors) = write_model(&tiny_config(), Dtype::F32, false);
    let mut bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.clone(), s.clone(), encode(Dtype::F32, v)))
        .collect();
    let name = "model.layers.0.self_attn.v_proj.weight";
    let mut dtypes = vec![Dtype::F32; bytes.len()];
    for (i, t) in bytes.iter_mut().enumerate() {
        if t.0 == name {
            t.2 = encode(Dtype::I32, &tensors[i].2);
            dtypes[i] = Dtype::I32;
        }
    }
    let views: Vec<(&str, TensorView<'_>)> = bytes
        .iter()
        .zip(&dtypes)
        .map(|((n, s, b), d)| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    dir.write(
        "model.safetensors",
        safetensors::serialize(views, None).unwrap(),
    );
    let e = load_err(dir.path());
    assert!(
        e.contains(name) && e.contains("I32") && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn tied_and_untied_heads() {
    // Untied with a head: the head is loaded.
    let (dir, _, tensors) = write_model(&tiny_config(), Dtype::F32, true);
    let model = load_ok(dir.path());
    let head = model.weights.lm_head.as_ref().unwrap();
    assert_eq!(head.weight, value_of(&tensors, "lm_head.weight"));
    assert_eq!((head.out_features, head.in_features), (8, 4));

    // Untied without a head: an error naming it.
    let (dir, _, _) = write_model(&tiny_config(), Dtype::F32, false);
    assert!(load_err(dir.path()).contains("lm_head.weight"));

    // Tied, with or without a stored copy of the head: no separate head.
    let tied = with(tiny_config(), "tie_word_embeddings", json!(true));
    for stored in [false, true] {
        let (dir, _, _) = write_model(&tied, Dtype::F32, stored);
        let model = load_ok(dir.path());
        assert!(model.config.tie_word_embeddings);
        assert!(model.weights.lm_head.is_none());
    }
}

#[test]
fn loads_qwen2_biases() {
    let qwen = with(tiny_config(), "architectures", json!(["Qwen2ForCausalLM"]));
    let qwen = with(qwen, "tie_word_embeddings", json!(true));
    let (dir, _, tensors) = write_model(&qwen, Dtype::BF16, false);
    let model = load_ok(dir.path());
    let l = &model.weights.layers[1];
    assert_eq!(
        l.k_proj.bias.as_deref().unwrap(),
        value_of(&tensors, "model.layers.1.self_attn.k_proj.bias")
    );
    assert!(l.o_proj.bias.is_none());
}

#[test]
fn missing_files_are_named() {
    let (dir, _, _) = write_model(&tiny_config(), Dtype::F32, true);
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    assert!(load_err(dir.path()).contains("tokenizer.json"));
    dir.write("tokenizer.json", "{ nope");
    assert!(load_err(dir.path()).contains("tokenizer.json"));
    dir.write("tokenizer.json", TOKENIZER);
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    assert!(load_err(dir.path()).contains("model.safetensors"));
    dir.write("model.safetensors", b"garbage!");
    assert!(load_err(dir.path()).contains("model.safetensors"));
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert!(load_err(dir.path()).contains("config.json"));
    dir.write("config.json", r#"{"architectures": ["BertModel"]}"#);
    let e = load_err(dir.path());
    assert!(e.contains("config.json") && e.contains("BertModel"), "{e}");
}

#[test]
fn tokenizer_larger_than_vocab_is_refused() {
    let small = with(tiny_config(), "vocab_size", json!(6));
    let (dir, _, _) = write_model(&small, Dtype::F32, true);
    let e = load_err(dir.path());
    assert!(
        e.contains("vocab_size") && e.contains("tokenizer.json"),
        "{e}"
    );
}

#[test]
fn tokenizer_config_template_and_special_tokens() {
    let (dir, _, _) = write_model(&tiny_config(), Dtype::F32, true);
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();

    // No tokenizer_config.json: no template, texts from the tokenizer's ids (bos 1, eos 2).
    let model = load_ok(dir.path());
    assert_eq!(model.name, name);
    assert_eq!(model.chat_template, None);
    assert_eq!(
        (model.bos_token.as_str(), model.eos_token.as_str()),
        ("<s>", "</s>")
    );
    assert_eq!(
        model.tokenizer.encode("a b e", false).unwrap().get_ids(),
        &[3, 4, 7]
    );

    // A plain string template and object-form tokens.
    let tc = json!({
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "bos_token": {"content": "<B>", "lstrip": false},
        "eos_token": "<E>",
    });
    dir.write("tokenizer_config.json", tc.to_string());
    let model = load_ok(dir.path());
    assert!(model.chat_template.unwrap().starts_with("{{ bos_token }}"));
    assert_eq!(
        (model.bos_token.as_str(), model.eos_token.as_str()),
        ("<B>", "<E>")
    );

    // A list of named templates: `default` is taken; null tokens fall back to the tokenizer.
    let tc = json!({
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "DEFAULT"},
        ],
        "bos_token": null,
    });
    dir.write("tokenizer_config.json", tc.to_string());
    let model = load_ok(dir.path());
    assert_eq!(model.chat_template.as_deref(), Some("DEFAULT"));
    assert_eq!(
        (model.bos_token.as_str(), model.eos_token.as_str()),
        ("<s>", "</s>")
    );

    let tc = json!({"chat_template": [{"name": "tool_use", "template": "TOOLS"}]});
    dir.write("tokenizer_config.json", tc.to_string());
    let e = load_err(dir.path());
    assert!(
        e.contains("tokenizer_config.json") && e.contains("default"),
        "{e}"
    );

    dir.write("tokenizer_config.json", "{");
    assert!(load_err(dir.path()).contains("tokenizer_config.json"));

    // chat_template.jinja takes precedence over the config's template.
    dir.write(
        "tokenizer_config.json",
        json!({"chat_template": "CONFIG"}).to_string(),
    );
    dir.write("chat_template.jinja", "JINJA FILE");
    assert_eq!(
        load_ok(dir.path()).chat_template.as_deref(),
        Some("JINJA FILE")
    );
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    assert_eq!(load_ok(dir.path()).chat_template.as_deref(), Some("CONFIG"));
    // chat_template.json is the last resort.
    dir.write("tokenizer_config.json", "{}");
    dir.write(
        "chat_template.json",
        json!({"chat_template": "JSON FILE"}).to_string(),
    );
    assert_eq!(
        load_ok(dir.path()).chat_template.as_deref(),
        Some("JSON FILE")
    );
}

#[test]
fn dir_name_resolves_dot() {
    assert_eq!(dir_name(Path::new("/models/SmolLM2-135M/")), "SmolLM2-135M");
    let here = std::env::current_dir().unwrap();
    assert_eq!(
        dir_name(Path::new(".")),
        here.file_name().unwrap().to_string_lossy()
    );
}

#[test]
fn dispatches_through_model_load() {
    let (dir, _, _) = write_model(&tiny_config(), Dtype::F16, true);
    match super::super::load(dir.path()) {
        Ok(m) => assert_eq!(m.config.num_layers, 2),
        Err(e) => panic!("{e}"),
    }
}
