"""Device meshes for sharded training (FSDP2, HSDP) from what ddl knows of the machine.

HSDP shards a model inside a group of ranks and replicates it across groups: its allgathers and
reduce-scatters (every layer, every step) stay inside the group, and only one allreduce of the already
reduced shard per step crosses between groups. The right group is the fastest level of the machine whose
ranks, together, hold the model: ddl's topology gives the levels (innermost first: a host, a leaf switch, ...),
so the user does not lay out the mesh by hand.

    mesh = ddl.torch.device_mesh()                      # shard inside each host, replicate across hosts
    mesh = ddl.torch.device_mesh(hold_bytes=40 << 30)   # the fastest level whose ranks hold 40 GiB of state
    fully_shard(layer, mesh=mesh)

The result is a 2-D DeviceMesh named ("replicate", "shard") whose rows are the groups, or a 1-D mesh
("shard",) (plain FSDP) where sharding is over every rank: one group holds them all, the levels are uneven, or
the chosen level is the whole machine.
"""
from __future__ import annotations

import os

import torch
from torch.distributed.device_mesh import DeviceMesh

import ddl
from ..errors import DDLError


def shard_level(sizes: tuple[int, ...], hold_bytes: int | None, budget_bytes: int | None) -> int:
    """The level (index into ``sizes``, group sizes innermost first) to shard inside: the innermost one whose
    group holds ``hold_bytes`` within ``budget_bytes`` per rank (the innermost level when either is unknown,
    the outermost when none does). A level whose groups have one rank shards nothing: it is skipped."""
    group = 1
    for level, n in enumerate(sizes):
        group *= n
        if n == 1:
            continue
        if hold_bytes is None or budget_bytes is None or hold_bytes <= budget_bytes * group:
            return level
    return len(sizes) - 1


def mesh_rows(coords: tuple[tuple[int, ...], ...], sizes: tuple[int, ...], level: int) -> list[list[int]]:
    """Ranks as rows of the 2-D mesh: a row is the ranks that agree on every coordinate above ``level`` (one
    shard group), ordered by their coordinates inside it; rows ordered by the coordinates above."""

    def number(c, levels):
        k = 0
        for lvl in reversed(levels):  # the outermost coordinate most significant
            k = k * sizes[lvl] + c[lvl]
        return k

    inner, outer = range(level + 1), range(level + 1, len(sizes))
    width = 1
    for lvl in inner:
        width *= sizes[lvl]
    rows = [[-1] * width for _ in range(len(coords) // width)]
    for rank, c in enumerate(coords):
        rows[number(c, outer)][number(c, inner)] = rank
    return rows


def _budget(comm) -> int | None:
    """Bytes of memory one rank may use: the free memory of its GPU, or the host's memory over its ranks."""
    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0]
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    here = sum(1 for h in (comm.hosts or []) if h == comm.hosts[comm.rank]) or 1
    return host // here


def device_mesh(hold_bytes: int | None = None, level: int | None = None, device_type: str | None = None,
                comm=None, backend: str | None = None) -> DeviceMesh:
    """A DeviceMesh for FSDP2 (``fully_shard(..., mesh=...)``) laid out from ddl's topology: 2-D
    ("replicate", "shard") with shard groups at ``level`` (0: the innermost level, e.g. a host; default: the
    innermost level whose ranks hold ``hold_bytes`` of model state, parameters + gradients + optimizer, in their
    memory, else the innermost), or 1-D ("shard",) when the shard group is every rank. Needs the process group
    initialised (``ddl.torch.init_process_group()``); ``comm``: the ddl communicator whose topology to follow
    (default ddl's, whose ranks are torch's); ``backend``: the mesh's groups' backend when it is not the default
    group's (e.g. "ddl" beside a gloo default group)."""
    comm = comm or ddl.communicator()
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    grid = comm.grid
    if level is not None and not -len(grid.sizes) <= level < len(grid.sizes):
        raise DDLError(f"rank {comm.rank}: device_mesh level {level}: this machine has {len(grid.sizes)} "
                       f"level(s) of {list(grid.sizes)} ranks (0 innermost)")
    if level is None:
        level = shard_level(grid.sizes, hold_bytes, _budget(comm) if hold_bytes is not None else None)
    level %= len(grid.sizes)
    if level == len(grid.sizes) - 1 or not grid.even:  # shard over every rank: plain FSDP
        layout, names = torch.arange(comm.size), ("shard",)
    else:
        layout, names = torch.tensor(mesh_rows(grid.coords, grid.sizes, level)), ("replicate", "shard")
    override = None if backend is None else ((backend, None),) * len(names)
    return DeviceMesh(device_type, layout, mesh_dim_names=names, backend_override=override)
