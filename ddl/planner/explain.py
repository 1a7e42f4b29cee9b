"""Explains a plan: levels, groups, the algorithm per level, the bytes each level's links carry, the predicted
time beside the topology's lower bound, in nccl-tests' units (algbw, busbw). Used by ``ddl-topo --plan``
and ``Communicator.explain``."""
from __future__ import annotations

from dataclasses import dataclass

from ..units import bandwidth, format_size
from .choice import Plan, label, predict
from .model import Phase, Shape, link_bytes, lower_bound


@dataclass(frozen=True)
class Explanation:
    plan: Plan
    shape: Shape
    nbytes: int
    predicted: float          # seconds
    bound: float              # seconds
    bound_reason: str
    phases: tuple[Phase, ...]
    link_bytes: tuple[float, ...]  # per level: bytes one child sends over the level's links
    runs_on: str = ""         # where the call really runs when not on this plan (the host memory level)
    transport: str = ""       # what carries the levels' messages, and how the ranks found each other
    agreement: str = ""       # the shape of the agreement round every collective starts with
    path: str = ""            # the path of the communicator's road such a call takes, and why (ddl.core.road)
    device: object = None     # the same allreduce of GPU arrays: its levels' transports (ddl.gpu.levels)

    @property
    def nranks(self) -> int:
        return self.shape.nranks

    @property
    def efficiency(self) -> float:
        return self.bound / self.predicted if self.predicted > 0 else 1.0

    def bandwidths(self, seconds: float) -> tuple[float, float]:
        """(algbw, busbw) in GB/s for an allreduce of nbytes taking ``seconds`` (nccl-tests' definitions)."""
        return bandwidth(self.nbytes, seconds, self.nranks)

    def to_dict(self) -> dict:
        shape = self.shape
        return {
            "bytes": self.nbytes, "ranks": self.nranks, "plan": self.plan.to_dict(),
            "levels": [dict(level=i, groups=shape.groups[i], sizes=list(shape.sizes[i]),
                            algorithm=self.plan.algorithms[i], link_bytes=self.link_bytes[i], **lv.to_dict())
                       for i, lv in enumerate(self.plan.levels)],
            "phases": [p.__dict__ for p in self.phases],
            "predicted_seconds": self.predicted, "lower_bound_seconds": self.bound,
            "lower_bound_reason": self.bound_reason, "efficiency": self.efficiency, "runs_on": self.runs_on,
            "transport": self.transport, "agreement": self.agreement, "path": self.path,
            "device": self.device.to_dict() if self.device is not None else None,
        }

    def text(self) -> str:
        p, shape = self.plan, self.shape
        blocks = max(1, -(-self.nbytes // p.block_bytes))
        lines = [f"allreduce of {format_size(self.nbytes)} over {self.nranks} ranks, {shape.depth} level(s): "
                 f"{label(p)}; {blocks} block(s) of {format_size(min(p.block_bytes, self.nbytes))}, "
                 f"{p.inflight} in flight",
                 f"{'level':<6}{'name':<10}{'groups':>8}  {'sizes':<10}{'link':<10}{'via':<8}{'alpha':>9}"
                 f"{'GB/s':>9}  {'costs':<9}{'algorithm':<20}{'sent per child':>15}"]
        for i, lv in enumerate(p.levels):
            sizes = ",".join(map(str, shape.sizes[i][:4])) + ("..." if len(shape.sizes[i]) > 4 else "")
            algo = p.algorithms[i] if p.shape == "hierarchical" else "(recursive doubling)"
            lines.append(f"{i:<6}{lv.name[:9]:<10}{shape.groups[i]:>8}  {sizes:<10}{lv.link:<10}{lv.via:<8}"
                         f"{lv.alpha * 1e6:>7.1f}us{lv.bandwidth / 1e9:>9.3f}  "
                         f"{lv.costs:<9}{algo:<20}"
                         f"{format_size(self.link_bytes[i]):>15}")
        lines.append("phases, in order (whole buffer, unpipelined):")
        for ph in self.phases:
            lines.append(f"  level {ph.level} {ph.what:<19}{ph.algorithm:<19}{ph.rounds:>4} round(s) "
                         f"{ph.seconds * 1e6:>12.1f} us")
        alg, bus = self.bandwidths(self.predicted)
        lb_alg, lb_bus = self.bandwidths(self.bound)
        lines.append(f"predicted   {self.predicted * 1e6:>12.1f} us   algbw {alg:8.2f} GB/s   busbw {bus:8.2f} GB/s")
        lines.append(f"lower bound {self.bound * 1e6:>12.1f} us   algbw {lb_alg:8.2f} GB/s   busbw {lb_bus:8.2f} GB/s"
                     f"   ({self.bound_reason})")
        lines.append(f"predicted efficiency {100 * self.efficiency:.1f} % of the lower bound")
        if self.path:
            lines.append(f"path: {self.path}")
        if self.runs_on:
            lines.append(self.runs_on)
        if self.transport:
            lines.append(f"transport: {self.transport}")
        if self.agreement:
            lines.append(f"agreement round: {self.agreement}")
        if self.device is not None:
            lines.append(f"GPU arrays, per level: {self.device.text()}")
        return "\n".join(lines)

    __str__ = text


def explain(plan: Plan, nbytes: int) -> Explanation:
    shape = Shape.of(plan.tree)
    seconds, ph = predict(plan, nbytes, shape)
    bound, why = lower_bound(shape, plan.levels, nbytes)
    sent = link_bytes(shape, plan.levels, ph)
    return Explanation(plan, shape, nbytes, seconds, bound, why, tuple(ph), tuple(sent))
