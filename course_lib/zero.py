"""ZeRO by hand: shard the optimizer state (stage 1) and the gradients (stage 2) over the ranks.

Lecture: model parallelism and memory; ZeRO (Rajbhandari et al., SC 2020, section 5). Data
parallelism keeps a full copy of the training state on every rank: parameters, gradients and
Adam's two moments (and, with mixed precision, fp32 master weights). Adam works element by
element, so each rank can keep and update the moments of only its 1/p of the parameters:

* **stage 1** (optimizer state): all-reduce the gradients as before; each rank runs Adam on its
  shard of the flattened parameters; an all-gather puts the updated shards back together;
* **stage 2** (+ gradients): a reduce-scatter instead of the all-reduce leaves each rank only the
  mean gradient of its own shard -- the same bytes on the wire as an all-reduce's first half.

Both take exactly the steps of unsharded Adam on one process (Adam is elementwise), with the
moments' memory divided by p. :func:`train` runs either, or plain data parallelism ("DDP").

Lesson 11's check, stages 0, 1 and 2 against unsharded Adam on one process (a small float64
GPT, ten steps), with the optimizer state each rank holds::

    python -m course_lib.zero --world-size 2 [--steps 10]
    torchrun --standalone --nproc-per-node 2 -m course_lib.zero
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.data_parallel import parameters_vector
from course_lib.overlap import all_reduce_after_backward
from course_lib.runtime.devices import device
from course_lib.runtime.torchrun import run_command, run_main
from course_lib.training import check_split, is_whole, step_loop

STAGES = (0, 1, 2)


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int, int]:
    """(start, end, shard size) of ``rank``'s shard of a flat vector of ``numel`` entries cut
    into ``world_size`` equal shards (the last padded: all shards have one size, which
    all-gather and reduce-scatter need)."""
    whole = all(map(is_whole, (numel, world_size, rank)))
    if not (whole and world_size >= 1 and 0 <= rank < world_size and numel >= 0):
        raise ValueError(f"rank {rank} of {world_size} ranks, {numel} entries: need "
                         f"whole numbers, world_size >= 1, 0 <= rank < world_size and numel >= 0")
    size = -(-numel // world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel), size


class ShardedAdam:
    """Adam whose state lives only for this rank's shard of the flattened parameters.

    ``step()`` expects every parameter's ``.grad`` to hold this rank's local gradient; it
    averages them over the ranks (stage 1: all-reduce; stage 2: reduce-scatter), steps Adam on
    the shard, and all-gathers the parameters.

    As torch's Adam: ``params`` may be parameter groups (dicts with their own ``lr``,
    ``weight_decay`` ...); a frozen parameter is left out; a parameter that got no gradient on
    any rank this step is skipped (its moments and step count stay as they were). Inside the
    shard each parameter's piece is its own tensor for Adam, with its group's options."""

    def __init__(self, params, stage: int = 1, group=None, **adam):
        if isinstance(stage, bool) or stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2 (stage 3 shards the parameters too: FSDP), "
                             f"got {stage}")
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        groups = [dict(g, params=[p for p in g["params"] if p.requires_grad]) for g in groups]
        self.params = [p for g in groups for p in g["params"]]
        if not self.params:
            raise ValueError("ShardedAdam got no parameter that requires a gradient")
        self.stage, self.group = stage, group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.numel = sum(p.numel() for p in self.params)
        self.start, self.end, self.size = shard_bounds(self.numel, self.world_size, self.rank)
        # this rank's piece of each parameter: (parameter index, where it lies in the shard, a
        # leaf of its own holding its values); Adam keeps moments for these entries only
        self.pieces, inner, offset, index = [], [], 0, 0
        for g in groups:
            leaves = []
            for p in g["params"]:
                lo, hi = max(offset, self.start), min(offset + p.numel(), self.end)
                if lo < hi:
                    leaf = p.detach().reshape(-1)[lo - offset:hi - offset].clone()
                    leaves.append(leaf.requires_grad_(True))
                    self.pieces.append((index, lo - self.start, leaf))
                offset, index = offset + p.numel(), index + 1
            inner.append(dict({k: v for k, v in g.items() if k != "params"}, params=leaves))
        inner = [g for g in inner if g["params"]]
        self.adam = torch.optim.Adam(inner, foreach=False, **adam) if inner else None

    def _flat(self, tensors):
        """The tensors flattened into one vector, zero-padded to world_size x shard size."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.world_size * self.size - self.numel))

    @torch.no_grad()
    def step(self) -> None:
        got = torch.tensor([float(p.grad is not None) for p in self.params],
                           device=self.params[0].device)
        dist.all_reduce(got, group=self.group)  # which parameters got a gradient on some rank
        grads = self._flat([torch.zeros_like(p) if p.grad is None else p.grad
                            for p in self.params]) / self.world_size
        if self.stage == 1:  # every rank gets every mean gradient, and uses its shard of it
            dist.all_reduce(grads, group=self.group)
            mine = grads[self.rank * self.size:(self.rank + 1) * self.size]
        else:  # stage 2: each rank receives only its shard's sum
            mine = torch.empty(self.size, dtype=grads.dtype, device=grads.device)
            dist.reduce_scatter_single(mine, grads, group=self.group)
        for i, at, leaf in self.pieces:
            leaf.grad = mine[at:at + leaf.numel()].to(leaf.dtype, copy=True) if got[i] else None
        if self.adam is not None:
            self.adam.step()
        # in the gradients' dtype: with parameters of several dtypes, the widest (torch.cat's)
        shard = torch.zeros(self.size, dtype=grads.dtype, device=grads.device)
        for _, at, leaf in self.pieces:
            shard[at:at + leaf.numel()] = leaf
        full = torch.empty(self.world_size * self.size, dtype=shard.dtype, device=shard.device)
        dist.all_gather_single(full, shard, group=self.group)
        offset = 0
        for p, n in zip(self.params, got, strict=True):  # every rank: every updated parameter
            if n > 0:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (Adam's moments of its shard, and a step
        count per piece)."""
        return 0 if self.adam is None else adam_state_bytes(self.adam)


def adam_state_bytes(optimizer) -> int:
    """Bytes of the tensors in a torch optimizer's state (Adam: exp_avg, exp_avg_sq, step)."""
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if torch.is_tensor(t))


