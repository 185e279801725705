"""A fake model server on loopback that drives one agent turn through a real CLI's own tools.

It speaks the four wire formats the real CLIs use: the Anthropic Messages API (`/v1/messages`,
SSE), the OpenAI Responses API (`/responses`, SSE, as `codex exec` calls it), OpenAI chat
completions (`/chat/completions`, SSE: opencode, Qwen Code) and the Gemini API
(`:streamGenerateContent?alt=sse`, `:generateContent`). Whatever the format, the "model" is the
same small script (`decide`), read from the conversation the CLI sends:

1. the first user message says "Read the file P and carry out …": call the CLI's read tool on P;
2. the tool result is the prompt (phase, story, the file the story names): for dev and fix, call
   the CLI's write tool on that file, in the worktree P lives in (reading it first when it exists,
   as a careful model does and as Qwen Code insists); for a review, answer with the verdict line
   (CHANGES-REQUESTED for the first `reject_reviews` review prompts, else APPROVED);
3. after the write: a short closing message.

A request without tools (a title, a summary, a routing check) gets a plain short answer.

The scenario (`Scenario`) injects faults: every model call answered with `status` (429, 529,
503), or only the first `fail_first` calls. Beside it runs a proxy (`CountingProxy`), named by
HTTPS_PROXY/HTTP_PROXY in the CLIs' environment, which refuses every request and counts it: any
attempt to leave loopback through the proxy shows up there.
"""

from __future__ import annotations

import json
import os
import re
import socketserver
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Scenario", "FakeModel", "CountingProxy", "decide", "USAGE"]

# What every answer reports as its token use (cache reads included in the input, as the APIs do).
USAGE = {"input": 1200, "cached": 400, "output": 50, "reasoning": 7, "cache_write": 30}

_INSTRUCTION = re.compile(r"Read the file (\S+?) and carry out")
_PROMPT_NAME = re.compile(r"/(dev|review|fix|create)-(\d+)\.md$")
_FILES = re.compile(r'"files":\s*\[[^"\]]{0,80}"([^"]+)"')  # a read tool may number the lines
_MARK = "bmad-loop "  # the prompt's first line: "# bmad-loop dev session — story …"


@dataclass
class Scenario:
    status: int = 0  # every model call answered with this HTTP status (0: none)
    fail_first: int = 0  # only the first n model calls answered with `status`
    reject_reviews: int = 0  # the first n distinct review prompts request changes


@dataclass
class Action:
    kind: str  # read | write | text
    path: str = ""
    content: str = ""
    text: str = ""


@dataclass
class Conversation:
    """What the model needs of a request, whatever its format."""

    user_text: str
    results: list[str]
    tools: dict[str, set[str]]  # tool name -> its parameter names


@dataclass
class _State:
    scenario: Scenario = field(default_factory=Scenario)
    model_calls: int = 0
    faults_sent: int = 0
    reviews: list[str] = field(default_factory=list)
    plans: dict = field(default_factory=dict)  # prompt path -> the tool steps after reading it
    paths: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def decide(conv: Conversation, state: _State) -> Action:
    """The next step of the one scripted turn (see the module docstring)."""
    m = _INSTRUCTION.search(conv.user_text)
    if not m or not conv.tools:
        return Action("text", text="OK.")
    prompt_path = m.group(1)
    if not conv.results:
        return Action("read", path=prompt_path)
    prompt = conv.results[0]
    name = _PROMPT_NAME.search(prompt_path)
    if _MARK not in prompt or not name:
        return Action("text", text=f"I could not read the prompt file {prompt_path}: {prompt[:300]}")
    phase, number = name.group(1), int(name.group(2))
    if phase == "review":
        with state.lock:
            if prompt_path not in state.reviews:
                state.reviews.append(prompt_path)
            rejected = state.reviews.index(prompt_path) < state.scenario.reject_reviews
        verdict = "CHANGES-REQUESTED" if rejected else "APPROVED"
        return Action("text", text=f"Reviewed the change.\nBMAD-LOOP-VERDICT: {verdict}")
    files = _FILES.search(prompt)
    if not files:
        return Action("text", text="The story names no file.")
    target = f"{prompt_path.rsplit('/.bmad-loop-session/', 1)[0]}/{files.group(1)}"
    with state.lock:
        if len(conv.results) == 1:  # planned once the prompt is read: a file that exists is read first
            state.plans[prompt_path] = (["read"] if os.path.exists(target) else []) + ["write"]
        plan = state.plans.get(prompt_path, ["write"])
    step = len(conv.results) - 1
    if step < len(plan) and plan[step] == "read":
        return Action("read", path=target)
    if step < len(plan):
        return Action("write", path=target, content=f"# written by the {phase} session {number}\nVALUE = {number}\n")
    return Action("text", text=f"Done: the {phase} session wrote what the story names.")


