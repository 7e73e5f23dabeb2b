#!/usr/bin/env python3
"""kb_nano serve on loopback with the tiny Llama checkpoint (issue 21): the OpenAI endpoints streamed and not, chat,
stop strings, seeded sampling, concurrent requests (nothing lost or mixed up), a client that leaves mid-stream, and
the bad requests a client sends. Standard library only (CI has no pip); curl drives a few requests as users would.

Usage: serve_test.py <kb_nano> <source dir>
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KBN, SRC = sys.argv[1], sys.argv[2]
MODEL = [ "--device", "cpu", "--model", os.path.join(SRC, "tests/fixtures/tiny-llama"),
          "--tokenizer", os.path.join(SRC, "models/tokenizers/tiny-llama.json")]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def start(extra):
    err = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    p = subprocess.Popen([KBN, "serve", *MODEL, "--port", "0", *extra], stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.time() + 120
    while time.time() < deadline:
        text = open(err.name).read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m:
            return p, int(m.group(1)), err.name
        if p.poll() is not None:
            sys.exit(f"serve exited {p.returncode} before listening:\n{text}")
        time.sleep(0.1)
    p.kill()
    sys.exit("serve did not start listening within 120 s")


def request(port, method, path, body=None, raw=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read().decode()
    c.close()
    return r.status, out


def post(port, path, body, timeout=120):
    status, text = request(port, "POST", path, body, timeout=timeout)
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def stream(port, path, body):
    """Events of a streamed request: (list of parsed chunks, saw [DONE])."""
    status, text = request(port, "POST", path, dict(body, stream=True))
    assert status == 200, (status, text)
    chunks, done = [], False
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        if payload == "[DONE]":
            done = True
        else:
            assert not done, "an event after [DONE]"
            chunks.append(json.loads(payload))
    return chunks, done


def streamed_text(chunks, chat):
    key = (lambda c: c["delta"].get("content", "")) if chat else (lambda c: c["text"])
    return "".join(key(c) for ch in chunks for c in ch["choices"])


server, port, log = start(["--max-model-len", "2048", "--max-num-seqs", "8", "--max-body-bytes", "65536"])
try:
    # --- the basics, with curl as a user would type them
    out = subprocess.run(["curl", "-s", "-w", " %{http_code}", f"http://127.0.0.1:{port}/health"], capture_output=True,
                         text=True).stdout
    check(out.endswith(" 200"), f"GET /health answers 200 ({out!r})")
    out = subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/v1/models"], capture_output=True, text=True).stdout
    check(json.loads(out)["data"][0]["max_model_len"] == 2048, "GET /v1/models lists the model and its max_model_len")

    prompts = ["Hello world", "The quick brown fox", "def main():", "Once upon a time"]
    solo = {}
    for pr in prompts:
        s, r = post(port, "/v1/completions", {"prompt": pr, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
        check(s == 200 and r["usage"]["completion_tokens"] == 12 and r["choices"][0]["finish_reason"] == "length",
              f"completion of {pr!r}: 12 tokens, finish_reason length")
        solo[pr] = r["choices"][0]["text"]
    # The same text as kb_nano generate gives for the same prompt (greedy, same checkpoint, same tokenizer).
    g = subprocess.run([KBN, "generate", *MODEL, "--prompt", prompts[0], "--max-new-tokens", "12"],
                       capture_output=True, text=True)
    check(g.returncode == 0 and g.stdout.rstrip("\n") == prompts[0] + solo[prompts[0]],
          f"the server's completion equals kb_nano generate's ({g.stdout!r} vs {prompts[0] + solo[prompts[0]]!r})")

    chunks, done = stream(port, "/v1/completions", {"prompt": prompts[1], "max_tokens": 12, "temperature": 0,
                                                    "ignore_eos": True, "stream_options": {"include_usage": True}})
    check(done and streamed_text(chunks, False) == solo[prompts[1]], "a streamed completion is the same text, then [DONE]")
    check(chunks[-1]["usage"]["completion_tokens"] == 12 and chunks[-2]["choices"][0]["finish_reason"] == "length",
          "the stream ends with the finish reason, then the usage asked for")

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    s, r = post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 10, "temperature": 0, "ignore_eos": True})
    check(s == 200 and r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant",
          "a chat completion answers as the assistant")
    chunks, done = stream(port, "/v1/chat/completions",
                          {"messages": msgs, "max_tokens": 10, "temperature": 0, "ignore_eos": True})
    check(done and chunks[0]["choices"][0]["delta"].get("role") == "assistant" and
          streamed_text(chunks, True) == r["choices"][0]["message"]["content"],
          "a streamed chat opens with the role and gives the same text")

    # --- stop strings: the text ends before the first one, finish_reason stop, streamed or not
    full = solo[prompts[3]]
    stop = full[3:5] if len(full) >= 5 else full[-1:]
    want = full[:full.find(stop)]
    s, r = post(port, "/v1/completions", {"prompt": prompts[3], "max_tokens": 12, "temperature": 0,
                                          "ignore_eos": True, "stop": [stop]})
    check(s == 200 and r["choices"][0]["text"] == want and r["choices"][0]["finish_reason"] == "stop",
          f"stop {stop!r}: text {r['choices'][0]['text']!r}, expected {want!r}")
    chunks, done = stream(port, "/v1/completions", {"prompt": prompts[3], "max_tokens": 12, "temperature": 0,
                                                    "ignore_eos": True, "stop": stop})
    check(streamed_text(chunks, False) == want and chunks[-1]["choices"][0]["finish_reason"] == "stop",
          "the same stop when streamed")

    # --- sampling: one seed, one text; greedy unchanged by a seed
    body = {"prompt": prompts[2], "max_tokens": 16, "temperature": 1.0, "seed": 7, "ignore_eos": True}
    a, b = post(port, "/v1/completions", body)[1], post(port, "/v1/completions", body)[1]
    c = post(port, "/v1/completions", dict(body, seed=8))[1]
    check(a["choices"][0]["text"] == b["choices"][0]["text"], "the same seed samples the same text")
    check(a["choices"][0]["text"] != c["choices"][0]["text"], "another seed samples another text")

    # --- load: 48 requests, 12 at a time, streamed and not; each must be its prompt's solo text
    results, errors = {}, []

    def worker(i):
        pr = prompts[i % 4]
        body = {"prompt": pr, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        try:
            if i % 2:
                ch, dn = stream(port, "/v1/completions", body)
                results[i] = (pr, streamed_text(ch, False) if dn else None)
            else:
                s, r = post(port, "/v1/completions", body)
                results[i] = (pr, r["choices"][0]["text"] if s == 200 else None)
        except Exception as e:  # noqa: BLE001 - any failure is the test's
            errors.append(f"request {i}: {e}")

    t0 = time.time()
    for wave in range(4):
        threads = [threading.Thread(target=worker, args=(wave * 12 + k,)) for k in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    lost = [i for i in range(48) if i not in results or results[i][1] is None]
    mixed = [i for i, (pr, text) in results.items() if text is not None and text != solo[pr]]
    check(not errors and not lost and not mixed,
          f"48 concurrent requests in {time.time() - t0:.1f} s: errors {errors[:2]}, lost {lost}, mixed up {mixed}")

    # --- a client that leaves mid-stream: its request is aborted, and the server serves on
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hello", "max_tokens": 2000, "temperature": 0,
                                                          "ignore_eos": True, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = r.readline()
    c.sock.shutdown(socket.SHUT_RDWR)  # gone for sure (the response object still holds the socket's file)
    c.sock.close()
    r.close()
    aborted = False
    for _ in range(100):
        if "aborted (the client disconnected)" in open(log).read():
            aborted = True
            break
        time.sleep(0.1)
    check(first.startswith(b"data: ") and aborted, "a client that disconnects mid-stream has its request aborted")
    s, r = post(port, "/v1/completions", {"prompt": prompts[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    check(s == 200 and r["choices"][0]["text"] == solo[prompts[0]], "the next request is served as before")

    # --- kb_nano eval --url measures the running server as vllm bench serve does
    out_json = os.path.join(tempfile.mkdtemp(), "url.json")
    e = subprocess.run([KBN, "eval", "--url", f"http://127.0.0.1:{port}", "--input-len", "24", "--output-len", "8",
                        "--num-prompts", "20", "--request-rate", "100", "--max-concurrency", "6", "--json", out_json],
                       capture_output=True, text=True, timeout=300)
    ok = e.returncode == 0 and os.path.exists(out_json)
    res = json.load(open(out_json)) if ok else {}
    check(ok and res["successful_requests"] == 20 and res["failed_requests"] == 0 and
          res["total_output_tokens"] == 160 and res["total_input_tokens"] == 480 and res["ttft_ms"]["p99"] > 0 and
          res["tpot_ms"]["p50"] > 0 and res["e2el_ms"]["p50"] >= res["ttft_ms"]["p50"],
          f"eval --url: 20 requests at 100/s, 6 in flight, all measured ({e.stdout[-300:]!r} {e.stderr[-300:]!r})")

    # A burst: every request at once (cpp-httplib's own listen backlog of 5 dropped connections here before serve
    # widened it).
    e = subprocess.run([KBN, "eval", "--url", f"http://127.0.0.1:{port}", "--input-len", "16", "--output-len", "4",
                        "--num-prompts", "200", "--json", out_json], capture_output=True, text=True, timeout=300)
    res = json.load(open(out_json)) if e.returncode == 0 else {}
    check(res.get("successful_requests") == 200 and res.get("failed_requests") == 0,
          f"eval --url: a burst of 200 requests at once, none lost ({e.stdout[-200:]!r} {e.stderr[-200:]!r})")

    # --- bad requests: a clear error naming the field, never a crash
    def error_of(body=None, raw=None, path="/v1/completions"):
        status, text = request(port, "POST", path, body, raw=raw)
        try:
            return status, json.loads(text)["error"]
        except (json.JSONDecodeError, KeyError):
            return status, {"message": text}

    cases = [
        ("malformed JSON", dict(raw=b'{"prompt": "x",'), 400, "not valid JSON"),
        ("an unknown field", dict(body={"prompt": "x", "frobnicate": 1}), 400, "unknown field 'frobnicate'"),
        ("no prompt", dict(body={"max_tokens": 3}), 400, "'prompt' is required"),
        ("a prompt longer than max_model_len", dict(body={"prompt": "word " * 2100}), 400, "maximum context length"),
        ("max_tokens past max_model_len", dict(body={"prompt": "x", "max_tokens": 5000}), 400, "maximum context length"),
        ("n = 2", dict(body={"prompt": "x", "n": 2}), 400, "'n' must be 1"),
        ("a token id past the vocabulary", dict(body={"prompt": [1, 2, 99999]}), 400, "outside the vocabulary"),
        ("a negative temperature", dict(body={"prompt": "x", "temperature": -1}), 400, "temperature"),
        ("max_tokens as text", dict(body={"prompt": "x", "max_tokens": "10"}), 400, "must be an integer"),
        ("another model", dict(body={"prompt": "x", "model": "gpt-4"}), 404, "does not exist"),
        ("a body over --max-body-bytes", dict(raw=json.dumps({"prompt": "y" * 70000}).encode()), 413, "larger than"),
        ("chat with no messages", dict(body={"messages": []}, path="/v1/chat/completions"), 400, "'messages'"),
        ("chat out of order", dict(body={"messages": [{"role": "assistant", "content": "a"}]},
                                   path="/v1/chat/completions"), 400, "expected 'user'"),
    ]
    for name, kw, want_status, want_text in cases:
        status, err = error_of(**kw)
        check(status == want_status and want_text in err.get("message", ""),
              f"{name}: {status} {err.get('message', '')[:100]!r}")
    status, text = request(port, "GET", "/v1/nothing")
    check(status == 404 and "no such endpoint" in text, "an unknown path is a 404 naming the endpoints")
    status, _ = request(port, "GET", "/health")
    check(status == 200, "healthy after all of that")
    # Tensor parallel on CPU ranks: the same checkpoint gives the same greedy text at --tp 2.
    tp_server, tp_port, _ = start(["--tp", "2", "--max-model-len", "256"])
    try:
        s, r = post(tp_port, "/v1/completions", {"prompt": prompts[0], "max_tokens": 12, "temperature": 0,
                                                 "ignore_eos": True})
        check(s == 200 and r["choices"][0]["text"] == solo[prompts[0]], "serve --tp 2 (CPU ranks) answers as --tp 1")
    finally:
        tp_server.send_signal(signal.SIGTERM)
        tp_server.wait(timeout=20)
finally:
    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        rc = None
check(rc == 0, f"SIGTERM stops the server cleanly (exit {rc})")
if failures:
    print(open(log).read()[-3000:])
    sys.exit(f"serve_test: {len(failures)} checks failed")
print("serve_test: ok")
