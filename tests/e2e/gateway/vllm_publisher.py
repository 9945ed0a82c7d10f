"""A KV-event publisher speaking vLLM's documented wire format, for the gateway's tests.

vLLM (vllm/distributed/kv_events.py, ZmqEventPublisher) binds a ZMQ PUB socket and sends each
KVEventBatch as a multipart message [topic, sequence number (8-byte big-endian), msgpack
payload]. The payload is the batch [ts, events, data_parallel_rank]; events are tagged arrays
["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]
(vLLM up to v0.2x) or, with --map, tagged maps {"type": "BlockStored", ...} (later versions).

Binds tcp://127.0.0.1 on a free port (or on --port N), prints "port N", then reads one JSON command a line on
stdin and prints "sent SEQ" after each:
  {"events": [[tag, field, ...], ...]}   one batch (arrays turned into maps with --map)
  {"raw": "hex"}                         a payload of these bytes (garbage)
  {"oversize": n}                        a payload of n zero bytes
"""

import json
import sys
import time

import msgpack
import zmq

FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def as_map(event):
    tag, values = event[0], event[1:]
    out = {"type": tag}
    out.update(zip(FIELDS[tag], values))
    return out


def main():
    topic = sys.argv[1].encode()
    maps = "--map" in sys.argv
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    if "--port" in sys.argv:
        port = int(sys.argv[sys.argv.index("--port") + 1])
        pub.bind(f"tcp://127.0.0.1:{port}")
    else:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
    print(f"port {port}", flush=True)
    seq = 0
    for line in sys.stdin:
        cmd = json.loads(line)
        if "raw" in cmd:
            payload = bytes.fromhex(cmd["raw"])
        elif "oversize" in cmd:
            payload = bytes(cmd["oversize"])
        else:
            events = [as_map(e) if maps else e for e in cmd["events"]]
            payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        print(f"sent {seq}", flush=True)
        seq += 1


if __name__ == "__main__":
    main()
