//! Tests of `plan spec` against hand calculations and the roofline.

use super::*;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn expected_tokens_by_hand() {
    // (1 - 0.6^5) / 0.4 = (1 - 0.07776) / 0.4 = 2.3056.
    assert!(close(expected_tokens(0.6, 4), 2.3056, 1e-12));
    // (1 - 0.8^3) / 0.2 = 0.488 / 0.2 = 2.44.
    assert!(close(expected_tokens(0.8, 2), 2.44, 1e-12));
    for k in 1..=8 {
        assert_eq!(expected_tokens(0.0, k), 1.0, "alpha 0, k {k}");
        assert_eq!(expected_tokens(1.0, k), (k + 1) as f64, "alpha 1, k {k}");
    }
    // Continuous as alpha approaches 1.
    assert!(close(expected_tokens(1.0 - 1e-9, 4), 5.0, 1e-6));
}

#[test]
fn speedup_bound_with_constant_draft_cost_by_hand() {
    // E = 2.3056; 1 + 4 x 0.05 = 1.2; 2.3056 / 1.2 = 1.921333...
    assert!(close(speedup_bound(0.6, 4, 0.05), 2.3056 / 1.2, 1e-12));
    // alpha 0 never pays: 1 / (1 + 2 x 0.1) = 0.8333.
    assert!(close(speedup_bound(0.0, 2, 0.1), 1.0 / 1.2, 1e-12));
    let p = spec_plan(&SpecArgs::new(0.6, 4)).unwrap();
    assert_eq!(p.draft_cost_source, "default");
    assert!(close(p.draft_cost, DEFAULT_DRAFT_COST, 1e-12));
    assert!(close(p.step_cost_ratio, 1.2, 1e-12));
    assert!(close(p.speedup_bound, 2.3056 / 1.2, 1e-12));
    // At batch 1 decode streams the weights, so verifying 5 tokens costs one decode step.
    assert!(close(p.verify_step_s / p.target_step_s, 1.0, 1e-3));
    assert!(close(p.speedup, p.speedup_bound, 1e-3), "{p:?}");
    // Bounds by k: k=3 2.176 / 1.15 = 1.892, k=4 1.921, k=5 2.38336 / 1.25 = 1.907.
    assert_eq!(p.best_k, 4);
    assert!(close(p.by_k[2].speedup_bound, 2.176 / 1.15, 1e-12));
    assert!(close(p.by_k[4].speedup_bound, 2.38336 / 1.25, 1e-12));

    let mut a = SpecArgs::new(0.6, 4);
    a.draft_cost = Some(0.1);
    let p = spec_plan(&a).unwrap();
    assert_eq!(p.draft_cost_source, "flag");
    assert!(close(p.speedup_bound, 2.3056 / 1.4, 1e-12));
}

#[test]
fn roofline_step_time_by_hand() {
    // Llama-3-8B decode at batch 1 on H100 streams the body and the LM head:
    // (8,030,261,248 - 128,256 x 4096) x 2 B = 15,009,849,344 B, plus KV of 1,025 tokens x
    // 131,072 B = 134,348,800 B; / (3.35 TB/s x 0.7) = 6.458 ms, + 30 us graph launch.
    let p = spec_plan(&SpecArgs::new(0.6, 4)).unwrap();
    let by_hand = (15_009_849_344.0 + 134_348_800.0) / (3.35e12 * 0.7) + 30e-6;
    assert!(close(p.target_step_s, by_hand, 1e-9), "{}", p.target_step_s);
    assert!(close(p.draft_step_s, 0.05 * by_hand, 1e-9));
    let formula = p.expected_tokens * p.target_step_s / (4.0 * p.draft_step_s + p.verify_step_s);
    assert!(close(p.speedup, formula, 1e-12));
}

#[test]
fn draft_model_speedup_falls_with_batch_and_crosses_one() {
    let mut a = SpecArgs::new(0.6, 4);
    a.draft_model = Some("qwen2.5-0.5b".to_string());
    a.context = 256;
    let p = spec_plan(&a).unwrap();
    println!("{}", p.render_text());
    assert_eq!(p.draft_cost_source, "roofline");
    assert_eq!(p.draft_model, Some("qwen2.5-0.5b"));
    assert!(p.draft_cost > 0.0 && p.draft_cost < 0.2, "{}", p.draft_cost);
    assert!(close(p.draft_cost, p.draft_step_s / p.target_step_s, 1e-12));
    assert!(p.speedup > 1.5, "{}", p.speedup);
    for w in p.by_batch.windows(2) {
        assert!(w[1].speedup <= w[0].speedup + 1e-9, "{w:?}");
    }
    let last = p.by_batch.last().unwrap();
    assert!(
        last.verify_over_decode > 2.0,
        "compute-bound at 512: {last:?}"
    );
    let b = p.break_even_batch.expect("speculation stops paying by 512");
    let cost = SpecCost {
        target: RooflineModel::new(
            presets::gpu("h100").unwrap(),
            presets::model("llama-3-8b").unwrap(),
            roofline_config(),
        ),
        draft: Draft::Model(RooflineModel::new(
            presets::gpu("h100").unwrap(),
            presets::model("qwen2.5-0.5b").unwrap(),
            roofline_config(),
        )),
        context: 256,
    };
    assert!(cost.speedup(0.6, b, 4) <= 1.0);
    assert!(cost.speedup(0.6, b - 1, 4) > 1.0);
    assert!((16..=512).contains(&b), "{b}");
}

#[test]
fn long_contexts_keep_decode_memory_bound() {
    let mut a = SpecArgs::new(0.6, 4);
    a.context = 4096;
    let p = spec_plan(&a).unwrap();
    assert_eq!(p.break_even_batch, None);
    assert!(p.render_text().contains("not up to batch 512"));
}

#[test]
fn bad_flags_are_reported_together() {
    let mut a = SpecArgs::new(1.5, 0);
    a.gpu = "h800".to_string();
    a.batch = 0;
    let err = spec_plan(&a).unwrap_err();
    for part in ["--alpha", "--k", "--gpu", "--batch"] {
        assert!(err.contains(part), "{part}: {err}");
    }
    let mut a = SpecArgs::new(0.6, 4);
    a.draft_cost = Some(0.1);
    a.draft_model = Some("qwen2.5-0.5b".to_string());
    assert!(spec_plan(&a).unwrap_err().contains("not both"));
    a.draft_cost = None;
    a.draft_model = Some("tiny".to_string());
    assert!(spec_plan(&a).unwrap_err().contains("--draft-model"));
}

#[test]
fn json_carries_the_numbers() {
    let p = spec_plan(&SpecArgs::new(0.6, 4)).unwrap();
    let j = p.to_json();
    assert_eq!(j["k"], 4);
    assert!(close(j["expected_tokens"].as_f64().unwrap(), 2.3056, 1e-12));
    assert_eq!(j["by_k"].as_array().unwrap().len(), 8);
    assert_eq!(j["best_k"], 4);
    assert!(j["break_even_batch"].is_null());
}
