"""The HTTP fast path: a plain tool call of a known session answered as JSON, without the SDK's models.

A real daemon with its HTTP listener; raw HTTP requests where the test must see the wire (the
content type, a cancel, a dropped connection), the SDK's own client where behaviour must be the
SDK path's (questions mid-call, per-client instances are in test_instances_http.py).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, MCPError

from supervisor.gateway.http.fastcalls import modern_status
from tests.harness import RICH, Daemon, eventually, extension_settings, first_text

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"),
]

ASKER = extension_settings("plain_asker.py")
ODD = extension_settings("odd_answers.py")
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
WAIT = 30  # a read deadline that bounds a hang: 10 s was missed with two suites at once (pair 9)


def _initialize() -> bytes:
    params = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}).encode()


def _call(request_id: int, tool: str, **arguments: Any) -> bytes:
    params = {"name": tool, "arguments": arguments}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


class Raw:
    """One MCP session over plain HTTP requests."""

    def __init__(self, client: httpx2.AsyncClient, url: str) -> None:
        self.client, self.url, self.headers = client, url, dict(HEADERS)
        if "authorization" in client.headers:  # raw requests on a socket of their own need it too
            self.headers["authorization"] = client.headers["authorization"]

    async def open(self, *, list_tools: bool = True) -> None:
        answer = await self.client.post(self.url, content=_initialize(), headers=self.headers)
        self.headers.update(
            {"mcp-session-id": answer.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        )
        await self.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        if list_tools:
            assert (await self.post(b'{"jsonrpc":"2.0","id":"l","method":"tools/list"}')).status_code == 200

    async def post(self, body: bytes, **options: Any) -> httpx2.Response:
        return await self.client.post(self.url, content=body, headers=self.headers, **options)

    async def calling(self, tg: anyio.abc.TaskGroup, body: bytes) -> list[httpx2.Response]:
        """POST *body* in *tg*; its answer lands in the list returned."""
        answers: list[httpx2.Response] = []

        async def call() -> None:
            answers.append(await self.post(body))

        tg.start_soon(call)
        return answers

    async def cancel(self, request_id: int) -> int:
        """``notifications/cancelled`` for *request_id*; the HTTP status."""
        params = {"requestId": request_id}
        message = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
        return (await self.post(json.dumps(message).encode())).status_code


def _tail(http: Daemon, name: str) -> str:
    result = http.cli("logs", name)
    assert result.returncode == 0, result.stderr
    return result.stdout


class TestJson:
    async def test_a_plain_call_of_a_session_that_listed_tools_is_answered_as_json(
        self,
        http_gateway: Callable[..., Daemon],
    ) -> None:
        http = http_gateway({"rich": RICH})
        async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
            session = Raw(client, http.url + "/mcp")
            await session.open(list_tools=False)
            before = await session.post(_call(1, "rich__echo", text="before"))
            assert before.headers["content-type"].startswith("text/event-stream")  # not known yet: the SDK
            await session.post(b'{"jsonrpc":"2.0","id":"l","method":"tools/list"}')
            answer = await session.post(_call(2, "rich__echo", text="fast"))
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        assert answer.headers["content-length"] == str(len(answer.content))  # one body, not chunks
        assert "transfer-encoding" not in answer.headers
        message = answer.json()
        assert message["id"] == 2 and message["result"]["content"][0]["text"] == "fast"
        assert message["result"]["structuredContent"] == {"text": "fast"}

    async def test_an_unknown_session_goes_to_the_sdk_and_gets_404(
        self,
        http_gateway: Callable[..., Daemon],
    ) -> None:
        http = http_gateway({"rich": RICH})
        async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
            headers = {**HEADERS, "mcp-session-id": "0" * 32}
            answer = await client.post(
                http.url + "/mcp", content=_call(1, "rich__echo", text="x"), headers=headers
            )
        assert answer.status_code == 404

    async def test_errors_answer_as_on_the_sdk_path(
        self,
        http_gateway: Callable[..., Daemon],
    ) -> None:
        """The child's own error and an unknown tool: the same message before listing (the SDK's
        path) as after (the fast path, or the SDK's again for a name not routed)."""
        http = http_gateway({"rich": RICH})
        calls = [("rich__echo", {}), ("rich__nonexistent", {}), ("rich__echo", {"text": "x"})]
        async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
            session = Raw(client, http.url + "/mcp")
            await session.open(list_tools=False)
            slow = [
                _message(await session.post(_call(n, tool, **args))) for n, (tool, args) in enumerate(calls)
            ]
            await session.post(b'{"jsonrpc":"2.0","id":"l","method":"tools/list"}')
            fast = [
                _message(await session.post(_call(n, tool, **args))) for n, (tool, args) in enumerate(calls)
            ]
        assert fast == slow
        assert "error" in slow[0] and "error" in slow[1] and slow[2]["result"]["content"][0]["text"] == "x"

    async def test_media_types_the_sdk_refuses_go_to_the_sdk(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        """An Accept without event streams (the SDK serves streams: 406), a body not labelled
        JSON (400): refused there, never answered here."""
        http = http_gateway({"rich": RICH})
        async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
            session = Raw(client, http.url + "/mcp")
            await session.open()
            json_only = await client.post(
                session.url,
                content=_call(1, "rich__echo", text="x"),
                headers={**session.headers, "accept": "application/json"},
            )
            text = await client.post(
                session.url,
                content=_call(2, "rich__echo", text="x"),
                headers={**session.headers, "content-type": "text/plain"},
            )
            fine = await session.post(_call(3, "rich__echo", text="x"))
        assert (json_only.status_code, text.status_code, fine.status_code) == (406, 400, 200)

    async def test_the_sdk_client_gets_its_answers(
        self,
        http_gateway: Callable[..., Daemon],
    ) -> None:
        http = http_gateway({"rich": RICH})
        async with Client(http.mcp(), mode="legacy") as client:
            await client.list_tools()
            assert first_text(await client.call_tool("rich__echo", {"text": "sdk"})) == "sdk"
            with pytest.raises(MCPError, match="unknown tool"):
                await client.call_tool("rich__nonexistent", {})


def _message(answer: httpx2.Response) -> dict[str, Any]:
    """The one JSON-RPC message of *answer*, whether a JSON body or an event stream."""
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"] == "application/json":
        return answer.json()
    data = [
        line.removeprefix("data:").strip() for line in answer.text.splitlines() if line.startswith("data:")
    ]
    return json.loads(next(line for line in data if line))


class TestCancel:
    async def test_a_cancel_notification_cancels_the_childs_call(
        self,
        http_gateway: Callable[..., Daemon],
    ) -> None:
        http = http_gateway({"rich": RICH})
        async with (
            httpx2.AsyncClient(timeout=30, headers=http.headers) as client,
            anyio.create_task_group() as tg,
        ):
            session = Raw(client, http.url + "/mcp")
            await session.open()
            answers = await session.calling(tg, _call(7, "rich__wait", seconds=30))
            await eventually(lambda: http.status()["rich"]["in_flight"] == 1, within=10)
            assert await session.cancel(7) == 202
            await eventually(lambda: bool(answers), within=10)
        assert answers[0].status_code == 202 and answers[0].content == b""  # no answer to a cancelled call
        await eventually(lambda: "rich: cancelled" in _tail(http, "rich"), within=10)

    @pytest.mark.parametrize("pad", [0, 100_000], ids=["small body", "body over 64 KiB"])
    async def test_a_client_that_goes_cancels_the_childs_call(
        self,
        http_gateway: Callable[..., Daemon],
        pad: int,
    ) -> None:
        """The body comes in a read of its own: over uvicorn's 64 KiB high-water mark that pauses
        reading, and a paused connection hears no close unless reading resumes."""
        http = http_gateway({"rich": RICH})
        async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
            session = Raw(client, http.url + "/mcp")
            await session.open()
        host, port = http.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            body = _call(8, "rich__wait", seconds=30, pad="x" * pad)
            head = f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(body)}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in session.headers.items()) + "\r\n"
            sock.sendall(head.encode())
            await anyio.sleep(0.1)  # not a wait: it makes the body a write (and a read) of its own
            sock.sendall(body)
            await eventually(lambda: http.status()["rich"]["in_flight"] == 1, within=10)
        await eventually(lambda: "rich: cancelled" in _tail(http, "rich"), within=10)
        assert http.status()["rich"]["in_flight"] == 0

    async def test_a_cancel_names_a_call_of_its_own_session_only(
        self,
        http_gateway: Callable[..., Daemon],
    ) -> None:
        """Two clients at once: one cancels request id 7, the other's call with id 7 runs on."""
        http = http_gateway({"rich": RICH})
        async with (
            httpx2.AsyncClient(timeout=30, headers=http.headers) as client,
            anyio.create_task_group() as tg,
        ):
            honest, hostile = Raw(client, http.url + "/mcp"), Raw(client, http.url + "/mcp")
            await honest.open()
            await hostile.open()
            answers = await honest.calling(tg, _call(7, "rich__wait", seconds=1))
            await eventually(lambda: http.status()["rich"]["in_flight"] == 1, within=10)
            assert await hostile.cancel(7) == 202
            await eventually(lambda: bool(answers), within=10)
        assert answers[0].status_code == 200 and "result" in answers[0].json()


