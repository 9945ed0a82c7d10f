# Closed-loop client for benches/callgrind/gateway.sh: PORT N, N chat requests on 4 keep-alive
# connections; prints the non-200 answers.
# With CALLGRIND_CLIENT_KEY set: the gateway_overhead bench's features-on body (a 6 KB system
# prompt, a question that differs per request) with that key.
import http.client, json, os, sys, threading
port, n, threads = int(sys.argv[1]), int(sys.argv[2]), 4
BODY = b'{"model":"bench","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}'
KEY = os.environ.get("CALLGRIND_CLIENT_KEY")
SYSTEM = ("You are a careful assistant for a company's internal documentation. Answer from the "
          "documents given, cite the section you used, and say when the documents do not cover the "
          "question. Keep answers short and precise. ") * 28
def body(i):
    if not KEY:
        return BODY
    return json.dumps({"model": "bench", "max_tokens": 16, "stream": False, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Question {i}: which section covers travel expenses for trip {i * 7919 % 100003}?"}]}).encode()
HEADERS = {"content-type": "application/json"}
if KEY:
    HEADERS["authorization"] = "Bearer " + KEY
bad = []
def run(k):
    c = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(k):
        c.request("POST", "/v1/chat/completions", body(i), HEADERS)
        r = c.getresponse(); d = r.read()
        if r.status != 200: bad.append((r.status, d[:200]))
ts = [threading.Thread(target=run, args=(n // threads,)) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print("errors", len(bad), bad[:2])
sys.exit(1 if bad else 0)
