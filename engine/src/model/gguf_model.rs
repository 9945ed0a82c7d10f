//! Loads `llama`-architecture GGUF v3 files into the same in-memory model the Hugging Face loader
//! builds: the config from metadata, f32 weights under Hugging Face names and layouts, and a
//! `tokenizers` tokenizer rebuilt from the embedded GPT-2 style vocabulary.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value as Json, json};

use super::LoadedModel;
use super::config::{Arch, ModelConfig, RopeScaling};
use super::weights::{ModelWeights, Tensor, TensorSource};
use crate::gguf::{GgufFile, TensorInfo, Value};

/// `tokenizer.ggml.token_type` of a control token (`<|im_start|>`, `<|endoftext|>`, ...).
const TOKEN_TYPE_CONTROL: u64 = 3;
/// `tokenizer.ggml.token_type` of a user-defined (added, non-special) token.
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// `tokenizer.ggml.pre` values whose pre-tokenizer splits every digit before the GPT-2 regex
/// (llama.cpp groups these together).
const DIGIT_SPLITTING_PRE: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
];

/// Loads a GGUF v3 file of the `llama` architecture with a `gpt2` (byte-level BPE) tokenizer.
pub fn load_file(path: &Path) -> Result<LoadedModel, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    load_bytes(&bytes, &stem).map_err(|e| format!("{}: {e}", path.display()))
}

/// Loads a whole GGUF file held in memory; `fallback_name` names it when `general.name` is absent.
pub fn load_bytes(bytes: &[u8], fallback_name: &str) -> Result<LoadedModel, String> {
    let file = GgufFile::parse(bytes).map_err(|e| e.to_string())?;
    let config = config_from_metadata(&file)?;
    let tokens = string_array(&file, "tokenizer.ggml.tokens")?
        .ok_or("the file has no tokenizer.ggml.tokens (no embedded tokenizer)")?;
    let tokenizer = build_tokenizer(&file, &tokens)?;
    let token_text = |id: Option<u32>| {
        id.and_then(|id| tokens.get(id as usize))
            .map(|s| s.to_string())
            .unwrap_or_default()
    };
    let bos_token = token_text(config.bos_token_id);
    let eos_token = token_text(config.eos_token_ids.first().copied());
    let chat_template = opt_str(&file, "tokenizer.chat_template")?.map(str::to_string);
    let name = opt_str(&file, "general.name")?
        .filter(|n| !n.trim().is_empty())
        .unwrap_or(fallback_name)
        .to_string();

    let mut source = GgufSource::new(&file, bytes, config.num_heads, config.num_kv_heads);
    let weights = ModelWeights::from_source(&config, &mut source)?;
    Ok(LoadedModel {
        name,
        config,
        weights,
        tokenizer,
        chat_template,
        bos_token,
        eos_token,
    })
}

