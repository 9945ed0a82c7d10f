//! Property tests of the validate phase: any body is either accepted or refused with a 4xx, and
//! an accepted request names a routable model, stays within its tier's ceiling and carries a
//! well-formed body upstream.

use std::cell::Cell;
use std::path::Path;

use hyper::HeaderMap;
use hyper::body::Bytes;
use hyper::header::HeaderValue;
use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestRunner};
use serde_json::{Map, Value};

use super::*;
use crate::config::{Snapshot, TierSpec, load_str_with};

/// Models: `m` and `b` (plain), `alias` (renamed upstream), `m-canary` (the canary arm of `m`,
/// so version-only), `m-direct` (the canary arm of `b` that clients may name), `forbidden`
/// (outside the tier).
const CONFIG: &str = "\
models:
  - {name: m, pool: p}
  - {name: b, pool: q}
  - {name: alias, pool: p, upstream_model: real-model}
  - {name: m-canary, pool: q}
  - {name: m-direct, pool: q, direct: true}
  - {name: forbidden, pool: p}
pools:
  - name: p
    workers: [{url: \"http://127.0.0.1:9\"}]
  - name: q
    workers: [{url: \"http://127.0.0.1:10\"}]
";

const ROUTING: &str = "\
models:
  m:
    versions:
      - {name: stable, model: m, weight: 90}
      - {name: canary, model: m-canary, weight: 10}
  b:
    versions:
      - {name: stable, model: b, weight: 90}
      - {name: canary, model: m-direct, weight: 10}
";

const TIERS: &str = "tiers:\n  t: {max_tokens: 1000, default_max_tokens: 100, models: [m, b, alias, m-canary, m-direct]}\n";

/// Every model name the generators pick from: the configured ones plus near misses.
const MODEL_NAMES: &[&str] = &[
    "m",
    "b",
    "alias",
    "m-canary",
    "m-direct",
    "forbidden",
    "real-model",
    "unknown",
    "",
    " m",
    "M",
];

/// The model names the tier may call by name.
const ROUTABLE: &[&str] = &["m", "b", "alias", "m-direct"];

/// Field names the validator (or the engines behind it) know, used as object keys.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "include_usage",
    "stop",
    "user",
    "role",
    "content",
    "text",
];

fn snapshot() -> (Snapshot, TierSpec) {
    let snap = load_str_with(
        CONFIG,
        Path::new("/etc/infergate/infergate.yaml"),
        Some((ROUTING, Path::new("/etc/infergate/routing.yaml"))),
        Some((TIERS, Path::new("/etc/infergate/tenants.yaml"))),
    )
    .unwrap_or_else(|e| panic!("test config: {e}"));
    assert!(snap.is_version_only("m-canary") && snap.is_version_only("m-direct"));
    let tier = snap.tier("t").cloned().expect("tier t");
    (snap, tier)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x7a11_da7e),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,8}",
        "[ -~]{0,12}",
        "\\PC{0,12}",
        prop::sample::select(MODEL_NAMES).prop_map(str::to_owned),
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..1100).prop_map(Value::from),
        // NaN and the infinities become `null`.
        any::<f64>().prop_map(Value::from),
        (-0.5f64..2.5).prop_map(Value::from),
        prop::sample::select(vec![
            0.0,
            -0.0,
            0.5,
            1.0,
            1.5,
            2.0,
            2.000_000_1,
            -1.0,
            1e300,
            -1e300,
            999.0,
            1000.0,
            1000.5,
            1001.0,
            4.9e-324,
            1.8446744073709552e19,
        ])
        .prop_map(Value::from),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        number(),
        text().prop_map(Value::from),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(FIELDS).prop_map(str::to_owned),
        "[a-z_]{1,8}",
    ]
}

