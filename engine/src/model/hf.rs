//! Hugging Face model directories: `config.json` (+ `generation_config.json`), safetensors weights
//! (one file, or shards listed by `model.safetensors.index.json`), `tokenizer.json` and
//! `tokenizer_config.json` (chat template and special-token texts).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::{Map, Value};

use super::LoadedModel;
use super::config::{Arch, ModelConfig, RopeScaling};
use super::weights::{ModelWeights, Tensor, TensorSource};

/// Architectures accepted, for error messages.
const SUPPORTED: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

/// Loads a Hugging Face model directory (safetensors weights in F32, F16 or BF16).
pub fn load_dir(dir: &Path) -> Result<LoadedModel, String> {
    let config_path = dir.join("config.json");
    let mut config = parse_config(&read_text(&config_path)?)
        .map_err(|e| format!("{}: {e}", config_path.display()))?;

    let gen_path = dir.join("generation_config.json");
    if gen_path.is_file() {
        let extra = generation_eos(&read_text(&gen_path)?)
            .map_err(|e| format!("{}: {e}", gen_path.display()))?;
        merge_eos(&mut config.eos_token_ids, &extra);
    }

    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        return Err(format!(
            "{} is missing (the cpu backend needs the model's tokenizer.json)",
            tokenizer_path.display()
        ));
    }
    let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| format!("{}: {e}", tokenizer_path.display()))?;
    // Ids past the embedding table would index out of bounds in the forward pass.
    let max_id = tokenizer.get_vocab(true).into_values().max().unwrap_or(0);
    if max_id as usize >= config.vocab_size {
        return Err(format!(
            "{} has token id {max_id} but {} says vocab_size is {}",
            tokenizer_path.display(),
            config_path.display(),
            config.vocab_size
        ));
    }

    let texts = read_tokenizer_config(dir)?;
    let bos_token = texts
        .bos_token
        .unwrap_or_else(|| token_text(&tokenizer, config.bos_token_id));
    let eos_token = texts
        .eos_token
        .unwrap_or_else(|| token_text(&tokenizer, config.eos_token_ids.first().copied()));

    let weights = load_weights(dir, &config)?;
    Ok(LoadedModel {
        name: dir_name(dir),
        config,
        weights,
        tokenizer,
        chat_template: texts.chat_template,
        bos_token,
        eos_token,
    })
}

/// Parses a `config.json` of a Llama, Mistral or Qwen2 model and validates the shape.
pub fn parse_config(json: &str) -> Result<ModelConfig, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| "expected a JSON object".to_owned())?;
    let arch = arch(obj)?;

    if let Some(act) = obj.get("hidden_act").and_then(Value::as_str)
        && act != "silu"
    {
        return Err(format!("hidden_act `{act}` is not supported (only silu)"));
    }
    if obj.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
        return Err("mlp_bias is not supported".into());
    }
    if let Some(q) = obj.get("quantization_config").filter(|q| !q.is_null()) {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
        return Err(format!(
            "quantized checkpoints ({method}) are not supported; use F32, F16 or BF16 weights"
        ));
    }

    let num_heads = req_usize(obj, "num_attention_heads")?;
    let hidden_size = req_usize(obj, "hidden_size")?;
    if num_heads == 0 {
        return Err("num_attention_heads must be at least 1".into());
    }
    // Per-architecture defaults, as transformers' config classes have them.
    let (default_max_pos, default_eps) = match arch {
        Arch::Llama => (2048, 1e-6),
        Arch::Mistral => (4096 * 32, 1e-6),
        Arch::Qwen2 => (32768, 1e-6),
    };
    let rope_params = obj.get("rope_parameters").and_then(Value::as_object);
    let rope_theta = match opt_f64(obj, "rope_theta")? {
        Some(t) => t,
        None => match rope_params {
            Some(p) => opt_f64(p, "rope_theta")?.unwrap_or(10000.0),
            None => 10000.0,
        },
    };
    // Newer configs fold rope_scaling into rope_parameters.
    let scaling = match obj.get("rope_scaling").filter(|s| !s.is_null()) {
        Some(s) => Some(s),
        None => obj.get("rope_parameters").filter(|s| !s.is_null()),
    };
    let rope_scaling = match scaling {
        Some(s) => rope_scaling(s)?,
        None => None,
    };

    let config = ModelConfig {
        arch,
        vocab_size: req_usize(obj, "vocab_size")?,
        hidden_size,
        intermediate_size: req_usize(obj, "intermediate_size")?,
        num_layers: req_usize(obj, "num_hidden_layers")?,
        num_heads,
        num_kv_heads: opt_usize(obj, "num_key_value_heads")?.unwrap_or(num_heads),
        head_dim: opt_usize(obj, "head_dim")?.unwrap_or(hidden_size / num_heads),
        rms_norm_eps: opt_f64(obj, "rms_norm_eps")?.unwrap_or(default_eps) as f32,
        rope_theta: rope_theta as f32,
        rope_scaling,
        max_position_embeddings: opt_usize(obj, "max_position_embeddings")?
            .unwrap_or(default_max_pos),
        tie_word_embeddings: opt_bool(obj, "tie_word_embeddings")?.unwrap_or(false),
        attention_bias: match arch {
            Arch::Qwen2 => true,
            Arch::Llama | Arch::Mistral => opt_bool(obj, "attention_bias")?.unwrap_or(false),
        },
        bos_token_id: opt_u32(obj, "bos_token_id")?,
        eos_token_ids: token_ids(obj, "eos_token_id")?,
    };
    config.validate()?;
    Ok(config)
}

