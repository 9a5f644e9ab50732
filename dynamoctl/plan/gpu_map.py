"""Which GPUs and hosts the plan has handed out, and what ``scale`` may still place."""

from __future__ import annotations

from dynamoctl.plan.hosts import Host


class GpuMap:
    """Free GPUs per host, handed out first-fit and contiguously; gangs take whole hosts."""

    def __init__(self, hosts: list[Host], gpus_per_host: int) -> None:
        self.hosts = list(hosts)  # grows and shrinks with extra Slurm jobs (add_hosts)
        self.gpus_per_host = gpus_per_host
        self.used: dict[str, set[int]] = {host.name: set() for host in hosts}
        self.whole: set[str] = set()
        """Hosts a gang member owns (also on targets without GPUs)."""
        self._next_cpu_host = 0

    def take(self, count: int) -> tuple[Host, list[int]] | None:
        if count == 0:  # CPU replicas: round-robin over hosts
            host = self.hosts[self._next_cpu_host % len(self.hosts)]
            self._next_cpu_host += 1
            return host, []
        for host in self.hosts:
            if host.name in self.whole:
                continue
            if self.gpus_per_host - len(self.used[host.name]) < count:
                continue  # full enough: no block fits (keeps big plans linear in hosts)
            for start in range(self.gpus_per_host - count + 1):
                block = set(range(start, start + count))
                if not block & self.used[host.name]:
                    self.used[host.name] |= block
                    return host, sorted(block)
        return None

    def release(self, host: str, gpus: list[int]) -> None:
        if host in self.used:  # else its extra job was released with it
            self.used[host] -= set(gpus)

    def take_nodes(self, count: int, shared: bool = False) -> list[tuple[Host, list[int]]] | None:
        """``count`` whole hosts, none of whose GPUs is taken, in host order (the first
        leads the gang); ``shared`` (a local target): every member on its one host."""
        if shared:
            return [(self.hosts[0], [])] * count
        free = [
            host for host in self.hosts if host.name not in self.whole and not self.used[host.name]
        ][:count]
        if len(free) < count:
            return None
        everything = list(range(self.gpus_per_host))
        for host in free:
            self.whole.add(host.name)
            self.used[host.name] |= set(everything)
        return [(host, everything) for host in free]

    def release_node(self, host: str) -> None:
        """Give a gang member's whole host back."""
        if host in self.whole:
            self.whole.discard(host)
            self.used[host].clear()

    def add_hosts(self, hosts: list[Host]) -> None:
        """Hosts that join (an extra Slurm job's nodes): placed after the others, so the
        allocation fills first."""
        for host in hosts:
            if host.name not in self.used:
                self.hosts.append(host)
                self.used[host.name] = set()

    def remove_hosts(self, names: list[str]) -> None:
        """Hosts that leave (an extra job released): nothing is placed there any more."""
        self.hosts = [host for host in self.hosts if host.name not in names]
        for name in names:
            self.used.pop(name, None)
            self.whole.discard(name)
