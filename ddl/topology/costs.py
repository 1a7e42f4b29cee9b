"""What the planner knows about a level of the machine: its α (per message), β (as bandwidth) and γ (per byte
reduced), and how a level priced from the nominal link table alone looks."""
from __future__ import annotations

from dataclasses import dataclass

from . import links


@dataclass(frozen=True)
class LevelCost:
    """What the planner knows about one level of groups, innermost first. ``bandwidth``: bytes/s one child
    of a group (a rank, a socket, a node, a switch) can move to its siblings; ``alpha``: seconds per message
    across the level; ``gamma``: seconds per byte reduced by a rank; ``via``: "peer" when the children have
    links to each other (NVLink, X-Bus), "uplink" when they talk through their links into the container
    (a node's NICs): outer levels' traffic then crosses those links too; ``outside``: bytes/s of every link
    out of a child (peer links plus its uplink), what the lower bound may count on; ``measured``: the figures
    come from the probe rather than the nominal link table."""

    name: str
    link: str
    alpha: float
    bandwidth: float
    gamma: float
    via: str = "uplink"
    outside: float = 0.0  # 0: the same as bandwidth
    measured: bool | str = False  # from the probe: True, or "calibrated" under an allreduce's load (else nominal)

    def to_dict(self) -> dict:
        return dict(name=self.name, link=self.link, alpha=self.alpha, bandwidth=self.bandwidth, gamma=self.gamma,
                    via=self.via, outside=self.outside, measured=self.measured)

    @property
    def costs(self) -> str:
        """How the figures were obtained: nominal (the link table), probed, or calibrated."""
        return "calibrated" if self.measured == "calibrated" else "probed" if self.measured else "nominal"

    @property
    def escape(self) -> float:
        return max(self.outside, self.bandwidth)


def default_level(name: str, link: str) -> LevelCost:
    """A level priced from the nominal table alone (hierarchies given as nested lists or -mode dims)."""
    k = links.kind(link)
    return LevelCost(name, link, k.latency * 1e-6 + links.SOFTWARE_OVERHEAD, k.bandwidth * 1e9,
                     links.REDUCE_SECONDS_PER_BYTE["cpu"], "peer" if link == "shm" else "uplink")
