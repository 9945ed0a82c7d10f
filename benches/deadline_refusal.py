#!/usr/bin/env python3
"""How fast a deadline the queue cannot meet is refused (issue 45): against a running gateway
whose pool has one slot (`max_in_flight_per_worker: 1`, one slow engine) and a tier with
`min_deadline`, one request of tenant A holds the slot, then N requests of tenant B with
`x-infergate-deadline-ms: 50` are timed client-side on one keep-alive connection, from send to
the whole 429 read. Prints the statuses, the Retry-After values and the latency percentiles.

Usage: GATEWAY=127.0.0.1:18180 ADMIN=127.0.0.1:18181 KEY_A=... KEY_B=... \
    python3 benches/deadline_refusal.py [N]
"""
import http.client
import json
import os
import sys
import threading
import time

HOST, PORT = os.environ.get("GATEWAY", "127.0.0.1:18180").rsplit(":", 1)
ADMIN_HOST, ADMIN_PORT = os.environ.get("ADMIN", "127.0.0.1:18181").rsplit(":", 1)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 300


def post(key, body, headers=None):
    conn = http.client.HTTPConnection(HOST, int(PORT), timeout=120)
    h = {"authorization": "Bearer " + key, "content-type": "application/json"}
    h.update(headers or {})
    conn.request("POST", "/v1/completions", json.dumps(body), h)
    res = conn.getresponse()
    res.read()
    conn.close()
    return res.status


def wait_slot_held(within=10.0):
    """Polls `/admin/status` until a pool's admission slot is held (the holder runs)."""
    deadline = time.monotonic() + within
    while True:
        conn = http.client.HTTPConnection(ADMIN_HOST, int(ADMIN_PORT), timeout=5)
        conn.request("GET", "/admin/status")
        status = json.loads(conn.getresponse().read())
        conn.close()
        if any((p.get("admission") or {}).get("in_flight", 0) >= 1 for p in status["pools"]):
            return
        if time.monotonic() > deadline:
            sys.exit(f"the holder never took the slot within {within} s")
        time.sleep(0.01)


def main():
    hold = {"model": "llama-3-8b", "prompt": "hold the slot", "max_tokens": 300}
    holder = threading.Thread(target=post, args=(os.environ["KEY_A"], hold), daemon=True)
    holder.start()
    wait_slot_held()
    conn = http.client.HTTPConnection(HOST, int(PORT), timeout=60)
    body = json.dumps({"model": "llama-3-8b", "prompt": "a short question", "max_tokens": 2})
    headers = {
        "authorization": "Bearer " + os.environ["KEY_B"],
        "content-type": "application/json",
        "x-infergate-deadline-ms": "50",
    }
    times, statuses, retry = [], {}, set()
    for _ in range(N):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, headers)
        res = conn.getresponse()
        res.read()
        times.append((time.perf_counter() - t0) * 1000)
        statuses[res.status] = statuses.get(res.status, 0) + 1
        retry.add(res.getheader("retry-after"))
    times.sort()

    def q(p):
        return times[min(len(times) - 1, int(p * len(times)))]

    print(f"n={len(times)} statuses={statuses} retry-after={sorted(r or '-' for r in retry)} "
          f"p50={q(0.5):.2f} ms p99={q(0.99):.2f} ms max={times[-1]:.2f} ms")


if __name__ == "__main__":
    main()