class TestQuestions:
    async def test_a_childs_question_reaches_the_calling_http_client(
        self,
        http_gateway: Callable[..., Daemon],
    ) -> None:
        """On the fast path a question goes out on the session's own stream and its answer comes back."""
        http = http_gateway({"asker": ASKER})
        asked: list[str] = []

        async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            asked.append(params.message)
            return types.ElicitResult(action="accept", content={"answer": "yes"})

        async with Client(http.mcp(), mode="legacy", elicitation_callback=answer) as client:
            await client.list_tools()
            result = await client.call_tool("asker__elicit", {"message": "over http?"})
        assert first_text(result) == 'accept {"answer": "yes"}' and asked == ["over http?"]


MODERN = "2026-07-28"


def _modern(
    request_id: int, tool: str, arguments: dict[str, Any], **meta: Any
) -> tuple[bytes, dict[str, str]]:
    """A 2026-07-28 ``tools/call`` (body and headers). Extra *meta* (``logLevel``) sends it down
    the SDK's path, which is the reference for what the fast path must answer."""
    envelope = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": meta.pop("capabilities", {}),
        **{f"io.modelcontextprotocol/{key}": value for key, value in meta.items()},
    }
    params = {"name": tool, "arguments": arguments, "_meta": envelope}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
    headers = {**HEADERS, "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": tool}
    return body.encode(), headers


