use super::*;
use infergate_engine::flight::{BatchStats, FlightRecord, PathSteps};

fn line() -> TraceLine {
    TraceLine {
        request_id: "r1".into(),
        start_ms: 1_700_000_000_000,
        tenant: "acme".into(),
        endpoint: "/v1/chat/completions",
        model: "llama-3-8b".into(),
        served_model: "llama-3-8b-v2".into(),
        max_tokens: Some(64),
        version: "v2".into(),
        pool: "gpu".into(),
        class: Some("long-prompt".into()),
        worker: "http://10.0.0.7:8001".into(),
        status: 200,
        stream: true,
        queue_ms: Some(3),
        ttft_ms: Some(12.5),
        total_ms: 40.0,
        prompt_tokens: Some(21),
        completion_tokens: Some(8),
        flight_status: "ok",
        flight: Some(FlightRecord {
            v: 1,
            engine: "0.1.0".into(),
            backend: "sim".into(),
            capture: vec![1, 2, 4],
            steps: PathSteps { graph: 7, eager: 1 },
            batch: BatchStats {
                min: 1,
                max: 3,
                mean: 1.5,
            },
            preemptions: 2,
            decode_ms: 20.0,
            ..FlightRecord::default()
        }),
        attempts: vec![
            AttemptLine {
                worker: "http://10.0.0.6:8001".into(),
                start_ms: 3.0,
                ms: 1.5,
                error: Some("connect"),
                retried: true,
                ..AttemptLine::default()
            },
            AttemptLine {
                worker: "http://10.0.0.7:8001".into(),
                start_ms: 4.5,
                ms: 35.5,
                status: Some(200),
                ..AttemptLine::default()
            },
        ],
        ..TraceLine::default()
    }
}

/// The attribute `key` of `span`, as its OTLP value object.
fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["key"] == key)
        .map_or(&Value::Null, |a| &a["value"])
}

