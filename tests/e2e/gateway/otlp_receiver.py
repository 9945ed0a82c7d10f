#!/usr/bin/env python3
"""A real OTLP/HTTP trace receiver for the end-to-end tests (tests/e2e/gateway/otlp_export.rs).

Usage: otlp_receiver.py OUT MODE

Listens on an ephemeral loopback port and prints `listening PORT` once ready. Each POST to
/v1/traces with `content-type: application/json` is parsed with the official schema from the
`opentelemetry-proto` package (`google.protobuf.json_format.Parse` into
`ExportTraceServiceRequest`, unknown fields rejected) after OTLP/JSON's one deviation from
proto3 JSON is undone (trace and span ids are hex, not base64). What the schema rejects, or ids
of the wrong length, is answered 400. Each accepted span is added to OUT as one JSON line (the
file is replaced whole after each export, so a reader sees whole exports only).

MODE: `ok` answers 200; `busy-once` answers the first POST 429 with `Retry-After: 0` (a line
`{"refused": 429}` in OUT), then 200; `hang` reads each request and never answers.
"""

import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

OUT, MODE = sys.argv[1], sys.argv[2]
LOCK = threading.Lock()
STATE = {"posts": 0}


class Rejected(Exception):
    """A request the real schema (or OTLP's id rules) rejects."""


def hex_to_b64(value, length, what, empty_ok=False):
    """An OTLP/JSON hex id as proto3 JSON's base64, checked to be `length` bytes."""
    if not isinstance(value, str):
        raise Rejected(f"{what} is not a string")
    if value == "" and empty_ok:
        return ""
    try:
        raw = bytes.fromhex(value)
    except ValueError as e:
        raise Rejected(f"{what} {value!r} is not hex: {e}") from e
    if len(raw) != length or raw == bytes(length):
        raise Rejected(f"{what} {value!r} is not {length} non-zero bytes")
    return base64.b64encode(raw).decode()


def ids_to_b64(doc):
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                span["traceId"] = hex_to_b64(span.get("traceId"), 16, "traceId")
                span["spanId"] = hex_to_b64(span.get("spanId"), 8, "spanId")
                if "parentSpanId" in span:
                    span["parentSpanId"] = hex_to_b64(
                        span["parentSpanId"], 8, "parentSpanId", empty_ok=True
                    )


def any_value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def spans_of(req):
    for rs in req.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                if s.end_time_unix_nano < s.start_time_unix_nano:
                    raise Rejected(f"span {s.name!r} ends before it starts")
                yield {
                    "resource": resource,
                    "scope": ss.scope.name,
                    "traceId": s.trace_id.hex(),
                    "spanId": s.span_id.hex(),
                    "parentSpanId": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": s.kind,
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                    "status": {"code": s.status.code, "message": s.status.message},
                    "attributes": attrs(s.attributes),
                }


def write(lines):
    """Adds `lines` to OUT, replacing it whole (a rename), so a reader never sees a part of one
    export's spans."""
    with LOCK:
        STATE.setdefault("text", [])
        STATE["text"].extend(json.dumps(line) + "\n" for line in lines)
        with open(OUT + ".tmp", "w", encoding="utf-8") as f:
            f.write("".join(STATE["text"]))
        os.replace(OUT + ".tmp", OUT)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=b"{}", headers=()):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if MODE == "hang":
            time.sleep(3600)
            return
        if self.path != "/v1/traces":
            return self.answer(404)
        if self.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return self.answer(415)
        with LOCK:
            STATE["posts"] += 1
            first = STATE["posts"] == 1
        if MODE == "busy-once" and first:
            write([{"refused": 429}])
            return self.answer(429, headers=[("retry-after", "0")])
        try:
            doc = json.loads(body)
            ids_to_b64(doc)
            req = ExportTraceServiceRequest()
            json_format.Parse(json.dumps(doc), req)
            spans = list(spans_of(req))
        except (ValueError, Rejected, json_format.ParseError) as e:
            write([{"rejected": str(e)}])
            return self.answer(400, json.dumps({"error": str(e)}).encode())
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-")}
        write([dict(s, post=STATE["posts"], headers=headers) for s in spans])
        return self.answer(200)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
