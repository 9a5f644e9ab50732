"""aetcd's client over TLS: aetcd 1.0 only ever opens ``grpc.aio.insecure_channel``;
:class:`SecureClient` opens a ``grpc.aio.secure_channel`` with the credentials of an
:class:`~dynamoctl.discovery.etcd_tls.EtcdTls` instead and is otherwise aetcd's client."""

from __future__ import annotations

from typing import Any

import aetcd
import aetcd.rpc as rpc
from aetcd import watcher
from aetcd.client import _handle_errors

from dynamoctl.discovery.etcd_tls import EtcdTls


class SecureClient(aetcd.Client):  # type: ignore[misc]  # aetcd is untyped
    """aetcd's client over a TLS channel (its ``connect`` with ``secure_channel``)."""

    def __init__(self, *, tls: EtcdTls, **kwargs: Any) -> None:
        super().__init__(username=tls.username, password=tls.password, **kwargs)
        self._tls = tls

    @_handle_errors  # type: ignore[untyped-decorator]
    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]  # another task is connecting: wait for it, as aetcd does
            await _wait_connected(self)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            options = list(self._options.items())
            self.channel = rpc.secure_channel(target, self._tls.credentials(), options=options)
            if self._username is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                resp = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", resp.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


async def _wait_connected(client: aetcd.Client) -> None:
    import asyncio

    await asyncio.wait_for(client._connected.wait(), client._connect_wait_timeout)
