"""The machine: a typed graph of GPUs, sockets, nodes and switches (graph), its link kinds (links), where ranks
run and what each level costs (placement, costs), the nested groups of ranks the planner follows (tree),
topology files and the machine library (files), discovery from the running job (discover), text and pictures
(drawing).
"""
from .costs import LevelCost, default_level
from .files import MACHINES, from_dict, from_spec, library, load, machine_file
from .graph import FORMAT, VERTEX_KINDS, Topology

__all__ = ["Topology", "LevelCost", "default_level", "load", "library", "machine_file", "from_spec", "from_dict",
           "FORMAT", "VERTEX_KINDS", "MACHINES"]
