"""What every long-running component (worker, frontend) is told, in one place."""

from __future__ import annotations

from dataclasses import dataclass

from dynamoctl.discovery import Discovery, store_from_url


@dataclass
class ComponentOptions:
    """Options shared by ``dynamoctl worker`` and ``dynamoctl frontend``."""

    namespace: str = "dynamo"
    """Discovery namespace of the deployment."""
    discovery: str = "embedded"
    """Discovery URL (``embedded[://DIR]`` or ``etcd://HOST:PORT[,...]``)."""
    host: str = "127.0.0.1"
    """Address the component's sockets bind."""
    lease_ttl: float = 10.0
    """Discovery lease TTL in seconds."""
    drain_grace: float = 30.0
    """Seconds in-flight work gets to finish on SIGTERM."""
    label: str = ""
    """The supervisor's name for this process (``agg-0``), written into its records."""

    def open_discovery(self) -> Discovery:
        """This component's discovery handle (not yet started)."""
        return Discovery(store_from_url(self.discovery), lease_ttl=self.lease_ttl)
