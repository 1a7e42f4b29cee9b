"""The probe: the network's switch levels found by measurement, between one leader per host.

Hosts that see full bandwidth among themselves under concurrent load form a group; groups whose traffic shares
a slower or oversubscribed path form the next level up; and so on to the top. Each stage measures between the
current units (hosts, then groups of hosts) with concurrent rounds (``schedule``: units paired by reflection
exchange all at once, every member of a group with a member of the other, as a hierarchical allreduce loads
the links), groups the units by bandwidth with a noise margin (``grouping``), and fits each level's
bandwidth and latency from the same flows. ``measure`` runs the rounds over MPI with deadlines and a time budget;
``cache`` keeps the result per set of hosts; ``result`` is what comes out (a switch tree with measured links)
and what ddl.topology.discover builds the topology from.

Cost: a stage over G units runs at most min(G, 2W) rounds of at most H flows (W: DDL_PROBE_WINDOW, default 16), so
a probe of H hosts measures O(H * W * levels) flows, never the H^2 pairs of all-pairs (see ``schedule.cost``).
"""
from .grouping import Grouping, group
from .result import ProbeResult, ProbeError
from .schedule import cost, patterns, round_flows

__all__ = ["Grouping", "group", "ProbeResult", "ProbeError", "cost", "patterns", "round_flows"]
