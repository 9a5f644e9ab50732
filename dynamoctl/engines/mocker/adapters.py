"""The mocker's LoRA adapters: a load takes ``lora_load_s`` of simulated time, at most
``max_loras`` are held, and a request names one that is loaded. The adapter changes no
token the mocker samples; it changes the request's KV identity (its hash chain starts
from the adapter's name, :func:`dynamoctl.kv.hashing.adapter_parent`), which is what the
router and the prefix cache see."""

from __future__ import annotations

import json
from pathlib import Path

from dynamoctl.engines.api import AdapterRefused, RequestRejected
from dynamoctl.engines.mocker.clock import Clock


class MockerAdapters:
    """The adapters one mocker holds."""

    def __init__(self, max_loras: int, load_s: float, clock: Clock) -> None:
        self.max_loras = max_loras
        self.load_s = load_s
        self.clock = clock
        self.loaded: dict[str, str] = {}
        """Name → directory of every adapter loaded."""

    async def load(self, name: str, path: str) -> None:
        if name in self.loaded:
            return
        if self.max_loras < 1:
            raise AdapterRefused(
                f"adapter {name!r}: LoRA is off on this mocker (engine_args max_loras: 0)"
            )
        if len(self.loaded) >= self.max_loras:
            raise AdapterRefused(
                f"adapter {name!r}: {len(self.loaded)} of max_loras {self.max_loras} "
                f"already loaded ({', '.join(sorted(self.loaded))}); unload one first"
            )
        _check_directory(name, Path(path))
        await self.clock.sleep(self.load_s)
        self.loaded[name] = path

    def unload(self, name: str) -> None:
        self.loaded.pop(name, None)

    def check(self, adapter: str | None, request_id: str) -> None:
        """:class:`RequestRejected` for a request naming an adapter not loaded here."""
        if adapter is not None and adapter not in self.loaded:
            raise RequestRejected(
                f"request {request_id!r} names LoRA adapter {adapter!r}, not loaded here"
            )


def _check_directory(name: str, path: Path) -> None:
    """An adapter directory as peft writes it: ``adapter_config.json`` naming LoRA."""
    config = path / "adapter_config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterRefused(f"adapter {name!r}: cannot read {config}: {exc}") from exc
    if not isinstance(data, dict) or str(data.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterRefused(f"adapter {name!r}: {config} is not a LoRA adapter's config")