/// Any JSON value: leaves, arrays and objects (keys mostly known field names), a few levels deep.
fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A chat message: well-formed most of the time, anything otherwise.
fn message() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        prop::sample::select(vec!["system", "user", "assistant", "tool"]).prop_map(Value::from),
        json(),
    ];
    let part = prop_oneof![
        text().prop_map(|t| serde_json::json!({"type": "text", "text": t})),
        json(),
    ];
    let content = prop_oneof![
        text().prop_map(Value::from),
        prop::collection::vec(part, 0..4).prop_map(Value::Array),
        json(),
    ];
    prop_oneof![
        4 => (role, content).prop_map(|(r, c)| serde_json::json!({"role": r, "content": c})),
        1 => json(),
    ]
}

/// `plausible` picks the value from `good` that often against one `wild` random value.
fn field(
    plausible: u32,
    good: impl Strategy<Value = Value> + 'static,
) -> impl Strategy<Value = Option<Value>> {
    prop::option::of(prop_oneof![plausible => good.boxed(), 1 => json().boxed()])
}

/// Like [`field`], but present with probability `presence`.
fn present(
    presence: f64,
    plausible: u32,
    good: impl Strategy<Value = Value> + 'static,
) -> impl Strategy<Value = Option<Value>> {
    prop::option::weighted(
        presence,
        prop_oneof![plausible => good.boxed(), 1 => json().boxed()],
    )
}

/// Request bodies: an object with the known fields (each absent, plausible or random-typed),
/// plus a few random keys. `plausible` weighs realistic values against random ones.
fn request(plausible: u32) -> impl Strategy<Value = Value> {
    let p = plausible;
    // The fields a request needs are there more often when realistic requests are wanted.
    let need = if p > 1 { 0.9 } else { 0.5 };
    let model = prop_oneof![
        p => prop::sample::select(ROUTABLE),
        1 => prop::sample::select(MODEL_NAMES),
    ];
    let core = (
        present(need, p, model.prop_map(Value::from)),
        present(
            need,
            p,
            prop::collection::vec(message(), 1..4).prop_map(Value::Array),
        ),
        present(
            need,
            p,
            prop_oneof![
                text().prop_map(Value::from),
                prop::collection::vec(any::<u32>().prop_map(Value::from), 0..6)
                    .prop_map(Value::Array),
                prop::collection::vec(text().prop_map(Value::from), 0..3).prop_map(Value::Array),
            ],
        ),
        field(p, (1u64..1100).prop_map(Value::from)),
        prop::option::weighted(0.2, field(p, (1u64..1100).prop_map(Value::from))),
    );
    let sampling = (
        field(p, (0.0f64..2.0).prop_map(Value::from)),
        field(p, (0.01f64..1.0).prop_map(Value::from)),
        field(p, (1u64..3).prop_map(Value::from)),
        field(p, any::<bool>().prop_map(Value::from)),
        field(
            p,
            any::<bool>().prop_map(|b| serde_json::json!({"include_usage": b})),
        ),
        field(
            p,
            prop::collection::vec(text().prop_map(Value::from), 0..3).prop_map(Value::Array),
        ),
        field(p, text().prop_map(Value::from)),
    );
    let extra = prop::collection::vec((key(), json()), 0..3);
    (core, sampling, extra).prop_map(
        |((model, messages, prompt, max, max_completion), sampling, extra)| {
            let (temperature, top_p, n, stream, stream_options, stop, user) = sampling;
            let mut obj = Map::new();
            // Random keys first, so the known fields (set below) win over a clash.
            obj.extend(extra);
            let fields = [
                ("model", model),
                ("messages", messages),
                ("prompt", prompt),
                ("max_tokens", max),
                ("max_completion_tokens", max_completion.flatten()),
                ("temperature", temperature),
                ("top_p", top_p),
                ("n", n),
                ("stream", stream),
                ("stream_options", stream_options),
                ("stop", stop),
                ("user", user),
            ];
            for (k, v) in fields {
                if let Some(v) = v {
                    obj.insert(k.to_owned(), v);
                }
            }
            Value::Object(obj)
        },
    )
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    prop_oneof![Just(Endpoint::ChatCompletions), Just(Endpoint::Completions)]
}

