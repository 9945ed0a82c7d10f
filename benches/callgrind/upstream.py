# A keep-alive upstream for benches/callgrind/gateway.sh: the chat answer and vLLM metrics the
# gateway_overhead bench serves, on 127.0.0.1:PORT.
import http.server, sys, socketserver
ANSWER = b'{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}'
METRICS = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="bench"} 0\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="bench"} 0\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="bench"} 0\n'
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, body, ct):
        self.send_response(200); self.send_header("content-type", ct); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        self.reply(METRICS if self.path.startswith("/metrics") else b"{}", "text/plain")
    def do_POST(self):
        n = int(self.headers.get("content-length", 0)); self.rfile.read(n)
        self.reply(ANSWER, "application/json")
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", int(sys.argv[1])), H)
s.serve_forever()
