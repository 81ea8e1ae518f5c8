#!/usr/bin/env python3
"""Bounded load test of `nf4flash serve` over loopback (standard library only).

N clients each send streaming /v1/completions requests back to back (a prompt of --prompt-tokens
random token ids, --max-tokens new tokens, greedy) for --duration seconds, or --requests each.
Printed (and written with --json): requests, failures, p50/p99 TTFT, aggregate tok/s over the run,
and the steady-state decode rate: the tokens all streams received inside the window where every
stream of the first round was past its first token and none had finished, over that window.
Within 2 s after the run /metrics must show no running sequence and no KV block held; any failed
request or held block exits 1.

  scripts/serve_load.py --url http://127.0.0.1:8080 --clients 64 --duration 30
  scripts/serve_load.py --url ... --clients 32 --requests 1 --prompt-tokens 512 --max-tokens 128
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse


def stream_once(host, port, key, prompt, max_tokens, timeout):
    """One streaming completion: (ok, error, t_start, [arrival times of text chunks], completion_tokens)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    t0 = time.perf_counter()
    arrivals, usage = [], None
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("POST", "/v1/completions", body, headers)
        r = c.getresponse()
        if r.status != 200:
            return False, f"HTTP {r.status}: {r.read()[:200]!r}", t0, arrivals, 0
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                data = event[6:]
                if data == b"[DONE]":
                    c.close()
                    return True, "", t0, arrivals, (usage or {}).get("completion_tokens", len(arrivals))
                j = json.loads(data)
                if "error" in j:
                    return False, j["error"].get("message", "error"), t0, arrivals, 0
                if j.get("usage"):
                    usage = j["usage"]
                for ch in j.get("choices", []):
                    if ch.get("text"):
                        arrivals.append(time.perf_counter())
        return False, "stream ended without [DONE]", t0, arrivals, 0
    except Exception as e:  # noqa: BLE001 - any failure of a request is reported as one
        return False, repr(e), t0, arrivals, 0


def percentile(v, q):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--duration", type=float, default=0, help="seconds of load (0: --requests per client)")
    ap.add_argument("--requests", type=int, default=1, help="requests per client when --duration is 0")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn from [3, vocab)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80
    results, lock = [], threading.Lock()
    start = time.perf_counter()
    stop_at = start + a.duration if a.duration > 0 else None

    def client(i):
        rng = random.Random(1000 + i)
        n = 0
        while (stop_at is None and n < a.requests) or (stop_at is not None and time.perf_counter() < stop_at):
            prompt = [rng.randrange(3, a.vocab) for _ in range(a.prompt_tokens)]
            r = stream_once(host, port, a.api_key, prompt, a.max_tokens, a.timeout)
            with lock:
                results.append((i, n) + r)
            n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ok = [r for r in results if r[2]]
    failed = [r for r in results if not r[2]]
    ttft = [r[5][0] - r[4] for r in ok if r[5]]
    tokens = sum(r[6] for r in ok)
    # steady state of the first round: every stream past its first token, none finished
    first = [r for r in ok if r[1] == 0 and len(r[5]) > 1]
    steady = 0.0
    if len(first) == a.clients:
        lo = max(r[5][0] for r in first)
        hi = min(r[5][-1] for r in first)
        if hi > lo:
            n = sum(sum(1 for t in r[5] if lo < t <= hi) for r in first)
            steady = n / (hi - lo)
    def fetch_metrics():
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + a.api_key} if a.api_key else {})
        return conn.getresponse().read().decode()

    def metric(name):
        for line in metrics.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return -1.0

    # The last response's final bytes can reach the client before the scheduler's next step retires its
    # sequence and frees its blocks: poll for up to 2 s for the engine to go idle, then check.
    deadline = time.monotonic() + 2.0
    metrics = fetch_metrics()
    while (metric("nf4flash_sequences_running") != 0 or metric("nf4flash_kv_blocks_used") != 0) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
        metrics = fetch_metrics()

    out = {"clients": a.clients, "requests": len(results), "failed": len(failed), "wall_s": wall,
           "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens, "completion_tokens": tokens,
           "aggregate_tok_s": tokens / wall if wall > 0 else 0, "steady_decode_tok_s": steady,
           "ttft_ms_p50": 1e3 * percentile(ttft, 0.5), "ttft_ms_p99": 1e3 * percentile(ttft, 0.99),
           "running_after": metric("nf4flash_sequences_running"), "kv_blocks_used_after": metric("nf4flash_kv_blocks_used")}
    print(f"serve load: {out['requests']} requests from {a.clients} clients in {wall:.1f} s, {len(failed)} failed | "
          f"TTFT p50 {out['ttft_ms_p50']:.1f} ms p99 {out['ttft_ms_p99']:.1f} ms | aggregate {out['aggregate_tok_s']:.0f} tok/s | "
          f"steady decode {steady:.0f} tok/s | after: {out['running_after']:.0f} running, "
          f"{out['kv_blocks_used_after']:.0f} KV blocks held")
    for r in failed[:5]:
        print(f"  failed (client {r[0]}, request {r[1]}): {r[3]}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    bad = failed or out["running_after"] != 0 or out["kv_blocks_used_after"] != 0 or not results
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
