"""The schedule IR: plain, immutable data that says what each rank sends, receives and reduces, and when.

Terms:
- A *step* moves one element range [offset, offset + count) of the buffer to or from one peer.
  ``send`` reads the range; ``recv_reduce`` combines what arrives into it; ``recv_copy`` overwrites it.
- Steps carry a *round*. A rank runs its rounds in order; the steps of one round run concurrently, so within
  a round no step may write a range another step of that round reads or writes (the checker enforces it).
- Matching: in round r, the k-th send from a to b pairs with the k-th receive at b from a. ``tag`` numbers
  the messages of one program, identically on both sides, so the executor can keep them apart.
- ``level`` and ``transport`` say which tier of the machine and which transport carry a step. The flat
  algorithms use level 0 over MPI; the hierarchical planner fills in more.

Offsets and counts are in elements, so one schedule serves every dtype. A schedule is generated for one
element count; the executor pipelines a large buffer by running per-block schedules (see ddl.schedule.compile).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum


class Op(str, Enum):
    """A step's kind; the values are the executor's StepKind names."""
    SEND = "send"
    RECV_REDUCE = "recv_reduce"
    RECV_COPY = "recv_copy"


class Collective(str, Enum):
    ALLREDUCE = "allreduce"
    BROADCAST = "broadcast"
    ALLGATHER = "allgather"
    REDUCE_SCATTER = "reduce_scatter"


@dataclass(frozen=True)
class Step:
    round: int
    op: Op
    peer: int
    offset: int
    count: int
    tag: int = 0
    level: int = 0
    transport: str = "mpi"


@dataclass(frozen=True)
class Program:
    """One rank's steps, sorted by round. ``rounds`` is the schedule's round count, the same on every rank
    (a rank may sit some rounds out), so all ranks agree on how many tags a block uses."""

    rank: int
    steps: tuple[Step, ...]
    rounds: int
    width: int = 1  # messages one pair may exchange in one direction per round (the same on every rank)

    @property
    def tags(self) -> int:
        return self.rounds * self.width


@dataclass(frozen=True)
class Schedule:
    """Every rank's program for one collective on ``count`` elements.

    ``layout`` describes where each rank's input lives: for allreduce and broadcast every rank holds the whole
    range; for allgather rank r contributes the range ``layout[r]`` = (offset, count); for reduce_scatter every
    rank holds the whole range and rank r's result is the range ``layout[r]``.
    """

    collective: Collective
    algorithm: str
    nranks: int
    count: int
    programs: tuple[Program, ...]
    root: int = 0
    layout: tuple[tuple[int, int], ...] = field(default=())

    def to_json(self) -> str:
        def plain(obj):
            if isinstance(obj, Enum):
                return obj.value
            if isinstance(obj, dict):
                return {k: plain(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [plain(v) for v in obj]
            return obj

        return json.dumps(plain(asdict(self)), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        d = json.loads(text)
        programs = tuple(
            Program(p["rank"], tuple(Step(**{**s, "op": Op(s["op"])}) for s in p["steps"]), p["rounds"],
                    p.get("width", 1))
            for p in d["programs"]
        )
        return cls(
            collective=Collective(d["collective"]),
            algorithm=d["algorithm"],
            nranks=d["nranks"],
            count=d["count"],
            programs=programs,
            root=d["root"],
            layout=tuple(tuple(x) for x in d["layout"]),
        )


def number_tags(steps: list[Step], width: int = 1) -> tuple[Step, ...]:
    """Sort steps by round and give each message its tag, round * width + k for the k-th message (by offset)
    with that peer in that direction in the round. A message has the same range on both sides, so both
    count the same messages in the same order and compute the same tag."""
    steps = sorted(steps, key=lambda s: (s.round, s.offset))
    seen: dict[tuple[int, int, bool], int] = {}
    out = []
    for s in steps:
        key = (s.round, s.peer, s.op is Op.SEND)
        k = seen.get(key, 0)
        seen[key] = k + 1
        if k >= width:
            raise ValueError(f"more than {width} messages with rank {s.peer} in round {s.round}")
        out.append((s, k))
    return tuple(Step(s.round, s.op, s.peer, s.offset, s.count, s.round * width + k, s.level, s.transport)
                 for s, k in out)


def shares(count: int, parts: int) -> list[int]:
    """The bounds of ``parts`` nearly equal shares of ``count`` elements: share i is [b[i], b[i + 1]). Earlier
    shares are never smaller than later ones; shares may be empty when count < parts."""
    return [count * i // parts for i in range(parts + 1)]