# ------------------------------------------------------------------ the CLIs' tools

_READ_TOOLS = ("Read", "read_file", "read", "view")
_WRITE_TOOLS = ("Write", "write_file", "write", "create_file")
_SHELL_TOOLS = ("exec_command", "shell_command", "shell", "local_shell")
_PATH_PARAMS = ("file_path", "filePath", "absolute_path", "path")


def tool_call(action: Action, tools: dict[str, set[str]]) -> tuple[str, dict]:
    """The CLI's own tool (name, arguments) for a read or write action."""
    names = _READ_TOOLS if action.kind == "read" else _WRITE_TOOLS
    for name in names:
        if name in tools:
            params = tools[name]
            key = next((p for p in _PATH_PARAMS if p in params), "file_path")
            args = {key: action.path}
            if action.kind == "write":
                args["content"] = action.content
            return name, args
    for name in _SHELL_TOOLS:
        if name in tools:
            return name, _shell_args(name, tools[name], _shell_line(action))
    raise LookupError(f"no {action.kind} tool among {sorted(tools)}")


def _shell_line(action: Action) -> str:
    if action.kind == "read":
        return f"cat '{action.path}'"
    return f"mkdir -p \"$(dirname '{action.path}')\" && cat > '{action.path}' <<'EOF'\n{action.content}EOF"


def _shell_args(name: str, params: set[str], line: str) -> dict:
    if "cmd" in params:
        return {"cmd": line}
    if name == "shell" and "command" in params:
        return {"command": ["bash", "-lc", line]}
    return {"command": line}


# ------------------------------------------------------------------ the wire formats

def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(part) for part in content)
    if isinstance(content, dict):
        for key in ("text", "content", "output", "result"):
            if key in content:
                return _text_of(content[key])
        return json.dumps(content)
    return "" if content is None else str(content)


def _params(schema) -> set[str]:
    return set((schema or {}).get("properties", {}) or {})


def anthropic_conversation(body: dict) -> Conversation:
    user, results = [], []
    for message in body.get("messages", []):
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            if part.get("type") == "tool_result":
                results.append(_text_of(part.get("content")))
            elif message.get("role") == "user" and part.get("type") == "text":
                user.append(str(part.get("text", "")))
    tools = {t["name"]: _params(t.get("input_schema")) for t in body.get("tools", []) if "name" in t}
    return Conversation("\n".join(user), results, tools)


def responses_conversation(body: dict) -> Conversation:
    user, results = [], []
    items = body.get("input")
    for item in items if isinstance(items, list) else [{"role": "user", "content": items}]:
        kind = item.get("type", "message")
        if kind.endswith("_call_output"):
            results.append(_text_of(item.get("output")))
        elif kind == "message" and item.get("role") == "user":
            user.append(_text_of(item.get("content")))
    tools = {}
    for tool in body.get("tools", []):
        name = tool.get("name") or (tool.get("function") or {}).get("name") or tool.get("type")
        tools[name] = _params(tool.get("parameters") or (tool.get("function") or {}).get("parameters"))
    return Conversation("\n".join(user), results, tools)


def chat_conversation(body: dict) -> Conversation:
    user, results = [], []
    for message in body.get("messages", []):
        if message.get("role") == "tool":
            results.append(_text_of(message.get("content")))
        elif message.get("role") == "user":
            user.append(_text_of(message.get("content")))
    tools = {t["function"]["name"]: _params(t["function"].get("parameters"))
             for t in body.get("tools", []) if "function" in t}
    return Conversation("\n".join(user), results, tools)


def gemini_conversation(body: dict) -> Conversation:
    user, results = [], []
    for content in body.get("contents", []):
        for part in content.get("parts", []):
            if "functionResponse" in part:
                results.append(_text_of((part["functionResponse"] or {}).get("response")))
            elif content.get("role") == "user" and "text" in part:
                user.append(part["text"])
    tools = {}
    for tool in body.get("tools", []) or []:
        for decl in tool.get("functionDeclarations", []) or []:
            tools[decl["name"]] = _params(decl.get("parameters") or decl.get("parametersJsonSchema"))
    return Conversation("\n".join(user), results, tools)


