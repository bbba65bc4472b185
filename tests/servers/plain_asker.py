"""Fixture: ``asker.py`` on the standard library, the same tools, answers and stderr lines.

Its tools ask their client things mid-call: ``elicit(message)``, ``sample(prompt)``, ``roots()``,
``both(message, prompt)`` (an elicitation and a sampling at once), ``work(message, steps)`` (elicits,
then reports progress), ``later(delay)``, ``wait(seconds)``, ``slow(delay, message)``,
``stall(message)``; the prompt ``confirm`` elicits too. See ``asker.py`` for what each does.

It speaks as the SDK's server does in the handshake era, checked line by line against
``asker.py``: a cancelled call is never answered, a question it was waiting on is cancelled
(``notifications/cancelled`` with the reason "caller cancelled"), and at the end of its input the
questions still open fail with ``-32000 Connection closed``. Importing the SDK costs 1.8 s of CPU
at each start; the asking tests start this fixture about 50 times.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

import _raw

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}
ACTIONS = ("accept", "decline", "cancel")
CLOSED = {"code": -32000, "message": "Connection closed"}
INVALID = {"code": _raw.INVALID_PARAMS, "message": "Invalid request parameters", "data": ""}
IGNORE_CANCEL = bool(os.environ.get("ASKER_IGNORE_CANCEL"))


def _tool(name: str, **properties: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}}


TOOLS = [
    _tool("elicit", message={"type": "string"}),
    _tool("sample", prompt={"type": "string"}),
    _tool("roots"),
    _tool("later", delay={"type": "number"}),
    _tool("wait", seconds={"type": "number"}),
    _tool("both", message={"type": "string"}, prompt={"type": "string"}),
    _tool("work", message={"type": "string"}, steps={"type": "integer"}),
    _tool("slow", delay={"type": "number"}, message={"type": "string"}),
    _tool("stall", message={"type": "string"}),
]
PROMPTS = [{"name": "confirm", "arguments": [{"name": "message"}]}]


class Cancelled(Exception):
    """The client cancelled the request being served."""


class Refused(Exception):
    """The client answered a question with an error (``asker.py``'s ``MCPError``)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error


class Invalid(Exception):
    """An answer the SDK's models would not take."""


class Question:
    __slots__ = ("answered", "outcome")

    def __init__(self) -> None:
        self.answered = threading.Event()
        self.outcome: dict[str, Any] = {}


class Request:
    """One request being served: its id, its progress token, whether it was cancelled."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.id = message["id"]
        self.params: dict[str, Any] = message.get("params") or {}
        self.token = (self.params.get("_meta") or {}).get("progressToken")
        self.cancelled = threading.Event()
        self.questions: set[Question] = set()


_lock = threading.Lock()  # one whole line at a time on stdout; the tables below
_requests: dict[Any, Request] = {}
_questions: dict[int, Question] = {}
_next_id = 0
_closed = False


def send(message: dict[str, Any]) -> None:
    with _lock:
        _raw.send(message)


def say(line: str) -> None:
    _raw.log(f"asker: {line}")


def text(value: str, error: bool = False) -> dict[str, Any]:
    return {"content": [_raw.text(value)], "isError": error}


def ask(request: Request | None, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Send the client a request and wait for its answer; raises Cancelled if *request* is cancelled."""
    global _next_id
    question = Question()
    with _lock:
        if request is not None and request.cancelled.is_set():
            raise Cancelled  # cancelled before it asked: as the SDK's, it asks nothing
        _next_id += 1
        question_id = _next_id
        if _closed:
            question.outcome = {"error": CLOSED}
            question.answered.set()
        _questions[question_id] = question
        if request is not None:
            request.questions.add(question)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": question_id, "method": method}
    if params is not None:
        message["params"] = params
    send(message)
    question.answered.wait()
    with _lock:
        _questions.pop(question_id, None)
        if request is not None:
            request.questions.discard(question)
    if "result" in question.outcome:
        return question.outcome["result"]
    if "error" in question.outcome:
        raise Refused(question.outcome["error"])
    cancel = {"requestId": question_id, "reason": "caller cancelled"}
    send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
    raise Cancelled


def elicit(request: Request | None, message: str) -> str:
    asked = {"mode": "form", "message": message, "requestedSchema": SCHEMA}
    answer = ask(request, "elicitation/create", asked)
    action, content = answer.get("action"), answer.get("content")
    if action not in ACTIONS or not isinstance(content, dict | None):
        raise Invalid
    return f"{action} {json.dumps(content, sort_keys=True)}"


def sample(request: Request, prompt: str) -> str:
    message = {"role": "user", "content": {"type": "text", "text": prompt}}
    answer = ask(request, "sampling/createMessage", {"messages": [message], "maxTokens": 10})
    content = answer.get("content")
    if not isinstance(content, dict) or "model" not in answer:
        raise Invalid
    return f"{answer['model']} {content.get('text', content)}"


def roots(request: Request) -> str:
    answer = ask(request, "roots/list")
    listed = answer.get("roots")
    if not isinstance(listed, list) or not all(isinstance(r, dict) and "uri" in r for r in listed):
        raise Invalid
    return json.dumps([str(root["uri"]) for root in listed])


def both(request: Request, args: dict[str, Any]) -> str:
    outcomes: dict[str, str | BaseException] = {}

    def one(name: str) -> None:
        try:
            outcomes[name] = asking(request, name, args)
        except Exception as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=one, args=(name,)) for name in ("elicit", "sample")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for outcome in outcomes.values():
        if isinstance(outcome, BaseException):
            raise outcome
    return f"{outcomes['elicit']} | {outcomes['sample']}"