/// Builds the model shape from `llama.*` and `tokenizer.ggml.*` metadata.
fn config_from_metadata(file: &GgufFile) -> Result<ModelConfig, String> {
    let arch = opt_str(file, "general.architecture")?.ok_or("missing general.architecture")?;
    if arch != "llama" {
        return Err(format!(
            "unsupported architecture {arch:?}: only \"llama\" GGUF files are supported"
        ));
    }
    let num_heads = req_int(file, "llama.attention.head_count")?;
    let num_kv_heads = opt_int(file, "llama.attention.head_count_kv")?.unwrap_or(num_heads);
    let hidden_size = req_int(file, "llama.embedding_length")?;
    if num_heads == 0 || !hidden_size.is_multiple_of(num_heads) {
        return Err(format!(
            "llama.embedding_length {hidden_size} is not a multiple of llama.attention.head_count {num_heads}"
        ));
    }
    let head_dim = opt_int(file, "llama.attention.key_length")?.unwrap_or(hidden_size / num_heads);
    if let Some(v) = opt_int(file, "llama.attention.value_length")?
        && v != head_dim
    {
        return Err(format!(
            "llama.attention.value_length {v} differs from the key length {head_dim}; not supported"
        ));
    }
    // The forward pass rotates the whole head; partial rotary embeddings would be silently wrong.
    if let Some(d) = opt_int(file, "llama.rope.dimension_count")?
        && d != head_dim
    {
        return Err(format!(
            "llama.rope.dimension_count {d} differs from the head size {head_dim}; partial RoPE is not supported"
        ));
    }
    // Llama 3.1-style scaling is stored as a per-frequency tensor that the forward pass cannot use.
    if file.tensors.iter().any(|t| t.name == "rope_freqs.weight") {
        return Err(
            "the file carries rope_freqs.weight (per-frequency RoPE scaling), which is not supported"
                .into(),
        );
    }
    let rope_scaling = rope_scaling(file)?;
    let vocab_size = match file.get("tokenizer.ggml.tokens") {
        Some(Value::Array(tokens)) => tokens.len(),
        _ => opt_int(file, "llama.vocab_size")?.ok_or(
            "neither tokenizer.ggml.tokens nor llama.vocab_size gives the vocabulary size",
        )?,
    };
    let bos_token_id = opt_id(file, "tokenizer.ggml.bos_token_id")?;
    let mut eos_token_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = opt_id(file, key)?
            && !eos_token_ids.contains(&id)
        {
            eos_token_ids.push(id);
        }
    }
    Ok(ModelConfig {
        arch: Arch::Llama,
        vocab_size,
        hidden_size,
        intermediate_size: req_int(file, "llama.feed_forward_length")?,
        num_layers: req_int(file, "llama.block_count")?,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: opt_float(file, "llama.attention.layer_norm_rms_epsilon")?
            .ok_or("missing llama.attention.layer_norm_rms_epsilon")?,
        rope_theta: opt_float(file, "llama.rope.freq_base")?.unwrap_or(10000.0),
        rope_scaling,
        max_position_embeddings: req_int(file, "llama.context_length")?,
        // llama.cpp's converter drops the head when it is tied to the embeddings.
        tie_word_embeddings: !file.tensors.iter().any(|t| t.name == "output.weight"),
        attention_bias: false,
        bos_token_id,
        eos_token_ids,
    })
}

/// `llama.rope.scaling.*` (or the older `llama.rope.scale_linear`) as a [`RopeScaling`].
fn rope_scaling(file: &GgufFile) -> Result<Option<RopeScaling>, String> {
    let factor = match opt_str(file, "llama.rope.scaling.type")? {
        None => opt_float(file, "llama.rope.scale_linear")?,
        Some("none") => None,
        Some("linear") => {
            Some(opt_float(file, "llama.rope.scaling.factor")?.ok_or(
                "llama.rope.scaling.type is linear but llama.rope.scaling.factor is missing",
            )?)
        }
        Some(other) => {
            return Err(format!(
                "unsupported llama.rope.scaling.type {other:?}: only linear scaling is supported"
            ));
        }
    };
    match factor {
        Some(f) if f.is_nan() || f <= 0.0 => {
            Err(format!("RoPE scaling factor {f} must be positive"))
        }
        Some(f) if f != 1.0 => Ok(Some(RopeScaling::Linear { factor: f })),
        _ => Ok(None),
    }
}

/// Rebuilds a Hugging Face `tokenizer.json` from `tokenizer.ggml.*` metadata and loads it, so
/// GGUF and Hugging Face models share one tokenizer implementation.
fn build_tokenizer(file: &GgufFile, tokens: &[&str]) -> Result<tokenizers::Tokenizer, String> {
    let json = tokenizer_json(file, tokens)?;
    let bytes = serde_json::to_vec(&json).map_err(|e| format!("tokenizer: {e}"))?;
    tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| format!("tokenizer: {e}"))
}

