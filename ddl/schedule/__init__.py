"""Schedules, the IR between the planner and the executor: every rank's steps (ir), the flat algorithms that
produce them (algorithms), the symbolic checker that proves a schedule correct without MPI (check), and the
compilation of a rank's program into the executor's rows and pipeline blocks (compile).
"""
from .ir import Collective, Op, Program, Schedule, Step, number_tags

__all__ = ["Collective", "Op", "Program", "Schedule", "Step", "number_tags"]
