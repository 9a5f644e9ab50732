"""The client of the supervisor's control endpoint (``supervisor/control.py``): what the
operator commands (``status``, ``drain``, ``scale``, ``down``) and the planner use.

Apart from the server so that a process which only asks the supervisor (the planner) loads
nothing of the supervisor: the messages are :mod:`dynamoctl.wire.control`.
"""

from __future__ import annotations

from typing import TypeVar

import httpx
import msgspec

from dynamoctl.wire.adapters import LoraLoadRequest, LoraReport, LoraUnloadRequest
from dynamoctl.wire.control import (
    ControlReply,
    DownRequest,
    DrainRequest,
    ScaleReply,
    ScaleRequest,
    StatusReport,
)
from dynamoctl.wire.tenants import KeysReloadReport, KeysReloadRequest

T = TypeVar("T")


class ControlError(Exception):
    """The supervisor refused a command or could not be reached; the message says why."""


class Unreachable(ControlError):
    """No answer from the control endpoint (nothing listens, or the host is unreachable)."""


class ControlClient:
    def __init__(self, url: str, token: str, timeout: float = 10.0) -> None:
        self._http = httpx.Client(
            base_url=url,
            headers={"authorization": f"Bearer {token}"},
            timeout=timeout,
            trust_env=False,
        )

    def _call(self, method: str, path: str, body: msgspec.Struct | None, kind: type[T]) -> T:
        try:
            reply = self._http.request(
                method, path, content=msgspec.json.encode(body) if body else None
            )
        except httpx.HTTPError as exc:
            raise Unreachable(f"supervisor at {self._http.base_url} unreachable: {exc}") from exc
        if reply.status_code != 200:
            try:
                message = msgspec.json.decode(reply.content, type=ControlReply).message
            except msgspec.DecodeError:
                message = reply.text
            raise ControlError(message)
        return msgspec.json.decode(reply.content, type=kind)

    def status(self) -> StatusReport:
        return self._call("GET", "/status", None, StatusReport)

    def drain(self, target: str) -> ControlReply:
        return self._call("POST", "/drain", DrainRequest(target=target), ControlReply)

    def scale(
        self, pool: str, replicas: int, *, by_planner: bool = False, force: bool = False
    ) -> ScaleReply:
        body = ScaleRequest(pool=pool, replicas=replicas, by_planner=by_planner, force=force)
        return self._call("POST", "/scale", body, ScaleReply)

    def lora_load(
        self, name: str, path: str, pools: list[str], base_model: str | None = None
    ) -> ControlReply:
        body = LoraLoadRequest(name=name, path=path, pools=pools, base_model=base_model)
        return self._call("POST", "/lora/load", body, ControlReply)

    def lora_unload(self, name: str) -> ControlReply:
        return self._call("POST", "/lora/unload", LoraUnloadRequest(name=name), ControlReply)

    def lora(self) -> LoraReport:
        return self._call("GET", "/lora", None, LoraReport)

    def keys_reload(self, timeout: float) -> KeysReloadReport:
        body = KeysReloadRequest(timeout=timeout)
        return self._call("POST", "/keys/reload", body, KeysReloadReport)

    def down(self, now: bool) -> ControlReply:
        return self._call("POST", "/down", DownRequest(now=now), ControlReply)

    def close(self) -> None:
        self._http.close()
