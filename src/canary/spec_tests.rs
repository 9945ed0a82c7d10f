//! Parsing and validation of the `models:` section of routing.yaml.

use std::time::Duration;

use super::spec::{DEFAULT_SCHEDULE, StickyKey, parse_models};
use super::testkit::{analysis, secs};

const FULL: &str = "
pools:
  local:
    policy: prefix
    some_future_key: 3
models:
  llama-3-8b:
    versions:
      - {name: stable, model: llama-3-8b, weight: 95}
      - {name: canary, model: llama-3-8b-canary, weight: 5}
    sticky: user
    analysis:
      window: 30s
      min_samples: 20
      max_error_rate_delta: 0.05
      max_ttft_p99_ratio: 2
      max_itl_p99_ratio: 1.25
      schedule: [10, 50, 100]
  small:
    stable: old
    versions:
      - {name: new, model: small-v2, weight: 0}
      - {name: old, model: small-v1, weight: 100}
";

/// One model entry with the given versions and analysis lines (already indented).
fn entry(versions: &str, extra: &str) -> String {
    format!("models:\n  m:\n    versions:\n{versions}{extra}")
}

const TWO: &str =
    "      - {name: a, model: ma, weight: 90}\n      - {name: b, model: mb, weight: 10}\n";

#[test]
fn reads_only_models_and_fills_defaults() {
    let specs = parse_models(FULL).unwrap();
    assert_eq!(specs.len(), 2);
    let llama = &specs["llama-3-8b"];
    assert_eq!(llama.stable, 0);
    assert_eq!(llama.canary(), 1);
    assert_eq!(llama.sticky, StickyKey::User);
    assert_eq!(llama.versions[1].model, "llama-3-8b-canary");
    assert_eq!(
        llama.weights(),
        [("stable".to_string(), 95), ("canary".to_string(), 5)]
    );
    assert_eq!(llama.analysis.window, secs(30));
    assert_eq!(llama.analysis.min_samples, 20);
    assert_eq!(llama.analysis.max_ttft_p99_ratio, 2.0);
    assert_eq!(llama.analysis.schedule, [10, 50, 100]);
    let small = &specs["small"];
    assert_eq!((small.stable, small.canary()), (1, 0));
    assert_eq!(small.sticky, StickyKey::Session);
    assert_eq!(small.analysis, analysis());
    assert_eq!(small.analysis.schedule, DEFAULT_SCHEDULE);
}

#[test]
fn no_models_means_no_canaries() {
    for text in [
        "",
        "# nothing\n",
        "pools:\n  local:\n    policy: prefix\n",
        "models:\n",
    ] {
        assert_eq!(parse_models(text).map(|m| m.len()), Ok(0), "{text:?}");
    }
}

#[test]
fn every_error_is_reported_with_its_model() {
    let versions =
        "      - {name: a, model: '', weight: 90}\n      - {name: a, model: mb, weight: 20}\n";
    let extra = "    stable: z\n    analysis:\n      window: 0s\n      min_samples: 0\n      \
                 max_error_rate_delta: 2\n      max_ttft_p99_ratio: 0.5\n      \
                 schedule: [5, 5, 101]\n";
    let errors = parse_models(&entry(versions, extra)).unwrap_err();
    let expect = [
        "version 1: model is empty",
        "version 2: name `a` is used twice",
        "weights sum to 110",
        "stable `z` is not one of the versions",
        "window must be above 0",
        "min_samples must be at least 1",
        "max_error_rate_delta 2",
        "max_ttft_p99_ratio 0.5",
        "schedule step 101 is above 100",
        "must be strictly increasing",
    ];
    assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    for (e, want) in errors.iter().zip(expect) {
        assert!(e.starts_with("model `m`"), "{e}");
        assert!(e.contains(want), "{e} lacks {want}");
    }
}

#[test]
fn a_canary_has_exactly_two_versions() {
    let one = "      - {name: a, model: ma, weight: 100}\n";
    let three = format!("{TWO}      - {{name: c, model: mc, weight: 0}}\n");
    for versions in [one, three.as_str()] {
        let errors = parse_models(&entry(versions, "")).unwrap_err();
        assert!(errors[0].contains("exactly two"), "{errors:?}");
    }
}

#[test]
fn bad_values_and_unknown_keys_are_errors() {
    let cases = [
        "    analysis:\n      window: 10\n",
        "    analysis:\n      schedule: []\n",
        "    sticky: cookie\n",
        "    typo: 1\n",
    ];
    for extra in cases {
        assert!(parse_models(&entry(TWO, extra)).is_err(), "{extra}");
    }
    let ok = parse_models(&entry(
        TWO,
        "    analysis:\n      window: 1.5s\n      schedule: [0, 100]\n",
    ));
    assert_eq!(
        ok.unwrap()["m"].analysis.window,
        Duration::from_millis(1500)
    );
}
