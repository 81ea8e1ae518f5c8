#!/usr/bin/env python3
"""Multi-turn chat TTFT against `nf4flash serve` (standard library only).

One conversation of --turns turns: a system message, then per turn a user message of about
--user-words words and the assistant's reply (--max-tokens tokens, greedy) appended to the history,
so the last turn's prompt holds the whole history (about 1,000 tokens with the defaults). TTFT of each
turn is the time to the first streamed content chunk. Then the TTFT of fresh conversations whose one
user message is about as long as one turn (~100 tokens), the yardstick: with the prefix cache a new
turn costs about what its new tokens cost, not what the history costs. Prints each turn's TTFT,
prompt and cached tokens, and the ratio of the last turn's TTFT to the short prompt's (median of 5).

  scripts/serve_turns.py --url http://127.0.0.1:8080 [--turns 10] [--json out.json]
"""
import argparse
import http.client
import json
import random
import statistics
import time
import urllib.parse

WORDS = ("time people year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact water room mother area money story month lot right study "
         "book job word business issue side kind head house service friend father power hour game line end member").split()


def chat(host, port, key, messages, max_tokens):
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    c = http.client.HTTPConnection(host, port, timeout=300)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text, usage, buf = None, "", {}, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or event[6:] == b"[DONE]":
                continue
            j = json.loads(event[6:])
            if j.get("usage"):
                usage = j["usage"]
            for ch in j.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text += piece
    if ttft is None:
        ttft = time.perf_counter() - t0
    return ttft, text, usage


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--user-words", type=int, default=80)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80
    rng = random.Random(7)
    history = [{"role": "system", "content": "You are a helpful assistant. " + words(rng, 20)}]
    turns = []
    for t in range(a.turns):
        history.append({"role": "user", "content": words(rng, a.user_words)})
        ttft, text, usage = chat(host, port, a.api_key, history, a.max_tokens)
        history.append({"role": "assistant", "content": text})
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        turns.append({"turn": t + 1, "ttft_ms": 1e3 * ttft, "prompt_tokens": usage.get("prompt_tokens", 0),
                      "cached_tokens": cached})
        print(f"turn {t + 1:2d}: TTFT {1e3 * ttft:7.1f} ms, prompt {usage.get('prompt_tokens', 0)} tokens, "
              f"{cached} from the prefix cache")
    short = []
    for i in range(5):
        msgs = [{"role": "system", "content": "You are a helpful assistant. " + words(rng, 20)},
                {"role": "user", "content": words(rng, a.user_words)}]
        ttft, _, usage = chat(host, port, a.api_key, msgs, a.max_tokens)
        short.append(1e3 * ttft)
    short_ms = statistics.median(short)
    last = turns[-1]
    ratio = last["ttft_ms"] / short_ms if short_ms > 0 else 0
    print(f"fresh ~{turns[0]['prompt_tokens']}-token prompt: TTFT {short_ms:.1f} ms (median of 5); last turn "
          f"({last['prompt_tokens']} tokens, {last['cached_tokens']} cached): {last['ttft_ms']:.1f} ms = {ratio:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"turns": turns, "short_prompt_ttft_ms": short, "short_median_ms": short_ms,
                       "last_turn_ratio": ratio}, f, indent=2)


if __name__ == "__main__":
    main()
