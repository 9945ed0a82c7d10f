//! The whole model against an independent implementation: logits that Hugging Face transformers
//! computed for tiny random checkpoints (`tests/fixtures/reference/*`, made by
//! `tests/reference/make_fixtures.py`) must match ours, through the real loader (f32, bf16
//! sharded, f16), for token-by-token decoding, one whole prefill and chunked prefill.
#![expect(
    clippy::unwrap_used,
    reason = "tests and benches stop at the first thing that is not as it should be"
)]

use std::path::{Path, PathBuf};

use infergate_engine::model::forward::{Model, SeqChunk};
use infergate_engine::model::hf;
use serde_json::Value;

/// Largest allowed |ours − reference| relative to the case's largest |logit| (f32 both sides,
/// different summation orders).
const TOLERANCE: f32 = 2e-5;

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .flatten()
        .map(|d| d.path())
        .filter(|p| p.join("logits.json").is_file())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 3,
        "expected 3 reference checkpoints in {}",
        root.display()
    );
    dirs
}

fn load(dir: &Path) -> (Model, Value) {
    let config_text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let config = hf::parse_config(&config_text).unwrap();
    let weights = hf::load_weights(dir, &config).unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    (Model::new(config, weights), reference)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn max_rel_diff(ours: &[f32], want: &[f32], scale: f32) -> f32 {
    assert_eq!(ours.len(), want.len());
    ours.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / scale.max(1.0))
        .fold(0.0, f32::max)
}

#[test]
fn logits_match_transformers_for_every_position() {
    let block_size = 4;
    let mut worst = Vec::new();
    for dir in fixtures() {
        let (model, reference) = load(&dir);
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for (ci, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
            let prompt: Vec<u32> = case["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let want: Vec<Vec<f32>> = case["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(floats)
                .collect();
            let scale = want.iter().flatten().fold(0.0f32, |m, v| m.max(v.abs()));
            let n = prompt.len();
            let blocks = n.div_ceil(block_size);
            // A scattered block table, as the block manager hands out.
            let table: Vec<u32> = (0..blocks as u32)
                .map(|b| (b * 7 + 3) % (blocks as u32 * 7 + 3))
                .collect();
            let num_blocks = table.iter().max().unwrap() + 1;

            // Token by token: every position's logits.
            let mut cache = model.new_cache(num_blocks as usize, block_size);
            let mut stepwise_last = Vec::new();
            for (pos, tok) in prompt.iter().enumerate() {
                let out = model
                    .forward(
                        &mut cache,
                        &[SeqChunk {
                            tokens: std::slice::from_ref(tok),
                            start: pos,
                            block_table: &table,
                            want_logits: true,
                            // Every token after the first goes through the decode kernel.
                            prompt_len: 1,
                        }],
                    )
                    .unwrap();
                let d = max_rel_diff(&out[0], &want[pos], scale);
                worst.push((name.clone(), "decode", d));
                assert!(
                    d <= TOLERANCE,
                    "{name} case {ci} position {pos}: relative diff {d}"
                );
                stepwise_last = out[0].clone();
            }

            // One prefill of the whole prompt, and a prefill in chunks of 5: the last position.
            let mut cache = model.new_cache(num_blocks as usize, block_size);
            let whole = model
                .forward(
                    &mut cache,
                    &[SeqChunk {
                        tokens: &prompt,
                        start: 0,
                        block_table: &table,
                        want_logits: true,
                        prompt_len: n,
                    }],
                )
                .unwrap();
            let d = max_rel_diff(&whole[0], &want[n - 1], scale);
            worst.push((name.clone(), "prefill", d));
            assert!(
                d <= TOLERANCE,
                "{name} case {ci} prefill: relative diff {d}"
            );
            let mut cache = model.new_cache(num_blocks as usize, block_size);
            let mut chunked = Vec::new();
            for start in (0..n).step_by(5) {
                let end = (start + 5).min(n);
                chunked = model
                    .forward(
                        &mut cache,
                        &[SeqChunk {
                            tokens: &prompt[start..end],
                            start,
                            block_table: &table,
                            want_logits: end == n,
                            prompt_len: n,
                        }],
                    )
                    .unwrap();
            }
            // Prompt tokens agree exactly however they are chunked: each row's arithmetic does not
            // depend on its company. (Decode-kernel rows agree within the tolerance above.)
            assert_eq!(whole[0], chunked[0], "{name} case {ci}: prefill vs chunked");
            if n == 1 {
                assert_eq!(whole[0], stepwise_last, "{name} case {ci}: one token");
            }
        }
    }
    // Reported for the record (run with --nocapture): the largest deviation per fixture.
    worst.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(b.1)));
    worst.dedup_by(|b, a| {
        if a.0 == b.0 && a.1 == b.1 {
            a.2 = a.2.max(b.2);
            true
        } else {
            false
        }
    });
    for (name, path, d) in worst {
        eprintln!("{name} {path}: max |ours - transformers| / max(1, max|logit|) = {d:.2e}");
    }
}

#[test]
fn a_batch_gives_each_sequence_the_logits_it_gets_alone() {
    let dir = &fixtures()[0];
    let (model, reference) = load(dir);
    let cases = reference["cases"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| {
            c["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    let block_size = 4;
    let mut next = 0u32;
    let tables: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let n = p.len().div_ceil(block_size) as u32;
            let t = (next..next + n).collect();
            next += n;
            t
        })
        .collect();
    let mut cache = model.new_cache(next as usize, block_size);
    let chunks: Vec<SeqChunk<'_>> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| SeqChunk {
            tokens: p,
            start: 0,
            block_table: t,
            want_logits: true,
            prompt_len: p.len(),
        })
        .collect();
    let together = model.forward(&mut cache, &chunks).unwrap();
    for (i, chunk) in chunks.iter().enumerate() {
        let mut alone_cache = model.new_cache(next as usize, block_size);
        let alone = model
            .forward(&mut alone_cache, std::slice::from_ref(chunk))
            .unwrap();
        assert_eq!(alone[0], together[i], "sequence {i}");
    }
}