fn is_hex(s: &Value, len: usize) -> bool {
    let s = s.as_str().unwrap();
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[test]
fn a_request_is_a_server_span_with_genai_names_and_a_client_span_per_attempt() {
    let spans = spans(&line(), &mut Ids::default());
    assert_eq!(spans.len(), 3);
    let server = &spans[0];
    assert_eq!(server["name"], "chat llama-3-8b");
    assert_eq!(server["kind"], 2);
    assert!(is_hex(&server["traceId"], 32) && is_hex(&server["spanId"], 16));
    assert_eq!(server["parentSpanId"], "", "no traceparent: a root span");
    assert_eq!(server["startTimeUnixNano"], "1700000000000000000");
    assert_eq!(server["endTimeUnixNano"], "1700000000040000000");
    assert!(
        server.get("status").is_none(),
        "a 200 leaves the status unset"
    );
    assert_eq!(attr(server, "gen_ai.operation.name")["stringValue"], "chat");
    assert_eq!(
        attr(server, "gen_ai.request.model")["stringValue"],
        "llama-3-8b"
    );
    assert_eq!(
        attr(server, "gen_ai.response.model")["stringValue"],
        "llama-3-8b-v2"
    );
    assert_eq!(attr(server, "gen_ai.request.max_tokens")["intValue"], "64");
    assert_eq!(attr(server, "gen_ai.usage.input_tokens")["intValue"], "21");
    assert_eq!(attr(server, "gen_ai.usage.output_tokens")["intValue"], "8");
    assert_eq!(attr(server, "http.response.status_code")["intValue"], "200");
    assert_eq!(attr(server, "infergate.tenant")["stringValue"], "acme");
    assert_eq!(attr(server, "infergate.pool")["stringValue"], "gpu");
    assert_eq!(
        attr(server, "infergate.class")["stringValue"],
        "long-prompt"
    );
    assert_eq!(attr(server, "infergate.version")["stringValue"], "v2");
    // A format-1 record does not count off-path steps: one eager step (the prefill) is allowed.
    assert_eq!(attr(server, "infergate.exec.path")["stringValue"], "graph");
    assert_eq!(attr(server, "infergate.exec.graph_steps")["intValue"], "7");
    assert_eq!(attr(server, "infergate.batch.mean")["doubleValue"], 1.5);
    assert_eq!(attr(server, "infergate.preemptions")["intValue"], "2");
    assert_eq!(
        attr(server, "infergate.engine.decode_ms")["doubleValue"],
        20.0
    );
    assert_eq!(
        attr(server, "infergate.engine.capture_sizes")["arrayValue"]["values"][2]["intValue"],
        "4"
    );
    assert!(attr(server, "error.type").is_null());

    let (failed, answered) = (&spans[1], &spans[2]);
    for c in [failed, answered] {
        assert_eq!(c["kind"], 3);
        assert_eq!(c["traceId"], server["traceId"]);
        assert_eq!(c["parentSpanId"], server["spanId"]);
        assert_ne!(c["spanId"], server["spanId"]);
        assert_eq!(c["name"], "chat llama-3-8b");
    }
    assert_ne!(failed["spanId"], answered["spanId"]);
    assert_eq!(failed["startTimeUnixNano"], "1700000000003000000");
    assert_eq!(failed["endTimeUnixNano"], "1700000000004500000");
    assert_eq!(failed["status"]["code"], 2);
    assert_eq!(attr(failed, "error.type")["stringValue"], "connect");
    assert_eq!(attr(failed, "infergate.retried")["boolValue"], true);
    assert_eq!(attr(failed, "server.address")["stringValue"], "10.0.0.6");
    assert!(attr(failed, "http.response.status_code").is_null());
    assert_eq!(attr(answered, "server.port")["intValue"], "8001");
    assert_eq!(
        attr(answered, "http.response.status_code")["intValue"],
        "200"
    );
    assert_eq!(attr(answered, "infergate.retried")["boolValue"], false);
    assert_eq!(attr(answered, "infergate.attempt")["intValue"], "1");
    assert_eq!(
        attr(answered, "gen_ai.request.model")["stringValue"],
        "llama-3-8b-v2",
        "the model sent upstream"
    );
    assert!(answered.get("status").is_none());
}

#[test]
fn a_client_traceparent_is_joined_and_a_bad_one_ignored() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let with = |tp: &str| {
        let l = TraceLine {
            traceparent: Some(tp.into()),
            ..line()
        };
        spans(&l, &mut Ids::default())
    };
    let s = with(tp);
    assert_eq!(s[0]["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(s[0]["parentSpanId"], "00f067aa0ba902b7");
    assert_eq!(s[1]["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    let bad = with("00-00000000000000000000000000000000-00f067aa0ba902b7-01");
    assert_ne!(bad[0]["traceId"], "00000000000000000000000000000000");
    assert_eq!(bad[0]["parentSpanId"], "");
}

#[test]
fn failures_set_error_status_and_type() {
    let l = TraceLine {
        status: 502,
        attempts: vec![AttemptLine {
            worker: "http://[::1]:9".into(),
            status: Some(500),
            ..AttemptLine::default()
        }],
        flight: None,
        prompt_tokens: None,
        completion_tokens: None,
        ..line()
    };
    let s = spans(&l, &mut Ids::default());
    assert_eq!(s[0]["status"]["code"], 2);
    assert_eq!(attr(&s[0], "error.type")["stringValue"], "502");
    assert!(
        attr(&s[0], "gen_ai.usage.input_tokens").is_null(),
        "unknown"
    );
    assert!(attr(&s[0], "infergate.exec.path").is_null(), "no record");
    assert_eq!(attr(&s[1], "error.type")["stringValue"], "500");
    assert_eq!(attr(&s[1], "server.address")["stringValue"], "::1");
    assert_eq!(s[1]["status"]["code"], 2);
}

#[test]
fn operations_follow_the_endpoint_and_ids_are_fresh() {
    assert_eq!(operation("/v1/completions"), "text_completion");
    assert_eq!(operation("/v1/embeddings"), "embeddings");
    assert_eq!(operation("/v1/responses"), "chat");
    let mut ids = Ids::default();
    let a: std::collections::HashSet<String> = (0..1000).map(|_| ids.span_id()).collect();
    assert_eq!(a.len(), 1000);
    assert_ne!(ids.trace_id(), ids.trace_id());
}

#[test]
fn an_export_holds_every_lines_spans_under_one_resource() {
    let body = export_request(&[line(), line()], &mut Ids::default());
    let rs = &body["resourceSpans"][0];
    assert_eq!(
        rs["resource"]["attributes"][0],
        json!({"key": "service.name", "value": {"stringValue": "infergate"}})
    );
    let spans = rs["scopeSpans"][0]["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 6);
    assert_eq!(span_count(&line()), 3);
    assert_ne!(
        spans[0]["traceId"], spans[3]["traceId"],
        "a trace per request"
    );
}
