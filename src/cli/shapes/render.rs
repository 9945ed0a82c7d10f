//! The text tables of `infergate shapes` (the JSON is the report structs themselves).

use crate::plan::table::{columns, key_values, thousands};

use super::dist::Distribution;
use super::propose::Coverage;
use super::{Cost, ProposeReport, SizeSet};

/// A step count: whole when it is, else to one decimal.
fn steps(x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 {
        format!("{}", x.round())
    } else {
        format!("{x:.1}")
    }
}

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn sizes(list: &[u32]) -> String {
    if list.is_empty() {
        return "none (every step eager)".into();
    }
    list.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The distribution as tables.
pub fn distribution(d: &Distribution) -> String {
    let mut out = format!(
        "shapes: {} requests with an engine record ({} lines, {} without a record, {} bad)\n",
        d.requests, d.lines, d.without_record, d.bad_lines
    );
    out += &format!("capture sizes: {}\n", sizes(&d.capture));
    out += &format!(
        "\nsteps by batch size{}:\n",
        if d.exact {
            ""
        } else {
            " (estimated: some histograms coarsened)"
        }
    );
    let mut rows = vec![vec![
        "batch".to_owned(),
        "graph".to_owned(),
        "decode eager".to_owned(),
        "prefill/mixed".to_owned(),
    ]];
    rows.extend(d.steps.iter().map(|r| {
        vec![
            r.batch.to_string(),
            steps(r.graph),
            steps(r.decode_eager),
            steps(r.mixed),
        ]
    }));
    out += &columns(&rows, 2);
    let p = &d.paths;
    out += &format!(
        "\npaths: {} graph steps, {} eager ({} graph); sequence-steps {} graph, {} eager\n",
        steps(p.graph_steps),
        steps(p.eager_steps),
        pct(p.graph_share),
        thousands(p.graph_seq_steps),
        thousands(p.eager_seq_steps),
    );
    out += "\nrequests by prompt (rows) x output (columns) tokens:\n";
    let l = &d.lengths;
    let mut rows = vec![
        std::iter::once("prompt".to_owned())
            .chain(l.output_buckets.iter().cloned())
            .collect::<Vec<_>>(),
    ];
    for (label, counts) in l.prompt_buckets.iter().zip(&l.requests) {
        if counts.iter().all(|&c| c == 0) {
            continue;
        }
        rows.push(
            std::iter::once(label.clone())
                .chain(counts.iter().map(|c| thousands(*c)))
                .collect(),
        );
    }
    out += &columns(&rows, 2);
    let f = &d.features;
    out += "\nfeatures (requests):\n";
    out += &key_values(
        &[
            ("stream", f.stream),
            ("n > 1", f.n_gt_1),
            ("best_of > n", f.best_of),
            ("logprobs", f.logprobs),
            ("echo", f.echo),
            ("tools", f.tools),
            ("response_format", f.response_format),
            ("images", f.images),
            ("several prompts", f.multi_prompt),
        ]
        .map(|(k, v)| (k.to_owned(), thousands(v))),
        2,
    );
    let c = &d.cache;
    out += &format!(
        "\ncache: {} of {} prompt tokens cached ({}); requests by cached share: 0: {}, <=25%: {}, <=50%: {}, <=75%: {}, <=100%: {}\n",
        thousands(c.cached_tokens),
        thousands(c.prompt_tokens),
        pct(c.cached_share),
        c.requests_by_share[0],
        c.requests_by_share[1],
        c.requests_by_share[2],
        c.requests_by_share[3],
        c.requests_by_share[4],
    );
    out
}

fn coverage(c: &Coverage) -> String {
    format!(
        "{} of {} decode steps ({} requests), padding {}",
        pct(c.coverage),
        steps(c.decode_steps),
        c.requests,
        pct(c.padding_share)
    )
}

fn cost(c: &Cost) -> String {
    format!(
        "{:.1} MiB a GPU ({:.3}% of its memory, {} KV tokens), {:.2} s start-up",
        c.bytes as f64 / f64::from(1u32 << 20),
        c.gpu_memory_share * 100.0,
        thousands(c.kv_tokens),
        c.seconds
    )
}

fn size_set(name: &str, s: &SizeSet) -> Vec<(String, String)> {
    let mut rows = vec![
        (format!("{name} sizes"), sizes(&s.sizes)),
        ("  cost".to_owned(), cost(&s.cost)),
        ("  training window".to_owned(), coverage(&s.train)),
    ];
    if let Some(h) = &s.holdout {
        rows.push(("  held-out window".to_owned(), coverage(h)));
    }
    rows
}

/// The proposal as text.
pub fn proposal(r: &ProposeReport) -> String {
    let mut out = format!(
        "shapes --propose: cover {} of decode steps with at most {} sizes, chosen on the first {} of requests ({} on {}, tp {})\n",
        pct(r.target_share),
        r.max_sizes,
        pct(r.train_until),
        r.preset.model,
        r.preset.gpu,
        r.preset.tensor_parallel_size
    );
    if r.piecewise {
        out += "  (the trace's engines ran piecewise graphs too: each size costs two graphs)\n";
    }
    let mut rows = size_set("proposed", &r.proposed);
    rows.extend(size_set("current", &r.current));
    out += &key_values(&rows, 2);
    if !r.reached {
        out += "  (the target needs a batch size above the largest capture size, 512)\n";
    }
    if r.bad_lines > 0 {
        out += &format!("  {} bad trace lines skipped\n", r.bad_lines);
    }
    if !r.flag.is_empty() {
        out += &format!("apply: infergate engine {}\n", r.flag);
    }
    out
}