async def _post_modern(
    client: httpx2.AsyncClient, url: str, request_id: int, tool: str, arguments: dict[str, Any], **meta: Any
) -> tuple[int, str, dict[str, Any]]:
    body, headers = _modern(request_id, tool, arguments, **meta)
    answer = await client.post(url, content=body, headers=headers)
    kind = answer.headers["content-type"]
    return answer.status_code, kind, answer.json() if kind == "application/json" else {"raw": answer.text}


class TestModern:
    async def test_calls_answer_as_on_the_sdks_path(self, http_gateway: Callable[..., Daemon]) -> None:
        """A result, the child's own error, an unknown tool: the same status and message on both paths."""
        http = http_gateway({"rich": RICH})
        calls = [("rich__echo", {"text": "x"}), ("rich__echo", {}), ("rich__nonexistent", {})]
        url = http.url + "/mcp"
        async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
            fast = [await _post_modern(client, url, n, tool, args) for n, (tool, args) in enumerate(calls)]
            slow = [
                await _post_modern(client, url, n, tool, args, logLevel="emergency")
                for n, (tool, args) in enumerate(calls)
            ]
        assert fast == slow
        assert fast[0][:2] == (200, "application/json") and fast[0][2]["result"]["content"][0]["text"] == "x"
        assert fast[0][2]["result"]["resultType"] == "complete"
        assert fast[0][2]["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-supervisor"
        assert fast[1][2]["error"]["message"] == "rich: 'text'"
        assert fast[2][0] == 400  # INVALID_PARAMS, as the SDK maps it

    def test_an_error_gets_the_status_the_sdk_gives_its_code(self) -> None:
        invalid = b'{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"no"}}\n'
        internal = b'{"jsonrpc":"2.0","id":"a","error":{"code":-32603,"message":"no"}}\n'
        result = b'{"jsonrpc":"2.0","id":"a","result":{"error":{"code":-32602}}}\n'
        assert [modern_status(line, "a") for line in (invalid, internal, result)] == [400, 200, 200]

    async def test_the_sdk_client_gets_its_answers(self, http_gateway: Callable[..., Daemon]) -> None:
        http = http_gateway({"rich": RICH})
        async with Client(http.mcp()) as client:  # "auto": 2026-07-28 against this gateway
            assert client.protocol_version == MODERN
            assert first_text(await client.call_tool("rich__echo", {"text": "modern"})) == "modern"
            result = await client.call_tool("rich__echo", {"text": "structured"})
            assert result.structured_content == {"text": "structured"}

    async def test_a_question_to_a_client_that_cannot_be_asked_is_refused_as_on_the_sdks_path(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        """No sampling, elicitation or roots declared: the child's question is refused, the call
        goes on; a client that declared elicitation gets an input-required result (the SDK's)."""
        http = http_gateway({"asker": ASKER})
        url = http.url + "/mcp"
        arguments = {"message": "anyone?"}
        async with httpx2.AsyncClient(timeout=20, headers=http.headers) as client:
            fast = await _post_modern(client, url, 1, "asker__elicit", arguments)
            slow = await _post_modern(client, url, 1, "asker__elicit", arguments, logLevel="emergency")
            asked = await _post_modern(
                client, url, 2, "asker__elicit", arguments, capabilities={"elicitation": {}}
            )
        assert fast == slow and fast[0] == 200
        assert "did not declare the elicitation capability" in json.dumps(fast[2])
        assert asked[2]["result"]["resultType"] == "input_required"

    async def test_a_client_that_goes_cancels_its_call_and_spares_another(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        """Two clients at once: one drops its connection mid-call (its call is cancelled in the
        child), the other's call is answered."""
        http = http_gateway({"rich": RICH})
        host, port = http.url.removeprefix("http://").split(":")
        async with (
            httpx2.AsyncClient(timeout=30, headers=http.headers) as client,
            anyio.create_task_group() as tg,
        ):
            answers: list[tuple[int, str, dict[str, Any]]] = []

            async def honest() -> None:
                answers.append(await _post_modern(client, http.url + "/mcp", 1, "rich__wait", {"seconds": 1}))

            with socket.create_connection((host, int(port)), timeout=10) as sock:
                body, headers = _modern(2, "rich__wait", {"seconds": 30})
                head = f"POST /mcp HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(body)}\r\n"
                headers = {**headers, **http.headers}
                sock.sendall(
                    (head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + body
                )
                await eventually(lambda: http.status()["rich"]["in_flight"] == 1, within=10)
                tg.start_soon(honest)
                await eventually(lambda: http.status()["rich"]["in_flight"] == 2, within=10)
            await eventually(lambda: "rich: cancelled" in _tail(http, "rich"), within=10)
        assert answers[0][0] == 200 and answers[0][2]["result"]["content"][0]["text"] == "waited"
        await eventually(lambda: http.status()["rich"]["in_flight"] == 0, within=10)

    async def test_routing_headers_that_do_not_match_the_body_go_to_the_sdk(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        http = http_gateway({"rich": RICH})
        body, headers = _modern(1, "rich__echo", {"text": "x"})
        async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
            mismatch = await client.post(
                http.url + "/mcp", content=body, headers={**headers, "mcp-name": "rich__fail"}
            )
        assert mismatch.status_code == 400 and "error" in mismatch.json()

    async def test_what_the_sdk_refuses_or_reshapes_is_answered_as_there(
        self, http_gateway: Callable[..., Daemon]
    ) -> None:
        """Each as the SDK's path answers it: a tool whose schema annotates an argument with
        ``x-mcp-header``, called without its header (the SDK checks it: 400); a child's result
        claiming to be input-required (the SDK makes it complete); a result without ``isError``;
        an envelope without capabilities, or with a client info that is no Implementation (400);
        a body that is not JSON by its Content-Type (400); an Accept without event streams (406);
        a result that is no tool result (a content type nobody knows, ``isError: null``)."""
        http = http_gateway({"odd": ODD})
        url = http.url + "/mcp"
        envelope = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        cases: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, str]]] = [
            ("odd__route", {"region": "eu"}, {}, {}),
            ("odd__claims", {}, {}, {}),
            ("odd__echo", {"text": "x"}, {}, {}),
            (
                "odd__echo",
                {"text": "x"},
                {"_envelope": {"io.modelcontextprotocol/protocolVersion": MODERN}},
                {},
            ),
            (
                "odd__echo",
                {"text": "x"},
                {"_envelope": {**envelope, "io.modelcontextprotocol/clientInfo": 5}},
                {},
            ),
            ("odd__echo", {"text": "x"}, {}, {"content-type": "text/plain"}),
            ("odd__echo", {"text": "x"}, {}, {"accept": "application/json"}),
            ("odd__video", {}, {}, {}),
            ("odd__nullerror", {}, {}, {}),
        ]
        async with httpx2.AsyncClient(timeout=WAIT, headers=http.headers) as client:
            answers = {}
            for slow in (False, True):
                for n, (tool, arguments, meta, headers) in enumerate(cases):
                    body, sent = _modern(n, tool, arguments)
                    if "_envelope" in meta:
                        message = json.loads(body)
                        message["params"]["_meta"] = dict(meta["_envelope"])
                        if slow:
                            message["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = "emergency"
                        body = json.dumps(message).encode()
                    elif slow:
                        body = _modern(n, tool, arguments, logLevel="emergency")[0]
                    answer = await client.post(url, content=body, headers={**sent, **headers})
                    json_body = answer.headers.get("content-type") == "application/json" and answer.content
                    answers[slow, n] = (answer.status_code, answer.json() if json_body else None)
        fast = [answers[False, n] for n in range(len(cases))]
        assert fast == [answers[True, n] for n in range(len(cases))]
        assert [status for status, _ in fast] == [400, 200, 200, 400, 400, 400, 406, 200, 200]
        for invalid in fast[7:]:  # the tool error the SDK's path answers for a result that is none
            assert invalid[1]["result"]["isError"] is True
            assert "returned an invalid result" in invalid[1]["result"]["content"][0]["text"]
        assert (
            fast[1][1]["result"]["resultType"] == "complete" and "inputRequests" not in fast[1][1]["result"]
        )
        assert fast[2][1]["result"]["isError"] is False