/// The architecture from `architectures`, else from `model_type`.
fn arch(obj: &Map<String, Value>) -> Result<Arch, String> {
    if let Some(list) = obj.get("architectures").and_then(Value::as_array) {
        let names: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
        for name in &names {
            match *name {
                "LlamaForCausalLM" => return Ok(Arch::Llama),
                "MistralForCausalLM" => return Ok(Arch::Mistral),
                "Qwen2ForCausalLM" => return Ok(Arch::Qwen2),
                _ => {}
            }
        }
        if !names.is_empty() {
            return Err(format!(
                "architecture {} is not supported (supported: {SUPPORTED})",
                names.join(", ")
            ));
        }
    }
    match obj.get("model_type").and_then(Value::as_str) {
        Some("llama") => Ok(Arch::Llama),
        Some("mistral") => Ok(Arch::Mistral),
        Some("qwen2") => Ok(Arch::Qwen2),
        Some(other) => Err(format!(
            "model_type `{other}` is not supported (supported: llama, mistral, qwen2 — {SUPPORTED})"
        )),
        None => Err(format!(
            "neither `architectures` nor `model_type` is given (supported: {SUPPORTED})"
        )),
    }
}

/// `rope_scaling` (or `rope_parameters`): `None` for plain RoPE.
fn rope_scaling(v: &Value) -> Result<Option<RopeScaling>, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| "rope_scaling must be an object or null".to_owned())?;
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = |o: &Map<String, Value>, key: &str| -> Result<f32, String> {
        opt_f64(o, key)?
            .map(|f| f as f32)
            .ok_or_else(|| format!("rope_scaling `{kind}` needs `{key}`"))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: factor(obj, "factor")?,
        })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: factor(obj, "factor")?,
            low_freq_factor: factor(obj, "low_freq_factor")?,
            high_freq_factor: factor(obj, "high_freq_factor")?,
            original_max_position_embeddings: opt_usize(obj, "original_max_position_embeddings")?
                .ok_or_else(|| {
                "rope_scaling `llama3` needs `original_max_position_embeddings`".to_owned()
            })?,
        })),
        other => Err(format!(
            "unsupported rope_scaling type `{other}` (supported: linear, llama3)"
        )),
    }
}

/// `eos_token_id` of a `generation_config.json`.
fn generation_eos(json: &str) -> Result<Vec<u32>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| "expected a JSON object".to_owned())?;
    token_ids(obj, "eos_token_id")
}

