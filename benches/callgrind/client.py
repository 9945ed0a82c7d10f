# Closed-loop client for benches/callgrind/gateway.sh: PORT N, N chat requests on 4 keep-alive
# connections; prints the non-200 answers.
import http.client, sys, threading
port, n, threads = int(sys.argv[1]), int(sys.argv[2]), 4
BODY = b'{"model":"bench","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}'
bad = []
def run(k):
    c = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(k):
        c.request("POST", "/v1/chat/completions", BODY, {"content-type": "application/json"})
        r = c.getresponse(); d = r.read()
        if r.status != 200: bad.append((r.status, d[:200]))
ts = [threading.Thread(target=run, args=(n // threads,)) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print("errors", len(bad), bad[:2])
sys.exit(1 if bad else 0)
