"""Captures a real vLLM server's surface into testdata/vllm/real/ (see the README there).

Usage: python scripts/capture_real_vllm.py BASE_URL OUT_DIR MODEL PHASE
  PHASE = main        idle page, page under load, page with waiting requests, page after the load, and the API
                      answers (api.json); for a server started by `scripts/real-vllm.sh start` (max-num-seqs 8)
  PHASE = preemption  a page with preemptions; for a server started with a tiny KV cache
                      (`--num-gpu-blocks-override 8 --max-model-len 768`)

Standard library only, so any python runs it. Prompts are lists of token ids on /v1/completions, so their
lengths are exact whatever the tokenizer.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

BASE, OUT, MODEL, PHASE = sys.argv[1].rstrip("/"), Path(sys.argv[2]), sys.argv[3], sys.argv[4]


def http(method, path, body=None, raw=None, timeout=300):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(BASE + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def metrics():
    return http("GET", "/metrics")[2]


def gauge(page, name):
    for line in page.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def completion(prompt_len, max_tokens, stream=False):
    prompt = [10 + (i * 7) % 400 for i in range(prompt_len)]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": stream, "temperature": 0}
    return http("POST", "/v1/completions", body)


def load(n, prompt_len, max_tokens):
    threads = [threading.Thread(target=completion, args=(prompt_len, max_tokens)) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def wait_page(pred, what, limit=120):
    deadline = time.time() + limit
    while time.time() < deadline:
        page = metrics()
        if pred(page):
            return page
        time.sleep(0.2)
    sys.exit(f"no page with {what} within {limit} s")


def save(name, text):
    (OUT / name).write_text(text)
    print(f"wrote {OUT / name}", file=sys.stderr)


def sse_lines(text):
    return [line for line in text.splitlines() if line]


def main_phase():
    save("metrics-idle.txt", metrics())

    api = {}
    for path in ["/health", "/v1/models", "/version", "/is_sleeping"]:
        status, headers, body = http("GET", path)
        api[path] = {"status": status, "content_type": headers.get("content-type"), "body": body}
    status, headers, body = http("POST", "/sleep?level=1")
    api["POST /sleep?level=1"] = {"status": status, "content_type": headers.get("content-type"), "body": body}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 5,
            "ignore_eos": True, "temperature": 0}
    for name, path, body in [
        ("chat", "/v1/chat/completions", chat),
        ("chat stream", "/v1/chat/completions", {**chat, "stream": True}),
        ("chat stream usage", "/v1/chat/completions",
         {**chat, "stream": True, "stream_options": {"include_usage": True}}),
        ("completion", "/v1/completions",
         {"model": MODEL, "prompt": [11, 12, 13], "max_tokens": 4, "ignore_eos": True, "temperature": 0}),
        ("completion stream usage", "/v1/completions",
         {"model": MODEL, "prompt": [11, 12, 13], "max_tokens": 3, "ignore_eos": True, "stream": True,
          "stream_options": {"include_usage": True}, "temperature": 0}),
        ("error unknown model", "/v1/chat/completions", {**chat, "model": "no-such-model"}),
        ("error too long", "/v1/completions",
         {"model": MODEL, "prompt": [11] * 1100, "max_tokens": 10}),
        ("error missing messages", "/v1/chat/completions", {"model": MODEL}),
        ("error bad max_tokens", "/v1/chat/completions", {**chat, "max_tokens": -1}),
    ]:
        status, headers, text = http("POST", path, body)
        shown = dict(body)
        if isinstance(shown.get("prompt"), list) and len(shown["prompt"]) > 20:
            n = len(shown["prompt"])
            shown["prompt"] = f"[{shown['prompt'][0]}] * {n} (abbreviated here: {n} token ids)"
        entry = {"request": {"path": path, "body": shown}, "status": status,
                 "content_type": headers.get("content-type")}
        if body.get("stream"):
            entry["sse"] = sse_lines(text)
        else:
            entry["body"] = text
        api[name] = entry
    status, headers, text = http("POST", "/v1/chat/completions", raw=b"{not json")
    api["error bad json"] = {"status": status, "content_type": headers.get("content-type"), "body": text}
    (OUT / "api.json").write_text(json.dumps(api, indent=2, sort_keys=True) + "\n")

    # Under load: 8 requests fill the batch (max-num-seqs 8).
    threads = load(8, 200, 200)
    save("metrics-running.txt",
         wait_page(lambda p: gauge(p, "vllm:num_requests_running") >= 8, "8 running requests"))
    for t in threads:
        t.join()
    # Waiting requests: 48 concurrent against a batch of 8.
    threads = load(48, 100, 64)
    save("metrics-waiting.txt",
         wait_page(lambda p: gauge(p, "vllm:num_requests_waiting") >= 20, "20 waiting requests"))
    for t in threads:
        t.join()
    save("metrics-after-load.txt", metrics())


def preemption_phase():
    save("metrics-fresh-small-cache.txt", metrics())
    threads = load(24, 100, 300)
    save("metrics-preemption.txt",
         wait_page(lambda p: any(line.startswith("vllm:num_preemptions_total{")
                                 and float(line.rsplit(" ", 1)[1]) > 0 for line in p.splitlines())
                   and gauge(p, "vllm:num_requests_waiting") > 0, "preemptions and waiting requests", 300))
    for t in threads:
        t.join()


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    {"main": main_phase, "preemption": preemption_phase}[PHASE]()