/// The `tokenizer.json` equivalent of the embedded `gpt2` tokenizer.
fn tokenizer_json(file: &GgufFile, tokens: &[&str]) -> Result<Json, String> {
    match opt_str(file, "tokenizer.ggml.model")? {
        Some("gpt2") => {}
        Some(other) => {
            return Err(format!(
                "unsupported tokenizer model {other:?}: only \"gpt2\" (byte-level BPE) is supported"
            ));
        }
        None => return Err("missing tokenizer.ggml.model".into()),
    }
    let types = match file.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(Value::Array(items)) if items.len() == tokens.len() => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .ok_or("tokenizer.ggml.token_type holds a non-integer")
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => {
            return Err(format!(
                "tokenizer.ggml.token_type: expected an array of {} integers, found {}",
                tokens.len(),
                describe(v)
            ));
        }
    };

    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, (&token, &kind)) in tokens.iter().zip(&types).enumerate() {
        // A duplicated string keeps its first id, as a JSON vocabulary can hold it only once.
        vocab.entry(token).or_insert(json!(id));
        if kind == TOKEN_TYPE_CONTROL || kind == TOKEN_TYPE_USER_DEFINED {
            // llama.cpp's converter maps HF added tokens to control (special) or user-defined
            // (not special); both must match as whole tokens, e.g. `<|im_start|>` in a prompt.
            added.push(json!({
                "id": id,
                "content": token,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": kind == TOKEN_TYPE_CONTROL,
            }));
        }
    }

    let merges = string_array(file, "tokenizer.ggml.merges")?
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            split_merge(m)
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| format!("tokenizer.ggml.merges: {m:?} is not two tokens"))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let byte_level = json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": true,
        "use_regex": true,
    });
    let pre = opt_str(file, "tokenizer.ggml.pre")?.unwrap_or("default");
    let pre_tokenizer = if DIGIT_SPLITTING_PRE.contains(&pre) {
        json!({
            "type": "Sequence",
            "pretokenizers": [
                { "type": "Digits", "individual_digits": true },
                byte_level.clone(),
            ],
        })
    } else {
        byte_level.clone()
    };

    let add_bos = match file.get("tokenizer.ggml.add_bos_token") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(format!(
                "tokenizer.ggml.add_bos_token: expected a bool, found {}",
                describe(v)
            ));
        }
    };
    let post_processor = match opt_id(file, "tokenizer.ggml.bos_token_id")? {
        Some(bos) if add_bos => {
            let text = tokens
                .get(bos as usize)
                .ok_or_else(|| format!("tokenizer.ggml.bos_token_id {bos} is out of range"))?;
            let mut special = serde_json::Map::new();
            special.insert(
                text.to_string(),
                json!({ "id": text, "ids": [bos], "tokens": [text] }),
            );
            json!({
                "type": "TemplateProcessing",
                "single": [
                    { "SpecialToken": { "id": text, "type_id": 0 } },
                    { "Sequence": { "id": "A", "type_id": 0 } },
                ],
                "pair": [
                    { "SpecialToken": { "id": text, "type_id": 0 } },
                    { "Sequence": { "id": "A", "type_id": 0 } },
                    { "SpecialToken": { "id": text, "type_id": 1 } },
                    { "Sequence": { "id": "B", "type_id": 1 } },
                ],
                "special_tokens": special,
            })
        }
        Some(_) => Json::Null,
        None if add_bos => {
            return Err("tokenizer.ggml.add_bos_token is set but there is no bos_token_id".into());
        }
        None => Json::Null,
    };

    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    }))
}

/// Splits a `"a b"` merge at its first space after the first character (as llama.cpp does, so
/// a pair whose left side is itself a space still splits right).
fn split_merge(merge: &str) -> Option<(&str, &str)> {
    let first = merge.chars().next()?.len_utf8();
    let at = first + merge[first..].find(' ')?;
    Some((&merge[..at], &merge[at + 1..]))
}

/// Serves the file's tensors under Hugging Face names, in PyTorch layout, as f32.
struct GgufSource<'a> {
    file: &'a GgufFile,
    bytes: &'a [u8],
    by_name: HashMap<&'a str, &'a TensorInfo>,
    num_heads: usize,
    num_kv_heads: usize,
}

impl<'a> GgufSource<'a> {
    fn new(file: &'a GgufFile, bytes: &'a [u8], num_heads: usize, num_kv_heads: usize) -> Self {
        let by_name = file.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        Self {
            file,
            bytes,
            by_name,
            num_heads,
            num_kv_heads,
        }
    }
}

