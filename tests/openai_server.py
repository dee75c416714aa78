"""A small OpenAI-compatible server for tests: a real transformers causal LM on loopback, never canned answers.

Serves ``GET /v1/models``, ``POST /v1/chat/completions`` (chat template when the tokenizer has one) and
``POST /v1/completions`` (with ``echo`` + ``logprobs`` returning ``tokens``, ``token_logprobs`` and
``text_offset`` as vLLM does). It is written against transformers directly, not retrctl.llm, so the client is
checked against an independent implementation. Fault injection for retry tests: ``fail_first`` requests answer
``fail_status`` (503 by default), ``delay_first`` requests sleep that long first.

    with OpenAIServer(model_dir, fail_first=1) as srv:
        llm = load_llm(model_dir, backend="openai", base_url=srv.url)

By hand: ``python tests/openai_server.py MODEL_DIR --port 8000``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


class Model:
    def __init__(self, path):
        self.tok = AutoTokenizer.from_pretrained(str(path))
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        bos = self.tok.bos_token_id
        self.bos = [bos] if bos is not None and self.tok("a")["input_ids"][:1] == [bos] else []
        self.lock = threading.Lock()  # one forward at a time; HTTP handling stays concurrent

    def encode(self, text):
        """(ids, character offsets) with BOS added as the tokenizer would, offsets into ``text``."""
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), [s for s, _ in enc["offset_mapping"]]
        if self.bos and not (self.tok.bos_token and text.startswith(self.tok.bos_token)):
            ids, offsets = self.bos + ids, [0] + offsets
        return ids, offsets

    def chat_text(self, messages):
        if getattr(self.tok, "chat_template", None):
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n".join(m["content"] for m in messages) + "\n"

    def prompt_logprobs(self, ids):
        with self.lock, torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
        return [None] + [float(logits[i - 1, t]) for i, t in enumerate(ids) if i > 0]

    def generate(self, ids, max_tokens, temperature, top_p, seed, stop):
        if max_tokens <= 0:
            return [], [], "", "length"
        kw = {"do_sample": temperature > 0}
        if temperature > 0:
            kw.update(temperature=temperature, top_p=top_p)
        eos = self.tok.eos_token_id
        with self.lock, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      max_new_tokens=max_tokens, eos_token_id=eos, pad_token_id=self.tok.pad_token_id,
                                      return_dict_in_generate=True, output_logits=True, **kw)
        new = out.sequences[0, len(ids):].tolist()
        end = next((k for k, t in enumerate(new) if t == eos), len(new))
        finish = "stop" if end < len(new) else "length"
        lps = [float(out.logits[k][0].float().log_softmax(-1)[t]) for k, t in enumerate(new[:end])]
        text = self.tok.decode(new[:end], skip_special_tokens=True)
        for s in stop:
            if s and s in text:
                text, finish = text[: text.index(s)], "stop"
        return new[:end], lps, text, finish


class Handler(BaseHTTPRequestHandler):
    server_version = "retrctl-test-openai/1"

    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": self.server.name, "object": "model"}]})
        self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        srv = self.server
        payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with srv.state_lock:
            srv.requests.append({"path": self.path, "headers": dict(self.headers), "payload": payload})
            n = len(srv.requests)
        if n <= srv.delay_count:
            time.sleep(srv.delay_first)
        if n <= srv.fail_first:
            return self._send(srv.fail_status, {"error": {"message": "injected failure"}})
        try:
            if self.path == "/v1/chat/completions":
                return self._send(200, self.chat(payload))
            if self.path == "/v1/completions":
                return self._send(200, self.completions(payload))
        except (KeyError, TypeError, ValueError) as e:
            return self._send(400, {"error": {"message": f"bad request: {e}"}})
        self._send(404, {"error": {"message": f"no route {self.path}"}})

    def _params(self, p):
        stop = p.get("stop") or []
        return (int(p.get("max_tokens", 16)), float(p.get("temperature", 1.0)), float(p.get("top_p", 1.0)),
                p.get("seed"), [stop] if isinstance(stop, str) else list(stop))

    def chat(self, p):
        m = self.server.model
        ids, _ = m.encode(m.chat_text(p["messages"]))
        new, lps, text, finish = m.generate(ids, *self._params(p))
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        if p.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": m.tok.decode([t]), "logprob": v} for t, v in zip(new, lps, strict=True)]}
        return {"id": "chatcmpl-test", "object": "chat.completion", "model": p.get("model"), "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(new), "total_tokens": len(ids) + len(new)}}

    def completions(self, p):
        m = self.server.model
        prompt = p["prompt"]
        ids, offsets = m.encode(prompt)
        new, lps, text, finish = m.generate(ids, *self._params(p))
        choice = {"index": 0, "text": (prompt + text) if p.get("echo") else text, "finish_reason": finish}
        if p.get("logprobs") is not None:
            tokens, values, offs = [], [], []
            if p.get("echo"):
                tokens = [m.tok.decode([t]) for t in ids]
                values, offs = m.prompt_logprobs(ids), list(offsets)
            pos = len(prompt)
            for t, v in zip(new, lps, strict=True):
                piece = m.tok.decode([t])
                tokens.append(piece)
                values.append(v)
                offs.append(pos)
                pos += len(piece)
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": values, "text_offset": offs}
        return {"id": "cmpl-test", "object": "text_completion", "model": p.get("model"), "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(new), "total_tokens": len(ids) + len(new)}}


class OpenAIServer:
    """ThreadingHTTPServer on 127.0.0.1 (port 0 = any free port) in a daemon thread."""

    def __init__(self, model_dir, *, name="test-model", port=0, fail_first=0, fail_status=503, delay_first=0.0,
                 delay_count=0):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.httpd.model = Model(model_dir)
        self.httpd.name = name
        self.httpd.requests = []
        self.httpd.state_lock = threading.Lock()
        self.httpd.fail_first, self.httpd.fail_status = fail_first, fail_status
        self.httpd.delay_first, self.httpd.delay_count = delay_first, delay_count
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def requests(self) -> list[dict]:
        return self.httpd.requests

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    with OpenAIServer(args.model_dir, port=args.port) as s:
        print(f"serving {args.model_dir} at {s.url}", flush=True)
        s.thread.join()
