//! Tests of `plan kv` against hand calculations.

use super::*;

fn args(model: &str, gpu: &str, context: usize, mean: usize) -> KvArgs {
    KvArgs {
        model: model.to_string(),
        gpu: gpu.to_string(),
        context: Some(context),
        mean_context: Some(mean),
        ..KvArgs::default()
    }
}

#[test]
fn kv_bytes_per_token_by_hand() {
    // 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes.
    let p = kv_plan(&args("llama-3-8b", "h100", 8192, 2048)).unwrap();
    assert_eq!(p.kv_bytes_per_token, 131_072);
    assert_eq!(p.kv_bytes_per_token_per_gpu, 131_072);
    // 2 x 80 layers x 8 x 128 x 2; on four GPUs each holds 2 of the 8 KV heads.
    let mut a = args("llama-3-70b", "h100", 8192, 2048);
    a.tensor_parallel_size = 4;
    let p = kv_plan(&a).unwrap();
    assert_eq!(p.kv_bytes_per_token, 327_680);
    assert_eq!(p.kv_bytes_per_token_per_gpu, 81_920);
}

#[test]
fn llama_8b_on_one_h100_by_hand() {
    // usable 80 GiB x 0.9 = 77,309,411,328 B; weights 8,030,261,248 x 2 = 16,060,522,496 B;
    // reserve 1 GiB + 8192 x (3 x 14336 + 2 x 4096) x 2 = 1,912,602,624 B;
    // KV = 59,336,286,208 B / (16 x 131,072 B a block) = 28,293 blocks = 452,688 tokens.
    let p = kv_plan(&args("llama-3-8b", "h100", 32_768, 4100)).unwrap();
    assert_eq!(p.weight_bytes_per_gpu, 16_060_522_496);
    assert_eq!(p.kv_cache_bytes, 59_336_286_208);
    assert_eq!(p.num_blocks, 28_293);
    assert_eq!(p.kv_tokens, 452_688);
    // ceil(4100 / 16) = 257 and 32768 / 16 = 2048 blocks a sequence.
    assert_eq!((p.blocks_per_mean_seq, p.blocks_per_full_seq), (257, 2048));
    // 28,293 / 257 = 110.09 and 28,293 / 2048 = 13.8; 14 full requests exceed the cache.
    assert_eq!((p.seqs_at_mean, p.seqs_at_full), (110, 13));
    assert_eq!(p.full_requests_to_exhaust, 14);
    assert!((p.displaced_per_full_request - 2048.0 / 257.0).abs() < 1e-12);
    // 32,768 is beyond llama-3-8b's 8,192.
    assert!(p.notes.iter().any(|n| n.contains("max_model_len 8,192")));
}

#[test]
fn issue_example_on_mi300x() {
    // 192 GiB x 0.9 - weights - reserve = 167,569,462,067 B -> 79,903 blocks.
    let p = kv_plan(&args("llama-3-8b", "mi300x", 32_768, 4100)).unwrap();
    assert_eq!(p.num_blocks, 79_903);
    assert_eq!((p.seqs_at_mean, p.seqs_at_full), (310, 39));
    assert_eq!(p.full_requests_to_exhaust, 40);
    let text = p.render_text();
    println!("{text}");
    assert!(text.contains("40 requests of 32,768 tokens take the whole cache"));
    assert!(text.contains("~8.0 mean-context sequences of 4,100 tokens"));
    let j = p.to_json();
    assert_eq!(j["num_blocks"], 79_903);
    assert_eq!(j["kv_bytes_per_token"], 131_072);
}

#[test]
fn capacity_arithmetic_by_hand() {
    // 1,000 blocks of 16: mean 100 tokens -> 7 blocks, full 1,000 tokens -> 63 blocks.
    let c = Capacity::new(1000, 16, 1000, 100);
    assert_eq!((c.blocks_mean, c.blocks_full), (7, 63));
    assert_eq!((c.seqs_at_mean, c.seqs_at_full), (142, 15));
    assert_eq!(c.full_to_exhaust, 16);
    // Two full requests hold 126 blocks; 874 / 7 = 124 mean sequences remain.
    assert_eq!(c.mean_seqs_beside(2), 124);
    let burst = c.burst();
    let fulls: Vec<usize> = burst.iter().map(|r| r.full_requests).collect();
    assert_eq!(fulls, [0, 1, 4, 8, 12, 15]);
    assert_eq!(burst[0].mean_seqs, 142);
    // 15 x 63 = 945 blocks leave 55: 7 mean sequences.
    assert_eq!(burst[5].mean_seqs, 7);
}

#[test]
fn defaults_come_from_the_model() {
    let p = kv_plan(&KvArgs::default()).unwrap();
    assert_eq!((p.context, p.mean_context), (8192, 2048));
    assert!(p.notes.is_empty(), "{:?}", p.notes);
}

#[test]
fn refuses_a_model_that_does_not_fit_naming_memory() {
    let err = kv_plan(&args("llama-3-70b", "h100", 8192, 2048)).unwrap_err();
    assert!(err.contains("131.4 GiB"), "{err}");
    assert!(err.contains("72.0 GiB usable"), "{err}");
    assert!(err.contains("--tensor-parallel-size 2"), "{err}");
}

#[test]
fn reports_every_bad_flag_at_once() {
    let a = KvArgs {
        model: "llama-9".to_string(),
        gpu: "h800".to_string(),
        gpu_memory_utilization: 1.5,
        block_size: 0,
        ..KvArgs::default()
    };
    let err = kv_plan(&a).unwrap_err();
    for part in [
        "--gpu",
        "--model",
        "--gpu-memory-utilization",
        "--block-size",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    let err = kv_plan(&args("llama-3-8b", "h100", 1000, 2000)).unwrap_err();
    assert!(
        err.contains("--mean-context 2000 exceeds --context 1000"),
        "{err}"
    );
}

#[test]
fn a_context_larger_than_the_cache_is_flagged() {
    // l4: 24 GiB x 0.9 leaves about 4 GiB of KV for llama-3-8b: far less than 1M tokens.
    let p = kv_plan(&args("llama-3-8b", "l4", 1_000_000, 1000)).unwrap();
    assert_eq!(p.seqs_at_full, 0);
    assert_eq!(p.full_requests_to_exhaust, 1);
    assert!(p.notes.iter().any(|n| n.contains("can never run")));
}