def _sse(events: list[tuple[str | None, dict | str]]) -> bytes:
    out = []
    for name, data in events:
        payload = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "") + f"data: {payload}\n\n")
    return "".join(out).encode()


def anthropic_answer(action: Action, tools, model: str, n: int) -> bytes:
    usage = {"input_tokens": USAGE["input"] - USAGE["cached"], "output_tokens": 1,
             "cache_read_input_tokens": USAGE["cached"], "cache_creation_input_tokens": USAGE["cache_write"]}
    events = [("message_start", {"type": "message_start", "message": {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage}})]
    if action.kind == "text":
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": action.text}
        stop = "end_turn"
    else:
        name, args = tool_call(action, tools)
        block = {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(args)}
        stop = "tool_use"
    events += [("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
               ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
               ("content_block_stop", {"type": "content_block_stop", "index": 0}),
               ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": USAGE["output"]}}),
               ("message_stop", {"type": "message_stop"})]
    return _sse(events)


def responses_answer(action: Action, tools, model: str, n: int) -> bytes:
    if action.kind == "text":
        item = {"type": "message", "role": "assistant", "id": f"msg_{n}", "status": "completed",
                "content": [{"type": "output_text", "text": action.text, "annotations": []}]}
    else:
        name, args = tool_call(action, tools)
        item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
                "arguments": json.dumps(args), "status": "completed"}
    usage = {"input_tokens": USAGE["input"], "input_tokens_details": {"cached_tokens": USAGE["cached"]},
             "output_tokens": USAGE["output"], "output_tokens_details": {"reasoning_tokens": USAGE["reasoning"]},
             "total_tokens": USAGE["input"] + USAGE["output"]}
    response = {"id": f"resp_{n}", "object": "response", "model": model, "status": "completed",
                "output": [item], "usage": usage}
    return _sse([("response.created", {"type": "response.created", "response": {**response, "status": "in_progress",
                                                                              "output": []}}),
                 ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}),
                 ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
                 ("response.completed", {"type": "response.completed", "response": response})])


def chat_answer(action: Action, tools, model: str, n: int) -> bytes:
    def chunk(delta, finish=None, **extra):
        return (None, {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})

    if action.kind == "text":
        events = [chunk({"role": "assistant", "content": action.text}), chunk({}, "stop")]
    else:
        name, args = tool_call(action, tools)
        call = {"index": 0, "id": f"call_{n}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
        events = [chunk({"role": "assistant", "content": None, "tool_calls": [call]}), chunk({}, "tool_calls")]
    usage = {"prompt_tokens": USAGE["input"], "completion_tokens": USAGE["output"],
             "total_tokens": USAGE["input"] + USAGE["output"],
             "prompt_tokens_details": {"cached_tokens": USAGE["cached"]}}
    events.append((None, {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0,
                          "model": model, "choices": [], "usage": usage}))
    events.append((None, "[DONE]"))
    return _sse(events)


def gemini_candidate(action: Action, tools) -> dict:
    if action.kind == "text":
        part = {"text": action.text}
    else:
        name, args = tool_call(action, tools)
        part = {"functionCall": {"name": name, "args": args}}
    return {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": USAGE["input"], "candidatesTokenCount": USAGE["output"],
                              "cachedContentTokenCount": USAGE["cached"],
                              "totalTokenCount": USAGE["input"] + USAGE["output"]}}


# ------------------------------------------------------------------ faults, in each API's words

def fault_body(api: str, status: int) -> dict:
    words = {429: "Rate limit exceeded: too many requests, please slow down.",
             529: "Overloaded", 503: "The model is overloaded. Please try again later."}.get(status, "error")
    if api == "anthropic":
        kind = {429: "rate_limit_error", 529: "overloaded_error", 503: "api_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": words}}
    if api == "gemini":
        code = {429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}.get(status, "UNAVAILABLE")
        # As the Gemini API says it: how long to wait, in a RetryInfo detail.
        details = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.2s"}] \
            if status == 429 else []
        return {"error": {"code": status, "message": words, "status": code, "details": details}}
    code = {429: "rate_limit_exceeded", 503: "server_is_overloaded"}.get(status, "server_error")
    return {"error": {"message": words, "type": "server_error" if status != 429 else "requests", "code": code}}