/// Appends the ids of `extra` that `ids` lacks, keeping `ids` first.
fn merge_eos(ids: &mut Vec<u32>, extra: &[u32]) {
    for &id in extra {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
}

fn req_usize(obj: &Map<String, Value>, key: &str) -> Result<usize, String> {
    opt_usize(obj, key)?.ok_or_else(|| format!("`{key}` is missing"))
}

/// A non-negative integer field; absent or null is `None`.
fn opt_usize(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a non-negative integer, not {v}")),
    }
}

fn opt_u32(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, String> {
    match opt_usize(obj, key)? {
        None => Ok(None),
        Some(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| format!("`{key}` {n} is too large")),
    }
}

fn opt_f64(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a number, not {v}")),
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be true or false, not {v}")),
    }
}

/// A token-id field that may be an integer, a list of integers, or absent.
fn token_ids(obj: &Map<String, Value>, key: &str) -> Result<Vec<u32>, String> {
    let as_id = |v: &Value| -> Result<u32, String> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("`{key}` must hold token ids, not {v}"))
    };
    let mut ids = Vec::new();
    match obj.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for v in list {
                let id = as_id(v)?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Some(v) => ids.push(as_id(v)?),
    }
    Ok(ids)
}

/// What `tokenizer_config.json` (and its sibling template files) say.
#[derive(Debug, Default, PartialEq)]
struct TokenizerTexts {
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// Reads the chat template and special-token texts; every part may be absent.
///
/// Precedence follows recent transformers: `chat_template.jinja`, then the config's
/// `chat_template`, then `chat_template.json`.
fn read_tokenizer_config(dir: &Path) -> Result<TokenizerTexts, String> {
    let path = dir.join("tokenizer_config.json");
    let mut texts = TokenizerTexts::default();
    let mut config_template = None;
    if path.is_file() {
        let v = read_json(&path)?;
        texts.bos_token = special_token(v.get("bos_token"));
        texts.eos_token = special_token(v.get("eos_token"));
        config_template = template_field(v.get("chat_template"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let jinja = dir.join("chat_template.jinja");
    let json = dir.join("chat_template.json");
    texts.chat_template = if jinja.is_file() {
        Some(read_text(&jinja)?)
    } else if config_template.is_some() {
        config_template
    } else if json.is_file() {
        template_field(read_json(&json)?.get("chat_template"))
            .map_err(|e| format!("{}: {e}", json.display()))?
    } else {
        None
    };
    Ok(texts)
}

/// A `bos_token`/`eos_token` entry: a string or an added-token object `{"content": ...}`.
fn special_token(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// A `chat_template` entry: a string, or a list of `{name, template}` of which `default` is used.
fn template_field(value: Option<&Value>) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(entries)) => entries
            .iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|e| e.get("template").and_then(Value::as_str))
            .map(|s| Some(s.to_owned()))
            .ok_or_else(|| "`chat_template` list has no template named `default`".to_owned()),
        Some(_) => Err("`chat_template` must be a string or a list".into()),
    }
}

/// The text of token `id`, or empty when there is none.
fn token_text(tokenizer: &tokenizers::Tokenizer, id: Option<u32>) -> String {
    id.and_then(|id| tokenizer.id_to_token(id))
        .unwrap_or_default()
}

/// The directory's own name, resolving `.` and the like.
fn dir_name(dir: &Path) -> String {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    name.or_else(|| {
        dir.canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    })
    .unwrap_or_else(|| "model".to_owned())
}

fn read_text(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

fn read_json(path: &Path) -> Result<Value, String> {
    serde_json::from_str(&read_text(path)?).map_err(|e| format!("parsing {}: {e}", path.display()))
}

/// The file naming the weights (`model.safetensors` or the index) and the safetensors files
/// holding them, each listed once.
fn shard_paths(dir: &Path) -> Result<(PathBuf, Vec<PathBuf>), String> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((single.clone(), vec![single]));
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(format!(
            "{} has neither model.safetensors nor model.safetensors.index.json \
             (only safetensors weights are supported)",
            dir.display()
        ));
    }
    let v = read_json(&index)?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| format!("{}: `weight_map` is missing", index.display()))?;
    let mut files: Vec<&str> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| {
            format!(
                "{}: weight_map entry {name} is not a file name",
                index.display()
            )
        })?;
        // Shards must stay inside the model directory.
        if !Path::new(file)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(format!(
                "{}: shard path `{file}` is not a plain relative path",
                index.display()
            ));
        }
        if !files.contains(&file) {
            files.push(file);
        }
    }
    if files.is_empty() {
        return Err(format!("{}: `weight_map` is empty", index.display()));
    }
    files.sort_unstable();
    let paths = files.into_iter().map(|f| dir.join(f)).collect();
    Ok((index, paths))
}

