//! Tests of tenants in the config and tiers in tenants.yaml: defaults, every key source, and
//! every error reported at once with its file and line, never repeating a plain key.

use std::path::Path;

use super::tests::{CONFIG, MINIMAL};
use super::*;
use crate::tenants::keys::{KeyTable, format_hash, hash_key};

const TENANTS: &str = "/etc/infergate/tenants.yaml";

/// Two tiers over the model `m` of `MINIMAL`.
const TIERS: &str = "\
tiers:
  free: {priority: 1, requests_per_minute: 60, max_tokens: 1024, models: [m]}
  paid: {priority: 10}
default_tier: free
";

/// Compiles `MINIMAL` plus `extra` config lines, with tenants text when given.
fn load_tenants(extra: &str, tiers: Option<&str>) -> Result<Snapshot, ConfigErrors> {
    let config = format!("{MINIMAL}{extra}");
    load_str_with(
        &config,
        Path::new(CONFIG),
        None,
        tiers.map(|t| (t, Path::new(TENANTS))),
    )
}

/// The errors of a load that must fail, as (file name, line, message).
fn tenant_errors(extra: &str, tiers: Option<&str>) -> Vec<(String, Option<u64>, String)> {
    let Err(errors) = load_tenants(extra, tiers) else {
        panic!("expected errors for:\n{extra}\n{tiers:?}");
    };
    let name = |e: &ConfigError| e.file.file_name().map(|n| n.to_string_lossy().into_owned());
    let list = errors.0.iter();
    list.map(|e| (name(e).unwrap_or_default(), e.line, e.message.clone()))
        .collect()
}

#[test]
fn the_shipped_tiers_load() {
    let snap = load_default().expect("shipped config is valid");
    assert!(snap.tenants.is_empty(), "no shipped tenant may hold a key");
    assert_eq!(snap.default_tier.as_deref(), Some("paid"));
    let names: Vec<&str> = snap.tiers.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["free", "paid", "enterprise"]);
    let free = snap.tier("free").expect("free");
    assert_eq!((free.priority, free.requests_per_minute), (1, Some(60)));
    assert_eq!(
        (free.tokens_per_minute, free.max_concurrent),
        (Some(40_000), Some(4))
    );
    assert_eq!((free.max_tokens, free.default_max_tokens), (1024, 256));
    assert!(free.allows_model("llama-3-8b"));
    let paid = snap.tier("paid").expect("paid");
    assert_eq!((paid.priority, paid.requests_per_minute), (10, Some(600)));
    assert_eq!(
        (paid.tokens_per_minute, paid.max_concurrent),
        (Some(1_000_000), Some(64))
    );
    assert_eq!((paid.max_tokens, paid.default_max_tokens), (4096, 1024));
    assert!(snap.tier("gold").is_none());
}

#[test]
fn without_tenants_yaml_there_is_one_unlimited_tier() {
    let snap = load_tenants("", None).expect("valid");
    assert_eq!(snap.default_tier.as_deref(), Some("default"));
    let tier = snap.tier("default").expect("built-in");
    assert_eq!(snap.tiers.len(), 1);
    assert_eq!(tier.priority, 0);
    assert_eq!(
        (tier.requests_per_minute, tier.tokens_per_minute),
        (None, None)
    );
    assert_eq!(tier.max_concurrent, None);
    assert_eq!((tier.max_tokens, tier.default_max_tokens), (4096, 256));
    assert_eq!(tier.models, ["*"]);
    assert!(tier.allows_model("anything"));
}

#[test]
fn tier_fields_default_and_models_restrict() {
    let snap = load_tenants("", Some(TIERS)).expect("valid");
    let free = snap.tier("free").expect("free");
    assert!(free.allows_model("m") && !free.allows_model("other"));
    assert_eq!(free.default_max_tokens, 256);
    let paid = snap.tier("paid").expect("paid");
    assert_eq!((paid.max_tokens, paid.default_max_tokens), (4096, 256));
    assert_eq!(paid.models, ["*"]);
    assert_eq!(snap.files.len(), 2);
    assert!(snap.files[1].ends_with("tenants.yaml"));
    let small = "tiers:\n  t: {max_tokens: 100}\n";
    let snap = load_tenants("", Some(small)).expect("valid");
    assert_eq!(snap.tiers[0].default_max_tokens, 100);
    assert_eq!(snap.default_tier, None);
}