class FakeModel:
    """The HTTP server (a thread): start(), scenario changes between commands, report()."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.state = _State()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "FakeModel":
        self.thread.start()
        return self

    def set_scenario(self, scenario: Scenario) -> None:
        with self.state.lock:
            self.state.scenario = scenario
            self.state.faults_sent = 0

    def report(self) -> dict:
        with self.state.lock:
            return {"model_calls": self.state.model_calls, "faults_sent": self.state.faults_sent,
                    "paths": list(self.state.paths), "unknown": list(self.state.unknown)}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State

    def log_message(self, *args):  # quiet: the report says what was asked
        pass

    def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with self.state.lock:
            self.state.paths.append(f"GET {self.path}")
        if self.path.rstrip("/").endswith("/models"):
            model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}
            return self._send(200, json.dumps({"object": "list", "data": [model]}).encode(), "application/json")
        self._send(404, b'{"error": {"message": "not found"}}', "application/json")

    def do_HEAD(self):
        self._send(200, b"", "text/plain")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?")[0]
        api = ("anthropic" if path.endswith("/messages") else "responses" if path.endswith("/responses")
               else "chat" if path.endswith("/chat/completions") else "gemini" if ":" in path.rsplit("/", 1)[-1]
               else None)
        with self.state.lock:
            self.state.paths.append(f"POST {self.path}")
            if api is None or path.endswith(":countTokens"):
                if api is None:
                    self.state.unknown.append(self.path)
            else:
                self.state.model_calls += 1
            n = self.state.model_calls
            scenario = self.state.scenario
            fault = (api is not None and not path.endswith(":countTokens") and scenario.status
                     and (not scenario.fail_first or self.state.faults_sent < scenario.fail_first))
            if fault:
                self.state.faults_sent += 1
        if path.endswith("/count_tokens") or path.endswith(":countTokens"):
            return self._send(200, json.dumps({"input_tokens": 100, "totalTokens": 100}).encode(), "application/json")
        if api is None:
            return self._send(404, b'{"error": {"message": "not found"}}', "application/json")
        if fault:
            return self._send(scenario.status, json.dumps(fault_body(api, scenario.status)).encode(),
                              "application/json", {"retry-after": "0", "retry-after-ms": "10"})
        self._answer(api, path, body, n)

    def _answer(self, api: str, path: str, body: dict, n: int) -> None:
        model = str(body.get("model") or path.rsplit("/", 1)[-1].split(":")[0])
        conv = {"anthropic": anthropic_conversation, "responses": responses_conversation,
                "chat": chat_conversation, "gemini": gemini_conversation}[api](body)
        action = decide(conv, self.state)
        if api == "gemini":
            candidate = gemini_candidate(action, conv.tools)
            if path.endswith(":generateContent"):
                if (body.get("generationConfig") or {}).get("responseMimeType") == "application/json":
                    reply = json.dumps({"reasoning": "The turn is over.", "next_speaker": "user",
                                        "model_choice": "flash", "complexity_score": 1})
                    candidate["candidates"][0]["content"]["parts"] = [{"text": reply}]
                return self._send(200, json.dumps(candidate).encode(), "application/json")
            return self._send(200, _sse([(None, candidate)]), "text/event-stream")
        if api == "anthropic" and not body.get("stream"):
            text = action.text if action.kind == "text" else "OK."
            message = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": model,
                       "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                       "usage": {"input_tokens": 10, "output_tokens": 2}}
            return self._send(200, json.dumps(message).encode(), "application/json")
        if api == "chat" and not body.get("stream"):
            text = action.text if action.kind == "text" else "OK."
            reply = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": model,
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}
            return self._send(200, json.dumps(reply).encode(), "application/json")
        answer = {"anthropic": anthropic_answer, "responses": responses_answer, "chat": chat_answer}[api]
        self._send(200, answer(action, conv.tools, model, n), "text/event-stream")


class CountingProxy:
    """An HTTP(S) proxy that forwards nothing: every request is refused (403) and counted."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.attempts: list[str] = []
        attempts = self.attempts

        class Refuse(socketserver.StreamRequestHandler):
            def handle(self):
                line = self.rfile.readline(4096).decode("latin-1").strip()
                if line:
                    attempts.append(line)
                self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

        self.server = socketserver.ThreadingTCPServer((host, port), Refuse)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "CountingProxy":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
