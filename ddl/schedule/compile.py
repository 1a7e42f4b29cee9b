"""Turns a rank's Program into what the native executor runs: rows of numbers, scratch offsets, blocks (a
pipeline: programs run over blocks of the buffer, ``inflight`` at once).

Everything the executor does mechanically is decided here: where each receive lands, which receives must
wait for the sends of their round (they write a range those sends read), how the buffer is cut into pipeline
blocks, and how many blocks are in flight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import _native
from .ir import Op, Program

# The row layout and kind codes come from the executor, where they are declared.
_FIELDS = {name: i for i, name in enumerate(_native.STEP_FIELDS)}
_KIND = {op: int(getattr(_native.StepKind, op.value)) for op in Op}


def _overlaps(a, b) -> bool:
    return a.offset < b.offset + b.count and b.offset < a.offset + a.count


def program_rows(program: Program) -> tuple[np.ndarray, int]:
    """(rows, scratch elements): one row per step, fields in _native.STEP_FIELDS order. A
    receive that overlaps a send of its own round is staged in scratch and applied after the sends; a reduce
    always lands in scratch first."""
    rows = np.zeros((len(program.steps), len(_FIELDS)), dtype=np.int64)
    sends_by_round: dict[int, list] = {}
    for s in program.steps:
        if s.op is Op.SEND:
            sends_by_round.setdefault(s.round, []).append(s)
    scratch = 0
    for i, s in enumerate(program.steps):
        clash = any(_overlaps(s, t) for t in sends_by_round.get(s.round, ())) if s.op is not Op.SEND else False
        where = -1
        if s.op is Op.RECV_REDUCE or (s.op is Op.RECV_COPY and clash):
            where, scratch = scratch, scratch + s.count
        row = rows[i]
        row[_FIELDS["kind"]], row[_FIELDS["peer"]], row[_FIELDS["round"]] = _KIND[s.op], s.peer, s.round
        row[_FIELDS["tag"]], row[_FIELDS["offset"]], row[_FIELDS["count"]] = s.tag, s.offset, s.count
        row[_FIELDS["scratch"]], row[_FIELDS["wait_sends"]] = where, int(clash)
    return rows, scratch


def native_program(program: Program) -> "_native.Program":
    rows, scratch = program_rows(program)
    return _native.Program(rows, scratch, program.tags)


@dataclass(frozen=True)
class CompiledPipeline:
    """A native pipeline and what it was made from, for -dbg_level output and tests."""

    native: "_native.Pipeline"
    algorithm: str
    count: int
    block_elems: int
    nblocks: int
    inflight: int
    phases: tuple[tuple[int, str], ...] = ()  # (level, phase) per round, for the timeline; later rounds: as
                                              # the last; none: level 0, phase = the algorithm


def compile_blocks(make: Callable[[int], Program], count: int, block_elems: int, inflight: int,
                   algorithm: str, phases: tuple[tuple[int, str], ...] = ()) -> CompiledPipeline:
    """Cuts [0, count) into blocks of block_elems (the last may be shorter) and runs ``make(n)``'s program on
    each; at most two distinct programs are built (full blocks and the tail)."""
    block_elems = max(1, min(block_elems, count)) if count else 1
    full, tail = divmod(count, block_elems)
    programs, blocks = [], []
    if full:
        programs.append(native_program(make(block_elems)))
        blocks += [(i * block_elems, 0) for i in range(full)]
    if tail or not count:
        programs.append(native_program(make(tail)))
        blocks.append((full * block_elems, len(programs) - 1))
    native = _native.Pipeline(programs, np.asarray(blocks, dtype=np.int64).reshape(-1, 2), inflight)
    return CompiledPipeline(native, algorithm, count, block_elems, len(blocks), inflight, phases)