/// Headers: none, or an `x-session-id` (possibly not UTF-8).
fn headers() -> impl Strategy<Value = HeaderMap> {
    prop_oneof![
        Just(Vec::new()),
        "[ -~]{0,16}".prop_map(String::into_bytes),
        prop::collection::vec(0x20u8..=0xff, 0..16),
    ]
    .prop_map(|bytes| {
        let mut h = HeaderMap::new();
        if !bytes.is_empty()
            && let Ok(v) = HeaderValue::from_bytes(&bytes)
        {
            h.insert("x-session-id", v);
        }
        h
    })
}

/// Validates and checks the outcome: a refusal is a 4xx; an acceptance keeps the invariants.
/// Returns whether the request was accepted.
fn check(
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Bytes,
    snap: &Snapshot,
    tier: &TierSpec,
) -> Result<bool, TestCaseError> {
    let sent: Option<Value> = serde_json::from_slice(&body).ok();
    match validate(endpoint, headers, body, snap, tier) {
        Err(e) => {
            let status = e.status();
            prop_assert!(status.is_client_error(), "refused with {status}: {e:?}");
            Ok(false)
        }
        Ok(v) => {
            let sent = sent.and_then(|s| s.as_object().cloned());
            prop_assert!(sent.is_some(), "accepted a body that is not a JSON object");
            let sent = sent.unwrap_or_default();
            invariants(endpoint, headers, &sent, &v, snap, tier)?;
            Ok(true)
        }
    }
}

/// The number the engine behind the gateway reads as the completion limit (see
/// `infergate_engine::openai::parse`): chat prefers a non-null `max_completion_tokens`,
/// completions only know `max_tokens`.
fn upstream_limit(endpoint: Endpoint, body: &Map<String, Value>) -> Option<&Value> {
    let non_null = |k: &str| body.get(k).filter(|v| !v.is_null());
    match endpoint {
        Endpoint::ChatCompletions => {
            non_null("max_completion_tokens").or_else(|| non_null("max_tokens"))
        }
        Endpoint::Completions => non_null("max_tokens"),
        Endpoint::Responses => non_null("max_output_tokens"),
        Endpoint::Embeddings => None,
    }
}