/// Loads the safetensors weights of model directory `dir` (one file or shards) for `config`.
///
/// Every shard is read, then the f32 weights are built from them; the shard bytes are dropped on
/// return, so the peak is the raw shards plus one f32 copy.
pub fn load_weights(dir: &Path, config: &ModelConfig) -> Result<ModelWeights, String> {
    let (label, paths) = shard_paths(dir)?;
    let mut bytes = Vec::with_capacity(paths.len());
    for path in &paths {
        bytes.push(std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?);
    }
    let mut source = Shards::new(&paths, &bytes)?;
    ModelWeights::from_source(config, &mut source).map_err(|e| {
        // Errors of the source name their shard already; shape checks get the weights file.
        if source.failed {
            e
        } else {
            format!("{}: {e}", label.display())
        }
    })
}

/// Tensors looked up across parsed safetensors shards, borrowing the shards' bytes.
struct Shards<'a> {
    files: Vec<(&'a Path, SafeTensors<'a>)>,
    /// Tensor name → index into `files`.
    by_name: HashMap<String, usize>,
    /// Set once `tensor` has returned an error (which names its file).
    failed: bool,
}

impl<'a> Shards<'a> {
    fn new(paths: &'a [PathBuf], bytes: &'a [Vec<u8>]) -> Result<Self, String> {
        let mut files: Vec<(&Path, SafeTensors)> = Vec::with_capacity(paths.len());
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (i, (path, data)) in paths.iter().zip(bytes).enumerate() {
            let st = SafeTensors::deserialize(data)
                .map_err(|e| format!("{}: not a valid safetensors file: {e}", path.display()))?;
            for name in st.names() {
                if let Some(&other) = by_name.get(name) {
                    return Err(format!(
                        "tensor {name} is in both {} and {}",
                        files[other].0.display(),
                        path.display()
                    ));
                }
                by_name.insert(name.to_owned(), i);
            }
            files.push((path.as_path(), st));
        }
        Ok(Self {
            files,
            by_name,
            failed: false,
        })
    }
}

impl TensorSource for Shards<'_> {
    fn tensor(&mut self, name: &str) -> Result<Option<Tensor>, String> {
        let result = self.read(name);
        self.failed |= result.is_err();
        result
    }
}

impl Shards<'_> {
    fn read(&self, name: &str) -> Result<Option<Tensor>, String> {
        let Some(&i) = self.by_name.get(name) else {
            return Ok(None);
        };
        let (path, st) = &self.files[i];
        let view = st
            .tensor(name)
            .map_err(|e| format!("{}: tensor {name}: {e}", path.display()))?;
        let data = to_f32(view.dtype(), view.data()).ok_or_else(|| {
            format!(
                "{}: tensor {name} has dtype {}; only F32, F16 and BF16 are supported",
                path.display(),
                view.dtype()
            )
        })?;
        Ok(Some((view.shape().to_vec(), data)))
    }
}

/// Little-endian `F32`/`F16`/`BF16` bytes as f32; `None` for other dtypes.
fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let halves = |f: fn(u16) -> f32| {
        bytes
            .chunks_exact(2)
            .map(|c| f(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    };
    match dtype {
        Dtype::F32 => Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        Dtype::F16 => Some(halves(|b| half::f16::from_bits(b).to_f32())),
        Dtype::BF16 => Some(halves(|b| half::bf16::from_bits(b).to_f32())),
        _ => None,
    }
}

#[cfg(test)]
#[path = "hf_tests.rs"]
mod tests;