def train(model_fn, x, y, global_batch: int, steps: int, lr: float = 1e-2, stage: int = 1,
          seed: int = 0, group=None) -> dict:
    """Adam with data parallelism over ``group``, in the one step loop
    (:func:`course_lib.training.step_loop`): stage 0 all-reduces the gradients after backward
    (lesson 4's rule, :func:`course_lib.overlap.all_reduce_after_backward`) and keeps the whole
    optimizer state on every rank; stages 1 and 2 use :class:`ShardedAdam`, which averages the
    gradients itself. Returns the final ``params``, this rank's ``losses`` and the bytes of
    optimizer state it held, ``optimizer_bytes`` (train_gpt's ``state["optimizer"]``)."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage}")
    check_split(global_batch, dist.get_world_size(group))
    model = model_fn().to(device(group))
    if stage == 0:
        opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
        sync = lambda: all_reduce_after_backward(model, group, find_unused=True)  # noqa: E731
    else:
        opt, sync = ShardedAdam(model.parameters(), stage, group, lr=lr), None
    losses = step_loop(model, opt, x, y, global_batch, steps, sync, seed, group)
    state = adam_state_bytes(opt) if stage == 0 else opt.state_bytes()
    return dict(params=parameters_vector(model), losses=losses, optimizer_bytes=state)


def train_one_process(model_fn, x, y, global_batch: int, steps: int, lr: float = 1e-2,
                      seed: int = 0) -> dict:
    """The baseline: unsharded Adam on one process with the whole global batch."""
    model = model_fn()
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    losses = step_loop(model, opt, x, y, global_batch, steps, seed=seed)
    return dict(params=parameters_vector(model), losses=losses,
                optimizer_bytes=adam_state_bytes(opt))


# -- lesson 11's check, as a command ---------------------------------------------------------------


def lesson_setup(seed: int = 1):
    """Lesson 11's small problem: a float64 GPT (2 blocks, d = 32) and 128 windows of 16
    characters of the standard library's source."""
    import functools

    from course_lib.data import stdlib_text, text_batch
    from course_lib.models import tiny_gpt

    model_fn = functools.partial(tiny_gpt, d_model=32, layers=2, heads=4, context=16, seed=seed,
                                 dtype=torch.float64)
    return (model_fn, *text_batch(stdlib_text(50_000), 128, 16, torch.Generator().manual_seed(1)))


def every_stage(global_batch: int = 16, steps: int = 10, lr: float = 1e-2, seed: int = 1,
                group=None) -> dict:
    """Run on every rank of ``group``: :func:`train` at each of ``STAGES``: final parameters and
    the optimizer state this rank held, by stage."""
    model_fn, x, y = lesson_setup(seed)
    return {stage: {k: v for k, v in train(model_fn, x, y, global_batch, steps, lr, stage=stage,
                                           group=group).items() if k != "losses"}
            for stage in STAGES}


def main(argv=None):
    args, results = run_command(
        every_stage, "Lesson 11: ZeRO stages 1 and 2 by hand, against unsharded Adam on one "
        "process",
        (("--global-batch", int, 16), ("--steps", int, 10), ("--lr", float, 1e-2),
         ("--seed", int, 1)), argv)
    if results is not None:  # the launcher, or rank 0 under torchrun
        model_fn, x, y = lesson_setup(args.seed)
        one = train_one_process(model_fn, x, y, args.global_batch, args.steps, args.lr)
        print(f"{len(results)} ranks, {args.steps} Adam steps on a global batch of "
              f"{args.global_batch} windows")
        for stage in STAGES:
            worst = max((r[stage]["params"] - one["params"]).abs().max().item() for r in results)
            held = [r[stage]["optimizer_bytes"] for r in results]
            print(f"stage {stage}: largest difference from one process {worst:.1e}; optimizer "
                  f"state per rank {', '.join(f'{b:,}' for b in held)} bytes = "
                  f"{held[0] / one['optimizer_bytes']:.3f} of unsharded Adam's "
                  f"({one['optimizer_bytes']:,})")
    return results


if __name__ == "__main__":
    run_main(main)