fn invariants(
    endpoint: Endpoint,
    headers: &HeaderMap,
    sent: &Map<String, Value>,
    v: &ValidRequest,
    snap: &Snapshot,
    tier: &TierSpec,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(v.endpoint, endpoint);
    prop_assert_eq!(sent.get("model"), Some(&Value::from(v.model.as_str())));
    let route = snap.model(&v.model);
    prop_assert!(route.is_some(), "accepted unknown model {:?}", v.model);
    let route = route.expect("checked");
    prop_assert!(tier.allows_model(&v.model), "tier forbids {:?}", v.model);
    prop_assert!(
        route.direct || !snap.is_version_only(&v.model),
        "accepted version-only model {:?}",
        v.model
    );
    prop_assert_eq!(v.pool, route.pool);
    prop_assert_eq!(v.max_context, route.max_context);
    prop_assert!(
        (1..=u64::from(tier.max_tokens)).contains(&v.max_tokens),
        "max_tokens {} outside 1..={}",
        v.max_tokens,
        tier.max_tokens
    );
    prop_assert_eq!(
        u64::from(v.features.max_output_tokens),
        v.max_tokens,
        "routing sees another max_tokens"
    );
    prop_assert_eq!(v.stream, sent.get("stream") == Some(&Value::Bool(true)));
    let session = headers.get("x-session-id").and_then(|h| h.to_str().ok());
    prop_assert_eq!(v.session_id.as_deref(), session);
    prop_assert_eq!(v.user.as_deref(), sent.get("user").and_then(Value::as_str));

    let body: Result<Value, _> = serde_json::from_slice(&v.body.bytes());
    prop_assert!(body.is_ok(), "upstream body is not JSON: {:?}", v.body);
    let body = body.expect("checked");
    let body = body.as_object();
    prop_assert!(body.is_some(), "upstream body is not an object");
    let body = body.expect("checked");
    prop_assert_eq!(
        body.get("model").and_then(Value::as_str),
        Some(route.upstream_name()),
        "upstream model"
    );
    // The reservation covers every limit field sent upstream (engines differ in which one they
    // read), and the largest one is exactly what was reserved.
    let limits: Vec<f64> = ["max_completion_tokens", "max_tokens"]
        .iter()
        .filter_map(|k| body.get(*k).and_then(Value::as_f64))
        .collect();
    prop_assert!(!limits.is_empty(), "no limit field upstream");
    prop_assert!(
        limits.iter().all(|&l| l <= v.max_tokens as f64),
        "a limit upstream {:?} above the reservation {}",
        limits,
        v.max_tokens
    );
    prop_assert_eq!(
        limits.iter().copied().fold(0.0, f64::max),
        v.max_tokens as f64,
        "reserved vs the largest limit upstream"
    );
    // The limit the engine applies is within the reservation.
    prop_assert!(
        upstream_limit(endpoint, body)
            .and_then(Value::as_f64)
            .is_some_and(|l| l <= v.max_tokens as f64),
        "limit the engine applies"
    );
    if v.stream && !v.client_wants_usage {
        prop_assert_eq!(
            body.get("stream_options")
                .and_then(|o| o.get("include_usage")),
            Some(&Value::Bool(true)),
            "usage chunk not asked for upstream"
        );
    }
    // Apart from the fields the gateway rewrites, the body goes upstream as the client sent it
    // (up to an ulp on long floats: serde_json without `float_roundtrip` does not parse every
    // float it prints back to the same value, and a rewritten body is printed once more).
    for (k, x) in sent {
        if !matches!(k.as_str(), "model" | "max_tokens" | "stream_options") {
            let reprinted: Value =
                serde_json::from_slice(&serde_json::to_vec(x).expect("serializes")).expect("JSON");
            let got = body.get(k);
            prop_assert!(
                got == Some(x) || got == Some(&reprinted),
                "field `{}` changed: sent {:?}, upstream {:?}",
                k,
                x,
                got
            );
        }
    }
    Ok(())
}

/// Runs `cases` random requests through `check`; returns how many were accepted.
fn run_requests(cases: u32, body: impl Strategy<Value = Bytes>) -> u32 {
    let (snap, tier) = snapshot();
    let accepted = Cell::new(0u32);
    let mut runner = TestRunner::new(config(cases));
    let result = runner.run(&(endpoint(), headers(), body), |(ep, h, body)| {
        if check(ep, &h, body, &snap, &tier)? {
            accepted.set(accepted.get() + 1);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    accepted.get()
}

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("a Value serializes"))
}

/// Arbitrary bytes (and valid bodies cut short or with a byte changed) never panic and are
/// refused only with a 4xx.
#[test]
fn arbitrary_bodies_never_panic_and_are_refused_with_4xx() {
    let mangled = (
        request(8),
        any::<prop::sample::Index>(),
        any::<u8>(),
        0..3u8,
    )
        .prop_map(|(v, at, byte, how)| {
            let mut b = serde_json::to_vec(&v).expect("a Value serializes");
            let i = at.index(b.len());
            match how {
                0 => b.truncate(i),
                1 => b[i] = byte,
                _ => b.insert(i, byte),
            }
            Bytes::from(b)
        });
    let bodies = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256).prop_map(Bytes::from),
        "\\PC{0,64}".prop_map(Bytes::from),
        mangled,
    ];
    run_requests(256, bodies);
}

/// Structurally random JSON (known fields with random-typed values, random nesting) never
/// panics and is either accepted with the invariants holding or refused with a 4xx.
#[test]
fn random_json_requests_are_accepted_or_refused_with_4xx() {
    let bodies = prop_oneof![
        4 => request(1).prop_map(|v| to_bytes(&v)),
        1 => json().prop_map(|v| to_bytes(&v)),
    ];
    run_requests(256, bodies);
}

