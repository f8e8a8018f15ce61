"""Loss scaling, written by hand: keep small fp16 gradients from flushing to zero.

Micikevicius et al. 2018 (mixed precision training): multiply the loss by S before the backward
pass, so every gradient is S times larger while it flows through fp16; divide the weight
gradients by S (in fp32) before the update. A **static** scaler keeps S fixed; a **dynamic** one
starts high, halves S and skips the step when a gradient overflows to inf/NaN, and doubles S
after a run of clean steps. The rules below are ``torch.amp.GradScaler``'s (defaults: S = 2^16,
growth x2 every 2000 clean steps, back-off x0.5), so the two can be compared step for step.
"""

from __future__ import annotations

import torch

from course_lib.training import is_whole


def update_scale(scale: float, growth_tracker: int, found_inf: bool, *,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> tuple[float, int]:
    """The dynamic rule: returns the new (scale, growth_tracker).

    An inf/NaN: back off (scale x backoff_factor) and start counting again. A clean step: count
    it; after ``growth_interval`` clean steps in a row, grow (scale x growth_factor)."""
    check_rule(growth_factor, backoff_factor, growth_interval, growth_tracker)
    if not 0 < scale < float("inf"):
        raise ValueError(f"scale must be positive and finite, got {scale!r}")
    if found_inf:
        return scale * backoff_factor, 0
    if growth_tracker + 1 == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker + 1


def check_rule(growth_factor: float, backoff_factor: float, growth_interval: int,
               growth_tracker: int = 0) -> None:
    """Refuse a rule that torch.amp.GradScaler refuses, naming the settings, and a count of
    clean steps that is not 0 to ``growth_interval`` - 1."""
    if not (growth_factor > 1 and 0 < backoff_factor < 1 and is_whole(growth_interval)
            and growth_interval >= 1):
        raise ValueError(f"as torch.amp.GradScaler asks: growth_factor > 1, 0 < "
                         f"backoff_factor < 1 and growth_interval a whole number >= 1; got "
                         f"{growth_factor}, {backoff_factor} and {growth_interval!r}")
    if not (is_whole(growth_tracker) and 0 <= growth_tracker < growth_interval):
        raise ValueError(f"growth_tracker counts clean steps since the last change: 0 to "
                         f"growth_interval - 1 = {growth_interval - 1}, got {growth_tracker!r}")


class LossScaler:
    """Loss scaling around any optimiser, in three calls per step::

        scaler.scale(loss).backward()
        scaler.step(optimizer)   # unscales the gradients, skips the step on inf/NaN
        scaler.update()          # dynamic: back off or grow; static: keep the scale

    ``history`` records, per step, the scale used, whether an inf/NaN was found and whether
    the optimiser stepped.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, *, dynamic: bool = True,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        if not 0 < init_scale < float("inf"):
            raise ValueError(f"init_scale must be positive and finite, got {init_scale}")
        check_rule(growth_factor, backoff_factor, growth_interval)
        self.scale_value, self.dynamic = float(init_scale), dynamic
        self.rule = dict(growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval)
        self.growth_tracker = 0
        self.found_inf = False
        self.unscaled: dict[int, bool] = {}  # id(optimizer) -> inf/NaN found, since update()
        self.stepped: set[int] = set()
        self.history: list[dict] = []

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times S: its backward pass makes every gradient S times larger."""
        return loss * self.scale_value

    def unscale_(self, optimizer) -> bool:
        """Divide every gradient by S in place (e.g. before clipping them); return whether any is
        inf or NaN. Once per optimizer between updates, as torch.amp.GradScaler allows."""
        if id(optimizer) in self.unscaled:
            raise RuntimeError("unscale_() was already called on this optimizer since the last "
                               "update(): its gradients would be divided by S twice")
        inverse = 1.0 / self.scale_value  # S is a power of two: dividing by it is exact
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(inverse)
                    found |= not torch.isfinite(p.grad).all().item()
        self.unscaled[id(optimizer)] = found
        self.found_inf = any(self.unscaled.values())
        return found

    def step(self, optimizer) -> bool:
        """Unscale (unless :meth:`unscale_` already did), then step unless a gradient overflowed.
        Returns whether it stepped. Once per optimizer between updates."""
        if id(optimizer) in self.stepped:
            raise RuntimeError("step() was already called on this optimizer since the last "
                               "update(): call update() once per iteration")
        found = self.unscaled.get(id(optimizer))
        stepped = not (self.unscale_(optimizer) if found is None else found)
        if stepped:
            optimizer.step()
        self.stepped.add(id(optimizer))
        self.history.append(dict(scale=self.scale_value, found_inf=self.found_inf,
                                 stepped=stepped))
        return stepped

    def update(self) -> None:
        """Dynamic scaling: the new scale for the next step. Ends the iteration."""
        if self.dynamic:
            self.scale_value, self.growth_tracker = update_scale(
                self.scale_value, self.growth_tracker, self.found_inf, **self.rule)
        self.unscaled.clear()
        self.stepped.clear()
        self.found_inf = False
