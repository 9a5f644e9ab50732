"""An engine that publishes its own KV events (vLLM) gets that stream registered, so
routers subscribe to the engine directly; one that publishes none falls back to the
worker's own (empty) stream; the mocker keeps the worker's publisher."""

from __future__ import annotations

from pathlib import Path

from dynamoctl import wire
from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.engines.api import Engine, KvEventSource, PublishesKvEvents
from dynamoctl.engines.mocker import MockerConfig, MockerEngine
from dynamoctl.worker.instance import WorkerInstance


class SelfPublishing(MockerEngine, PublishesKvEvents):
    """A mocker that claims to publish its KV events itself, like vLLM."""

    def __init__(self, source: KvEventSource | None) -> None:
        super().__init__(MockerConfig(model="m", num_gpu_blocks=64, block_size=16))
        self.source = source
        self.host = ""

    def set_kv_event_host(self, host: str) -> None:
        self.host = host

    def kv_event_source(self) -> KvEventSource | None:
        return self.source


async def registered_events(tmp_path: Path, engine: Engine) -> wire.EventsRecord:
    async with Discovery(store_from_url(f"embedded://{tmp_path}"), lease_ttl=2) as disc:
        inst = WorkerInstance(engine, disc, namespace="ns", host="127.0.0.1")
        await inst.start()
        try:
            raw = await disc.get(keys.events_key("ns", "worker", inst.instance_id))
            assert raw is not None
            return wire.decode_json(raw, wire.EventsRecord)
        finally:
            await inst.close()


async def test_the_engines_own_stream_is_registered(tmp_path: Path) -> None:
    source = KvEventSource("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", "kv@vllm")
    engine = SelfPublishing(source)
    record = await registered_events(tmp_path, engine)
    assert (record.kv, record.kv_replay, record.kv_topic) == (
        source.address,
        source.replay_address,
        source.topic,
    )
    assert engine.host == "127.0.0.1"
    assert record.load.startswith("tcp://127.0.0.1:")  # load is always the worker's


async def test_an_engine_without_events_gets_the_workers_stream(tmp_path: Path) -> None:
    record = await registered_events(tmp_path, SelfPublishing(None))
    assert record.kv.startswith("tcp://127.0.0.1:") and record.kv_topic == "kv-events"
    assert record.kv_replay is not None


async def test_the_mocker_keeps_the_workers_publisher(tmp_path: Path) -> None:
    record = await registered_events(tmp_path, MockerEngine(MockerConfig(model="m")))
    assert record.kv.startswith("tcp://127.0.0.1:") and record.kv_topic == "kv-events"