/// Mostly realistic requests: many are accepted, and every accepted one names a routable model
/// the tier allows, reserves `max_tokens` within the tier's ceiling and sends a JSON object
/// upstream whose `model` is the upstream name and whose limit field is the reserved count.
#[test]
fn accepted_requests_keep_the_invariants() {
    let accepted = run_requests(256, request(12).prop_map(|v| to_bytes(&v)));
    assert!(
        accepted >= 40,
        "only {accepted} of 256 accepted: the generator no longer reaches the invariants"
    );
}

/// On `/v1/completions` the engine reads only `max_tokens`, so a request the gateway accepts
/// must not send a `max_tokens` above the tier's ceiling (nor other than what was reserved).
#[test]
fn completions_upstream_max_tokens_is_within_the_ceiling() {
    let (snap, tier) = snapshot();
    let mut runner = TestRunner::new(config(64));
    // `max_completion_tokens` within the ceiling, `max_tokens` above it.
    let strategy = (1u64..=1000, 1001u64..2_000_000);
    let result = runner.run(&strategy, |(completion, max)| {
        let body = serde_json::json!({
            "model": "m",
            "prompt": "hello",
            "max_completion_tokens": completion,
            "max_tokens": max,
        });
        let h = HeaderMap::new();
        if let Ok(v) = validate(Endpoint::Completions, &h, to_bytes(&body), &snap, &tier) {
            let sent: Value = serde_json::from_slice(&v.body.bytes()).expect("JSON");
            let limit = sent
                .as_object()
                .and_then(|b| upstream_limit(Endpoint::Completions, b))
                .and_then(Value::as_u64);
            prop_assert!(
                limit.is_some_and(|l| l <= u64::from(tier.max_tokens) && l == v.max_tokens),
                "accepted: reserved {} but the engine may generate {:?} (ceiling {})",
                v.max_tokens,
                limit,
                tier.max_tokens
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn embeddings_meter_input_only_and_never_stream() {
    let (snap, tier) = snapshot();
    let h = HeaderMap::new();
    let ok = |body: Value| validate(Endpoint::Embeddings, &h, to_bytes(&body), &snap, &tier);
    let v = ok(serde_json::json!({"model": "m", "input": "hello world", "stream": true})).unwrap();
    assert_eq!((v.max_tokens, v.stream), (0, false));
    assert_eq!(v.prompt, PromptSize::Text("hello world".into()));
    // The body goes upstream as sent: no max_tokens, no stream_options.
    assert_eq!(
        v.body.bytes(),
        to_bytes(&serde_json::json!({"model": "m", "input": "hello world", "stream": true}))
    );
    let v = ok(serde_json::json!({"model": "m", "input": [1, 2, 3]})).unwrap();
    assert_eq!(v.prompt, PromptSize::Tokens(3));
    let v = ok(serde_json::json!({"model": "m", "input": [[1, 2], [3]]})).unwrap();
    assert_eq!(v.prompt, PromptSize::Tokens(3));
    let v = ok(serde_json::json!({"model": "m", "input": ["a", "b"]})).unwrap();
    assert_eq!(v.prompt, PromptSize::Text("a\nb".into()));
    for bad in [
        serde_json::json!({"model": "m"}),
        serde_json::json!({"model": "m", "input": ""}),
        serde_json::json!({"model": "m", "input": []}),
        serde_json::json!({"model": "m", "input": [1, "a"]}),
        serde_json::json!({"model": "m", "input": {"text": "a"}}),
    ] {
        let e = ok(bad.clone()).unwrap_err();
        assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[test]
fn responses_reserve_max_output_tokens_and_read_instructions_and_items() {
    let (snap, tier) = snapshot();
    let h = HeaderMap::new();
    let ok = |body: Value| validate(Endpoint::Responses, &h, to_bytes(&body), &snap, &tier);
    let v = ok(serde_json::json!({"model": "m", "input": "hi", "instructions": "be brief", "stream": true}))
        .unwrap();
    assert!(v.stream);
    // The tier's default is reserved and sent as `max_output_tokens`; no stream_options (the
    // Responses API reports usage in `response.completed` anyway).
    assert_eq!(v.max_tokens, 100);
    let sent: Value = serde_json::from_slice(&v.body.bytes()).unwrap();
    assert_eq!(sent["max_output_tokens"], 100);
    assert!(sent.get("stream_options").is_none() && sent.get("max_tokens").is_none());
    assert_eq!(
        v.prompt,
        PromptSize::Text("system\nbe brief\nuser\nhi\n".into())
    );
    let items = serde_json::json!({"model": "m", "max_output_tokens": 7, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {"type": "message", "role": "assistant", "content": "b"},
    ]});
    let v = ok(items).unwrap();
    assert_eq!(v.max_tokens, 7);
    assert_eq!(v.prompt, PromptSize::Text("user\na\nassistant\nb\n".into()));
    // The tier's ceiling applies to `max_output_tokens`.
    let e =
        ok(serde_json::json!({"model": "m", "input": "x", "max_output_tokens": 5000})).unwrap_err();
    assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST);
    for bad in [
        serde_json::json!({"model": "m"}),
        serde_json::json!({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}),
        serde_json::json!({"model": "m", "input": "x", "instructions": 3}),
    ] {
        let e = ok(bad.clone()).unwrap_err();
        assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{bad}");
    }
}

/// Validates `raw` as a chat request against the test snapshot and tier.
fn chat(raw: impl Into<Bytes>) -> Result<ValidRequest, GatewayError> {
    let (snap, tier) = snapshot();
    validate(
        Endpoint::ChatCompletions,
        &HeaderMap::new(),
        raw.into(),
        &snap,
        &tier,
    )
}

#[test]
fn a_body_without_edits_goes_upstream_byte_for_byte() {
    // Key order, spacing, escapes and fields the gateway does not know all survive.
    let raw = "{ \"messages\":[{\"role\":\"user\",\"content\":\"say \\\"hi\\\"\\n\"}], \"model\":\"m\",\"max_tokens\":5, \"logit_bias\":{\"50256\":-100}, \"seed\":1e3}";
    let v = chat(raw).unwrap();
    assert_eq!(v.body.bytes(), Bytes::from(raw));
    // The escaped content is read unescaped.
    assert_eq!(v.prompt, PromptSize::Text("user\nsay \"hi\"\n\n".into()));
}

#[test]
fn a_repeated_key_keeps_its_last_value_and_goes_upstream_once() {
    let raw = r#"{"model":"forbidden","model":"m","max_tokens":5,"messages":[{"role":"user","content":"a","content":"b"}]}"#;
    let v = chat(raw).unwrap();
    assert_eq!(v.model, "m");
    assert_eq!(v.prompt, PromptSize::Text("user\nb\n".into()));
    // The worker sees one `model`, the one the gateway checked.
    let sent = v.body.bytes();
    let sent = std::str::from_utf8(&sent).unwrap();
    assert_eq!(sent.matches("\"model\"").count(), 1, "{sent}");
    let sent: Value = serde_json::from_str(sent).unwrap();
    assert_eq!(sent["model"], "m");
}

#[test]
fn field_type_errors_name_the_field() {
    let refuse = |raw: &'static str| chat(raw).unwrap_err().to_string();
    assert!(refuse(r#"[1,2]"#).contains("must be a JSON object"));
    assert!(refuse(r#"{"model":"m","#).contains("invalid JSON body"));
}

#[test]
fn strings_are_read_borrowed_or_unescaped_and_numbers_only_from_numbers() {
    let raw = |s: &'static str| serde_json::from_str::<&RawValue>(s).unwrap();
    assert!(matches!(
        super::text(raw(r#""plain""#)),
        Some(Cow::Borrowed("plain"))
    ));
    assert_eq!(super::text(raw(r#""a\"b""#)).as_deref(), Some("a\"b"));
    assert_eq!(super::text(raw("5")), None);
    assert_eq!(super::number(Some(raw("0.5")), "top_p").unwrap(), Some(0.5));
    assert_eq!(super::number(Some(raw("null")), "top_p").unwrap(), None);
    assert!(super::number(Some(raw(r#""0.5""#)), "top_p").is_err());
}

#[test]
fn a_message_that_is_not_an_object_adds_an_empty_turn() {
    let v = chat(
        r#"{"model":"m","max_tokens":5,"messages":[["user","hi"],{"role":"user","content":"b"}]}"#,
    )
    .unwrap();
    assert_eq!(v.prompt, PromptSize::Text("\n\nuser\nb\n".into()));
}

#[test]
fn string_messages_read_in_one_pass_match_the_general_reading() {
    // Strings (and a null content) take the one-pass reading; parts, a repeated key or a
    // non-string role take the general one. Equal conversations must give equal prompts.
    let fast = chat(
        r#"{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"be \"brief\""},{"role":"user","content":"hi","name":"x"},{"role":"assistant","content":null}]}"#,
    )
    .unwrap();
    let general = chat(
        r#"{"model":"m","max_tokens":5,"messages":[{"role":"system","content":[{"type":"text","text":"be \"brief\""}]},{"role":"user","content":"hi","content":"hi"},{"role":"assistant"}]}"#,
    )
    .unwrap();
    assert_eq!(
        fast.prompt,
        PromptSize::Text("system\nbe \"brief\"\nuser\nhi\nassistant\n\n".into())
    );
    assert_eq!(fast.prompt, general.prompt);
    assert_eq!(fast.features.prefix_hashes, general.features.prefix_hashes);
    // A role that is not a string reads as an empty one either way.
    let odd =
        chat(r#"{"model":"m","max_tokens":5,"messages":[{"role":7,"content":"hi"}]}"#).unwrap();
    assert_eq!(odd.prompt, PromptSize::Text("\nhi\n".into()));
    assert!(chat(r#"{"model":"m","max_tokens":5,"messages":[]}"#).is_err());
}

#[test]
fn a_body_that_is_not_utf8_is_refused_even_in_a_field_the_gateway_skips() {
    let (snap, tier) = snapshot();
    // With max_tokens (nothing to edit) and without (the gateway adds it): both refused.
    for raw in [
        &b"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"x\":\"\x80\"}"[..],
        &b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"x\":\"\xff\"}"[..],
    ] {
        let Err(err) = validate(
            Endpoint::ChatCompletions,
            &HeaderMap::new(),
            Bytes::copy_from_slice(raw),
            &snap,
            &tier,
        ) else {
            panic!("accepted a body that is not UTF-8");
        };
        assert_eq!(err.status(), hyper::StatusCode::BAD_REQUEST);
        assert!(err.to_string().contains("invalid JSON body"), "{err}");
    }
}

#[test]
fn edits_are_spliced_into_the_clients_bytes_once() {
    // No max_tokens: the tier's default is added; the rest keeps its bytes and order.
    let raw = r#"{"z": 1,  "model":"m", "messages":[{"role":"user","content":"a"}]}"#;
    let mut v = chat(raw).unwrap();
    let sent = v.body.bytes();
    let text = std::str::from_utf8(&sent).unwrap();
    assert!(
        text.ends_with(
            r#"{"z": 1,  "model":"m", "messages":[{"role":"user","content":"a"}]}"#
                .trim_start_matches('{')
        ),
        "{text}"
    );
    // A later phase's edit of the same field replaces the first.
    v.body.set("max_tokens", "3".into());
    let sent: Value = serde_json::from_slice(&v.body.bytes()).unwrap();
    assert_eq!(sent["max_tokens"], 3);
    assert_eq!(sent["z"], 1);
    assert_eq!(
        v.body
            .bytes()
            .windows(12)
            .filter(|w| w == b"\"max_tokens\"")
            .count(),
        1
    );
}

#[test]
fn n_bounds_the_completion_and_media_parts_are_counted() {
    let v = chat(r#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#).unwrap();
    assert_eq!((v.n, v.media_parts), (1, 0));
    let v = chat(r#"{"model":"m","n":4,"messages":[{"role":"user","content":"a"}]}"#).unwrap();
    assert_eq!(v.n, 4);
    for bad in [
        r#"{"model":"m","n":0,"messages":[{"role":"user","content":"a"}]}"#,
        r#"{"model":"m","n":129,"messages":[{"role":"user","content":"a"}]}"#,
        r#"{"model":"m","n":1.5,"messages":[{"role":"user","content":"a"}]}"#,
        r#"{"model":"m","n":"2","messages":[{"role":"user","content":"a"}]}"#,
    ] {
        let err = chat(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
        assert_eq!(err.status(), hyper::StatusCode::BAD_REQUEST, "n = {bad}");
    }
    let images = r#"{"model":"m","messages":[
        {"role":"user","content":[{"type":"text","text":"what is this?"},
            {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},
            {"type":"image_url","image_url":{"url":"https://x/y.png"}}]},
        {"role":"assistant","content":"a cat"}]}"#;
    assert_eq!(chat(images).unwrap().media_parts, 2);
}

#[test]
fn content_parts_read_in_one_pass_match_the_general_reading() {
    // The same conversation with parts and an image: read in the first pass, and read the
    // general way (a key given twice in the last message sends the body there).
    let parts = r#"{"role":"user","content":[{"type":"text","text":"what is \"this\"?"},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},
        {"type":"input_text","text":"and this"},{"type":"text","text":null}]}"#;
    let fast = chat(format!(
        r#"{{"model":"m","messages":[{parts},{{"role":"assistant","content":"a cat"}}]}}"#
    ))
    .unwrap();
    let general = chat(format!(
        r#"{{"model":"m","messages":[{parts},{{"role":"assistant","content":"a dog","content":"a cat"}}]}}"#
    ))
    .unwrap();
    assert_eq!(
        fast.prompt,
        PromptSize::Text("user\nwhat is \"this\"?\nand this\nassistant\na cat\n".into())
    );
    assert_eq!(fast.prompt, general.prompt);
    assert_eq!(fast.features.prefix_hashes, general.features.prefix_hashes);
    assert_eq!((fast.media_parts, general.media_parts), (1, 1));
}

#[test]
fn compact_and_pretty_bodies_read_alike_and_control_characters_in_strings_are_refused() {
    let (snap, tier) = snapshot();
    let h = HeaderMap::new();
    let chat = |body: &str| {
        validate(
            Endpoint::ChatCompletions,
            &h,
            Bytes::from(body.to_owned()),
            &snap,
            &tier,
        )
    };
    let want = PromptSize::Text("system\nbe \"brief\"\nuser\nhi é\n".into());
    // Compact (no control byte anywhere: strings read raw) and pretty-printed (line breaks
    // between the fields: strings read with serde's check), escapes and parts alike.
    for body in [
        r#"{"model":"m","messages":[{"role":"system","content":"be \"brief\""},{"role":"user","content":"hi \u00e9"}]}"#,
        "{\n  \"model\": \"m\",\n  \"messages\": [\n    {\"role\": \"system\", \"content\": \"be \\\"brief\\\"\"},\n    {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi é\"}]}\n  ]\n}",
        r#"{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"be \"brief\""}]},{"role":"user","content":"hi é"}]}"#,
    ] {
        assert_eq!(chat(body).expect(body).prompt, want, "{body}");
    }
    // A raw control character inside a string is not JSON, in either kind of body.
    for body in [
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\u{1}b\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\tb\"}]}]}",
        "{\"model\":\"m\",\n\"messages\":[{\"role\":\"user\",\"content\":\"a\u{1f}b\"}]}",
    ] {
        let e = chat(body).expect_err(body);
        assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{body}");
    }
}
