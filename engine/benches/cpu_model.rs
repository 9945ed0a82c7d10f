//! Throughput of the cpu backend's forward pass on a real checkpoint: prefill tokens/s for one
//! prompt, and greedy decode tokens/s at several batch sizes, measured the same way as
//! `tests/reference/bench_reference.py` measures Hugging Face transformers, so the two print
//! comparable JSON lines.
//!
//! `CPU_BENCH_MODEL=DIR|FILE.gguf|default cargo bench -p infergate-engine --bench cpu_model`
//! Knobs: `CPU_BENCH_PROMPT_LEN` (128), `CPU_BENCH_DECODE` (32), `CPU_BENCH_BATCHES` ("1,8").

use std::path::PathBuf;
use std::time::Instant;

use infergate_engine::model::forward::{Model, SeqChunk};
use infergate_engine::model::sampler::argmax;
use infergate_engine::model::{default_model, hf};

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn load(spec: &str) -> Result<Model, String> {
    let path = if spec == "default" {
        default_model::ensure(&default_model::models_dir())?
    } else {
        PathBuf::from(spec)
    };
    // Random checkpoints carry no tokenizer: load config and weights only for directories.
    if path.is_dir() {
        let config = hf::parse_config(
            &std::fs::read_to_string(path.join("config.json")).map_err(|e| e.to_string())?,
        )?;
        let weights = hf::load_weights(&path, &config)?;
        Ok(Model::new(config, weights))
    } else {
        let loaded = infergate_engine::model::load(&path)?;
        Ok(Model::new(loaded.config, loaded.weights))
    }
}

/// Seeded prompt ids below `vocab`.
fn prompt(len: usize, vocab: usize, salt: u64) -> Vec<u32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ salt;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn main() -> Result<(), String> {
    let spec = std::env::var("CPU_BENCH_MODEL").unwrap_or_else(|_| "default".into());
    let prompt_len: usize = env_or("CPU_BENCH_PROMPT_LEN", 128);
    let decode: usize = env_or("CPU_BENCH_DECODE", 32);
    let batches: Vec<usize> = std::env::var("CPU_BENCH_BATCHES")
        .unwrap_or_else(|_| "1,8".into())
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .collect();
    let started = Instant::now();
    let model = load(&spec)?;
    let load_s = started.elapsed().as_secs_f64();
    let vocab = model.config.vocab_size;
    let block_size = 16;
    let per_seq = (prompt_len + decode).div_ceil(block_size);
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let mut cache = model.new_cache(per_seq * max_batch, block_size);
    let tables: Vec<Vec<u32>> = (0..max_batch)
        .map(|b| ((b * per_seq) as u32..((b + 1) * per_seq) as u32).collect())
        .collect();

    // Prefill: best of 3 after a warm-up, one sequence of `prompt_len` tokens.
    let p = prompt(prompt_len, vocab, 0);
    let mut best = f64::INFINITY;
    for _ in 0..4 {
        let t = Instant::now();
        model.forward(
            &mut cache,
            &[SeqChunk {
                tokens: &p,
                start: 0,
                block_table: &tables[0],
                want_logits: true,
                prompt_len,
            }],
        )?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let prefill_tps = prompt_len as f64 / best;

    let mut decode_tps = Vec::new();
    for &b in &batches {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let prompts: Vec<Vec<u32>> = (0..b)
                .map(|i| prompt(prompt_len, vocab, i as u64 + 1))
                .collect();
            let chunks: Vec<SeqChunk<'_>> = prompts
                .iter()
                .zip(&tables)
                .map(|(p, t)| SeqChunk {
                    tokens: p,
                    start: 0,
                    block_table: t,
                    want_logits: true,
                    prompt_len,
                })
                .collect();
            let logits = model.forward(&mut cache, &chunks)?;
            let mut next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
            let t = Instant::now();
            for step in 0..decode {
                let toks = next.clone();
                let chunks: Vec<SeqChunk<'_>> = toks
                    .iter()
                    .zip(&tables)
                    .map(|(tok, t)| SeqChunk {
                        tokens: std::slice::from_ref(tok),
                        start: prompt_len + step,
                        block_table: t,
                        want_logits: true,
                        prompt_len,
                    })
                    .collect();
                let logits = model.forward(&mut cache, &chunks)?;
                next = logits.iter().map(|l| argmax(l)).collect();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        decode_tps.push((b, (b * decode) as f64 / best));
    }
    let decode_json: Vec<String> = decode_tps
        .iter()
        .map(|(b, tps)| format!("\"{b}\": {tps:.1}"))
        .collect();
    println!(
        "{{\"impl\": \"infergate cpu\", \"model\": \"{spec}\", \"parameters\": {}, \"threads\": {}, \"load_s\": {load_s:.2}, \"prompt_len\": {prompt_len}, \"decode_tokens\": {decode}, \"prefill_tok_s\": {prefill_tps:.1}, \"decode_tok_s\": {{{}}}}}",
        model.config.num_parameters(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        decode_json.join(", ")
    );
    Ok(())
}
