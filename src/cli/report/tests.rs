//! Report numbers checked against hand calculations.

use std::time::Duration;

use super::*;

fn rec(id: u64, status: u16, ttft: Option<f64>, itl: &[f64], e2e: f64) -> RequestRecord {
    RequestRecord {
        id,
        tenant: None,
        class: None,
        worker: None,
        path: None,
        shared: None,
        status,
        start: id as f64,
        ttft,
        itl: itl.to_vec(),
        e2e,
        prompt_tokens: 0,
        output_tokens: itl.len() as u64 + u64::from(ttft.is_some()),
        asked_output_tokens: itl.len() as u64 + 1,
        cached: None,
    }
}

fn tagged(
    mut r: RequestRecord,
    tenant: &str,
    worker: Option<&str>,
    path: Option<&str>,
) -> RequestRecord {
    r.tenant = Some(tenant.into());
    r.worker = worker.map(Into::into);
    r.path = path.map(Into::into);
    r
}

/// Five requests: three 2xx (one good, one with a 200 ms gap, one with a 2 s TTFT), a 429 and a
/// transport error.
fn sample() -> Vec<RequestRecord> {
    let mut r0 = tagged(
        rec(0, 200, Some(0.1), &[0.01, 0.02, 0.03], 0.2),
        "a",
        Some("w1"),
        Some("graph"),
    );
    r0.prompt_tokens = 100;
    let mut r1 = tagged(
        rec(1, 200, Some(0.3), &[0.05, 0.2], 0.6),
        "b",
        Some("w2"),
        Some("mixed"),
    );
    r1.prompt_tokens = 200;
    let r2 = tagged(rec(2, 429, None, &[], 0.001), "a", None, None);
    let r3 = tagged(rec(3, 0, None, &[], 0.5), "b", None, None);
    let mut r4 = tagged(
        rec(4, 200, Some(2.0), &[0.01], 2.05),
        "a",
        Some("w1"),
        Some("graph"),
    );
    r4.prompt_tokens = 50;
    vec![r0, r1, r2, r3, r4]
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn summary() -> Report {
    summarize(
        "t",
        &sample(),
        10.0,
        Duration::from_secs(1),
        Duration::from_millis(100),
    )
}

#[test]
fn nearest_rank_percentiles() {
    let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
    let p = Percentiles::of(&hundred);
    assert_eq!(
        (p.p50, p.p90, p.p95, p.p99, p.max),
        (50.0, 90.0, 95.0, 99.0, 100.0)
    );
    assert!(close(p.mean, 50.5));
    let ten: Vec<f64> = (1..=10).rev().map(f64::from).collect();
    let p = Percentiles::of(&ten);
    assert_eq!(
        (p.p50, p.p90, p.p95, p.p99, p.max),
        (5.0, 9.0, 10.0, 10.0, 10.0)
    );
    assert_eq!(Percentiles::of(&[]), Percentiles::default());
    assert_eq!(Percentiles::of(&[7.0]).p50, 7.0);
}

#[test]
fn counts_throughput_and_goodput() {
    let r = summary();
    assert_eq!(
        (
            r.requests,
            r.ok,
            r.rate_limited,
            r.client_errors,
            r.server_errors
        ),
        (5, 3, 1, 0, 1)
    );
    // Only request 0 has TTFT ≤ 1 s and every gap ≤ 100 ms.
    assert!(close(r.goodput, 0.2));
    assert!(close(r.tokens_in_per_s, 35.0));
    assert!(close(r.tokens_out_per_s, 0.9)); // 4 + 3 + 2 tokens in 10 s
    assert!(close(r.slo_ttft_s, 1.0) && close(r.slo_itl_s, 0.1));
}

#[test]
fn latency_percentiles_over_successes() {
    let r = summary();
    // TTFT of 0.1, 0.3, 2.0.
    assert_eq!((r.ttft.p50, r.ttft.p90, r.ttft.max), (0.3, 2.0, 2.0));
    assert!(close(r.ttft.mean, 0.8));
    // Gaps sorted: 0.01 0.01 0.02 0.03 0.05 0.2 → rank 3 and rank 6.
    assert_eq!(
        (r.itl.p50, r.itl.p90, r.itl.p99, r.itl.max),
        (0.02, 0.2, 0.2, 0.2)
    );
    assert_eq!((r.e2e.p50, r.e2e.max), (0.6, 2.05));
    // TPOT: (0.2 − 0.1)/3, (0.6 − 0.3)/2, (2.05 − 2.0)/1.
    assert!(close(r.tpot_mean, (0.1 / 3.0 + 0.15 + 0.05) / 3.0));
    // Per request, sorted: 0.033, 0.05, 0.15 → p50 the 2nd, p95 the 3rd.
    assert!(close(r.tpot.p50, 0.05) && close(r.tpot.p95, 0.15));
    assert!(close(r.tpot.mean, r.tpot_mean));
}

#[test]
fn engines_render_as_a_table_and_stay_out_of_json_when_absent() {
    let mut r = summary();
    assert!(
        !r.to_json().contains("by_engine"),
        "a live run has no engine rows"
    );
    r.by_engine.insert(
        "w00".into(),
        super::EngineBreakdown {
            busy_fraction: 0.3,
            host_fraction: 0.6,
            batch_mean: 7.5,
            batch_p95: 8.0,
            queue_mean: 120.0,
            preemptions: 2.0,
            recomputed_tokens: 900.0,
        },
    );
    let text = r.render_text();
    let row = text
        .lines()
        .find(|l| l.starts_with("w00") && l.contains("30.0%"))
        .unwrap_or_else(|| panic!("no engine row in:\n{text}"));
    for cell in ["60.0%", "7.5", "120.0", "900"] {
        assert!(row.contains(cell), "{cell} missing from {row}");
    }
    let back = super::Report::from_json(&r.to_json()).expect("round trip");
    assert_eq!(back.by_engine, r.by_engine);
}

#[test]
fn breakdowns_by_tenant_worker_and_path() {
    let r = summary();
    let a = &r.by_tenant["a"];
    assert_eq!((a.requests, a.ok, a.ttft_p50, a.ttft_p99), (3, 2, 0.1, 2.0));
    assert!(close(a.goodput, 1.0 / 3.0));
    let b = &r.by_tenant["b"];
    assert_eq!((b.requests, b.ok, b.itl_p99, b.goodput), (2, 1, 0.2, 0.0));
    assert_eq!(r.by_worker.keys().collect::<Vec<_>>(), ["w1", "w2"]);
    assert!(close(r.by_worker["w1"].goodput, 0.5));
    assert_eq!(r.by_path["graph"].requests, 2);
    assert_eq!(r.by_path["mixed"].e2e_p99, 0.6);
}

#[test]
fn empty_run_has_no_nan() {
    let r = summarize(
        "empty",
        &[],
        0.0,
        Duration::from_secs(1),
        Duration::from_millis(50),
    );
    assert_eq!(r.goodput, 0.0);
    assert_eq!(Report::from_json(&r.to_json()), Ok(r));
}

#[test]
fn json_round_trip_and_records() {
    let mut r = summary();
    r.extra.insert("prefix_hit_rate".into(), 0.75);
    assert_eq!(Report::from_json(&r.to_json()), Ok(r));
    let records = sample();
    let text = records_jsonl(&records);
    assert_eq!(text.lines().count(), 5);
    assert_eq!(parse_records(&text), Ok(records));
    assert!(Report::from_json("{}").is_err());
}

#[test]
fn text_shows_the_itl_tail_beside_tpot() {
    let text = summary().render_text();
    assert!(
        text.contains("TPOT mean 77.8 ms · ITL p99 200.0 ms · ITL max 200.0 ms"),
        "{text}"
    );
    let ttft = text
        .lines()
        .find(|l| l.starts_with("TTFT"))
        .unwrap_or_default();
    let cells: Vec<&str> = ttft.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "TTFT", "300.0", "2000.0", "2000.0", "2000.0", "2000.0", "800.0"
        ]
    );
    for section in ["tenant", "worker", "path", "goodput 20.0%"] {
        assert!(text.contains(section), "{section} missing:\n{text}");
    }
}