def work(request: Request, args: dict[str, Any]) -> str:
    answer = elicit(request, str(args.get("message", "?")))
    steps = int(args.get("steps", 3))
    for step in range(1, steps + 1):
        pause(request, 0.05)
        if request.token is not None:
            said = {
                "progressToken": request.token,
                "progress": step,
                "total": steps,
                "message": f"step {step}",
            }
            send({"jsonrpc": "2.0", "method": "notifications/progress", "params": said})
    return f"{answer}; worked {steps}"


def asking(request: Request, name: str, args: dict[str, Any]) -> str:
    if name == "both":
        return both(request, args)
    if name == "work":
        return work(request, args)
    if name == "elicit":
        return elicit(request, str(args.get("message", "?")))
    if name == "sample":
        return sample(request, str(args.get("prompt")))
    return roots(request)


def pause(request: Request, seconds: float) -> None:
    if request.cancelled.wait(seconds):
        raise Cancelled


def later(delay: float) -> None:
    time.sleep(delay)
    try:
        outcome = elicit(None, "later")
    except Refused as exc:
        outcome = f"error {exc.error.get('code')}: {exc.error.get('message')}"
    say(f"later -> {outcome}")


def call_tool(request: Request) -> dict[str, Any]:
    args = request.params.get("arguments") or {}
    name = str(request.params.get("name"))
    if name == "wait":
        pause(request, float(args.get("seconds", 1)))
        return text("waited")
    if name == "later":
        threading.Thread(target=later, args=(float(args.get("delay", 0.2)),), daemon=True).start()
        return text("later")
    asked = name
    if name == "slow":
        pause(request, float(args.get("delay", 1)))
        asked = "elicit"
    if name == "stall":
        say(f"stall -> {asking(request, 'elicit', args)}, then silence")
        pause(request, 3600)
    try:
        outcome, error = asking(request, asked, args), False
    except Refused as exc:
        outcome, error = f"error {exc.error.get('code')}: {exc.error.get('message')}", True
    except Cancelled:
        say(f"{name} -> cancelled")
        raise
    say(f"{name} -> {outcome}")
    return text(outcome, error)


def get_prompt(request: Request) -> dict[str, Any]:
    outcome = elicit(request, str((request.params.get("arguments") or {}).get("message", "?")))
    say(f"confirm -> {outcome}")
    return {"messages": [{"role": "user", "content": _raw.text(outcome)}]}


def initialize(request: Request) -> dict[str, Any]:
    return {
        "protocolVersion": request.params.get("protocolVersion") or _raw.DEFAULT_PROTOCOL,
        "capabilities": {"prompts": {"listChanged": False}, "tools": {"listChanged": False}},
        "serverInfo": {"name": "asker", "version": ""},
    }


HANDLERS = {
    "initialize": initialize,
    "ping": lambda request: {},
    "tools/list": lambda request: {"tools": TOOLS},
    "tools/call": call_tool,
    "prompts/list": lambda request: {"prompts": PROMPTS},
    "prompts/get": get_prompt,
}


def serve(request: Request, method: str) -> None:
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request.id}
    try:
        reply["result"] = HANDLERS[method](request)
    except Cancelled:
        return  # never answered, as the SDK's server: the client said it no longer wants one
    except Invalid:
        reply["error"] = INVALID
    except Exception as exc:  # as the SDK's server: code 0, the message
        reply["error"] = {"code": 0, "message": str(exc)}
    finally:
        with _lock:
            _requests.pop(request.id, None)
    send(reply)


def cancelled(params: dict[str, Any]) -> None:
    if IGNORE_CANCEL:
        say("cancel ignored")
        return
    with _lock:
        request = _requests.get(params.get("requestId"))
        if request is None:
            return
        request.cancelled.set()
        for question in request.questions:
            question.answered.set()  # with no outcome: it was given up


def answered(message: dict[str, Any]) -> None:
    with _lock:
        question = _questions.get(message.get("id"))
        if question is None or question.answered.is_set():
            return
        question.outcome = {key: message[key] for key in ("result", "error") if key in message}
        question.answered.set()


def close() -> None:
    """The input ended: every question still open fails, as the SDK's session does."""
    global _closed
    with _lock:
        _closed = True
        for question in _questions.values():
            if not question.answered.is_set():
                question.outcome = {"error": CLOSED}
                question.answered.set()


def main() -> None:
    sys.stdout = sys.stderr  # a stray print() must not corrupt the protocol stream
    for message in _raw.incoming(send):
        method = message.get("method")
        if method is None:
            answered(message)
        elif method == "notifications/cancelled":
            cancelled(message.get("params") or {})
        elif method == "notifications/roots/list_changed":
            say("roots changed")
        elif "id" not in message:
            continue  # initialized: nothing to do
        elif method not in HANDLERS:
            error = {"code": _raw.METHOD_NOT_FOUND, "message": "Method not found"}
            send({"jsonrpc": "2.0", "id": message["id"], "error": error})
        else:
            request = Request(message)
            with _lock:
                _requests[request.id] = request
            threading.Thread(target=serve, args=(request, method), daemon=True).start()
    close()
    deadline = time.monotonic() + 1  # the calls those questions belonged to say how they ended
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):  # the client went away; nothing left to answer
        main()
