"""Planning an allreduce over a tree of ranks: the cost model (model), the choice of an algorithm per level and
of the pipeline blocks (choice), every rank's own program (programs), and the explanation of a plan against the
topology's lower bound (explain). Pure Python: no MPI, called once per size and cached by the communicator.
"""
from .choice import Plan, choose, default_levels, label, predict, predict_allgather
from .explain import Explanation, explain
from .model import (LEVEL_ALGORITHMS, MAX_BLOCK_BYTES, MAX_BLOCKS, MIN_BLOCK_BYTES, MOST_BLOCKS, TCP_BLOCK_BYTES,
                    TOP_ALGORITHMS,
                    Phase, Shape, agreement_phases, allgather_phases, broadcast_lower_bound, latency_phases, level_rounds, link_bytes,
                    link_seconds, lower_bound, phases, pipelined, top_rounds)
from .programs import ALLREDUCE_AT_TOP, program

__all__ = ["Plan", "choose", "default_levels", "label", "predict", "predict_allgather", "Explanation", "explain", "LEVEL_ALGORITHMS",
           "MAX_BLOCK_BYTES", "MAX_BLOCKS", "MIN_BLOCK_BYTES", "MOST_BLOCKS", "TCP_BLOCK_BYTES", "TOP_ALGORITHMS", "Phase", "Shape",
           "agreement_phases", "allgather_phases", "broadcast_lower_bound", "latency_phases", "level_rounds",
           "link_bytes", "link_seconds", "lower_bound", "phases", "pipelined", "top_rounds", "ALLREDUCE_AT_TOP",
           "program"]
