"""A simulated switched network for the probe's tests: a tree of switches over hosts, each link with a capacity
per direction, and max-min fair sharing among the flows of a round (what TCP flows through shared links come
close to). Noise, when asked for, multiplies each rate by a random factor, as a busy machine would. A ``skew``
(seconds) has every receiver start its clock that late, as a leader passing a round's barrier after its sender
does: a flow of ``nbytes`` then reads faster than its share, the more the shorter it is."""
from __future__ import annotations

import random
from collections import defaultdict

from ddl.topology.probe.grouping import Flow


class Network:
    def __init__(self, host_switch: dict[str, str], parent: dict[str, str | None], nic: float,
                 uplink: dict[str, float], noise: float = 0.0, seed: int = 0, latency: float = 20e-6,
                 skew: float = 0.0, nbytes: float = 1e6):
        self.host_switch, self.parent, self.nic, self.uplink = host_switch, parent, nic, uplink
        self.noise, self.rng, self.latency = noise, random.Random(seed), latency
        self.skew, self.nbytes = skew, nbytes

    def size_flows(self, nbytes: float) -> int:
        """The probe's calibration sets the flows' bytes through this (capped as ddl's measure caps them)."""
        self.nbytes = int(min(16 << 20, max(64 << 10, nbytes)))
        return self.nbytes

    def _read(self, rate: float) -> float:
        """The rate a receiver reads for a flow of ``nbytes`` whose share is ``rate``."""
        return self.nbytes / max(self.nbytes / rate - self.skew, self.nbytes / (100 * rate))

    @classmethod
    def tree(cls, shape: list, nic: float, uplinks: list[float], **kw) -> "Network":
        """``shape``: nested lists of host names; ``uplinks[k]``: capacity of a switch k levels above the
        leaves (0: a leaf switch's uplink)."""
        host_switch, parent, uplink = {}, {}, {}

        def walk(node, name, level, up):
            parent[name] = up
            if up is not None:
                uplink[name] = uplinks[level - 1] if level - 1 < len(uplinks) else nic
            for i, child in enumerate(node):
                if isinstance(child, str):
                    host_switch[child] = name
                else:
                    walk(child, f"{name}.{i}", level - 1, name)
        walk(shape, "root", _depth(shape), None)
        return cls(host_switch, parent, nic, uplink, **kw)

    def _path_up(self, host: str) -> list[str]:
        out, s = [], self.host_switch[host]
        while s is not None:
            out.append(s)
            s = self.parent[s]
        return out

    def links(self, src: str, dst: str) -> list[tuple]:
        a, b = self._path_up(src), self._path_up(dst)
        common = next(s for s in a if s in b)
        up = [(s, "up") for s in a[:a.index(common)]]
        down = [(s, "down") for s in b[:b.index(common)]]
        return [(src, "nic-up")] + up + down + [(dst, "nic-down")]

    def capacity(self, link) -> float:
        return self.nic if link[1].startswith("nic") else self.uplink[link[0]]

    def rates(self, flows: list[tuple[str, str]]) -> list[float]:
        paths = [self.links(s, d) for s, d in flows]
        left = {}
        users = defaultdict(set)
        for i, p in enumerate(paths):
            for link in p:
                left.setdefault(link, self.capacity(link))
                users[link].add(i)
        rate = [0.0] * len(flows)
        active = set(range(len(flows)))
        while active:
            share = {link: left[link] / len(u & active) for link, u in users.items() if u & active}
            low = min(share.values())
            fixed = {i for link, s in share.items() if s <= low * (1 + 1e-12) for i in users[link] & active}
            for i in fixed:
                rate[i] = low
                for link in paths[i]:
                    left[link] -= low
            active -= fixed
        return rate

    def measure(self, hosts: list[str]):
        """A probe ``measure`` callback over this network: flows by host index."""
        def run(pattern, index):
            rates = self.rates([(hosts[s], hosts[d]) for s, d in pattern])
            jitter = lambda: 1 + self.rng.uniform(-self.noise, self.noise)
            return [Flow(index, s, d, self._read(r) * jitter(), self.latency * jitter())
                    for (s, d), r in zip(pattern, rates)]
        return run


def _depth(tree) -> int:
    return 0 if isinstance(tree, str) else 1 + max(_depth(t) for t in tree)