impl TensorSource for GgufSource<'_> {
    fn tensor(&mut self, name: &str) -> Result<Option<Tensor>, String> {
        let Some(gguf_name) = gguf_name(name) else {
            return Ok(None);
        };
        let Some(info) = self.by_name.get(gguf_name.as_str()) else {
            // Only the head may be absent (tied); anything else gets an error naming both spellings.
            return if name == "lm_head.weight" {
                Ok(None)
            } else {
                Err(format!(
                    "the file has no tensor {gguf_name} (Hugging Face {name})"
                ))
            };
        };
        let mut data = self
            .file
            .dequantize(self.bytes, info)
            .map_err(|e| e.to_string())?;
        // ggml lists dimensions innermost first; PyTorch outermost first, over the same bytes.
        let shape = info
            .dims
            .iter()
            .rev()
            .map(|&d| {
                usize::try_from(d)
                    .map_err(|_| format!("tensor {gguf_name}: dimension {d} is too large"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let heads = if gguf_name.ends_with(".attn_q.weight") {
            Some(self.num_heads)
        } else if gguf_name.ends_with(".attn_k.weight") {
            Some(self.num_kv_heads)
        } else {
            None
        };
        if let Some(n_head) = heads {
            let &[rows, cols] = shape.as_slice() else {
                return Err(format!(
                    "tensor {gguf_name}: expected 2 dimensions, found {shape:?}"
                ));
            };
            data = unpermute_rows(&data, rows, cols, n_head)
                .map_err(|e| format!("tensor {gguf_name}: {e}"))?;
        }
        Ok(Some((shape, data)))
    }
}

/// The GGUF name of a Hugging Face Llama tensor name, or `None` for names GGUF llama lacks.
fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let gguf = match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        _ => return None,
    };
    Some(format!("blk.{layer}.{gguf}"))
}

/// Undoes the row permutation llama.cpp's converter applies to llama Q and K weights.
///
/// The converter reshapes `[rows, cols]` to `[n_head, 2, half, cols]` and swaps axes 1 and 2, so
/// within each head Hugging Face row `i·half + j` (`i` ∈ {0, 1}, `j` < `half`) lands on row
/// `2j + i`: the two rotate-half partners become adjacent for ggml's interleaved RoPE. The
/// inverse reads Hugging Face row `i·half + j` back from row `2j + i`.
fn unpermute_rows(
    data: &[f32],
    rows: usize,
    cols: usize,
    n_head: usize,
) -> Result<Vec<f32>, String> {
    if n_head == 0 || !rows.is_multiple_of(n_head) || !(rows / n_head).is_multiple_of(2) {
        return Err(format!(
            "{rows} rows do not split into {n_head} heads of an even size"
        ));
    }
    if data.len() != rows * cols {
        return Err(format!("{} values for a {rows}×{cols} matrix", data.len()));
    }
    let per_head = rows / n_head;
    let half = per_head / 2;
    let mut out = Vec::with_capacity(data.len());
    for head in 0..n_head {
        for i in 0..2 {
            for j in 0..half {
                let src = head * per_head + 2 * j + i;
                out.extend_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    Ok(out)
}

/// Short description of a metadata value for errors (arrays can hold thousands of items).
fn describe(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("an array of {} values", items.len()),
        other => format!("{other:?}"),
    }
}

/// An optional non-negative integer entry; present with another type is an error.
fn opt_int(file: &GgufFile, key: &str) -> Result<Option<usize>, String> {
    file.get(key)
        .map(|v| {
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    format!(
                        "{key}: expected a non-negative integer, found {}",
                        describe(v)
                    )
                })
        })
        .transpose()
}

/// A required non-negative integer entry.
fn req_int(file: &GgufFile, key: &str) -> Result<usize, String> {
    opt_int(file, key)?.ok_or_else(|| format!("missing metadata {key}"))
}

/// An optional token id entry.
fn opt_id(file: &GgufFile, key: &str) -> Result<Option<u32>, String> {
    opt_int(file, key)?
        .map(|n| u32::try_from(n).map_err(|_| format!("{key}: {n} is not a token id")))
        .transpose()
}

/// An optional float entry (`F32`, or `F64` narrowed).
fn opt_float(file: &GgufFile, key: &str) -> Result<Option<f32>, String> {
    match file.get(key) {
        None => Ok(None),
        Some(Value::F32(v)) => Ok(Some(*v)),
        Some(Value::F64(v)) => Ok(Some(*v as f32)),
        Some(v) => Err(format!("{key}: expected a float, found {}", describe(v))),
    }
}

/// An optional string entry.
fn opt_str<'a>(file: &'a GgufFile, key: &str) -> Result<Option<&'a str>, String> {
    match file.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(format!("{key}: expected a string, found {}", describe(v))),
    }
}

/// An optional array-of-strings entry.
fn string_array<'a>(file: &'a GgufFile, key: &str) -> Result<Option<Vec<&'a str>>, String> {
    let Some(value) = file.get(key) else {
        return Ok(None);
    };
    let wrong = || {
        format!(
            "{key}: expected an array of strings, found {}",
            describe(value)
        )
    };
    let Value::Array(items) = value else {
        return Err(wrong());
    };
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.as_str()),
            _ => Err(wrong()),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

#[cfg(test)]
#[path = "gguf_model_tests.rs"]
mod tests;