#[test]
fn diff_shows_ratios() {
    let a = summary();
    let mut b = a.clone();
    b.ttft.p99 = 1.0;
    b.goodput = 0.4;
    b.extra.insert("preemptions".into(), 3.0);
    let text = diff(&a, &b);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(
        row("TTFT p99 ms"),
        ["TTFT", "p99", "ms", "2000.0", "1000.0", "0.500"]
    );
    assert_eq!(row("goodput"), ["goodput", "20.0%", "40.0%", "2.000"]);
    assert_eq!(row("requests"), ["requests", "5", "5", "1.000"]);
    assert_eq!(row("preemptions"), ["preemptions", "-", "3", "-"]);
}

#[test]
fn jain_index_is_one_for_a_max_min_fair_split_and_lower_for_first_come() {
    // Demands (asked tokens): a 1000, b 100, c 100; 600 tokens served in all. Max-min fair:
    // b 100, c 100, a 400.
    let served = |tenant: &str, asked: u64, got: u64| {
        let mut r = tagged(rec(0, 200, Some(0.1), &[], 0.2), tenant, None, None);
        r.prompt_tokens = 0;
        r.asked_output_tokens = asked;
        r.output_tokens = got;
        r
    };
    let fair = [
        served("a", 1000, 400),
        served("b", 100, 100),
        served("c", 100, 100),
    ];
    let r = summarize(
        "t",
        &fair,
        1.0,
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    assert!((r.jain_index - 1.0).abs() < 1e-9, "{}", r.jain_index);
    assert_eq!(r.by_tenant["a"].served_tokens, 400);
    assert_eq!(r.by_tenant["a"].asked_tokens, 1000);
    // First come, in proportion to demand: a 500, b 50, c 50.
    let fcfs = [
        served("a", 1000, 500),
        served("b", 100, 50),
        served("c", 100, 50),
    ];
    let r = summarize(
        "t",
        &fcfs,
        1.0,
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    // x = (1.25, 0.5, 0.5): (2.25)^2 / (3 * 2.0625)
    assert!(
        (r.jain_index - 2.25 * 2.25 / (3.0 * 2.0625)).abs() < 1e-9,
        "{}",
        r.jain_index
    );
    // One tenant (or none): trivially fair.
    let one = [served("a", 10, 5)];
    let r = summarize(
        "t",
        &one,
        1.0,
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    assert_eq!(r.jain_index, 1.0);
}

#[test]
fn the_explained_hit_rate_sums_the_successful_answers_that_carried_it() {
    let with = |id, status, cached| {
        let mut r = rec(id, status, Some(0.1), &[0.01], 0.2);
        r.prompt_tokens = 1000;
        r.cached = cached;
        r
    };
    let c = |predicted, delivered, available| {
        Some(super::CachedTokens {
            predicted,
            delivered,
            available,
        })
    };
    let records = [
        with(0, 200, c(512, 512, 768)),
        with(1, 200, c(0, 256, 512)),
        with(2, 200, None),
        with(3, 500, c(900, 900, 900)),
    ];
    let r = summarize(
        "t",
        &records,
        1.0,
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let s = r.cached_tokens.expect("two answers carried it");
    assert_eq!(
        (
            s.answers,
            s.prompt_tokens,
            s.predicted,
            s.delivered,
            s.available
        ),
        (2, 2000, 512, 768, 1280)
    );
    assert!(
        r.render_text()
            .contains("predicted 512 · delivered 768 · available 1280")
    );
    let none = summarize(
        "t",
        &records[2..3],
        1.0,
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    assert!(none.cached_tokens.is_none() && !none.render_text().contains("cached prompt tokens"));
}
