"""The emulated multi-node cluster: specs such as ``T2`` or ``2x2x2:nic=1gbit`` turned into topologies (spec),
and the namespaces, bridges and shaped links that run real MPI jobs across pretend nodes (emulated)."""
from .emulated import AGENT, Cluster, ClusterError, Link, available, remove_stale, saved

__all__ = ["AGENT", "Cluster", "ClusterError", "Link", "available", "remove_stale", "saved"]