#[test]
fn keys_come_from_hashes_env_and_files() {
    let dir = std::env::temp_dir().join(format!("infergate-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("b.keys");
    std::fs::write(&file, "# keys of b\n  kb1  \n\nkb2\n").expect("write");
    let hash = format_hash(&hash_key("ka"));
    let extra = format!(
        "tenants:\n  - {{name: a, tier: free, keys: [\"{hash}\"]}}\n  \
         - {{name: b, tier: paid, key_file: {}, key_env: PATH}}\n",
        file.display()
    );
    let snap = load_tenants(&extra, Some(TIERS));
    let _ = std::fs::remove_dir_all(&dir);
    let snap = snap.expect("valid");
    assert_eq!(snap.tenants.len(), 2);
    assert_eq!(
        (snap.tenants[1].name.as_str(), snap.tenants[1].tier.as_str()),
        ("b", "paid")
    );
    let table = KeyTable::new(&snap.tenants);
    let path = std::env::var("PATH").expect("PATH is set");
    assert_eq!(table.lookup("ka"), Some(0));
    assert_eq!(table.lookup("kb1"), Some(1));
    assert_eq!(table.lookup("kb2"), Some(1));
    assert_eq!(table.lookup(path.trim()), Some(1));
    assert_eq!(table.lookup("# keys of b"), None);
    assert!(snap.files.last().is_some_and(|f| f.ends_with("b.keys")));
}

#[test]
fn tenant_errors_are_all_reported_with_their_lines() {
    let key = format_hash(&hash_key("shared"));
    let extra = format!(
        "\
tenants:
  - {{name: a, tier: free, keys: [\"{key}\"]}}
  - {{name: a, tier: paid, keys: [\"{key}\"]}}
  - {{name: c, tier: gold, keys: [not-a-hash-but-a-plain-secret]}}
  - {{name: d, tier: free}}
  - {{name: e, tier: free, key_env: INFERGATE_TEST_UNSET_TENANT_KEY_51c2}}
  - {{name: f, tier: free, key_file: /nonexistent/f.keys}}
"
    );
    let errs = tenant_errors(&extra, Some(TIERS));
    let lines: Vec<Option<u64>> = errs.iter().map(|e| e.1).collect();
    assert_eq!(lines, [9, 9, 10, 10, 11, 12, 13].map(Some), "{errs:#?}");
    assert!(
        errs[0]
            .2
            .contains("duplicate tenant name `a` (first on line 8)")
    );
    assert!(errs[1].2.contains("also a key of tenant `a`") && errs[1].2.contains("`a`: this"));
    assert!(
        errs[2]
            .2
            .contains("tier `gold` is not defined (tiers: free, paid)")
    );
    assert!(errs[3].2.contains("must start with `sha256:`"));
    assert!(errs[4].2.contains("tenant `d`: no keys"));
    assert!(errs[5].2.contains("is not set"));
    assert!(errs[6].2.contains("key_file: cannot read"));
    assert!(
        errs.iter().all(|e| !e.2.contains("plain-secret")),
        "{errs:#?}"
    );
}

#[test]
fn a_key_shared_by_two_tenants_names_both() {
    let key = format_hash(&hash_key("shared"));
    let extra = format!(
        "tenants:\n  - {{name: one, tier: paid, keys: [\"{key}\", \"{key}\"]}}\n  \
         - {{name: two, tier: paid, keys: [\"{key}\"]}}\n"
    );
    let errs = tenant_errors(&extra, Some(TIERS));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].1, Some(9));
    assert!(
        errs[0]
            .2
            .contains("tenant `two`: this key is also a key of tenant `one` (line 8)")
    );
}

#[test]
fn tier_errors_are_all_reported_with_their_lines() {
    let tiers = "\
tiers:
  a:
    requests_per_minute: 0
    tokens_per_minute: 0
    max_concurrent: 0
    max_tokens: 0
  b: {max_tokens: 10, default_max_tokens: 11, models: [m, ghost]}
  c: {models: []}
default_tier: gold
";
    let errs = tenant_errors("", Some(tiers));
    let lines: Vec<(&str, Option<u64>)> = errs.iter().map(|e| (e.0.as_str(), e.1)).collect();
    let expected = [3, 4, 5, 6, 7, 7, 8, 9].map(|l| ("tenants.yaml", Some(l)));
    assert_eq!(lines, expected, "{errs:#?}");
    assert!(
        errs[0]
            .2
            .contains("tier `a`: requests_per_minute must be ≥ 1")
    );
    assert!(errs[3].2.contains("max_tokens must be ≥ 1"));
    let line7 = format!("{} | {}", errs[4].2, errs[5].2);
    assert!(
        line7.contains("default_max_tokens 11 is above max_tokens 10"),
        "{line7}"
    );
    assert!(
        line7.contains("model `ghost` is not in the config's models (m)"),
        "{line7}"
    );
    assert!(errs[6].2.contains("models is empty"));
    assert!(errs[7].2.contains("default_tier `gold` is not a tier here"));
}

#[test]
fn a_broken_tenants_file_is_one_error_and_hides_tier_checks() {
    let extra = "tenants:\n  - {name: a, tier: free, key_env: PATH}\n";
    let errs = tenant_errors(extra, Some("tiers:\n  free: {priorty: 1}\n"));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!((errs[0].0.as_str(), errs[0].1), ("tenants.yaml", Some(2)));
    assert!(errs[0].2.contains("priorty"));
    let errs = tenant_errors("", Some("# nothing\n"));
    assert_eq!((errs.len(), errs[0].1), (1, None), "{errs:#?}");
    assert!(errs[0].2.contains("no tiers declared"));
    let errs = tenant_errors("", Some("tiers:\n  t: {priority: -1}\n"));
    assert_eq!((errs.len(), errs[0].1), (1, Some(2)), "{errs:#?}");
}

const PRICES: &str = "/etc/infergate/prices.yaml";

/// Compiles `MINIMAL` with `TIERS` (plus `tiers_extra`) and prices text.
fn load_priced(tiers_extra: &str, prices: &str) -> Result<Snapshot, ConfigErrors> {
    let tiers = TIERS.replace("default_tier", &format!("{tiers_extra}default_tier"));
    load_str_all(
        MINIMAL,
        Path::new(CONFIG),
        None,
        Some((&tiers, Path::new(TENANTS))),
        None,
        Some((prices, Path::new(PRICES))),
    )
}

fn errors_of(r: Result<Snapshot, ConfigErrors>) -> Vec<(String, Option<u64>, String)> {
    let Err(errors) = r else {
        panic!("expected errors");
    };
    let name = |e: &ConfigError| e.file.file_name().map(|n| n.to_string_lossy().into_owned());
    errors
        .0
        .iter()
        .map(|e| (name(e).unwrap_or_default(), e.line, e.message.clone()))
        .collect()
}

#[test]
fn prices_and_budgets_load_into_integer_nano_usd() {
    let budgets = "budgets:\n  nobody-checks: []\n";
    let prices = "version: 3\nmodels:\n  m: {input: 0.15, cached_input: 0.075, output: 0.6}\ntiers:\n  paid: 0.8\n";
    let tiers = format!(
        "{}\n",
        TIERS.replace(
            "paid: {priority: 10}",
            "paid: {priority: 10, budgets: [{period: day, usd: 12.5}, {period: month, usd: 100, kind: soft}]}"
        )
    );
    let s = load_str_all(
        MINIMAL,
        Path::new(CONFIG),
        None,
        Some((&format!("{tiers}{budgets}"), Path::new(TENANTS))),
        None,
        Some((prices, Path::new(PRICES))),
    )
    .expect("valid");
    assert_eq!(s.prices.version, 3);
    let m = s.prices.models["m"];
    assert_eq!(
        (m.input, m.cached_input, m.output),
        (150_000_000, 75_000_000, 600_000_000)
    );
    assert_eq!(s.prices.tier_multipliers["paid"], 800_000);
    let paid = s.tier("paid").expect("paid");
    assert_eq!(paid.budgets.len(), 2);
    assert_eq!(paid.budgets[0].limit_nano, 12_500_000_000);
    assert!(paid.budgets[0].hard && !paid.budgets[1].hard);
    // The config declares no tenants: a budget for any name is kept (`up`'s demo tenant).
    assert!(s.tenant_budgets.contains_key("nobody-checks"));
    // Without cached_input, cached tokens cost the input price.
    let s = load_priced("", "version: 1\nmodels:\n  m: {input: 1, output: 2}\n").expect("valid");
    assert_eq!(
        s.prices.models["m"].cached_input,
        s.prices.models["m"].input
    );
}

#[test]
fn price_and_budget_errors_are_reported_with_their_lines() {
    let prices = "\
version: 0
currency: EUR
models:
  m: {input: -1, output: 2}
  ghost: {input: 1, output: 1}
tiers:
  gold: 0.5
  paid: 0
";
    let errs = errors_of(load_priced("", prices));
    let lines: Vec<(&str, Option<u64>)> = errs.iter().map(|e| (e.0.as_str(), e.1)).collect();
    let expected = [1, 2, 4, 5, 7, 8].map(|l| ("prices.yaml", Some(l)));
    assert_eq!(lines, expected, "{errs:#?}");
    assert!(errs[0].2.contains("version must be ≥ 1"));
    assert!(errs[1].2.contains("only USD"));
    assert!(
        errs[2]
            .2
            .contains("model `m`: input must be USD per 1M tokens")
    );
    assert!(
        errs[3]
            .2
            .contains("model `ghost` is not in the config's models")
    );
    assert!(errs[4].2.contains("tier `gold` is not in tenants.yaml"));
    assert!(errs[5].2.contains("multiplier must be above 0"));
    let errs = errors_of(load_priced("", "models: {}\n"));
    assert!(errs[0].2.contains("no `version`"), "{errs:#?}");

    let budgets = concat!(
        "  b:\n",
        "    budgets:\n",
        "      - {period: week, usd: 1}\n",
        "      - {period: day, usd: 0}\n",
        "      - {period: day, usd: 1, kind: maybe}\n",
        "      - {period: day, usd: 1}\n",
        "      - {period: day, usd: 2}\n",
    );
    let errs = errors_of(load_priced(budgets, "version: 1\n"));
    let lines: Vec<Option<u64>> = errs.iter().map(|e| e.1).collect();
    assert_eq!(lines, [Some(6), Some(7), Some(8), Some(10)], "{errs:#?}");
    assert!(errs[0].2.contains("period `week`: use `day` or `month`"));
    assert!(errs[1].2.contains("usd must be above 0"));
    assert!(errs[2].2.contains("kind `maybe`"));
    assert!(errs[3].2.contains("two hard budgets per day"));
}

#[test]
fn a_budget_for_an_undeclared_tenant_is_a_typo() {
    let extra = format!(
        "tenants:\n  - {{name: acme, tier: free, keys: [\"{}\"]}}\n",
        format_hash(&hash_key("k"))
    );
    let tiers = format!(
        "{TIERS}budgets:\n  acme: [{{period: day, usd: 1}}]\n  acne: [{{period: day, usd: 1}}]\n"
    );
    let errs = tenant_errors(&extra, Some(&tiers));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!((errs[0].0.as_str(), errs[0].1), ("tenants.yaml", Some(7)));
    assert!(
        errs[0]
            .2
            .contains("tenant `acne` is not one of the config's tenants")
    );
}
